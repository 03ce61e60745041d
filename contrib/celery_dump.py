#!/usr/bin/python3
"""Dump a Celery app's beat schedule for `beatd import`, and compute Celery's
own fire times for `beatd import --check`.

Dump (reads Celery's schedule objects, not the source text):

    python3 contrib/celery_dump.py MODULE:APP [--state celerybeat-schedule] > dump.json

MODULE is imported from PYTHONPATH (as `celery -A MODULE` does); APP is the
Celery instance's name in it (default: "app", then "celery"). The JSON holds
the app's timezone and enable_utc, and every beat_schedule entry (including
those added with add_periodic_task): task, args, kwargs, options, and the
schedule as Celery holds it: a crontab's original field strings, an
interval's seconds and relative flag, a solar event and place. With --state,
each entry's last_run_at and total_run_count from celery beat's schedule
file (the shelve; stop celery beat first, it holds a lock on it).

Next fire times (used by `beatd import --check`; reads JSON on stdin):

    python3 contrib/celery_dump.py --next 50 --from 2026-11-30T10:00:00Z < entries.json

entries.json is {"entries": [{"name", "zone", "schedule": {...}}]} with the
schedule in the dump's form. For each entry it prints Celery's next fire
times after --from, chaining last_run_at = the previous fire as beat does.
Celery 5.2.6's known bugs that beatd does not copy are not reproduced
either, and are named in "deviations": crontab wall times are converted with
astimezone (5.2.6 subtracts them naively across DST changes),
dusk_astronomical uses -18 degrees (5.2.6 says 18), and where a solar event
does not occur the next day it occurs is taken (5.2.6 raises TypeError).

Needs Debian's python3-celery (and python3-ephem for solar entries).
"""
import argparse
import dbm
import importlib
import json
import shelve
import sys
from datetime import datetime, timedelta, timezone

UTC = timezone.utc


def load_app(spec):
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    if attr:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    for name in ("app", "celery"):
        if hasattr(module, name):
            return getattr(module, name)
    raise SystemExit(f"celery_dump: no Celery app in {module_name}; give MODULE:APP")


def iso(dt):
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.isoformat()


def jsonable(value, problems, where):
    """Python value -> JSON value; anything JSON cannot carry is reported."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            problems.append(f"{where}: {value!r} is not a finite number")
            return None
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v, problems, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append(f"{where}: key {k!r} is not a string")
                k = str(k)
            out[k] = jsonable(v, problems, f"{where}.{k}")
        return out
    problems.append(f"{where}: {type(value).__name__} {value!r} has no JSON form")
    return repr(value)


def cron_field(value):
    # crontab() takes an int, a string, or an iterable of them.
    if isinstance(value, (list, tuple, set, frozenset, range)):
        return ",".join(str(v) for v in (sorted(value) if isinstance(value, (set, frozenset)) else value))
    return str(value)


def dump_schedule(sched):
    from celery import schedules
    if isinstance(sched, schedules.crontab):
        return {"type": "crontab", "minute": cron_field(sched._orig_minute), "hour": cron_field(sched._orig_hour),
                "day_of_week": cron_field(sched._orig_day_of_week),
                "day_of_month": cron_field(sched._orig_day_of_month),
                "month_of_year": cron_field(sched._orig_month_of_year)}
    if isinstance(sched, schedules.solar):
        return {"type": "solar", "event": sched.event, "lat": float(sched.lat), "lon": float(sched.lon)}
    if type(sched) is schedules.schedule:
        return {"type": "interval", "seconds": sched.run_every.total_seconds(),
                "relative": bool(sched.relative)}
    return {"type": "unknown", "repr": repr(sched), "class": type(sched).__module__ + "." + type(sched).__name__}


def option_value(value):
    # A signature (link, link_error) is a dict: kept whole, not its name.
    if isinstance(value, dict):
        return value
    # Kombu Queue and Exchange objects stand for their names.
    name = getattr(value, "name", None)
    if name is not None and not isinstance(value, (str, bytes)):
        return name
    if isinstance(value, datetime):
        return iso(value)
    return value


def dump(args):
    from celery.schedules import maybe_schedule
    app = load_app(args.app)
    app.loader.import_default_modules()
    conf = app.conf  # loading the config runs on_after_configure handlers
    app.finalize(auto=True)
    while app._pending_periodic_tasks:  # add_periodic_task before configure
        app._add_periodic_task(*app._pending_periodic_tasks.popleft())
    out = {"source": "celery", "app": args.app, "timezone": str(conf.timezone or "") or None,
           "enable_utc": bool(conf.enable_utc), "entries": []}
    state = {}
    if args.state:
        path = args.state
        try:
            db = shelve.open(path, flag="r")
        except dbm.error:
            db = shelve.open(path[:-3] if path.endswith(".db") else path, flag="r")
        with db:
            for name, entry in db.get("entries", {}).items():
                state[name] = {"last_run_at": iso(entry.last_run_at),
                               "total_run_count": int(entry.total_run_count or 0)}
            out["state_tz"] = str(db.get("tz")) if db.get("tz") else None
    schedule = dict(conf.beat_schedule or {})
    # celery beat adds this entry itself (Scheduler.install_default_entries)
    # when results expire and the backend cannot expire them on its own.
    try:
        if conf.result_expires and not app.backend.supports_autoexpire and "celery.backend_cleanup" not in schedule:
            from celery.schedules import crontab
            schedule["celery.backend_cleanup"] = {"task": "celery.backend_cleanup",
                                                  "schedule": crontab("0", "4", "*"),
                                                  "options": {"expires": 12 * 3600}}
    except Exception as exc:  # a backend that cannot be set up here
        out.setdefault("notes", []).append(f"could not tell whether celery beat adds celery.backend_cleanup: {exc}")
    unknown_state = sorted(set(state) - set(schedule))
    if unknown_state:
        out["state_only"] = unknown_state
    for name, entry in schedule.items():
        problems = []
        sched = maybe_schedule(entry.get("schedule"), entry.get("relative", False), app=app)
        rec = {"name": name, "task": entry.get("task"), "schedule": dump_schedule(sched),
               "args": jsonable(list(entry.get("args") or ()), problems, "args"),
               "kwargs": jsonable(dict(entry.get("kwargs") or {}), problems, "kwargs"),
               "options": jsonable({k: option_value(v) for k, v in (entry.get("options") or {}).items()},
                                   problems, "options")}
        if name in state:
            rec.update(state[name])
        if problems:
            rec["problems"] = problems
        out["entries"].append(rec)
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


# --- next fire times, as Celery computes them -------------------------------

_apps = {}


def app_for(zone):
    from celery import Celery
    if zone not in _apps:
        a = Celery("beatd-check")
        a.conf.timezone = zone
        a.conf.enable_utc = True
        _apps[zone] = a
    return _apps[zone]


def next_crontab(spec, zone, last, count):
    from celery.schedules import crontab
    from zoneinfo import ZoneInfo
    app = app_for(zone)
    tz = ZoneInfo(zone)
    out, deviations = [], []
    fields = {k: spec[k] for k in ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")}
    for _ in range(count):
        local = last.astimezone(tz)
        c = crontab(app=app, nowfun=lambda local=local: local, **fields)
        base, delta, _ = c.remaining_delta(local)
        wall = (base + delta)
        nxt = wall.astimezone(UTC)
        naive = wall.replace(tzinfo=None)
        back = naive.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None)
        if back != naive:
            deviations.append({"at": nxt.isoformat(), "why": "dst_gap"})
        out.append(nxt)
        last = nxt
    return out, deviations


def next_interval(spec, zone, last, count):
    from celery.schedules import schedule
    app = app_for(zone)
    out = []
    for _ in range(count):
        s = schedule(timedelta(seconds=spec["seconds"]), relative=spec.get("relative", False),
                     app=app, nowfun=lambda last=last: last)
        nxt = last + s.remaining_estimate(last)
        out.append(nxt.astimezone(UTC))
        last = nxt
    return out, []


def next_solar(spec, zone, last, count):
    import ephem
    from celery.schedules import solar
    app = app_for("UTC")
    out, deviations = [], []
    for _ in range(count):
        t = last
        for _ in range(400):
            s = solar(spec["event"], spec["lat"], spec["lon"], app=app, nowfun=lambda t=t: t)
            if spec["event"] == "dusk_astronomical":
                s.cal.horizon = "-18"
            try:
                nxt = t + s.remaining_estimate(t)
                break
            except TypeError:  # 5.2.6's CircumpolarError fallback
                obs = s.cal
                try:
                    getattr(obs, s.method)(ephem.Sun(), start=t, use_center=s.use_center)
                except ephem.AlwaysUpError:
                    stop = obs.next_antitransit(ephem.Sun(), start=t)
                except ephem.NeverUpError:
                    stop = obs.next_transit(ephem.Sun(), start=t)
                t = stop.datetime().replace(tzinfo=UTC) + timedelta(minutes=1)
                deviations.append({"at": None, "why": "polar"})
        else:
            break
        out.append(nxt.astimezone(UTC))
        # beat's last_run_at is the send time, just after the event.
        last = nxt + timedelta(seconds=1)
    if spec["event"] == "dusk_astronomical":
        deviations.append({"at": None, "why": "dusk_astronomical_horizon"})
    return out, deviations


def next_times(args):
    doc = json.load(sys.stdin)
    start = datetime.fromisoformat(args.from_.replace("Z", "+00:00"))
    result = {}
    for e in doc["entries"]:
        spec = e["schedule"]
        zone = e.get("zone") or "UTC"
        last = datetime.fromisoformat(e["from"].replace("Z", "+00:00")) if e.get("from") else start
        try:
            if spec["type"] == "crontab":
                times, dev = next_crontab(spec, zone, last, args.next)
            elif spec["type"] == "interval":
                times, dev = next_interval(spec, zone, last, args.next)
            elif spec["type"] == "solar":
                times, dev = next_solar(spec, zone, last, args.next)
            elif spec["type"] == "clocked":
                at = datetime.fromisoformat(spec["at"].replace("Z", "+00:00"))
                times, dev = ([at.astimezone(UTC)] if at > last else []), []
            else:
                result[e["name"]] = {"error": f"no Celery computation for {spec['type']}"}
                continue
        except Exception as exc:  # report, do not die: every entry is checked
            result[e["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        result[e["name"]] = {"times": [t.isoformat() for t in times], "deviations": dev}
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("app", nargs="?", help="MODULE:APP")
    p.add_argument("--state", help="celery beat's schedule file (celerybeat-schedule)")
    p.add_argument("--next", type=int, help="print Celery's next N fire times of the entries on stdin")
    p.add_argument("--from", dest="from_", help="with --next: start after this RFC 3339 instant")
    args = p.parse_args()
    if args.next:
        if not args.from_:
            p.error("--next needs --from")
        next_times(args)
    elif args.app:
        dump(args)
    else:
        p.error("give MODULE:APP, or --next N --from TIME")


if __name__ == "__main__":
    main()

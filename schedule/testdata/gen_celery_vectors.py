#!/usr/bin/python3
"""Generate crontab test vectors from real Celery (Debian python3-celery 5.2.6).

Each output line is one case: a random crontab spec, a zone, a start instant,
and the next COUNT slots, chaining last_run_at = previous slot as beat does.

Two answers are recorded per step:

* "celery": Celery's own computation. remaining_delta() yields the next wall
  time; it is converted to an instant with astimezone(UTC), as Celery >= 5.3
  does. (5.2.6's remaining() subtracts two datetimes sharing a tzinfo, which
  Python does on the naive wall clock, so every slot that straddles a DST
  change is shifted by the DST offset. beatd does not copy that bug.)
* "oracle": an independent brute-force walk over wall-clock minutes that uses
  Celery's expanded field sets (c.minute, c.hour, ...) and beatd's documented
  DST policy: a wall time in a spring-forward gap fires at the end of the gap,
  one that occurs twice fires at its first occurrence only.

Where they differ, "deviation" names why:
* "dst_gap": Celery reads a nonexistent wall time with the pre-transition
  offset (an hour late); beatd fires at the end of the gap.
* "celery_5_2_6_month_skip": 5.2.6's _delta_to_next compares the UTC midnight
  of a candidate day with last_run_at, so west of UTC it skips the rest of the
  month (fixed upstream; beatd fires on the matching day).

Run from this directory:

    /usr/bin/python3 gen_celery_vectors.py > celery_vectors.jsonl

The seed is fixed, so the file reproduces byte for byte.
"""
import json
import random
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from celery import Celery
from celery.schedules import crontab

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 20261130
CASES = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
COUNT = 5
UTC = timezone.utc
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/Sao_Paulo", "Pacific/Chatham", "Asia/Tokyo", "Europe/London", "America/Los_Angeles"]
DOW_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]

rng = random.Random(SEED)


def field(lo, hi, names=None, star_weight=4):
    kind = rng.randrange(10)
    if kind < star_weight:
        return "*"
    n = hi - lo + 1

    def val():
        v = rng.randint(lo, hi)
        if names and rng.random() < 0.4:
            return names[v - lo]
        return str(v)
    if kind == 4:
        return "*/%d" % rng.randint(1, max(1, n // 2))
    if kind == 5:
        return "%s-%s" % (val(), val())
    if kind == 6:
        return "%s-%s/%d" % (val(), val(), rng.randint(1, 4))
    if kind == 7:
        return ",".join(sorted({val() for _ in range(rng.randint(2, 4))}))
    return val()


def exists(wall, tz):
    """Whether a naive wall time exists in tz (is not in a DST gap)."""
    aware = wall.replace(tzinfo=tz)
    back = aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    return back == wall


def resolve(wall, tz):
    """beatd's DST policy, independently: wall time -> UTC instant."""
    if exists(wall, tz):
        return wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    probe = wall
    while not exists(probe, tz):  # the end of the gap
        probe = probe.replace(second=0) + timedelta(minutes=1)
    return probe.replace(tzinfo=tz, fold=0).astimezone(UTC)


def oracle_next(c, tz, last):
    """First slot strictly after instant last, walking wall-clock days."""
    wall = last.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0) + timedelta(minutes=1)
    day = wall.date()
    for _ in range(366 * 60):
        if (day.month in c.month_of_year and day.day in c.day_of_month
                and day.isoweekday() % 7 in c.day_of_week):
            for h in sorted(c.hour):
                for m in sorted(c.minute):
                    cand = datetime(day.year, day.month, day.day, h, m)
                    if cand < wall:
                        continue
                    inst = resolve(cand, tz)
                    if inst > last:
                        return inst
        day += timedelta(days=1)
        wall = datetime(day.year, day.month, day.day)
    raise RuntimeError("no slot within 60 years")


def transitions(tz, year):
    """Instants (UTC, to the hour) where tz changes offset during year."""
    out = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    prev = t.astimezone(tz).utcoffset()
    while t.year == year:
        t += timedelta(hours=1)
        off = t.astimezone(tz).utcoffset()
        if off != prev:
            out.append(t)
        prev = off
    return out


def main():
    app = Celery("vectors")
    out = sys.stdout
    made = 0
    while made < CASES:
        spec = dict(minute=field(0, 59, star_weight=2), hour=field(0, 23),
                    day_of_week=field(0, 6, DOW_NAMES, star_weight=6),
                    day_of_month=field(1, 31, star_weight=6),
                    month_of_year=field(1, 12, MONTH_NAMES, star_weight=6))
        zone = rng.choice(ZONES)
        app.conf.timezone = zone
        app.conf.enable_utc = True
        tz = ZoneInfo(zone)
        start = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(
            seconds=rng.randrange(0, 10 * 365 * 86400), microseconds=rng.randrange(0, 10**6))
        near = transitions(tz, start.year) if rng.random() < 0.2 else []
        if near:
            # Start shortly before a DST change, with hours that cross it.
            start = rng.choice(near) - timedelta(seconds=rng.randrange(0, 36 * 3600))
            spec["hour"] = rng.choice(["*", "1-3", "2", "0-4/2", "*/3"])
            spec["day_of_month"] = spec["month_of_year"] = "*"
        last = start
        steps = []
        try:
            for _ in range(COUNT):
                local = last.astimezone(tz)
                c = crontab(app=app, nowfun=lambda local=local: local, **spec)
                base, delta, _ = c.remaining_delta(local)
                celery = (base + delta).astimezone(UTC)
                oracle = oracle_next(c, tz, last)
                step = {"celery": celery.astimezone(tz).isoformat(),
                        "oracle": oracle.astimezone(tz).isoformat()}
                if celery != oracle:
                    wall = (base + delta).replace(tzinfo=None)
                    if not exists(wall, tz):
                        step["deviation"] = "dst_gap"
                    elif celery > oracle:
                        step["deviation"] = "celery_5_2_6_month_skip"
                    else:
                        step["deviation"] = "unexplained"
                steps.append(step)
                last = oracle
        except (RuntimeError, ValueError):
            continue  # Celery rejects the spec or cannot find a date
        json.dump({"spec": spec, "zone": zone, "from": start.isoformat(), "steps": steps}, out,
                  sort_keys=True)
        out.write("\n")
        made += 1


if __name__ == "__main__":
    main()

"""How `make demo` reads beatd's and the worker's logs: one reader for the
live view and for the final counts, so both say the same thing.

    view.py follow            read both logs' lines on stdin, print each event
    view.py count BEATD WORKER  print how many tasks beatd published and the
                              worker ran
"""
import json
import re
import sys

# A worker run's end, as Celery's worker logs it (celery/app/trace.py):
# "Task NAME[ID] succeeded in RUNTIMEs: RESULT", where RUNTIME is a Python
# float's repr (0.0012, 7.73e-05), or "Task NAME[ID] raised unexpected: EXC"
# (or INTERNAL ERROR). A run is counted once, by its task id.
WORKER_RUN = re.compile(
    r"Task (?P<name>\S+)\[(?P<id>[0-9a-f-]+)\] "
    r"(?:succeeded in (?P<runtime>[0-9.]+(?:e[-+]?[0-9]+)?)s: (?P<result>.*)"
    r"|(?P<failure>raised unexpected|INTERNAL ERROR): (?P<exc>.*))$")


def event(line):
    """The event a log line records, or None: ("published", fields) for a
    beatd fire line, ("beatd", msg) for a beatd warning or milestone,
    ("succeeded" | "failed", fields) for the end of a worker run."""
    line = line.strip()
    if line.startswith("{"):
        try:
            r = json.loads(line)
        except ValueError:
            return None
        if r.get("msg") == "fired":
            # Every fire line counts as published, whatever its result.
            return "published", r
        if r.get("level") in ("WARN", "ERROR") or r.get("msg") in ("elected leader", "beatd started"):
            return "beatd", r.get("msg")
        return None
    m = WORKER_RUN.search(line)
    if m:
        return ("failed" if m.group("failure") else "succeeded"), m.groupdict()
    return None


def follow(lines):
    for line in lines:
        ev = event(line)
        if ev is None:
            continue
        kind, f = ev
        if kind == "published":
            print("beatd   published %-24s slot %s  lag %-10s task_id %s%s" % (
                f["entry"], f["slot"], f["lag"], f["task_id"], "  (manual trigger)" if f.get("manual") else ""))
        elif kind == "beatd":
            print("beatd   %s" % f)
        elif kind == "succeeded":
            print("worker  ran       %-24s -> %s  (%ss)" % (f["name"], f["result"], f["runtime"]))
        else:
            print("worker  failed    %-24s -> %s" % (f["name"], f["exc"]))


def count(beatd_log, worker_log):
    published, runs = 0, {}
    for path in (beatd_log, worker_log):
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    ev = event(line)
                    if ev is None:
                        continue
                    kind, fields = ev
                    if kind == "published":
                        published += 1
                    elif kind in ("succeeded", "failed"):
                        runs[fields["id"]] = kind
        except OSError:
            pass
    ok = sum(1 for k in runs.values() if k == "succeeded")
    print("demo: beatd published %d tasks; the Celery worker ran %d (%d succeeded, %d failed)." % (
        published, len(runs), ok, len(runs) - ok))


if __name__ == "__main__":
    if sys.argv[1:2] == ["follow"]:
        follow(sys.stdin)
    elif sys.argv[1:2] == ["count"] and len(sys.argv) == 4:
        count(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)

"""Send Celery task events at a steady rate with Celery's own
EventDispatcher, as a worker started with -E does (task events buffered
and sent as task.multi), for beatd's event-consumer benchmark.

usage: emit_events.py REDIS_URL RATE SECONDS IDS
Each task id in bench-0..bench-(IDS-1) goes through received, started and
succeeded in turn. Prints the events sent.
"""
import sys
import time

from celery import Celery

url, rate, seconds, ids = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
app = Celery("bench", broker=url)
kinds = [("task-received", {"name": "tasks.add", "args": "(1, 2)", "kwargs": "{}", "retries": 0}),
         ("task-started", {}),
         ("task-succeeded", {"result": "3", "runtime": 0.001})]
sent = 0
with app.connection_for_write() as conn:
    d = app.events.Dispatcher(conn, hostname="bench@host", enabled=True, groups=["task"], buffer_group=["task"], buffer_limit=100)
    start = time.monotonic()
    i = 0
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            break
        due = int(elapsed * rate)
        while sent < due:
            task = "bench-%d" % ((sent // 3) % ids)
            kind, fields = kinds[sent % 3]
            d.send(kind, uuid=task, **fields)
            sent += 1
        time.sleep(0.002)
    d.flush()
print(sent)

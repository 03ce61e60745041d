"""The Celery app `make demo` runs: an unmodified Celery worker that executes
what beatd publishes from the example schedules.yaml."""
import os

from celery import Celery

_broker = os.environ.get("DEMO_BROKER", "redis://127.0.0.1:6379/0")
app = Celery("beatd_demo", broker=_broker)
app.conf.worker_hijack_root_logger = False


@app.task(name="tasks.add")
def add(x, y):
    return x + y


@app.task(name="tasks.hello")
def hello(who="world"):
    return "hello " + who


@app.task(name="tasks.report")
def report(*args, **kwargs):
    return "report built with args=%r kwargs=%r" % (args, kwargs)


@app.task(name="tasks.cleanup")
def cleanup():
    return "cleaned"

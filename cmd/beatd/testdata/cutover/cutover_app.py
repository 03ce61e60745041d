"""The Celery app of the cutover test: celery beat runs it, then beatd takes
over its schedule (beatd import --state)."""
import os

from celery import Celery
from celery.schedules import crontab

app = Celery("cutover", broker=os.environ["CUTOVER_BROKER"])
app.conf.timezone = "UTC"
app.conf.beat_schedule = {
    "minute": {"task": "tasks.minute", "schedule": crontab()},
    "i1": {"task": "tasks.i1", "schedule": 1.0},
    "i2": {"task": "tasks.i2", "schedule": 2.0},
    "i5": {"task": "tasks.i5", "schedule": 5.0},
}

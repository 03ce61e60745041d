"""A Celery app whose beat_schedule uses every form the import reads (test
fixture for migrate; `python3 contrib/celery_dump.py beat_app:app`)."""
from datetime import datetime, timedelta

from celery import Celery
from celery.schedules import crontab, schedule, solar

app = Celery("beat_app", broker="memory://")
app.conf.timezone = "Europe/Berlin"
app.conf.enable_utc = True


class every_other_tuesday(schedule):
    """A custom schedule: beatd has nothing like it."""


app.conf.beat_schedule = {
    "add-every-30": {"task": "tasks.add", "schedule": 30.0, "args": (16, 16)},
    "daily": {"task": "tasks.daily", "schedule": timedelta(days=1),
              "kwargs": {"b": 1, "a": [1, 2.5, None, "é"]}},
    "fortnight": {"task": "tasks.fortnight", "schedule": timedelta(weeks=2)},
    "hourly-relative": {"task": "tasks.rel", "schedule": timedelta(hours=1), "relative": True},
    "ninety-relative": {"task": "tasks.rel90", "schedule": schedule(timedelta(minutes=90), relative=True)},
    "half-second": {"task": "tasks.fast", "schedule": 0.5},
    "weekday-morning": {"task": "tasks.report", "schedule": crontab(hour=7, minute=30, day_of_week="mon-fri"),
                        "options": {"queue": "reports", "priority": 5, "expires": 60,
                                    "headers": {"x-team": "data"}, "time_limit": 30,
                                    "soft_time_limit": 20.5, "ignore_result": True,
                                    "exchange": "reports", "routing_key": "reports.daily"}},
    "minute-list": {"task": "tasks.list", "schedule": crontab(minute=[0, 20, 40], hour="9-17")},
    "month-end": {"task": "tasks.close", "schedule": crontab(minute=0, hour=23, day_of_month="28-31", month_of_year="*/3")},
    "sunrise-berlin": {"task": "tasks.sun", "schedule": solar("sunrise", 52.52, 13.40)},
    "dusk-sydney": {"task": "tasks.dusk", "schedule": solar("dusk_astronomical", -33.87, 151.21)},
    "noon-apia": {"task": "tasks.noon", "schedule": solar("solar_noon", -13.83, -171.76)},
    "reports/weekly": {"task": "tasks.weekly", "schedule": crontab(minute=0, hour=8, day_of_week="mon"),
                       "options": {"countdown": 10}},
    "custom": {"task": "tasks.custom", "schedule": every_other_tuesday(timedelta(days=14))},
    "when": {"task": "tasks.when", "schedule": 3600, "args": (datetime(2026, 1, 1),)},
}


@app.on_after_configure.connect
def setup_periodic_tasks(sender, **kwargs):
    sender.add_periodic_task(10.0, sender.signature("tasks.ping", args=("pong",)), name="ping every 10s")

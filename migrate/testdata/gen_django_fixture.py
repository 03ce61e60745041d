#!/usr/bin/python3
"""Build a django-celery-beat database with the real models (Debian's
python3-django-celery-beat 2.4.0, python3-django 3.2) in a throwaway
project, and print `manage.py dumpdata django_celery_beat`.

Every model and field the import reads is used: CrontabSchedule (with a
timezone), IntervalSchedule (each period), ClockedSchedule, SolarSchedule,
and PeriodicTask's enabled, one_off, start_time, expires, expire_seconds,
queue, exchange, routing_key, priority, headers, args, kwargs,
last_run_at, total_run_count and description.

    /usr/bin/python3 gen_django_fixture.py > django_dump.json
"""
import io
import json
import os
import sys
import tempfile
from datetime import datetime, timedelta, timezone

import django
from django.conf import settings

tmp = tempfile.mkdtemp(prefix="dcb-")
settings.configure(
    INSTALLED_APPS=["django_celery_beat"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(tmp, "db.sqlite3")}},
    USE_TZ=True, TIME_ZONE="UTC", DEFAULT_AUTO_FIELD="django.db.models.AutoField",
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django_celery_beat.models import (  # noqa: E402
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule)

call_command("migrate", "django_celery_beat", verbosity=0)

UTC = timezone.utc
last = datetime(2026, 11, 30, 9, 45, 0, 123456, tzinfo=UTC)

every_5m = IntervalSchedule.objects.create(every=5, period=IntervalSchedule.MINUTES)
every_2d = IntervalSchedule.objects.create(every=2, period=IntervalSchedule.DAYS)
every_90s = IntervalSchedule.objects.create(every=90, period=IntervalSchedule.SECONDS)
every_3h = IntervalSchedule.objects.create(every=3, period=IntervalSchedule.HOURS)
weekday_morning = CrontabSchedule.objects.create(minute="30", hour="7", day_of_week="mon-fri",
                                                 day_of_month="*", month_of_year="*", timezone="America/New_York")
quarter = CrontabSchedule.objects.create(minute="*/15", hour="*", day_of_week="*",
                                         day_of_month="*", month_of_year="*", timezone="UTC")
first_of_month = CrontabSchedule.objects.create(minute="0", hour="3", day_of_week="*",
                                                day_of_month="1", month_of_year="*", timezone="Europe/Berlin")
sunset = SolarSchedule.objects.create(event="sunset", latitude="52.520000", longitude="13.400000")
dusk = SolarSchedule.objects.create(event="dusk_astronomical", latitude="-33.868800", longitude="151.209300")
clocked = ClockedSchedule.objects.create(clocked_time=datetime(2027, 1, 1, 0, 0, tzinfo=UTC))

PeriodicTask.objects.create(name="cleanup", task="app.tasks.cleanup", interval=every_5m,
                            args=json.dumps([1, "two", None]), kwargs=json.dumps({"z": 1, "a": [True, 2.5]}),
                            last_run_at=last, total_run_count=42, description="Deletes stale rows.\nRuns often.")
PeriodicTask.objects.create(name="backup", task="app.tasks.backup", interval=every_2d, queue="slow",
                            exchange="backups", routing_key="backup.run", priority=3,
                            headers=json.dumps({"x-team": "ops"}), expire_seconds=3600)
PeriodicTask.objects.create(name="poll", task="app.tasks.poll", interval=every_90s, enabled=False)
PeriodicTask.objects.create(name="rollup", task="app.tasks.rollup", interval=every_3h,
                            start_time=datetime(2026, 12, 1, 6, 0, tzinfo=UTC))
PeriodicTask.objects.create(name="morning report", task="app.tasks.report", crontab=weekday_morning,
                            expires=datetime(2027, 6, 30, 12, 0, tzinfo=UTC),
                            last_run_at=datetime(2026, 11, 27, 12, 30, 0, 500000, tzinfo=UTC), total_run_count=300)
PeriodicTask.objects.create(name="quarter/hourly", task="app.tasks.tick", crontab=quarter,
                            last_run_at=datetime(2026, 11, 30, 9, 45, 0, 2000, tzinfo=UTC), total_run_count=7)
PeriodicTask.objects.create(name="monthly", task="app.tasks.invoice", crontab=first_of_month)
PeriodicTask.objects.create(name="lights", task="app.tasks.lights", solar=sunset,
                            last_run_at=datetime(2026, 11, 29, 14, 57, 36, 400000, tzinfo=UTC), total_run_count=12)
PeriodicTask.objects.create(name="stargazing", task="app.tasks.stars", solar=dusk)
PeriodicTask.objects.create(name="new year", task="app.tasks.greet", clocked=clocked, one_off=True)
PeriodicTask.objects.create(name="once-quarterly", task="app.tasks.once", crontab=quarter, one_off=True)
PeriodicTask.objects.create(name="done-once", task="app.tasks.done", interval=every_5m, one_off=True,
                            enabled=False, last_run_at=last)

out = io.StringIO()
call_command("dumpdata", "django_celery_beat", indent=1, stdout=out)
# date_changed and last_update are when this script ran: fix them so the
# file reproduces.
rows = json.loads(out.getvalue())
for r in rows:
    for k in ("date_changed", "last_update"):
        if k in r["fields"]:
            r["fields"][k] = "2026-11-30T10:00:00Z"
json.dump(rows, sys.stdout, indent=1)
sys.stdout.write("\n")

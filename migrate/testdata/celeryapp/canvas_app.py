"""A Celery app whose periodic tasks are workflows (test fixture for
migrate's canvas import): a chain through add_periodic_task, link and
link_error options with signatures, and a group beatd cannot send."""
from celery import Celery, chain, group, signature

app = Celery("canvas_app", broker="memory://")
app.conf.timezone = "UTC"
app.conf.beat_schedule = {
    "with-callbacks": {"task": "tasks.add", "schedule": 60.0, "args": (1, 2),
                       "options": {"queue": "math",
                                   "link": signature("tasks.notify", kwargs={"who": "ok"}, immutable=True),
                                   "link_error": [signature("tasks.alert", options={"priority": 9})]}},
    "group-link": {"task": "tasks.add", "schedule": 60.0, "args": (3, 4),
                   "options": {"link": group(signature("tasks.a"), signature("tasks.b"))}},
}


@app.on_after_configure.connect
def setup(sender, **kwargs):
    sender.add_periodic_task(300.0, chain(signature("etl.fetch", args=(1,)),
                                          signature("etl.transform", options={"queue": "etl"}),
                                          signature("etl.notify", kwargs={"to": "ops"}, immutable=True)),
                             name="etl chain")

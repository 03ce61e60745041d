"""A tiny Celery app that beatd's end-to-end tests publish to.

The worker is started by internal/testutil with REDIS_PORT set; results go to
Redis database 1 so tests can read each task's final state.
"""
import os

from celery import Celery

_port = os.environ.get("REDIS_PORT", "6379")
# BROKER_URL selects another broker (the AMQP tests: RabbitMQ); results stay
# in Redis either way.
app = Celery("beatd_e2e", broker=os.environ.get("BROKER_URL") or "redis://127.0.0.1:%s/0" % _port,
             backend="redis://127.0.0.1:%s/1" % _port)
if os.environ.get("PRIORITY_QUEUE"):
    # A second queue declared with x-max-priority, as a worker's
    # task_queues would; beatd is told so in schedules.yaml (amqp.queues).
    from kombu import Exchange, Queue
    _pq = os.environ["PRIORITY_QUEUE"]
    app.conf.task_queues = [
        Queue("celery", Exchange("celery"), routing_key="celery"),
        Queue(_pq, Exchange(_pq), routing_key=_pq, queue_arguments={"x-max-priority": 10}),
    ]
if os.environ.get("SQS_TRANSPORT_OPTIONS"):
    # Kombu's SQS transport reads these from the app, not the URL: the
    # region, is_secure=False for the emulator, queue_name_prefix.
    import json
    app.conf.broker_transport_options = json.loads(os.environ["SQS_TRANSPORT_OPTIONS"])
app.conf.worker_hijack_root_logger = False
app.conf.result_expires = 3600


@app.task(name="tasks.add")
def add(x, y):
    return x + y


@app.task(name="tasks.hello")
def hello(who="world"):
    return "hello " + who


@app.task(name="tasks.header", bind=True)
def header(self, name):
    """Return a custom message header, as the worker saw it."""
    return self.request.get(name)


@app.task(name="tasks.fail")
def fail():
    """Raise, for outcome tests: task-failed carries ZeroDivisionError."""
    return 1 / 0


@app.task(name="tasks.sleep")
def sleep(seconds, mark=""):
    """Sleep, recording the worker's own start and end times in the
    result, so tests judge overlap from what the worker ran."""
    import time
    start = time.time()
    time.sleep(seconds)
    return {"start": start, "end": time.time(), "mark": mark}


@app.task(name="tasks.flaky", bind=True, max_retries=1, default_retry_delay=0)
def flaky(self):
    """Retry once, then succeed: task-retried, then task-succeeded."""
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return "ok"


@app.task(name="tasks.periodic_name", bind=True)
def periodic_name(self):
    """Return the periodic_task_name the message carried, where
    django-celery-results reads it (the message properties)."""
    return (self.request.properties or {}).get("periodic_task_name")


def _records():
    import redis
    return redis.Redis(port=int(_port))


@app.task(name="tasks.record", bind=True)
def record(self, *args, log="records", fail=False):
    """Append this run to the Redis list log: its args and kwargs as it got
    them, its ids and the beat_slot header, so tests read a chain's order
    and arguments from the tasks' own records. Returns its args joined by
    "+", which the next step of a chain receives first; fail raises after
    recording, for link_error."""
    import json
    _records().rpush(log, json.dumps({"task": "record", "id": self.request.id, "root_id": self.request.root_id,
                                      "parent_id": self.request.parent_id, "args": list(args),
                                      "beat_slot": self.request.get("beat_slot")}))
    if fail:
        raise ValueError("asked to fail")
    return "+".join(str(a) for a in args)


@app.task(name="tasks.record_error", bind=True)
def record_error(self, failed_id, log="records"):
    """A link_error: Celery sends it the failed task's id (bound tasks
    are sent as tasks, with the id as their argument)."""
    import json
    _records().rpush(log, json.dumps({"task": "record_error", "id": self.request.id, "root_id": self.request.root_id,
                                      "args": [failed_id]}))

#!/bin/sh
# Regenerate every capture against a RabbitMQ on $RABBIT_PORT (empty vhost /).
set -e
cd "$(dirname "$0")"
c() { /usr/bin/python3 capture.py "$@"; }
c plain "add.apply_async((2, 3))"
c kwargs_unicode "hello.apply_async(kwargs={'who': 'Zoë ☃'})"
c custom_headers "add.apply_async((5, 5), headers={'x-tenant': 'acme', 'x-n': 7, 'x-neg': -3, 'x-big': 2**40, 'x-f': 1.5, 'x-t': True, 'x-none': None, 'x-list': [1, 'a', None, True], 'x-map': {'k': 'v', 'n': 2}})"
c expires_seconds "add.apply_async((1, 1), expires=120)"
c priority "add.apply_async((1, 1), priority=5)"
c queue "add.apply_async((1, 1), queue='reports')"
c queue_celery "add.apply_async((1, 1), queue='celery')"
c limits "add.apply_async((1, 1), time_limit=30, soft_time_limit=20.5, ignore_result=True)"
c send_task_by_name "app.send_task('remote.only.task', args=[1], kwargs={'a': [1, 2, {'b': None}]})"
c exchange_routing_key "add.apply_async((1, 1), exchange='mail', routing_key='mail.send')"
c max_priority "add.apply_async((1, 1), queue='prio', priority=7)" "{'task_queue_max_priority': 10}"
c queue_arguments "add.apply_async((1, 1), queue='lazyq')" "{'task_queues': [Queue('lazyq', queue_arguments={'x-queue-mode': 'lazy', 'x-max-priority': 5})]}"

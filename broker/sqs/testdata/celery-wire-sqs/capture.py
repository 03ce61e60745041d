"""Captures what Celery 5.2.6 and Kombu 5.2.4's SQS transport send to SQS.

Run against the test emulator (testkit/sqsemu), as the golden test's
comment says:

    SQS_PORT=4100 AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x python3 capture.py NAME 'CALL' [PREFIX]

Each message is read back raw with boto3 (the body exactly as sent and its
message attributes), with the parameters of Kombu's SendMessage call (on a
.fifo queue, MessageGroupId and MessageDeduplicationId), and written to NAME.json with the queue names
Kombu created.
"""
import base64
import json
import os
import sys

import boto3
import botocore.client
from celery import Celery
from kombu import Exchange, Queue

# Kombu's own SendMessage calls, recorded as boto3 is asked to make them:
# the emulator does not return a FIFO message's MessageGroupId and
# MessageDeduplicationId on receive.
sent = []
_make_api_call = botocore.client.BaseClient._make_api_call


def _record(self, operation, params):
    if operation == "SendMessage":
        sent.append({k: v for k, v in params.items() if k != "MessageBody"} | {"QueueName": params["QueueUrl"].rsplit("/", 1)[1]})
    return _make_api_call(self, operation, params)


botocore.client.BaseClient._make_api_call = _record

port = os.environ.get("SQS_PORT", "4100")
name, call = sys.argv[1], sys.argv[2]
prefix = sys.argv[3] if len(sys.argv) > 3 else ""
app = Celery("demo", broker="sqs://127.0.0.1:" + port)
app.conf.broker_transport_options = {"region": "us-east-1", "is_secure": False, "queue_name_prefix": prefix}
app.conf.task_queues = [Queue("celery"), Queue("reports.daily"), Queue("jobs.fifo"),
                        Queue("emails", Exchange("mail", type="direct"), routing_key="mail.send")]

sqs = boto3.client("sqs", endpoint_url="http://127.0.0.1:" + port, region_name="us-east-1")
eval(call)
out = {"call": call, "celery": "5.2.6", "kombu": "5.2.4", "prefix": prefix, "queues": {}, "send_message": sent}
for url in sqs.list_queues().get("QueueUrls", []):
    q = url.rsplit("/", 1)[1]
    msgs = []
    while True:
        r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                MessageAttributeNames=["All"], WaitTimeSeconds=0)
        if not r.get("Messages"):
            break
        for m in r["Messages"]:
            env = json.loads(base64.b64decode(m["Body"]))
            env["_decoded_body"] = json.loads(base64.b64decode(env["body"]))
            attrs = {k: v for k, v in m.get("Attributes", {}).items() if k in ("MessageGroupId", "MessageDeduplicationId")}
            msgs.append({"body": m["Body"], "envelope": env, "message_attributes": m.get("MessageAttributes", {}),
                         "attributes": attrs})
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    if msgs:
        out["queues"][q] = msgs
json.dump(out, open(name + ".json", "w"), indent=1, ensure_ascii=False)
print(name, {k: len(v) for k, v in out["queues"].items()})

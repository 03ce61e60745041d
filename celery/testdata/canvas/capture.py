# Captures what real Celery (Debian's python3-celery 5.2.6, Kombu 5.2.4)
# LPUSHes for a canvas call, as /work/shared/celery-wire/capture.py does,
# for celery/canvas_test.go. Start a Redis on a loopback port, then:
#   REDIS_PORT=6390 /usr/bin/python3 capture.py NAME "PYTHON CALL"
import base64, json, os, sys
import redis
from celery import Celery, chain, signature
app = Celery("demo", broker="redis://127.0.0.1:%s/0" % os.environ.get("REDIS_PORT", "6390"))
app.conf.timezone = "UTC"
@app.task(name="tasks.add")
def add(x, y):
    return x + y
@app.task(name="tasks.hello")
def hello(who="world"):
    return "hello " + who
r = redis.Redis(port=int(os.environ.get("REDIS_PORT", "6390")))
name, call = sys.argv[1], sys.argv[2]
r.flushdb()
eval(call)
out = {"call": call, "celery": "5.2.6", "kombu": "5.2.4", "redis": {}}
for k in sorted(r.keys("*")):
    t = r.type(k).decode(); ks = k.decode("latin-1")
    if t == "list":
        msgs = [json.loads(m) for m in r.lrange(k, 0, -1)]
        for m in msgs: m["_decoded_body"] = json.loads(base64.b64decode(m["body"]))
        out["redis"][ks] = {"type": "list", "values": msgs}
    elif t == "set":
        out["redis"][ks] = {"type": "set", "values": sorted(v.decode("latin-1") for v in r.smembers(k))}
json.dump(out, open(name + ".json", "w"), indent=1, ensure_ascii=False)
print(name, [(k, v["values"] if v["type"] == "set" else len(v["values"])) for k, v in out["redis"].items()])

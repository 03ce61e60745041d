"""Capture the AMQP frames real Celery writes, for beatd's golden test.

Runs Celery 5.2.6 / Kombu 5.2.4 / py-amqp 5.1.1 (Debian's packages) against a
real RabbitMQ through a recording TCP proxy, and writes NAME.json with every
declaration and publish the client sent, decoded field by field with the
AMQP type letter of every table value, plus the raw content-header bytes.

    RABBIT_PORT=5672 /usr/bin/python3 capture.py NAME "PYTHON CALL" ['CONF DICT']

Each run is a fresh process and connection, so Kombu's declaration cache is
empty, as in a freshly started producer. CONF is a dict merged into
app.conf, evaluated with kombu's Queue and Exchange in scope
(e.g. "{'task_queue_max_priority': 10}").
"""
import json
import os
import socket
import struct
import sys
import threading
import time

RABBIT = int(os.environ.get("RABBIT_PORT", "5672"))
recorded = bytearray()
lock = threading.Lock()


def pump(src, dst, record):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if record:
                with lock:
                    recorded.extend(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listener):
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", RABBIT))
        threading.Thread(target=pump, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, False), daemon=True).start()


class Reader:
    def __init__(self, buf):
        self.buf, self.off = bytes(buf), 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.off)
        self.off += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def shortstr(self):
        n = self.take(">B")
        s = self.buf[self.off:self.off + n]
        self.off += n
        return s.decode("utf-8")

    def longstr(self):
        n = self.take(">I")
        s = self.buf[self.off:self.off + n]
        self.off += n
        return s

    def table(self):
        n = self.take(">I")
        end = self.off + n
        out = []
        while self.off < end:
            k = self.shortstr()
            t, v = self.field()
            out.append([k, t, v])
        return out

    def field(self):
        t = chr(self.buf[self.off])
        self.off += 1
        if t == "S":
            return t, self.longstr().decode("utf-8")
        if t == "x":
            return t, self.longstr().hex()
        if t == "t":
            return t, bool(self.take(">B"))
        if t in "bB":
            return t, self.take(">b" if t == "b" else ">B")
        if t in "sU":
            return t, self.take(">h")
        if t == "u":
            return t, self.take(">H")
        if t == "I":
            return t, self.take(">i")
        if t == "i":
            return t, self.take(">I")
        if t == "L":
            return t, self.take(">q")
        if t == "l":
            return t, self.take(">q")
        if t == "f":
            return t, self.take(">f")
        if t == "d":
            return t, self.take(">d")
        if t == "D":
            scale, val = self.take(">Bi")
            return t, [scale, val]
        if t == "T":
            return t, self.take(">Q")
        if t == "F":
            return t, self.table()
        if t == "A":
            n = self.take(">I")
            end = self.off + n
            items = []
            while self.off < end:
                items.append(list(self.field()))
            return t, items
        if t == "V":
            return t, None
        raise ValueError("field type %r" % t)


PROPS = [("content_type", "s"), ("content_encoding", "s"), ("headers", "F"), ("delivery_mode", "B"),
         ("priority", "B"), ("correlation_id", "s"), ("reply_to", "s"), ("expiration", "s"),
         ("message_id", "s"), ("timestamp", "T"), ("type", "s"), ("user_id", "s"), ("app_id", "s"),
         ("cluster_id", "s")]


def bits(r, names):
    b = r.take(">B")
    return {n: bool(b & (1 << i)) for i, n in enumerate(names)}


def decode(stream):
    """Frames the client sent, as declarations and messages."""
    assert stream[:8] == b"AMQP\x00\x00\x09\x01", stream[:8]
    off, methods, messages, cur = 8, [], [], None
    while off + 7 <= len(stream):
        ftype, ch, size = struct.unpack_from(">BHI", stream, off)
        payload = stream[off + 7:off + 7 + size]
        off += 8 + size
        if ftype == 1:
            r = Reader(payload)
            cls, meth = r.take(">HH")
            if (cls, meth) == (40, 10):
                r.take(">H")
                m = {"method": "exchange.declare", "exchange": r.shortstr(), "type": r.shortstr()}
                m.update(bits(r, ["passive", "durable", "auto_delete", "internal", "nowait"]))
                m["arguments"] = r.table()
                methods.append(m)
            elif (cls, meth) == (50, 10):
                r.take(">H")
                m = {"method": "queue.declare", "queue": r.shortstr()}
                m.update(bits(r, ["passive", "durable", "exclusive", "auto_delete", "nowait"]))
                m["arguments"] = r.table()
                methods.append(m)
            elif (cls, meth) == (50, 20):
                r.take(">H")
                m = {"method": "queue.bind", "queue": r.shortstr(), "exchange": r.shortstr(),
                     "routing_key": r.shortstr()}
                m.update(bits(r, ["nowait"]))
                m["arguments"] = r.table()
                methods.append(m)
            elif (cls, meth) == (60, 40):
                r.take(">H")
                cur = {"exchange": r.shortstr(), "routing_key": r.shortstr()}
                cur.update(bits(r, ["mandatory", "immediate"]))
                messages.append(cur)
        elif ftype == 2 and cur is not None:
            r = Reader(payload)
            r.take(">HHQ")
            cur["properties_hex"] = payload[14:].hex()
            flags = r.take(">H")
            props = {}
            for i, (name, kind) in enumerate(PROPS):
                if flags & (1 << (15 - i)):
                    if kind == "s":
                        props[name] = r.shortstr()
                    elif kind == "F":
                        props[name] = r.table()
                    elif kind == "B":
                        props[name] = r.take(">B")
                    elif kind == "T":
                        props[name] = r.take(">Q")
            cur["properties"] = props
            cur["body"] = ""
        elif ftype == 3 and cur is not None:
            cur["body"] += payload.decode("utf-8")
    return methods, messages


def main():
    name, call = sys.argv[1], sys.argv[2]
    from kombu import Exchange, Queue
    conf_src = sys.argv[3] if len(sys.argv) > 3 else "{}"
    conf = eval(conf_src, {"Queue": Queue, "Exchange": Exchange})
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    port = listener.getsockname()[1]

    from celery import Celery
    app = Celery("capture", broker="pyamqp://guest:guest@127.0.0.1:%d//" % port)
    app.conf.update(conf)

    @app.task(name="tasks.add")
    def add(x, y):
        return x + y

    @app.task(name="tasks.hello")
    def hello(who="world"):
        return "hello " + who

    eval(call, {"app": app, "add": add, "hello": hello})
    with app.pool.acquire() as conn:
        conn.release()
    app.pool.force_close_all()
    time.sleep(0.3)
    with lock:
        methods, messages = decode(recorded)
    out = {"call": call, "conf": conf_src, "celery": "5.2.6", "kombu": "5.2.4", "py-amqp": "5.1.1",
           "rabbitmq": "3.10.8", "methods": methods, "messages": messages}
    with open(name + ".json", "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
    print(name, [m["method"] + " " + m.get("queue", m.get("exchange", "")) for m in methods], len(messages))


if __name__ == "__main__":
    main()

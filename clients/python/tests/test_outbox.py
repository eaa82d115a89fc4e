"""
The transactional outbox's client side: Standard Webhooks signing and
verification (the shared cases of ../../conformance/webhooks.json), the
relay (batches acknowledged after delivery, retries with backoff and
jitter, dead letters, generations, redelivery after a relay dies), the
receivers (ASGI, Django, Flask: one effect per webhook-id, in the
receiver's transaction) and the Redis Streams sink.  Against
../../conformance/outbox-fake.sql, a stand-in for the extension's outbox
calls, loaded into schema outbox_fake; and end to end against the
extension's own calls when it has them (skipped, saying so, when not).
"""

import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid

import psycopg
import pytest

from conftest import (APP_USER, CLIENT_DIR, DEADLINE, HERE, PYTHON, request,
                      su_connect, wait_until)
from pg_idempotency import StaleGeneration
from pg_idempotency.outbox import (DeadLetter, DeliveryError, OutboxLost,
                                   OutboxRelay, RedisStreamSink, WebhookSink,
                                   backoff_delay, outbox_ack,
                                   outbox_dead_letters, outbox_next, publish)
from pg_idempotency.webhooks import (WebhookVerificationError,
                                     generate_secret, sign, verify,
                                     webhook_headers)

CONFORMANCE = os.path.join(os.path.dirname(CLIENT_DIR), "conformance")
with open(os.path.join(CONFORMANCE, "webhooks.json")) as f:
    CASES = json.load(f)
SECRET = generate_secret()
FRAMEWORKS = ["asgi", "fastapi", "django", "flask"]
# before pg_catalog, where the extension's own calls are when it has them
FAKE = "-c search_path=outbox_fake,pg_catalog,%s,public" % APP_USER


def fake_connect(**kw):
    return psycopg.connect("user=%s" % APP_USER, options=FAKE, **kw)


@pytest.fixture(scope="module")
def fake():
    with open(os.path.join(CONFORMANCE, "outbox-fake.sql")) as f:
        sql = f.read()
    with su_connect() as c:
        c.execute(sql)
    with fake_connect(autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS %s.received ("
                  " consumer text, event_id text, n int)" % APP_USER)
        yield c


def uid(prefix):
    return "%s-%s" % (prefix, uuid.uuid4())


def publish_many(conn, topic, n, key=None):
    return [publish(conn, topic, {"n": i}, key=key) for i in range(n)]


def received(conn, consumer, ids):
    return [r[0] for r in conn.execute(
        "SELECT event_id FROM received WHERE consumer = %s AND"
        " event_id = ANY(%s) ORDER BY n", (consumer, list(ids)))]


class Endpoint:
    """An HTTP endpoint in this process: records what it gets and answers
    the statuses scripted per webhook-id (then 204)."""

    def __init__(self):
        self.got = []
        self.script = {}
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n)
                outer.got.append((dict((k.lower(), v) for k, v
                                       in self.headers.items()), body))
                left = outer.script.get(self.headers.get("webhook-id"))
                status = left.pop(0) if left else 204
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/" % self.server.server_port
        threading.Thread(target=self.server.serve_forever,
                         daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    e = Endpoint()
    yield e
    e.close()


def sleeps():
    slept = []
    return slept, slept.append


# ---------------------------------------------------------------- signatures

@pytest.mark.parametrize("case", CASES["sign"], ids=lambda c: c["id"])
def test_sign_vector(case):
    assert sign(CASES["secret"], case["id"], case["timestamp"],
                case["body"]) == case["signature"]
    assert sign(CASES["secret"], case["id"], case["timestamp"],
                case["body"].encode()) == case["signature"]


@pytest.mark.parametrize("case", CASES["verify"], ids=lambda c: c["name"])
def test_verify_cases(case):
    if case.get("ok"):
        assert verify(CASES["secret"], case["headers"], case["body"],
                      now=case["now"])[0] == case["headers"]["webhook-id"]
        return
    with pytest.raises(WebhookVerificationError) as e:
        verify(CASES["secret"], case["headers"], case["body"],
               now=case["now"])
    assert (e.value.http_status, e.value.problem) == \
        (case["status"], case["slug"])


def test_secret_rotation_and_bad_secrets():
    h = webhook_headers(SECRET, "msg_1", 1000, "x")
    assert verify([generate_secret(), SECRET], h, "x", now=1000)[0] == "msg_1"
    with pytest.raises(WebhookVerificationError):
        verify([generate_secret()], h, "x", now=1000)
    with pytest.raises(TypeError):
        sign("whsec_not base64!", "a", 1, "")
    with pytest.raises(TypeError):
        WebhookSink("http://127.0.0.1:1/", "whsec_")


def test_receivers_refuse_a_bad_secret_when_made():
    from pg_idempotency.asgi import WebhookEndpoint
    from pg_idempotency.django import webhook_receiver as django_receiver
    from pg_idempotency.flask import webhook_receiver as flask_receiver

    async def handler(conn, event):
        pass
    for make in (lambda s: WebhookEndpoint(handler, consumer="c", secret=s,
                                           conninfo=""),
                 lambda s: django_receiver(consumer="c", secret=s),
                 lambda s: flask_receiver(consumer="c", secret=s)):
        make(SECRET)
        with pytest.raises(TypeError):
            make([SECRET, "nope!"])


def test_async_handlers_where_they_would_never_run(fake):
    """A sync receiver given a coroutine function keeps nothing: Django's
    refuses it when made, receive_webhook rolls the record back."""
    from pg_idempotency.django import webhook_receiver as django_receiver
    from pg_idempotency.webhooks import receive_webhook

    async def handler(conn, event):
        pass
    with pytest.raises(TypeError):
        django_receiver(consumer="c", secret=SECRET)(handler)
    msg = uid("msg")
    body = json.dumps({"n": 1}).encode()
    h = webhook_headers(SECRET, msg, int(time.time()), body)
    with fake_connect() as c:
        with pytest.raises(TypeError):
            receive_webhook(c, "async-c", SECRET, h, body, handler)
        from pg_idempotency import consume_message
        assert consume_message(c, "async-c", msg) is True
        c.rollback()


def test_repeated_header_is_malformed():
    h = list(webhook_headers(SECRET, "msg_1", 1000, "x").items())
    h.append(("webhook-id", "msg_2"))
    with pytest.raises(WebhookVerificationError) as e:
        verify(SECRET, h, "x", now=1000)
    assert e.value.http_status == 400


def test_backoff():
    assert backoff_delay(1, 1.0, 60.0, lambda: 0) == 0.5
    assert backoff_delay(1, 1.0, 60.0, lambda: 1) == 1.0
    assert backoff_delay(3, 1.0, 60.0, lambda: 0.5) == 3.0
    assert backoff_delay(20, 1.0, 60.0, lambda: 1) == 60.0
    assert backoff_delay(20, 1.0, 60.0, lambda: 0) == 30.0


# ---------------------------------------------------------------- the fake

def test_publish_in_the_callers_transaction(fake):
    topic = uid("t")
    with fake_connect() as c:
        publish(c, topic, {"n": 1})
        c.rollback()
        kept = publish(c, topic, {"n": 2}, key="order-1",
                       headers={"x-kind": "created"})
        c.commit()
        b = outbox_next(c, "r", topic)
        c.commit()
    assert [e.event_id for e in b.events] == [kept]
    e = b.events[0]
    assert (e.payload, e.key, e.headers) == ({"n": 2}, "order-1",
                                             {"x-kind": "created"})


def test_next_until_ack(fake):
    topic = uid("t")
    ids = publish_many(fake, topic, 5)
    a = outbox_next(fake, "r", topic, 3)
    assert [e.event_id for e in a.events] == ids[:3]
    assert outbox_next(fake, "r", topic, 3) == a
    assert outbox_ack(fake, "r", topic, a.batch) is True
    assert outbox_ack(fake, "r", topic, a.batch) is False
    b = outbox_next(fake, "r", topic, 3)
    assert [e.event_id for e in b.events] == ids[3:]
    assert b.batch == a.batch + 1


# ---------------------------------------------------------------- the relay

def test_relay_body_headers_signature(fake, endpoint):
    topic = uid("t")
    j = publish(fake, topic, {"b": [1, 2], "a": "x"})
    r = publish(fake, topic, raw=b"\x00\x01\xff",
                headers={"content-type": "image/png", "webhook-id": "forged",
                         "x-tags": ["a", "b"]})
    relay = OutboxRelay(fake, relay="bytes", topic=topic,
                        sink=WebhookSink(endpoint.url, SECRET))
    assert relay.run_once()["delivered"] == 2
    (h0, b0), (h1, b1) = endpoint.got
    assert b0 == b'{"a": "x", "b": [1, 2]}'
    assert h0["content-type"] == "application/json"
    assert h0["webhook-id"] == j
    assert b1 == b"\x00\x01\xff"
    assert h1["content-type"] == "image/png"
    assert h1["x-tags"] == "a, b"
    assert h1["webhook-id"] == r
    for h, b in endpoint.got:
        assert abs(int(h["webhook-timestamp"]) - time.time()) < 300
        assert verify(SECRET, h, b)[0] == h["webhook-id"]


def test_relay_retries_with_backoff(fake, endpoint):
    topic = uid("t")
    ids = publish_many(fake, topic, 3)
    endpoint.script[ids[1]] = [500, 503, 429]
    slept, sleep = sleeps()
    relay = OutboxRelay(fake, relay="retry", topic=topic, sleep=sleep,
                        random=lambda: 0.5, initial_delay=0.1,
                        max_delay=0.25,
                        sink=WebhookSink(endpoint.url, SECRET))
    r = relay.run_once()
    assert (r["delivered"], r["dead_lettered"], r["acked"]) == (3, 0, True)
    assert slept == pytest.approx([0.075, 0.15, 0.1875])
    assert [h["webhook-id"] for h, _ in endpoint.got] == \
        [ids[0], ids[1], ids[1], ids[1], ids[1], ids[2]]


def test_dead_letter_continue(fake, endpoint):
    topic = uid("t")
    ids = publish_many(fake, topic, 3)
    endpoint.script[ids[0]] = [500] * 4
    slept, sleep = sleeps()
    kinds = []
    relay = OutboxRelay(fake, relay="dl", topic=topic, sleep=sleep,
                        max_attempts=4,
                        on_event=lambda k, i: kinds.append(k),
                        sink=WebhookSink(endpoint.url, SECRET))
    r = relay.run_once()
    assert (r["delivered"], r["dead_lettered"]) == (2, 1)
    assert len(slept) == 3 and "dead-letter" in kinds
    rows = [(d.event.event_id, d.reason, d.attempts, d.event.payload)
            for d in outbox_dead_letters(fake, "dl", topic)]
    assert rows == [(ids[0], "POST %s: HTTP 500" % endpoint.url, 4, {"n": 0})]
    assert outbox_dead_letters(fake, "other", topic) == []
    assert outbox_next(fake, "dl", topic).batch is None


def test_dead_letter_stop(fake, endpoint):
    topic = uid("t")
    ids = publish_many(fake, topic, 3)
    endpoint.script[ids[1]] = [500, 500]
    slept, sleep = sleeps()
    relay = OutboxRelay(fake, relay="dls", topic=topic, sleep=sleep,
                        max_attempts=2, on_dead_letter="stop",
                        sink=WebhookSink(endpoint.url, SECRET))
    with pytest.raises(DeadLetter) as e:
        relay.run_once()
    assert e.value.event.event_id == ids[1]
    assert len(outbox_dead_letters(fake, topic=topic)) == 1
    assert [x.event_id for x in outbox_next(fake, "dls", topic).events] \
        == ids
    assert relay.run_once()["delivered"] == 3


def test_generations_fence(fake, endpoint):
    topic = uid("t")
    publish_many(fake, topic, 2)
    sink = WebhookSink(endpoint.url, SECRET)
    zombie = OutboxRelay(fake, relay="g", topic=topic, generation=1,
                         sink=sink)
    taken = outbox_next(fake, "g", topic, generation=1)
    owner = OutboxRelay(fake, relay="g", topic=topic, generation=2,
                        sink=sink)
    with pytest.raises(StaleGeneration):
        outbox_next(fake, "g", topic)
    assert owner.run_once()["delivered"] == 2
    with pytest.raises(StaleGeneration):
        zombie.run_once()
    with pytest.raises(StaleGeneration):
        outbox_ack(fake, "g", topic, taken.batch, generation=1)
    with pytest.raises(StaleGeneration):
        zombie.run()


def test_loss(fake, endpoint):
    """A loss (ID003) stops the relay with OutboxLost, or is
    acknowledged with acknowledge_loss."""
    topic = uid("t")
    publish_many(fake, topic, 3)
    sink = WebhookSink(endpoint.url, SECRET)
    assert fake.execute("SELECT outbox_fake.lose(%s, %s)",
                        ("loss", topic)).fetchone()[0] == 3
    strict = OutboxRelay(fake, relay="loss", topic=topic, sink=sink)
    with pytest.raises(OutboxLost) as e:
        strict.run_once()
    assert (e.value.sqlstate, e.value.batch) == ("ID003", 1)
    with pytest.raises(OutboxLost):
        strict.run()
    kinds = []
    lenient = OutboxRelay(fake, relay="loss", topic=topic, sink=sink,
                          acknowledge_loss=True,
                          on_event=lambda k, i: kinds.append(k))
    assert lenient.run_once() == {"batch": 1, "delivered": 0,
                                  "dead_lettered": 0, "events": 0,
                                  "lost": True}
    assert kinds == ["loss"]
    after = publish(fake, topic, {"n": 9})
    assert lenient.run_once()["batch"] == 2
    assert [h["webhook-id"] for h, _ in endpoint.got] == [after]


def test_stop_during_backoff(fake, endpoint):
    topic = uid("t")
    ids = publish_many(fake, topic, 2)
    endpoint.script[ids[1]] = [500] * 6
    holder = {}

    def sleep(_):
        holder["relay"].stop()
    relay = OutboxRelay(fake, relay="st", topic=topic, sleep=sleep,
                        sink=WebhookSink(endpoint.url, SECRET))
    holder["relay"] = relay
    relay.run()
    assert outbox_dead_letters(fake, topic=topic) == []
    assert [x.event_id for x in outbox_next(fake, "st", topic).events] == ids


# ---------------------------------------------------------------- receivers

@pytest.fixture(scope="module")
def receivers(fake):
    from conftest import Server
    started = {}
    for fw in FRAMEWORKS:
        started[fw] = Server("webhook_receivers", {
            "WEBHOOK_FRAMEWORK": fw, "WEBHOOK_SECRET": SECRET})
    yield started
    for s in started.values():
        s.stop()


def post(port, headers, body):
    return request(port, "/hooks", body, list(headers.items()) + [
        ("Content-Type", "application/json")])


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_receiver_answers(fake, receivers, fw):
    port = receivers[fw].port
    msg = uid("msg")
    body = json.dumps({"n": 41}).encode()
    h = webhook_headers(SECRET, msg, int(time.time()), body)
    a = post(port, h, body)
    assert a.status == 200, a
    assert a.json() == {"id": msg, "status": "applied"}
    a = post(port, h, body)
    assert a.json() == {"id": msg, "status": "duplicate"}
    assert received(fake, fw, [msg]) == [msg]
    bad = dict(h, **{"webhook-signature": sign(
        generate_secret(), msg, int(h["webhook-timestamp"]), body)})
    a = post(port, bad, body)
    assert a.status == 401
    assert a.header("Content-Type") == "application/problem+json"
    assert a.json()["type"] == "tag:pg-idempotency,2026:webhook-signature"
    old = webhook_headers(SECRET, uid("msg"), int(time.time()) - 3600, body)
    a = post(port, old, body)
    assert a.status == 401
    assert a.json()["type"] == "tag:pg-idempotency,2026:webhook-timestamp"
    a = post(port, {"webhook-id": uid("msg")}, body)
    assert a.status == 400
    assert a.json()["type"] == "tag:pg-idempotency,2026:webhook-malformed"
    assert received(fake, fw, [old["webhook-id"]]) == []
    # the handler raises after its INSERT: 500, nothing kept, and the
    # redelivery is applied (the dedup record rolled back too)
    boom_id = uid("msg")
    boom = json.dumps({"n": 7, "explode": True}).encode()
    a = post(port, webhook_headers(SECRET, boom_id, int(time.time()), boom),
             boom)
    assert a.status == 500
    assert a.json()["type"] == "tag:pg-idempotency,2026:internal"
    assert received(fake, fw, [boom_id]) == []
    with fake_connect() as c:
        from pg_idempotency import consume_message
        assert consume_message(c, fw, boom_id) is True
        c.rollback()


def test_flask_async_receiver(fake, receivers):
    """An ``async def`` view under Flask's webhook_receiver runs (once)."""
    port = receivers["flask"].port
    msg = uid("msg")
    body = json.dumps({"n": 5}).encode()
    h = webhook_headers(SECRET, msg, int(time.time()), body)
    hdrs = list(h.items()) + [("Content-Type", "application/json")]
    a = request(port, "/hooks-async", body, hdrs)
    assert a.status == 200 and a.json() == {"id": msg, "status": "applied"}, a
    assert received(fake, "flask-async", [msg]) == [msg]
    a = request(port, "/hooks-async", body, hdrs)
    assert a.json() == {"id": msg, "status": "duplicate"}
    assert received(fake, "flask-async", [msg]) == [msg]


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_relay_to_receiver(fake, receivers, fw):
    topic = uid("t")
    ids = publish_many(fake, topic, 7)
    url = "http://127.0.0.1:%d/hooks" % receivers[fw].port
    relay = OutboxRelay(fake, relay="http", topic=topic, max_events=3,
                        sink=WebhookSink(url, SECRET))
    sizes = []
    while True:
        r = relay.run_once()
        if r["batch"] is None:
            break
        sizes.append(r["events"])
    assert sizes == [3, 3, 1]
    assert received(fake, fw, ids) == ids
    # the same events again (a relay that died before its ack)
    sink = WebhookSink(url, SECRET)
    for e in outbox_next(fake, "again", topic).events:
        sink(e)
    assert received(fake, fw, ids) == ids


def test_relay_sigkilled_mid_batch(fake, receivers):
    topic = uid("t")
    ids = publish_many(fake, topic, 20)
    url = "http://127.0.0.1:%d/hooks" % receivers["flask"].port
    env = dict(os.environ, PYTHONPATH=os.path.join(CLIENT_DIR, "src"),
               RELAY_TOPIC=topic, RELAY_URL=url, RELAY_SECRET=SECRET,
               RELAY_OPTIONS=FAKE, RELAY_PAUSE_AFTER="7",
               RELAY_MAX_EVENTS="20")
    p = subprocess.Popen([PYTHON, os.path.join(HERE, "outbox_relay_worker.py")],
                         env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "paused"
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    assert len(received(fake, "flask", ids)) == 7
    relay = OutboxRelay(fake, relay="killed", topic=topic, max_events=20,
                        sink=WebhookSink(url, SECRET))
    assert relay.run_once()["delivered"] == 20
    assert received(fake, "flask", ids) == ids


# ---------------------------------------------------------------- Redis

@pytest.fixture(scope="module")
def redis_client():
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed "
                    "(Debian: apt-get install redis-server)")
    try:
        import redis
    except ImportError:
        pytest.skip("redis-py is not installed (Debian: python3-redis)")
    d = tempfile.mkdtemp()
    sock = os.path.join(d, "redis.sock")
    p = subprocess.Popen([exe, "--port", "0", "--unixsocket", sock,
                          "--save", "", "--appendonly", "no"],
                         stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: os.path.exists(sock), "redis-server listens")
        client = redis.Redis(unix_socket_path=sock)
        yield client
        client.close()
    finally:
        p.terminate()
        p.wait()
        shutil.rmtree(d, ignore_errors=True)


def test_redis_stream_sink(fake, redis_client):
    topic = uid("t")
    a = publish(fake, topic, {"n": 1}, key="k1", headers={"h": "v"})
    b = publish(fake, topic, raw=b"raw bytes")
    relay = OutboxRelay(fake, relay="redis", topic=topic,
                        sink=RedisStreamSink(redis_client, "s-" + topic))
    assert relay.run_once()["delivered"] == 2
    entries = [m for _, m in redis_client.xrange("s-" + topic)]
    assert [m[b"event_id"].decode() for m in entries] == [a, b]
    assert entries[0][b"payload"] == b'{"n": 1}'
    assert entries[0][b"key"] == b"k1"
    assert entries[0][b"headers"] == b'{"h":"v"}'
    assert entries[1][b"payload_raw"] == b"raw bytes"
    assert b"payload" not in entries[1]


def test_redis_dedup_seconds(fake, redis_client):
    """A redelivered batch: a second entry per event, or none within
    dedup_seconds."""
    topic = uid("t")
    ids = publish_many(fake, topic, 2)
    for stream, dedup in (("plain-" + topic, None), ("once-" + topic, 3600)):
        sink = RedisStreamSink(redis_client, stream, dedup_seconds=dedup)
        events = outbox_next(fake, "r-" + stream, topic).events
        for e in events + events:
            sink(e, {"topic": topic})
        got = [m[b"event_id"].decode()
               for _, m in redis_client.xrange(stream)]
        assert got == (ids if dedup else ids + ids), stream
    assert redis_client.ttl("once-%s:dedup:%s" % (topic, ids[0])) > 3500
    with pytest.raises(TypeError):
        RedisStreamSink(redis_client, dedup_seconds=0)


# ---------------------------------------------------------------- the real one

def test_end_to_end_against_the_extension(receivers):
    with psycopg.connect("user=%s" % APP_USER, autocommit=True) as c:
        n = c.execute(
            "SELECT count(DISTINCT p.proname) FROM pg_proc p JOIN pg_depend d"
            " ON d.objid = p.oid"
            " JOIN pg_extension e ON d.refobjid = e.oid"
            " WHERE e.extname = 'idempotency' AND p.proname IN ("
            "'idem_publish', 'idem_outbox_next', 'idem_outbox_ack',"
            " 'idem_outbox_dead_letter')").fetchone()[0]
        if n != 4:
            pytest.skip("the installed extension has no idem_publish/"
                        "idem_outbox_next/idem_outbox_ack/"
                        "idem_outbox_dead_letter (the outbox core is not "
                        "merged yet)")
        topic = uid("t")
        kept = []
        for i in range(10):
            with psycopg.connect("user=%s" % APP_USER) as t:
                eid = publish(t, topic, {"n": i}, key="k")
                if i % 3 == 0:
                    t.rollback()
                else:
                    t.commit()
                    kept.append(eid)
        url = "http://127.0.0.1:%d/hooks" % receivers["asgi"].port
        relay = OutboxRelay(c, relay="e2e", topic=topic, max_events=4,
                            sink=WebhookSink(url, SECRET))
        while relay.run_once()["batch"] is not None:
            pass
        assert received(c, "asgi", kept) == kept
        # a dead letter, as the extension records and shows it
        dead = publish(c, topic, {"n": 99})

        def refuse(event, ctx=None):
            raise DeliveryError("refused")
        failing = OutboxRelay(c, relay="e2e", topic=topic, max_attempts=2,
                              sleep=lambda s: None, sink=refuse)
        assert failing.run_once()["dead_lettered"] == 1
        assert [(d.event.event_id, d.reason, d.attempts) for d in
                outbox_dead_letters(c, "e2e", topic)] == [(dead, "refused", 2)]
        assert failing.run_once()["batch"] is None


def test_run_waits_out_a_database_out_of_reach(fake, endpoint):
    """run() survives a connection that cannot be made or is lost: it waits
    (backoff) and connects again, and delivers what was published."""
    topic = uid("t")
    ids = publish_many(fake, topic, 2)
    calls = []
    kinds = []

    def connect():
        calls.append(1)
        if len(calls) == 1:
            raise psycopg.OperationalError("connection refused (a test)")
        return fake_connect(autocommit=True)
    holder = {}

    def on_event(kind, info):
        kinds.append(kind)
        if kind == "idle":
            holder["relay"].stop()
    relay = OutboxRelay(connect, relay="unreachable", topic=topic,
                        sleep=lambda s: None, on_event=on_event,
                        sink=WebhookSink(endpoint.url, SECRET))
    holder["relay"] = relay
    relay.run()
    assert kinds[0] == "database-unavailable"
    assert [h["webhook-id"] for h, _ in endpoint.got] == ids
    # the connection lost under the relay: closed, and made again
    relay._conn.close()
    publish(fake, topic, {"n": 3})
    relay._stop.clear()
    relay.run()
    assert len(endpoint.got) == 3

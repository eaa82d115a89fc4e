"""
The Python driver of the clients' conformance suite: every case of
clients/conformance/cases.json against the conformance app of each
adapter (servers/conformance_*.py) behind a real server.  The Node.js
driver (clients/node/test/conformance.test.js) runs the same cases against
the Node.js adapters.
"""

import concurrent.futures
import http.client
import json
import os
import socket
import uuid

import pytest

from conftest import (CLIENT_DIR, DEADLINE, Answer, Server, app_connect,
                      request, wait_until)

SUITE = json.load(open(os.path.join(CLIENT_DIR, "..", "conformance",
                                    "cases.json"), encoding="utf-8"))

ADAPTERS = {
    "fastapi": ("conformance_asgi", {"IDEM_FRAMEWORK": "fastapi"}),
    "starlette": ("conformance_asgi", {"IDEM_FRAMEWORK": "starlette"}),
    "django-middleware": ("conformance_django", {"IDEM_DJANGO": "middleware"}),
    "django-decorator": ("conformance_django", {"IDEM_DJANGO": "decorator"}),
    "flask": ("conformance_flask", {}),
}

TABLE = ("CREATE TABLE IF NOT EXISTS conformance_charges ("
         " id bigserial PRIMARY KEY, caller text, route text, amount int,"
         " currency text)")
BLOCKED = ("SELECT count(*) FROM pg_stat_activity WHERE application_name ="
           " 'idem-conformance' AND wait_event_type = 'Lock'")


@pytest.fixture(scope="module")
def db():
    """The driver's own connection (autocommit), for counts and waits."""
    with app_connect(autocommit=True) as c:
        c.execute(TABLE)
        yield c


@pytest.fixture(scope="module", params=list(ADAPTERS))
def app(request, db):
    name, env = ADAPTERS[request.param]
    s = Server(name, env)
    yield s
    s.stop()


def headers_of(send, prefix):
    hdrs = []
    for k, v in (send.get("headers") or {}).items():
        hdrs.append((k, v))
    if send.get("caller"):
        hdrs.append(("Authorization", "Bearer %s" % send["caller"]))

    def of_length(n):
        return (prefix + "-").ljust(n, "k")
    if "key" in send:
        hdrs.append(("Idempotency-Key", '"%s-%s"' % (prefix, send["key"])))
    if "bareKey" in send:
        hdrs.append(("Idempotency-Key", "%s-%s" % (prefix, send["bareKey"])))
    if "keyOfLength" in send:
        hdrs.append(("Idempotency-Key", '"%s"' % of_length(send["keyOfLength"])))
    if "bareKeyOfLength" in send:
        hdrs.append(("Idempotency-Key", of_length(send["bareKeyOfLength"])))
    for v in send.get("rawKeys", []):
        hdrs.append(("Idempotency-Key", v))
    return hdrs


def announce(port, path, hdrs, length):
    """The head of a request announcing LENGTH bytes of body, not sent (a
    server that answers early and closes may reset a connection whose
    client is still sending); the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    try:
        lines = ["POST %s HTTP/1.1" % path, "Host: 127.0.0.1",
                 "Content-Type: application/json",
                 "Content-Length: %d" % length, "Connection: close"]
        lines += ["%s: %s" % kv for kv in hdrs]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        r = http.client.HTTPResponse(sock)
        r.begin()
        return Answer(r.status, r.getheaders(), r.read())
    finally:
        sock.close()


def send(port, send, prefix):
    hdrs = headers_of(send, prefix)
    if "announceLength" in send:
        return announce(port, send["path"], hdrs, send["announceLength"])
    body = b""
    if "json" in send:
        body = json.dumps(send["json"]).encode("utf-8")
    if "body" in send:
        body = send["body"].encode("utf-8")
    return request(port, send["path"], body, hdrs,
                   method=send.get("method", "POST"))


def check(ans, expect, saved, what):
    at = "%s: %r" % (what, ans)
    if "status" in expect:
        assert ans.status == expect["status"], at
    if "statusAtLeast" in expect:
        assert ans.status >= expect["statusAtLeast"], at
    if "replayed" in expect:
        assert ans.replayed == expect["replayed"], at
    if "problem" in expect:
        assert ans.header("Content-Type").startswith(
            "application/problem+json"), at
        doc = ans.json()
        assert doc["type"] == SUITE["problem_base"] + expect["problem"], at
        assert doc["status"] == ans.status, at
        assert isinstance(doc["title"], str), at
        assert doc["key_retention_seconds"] == SUITE["key_retention_seconds"], at
        assert ans.header("Link") is None, at
        if ans.status in (409, 503):
            assert ans.header("Retry-After") == "1", at
    for k, v in expect.get("json", {}).items():
        assert ans.json().get(k) == v, "%s: %s" % (at, k)
    for h in expect.get("has", []):
        assert ans.header(h) is not None, "%s: has %s" % (at, h)
    for h in expect.get("lacks", []):
        assert ans.header(h) is None, "%s: lacks %s" % (at, h)
    if "contentTypePrefix" in expect:
        assert ans.header("Content-Type").startswith(
            expect["contentTypePrefix"]), at
    if "sameAs" in expect:
        first = saved[expect["sameAs"]]
        assert ans.status == first.status, at
        assert ans.body == first.body, at
        for h in expect.get("sameHeaders", []):
            assert ans.header(h) == first.header(h), "%s: %s" % (at, h)
    if expect.get("policy"):
        assert ans.json() == SUITE["policy"], at


@pytest.mark.parametrize("case", SUITE["cases"], ids=lambda c: c["name"])
def test_conformance(app, db, case):
    def scalar(sql):
        return db.execute(sql).fetchone()[0]
    prefix = "c-%s" % uuid.uuid4()
    saved = {}
    background = {}
    lock = None
    pool = concurrent.futures.ThreadPoolExecutor(24)
    before = scalar("SELECT count(*) FROM conformance_charges")
    try:
        for i, step in enumerate(case["steps"]):
            what = "step %d" % (i + 1)
            if step.get("lock"):
                lock = app_connect()
                lock.execute("LOCK TABLE conformance_charges IN EXCLUSIVE MODE")
            elif step.get("unlock"):
                lock.rollback()
                lock.close()
                lock = None
            elif "waitBlocked" in step:
                wait_until(lambda: scalar(BLOCKED) >= step["waitBlocked"],
                           "a request waits at its INSERT")
            elif "join" in step:
                ans = background[step["join"]].result(DEADLINE)
                check(ans, step.get("expect", {}), saved, what)
                if "save" in step:
                    saved[step["save"]] = ans
            elif "parallel" in step:
                answers = list(pool.map(
                    lambda _: send(app.port, step["send"], prefix),
                    range(step["parallel"])))
                fresh = [a for a in answers
                         if a.status == 201 and not a.replayed]
                assert len(fresh) == 1, answers
                for a in answers:
                    if a is fresh[0]:
                        continue
                    if a.status == 409:
                        check(a, {"problem": "in-progress"}, saved, what)
                    else:
                        check(a, {"status": 201, "replayed": True}, saved,
                              what)
                        assert a.body == fresh[0].body, what
            elif "background" in step:
                background[step["background"]] = pool.submit(
                    send, app.port, step["send"], prefix)
            else:
                ans = send(app.port, step["send"], prefix)
                check(ans, step.get("expect", {}), saved, what)
                if "save" in step:
                    saved[step["save"]] = ans
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        pool.shutdown(wait=True)
    after = scalar("SELECT count(*) FROM conformance_charges")
    assert after - before == case["charges"], "charges made by the case"

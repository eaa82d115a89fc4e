"""
The HTTP adapters behind real servers (uvicorn for FastAPI and Starlette,
wsgiref for Django, werkzeug for Flask) with real concurrent clients.
Every test asserts what must hold whatever the timing: how many charges
exist, which answers are possible, and that replays are byte for byte.
"""

import base64
import concurrent.futures
import json
import threading

import pytest

from conftest import (APP_USER, DEADLINE, Server, charges_for,
                      new_key, request, scalar, su_connect, wait_until)

FRAMEWORKS = {
    "fastapi": ("asgi_app", {"IDEM_FRAMEWORK": "fastapi"}),
    "starlette": ("asgi_app", {"IDEM_FRAMEWORK": "starlette"}),
    "django": ("django_app", {}),
    "flask": ("flask_app", {}),
}


@pytest.fixture(scope="module", params=list(FRAMEWORKS))
def svc(request):
    name, env = FRAMEWORKS[request.param]
    s = Server(name, env)
    s.framework = request.param
    yield s
    s.stop()


@pytest.fixture(scope="module")
def wait_svc(svc):
    """The same framework with wait=30 and too_large_status=413."""
    name, env = FRAMEWORKS[svc.framework]
    s = Server(name, dict(env, IDEM_WAIT="30", IDEM_TOO_LARGE_STATUS="413"))
    yield s
    s.stop()


def key_header(key):
    return ("Idempotency-Key", '"%s"' % key)


def charge(port, key, amount=1999, extra=(), body=None, path="/charges"):
    if body is None:
        body = json.dumps({"amount": amount, "currency": "eur"}).encode()
    hdrs = ([key_header(key)] if key is not None else []) + list(extra)
    return request(port, path, body, hdrs)


def total_charges():
    return scalar("SELECT count(*) FROM app.charges")


def problem(ans, status):
    assert ans.status == status, ans
    assert ans.header("Content-Type").startswith("application/problem+json")
    doc = ans.json()
    assert doc["status"] == status
    assert doc["type"].startswith("http://docs.example/idempotency#")
    assert doc["key_retention_seconds"] == 7200
    assert ans.header("Link") == '<http://docs.example/idempotency>; rel="describedby"'
    return doc


def test_first_request_then_replay(svc):
    key = new_key()
    first = charge(svc.port, key)
    assert first.status == 201, first
    assert not first.replayed
    assert first.header("Location") == "/charges/%d" % first.json()["id"]
    assert first.all("Set-Cookie")          # the handler's own answer has it
    # the same JSON, other key order and spacing: the same request
    body = b'{ "currency":"eur",   "amount":1999 }'
    again = charge(svc.port, key, body=body)
    assert again.status == 201 and again.replayed, again
    assert again.body == first.body
    assert again.header("Location") == first.header("Location")
    assert again.header("ETag") == first.header("ETag")
    assert again.header("Content-Type") == "application/json"
    assert again.all("Set-Cookie") == []    # never replayed
    assert again.all("X-Not-Replayed") == []  # not in the allowlist
    assert charges_for(key) == 1


def test_flask_async_view(svc):
    """An ``async def`` view under @idempotent runs once and replays."""
    if svc.framework != "flask":
        pytest.skip("an async view under the Flask decorator")
    key = new_key()
    first = charge(svc.port, key, path="/async-charges")
    assert first.status == 201 and not first.replayed, first
    again = charge(svc.port, key, path="/async-charges")
    assert again.status == 201 and again.replayed, again
    assert again.body == first.body
    assert charges_for(key) == 1


def test_mismatch_is_422(svc):
    key = new_key()
    assert charge(svc.port, key, 100).status == 201
    doc = problem(charge(svc.port, key, 200), 422)
    assert doc["type"].endswith("#mismatch")
    assert charges_for(key) == 1
    assert charge(svc.port, key, 100).replayed


@pytest.mark.parametrize("name,headers,status", [
    ("no key", [], 400),
    ("empty key", [("Idempotency-Key", '""')], 400),
    ("256 bytes", [("Idempotency-Key", '"%s"' % ("k" * 256))], 400),
    ("two fields", [("Idempotency-Key", '"k-a"'), ("Idempotency-Key", '"k-b"')], 400),
    ("invalid characters", [("Idempotency-Key", "bad key!")], 400),
    ("unterminated string", [("Idempotency-Key", '"k-open')], 400),
])
def test_bad_input_writes_nothing(svc, name, headers, status):
    before = total_charges()
    body = json.dumps({"amount": 5, "currency": "eur"}).encode()
    ans = request(svc.port, "/charges", body, headers)
    problem(ans, status)
    assert total_charges() == before


def test_body_over_limit_is_413(svc):
    """Content-Length over max_body_bytes: 413 before the body is read.
    The body is announced and not sent (a server that answers early and
    closes may reset a connection whose client is still sending)."""
    import http.client
    import socket
    before = total_charges()
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=DEADLINE)
    try:
        sock.sendall(("POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Idempotency-Key: \"%s\"\r\n"
                      "Content-Type: application/json\r\n"
                      "Content-Length: %d\r\nConnection: close\r\n\r\n"
                      % (new_key(), 1024 * 1024 + 1)).encode())
        r = http.client.HTTPResponse(sock)
        r.begin()
        from conftest import Answer
        ans = Answer(r.status, r.getheaders(), r.read())
    finally:
        sock.close()
    problem(ans, 413)
    assert total_charges() == before


def test_255_byte_key_and_bare_key(svc):
    long_key = new_key().ljust(255, "k")
    assert len(long_key) == 255
    assert charge(svc.port, long_key).status == 201
    bare = new_key()
    first = request(svc.port, "/charges", b'{"amount": 1, "currency": "eur"}',
                    [("Idempotency-Key", bare)])
    assert first.status == 201 and not first.replayed
    # its quoted form names the same key
    assert charge(svc.port, bare, 1).replayed


def test_keys_are_per_caller(svc):
    key = new_key()

    def as_user(u):
        return ("Authorization", "Basic " +
                base64.b64encode(("%s:pw" % u).encode()).decode())
    a = charge(svc.port, key, extra=[as_user("alice")])
    b = charge(svc.port, key, extra=[as_user("bob")])
    anon = charge(svc.port, key)
    assert (a.status, b.status, anon.status) == (201, 201, 201)
    assert not a.replayed and not b.replayed and not anon.replayed
    assert charge(svc.port, key, extra=[as_user("alice")]).body == a.body
    assert charges_for(key) == 3


def test_twenty_parallel_requests_one_charge(svc):
    key = new_key()
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        answers = list(ex.map(
            lambda _: charge(svc.port, key, extra=[("Test-Delay-Ms", "300")]),
            range(20)))
    assert charges_for(key) == 1
    made = [a for a in answers if a.status == 201 and not a.replayed]
    replays = [a for a in answers if a.status == 201 and a.replayed]
    conflicts = [a for a in answers if a.status == 409]
    assert len(made) == 1, answers
    assert len(made) + len(replays) + len(conflicts) == 20, answers
    assert all(r.body == made[0].body for r in replays)
    for c in conflicts:
        problem(c, 409)
        assert c.header("Retry-After") == "1"
    after = charge(svc.port, key)
    assert after.replayed and after.body == made[0].body


def test_twenty_parallel_requests_wait_and_replay(wait_svc):
    key = new_key()
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        answers = list(ex.map(
            lambda _: charge(wait_svc.port, key, extra=[("Test-Delay-Ms", "300")]),
            range(20)))
    assert charges_for(key) == 1
    assert all(a.status == 201 for a in answers), answers
    assert sum(not a.replayed for a in answers) == 1
    assert len({a.body for a in answers}) == 1


class Blocker:
    """Holds an EXCLUSIVE lock on app.charges in a transaction, so that a
    request stops at its INSERT, after its claim, for as long as the test
    needs."""

    def __enter__(self):
        self.conn = su_connect()
        self.conn.autocommit = False
        self.conn.execute("LOCK TABLE app.charges IN EXCLUSIVE MODE")
        return self

    def __exit__(self, *exc):
        self.conn.rollback()
        self.conn.close()


def waiting_requests():
    return scalar("SELECT count(*) FROM pg_stat_activity WHERE "
                  "application_name = 'idem-test-server' AND "
                  "wait_event_type = 'Lock'")


def test_duplicate_in_flight_is_409_then_replayed(svc):
    key = new_key()
    results = {}
    with Blocker():
        t = threading.Thread(target=lambda: results.setdefault(
            "first", charge(svc.port, key)))
        t.start()
        wait_until(lambda: waiting_requests() >= 1,
                   "the first request waits at its INSERT")
        dup = charge(svc.port, key)
        doc = problem(dup, 409)
        assert doc["type"].endswith("#in-progress")
        assert dup.header("Retry-After") == "1"
    t.join(DEADLINE)
    first = results["first"]
    assert first.status == 201 and not first.replayed
    again = charge(svc.port, key)
    assert again.replayed and again.body == first.body
    assert charges_for(key) == 1


def test_wait_that_runs_out_is_busy(svc):
    """wait=0.3 and busy_status=503: a duplicate waits for the request in
    flight, its lock_timeout expires (55P03): 503 with Retry-After."""
    name, env = FRAMEWORKS[svc.framework]
    busy = Server(name, dict(env, IDEM_WAIT="0.3", IDEM_BUSY_STATUS="503"))
    try:
        key = new_key()
        results = {}
        with Blocker():
            t = threading.Thread(target=lambda: results.setdefault(
                "first", charge(busy.port, key)))
            t.start()
            wait_until(lambda: waiting_requests() >= 1,
                       "the first request waits at its INSERT")
            dup = charge(busy.port, key)
            doc = problem(dup, 503)
            assert doc["type"].endswith("#busy")
            assert dup.header("Retry-After") == "1"
        t.join(DEADLINE)
        assert results["first"].status == 201
        assert charges_for(key) == 1
    finally:
        busy.stop()


def test_crash_before_commit_then_retry_makes_one(svc):
    key = new_key()
    try:
        ans = charge(svc.port, key, extra=[("Test-Crash", "1")])
        pytest.fail("the server answered %r" % ans)
    except (ConnectionError, OSError):
        pass
    wait_until(lambda: not svc.alive(), "the server is gone")
    svc.restart_if_dead()
    assert charges_for(key) == 0

    def retry():
        ans = charge(svc.port, key)
        return ans if ans.status != 409 else None
    # 409 only until the dead server's transaction has rolled back
    ans = wait_until(retry, "the retry is no longer in conflict")
    assert ans.status == 201 and not ans.replayed
    assert charges_for(key) == 1


@pytest.mark.parametrize("hook,status", [(("Test-Status", "503"), 503),
                                         (("Test-Fail", "1"), 500)])
def test_5xx_is_not_stored_and_retry_runs(svc, hook, status):
    key = new_key()
    ans = charge(svc.port, key, extra=[hook])
    assert ans.status == status and not ans.replayed
    assert charges_for(key) == 0            # rolled back
    with su_connect() as c:
        c.execute("SET ROLE %s" % APP_USER)
        assert c.execute("SELECT count(*) FROM idem_lookup(%s, %s)",
                         (key, "POST /charges")).fetchone()[0] == 0
    retry = charge(svc.port, key)
    assert retry.status == 201 and not retry.replayed
    assert charges_for(key) == 1


def test_response_over_max_response_bytes(svc, wait_svc):
    for s, status in ((svc, 500), (wait_svc, 413)):
        key = new_key()
        ans = charge(s.port, key, extra=[("Test-Big", "70000")])
        doc = problem(ans, status)
        assert doc["type"].endswith("#response-too-large")
        assert charges_for(key) == 0
        retry = charge(s.port, key)
        assert retry.status == 201 and not retry.replayed
        assert charges_for(key) == 1


def test_raw_bytes_replayed_exactly(svc):
    key = new_key()
    blob = bytes(range(256)) * 4 + b"\x00\xff"
    hdrs = [key_header(key), ("Content-Type", "application/octet-stream")]
    first = request(svc.port, "/blobs", blob, hdrs)
    assert first.status == 200 and first.body == blob[::-1]
    again = request(svc.port, "/blobs", blob, hdrs)
    assert again.replayed and again.body == first.body
    assert again.header("Content-Type") == "application/octet-stream"
    changed = request(svc.port, "/blobs", blob + b"!", hdrs)
    assert changed.status == 422


def test_retention_is_advertised_and_real(svc):
    ans = request(svc.port, "/idempotency", method="GET")
    assert ans.status == 200
    assert ans.json()["key_retention_seconds"] == 7200
    key = new_key()
    assert charge(svc.port, key).status == 201
    with su_connect() as c:
        c.execute("SET ROLE %s" % APP_USER)
        secs = c.execute("SELECT extract(epoch FROM expires_at - claimed_at)::int "
                         "FROM idem_lookup(%s, %s)", (key, "POST /charges")).fetchone()
    assert secs == (7200,)


def test_expired_and_remembered_key_is_410(svc):
    """A retry after the key's retention, while the server remembers it
    (idempotency.key_memory, set on the test database by test.sh): 410
    expired, the handler does not run again; a new key runs."""
    name, env = FRAMEWORKS[svc.framework]
    s = Server(name, dict(env, IDEM_TTL="1 second", IDEM_KEY_MEMORY="30 days"))
    try:
        assert s.port and request(s.port, "/idempotency", method="GET").json()[
            "key_memory_seconds"] == 30 * 86400
        key = new_key()
        assert charge(s.port, key).status == 201

        def expired():
            with su_connect() as c:
                c.execute("SET ROLE %s" % APP_USER)
                return c.execute("SELECT status FROM idem_lookup(%s, %s)",
                                 (key, "POST /charges")).fetchone()
        assert wait_until(lambda: expired() == ("expired",),
                          "the key expired and remembered")
        ans = charge(s.port, key)
        assert ans.status == 410, ans
        doc = ans.json()
        assert doc["type"] == "http://docs.example/idempotency#expired"
        assert doc["status"] == 410
        assert doc["key_retention_seconds"] == 1
        assert doc["key_memory_seconds"] == 30 * 86400
        assert ans.header("Retry-After") is None
        assert charges_for(key) == 1
        assert charge(s.port, new_key()).status == 201
    finally:
        s.stop()


def test_store_unreachable_is_503_never_run_anyway(servers):
    """Django with its database unreachable: 503 with Retry-After, and the
    handler does not run without its key."""
    s = servers("django_app", PGHOST="/nonexistent-socket-dir")
    key = new_key()
    ans = charge(s.port, key)
    doc = problem(ans, 503)
    assert doc["type"].endswith("#unavailable")
    assert ans.header("Retry-After") == "1"
    assert charges_for(key) == 0

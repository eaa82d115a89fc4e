"""Policy.handle and handle_async on a real connection: a deadlock or
serialization failure runs the request again; when the attempts run out
the answer is 503; nothing of a failed attempt stays."""

import asyncio

import psycopg
import psycopg.errors

from pg_idempotency import AsyncPsycopgRunner, PsycopgRunner
from pg_idempotency.http import Options, Policy, RequestInfo, Response
from conftest import APP_USER, charges_for, new_key


def info():
    return RequestInfo(method="POST", path="/p", route="/p", query="",
                       caller="tester", content_type="application/json",
                       body=b'{"a": 1}')


def test_retried_after_deadlock(conn):
    key = new_key()
    attempts = []
    policy = Policy(Options(attempts=3))

    def call():
        attempts.append(1)
        conn.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
        if len(attempts) == 1:
            raise psycopg.errors.DeadlockDetected("simulated")
        if len(attempts) == 2:
            raise psycopg.errors.SerializationFailure("simulated")
        return Response(201, [("Content-Type", "text/plain")], b"made")
    resp = policy.handle(PsycopgRunner(conn), *policy.prepare(info(), key), call)
    assert resp.status == 201 and resp.body == b"made"
    assert len(attempts) == 3
    assert charges_for(key) == 1


def test_attempts_run_out_503(conn):
    key = new_key()
    policy = Policy(Options(attempts=2))

    def call():
        conn.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
        raise psycopg.errors.DeadlockDetected("simulated")
    resp = policy.handle(PsycopgRunner(conn), *policy.prepare(info(), key), call)
    assert resp.status == 503
    assert ("Retry-After", "1") in resp.headers
    assert charges_for(key) == 0


def test_async_retried_after_deadlock():
    key = new_key()

    async def main():
        attempts = []
        policy = Policy(Options())
        async with await psycopg.AsyncConnection.connect("user=%s" % APP_USER) as c:
            async def call():
                attempts.append(1)
                await c.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
                if len(attempts) == 1:
                    raise psycopg.errors.DeadlockDetected("simulated")
                return Response(201, [], b"ok")
            resp = await policy.handle_async(AsyncPsycopgRunner(c), *policy.prepare(info(), key), call)
            again = await policy.handle_async(AsyncPsycopgRunner(c), *policy.prepare(info(), key), call)
        return resp, again, attempts
    resp, again, attempts = asyncio.run(main())
    assert resp.status == 201 and again.replayed and again.body == b"ok"
    assert len(attempts) == 2
    assert charges_for(key) == 1


# ---------------------------------------------------------------- prepare

def test_no_caller_is_refused_unless_anonymous():
    import pytest
    from pg_idempotency import NoCaller
    anon = RequestInfo(method="POST", path="/p/1", route="/p/{id}", query="",
                       caller="", content_type="", body=b"")
    with pytest.raises(NoCaller):
        Policy(Options()).prepare(anon, "k")
    key, scope, _ = Policy(Options(anonymous=True)).prepare(anon, "k")
    assert (key, scope) == ("k", "POST /p/{id}")
    # a scope function that finds nothing is refused the same way
    with pytest.raises(NoCaller):
        Policy(Options(scope=lambda i: None)).prepare(anon, "k")
    key, scope, _ = Policy(Options()).prepare(info(), "k")
    assert scope == '["tester","POST","/p"]'


def test_long_scopes_are_hashed():
    long = RequestInfo(method="POST", path="/p", route="/p", query="",
                       caller="u" * 300, content_type="", body=b"")
    _, scope, _ = Policy(Options()).prepare(long, "k")
    assert scope.startswith("sha256:") and len(scope) == 71


def test_fingerprint_fields_and_the_key_option():
    import json
    policy = Policy(Options(fingerprint_fields=["amount", "card.last4"],
                            key=lambda i: i.header("Webhook-Id")))

    def fp(body, hdrs=(("Webhook-Id", "m-1"),)):
        i = RequestInfo(method="POST", path="/p", route="/p", query="q=1",
                        caller="tester", content_type="application/json",
                        body=json.dumps(body).encode(), headers=hdrs)
        key, _, request = policy.prepare(i, None)
        return key, json.loads(request)
    key, a = fp({"amount": 5, "card": {"last4": "4242"}, "sent_at": 1})
    assert key == "m-1"
    assert a == {"method": "POST", "path": "/p", "query": "q=1",
                 "body": {"amount": 5, "card.last4": "4242"}}
    assert fp({"amount": 5, "card": {"last4": "4242"}, "sent_at": 2})[1] == a
    assert fp({"amount": 6, "card": {"last4": "4242"}})[1] != a
    import pytest
    from pg_idempotency.http import BadKey
    with pytest.raises(BadKey) as e:
        fp({"amount": 5}, hdrs=())
    assert e.value.problem == "missing-key"


def test_a_fingerprint_with_nul_is_kept_by_its_digest():
    policy = Policy(Options(fingerprint=lambda i: {"note": "a\u0000b"}))
    _, _, request = policy.prepare(info(), "k")
    assert "sha256" in str(request) and "\\u0000" not in str(request)


def test_problem_documents_and_policy_are_the_shared_ones():
    import json
    policy = Policy(Options())
    resp = policy.error_response(KeyMismatchErr())
    doc = json.loads(resp.body)
    assert doc["type"] == "tag:pg-idempotency,2026:mismatch"
    assert doc["key_retention_seconds"] == 86400
    assert not any(k == "Link" for k, _ in resp.headers)
    busy = policy.error_response(InProgressErr())
    assert ("Retry-After", "1") in busy.headers
    doc = Policy(Options(wait="10 seconds")).policy_document()
    assert doc["wait_seconds"] == 10
    assert doc["concurrent_duplicate"] == "waits up to 10 s for the first request, then 409"


def KeyMismatchErr():
    from pg_idempotency import KeyMismatch
    return KeyMismatch()


def InProgressErr():
    from pg_idempotency import KeyInProgress
    return KeyInProgress()

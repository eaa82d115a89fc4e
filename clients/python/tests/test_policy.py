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
                       caller="", content_type="application/json",
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
    resp = policy.handle(PsycopgRunner(conn), info(), key, call)
    assert resp.status == 201 and resp.body == b"made"
    assert len(attempts) == 3
    assert charges_for(key) == 1


def test_attempts_run_out_503(conn):
    key = new_key()
    policy = Policy(Options(attempts=2))

    def call():
        conn.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
        raise psycopg.errors.DeadlockDetected("simulated")
    resp = policy.handle(PsycopgRunner(conn), info(), key, call)
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
            resp = await policy.handle_async(AsyncPsycopgRunner(c), info(), key, call)
            again = await policy.handle_async(AsyncPsycopgRunner(c), info(), key, call)
        return resp, again, attempts
    resp, again, attempts = asyncio.run(main())
    assert resp.status == 201 and again.replayed and again.body == b"ok"
    assert len(attempts) == 2
    assert charges_for(key) == 1

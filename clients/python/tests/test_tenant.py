"""
A consumed message's tenant (for a message ledger distributed by Citus,
extension 0.5.0): every entry point that consumes message ids takes
tenant=, and passes it through idem_consume_message(s)' four-argument
form only when it is given; without it, the three-argument call of 0.4.0
is made, as before.  The server here does not distribute its ledger, so
the four-argument form ignores the tenant and the answers cannot tell the
forms apart: ../../conformance/tenant-spy.sql puts a logging stand-in of
each form before pg_catalog in search_path, and the tests read which
form each call resolved to and what it received.  The same calls also run
against the extension's own functions (no spy).
"""

import asyncio
import json
import os
import time
import uuid

import psycopg
import psycopg2
import pytest

import pg_idempotency as pi
import pg_idempotency.aio as aio
from conftest import APP_USER, CLIENT_DIR, Server, request, su_connect
from pg_idempotency import _protocol as P
from pg_idempotency.webhooks import (generate_secret, receive_webhook,
                                     receive_webhook_async, webhook_headers)

SPY_SQL = os.path.join(os.path.dirname(CLIENT_DIR), "conformance",
                       "tenant-spy.sql")
# the spies before pg_catalog, where the extension's functions are
SPY_PATH = "tenant_spy,pg_catalog,%s,public" % APP_USER
SPY = "-c search_path=" + SPY_PATH
SECRET = generate_secret()
FRAMEWORKS = ["asgi", "fastapi", "django", "flask"]


@pytest.fixture(scope="module", autouse=True)
def spy():
    with open(SPY_SQL) as f:
        sql = f.read()
    with su_connect() as c:
        c.execute(sql)
    with psycopg.connect("user=%s" % APP_USER, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS received ("
                  " consumer text, event_id text, n int)")


def calls(consumer, ids=None):
    """(function, nargs, ids, tenant) of each call the spies saw for
    CONSUMER (and for one of IDS, when given), in order."""
    with su_connect() as c:
        return [tuple(r) for r in c.execute(
            "SELECT fn, nargs, message_ids, tenant FROM tenant_spy.calls"
            " WHERE consumer = %s AND (%s::text[] IS NULL OR"
            " message_ids && %s::text[]) ORDER BY n",
            (consumer, ids, ids))]


def uid(prefix):
    return "%s-%s" % (prefix, uuid.uuid4())


@pytest.fixture(params=["psycopg", "psycopg2"])
def spyconn(request):
    """A connection of either driver whose calls resolve to the spies."""
    if request.param == "psycopg":
        c = psycopg.connect("user=%s" % APP_USER, options=SPY)
    else:
        c = psycopg2.connect("user=%s" % APP_USER, options=SPY)
    yield c
    c.close()


# ---------------------------------------------------------------- the calls

def test_without_a_tenant_the_statements_are_04s():
    """No tenant: the very SQL and parameters the client sent before."""
    sql, params, _ = P.consume_message("c", "m1", None)
    assert sql == "SELECT idem_consume_message(%s::text, %s::text, %s::interval)"
    assert params == ("c", "m1", None)
    sql, params, _ = P.consume_messages("c", ["m1", "m2"], 60)
    assert sql == ("SELECT m FROM idem_consume_messages(%s::text, "
                   "ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)), "
                   "%s::interval) AS t(m)")
    assert params == ("c", '["m1", "m2"]', "60.0 seconds")


def test_the_tenant_reaches_the_four_argument_form(spyconn):
    consumer = uid("c")
    with pi.runner_for(spyconn).transaction():
        assert pi.consume_message(spyconn, consumer, "m1",
                                  tenant="acct-1") is True
        # one ledger on a server that does not distribute it: the tenant
        # is not part of the id's identity
        assert pi.consume_message(spyconn, consumer, "m1") is False
        assert pi.consume_messages(spyconn, consumer, ["m1", "m2"], "1 day",
                                   tenant=42) == ["m2"]
        assert pi.consume_messages(spyconn, consumer, ["m3"]) == ["m3"]
        assert pi.consume_message(spyconn, consumer, "m4",
                                  tenant=None) is True
    assert calls(consumer) == [
        ("idem_consume_message", 4, ["m1"], "acct-1"),
        ("idem_consume_message", 3, ["m1"], None),
        ("idem_consume_messages", 4, ["m1", "m2"], "42"),
        ("idem_consume_messages", 3, ["m3"], None),
        ("idem_consume_message", 3, ["m4"], None),
    ]


def test_consume_batch(spyconn):
    consumer = uid("c")
    got = []
    pi.consume_batch(spyconn, consumer, ["a", "b"],
                     lambda conn, m: got.append(m), tenant="acct-2")
    pi.consume_batch(spyconn, consumer, ["b", "c"],
                     lambda conn, m: got.append(m))
    assert got == ["a", "b", "c"]
    assert calls(consumer) == [
        ("idem_consume_messages", 4, ["a", "b"], "acct-2"),
        ("idem_consume_messages", 3, ["b", "c"], None),
    ]


def test_a_tenant_that_is_not_text_or_an_integer_sends_nothing(spyconn):
    consumer = uid("c")
    for bad in (True, 1.5, b"acct", ["acct"]):
        with pytest.raises(TypeError):
            pi.consume_message(spyconn, consumer, "m1", tenant=bad)
        with pytest.raises(TypeError):
            pi.consume_batch(spyconn, consumer, ["m1"],
                             lambda conn, m: None, tenant=bad)
    assert calls(consumer) == []


def test_asyncio():
    consumer = uid("c")

    async def main():
        async with await psycopg.AsyncConnection.connect(
                "user=%s" % APP_USER, options=SPY) as conn:
            async with conn.transaction():
                assert await aio.consume_message(conn, consumer, "m1",
                                                 tenant="acct-3") is True
                assert await aio.consume_messages(
                    conn, consumer, ["m1", "m2"], tenant="acct-3") == ["m2"]
                assert await aio.consume_message(conn, consumer, "m3") is True
            got = []

            async def handle(c, m):
                got.append(m)
            await aio.consume_batch(conn, consumer, ["m4"], handle,
                                    tenant=7)
            await aio.consume_batch(conn, consumer, ["m5"], handle)
            assert got == ["m4", "m5"]
    asyncio.run(main())
    assert calls(consumer) == [
        ("idem_consume_message", 4, ["m1"], "acct-3"),
        ("idem_consume_messages", 4, ["m1", "m2"], "acct-3"),
        ("idem_consume_message", 3, ["m3"], None),
        ("idem_consume_messages", 4, ["m4"], "7"),
        ("idem_consume_messages", 3, ["m5"], None),
    ]


def test_the_extensions_own_four_argument_form():
    """No spy: the client's four-argument calls run the extension's
    functions, which on this server record the id as the three-argument
    ones do (the tenant is not used)."""
    consumer = uid("c")
    with psycopg.connect("user=%s" % APP_USER) as c:
        assert pi.consume_message(c, consumer, "m1", tenant="acct-1") is True
        assert pi.consume_message(c, consumer, "m1", tenant="acct-2") is False
        assert pi.consume_messages(c, consumer, ["m1", "m2"],
                                   tenant="acct-1") == ["m2"]
        assert pi.consume_message(c, consumer, "m2") is False
        c.commit()
        assert pi.consume_messages(c, consumer, ["m2", "m3"], "1 hour",
                                   tenant=5) == ["m3"]
        c.rollback()
        assert pi.consume_message(c, consumer, "m3") is True
    assert calls(consumer) == []


# ---------------------------------------------------------------- webhooks

def delivery(msg, body=None):
    data = json.dumps(body or {"n": 1}).encode()
    return webhook_headers(SECRET, msg, int(time.time()), data), data


def test_receive_webhook(spyconn):
    consumer = uid("c")
    m1, m2, m3, m4 = (uid("msg") for _ in range(4))
    seen = []

    def handler(conn, event):
        seen.append(event.id)
    h, b = delivery(m1)
    r = receive_webhook(spyconn, consumer, SECRET, h, b, handler,
                        tenant="acct-4")
    assert not r.duplicate
    assert receive_webhook(spyconn, consumer, SECRET, h, b, handler,
                           tenant="acct-4").duplicate
    # the tenant of each delivery, from the verified event
    h, b = delivery(m2, {"tenant": "acct-5"})
    receive_webhook(spyconn, consumer, SECRET, h, b, handler,
                    tenant=lambda event: event.json()["tenant"])
    h, b = delivery(m3)
    receive_webhook(spyconn, consumer, SECRET, h, b, handler,
                    tenant=lambda event: None)
    h, b = delivery(m4)
    receive_webhook(spyconn, consumer, SECRET, h, b, handler)
    assert seen == [m1, m2, m3, m4]
    assert calls(consumer) == [
        ("idem_consume_message", 4, [m1], "acct-4"),
        ("idem_consume_message", 4, [m1], "acct-4"),
        ("idem_consume_message", 4, [m2], "acct-5"),
        ("idem_consume_message", 3, [m3], None),
        ("idem_consume_message", 3, [m4], None),
    ]


def test_receive_webhook_async():
    consumer = uid("c")
    m1, m2, m3 = uid("msg"), uid("msg"), uid("msg")

    async def handler(conn, event):
        return event.id

    async def tenant_of(event):
        return "acct-12"

    async def main():
        async with await psycopg.AsyncConnection.connect(
                "user=%s" % APP_USER, options=SPY) as conn:
            h, b = delivery(m1, {"tenant": 11})
            r = await receive_webhook_async(
                conn, consumer, SECRET, h, b, handler,
                tenant=lambda event: event.json()["tenant"])
            assert r.result == m1
            h, b = delivery(m2)
            await receive_webhook_async(conn, consumer, SECRET, h, b,
                                        handler)
            # a coroutine function
            h, b = delivery(m3)
            await receive_webhook_async(conn, consumer, SECRET, h, b,
                                        handler, tenant=tenant_of)
    asyncio.run(main())
    assert calls(consumer) == [
        ("idem_consume_message", 4, [m1], "11"),
        ("idem_consume_message", 3, [m2], None),
        ("idem_consume_message", 4, [m3], "acct-12"),
    ]


@pytest.fixture(scope="module")
def spied_receivers():
    """The webhook receivers of test_outbox.py, their connections'
    search_path (libpq's PGOPTIONS) on the spies."""
    started = {}
    for fw in FRAMEWORKS:
        started[fw] = Server("webhook_receivers", {
            "WEBHOOK_FRAMEWORK": fw, "WEBHOOK_SECRET": SECRET,
            "PGOPTIONS": SPY})
    yield started
    for s in started.values():
        s.stop()


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_framework_receivers(spied_receivers, fw):
    """The tenant function gets the verified event and the framework's
    request (here: the tenant from the route's path); a receiver without
    a tenant makes the three-argument call."""
    port = spied_receivers[fw].port
    tenant = uid("acct")
    m1, m2 = uid("msg"), uid("msg")
    h, b = delivery(m1)
    hdrs = list(h.items()) + [("Content-Type", "application/json")]
    a = request(port, "/hooks/t/" + tenant, b, hdrs)
    assert a.status == 200 and a.json() == {"id": m1, "status": "applied"}, a
    a = request(port, "/hooks/t/" + tenant, b, hdrs)
    assert a.json() == {"id": m1, "status": "duplicate"}, a
    assert calls(fw + "-tenant", [m1]) == [
        ("idem_consume_message", 4, [m1], tenant),
        ("idem_consume_message", 4, [m1], tenant),
    ]
    h, b = delivery(m2)
    a = request(port, "/hooks", b,
                list(h.items()) + [("Content-Type", "application/json")])
    assert a.status == 200 and a.json() == {"id": m2, "status": "applied"}, a
    assert calls(fw, [m2]) == [("idem_consume_message", 3, [m2], None)]

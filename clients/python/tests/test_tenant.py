"""
A tenant (for a message ledger, stream positions and producer sequences
distributed by Citus, extension 0.5.0): every entry point that consumes
message ids takes tenant=, and passes it through idem_consume_message(s)'
four-argument form only when it is given; without it, the three-argument
call of 0.4.0 is made, as before.  Likewise the ordered-stream calls
(assign, advance, positions, sequence, StreamConsumer): with a tenant,
the tenant overloads of idem_assign, idem_advance, idem_positions and
idem_sequence; without, the very statements of 0.4.0.  And the outbox:
publish(..., tenant=) calls idem_publish's tenant overload, and
OutboxRelay(..., tenants=True) the tenant overloads of idem_outbox_next,
_ack and _dead_letter with tenant NULL; without them, 0.4.0's statements.
The server here
does not distribute anything, so the forms with a tenant ignore it and
the answers cannot tell the forms apart: ../../conformance/tenant-spy.sql
puts a logging stand-in of each form before pg_catalog in search_path,
and the tests read which form each call resolved to and what it
received.  The same calls also run against the extension's own functions
(no spy).
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
from pg_idempotency import StaleGeneration
from pg_idempotency import _protocol as P
from pg_idempotency import outbox as O
from pg_idempotency._sql import runner_for
from pg_idempotency.outbox import DeliveryError
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


# ---------------------------------------------------------------- streams

def stream_calls(consumer):
    """(function, nargs, stream or producer, other arguments as text,
    tenant) of each call the spies saw for CONSUMER, in order."""
    with su_connect() as c:
        return [tuple(r) for r in c.execute(
            "SELECT fn, nargs, stream, args, tenant FROM tenant_spy.calls"
            " WHERE consumer = %s ORDER BY n", (consumer,))]


def parts_of(ps):
    return [(p.part, p.next_offset, p.generation) for p in ps]


ASSIGN = ("SELECT part, next_offset FROM idem_assign(%s::text, %s::text, "
          "ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)::integer), "
          "%s::bigint")
ADVANCE = ("SELECT first_offset, last_offset FROM idem_advance(%s::text, "
           "%s::text, %s::integer, %s::bigint, %s::bigint, %s::bigint")
POSITIONS = ("SELECT part, next_offset, generation, updated_at "
             "FROM idem_positions(%s::text, %s::text")
SEQUENCE = ("SELECT idem_sequence(%s::text, %s::text, %s::bigint, "
            "%s::bigint, %s::boolean")


def test_stream_statements_without_a_tenant_are_04s():
    """No tenant (or None): the very SQL and parameters the client sent
    before (a 0.4.0 server has no tenant overloads); with one, the same
    and the tenant as text, last."""
    for kw in ({}, {"tenant": None}):
        assert P.assign("c", "s", [1, 0], 7, **kw)[:2] == (
            ASSIGN + ")", ("c", "s", "[1, 0]", 7))
        assert P.advance("c", "s", 0, 10, 19, **kw)[:2] == (
            ADVANCE + ")", ("c", "s", 0, 10, 19, None))
        assert P.advance("c", "s", 0, 10, 19, 7, **kw)[:2] == (
            ADVANCE + ")", ("c", "s", 0, 10, 19, 7))
        assert P.positions("c", "s", **kw)[:2] == (
            POSITIONS + ") ORDER BY part", ("c", "s"))
        assert P.sequence("c", "p", 1, 2, **kw)[:2] == (
            SEQUENCE + ")", ("c", "p", 1, 2, False))
    assert P.assign("c", "s", [0], 7, "t")[:2] == (
        ASSIGN + ", %s::text)", ("c", "s", "[0]", 7, "t"))
    assert P.advance("c", "s", 0, 10, 19, None, 42)[:2] == (
        ADVANCE + ", %s::text)", ("c", "s", 0, 10, 19, None, "42"))
    assert P.positions("c", "s", "t")[:2] == (
        POSITIONS + ", %s::text) ORDER BY part", ("c", "s", "t"))
    assert P.sequence("c", "p", 1, 2, True, "t")[:2] == (
        SEQUENCE + ", %s::text)", ("c", "p", 1, 2, True, "t"))


def test_the_tenant_reaches_the_stream_calls_tenant_forms(spyconn):
    consumer, stream = uid("c"), uid("s")
    with pi.runner_for(spyconn).transaction():
        assert pi.assign(spyconn, consumer, stream, [1, 0], 3,
                         tenant="acct-1") == {0: None, 1: None}
        assert pi.advance(spyconn, consumer, stream, 0, 10, 19, 3,
                          tenant="acct-1") == pi.OffsetRange(10, 19)
        # unfenced, on a partition never assigned: generation goes, NULL
        assert pi.advance(spyconn, consumer, stream, 2, 0, 4,
                          tenant=42) == pi.OffsetRange(0, 4)
        # without it: the node's own positions, the same ones here
        assert pi.advance(spyconn, consumer, stream, 0, 15, 24,
                          3) == pi.OffsetRange(20, 24)
        assert parts_of(pi.positions(spyconn, consumer, stream,
                                     tenant="acct-1")) == \
            [(0, 25, 3), (1, None, 3), (2, 5, None)]
        assert parts_of(pi.positions(spyconn, consumer, stream,
                                     tenant=None)) == \
            [(0, 25, 3), (1, None, 3), (2, 5, None)]
        assert pi.sequence(spyconn, consumer, "p1", 1, 1,
                           tenant="acct-1") == "new"
        assert pi.sequence(spyconn, consumer, "p1", 1, 1) == "duplicate"
        assert pi.sequence(spyconn, consumer, "p1", 1, 3,
                           tenant=7) == "gap"
    assert stream_calls(consumer) == [
        ("idem_assign", 5, stream, ["{1,0}", "3"], "acct-1"),
        ("idem_advance", 7, stream, ["0", "10", "19", "3"], "acct-1"),
        ("idem_advance", 7, stream, ["2", "0", "4", None], "42"),
        ("idem_advance", 6, stream, ["0", "15", "24", "3"], None),
        ("idem_positions", 3, stream, [], "acct-1"),
        ("idem_positions", 2, stream, [], None),
        ("idem_sequence", 6, "p1", ["1", "1", "false"], "acct-1"),
        ("idem_sequence", 5, "p1", ["1", "1", "false"], None),
        ("idem_sequence", 6, "p1", ["1", "3", "false"], "7"),
    ]
    # strict goes to the tenant form too (its gap is refused, and the
    # refusal rolls its log row back: the answer says which form ran)
    with pytest.raises(pi.SequenceGap):
        pi.sequence(spyconn, consumer, "p1", 1, 9, strict=True,
                    tenant="acct-1")
    spyconn.rollback()
    assert pi.sequence(spyconn, consumer, "p1", 1, 4, strict=True,
                       tenant="acct-1") == "new"
    spyconn.commit()
    assert stream_calls(consumer)[-1] == \
        ("idem_sequence", 6, "p1", ["1", "4", "true"], "acct-1")


def test_stream_consumer_passes_its_tenant_to_every_call(spyconn):
    consumer, stream = uid("c"), uid("s")
    seen = []

    def handle(conn, records):
        seen.append(records)
    sc = pi.StreamConsumer(spyconn, consumer, stream, tenant="acct-9")
    assert sc.tenant == "acct-9"
    assert sc.assign([0], 1) == {0: None}
    assert sc.process(0, [5, 6, 7], handle) == [5, 6, 7]
    assert sc.process(0, [6, 7, 8], handle) == [8]
    assert parts_of(sc.positions()) == [(0, 9, 1)]
    spyconn.commit()
    plain = pi.StreamConsumer(spyconn, consumer, stream, generation=1)
    assert plain.process(0, [9], handle) == [9]
    assert parts_of(plain.positions()) == [(0, 10, 1)]
    spyconn.commit()
    assert seen == [[5, 6, 7], [8], [9]]
    assert stream_calls(consumer) == [
        ("idem_assign", 5, stream, ["{0}", "1"], "acct-9"),
        ("idem_advance", 7, stream, ["0", "5", "7", "1"], "acct-9"),
        ("idem_advance", 7, stream, ["0", "6", "8", "1"], "acct-9"),
        ("idem_positions", 3, stream, [], "acct-9"),
        ("idem_advance", 6, stream, ["0", "9", "9", "1"], None),
        ("idem_positions", 2, stream, [], None),
    ]


BAD_TENANTS = (True, 1.5, b"acct", ["acct"], {"t": 1})


def test_a_stream_tenant_that_is_not_text_or_an_integer_sends_nothing(
        spyconn):
    consumer, stream = uid("c"), uid("s")
    for bad in BAD_TENANTS:
        with pytest.raises(TypeError):
            pi.assign(spyconn, consumer, stream, [0], 1, tenant=bad)
        with pytest.raises(TypeError):
            pi.advance(spyconn, consumer, stream, 0, 1, 2, tenant=bad)
        with pytest.raises(TypeError):
            pi.positions(spyconn, consumer, stream, tenant=bad)
        with pytest.raises(TypeError):
            pi.sequence(spyconn, consumer, "p", 1, 1, tenant=bad)
        with pytest.raises(TypeError):
            pi.StreamConsumer(spyconn, consumer, stream, tenant=bad)
        with pytest.raises(TypeError):
            aio.StreamConsumer(spyconn, consumer, stream, tenant=bad)
    # whatever a call sent would be committed here, and seen
    spyconn.commit()
    assert stream_calls(consumer) == []


def test_asyncio_stream_calls():
    consumer, stream = uid("c"), uid("s")

    async def main():
        async with await psycopg.AsyncConnection.connect(
                "user=%s" % APP_USER, options=SPY) as conn:
            async with conn.transaction():
                assert await aio.assign(conn, consumer, stream, [0], 2,
                                        tenant="acct-3") == {0: None}
                assert await aio.advance(conn, consumer, stream, 0, 0, 9, 2,
                                         tenant="acct-3") == \
                    pi.OffsetRange(0, 9)
                assert parts_of(await aio.positions(
                    conn, consumer, stream, tenant="acct-3")) == [(0, 10, 2)]
                assert await aio.sequence(conn, consumer, "p", 1, 1,
                                          tenant=11) == "new"
                assert await aio.sequence(conn, consumer, "p", 1, 1) == \
                    "duplicate"
                for bad in BAD_TENANTS:
                    with pytest.raises(TypeError):
                        await aio.assign(conn, consumer, stream, [0], 2,
                                         tenant=bad)
                    with pytest.raises(TypeError):
                        await aio.advance(conn, consumer, stream, 0, 0, 9,
                                          2, tenant=bad)
                    with pytest.raises(TypeError):
                        await aio.positions(conn, consumer, stream,
                                            tenant=bad)
                    with pytest.raises(TypeError):
                        await aio.sequence(conn, consumer, "p", 1, 2,
                                           tenant=bad)
            sc = aio.StreamConsumer(conn, consumer, stream, tenant="acct-3")
            assert await sc.assign([0], 3) == {0: 10}
            got = []

            async def handle(c, records):
                got.append(records)
            assert await sc.process(0, [10, 11], handle) == [10, 11]
            assert parts_of(await sc.positions()) == [(0, 12, 3)]
            await conn.commit()
            assert got == [[10, 11]]
    asyncio.run(main())
    assert stream_calls(consumer) == [
        ("idem_assign", 5, stream, ["{0}", "2"], "acct-3"),
        ("idem_advance", 7, stream, ["0", "0", "9", "2"], "acct-3"),
        ("idem_positions", 3, stream, [], "acct-3"),
        ("idem_sequence", 6, "p", ["1", "1", "false"], "11"),
        ("idem_sequence", 5, "p", ["1", "1", "false"], None),
        ("idem_assign", 5, stream, ["{0}", "3"], "acct-3"),
        ("idem_advance", 7, stream, ["0", "10", "11", "3"], "acct-3"),
        ("idem_positions", 3, stream, [], "acct-3"),
    ]


def test_the_extensions_own_stream_tenant_forms():
    """No spy: the tenant overloads of the extension, which on this server
    (no Citus) keep the node's own positions and sequences: a position
    advanced with a tenant is read back with it (and without it, and
    another tenant's call moves it), fenced as without one."""
    consumer, stream = uid("c"), uid("s")
    with psycopg.connect("user=%s" % APP_USER) as c:
        assert pi.assign(c, consumer, stream, [0, 1], 2,
                         tenant="acct-1") == {0: None, 1: None}
        assert pi.advance(c, consumer, stream, 0, 0, 9, 2,
                          tenant="acct-1") == pi.OffsetRange(0, 9)
        c.commit()
        assert parts_of(pi.positions(c, consumer, stream,
                                     tenant="acct-1")) == \
            [(0, 10, 2), (1, None, 2)]
        assert parts_of(pi.positions(c, consumer, stream)) == \
            [(0, 10, 2), (1, None, 2)]
        assert pi.advance(c, consumer, stream, 0, 5, 14, 2,
                          tenant=99) == pi.OffsetRange(10, 14)
        c.rollback()
        with pytest.raises(pi.StaleGeneration):
            pi.advance(c, consumer, stream, 0, 10, 11, 1, tenant="acct-1")
        c.rollback()
        with pytest.raises(pi.StaleGeneration):
            pi.advance(c, consumer, stream, 0, 10, 11, tenant="acct-1")
        c.rollback()
        assert parts_of(pi.positions(c, consumer, stream,
                                     tenant="acct-1")) == \
            [(0, 10, 2), (1, None, 2)]
        c.rollback()
        assert pi.sequence(c, consumer, "p", 1, 1, tenant="acct-1") == "new"
        c.commit()
        assert pi.sequence(c, consumer, "p", 1, 1, tenant="acct-1") == \
            "duplicate"
        assert pi.sequence(c, consumer, "p", 1, 1) == "duplicate"
        with pytest.raises(pi.SequenceGap):
            pi.sequence(c, consumer, "p", 1, 5, strict=True, tenant="acct-1")
        c.rollback()
        sc = pi.StreamConsumer(c, consumer, stream, tenant="acct-1")
        assert sc.assign([0], 3) == {0: 10}
        assert sc.process(0, [8, 9, 10, 11, 12], lambda conn, r: None) == \
            [10, 11, 12]
        assert parts_of(sc.positions()) == [(0, 13, 3), (1, None, 2)]
        c.commit()
    assert stream_calls(consumer) == []


# ---------------------------------------------------------------- outbox

PUBLISH = ("SELECT idem_publish(%s::text, %s::jsonb, %s::text, %s::jsonb,"
           " %s::bytea")
NEXT = ("SELECT batch, event_id::text, key, payload::text, payload_raw,"
        " headers, published_at FROM idem_outbox_next(%s::text, %s::text,"
        " %s::int, %s::bigint")
NEXT_T = ("SELECT batch, event_id::text, key, payload::text, payload_raw,"
          " headers, published_at, tenant, seq FROM idem_outbox_next(%s::text,"
          " %s::text, %s::int, %s::bigint")
ACK = "SELECT idem_outbox_ack(%s::text, %s::text, %s::bigint, %s::bigint"
DEAD = ("SELECT idem_outbox_dead_letter(%s::text, %s::text, %s::uuid,"
        " %s::text, %s::int")


class Recorder:
    """A Runner that records each statement and its parameters and runs
    them on a real connection."""

    def __init__(self, conn):
        self.inner = runner_for(conn)
        self.sent = []

    def execute(self, sql, params=()):
        self.sent.append((sql, tuple(params)))
        return self.inner.execute(sql, params)

    def transaction(self):
        return self.inner.transaction()

    def in_transaction(self):
        return self.inner.in_transaction()


def outbox_calls(topic):
    """(function, nargs, relay, other arguments as text, tenant) of each
    outbox call the spies saw for TOPIC, in order."""
    with su_connect() as c:
        return [tuple(r) for r in c.execute(
            "SELECT fn, nargs, consumer, args, tenant FROM tenant_spy.calls"
            " WHERE stream = %s AND fn LIKE 'idem_%%' AND"
            " (fn LIKE 'idem_outbox%%' OR fn = 'idem_publish') ORDER BY n",
            (topic,))]


def test_tenant_outbox_statements_without_a_tenant_are_04s():
    """No tenant, no tenants (or None, False): the very SQL and parameters
    the client sent before (a 0.4.0 server has no tenant overloads); with
    one, the same and the tenant as text, last (NULL for every tenant)."""
    topic = uid("t")
    with psycopg.connect("user=%s" % APP_USER, autocommit=True) as c:
        r = Recorder(c)
        e1 = O.publish(r, topic, {"n": 1}, key="k")
        e2 = O.publish(r, topic, {"n": 2}, tenant=None)
        e3 = O.publish(r, topic, None, raw=b"\x01", tenant="acct-1")
        e4 = O.publish(r, topic, {"n": 4}, tenant=42)
        assert r.sent == [
            (PUBLISH + ")::text", (topic, '{"n":1}', "k", None, None)),
            (PUBLISH + ")::text", (topic, '{"n":2}', None, None, None)),
            (PUBLISH + ", %s::text)::text",
             (topic, None, None, None, b"\x01", "acct-1")),
            (PUBLISH + ", %s::text)::text",
             (topic, '{"n":4}', None, None, None, "42")),
        ]
        del r.sent[:]
        b = O.outbox_next(r, "rel", topic, 10, None)
        assert [e.event_id for e in b.events] == [e1, e2, e3, e4]
        # the node's own outbox: no tenant, no number
        assert [(e.tenant, e.seq) for e in b.events] == [(None, None)] * 4
        assert O.outbox_next(r, "rel", topic, 10, tenants=False) == b
        bt = O.outbox_next(r, "rel", topic, 10, tenants=True)
        assert bt == b
        assert O.outbox_next(r, "rel", topic, 10, 5, tenant="acct-1") == b
        O.outbox_dead_letter(r, "rel", topic, e1, "no", 1)
        O.outbox_dead_letter(r, "rel", topic, e2, "no", 2, tenants=True)
        O.outbox_dead_letter(r, "rel", topic, e3, None, None, tenant=7)
        assert O.outbox_ack(r, "rel", topic, b.batch, 5,
                            tenants=True) is True
        assert O.outbox_ack(r, "rel", topic, b.batch, 5) is False
        assert O.outbox_ack(r, "rel", topic, b.batch, 5,
                            tenant="acct-1") is False
        assert r.sent == [
            (NEXT + ")", ("rel", topic, 10, None)),
            (NEXT + ")", ("rel", topic, 10, None)),
            (NEXT_T + ", %s::text)", ("rel", topic, 10, None, None)),
            (NEXT_T + ", %s::text)", ("rel", topic, 10, 5, "acct-1")),
            (DEAD + ")", ("rel", topic, e1, "no", 1)),
            (DEAD + ", %s::text)", ("rel", topic, e2, "no", 2, None)),
            (DEAD + ", %s::text)", ("rel", topic, e3, None, None, "7")),
            (ACK + ", %s::text)", ("rel", topic, b.batch, 5, None)),
            (ACK + ")", ("rel", topic, b.batch, 5)),
            (ACK + ", %s::text)", ("rel", topic, b.batch, 5, "acct-1")),
        ]
        assert [(d.event.event_id, d.attempts) for d in
                O.outbox_dead_letters(c, "rel", topic)] == \
            [(e1, 1), (e2, 2), (e3, None)]


def test_tenant_outbox_calls_reach_the_tenant_forms(spyconn):
    topic = uid("t")
    with runner_for(spyconn).transaction():
        e1 = O.publish(spyconn, topic, {"n": 1}, key="k", tenant="acct-1")
        e2 = O.publish(spyconn, topic, {"n": 2}, headers={"h": "v"})
        e3 = O.publish(spyconn, topic, None, raw=b"\x02", tenant=9)
    b = O.outbox_next(spyconn, "rel", topic, 10, 3, tenants=True)
    assert [(e.event_id, e.key, e.payload, e.raw, e.headers, e.tenant, e.seq)
            for e in b.events] == [
        (e1, "k", {"n": 1}, None, None, None, None),
        (e2, None, {"n": 2}, None, {"h": "v"}, None, None),
        (e3, None, None, b"\x02", None, None, None)]
    O.outbox_dead_letter(spyconn, "rel", topic, e2, "gone", 3, tenants=True)
    assert O.outbox_ack(spyconn, "rel", topic, b.batch, 3, tenants=True)
    spyconn.commit()
    assert O.outbox_next(spyconn, "rel", topic, 10, 3).batch is None
    spyconn.commit()
    assert outbox_calls(topic) == [
        ("idem_publish", 6, None, ['{"n": 1}', "k", None, None], "acct-1"),
        ("idem_publish", 5, None, ['{"n": 2}', None, '{"h": "v"}', None],
         None),
        ("idem_publish", 6, None, [None, None, None, "\\x02"], "9"),
        ("idem_outbox_next", 5, "rel", ["10", "3"], None),
        ("idem_outbox_dead_letter", 6, "rel", [e2, "gone", "3"], None),
        ("idem_outbox_ack", 5, "rel", [str(b.batch), "3"], None),
        ("idem_outbox_next", 4, "rel", ["10", "3"], None),
    ]


def test_tenant_outbox_relay_of_every_tenant(spyconn):
    """OutboxRelay(..., tenants=True): the relay's every call is a tenant
    overload with tenant NULL; without Citus' tenant outbox the server
    relays its own outbox then, so it delivers the events published with
    and without a tenant, each with its event id as webhook-id, dead-letters
    as before, and its generation fences as before."""
    from test_outbox import Endpoint
    topic = uid("t")
    ids = [O.publish(spyconn, topic, {"n": i},
                     tenant=("acct-%d" % (i % 2)) if i % 3 else None)
           for i in range(5)]
    spyconn.commit()
    endpoint = Endpoint()
    try:
        endpoint.script[ids[1]] = [503, 503]
        relay = O.OutboxRelay(spyconn, relay="all", topic=topic,
                              max_events=3, generation=2, tenants=True,
                              max_attempts=2, sleep=lambda s: None,
                              sink=O.WebhookSink(endpoint.url, SECRET))
        assert relay.tenants is True
        rounds = []
        while True:
            r = relay.run_once()
            if r["batch"] is None:
                break
            rounds.append((r["events"], r["delivered"], r["dead_lettered"]))
        assert rounds == [(3, 2, 1), (2, 2, 0)]
        got = [h["webhook-id"] for h, _ in endpoint.got]
        assert got == [ids[0], ids[1], ids[1], ids[2], ids[3], ids[4]]
        assert [json.loads(body) for h, body in endpoint.got
                if h["webhook-id"] != ids[1]] == [{"n": i} for i in
                                                  (0, 2, 3, 4)]
    finally:
        endpoint.close()
    assert [(d.event.event_id, d.attempts) for d in
            O.outbox_dead_letters(spyconn, "all", topic)] == [(ids[1], 2)]
    spyconn.commit()
    # the generation fences the relay as without the option
    zombie = O.OutboxRelay(spyconn, relay="all", topic=topic, generation=1,
                           tenants=True, sink=lambda e, ctx=None: None)
    with pytest.raises(StaleGeneration):
        zombie.run_once()
    spyconn.rollback()
    seen = outbox_calls(topic)
    assert [c[0] for c in seen[:5]] == ["idem_publish"] * 5
    assert [c[1] for c in seen[:5]] == [5, 6, 6, 5, 6]
    relay_calls = [(fn, nargs, tenant) for fn, nargs, rel, args, tenant
                   in seen[5:]]
    assert relay_calls == [
        ("idem_outbox_next", 5, None),
        ("idem_outbox_dead_letter", 6, None),
        ("idem_outbox_ack", 5, None),
        ("idem_outbox_next", 5, None),
        ("idem_outbox_ack", 5, None),
        ("idem_outbox_next", 5, None),
    ]
    assert all(rel == "all" for _, _, rel, _, _ in seen[5:])


def test_tenant_outbox_relay_without_the_option_makes_04s_calls(spyconn):
    topic = uid("t")
    ids = [O.publish(spyconn, topic, {"n": i}) for i in range(2)]
    spyconn.commit()
    got = []

    def sink(event, ctx=None):
        got.append((event.event_id, event.tenant, event.seq))
        if event.event_id == ids[1]:
            raise DeliveryError("refused")
    relay = O.OutboxRelay(spyconn, relay="own", topic=topic,
                          max_attempts=1, on_dead_letter="stop", sink=sink)
    assert relay.tenants is False
    with pytest.raises(O.DeadLetter):
        relay.run_once()
    assert got == [(ids[0], None, None), (ids[1], None, None)]
    spyconn.rollback()
    assert [(fn, nargs, tenant) for fn, nargs, _, _, tenant in
            outbox_calls(topic)] == [
        ("idem_publish", 5, None), ("idem_publish", 5, None),
        ("idem_outbox_next", 4, None), ("idem_outbox_dead_letter", 5, None)]
    # a relay of every tenant stopping on a dead letter records it with
    # the tenant overload
    stop = O.OutboxRelay(spyconn, relay="own-t", topic=topic, max_attempts=1,
                         on_dead_letter="stop", tenants=True, sink=sink)
    with pytest.raises(O.DeadLetter):
        stop.run_once()
    spyconn.rollback()
    assert [(fn, nargs, tenant) for fn, nargs, _, _, tenant in
            outbox_calls(topic)][4:] == [
        ("idem_outbox_next", 5, None), ("idem_outbox_dead_letter", 6, None)]


BAD_TENANTS_FLAGS = ("yes", 1, 0, 1.0, ["x"])


def test_tenant_outbox_bad_tenants_send_nothing(spyconn):
    topic = uid("t")
    for bad in BAD_TENANTS:
        with pytest.raises(TypeError):
            O.publish(spyconn, topic, {"n": 1}, tenant=bad)
        with pytest.raises(TypeError):
            O.outbox_next(spyconn, "r", topic, tenant=bad)
        with pytest.raises(TypeError):
            O.outbox_ack(spyconn, "r", topic, 1, tenant=bad)
        with pytest.raises(TypeError):
            O.outbox_dead_letter(spyconn, "r", topic, str(uuid.uuid4()),
                                 tenant=bad)
    for bad in BAD_TENANTS_FLAGS:
        with pytest.raises(TypeError):
            O.outbox_next(spyconn, "r", topic, tenants=bad)
        with pytest.raises(TypeError):
            O.outbox_ack(spyconn, "r", topic, 1, tenants=bad)
        with pytest.raises(TypeError):
            O.outbox_dead_letter(spyconn, "r", topic, str(uuid.uuid4()),
                                 tenants=bad)
        with pytest.raises(TypeError):
            O.OutboxRelay(spyconn, relay="r", topic=topic, tenants=bad,
                          sink=lambda e, ctx=None: None)
    # one tenant or every tenant, not both
    with pytest.raises(TypeError):
        O.outbox_next(spyconn, "r", topic, tenant="acct-1", tenants=True)
    spyconn.commit()
    assert outbox_calls(topic) == []

"""Ordered streams: assign/advance/positions/sequence and StreamConsumer on
psycopg 3 and psycopg2 (and the asyncio versions), against the extension."""

import asyncio
import datetime
import threading

import psycopg
import psycopg2
import pytest

import pg_idempotency as pi
import pg_idempotency.aio as aio
from conftest import APP_USER, DEADLINE, new_key, su_connect, wait_until

DRIVERS = {"psycopg": psycopg.connect, "psycopg2": psycopg2.connect}


@pytest.fixture(params=sorted(DRIVERS))
def connect(request):
    """Opens connections of one driver, as the application role."""
    opened = []

    def make():
        c = DRIVERS[request.param]("user=%s" % APP_USER)
        opened.append(c)
        return c
    yield make
    for c in opened:
        c.close()


@pytest.fixture
def anyconn(connect):
    return connect()


@pytest.fixture(scope="module", autouse=True)
def applied_table():
    with psycopg.connect("user=%s" % APP_USER, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS applied ("
                  " consumer text, part int, off bigint)")


def recs(first, last):
    return [{"offset": o, "amount": o * 10} for o in range(first, last + 1)]


def offs(records):
    return [r["offset"] for r in records]


def applied(consumer, part=0):
    """The offsets applied for CONSUMER's PART, as committed, repeats kept."""
    with su_connect() as c:
        return [r[0] for r in c.execute(
            "SELECT off FROM app.applied WHERE consumer = %s AND part = %s"
            " ORDER BY off", (consumer, part))]


def writer(consumer, part, seen):
    """A handler that applies each record (one row) and notes what it got."""
    def handle(conn, records):
        seen.append(offs(records))
        runner = pi.runner_for(conn)
        for r in records:
            runner.execute("INSERT INTO applied VALUES (%s, %s, %s)",
                           (consumer, part, r["offset"]))
    return handle


def position(conn, consumer, stream, part=0):
    rows = {p.part: p for p in pi.positions(conn, consumer, stream)}
    conn.rollback()
    return rows.get(part)


def test_assign_returns_next_offsets(anyconn):
    consumer, stream = new_key("c"), new_key("s")
    seeks = pi.assign(anyconn, consumer, stream, [2, 0, 1, 0], 1)
    assert seeks == {0: None, 1: None, 2: None}
    assert list(seeks) == [0, 1, 2]
    assert pi.advance(anyconn, consumer, stream, 0, 0, 9, 1) == \
        pi.OffsetRange(0, 9)
    anyconn.commit()
    assert pi.assign(anyconn, consumer, stream, [1, 0], 2) == {0: 10, 1: None}
    anyconn.commit()
    ps = pi.positions(anyconn, consumer, stream)
    anyconn.commit()
    assert [(p.part, p.next_offset, p.generation) for p in ps] == \
        [(0, 10, 2), (1, None, 2), (2, None, 1)]
    assert all(isinstance(p.updated_at, datetime.datetime) for p in ps)
    assert pi.positions(anyconn, consumer, new_key("other")) == []
    anyconn.commit()
    # an unfenced advance of a partition never assigned starts at the batch
    assert pi.advance(anyconn, consumer, stream, 7, 100, 110) == \
        pi.OffsetRange(100, 110)
    anyconn.commit()
    p7 = position(anyconn, consumer, stream, 7)
    assert (p7.next_offset, p7.generation) == (111, None)


def test_advance_returns_only_the_new_subrange(anyconn):
    consumer, stream = new_key("c"), new_key("s")
    assert pi.advance(anyconn, consumer, stream, 0, 0, 9) == pi.OffsetRange(0, 9)
    r = pi.advance(anyconn, consumer, stream, 0, 5, 14)
    assert (r.first, r.last) == (10, 14) and 12 in r and 9 not in r
    assert pi.advance(anyconn, consumer, stream, 0, 3, 8) is None
    anyconn.commit()
    assert position(anyconn, consumer, stream).next_offset == 15


def test_stream_consumer_handles_only_new_records(anyconn):
    consumer, stream = new_key("c"), new_key("s")
    sc = pi.StreamConsumer(anyconn, consumer, stream)
    assert sc.assign([0], 7) == {0: None}
    seen = []
    h = writer(consumer, 0, seen)
    assert offs(sc.process(0, recs(0, 9), h)) == list(range(10))
    # a redelivery overlapping the last batch: only 10..14 are new
    assert offs(sc.process(0, recs(5, 14), h)) == list(range(10, 15))
    assert seen == [list(range(10)), list(range(10, 15))]
    # all old: the handler is not called
    assert sc.process(0, recs(3, 8), h) == []
    assert len(seen) == 2
    # offsets may skip (a compacted log)
    sparse = [{"offset": 15}, {"offset": 17}, {"offset": 20}]
    assert offs(sc.process(0, sparse, h)) == [15, 17, 20]
    assert sc.process(0, [], h) == []
    assert applied(consumer) == list(range(15)) + [15, 17, 20]
    p = sc.positions()
    anyconn.rollback()
    assert [(x.part, x.next_offset, x.generation) for x in p] == [(0, 21, 7)]
    # seeking after a restart: the next offset to read
    again = pi.StreamConsumer(anyconn, consumer, stream)
    assert again.assign([0, 1], 8) == {0: 21, 1: None}


def test_rolled_back_batch_is_delivered_again(anyconn):
    consumer, stream = new_key("c"), new_key("s")
    sc = pi.StreamConsumer(anyconn, consumer, stream)
    sc.assign([0], 1)
    seen = []
    h = writer(consumer, 0, seen)
    sc.process(0, recs(0, 4), h)

    def crash(conn, records):
        h(conn, records)
        raise RuntimeError("crash mid-batch")
    with pytest.raises(RuntimeError):
        sc.process(0, recs(5, 9), crash)
    assert position(anyconn, consumer, stream).next_offset == 5
    assert applied(consumer) == list(range(5))
    # in the caller's transaction, rolled back by the caller
    pi.runner_for(anyconn).execute("SELECT 1")
    assert offs(sc.process(0, recs(5, 9), h)) == list(range(5, 10))
    anyconn.rollback()
    assert position(anyconn, consumer, stream).next_offset == 5
    # the redelivery applies the whole batch, once
    assert offs(sc.process(0, recs(5, 9), h)) == list(range(5, 10))
    assert applied(consumer) == list(range(10))
    assert position(anyconn, consumer, stream).next_offset == 10


def test_lower_generation_is_refused_and_changes_nothing(connect):
    consumer, stream = new_key("c"), new_key("s")
    c1, c2 = connect(), connect()
    seen = []
    zombie = pi.StreamConsumer(c1, consumer, stream)
    assert zombie.assign([0, 1], 1) == {0: None, 1: None}
    zombie.process(0, recs(0, 4), writer(consumer, 0, seen))
    # a rebalance gives partition 0 to another consumer
    successor = pi.StreamConsumer(c2, consumer, stream)
    assert successor.assign([0], 2) == {0: 5}
    ran = []
    with pytest.raises(pi.StaleGeneration) as e:
        zombie.process(0, recs(5, 9), lambda conn, r: ran.append(r))
    assert e.value.sqlstate == "ID001"
    assert isinstance(e.value, pi.IdempotencyError)
    assert ran == []
    p = position(c1, consumer, stream)
    assert (p.next_offset, p.generation) == (5, 2)
    # re-assigning with the old generation is refused, partition 1 included
    with pytest.raises(pi.StaleGeneration):
        zombie.assign([0, 1], 1)
    assert zombie.generation == 1
    # the core call too, in the caller's transaction (which rolls back)
    pi.runner_for(c1).execute("INSERT INTO applied VALUES (%s, 0, 99)",
                              (consumer,))
    with pytest.raises(pi.StaleGeneration):
        pi.advance(c1, consumer, stream, 0, 5, 9, 1)
    c1.rollback()
    assert applied(consumer) == list(range(5))
    # the zombie still owns partition 1 (fencing is per partition), and its
    # connection is usable: the refused transactions were rolled back
    assert offs(zombie.process(1, recs(0, 2), writer(consumer, 1, seen))) == \
        [0, 1, 2]
    # the successor goes on from the position
    assert offs(successor.process(0, recs(5, 9), writer(consumer, 0, seen))) \
        == list(range(5, 10))
    assert applied(consumer) == list(range(10))


def test_concurrent_advances_on_one_partition_serialize(connect):
    consumer, stream = new_key("c"), new_key("s")
    ca, cb = connect(), connect()
    a = pi.StreamConsumer(ca, consumer, stream)
    a.assign([0], 1)
    b = pi.StreamConsumer(cb, consumer, stream, generation=1)
    pid_b = pi.runner_for(cb).execute("SELECT pg_backend_pid()")[0][0]
    cb.rollback()
    seen_a, seen_b = [], []
    in_a, go_a = threading.Event(), threading.Event()
    write_a = writer(consumer, 0, seen_a)

    def slow(conn, records):
        write_a(conn, records)
        in_a.set()
        assert go_a.wait(DEADLINE)
    results, errors = {}, []

    def start(name, fn):
        def target():
            try:
                results[name] = fn()
            except BaseException as e:  # noqa: BLE001 -- reported below
                errors.append(e)
                in_a.set()
        t = threading.Thread(target=target, daemon=True)
        t.start()
        return t
    ta = start("a", lambda: a.process(0, recs(0, 9), slow))
    assert in_a.wait(DEADLINE) and not errors
    tb = start("b", lambda: b.process(0, recs(5, 14),
                                      writer(consumer, 0, seen_b)))

    def b_waits():
        with su_connect() as c:
            row = c.execute("SELECT wait_event_type FROM pg_stat_activity"
                            " WHERE pid = %s", (pid_b,)).fetchone()
        return row is not None and row[0] == "Lock"
    waited = []
    try:
        wait_until(lambda: (b_waits() and not waited.append(True)) or errors
                   or not tb.is_alive(),
                   "b waiting for a's lock on the partition")
    finally:
        go_a.set()
        ta.join(DEADLINE)
        tb.join(DEADLINE)
    assert not errors, errors
    assert waited, "b's batch did not wait for a's uncommitted one"
    assert offs(results["a"]) == list(range(10))
    assert offs(results["b"]) == list(range(10, 15))
    assert seen_b == [list(range(10, 15))]
    assert applied(consumer) == list(range(15))
    assert position(ca, consumer, stream).next_offset == 15


def test_sequence_answers_and_strict_gap(anyconn):
    consumer, producer = new_key("c"), "producer-1"

    def seq(epoch, n, **kw):
        return pi.sequence(anyconn, consumer, producer, epoch, n, **kw)
    assert [seq(1, 1), seq(1, 1), seq(1, 2), seq(1, 5), seq(0, 9), seq(2, 0)] \
        == ["new", "duplicate", "new", "gap", "fenced", "new"]
    anyconn.commit()
    with pytest.raises(pi.SequenceGap) as e:
        seq(2, 5, strict=True)
    assert e.value.sqlstate == "ID002"
    anyconn.rollback()
    # the refused one recorded nothing; a rolled-back answer neither
    assert seq(2, 1, strict=True) == "new"
    anyconn.rollback()
    assert seq(2, 1, strict=True) == "new"
    anyconn.commit()
    assert seq(2, 1) == "duplicate"
    assert seq(2, 2, strict=True) == "new"
    anyconn.commit()


def test_bad_arguments_are_refused_before_sql(anyconn):
    with pytest.raises(TypeError):
        pi.assign(anyconn, "c", "s", [0, "1"], 1)
    with pytest.raises(TypeError):
        pi.advance(anyconn, "c", "s", 0, 1.5, 2)
    with pytest.raises(TypeError):
        pi.sequence(anyconn, "c", "p", 1, None)


def test_record_offset():
    class Attr:
        offset = 3

    class Method:
        def offset(self):
            return 4
    assert [pi.record_offset(r) for r in (1, {"offset": 2}, Attr(), Method())] \
        == [1, 2, 3, 4]


def test_asyncio_stream_consumer():
    async def main():
        consumer, stream = new_key("c"), new_key("s")
        seen = []

        async def handle(conn, records):
            seen.append(offs(records))
            for r in records:
                await conn.execute("INSERT INTO applied VALUES (%s, 0, %s)",
                                   (consumer, r["offset"]))
        async with await psycopg.AsyncConnection.connect(
                "user=%s" % APP_USER) as c1, \
                await psycopg.AsyncConnection.connect(
                    "user=%s" % APP_USER) as c2:
            sc = aio.StreamConsumer(c1, consumer, stream)
            assert await sc.assign([0], 1) == {0: None}
            assert offs(await sc.process(0, recs(0, 4), handle)) == \
                list(range(5))
            assert offs(await sc.process(0, recs(3, 6), handle)) == [5, 6]
            assert await sc.process(0, recs(0, 6), handle) == []
            assert seen == [list(range(5)), [5, 6]]
            assert await aio.assign(c2, consumer, stream, [0], 2) == {0: 7}
            await c2.commit()
            try:
                await sc.process(0, recs(7, 8), handle)
                raise AssertionError("a stale generation was accepted")
            except pi.StaleGeneration:
                pass
            assert len(seen) == 2
            r = await aio.advance(c2, consumer, stream, 0, 7, 8, 2)
            assert r == pi.OffsetRange(7, 8)
            await c2.commit()
            ps = await sc.positions()
            assert [(p.next_offset, p.generation) for p in ps] == [(9, 2)]
            assert await aio.sequence(c2, consumer, "p", 1, 1) == "new"
            assert await aio.sequence(c2, consumer, "p", 1, 1) == "duplicate"
            await c2.rollback()
        return consumer
    consumer = asyncio.run(main())
    assert applied(consumer) == list(range(7))

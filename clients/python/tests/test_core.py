"""The core on psycopg 3 and psycopg2: one transaction for the claim and
the business write, the decorator, the SQLSTATE mapping."""

import threading

import psycopg
import psycopg2
import pytest

import pg_idempotency as pi
from conftest import APP_USER, charges_for, new_key, scalar


@pytest.fixture(params=["psycopg", "psycopg2"])
def anyconn(request):
    """A connection of either driver, as the application role."""
    if request.param == "psycopg":
        c = psycopg.connect("user=%s" % APP_USER)
    else:
        c = psycopg2.connect("user=%s" % APP_USER)
    yield c
    c.close()


def insert(conn, key, amount=100):
    pi.runner_for(conn).execute(
        "INSERT INTO charges (key, amount, framework) VALUES (%s, %s, 'core')",
        (key, amount))


def test_claim_key_commits_write_and_key_together(anyconn):
    key = new_key()
    with pi.claim_key(anyconn, key, {"amount": 100}, scope="acct-1") as c:
        assert not c.replayed and c.status == "claimed"
        insert(anyconn, key)
        c.complete(201, {"charge": key}, headers={"Location": "/c/1"})
    assert charges_for(key) == 1
    with pi.claim_key(anyconn, key, {"amount": 100}, scope="acct-1") as c:
        assert c.replayed
        assert c.response.code == 201 and c.response.body == {"charge": key}
        assert c.response.headers == {"Location": "/c/1"}
    assert charges_for(key) == 1
    with pytest.raises(pi.KeyMismatch) as e:
        with pi.claim_key(anyconn, key, {"amount": 999}, scope="acct-1"):
            pytest.fail("mismatch ran the block")
    assert e.value.http_status == 422
    # another scope is another key
    with pi.claim_key(anyconn, key, {"amount": 999}, scope="acct-2") as c:
        assert c.status == "claimed"
        c.release()


def test_exception_rolls_back_write_and_claim(anyconn):
    key = new_key()
    with pytest.raises(RuntimeError):
        with pi.claim_key(anyconn, key, {"n": 1}):
            insert(anyconn, key)
            raise RuntimeError("boom")
    assert charges_for(key) == 0
    assert pi.lookup(anyconn, key) is None
    anyconn.rollback()


def test_unresolved_claim_is_a_programming_error(anyconn):
    key = new_key()
    with pytest.raises(pi.ClaimNotResolved):
        with pi.claim_key(anyconn, key):
            insert(anyconn, key)
    assert charges_for(key) == 0


def test_2d000_at_commit_is_mapped(anyconn):
    key = new_key()
    with pytest.raises(pi.ClaimNotResolved) as e:
        def body():
            pi.claim(anyconn, key)
        pi.run_in_transaction(anyconn, body)
    assert e.value.sqlstate == "2D000"


def test_in_caller_transaction_and_in_progress(anyconn):
    key = new_key()
    # the caller's own transaction: psycopg 3's conn.transaction(), or
    # psycopg2's implicit one
    runner = pi.runner_for(anyconn)
    with runner.transaction():
        with pi.claim_key(anyconn, key, {"a": 1}) as c:
            insert(anyconn, key)
            # a second session sees the key in progress
            with psycopg.connect("user=%s" % APP_USER) as other:
                with pytest.raises(pi.KeyInProgress) as e:
                    with pi.claim_key(other, key, {"a": 1}):
                        pass
                assert e.value.http_status == 409
            c.complete(200, {"ok": True})
    assert charges_for(key) == 1


def test_wait_replays_outcome_of_open_transaction(conn):
    key = new_key()
    holder = psycopg.connect("user=%s" % APP_USER)
    got = {}
    try:
        holder.execute("SELECT 1")   # opens the transaction
        pi.claim(holder, key, {"x": 1})
        insert(holder, key)

        def waiter():
            with psycopg.connect("user=%s" % APP_USER) as w:
                with pi.claim_key(w, key, {"x": 1}, wait=60) as c:
                    got["replayed"] = c.replayed
                    got["code"] = c.response.code if c.response else None
        t = threading.Thread(target=waiter)
        t.start()
        from conftest import wait_until
        wait_until(lambda: scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s "
            "AND wait_event_type = 'Lock'", (APP_USER,)) >= 1,
            "the waiter waits")
        pi.complete(holder, key, 201, {"done": 1})
        holder.commit()
        t.join(60)
        assert got == {"replayed": True, "code": 201}
    finally:
        holder.close()


def test_busy_when_wait_runs_out(conn):
    key = new_key()
    with psycopg.connect("user=%s" % APP_USER) as holder:
        holder.execute("SELECT 1")
        pi.claim(holder, key)
        with pytest.raises(pi.Busy) as e:
            with pi.claim_key(conn, key, wait=0.2):
                pass
        assert e.value.sqlstate == "55P03"
        conn.rollback()
        holder.rollback()
    # lock_timeout was only for the claim
    assert conn.execute("SHOW lock_timeout").fetchone()[0] == "0"


def test_decorator_runs_once_and_replays(anyconn):
    calls = []

    @pi.idempotent(scope="billing")
    def charge(c, account, amount):
        calls.append(amount)
        insert(c, account + ":" + str(amount), amount)
        return {"charged": amount}

    key = new_key()
    assert charge(anyconn, "acct", 5, idempotency_key=key) == {"charged": 5}
    assert charge(anyconn, "acct", 5, idempotency_key=key) == {"charged": 5}
    assert calls == [5]
    with pytest.raises(pi.KeyMismatch):
        charge(anyconn, "acct", 6, idempotency_key=key)
    assert calls == [5]


def test_response_too_large_rolls_back(anyconn):
    key = new_key()
    with pytest.raises(pi.ResponseTooLarge) as e:
        with pi.claim_key(anyconn, key) as c:
            insert(anyconn, key)
            c.complete(200, raw=b"x" * 70000)
    assert e.value.sqlstate == "54000"
    assert charges_for(key) == 0
    assert pi.lookup(anyconn, key) is None


def test_raw_bytes_and_repeated_headers(anyconn):
    key = new_key()
    blob = bytes(range(256)) * 3
    with pi.claim_key(anyconn, key) as c:
        c.complete(201, raw=blob, headers={"Content-Type": "application/x",
                                           "Link": ["<a>", "<b>"]})
    rec = pi.lookup(anyconn, key)
    assert rec.status == "completed" and rec.response.raw == blob
    # jsonb orders the names its own way; the values of one name keep
    # their order
    assert sorted(rec.response.header_items()) == [
        ("Content-Type", "application/x"), ("Link", "<a>"), ("Link", "<b>")]
    anyconn.rollback()


def test_deadlock_is_retried(conn):
    """Two transactions lock two rows in opposite orders: the victim's
    40P01 makes run_in_transaction run it again, and both succeed, each
    once.  (How many retries it takes depends on the machine: on a busy
    one the victim's retry can take the first row again before the other
    transaction, woken by the lock manager, got it, and deadlock again.)"""
    with psycopg.connect("user=%s" % APP_USER, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS dl (id int PRIMARY KEY, n int)")
        c.execute("INSERT INTO dl VALUES (1, 0), (2, 0) ON CONFLICT DO NOTHING")
        before = dict(c.execute("SELECT id, n FROM dl").fetchall())
    barrier = threading.Barrier(2, timeout=60)
    attempts = {"a": 0, "b": 0}
    errors = []

    def worker(name, first, second):
        try:
            with psycopg.connect("user=%s" % APP_USER) as w:
                def body():
                    attempts[name] += 1
                    w.execute("UPDATE dl SET n = n + 1 WHERE id = %s", (first,))
                    if attempts[name] == 1:
                        barrier.wait()
                    w.execute("UPDATE dl SET n = n + 1 WHERE id = %s", (second,))
                pi.run_in_transaction(w, body, attempts=3)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=worker, args=("a", 1, 2)),
          threading.Thread(target=worker, args=("b", 2, 1))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert errors == []
    # a deadlock happened and was retried, within the attempts given
    assert max(attempts.values()) >= 2
    assert all(1 <= n <= 3 for n in attempts.values())
    # each transaction's work committed exactly once
    with psycopg.connect("user=%s" % APP_USER, autocommit=True) as c:
        after = dict(c.execute("SELECT id, n FROM dl").fetchall())
    assert after == {1: before[1] + 2, 2: before[2] + 2}


def test_store_unavailable_is_classified():
    with pytest.raises(psycopg.OperationalError) as e:
        psycopg.connect("host=/nonexistent-socket-dir")
    assert isinstance(pi.classify(e.value), pi.StoreUnavailable)
    assert pi.classify(e.value).http_status == 503


def test_consume(anyconn):
    consumer = new_key("consumer")
    with pi.runner_for(anyconn).transaction():
        assert pi.consume_message(anyconn, consumer, "m1") is True
        assert pi.consume_message(anyconn, consumer, "m1") is False
        assert pi.consume_messages(anyconn, consumer,
                                   ["m2", "m1", "m3", "m2"]) == ["m2", "m3"]
        assert pi.consume_messages(anyconn, consumer, []) == []


def test_runner_for_each_driver(anyconn):
    r = pi.runner_for(anyconn)
    want = pi.PsycopgRunner if isinstance(anyconn, psycopg.Connection) \
        else pi.DbapiRunner
    assert type(r) is want
    assert pi.runner_for(r) is r
    with pytest.raises(TypeError):
        pi.runner_for(object())


def test_psycopg2_autocommit_and_savepoints():
    """DbapiRunner: BEGIN/COMMIT on an autocommit connection, a savepoint
    for a nested block (rolled back alone)."""
    c = psycopg2.connect("user=%s" % APP_USER)
    c.autocommit = True
    try:
        key, inner = new_key(), new_key()
        r = pi.runner_for(c)
        with r.transaction():
            insert(c, key)
            with pytest.raises(ValueError):
                with r.transaction():
                    insert(c, inner)
                    raise ValueError("inner")
            with pi.claim_key(c, key) as cl:
                cl.complete(200)
        assert charges_for(key) == 1 and charges_for(inner) == 0
        assert pi.lookup(c, key).status == "completed"
    finally:
        c.close()

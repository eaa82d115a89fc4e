"""Two-phase mode: claim with a lease, commit, call, complete with the
token; release on failure; a holder killed mid-work is recovered."""

import os
import signal
import subprocess
import threading

import psycopg
import pytest

import pg_idempotency as pi
from conftest import APP_USER, DEADLINE, HERE, PYTHON, new_key, scalar, wait_until


def effects(key, step=None):
    if step:
        return scalar("SELECT count(*) FROM app.effects WHERE key = %s AND step = %s",
                      (key, step))
    return scalar("SELECT count(*) FROM app.effects WHERE key = %s", (key,))


def test_claim_commit_call_complete(conn):
    key = new_key()
    with pi.two_phase(conn, key, {"a": 1}, lease="30 seconds") as op:
        assert not op.replayed and op.token
        # the claim is committed: another session sees it in progress
        with psycopg.connect("user=%s" % APP_USER) as other:
            with pytest.raises(pi.KeyInProgress):
                with pi.two_phase(other, key, {"a": 1}, lease="30 seconds"):
                    pass
        op.checkpoint("step-1")
        # the completion may share a transaction with a business write
        with conn.transaction():
            conn.execute("INSERT INTO effects (key, step) VALUES (%s, 'done')", (key,))
            op.complete(201, {"ok": 1})
    with pi.two_phase(conn, key, {"a": 1}, lease="30 seconds") as op:
        assert op.replayed and op.response.code == 201
        assert op.response.body == {"ok": 1}
    assert effects(key, "done") == 1


def test_failure_releases_and_keeps_recovery_point(conn):
    key = new_key()
    with pytest.raises(RuntimeError):
        with pi.two_phase(conn, key, lease="30 seconds") as op:
            op.checkpoint("half-way")
            raise RuntimeError("provider said 503")
    rec = pi.lookup(conn, key)
    assert rec.status == "released"
    conn.rollback()
    with pi.two_phase(conn, key, lease="30 seconds") as op:
        assert op.recovery_point == "half-way"
        op.complete(200)


def test_duplicate_waits_for_holder(conn):
    key = new_key()
    got = {}
    with pi.two_phase(conn, key, lease="60 seconds") as op:
        def waiter():
            with psycopg.connect("user=%s" % APP_USER) as w:
                with pi.two_phase(w, key, lease="60 seconds", wait=60) as dup:
                    got["replayed"] = dup.replayed
                    got["body"] = dup.response.body if dup.response else None
        t = threading.Thread(target=waiter)
        t.start()
        wait_until(lambda: scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
            "query LIKE %s AND state = 'active'", (APP_USER, "%idem_claim%")) >= 1,
            "the duplicate waits in idem_claim")
        op.complete(201, {"charged": True})
        t.join(DEADLINE)
    assert got == {"replayed": True, "body": {"charged": True}}


def test_killed_holder_is_recovered_once(conn):
    key = new_key()
    env = dict(os.environ)
    proc = subprocess.Popen([PYTHON, os.path.join(HERE, "twophase_worker.py"),
                             key, APP_USER], env=env, stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    old_token = int(line.split()[1])
    proc.send_signal(signal.SIGKILL)
    proc.wait(DEADLINE)
    assert effects(key, "charged") == 1

    done = []

    def finish(op):
        # the kept request and the last recovery point tell what is left
        assert op.request == {"amount": 42}
        if op.recovery_point != "charged":
            conn.execute("INSERT INTO effects (key, step) VALUES (%s, 'charged')", (key,))
        with conn.transaction():
            conn.execute("INSERT INTO effects (key, step) VALUES (%s, 'emailed')", (key,))
            op.complete(201, {"amount": op.request["amount"], "recovered": True})
        done.append(op.key)

    rec = pi.Recoverer(conn, finish, lease="30 seconds", scope="pay")
    # the lease (1 s) lapses; then a round takes the claim over
    wait_until(lambda: rec.run_once() > 0 or None, "the claim is recovered",
               step=0.1)
    assert done == [key]
    assert effects(key, "charged") == 1 and effects(key, "emailed") == 1
    rec_ = pi.lookup(conn, key, "pay")
    assert rec_.status == "completed" and rec_.response.code == 201
    conn.rollback()
    # the dead holder's token is stale
    with pytest.raises(pi.StaleToken) as e:
        with conn.transaction():
            pi.complete(conn, key, 200, scope="pay", token=old_token)
    assert e.value.sqlstate == "55006"
    # the client's retry replays the recovered answer
    with pi.two_phase(conn, key, {"amount": 42}, lease="30 seconds",
                      scope="pay") as op:
        assert op.replayed and op.response.body == {"amount": 42, "recovered": True}
    # nothing left to recover
    assert rec.run_once() == 0

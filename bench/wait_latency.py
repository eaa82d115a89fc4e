#!/usr/bin/python3
"""bench/wait_latency.py -- the client side of bench/wait.sh.

    wait_latency.py ROUNDS DELAY_MIN_MS DELAY_MAX_MS MODE=CONNINFO...

For each round and each MODE (a server, in the order given, rotated by one
each round so that no mode always goes first), on one key:

  1. the holder (a long-lived connection of the main process) makes a
     two-phase claim, idem_claim(key, request, lease => '1 min'), and
     commits it;
  2. the waiter (a long-lived connection of a second process, with
     idempotency.wait_timeout = 30 s) calls idem_claim(key, request,
     lease => '1 min', wait => true) and sleeps on the holder;
  3. once a third connection sees the waiter's backend asleep
     (pg_stat_activity: wait_event_type 'Extension'), the holder waits a
     random DELAY_MIN_MS..DELAY_MAX_MS more (so that a polling waiter is
     at its 50 ms steady interval and the commit falls at a random point
     of it), then completes the key with its token and COMMITs.

Figures per round, each a line "round=R mode=M status=S k=v ...":

  commit_to_answer_ms  from just before the holder's client sends COMMIT
                       to the waiter's client having the answer
                       (time.monotonic in both processes: one clock)
  commit_ms            the holder's COMMIT round trip
  server_ms            from the holder's commit timestamp
                       (pg_xact_commit_timestamp, track_commit_timestamp on)
                       to clock_timestamp() in the waiter's statement once
                       idem_claim has returned: the same wake-up seen by
                       the server alone, without either client

The two clients are separate processes, so neither waits for the other's
interpreter lock; both keep their connections for the whole run, so no
figure includes a connection's or an interpreter's start.  Needs psycopg 3
(Debian: python3-psycopg).
"""

import multiprocessing
import random
import sys
import time

import psycopg

REQUEST = '{"amount": 100, "currency": "eur"}'
BODY = '{"charge": 1}'
WAIT_TIMEOUT_MS = 30000


def waiter(pipe, dsns):
    conns = {}
    for mode, dsn in dsns:
        c = psycopg.connect(dsn, autocommit=True)
        c.execute("SET idempotency.wait_timeout = %d" % WAIT_TIMEOUT_MS)
        conns[mode] = c
    pipe.send({mode: c.info.backend_pid for mode, c in conns.items()})
    while True:
        msg = pipe.recv()
        if msg is None:
            break
        mode, key = msg
        try:
            cur = conns[mode].execute(
                "SELECT c.status, extract(epoch FROM clock_timestamp())::float8"
                " FROM idem_claim(%s, %s::jsonb, lease => '1 min', wait => true) c",
                (key, REQUEST))
            t_answer = time.monotonic()
            status, server_answer = cur.fetchone()
        except psycopg.Error as e:
            t_answer, status, server_answer = time.monotonic(), "error:" + str(e).split("\n")[0], None
        pipe.send((status, t_answer, server_answer))
    for c in conns.values():
        c.close()


def main():
    rounds = int(sys.argv[1])
    dmin, dmax = float(sys.argv[2]), float(sys.argv[3])
    dsns = [a.split("=", 1) for a in sys.argv[4:]]
    modes = [m for m, _ in dsns]

    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=waiter, args=(there, dsns), daemon=True)
    proc.start()
    wpid = here.recv()

    holder = {m: psycopg.connect(d) for m, d in dsns}           # transactions
    monitor = {m: psycopg.connect(d, autocommit=True) for m, d in dsns}
    rng = random.Random(20260423)

    for r in range(1, rounds + 1):
        k = (r - 1) % len(modes)
        for mode in modes[k:] + modes[:k]:
            key = "wait-%d-%s-%d" % (r, mode, rng.getrandbits(48))
            h, mon = holder[mode], monitor[mode]
            (token,) = h.execute(
                "SELECT token FROM idem_claim(%s, %s::jsonb, lease => '1 min')",
                (key, REQUEST)).fetchone()
            h.commit()
            here.send((mode, key))
            # the waiter's backend asleep on the holder (bounded: 30 s)
            deadline = time.monotonic() + 30
            while True:
                ev = mon.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                    (wpid[mode],)).fetchone()
                if ev is not None and ev[0] == "Extension":
                    break
                if here.poll():     # it answered without waiting: an error
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the waiter was never seen asleep (%s)" % mode)
                time.sleep(0.0002)
            time.sleep(rng.uniform(dmin, dmax) / 1000.0)
            (xid,) = h.execute(
                "SELECT pg_current_xact_id()::xid::text"
                " FROM idem_complete(%s, 201, %s::jsonb, token => %s)",
                (key, BODY, token)).fetchone()
            t0 = time.monotonic()
            h.commit()
            t1 = time.monotonic()
            status, t_answer, server_answer = here.recv()
            (committed,) = mon.execute(
                "SELECT extract(epoch FROM pg_xact_commit_timestamp(%s::xid))::float8",
                (xid,)).fetchone()
            server_ms = ("%.3f" % ((server_answer - committed) * 1000.0)
                         if server_answer is not None and committed is not None else "NA")
            print("round=%d mode=%s status=%s commit_to_answer_ms=%.3f commit_ms=%.3f server_ms=%s"
                  % (r, mode, status.replace(" ", "_"), (t_answer - t0) * 1000.0,
                     (t1 - t0) * 1000.0, server_ms), flush=True)

    here.send(None)
    proc.join(10)
    for c in list(holder.values()) + list(monitor.values()):
        c.close()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""test/outbox/services.py -- the processes of the outbox's end-to-end
proof, test/t/068_outbox_end_to_end.pl, which starts, kills and restarts
them.  Each is a real process using the Python client library
(clients/python/src on PYTHONPATH) as an application would:

  publish   service A's business transactions (one connection): each
            publishes 1 to 3 events of one key with pg_idempotency's
            publish() and records them in table "published" in the same
            transaction, each with the key's rank (key_rank.n + 1, the
            key's row locked until COMMIT, so ranks are commit order).
            A tenth of the transactions roll back after publishing; one in
            HOLD_EVERY stays open HOLD_MIN..HOLD_MAX seconds before it
            commits (other publishers commit meanwhile: its events have
            smaller numbers than theirs and become visible after them).
            When the server goes away (stopped with -m immediate), it
            connects again and finds out from "published" whether the
            interrupted transaction committed (all its events there) or
            not (none; anything else is reported as a broken transaction),
            and goes on with the next one: the run publishes exactly
            --events events.  Writes a JSON summary (--summary) at the
            end: the events committed, rolled back (by the transaction or
            by the stop), the transactions held open and the reconnects.
  relay     pg_idempotency.outbox.OutboxRelay delivering topic "orders" to
            B's URL with WebhookSink (Standard Webhooks), retries with
            backoff, no dead letters wanted (max_attempts very high).  Logs
            one line per failed attempt, dead letter, acknowledgment and
            idle poll.  SIGTERM stops it after the event in flight.
            --naive: instead, a hand-written relay that reads the events
            table directly with "ev_id > last_seen" (persisted in table
            naive_position after each batch) and delivers with the same
            sink: the reader the outbox exists to replace, which skips an
            event whose transaction commits after one with a larger
            number (a connection of a superuser; for showing that the test
            catches it).
  receive   service B, a Flask app: POST /hooks/orders is
            pg_idempotency.flask.webhook_receiver (signature checked,
            webhook-id recorded with idem_consume_message in the
            transaction of the handler, which inserts one row into
            "effects").  Chaos: the first answer to a delivery is a 503,
            before anything is done, with probability --fail-before; a 500
            after the effect committed (the answer lost, as a proxy would
            lose it) with probability --fail-after.  Prints "PORT <n>" once
            it listens, and "duplicate <id>" for each redelivery it
            refused.  --no-dedup: the handler verifies the signature and
            inserts the effect without the dedup record (for showing that
            the test catches duplicates).

Connections from the libpq environment (PGHOST, PGPORT, PGDATABASE,
PGUSER).  HOOK_SECRET: the endpoint's secret.
"""

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time

import psycopg

TOPIC = "orders"
RELAY = "shipping"


# ---------------------------------------------------------------- publish

def connect_retrying(deadline):
    """A connection, waiting until DEADLINE (time.monotonic()) for a
    server that is restarting."""
    while True:
        try:
            return psycopg.connect(connect_timeout=10)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def publish(args):
    from pg_idempotency import StoreUnavailable
    from pg_idempotency.outbox import publish as idem_publish

    rng = random.Random(args.seed)
    out = {"committed": [], "rolled_back": [], "lost_in_stop": [],
           "held": 0, "reconnects": 0, "broken": []}
    conn = connect_retrying(time.monotonic() + args.reconnect_for)
    left = args.events
    txn = 0
    while left > 0:
        txn += 1
        n = min(left, rng.randint(1, 3))
        key = "k%02d" % rng.randrange(args.keys)
        rollback = rng.random() < 0.1
        hold = rng.uniform(args.hold_min, args.hold_max) \
            if args.hold_every and rng.randrange(args.hold_every) == 0 else 0
        ids = []
        try:
            with conn.transaction(force_rollback=rollback):
                for i in range(n):
                    rank = conn.execute(
                        "UPDATE key_rank SET n = n + 1 WHERE key = %s"
                        " RETURNING n", (key,)).fetchone()[0]
                    eid = idem_publish(conn, TOPIC,
                                       {"key": key, "rank": rank,
                                        "publisher": args.index,
                                        "txn": txn, "i": i},
                                       key=key)
                    ids.append(eid)
                    conn.execute("INSERT INTO published (event_id, key, rank,"
                                 " publisher) VALUES (%s, %s, %s, %s)",
                                 (eid, key, rank, args.index))
                if hold:
                    out["held"] += 1
                    time.sleep(hold)
        except (psycopg.OperationalError, StoreUnavailable) as e:
            # the server went away: did the transaction commit?
            print("connection lost in transaction %d: %s"
                  % (txn, str(e).strip().splitlines()[0] if str(e) else e),
                  flush=True)
            out["reconnects"] += 1
            try:
                conn.close()
            except Exception:   # noqa: BLE001 -- gone anyway
                pass
            conn = connect_retrying(time.monotonic() + args.reconnect_for)
            if not ids:
                # not even the first publish returned: nothing to look for,
                # and nothing can have committed (the transaction had not
                # come to its COMMIT); the same transaction again
                continue
            # the events not published yet go to the next transactions
            n = len(ids)
            found = conn.execute("SELECT count(*) FROM published"
                                 " WHERE event_id = ANY(%s::uuid[])",
                                 (ids,)).fetchone()[0]
            conn.commit()
            if found == len(ids) and not rollback:
                out["committed"] += ids
            elif found == 0:
                out["lost_in_stop"] += ids
            else:
                out["broken"].append({"txn": txn, "ids": ids,
                                      "found": found})
            left -= n
            continue
        (out["rolled_back"] if rollback else out["committed"]).extend(ids)
        left -= n
    conn.close()
    with open(args.summary + ".tmp", "w") as f:
        json.dump(out, f)
    os.rename(args.summary + ".tmp", args.summary)
    print("published %d events: %d committed, %d rolled back, %d lost in "
          "the stop; %d transactions held open, %d reconnects"
          % (args.events, len(out["committed"]), len(out["rolled_back"]),
             len(out["lost_in_stop"]), out["held"], out["reconnects"]),
          flush=True)


# ---------------------------------------------------------------- relay

def log_event(kind, info):
    if kind in ("attempt-failed", "dead-letter", "database-unavailable"):
        err = info.get("error")
        ev = info.get("event")
        print("%s %s %s" % (kind, ev.event_id if ev is not None else "-",
                            str(err).strip().splitlines()[0]
                            if err is not None and str(err).strip() else ""),
              flush=True)
    elif kind == "acked":
        print("acked %s %s %.3f" % (info["batch"], info["events"],
                                    time.time()), flush=True)
    elif kind == "idle":
        print("idle", flush=True)


def relay(args):
    from pg_idempotency.outbox import OutboxRelay, WebhookSink

    sink = WebhookSink(args.url, os.environ["HOOK_SECRET"], timeout=60)
    if args.naive:
        return naive_relay(args, sink)
    r = OutboxRelay(lambda: psycopg.connect(autocommit=True,
                                            connect_timeout=10),
                    relay=RELAY, topic=TOPIC, sink=sink, max_events=100,
                    initial_delay=0.05, max_delay=0.5,
                    max_attempts=1000000, poll_interval=0.1,
                    on_event=log_event)
    signal.signal(signal.SIGTERM, lambda *a: r.stop())
    print("relaying", flush=True)
    r.run()


def naive_relay(args, sink):
    """The hand-written reader the outbox replaces: id > last_seen."""
    from pg_idempotency.outbox import Event

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    conn = None
    print("relaying (naive: ev_id > last_seen)", flush=True)
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(autocommit=True, connect_timeout=10,
                                       user=args.naive_user)
            last = conn.execute("SELECT last_seen FROM naive_position"
                                ).fetchone()[0]
            rows = conn.execute(
                "SELECT ev_id, event_id::text, key, payload::text,"
                " published_at FROM idempotency.outbox"
                " WHERE topic = %s AND ev_id > %s ORDER BY ev_id LIMIT 100",
                (TOPIC, last)).fetchall()
        except psycopg.OperationalError:
            conn = None
            stop.wait(0.1)
            continue
        if not rows:
            print("idle", flush=True)
            stop.wait(0.1)
            continue
        for ev_id, eid, key, payload, at in rows:
            while not stop.is_set():
                try:
                    sink(Event(eid, key, payload, None, None, at))
                    break
                except Exception as e:  # noqa: BLE001 -- retried
                    print("attempt-failed %s %s" % (eid, e), flush=True)
                    stop.wait(0.05)
        try:
            conn.execute("UPDATE naive_position SET last_seen = %s",
                         (rows[-1][0],))
            print("acked naive %d" % len(rows), flush=True)
        except psycopg.OperationalError:
            conn = None


# ---------------------------------------------------------------- receive

def receive(args):
    from flask import Flask, request
    from psycopg_pool import ConnectionPool
    from werkzeug.serving import make_server

    from pg_idempotency import webhooks as W
    from pg_idempotency.flask import _to_flask, webhook_receiver

    # no line per request: the log is for duplicates and errors
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    secret = os.environ["HOOK_SECRET"]
    rng = random.Random(args.seed)
    lock = threading.Lock()
    seen = set()
    app = Flask(__name__)
    pool = ConnectionPool("", min_size=1, max_size=4, open=False)

    def chance(p):
        with lock:
            return rng.random() < p

    @app.before_request
    def fail_before():
        eid = request.headers.get("webhook-id", "")
        with lock:
            first = eid not in seen
            seen.add(eid)
        if first and chance(args.fail_before):
            return "try again", 503
        return None

    @app.after_request
    def fail_after(resp):
        doc = resp.get_json(silent=True) if resp.is_json else None
        status = (doc or {}).get("status")
        if status == "duplicate":
            print("duplicate %s" % doc["id"], flush=True)
        if status == "applied" and chance(args.fail_after):
            # the effect committed, the answer is lost on its way
            return app.response_class("bad gateway", status=502)
        return resp

    def insert_effect(conn, event):
        e = event.json()
        conn.execute("INSERT INTO effects (event_id, key, rank, publisher)"
                     " VALUES (%s, %s, %s, %s)",
                     (event.id, e["key"], e["rank"], e["publisher"]))

    if args.no_dedup:
        @app.post("/hooks/orders")
        def on_order_no_dedup():
            body = request.get_data(cache=True)
            try:
                msg_id, ts = W.verify(secret, request.headers, body)
                with pool.connection() as conn:
                    insert_effect(conn, W.WebhookEvent(msg_id, ts,
                                                       request.headers,
                                                       body))
            except Exception as e:  # noqa: BLE001 -- answered
                return _to_flask(W.answer_error(e))
            return {"id": msg_id, "status": "applied"}
    else:
        @app.post("/hooks/orders")
        @webhook_receiver(consumer="e2e", secret=secret,
                          connect=pool.connection)
        def on_order(conn, event):
            insert_effect(conn, event)

    pool.open()
    server = make_server("127.0.0.1", args.port, app, threaded=True)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(
        target=server.shutdown).start())
    print("PORT %d" % server.server_port, flush=True)
    server.serve_forever()
    pool.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pb = sub.add_parser("publish")
    pb.add_argument("--index", type=int, required=True)
    pb.add_argument("--events", type=int, required=True)
    pb.add_argument("--keys", type=int, default=32)
    pb.add_argument("--seed", type=int, required=True)
    pb.add_argument("--hold-every", type=int, default=150)
    pb.add_argument("--hold-min", type=float, default=1.0)
    pb.add_argument("--hold-max", type=float, default=3.0)
    pb.add_argument("--reconnect-for", type=float, default=300.0)
    pb.add_argument("--summary", required=True)
    rl = sub.add_parser("relay")
    rl.add_argument("--url", required=True)
    rl.add_argument("--naive", action="store_true")
    rl.add_argument("--naive-user", default=None)
    rc = sub.add_parser("receive")
    rc.add_argument("--port", type=int, default=0)
    rc.add_argument("--seed", type=int, required=True)
    rc.add_argument("--fail-before", type=float, default=0.03)
    rc.add_argument("--fail-after", type=float, default=0.02)
    rc.add_argument("--no-dedup", action="store_true")
    args = p.parse_args()
    {"publish": publish, "relay": relay, "receive": receive}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

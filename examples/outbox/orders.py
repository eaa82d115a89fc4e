"""
The orders service of examples/outbox: places orders and publishes each
as an event in the same transaction, and relays the events to the
shipping service over HTTP (Standard Webhooks).

    python3 orders.py place --count 200 [--rollback-every 10]
                            [--hold-every 25 --hold 1.0] [--seed N]
    python3 orders.py relay --url http://127.0.0.1:8001/hooks/orders

Connection: libpq's environment (PGHOST, PGDATABASE=orders, PGUSER, ...).
The endpoint's secret: HOOK_SECRET ("whsec_<base64>").
"""

import argparse
import os
import random
import signal
import sys
import time

import psycopg

from pg_idempotency import StoreUnavailable
from pg_idempotency.outbox import OutboxRelay, WebhookSink, publish


def connect_retrying(deadline):
    """A connection, waiting (until DEADLINE, time.monotonic()) for a
    server that is restarting."""
    while True:
        try:
            return psycopg.connect()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def place(args):
    """Each order and its event in one transaction.  Every ROLLBACK_EVERY-th
    transaction rolls back after publishing (its event must never reach
    shipping); every HOLD_EVERY-th stays open HOLD seconds after publishing
    before it commits (other publishers commit meanwhile: its event has a
    smaller number than theirs but becomes visible after them).  A lost
    connection (the server restarting) is made again and the order placed
    again: if its COMMIT had gone through, that is a second order, with
    its own event, as a real client retrying would make."""
    rng = random.Random(args.seed)
    committed = lost = 0
    deadline = time.monotonic() + args.reconnect_for
    conn = connect_retrying(deadline)
    i = 1
    while i <= args.count:
        customer = "customer-%d" % rng.randrange(20)
        rollback = args.rollback_every > 0 and i % args.rollback_every == 0
        hold = args.hold if args.hold_every > 0 and \
            i % args.hold_every == 0 else 0
        try:
            with conn.transaction(force_rollback=rollback):
                # the customer's row lock orders its orders by commit
                seq = conn.execute(
                    "UPDATE customers SET seq = seq + 1 WHERE name = %s"
                    " RETURNING seq", (customer,)).fetchone()[0]
                order_id = conn.execute(
                    "INSERT INTO orders (customer, seq, item)"
                    " VALUES (%s, %s, %s) RETURNING id",
                    (customer, seq, "item-%d" % i)).fetchone()[0]
                publish(conn, "orders",
                        {"order": order_id, "customer": customer, "seq": seq},
                        key=customer)
                if hold:
                    time.sleep(hold)
        except (psycopg.OperationalError, StoreUnavailable):
            lost += 1
            conn.close()
            conn = connect_retrying(time.monotonic() + args.reconnect_for)
            continue            # the same order again
        committed += 0 if rollback else 1
        i += 1
    conn.close()
    print("placed %d orders (%d rolled back, %d lost connections)"
          % (committed, args.count - committed, lost), flush=True)


def relay(args):
    sink = WebhookSink(args.url, os.environ["HOOK_SECRET"])

    def on_event(kind, info):
        if kind == "idle":
            print("idle", flush=True)
        elif kind in ("attempt-failed", "dead-letter", "acked"):
            print(kind, {k: (v.event_id if k == "event" else v)
                         for k, v in info.items() if k != "error"},
                  info.get("error", ""), flush=True)

    r = OutboxRelay(lambda: psycopg.connect(autocommit=True),
                    relay="shipping", topic="orders", sink=sink,
                    max_events=args.max_events,
                    generation=args.generation,
                    initial_delay=args.initial_delay,
                    max_delay=args.max_delay,
                    max_attempts=args.max_attempts,
                    poll_interval=args.poll_interval, on_event=on_event)
    signal.signal(signal.SIGTERM, lambda *a: r.stop())
    print("relaying topic orders to %s" % args.url, flush=True)
    r.run()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("place")
    pl.add_argument("--count", type=int, default=100)
    pl.add_argument("--rollback-every", type=int, default=10)
    pl.add_argument("--seed", type=int, default=1)
    pl.add_argument("--hold-every", type=int, default=0)
    pl.add_argument("--hold", type=float, default=1.0)
    pl.add_argument("--reconnect-for", type=float, default=120.0)
    rl = sub.add_parser("relay")
    rl.add_argument("--url", required=True)
    rl.add_argument("--max-events", type=int, default=100)
    rl.add_argument("--generation", type=int, default=None)
    rl.add_argument("--initial-delay", type=float, default=1.0)
    rl.add_argument("--max-delay", type=float, default=60.0)
    rl.add_argument("--max-attempts", type=int, default=8)
    rl.add_argument("--poll-interval", type=float, default=1.0)
    args = p.parse_args()
    {"place": place, "relay": relay}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
#
# examples/consumer/consumer.py -- an exactly-once consumer of an
# at-least-once table queue, with idem_consume_messages(), and a producer
# that publishes some messages more than once.
#
#   python3 examples/consumer/consumer.py produce --count 1000 --dup-rate 0.2
#   python3 examples/consumer/consumer.py consume --name c1 [--mode lease]
#
# The queue (schema.sql) redelivers: the producer publishes duplicates, and
# in lease mode a batch whose consumer died before acking comes back after
# the visibility timeout.  Each batch is one transaction that records its
# message ids with idem_consume_messages() and applies the effect (a
# balance and a ledger line) only for the ids it returned:
#
#   BEGIN;
#   SELECT ... FROM queue ... FOR UPDATE SKIP LOCKED LIMIT n;    -- tx mode
#   SELECT m FROM idem_consume_messages('ledger', ids) AS m;     -- new ids
#   INSERT INTO ledger ...; INSERT INTO accounts ... ON CONFLICT ...;
#   DELETE FROM queue WHERE seq = ANY (...);                     -- ack
#   COMMIT;
#
# Lease mode receives and acks outside the processing transaction, as with
# an external broker (SQS, RabbitMQ, Kafka offsets):
#
#   UPDATE queue SET visible_at = now() + visibility ... RETURNING ...;
#   BEGIN; idem_consume_messages ...; effects ...; COMMIT;
#   DELETE FROM queue WHERE seq = ANY (...);                     -- ack
#
# Fault injection for the test: --crash-at-batch/--crash-point end the
# process with os._exit(3) just before or just after the COMMIT of a batch;
# --hold keeps a batch's transaction open (for a kill -9 from outside);
# --no-dedup skips idem_consume_messages() to show what goes wrong without it.
#
# Connection settings come from --dsn and the usual libpq environment
# (PGHOST, PGPORT, PGDATABASE, PGUSER).  See examples/consumer/README.md.
# Standard library + psycopg 3 only (Debian: python3-psycopg).

import argparse
import os
import random
import sys
import time

import psycopg
from psycopg import errors as pgerrors

CRASH_EXIT_CODE = 3


def log(name, msg):
    sys.stderr.write("%s: %s\n" % (name, msg))
    sys.stderr.flush()


# ------------------------------------------------------------------ produce

def produce(opts):
    """
    Publish messages m-FIRST .. m-(FIRST+COUNT-1), each once into
    "published" and once or (with probability DUP_RATE) twice into the
    queue; also publish REDELIVER messages of earlier runs again.  The
    deliveries are shuffled and inserted CHUNK per transaction.
    """
    rnd = random.Random(opts.seed)
    with psycopg.connect(opts.dsn, autocommit=True,
                         application_name="producer") as conn:
        earlier = []
        if opts.redeliver > 0:
            earlier = conn.execute(
                "SELECT message_id, account, amount FROM published "
                " ORDER BY message_id").fetchall()
            earlier = rnd.sample(earlier, min(opts.redeliver, len(earlier)))

        messages = []
        for n in range(opts.first, opts.first + opts.count):
            messages.append(("m-%07d" % n,
                             "acct-%02d" % rnd.randrange(opts.accounts),
                             rnd.randint(1, 1000)))
        deliveries = list(messages)
        deliveries += [m for m in messages if rnd.random() < opts.dup_rate]
        deliveries += earlier
        rnd.shuffle(deliveries)

        for i in range(0, len(deliveries), opts.chunk):
            chunk = deliveries[i:i + opts.chunk]
            ids = [d[0] for d in chunk]
            accounts = [d[1] for d in chunk]
            amounts = [d[2] for d in chunk]
            with conn.transaction():
                conn.execute(
                    "INSERT INTO published (message_id, account, amount) "
                    "SELECT * FROM unnest(%s::text[], %s::text[], "
                    "                     %s::bigint[]) "
                    "ON CONFLICT (message_id) DO NOTHING",
                    (ids, accounts, amounts))
                conn.execute(
                    "INSERT INTO queue (message_id, account, amount) "
                    "SELECT * FROM unnest(%s::text[], %s::text[], "
                    "                     %s::bigint[])",
                    (ids, accounts, amounts))
        log("producer", "published %d messages in %d deliveries "
            "(%d duplicates, %d redeliveries of earlier messages)"
            % (len(messages), len(deliveries),
               len(deliveries) - len(messages) - len(earlier), len(earlier)))


# ------------------------------------------------------------------ consume

class Consumer:
    def __init__(self, opts):
        self.opts = opts
        self.name = opts.name
        self.conn = psycopg.connect(opts.dsn, autocommit=True,
                                    application_name=opts.name)
        self.batches = 0            # non-empty batches received
        self.delivered = 0
        self.applied = 0

    def maybe_crash(self, point):
        """End the process abruptly at POINT of the batch, if asked to."""
        o = self.opts
        if o.crash_at_batch == self.batches and o.crash_point == point:
            log(self.name, "injected crash %s of batch %d"
                % (point, self.batches))
            os._exit(CRASH_EXIT_CODE)

    def receive_tx(self, conn):
        """Tx mode: lock a batch of visible rows for this transaction."""
        return conn.execute(
            "SELECT seq, message_id, account, amount, receives "
            "  FROM queue WHERE visible_at <= now() "
            " ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED",
            (self.opts.batch,)).fetchall()

    def receive_lease(self):
        """
        Lease mode: hide a batch of visible rows for the visibility timeout,
        in a transaction of its own (the broker's "receive").
        """
        return self.conn.execute(
            "UPDATE queue q "
            "   SET visible_at = clock_timestamp() "
            "                    + make_interval(secs => %s), "
            "       receives = q.receives + 1 "
            "  FROM (SELECT seq FROM queue "
            "         WHERE visible_at <= clock_timestamp() "
            "         ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) b "
            " WHERE q.seq = b.seq "
            "RETURNING q.seq, q.message_id, q.account, q.amount, q.receives",
            (self.opts.visibility, self.opts.batch)).fetchall()

    def apply(self, conn, rows):
        """
        Record the batch's message ids and apply the effect of the new ones,
        in the caller's transaction.  Returns how many messages it applied.
        """
        ids = [r[1] for r in rows]
        if self.opts.no_dedup:
            # the naive consumer: every delivery is applied
            todo = rows
        else:
            # each new id once, in input order; all of them recorded
            new = {r[0] for r in conn.execute(
                "SELECT m FROM idem_consume_messages(%s, %s) AS m",
                (self.opts.group, ids))}
            todo = []
            for r in rows:
                if r[1] in new:
                    todo.append(r)
                    new.discard(r[1])
        if todo:
            conn.execute(
                "INSERT INTO ledger (message_id, account, amount, consumer) "
                "SELECT m, a, x, %s "
                "  FROM unnest(%s::text[], %s::text[], %s::bigint[]) "
                "       AS u (m, a, x)",
                (self.name, [r[1] for r in todo], [r[2] for r in todo],
                 [r[3] for r in todo]))
            # one update per account, in account order, so that concurrent
            # batches lock accounts in the same order
            conn.execute(
                "INSERT INTO accounts (account, balance) "
                "SELECT a, sum(x) "
                "  FROM unnest(%s::text[], %s::bigint[]) AS u (a, x) "
                " GROUP BY a ORDER BY a "
                "ON CONFLICT (account) "
                "DO UPDATE SET balance = accounts.balance + excluded.balance",
                ([r[2] for r in todo], [r[3] for r in todo]))
        # rows some lease-mode consumer received before this delivery (a
        # lease-mode receive has counted this one already)
        seen = 1 if self.opts.mode == "lease" else 0
        again = [r for r in rows if r[4] > seen]
        applied_seqs = {r[0] for r in todo}
        conn.execute(
            "INSERT INTO batches (consumer, mode, delivered, applied, "
            "                     redelivered, redelivered_skipped) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (self.name, self.opts.mode, len(rows), len(todo), len(again),
             sum(1 for r in again if r[0] not in applied_seqs)))
        return len(todo)

    def hold(self):
        if self.opts.hold > 0:
            log(self.name, "holding the transaction of batch %d open for %gs"
                % (self.batches, self.opts.hold))
            time.sleep(self.opts.hold)

    def one_batch_tx(self):
        """Tx mode: receive, apply and ack in one transaction."""
        conn = self.conn
        with conn.transaction():
            rows = self.receive_tx(conn)
            if not rows:
                return 0
            self.batches += 1
            applied = self.apply(conn, rows)
            conn.execute("DELETE FROM queue WHERE seq = ANY (%s)",
                         ([r[0] for r in rows],))
            self.hold()
            self.maybe_crash("before-commit")
        self.maybe_crash("after-commit")
        self.delivered += len(rows)
        self.applied += applied
        return len(rows)

    def one_batch_lease(self):
        """Lease mode: receive; apply in a transaction; then ack."""
        conn = self.conn
        rows = self.receive_lease()
        if not rows:
            return 0
        self.batches += 1
        for attempt in range(1, 4):
            try:
                with conn.transaction():
                    applied = self.apply(conn, rows)
                    self.hold()
                    self.maybe_crash("before-commit")
                break
            except (pgerrors.DeadlockDetected,
                    pgerrors.SerializationFailure) as e:
                log(self.name, "retrying batch %d: %s"
                    % (self.batches, e.diag.message_primary))
                if attempt == 3:
                    # leave the batch to the visibility timeout
                    return len(rows)
        # the effect is committed, the ack is not sent yet: a crash here
        # makes the queue deliver the batch again
        self.maybe_crash("after-commit")
        conn.execute("DELETE FROM queue WHERE seq = ANY (%s)",
                     ([r[0] for r in rows],))
        self.delivered += len(rows)
        self.applied += applied
        return len(rows)

    def queue_empty(self):
        return self.conn.execute(
            "SELECT NOT EXISTS (SELECT FROM queue)").fetchone()[0]

    def run(self):
        step = self.one_batch_lease if self.opts.mode == "lease" \
            else self.one_batch_tx
        while True:
            try:
                n = step()
            except (pgerrors.DeadlockDetected,
                    pgerrors.SerializationFailure) as e:
                # tx mode: the rollback gave the rows back; take a batch again
                log(self.name, "retrying: %s" % e.diag.message_primary)
                continue
            if n == 0:
                if self.opts.exit_when_empty and self.queue_empty():
                    break
                time.sleep(self.opts.poll)
        log(self.name, "done: %d batches, %d deliveries, %d applied, "
            "%d skipped as already consumed"
            % (self.batches, self.delivered, self.applied,
               self.delivered - self.applied))


def main():
    ap = argparse.ArgumentParser(
        description="Example exactly-once consumer of a redelivering queue.")
    ap.add_argument("--dsn", default="",
                    help="libpq connection string (default: PG* environment)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("produce", help="publish messages, some twice")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--first", type=int, default=0,
                   help="number of the first message (ids m-0000000...)")
    p.add_argument("--dup-rate", type=float, default=0.2,
                   help="share of messages published twice")
    p.add_argument("--redeliver", type=int, default=0,
                   help="publish this many earlier messages again")
    p.add_argument("--accounts", type=int, default=20)
    p.add_argument("--chunk", type=int, default=100,
                   help="deliveries per producer transaction")
    p.add_argument("--seed", type=int, default=1)

    c = sub.add_parser("consume", help="consume until stopped")
    c.add_argument("--name", default="consumer-%d" % os.getpid(),
                   help="process name (application_name, ledger.consumer)")
    c.add_argument("--group", default="ledger",
                   help="consumer name given to idem_consume_messages(); "
                        "shared by every process of the group")
    c.add_argument("--mode", choices=("tx", "lease"), default="tx",
                   help="tx: receive+apply+ack in one transaction; lease: "
                        "receive with a visibility timeout, ack after COMMIT")
    c.add_argument("--batch", type=int, default=25)
    c.add_argument("--visibility", type=float, default=30.0,
                   help="lease mode: seconds a received batch stays hidden")
    c.add_argument("--poll", type=float, default=0.1,
                   help="seconds to wait when no message is visible")
    c.add_argument("--exit-when-empty", action="store_true",
                   help="exit once the queue table is empty")
    c.add_argument("--no-dedup", action="store_true",
                   help="do not call idem_consume_messages() (shows the bug)")
    c.add_argument("--crash-at-batch", type=int, default=0,
                   help="os._exit(3) in this batch (1 = first) ...")
    c.add_argument("--crash-point", choices=("before-commit", "after-commit"),
                   default="before-commit", help="... at this point")
    c.add_argument("--hold", type=float, default=0.0,
                   help="seconds to keep each batch's transaction open "
                        "before COMMIT")

    opts = ap.parse_args()
    if opts.command == "produce":
        produce(opts)
    else:
        Consumer(opts).run()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Exactly-once consumer of a partitioned log, with its positions in
PostgreSQL (idem_assign / idem_advance of the idempotency extension).

The log here is Redis Streams, one stream per partition (<stream>:<part>)
whose entry ids are 0-<offset+1>, so that an entry's id gives its offset;
anything with offsets that only grow within a partition (Kafka, Kinesis, a
change stream) fits the same code: only RedisLog changes.

    consumer.py produce --stream payments --parts 4 --count 1000
    consumer.py consume --group billing --stream payments --parts 0,1,2,3 \
                        --generation auto --exit-when-idle

Each batch of one partition is applied in one transaction:

    BEGIN;
    SELECT * FROM idem_advance('billing', 'payments', part, first, last, generation);
    -- apply the records whose offsets are in the range it returns (none
    -- if it returns no row: the batch was applied already)
    COMMIT;

The position moves with the effects or not at all, so a crash, a rollback
or a redelivery never applies a record twice nor skips one.  On
assignment, idem_assign() stores the generation and says where to seek;
once a partition has been assigned with a higher generation, a consumer
still holding it (a zombie: paused, partitioned away, slow) is refused
with SQLSTATE ID001, changes nothing, and stops consuming it.

Python 3 with psycopg 3 and redis-py (Debian: python3-psycopg,
python3-redis).  PostgreSQL from the libpq environment (PGHOST,
PGDATABASE, ...); Redis from --redis (a URL: redis://host:port/0 or
unix:///path/to/redis.sock).  See README.md.
"""

import argparse
import os
import signal
import sys
import time

import psycopg
import redis

STALE_GENERATION = "ID001"


def say(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- the log
class RedisLog:
    """A partitioned log on Redis Streams: partition p of stream s is the
    Redis stream "s:p"; the entry of offset o has id 0-<o+1> (Redis refuses
    0-0)."""

    def __init__(self, url, stream):
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.stream = stream

    def key(self, part):
        return "%s:%d" % (self.stream, part)

    def read(self, positions, count, block_ms):
        """Up to count records of each partition from its position on:
        {part: [(offset, fields), ...]}; waits up to block_ms for some."""
        if not positions:
            time.sleep(block_ms / 1000)
            return {}
        # XREAD returns the entries after the id given: 0-<next> is the id
        # of offset next - 1
        got = self.r.xread({self.key(p): "0-%d" % n for p, n in positions.items()},
                           count=count, block=block_ms)
        out = {}
        for key, entries in got or []:
            part = int(key.rsplit(":", 1)[1])
            out[part] = [(int(i.split("-", 1)[1]) - 1, f) for i, f in entries]
        return out

    def append(self, part, offset, fields):
        self.r.xadd(self.key(part), fields, id="0-%d" % (offset + 1))

    def end(self, part):
        """The offset after the partition's last entry (0 if empty)."""
        last = self.r.xrevrange(self.key(part), count=1)
        return int(last[0][0].split("-", 1)[1]) if last else 0


# ---------------------------------------------------------------- the effect
def apply(cur, part, offset, fields, args):
    """The business effect of one record, in the batch's transaction: a
    ledger line and the account's balance."""
    amount = int(fields["amount"])
    cur.execute(
        "INSERT INTO ledger (stream, part, off, account, amount, consumer)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (args.stream, part, offset, fields["account"], amount, args.name))
    cur.execute(
        "INSERT INTO balances (account, balance) VALUES (%s, %s)"
        " ON CONFLICT (account) DO UPDATE SET balance = balances.balance + EXCLUDED.balance",
        (fields["account"], amount))


# ---------------------------------------------------------------- consumer
class Consumer:
    def __init__(self, args):
        self.args = args
        self.db = psycopg.connect(autocommit=True, application_name="streams-example")
        self.log = RedisLog(args.redis, args.stream)
        self.generation = None
        self.positions = {}     # partition -> next offset to read
        self.batches = 0
        self.applied = 0

    def assign(self, parts, generation):
        """On assignment (Kafka: onPartitionsAssigned): store the generation
        and seek where idem_assign says; a partition never seen starts at
        the log's beginning (the application's policy: could be its end)."""
        rows = self.db.execute(
            "SELECT part, next_offset FROM idem_assign(%s, %s, %s::int[], %s)",
            (self.args.group, self.args.stream, parts, generation)).fetchall()
        self.generation = generation
        self.positions = {p: (n if n is not None else 0) for p, n in rows}
        say("%s: assigned %s with generation %d, seeking to %s"
            % (self.args.name, parts, generation,
               ", ".join("%d:%d" % (p, n) for p, n in sorted(self.positions.items()))))

    def handle(self, part, records):
        """One batch of one partition, in one transaction.  Returns False if
        the partition was taken over by a newer generation."""
        first = self.positions[part]
        last = records[-1][0]
        try:
            with self.db.transaction():
                with self.db.cursor() as cur:
                    cur.execute(
                        "SELECT first_offset, last_offset"
                        " FROM idem_advance(%s, %s, %s, %s, %s, %s)",
                        (self.args.group, self.args.stream, part, first, last,
                         self.generation))
                    todo = cur.fetchone()
                    n = 0
                    if todo is not None:
                        for offset, fields in records:
                            if todo[0] <= offset <= todo[1]:
                                apply(cur, part, offset, fields, self.args)
                                n += 1
                    self.test_hook_crash()
        except psycopg.Error as e:
            if e.sqlstate != STALE_GENERATION:
                raise
            # a zombie: another consumer owns the partition now; nothing
            # of this batch was written.  Stop consuming it.
            say("%s: partition %d: fenced, generation %d is stale (%s); dropping it"
                % (self.args.name, part, self.generation, e.diag.message_detail))
            del self.positions[part]
            return False
        # committed: only now does the read position move past the batch
        self.positions[part] = last + 1
        self.batches += 1
        self.applied += n
        return True

    def test_hook_crash(self):
        a = self.args
        if a.crash_after_batches is not None and self.batches >= a.crash_after_batches:
            say("%s: crashing inside a transaction (--crash-after-batches)" % a.name)
            os._exit(9)

    def run(self):
        a = self.args
        self.assign(a.parts, a.generation)
        idle_since = None
        while self.positions:
            batches = self.log.read(self.positions, a.batch, 200)
            if not batches:
                idle_since = idle_since or time.monotonic()
                if a.exit_when_idle and time.monotonic() - idle_since >= a.idle_seconds:
                    break
                continue
            idle_since = None
            for part, records in sorted(batches.items()):
                if (a.pause_after_batches is not None and self.batches >= a.pause_after_batches):
                    # test hook: a consumer frozen with a batch in hand (a
                    # long GC pause, a suspended VM), after its assignment
                    a.pause_after_batches = None
                    say("%s: stopping myself with partition %d offsets %d..%d in hand"
                        % (a.name, part, records[0][0], records[-1][0]))
                    os.kill(os.getpid(), signal.SIGSTOP)
                    say("%s: resumed" % a.name)
                if part in self.positions:
                    self.handle(part, records)
        say("%s: %d records applied in %d batches" % (a.name, self.applied, self.batches))
        if not self.positions:
            say("%s: every partition was taken over: rejoin the group" % a.name)
            return 3
        return 0


def generation_arg(args):
    """--generation auto: the next number of a counter in Redis, like a
    consumer group's generation: every new assignment gets a higher one."""
    if args.generation == "auto":
        r = redis.Redis.from_url(args.redis)
        return int(r.incr("%s:generation:%s" % (args.stream, args.group)))
    return int(args.generation)


def produce(args):
    log = RedisLog(args.redis, args.stream)
    total = 0
    n = 0
    for part in range(args.parts):
        offset = log.end(part)
        for i in range(args.count):
            # a compacted topic: some offsets are not there (never an error)
            if args.missing_pct and (offset * 7919 % 100) < args.missing_pct:
                offset += 1
            amount = offset % 97 + 1
            log.append(part, offset, {"account": "acct-%d" % (offset % 10), "amount": amount})
            total += amount
            n += 1
            offset += 1
    say("produced %d records, total amount %d" % (n, total))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    p.add_argument("--stream", default="payments")
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("produce", help="append records to every partition")
    pr.add_argument("--parts", type=int, default=4)
    pr.add_argument("--count", type=int, default=1000, help="records per partition")
    pr.add_argument("--missing-pct", type=int, default=0, help="offsets left out (compaction)")
    co = sub.add_parser("consume", help="apply the records of some partitions")
    co.add_argument("--name", default="consumer-%d" % os.getpid())
    co.add_argument("--group", default="billing", help="the positions' consumer name")
    co.add_argument("--parts", required=True, type=lambda s: [int(x) for x in s.split(",")])
    co.add_argument("--generation", default="auto", help="a number, or auto (a Redis counter)")
    co.add_argument("--batch", type=int, default=100, help="records per batch and partition")
    co.add_argument("--exit-when-idle", action="store_true")
    co.add_argument("--idle-seconds", type=float, default=1.0)
    co.add_argument("--pause-after-batches", type=int, help="test hook: SIGSTOP myself then")
    co.add_argument("--crash-after-batches", type=int, help="test hook: die before a COMMIT")
    args = p.parse_args()
    if args.cmd == "produce":
        produce(args)
        return 0
    args.generation = generation_arg(args)
    return Consumer(args).run()


if __name__ == "__main__":
    sys.exit(main())

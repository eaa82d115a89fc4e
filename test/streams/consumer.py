#!/usr/bin/python3
"""test/streams/consumer.py -- one consumer process of the Redis-backed
streams test (test/t/070_streams_redis.pl, run by coordinator.py).

It reads the partitions it is assigned from Redis Streams (one stream per
partition, entry id 0-<offset+1>, field v) and applies each record once:
per batch of one partition, one transaction that calls idem_advance() with
the assignment's generation and inserts one effects row per record it
returns, then commits.  The position lives in PostgreSQL only: on
assignment, idem_assign() says where to seek; after a commit the in-memory
read position moves past the batch, after a rollback it does not (the batch
is read again).

The coordinator talks to it with JSON lines, on stdin:
  {"type": "assign", "gen": G, "parts": [...]}   a new assignment (the
      partitions it had before are revoked): idem_assign(), an assignments
      row per partition, then {"type": "assigned"} back
  {"type": "pause"}     read a batch of every partition it has (waiting
      until there is one), report them ({"type": "holding"}) and wait for
      "continue" before doing anything with them: the coordinator SIGSTOPs
      the process meanwhile and gives its partitions to the others, so that
      after "continue" it is a zombie: it tries each held batch (each must
      be refused with ID001), reports each try ({"type": "zombie_attempt"}),
      then drops every partition and asks to rejoin ({"type": "fenced"}),
      as a Kafka consumer does after a fencing error
  {"type": "stop"}      report its counters ({"type": "done"}) and exit
and on stdout it writes the answers and {"type": "refused"} for a batch
refused in ordinary operation (a reassignment overtook it).

Options: --name, --group, --stream, --redis-socket, --prefix,
--batch-max (records per read, drawn from 1..N), --rollback-pct (roll back
that share of batches after doing their work), --seed.  PostgreSQL from the
libpq environment (PGHOST, PGPORT, PGDATABASE, PGUSER).
"""

import argparse
import json
import os
import random
import select
import sys
import time

import psycopg
import redis

STALE = "ID001"


class Control:
    """Non-blocking JSON lines from stdin, and JSON lines to stdout."""

    def __init__(self):
        self.buf = b""
        self.lines = []
        self.eof = False

    def poll(self, timeout):
        """Read what is there, waiting up to timeout seconds for something."""
        if self.lines or self.eof:
            return
        r, _, _ = select.select([0], [], [], timeout)
        if r:
            data = os.read(0, 65536)
            if not data:
                self.eof = True
            self.buf += data
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if line.strip():
                    self.lines.append(json.loads(line))

    def next(self, timeout=0.0):
        self.poll(timeout)
        return self.lines.pop(0) if self.lines else None

    def wait(self, kind):
        """Block until a message of this type (others before it are kept)."""
        while True:
            for i, m in enumerate(self.lines):
                if m["type"] == kind:
                    return self.lines.pop(i)
            if self.eof:
                raise SystemExit("coordinator went away")
            self.poll(None)

    @staticmethod
    def send(**msg):
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


class Consumer:
    def __init__(self, args):
        self.a = args
        self.rnd = random.Random(args.seed)
        self.ctl = Control()
        self.db = psycopg.connect(application_name="streams-" + args.name)
        self.redis = redis.Redis(unix_socket_path=args.redis_socket,
                                 decode_responses=True)
        self.gen = None
        self.pos = {}  # partition -> next offset to read
        self.counts = dict(batches=0, records=0, rollbacks=0, refused=0,
                           assignments=0, empty_advances=0)

    def key(self, part):
        return "%s:%d" % (self.a.prefix, part)

    # ------------------------------------------------------------ assignment
    def assign(self, gen, parts):
        try:
            rows = self.db.execute(
                "WITH a AS (SELECT * FROM idem_assign(%s, %s, %s::int[], %s)),"
                " log AS (INSERT INTO assignments (part, generation, consumer, assigned_at)"
                "         SELECT part, %s, %s, clock_timestamp() FROM a)"
                " SELECT part, next_offset FROM a",
                (self.a.group, self.a.stream, parts, gen, gen, self.a.name),
            ).fetchall()
            self.db.commit()
        except psycopg.Error as e:
            self.db.rollback()
            Control.send(type="assign_refused", name=self.a.name, gen=gen,
                         sqlstate=e.sqlstate, error=str(e).strip())
            return
        self.gen = gen
        # a partition never seen starts at the log's beginning (our policy)
        self.pos = {p: (n if n is not None else 0) for p, n in rows}
        self.counts["assignments"] += 1
        Control.send(type="assigned", name=self.a.name, gen=gen,
                     seek={str(p): n for p, n in rows})

    # ------------------------------------------------------------ reading
    def read(self, block_ms):
        """One batch per partition that has records past its position."""
        if not self.pos:
            return {}
        count = self.rnd.randint(1, self.a.batch_max)
        streams = {self.key(p): "0-%d" % n for p, n in self.pos.items()}
        got = self.redis.xread(streams, count=count, block=block_ms)
        out = {}
        for key, entries in got or []:
            part = int(key.rsplit(":", 1)[1])
            recs = [(int(i.split("-", 1)[1]) - 1, f["v"]) for i, f in entries]
            if recs:
                out[part] = recs
        return out

    # ------------------------------------------------------------ one batch
    def apply(self, part, recs, gen, allow_rollback=True):
        """One transaction: advance and effects.  Returns 'committed',
        'rolled back' or the SQLSTATE that refused it."""
        first = self.pos[part]
        last = recs[-1][0]
        try:
            row = self.db.execute(
                "SELECT first_offset, last_offset FROM idem_advance(%s, %s, %s, %s, %s, %s)",
                (self.a.group, self.a.stream, part, first, last, gen),
            ).fetchone()
            if row is None:
                self.counts["empty_advances"] += 1
            else:
                todo = [(o, v) for o, v in recs if row[0] <= o <= row[1]]
                self.db.execute(
                    "INSERT INTO effects (part, off, v, consumer, generation, written_at)"
                    " SELECT %s, o, v, %s, %s, clock_timestamp()"
                    " FROM unnest(%s::bigint[], %s::text[]) AS t(o, v)",
                    (part, self.a.name, gen, [o for o, _ in todo], [v for _, v in todo]),
                )
                self.counts["records"] += len(todo)
            if allow_rollback and self.rnd.random() * 100 < self.a.rollback_pct:
                self.db.rollback()
                self.counts["rollbacks"] += 1
                if row is not None:
                    self.counts["records"] -= len(todo)
                return "rolled back"
            self.db.commit()
        except psycopg.Error as e:
            self.db.rollback()
            if e.sqlstate != STALE:
                raise
            return e.sqlstate
        self.pos[part] = last + 1
        self.counts["batches"] += 1
        return "committed"

    # ------------------------------------------------------------ zombie
    def pause(self):
        held = {}
        while not held:
            if not self.pos:
                break
            held = self.read(100)
        gen = self.gen
        Control.send(type="holding", name=self.a.name, gen=gen,
                     batches=[[p, self.pos[p], r[-1][0], len(r)] for p, r in sorted(held.items())])
        self.ctl.wait("continue")
        # SIGSTOPped and resumed meanwhile: the partitions are others' now
        for part, recs in sorted(held.items()):
            first = self.pos[part]
            outcome = self.apply(part, recs, gen, allow_rollback=False)
            Control.send(type="zombie_attempt", name=self.a.name, part=part,
                         gen=gen, first=first, last=recs[-1][0],
                         outcome=outcome)
        self.pos = {}
        self.gen = None
        Control.send(type="fenced", name=self.a.name)

    # ------------------------------------------------------------ main loop
    def run(self):
        Control.send(type="ready", name=self.a.name, pid=os.getpid())
        while True:
            # control messages first, between transactions
            idle = not self.pos
            msg = self.ctl.next(0.1 if idle else 0.0)
            if self.ctl.eof:
                return
            if msg is not None:
                t = msg["type"]
                if t == "assign":
                    self.assign(msg["gen"], msg["parts"])
                elif t == "pause":
                    self.pause()
                elif t == "stop":
                    Control.send(type="done", name=self.a.name, **self.counts)
                    return
                else:
                    raise SystemExit("unknown message %r" % msg)
                continue
            if not self.pos:
                continue
            batches = self.read(100)
            for part, recs in sorted(batches.items()):
                if part not in self.pos:
                    continue
                outcome = self.apply(part, recs, self.gen)
                if outcome == STALE:
                    # a reassignment overtook this batch: the partition is
                    # another's now; the new assignment is on its way
                    self.counts["refused"] += 1
                    del self.pos[part]
                    Control.send(type="refused", name=self.a.name, part=part, gen=self.gen)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--redis-socket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--batch-max", type=int, default=200)
    p.add_argument("--rollback-pct", type=float, default=0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    try:
        Consumer(a).run()
    except Exception as e:  # reported to the coordinator, which fails the run
        Control.send(type="error", name=a.name, error="%s: %s" % (type(e).__name__, e))
        raise


if __name__ == "__main__":
    main()

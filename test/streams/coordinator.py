#!/usr/bin/python3
"""test/streams/coordinator.py -- the log, the group coordinator and the
zombie maker of the Redis-backed streams test (test/t/070_streams_redis.pl).

Redis Streams has no partition assignment, so this plays Kafka's group
coordinator for a group of --consumers processes (consumer.py) over --parts
partitions, each a Redis stream <prefix>:<part> whose entries have ids
0-<offset+1> and one field v = "r<part>.<offset>".

  1. The log: --records records spread over the partitions, offsets from 0
     with --missing-pct of them left out at random (a compacted topic), all
     written to table produced (part, off, v), and to Redis in --chunks
     chunks: the first before the consumers start, each next one right
     after a reassignment, so that every reassignment and every zombie has
     records still to come however fast the machine is.
  2. Reassignments: the first assignment, then one every --rebalance-seconds
     until the last chunk is written, then on every --rebalance-seconds
     until the consumers have caught up.  Each has a new generation (1, 2,
     ...) and moves every partition (partition p goes to member
     (p + generation) mod members, members in name order); it is sent to
     every member, which calls idem_assign(), and the next one waits until
     every member has answered.
  3. Zombies (--zombies of the reassignments, spread over the chunks): the
     coordinator tells one member to pause; it reads a batch of each of its
     partitions and says so; the coordinator SIGSTOPs it (and waits until
     the kernel says it is stopped), reassigns all partitions to the other
     members with a new generation and waits for their idem_assign() to
     commit, then SIGCONTs it and lets it go on: it tries each held batch
     with its old generation (each must be refused with ID001), drops its
     partitions and rejoins at the next reassignment.
  4. The end: when every partition's position (idem_positions()) is past its
     last offset, every member is stopped; the summary (--summary, JSON) has
     the generations, the zombies' attempts and outcomes and the members'
     counters.  The test checks the tables itself.

Exit status 0 if the run got to its end (every record consumed, no
consumer failed); the invariants are the test's to check.  Every wait is
for a condition, bounded by --timeout (for a hung run, not a slow one).
PostgreSQL from the libpq environment, as the consumers' role.
"""

import argparse
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time

import psycopg
import redis

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print("coordinator:", *a, file=sys.stderr, flush=True)


class Failed(Exception):
    pass


class Member:
    def __init__(self, name, proc):
        self.name = name
        self.proc = proc
        self.buf = b""
        self.eof = False

    def send(self, **msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()


class Coordinator:
    def __init__(self, a):
        self.a = a
        self.rnd = random.Random(a.seed)
        self.redis = redis.Redis(unix_socket_path=a.redis_socket, decode_responses=True)
        self.db = psycopg.connect(autocommit=True, application_name="streams-coordinator")
        self.sel = selectors.DefaultSelector()
        self.members = {}
        self.out = set()  # members out of the group (zombies until they rejoin)
        self.gen = 0
        self.acks = {}
        self.holding = {}
        self.fenced = set()
        self.attempts = []
        self.refusals = []
        self.done = {}
        self.rebalances = []
        self.episodes = []
        self.last = {}
        self.chunks = []
        self.deadline_s = a.timeout
        self.ready = set()

    # ------------------------------------------------------------ the log
    def make_log(self):
        a = self.a
        per, extra = divmod(a.records, a.parts)
        rows = []
        self.chunks = [[] for _ in range(a.chunks)]
        for p in range(a.parts):
            n = per + (1 if p < extra else 0)
            if n < a.chunks:
                raise Failed("partition %d would have %d records, fewer than %d chunks" % (p, n, a.chunks))
            offs = []
            o = 0
            while len(offs) < n:
                if self.rnd.random() * 100 >= a.missing_pct:
                    offs.append(o)
                o += 1
            self.last[p] = offs[-1]
            for c in range(a.chunks):
                lo, hi = c * n // a.chunks, (c + 1) * n // a.chunks
                self.chunks[c].append((p, offs[lo:hi]))
            rows.extend((p, o) for o in offs)
        with self.db.cursor() as cur:
            with cur.copy("COPY produced (part, off, v) FROM STDIN") as cp:
                for p, o in rows:
                    cp.write_row((p, o, "r%d.%d" % (p, o)))
        self.offset_space = sum(self.last[p] + 1 for p in self.last)
        log("log: %d records over %d partitions, %d offsets (%d missing), %d chunks"
            % (len(rows), a.parts, self.offset_space, self.offset_space - len(rows), a.chunks))

    def append_chunk(self, c):
        pipe = self.redis.pipeline(transaction=False)
        n = 0
        for p, offs in self.chunks[c]:
            key = "%s:%d" % (self.a.prefix, p)
            for o in offs:
                pipe.xadd(key, {"v": "r%d.%d" % (p, o)}, id="0-%d" % (o + 1))
                n += 1
                if n % 2000 == 0:
                    pipe.execute()
        pipe.execute()
        log("chunk %d written (%d records)" % (c, n))

    # ------------------------------------------------------------ members
    def spawn(self):
        a = self.a
        for i in range(a.consumers):
            name = "c%d" % i
            err = open(os.path.join(a.log_dir, name + ".log"), "w")
            proc = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "consumer.py"),
                 "--name", name, "--group", a.group, "--stream", a.stream,
                 "--redis-socket", a.redis_socket, "--prefix", a.prefix,
                 "--batch-max", str(a.batch_max), "--rollback-pct", str(a.rollback_pct),
                 "--seed", str(a.seed * 100 + i)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
            m = Member(name, proc)
            self.members[name] = m
            os.set_blocking(proc.stdout.fileno(), False)
            self.sel.register(proc.stdout, selectors.EVENT_READ, m)
        self.wait_for(lambda: len(self.ready) == a.consumers, "the consumers to start")

    def handle(self, m, msg):
        t = msg["type"]
        if t == "ready":
            self.ready.add(m.name)
        elif t == "assigned":
            self.acks.setdefault(msg["gen"], set()).add(m.name)
        elif t == "assign_refused":
            raise Failed("%s: idem_assign(generation %d) refused: %s" % (m.name, msg["gen"], msg["error"]))
        elif t == "holding":
            self.holding[m.name] = msg
        elif t == "zombie_attempt":
            self.attempts.append(msg)
        elif t == "fenced":
            self.fenced.add(m.name)
        elif t == "refused":
            self.refusals.append(msg)
        elif t == "done":
            self.done[m.name] = msg
        elif t == "error":
            raise Failed("%s failed: %s" % (m.name, msg["error"]))
        else:
            raise Failed("%s: unknown message %r" % (m.name, msg))

    def pump(self, timeout):
        for key, _ in self.sel.select(timeout):
            m = key.data
            data = os.read(m.proc.stdout.fileno(), 65536)
            if not data:
                m.eof = True
                self.sel.unregister(m.proc.stdout)
                if m.name not in self.done:
                    raise Failed("%s exited (status %s) before it was stopped"
                                 % (m.name, m.proc.wait()))
                continue
            m.buf += data
            while b"\n" in m.buf:
                line, m.buf = m.buf.split(b"\n", 1)
                self.handle(m, json.loads(line))

    def wait_for(self, cond, what):
        end = time.monotonic() + self.deadline_s
        while not cond():
            if time.monotonic() > end:
                raise Failed("timed out waiting for " + what)
            self.pump(0.05)

    def sleep_until(self, t):
        """The schedule of reassignments is by time; messages keep coming."""
        while True:
            d = t - time.monotonic()
            if d <= 0:
                return
            self.pump(d)

    # ------------------------------------------------------------ assignment
    def group(self):
        return sorted(n for n in self.members if n not in self.out)

    def rebalance(self, members):
        self.gen += 1
        g = self.gen
        plan = {n: [] for n in members}
        for p in range(self.a.parts):
            plan[members[(p + g) % len(members)]].append(p)
        for n in members:
            self.members[n].send(type="assign", gen=g, parts=plan[n])
        self.wait_for(lambda: self.acks.get(g, set()) >= set(members),
                      "the assignment of generation %d" % g)
        self.rebalances.append({"gen": g, "plan": plan})
        return g

    def stopped(self, pid):
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")

    def zombie(self, chunk):
        members = self.group()
        z = members[len(self.episodes) % len(members)]
        m = self.members[z]
        old = self.gen
        self.holding.pop(z, None)
        m.send(type="pause")
        self.append_chunk(chunk)
        self.wait_for(lambda: z in self.holding, "%s to hold a batch" % z)
        held = self.holding[z]["batches"]
        os.kill(m.proc.pid, signal.SIGSTOP)
        self.wait_for(lambda: self.stopped(m.proc.pid), "%s to stop" % z)
        self.out.add(z)
        new = self.rebalance([n for n in members if n != z])
        log("zombie %s: stopped holding %s of generation %d; partitions reassigned with generation %d"
            % (z, held, old, new))
        before = len(self.attempts)
        self.fenced.discard(z)
        os.kill(m.proc.pid, signal.SIGCONT)
        m.send(type="continue")
        self.wait_for(lambda: z in self.fenced, "%s to be fenced" % z)
        tries = self.attempts[before:]
        log("zombie %s: %s" % (z, ", ".join("partition %d %d..%d: %s" % (t["part"], t["first"], t["last"], t["outcome"]) for t in tries)))
        self.episodes.append({"zombie": z, "old_gen": old, "new_gen": new,
                              "held": held, "attempts": tries})
        self.out.discard(z)  # it rejoins at the next reassignment

    # ------------------------------------------------------------ the end
    def caught_up(self):
        rows = self.db.execute("SELECT part, next_offset FROM idem_positions(%s, %s)",
                               (self.a.group, self.a.stream)).fetchall()
        pos = dict(rows)
        return all(pos.get(p) == self.last[p] + 1 for p in self.last)

    def run(self):
        a = self.a
        start = time.monotonic()
        self.make_log()
        self.spawn()
        slots = {round((i + 1) * a.chunks / (a.zombies + 1)) for i in range(a.zombies)}
        if a.zombies and (len(slots) != a.zombies or min(slots) < 1 or max(slots) >= a.chunks):
            raise Failed("--chunks %d leaves no room for %d zombies" % (a.chunks, a.zombies))
        self.rebalance(self.group())
        self.append_chunk(0)
        nxt = time.monotonic() + a.rebalance_seconds
        for c in range(1, a.chunks):
            self.sleep_until(nxt)
            if c in slots:
                self.zombie(c)
            else:
                self.rebalance(self.group())
                self.append_chunk(c)
            nxt = time.monotonic() + a.rebalance_seconds
        # go on reassigning until every record is consumed
        end = time.monotonic() + self.deadline_s
        while not self.caught_up():
            if time.monotonic() > end:
                raise Failed("timed out waiting for the consumers to catch up")
            if time.monotonic() >= nxt:
                self.rebalance(self.group())
                nxt = time.monotonic() + a.rebalance_seconds
            self.pump(0.1)
        for m in self.members.values():
            m.send(type="stop")
        self.wait_for(lambda: len(self.done) == len(self.members), "the consumers to stop")
        for m in self.members.values():
            rc = m.proc.wait(timeout=self.deadline_s)
            if rc != 0:
                raise Failed("%s exited with status %d" % (m.name, rc))
        summary = {
            "records": a.records, "offset_space": self.offset_space,
            "last_offsets": {str(p): o for p, o in self.last.items()},
            "generations": self.gen, "rebalances": len(self.rebalances),
            "episodes": self.episodes, "refusals": len(self.refusals),
            "consumers": self.done, "seconds": round(time.monotonic() - start, 1),
        }
        with open(a.summary, "w") as f:
            json.dump(summary, f, indent=1)
        log("done in %.1f s: %d generations, %d zombie episodes, %d batches refused in"
            " ordinary reassignments, %s" % (summary["seconds"], self.gen, len(self.episodes),
                                             len(self.refusals),
                                             {n: {k: v for k, v in d.items() if k not in ("type", "name")}
                                              for n, d in sorted(self.done.items())}))

    def kill_all(self):
        for m in self.members.values():
            if m.proc.poll() is None:
                try:
                    os.kill(m.proc.pid, signal.SIGCONT)
                    m.proc.kill()
                    m.proc.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=100000)
    p.add_argument("--parts", type=int, default=12)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--rebalance-seconds", type=float, default=2.0)
    p.add_argument("--zombies", type=int, default=2)
    p.add_argument("--missing-pct", type=float, default=0)
    p.add_argument("--rollback-pct", type=float, default=0)
    p.add_argument("--batch-max", type=int, default=200)
    p.add_argument("--group", default="g")
    p.add_argument("--stream", default="s")
    p.add_argument("--prefix", default="s")
    p.add_argument("--redis-socket", required=True)
    p.add_argument("--summary", required=True)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    c = Coordinator(a)
    try:
        c.run()
    except Failed as e:
        log("FAILED:", e)
        c.kill_all()
        sys.exit(1)
    except BaseException:
        c.kill_all()
        raise


if __name__ == "__main__":
    main()

"""examples/lib/payments_load.py -- the concurrent client the scale-out
examples' load tests share (examples/plproxy, examples/citus).

The application under test is a payments service with one entry point,
FUNCTION(tenant text, key text, request jsonb, amount numeric) RETURNS
(status, response_code, response_body), called as the application role.
This module sends such calls from many threads at once (every copy of a
key released by one barrier, so duplicates really overlap), records every
reply with its timing, and prints one line per check.
"""

import json
import threading
import time
from collections import defaultdict

try:
    import psycopg
except ImportError:
    raise SystemExit("loadtest: python3-psycopg (psycopg 3) is required")


class Reply:
    __slots__ = ("phase", "tenant", "key", "status", "code", "body",
                 "start", "end", "retries")

    def __init__(self, phase, tenant, key, status, code, body, start, end,
                 retries=0):
        self.phase = phase
        self.tenant = tenant
        self.key = key
        self.status = status
        self.code = code
        self.body = body
        self.start = start
        self.end = end
        self.retries = retries


def amount_of(tenant, key):
    """The amount a request for (tenant, key) carries: fixed per key."""
    return (sum(map(ord, tenant + key)) % 9000 + 100) / 100


def request_of(amount):
    return {"amount": amount, "currency": "EUR"}


def with_user(conninfo, user):
    return "%s user=%s" % (conninfo, user)


class Client:
    """One application connection.  With retry_sqlstates, a call that fails
    with one of them is sent again, as a client's retry loop would (up to
    max_retries times, after a short pause)."""

    def __init__(self, conninfo, function, retry_sqlstates=(),
                 max_retries=100):
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.function = function
        self.retry_sqlstates = tuple(retry_sqlstates)
        self.max_retries = max_retries

    def send(self, phase, tenant, key, amount):
        sql = ("SELECT status, response_code, response_body FROM "
               + self.function + "(%s, %s, %s::jsonb, %s::numeric)")
        start = time.monotonic()
        retries = 0
        while True:
            try:
                row = self.conn.execute(
                    sql, (tenant, key, json.dumps(request_of(amount)),
                          str(amount))).fetchone()
                status, code, body = row
            except psycopg.Error as e:
                if (e.sqlstate in self.retry_sqlstates
                        and retries < self.max_retries):
                    retries += 1
                    time.sleep(0.01)
                    continue
                status, code, body = "error %s: %s" % (e.sqlstate, e), None, None
            return Reply(phase, tenant, key, status, code, body, start,
                         time.monotonic(), retries)

    def close(self):
        self.conn.close()


def run_concurrent(conninfo, function, phase, keys, copies, threads,
                   retry_sqlstates=()):
    """Send each key "copies" times at once: rounds of threads // copies keys,
    every thread of a round released by the same barrier."""
    per_round = max(1, threads // copies)
    rounds = [keys[i:i + per_round] for i in range(0, len(keys), per_round)]
    barrier = threading.Barrier(threads)
    replies = []
    lock = threading.Lock()
    failures = []

    def worker(n):
        try:
            client = Client(conninfo, function, retry_sqlstates)
        except psycopg.Error as e:
            failures.append(str(e))
            barrier.abort()
            return
        mine = []
        try:
            for r in rounds:
                slot = n // copies
                item = r[slot] if slot < len(r) else None
                barrier.wait()
                if item is not None:
                    tenant, key = item
                    mine.append(client.send(phase, tenant, key,
                                            amount_of(tenant, key)))
        except threading.BrokenBarrierError:
            failures.append("barrier broken")
        finally:
            client.close()
        with lock:
            replies.extend(mine)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if failures:
        raise RuntimeError("load phase %s failed: %s" % (phase, failures[0]))
    return replies


def run_pool(conninfo, function, phase, items, threads, retry_sqlstates=()):
    """Send each (tenant, key, amount) once, from a pool of threads."""
    queue = list(items)
    lock = threading.Lock()
    replies = []

    def worker():
        client = Client(conninfo, function, retry_sqlstates)
        mine = []
        while True:
            with lock:
                if not queue:
                    break
                tenant, key, amount = queue.pop()
            mine.append(client.send(phase, tenant, key, amount))
        client.close()
        with lock:
            replies.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return replies


def overlaps(replies):
    """Keys whose concurrent copies really ran at the same time: some
    'replayed' reply was sent before the 'created' one had returned."""
    per_key = defaultdict(list)
    for r in replies:
        per_key[(r.tenant, r.key)].append(r)
    n = 0
    for rs in per_key.values():
        created = [r for r in rs if r.status == "created"]
        if created and any(r.status == "replayed" and r.start < created[0].end
                           for r in rs):
            n += 1
    return n


def status_summary(replies):
    """'phase status: count' for every (phase, status) of the replies."""
    count = defaultdict(int)
    for r in replies:
        count[(r.phase, r.status.split(":")[0])] += 1
    return ", ".join("%s %s: %d" % (p, s, n)
                     for (p, s), n in sorted(count.items()))


class Checker:
    """Prints one line per check and remembers the failed ones."""

    def __init__(self):
        self.failed = []

    def __call__(self, name, problems, show=10):
        if problems:
            self.failed.append(name)
            print("FAIL %s: %d problem(s)" % (name, len(problems)))
            for p in problems[:show]:
                print("     " + p)
        else:
            print("ok   %s" % name)

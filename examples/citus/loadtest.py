#!/usr/bin/env python3
"""examples/citus/loadtest.py -- exactly-once on a Citus cluster, through
concurrent duplicates, calls that are not delegated, and shard moves under
load; for examples/citus/test.sh.

    python3 loadtest.py --coordinator CONNINFO --worker CONNINFO \
        --worker CONNINFO [--app-user app] [--tenants 24] [--keys 10] \
        [--copies 4] [--threads 8] [--seed N]

Every CONNINFO is a superuser connection (the workers are read directly for
the checks); the load runs as --app-user through the coordinator, which
delegates each create_payment() / apply_event() call to the worker that
holds the tenant's shard.  Steps:

  1. concurrent: every (tenant, key) is sent --copies times at the same
     moment; then every key once more, alone; then every third key with a
     changed amount (422, nothing written).  Every event id of every tenant
     is applied twice at once.
  2. checks: one payment per key in the whole cluster, identical replies per
     key, each key on the ledger of the worker holding its tenant's shard
     and none on the coordinator's, each event applied once.
  3. calls that are not delegated (inside a transaction block on the
     coordinator, two calls in one statement) are refused with 0A000, and
     calls delegated by the wrong argument (the key) are either refused
     with 40001 or run on the tenant's node: nothing is written twice or
     anywhere else.
  4. shard moves under load: while clients send new keys (each twice at
     once), replays of old keys and events, and retry on 40001, --moves
     shards picked at random are moved with move_tenant_shard() (move.sql)
     to the other worker (a shard may come back to a worker that still has
     old copies of its keys).
     Afterwards every old key replays its first reply from its new node,
     every event id is still a duplicate, the checks of step 2 hold, and
     the outbox of each tenant's worker has every payment's event once.
  5. controls, which must find duplicates so that the checks can fail:
     create_payment_unsafe() (check-then-insert, no claim) under concurrent
     duplicates, and a shard of fresh tenants moved with a plain
     citus_move_shard_placement() (no ledger), after which their keys are
     paid again.
  6. the rest of a tenant moves too: on a fresh tenant's worker a relay
     delivers some of its payments' events and dead-letters one, and a key
     and a message id run and expire (remembered: idempotency.key_memory);
     after move_tenant_shard() the relay gets on the new worker exactly
     the events it had not acknowledged, its dead letter is there, and the
     expired key and id are answered "expired" and false there, paying
     and applying nothing.

Prints one line per check and exits 0 if every check passed.
"""

import argparse
import os
import random
import sys
import threading
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))
from payments_load import (Checker, Client, amount_of, overlaps,  # noqa: E402
                           psycopg, run_concurrent, run_pool, status_summary,
                           with_user)

RETRY = ("40001",)      # the tenant moved: the retry goes to its new node
# how long a shard move is retried while Citus has not yet dropped the old
# placement of an earlier move on its target (Cluster.moving)
ORPHAN_WAIT_SECONDS = 60

UNSAFE_FUNCTION = """
CREATE OR REPLACE FUNCTION create_payment_unsafe(
        tenant text, key text, request jsonb, amount numeric,
        OUT status text, OUT response_code int, OUT response_body jsonb)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    payment bigint;
BEGIN
    -- the usual hand-rolled check, then the work, then the write
    PERFORM public.tenant_shard_here('public.payments', tenant);
    IF EXISTS (SELECT 1 FROM public.payments p
                WHERE p.tenant = create_payment_unsafe.tenant
                  AND p.key = create_payment_unsafe.key) THEN
        status := 'replayed';
        response_code := 200;
        RETURN;
    END IF;
    PERFORM pg_sleep(0.02);     -- the handler's work between check and write
    INSERT INTO public.payments (tenant, key, amount)
    VALUES (create_payment_unsafe.tenant, create_payment_unsafe.key,
            create_payment_unsafe.amount)
    RETURNING id INTO payment;
    status := 'created';
    response_code := 201;
    response_body := jsonb_build_object('payment_id', payment);
END
$$;
SELECT create_distributed_function(
    'create_payment_unsafe(text,text,jsonb,numeric)',
    distribution_arg_name := 'tenant', colocate_with := 'payments');
GRANT EXECUTE ON FUNCTION
    create_payment_unsafe(text, text, jsonb, numeric) TO {role};

-- the handler, distributed by the wrong argument
CREATE OR REPLACE FUNCTION create_payment_by_key(
        tenant text, key text, request jsonb, amount numeric,
        OUT status text, OUT response_code int, OUT response_body jsonb)
RETURNS record
LANGUAGE sql VOLATILE
AS $$ SELECT * FROM public.create_payment(tenant, key, request, amount) $$;
SELECT create_distributed_function(
    'create_payment_by_key(text,text,jsonb,numeric)',
    distribution_arg_name := 'key', colocate_with := 'payments');
GRANT EXECUTE ON FUNCTION
    create_payment_by_key(text, text, jsonb, numeric) TO {role};
"""


class Cluster:
    """Superuser connections to the coordinator and the workers."""

    def __init__(self, coordinator, workers):
        self.coordinator = coordinator
        self.workers = workers
        self.co = psycopg.connect(coordinator, autocommit=True)
        self.node_of = {}       # (nodename, nodeport) -> worker index
        for i, w in enumerate(workers):
            with psycopg.connect(w, autocommit=True) as conn:
                name, port = conn.execute(
                    "SELECT nodename, nodeport FROM pg_dist_node"
                    " WHERE groupid = (SELECT groupid"
                    "                    FROM pg_dist_local_group)").fetchone()
            self.node_of[(name, port)] = i

    def q(self, sql, params=()):
        return self.co.execute(sql, params).fetchall()

    def home(self, tenants):
        """tenant -> (shard id, worker index) of its payments shard."""
        out = {}
        for t in tenants:
            shard, name, port = self.co.execute(
                "SELECT s.shardid, n.nodename, n.nodeport"
                "  FROM pg_dist_placement p"
                "  JOIN pg_dist_node n ON n.groupid = p.groupid"
                "  JOIN (SELECT get_shard_id_for_distribution_column("
                "                 'payments', %s::text) AS shardid) s"
                "    ON s.shardid = p.shardid", (t,)).fetchone()
            out[t] = (shard, self.node_of[(name, port)])
        return out

    def payments(self):
        """(tenant, key) -> [(payment id, amount)], in the whole cluster."""
        rows = defaultdict(list)
        for t, k, pid, amount in self.q(
                "SELECT tenant, key, id, amount FROM payments"):
            rows[(t, k)].append((pid, float(amount)))
        return rows

    def events(self):
        rows = defaultdict(int)
        for t, e, n in self.q("SELECT tenant, event_id, count(*)"
                              "  FROM events GROUP BY 1, 2"):
            rows[(t, e)] = n
        return rows

    def ledger_keys(self, conninfo, tenants):
        """(tenant count of completed keys, of in-progress keys) of the
        given tenants in one node's ledger."""
        with psycopg.connect(conninfo, autocommit=True) as conn:
            return conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'),"
                "       count(*) FILTER (WHERE status <> 'completed')"
                "  FROM idempotency.export_keys(%s)", (list(tenants),)
            ).fetchone()

    def moving(self, sql, args):
        """Runs a shard move, again while Citus refuses it for the old
        placement a previous move left on the target: Citus 12 and later
        drop a moved shard's source placement later, once nothing uses it
        (deferred cleanup), and a move back onto that node before then
        fails at its start ("orphaned shard ... could not be cleaned up"),
        having moved nothing.  Its maintenance daemon drops the placement
        within moments; an operator retries the same way."""
        deadline = time.monotonic() + ORPHAN_WAIT_SECONDS
        delay = 0.05
        while True:
            try:
                return self.co.execute(sql, args)
            except psycopg.errors.InternalError_ as e:
                if ("could not be cleaned up" not in str(e)
                        or time.monotonic() > deadline):
                    raise
                print(f"move of shard {args[0]} retried: {e.diag.message_primary}",
                      flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def move(self, shard, to):
        """move_tenant_shard(): (tenants, keys and message ids imported,
        {part of the export: rows written})."""
        name, port = [k for k, v in self.node_of.items() if v == to][0]
        return self.moving(
            "SELECT tenants, keys_imported, messages_imported, imported"
            "  FROM move_tenant_shard(%s, %s, %s)", (shard, name, port)
        ).fetchone()

    def move_plain(self, shard, frm, to):
        src = [k for k, v in self.node_of.items() if v == frm][0]
        dst = [k for k, v in self.node_of.items() if v == to][0]
        self.moving(
            "SELECT citus_move_shard_placement(%s, %s, %s, %s, %s,"
            "       shard_transfer_mode := 'block_writes')",
            (shard,) + src + dst)


def payment_problems(keys, rows):
    """Exactly one payment row per key, with the amount sent."""
    problems = []
    for k in sorted(keys):
        found = rows.get(k, [])
        if len(found) != 1:
            problems.append("%s/%s: %d payment rows" % (k[0], k[1],
                                                        len(found)))
        elif found[0][1] != amount_of(*k):
            problems.append("%s/%s: amount %s, sent %s"
                            % (k[0], k[1], found[0][1], amount_of(*k)))
    return problems


def reply_problems(keys, replies, rows):
    """Per key one 'created', every success reply identical and naming the
    key's payment; changed requests answered 422."""
    problems = []
    per_key = defaultdict(list)
    for r in replies:
        per_key[(r.tenant, r.key)].append(r)
    for k in sorted(keys):
        rs = [r for r in per_key[k] if r.phase != "mismatch"]
        created = [r for r in rs if r.status == "created"]
        if len(created) != 1:
            problems.append("%s/%s: %d 'created' replies" % (k[0], k[1],
                                                            len(created)))
        for r in rs:
            if r.status not in ("created", "replayed"):
                problems.append("%s/%s: %s reply %r" % (k[0], k[1], r.phase,
                                                        r.status))
        answers = {(r.code, str(sorted((r.body or {}).items())))
                   for r in rs if r.status in ("created", "replayed")}
        if len(answers) > 1:
            problems.append("%s/%s: %d different replies"
                            % (k[0], k[1], len(answers)))
        found = rows.get(k, [])
        if created and len(found) == 1 and \
                (created[0].body or {}).get("payment_id") != found[0][0]:
            problems.append("%s/%s: reply %s does not name payment %s"
                            % (k[0], k[1], created[0].body, found[0][0]))
        for r in per_key[k]:
            if r.phase == "mismatch" and (r.status, r.code) != ("mismatch",
                                                                 422):
                problems.append("%s/%s: changed request answered %r"
                                % (k[0], k[1], r.status))
    return problems


def ledger_problems(cluster, keys):
    """Each tenant's keys are completed in the ledger of the worker holding
    its shard; the coordinator's ledger has no key of any tenant."""
    problems = []
    per_tenant = defaultdict(int)
    for t, _ in keys:
        per_tenant[t] += 1
    home = cluster.home(per_tenant)
    for w in range(len(cluster.workers)):
        here = [t for t in per_tenant if home[t][1] == w]
        done, other = cluster.ledger_keys(cluster.workers[w], here)
        want = sum(per_tenant[t] for t in here)
        if (done, other) != (want, 0):
            problems.append("worker %d: %d completed and %d other keys of "
                            "its %d tenants, want %d completed"
                            % (w + 1, done, other, len(here), want))
    done, other = cluster.ledger_keys(cluster.coordinator, list(per_tenant))
    if done or other:
        problems.append("coordinator ledger holds %d keys" % (done + other))
    return problems


def send_events(conninfo, events, copies, threads):
    """Apply every (tenant, event id) "copies" times at once; returns
    {(tenant, event): [answers]}."""
    answers = defaultdict(list)
    lock = threading.Lock()
    queue = [e for e in events for _ in range(copies)]
    random.shuffle(queue)

    def worker():
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while True:
                with lock:
                    if not queue:
                        return
                    t, e = queue.pop()
                for _ in range(100):
                    try:
                        a = conn.execute("SELECT apply_event(%s, %s, 1)",
                                         (t, e)).fetchone()[0]
                        break
                    except psycopg.Error as err:
                        if err.sqlstate not in RETRY:
                            a = "error %s" % err.sqlstate
                            break
                        time.sleep(0.01)
                with lock:
                    answers[(t, e)].append(a)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return answers


def event_problems(events, answers, rows, first_time):
    problems = []
    for ev in sorted(events):
        if rows.get(ev, 0) != 1:
            problems.append("%s/%s: applied %d times" % (ev[0], ev[1],
                                                         rows.get(ev, 0)))
        a = answers.get(ev, [])
        want_true = 1 if first_time else 0
        if a.count(True) != want_true or any(x not in (True, False)
                                             for x in a):
            problems.append("%s/%s: answers %r" % (ev[0], ev[1], a))
    return problems


def not_delegated(cluster, app_co, tenant, check):
    """Step 3: calls that do not run on the tenant's worker."""
    before = cluster.payments()
    co_before = cluster.ledger_keys(cluster.coordinator, [tenant])
    refused = []
    with psycopg.connect(app_co) as conn:          # a transaction block
        try:
            conn.execute("SELECT * FROM create_payment(%s, 'in-a-block',"
                         " '{}', 1)", (tenant,))
            refused.append("in a transaction block: accepted")
        except psycopg.Error as e:
            if e.sqlstate != "0A000":
                refused.append("in a transaction block: %s" % e.sqlstate)
    with psycopg.connect(app_co, autocommit=True) as conn:
        try:
            conn.execute("SELECT create_payment(%s, 'two-a', '{}', 1),"
                         "       create_payment(%s, 'two-b', '{}', 1)",
                         (tenant, tenant))
            refused.append("two calls in one statement: accepted")
        except psycopg.Error as e:
            if e.sqlstate != "0A000":
                refused.append("two calls in one statement: %s" % e.sqlstate)
    after = cluster.payments()
    new = sorted(set(after) - set(before))
    if new:
        refused.append("payments written: %s" % new)
    if cluster.ledger_keys(cluster.coordinator, [tenant]) != co_before:
        refused.append("the coordinator's ledger changed")
    check("calls that are not delegated are refused with 0A000, writing "
          "nothing", refused)


def wrong_argument(cluster, app_co, tenants, check):
    """Step 3: the handler delegated by the key instead of the tenant."""
    keys = [(t, "by-key-%d" % i) for t in tenants for i in range(4)]
    replies = run_pool(app_co, "create_payment_by_key", "by-key",
                       [(t, k, amount_of(t, k)) for t, k in keys], 4)
    ok = {(r.tenant, r.key) for r in replies if r.status == "created"}
    refused = [r for r in replies if r.status.startswith("error 40001")]
    other = [r for r in replies if (r.tenant, r.key) not in ok
             and not r.status.startswith("error 40001")]
    rows = cluster.payments()
    problems = ["%s/%s: %s" % (r.tenant, r.key, r.status) for r in other]
    problems += ["%s/%s: refused but paid" % (r.tenant, r.key)
                 for r in refused if rows.get((r.tenant, r.key))]
    problems += payment_problems(ok, rows)
    print("delegated by the key: %d calls ran on the tenant's worker, %d "
          "were refused (40001)" % (len(ok), len(refused)))
    check("calls delegated by the wrong argument run where the tenant is or "
          "are refused", problems + ([] if refused else
                                     ["no call landed on another worker"]))
    return sorted(ok)


def moves_under_load(cluster, app_co, old_keys, tenants, events, args, rng):
    """Step 4: move shards while clients send new keys, old keys and
    events.  Returns the replies, the new keys and the moves made."""
    stop = threading.Event()
    lock = threading.Lock()
    replies = []
    new_keys = []
    counter = [0]

    def client_loop(n):
        r = random.Random(n)
        client = Client(app_co, "create_payment", RETRY)
        second = Client(app_co, "create_payment", RETRY)
        try:
            while not stop.is_set():
                with lock:
                    counter[0] += 1
                    i = counter[0]
                t = r.choice(tenants)
                if i % 3 == 0:
                    k = r.choice(old_keys)
                    got = [client.send("during-old", k[0], k[1],
                                       amount_of(*k))]
                else:
                    k = (t, "during-%05d" % i)
                    with lock:
                        new_keys.append(k)
                    # two copies of the new key: this one and a second
                    # connection's, at once
                    got = []
                    other = threading.Thread(target=lambda: got.append(
                        second.send("during-new", k[0], k[1],
                                    amount_of(*k))))
                    other.start()
                    got.append(client.send("during-new", k[0], k[1],
                                           amount_of(*k)))
                    other.join()
                with lock:
                    replies.extend(got)
        finally:
            client.close()
            second.close()

    ev_answers = {}

    def event_loop():
        ev_answers.update(send_events(app_co, events, 1, 2))

    threads = [threading.Thread(target=client_loop, args=(n,))
               for n in range(args.load_threads)]
    threads.append(threading.Thread(target=event_loop))
    for t in threads:
        t.start()
    moves = []
    at_start = set(cluster.home(tenants).values())
    try:
        # any shard that holds tenants, to the other worker; a shard may
        # come back to a worker that still has old copies of its keys.  The
        # last move takes a shard away from where it started, so that some
        # tenants end on another node whatever the seed chose before.
        for i in range(args.moves):
            where = sorted(set(cluster.home(tenants).values()))
            if i == args.moves - 1 and set(where) & at_start:
                where = sorted(set(where) & at_start)
            shard, frm = rng.choice(where)
            started = time.monotonic()
            n_tenants, n_keys, n_msgs, _ = cluster.move(shard, 1 - frm)
            moves.append((shard, frm, 1 - frm, n_tenants, n_keys, n_msgs,
                          time.monotonic() - started))
    finally:
        stop.set()
        for t in threads:
            t.join()
    return replies, new_keys, moves, ev_answers


def outbox_problems(cluster, keys):
    """Each payment published its event (schema.sql): the outbox of the
    worker holding the tenant has it, once (topic 'payments:<tenant>', the
    payment's key), whatever moves the tenant went through."""
    problems = []
    per_tenant = defaultdict(set)
    for t, k in keys:
        per_tenant[t].add(k)
    home = cluster.home(per_tenant)
    for w in range(len(cluster.workers)):
        here = [t for t in per_tenant if home[t][1] == w]
        with psycopg.connect(cluster.workers[w], autocommit=True) as conn:
            got = defaultdict(list)
            for topic, key in conn.execute(
                    "SELECT topic, key FROM idempotency.export_events(%s)",
                    (["payments:" + t for t in here],)):
                got[topic[len("payments:"):]].append(key)
        for t in here:
            want = per_tenant[t]
            seen = got.get(t, [])
            missing = want - set(seen)
            twice = len(seen) - len(set(seen))
            if missing or twice or set(seen) - want:
                problems.append("%s on worker %d: %d events missing, %d "
                                "twice, %d of keys not paid"
                                % (t, w + 1, len(missing), twice,
                                   len(set(seen) - want)))
    return problems


def carry_the_rest(cluster, app_co, app_user, check):
    """Step 6: a tenant's outbox (its relay, the events the relay has not
    acknowledged, its dead letters) and the keys and message ids it
    remembers after they expired move with it (move_tenant_shard())."""
    tenant = "carry-01"
    topic = "payments:" + tenant
    consumer = "events:" + tenant
    keys = [(tenant, "key-%d" % i) for i in range(1, 9)]
    replies = run_pool(app_co, "create_payment", "carry",
                       [(t, k, amount_of(t, k)) for t, k in keys], 1, RETRY)
    problems = ["%s: %s" % (r.key, r.status) for r in replies
                if r.status != "created"]
    shard, frm = cluster.home([tenant])[tenant]
    with psycopg.connect(cluster.workers[frm], autocommit=True) as w:
        w.execute("SET ROLE %s" % app_user)
        # the tenant's relay delivers three events, then gives up on the
        # fourth (a dead letter) and acknowledges it: four are left
        first = w.execute("SELECT batch, event_id FROM"
                          " idem_outbox_next('books', %s, 3)",
                          (topic,)).fetchall()
        w.execute("SELECT idem_outbox_ack('books', %s, %s)",
                  (topic, first[0][0]))
        batch, dead = w.execute("SELECT batch, event_id FROM"
                                " idem_outbox_next('books', %s, 1)",
                                (topic,)).fetchone()
        w.execute("SELECT idem_outbox_dead_letter('books', %s, %s,"
                  "                               'refused by the books')",
                  (topic, dead))
        w.execute("SELECT idem_outbox_ack('books', %s, %s)", (topic, batch))
        # a message id and a key that ran and expired, remembered
        w.execute("SELECT idem_consume_message(%s, 'late-event',"
                  "                            ttl => '1 second')",
                  (consumer,))
        with w.transaction():
            w.execute("SELECT idem_claim('late-key', scope => %s,"
                      "                  ttl => '1 second')", (tenant,))
            w.execute("SELECT idem_complete('late-key', 201, scope => %s)",
                      (tenant,))
        # until it has expired (its ttl is a second): remembered, answered
        # "expired"
        deadline = time.monotonic() + 60
        while w.execute("SELECT coalesce((SELECT status FROM"
                        "  idem_lookup('late-key', scope => %s)), 'none')",
                        (tenant,)).fetchone()[0] != "expired":
            if time.monotonic() > deadline:
                problems.append("the expired key is not remembered on its "
                                "worker")
                break
            time.sleep(0.05)
        w.execute("RESET ROLE")
        unacked = {r[0] for r in w.execute(
            "SELECT event_id FROM idempotency.export_events(%s)"
            " WHERE NOT 'books' = ANY (delivered_by)", ([topic],))}
    if len(unacked) != 4:
        problems.append("%d events not acknowledged before the move, want 4"
                        % len(unacked))

    imported = cluster.move(shard, 1 - frm)[3]
    print("moved shard %d of %s from worker %d to worker %d: %s"
          % (shard, tenant, frm + 1, 2 - frm, imported))
    with psycopg.connect(cluster.workers[1 - frm], autocommit=True) as w:
        w.execute("SET ROLE %s" % app_user)
        got = {r[0] for r in w.execute("SELECT event_id FROM"
                                       " idem_outbox_next('books', %s, 100)",
                                       (topic,))}
        if got != unacked:
            problems.append("the relay got %d events on the new worker, %d "
                            "of them not acknowledged on the old one; want "
                            "the %d it had not acknowledged"
                            % (len(got), len(got & unacked), len(unacked)))
        letters = [r[0] for r in w.execute(
            "SELECT event_id FROM idem_outbox_dead_letters('books', %s)",
            (topic,))]
        if letters != [dead]:
            problems.append("dead letters on the new worker: %s, want [%s]"
                            % (letters, dead))
    late = run_pool(app_co, "create_payment", "carry-late",
                    [(tenant, "late-key", 1)], 1, RETRY)
    if [r.status for r in late] != ["expired"]:
        problems.append("the expired key on the new worker: %s, want "
                        "'expired'" % [r.status for r in late])
    with psycopg.connect(app_co, autocommit=True) as conn:
        applied = conn.execute("SELECT apply_event(%s, 'late-event', 1)",
                               (tenant,)).fetchone()[0]
    if applied is not False:
        problems.append("the expired message id on the new worker was "
                        "applied")
    rows = cluster.payments()
    if rows.get((tenant, "late-key")):
        problems.append("the expired key was paid")
    if cluster.events().get((tenant, "late-event")):
        problems.append("the expired message id was applied")
    check("a tenant's undelivered events, relay, dead letters and "
          "remembered keys and ids move with it", problems)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", action="append", required=True)
    ap.add_argument("--app-user", default="app")
    ap.add_argument("--tenants", type=int, default=24)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--events", type=int, default=4)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--load-threads", type=int, default=4)
    ap.add_argument("--moves", type=int, default=8)
    ap.add_argument("--control-tenants", type=int, default=6)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    if len(args.worker) != 2:
        sys.exit("loadtest: give exactly two --worker")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    random.seed(seed)
    print("loadtest, seed %d" % seed)
    check = Checker()
    cluster = Cluster(args.coordinator, args.worker)
    app_co = with_user(args.coordinator, args.app_user)
    cluster.co.execute(UNSAFE_FUNCTION.format(role=args.app_user))

    tenants = ["tenant-%02d" % i for i in range(1, args.tenants + 1)]
    keys = [(t, "key-%03d" % j) for t in tenants
            for j in range(1, args.keys + 1)]
    rng.shuffle(keys)
    events = [(t, "event-%d" % j) for t in tenants
              for j in range(1, args.events + 1)]
    home = cluster.home(tenants)
    print("%d tenants x %d keys on %d shards; tenants per worker %s"
          % (len(tenants), args.keys, len({s for s, _ in home.values()}),
             [sum(1 for t in tenants if home[t][1] == w) for w in (0, 1)]))
    check("both workers hold tenants",
          [] if len({w for _, w in home.values()}) == 2 else
          ["all tenants are on one worker"])

    # ------------------------------------------------------------ 1. load
    t0 = time.monotonic()
    replies = run_concurrent(app_co, "create_payment", "concurrent", keys,
                             args.copies, args.threads)
    seq = list(keys)
    rng.shuffle(seq)
    replies += run_pool(app_co, "create_payment", "sequential",
                        [(t, k, amount_of(t, k)) for t, k in seq],
                        args.threads)
    replies += run_pool(app_co, "create_payment", "mismatch",
                        [(t, k, amount_of(t, k) + 1) for t, k in seq[::3]],
                        args.threads)
    ev_answers = send_events(app_co, events, 2, args.threads)
    print("%d calls and %d event deliveries through the coordinator in "
          "%.1f s" % (len(replies), 2 * len(events), time.monotonic() - t0))
    print("replies: " + status_summary(replies))

    # ------------------------------------------------------------ 2. checks
    rows = cluster.payments()
    check("one payment per key in the whole cluster",
          payment_problems(keys, rows))
    check("every reply for a key agrees and names its payment",
          reply_problems(keys, replies, rows))
    check("every key is on its tenant's worker, none on the coordinator",
          ledger_problems(cluster, keys))
    check("every event applied once, answered true once",
          event_problems(events, ev_answers, cluster.events(), True))
    n = overlaps(replies)
    print("keys whose duplicates overlapped the first request: %d of %d"
          % (n, len(keys)))
    check("duplicates really ran concurrently",
          [] if n > 0 else ["no duplicate was in flight with its original"])
    first = {(r.tenant, r.key): (r.code, r.body) for r in replies
             if r.status == "created"}

    # ------------------------------------------------------------ 3. routing
    not_delegated(cluster, app_co, tenants[0], check)
    by_key = wrong_argument(cluster, app_co, tenants[:6], check)

    # ------------------------------------------------------------ 4. moves
    during, new_keys, moves, ev_during = moves_under_load(
        cluster, app_co, keys, tenants, events, args, rng)
    for shard, frm, to, nt, nk, nm, took in moves:
        print("moved shard %d from worker %d to worker %d with %d tenants: "
              "%d keys and %d message ids imported, %.2f s"
              % (shard, frm + 1, to + 1, nt, nk, nm, took))
    retried = sum(r.retries for r in during)
    print("during the moves: %d calls (%s), %d retries after 40001"
          % (len(during), status_summary(during), retried))
    check("shards moved under load", [] if len(moves) == args.moves else
          ["%d of %d moves made" % (len(moves), args.moves)])
    moved_home = cluster.home(tenants)
    moved_tenants = [t for t in tenants if moved_home[t] != home[t]]
    problems = ["%s/%s: %r %s, first reply %s" % (r.tenant, r.key, r.status,
                                                  r.body, first.get(
                                                      (r.tenant, r.key)))
                for r in during if r.phase == "during-old"
                and (r.code, r.body) != first.get((r.tenant, r.key))]
    check("old keys sent during the moves replayed their first reply",
          problems)
    rows = cluster.payments()
    check("keys sent during the moves: one payment each, replies agree",
          payment_problems(new_keys, rows) +
          reply_problems(new_keys, [r for r in during
                                    if r.phase == "during-new"], rows))
    check("events sent during the moves were duplicates",
          [] if all(v == [False] for v in ev_during.values())
          and len(ev_during) == len(events) else
          ["answers: %s" % sorted(ev_during.items())[:5]])

    first.update({(r.tenant, r.key): (r.code, r.body) for r in during
                  if r.status == "created"})
    after = run_concurrent(app_co, "create_payment", "after-move",
                           keys + new_keys, 2, args.threads, RETRY)
    check("after the moves every key, old or sent during the moves, replays "
          "its first reply from its node (%d tenants moved)"
          % len(moved_tenants),
          ["%s/%s: %r" % (r.tenant, r.key, r.status) for r in after
           if (r.status, r.code, r.body) != ("replayed",) +
           first.get((r.tenant, r.key), (None, None))] +
          ([] if moved_tenants else ["no tenant moved"]))
    rows = cluster.payments()
    all_keys = keys + new_keys + by_key
    check("one payment per key in the whole cluster, after the moves",
          payment_problems(all_keys, rows) +
          ["%s/%s: payment for a key never paid" % k for k in rows
           if k not in set(all_keys) and k[0] in tenants])
    check("every key is on its tenant's worker after the moves",
          ledger_problems(cluster, all_keys))
    check("every payment's event is in the outbox of its tenant's worker, "
          "once, after the moves",
          outbox_problems(cluster, [k for k in rows if k[0] in tenants]))
    check("every event is still a duplicate after the moves",
          event_problems(events, send_events(app_co, events, 1, 4),
                         cluster.events(), False))

    # ------------------------------------------------------------ 5. controls
    ctl_tenants = ["control-%02d" % i
                   for i in range(1, args.control_tenants + 1)]
    ctl_keys = [(t, "key-%03d" % j) for t in ctl_tenants
                for j in range(1, args.keys // 2 + 1)]
    run_concurrent(app_co, "create_payment_unsafe", "control", ctl_keys,
                   args.copies, args.threads)
    rows = cluster.payments()
    dup = sum(1 for k in ctl_keys if len(rows.get(k, [])) > 1)
    print("control, no claim: %d of %d keys paid more than once"
          % (dup, len(ctl_keys)))
    check("the checks find duplicates without the claim",
          [] if payment_problems(ctl_keys, rows) and dup else
          ["check-then-insert made no duplicate"])

    # fresh tenants, whose keys no other worker ever had a copy of
    fresh = [("fresh-%02d" % i, "key-%d" % j) for i in range(1, 9)
             for j in range(1, 6)]
    run_pool(app_co, "create_payment", "fresh",
             [(t, k, amount_of(t, k)) for t, k in fresh], args.threads, RETRY)
    fresh_home = cluster.home({t for t, _ in fresh})
    shard, frm = fresh_home["fresh-01"]
    cluster.move_plain(shard, frm, 1 - frm)
    victims = [k for k in fresh if fresh_home[k[0]][0] == shard]
    again = run_pool(app_co, "create_payment", "control-move",
                     [(t, k, amount_of(t, k)) for t, k in victims],
                     args.threads, RETRY)
    paid_again = sum(1 for r in again if r.status == "created")
    print("control, shard %d moved without its ledger: %d of %d keys paid "
          "again" % (shard, paid_again, len(victims)))
    check("a move without the ledger pays the keys again",
          [] if paid_again == len(victims) else
          ["%d of %d keys paid again" % (paid_again, len(victims))])

    # ------------------------------------------------------------ 6. the rest
    carry_the_rest(cluster, app_co, args.app_user, check)

    if check.failed:
        print("loadtest: %d check(s) failed (seed %d)"
              % (len(check.failed), seed))
        return 1
    print("loadtest: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

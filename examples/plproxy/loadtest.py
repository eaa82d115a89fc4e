#!/usr/bin/env python3
"""examples/plproxy/loadtest.py -- concurrent load through the PL/Proxy node,
then checks on the partitions, for examples/plproxy/test.sh.

    python3 loadtest.py [--mode load|after-move|after-split] [--state FILE] \
        --proxy CONNINFO --part CONNINFO [--part ...] [--app-user app] \
        [--tenants 24] [--keys 12] [--copies 4] [--threads 8] [--seed N]

--proxy is the proxy database, each --part a partition database in
partition order (part0, part1, ...), all as a superuser; the load runs as
--app-user.

--mode load (default).  Phases, all through the proxy:
  1. concurrent: every (tenant, key) is sent --copies times at the same
     moment, by --copies threads released together by a barrier;
  2. sequential: every key once more, alone;
  3. mismatch: every third key again with a different amount;
  4. control: fresh tenants through create_payment_anywhere(), a copy of the
     proxy function that routes with RUN ON ANY instead of by tenant.
Then, reading every partition directly (not through the proxy):
  - each (tenant, key) of phases 1-3 has exactly one payment row in all the
    partitions together, on the partition hashtext(tenant) & (N - 1), and all
    rows of a tenant are on that one partition;
  - every reply for a key agrees: one 'created', the rest 'replayed' with the
    same code and body, which names that row; mismatches got 422 and wrote
    nothing; idem_lookup() on the partition shows the key completed with that
    body;
  - each partition holds as many idempotency keys as payments;
  - the concurrent copies of most keys really overlapped in time;
  - the same row checks, run on the control tenants, must find duplicates:
    that is what the routing prevents.
The keys and first replies are saved to --state, if given.

--mode after-move, after test.sh moved a partition to another server: every
saved key is sent again (two copies at once) and must replay its first reply;
a new key per tenant (--copies at once) must be paid once, on the tenant's
partition; keys = payments on every partition.

--mode after-split, after test.sh split every partition in two (4 -> 8,
moving each tenant's payments and live keys with idempotency.export_keys()
and import_key()): the same, except that a partition keeps the ledger rows
of the tenants that left it, so the count is per tenant: on its partition,
as many live keys as payments.

Prints a line per check and exits 0 if every check passed, 1 otherwise.
"""

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))
from payments_load import (Checker, amount_of, overlaps,  # noqa: E402
                           psycopg, run_concurrent, run_pool, status_summary,
                           with_user)


CONTROL_FUNCTION = """
CREATE OR REPLACE FUNCTION create_payment_anywhere(
        tenant text, key text, request jsonb, amount numeric,
        OUT status text, OUT response_code int, OUT response_body jsonb)
RETURNS record
LANGUAGE plproxy
AS $$
    CLUSTER 'payments';
    RUN ON ANY;
    TARGET create_payment;
$$;
GRANT EXECUTE ON FUNCTION
    create_payment_anywhere(text, text, jsonb, numeric) TO {role};
"""


def read_partitions(parts):
    """Every payment row, and the ledger's key count, of each partition."""
    rows = []
    ledger = []
    for n, conninfo in enumerate(parts):
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for tenant, key, pid, amount in conn.execute(
                    "SELECT tenant, key, id, amount FROM payments"):
                rows.append((n, tenant, key, pid, float(amount)))
            ledger.append(conn.execute(
                "SELECT CASE WHEN to_regclass('idempotency.keys') IS NULL"
                " THEN 0 ELSE (SELECT count(*) FROM idempotency.keys) END"
            ).fetchone()[0])
            dbname = conn.execute("SELECT current_database()").fetchone()[0]
            if dbname != "part%d" % n:
                raise RuntimeError("--part %d is database %s, not part%d"
                                   % (n, dbname, n))
    return rows, ledger


def home_partitions(conninfo, tenants, nparts):
    """hashtext(tenant) & (nparts - 1): where PL/Proxy must send a tenant."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        return {t: conn.execute("SELECT hashtext(%s) & %s",
                                (t, nparts - 1)).fetchone()[0]
                for t in tenants}


def row_problems(keys, rows, home):
    """Problems with the payment rows of the given keys (exactly one row per
    key, on the tenant's home partition; one partition per tenant)."""
    problems = []
    wanted = set(keys)
    tenants = {t for t, _ in keys}
    by_key = defaultdict(list)
    parts_of_tenant = defaultdict(set)
    for part, tenant, key, pid, amount in rows:
        if tenant not in tenants:
            continue
        by_key[(tenant, key)].append((part, pid, amount))
        parts_of_tenant[tenant].add(part)
    for k in sorted(wanted):
        found = by_key.get(k, [])
        if len(found) != 1:
            problems.append("%s/%s: %d payment rows (on partitions %s)"
                            % (k[0], k[1], len(found),
                               sorted(p for p, _, _ in found)))
        for part, pid, amount in found:
            if part != home[k[0]]:
                problems.append("%s/%s: payment %d on partition %d, "
                                "hashtext routes the tenant to %d"
                                % (k[0], k[1], pid, part, home[k[0]]))
            if amount != amount_of(*k):
                problems.append("%s/%s: amount %s, sent %s"
                                % (k[0], k[1], amount, amount_of(*k)))
    for k in sorted(set(by_key) - wanted):
        problems.append("%s/%s: payment for a key never sent" % k)
    for t in sorted(parts_of_tenant):
        if len(parts_of_tenant[t]) != 1:
            problems.append("tenant %s has payments on partitions %s"
                            % (t, sorted(parts_of_tenant[t])))
    return problems, by_key


def reply_problems(keys, replies, by_key):
    """Problems with the replies: per key one 'created', every success reply
    identical and naming the key's row."""
    problems = []
    per_key = defaultdict(list)
    for r in replies:
        per_key[(r.tenant, r.key)].append(r)
    for k in sorted(keys):
        rs = [r for r in per_key[k] if r.phase != "mismatch"]
        created = [r for r in rs if r.status == "created"]
        bad = [r for r in rs if r.status not in ("created", "replayed")]
        if len(created) != 1:
            problems.append("%s/%s: %d 'created' replies" % (k[0], k[1],
                                                            len(created)))
        for r in bad:
            problems.append("%s/%s: %s reply %r" % (k[0], k[1], r.phase,
                                                    r.status))
        answers = {(r.code, json.dumps(r.body, sort_keys=True))
                   for r in rs if r.status in ("created", "replayed")}
        if len(answers) > 1:
            problems.append("%s/%s: %d different replies"
                            % (k[0], k[1], len(answers)))
        rows = by_key.get(k, [])
        if len(rows) == 1 and created:
            body = created[0].body or {}
            part, pid, _ = rows[0]
            if (body.get("payment_id") != pid
                    or body.get("partition") != "part%d" % part
                    or created[0].code != 201):
                problems.append("%s/%s: reply %s does not name payment %d "
                                "on part%d" % (k[0], k[1], body, pid, part))
        for r in per_key[k]:
            if r.phase == "mismatch" and (r.status, r.code) != ("mismatch",
                                                                 422):
                problems.append("%s/%s: changed request answered %r %r"
                                % (k[0], k[1], r.status, r.code))
            if r.phase == "sequential" and r.status != "replayed":
                problems.append("%s/%s: sequential retry answered %r"
                                % (k[0], k[1], r.status))
    return problems


def lookup_problems(parts_app, keys, home, replies):
    """idem_lookup(), as the application role, on each key's partition."""
    problems = []
    body_of = {(r.tenant, r.key): r.body for r in replies
               if r.status == "created"}
    conns = [psycopg.connect(c, autocommit=True) for c in parts_app]
    try:
        for tenant, key in sorted(keys):
            row = conns[home[tenant]].execute(
                "SELECT status, response_code, response_body"
                "  FROM idem_lookup(%s, scope => %s)", (key, tenant)).fetchone()
            if row is None:
                problems.append("%s/%s: idem_lookup finds no key on part%d"
                                % (tenant, key, home[tenant]))
            elif (row[0], row[1], row[2]) != ("completed", 201,
                                              body_of.get((tenant, key))):
                problems.append("%s/%s: idem_lookup says %r"
                                % (tenant, key, row))
    finally:
        for c in conns:
            c.close()
    return problems


def ledger_problems(payments, ledger):
    return ["partition %d: %d keys, %d payments" % (p, ledger[p], payments[p])
            for p in range(len(ledger)) if ledger[p] != payments[p]]


def mode_load(args, check, rng):
    """Phases 1-4 and the checks; saves the keys and replies to --state."""
    nparts = len(args.part)
    app_proxy = with_user(args.proxy, args.app_user)
    tenants = ["tenant-%02d" % i for i in range(1, args.tenants + 1)]
    keys = [(t, "key-%03d" % j) for t in tenants
            for j in range(1, args.keys + 1)]
    rng.shuffle(keys)
    ctl_tenants = ["control-%02d" % i
                   for i in range(1, args.control_tenants + 1)]
    ctl_keys = [(t, "key-%03d" % j) for t in ctl_tenants
                for j in range(1, args.keys // 2 + 1)]
    rng.shuffle(ctl_keys)
    home = home_partitions(args.part[0], tenants + ctl_tenants, nparts)
    print("%d tenants x %d keys over %d partitions, tenants per partition %s"
          % (len(tenants), args.keys, nparts,
             [sum(1 for t in tenants if home[t] == p) for p in range(nparts)]))
    check("every partition owns some tenants",
          ["partition %d owns no tenant" % p for p in range(nparts)
           if not any(home[t] == p for t in tenants)])

    with psycopg.connect(args.proxy, autocommit=True) as conn:
        conn.execute(CONTROL_FUNCTION.format(role=args.app_user))

    t0 = time.monotonic()
    replies = run_concurrent(app_proxy, "create_payment", "concurrent", keys,
                             args.copies, args.threads)
    t1 = time.monotonic()
    seq = list(keys)
    rng.shuffle(seq)
    replies += run_pool(app_proxy, "create_payment", "sequential",
                        [(t, k, amount_of(t, k)) for t, k in seq],
                        args.threads)
    replies += run_pool(app_proxy, "create_payment", "mismatch",
                        [(t, k, amount_of(t, k) + 1) for t, k in seq[::3]],
                        args.threads)
    t2 = time.monotonic()
    ctl_replies = run_concurrent(app_proxy, "create_payment_anywhere",
                                 "concurrent", ctl_keys, args.copies,
                                 args.threads)
    print("%d calls through the proxy: concurrent phase %d calls in %.2f s, "
          "sequential + mismatch %d calls in %.2f s, control %d calls"
          % (len(replies) + len(ctl_replies), len(keys) * args.copies,
             t1 - t0, len(replies) - len(keys) * args.copies, t2 - t1,
             len(ctl_replies)))
    print("replies: " + status_summary(replies))

    rows, ledger = read_partitions(args.part)
    payments = [sum(1 for r in rows if r[0] == p) for p in range(nparts)]
    print("payments per partition %s, idempotency keys per partition %s"
          % (payments, ledger))

    problems, by_key = row_problems(keys, rows, home)
    check("one payment per key, on the tenant's hashtext partition", problems)
    check("every reply for a key agrees and names its payment",
          reply_problems(keys, replies, by_key))
    check("idem_lookup on the partition shows each key completed",
          lookup_problems([with_user(p, args.app_user) for p in args.part],
                          keys, home, replies))
    check("idempotency keys = payments on every partition",
          ledger_problems(payments, ledger))
    n = overlaps(replies)
    print("keys whose duplicates overlapped the first request in time: "
          "%d of %d" % (n, len(keys)))
    check("the concurrent phase really ran duplicates concurrently",
          [] if n > 0 else ["no duplicate was in flight with its original"])

    # Control: the same row checks must catch random routing.
    ctl_problems, ctl_by_key = row_problems(ctl_keys, rows, home)
    dup = sum(1 for v in ctl_by_key.values() if len(v) > 1)
    spread = len({t for t in ctl_tenants
                  if len({r[0] for r in rows if r[1] == t}) > 1})
    print("control (RUN ON ANY): %d of %d keys paid more than once, %d of %d "
          "tenants spread over several partitions"
          % (dup, len(ctl_keys), spread, len(ctl_tenants)))
    check("the checks detect duplicates when routing ignores the tenant",
          [] if dup > 0 and ctl_problems else
          ["random routing produced no duplicate payment"])

    if args.state:
        with open(args.state, "w") as f:
            json.dump({"keys": keys,
                       "created": [[r.tenant, r.key, r.body] for r in replies
                                   if r.status == "created"]}, f)


def tenant_ledger_problems(parts, tenants, home, rows):
    """On each tenant's partition, as many live keys of the tenant as
    payments (the partition may hold keys of tenants that left it)."""
    problems = []
    paid = defaultdict(int)
    for part, tenant, _, _, _ in rows:
        paid[(part, tenant)] += 1
    conns = [psycopg.connect(c, autocommit=True) for c in parts]
    try:
        for t in sorted(tenants):
            n = conns[home[t]].execute(
                "SELECT count(*) FROM idempotency.export_keys(%s)",
                ([t],)).fetchone()[0]
            if n != paid[(home[t], t)]:
                problems.append("tenant %s: %d keys, %d payments on part%d"
                                % (t, n, paid[(home[t], t)], home[t]))
    finally:
        for c in conns:
            c.close()
    return problems


def mode_after_move(args, check, rng):
    """After a partition moved to another server, or every partition was
    split (test.sh): every key saved by mode_load, sent again through the
    proxy, replays its first response; a new key per tenant is paid once,
    on its tenant's partition."""
    nparts = len(args.part)
    app_proxy = with_user(args.proxy, args.app_user)
    with open(args.state) as f:
        state = json.load(f)
    keys = [tuple(k) for k in state["keys"]]
    first = {(t, k): body for t, k, body in state["created"]}
    tenants = sorted({t for t, _ in keys})
    home = home_partitions(args.part[0], tenants, nparts)

    replies = run_concurrent(app_proxy, "create_payment", "concurrent", keys,
                             2, args.threads)
    problems = []
    for r in replies:
        if (r.status, r.body) != ("replayed", first.get((r.tenant, r.key))):
            problems.append("%s/%s: %r %s, first reply was %s"
                            % (r.tenant, r.key, r.status, r.body,
                               first.get((r.tenant, r.key))))
    print("%d retries of old keys through the proxy" % len(replies))
    check("every old key, moved partition included, replays its first reply",
          problems)

    new_keys = [(t, "key-" + args.mode) for t in tenants]
    new_replies = run_concurrent(app_proxy, "create_payment", "concurrent",
                                 new_keys, args.copies, args.threads)
    rows, ledger = read_partitions(args.part)
    payments = [sum(1 for r in rows if r[0] == p) for p in range(nparts)]
    print("payments per partition %s, idempotency keys per partition %s"
          % (payments, ledger))
    earlier = ([(t, "key-after-move") for t in tenants]
               if args.mode == "after-split" else [])
    problems, by_key = row_problems(keys + earlier + new_keys, rows, home)
    check("one payment per key, on the tenant's hashtext partition", problems)
    check("every reply for a new key agrees and names its payment",
          reply_problems(new_keys, new_replies, by_key))
    if args.mode == "after-split":
        check("on its partition, each tenant has as many keys as payments",
              tenant_ledger_problems(args.part, tenants, home, rows))
    else:
        check("idempotency keys = payments on every partition",
              ledger_problems(payments, ledger))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("load", "after-move", "after-split"),
                    default="load")
    ap.add_argument("--state", help="file for the keys and first replies")
    ap.add_argument("--proxy", required=True)
    ap.add_argument("--part", action="append", required=True)
    ap.add_argument("--app-user", default="app")
    ap.add_argument("--tenants", type=int, default=24)
    ap.add_argument("--keys", type=int, default=12)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--control-tenants", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()

    nparts = len(args.part)
    if nparts & (nparts - 1):
        sys.exit("loadtest: the partition count must be a power of two")
    if args.mode != "load" and not args.state:
        sys.exit("loadtest: --mode %s needs --state" % args.mode)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print("loadtest --mode %s, seed %d" % (args.mode, seed))
    check = Checker()
    if args.mode == "load":
        mode_load(args, check, random.Random(seed))
    else:
        mode_after_move(args, check, random.Random(seed))
    if check.failed:
        print("loadtest: %d check(s) failed (seed %d)"
              % (len(check.failed), seed))
        return 1
    print("loadtest: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Checks the relay's sink (relay.py) against the payments: every payment's
event (one per payment) reached the sink at least once, none is missing,
and each tenant's events reached it in their sequence order (the first
delivery of each, 1, 2, 3... with no gap).  Prints the figures; exit 1 on
a failure.
Usage: CO=conninfo relay_check.py SINK"""
import os, sys
import psycopg

conn = psycopg.connect(os.environ["CO"], autocommit=True)
payments = {}
for tenant, key in conn.execute("SELECT tenant, key FROM payments"):
    payments.setdefault(tenant, set()).add(key)
deliveries = 0
first = {}            # tenant -> [seq in order of first delivery]
seen = set()          # (tenant, seq)
keys = {}             # tenant -> set of keys delivered
ids = {}              # (tenant, seq) -> event_id
bad_ids = 0
for line in open(sys.argv[1]):
    tenant, seq, event_id, key = line.split()
    seq = int(seq)
    deliveries += 1
    if (tenant, seq) in ids and ids[(tenant, seq)] != event_id:
        bad_ids += 1
    ids[(tenant, seq)] = event_id
    if (tenant, seq) not in seen:
        seen.add((tenant, seq))
        first.setdefault(tenant, []).append(seq)
    keys.setdefault(tenant, set()).add(key)
npay = sum(len(v) for v in payments.values())
missing = sum(len(v - keys.get(t, set())) for t, v in payments.items())
unknown = sum(len(v - payments.get(t, set())) for t, v in keys.items())
out_of_order = [t for t, s in first.items() if s != list(range(1, len(s) + 1))]
print("relay sink: %d payments, %d events delivered (%d deliveries, %d again), %d tenants"
      % (npay, len(seen), deliveries, deliveries - len(seen), len(first)))
print("events missing: %d, events of no payment: %d, tenants out of sequence order: %d, one number with two event ids: %d"
      % (missing, unknown, len(out_of_order), bad_ids))
for t in out_of_order[:5]:
    print("tenant %s: first deliveries in order %s" % (t, first[t][:20]))
sys.exit(1 if missing or unknown or out_of_order or bad_ids or len(seen) != npay else 0)

#!/usr/bin/python3
"""Every key of every step sent once more: each must replay the payment it
made, and its event must be a duplicate (whatever shard operations
happened since)."""
import os
import sys
import psycopg
c = psycopg.connect(os.environ["CO"] + (" user=" + os.environ["APP_USER"] if os.environ.get("APP_USER") else ""), autocommit=True)
cur = c.cursor()
cur.execute("SELECT tenant, key, id FROM payments")
rows = cur.fetchall()
bad = 0
for t, k, pid in rows:
    cur.execute("SELECT status, response_body->>'payment_id' FROM create_payment(%s, %s, 5)", (t, k))
    st, got = cur.fetchone()
    if st != 'completed' or int(got) != pid:
        bad += 1
    cur.execute("SELECT apply_event(%s, %s)", (t, k))
    if cur.fetchone()[0]:
        bad += 1
print("keys replayed:", len(rows), "not replaying their own payment, or their event applied again:", bad)
sys.exit(1 if bad else 0)

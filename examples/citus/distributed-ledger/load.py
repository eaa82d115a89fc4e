#!/usr/bin/python3
"""Retried payments and redelivered events through the coordinator while a
Citus shard operation runs (issue 37).  Each send of a key calls
create_payment(tenant, key) (the key ledger) then apply_event(tenant, key)
(the message ledger), each retried on an error.
Usage: CO=conninfo load.py "SQL[;; SQL...]" TAG [MAXKEYS]; exit 1 on a key
paid twice, differing replies, an event applied twice, or a replay lost
after the operation (a key not replayed, an event applied again)."""
import os, random, sys, threading, time
import psycopg

CO = os.environ["CO"]
TENANTS = ["t%02d" % i for i in range(24)] + ["acme"]
op_sql = sys.argv[1]
MAXKEYS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
tag = sys.argv[2] if len(sys.argv) > 2 else "run"
replies = {}          # (tenant, key) -> set of payment ids
lock = threading.Lock()
stop = threading.Event()
stats = {"calls": 0, "created": 0, "replayed": 0, "retry40001": 0, "other_err": 0,
         "applied": 0, "duplicate_events": 0}
pool = []             # keys sent so far
errs = {}

def newkey(i):
    t = random.choice(TENANTS)
    return (t, "%s-%d" % (tag, i))

def client(seed):
    rnd = random.Random(seed)
    conn = psycopg.connect(CO, autocommit=True)
    cur = conn.cursor()
    n = 0
    while not stop.is_set():
        with lock:
            if not pool or (len(pool) < MAXKEYS and rnd.random() < 0.3):
                k = newkey(len(pool)); pool.append(k)
            else:
                k = rnd.choice(pool)
        st = pid = None
        for what in ("payment", "event"):
            while True:
                try:
                    if what == "payment":
                        cur.execute("SELECT status, response_body->>'payment_id' FROM create_payment(%s, %s, 5)", k)
                        st, pid = cur.fetchone()
                    else:
                        cur.execute("SELECT apply_event(%s, %s)", k)
                        fresh = cur.fetchone()[0]
                    break
                except psycopg.Error as e:
                    with lock:
                        if e.sqlstate == '40001':
                            stats["retry40001"] += 1
                        else:
                            stats["other_err"] += 1
                            m = (e.sqlstate, str(e).splitlines()[0][:120])
                            errs[m] = errs.get(m, 0) + 1
                    try:
                        conn.close()
                    except Exception:
                        pass
                    time.sleep(0.01)
                    conn = psycopg.connect(CO, autocommit=True); cur = conn.cursor()
        with lock:
            stats["calls"] += 1
            stats[st] = stats.get(st, 0) + 1
            stats["applied" if fresh else "duplicate_events"] += 1
            if st in ("created", "completed"):
                replies.setdefault(k, set()).add(pid)

threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
for t in threads: t.start()
time.sleep(2)
t0 = time.time()
opconn = psycopg.connect(CO, autocommit=True)
oc = opconn.cursor()
try:
    for stmt in op_sql.split(';;'):
        oc.execute(stmt)
        try:
            print(oc.fetchall(), flush=True)
        except psycopg.ProgrammingError:
            pass
finally:
    print("operation took %.2f s, %d calls so far" % (time.time() - t0, stats["calls"]), flush=True)
time.sleep(2)
stop.set()
for t in threads: t.join()
# every key once more, after the operation: must replay
conn = psycopg.connect(CO, autocommit=True); cur = conn.cursor()
lost = 0
applied_again = 0
for k in list(replies):
    cur.execute("SELECT status, response_body->>'payment_id' FROM create_payment(%s, %s, 5)", k)
    st, pid = cur.fetchone()
    if st != "completed":
        lost += 1
    replies[k].add(pid)
    cur.execute("SELECT apply_event(%s, %s)", k)
    if cur.fetchone()[0]:
        applied_again += 1
cur.execute("SELECT tenant, key, count(*) FROM payments WHERE key LIKE %s GROUP BY 1, 2 HAVING count(*) > 1", (tag + "-%",))
dup = cur.fetchall()
cur.execute("SELECT count(*) FROM payments WHERE key LIKE %s", (tag + "-%",))
npay = cur.fetchone()[0]
cur.execute("SELECT tenant, id, count(*) FROM applied WHERE id LIKE %s GROUP BY 1, 2 HAVING count(*) > 1", (tag + "-%",))
dup_events = cur.fetchall()
multi = [k for k, v in replies.items() if len(v) > 1]
print("stats", stats, "keys", len(replies), "payments", npay)
print("keys paid twice:", len(dup), "keys with differing replies:", len(multi), "replays lost after:", lost)
print("events applied twice:", len(dup_events), "events applied again after:", applied_again)
if errs: print("errors:", errs)
sys.exit(1 if dup or multi or lost or npay != len(replies) or dup_events or applied_again else 0)

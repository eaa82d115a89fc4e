#!/usr/bin/python3
"""Retried payments and redelivered events through the coordinator while a
Citus shard operation runs (issue 37).  Each send of a key calls
create_payment(tenant, key) (the key ledger) then apply_event(tenant, key)
(the message ledger), each retried on an error; then a batch of the
tenant's stream, consume_offsets(tenant, first, last) (the tenant's stream
position, and the batch's producer sequence): the next batch of 5
offsets, or one delivered before again (a redelivery), one batch of a
tenant in flight at a time, retried on an error.
Usage: CO=conninfo [APP_USER=role] load.py "SQL[;; SQL...]" TAG [MAXKEYS]; exit 1 on a key
paid twice, differing replies, an event applied twice, a stream offset
processed twice, a batch's sequence new twice or a gap, or a replay lost
after the operation (a key not replayed,
an event applied again, a tenant's stream position not where its consumer
left it, or a batch delivered before processed again)."""
import os, random, sys, threading, time
import psycopg

CO = os.environ["CO"]
# the clients connect as the application's role (APP_USER, an ordinary
# role, whose OID differs between the nodes); the operation as CO's user
APP = CO + (" user=" + os.environ["APP_USER"] if os.environ.get("APP_USER") else "")
TENANTS = ["t%02d" % i for i in range(24)] + ["acme"]
op_sql = sys.argv[1]
MAXKEYS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
tag = sys.argv[2] if len(sys.argv) > 2 else "run"
replies = {}          # (tenant, key) -> set of payment ids
lock = threading.Lock()
stop = threading.Event()
stats = {"calls": 0, "created": 0, "replayed": 0, "retry40001": 0, "other_err": 0,
         "applied": 0, "duplicate_events": 0, "batches": 0, "redeliveries": 0,
         "offsets_processed": 0, "redelivered_processed": 0}
pool = []             # keys sent so far
errs = {}
BATCH = 5
# each tenant's stream: the next offset its consumer sends (from where the
# position is now: the stream goes on from run to run), one batch in flight
conn0 = psycopg.connect(APP, autocommit=True)
nxt = {}
for t in TENANTS:
    nxt[t] = conn0.execute("SELECT stream_position(%s)", (t,)).fetchone()[0] or 0
conn0.close()
tenant_locks = {t: threading.Lock() for t in TENANTS}

def call(cur_conn, sql, args):
    """runs sql on a connection (holder: [conn, cur]), retried on an error"""
    while True:
        try:
            cur_conn[1].execute(sql, args)
            return cur_conn[1].fetchone()
        except psycopg.Error as e:
            with lock:
                if e.sqlstate == '40001':
                    stats["retry40001"] += 1
                else:
                    stats["other_err"] += 1
                    m = ("stream", e.sqlstate, str(e).splitlines()[0][:120])
                    errs[m] = errs.get(m, 0) + 1
            try:
                cur_conn[0].close()
            except Exception:
                pass
            time.sleep(0.01)
            cur_conn[0] = psycopg.connect(APP, autocommit=True)
            cur_conn[1] = cur_conn[0].cursor()

def stream_step(rnd, holder):
    t = rnd.choice(TENANTS)
    if not tenant_locks[t].acquire(blocking=False):
        return
    try:
        n = nxt[t]
        if n >= BATCH and rnd.random() < 0.3:
            first = rnd.randrange(0, n // BATCH) * BATCH     # a redelivery
            got = call(holder, "SELECT consume_offsets(%s, %s, %s)", (t, first, first + BATCH - 1))[0]
            with lock:
                stats["redeliveries"] += 1
                stats["redelivered_processed"] += got
        else:
            got = call(holder, "SELECT consume_offsets(%s, %s, %s)", (t, n, n + BATCH - 1))[0]
            nxt[t] = n + BATCH
            with lock:
                stats["batches"] += 1
                stats["offsets_processed"] += got
    finally:
        tenant_locks[t].release()

def newkey(i):
    t = random.choice(TENANTS)
    return (t, "%s-%d" % (tag, i))

def client(seed):
    rnd = random.Random(seed)
    conn = psycopg.connect(APP, autocommit=True)
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
                            m = (what, e.sqlstate, str(e).splitlines()[0][:120])
                            errs[m] = errs.get(m, 0) + 1
                    try:
                        conn.close()
                    except Exception:
                        pass
                    time.sleep(0.01)
                    conn = psycopg.connect(APP, autocommit=True); cur = conn.cursor()
        with lock:
            stats["calls"] += 1
            stats[st] = stats.get(st, 0) + 1
            stats["applied" if fresh else "duplicate_events"] += 1
            if st in ("created", "completed"):
                replies.setdefault(k, set()).add(pid)
        holder = [conn, cur]
        stream_step(rnd, holder)
        conn, cur = holder

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
conn = psycopg.connect(APP, autocommit=True); cur = conn.cursor()
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
# each tenant's stream after the operation: its position is where its
# consumer left it (the consumer re-running gets the next offset, not an
# old one), a batch delivered before is processed again by nobody, and no
# offset was processed twice
moved_wrong = 0
processed_again = 0
for t in TENANTS:
    if nxt[t] == 0:
        continue
    pos = cur.execute("SELECT stream_position(%s)", (t,)).fetchone()[0]
    if pos != nxt[t]:
        moved_wrong += 1
        print("tenant %s: stream position %s, its consumer sent up to %d" % (t, pos, nxt[t] - 1))
    got = cur.execute("SELECT consume_offsets(%s, 0, %s)", (t, BATCH - 1)).fetchone()[0]
    processed_again += got
cur.execute("SELECT tenant, off, count(*) FROM processed GROUP BY 1, 2 HAVING count(*) > 1")
dup_offsets = cur.fetchall()
# each batch's producer sequence: new once (a redelivery is a duplicate),
# never a gap (the tenant's sequence moved with it)
cur.execute("SELECT tenant, seq, count(*) FROM sequenced GROUP BY 1, 2 HAVING count(*) > 1")
dup_seqs = cur.fetchall()
cur.execute("SELECT count(*) FROM sequenced WHERE answer = 'gap'")
gaps = cur.fetchone()[0]
multi = [k for k, v in replies.items() if len(v) > 1]
print("stats", stats, "keys", len(replies), "payments", npay)
print("keys paid twice:", len(dup), "keys with differing replies:", len(multi), "replays lost after:", lost)
print("events applied twice:", len(dup_events), "events applied again after:", applied_again)
print("stream offsets processed twice:", len(dup_offsets), "tenants whose stream position is not where its consumer left it:",
      moved_wrong, "offsets of an old batch processed again after:", processed_again)
print("batch sequences new twice:", len(dup_seqs), "sequence gaps:", gaps)
if errs: print("errors:", errs)
sys.exit(1 if dup or multi or lost or npay != len(replies) or dup_events or applied_again
         or dup_offsets or moved_wrong or processed_again or stats["redelivered_processed"]
         or dup_seqs or gaps else 0)

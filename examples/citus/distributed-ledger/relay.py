#!/usr/bin/python3
"""The relay of the tenant outbox (issue 37), on the coordinator, while
Citus' shard operations run: takes batches of topic "payments" of every
tenant (idem_outbox_next(..., tenant => NULL)), writes each event to the
sink (a file: one line per delivery, "tenant seq event_id key"), then
acknowledges the batch; retried on an error (a batch delivered and not
acknowledged is delivered again: at least once).  Stops once STOP_FILE
exists and a batch came back empty.
Usage: CO=conninfo relay.py SINK STOP_FILE"""
import os, sys, time
import psycopg

CO = os.environ["CO"] + (" user=" + os.environ["APP_USER"] if os.environ.get("APP_USER") else "")
sink_path, stop_path = sys.argv[1], sys.argv[2]
errors = {}
batches = 0
with open(sink_path, "a") as sink:
    conn = None
    while True:
        try:
            if conn is None:
                conn = psycopg.connect(CO)
            cur = conn.cursor()
            cur.execute("SELECT batch, tenant, seq, event_id, key"
                        " FROM idem_outbox_next('sink', 'payments', 200, 1, NULL)")
            rows = cur.fetchall()
            for _, tenant, seq, event_id, key in rows:
                sink.write("%s %d %s %s\n" % (tenant, seq, event_id, key))
            sink.flush()
            if rows:
                cur.execute("SELECT idem_outbox_ack('sink', 'payments', %s, 1, NULL)", (rows[0][0],))
                batches += 1
            conn.commit()
            if not rows:
                if os.path.exists(stop_path):
                    break
                time.sleep(0.2)
        except psycopg.Error as e:
            m = (e.sqlstate, str(e).splitlines()[0][:100])
            errors[m] = errors.get(m, 0) + 1
            try:
                conn.close()
            except Exception:
                pass
            conn = None
            time.sleep(0.05)
print("relay: %d batches acknowledged; errors retried: %s" % (batches, errors or "none"), flush=True)

#!/usr/bin/python3
"""The relay of the tenant outbox (issue 37), on the coordinator, while
Citus' shard operations run: takes batches of topic "payments" of every
tenant (idem_outbox_next(..., tenant => NULL)), writes each event to the
sink (a file: one line per delivery, "tenant seq event_id key"), then
acknowledges the batch.  As the client libraries' relays do
(clients/python/src/pg_idempotency/outbox.py, OutboxRelay.run_once): the
batch is taken in a transaction of its own, delivered, then acknowledged
in another, so the acknowledgement comes after the delivery and a batch
taken stays taken (the same batch again until acknowledged) whatever
happens between; an error is retried (a batch delivered and not
acknowledged is delivered again: at least once); a loss (ID003: events
past idempotency.outbox_max_age before they were acknowledged) is
counted, reported at the end, and acknowledged with the batch number its
detail gives, so that the relay goes on (as OutboxRelay with
acknowledge_loss=True).  Stops once STOP_FILE exists and a batch came
back empty.
Usage: CO=conninfo relay.py SINK STOP_FILE"""
import os, re, sys, time
import psycopg

CO = os.environ["CO"] + (" user=" + os.environ["APP_USER"] if os.environ.get("APP_USER") else "")
sink_path, stop_path = sys.argv[1], sys.argv[2]
LOSS_BATCH = re.compile(r"the loss is batch ([0-9]+)")
errors = {}
losses = []
batches = 0
with open(sink_path, "a") as sink:
    conn = None
    while True:
        try:
            if conn is None:
                # each call a transaction of its own
                conn = psycopg.connect(CO, autocommit=True)
            try:
                rows = conn.execute("SELECT batch, tenant, seq, event_id, key"
                                    " FROM idem_outbox_next('sink', 'payments', 200, 1, NULL)").fetchall()
            except psycopg.Error as e:
                m = LOSS_BATCH.search(e.diag.message_detail or "") if e.sqlstate == "ID003" else None
                if m is None:
                    raise
                # a loss, reported as batch m: acknowledged, and on
                losses.append(e.diag.message_detail)
                conn.execute("SELECT idem_outbox_ack('sink', 'payments', %s, 1, NULL)", (int(m.group(1)),))
                continue
            for _, tenant, seq, event_id, key in rows:
                sink.write("%s %d %s %s\n" % (tenant, seq, event_id, key))
            sink.flush()
            if rows:
                conn.execute("SELECT idem_outbox_ack('sink', 'payments', %s, 1, NULL)", (rows[0][0],))
                batches += 1
            else:
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
print("relay: %d batches acknowledged; losses acknowledged: %s; errors retried: %s"
      % (batches, losses or "none", errors or "none"), flush=True)

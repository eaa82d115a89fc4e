"""
The shipping service of examples/outbox: a Flask app whose POST
/hooks/orders receives the orders service's events (Standard Webhooks),
verifies their signature and makes one shipment per order, exactly once:
the event id (webhook-id) is recorded with idem_consume_message in the
transaction of the INSERT, so a redelivered event is answered 200
"duplicate" and changes nothing.

    python3 shipping.py --port 8001

Connection: libpq's environment (PGDATABASE=shipping, ...).  The secret:
HOOK_SECRET.  FAIL_EVERY=N (a demonstration of the relay's retries): the
first delivery of every N-th event is answered 503.
"""

import argparse
import os
import sys
import threading

from flask import Flask
from psycopg_pool import ConnectionPool
from werkzeug.serving import make_server

from pg_idempotency.flask import webhook_receiver

app = Flask(__name__)
pool = ConnectionPool("", min_size=1, max_size=4, open=False)
FAIL_EVERY = int(os.environ.get("FAIL_EVERY", "0"))
_seen = {}
_lock = threading.Lock()


@app.before_request
def flaky():
    """FAIL_EVERY: a 503 for the first delivery of every N-th event."""
    from flask import request
    if not FAIL_EVERY:
        return None
    eid = request.headers.get("webhook-id", "")
    with _lock:
        n = _seen.setdefault(eid, [len(_seen) + 1, 0])
        n[1] += 1
        if n[0] % FAIL_EVERY == 0 and n[1] == 1:
            return "try again", 503
    return None


@app.after_request
def log_duplicates(resp):
    if resp.is_json and (resp.get_json(silent=True) or {}).get(
            "status") == "duplicate":
        print("duplicate %s" % resp.get_json()["id"], flush=True)
    return resp


@app.post("/hooks/orders")
@webhook_receiver(consumer="shipping", secret=os.environ["HOOK_SECRET"],
                  connect=pool.connection)
def on_order(conn, event):
    order = event.json()
    conn.execute("INSERT INTO shipments (order_id, event_id, customer, seq)"
                 " VALUES (%s, %s, %s, %s)",
                 (order["order"], event.id, order["customer"], order["seq"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args()
    pool.open()
    server = make_server("127.0.0.1", args.port, app, threaded=True)
    print("PORT %d" % server.server_port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

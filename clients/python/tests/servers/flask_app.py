"""Flask test server (werkzeug's threaded server)."""

from flask import Flask, request
from psycopg_pool import ConnectionPool
from werkzeug.serving import make_server

import common
from pg_idempotency.flask import connection, current_key, idempotent

pool = ConnectionPool(common.conninfo(), min_size=1, max_size=22)
app = Flask(__name__)
OPTS = common.options()


def charge():
    conn = connection()
    headers = {k.lower(): v for k, v in request.headers.items()}
    key = current_key()
    sql, params = common.before(headers, key, request.get_data(), "flask")
    charge_id = conn.execute(sql, params).fetchone()[0]
    status, hdrs, out = common.after(headers, charge_id, conn.execute)
    return out, status, hdrs


@app.post("/charges")
@idempotent(connect=pool.connection, **OPTS)
def charges():
    return charge()


@app.post("/async-charges")
@idempotent(connect=pool.connection, **OPTS)
async def async_charges():
    # an async view, run by Flask's ensure_sync under the decorator
    return charge()


@app.post("/blobs")
@idempotent(connect=pool.connection, **OPTS)
def blobs():
    status, hdrs, out = common.blob(request.get_data())
    return out, status, hdrs


@app.get("/idempotency")
def policy():
    from pg_idempotency.http import Policy, Options
    return Policy(Options(**OPTS)).policy_document()


def main():
    sock = common.listen()
    port = sock.getsockname()[1]
    server = make_server("127.0.0.1", port, app, threaded=True,
                         fd=sock.fileno())
    common.announce(port)
    server.serve_forever()


if __name__ == "__main__":
    main()

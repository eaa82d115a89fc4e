"""The conformance app on Flask: the view decorator, the caller from g.user
that a before_request hook (the app's authentication) sets."""

from flask import Flask, g, request
from psycopg_pool import ConnectionPool
from werkzeug.serving import make_server

import common
import conformance_common as cc
from pg_idempotency.flask import connection, idempotent, policy_view

pool = ConnectionPool(cc.conninfo(), min_size=1, max_size=24)
app = Flask(__name__)
OPTIONS = {"caller": lambda request: g.get("user")}


@app.before_request
def authenticate():
    g.user = cc.bearer(request.headers.get("Authorization"))


def handle(route, params):
    body = request.get_data()
    what, arg = cc.plan(route, body)
    if what == "answer":
        return arg
    charge_id = connection().execute(
        cc.INSERT, (g.user, route, arg[0], arg[1])).fetchone()[0]
    headers_in = {k.lower(): v for k, v in request.headers.items()}
    return cc.answer(route, charge_id, g.user, body, params, headers_in)


def reply(out):
    status, headers, body = out
    return body, status, headers


@app.post("/charges")
@idempotent(connect=pool.connection, **OPTIONS)
def charges():
    return reply(handle("/charges", {}))


@app.post("/orders/<id>/refund")
@idempotent(connect=pool.connection, **OPTIONS)
def refund(id):
    return reply(handle("refund", {"id": id}))


@app.post("/text")
@idempotent(connect=pool.connection, **OPTIONS)
def text():
    return reply(handle("/text", {}))


@app.post("/big")
@idempotent(connect=pool.connection, **OPTIONS)
def big():
    return reply(handle("/big", {}))


app.add_url_rule("/idempotency", view_func=policy_view(**OPTIONS))


def main():
    sock = common.listen()
    port = sock.getsockname()[1]
    server = make_server("127.0.0.1", port, app, threaded=True,
                         fd=sock.fileno())
    common.announce(port)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""
Set-ups in which the adapters cannot keep their contract, as apps write
them by mistake: each is refused loudly (at start-up where it can be seen
then, else a 500 and nothing done), never answered with another caller's
response or a success that did not happen.
"""

import base64
import json
import re
import subprocess
import threading

import pytest

from conftest import PYTHON, charges_for, new_key, request


def as_user(name):
    return ("Authorization",
            "Basic " + base64.b64encode(("%s:pw" % name).encode()).decode())


def post(port, key, *extra):
    return request(port, "/charges", b'{"amount": 1}',
                   [("Idempotency-Key", '"%s"' % key)] + list(extra))


@pytest.fixture
def misconfig(servers):
    def start(mode):
        return servers("misconfig_asgi", IDEM_MISCONFIG=mode)
    return start


def test_auth_middleware_after_idempotency_never_leaks(misconfig):
    """AuthenticationMiddleware added before IdempotencyMiddleware (the
    natural order, and the wrong one): Bob's request with Alice's key is
    never answered with Alice's response; nothing is written."""
    s = misconfig("auth-order")
    key = new_key()
    alice = post(s.port, key, as_user("alice"))
    bob = post(s.port, key, as_user("bob"))
    assert not bob.replayed, bob
    assert b"alice" not in bob.body, bob
    assert alice.status == 500 and bob.status == 500, (alice, bob)
    assert charges_for(key) == 0


def test_auth_middleware_order_is_refused_at_start_up():
    from fastapi import FastAPI
    from starlette.authentication import AuthenticationBackend
    from starlette.middleware.authentication import AuthenticationMiddleware
    from pg_idempotency import ConfigurationError
    from pg_idempotency.asgi import IdempotencyMiddleware

    class Nobody(AuthenticationBackend):
        async def authenticate(self, conn):
            return None
    app = FastAPI()
    app.add_middleware(AuthenticationMiddleware, backend=Nobody())
    app.add_middleware(IdempotencyMiddleware, conninfo="", anonymous=True)
    with pytest.raises(ConfigurationError, match="AuthenticationMiddleware"):
        app.build_middleware_stack()
    # the other order is the right one
    ok = FastAPI()
    ok.add_middleware(IdempotencyMiddleware, conninfo="")
    ok.add_middleware(AuthenticationMiddleware, backend=Nobody())
    ok.build_middleware_stack()


def test_sync_handler_never_stores_a_success_that_did_not_happen(misconfig):
    s = misconfig("sync-handler")
    key = new_key()
    first = post(s.port, key, as_user("alice"))
    again = post(s.port, key, as_user("alice"))
    assert first.status == 500 and again.status == 500, (first, again)
    assert not again.replayed
    assert charges_for(key) == 0


def test_sync_handler_is_refused_at_registration():
    from fastapi import FastAPI
    from pg_idempotency import ConfigurationError
    from pg_idempotency.asgi import IdempotencyMiddleware
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, conninfo="")

    @app.post("/orders")
    def create():
        return {}

    @app.get("/orders")
    def list_orders():                  # GET takes no key: fine
        return []
    with pytest.raises(ConfigurationError, match=r"POST /orders \(.*create\)"):
        app.build_middleware_stack()
    # a route the middleware does not apply to is fine
    app2 = FastAPI()
    app2.add_middleware(IdempotencyMiddleware, conninfo="",
                        applies=lambda method, path: path != "/health")

    @app2.post("/health")
    def health():
        return {}
    app2.build_middleware_stack()


def test_sync_handler_under_an_included_router_or_a_mount_is_refused():
    """The routes of an included router (FastAPI 0.92 copies them into
    the app's list, 0.162 keeps the router as one entry of it) and of a
    mounted app are checked like the app's own."""
    from fastapi import APIRouter, FastAPI
    from starlette.applications import Starlette
    from starlette.routing import Route
    from pg_idempotency import ConfigurationError
    from pg_idempotency.asgi import IdempotencyMiddleware

    inner = APIRouter(prefix="/shop")

    @inner.post("/orders")
    def create():
        return {}
    outer = APIRouter(prefix="/v1")
    outer.include_router(inner)

    def pay(request):
        pass
    app = FastAPI()
    app.include_router(outer)
    app.mount("/legacy", Starlette(routes=[Route("/pay", pay,
                                                   methods=["POST"])]))
    app.add_middleware(IdempotencyMiddleware, conninfo="")
    with pytest.raises(ConfigurationError) as e:
        app.build_middleware_stack()
    assert re.search(r"POST /v1/shop/orders \(.*create\)", str(e.value)), e
    assert re.search(r"POST /legacy/pay \(.*pay\)", str(e.value)), e


def _refund_app():
    """POST /v1/orders/{order_id}/refund (an included router) and
    /legacy/orders/{id}/refund (a mounted Starlette app), each inserting a
    charge on connection(request)."""
    from fastapi import APIRouter, FastAPI, Request
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from conftest import APP_USER
    from pg_idempotency.asgi import IdempotencyMiddleware, connection

    async def charge(request):
        key = request.headers["idempotency-key"].strip('"')
        await connection(request).execute(
            "INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
        return JSONResponse({"refund": request.url.path}, status_code=201)
    router = APIRouter(prefix="/v1")

    @router.post("/orders/{order_id}/refund", status_code=201)
    async def refund(order_id: int, request: Request):
        return await charge(request)
    app = FastAPI()
    app.include_router(router)
    app.mount("/legacy", Starlette(routes=[
        Route("/orders/{id}/refund", charge, methods=["POST"])]))
    app.add_middleware(IdempotencyMiddleware, conninfo="user=%s" % APP_USER,
                       anonymous=True)
    return app


def _asgi_post(app, path, key):
    """One POST of {} with KEY through APP in this process: the status."""
    import asyncio
    sent = []
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)
    asyncio.run(app({
        "type": "http", "method": "POST", "path": path,
        "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"idempotency-key", ('"%s"' % key).encode()),
                    (b"content-type", b"application/json")],
        "scheme": "http", "server": ("t", 80), "client": ("c", 1),
        "http_version": "1.1", "asgi": {"version": "3.0"}}, receive, send))
    return sent[0]["status"]


@pytest.mark.parametrize("first,second,template", [
    ("/v1/orders/1/refund", "/v1/orders/2/refund",
     "/v1/orders/{order_id}/refund"),
    ("/legacy/orders/1/refund", "/legacy/orders/2/refund",
     "/legacy/orders/{id}/refund"),
])
def test_the_route_is_the_template_under_included_routers_and_mounts(
        first, second, template):
    """The scope's route is the template (http-behaviour.md) under an
    included router and a mount too: one key on two orders' refunds is 422,
    one refund."""
    from pg_idempotency.asgi import route_of
    app = _refund_app()
    scope = {"type": "http", "method": "POST", "path": first,
             "root_path": "", "query_string": b"", "headers": [], "app": app}
    assert route_of(scope) == template
    key = new_key()
    assert _asgi_post(app, first, key) == 201
    assert _asgi_post(app, second, key) == 422
    assert charges_for(key) == 1


def _auth_inside_app(where, methods=("POST",)):
    """An app whose AuthenticationMiddleware runs inside
    IdempotencyMiddleware: on a mount (of routes, or of an ASGI app whose
    routes are not known), a route or a router (the last two: None where
    Starlette has no middleware there, as 0.26)."""
    import inspect as insp
    from starlette.applications import Starlette
    from starlette.authentication import AuthenticationBackend
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.responses import JSONResponse
    from starlette.routing import Mount, Route, Router

    class Nobody(AuthenticationBackend):
        async def authenticate(self, conn):
            return None

    async def charge(request):
        return JSONResponse({})
    auth = [Middleware(AuthenticationMiddleware, backend=Nobody())]
    routes = [Route("/charges", charge, methods=list(methods))]
    if where == "mount":
        return Starlette(routes=[Mount("/v1", routes=routes, middleware=auth)])
    if where == "mounted-app":
        async def asgi(scope, receive, send):
            await JSONResponse({})(scope, receive, send)
        return Starlette(routes=[Mount("/v1", app=asgi, middleware=auth)])
    if where == "route":
        if "middleware" not in insp.signature(Route).parameters:
            return None
        return Starlette(routes=[Route("/charges", charge,
                                       methods=list(methods),
                                       middleware=auth)])
    if "middleware" not in insp.signature(Router).parameters:
        return None
    return Starlette(routes=[Mount("/v1", app=Router(routes,
                                                     middleware=auth))])


@pytest.mark.parametrize("where", ["mount", "mounted-app", "route",
                                   "router"])
def test_auth_middleware_on_a_mount_route_or_router_is_refused(where):
    """Inside IdempotencyMiddleware, AuthenticationMiddleware leaves every
    request it applies to without its caller: refused at start-up, even
    with anonymous (which would share one scope among all callers); where
    the middleware applies to none of its routes, it is fine."""
    from starlette import __version__ as starlette_version
    from pg_idempotency import ConfigurationError
    from pg_idempotency.asgi import IdempotencyMiddleware
    app = _auth_inside_app(where)
    if app is None:
        pytest.skip("Starlette %s has no middleware on a %s"
                    % (starlette_version, where))
    app.add_middleware(IdempotencyMiddleware, conninfo="", anonymous=True)
    with pytest.raises(ConfigurationError, match="AuthenticationMiddleware"):
        app.build_middleware_stack()
    fine = _auth_inside_app(where, methods=("GET",))
    fine.add_middleware(IdempotencyMiddleware, conninfo="", anonymous=True,
                        applies=lambda method, path: where != "mounted-app")
    fine.build_middleware_stack()


def test_an_app_whose_routes_cannot_be_seen_is_logged(caplog):
    """Below a middleware that keeps the app where the start-up checks do
    not look, they cannot run: it says so on the pg_idempotency logger
    (the handlers' calls outside the event loop are still refused)."""
    import logging
    from starlette.routing import Router
    from pg_idempotency.asgi import IdempotencyMiddleware

    class Opaque:
        def __init__(self, app):
            self._inner = app

        async def __call__(self, scope, receive, send):
            await self._inner(scope, receive, send)

    async def plain(scope, receive, send):
        pass
    with caplog.at_level(logging.WARNING, logger="pg_idempotency"):
        IdempotencyMiddleware(plain, conninfo="")     # no routes: fine
        IdempotencyMiddleware(Router(), conninfo="")
        assert caplog.text == ""
        IdempotencyMiddleware(Opaque(Router()), conninfo="")
    assert "cannot see the routes of the app through 'test_an_app" in \
        caplog.text, caplog.text


def test_connection_outside_the_event_loop_is_refused():
    from pg_idempotency import ConfigurationError
    from pg_idempotency.asgi import connection
    errors = []

    def worker():
        try:
            connection({"type": "http"})
        except ConfigurationError as e:
            errors.append(e)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert errors and "async def" in str(errors[0])


def test_a_database_call_not_awaited_is_500_and_nothing_kept(misconfig):
    s = misconfig("no-await")
    key = new_key()
    first = post(s.port, key, as_user("alice"))
    assert first.status == 500, first
    doc = first.json()
    assert doc["type"] == "tag:pg-idempotency,2026:misconfigured"
    again = post(s.port, key, as_user("alice"))
    assert again.status == 500 and not again.replayed
    assert charges_for(key) == 0


DJANGO = r'''
import django, sys
from django.conf import settings
settings.configure(
    SECRET_KEY="x", INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes"],
    MIDDLEWARE=sys.argv[1].split(","),
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}})
django.setup()
from pg_idempotency import ConfigurationError
from pg_idempotency.django import IdempotencyMiddleware
try:
    IdempotencyMiddleware(lambda request: None)
    print("accepted")
except ConfigurationError as e:
    print("refused:", e)
'''


@pytest.mark.parametrize("order,answer", [
    ("pg_idempotency.django.IdempotencyMiddleware,"
     "django.contrib.sessions.middleware.SessionMiddleware,"
     "django.contrib.auth.middleware.AuthenticationMiddleware", "refused"),
    ("django.contrib.sessions.middleware.SessionMiddleware,"
     "django.contrib.auth.middleware.AuthenticationMiddleware,"
     "pg_idempotency.django.IdempotencyMiddleware", "accepted"),
])
def test_django_middleware_order(order, answer):
    import os
    from conftest import CLIENT_DIR
    env = dict(os.environ, PYTHONPATH=os.path.join(CLIENT_DIR, "src"))
    r = subprocess.run([PYTHON, "-c", DJANGO, order], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(answer), r.stdout
    if answer == "refused":
        assert "AuthenticationMiddleware comes after" in r.stdout


def test_idempotent_values_beyond_json(conn):
    """The non-HTTP decorator: a value that is not JSON is a TypeError
    naming the hook, and nothing is kept; serialize/deserialize store it;
    key= selects the key from the arguments."""
    import datetime
    import pg_idempotency as idem
    key = new_key()

    @idem.idempotent(key=lambda order: order["id"],
                     request=lambda order: {"amount": order["amount"]})
    def bad(c, order):
        c.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)",
                  (order["id"],))
        return datetime.datetime(2026, 1, 2, 3, 4, 5)
    with pytest.raises(TypeError, match="serialize"):
        bad(conn, {"id": key, "amount": 5})
    assert charges_for(key) == 0
    calls = []

    @idem.idempotent(key=lambda order: order["id"],
                     request=lambda order: {"amount": order["amount"]},
                     serialize=lambda v: v.isoformat(),
                     deserialize=datetime.datetime.fromisoformat)
    def good(c, order):
        calls.append(1)
        c.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)",
                  (order["id"],))
        return datetime.datetime(2026, 1, 2, 3, 4, 5)
    first = good(conn, {"id": key, "amount": 5, "sent_at": 1})
    again = good(conn, {"id": key, "amount": 5, "sent_at": 2})
    assert first == again == datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert len(calls) == 1 and charges_for(key) == 1
    with pytest.raises(idem.KeyMismatch):
        good(conn, {"id": key, "amount": 6})
    assert json.dumps(first.isoformat())


def test_the_handlers_connection_is_the_connection():
    """What connection(request) hands a handler tracks its calls, and is
    otherwise the connection: isinstance, cursors as context managers,
    savepoints, attributes; every awaited call counts as awaited."""
    import asyncio
    import psycopg
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from conftest import APP_USER
    from pg_idempotency.asgi import IdempotencyMiddleware, connection

    key = new_key()
    seen = {}

    async def endpoint(request):
        conn = connection(request)
        seen["isinstance"] = isinstance(conn, psycopg.AsyncConnection)
        seen["autocommit"] = conn.autocommit
        async with conn.cursor() as cur:
            await cur.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
        async with conn.transaction():
            await conn.execute("INSERT INTO charges (key, amount) VALUES (%s, 2)", (key,))
        cur = await conn.execute("SELECT count(*) FROM charges WHERE key = %s", (key,))
        seen["count"] = (await cur.fetchone())[0]
        return JSONResponse({"ok": True}, status_code=201)

    app = Starlette(routes=[Route("/c", endpoint, methods=["POST"])])
    app.add_middleware(IdempotencyMiddleware, conninfo="user=%s" % APP_USER,
                       anonymous=True)

    async def call():
        sent = []
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(msg):
            sent.append(msg)
        await app({"type": "http", "method": "POST", "path": "/c",
                   "raw_path": b"/c", "query_string": b"", "root_path": "",
                   "headers": [(b"idempotency-key", ('"%s"' % key).encode()),
                               (b"content-type", b"application/json")],
                   "scheme": "http", "server": ("t", 80), "client": ("c", 1),
                   "http_version": "1.1", "asgi": {"version": "3.0"}},
                  receive, send)
        return sent
    sent = asyncio.run(call())
    assert sent[0]["status"] == 201, sent
    assert seen == {"isinstance": True, "autocommit": False, "count": 2}
    assert charges_for(key) == 2

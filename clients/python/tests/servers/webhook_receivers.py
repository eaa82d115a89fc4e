"""
The webhook receivers of the outbox tests, one framework per process
(WEBHOOK_FRAMEWORK: asgi (Starlette), fastapi, django or flask): POST /hooks verifies a
Standard Webhooks delivery signed with WEBHOOK_SECRET and, once per
webhook-id, inserts a row into received (consumer = the framework,
event_id, n = the body's "n"); a body with "explode" makes the handler
raise after its INSERT.  POST /hooks/t/<tenant> does the same for the
consumer "<framework>-tenant", with the receiver's tenant taken from the
path by a function of (event, request) (test_tenant.py).  GET
/idempotency answers 200 (the suite's readiness probe).  Prints "PORT
<n>" once it listens.
"""

import contextlib
import json
import os

import common

FRAMEWORK = os.environ["WEBHOOK_FRAMEWORK"]
SECRET = os.environ["WEBHOOK_SECRET"]
INSERT = "INSERT INTO received (consumer, event_id, n) VALUES (%s, %s, %s)"


def check(body):
    if body.get("explode"):
        raise RuntimeError("the handler failed")


def asgi(fastapi=False):
    import uvicorn
    from psycopg_pool import AsyncConnectionPool
    from starlette.responses import PlainTextResponse

    from pg_idempotency.asgi import WebhookEndpoint

    name = "fastapi" if fastapi else "asgi"
    pool = AsyncConnectionPool(common.conninfo(), min_size=1, max_size=8,
                               open=False)

    async def on_event(conn, event):
        body = event.json()
        await conn.execute(INSERT, (name, event.id, body.get("n")))
        check(body)

    async def on_tenant_event(conn, event):
        await conn.execute(INSERT, (name + "-tenant", event.id,
                                    event.json().get("n")))

    async def ready(request):
        return PlainTextResponse("ok")

    # a lifespan, which every Starlette takes (1.0 dropped on_startup)
    @contextlib.asynccontextmanager
    async def lifespan(app):
        await pool.open()
        yield

    endpoint = WebhookEndpoint(on_event, consumer=name, secret=SECRET,
                               pool=pool)
    # the tenant from the route's path parameter, in the ASGI scope
    tenant_endpoint = WebhookEndpoint(
        on_tenant_event, consumer=name + "-tenant", secret=SECRET, pool=pool,
        tenant=lambda event, scope: scope["path_params"]["tenant"])
    if fastapi:
        from fastapi import FastAPI
        # set on the router, not FastAPI(lifespan=): FastAPI before 0.93
        # (Debian 12's 0.92) takes no lifespan argument and drops it
        # unread, so the pool was never opened (every delivery 503)
        app = FastAPI()
        app.router.lifespan_context = lifespan
        app.add_route("/hooks", endpoint, methods=["POST"])
        app.add_route("/hooks/t/{tenant}", tenant_endpoint, methods=["POST"])
        app.add_route("/idempotency", ready)
    else:
        from starlette.applications import Starlette
        from starlette.routing import Route
        app = Starlette(routes=[
            Route("/hooks", endpoint, methods=["POST"]),
            Route("/hooks/t/{tenant}", tenant_endpoint, methods=["POST"]),
            Route("/idempotency", ready)], lifespan=lifespan)
    sock = common.listen()
    common.announce(sock.getsockname()[1])
    uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                  access_log=False)).run(sockets=[sock])


def flask():
    from flask import Flask
    from psycopg_pool import ConnectionPool
    from werkzeug.serving import make_server

    from pg_idempotency.flask import webhook_receiver

    pool = ConnectionPool(common.conninfo(), min_size=1, max_size=8)
    app = Flask(__name__)

    @app.post("/hooks")
    @webhook_receiver(consumer="flask", secret=SECRET,
                      connect=pool.connection)
    def hooks(conn, event):
        body = event.json()
        conn.execute(INSERT, ("flask", event.id, body.get("n")))
        check(body)

    @app.post("/hooks-async")
    @webhook_receiver(consumer="flask-async", secret=SECRET,
                      connect=pool.connection)
    async def hooks_async(conn, event):
        # an async view, run by Flask's ensure_sync under the decorator
        conn.execute(INSERT, ("flask-async", event.id, event.json().get("n")))

    @app.post("/hooks/t/<tenant>")
    @webhook_receiver(consumer="flask-tenant", secret=SECRET,
                      connect=pool.connection,
                      tenant=lambda event, request: request.view_args["tenant"])
    def hooks_tenant(conn, event, tenant):
        conn.execute(INSERT, ("flask-tenant", event.id, event.json().get("n")))

    @app.get("/idempotency")
    def ready():
        return "ok"

    sock = common.listen()
    port = sock.getsockname()[1]
    server = make_server("127.0.0.1", port, app, threaded=True,
                         fd=sock.fileno())
    common.announce(port)
    server.serve_forever()


def django():
    import socketserver
    from wsgiref.simple_server import (WSGIRequestHandler, WSGIServer,
                                       make_server)

    import django as dj
    from django.conf import settings
    settings.configure(
        DEBUG=False, SECRET_KEY="test", ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__, MIDDLEWARE=[], INSTALLED_APPS=[],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["PGDATABASE"],
            "USER": os.environ.get("IDEM_TEST_APP_USER", "app"),
            "HOST": os.environ["PGHOST"], "PORT": os.environ["PGPORT"]}},
        USE_TZ=True, LOGGING_CONFIG=None)
    dj.setup()
    from django.db import connection
    from django.http import HttpResponse
    from django.urls import path

    from pg_idempotency.django import webhook_receiver

    @webhook_receiver(consumer="django", secret=SECRET)
    def hooks(request, event):
        body = event.json()
        with connection.cursor() as cur:
            cur.execute(INSERT, ("django", event.id, body.get("n")))
        check(body)

    @webhook_receiver(
        consumer="django-tenant", secret=SECRET,
        tenant=lambda event, request: request.resolver_match.kwargs["tenant"])
    def hooks_tenant(request, event, tenant):
        with connection.cursor() as cur:
            cur.execute(INSERT, ("django-tenant", event.id,
                                 event.json().get("n")))

    global urlpatterns
    urlpatterns = [path("hooks", hooks),
                   path("hooks/t/<str:tenant>", hooks_tenant),
                   path("idempotency", lambda r: HttpResponse("ok"))]

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    from django.core.wsgi import get_wsgi_application
    server = make_server("127.0.0.1", 0, get_wsgi_application(),
                         server_class=Server, handler_class=Quiet)
    common.announce(server.server_port)
    server.serve_forever()


urlpatterns = []

if __name__ == "__main__":
    {"asgi": asgi, "fastapi": lambda: asgi(fastapi=True), "flask": flask,
     "django": django}[FRAMEWORK]()

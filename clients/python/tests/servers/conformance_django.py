"""The conformance app on Django: the middleware (IDEM_DJANGO=middleware,
after a Bearer authentication middleware) or the view decorator
(IDEM_DJANGO=decorator), on Django's own connection (psycopg2)."""

import os
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import django
from django.conf import settings

import common
import conformance_common as cc

MODE = os.environ.get("IDEM_DJANGO", "middleware")

middleware = [__name__ + ".BearerAuthMiddleware"]
if MODE == "middleware":
    middleware.append("pg_idempotency.django.IdempotencyMiddleware")
settings.configure(
    DEBUG=False,
    SECRET_KEY="conformance",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=middleware,
    INSTALLED_APPS=[],
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["PGDATABASE"],
        "USER": os.environ.get("IDEM_TEST_APP_USER", "app"),
        "HOST": os.environ["PGHOST"],
        "PORT": os.environ["PGPORT"],
        "OPTIONS": {"application_name": "idem-conformance"},
    }},
    PG_IDEMPOTENCY={},
    USE_TZ=True,
    LOGGING_CONFIG=None,
)
django.setup()

from django.db import connection  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from pg_idempotency.django import idempotent, policy_view  # noqa: E402


class _User:
    is_authenticated = True

    def __init__(self, name):
        self.pk = name


class _Anonymous:
    is_authenticated = False
    pk = None


class BearerAuthMiddleware:
    """The app's authentication: request.user from Authorization: Bearer."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = cc.bearer(request.META.get("HTTP_AUTHORIZATION"))
        request.user = _User(name) if name else _Anonymous()
        return self.get_response(request)


def view(route):
    def endpoint(request, **params):
        user = request.user
        caller = user.pk if user.is_authenticated else None
        what, arg = cc.plan(route, request.body)
        if what == "answer":
            status, headers, out = arg
        else:
            with connection.cursor() as cur:
                cur.execute(cc.INSERT, (caller, route, arg[0], arg[1]))
                charge_id = cur.fetchone()[0]
            headers_in = {k.lower(): v for k, v in request.headers.items()}
            status, headers, out = cc.answer(route, charge_id, caller,
                                             request.body, params, headers_in)
        resp = HttpResponse(out, status=status)
        for k, v in headers:
            if k.lower() == "set-cookie":
                resp.set_cookie("session", v.split("=", 1)[1])
            else:
                resp[k] = v
        return resp
    endpoint.__name__ = "view_" + route.strip("/")
    endpoint = csrf_exempt(endpoint)
    return idempotent(endpoint) if MODE == "decorator" else endpoint


urlpatterns = [path("charges", view("/charges")),
               path("orders/<str:id>/refund", view("refund")),
               path("text", view("/text")),
               path("big", view("/big")),
               path("idempotency", policy_view())]


class Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 256


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main():
    from django.core.wsgi import get_wsgi_application
    sock = common.listen()
    port = sock.getsockname()[1]
    server = Server(("127.0.0.1", port), QuietHandler,
                    bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()
    server.server_name, server.server_port = "127.0.0.1", port
    server.setup_environ()
    server.set_app(get_wsgi_application())
    common.announce(port)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""Django test server (wsgiref, one thread per request), on Django's own
connection (psycopg2 on Django 3.2)."""

import os
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import django
from django.conf import settings

import common

settings.configure(
    DEBUG=False,
    SECRET_KEY="test",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[__name__ + ".BasicAuthMiddleware",
                "pg_idempotency.django.IdempotencyMiddleware"],
    INSTALLED_APPS=[],
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["PGDATABASE"],
        "USER": os.environ.get("IDEM_TEST_APP_USER", "app"),
        "HOST": os.environ["PGHOST"],
        "PORT": os.environ["PGPORT"],
        "OPTIONS": {"application_name": "idem-test-server"},
    }},
    PG_IDEMPOTENCY=common.options(),
    USE_TZ=True,
    LOGGING_CONFIG=None,
)
django.setup()

from django.db import connection  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402


def _execute(sql, params):
    with connection.cursor() as cur:
        cur.execute(sql, params)


class _User:
    is_authenticated = True

    def __init__(self, name):
        self.pk = name


class BasicAuthMiddleware:
    """The test's authentication: request.user from HTTP Basic."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        name = common.basic_user(request.META.get("HTTP_AUTHORIZATION"))
        if name:
            request.user = _User(name)
        return self.get_response(request)


@csrf_exempt
def charges(request):
    headers = {k.lower(): v for k, v in request.headers.items()}
    sql, params = common.before(headers, request.idempotency_key,
                                request.body, "django")
    with connection.cursor() as cur:
        cur.execute(sql, params)
        charge_id = cur.fetchone()[0]
    status, hdrs, out = common.after(headers, charge_id, _execute)
    resp = HttpResponse(out, status=status)
    for k, v in hdrs:
        if k.lower() == "set-cookie":
            resp.set_cookie("session", "secret-%d" % charge_id)
        else:
            resp[k] = v
    return resp


@csrf_exempt
def blobs(request):
    status, hdrs, out = common.blob(request.body)
    return HttpResponse(out, status=status, content_type=hdrs[0][1])


urlpatterns = [path("charges", charges), path("blobs", blobs)]


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

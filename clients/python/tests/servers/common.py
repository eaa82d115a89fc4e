"""
The test service every server of the suite implements, whatever the
framework: POST /charges makes a charge row in the request's transaction
and answers 201; request headers steer it (test hooks):

  Test-Delay-Ms: N      pg_sleep in the transaction, after the INSERT
  Test-Fail: 1          raise after the INSERT (the framework answers 500)
  Test-Crash: 1         SIGKILL this server after the INSERT, before COMMIT
  Test-Status: N        answer N (after the INSERT)
  Test-Big: N           a body of N bytes (over max_response_bytes: 54000)

POST /blobs answers the request body reversed, as application/octet-stream
(raw bytes replay).  Servers print "PORT <n>" once they listen.
"""

import json
import os
import signal
import socket
import sys

CHARGE_SQL = ("INSERT INTO charges (key, amount, framework) "
              "VALUES (%s, %s, %s) RETURNING id")


def listen():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    return sock


def announce(port):
    sys.stdout.write("PORT %d\n" % port)
    sys.stdout.flush()


def options():
    """Options of the adapters from the environment."""
    # anonymous: most tests send no credentials (the callers' own scopes
    # are tested with HTTP Basic users; the refusal of a request without
    # a caller by test_conformance.py and test_misconfig.py)
    opts = {"ttl": 7200, "docs_url": "http://docs.example/idempotency",
            "policy_path": "/idempotency", "anonymous": True}
    if os.environ.get("IDEM_WAIT"):
        opts["wait"] = float(os.environ["IDEM_WAIT"])
    if os.environ.get("IDEM_TTL"):
        opts["ttl"] = os.environ["IDEM_TTL"]
    if os.environ.get("IDEM_KEY_MEMORY"):
        opts["key_memory"] = os.environ["IDEM_KEY_MEMORY"]
    if os.environ.get("IDEM_TOO_LARGE_STATUS"):
        opts["too_large_status"] = int(os.environ["IDEM_TOO_LARGE_STATUS"])
    if os.environ.get("IDEM_BUSY_STATUS"):
        opts["busy_status"] = int(os.environ["IDEM_BUSY_STATUS"])
    if os.environ.get("IDEM_SERVER_ERRORS"):
        opts["server_errors"] = os.environ["IDEM_SERVER_ERRORS"]
    if os.environ.get("IDEM_MAX_BODY"):
        opts["max_body_bytes"] = int(os.environ["IDEM_MAX_BODY"])
    return opts


def conninfo():
    return "user=%s application_name=idem-test-server" % \
        os.environ.get("IDEM_TEST_APP_USER", "app")


def before(headers, key, body, framework):
    """(sql, params) of the INSERT; raises ValueError on a bad body."""
    req = json.loads(body.decode("utf-8"))
    return CHARGE_SQL, (key, int(req["amount"]), framework)


def after(headers, charge_id, execute):
    """The answer once the charge row is written: (status, headers, body).
    EXECUTE(sql, params) runs SQL in the request's transaction."""
    delay = int(headers.get("test-delay-ms", "0") or 0)
    if delay:
        execute("SELECT pg_sleep(%s)", (delay / 1000.0,))
    if headers.get("test-crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    if headers.get("test-fail"):
        raise RuntimeError("injected failure after the INSERT")
    status = int(headers.get("test-status", "201"))
    big = int(headers.get("test-big", "0") or 0)
    body = {"id": charge_id, "object": "charge"}
    if big:
        body["padding"] = "x" * big
    out = json.dumps(body, sort_keys=True).encode("utf-8")
    hdrs = [("Content-Type", "application/json"),
            ("Location", "/charges/%d" % charge_id),
            ("ETag", '"c%d"' % charge_id),
            ("X-Not-Replayed", "1"),
            ("Set-Cookie", "session=secret-%d; Path=/" % charge_id)]
    return status, hdrs, out


def blob(body):
    return 200, [("Content-Type", "application/octet-stream")], body[::-1]


def basic_user(authorization):
    """The user name of an HTTP Basic Authorization value, or None."""
    import base64
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        return base64.b64decode(authorization[6:]).decode().split(":", 1)[0]
    except ValueError:
        return None

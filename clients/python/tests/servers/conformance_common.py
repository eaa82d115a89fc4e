"""
The conformance app of clients/conformance/README.md, framework-free: each
server (conformance_asgi.py, conformance_django.py, conformance_flask.py)
reads the request, calls plan(), inserts the charge it asks for in the
request's transaction, and answers what answer() makes.  Servers print
"PORT <n>" once they listen.
"""

import json
import os

INSERT = ("INSERT INTO conformance_charges (caller, route, amount, currency) "
          "VALUES (%s, %s, %s, %s) RETURNING id")
ROUTES = ("/charges", "refund", "/text", "/big")


def conninfo():
    return "user=%s application_name=idem-conformance" % \
        os.environ.get("IDEM_TEST_APP_USER", "app")


def bearer(authorization):
    """NAME of "Bearer NAME", or None."""
    if authorization and authorization.startswith("Bearer "):
        name = authorization[7:].strip()
        return name or None
    return None


def _json(obj):
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def plan(route, body):
    """("answer", (status, headers, body)) without writing, or ("insert",
    (amount, currency)) for the charge to insert first."""
    try:
        doc = json.loads(body.decode("utf-8")) if body else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    if route == "/charges":
        amount = doc.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
            return "answer", (400, [("Content-Type", "application/json")],
                              _json({"error": "amount must be a non-negative integer"}))
        return "insert", (amount, doc.get("currency"))
    if route == "refund":
        return "insert", (doc.get("amount"), None)
    return "insert", (0, None)


def answer(route, charge_id, caller, body, params, headers):
    """(status, headers, body) once the charge is inserted; raises for
    Test-Fail: 1."""
    doc = json.loads(body.decode("utf-8")) if body else {}
    if route == "/charges":
        if headers.get("test-fail") == "1":
            raise RuntimeError("Test-Fail: after the INSERT")
        return 201, [("Content-Type", "application/json"),
                     ("Location", "/charges/%d" % charge_id)], \
            _json({"id": charge_id, "caller": caller,
                   "amount": doc.get("amount"),
                   "currency": doc.get("currency")})
    if route == "refund":
        return 201, [("Content-Type", "application/json")], \
            _json({"order": str(params["id"]), "refund": charge_id})
    if route == "/text":
        return 201, [("Content-Type", "text/plain; charset=utf-8"),
                     ("Location", "/charges/%d" % charge_id),
                     ("X-Not-Replayed", "yes"),
                     ("Set-Cookie", "session=%d" % charge_id)], \
            ("charge %d\n" % charge_id).encode("utf-8")
    return 200, [("Content-Type", "application/json")], \
        _json({"id": charge_id, "padding": "x" * int(doc.get("size", 0))})

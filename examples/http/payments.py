#
# examples/http/payments.py -- what the payments service (server.py) and its
# recoverer (recoverer.py) share: the connection pool, the charge request,
# the simulated card network, and the second phase of a charge (call the
# card network, then INSERT the charge and idem_complete() the key in one
# transaction).  See examples/http/README.md for the flow.
#
# Standard library + psycopg 3 only (Debian: python3-psycopg).

import argparse
import collections
import contextlib
import json
import queue
import re
import threading
import time
import uuid

import psycopg
from psycopg import errors as pgerrors
from psycopg.types.json import Jsonb

MAX_DESCRIPTION_LENGTH = 500
CURRENCY_RE = re.compile(r"[a-z]{3}")

# The scope of a key is "<account> POST /charges": keys are per account and
# per operation, and the recoverer reads the account back from the scope.
SCOPE_SUFFIX = " POST /charges"

# The only stored response headers that are replayed.  Set-Cookie and the
# like belong to one client's session and must never be sent to another.
REPLAY_HEADERS = ("Content-Type", "Location", "ETag")

# The recovery point of a charge's key names the idempotency key sent to the
# card network.  It is recorded with the claim, in the claim's transaction,
# before the card network is called, and carries over to whoever takes the
# key over (a retry after the lease lapsed, or the recoverer).
PROVIDER_KEY_PREFIX = "card_network_key:"


class BadRequest(Exception):
    """The request body is not a valid charge (400, key left unused)."""


class InjectedFailure(Exception):
    """Raised by the --test-hooks fault injection, after the INSERT."""


class CardNetworkUnavailable(Exception):
    """The card network refused the call before charging anything."""


class TakenOver(Exception):
    """idem_complete() refused our token (55006): someone took the key over."""


Response = collections.namedtuple("Response", "code headers body")
Response.__doc__ = """
An HTTP response as sent and as stored with idem_complete():
code, headers (a list of (name, value)), body (bytes).
"""


# ---------------------------------------------------------------- requests

def scope_of(account):
    return account + SCOPE_SUFFIX


def account_of(scope):
    """The account a scope belongs to, or None if it is not a charge's."""
    if scope.endswith(SCOPE_SUFFIX) and " " not in scope[:-len(SCOPE_SUFFIX)]:
        return scope[:-len(SCOPE_SUFFIX)] or None
    return None


def parse_body(body_bytes):
    """Parse a POST /charges body; return the JSON object (BadRequest)."""
    try:
        req = json.loads(body_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest("The body is not valid JSON: %s." % e) from None
    charge_fields(req)
    return req


def charge_fields(req):
    """
    Validate a charge request (the parsed body, or the request the key kept
    for the recoverer); return its amount, currency and description.
    """
    if not isinstance(req, dict):
        raise BadRequest("The body must be a JSON object.")
    amount = req.get("amount")
    currency = req.get("currency")
    description = req.get("description")
    if not isinstance(amount, int) or isinstance(amount, bool) or \
            not 0 < amount < 2 ** 53:
        raise BadRequest("\"amount\" must be a positive integer (minor units).")
    if not isinstance(currency, str) or not CURRENCY_RE.fullmatch(currency):
        raise BadRequest("\"currency\" must be a lower-case ISO 4217 code "
                         "such as \"eur\".")
    if description is not None and (not isinstance(description, str) or
                                    len(description) > MAX_DESCRIPTION_LENGTH):
        raise BadRequest("\"description\" must be a string of at most %d "
                         "characters." % MAX_DESCRIPTION_LENGTH)
    return {"amount": amount, "currency": currency,
            "description": description}


# ---------------------------------------------------------------- responses

def dump_json(obj):
    """The one JSON serialization of the service's response bodies."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def json_response(code, obj, headers=()):
    return Response(code, [("Content-Type", "application/json")] +
                    list(headers), dump_json(obj))


def charge_json(row):
    charge_id, account, amount, currency, description, created = row
    return {"id": "ch_%d" % charge_id, "object": "charge",
            "account": account, "amount": amount, "currency": currency,
            "description": description,
            "created": created.isoformat(timespec="microseconds")}


def replay_headers(stored):
    """
    The replayable headers of a stored header object (as idem_complete
    keeps it, names in any case): only the REPLAY_HEADERS allowlist.
    """
    allowed = {h.lower(): h for h in REPLAY_HEADERS}
    out = []
    for name, value in sorted((stored or {}).items()):
        if name.lower() in allowed:
            values = value if isinstance(value, list) else [value]
            out.extend((allowed[name.lower()], v) for v in values)
    return out


def headers_to_store(headers):
    """The headers of a response that idem_complete() keeps: the allowlist."""
    allowed = {h.lower() for h in REPLAY_HEADERS}
    return {name: value for name, value in headers
            if name.lower() in allowed}


def stored_response(code, headers, raw, body):
    """The Response a completed key replays (idem_claim's columns)."""
    if raw is None and body is not None:
        # completed by the 0.3 version of this example: JSON only
        return json_response(code, body)
    return Response(code, replay_headers(headers), raw or b"")


# ---------------------------------------------------------------- plumbing

class Pool:
    """
    A small connection pool: at most SIZE connections, reused LIFO.  A
    connection that comes back broken or inside a transaction is closed
    instead of reused.  Connections are in autocommit mode: every
    transaction is an explicit conn.transaction() block, BEGIN ... COMMIT,
    and a statement outside one commits on its own.
    """

    def __init__(self, conninfo, size, application_name):
        self._conninfo = conninfo
        self._name = application_name
        self._idle = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)

    @contextlib.contextmanager
    def connection(self):
        self._slots.acquire()
        conn = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = psycopg.connect(self._conninfo, autocommit=True,
                                       application_name=self._name)
            yield conn
        finally:
            if conn is not None:
                if conn.closed or conn.info.transaction_status != \
                        psycopg.pq.TransactionStatus.IDLE:
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()


def parse_duration(text):
    """'500ms', '90s' or '90', '30m', '24h', '7d' -> seconds (float)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|[smhd]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError("not a duration: %r" % text)
    return float(m.group(1)) * {"ms": 0.001, "": 1, "s": 1, "m": 60,
                                "h": 3600, "d": 86400}[m.group(2)]


def positive_duration(text):
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be positive: %r" % text)
    return seconds


def human_interval(seconds):
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            n = int(seconds // size)
            return "%d %s%s" % (n, unit, "" if n == 1 else "s")
    return "%g second%s" % (seconds, "" if seconds == 1 else "s")


# ---------------------------------------------------------------- card network

ProviderCharge = collections.namedtuple("ProviderCharge", "id outcome")


class CardNetwork:
    """
    Stands for the card network's API (Stripe, Adyen, a bank): a remote call
    outside our transactions, made idempotent by the key we send with it,
    as those APIs are.  Simulated with the table provider_charges, in the
    same database for the example's sake but on connections of its own and
    in autocommit: once charge() has inserted, the charge is made, whatever
    happens to our side afterwards.  The same key again returns the first
    answer; the same key with another amount is an error, as with Stripe.
    """

    # the simulated issuer declines amounts above this (minor units)
    DECLINE_ABOVE = 1000000

    def __init__(self, conninfo, size):
        self._pool = Pool(conninfo, size, "card-network")

    def charge(self, provider_key, amount, currency, metadata, delay=0.0,
               fail=""):
        if fail == "card-network-down":
            raise CardNetworkUnavailable("card network unavailable (test hook)")
        with self._pool.connection() as conn:
            conn.execute(
                "INSERT INTO provider_charges (idempotency_key, amount, "
                "                              currency, outcome, metadata) "
                "VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (idempotency_key) DO NOTHING",
                (provider_key, amount, currency,
                 "declined" if amount > self.DECLINE_ABOVE else "succeeded",
                 Jsonb(metadata)))
            row = conn.execute(
                "SELECT id, outcome, amount, currency FROM provider_charges "
                " WHERE idempotency_key = %s", (provider_key,)).fetchone()
        if (row[2], row[3]) != (amount, currency):
            raise RuntimeError("card network: idempotency key %s was used "
                               "for another amount" % provider_key)
        if delay > 0:
            # the charge is made; its answer is slow to come back
            time.sleep(delay)
        return ProviderCharge(row[0], row[1])


# ---------------------------------------------------------------- phase 2

def provider_key_of(recovery_point):
    """The card network key in a charge's recovery point (or None)."""
    if recovery_point and recovery_point.startswith(PROVIDER_KEY_PREFIX):
        return recovery_point[len(PROVIDER_KEY_PREFIX):]
    return None


def new_provider_key(conn, key, scope, token=None):
    """
    Mint the card network key of a charge and record it as the key's
    recovery point (token None: a claim of this transaction).
    """
    provider_key = str(uuid.uuid4())
    conn.execute("SELECT idem_checkpoint(%s, %s, %s, %s)",
                 (key, PROVIDER_KEY_PREFIX + provider_key, scope, token))
    return provider_key


def make_charge(work_pool, network, key, scope, token, provider_key,
                request, delay=0.0, fail=""):
    """
    Phase 2 of a charge whose key we hold with TOKEN: call the card network
    (outside any transaction), then in one transaction INSERT the charge and
    complete the key with the response, headers and exact body bytes.
    Returns the Response.  Raises TakenOver if the key was taken over
    meanwhile (our INSERT rolled back with it), CardNetworkUnavailable if
    nothing was charged, and anything else if the outcome is unknown.
    """
    account = account_of(scope)
    charge = charge_fields(request)
    paid = network.charge(provider_key, charge["amount"], charge["currency"],
                          {"account": account, "idempotency_key": key},
                          delay=delay, fail=fail)
    for attempt in range(1, 4):
        try:
            with work_pool.connection() as conn, conn.transaction():
                if paid.outcome == "succeeded":
                    row = conn.execute(
                        "INSERT INTO charges (account_id, amount, currency, "
                        "    description, idempotency_key, provider_charge_id) "
                        "VALUES (%s, %s, %s, %s, %s, %s) "
                        "RETURNING id, account_id, amount, currency, "
                        "          description, created_at",
                        (account, charge["amount"], charge["currency"],
                         charge["description"], key, paid.id)).fetchone()
                    response = json_response(
                        201, charge_json(row),
                        [("Location", "/charges/%d" % row[0])])
                else:
                    # a business error is a response too: stored, replayed
                    response = json_response(402, {"error": {
                        "code": "card_declined",
                        "message": "The card was declined.",
                        "amount": charge["amount"]}})
                if fail == "after-insert":
                    raise InjectedFailure()
                conn.execute(
                    "SELECT idem_complete(%s, %s, scope => %s, token => %s, "
                    "    response_headers => %s, response_raw => %s)",
                    (key, response.code, scope, token,
                     Jsonb(headers_to_store(response.headers)), response.body))
            return response
        except pgerrors.ObjectInUse:
            raise TakenOver(key) from None
        except (pgerrors.SerializationFailure, pgerrors.DeadlockDetected):
            if attempt == 3:
                raise
    raise AssertionError("not reached")


def release(work_pool, key, scope, token):
    """
    Give the key up after a failure that charged nothing: the retry claims
    it afresh.  False if it was taken over meanwhile.
    """
    try:
        with work_pool.connection() as conn:
            conn.execute("SELECT idem_release(%s, %s, %s)", (key, scope, token))
        return True
    except pgerrors.ObjectInUse:
        return False

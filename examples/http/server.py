#!/usr/bin/env python3
#
# examples/http/server.py -- a small payments API that honours the
# Idempotency-Key request header field (IETF draft
# draft-ietf-httpapi-idempotency-key-header) with the idempotency extension.
#
#   python3 examples/http/server.py --port 8080 [--dsn 'dbname=payments']
#
# Endpoints:
#   POST /charges            make a charge; needs an Idempotency-Key header
#   GET  /charges/ID         read a charge of the caller's account
#   GET  /docs/idempotency   the idempotency policy (key format, retention,
#                            status codes), HTML or, with
#                            "Accept: application/json", JSON
#
# Each POST /charges runs one transaction on one pooled connection:
#
#   BEGIN;
#   SELECT ... FROM idem_claim(key, request => body, scope => account,
#                              ttl => retention, wait => false);
#   -- 'claimed':     INSERT INTO charges ...;
#   --                SELECT idem_complete(key, 201, response, scope => ...);
#   -- 'completed':   nothing; send the stored response again
#   -- 'in_progress': nothing; 409 Conflict
#   -- 'mismatch':    nothing; 422 Unprocessable Content
#   COMMIT;
#
# so the charge and the stored response commit or roll back together: a
# crash before COMMIT leaves the key unused and the retry makes the charge.
# Connection settings come from --dsn and the usual libpq environment
# (PGHOST, PGPORT, PGDATABASE, PGUSER).  See examples/http/README.md.
#
# Standard library + psycopg 3 only (Debian: python3-psycopg).

import argparse
import contextlib
import html
import http.server
import json
import queue
import re
import sys
import threading

import psycopg
from psycopg import errors as pgerrors
from psycopg.types.json import Jsonb

# Longest key we accept, in bytes after unquoting.  The extension's own limit
# is idempotency.max_key_length (255 by default); a longer key would be an
# error there, and must be a 400 here.
MAX_KEY_LENGTH = 255
MAX_ACCOUNT_LENGTH = 64
MAX_BODY_BYTES = 64 * 1024
MAX_DESCRIPTION_LENGTH = 500

# What a bare (unquoted) key may contain; see parse_idempotency_key().
BARE_KEY_RE = re.compile(r"[A-Za-z0-9._~:-]+")
CURRENCY_RE = re.compile(r"[a-z]{3}")
CHARGE_PATH_RE = re.compile(r"/charges/([0-9]{1,18})")

DOC_PATH = "/docs/idempotency"


class BadKey(Exception):
    """The Idempotency-Key field is missing or malformed (400)."""

    def __init__(self, title, detail):
        super().__init__(detail)
        self.title = title
        self.detail = detail


class BadRequest(Exception):
    """The request body is not a valid charge (400, key left unused)."""


class InjectedFailure(Exception):
    """Raised by the --test-hooks fault injection, after the INSERT."""


def parse_idempotency_key(values):
    """
    Return the key carried by the Idempotency-Key field values of a request.

    The draft makes the field an RFC 8941 Item whose value is a String:
        Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
    A String is printable ASCII in double quotes, with \\" and \\\\ as the
    only escapes.  For clients written for Stripe-style APIs we also take a
    bare value made of [A-Za-z0-9._~:-] only; it names the same key as its
    quoted form.  Raises BadKey for every other input.
    """
    if not values:
        raise BadKey("Idempotency-Key is missing",
                     "This operation is idempotent and requires an "
                     "Idempotency-Key request header field.")
    if len(values) > 1:
        raise BadKey("More than one Idempotency-Key",
                     "A request must not carry more than one Idempotency-Key "
                     "header field.")
    raw = values[0].strip(" \t")
    if raw.startswith('"'):
        key = _parse_sf_string(raw)
    elif BARE_KEY_RE.fullmatch(raw):
        key = raw
    else:
        key = None
    if key is None:
        raise BadKey("Idempotency-Key is malformed",
                     "The Idempotency-Key must be a Structured Field String "
                     "(RFC 8941), such as "
                     "\"8e03978e-40d5-43e8-bc93-6894a57f9324\".")
    if key == "":
        raise BadKey("Idempotency-Key is empty",
                     "The Idempotency-Key must not be empty.")
    if len(key) > MAX_KEY_LENGTH:
        raise BadKey("Idempotency-Key is too long",
                     "The Idempotency-Key must be at most %d characters long."
                     % MAX_KEY_LENGTH)
    return key


def _parse_sf_string(raw):
    """
    Parse an RFC 8941 sf-string (section 4.2.5) that makes up all of RAW;
    None if RAW is not one.
    """
    out = []
    i = 1
    while i < len(raw):
        c = raw[i]
        if c == "\\":
            i += 1
            if i >= len(raw) or raw[i] not in "\"\\":
                return None
            out.append(raw[i])
        elif c == '"':
            return "".join(out) if i == len(raw) - 1 else None
        elif " " <= c <= "~":
            out.append(c)
        else:
            return None
        i += 1
    return None                 # no closing quote


def parse_charge(body_bytes):
    """
    Validate a POST /charges body; return (request_json, charge_fields).
    request_json is the whole parsed body: it is what the key's fingerprint
    is taken from, so a retry must send the same JSON (key order and
    whitespace do not matter: the extension fingerprints canonical jsonb).
    """
    try:
        req = json.loads(body_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BadRequest("The body is not valid JSON: %s." % e) from None
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
    return req, {"amount": amount, "currency": currency,
                 "description": description}


def dump_json(obj):
    """
    The one serialization used for first responses and replays alike, so a
    replay is byte-for-byte the original (jsonb reorders keys; we sort).
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


class Pool:
    """
    A small connection pool: at most SIZE connections, reused LIFO.  A
    connection that comes back broken or inside a transaction is closed
    instead of reused.
    """

    def __init__(self, conninfo, size):
        self._conninfo = conninfo
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
                # autocommit: every transaction is an explicit
                # conn.transaction() block, BEGIN ... COMMIT
                conn = psycopg.connect(self._conninfo, autocommit=True,
                                       application_name="payments-example")
            yield conn
        finally:
            if conn is not None:
                if conn.closed or conn.info.transaction_status != \
                        psycopg.pq.TransactionStatus.IDLE:
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()


class PaymentsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # the default backlog of 5 drops connections under a burst of retries
    request_queue_size = 128

    def __init__(self, address, opts, pool):
        super().__init__(address, PaymentsHandler)
        self.opts = opts
        self.pool = pool
        self.ttl_seconds = opts.key_ttl
        host, port = self.server_address[:2]
        self.public_url = (opts.public_url or
                           "http://%s:%d" % (host, port)).rstrip("/")
        self.doc_url = self.public_url + DOC_PATH


class PaymentsHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "payments-example/0.1"

    # ------------------------------------------------------------ plumbing

    def log_message(self, fmt, *args):
        if not self.server.opts.quiet:
            sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % args))

    def send(self, code, body, content_type="application/json",
             headers=()):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_problem(self, code, title, detail, headers=()):
        """
        An RFC 9457 problem document whose "type" is our idempotency
        documentation, plus a Link to it (draft, "Error Scenarios").
        """
        problem = {"type": self.server.doc_url, "title": title,
                   "status": code, "detail": detail}
        link = '<%s>; rel="describedby"; type="text/html"' % \
            self.server.doc_url
        self.send(code, dump_json(problem), "application/problem+json",
                  [("Content-Language", "en"), ("Link", link)] + list(headers))

    def account(self):
        """
        The caller's account.  A real service takes it from authentication
        (the API key), never from a header the client picks; this example
        reads Account-Id so that the test can act as several accounts.
        """
        account = self.headers.get("Account-Id", "acct_default").strip()
        if not account or len(account) > MAX_ACCOUNT_LENGTH or \
                not BARE_KEY_RE.fullmatch(account):
            return None
        return account

    def read_body(self):
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return None
        length = int(length)
        if length > MAX_BODY_BYTES:
            return None
        return self.rfile.read(length)

    # ------------------------------------------------------------ routes

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == DOC_PATH:
            return self.get_docs()
        m = CHARGE_PATH_RE.fullmatch(path)
        if m:
            return self.get_charge(int(m.group(1)))
        self.send(404, dump_json({"error": "not found"}))

    do_HEAD = do_GET

    def do_POST(self):
        if self.path.split("?", 1)[0] != "/charges":
            self.read_body()            # keep the connection in sync
            self.send(404, dump_json({"error": "not found"}))
            return
        try:
            self.post_charge()
        except OSError:
            raise                       # the client went away
        except Exception as e:          # noqa: BLE001 -- answer, then log
            # Whatever failed rolled its transaction back: the key is
            # unused and a retry with it starts afresh.
            self.log_error("POST /charges failed: %r", e)
            self.send(500, dump_json({"error": {
                "code": "internal_error",
                "message": "The request failed and changed nothing; retry "
                           "it with the same Idempotency-Key."}}))

    def get_docs(self):
        s = self.server
        ttl = s.ttl_seconds
        policy = {
            "header": "Idempotency-Key",
            "required_for": ["POST /charges"],
            "key_format": "RFC 8941 String of 1-%d printable ASCII "
                          "characters, e.g. \"8e03978e-40d5-43e8-bc93-"
                          "6894a57f9324\"; a bare value of "
                          "[A-Za-z0-9._~:-] is taken as the same key"
                          % MAX_KEY_LENGTH,
            "recommended_key": "a random UUID per operation",
            "key_scope": "per account and operation: the same key sent by "
                         "two accounts names two operations",
            "fingerprint": "the JSON request body (key order and "
                           "whitespace do not matter)",
            "key_retention_seconds": ttl,
            "key_retention": "a key is kept for %s after its first use; "
                             "after that the same key starts a new "
                             "operation" % human_interval(ttl),
            "responses": {
                "first use": "the operation's own response",
                "retry after completion": "the stored response (status "
                                          "and body), with header "
                                          "Idempotent-Replayed: true",
                "retry while the first request is in progress":
                    ("409 Conflict; retry later" if not s.opts.wait else
                     "waits for the first request, then as above"),
                "key reused with a different body": "422 Unprocessable "
                                                    "Content",
                "no, empty, malformed, too long, or repeated key":
                    "400 Bad Request",
            },
        }
        if "application/json" in self.headers.get("Accept", ""):
            return self.send(200, dump_json(policy))
        rows = "".join("<tr><td>%s</td><td>%s</td></tr>\n" %
                       (html.escape(k), html.escape(v))
                       for k, v in policy["responses"].items())
        page = (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>Idempotency</title></head><body>\n"
            "<h1>Idempotent requests</h1>\n"
            "<p>Send an <code>Idempotency-Key</code> header with every "
            "<code>POST /charges</code>: %s.  Recommended: %s.</p>\n"
            "<p>Keys are scoped %s.  The fingerprint is %s.</p>\n"
            "<p id=\"retention\">Retention: %s "
            "(<span id=\"retention-seconds\">%d</span> seconds).</p>\n"
            "<table>\n%s</table>\n</body></html>\n"
            % (html.escape(policy["key_format"]),
               html.escape(policy["recommended_key"]),
               html.escape(policy["key_scope"]),
               html.escape(policy["fingerprint"]),
               html.escape(policy["key_retention"]), ttl, rows))
        self.send(200, page.encode("utf-8"), "text/html; charset=utf-8")

    def get_charge(self, charge_id):
        account = self.account()
        if account is None:
            return self.send(400, dump_json({"error": "bad Account-Id"}))
        with self.server.pool.connection() as conn:
            with conn.transaction():
                row = conn.execute(
                    "SELECT id, account_id, amount, currency, description, "
                    "       created_at "
                    "  FROM charges WHERE id = %s AND account_id = %s",
                    (charge_id, account)).fetchone()
        if row is None:
            return self.send(404, dump_json({"error": "not found"}))
        self.send(200, dump_json(charge_json(row)))

    def post_charge(self):
        opts = self.server.opts
        body = self.read_body()
        if body is None:
            return self.send(413 if self.headers.get("Content-Length", "")
                             .isdigit() else 411,
                             dump_json({"error": "the body must have a "
                                        "Content-Length of at most %d bytes"
                                        % MAX_BODY_BYTES}))
        try:
            key = parse_idempotency_key(self.headers.get_all("Idempotency-Key"))
        except BadKey as e:
            return self.send_problem(400, e.title, e.detail)
        account = self.account()
        if account is None:
            return self.send_problem(400, "Bad Account-Id",
                                     "Account-Id must be 1-%d characters of "
                                     "[A-Za-z0-9._~:-]." % MAX_ACCOUNT_LENGTH)
        try:
            request, charge = parse_charge(body)
        except BadRequest as e:
            # Nothing claimed: the client fixes the body and retries with
            # the same key.
            return self.send(400, dump_json({"error": {
                "code": "invalid_request", "message": str(e)}}))

        hooks = opts.test_hooks
        delay_ms = int(self.headers.get("Test-Delay-Ms", "0") or 0) \
            if hooks else 0
        fail = self.headers.get("Test-Fail", "") if hooks else ""

        # The key's identity is (database role, scope, key); the draft's
        # security section asks for the client's key combined with what the
        # server knows about the client.
        scope = "%s POST /charges" % account

        for attempt in range(1, 4):
            try:
                outcome = self.charge_transaction(key, scope, account,
                                                  request, charge,
                                                  delay_ms, fail)
                break
            except (pgerrors.SerializationFailure,
                    pgerrors.DeadlockDetected):
                if attempt == 3:
                    raise
            except InjectedFailure:
                return self.send(500, dump_json({"error": {
                    "code": "internal_error",
                    "message": "injected failure after the INSERT; the "
                               "transaction rolled back"}}))
            except pgerrors.LockNotAvailable:
                # --wait: the first request held the key past lock_timeout
                outcome = ("in_progress", None, None)
                break

        status, code, response = outcome
        if status == "claimed":
            return self.send(code, dump_json(response),
                             headers=location_header(code, response))
        if status == "completed":
            return self.send(code, dump_json(response),
                             headers=[("Idempotent-Replayed", "true")] +
                             location_header(code, response))
        if status == "in_progress":
            return self.send_problem(
                409, "A request is outstanding for this Idempotency-Key",
                "A request with the same Idempotency-Key for the same "
                "operation is being processed.  Retry it later.",
                headers=[("Retry-After", "1")])
        if status == "mismatch":
            return self.send_problem(
                422, "Idempotency-Key is already used",
                "This Idempotency-Key was used with a different request "
                "body.  A key must not be reused for a different request.")
        raise RuntimeError("unexpected idem_claim status %r" % status)

    def charge_transaction(self, key, scope, account, request, charge,
                           delay_ms, fail):
        """
        One transaction: claim the key; if it is ours, make the charge and
        store the response.  Returns (status, response_code, response_body).
        """
        opts = self.server.opts
        with self.server.pool.connection() as conn:
            with conn.transaction():
                if opts.wait:
                    conn.execute("SET LOCAL lock_timeout = %s" %
                                 int(opts.lock_timeout * 1000))
                status, code, response = conn.execute(
                    "SELECT status, response_code, response_body "
                    "  FROM idem_claim(%s, request => %s, scope => %s, "
                    "                  ttl => make_interval(secs => %s), "
                    "                  wait => %s)",
                    (key, Jsonb(request), scope, self.server.ttl_seconds,
                     opts.wait)).fetchone()
                if status != "claimed":
                    # the claim wrote nothing; the COMMIT is empty
                    return status, code, response

                if delay_ms > 0:
                    # stands for the time a card network takes
                    conn.execute("SELECT pg_sleep(%s)", (delay_ms / 1000.0,))
                if charge["amount"] > opts.decline_above:
                    # a business error is a response too: stored, replayed
                    code = 402
                    response = {"error": {
                        "code": "card_declined",
                        "message": "The card was declined.",
                        "amount": charge["amount"]}}
                else:
                    row = conn.execute(
                        "INSERT INTO charges (account_id, amount, currency, "
                        "                     description, idempotency_key) "
                        "VALUES (%s, %s, %s, %s, %s) "
                        "RETURNING id, account_id, amount, currency, "
                        "          description, created_at",
                        (account, charge["amount"], charge["currency"],
                         charge["description"], key)).fetchone()
                    code = 201
                    response = charge_json(row)
                if fail == "after-insert":
                    raise InjectedFailure()
                conn.execute(
                    "SELECT idem_complete(%s, %s, %s, scope => %s)",
                    (key, code, Jsonb(response), scope))
                return status, code, response


def charge_json(row):
    charge_id, account, amount, currency, description, created = row
    return {"id": "ch_%d" % charge_id, "object": "charge",
            "account": account, "amount": amount, "currency": currency,
            "description": description,
            "created": created.isoformat(timespec="microseconds")}


def location_header(code, response):
    if code == 201 and isinstance(response, dict) and \
            str(response.get("id", "")).startswith("ch_"):
        return [("Location", "/charges/%s" % response["id"][3:])]
    return []


def human_interval(seconds):
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            n = seconds // size
            return "%d %s%s" % (n, unit, "" if n == 1 else "s")
    return "%d second%s" % (seconds, "" if seconds == 1 else "s")


def parse_duration(text):
    """'86400', '90s', '30m', '24h' or '7d' -> seconds."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([smhd]?)\s*", text)
    if not m or int(m.group(1)) == 0:
        raise argparse.ArgumentTypeError("not a positive duration: %r" % text)
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600,
                              "d": 86400}[m.group(2)]


def main():
    ap = argparse.ArgumentParser(
        description="Example payments API with Idempotency-Key support.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--dsn", default="",
                    help="libpq connection string (default: PG* environment)")
    ap.add_argument("--pool-size", type=int, default=8)
    ap.add_argument("--key-ttl", type=parse_duration, default=86400,
                    help="how long a key is kept (e.g. 24h; default 24h); "
                         "published at " + DOC_PATH)
    ap.add_argument("--wait", action="store_true",
                    help="make a concurrent retry wait for the first request "
                         "and replay its response, instead of the draft's "
                         "409 Conflict")
    ap.add_argument("--lock-timeout", type=float, default=5.0,
                    help="with --wait: seconds to wait before answering 409")
    ap.add_argument("--decline-above", type=int, default=1000000,
                    help="charges above this amount are declined (402)")
    ap.add_argument("--public-url", default="",
                    help="base URL used in problem types and Link headers")
    ap.add_argument("--test-hooks", action="store_true",
                    help="honour the Test-Delay-Ms and Test-Fail: after-insert "
                         "request headers (tests only)")
    ap.add_argument("--quiet", action="store_true", help="no access log")
    opts = ap.parse_args()

    pool = Pool(opts.dsn, opts.pool_size)
    # fail early, before listening, if the database is unusable
    with pool.connection() as conn:
        conn.execute("SELECT 'idem_claim'::regproc, 'charges'::regclass")
    server = PaymentsServer((opts.host, opts.port), opts, pool)
    sys.stderr.write("payments example listening on %s (keys kept %s)\n"
                     % (server.public_url, human_interval(opts.key_ttl)))
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

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
# A charge calls the card network, a remote API outside our transactions,
# so each POST /charges is two phases around that call:
#
#   BEGIN;                                                   -- phase 1
#   SET LOCAL idempotency.wait_timeout = <--wait-timeout>;
#   SELECT ... FROM idem_claim(key, request => body, scope => account,
#                              ttl => retention, lease => <--lease>,
#                              wait => true, keep_request => true);
#   -- 'claimed':     SELECT idem_checkpoint(key, <card network key>, ...);
#   -- 'completed':   nothing; send the stored response again
#   -- 'in_progress': nothing; 409 Conflict (the wait ran out)
#   -- 'mismatch':    nothing; 422 Unprocessable Content
#   COMMIT;
#   -- the card network call, idempotent by the card network key
#   BEGIN;                                                   -- phase 2
#   INSERT INTO charges ...;
#   SELECT idem_complete(key, 201, scope => ..., token => token,
#                        response_headers => ..., response_raw => ...);
#   COMMIT;
#
# A duplicate that arrives meanwhile waits (up to --wait-timeout) for the
# first request's result.  If this process dies between the phases, the
# lease lapses and recoverer.py (or the client's retry) finishes the charge
# from the request the key kept.  Phase 2 and the card network are in
# payments.py, shared with recoverer.py.  Connection settings come from
# --dsn and the usual libpq environment (PGHOST, PGPORT, PGDATABASE,
# PGUSER).  See examples/http/README.md.
#
# Standard library + psycopg 3 only (Debian: python3-psycopg).

import argparse
import collections
import html
import http.server
import re
import sys

from psycopg import errors as pgerrors
from psycopg.types.json import Jsonb

import payments
from payments import Response, dump_json, json_response

# Longest key we accept, in bytes after unquoting.  The extension's own limit
# is idempotency.max_key_length (255 by default); a longer key would be an
# error there, and must be a 400 here.
MAX_KEY_LENGTH = 255
MAX_ACCOUNT_LENGTH = 64
# The key keeps the request for the recoverer; with the request's text it
# must fit idempotency.max_response_bytes (1 MB by default).
MAX_BODY_BYTES = 64 * 1024

# What a bare (unquoted) key may contain; see parse_idempotency_key().
BARE_KEY_RE = re.compile(r"[A-Za-z0-9._~:-]+")
CHARGE_PATH_RE = re.compile(r"/charges/([0-9]{1,18})")

DOC_PATH = "/docs/idempotency"

# What phase 1 gives phase 2: the status, and for 'claimed' the token and
# the card network key, for 'completed' the stored Response.
Claim = collections.namedtuple("Claim", "status token provider_key response")


class BadKey(Exception):
    """The Idempotency-Key field is missing or malformed (400)."""

    def __init__(self, title, detail):
        super().__init__(detail)
        self.title = title
        self.detail = detail


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


class PaymentsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # the default backlog of 5 drops connections under a burst of retries
    request_queue_size = 128

    def __init__(self, address, opts):
        super().__init__(address, PaymentsHandler)
        self.opts = opts
        # Two pools, so that duplicates waiting in idem_claim (each holds a
        # connection of claim_pool for up to --wait-timeout) never take the
        # connections the requests they wait for need to finish.
        self.claim_pool = payments.Pool(opts.dsn, opts.pool_size,
                                        "payments-claims")
        self.work_pool = payments.Pool(opts.dsn, opts.pool_size,
                                       "payments-work")
        self.network = payments.CardNetwork(opts.dsn, opts.pool_size)
        self.ttl_seconds = opts.key_ttl
        host, port = self.server_address[:2]
        self.public_url = (opts.public_url or
                           "http://%s:%d" % (host, port)).rstrip("/")
        self.doc_url = self.public_url + DOC_PATH


class PaymentsHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "payments-example/0.2"

    # ------------------------------------------------------------ plumbing

    def log_message(self, fmt, *args):
        if not self.server.opts.quiet:
            sys.stderr.write("%s - %s\n" % (self.address_string(), fmt % args))

    def send(self, response, extra_headers=()):
        code, headers, body = response
        self.send_response(code)
        for name, value in list(headers) + list(extra_headers):
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
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
        self.send(Response(code, [("Content-Type", "application/problem+json"),
                                  ("Content-Language", "en"),
                                  ("Link", link)] + list(headers),
                           dump_json(problem)))

    def send_error_json(self, code, error, message, headers=()):
        self.send(json_response(code, {"error": {"code": error,
                                                 "message": message}},
                                headers))

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
        self.send(json_response(404, {"error": "not found"}))

    do_HEAD = do_GET

    def do_POST(self):
        if self.path.split("?", 1)[0] != "/charges":
            self.read_body()            # keep the connection in sync
            self.send(json_response(404, {"error": "not found"}))
            return
        try:
            self.post_charge()
        except OSError:
            raise                       # the client went away
        except Exception as e:          # noqa: BLE001 -- answer, then log
            # Failed in phase 1 (nothing was charged) or in an unexpected
            # place; either way a retry with the same key is safe.
            self.log_error("POST /charges failed: %r", e)
            self.send_error_json(500, "internal_error",
                                 "The request failed; retry it with the "
                                 "same Idempotency-Key.")

    def get_docs(self):
        s = self.server
        ttl = s.ttl_seconds
        wait = s.opts.wait_timeout
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
                             "operation" % payments.human_interval(ttl),
            "concurrent_wait_seconds": int(wait) if wait == int(wait)
                                       else wait,
            "responses": {
                "first use": "the operation's own response",
                "retry after completion": "the stored response (status, "
                                          "Content-Type, Location and "
                                          "body), with header "
                                          "Idempotent-Replayed: true",
                "retry while the first request is in progress":
                    ("waits up to %s for the first request, then as "
                     "above; 409 Conflict with Retry-After if it is still "
                     "running" % payments.human_interval(wait) if wait else
                     "409 Conflict with Retry-After; retry later"),
                "key reused with a different body": "422 Unprocessable "
                                                    "Content",
                "no, empty, malformed, too long, or repeated key":
                    "400 Bad Request",
                "503 Service Unavailable": "nothing was charged; retry "
                                           "with the same key",
                "500 Internal Server Error": "the charge may have been "
                                             "made and will be completed; "
                                             "retry with the same key to "
                                             "get its result",
            },
        }
        if "application/json" in self.headers.get("Accept", ""):
            return self.send(json_response(200, policy))
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
        self.send(Response(200, [("Content-Type", "text/html; charset=utf-8")],
                           page.encode("utf-8")))

    def get_charge(self, charge_id):
        account = self.account()
        if account is None:
            return self.send(json_response(400, {"error": "bad Account-Id"}))
        with self.server.work_pool.connection() as conn:
            row = conn.execute(
                "SELECT id, account_id, amount, currency, description, "
                "       created_at "
                "  FROM charges WHERE id = %s AND account_id = %s",
                (charge_id, account)).fetchone()
        if row is None:
            return self.send(json_response(404, {"error": "not found"}))
        self.send(json_response(200, payments.charge_json(row)))

    def post_charge(self):
        opts = self.server.opts
        body = self.read_body()
        if body is None:
            return self.send(json_response(
                413 if self.headers.get("Content-Length", "").isdigit()
                else 411,
                {"error": "the body must have a Content-Length of at most "
                          "%d bytes" % MAX_BODY_BYTES}))
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
            request = payments.parse_body(body)
        except payments.BadRequest as e:
            # Nothing claimed: the client fixes the body and retries with
            # the same key.
            return self.send_error_json(400, "invalid_request", str(e))

        hooks = opts.test_hooks
        delay_ms = int(self.headers.get("Test-Delay-Ms", "0") or 0) \
            if hooks else 0
        fail = self.headers.get("Test-Fail", "") if hooks else ""

        # The key's identity is (database role, scope, key); the draft's
        # security section asks for the client's key combined with what the
        # server knows about the client.
        scope = payments.scope_of(account)

        for _ in range(3):
            try:
                claim = self.claim(key, scope, request)
            except pgerrors.ProgramLimitExceeded:
                # 54000: the request, kept with the key for the recoverer,
                # is over idempotency.max_response_bytes; nothing claimed
                return self.send_error_json(
                    413, "request_too_large",
                    "The request is too large to be kept with its "
                    "Idempotency-Key.")
            if claim.status != "claimed":
                return self.answer(claim)
            try:
                return self.send(self.charge(claim, key, scope, request,
                                             delay_ms / 1000.0, fail))
            except payments.TakenOver:
                # Our lease lapsed and a retry or the recoverer holds the
                # key now (our INSERT rolled back): wait for its result
                # like any duplicate.
                self.log_error("key %r was taken over; waiting for its "
                               "new holder", key)
        return self.answer(Claim("in_progress", None, None, None))

    # ------------------------------------------------------------ phases

    def claim(self, key, scope, request):
        """
        Phase 1, one transaction: claim the key (waiting up to
        --wait-timeout for a request that holds it) with a lease, keeping
        the request for the recoverer; a new claim records the card network
        key it will use as its recovery point.  Returns a Claim.
        """
        s = self.server
        opts = s.opts
        try:
            with s.claim_pool.connection() as conn, conn.transaction():
                conn.execute(
                    "SELECT set_config('idempotency.wait_timeout', %s, true), "
                    "       set_config('lock_timeout', %s, true)",
                    ("%d" % round(opts.wait_timeout * 1000),
                     "%dms" % round(opts.lock_timeout * 1000)))
                status, token, recovery_point, code, headers, raw, body = \
                    conn.execute(
                        "SELECT status, token, recovery_point, "
                        "       response_code, response_headers, "
                        "       response_raw, response_body "
                        "  FROM idem_claim(%s, request => %s, scope => %s, "
                        "        ttl => make_interval(secs => %s), "
                        "        lease => make_interval(secs => %s), "
                        "        wait => true, keep_request => true)",
                        (key, Jsonb(request), scope, s.ttl_seconds,
                         opts.lease)).fetchone()
                if status == "completed":
                    return Claim(status, None, None, payments.stored_response(
                        code, headers, raw, body))
                if status != "claimed":
                    return Claim(status, None, None, None)
                # A key taken over (its holder died) has the card network
                # key its first holder used: the same charge, not a new one.
                provider_key = payments.provider_key_of(recovery_point) or \
                    payments.new_provider_key(conn, key, scope)
                return Claim(status, token, provider_key, None)
        except pgerrors.LockNotAvailable:
            # another request's claim or completion transaction stayed
            # open past --lock-timeout
            return Claim("in_progress", None, None, None)

    def charge(self, claim, key, scope, request, delay, fail):
        """
        Phase 2 (payments.make_charge), and what a failure in it means for
        the key: released if nothing was charged, else left in progress
        for the recoverer.  Returns the Response to send.
        """
        s = self.server
        try:
            return payments.make_charge(s.work_pool, s.network, key, scope,
                                        claim.token, claim.provider_key,
                                        request, delay, fail)
        except payments.CardNetworkUnavailable:
            # Certain that nothing was charged: give the key up, so that
            # the retry starts afresh (with the same card network key).
            payments.release(s.work_pool, key, scope, claim.token)
            return json_response(503, {"error": {
                "code": "card_network_unavailable",
                "message": "The card network is unavailable; nothing was "
                           "charged.  Retry with the same Idempotency-Key."}},
                [("Retry-After", "1")])
        except payments.TakenOver:
            raise
        except Exception as e:          # noqa: BLE001 -- answer, then log
            # The card network may have charged: the key stays in progress
            # and its lease lapses; then the recoverer (or the client's
            # retry) finishes the charge with the same card network key.
            self.log_error("charge %r left for the recoverer: %r", key, e)
            return json_response(500, {"error": {
                "code": "charge_pending",
                "message": "The charge may have been made; it will be "
                           "completed.  Retry with the same "
                           "Idempotency-Key to get its result."}})

    def answer(self, claim):
        """The response for a claim that is not ours to work on."""
        if claim.status == "completed":
            return self.send(claim.response, [("Idempotent-Replayed", "true")])
        if claim.status == "in_progress":
            return self.send_problem(
                409, "A request is outstanding for this Idempotency-Key",
                "A request with the same Idempotency-Key for the same "
                "operation is being processed.  Retry it later.",
                headers=[("Retry-After", "1")])
        if claim.status == "mismatch":
            return self.send_problem(
                422, "Idempotency-Key is already used",
                "This Idempotency-Key was used with a different request "
                "body.  A key must not be reused for a different request.")
        raise RuntimeError("unexpected idem_claim status %r" % claim.status)


def key_ttl(text):
    seconds = payments.positive_duration(text)
    if seconds != int(seconds):
        raise argparse.ArgumentTypeError("whole seconds only: %r" % text)
    return int(seconds)


def main():
    ap = argparse.ArgumentParser(
        description="Example payments API with Idempotency-Key support.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--dsn", default="",
                    help="libpq connection string (default: PG* environment)")
    ap.add_argument("--pool-size", type=int, default=8,
                    help="connections for claims, and as many for the "
                         "charges themselves (default 8 each)")
    ap.add_argument("--key-ttl", type=key_ttl, default=86400,
                    help="how long a key is kept (e.g. 24h; default 24h); "
                         "published at " + DOC_PATH)
    ap.add_argument("--lease", type=payments.positive_duration, default=30.0,
                    help="how long a charge may take before the recoverer "
                         "or a retry may take it over (default 30s)")
    ap.add_argument("--wait-timeout", type=payments.parse_duration,
                    default=10.0,
                    help="how long a request waits for a concurrent one "
                         "with its key before answering 409 (default 10s; "
                         "0: 409 at once, as the IETF draft asks)")
    ap.add_argument("--lock-timeout", type=payments.positive_duration,
                    default=5.0,
                    help="bound on waiting for another request's open "
                         "claim or completion transaction (default 5s)")
    ap.add_argument("--public-url", default="",
                    help="base URL used in problem types and Link headers")
    ap.add_argument("--test-hooks", action="store_true",
                    help="honour the Test-Delay-Ms and Test-Fail "
                         "(after-insert, card-network-down) request "
                         "headers (tests only)")
    ap.add_argument("--quiet", action="store_true", help="no access log")
    opts = ap.parse_args()
    if opts.lease > opts.key_ttl:
        ap.error("--lease must not be longer than --key-ttl")

    server = PaymentsServer((opts.host, opts.port), opts)
    # fail early, before serving, if the database is unusable
    with server.work_pool.connection() as conn:
        conn.execute("SELECT 'idem_claim'::regproc, 'charges'::regclass, "
                     "       'provider_charges'::regclass")
    sys.stderr.write("payments example listening on %s (keys kept %s, "
                     "lease %s, duplicates wait %s)\n"
                     % (server.public_url,
                        payments.human_interval(opts.key_ttl),
                        payments.human_interval(opts.lease),
                        payments.human_interval(opts.wait_timeout)))
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

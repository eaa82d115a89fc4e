"""
HTTP conventions shared by the framework adapters (asgi.py, django.py,
flask.py), after draft-ietf-httpapi-idempotency-key-header:

- the key is the Idempotency-Key field, an RFC 8941 String
  ("8e03978e-...") or a bare value of [A-Za-z0-9._~:-]; at most 255 bytes;
  missing (where required), empty, malformed, too long or repeated: 400;
- the scope is the authenticated caller + method + route, the fingerprint
  the method, path, query and body (a JSON body as JSON: key order and
  whitespace do not matter);
- same transaction: the claim, the handler's writes and the stored response
  commit together; the response is sent after COMMIT;
- in flight: 409 with Retry-After (or, with ``wait``, the duplicate waits
  and replays); fingerprint mismatch: 422; request body too large: 413;
  store unreachable: 503 (never "run anyway"); lock or statement timeout:
  409 or 503 (busy_status); deadlock or serialization failure: retried;
  response over idempotency.max_response_bytes: rolled back, 500 or 413
  (too_large_status);
- replays carry the stored status, the allowlisted headers (never
  Set-Cookie), the exact body bytes and Idempotent-Replayed: true;
- 5xx answers are not stored: the transaction rolls back by default;
- errors are RFC 9457 problem documents; the retention is advertised in
  them, in the policy document, and with a Link to the docs when set.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import (Any, Awaitable, Callable, Dict, FrozenSet, List,
                    Optional, Sequence, Tuple, Union)

from . import aio
from . import core
from ._protocol import RawJson, StoredResponse
from ._sql import AsyncRunner, Interval, Runner, interval_seconds
from .errors import (IdempotencyError, KeyInProgress, KeyMismatch,
                     RetryableConflict, StoreUnavailable, classify)

#: What a bare (unquoted) key may contain.
BARE_KEY = re.compile(r"[A-Za-z0-9._~:-]+")

#: Response headers replayed by default (compared case-insensitively).
DEFAULT_REPLAY_HEADERS: Tuple[str, ...] = (
    "Content-Type", "Content-Language", "Content-Disposition",
    "Content-Encoding", "Location", "ETag", "Last-Modified", "Link",
    "Cache-Control", "Expires", "Vary",
)
#: Never stored, whatever the allowlist says: Set-Cookie belongs to one
#: client; the hop-by-hop and framing fields are the server's to make.
NEVER_STORED: FrozenSet[str] = frozenset({
    "set-cookie", "set-cookie2", "content-length", "transfer-encoding",
    "connection", "keep-alive", "upgrade", "trailer", "te",
    "proxy-authenticate", "idempotent-replayed", "date", "server",
})

REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass
class Response:
    """A framework-neutral response."""
    status: int
    headers: List[Tuple[str, str]]
    body: bytes
    #: the framework's own response object, for a first (not replayed)
    #: answer that the adapter sends as the handler made it
    native: Any = None
    replayed: bool = False


@dataclass
class RequestInfo:
    """What the policy needs to know of a request."""
    method: str
    path: str
    route: str
    query: str
    caller: str
    content_type: str
    body: bytes
    native: Any = None


class BadKey(IdempotencyError):
    """The Idempotency-Key field is missing or malformed (400)."""
    http_status = 400
    problem = "bad-key"

    def __init__(self, problem: str, title: str, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem
        self.title = title


class BodyTooLarge(IdempotencyError):
    """The request body is over max_body_bytes (413)."""
    http_status = 413
    problem = "body-too-large"
    title = "The request body is too large"


def _parse_sf_string(raw: str) -> Tuple[Optional[str], str]:
    """An RFC 8941 sf-string at the start of RAW: (value, rest), or (None,
    rest) if RAW does not start with a valid one."""
    out = []
    i = 1
    while i < len(raw):
        c = raw[i]
        if c == "\\":
            i += 1
            if i >= len(raw) or raw[i] not in "\"\\":
                return None, ""
            out.append(raw[i])
        elif c == '"':
            return "".join(out), raw[i + 1:]
        elif " " <= c <= "~":
            out.append(c)
        else:
            return None, ""
        i += 1
    return None, ""


def parse_key(values: Sequence[str], max_bytes: int = 255,
              header: str = "Idempotency-Key") -> Optional[str]:
    """
    The key carried by the VALUES of the Idempotency-Key field (one per
    field line; servers that join repeated fields with commas are handled
    too); None when there is none.  Raises BadKey when it is empty,
    malformed, longer than MAX_BYTES or given more than once.
    """
    if not values:
        return None
    if len(values) > 1:
        raise _more_than_one(header)
    raw = values[0].strip(" \t")
    key: Optional[str]
    if raw.startswith('"'):
        key, rest = _parse_sf_string(raw)
        rest = rest.strip(" \t")
        if key is not None and rest.startswith(","):
            raise _more_than_one(header)
        if rest:
            key = None
    elif "," in raw:
        raise _more_than_one(header)
    elif BARE_KEY.fullmatch(raw):
        key = raw
    else:
        key = None
    if key is None:
        raise BadKey("malformed-key", "%s is malformed" % header,
                     "The %s must be a Structured Field String (RFC 8941) "
                     "of printable ASCII, such as "
                     "\"8e03978e-40d5-43e8-bc93-6894a57f9324\", or a bare "
                     "value of letters, digits and ._~:-." % header)
    if key == "":
        raise BadKey("empty-key", "%s is empty" % header,
                     "The %s must not be empty." % header)
    if len(key.encode("utf-8")) > max_bytes:
        raise BadKey("key-too-long", "%s is too long" % header,
                     "The %s must be at most %d bytes long."
                     % (header, max_bytes))
    return key


def _more_than_one(header: str) -> BadKey:
    return BadKey("repeated-key", "More than one %s" % header,
                  "A request must carry one %s header field." % header)


def _strict_json(body: bytes) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(name)
    return json.loads(body.decode("utf-8"), parse_constant=no_constant)


def default_fingerprint(info: RequestInfo) -> Any:
    """
    The request fingerprint: method, path, query and body.  A JSON body is
    kept as JSON (the extension compares canonical jsonb: key order,
    whitespace and a number's written scale do not matter); any other body
    by its SHA-256.
    """
    doc: Dict[str, Any] = {"method": info.method, "path": info.path,
                           "query": info.query}
    body: Any
    if info.body and "json" in info.content_type.lower():
        try:
            parsed = _strict_json(info.body)
            text = json.dumps(parsed, ensure_ascii=False, allow_nan=False)
            text.encode("utf-8")            # no lone surrogates
            if "\\u0000" not in text:
                body = parsed
            else:
                body = {"sha256": hashlib.sha256(info.body).hexdigest()}
        except (ValueError, UnicodeError, RecursionError):
            body = {"sha256": hashlib.sha256(info.body).hexdigest()}
    elif info.body:
        body = {"sha256": hashlib.sha256(info.body).hexdigest()}
    else:
        body = None
    doc["body"] = body
    return doc


def default_scope(info: RequestInfo) -> str:
    """caller + method + route; anonymous callers share "METHOD route".
    Longer than 255 bytes: its SHA-256."""
    if info.caller:
        scope = json.dumps([info.caller, info.method, info.route],
                           ensure_ascii=False, separators=(",", ":"))
    else:
        scope = "%s %s" % (info.method, info.route)
    if len(scope.encode("utf-8")) > 255:
        scope = "sha256:" + hashlib.sha256(scope.encode("utf-8")).hexdigest()
    return scope


@dataclass
class Options:
    """The policy of the HTTP adapters; every field is a keyword argument
    of the middleware or decorator."""
    #: request methods that take a key (others pass through)
    methods: FrozenSet[str] = frozenset({"POST", "PATCH"})
    #: (method, path) -> bool: which requests of those methods take a key
    applies: Optional[Callable[[str, str], bool]] = None
    #: a missing key is a 400 (False: such requests run without one)
    required: bool = True
    header: str = "Idempotency-Key"
    max_key_bytes: int = 255
    #: how long a key is kept: passed to every claim as its ttl, and
    #: advertised (policy document, problem documents)
    ttl: Interval = 86400
    #: None: a duplicate of a request in flight gets 409 at once; seconds:
    #: it waits that long (lock_timeout and idempotency.wait_timeout, SET
    #: LOCAL for the claim) and replays the outcome, then 409
    wait: Optional[float] = None
    retry_after: int = 1
    #: status for 55P03/57014 (a wait that ran out): 409 or 503
    busy_status: int = 409
    #: status for 54000 (response larger than max_response_bytes): 500 or 413
    too_large_status: int = 500
    max_body_bytes: int = 1024 * 1024
    #: 5xx answers: "rollback" (default: the transaction rolls back, the
    #: key stays unused), "release" (the handler's writes commit, the key
    #: is released) or "store" (stored and replayed like any answer)
    server_errors: str = "rollback"
    replay_headers: Sequence[str] = DEFAULT_REPLAY_HEADERS
    #: framework request -> the authenticated caller ("" for anonymous)
    caller: Optional[Callable[[Any], str]] = None
    #: RequestInfo -> scope text
    scope: Callable[[RequestInfo], str] = default_scope
    #: RequestInfo -> JSON value (None: no fingerprint check)
    fingerprint: Optional[Callable[[RequestInfo], Any]] = default_fingerprint
    #: where the idempotency policy is documented (Link, problem types)
    docs_url: Optional[str] = None
    #: serve the policy document (JSON) at this path (None: don't)
    policy_path: Optional[str] = None
    #: attempts of a request that hits a deadlock or serialization failure
    attempts: int = 3

    def __post_init__(self) -> None:
        self.methods = frozenset(m.upper() for m in self.methods)
        if self.busy_status not in (409, 503):
            raise ValueError("busy_status is 409 or 503")
        if self.too_large_status not in (500, 413):
            raise ValueError("too_large_status is 500 or 413")
        if self.server_errors not in ("rollback", "release", "store"):
            raise ValueError("server_errors is rollback, release or store")
        bad = [h for h in self.replay_headers if h.lower() in NEVER_STORED]
        if bad:
            raise ValueError("never replayed: %s" % ", ".join(bad))
        self._replay = frozenset(h.lower() for h in self.replay_headers)
        self.ttl_seconds = int(interval_seconds(self.ttl))


class Policy:
    """The HTTP side of the protocol, framework-neutral: checks, problem
    documents, replays, and the transaction around a handler (handle() and
    handle_async())."""

    def __init__(self, options: Optional[Options] = None, **kw: Any) -> None:
        self.options = options or Options(**kw)

    # ------------------------------------------------------------ checks

    def applies(self, method: str, path: str) -> bool:
        o = self.options
        if method.upper() not in o.methods:
            return False
        return o.applies(method.upper(), path) if o.applies else True

    def key_of(self, values: Sequence[str]) -> Optional[str]:
        """parse_key with the options; BadKey (400) when missing and
        required."""
        o = self.options
        key = parse_key(values, o.max_key_bytes, o.header)
        if key is None and o.required:
            raise BadKey("missing-key", "%s is missing" % o.header,
                         "This operation is idempotent and requires an %s "
                         "request header field." % o.header)
        return key

    def check_length(self, content_length: Optional[int]) -> None:
        if content_length is not None and \
                content_length > self.options.max_body_bytes:
            raise self.too_large_body()

    def too_large_body(self) -> BodyTooLarge:
        return BodyTooLarge("The request body must be at most %d bytes."
                            % self.options.max_body_bytes)

    # ------------------------------------------------------------ answers

    def problem_type(self, slug: str) -> str:
        if self.options.docs_url:
            return "%s#%s" % (self.options.docs_url, slug)
        return "tag:pg-idempotency,2026:%s" % slug

    def problem(self, status: int, slug: str, title: str, detail: str,
                headers: Sequence[Tuple[str, str]] = ()) -> Response:
        """An RFC 9457 problem document."""
        o = self.options
        doc = {"type": self.problem_type(slug), "title": title,
               "status": status, "detail": detail,
               "key_retention_seconds": o.ttl_seconds}
        hdrs = [("Content-Type", "application/problem+json"),
                ("Content-Language", "en")]
        if o.docs_url:
            hdrs.append(("Link", '<%s>; rel="describedby"' % o.docs_url))
        hdrs.extend(headers)
        body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        return Response(status, hdrs, body)

    def error_response(self, err: IdempotencyError) -> Response:
        o = self.options
        status = err.http_status or 500
        headers: List[Tuple[str, str]] = []
        detail = err.detail
        if status == 409 and err.problem == "busy":
            status = o.busy_status
        if err.problem == "response-too-large":
            status = o.too_large_status
            detail = ("The response was larger than the store takes "
                      "(idempotency.max_response_bytes). Nothing was done; "
                      "the request can be retried.")
        if isinstance(err, KeyInProgress) or err.problem == "busy":
            detail = ("A request with the same %s for the same operation "
                      "is being processed. Retry it later." % o.header)
        if isinstance(err, KeyMismatch):
            detail = ("This %s was used with a different request. A key "
                      "must not be reused for another request." % o.header)
        if isinstance(err, (StoreUnavailable, RetryableConflict)):
            detail = "The request was not processed; retry it later."
        if status in (409, 503):
            headers.append(("Retry-After", str(o.retry_after)))
        if status == 500:
            detail = "The request failed and changed nothing."
        return self.problem(status, err.problem, err.title, detail, headers)

    def policy_document(self) -> Dict[str, Any]:
        """The published policy: header, key format, scope, retention."""
        o = self.options
        return {
            "header": o.header,
            "methods": sorted(o.methods),
            "required": o.required,
            "key_format": ("RFC 8941 String of 1-%d bytes of printable "
                           "ASCII, or a bare value of [A-Za-z0-9._~:-]"
                           % o.max_key_bytes),
            "key_scope": "authenticated caller, method and route",
            "key_retention_seconds": o.ttl_seconds,
            "concurrent_duplicate": ("409 Conflict with Retry-After"
                                     if o.wait is None else
                                     "waits up to %g s for the first "
                                     "request, then 409" % o.wait),
            "replay_header": "%s: true" % REPLAYED_HEADER,
            "statuses": STATUS_TABLE,
        }

    def policy_response(self) -> Response:
        body = json.dumps(self.policy_document(), separators=(",", ":"))
        return Response(200, [("Content-Type", "application/json")],
                        body.encode("utf-8"))

    def replay(self, stored: StoredResponse) -> Response:
        headers = stored.header_items()
        if stored.raw is None and stored.body_text is not None and \
                not any(n.lower() == "content-type" for n, _ in headers):
            headers.append(("Content-Type", "application/json"))
        headers.append((REPLAYED_HEADER, "true"))
        return Response(stored.code, headers, stored.body_bytes(),
                        replayed=True)

    def stored_headers(self, headers: Sequence[Tuple[str, str]]
                       ) -> Optional[Dict[str, Union[str, List[str]]]]:
        out: Dict[str, Union[str, List[str]]] = {}
        names: Dict[str, str] = {}
        for name, value in headers:
            low = name.lower()
            if low in NEVER_STORED or low not in self.options._replay or \
                    "\r" in value or "\n" in value:
                continue
            first = names.setdefault(low, name)
            if first in out:
                prev = out[first]
                out[first] = (prev if isinstance(prev, list) else [prev]) + [value]
            else:
                out[first] = value
        return out or None

    # ------------------------------------------------------------ flow

    def scope_and_request(self, info: RequestInfo) -> Tuple[str, Any]:
        o = self.options
        fp = o.fingerprint(info) if o.fingerprint else None
        if fp is not None and not isinstance(fp, RawJson):
            fp = RawJson(json.dumps(fp, ensure_ascii=False, allow_nan=False,
                                    separators=(",", ":")))
        return o.scope(info), fp

    def _wait(self) -> core.Wait:
        return self.options.wait if self.options.wait is not None else False

    def handle(self, runner: Runner, info: RequestInfo, key: str,
               call: Callable[[], Response]) -> Response:
        """
        Run CALL (the handler) for a request with KEY in a transaction on
        RUNNER with the claim and the completion; return the response to
        send (after the commit), a replay, or a problem document.
        """
        scope, request = self.scope_and_request(info)
        outermost = not runner.in_transaction()
        attempt = 0
        while True:
            attempt += 1
            try:
                with runner.transaction():
                    return self._once(runner, key, scope, request, call)
            except _RolledBack as r:
                return r.response
            except Exception as e:  # noqa: BLE001 -- answered or re-raised
                mapped = classify(e)
                if isinstance(mapped, RetryableConflict) and outermost and \
                        attempt < self.options.attempts:
                    continue
                if mapped is None or not mapped.http_status:
                    raise
                return self.error_response(mapped)

    def _once(self, runner: Runner, key: str, scope: str, request: Any,
              call: Callable[[], Response]) -> Response:
        o = self.options
        result = core.claim(runner, key, request, scope=scope, ttl=o.ttl,
                            wait=self._wait())
        early = self._early(result)
        if early is not None:
            return early
        resp = call()
        return self._finish_sync(runner, key, scope, resp)

    def _early(self, result: Any) -> Optional[Response]:
        if result.status == "completed":
            return self.replay(result.response)
        if result.status == "in_progress":
            return self.error_response(KeyInProgress())
        if result.status == "mismatch":
            return self.error_response(KeyMismatch())
        return None

    def _finish_sync(self, runner: Runner, key: str, scope: str,
                     resp: Response) -> Response:
        o = self.options
        if resp.status >= 500 and o.server_errors != "store":
            if o.server_errors == "rollback":
                raise _RolledBack(resp)
            core.release(runner, key, scope=scope)
            return resp
        core.complete(runner, key, resp.status, None, scope=scope,
                      headers=self.stored_headers(resp.headers),
                      raw=resp.body)
        return resp

    async def handle_async(self, runner: AsyncRunner, info: RequestInfo,
                           key: str, call: Callable[[], Awaitable[Response]]
                           ) -> Response:
        """As handle(), for asyncio (psycopg.AsyncConnection)."""
        o = self.options
        scope, request = self.scope_and_request(info)
        outermost = not runner.in_transaction()
        attempt = 0
        while True:
            attempt += 1
            try:
                async with runner.transaction():
                    result = await aio.claim(runner, key, request,
                                             scope=scope, ttl=o.ttl,
                                             wait=self._wait())
                    early = self._early(result)
                    if early is not None:
                        return early
                    resp = await call()
                    if resp.status >= 500 and o.server_errors != "store":
                        if o.server_errors == "rollback":
                            raise _RolledBack(resp)
                        await aio.release(runner, key, scope=scope)
                        return resp
                    await aio.complete(
                        runner, key, resp.status, None, scope=scope,
                        headers=self.stored_headers(resp.headers),
                        raw=resp.body)
                    return resp
            except _RolledBack as r:
                return r.response
            except Exception as e:  # noqa: BLE001 -- answered or re-raised
                mapped = classify(e)
                if isinstance(mapped, RetryableConflict) and outermost and \
                        attempt < o.attempts:
                    continue
                if mapped is None or not mapped.http_status:
                    raise
                return self.error_response(mapped)


class _RolledBack(Exception):
    """Raised inside the transaction to roll it back and send RESPONSE."""

    def __init__(self, response: Response) -> None:
        super().__init__("rolled back")
        self.response = response


#: The status codes the adapters answer with (README's table).
STATUS_TABLE: Dict[str, str] = {
    "first request": "the handler's answer (stored with the business write "
                     "in one transaction)",
    "retry after completion": "the stored status, allowlisted headers and "
                              "body bytes, with Idempotent-Replayed: true",
    "no key (where required), empty, malformed, too long or repeated": "400",
    "duplicate while the first request is in flight": "409 with Retry-After "
                                                      "(or wait, then replay)",
    "lock_timeout or statement_timeout (55P03, 57014)": "409 or 503 "
                                                        "(busy_status)",
    "key reused with a different request": "422",
    "request body over max_body_bytes": "413",
    "response over idempotency.max_response_bytes (54000)":
        "500 or 413 (too_large_status); rolled back",
    "deadlock or serialization failure (40P01, 40001)":
        "retried; 503 when the attempts run out",
    "database unreachable": "503 with Retry-After",
    "5xx from the handler": "rolled back, not stored (server_errors)",
}

"""
HTTP conventions shared by the framework adapters (asgi.py, django.py,
flask.py), as clients/http-behaviour.md lays them down for both client
libraries, after draft-ietf-httpapi-idempotency-key-header:

- the key is the Idempotency-Key field, an RFC 8941 String
  ("8e03978e-...") or a bare value of [A-Za-z0-9._~:-]; at most 255 bytes;
  missing (where required), empty, malformed, too long or repeated: 400;
- the scope is the authenticated caller + method + route; a request whose
  caller cannot be established is refused (500 no-caller) unless
  anonymous requests are allowed (anonymous=True: they share the scope
  "METHOD route");
- the fingerprint is the method, path, query and body (a JSON body as
  JSON: key order and whitespace do not matter; fingerprint_fields selects
  some of its fields);
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
import logging
import re
from dataclasses import dataclass
from typing import (Any, Awaitable, Callable, Dict, FrozenSet, List,
                    Optional, Sequence, Tuple, Union)

from . import aio
from . import core
from ._protocol import RawJson, StoredResponse
from ._sql import AsyncRunner, Interval, Runner, interval_seconds
from .errors import (ConfigurationError, IdempotencyError, KeyInProgress,
                     KeyExpired, KeyMismatch, NoCaller, RetryableConflict,
                     StoreUnavailable, classify)

#: where the adapters log what makes them answer 500 (no-caller,
#: misconfigured): the client is told only that nothing was done
log = logging.getLogger("pg_idempotency")

#: the problem types' base when no docs_url is set (RFC 9457 allows a URI
#: that is not dereferenceable; a tag URI never points at a missing page)
PROBLEM_TAG = "tag:pg-idempotency,2026:"

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
    #: the request's header fields, (name, value) pairs as received
    headers: Sequence[Tuple[str, str]] = ()

    def header(self, name: str) -> Optional[str]:
        """The value of the header field NAME (case-insensitive), or None."""
        low = name.lower()
        for k, v in self.headers:
            if k.lower() == low:
                return v
        return None

    def json(self) -> Any:
        """The body parsed as JSON (ValueError if it is not)."""
        return _strict_json(self.body)


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
    return check_key_text(key, max_bytes, header)


def _more_than_one(header: str) -> BadKey:
    return BadKey("multiple-keys", "More than one %s" % header,
                  "A request must carry one %s header field." % header)


def check_key_text(key: str, max_bytes: int = 255,
                   header: str = "Idempotency-Key") -> str:
    """KEY if it is not empty and at most MAX_BYTES long; else BadKey."""
    if key == "":
        raise BadKey("empty-key", "%s is empty" % header,
                     "The %s must not be empty." % header)
    if len(key.encode("utf-8")) > max_bytes:
        raise BadKey("key-too-long", "%s is too long" % header,
                     "The %s must be at most %d bytes long."
                     % (header, max_bytes))
    return key


def _strict_json(body: bytes) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(name)
    return json.loads(body.decode("utf-8"), parse_constant=no_constant)


_NO_JSON = object()


def _sha256(data: bytes) -> Dict[str, str]:
    return {"sha256": hashlib.sha256(data).hexdigest()}


def _json_body(info: RequestInfo) -> Any:
    """The body as JSON the store can keep, or _NO_JSON."""
    if not info.body or "json" not in info.content_type.lower():
        return _NO_JSON
    try:
        parsed = _strict_json(info.body)
        text = json.dumps(parsed, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")            # no lone surrogates
    except (ValueError, UnicodeError, RecursionError):
        return _NO_JSON
    return _NO_JSON if "\\u0000" in text else parsed


def _select(value: Any, path: str) -> Any:
    """One dotted path ("card.last4", "items.0.sku") of a JSON value; None
    when absent."""
    v = value
    for seg in path.split("."):
        if isinstance(v, list) and seg.isdigit() and int(seg) < len(v):
            v = v[int(seg)]
        elif isinstance(v, dict) and seg in v:
            v = v[seg]
        else:
            return None
    return v


def fingerprint_of(info: RequestInfo,
                   fields: Optional[Sequence[str]] = None) -> Any:
    """
    The request fingerprint: method, path, query and body.  A JSON body is
    kept as JSON (the extension compares canonical jsonb: key order and
    whitespace do not matter), or only its FIELDS (dotted paths) when given
    and the body is a JSON object; any other body by its SHA-256; no body
    as None.
    """
    parsed = _json_body(info)
    body: Any
    if parsed is not _NO_JSON:
        body = parsed
        if fields is not None and isinstance(parsed, dict):
            body = {f: _select(parsed, f) for f in fields}
    elif info.body:
        body = _sha256(info.body)
    else:
        body = None
    return {"method": info.method, "path": info.path, "query": info.query,
            "body": body}


def default_fingerprint(info: RequestInfo) -> Any:
    """fingerprint_of(info): the method, path, query and whole body."""
    return fingerprint_of(info)


def default_scope(info: RequestInfo) -> str:
    """caller + method + route as JSON; "METHOD route" when there is no
    caller (anonymous requests, where they are allowed).  Longer than 255
    bytes: its SHA-256."""
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
    #: the server's idempotency.key_memory, advertised (policy document,
    #: the 410 expired answer); None: not said
    key_memory: Optional[Interval] = None
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
    #: framework request -> the authenticated caller (None or "": none)
    caller: Optional[Callable[[Any], Optional[str]]] = None
    #: False (default): a request whose caller cannot be established is
    #: refused (500 no-caller); True: it is anonymous, and anonymous
    #: requests share the keys of a route (for APIs without authentication)
    anonymous: bool = False
    #: RequestInfo -> scope text (None or "": refused as no-caller unless
    #: anonymous); default: caller + method + route
    scope: Callable[[RequestInfo], Optional[str]] = default_scope
    #: RequestInfo -> JSON value (None: no fingerprint check)
    fingerprint: Optional[Callable[[RequestInfo], Any]] = default_fingerprint
    #: dotted paths of the JSON body's fields the fingerprint keeps (with
    #: the method, path and query) instead of the whole body
    fingerprint_fields: Optional[Sequence[str]] = None
    #: RequestInfo -> the key (None: missing), instead of the header field
    key: Optional[Callable[[RequestInfo], Optional[str]]] = None
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
        self.key_memory_seconds = (None if self.key_memory is None
                                   else int(interval_seconds(self.key_memory)))
        if self.wait is not None:
            self.wait = interval_seconds(self.wait)
        if self.fingerprint_fields is not None:
            if isinstance(self.fingerprint_fields, str):
                raise ValueError("fingerprint_fields is a list of dotted paths")
            if self.fingerprint is not default_fingerprint:
                raise ValueError("give fingerprint or fingerprint_fields, "
                                 "not both")
            self.fingerprint_fields = tuple(self.fingerprint_fields)


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
            raise self._missing()
        return key

    def _missing(self) -> BadKey:
        o = self.options
        return BadKey("missing-key", "%s is missing" % o.header,
                      "This operation is idempotent and requires an %s "
                      "request header field." % o.header)

    def scope_for(self, info: RequestInfo) -> Optional[str]:
        """The key's scope, or None when no caller can be established and
        anonymous requests are not allowed."""
        o = self.options
        if o.scope is default_scope:
            if not info.caller and not o.anonymous:
                return None
            return default_scope(info)
        s = o.scope(info)
        if s is None or s == "":
            return "" if o.anonymous else None
        s = str(s)
        if len(s.encode("utf-8")) > 255:
            s = "sha256:" + hashlib.sha256(s.encode("utf-8")).hexdigest()
        return s

    def request_of(self, info: RequestInfo) -> Any:
        """The fingerprint to claim with (RawJson), or None."""
        o = self.options
        if o.fingerprint_fields is not None:
            fp = fingerprint_of(info, o.fingerprint_fields)
        else:
            fp = o.fingerprint(info) if o.fingerprint else None
        if fp is None or isinstance(fp, RawJson):
            return fp
        text = json.dumps(fp, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))
        if "\\u0000" in text:         # not storable as jsonb: its digest
            text = json.dumps(_sha256(text.encode("utf-8")))
        return RawJson(text)

    def prepare(self, info: RequestInfo, key: Optional[str]
                ) -> Tuple[Optional[str], str, Any]:
        """(key, scope, fingerprint) of a request whose header gave KEY
        (or whose key option selects it from INFO).  Raises BadKey (400)
        and NoCaller (500); key None: the request runs without one."""
        o = self.options
        if o.key is not None:
            raw = o.key(info)
            if raw is None:
                if o.required:
                    raise self._missing()
                return None, "", None
            key = check_key_text(str(raw), o.max_key_bytes, o.header)
        if key is None:
            return None, "", None
        scope = self.scope_for(info)
        if scope is None:
            raise NoCaller(
                "no caller for %s %s: the caller option (default: the "
                "framework's authenticated user) found none. Put the "
                "authentication before the idempotency middleware, or set "
                "caller= to what identifies the client; only an API without "
                "authentication sets anonymous=True." % (info.method,
                                                         info.path))
        return key, scope, self.request_of(info)

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
        return PROBLEM_TAG + slug

    def problem(self, status: int, slug: str, title: str, detail: str,
                headers: Sequence[Tuple[str, str]] = ()) -> Response:
        """An RFC 9457 problem document; 409 and 503 carry Retry-After."""
        o = self.options
        doc = {"type": self.problem_type(slug), "title": title,
               "status": status, "detail": detail,
               "key_retention_seconds": o.ttl_seconds}
        if slug == "expired":
            doc["key_memory_seconds"] = o.key_memory_seconds
        hdrs = [("Content-Type", "application/problem+json"),
                ("Content-Language", "en")]
        if o.docs_url:
            hdrs.append(("Link", '<%s>; rel="describedby"' % o.docs_url))
        if status in (409, 503):
            hdrs.append(("Retry-After", str(o.retry_after)))
        hdrs.extend(headers)
        body = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        return Response(status, hdrs, body)

    def error_response(self, err: IdempotencyError) -> Response:
        o = self.options
        status = err.http_status or 500
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
        if isinstance(err, KeyExpired):
            detail = ("This %s was used for a request whose response is no "
                      "longer kept. The request was not processed again; "
                      "send a new request with a new key." % o.header)
        if isinstance(err, (StoreUnavailable, RetryableConflict)):
            detail = "The request was not processed; retry it later."
        if err.problem == "taken-over":
            detail = ("This request took longer than its lease and another "
                      "request for the same %s took it over." % o.header)
        if status == 500:
            detail = "The request failed and changed nothing."
        if isinstance(err, NoCaller):
            log.error("pg_idempotency: %s", err.detail)
            detail = ("This server scopes each %s by the authenticated "
                      "caller and could not establish one for this "
                      "request; nothing was done." % o.header)
        elif isinstance(err, ConfigurationError):
            log.error("pg_idempotency: %s", err.detail)
            detail = ("The server cannot process this request as it is set "
                      "up; nothing was done.")
        return self.problem(status, err.problem, err.title, detail)

    def policy_document(self) -> Dict[str, Any]:
        """The published policy: the same document as the Node.js
        adapters'."""
        o = self.options
        if o.fingerprint_fields is not None:
            fingerprint = ("the method, path, query and the body's %s"
                           % ", ".join(o.fingerprint_fields))
        elif o.fingerprint is default_fingerprint:
            fingerprint = "the method, path, query and body"
        else:
            fingerprint = "set by the application"
        wait = None if o.wait is None else float(o.wait)
        if wait is not None and wait.is_integer():
            wait = int(wait)
        return {
            "header": o.header,
            "methods": sorted(o.methods),
            "required": o.required,
            "key_format": ("set by the application" if o.key is not None
                           else "an RFC 8941 String of 1-%d bytes of "
                           "printable ASCII, or a bare value of "
                           "[A-Za-z0-9._~:-]" % o.max_key_bytes),
            "max_key_bytes": o.max_key_bytes,
            "key_scope": ("the authenticated caller, the method and the "
                          "route" if o.scope is default_scope
                          else "set by the application"),
            "anonymous": o.anonymous,
            "fingerprint": fingerprint,
            "key_retention_seconds": o.ttl_seconds,
            "key_memory_seconds": o.key_memory_seconds,
            "expired_key": "410 expired",
            "concurrent_duplicate": ("409 with Retry-After" if wait is None
                                     else "waits up to %s s for the first "
                                     "request, then %d" % (wait,
                                                           o.busy_status)),
            "wait_seconds": wait,
            "replay_header": "%s: true" % REPLAYED_HEADER,
            "replayed_headers": sorted(o._replay),
            "server_errors": o.server_errors,
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

    def _wait(self) -> core.Wait:
        return self.options.wait if self.options.wait is not None else False

    def handle(self, runner: Runner, key: str, scope: str, request: Any,
               call: Callable[[], Response]) -> Response:
        """
        Run CALL (the handler) for a request with KEY (SCOPE and REQUEST,
        the fingerprint, as prepare() made them) in a transaction on
        RUNNER with the claim and the completion; return the response to
        send (after the commit), a replay, or a problem document.
        """
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
        if result.status == "expired":
            return self.error_response(KeyExpired())
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

    async def handle_async(self, runner: AsyncRunner, key: str, scope: str,
                           request: Any,
                           call: Callable[[], Awaitable[Response]]
                           ) -> Response:
        """As handle(), for asyncio (psycopg.AsyncConnection)."""
        o = self.options
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

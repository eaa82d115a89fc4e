"""
ASGI middleware (Starlette, FastAPI, any ASGI app) on psycopg 3's
AsyncConnection:

    app.add_middleware(IdempotencyMiddleware, conninfo="dbname=shop")
    app.add_middleware(AuthenticationMiddleware, backend=...)  # runs first

    @app.post("/orders")
    async def create(request: Request):
        await connection(request).execute("INSERT INTO orders ...")
        return {"ok": True}

For each request that takes a key, the middleware reads the body, takes a
connection, opens a transaction, claims the key and runs the app inside
it; the handler's SQL on connection(request) is part of that transaction,
and the response is stored with it and sent after COMMIT (so the response
is buffered).

What would break that contract is refused, never run:

- a handler that is not ``async def`` (FastAPI and Starlette run it in a
  thread, where the connection's calls are coroutines nobody awaits): a
  route the middleware applies to whose endpoint is synchronous (the
  app's own, a mounted app's, an included router's) is a
  ConfigurationError when the middleware stack is built (at start-up);
  connection(request) called outside the event loop raises it too;
- a database call the handler does not await (``connection(request)
  .execute(...)`` without ``await``: the write never happens): the
  transaction rolls back and the answer is 500 (misconfigured);
- Starlette's AuthenticationMiddleware inside this one (added before it:
  Starlette runs the last added first; or the middleware of a mount, a
  route or a router whose routes this one applies to), which would leave
  every request without its caller: a ConfigurationError at start-up; a
  request whose caller cannot be established is refused with 500
  (no-caller) unless ``anonymous=True``.

The routes are those the framework answers with: Starlette's and older
FastAPI's route lists, and FastAPI's effective routes (its included
routers, prefixes and all) where it keeps an included router as one entry
of the list (fastapi.routing.iter_route_contexts).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import sys
from typing import (TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable,
                    Dict, List, Optional, Tuple, Union)

from ._protocol import Tenant
from ._sql import AsyncPsycopgRunner
from .errors import ConfigurationError, IdempotencyError, classify
from .http import Options, Policy, RequestInfo, Response

Scope = Dict[str, Any]
Receive = Callable[[], Awaitable[Dict[str, Any]]]
Send = Callable[[Dict[str, Any]], Awaitable[None]]

if TYPE_CHECKING:
    from .webhooks import WebhookEvent

_STATE_KEY = "pg_idempotency"
log = logging.getLogger("pg_idempotency")


class _Tracked:
    """
    A connection (or cursor) as the handler sees it: every call that
    returns a coroutine is remembered, so that the middleware can tell,
    once the handler answered, whether one was never awaited (a database
    call that never happened).  Attributes and other calls pass through;
    a cursor it returns is tracked too.
    """

    __slots__ = ("__wrapped__", "_pending")

    def __init__(self, target: Any, pending: List[Any]) -> None:
        object.__setattr__(self, "__wrapped__", target)
        object.__setattr__(self, "_pending", pending)

    @property  # type: ignore[misc]
    def __class__(self) -> Any:         # isinstance() sees the connection
        return type(self.__wrapped__)

    def _wrap(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            pending = self._pending
            if len(pending) >= 64:
                pending[:] = [c for c in pending
                              if inspect.getcoroutinestate(c) ==
                              inspect.CORO_CREATED]
            pending.append(value)
            return value
        if value is not self.__wrapped__ and hasattr(value, "execute") and \
                hasattr(value, "fetchone"):
            return _Tracked(value, self._pending)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.__wrapped__, name)
        if not callable(attr) or name.startswith("__"):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._wrap(attr(*args, **kwargs))
        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__wrapped__, name, value)

    async def __aenter__(self) -> Any:
        got = await self.__wrapped__.__aenter__()
        return self if got is self.__wrapped__ else got

    async def __aexit__(self, *exc: Any) -> Any:
        return await self.__wrapped__.__aexit__(*exc)

    def __aiter__(self) -> Any:
        return self.__wrapped__.__aiter__()

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def _dropped(pending: List[Any]) -> List[str]:
    """The names of the tracked coroutines that were never awaited (and
    closes them, so that Python does not warn about them again)."""
    names = []
    for coro in pending:
        if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
            names.append(getattr(coro, "__qualname__", repr(coro)))
            coro.close()
    pending.clear()
    return names


class RequestContext:
    """What the handler gets: the connection in its transaction, the key
    and its scope."""

    def __init__(self, connection: Any, key: str, scope: str = "") -> None:
        self._pending: List[Any] = []
        self.connection = _Tracked(connection, self._pending)
        self.key = key
        self.scope = scope


def context(request_or_scope: Any) -> Optional[RequestContext]:
    """The RequestContext of a request (a Starlette/FastAPI Request or an
    ASGI scope), or None when the request runs without a key."""
    scope = getattr(request_or_scope, "scope", request_or_scope)
    ctx = scope.get(_STATE_KEY)
    if ctx is None:
        ctx = (scope.get("state") or {}).get(_STATE_KEY)
    return ctx if isinstance(ctx, RequestContext) else None


def connection(request_or_scope: Any) -> Any:
    """The psycopg AsyncConnection whose transaction holds the request's
    claim: run the business write on it, and await every call.
    LookupError when the request runs without a key; ConfigurationError
    when called outside the event loop (from a handler that is not
    ``async def``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigurationError(
            "connection(request) was called outside the event loop: a "
            "handler that is not `async def` runs in a thread, where the "
            "connection's calls are coroutines nobody awaits. Declare it "
            "`async def` and await its database calls.") from None
    ctx = context(request_or_scope)
    if ctx is None:
        raise LookupError("this request runs without an Idempotency-Key "
                          "(no transaction of pg_idempotency)")
    return ctx.connection


def caller_from_scope(scope: Scope) -> str:
    """The default caller: an authenticated scope["user"] (Starlette's
    AuthenticationMiddleware) by its identity, else "" (none)."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return ""
    for attr in ("identity", "display_name"):
        try:
            ident = getattr(user, attr, None)
        except NotImplementedError:     # Starlette's BaseUser.identity
            ident = None
        if ident:
            return str(ident)
    return ""


def route_of(scope: Scope) -> str:
    """The route template (Starlette/FastAPI: "/orders/{id}") that will
    handle the request, or its path when none is known."""
    app = scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", None)
    if routes:
        found = _match(routes, dict(scope), "")
        if found:
            return found
    return str(scope.get("path", ""))


def _effective_routes(routes: Any) -> List[Tuple[Any, Any]]:
    """
    ROUTES as they answer requests, as (route, original) pairs.  Starlette
    keeps every route in the router's list, and so does FastAPI 0.92
    (Debian 12's), an included router's copied in with its prefix.  FastAPI
    0.162 (Debian sid's) keeps an included router as one entry (its routes
    are not copied, and have no path of their own there) and lists its
    routes, prefix included, with
    fastapi.routing.iter_route_contexts (what its OpenAPI schema reads):
    each context has the route's path, methods and endpoint, answers
    matches(), and names the route it stands for as original_route.
    """
    routes = list(routes or ())
    contexts = _iter_route_contexts()
    if contexts is None:
        return [(r, r) for r in routes]
    return [(c, getattr(c, "original_route", c)) for c in contexts(routes)]


def _iter_route_contexts() -> Any:
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        return None
    return iter_route_contexts


def _match(routes: Any, scope: Scope, prefix: str) -> Optional[str]:
    try:
        from starlette.routing import Match
    except ImportError:                     # pragma: no cover
        return None
    for route, _ in _effective_routes(routes):
        try:
            match, child = route.matches(scope)
        except Exception:  # noqa: BLE001 -- a route we cannot ask
            continue
        if match != Match.FULL:
            continue
        sub = getattr(route, "routes", None)
        path = getattr(route, "path", "") or ""
        if sub:
            inner = dict(scope)
            inner.update(child)
            found = _match(sub, inner, prefix + path)
            return found if found else prefix + path
        return prefix + path
    return None


# ---------------------------------------------------------------- start-up

# what the frameworks use to tell a coroutine function (and so whether
# they run a handler in a thread): inspect's from Python 3.13 on (asyncio's
# is deprecated there), asyncio's before
if sys.version_info >= (3, 13):
    _iscoroutinefunction = inspect.iscoroutinefunction
else:
    _iscoroutinefunction = asyncio.iscoroutinefunction


def _is_async(fn: Any) -> bool:
    """As Starlette's request_response() and FastAPI decide whether to run
    a handler on the event loop or in a thread."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return _iscoroutinefunction(fn) or (
        callable(fn) and _iscoroutinefunction(getattr(fn, "__call__", None)))


def _auth_middleware() -> Any:
    try:
        from starlette.middleware.authentication import \
            AuthenticationMiddleware
    except ImportError:                     # pragma: no cover
        return None
    return AuthenticationMiddleware


def _router_class() -> Any:
    try:
        from starlette.routing import Router
    except ImportError:                     # pragma: no cover
        return None
    return Router


def _has_auth_middleware(node: Any) -> bool:
    """
    Whether Starlette's AuthenticationMiddleware (or a subclass) wraps the
    ASGI app NODE: anywhere along the chain of middleware from NODE down to
    what ends it (a router, a route's handler), including the middleware a
    Starlette app lists (user_middleware, a mounted app's, whose stack is
    built when it is first called) and a router's own (Router(middleware=)
    and Route(middleware=): Starlette 1.9 has them, 0.26 has not).
    """
    auth = _auth_middleware()
    router_cls = _router_class()
    if auth is None:
        return False
    for _ in range(64):
        if node is None:
            return False
        if isinstance(node, auth):
            return True
        for m in getattr(node, "user_middleware", None) or ():
            cls = getattr(m, "cls", None)
            if inspect.isclass(cls) and issubclass(cls, auth):
                return True
        if router_cls is not None and isinstance(node, router_cls):
            # its middleware, if any, wrap its own app() method
            stack = getattr(node, "middleware_stack", None)
            if stack is None or inspect.ismethod(stack):
                return False
            node = stack
            continue
        node = getattr(node, "app", None)
        if inspect.isroutine(node):
            return False
    return False


def _route_problems(routes: Any, policy: Policy, prefix: str = ""
                    ) -> Tuple[List[str], List[str], int]:
    """
    What the routes (of a Starlette or FastAPI router, mounts and included
    routers included) the policy applies to would break: those whose
    endpoint for such a method is synchronous, and those (routes or
    mounts) that run Starlette's AuthenticationMiddleware themselves, inside
    this middleware; and how many endpoints the policy applies to.
    """
    sync: List[str] = []
    auth: List[str] = []
    applied = 0
    for route, original in _effective_routes(routes):
        if "WebSocket" in type(original).__name__:
            continue
        path = prefix + str(getattr(route, "path", "") or "")
        endpoint = getattr(route, "endpoint", None)
        sub = getattr(route, "routes", None)
        if sub and endpoint is None:
            s, a, n = _route_problems(sub, policy, path)
            sync.extend(s)
            auth.extend(a)
            applied += n
            if n and _has_auth_middleware(getattr(route, "app", None)):
                auth.append("the mount %s" % (path or "/"))
            continue
        if endpoint is None:
            # a mount of an app whose routes are not known (any ASGI app):
            # its authentication would run inside this middleware for every
            # request it applies to there
            if "Mount" in type(original).__name__ and \
                    any(policy.applies(m.upper(), path)
                        for m in policy.options.methods) and \
                    _has_auth_middleware(getattr(route, "app", None)):
                auth.append("the mount %s" % (path or "/"))
            continue
        methods = getattr(route, "methods", None) or policy.options.methods
        methods = sorted({m.upper() for m in methods
                          if policy.applies(m.upper(), path)})
        if not methods:
            continue
        applied += 1
        if _has_auth_middleware(getattr(route, "app", None)):
            auth.append("the route %s %s" % ("/".join(methods), path))
        for method in methods:
            fn = endpoint
            if inspect.isclass(endpoint):       # Starlette's HTTPEndpoint
                fn = getattr(endpoint, method.lower(), None)
                if fn is None:
                    continue
            elif not (inspect.isfunction(endpoint) or
                      inspect.ismethod(endpoint) or
                      isinstance(endpoint, functools.partial)):
                continue                        # an ASGI app of its own
            if not _is_async(fn):
                sync.append("%s %s (%s)" % (
                    method, path, getattr(fn, "__qualname__", repr(fn))))
    return sync, auth, applied


_AUTH_ORDER = (
    "Add IdempotencyMiddleware first and AuthenticationMiddleware after it "
    "(Starlette runs the last added first), and not on a route, a mount or "
    "a router of the app.")


def check_app(app: Any, policy: Policy) -> None:
    """
    Refuse (ConfigurationError) an app the middleware cannot keep its
    contract in: Starlette's AuthenticationMiddleware inside it (it would
    run after it, and every request would be without its caller: added
    before it, or on a router, mount or route the middleware applies to),
    or a route it applies to whose endpoint is not ``async def``.  APP is
    what the middleware wraps: the rest of the middleware stack and the
    router.
    """
    auth = _auth_middleware()
    router_cls = _router_class()
    node = app
    routes = None
    for _ in range(64):
        if node is None or inspect.isroutine(node):
            break
        if auth is not None and isinstance(node, auth):
            raise ConfigurationError(
                "AuthenticationMiddleware runs after IdempotencyMiddleware, "
                "so no request has its caller when its key is claimed. " +
                _AUTH_ORDER)
        if router_cls is not None and isinstance(node, router_cls):
            if _has_auth_middleware(node):
                raise ConfigurationError(
                    "AuthenticationMiddleware is a middleware of the router, "
                    "inside IdempotencyMiddleware, so no request has its "
                    "caller when its key is claimed. " + _AUTH_ORDER)
            routes = node.routes
            break
        router = getattr(node, "router", None)
        if router is not None and getattr(router, "routes", None) is not None:
            node = router
            continue
        if getattr(node, "routes", None) is not None and \
                not hasattr(node, "app"):
            routes = node.routes            # a router of another kind
            break
        if not hasattr(node, "app"):
            # an ASGI app object without routes, or a middleware that keeps
            # the app it wraps where this does not look: nothing is checked
            log.warning(
                "pg_idempotency: IdempotencyMiddleware cannot see the routes "
                "of the app through %r: the start-up checks of its handlers "
                "and of the authentication middleware below it did not run",
                type(node).__qualname__)
            break
        node = node.app
    if routes is None:
        return
    sync, inner_auth, _ = _route_problems(routes, policy)
    if inner_auth:
        raise ConfigurationError(
            "AuthenticationMiddleware runs inside IdempotencyMiddleware "
            "on %s, so no request there has its caller when its key is "
            "claimed. %s"
            % (", ".join(inner_auth), _AUTH_ORDER))
    if sync:
        raise ConfigurationError(
            "IdempotencyMiddleware applies to routes whose handler is not "
            "`async def`: %s. FastAPI and Starlette run such a handler in a "
            "thread, where connection(request) cannot be awaited; declare "
            "it `async def` (or leave the route out with methods= or "
            "applies=)." % ", ".join(sync))


class IdempotencyMiddleware:
    """
    ASGI middleware.  Connections come from POOL (anything whose
    ``connection()`` is an async context manager yielding a
    psycopg.AsyncConnection, such as psycopg_pool.AsyncConnectionPool), or
    CONNECT (an async callable returning one, closed after the request), or
    CONNINFO (a libpq connection string; a connection per request).  The
    other keyword arguments are the fields of pg_idempotency.http.Options.
    """

    def __init__(self, app: Any, *, pool: Any = None,
                 connect: Optional[Callable[[], Awaitable[Any]]] = None,
                 conninfo: Optional[str] = None, **options: Any) -> None:
        if sum(x is not None for x in (pool, connect, conninfo)) != 1:
            raise TypeError("give one of pool, connect or conninfo")
        self.app = app
        self.pool = pool
        self.connect = connect
        self.conninfo = conninfo
        self.policy = Policy(Options(**options))
        check_app(app, self.policy)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        if self.pool is not None:
            async with self.pool.connection() as conn:
                yield conn
            return
        if self.connect is not None:
            conn = await self.connect()
        else:
            import psycopg
            conn = await psycopg.AsyncConnection.connect(self.conninfo or "")
        try:
            yield conn
        finally:
            await conn.close()

    async def __call__(self, scope: Scope, receive: Receive,
                       send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.policy
        o = policy.options
        method = scope["method"].upper()
        path = scope.get("path", "")
        if o.policy_path and path == o.policy_path and method in ("GET",
                                                                  "HEAD"):
            await _send(send, policy.policy_response(), method)
            return
        if not policy.applies(method, path):
            await self.app(scope, receive, send)
            return
        hname = o.header.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in scope.get("headers", [])
                  if k.lower() == hname]
        try:
            key = None
            if o.key is None:
                key = policy.key_of(values)
                if key is None:
                    await self.app(scope, receive, send)
                    return
            length = _content_length(scope)
            policy.check_length(length)
            body = await _read_body(receive, o.max_body_bytes, policy)
            caller = o.caller(scope) if o.caller else caller_from_scope(scope)
            info = RequestInfo(
                method=method, path=path, route=route_of(scope),
                query=scope.get("query_string", b"").decode("latin-1"),
                caller=str(caller) if caller else "",
                content_type=_header(scope, b"content-type"), body=body,
                native=scope,
                headers=[(k.decode("latin-1"), v.decode("latin-1"))
                         for k, v in scope.get("headers", [])])
            key, key_scope, request = policy.prepare(info, key)
        except IdempotencyError as e:
            await _send(send, policy.error_response(e), method)
            return
        except _Disconnected:
            return
        if key is None:             # the key option found none: no key
            await self.app(scope, _replaying(receive, body), send)
            return
        try:
            async with self._connection() as conn:
                ctx = RequestContext(conn, key, key_scope)
                runner = AsyncPsycopgRunner(conn)

                async def call() -> Response:
                    scope[_STATE_KEY] = ctx
                    state = scope.setdefault("state", {})
                    if isinstance(state, dict):
                        state[_STATE_KEY] = ctx
                    resp = await _run_app(self.app, scope, receive, body)
                    dropped = _dropped(ctx._pending)
                    if dropped:
                        raise ConfigurationError(
                            "%s %s: the handler did not await %s on "
                            "connection(request); that call never ran, so "
                            "its response is not stored. Await every "
                            "database call." % (method, path,
                                                ", ".join(dropped)))
                    return resp
                resp = await policy.handle_async(runner, key, key_scope,
                                                 request, call)
        except Exception as e:  # noqa: BLE001 -- answered or re-raised
            mapped = classify(e)
            if mapped is None or not mapped.http_status:
                raise
            resp = policy.error_response(mapped)
        await _send(send, resp, method)


def _replaying(receive: Receive, body: bytes) -> Receive:
    """RECEIVE with BODY, already read, as the request's body."""
    sent = False

    async def replay() -> Dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


class _Disconnected(Exception):
    pass


def _header(scope: Scope, name: bytes) -> str:
    for k, v in scope.get("headers", []):
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return ""


def _content_length(scope: Scope) -> Optional[int]:
    v = _header(scope, b"content-length").strip()
    return int(v) if v.isdigit() else None


async def _read_body(receive: Receive, limit: int, policy: Policy) -> bytes:
    chunks: List[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Disconnected()
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise policy.too_large_body()
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)


async def _run_app(app: Any, scope: Scope, receive: Receive,
                   body: bytes) -> Response:
    """Run the app with BODY as its request body; capture its response."""
    replay_receive = _replaying(receive, body)
    status = 500
    headers: List[Tuple[str, str]] = []
    chunks: List[bytes] = []

    async def capture(msg: Dict[str, Any]) -> None:
        nonlocal status, headers
        if msg["type"] == "http.response.start":
            status = int(msg["status"])
            headers = [(k.decode("latin-1"), v.decode("latin-1"))
                       for k, v in msg.get("headers", [])]
        elif msg["type"] == "http.response.body":
            chunks.append(msg.get("body", b""))

    await app(scope, replay_receive, capture)
    return Response(status, headers, b"".join(chunks))


async def _send(send: Send, resp: Response, method: str) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1"))
               for k, v in resp.headers if k.lower() != "content-length"]
    headers.append((b"content-length", str(len(resp.body)).encode()))
    await send({"type": "http.response.start", "status": resp.status,
                "headers": headers})
    await send({"type": "http.response.body",
                "body": b"" if method == "HEAD" else resp.body})


class WebhookEndpoint:
    """
    An ASGI endpoint receiving Standard Webhooks deliveries (an outbox
    relay's, ../../outbox-behaviour.md): verifies the signature and runs
    HANDLER(conn, event) once per webhook-id, in the transaction that
    records it with idem_consume_message on CONSUMER.

        async def on_order(conn, event):
            await conn.execute("INSERT INTO shipments ...", ...)

        app.add_route("/hooks/orders", WebhookEndpoint(
            on_order, consumer="shipping", secret=SECRET, pool=pool),
            methods=["POST"])          # FastAPI or Starlette

    Connections as IdempotencyMiddleware's (one of pool, connect,
    conninfo); a connection is taken only for a delivery whose signature
    holds.  Answers: 200 {"id", "status": "applied" | "duplicate"}, 400
    or 401 problems for a delivery refused, 413 over MAX_BODY_BYTES, 500
    (the handler failed: nothing kept, the sender retries), 503.

    TENANT, for a message ledger distributed by Citus: the tenant whose
    rows the handler writes, in whose shard the id is recorded (a string
    or integer, or a function TENANT(event, scope) of the verified event
    and the ASGI scope, e.g. its path parameters, which may be a coroutine
    function; None: no tenant, the call of a receiver without one).
    """

    def __init__(self, handler: Callable[[Any, Any], Awaitable[Any]], *,
                 consumer: str, secret: Any, pool: Any = None,
                 connect: Optional[Callable[[], Awaitable[Any]]] = None,
                 conninfo: Optional[str] = None, tolerance: int = 300,
                 ttl: Any = None,
                 tenant: Union[Tenant, Callable[[WebhookEvent, Scope], Union[
                     Optional[Tenant], Awaitable[Optional[Tenant]]]],
                     None] = None,
                 max_body_bytes: int = 1024 * 1024) -> None:
        from .webhooks import secret_key
        if sum(x is not None for x in (pool, connect, conninfo)) != 1:
            raise TypeError("give one of pool, connect or conninfo")
        if not inspect.iscoroutinefunction(handler):
            raise ConfigurationError("a WebhookEndpoint handler is an "
                                     "async def (conn, event)")
        for s in (secret if isinstance(secret, (list, tuple)) else [secret]):
            secret_key(s)
        self.handler = handler
        self.consumer = consumer
        self.secret = secret
        self.tolerance = tolerance
        self.ttl = ttl
        self.tenant = tenant
        self.max_body_bytes = max_body_bytes
        self._conns = IdempotencyMiddleware.__new__(IdempotencyMiddleware)
        self._conns.pool = pool
        self._conns.connect = connect
        self._conns.conninfo = conninfo

    async def __call__(self, scope: Scope, receive: Receive,
                       send: Send) -> None:
        from . import webhooks as W
        if scope["type"] != "http":
            raise ConfigurationError("WebhookEndpoint serves HTTP only")
        chunks: List[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size <= self.max_body_bytes:
                chunks.append(chunk)
            if not msg.get("more_body"):
                break
        method = scope["method"].upper()
        if size > self.max_body_bytes:
            await _send(send, W.too_large(self.max_body_bytes), method)
            return
        body = b"".join(chunks)
        headers = [(k.decode("latin-1"), v.decode("latin-1"))
                   for k, v in scope.get("headers", [])]
        try:
            W.verify(self.secret, headers, body, tolerance=self.tolerance)
            async with self._conns._connection() as conn:
                r = await W.receive_webhook_async(
                    conn, self.consumer, self.secret, headers, body,
                    self.handler, tolerance=self.tolerance, ttl=self.ttl,
                    tenant=W.request_tenant(self.tenant, scope))
            resp = W.answer_received(r)
        except Exception as e:      # noqa: BLE001 -- answered
            if not isinstance(e, W.WebhookVerificationError):
                logging.getLogger("pg_idempotency").error(
                    "webhook receiver: %s", e, exc_info=e)
            resp = W.answer_error(e)
        await _send(send, resp, method)

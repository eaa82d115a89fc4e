"""
ASGI middleware (Starlette, FastAPI, any ASGI app) on psycopg 3's
AsyncConnection:

    app.add_middleware(IdempotencyMiddleware, conninfo="dbname=shop")

    @app.post("/orders")
    async def create(request: Request):
        await connection(request).execute("INSERT INTO orders ...")
        return {"ok": True}

For each request that takes a key, the middleware reads the body, takes a
connection, opens a transaction, claims the key and runs the app inside
it; the handler's SQL on connection(request) is part of that transaction,
and the response is stored with it and sent after COMMIT (so the response
is buffered).  The handler must use ``async def``.
"""

from __future__ import annotations

import contextlib
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, List,
                    Optional, Tuple)

from ._sql import AsyncPsycopgRunner
from .errors import IdempotencyError, classify
from .http import Options, Policy, RequestInfo, Response

Scope = Dict[str, Any]
Receive = Callable[[], Awaitable[Dict[str, Any]]]
Send = Callable[[Dict[str, Any]], Awaitable[None]]

_STATE_KEY = "pg_idempotency"


class RequestContext:
    """What the handler gets: the connection in its transaction, the key
    and its scope."""

    def __init__(self, connection: Any, key: str) -> None:
        self.connection = connection
        self.key = key


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
    claim: run the business write on it.  LookupError when the request
    runs without a key."""
    ctx = context(request_or_scope)
    if ctx is None:
        raise LookupError("this request runs without an Idempotency-Key "
                          "(no transaction of pg_idempotency)")
    return ctx.connection


def caller_from_scope(scope: Scope) -> str:
    """The default caller: an authenticated scope["user"] (Starlette's
    AuthenticationMiddleware) by its identity, else "" (anonymous)."""
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


def _match(routes: Any, scope: Scope, prefix: str) -> Optional[str]:
    try:
        from starlette.routing import Match
    except ImportError:                     # pragma: no cover
        return None
    for route in routes:
        try:
            match, child = route.matches(scope)
        except Exception:  # noqa: BLE001 -- a route we cannot ask
            continue
        if match != Match.FULL:
            continue
        sub = getattr(route, "routes", None)
        path = getattr(route, "path", "")
        if sub:
            inner = dict(scope)
            inner.update(child)
            found = _match(sub, inner, prefix + path)
            return found if found else prefix + path
        return prefix + path
    return None


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
            key = policy.key_of(values)
            if key is None:
                await self.app(scope, receive, send)
                return
            length = _content_length(scope)
            policy.check_length(length)
            body = await _read_body(receive, o.max_body_bytes, policy)
        except IdempotencyError as e:
            await _send(send, policy.error_response(e), method)
            return
        except _Disconnected:
            return
        info = RequestInfo(
            method=method, path=path, route=route_of(scope),
            query=scope.get("query_string", b"").decode("latin-1"),
            caller=(o.caller(scope) if o.caller else caller_from_scope(scope)),
            content_type=_header(scope, b"content-type"), body=body,
            native=scope)
        try:
            async with self._connection() as conn:
                ctx = RequestContext(conn, key)
                runner = AsyncPsycopgRunner(conn)

                async def call() -> Response:
                    scope[_STATE_KEY] = ctx
                    state = scope.setdefault("state", {})
                    if isinstance(state, dict):
                        state[_STATE_KEY] = ctx
                    return await _run_app(self.app, scope, receive, body)
                resp = await policy.handle_async(runner, info, key, call)
        except Exception as e:  # noqa: BLE001 -- answered or re-raised
            mapped = classify(e)
            if mapped is None or not mapped.http_status:
                raise
            resp = policy.error_response(mapped)
        await _send(send, resp, method)


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
    sent_body = False

    async def replay_receive() -> Dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

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

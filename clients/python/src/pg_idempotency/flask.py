"""
Flask: a view decorator.  The claim, the view and the stored response run
in one transaction on a psycopg 3 connection that the view gets with
connection(); the response goes out after COMMIT.

    @app.post("/orders")
    @idempotent(connect=pool.connection)      # or conninfo="dbname=shop"
    def create_order():
        connection().execute("INSERT INTO orders ...")
        return {"ok": True}, 201

CONNECT is a callable returning a psycopg Connection (closed after the
request) or a context manager yielding one (psycopg_pool's
``pool.connection``).  Other keyword arguments are Options fields.  The
caller defaults to the HTTP Basic user name (request.authorization): pass
caller=lambda request: ... for your authentication (Flask has none of its
own; g.user as a before_request hook sets it, say).  A request without a
caller is refused (500 no-caller) unless ``anonymous=True``.
An ``async def`` view is run the way Flask runs one undecorated
(``app.ensure_sync``, which needs asgiref: ``flask[async]``).
policy_view(**options) is a view publishing the policy document.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

from ._protocol import Tenant
from ._sql import PsycopgRunner
from .errors import IdempotencyError, classify
from .http import Options, Policy, RequestInfo, Response

if TYPE_CHECKING:
    from .webhooks import WebhookEvent

_G_KEY = "pg_idempotency_connection"


def connection() -> Any:
    """The psycopg Connection whose transaction holds this request's claim."""
    from flask import g
    conn = getattr(g, _G_KEY, None)
    if conn is None:
        raise LookupError("this request runs without an Idempotency-Key "
                          "(no transaction of pg_idempotency)")
    return conn


def current_key() -> str:
    """The Idempotency-Key of this request, unquoted."""
    from flask import g
    key = getattr(g, _G_KEY + "_key", None)
    if key is None:
        raise LookupError("this request runs without an Idempotency-Key")
    return str(key)


def caller_from_request(request: Any) -> str:
    auth = getattr(request, "authorization", None)
    return str(auth.username) if auth is not None and auth.username else ""


def _to_flask(resp: Response) -> Any:
    from flask import Response as FlaskResponse
    out = FlaskResponse(resp.body, status=resp.status)
    out.headers.clear()
    for name, value in resp.headers:
        out.headers.add(name, value)
    return out


@contextlib.contextmanager
def _open(connect: Optional[Callable[[], Any]],
          conninfo: Optional[str]) -> Iterator[Any]:
    if connect is None:
        import psycopg
        conn = psycopg.connect(conninfo or "")
        try:
            yield conn
        finally:
            conn.close()
        return
    got = connect()
    if type(got).__module__.startswith("psycopg") and \
            hasattr(got, "pgconn"):
        try:
            yield got
        finally:
            got.close()
        return
    with got as conn:
        yield conn


def idempotent(view: Optional[Callable[..., Any]] = None, *,
               connect: Optional[Callable[[], Any]] = None,
               conninfo: Optional[str] = None, **options: Any) -> Any:
    """Flask view decorator; see the module's documentation."""
    policy = Policy(Options(**options))

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from flask import current_app, g, make_response, request
            # an ``async def`` view runs as Flask runs it undecorated
            # (Flask's async support, which needs asgiref)
            run_view = current_app.ensure_sync(fn)
            o = policy.options
            if not policy.applies(request.method, request.path):
                return run_view(*args, **kwargs)
            try:
                policy.check_length(request.content_length)
                # read before any answer: a server that closes a
                # connection with an unread body may reset it and lose
                # the answer
                body = request.get_data(cache=True)
                if len(body) > o.max_body_bytes:
                    raise policy.too_large_body()
                key = None
                if o.key is None:
                    key = policy.key_of(request.headers.getlist(o.header))
                    if key is None:
                        return run_view(*args, **kwargs)
                caller = o.caller(request) if o.caller \
                    else caller_from_request(request)
                rule = request.url_rule
                info = RequestInfo(
                    method=request.method, path=request.path,
                    route=rule.rule if rule is not None else request.path,
                    query=request.query_string.decode("latin-1"),
                    caller=str(caller) if caller else "",
                    content_type=request.content_type or "", body=body,
                    native=request, headers=list(request.headers.items()))
                key, scope, fingerprint = policy.prepare(info, key)
                if key is None:
                    return run_view(*args, **kwargs)
            except IdempotencyError as e:
                return _to_flask(policy.error_response(e))
            try:
                with _open(connect, conninfo) as conn:
                    def call() -> Response:
                        setattr(g, _G_KEY, conn)
                        setattr(g, _G_KEY + "_key", key)
                        try:
                            rv = make_response(run_view(*args, **kwargs))
                        finally:
                            setattr(g, _G_KEY, None)
                        rv.make_sequence()
                        return Response(rv.status_code,
                                        list(rv.headers.items()),
                                        rv.get_data(), native=rv)
                    resp = policy.handle(PsycopgRunner(conn), key, scope,
                                         fingerprint, call)
            except Exception as e:  # noqa: BLE001 -- answered or re-raised
                mapped = classify(e)
                if mapped is None or not mapped.http_status:
                    raise
                resp = policy.error_response(mapped)
            return resp.native if resp.native is not None else _to_flask(resp)
        return wrapper
    if view is not None:
        return deco(view)
    return deco


def policy_view(**options: Any) -> Callable[[], Any]:
    """A Flask view that publishes the policy document of the decorator
    with these OPTIONS (the same keyword arguments):

        app.add_url_rule("/idempotency", view_func=policy_view(**OPTIONS))
    """
    options = {k: v for k, v in options.items()
               if k not in ("connect", "conninfo")}
    policy = Policy(Options(**options))

    def idempotency_policy() -> Any:
        return _to_flask(policy.policy_response())
    return idempotency_policy


def webhook_receiver(*, consumer: str, secret: Any,
                     connect: Optional[Callable[[], Any]] = None,
                     conninfo: Optional[str] = None, tolerance: int = 300,
                     ttl: Any = None,
                     tenant: Union[Tenant, Callable[[WebhookEvent, Any],
                                                    Optional[Tenant]],
                                   None] = None,
                     max_body_bytes: int = 1024 * 1024
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """
    A view receiving Standard Webhooks deliveries (an outbox relay's,
    ../../outbox-behaviour.md): verifies the signature and runs the
    decorated VIEW(conn, event) once per webhook-id, in the transaction on
    a psycopg 3 connection (CONNECT or CONNINFO, as idempotent's) that
    records it with idem_consume_message on CONSUMER.  What the view
    returns is ignored: the answer is 200 {"id", "status": "applied" |
    "duplicate"}, a 400/401 problem for a delivery refused, 413, 500 (the
    view raised: nothing kept, the sender retries) or 503.  VIEW may be an
    ``async def``, run as Flask runs one (``app.ensure_sync``).

        @app.post("/hooks/orders")
        @webhook_receiver(consumer="shipping", secret=SECRET,
                          connect=pool.connection)
        def on_order(conn, event):
            conn.execute("INSERT INTO shipments ...", ...)

    TENANT, for a message ledger distributed by Citus: the tenant whose
    rows the view writes, in whose shard the id is recorded (a string or
    integer, or a function TENANT(event, request) of the verified event
    and flask.request, e.g. request.view_args; None: no tenant, the call
    of a receiver without one).
    """
    from .webhooks import secret_key
    for s in (secret if isinstance(secret, (list, tuple)) else [secret]):
        secret_key(s)

    def deco(view: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            import logging

            from flask import current_app, request

            from . import webhooks as W
            # an ``async def`` view runs as Flask runs it undecorated: called
            # directly, it would return a coroutine never run, and the
            # delivery would be answered "applied" with no effect
            run_view = current_app.ensure_sync(view)
            if request.content_length is not None and \
                    request.content_length > max_body_bytes:
                return _to_flask(W.too_large(max_body_bytes))
            body = request.get_data(cache=True)
            if len(body) > max_body_bytes:
                return _to_flask(W.too_large(max_body_bytes))
            try:
                W.verify(secret, request.headers, body, tolerance=tolerance)
                with _open(connect, conninfo) as conn:
                    r = W.receive_webhook(
                        conn, consumer, secret, request.headers, body,
                        lambda c, event: run_view(c, event, *args, **kwargs),
                        tolerance=tolerance, ttl=ttl,
                        tenant=W.request_tenant(tenant, request))
                resp = W.answer_received(r)
            except Exception as e:  # noqa: BLE001 -- answered
                if not isinstance(e, W.WebhookVerificationError):
                    logging.getLogger("pg_idempotency").error(
                        "webhook receiver: %s", e, exc_info=e)
                resp = W.answer_error(e)
            return _to_flask(resp)
        return wrapper
    return deco

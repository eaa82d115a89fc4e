"""
Django: a middleware and a view decorator.  Both run the claim, the view
and the stored response in one ``transaction.atomic`` on Django's own
connection (psycopg2 on Django 3.2), so the view's ORM writes and the key
commit together, and the response goes out after COMMIT.

    MIDDLEWARE = [..., "django.contrib.auth.middleware.AuthenticationMiddleware",
                  "pg_idempotency.django.IdempotencyMiddleware"]
    PG_IDEMPOTENCY = {"ttl": 86400, "wait": None}     # Options fields

or, per view:

    @idempotent(ttl=3600)
    def create_order(request): ...

Option ``using`` names the database alias (default "default").  The
caller defaults to request.user's primary key when authenticated; a
request without one is refused (500 no-caller) unless ``anonymous`` is
True.  The middleware must come after Django's AuthenticationMiddleware
(and RemoteUserMiddleware): listed before them, it is refused at start-up
(ConfigurationError).  Views taking a key need ``@csrf_exempt`` (or a
CSRF token) like any POST view.
"""

from __future__ import annotations

import functools
import inspect
from typing import (TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple,
                    Union)

from ._protocol import Tenant
from ._sql import DjangoRunner
from .errors import ConfigurationError, IdempotencyError
from .http import Options, Policy, RequestInfo, Response

if TYPE_CHECKING:
    from .webhooks import WebhookEvent

#: Django's middleware that set request.user
_AUTH_MIDDLEWARE = ("django.contrib.auth.middleware.AuthenticationMiddleware",
                    "django.contrib.auth.middleware.RemoteUserMiddleware")


def caller_from_request(request: Any) -> str:
    """The default caller: the authenticated user's primary key, else ""."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return str(user.pk)
    return ""


def check_middleware_order(middleware: Any, ours: type) -> None:
    """ConfigurationError when an authentication middleware of Django's
    (or a subclass) comes after OURS in MIDDLEWARE: every request would
    reach the idempotency middleware without its user."""
    from django.utils.module_loading import import_string
    classes = []
    for path in middleware:
        try:
            classes.append((path, import_string(path)))
        except Exception:  # noqa: BLE001 -- Django reports it itself
            classes.append((path, None))
    from django.apps import apps
    auth = []
    if apps.is_installed("django.contrib.auth"):
        for name in _AUTH_MIDDLEWARE:
            try:
                auth.append(import_string(name))
            except ImportError:         # pragma: no cover
                pass
    seen_ours = None
    for path, cls in classes:
        if cls is not None and isinstance(cls, type) and \
                issubclass(cls, ours):
            seen_ours = seen_ours or path
        elif seen_ours and (path in _AUTH_MIDDLEWARE or (
                cls is not None and isinstance(cls, type) and
                any(issubclass(cls, a) for a in auth))):
            raise ConfigurationError(
                "%s comes after %s in MIDDLEWARE, so no request has its user "
                "when its key is claimed; list the idempotency middleware "
                "after it." % (path, seen_ours))


def _route(request: Any) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        from django.urls import Resolver404, resolve
        try:
            match = resolve(request.path_info)
        except Resolver404:
            match = None
    route = getattr(match, "route", None) if match is not None else None
    return "/" + str(route).lstrip("^") if route else str(request.path)


def _to_django(resp: Response) -> Any:
    from django.http import HttpResponse
    out = HttpResponse(resp.body, status=resp.status)
    if "Content-Type" in out:
        del out["Content-Type"]
    seen: Dict[str, List[str]] = {}
    for name, value in resp.headers:
        seen.setdefault(name, []).append(value)
    for name, values in seen.items():
        # Django keeps one value per header name
        out[name] = ", ".join(values)
    return out


def _from_django(resp: Any) -> Response:
    if getattr(resp, "streaming", False):
        from django.http import HttpResponse
        body = b"".join(resp.streaming_content)
        plain = HttpResponse(body, status=resp.status_code)
        for name, value in resp.items():
            plain[name] = value
        plain.cookies = resp.cookies
        resp = plain
    headers: List[Tuple[str, str]] = [(k, v) for k, v in resp.items()]
    return Response(resp.status_code, headers, bytes(resp.content),
                    native=resp)


class _Handler:
    def __init__(self, policy: Policy, using: Optional[str]) -> None:
        self.policy = policy
        self.runner = DjangoRunner(using)

    def __call__(self, request: Any, view: Callable[[], Any]) -> Any:
        policy = self.policy
        o = policy.options
        if o.policy_path and request.path == o.policy_path and \
                request.method in ("GET", "HEAD"):
            return _to_django(policy.policy_response())
        if not policy.applies(request.method, request.path):
            return view()
        raw = request.META.get("HTTP_" + o.header.upper().replace("-", "_"))
        try:
            length = request.META.get("CONTENT_LENGTH") or ""
            policy.check_length(int(length) if length.isdigit() else None)
            # read before any answer: a server that closes a connection
            # with an unread body may reset it and lose the answer
            body = request.body
            if len(body) > o.max_body_bytes:
                raise policy.too_large_body()
            key = None
            if o.key is None:
                key = policy.key_of([raw] if raw is not None else [])
                if key is None:
                    return view()
            caller = o.caller(request) if o.caller \
                else caller_from_request(request)
            info = RequestInfo(
                method=request.method, path=request.path,
                route=_route(request),
                query=request.META.get("QUERY_STRING", ""),
                caller=str(caller) if caller else "",
                content_type=request.META.get("CONTENT_TYPE", ""), body=body,
                native=request, headers=list(request.headers.items()))
            key, scope, fingerprint = policy.prepare(info, key)
            if key is None:
                return view()
        except IdempotencyError as e:
            return _to_django(policy.error_response(e))
        request.idempotency_key = key

        def call() -> Response:
            return _from_django(view())
        try:
            resp = policy.handle(self.runner, key, scope, fingerprint, call)
        except IdempotencyError as e:
            resp = policy.error_response(e)
        return resp.native if resp.native is not None else _to_django(resp)


def _options(kw: Dict[str, Any]) -> Tuple[Policy, Optional[str]]:
    kw = dict(kw)
    using = kw.pop("using", None)
    return Policy(Options(**kw)), using


class IdempotencyMiddleware:
    """Django middleware; options from settings.PG_IDEMPOTENCY (a dict of
    Options fields, plus ``using``)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        from django.conf import settings
        self.get_response = get_response
        check_middleware_order(getattr(settings, "MIDDLEWARE", None) or (),
                               IdempotencyMiddleware)
        policy, using = _options(getattr(settings, "PG_IDEMPOTENCY", {}))
        self.handler = _Handler(policy, using)

    def __call__(self, request: Any) -> Any:
        return self.handler(request, lambda: self.get_response(request))


def idempotent(view: Optional[Callable[..., Any]] = None,
               **options: Any) -> Any:
    """View decorator; OPTIONS are Options fields, plus ``using``.  It
    applies to the methods of ``methods`` (POST and PATCH by default)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        policy, using = _options(options)
        handler = _Handler(policy, using)

        @functools.wraps(fn)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            return handler(request, lambda: fn(request, *args, **kwargs))
        return wrapper
    if view is not None:
        return deco(view)
    return deco


def policy_view(**options: Any) -> Callable[[Any], Any]:
    """A view publishing the policy document of the middleware or
    decorator with these OPTIONS (default: settings.PG_IDEMPOTENCY):

        path("idempotency", policy_view())
    """
    def idempotency_policy(request: Any) -> Any:
        if options:
            policy, _ = _options(options)
        else:
            from django.conf import settings
            policy, _ = _options(getattr(settings, "PG_IDEMPOTENCY", {}))
        return _to_django(policy.policy_response())
    return idempotency_policy


def webhook_receiver(*, consumer: str, secret: Any,
                     using: Optional[str] = None, tolerance: int = 300,
                     ttl: Any = None,
                     tenant: Union[Tenant, Callable[[WebhookEvent, Any],
                                                    Optional[Tenant]],
                                   None] = None
                     ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """
    A view receiving Standard Webhooks deliveries (an outbox relay's,
    ../../outbox-behaviour.md): verifies the signature and runs the
    decorated VIEW(request, event) once per webhook-id, inside the
    ``transaction.atomic`` on database USING that records it with
    idem_consume_message on CONSUMER; the view's ORM writes commit with
    the record.  What the view returns is ignored: the answer is 200
    {"id", "status": "applied" | "duplicate"}, a 400/401 problem for a
    delivery refused, 500 (the view raised: nothing kept, the sender
    retries) or 503.  The view is csrf_exempt (the signature authenticates
    the sender).

        @webhook_receiver(consumer="shipping", secret=settings.HOOK_SECRET)
        def on_order(request, event):
            Shipment.objects.create(order=event.json()["order"])

    TENANT, for a message ledger distributed by Citus: the tenant whose
    rows the view writes, in whose shard the id is recorded (a string or
    integer, or a function TENANT(event, request) of the verified event
    and the HttpRequest, e.g. request.resolver_match.kwargs; None: no
    tenant, the call of a receiver without one).
    """
    from .webhooks import secret_key
    for s in (secret if isinstance(secret, (list, tuple)) else [secret]):
        secret_key(s)

    def deco(view: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(view):
            # Django's ORM and transaction.atomic are synchronous: an async
            # view here would never run (its coroutine dropped) while the
            # delivery is recorded
            raise TypeError("webhook_receiver takes a plain (sync) view: "
                            "the ORM writes commit with the dedup record")

        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            import logging

            from django.db import connections

            from . import webhooks as W
            if request.method != "POST":
                from django.http import HttpResponseNotAllowed
                return HttpResponseNotAllowed(["POST"])
            body = request.body
            try:
                r = W.receive_webhook(
                    connections[using or "default"], consumer, secret,
                    request.headers, body,
                    lambda conn, event: view(request, event, *args,
                                             **kwargs),
                    tolerance=tolerance, ttl=ttl,
                    tenant=W.request_tenant(tenant, request))
                resp = W.answer_received(r)
            except Exception as e:  # noqa: BLE001 -- answered
                if not isinstance(e, W.WebhookVerificationError):
                    logging.getLogger("pg_idempotency").error(
                        "webhook receiver: %s", e, exc_info=e)
                resp = W.answer_error(e)
            return _to_django(resp)
        wrapper.csrf_exempt = True      # type: ignore[attr-defined]
        return wrapper
    return deco

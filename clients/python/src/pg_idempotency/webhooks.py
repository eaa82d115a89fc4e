"""
Standard Webhooks (https://www.standardwebhooks.com/): signing what a
relay sends, verifying what a receiver gets, and the receiver's dedup on
webhook-id inside its own transaction (idem_consume_message).  The wire
behaviour is ../../outbox-behaviour.md's, the same in the Node.js library.

    from pg_idempotency.webhooks import receive_webhook

    result = receive_webhook(conn, "shipping", SECRET, headers, body,
                             lambda conn, event: apply(conn, event.json()))

The framework receivers are pg_idempotency.asgi.WebhookEndpoint,
pg_idempotency.django.webhook_receiver and
pg_idempotency.flask.webhook_receiver.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import json
import os
import re
import time
from dataclasses import dataclass
from typing import (Any, Awaitable, Callable, Iterable, List, Mapping,
                    Optional, Sequence, Tuple, Union)

from ._protocol import Tenant
from .core import consume_message, run_in_transaction
from .errors import IdempotencyError, StoreUnavailable, classify
from .http import PROBLEM_TAG, Response

#: how far a webhook-timestamp may be from now, either way (seconds)
DEFAULT_TOLERANCE = 300

Secret = Union[str, bytes]
Headers = Union[Mapping[str, str], Iterable[Tuple[str, str]]]

_B64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
_TS = re.compile(r"^[0-9]{1,12}$")


class WebhookVerificationError(IdempotencyError):
    """
    A webhook the receiver refuses: http_status 400 (problem
    "webhook-malformed": a header missing, repeated or unreadable) or 401
    ("webhook-timestamp": more than the tolerance from now;
    "webhook-signature": no v1 signature matches).
    """

    def __init__(self, status: int, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.http_status = status
        self.problem = slug
        self.title = _TITLES[slug]


_TITLES = {
    "webhook-malformed": "The webhook headers are malformed",
    "webhook-timestamp": "The webhook timestamp is out of tolerance",
    "webhook-signature": "The webhook signature does not match",
}


def secret_key(secret: Secret) -> bytes:
    """The key of a secret: "whsec_<base64>" (prefix optional) or bytes."""
    if isinstance(secret, (bytes, bytearray, memoryview)):
        key = bytes(secret)
    elif isinstance(secret, str):
        b64 = secret[6:] if secret.startswith("whsec_") else secret
        if not _B64.match(b64):
            raise TypeError('a webhook secret is "whsec_" and base64')
        try:
            key = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise TypeError('a webhook secret is "whsec_" and base64') from e
    else:
        raise TypeError('a webhook secret is a "whsec_<base64>" string '
                        'or bytes')
    if not key:
        raise TypeError("a webhook secret must not be empty")
    return key


def generate_secret() -> str:
    """A new secret: "whsec_" and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")


def _bytes(body: Union[bytes, str, None]) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def _mac(key: bytes, msg_id: str, timestamp: Union[int, str],
         body: bytes) -> bytes:
    m = hmac.new(key, ("%s.%s." % (msg_id, timestamp)).encode("utf-8"),
                 hashlib.sha256)
    m.update(body)
    return m.digest()


def sign(secret: Secret, msg_id: str, timestamp: int,
         body: Union[bytes, str]) -> str:
    """ "v1,<base64 of HMAC-SHA256(key, id.timestamp.body)>" """
    digest = _mac(secret_key(secret), msg_id, timestamp, _bytes(body))
    return "v1," + base64.b64encode(digest).decode("ascii")


def webhook_headers(secret: Secret, msg_id: str, timestamp: int,
                    body: Union[bytes, str]) -> dict:
    """The headers a relay sends with BODY (timestamp: epoch seconds)."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(secret, msg_id, timestamp, body)}


def _values(headers: Headers, name: str) -> List[str]:
    getlist = getattr(headers, "getlist", None) or \
        getattr(headers, "get_all", None)
    if getlist is not None:
        return [str(v) for v in (getlist(name) or [])]
    if isinstance(headers, Mapping):
        return [str(v) for k, v in headers.items() if k.lower() == name]
    return [str(v) for k, v in headers if k.lower() == name]


def _one(headers: Headers, name: str) -> str:
    vs = _values(headers, name)
    if not vs:
        raise WebhookVerificationError(400, "webhook-malformed",
                                       "the %s header is missing" % name)
    if len(vs) > 1:
        raise WebhookVerificationError(400, "webhook-malformed",
                                       "the %s header is repeated" % name)
    return vs[0]


def verify(secret: Union[Secret, Sequence[Secret]], headers: Headers,
           body: Union[bytes, str], *, tolerance: int = DEFAULT_TOLERANCE,
           now: Optional[int] = None) -> Tuple[str, int]:
    """
    Check a delivery's webhook-id, webhook-timestamp and
    webhook-signature against BODY (the bytes as received); return (id,
    timestamp) or raise WebhookVerificationError.  SECRET may be a list (a
    rotation: any one matches).  Signatures are compared in constant time.
    """
    secrets = list(secret) if isinstance(secret, (list, tuple)) \
        else [secret]
    keys = [secret_key(s) for s in secrets]
    if not keys:
        raise TypeError("verify needs a secret")
    msg_id = _one(headers, "webhook-id")
    ts = _one(headers, "webhook-timestamp")
    sigs = _one(headers, "webhook-signature")
    if msg_id == "" or len(msg_id.encode("utf-8")) > 255:
        raise WebhookVerificationError(
            400, "webhook-malformed",
            "the webhook-id header is empty or longer than 255 bytes")
    if not _TS.match(ts):
        raise WebhookVerificationError(
            400, "webhook-malformed",
            "the webhook-timestamp header is not a number of seconds")
    timestamp = int(ts)
    current = int(time.time()) if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError(
            401, "webhook-timestamp",
            "the webhook-timestamp is more than %d seconds from now"
            % tolerance)
    data = _bytes(body)
    given = []
    for s in sigs.split(" "):
        if s.startswith("v1,"):
            try:
                given.append(base64.b64decode(s[3:]))
            except (binascii.Error, ValueError):
                pass
    for key in keys:
        expected = _mac(key, msg_id, ts, data)
        ok = False
        for g in given:
            if hmac.compare_digest(g, expected):
                ok = True
        if ok:
            return msg_id, timestamp
    raise WebhookVerificationError(401, "webhook-signature",
                                   "no webhook-signature matches the body")


@dataclass
class WebhookEvent:
    """What a receiver's handler gets."""
    id: str
    timestamp: int
    headers: Any
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


@dataclass
class Received:
    """receive_webhook's answer: DUPLICATE when the id was seen before
    (the handler did not run); RESULT is the handler's value."""
    id: str
    duplicate: bool
    result: Any = None


#: a receiver's tenant: one for every delivery, or a function of the
#: verified event giving each delivery's (None: no tenant)
TenantOf = Union[Tenant, Callable[[WebhookEvent], Optional[Tenant]], None]
#: receive_webhook_async's: the function may also be a coroutine function
AsyncTenantOf = Union[Tenant, Callable[[WebhookEvent], Union[
    Optional[Tenant], Awaitable[Optional[Tenant]]]], None]


def event_tenant(tenant: Any, event: WebhookEvent) -> Any:
    """The tenant of EVENT: TENANT, or TENANT(event) when it is callable."""
    if callable(tenant):
        return tenant(event)
    return tenant


def request_tenant(tenant: Any, request: Any) -> Any:
    """A framework receiver's TENANT, a value or a function of (event,
    REQUEST), as receive_webhook takes it."""
    if callable(tenant):
        return lambda event: tenant(event, request)
    return tenant


def receive_webhook(conn: Any, consumer: str,
                    secret: Union[Secret, Sequence[Secret]],
                    headers: Headers, body: Union[bytes, str],
                    handler: Callable[[Any, WebhookEvent], Any], *,
                    tolerance: int = DEFAULT_TOLERANCE,
                    ttl: Any = None, tenant: TenantOf = None,
                    now: Optional[int] = None) -> Received:
    """
    Verify the delivery, then in one transaction on CONN (psycopg 3,
    psycopg2 or Django's connection; a transaction of its own, retried on
    40P01/40001, or the caller's open one) record webhook-id for CONSUMER
    with idem_consume_message and, when it is new, call HANDLER(conn,
    event): its writes and the dedup record commit together.  A
    redelivery is Received(duplicate=True) and HANDLER does not run;
    HANDLER raising rolls both back (the sender delivers again), and so
    does a HANDLER that returns an awaitable (TypeError: a coroutine
    function needs receive_webhook_async).

    TENANT (a string or integer, or a function of the verified event
    giving one) is for a message ledger distributed by Citus: the tenant
    whose rows HANDLER writes, in whose shard the id is recorded
    (idem_consume_message's four-argument form).  None, or a function
    answering None: the three-argument form, as before.
    """
    msg_id, timestamp = verify(secret, headers, body, tolerance=tolerance,
                               now=now)
    event = WebhookEvent(msg_id, timestamp, headers, _bytes(body))
    of = event_tenant(tenant, event)

    def once() -> Received:
        if not consume_message(conn, consumer, msg_id, ttl, tenant=of):
            return Received(msg_id, True)
        result = handler(conn, event)
        if inspect.isawaitable(result):
            # an async handler here would never run: roll the record back
            # (500, the sender delivers again) rather than answer applied
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("the webhook handler returned an awaitable: "
                            "use receive_webhook_async, or a plain function")
        return Received(msg_id, False, result)
    return run_in_transaction(conn, once)


async def receive_webhook_async(
        conn: Any, consumer: str, secret: Union[Secret, Sequence[Secret]],
        headers: Headers, body: Union[bytes, str],
        handler: Callable[[Any, WebhookEvent], Awaitable[Any]], *,
        tolerance: int = DEFAULT_TOLERANCE, ttl: Any = None,
        tenant: AsyncTenantOf = None, now: Optional[int] = None) -> Received:
    """receive_webhook on a psycopg AsyncConnection, HANDLER a coroutine
    function (TENANT, if a function, may be one too)."""
    from . import aio
    msg_id, timestamp = verify(secret, headers, body, tolerance=tolerance,
                               now=now)
    event = WebhookEvent(msg_id, timestamp, headers, _bytes(body))
    of: Any = event_tenant(tenant, event)
    if inspect.isawaitable(of):
        of = await of

    async def once() -> Received:
        if not await aio.consume_message(conn, consumer, msg_id, ttl,
                                         tenant=of):
            return Received(msg_id, True)
        return Received(msg_id, False, await handler(conn, event))
    return await aio.run_in_transaction(conn, once)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- answers

def problem(status: int, slug: str, title: str, detail: str) -> Response:
    """An RFC 9457 problem document, as the receivers send it."""
    doc = {"type": PROBLEM_TAG + slug, "title": title, "status": status,
           "detail": detail}
    return Response(status, [("Content-Type", "application/problem+json"),
                             ("Content-Language", "en")],
                    json.dumps(doc, separators=(",", ":")).encode("utf-8"))


def answer_received(r: Received) -> Response:
    """200 {"id": ..., "status": "applied" | "duplicate"}"""
    doc = {"id": r.id, "status": "duplicate" if r.duplicate else "applied"}
    return Response(200, [("Content-Type", "application/json")],
                    json.dumps(doc, separators=(",", ":")).encode("utf-8"))


def answer_error(exc: BaseException) -> Response:
    """The answer of a receiver whose delivery failed: the verification's
    problem, 503 when the database is out of reach, else 500 (the
    handler's writes rolled back with the dedup record)."""
    if isinstance(exc, WebhookVerificationError):
        return problem(exc.http_status or 400, exc.problem, exc.title,
                       exc.detail)
    if isinstance(classify(exc), StoreUnavailable):
        return problem(503, "unavailable", "The database is unavailable",
                       "The webhook was not recorded; deliver it again.")
    return problem(500, "internal", "Internal error",
                   "The webhook was not recorded; deliver it again.")


def too_large(limit: int) -> Response:
    return problem(413, "too-large", "The webhook is too large",
                   "The body is over %d bytes." % limit)

"""
The transactional outbox's client side: publish() in the business
transaction, the SQL calls of a relay (outbox_next, outbox_ack,
outbox_dead_letter), and OutboxRelay, which delivers each batch to a sink
(an HTTP endpoint with Standard Webhooks signatures, WebhookSink, or a
Redis stream, RedisStreamSink) at least once, with retries, backoff and
jitter, dead letters and a generation that fences a zombie relay.

    with conn.transaction():
        conn.execute("INSERT INTO orders ...")
        publish(conn, "orders", {"order": 42}, key="order-42")

    relay = OutboxRelay(lambda: psycopg.connect(dsn), relay="shipping",
                        topic="orders",
                        sink=WebhookSink("https://shipping/hooks", SECRET))
    relay.run()             # until relay.stop()

With extension 0.5.0 on Citus, publish(..., tenant=) writes the event
into the tenant's shard of the tenant outbox, and OutboxRelay(...,
tenants=True) relays every tenant's events from the coordinator (the
extension's tenant overloads, called only when asked for; without Citus'
tenant outbox the server does not use the tenant).

The behaviour, the same in the Node.js library, is
../../outbox-behaviour.md's.
"""

from __future__ import annotations

import json
import random as _random
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ._protocol import Tenant, json_param, tenant_param
from ._sql import runner_for
from .core import run_in_transaction
from .errors import (IdempotencyError, RetryableConflict, StaleGeneration,
                     StoreUnavailable, classify, sqlstate_of)
from .webhooks import Secret, secret_key, webhook_headers


class OutboxLost(IdempotencyError):
    """
    ID003: events of the relay expired (idempotency.outbox_max_age)
    before it acknowledged them.  BATCH is the batch the loss is reported
    as (acknowledge it to go on), when the server said so.
    """

    def __init__(self, detail: str = "", *, batch: Optional[int] = None,
                 **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.batch = batch


class DeadLetter(IdempotencyError):
    """The relay stopped on an event that kept failing
    (on_dead_letter="stop"): the event is recorded as a dead letter and its
    batch left unacknowledged."""

    def __init__(self, detail: str, event: "Event",
                 failure: Optional[BaseException]) -> None:
        super().__init__(detail, cause=failure)
        self.event = event
        self.failure = failure


class DeliveryError(IdempotencyError):
    """One failed delivery attempt; PERMANENT: not worth another (the
    event is dead-lettered at once)."""

    def __init__(self, detail: str, *, status: Optional[int] = None,
                 permanent: bool = False,
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(detail, cause=cause)
        self.status = status
        self.permanent = permanent


_LOSS_BATCH = re.compile(r"the loss is batch ([0-9]+)")


def _map(exc: BaseException) -> BaseException:
    if isinstance(exc, IdempotencyError):
        return exc
    if sqlstate_of(exc) == "ID003":
        diag = getattr(exc, "diag", None)
        detail = getattr(diag, "message_detail", None) or \
            getattr(exc, "detail", None) or ""
        m = _LOSS_BATCH.search(str(detail))
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return OutboxLost(msg, batch=int(m.group(1)) if m else None,
                          sqlstate="ID003", cause=exc)
    return classify(exc) or exc


def _execute(conn: Any, sql: str, params: Tuple[Any, ...]) -> List[Any]:
    try:
        return runner_for(conn).execute(sql, params)
    except Exception as e:      # noqa: BLE001 -- mapped or re-raised
        mapped = _map(e)
        if mapped is e:
            raise
        raise mapped from e


# ---------------------------------------------------------------- SQL calls

def publish(conn: Any, topic: str, payload: Any = None, *,
            key: Optional[str] = None,
            headers: Optional[Mapping[str, Any]] = None,
            raw: Optional[bytes] = None,
            tenant: Optional[Tenant] = None) -> str:
    """
    idem_publish: one event in CONN's open transaction (it commits or
    rolls back with it; outside one, a transaction of its own).  Returns
    the event id (uuid text), which every delivery carries.  TENANT (a
    string or an integer; extension 0.5.0): the tenant outbox distributed
    by Citus, relayed by OutboxRelay(..., tenants=True); not used by a
    server without it.  Without a tenant, 0.4.0's call.
    """
    if not isinstance(topic, str):
        raise TypeError("publish needs a topic")
    if raw is not None and not isinstance(raw, (bytes, bytearray,
                                                memoryview)):
        raise TypeError("raw must be bytes")
    t = tenant_param(tenant)
    params: Tuple[Any, ...] = (
        topic, json_param(payload), None if key is None else str(key),
        json_param(dict(headers)) if headers is not None else None,
        None if raw is None else bytes(raw))
    if t is None:
        rows = _execute(conn, "SELECT idem_publish(%s::text, %s::jsonb,"
                        " %s::text, %s::jsonb, %s::bytea)::text", params)
    else:
        # the overload with a tenant (0.5.0): the tenant's shard of the
        # tenant outbox on Citus, the node's own outbox elsewhere
        rows = _execute(conn, "SELECT idem_publish(%s::text, %s::jsonb,"
                        " %s::text, %s::jsonb, %s::bytea, %s::text)::text",
                        params + (t,))
    return str(rows[0][0])


@dataclass
class Event:
    """One event of a relay's batch."""
    event_id: str
    key: Optional[str]
    #: the payload as PostgreSQL prints jsonb: the bytes a relay sends
    payload_text: Optional[str]
    raw: Optional[bytes]
    headers: Optional[Dict[str, Any]]
    published_at: Any
    #: read from the tenant outbox (a relay with tenants=True or tenant=):
    #: the event's tenant as text and its number in its (topic, tenant),
    #: 1, 2, 3...; None for an event of the node's own outbox
    tenant: Optional[str] = None
    seq: Optional[int] = None

    @property
    def payload(self) -> Any:
        return None if self.payload_text is None \
            else json.loads(self.payload_text)


@dataclass
class Batch:
    """outbox_next's answer: BATCH None and no events when there is
    nothing to relay."""
    batch: Optional[int]
    events: List[Event] = field(default_factory=list)


def _headers(v: Any) -> Optional[Dict[str, Any]]:
    if v is None or isinstance(v, dict):
        return v
    return json.loads(v)


def _relay_tenant(tenant: Optional[Tenant] = None,
                 tenants: bool = False) -> Tuple[bool, Optional[str]]:
    """
    Which relay calls to make: (False, None) for 0.4.0's (the node's own
    outbox), (True, None) for the tenant overloads with tenant NULL (every
    tenant's events of the tenant outbox, TENANTS=True), (True, text) for
    one tenant's (TENANT).  A TypeError for anything else, before anything
    is sent.
    """
    if not isinstance(tenants, bool):
        raise TypeError("tenants is True (every tenant's events) or False, "
                        "not %r; one tenant's events: tenant=" % (tenants,))
    t = tenant_param(tenant)
    if tenants and t is not None:
        raise TypeError("give tenant= (one tenant's events) or tenants=True "
                        "(every tenant's), not both")
    return (tenants or t is not None), t


def _tenant_form(sql: str, params: Tuple[Any, ...], tenant: Optional[Tenant],
                 tenants: bool) -> Tuple[str, Tuple[Any, ...]]:
    """SQL (a call ending in ")") and PARAMS as they are, or with the
    tenant argument last: the tenant overload (extension 0.5.0)."""
    form, t = _relay_tenant(tenant, tenants)
    if not form:
        return sql, params
    return sql[:-1] + ", %s::text)", params + (t,)


def outbox_next(conn: Any, relay: str, topic: str, max_events: int = 100,
                generation: Optional[int] = None, *,
                tenant: Optional[Tenant] = None,
                tenants: bool = False) -> Batch:
    """idem_outbox_next: the relay's current batch (the same one until it
    is acknowledged).  TENANTS=True: every tenant's events of the tenant
    outbox (extension 0.5.0, on the Citus coordinator), TENANT: one
    tenant's; each event with its tenant and seq.  Without Citus' tenant
    outbox, these read the node's own outbox (tenant and seq None)."""
    form, _ = _relay_tenant(tenant, tenants)
    sql, params = _tenant_form(
        "FROM idem_outbox_next(%s::text, %s::text, %s::int, %s::bigint)",
        (relay, topic, int(max_events),
         None if generation is None else int(generation)), tenant, tenants)
    rows = _execute(conn, "SELECT batch, event_id::text, key, payload::text,"
                    " payload_raw, headers, published_at" +
                    (", tenant, seq " if form else " ") + sql, params)
    if not rows:
        return Batch(None, [])
    events = []
    for r in rows:
        ev = Event(r[1], r[2], r[3], None if r[4] is None else bytes(r[4]),
                   _headers(r[5]), r[6])
        if form:
            ev.tenant = r[7]
            ev.seq = None if r[8] is None else int(r[8])
        events.append(ev)
    return Batch(int(rows[0][0]), events)


def outbox_ack(conn: Any, relay: str, topic: str, batch: int,
               generation: Optional[int] = None, *,
               tenant: Optional[Tenant] = None,
               tenants: bool = False) -> bool:
    """idem_outbox_ack: True if it moved the relay past BATCH, False if
    BATCH was acknowledged before.  TENANT, TENANTS: as the batch was
    taken (outbox_next)."""
    sql, params = _tenant_form(
        "SELECT idem_outbox_ack(%s::text, %s::text, %s::bigint, %s::bigint)",
        (relay, topic, int(batch),
         None if generation is None else int(generation)), tenant, tenants)
    rows = _execute(conn, sql, params)
    return bool(rows[0][0])


def outbox_dead_letter(conn: Any, relay: str, topic: str, event_id: str,
                       reason: Optional[str] = None,
                       attempts: Optional[int] = None, *,
                       tenant: Optional[Tenant] = None,
                       tenants: bool = False) -> None:
    """idem_outbox_dead_letter: the relay gave up on an event of its
    current batch.  TENANT, TENANTS: as the batch was taken
    (outbox_next)."""
    sql, params = _tenant_form(
        "SELECT idem_outbox_dead_letter(%s::text, %s::text, %s::uuid,"
        " %s::text, %s::int)",
        (relay, topic, event_id, reason, attempts), tenant, tenants)
    _execute(conn, sql, params)


@dataclass
class DeadLetterRecord:
    """One of idem_outbox_dead_letters' rows."""
    relay: str
    topic: str
    event: Event
    reason: Optional[str]
    attempts: Optional[int]
    failed_at: Any


def outbox_dead_letters(conn: Any, relay: Optional[str] = None,
                        topic: Optional[str] = None
                        ) -> List[DeadLetterRecord]:
    """idem_outbox_dead_letters: the calling role's dead letters, of one
    relay and topic or all."""
    rows = _execute(conn, "SELECT relay, topic, event_id::text, key,"
                    " payload::text, payload_raw, headers, published_at,"
                    " reason, attempts, failed_at"
                    " FROM idem_outbox_dead_letters(%s::text, %s::text)",
                    (relay, topic))
    return [DeadLetterRecord(r[0], r[1], Event(
        r[2], r[3], r[4], None if r[5] is None else bytes(r[5]),
        _headers(r[6]), r[7]), r[8], r[9], r[10]) for r in rows]


# ---------------------------------------------------------------- sinks

def event_body(event: Event) -> Tuple[bytes, Optional[str]]:
    """The bytes an event goes out as, and their content type: payload_raw
    when it has one, else the payload's JSON as PostgreSQL prints jsonb,
    else nothing."""
    if event.raw is not None:
        return event.raw, "application/octet-stream"
    if event.payload_text is not None:
        return event.payload_text.encode("utf-8"), "application/json"
    return b"", None


#: headers of an event that are never sent as they are
RESERVED_HEADERS = frozenset((
    "webhook-id", "webhook-timestamp", "webhook-signature", "content-length",
    "host", "transfer-encoding", "connection", "keep-alive", "upgrade", "te",
    "trailer"))


def _header_value(value: Any) -> str:
    """An event header's value as a field value: a string as it is, a
    list of strings joined with ", " (RFC 9110's combination of field
    lines), else its JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _reason(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:1000]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kw: Any) -> None:
        return None


class WebhookSink:
    """
    POSTs each event to URL (a string or a function of the event) with
    webhook-id (the event id), webhook-timestamp (now, at each attempt) and
    webhook-signature; the event's headers are added (content-type among
    them), then HEADERS.  Raises DeliveryError when the endpoint does not
    answer 2xx within TIMEOUT seconds (redirects are not followed).
    """

    def __init__(self, url: Any, secret: Secret, *, timeout: float = 15.0,
                 headers: Optional[Mapping[str, str]] = None,
                 now: Optional[Callable[[], int]] = None) -> None:
        if not url:
            raise TypeError("WebhookSink needs a url")
        secret_key(secret)      # a bad secret fails here, not later
        self.url = url
        self.secret = secret
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.now = now or (lambda: int(time.time()))
        self._opener = urllib.request.build_opener(_NoRedirect)

    def __call__(self, event: Event, ctx: Optional[Mapping[str, Any]] = None
                 ) -> None:
        body, content_type = event_body(event)
        hdrs: Dict[str, str] = {}
        if content_type:
            hdrs["content-type"] = content_type
        if isinstance(event.headers, dict):
            for name, value in event.headers.items():
                if value is None or name.lower() in RESERVED_HEADERS:
                    continue
                hdrs[name.lower()] = _header_value(value)
        for name, value in self.headers.items():
            hdrs[name.lower()] = str(value)
        hdrs.update(webhook_headers(self.secret, event.event_id, self.now(),
                                    body))
        url = self.url(event) if callable(self.url) else self.url
        req = urllib.request.Request(url, data=body, headers=hdrs,
                                     method="POST")
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            try:
                e.read()
            except Exception:   # noqa: BLE001 -- the status decides
                pass
            status = e.code
        except Exception as e:  # noqa: BLE001 -- every failure is one
            what = "no answer within %g s" % self.timeout \
                if "timed out" in str(e) else _reason(
                    getattr(e, "reason", None) or e)
            raise DeliveryError("POST %s: %s" % (url, what), cause=e) from e
        if not 200 <= status <= 299:
            raise DeliveryError("POST %s: HTTP %d" % (url, status),
                                status=status)


#: XADD, once per dedup key while the key lives: SET NX EX, then XADD, in
#: one script (atomic in Redis)
_XADD_ONCE = ("if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then "
              "return redis.call('XADD', KEYS[1], unpack(ARGV, 2)) end "
              "return false")


class RedisStreamSink:
    """
    XADD <stream> [MAXLEN ~ maxlen] * event_id <id> [key <key>] [headers
    <json>] [payload <json> | payload_raw <bytes>] published_at <ISO 8601>
    with CLIENT (redis-py's Redis, or anything with execute_command).
    STREAM: a name or a function of the event (default: the relay's
    topic).  Redis assigns the entry id; event_id is what a consumer
    dedups on.  DEDUP_SECONDS: an event already added within that many
    seconds is not added again (key <stream>:dedup:<event id>, set with
    the XADD in one script), so a redelivered batch adds no second entry.
    """

    def __init__(self, client: Any, stream: Any = None, *,
                 maxlen: Optional[int] = None,
                 dedup_seconds: Optional[int] = None) -> None:
        if not hasattr(client, "execute_command"):
            raise TypeError("RedisStreamSink needs a client with "
                            "execute_command (redis-py's Redis)")
        if dedup_seconds is not None and (
                not isinstance(dedup_seconds, int) or dedup_seconds < 1):
            raise TypeError("dedup_seconds must be a positive integer")
        self.client = client
        self.stream = stream
        self.maxlen = maxlen
        self.dedup_seconds = dedup_seconds

    def __call__(self, event: Event, ctx: Optional[Mapping[str, Any]] = None
                 ) -> None:
        stream = self.stream(event) if callable(self.stream) else \
            (self.stream or (ctx or {}).get("topic"))
        if not stream:
            raise TypeError("RedisStreamSink needs a stream")
        args: List[Any] = []
        if self.maxlen is not None:
            args += ["MAXLEN", "~", str(self.maxlen)]
        args += ["*", "event_id", event.event_id]
        if event.key is not None:
            args += ["key", event.key]
        if event.headers is not None:
            args += ["headers", json.dumps(event.headers,
                                           separators=(",", ":"),
                                           ensure_ascii=False)]
        if event.payload_text is not None:
            args += ["payload", event.payload_text]
        if event.raw is not None:
            args += ["payload_raw", event.raw]
        args += ["published_at", _iso(event.published_at)]
        if self.dedup_seconds is None:
            command = ["XADD", str(stream)] + args
        else:
            command = ["EVAL", _XADD_ONCE, 2, str(stream),
                       "%s:dedup:%s" % (stream, event.event_id),
                       str(self.dedup_seconds)] + args
        try:
            self.client.execute_command(*command)
        except Exception as e:  # noqa: BLE001 -- every failure is one
            raise DeliveryError("XADD %s: %s" % (stream, _reason(e)),
                                cause=e) from e


def _iso(ts: Any) -> str:
    """ISO 8601 in UTC with milliseconds and Z, as JavaScript prints it."""
    import datetime
    if isinstance(ts, datetime.datetime):
        if ts.tzinfo is not None:
            ts = ts.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return ts.strftime("%Y-%m-%dT%H:%M:%S.") + \
            "%03dZ" % (ts.microsecond // 1000)
    return str(ts)


# ---------------------------------------------------------------- the relay

def backoff_delay(n: int, initial_delay: float, max_delay: float,
                  random: Callable[[], float] = _random.random) -> float:
    """The wait before attempt n + 1 after n failed ones: min(max_delay,
    initial_delay * 2^(n-1)), of which the upper half is random."""
    base = min(max_delay, initial_delay * 2 ** (n - 1))
    return base / 2 + random() * (base / 2)


class OutboxRelay:
    """
    OutboxRelay(connect, relay=..., topic=..., sink=...)

    run_once()  one batch: next, deliver each event in order, ack (with
                the dead letters); returns a dict {batch, delivered,
                dead_lettered, events, acked}
    run()       batches until stop(); waits poll_interval when idle
    stop()      ends run() after the event in flight (the batch is not
                acknowledged: its events are delivered again next time)

    CONNECT: a connection (psycopg 3 or psycopg2), or a function returning
    one (called again after the connection is lost).  Options: max_events
    (100), generation (None: unfenced), max_attempts (8), initial_delay
    (1.0 s), max_delay (60.0 s), on_dead_letter ("continue" or "stop"),
    poll_interval (1.0 s), acknowledge_loss (False), on_event(kind, info)
    for logging and metrics, tenants (False): True relays every tenant's
    events of the tenant outbox (publish(..., tenant=); extension 0.5.0,
    connected to the Citus coordinator) through the tenant overloads of
    idem_outbox_next, _ack and _dead_letter with tenant NULL; without
    Citus' tenant outbox the server relays its own outbox then.
    """

    def __init__(self, connect: Any, *, relay: str, topic: str,
                 sink: Callable[..., Any], max_events: int = 100,
                 generation: Optional[int] = None, max_attempts: int = 8,
                 initial_delay: float = 1.0, max_delay: float = 60.0,
                 on_dead_letter: str = "continue",
                 poll_interval: float = 1.0, acknowledge_loss: bool = False,
                 on_event: Optional[Callable[[str, Dict[str, Any]], None]]
                 = None,
                 random: Callable[[], float] = _random.random,
                 sleep: Optional[Callable[[float], None]] = None,
                 tenants: bool = False) -> None:
        if not relay or not isinstance(relay, str):
            raise TypeError("OutboxRelay needs relay, its name")
        if not topic or not isinstance(topic, str):
            raise TypeError("OutboxRelay needs a topic")
        if not callable(sink):
            raise TypeError("OutboxRelay needs a sink: WebhookSink(...), "
                            "RedisStreamSink(...) or a function of the event")
        if not isinstance(max_events, int) or max_events < 1:
            raise TypeError("max_events must be an integer of at least 1")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise TypeError("max_attempts must be an integer of at least 1")
        if on_dead_letter not in ("continue", "stop"):
            raise TypeError('on_dead_letter is "continue" or "stop"')
        for name, v in (("initial_delay", initial_delay),
                        ("max_delay", max_delay),
                        ("poll_interval", poll_interval)):
            if not isinstance(v, (int, float)) or v < 0:
                raise TypeError("%s must be a number of seconds" % name)
        _relay_tenant(None, tenants)     # not a bool: a TypeError here
        if callable(connect) and not hasattr(connect, "cursor"):
            self._connect: Optional[Callable[[], Any]] = connect
            self._conn: Any = None
        else:
            self._connect = None
            self._conn = connect
        self.relay = relay
        self.topic = topic
        self.sink = sink
        self.max_events = max_events
        self.generation = generation
        self.max_attempts = max_attempts
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.on_dead_letter = on_dead_letter
        self.poll_interval = poll_interval
        self.acknowledge_loss = acknowledge_loss
        self.tenants = tenants
        self.on_event = on_event or (lambda kind, info: None)
        self.random = random
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    def _db(self) -> Any:
        if self._conn is None or getattr(self._conn, "closed", False):
            if self._connect is None:
                raise StoreUnavailable("the relay's connection is closed")
            self._conn = self._connect()
        return self._conn

    def _tx(self, fn: Callable[[Any], Any]) -> Any:
        conn = None
        try:
            conn = self._db()
            return run_in_transaction(conn, lambda: fn(conn))
        except Exception as e:  # noqa: BLE001 -- mapped or re-raised
            mapped = _map(e)
            if isinstance(mapped, StoreUnavailable) and \
                    self._connect is not None:
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:   # noqa: BLE001 -- gone anyway
                        pass
                self._conn = None
            if mapped is e:
                raise
            raise mapped from e

    def deliver(self, event: Event) -> Dict[str, Any]:
        """One event, retried: {"ok": True, "attempts": n} or {"ok": False,
        "attempts": n, "error": exc[, "stopped": True]}."""
        attempt = 0
        while True:
            attempt += 1
            try:
                self.sink(event, {"topic": self.topic, "relay": self.relay,
                                  "attempt": attempt})
                self.on_event("delivered", {"event": event,
                                            "attempt": attempt})
                return {"ok": True, "attempts": attempt}
            except Exception as e:  # noqa: BLE001 -- a failed attempt
                self.on_event("attempt-failed", {"event": event,
                                                 "attempt": attempt,
                                                 "error": e})
                if self.stopped:
                    return {"ok": False, "attempts": attempt, "error": e,
                            "stopped": True}
                if attempt >= self.max_attempts or \
                        getattr(e, "permanent", False):
                    return {"ok": False, "attempts": attempt, "error": e}
                self._sleep(backoff_delay(attempt, self.initial_delay,
                                          self.max_delay, self.random))
                if self.stopped:
                    return {"ok": False, "attempts": attempt, "error": e,
                            "stopped": True}

    def run_once(self) -> Dict[str, Any]:
        try:
            nxt = self._tx(lambda c: outbox_next(
                c, self.relay, self.topic, self.max_events, self.generation,
                tenants=self.tenants))
        except OutboxLost as e:
            if not (self.acknowledge_loss and e.batch is not None):
                raise
            self.on_event("loss", {"error": e})
            batch = e.batch
            self._tx(lambda c: outbox_ack(c, self.relay, self.topic, batch,
                                          self.generation,
                                          tenants=self.tenants))
            return {"batch": batch, "delivered": 0, "dead_lettered": 0,
                    "events": 0, "lost": True}
        if nxt.batch is None:
            self.on_event("idle", {})
            return {"batch": None, "delivered": 0, "dead_lettered": 0,
                    "events": 0}
        batch, events = nxt.batch, nxt.events
        dead = []
        delivered = 0
        for event in events:
            if self.stopped:
                return {"batch": batch, "delivered": delivered,
                        "dead_lettered": 0, "events": len(events),
                        "acked": False}
            r = self.deliver(event)
            if r["ok"]:
                delivered += 1
                continue
            if r.get("stopped"):
                return {"batch": batch, "delivered": delivered,
                        "dead_lettered": 0, "events": len(events),
                        "acked": False}
            reason = _reason(r["error"])
            if self.on_dead_letter == "stop":
                ev = event
                self._tx(lambda c: outbox_dead_letter(
                    c, self.relay, self.topic, ev.event_id, reason,
                    r["attempts"], tenants=self.tenants))
                self.on_event("dead-letter", {"event": event,
                                              "attempts": r["attempts"],
                                              "error": r["error"]})
                raise DeadLetter("event %s failed %d times (%s); the relay "
                                 "stops" % (event.event_id, r["attempts"],
                                            reason), event, r["error"])
            dead.append({"event": event, "reason": reason,
                         "attempts": r["attempts"], "error": r["error"]})

        def ack(c: Any) -> None:
            for d in dead:
                outbox_dead_letter(c, self.relay, self.topic,
                                   d["event"].event_id, d["reason"],
                                   d["attempts"], tenants=self.tenants)
            outbox_ack(c, self.relay, self.topic, batch, self.generation,
                       tenants=self.tenants)
        self._tx(ack)
        for d in dead:
            self.on_event("dead-letter", d)
        self.on_event("acked", {"batch": batch, "events": len(events)})
        return {"batch": batch, "delivered": delivered,
                "dead_lettered": len(dead), "events": len(events),
                "acked": True}

    def run(self) -> None:
        """
        Batches until stop() (or an error that ends the relay: a stale
        generation, a dead letter with on_dead_letter="stop", a loss not
        acknowledged, a programming error).  The database out of reach is
        waited out (backoff up to max_delay).
        """
        failures = 0
        while not self.stopped:
            try:
                r = self.run_once()
                failures = 0
            except (StoreUnavailable, RetryableConflict) as e:
                failures += 1
                self.on_event("database-unavailable", {"error": e})
                self._sleep(backoff_delay(failures, self.initial_delay,
                                          self.max_delay, self.random))
                continue
            except StaleGeneration as e:
                self.on_event("fenced", {"error": e})
                raise
            if r["batch"] is None:
                self._sleep(self.poll_interval)

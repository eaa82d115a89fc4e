"""
The synchronous core: the extension's calls on the caller's connection,
a context manager and a decorator that put the claim and the business
write in one transaction, and a transaction runner that retries deadlocks
and serialization failures.

Every function takes a connection: a psycopg 3 Connection, Django's
connection (django.db.connection or connections[alias]), a psycopg2
connection, or a pg_idempotency Runner.  Calls run in the connection's
current transaction; the context manager and the decorator open one when
none is open.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, TypeVar, Union)

from . import _protocol as P
from ._protocol import (ClaimResult, Headers, KeyRecord, OffsetRange,
                        Position, Recovered, SequenceAnswer, StoredResponse,
                        Tenant)
from ._sql import Interval, Runner, interval_seconds, runner_for
from .errors import (ClaimNotResolved, KeyExpired, KeyInProgress,
                     KeyMismatch,
                     ProgrammingError, RetryableConflict, classify)

T = TypeVar("T")
#: ``wait``: False (answer in_progress at once), True (wait as the
#: session's lock_timeout and idempotency.wait_timeout allow), or a bound
#: (seconds or timedelta) set for the claim with SET LOCAL.
Wait = Union[bool, int, float, datetime.timedelta]


def run(conn: Any, stmt: P.Statement) -> Any:
    """Run one statement of _protocol on CONN, errors mapped (errors.py)."""
    runner = runner_for(conn)
    sql, params, read = stmt
    try:
        rows = runner.execute(sql, params)
    except Exception as e:      # noqa: BLE001 -- mapped or re-raised
        mapped = classify(e)
        if mapped is None or mapped is e:
            raise
        raise mapped from e
    return read(rows)


def wait_bounds(wait: Wait) -> "tuple[bool, Optional[int]]":
    """(wait flag for idem_claim, milliseconds to SET LOCAL or None)."""
    if wait is True or wait is False:
        return bool(wait), None
    ms = int(round(interval_seconds(wait) * 1000))
    return True, max(ms, 1)


# ------------------------------------------------------------ plain calls

def claim(conn: Any, key: str, request: Any = None, *, scope: str = "",
          ttl: Optional[Interval] = None, lease: Optional[Interval] = None,
          wait: Wait = False, keep_request: bool = False) -> ClaimResult:
    """
    idem_claim in the connection's current transaction.  REQUEST is any
    JSON value (its fingerprint is kept), or None for no check.  With a
    numeric WAIT, idempotency.wait_timeout and lock_timeout are set for
    this call only (SET LOCAL, lock_timeout restored after it).
    """
    flag, ms = wait_bounds(wait)
    runner = runner_for(conn)
    prev = None
    if ms is not None:
        prev = run(runner, P.set_wait(ms, ms))
    result: ClaimResult = run(runner, P.claim(key, request, scope, ttl, lease,
                                              flag, keep_request))
    if prev is not None:
        run(runner, P.restore_lock_timeout(prev))
    return result


def complete(conn: Any, key: str, code: int, body: Any = None, *,
             scope: str = "", token: Optional[int] = None,
             headers: Optional[Headers] = None,
             raw: Optional[bytes] = None) -> None:
    """idem_complete: store CODE with a JSON BODY or RAW bytes, and HEADERS."""
    run(conn, P.complete(key, code, body, scope, token, headers, raw))


def checkpoint(conn: Any, key: str, recovery_point: str, *, scope: str = "",
               token: Optional[int] = None) -> None:
    """idem_checkpoint: record how far a multi-step operation got."""
    run(conn, P.checkpoint(key, recovery_point, scope, token))


def release(conn: Any, key: str, *, scope: str = "",
            token: Optional[int] = None) -> None:
    """idem_release: give the claim up; a retry starts afresh."""
    run(conn, P.release(key, scope, token))


def lookup(conn: Any, key: str, scope: str = "") -> Optional[KeyRecord]:
    """idem_lookup: the role's live record of KEY, or None."""
    return run(conn, P.lookup(key, scope))  # type: ignore[no-any-return]


def recover(conn: Any, lease: Interval, scope: Optional[str] = None,
            max_keys: int = 10) -> List[Recovered]:
    """idem_recover: take over lapsed keep_request claims."""
    return run(conn, P.recover(lease, scope, max_keys))  # type: ignore[no-any-return]


def consume_message(conn: Any, consumer: str, message_id: str,
                    ttl: Optional[Interval] = None, *,
                    tenant: Optional[Tenant] = None) -> bool:
    """
    idem_consume_message: True on the first delivery.  TENANT (the
    tenant whose rows the transaction writes) is for a message ledger
    distributed by Citus, which records the id in that tenant's shard:
    given, the four-argument function is called (extension 0.5.0); not
    given, the three-argument one, as before.
    """
    return run(conn, P.consume_message(consumer, message_id, ttl, tenant))  # type: ignore[no-any-return]


def consume_messages(conn: Any, consumer: str, message_ids: Sequence[str],
                     ttl: Optional[Interval] = None, *,
                     tenant: Optional[Tenant] = None) -> List[str]:
    """idem_consume_messages: the ids that were new, in input order (one
    TENANT for the batch, as consume_message's)."""
    if not message_ids:
        return []
    return run(conn, P.consume_messages(consumer, message_ids, ttl, tenant))  # type: ignore[no-any-return]


# ------------------------------------------------------------ ordered streams
#
# TENANT (keyword, each call; extension 0.5.0): the tenant whose rows the
# transaction writes, for stream positions and producer sequences
# distributed by Citus (idempotency.citus_distribute()), which the call
# then reads and writes in that tenant's shard.  Given, the call's tenant
# overload is made; a server whose positions are not distributed does not
# use it (the node's own positions and sequences, as without it).  Not
# given, the call without it, as before (what a 0.4.0 server has).

def assign(conn: Any, consumer: str, stream: str, parts: Iterable[int],
           generation: int, *,
           tenant: Optional[Tenant] = None) -> Dict[int, Optional[int]]:
    """
    idem_assign: record that CONSUMER now owns PARTS of STREAM with
    GENERATION, and return where to seek each partition: {part: next
    offset}, in partition order, None for a partition never seen (start
    where the application's policy says).  Raises StaleGeneration (ID001,
    nothing changed) if a partition has a higher generation stored.
    """
    return run(conn, P.assign(consumer, stream, list(parts), generation,  # type: ignore[no-any-return]
                              tenant))


def advance(conn: Any, consumer: str, stream: str, part: int,
            first_offset: int, last_offset: int,
            generation: Optional[int] = None, *,
            tenant: Optional[Tenant] = None) -> Optional[OffsetRange]:
    """
    idem_advance, in the connection's current transaction: move PART's
    position past the batch FIRST_OFFSET..LAST_OFFSET and return the part
    of it not applied yet (None when all of it was).  Apply only that
    range in the same transaction; a rollback leaves the position where
    it was.  GENERATION None is unfenced, for a partition that has no
    generation stored; a lower one than stored (or None while one is
    stored) raises StaleGeneration (ID001) and changes nothing.
    """
    return run(conn, P.advance(consumer, stream, part, first_offset,  # type: ignore[no-any-return]
                               last_offset, generation, tenant))


def positions(conn: Any, consumer: str, stream: str, *,
              tenant: Optional[Tenant] = None) -> List[Position]:
    """idem_positions: the role's positions of CONSUMER on STREAM."""
    return run(conn, P.positions(consumer, stream, tenant))  # type: ignore[no-any-return]


def sequence(conn: Any, consumer: str, producer: str, epoch: int, seq: int,
             *, strict: bool = False,
             tenant: Optional[Tenant] = None) -> SequenceAnswer:
    """
    idem_sequence: "new" or "gap" (process the message), "duplicate" or
    "fenced" (skip it), in the connection's current transaction.  With
    STRICT a gap raises SequenceGap (ID002) and records nothing.
    """
    return run(conn, P.sequence(consumer, producer, epoch, seq, strict,  # type: ignore[no-any-return]
                                tenant))


# ------------------------------------------------------------ transactions

def run_in_transaction(conn: Any, fn: Callable[[], T], *,
                       attempts: int = 3) -> T:
    """
    Call FN in a transaction on CONN and commit.  A deadlock (40P01) or
    serialization failure (40001) rolls the transaction back and FN runs
    again, ATTEMPTS times in all; then RetryableConflict is raised.  When a
    transaction is already open, FN runs in it once (a retry needs the
    outermost transaction) and errors are only mapped.
    """
    runner = runner_for(conn)
    outermost = not runner.in_transaction()
    attempt = 0
    while True:
        attempt += 1
        try:
            if outermost:
                with runner.transaction():
                    return fn()
            return fn()
        except Exception as e:  # noqa: BLE001 -- mapped or re-raised
            mapped = classify(e)
            if isinstance(mapped, RetryableConflict) and outermost and \
                    attempt < attempts:
                continue
            if mapped is None or mapped is e:
                raise
            raise mapped from e


class Claim:
    """
    A key this transaction claimed (status "claimed"), or a completed one
    to replay (status "completed", replayed True, response set).
    """

    def __init__(self, runner: Runner, key: str, scope: str,
                 result: ClaimResult) -> None:
        self._runner = runner
        self.key = key
        self.scope = scope
        self.result = result
        self.status = result.status
        self.token = result.token
        self.recovery_point = result.recovery_point
        self.response: Optional[StoredResponse] = result.response
        self.resolved = result.status != "claimed"

    @property
    def replayed(self) -> bool:
        """True when the key was completed before: send self.response."""
        return self.result.status == "completed"

    def _check(self) -> None:
        if self.replayed:
            raise ProgrammingError("key %r was completed earlier: replay its "
                                   "response instead" % self.key)
        if self.resolved:
            raise ProgrammingError("key %r is already %s"
                                   % (self.key, self.status))

    def complete(self, code: int = 200, body: Any = None, *,
                 headers: Optional[Headers] = None,
                 raw: Optional[bytes] = None) -> None:
        """Store the response; it commits with the transaction."""
        self._check()
        complete(self._runner, self.key, code, body, scope=self.scope,
                 headers=headers, raw=raw)
        self.resolved = True
        self.status = "completed"
        self.response = StoredResponse(code=code, body=body,
                                       headers=dict(headers) if headers else None,  # type: ignore[arg-type]
                                       raw=raw)

    def release(self) -> None:
        """Give the key up (commit the transaction; a retry starts afresh)."""
        self._check()
        release(self._runner, self.key, scope=self.scope)
        self.resolved = True
        self.status = "released"

    def checkpoint(self, recovery_point: str) -> None:
        """Record a recovery point; the claim stays in progress."""
        self._check()
        checkpoint(self._runner, self.key, recovery_point, scope=self.scope)
        self.recovery_point = recovery_point


def _claim_or_raise(runner: Runner, key: str, request: Any, scope: str,
                    ttl: Optional[Interval], wait: Wait) -> Claim:
    result = claim(runner, key, request, scope=scope, ttl=ttl, wait=wait)
    if result.status == "in_progress":
        raise KeyInProgress("another request holds key %r" % key)
    if result.status == "mismatch":
        raise KeyMismatch("key %r was used with a different request" % key)
    if result.status == "expired":
        raise KeyExpired("key %r expired: its response is no longer kept, "
                         "and the request is not run again" % key)
    return Claim(runner, key, scope, result)


@contextlib.contextmanager
def claim_key(conn: Any, key: str, request: Any = None, *, scope: str = "",
              ttl: Optional[Interval] = None,
              wait: Wait = False) -> Iterator[Claim]:
    """
    Claim KEY in the connection's transaction (one is opened, and committed
    at the end of the block, when none is open), and yield a Claim:

        with claim_key(conn, key, {"amount": 100}, scope="acct-1") as c:
            if c.replayed:
                return c.response.body
            conn.execute("INSERT INTO charges ...")
            c.complete(201, {"charge": 9})

    Raises KeyInProgress (409) or KeyMismatch (422) before the block runs.
    The block must complete or release a claimed key: leaving it without
    either raises ClaimNotResolved (the transaction must roll back, as
    COMMIT would refuse with 2D000).  An exception in the block rolls back
    the transaction this opened; in the caller's own transaction, the
    caller rolls back (the claim goes with it).
    """
    runner = runner_for(conn)
    if runner.in_transaction():
        c = _claim_or_raise(runner, key, request, scope, ttl, wait)
        yield c
        if not c.resolved:
            raise ClaimNotResolved("key %r was claimed but neither completed "
                                   "nor released" % key)
        return
    with runner.transaction():
        c = _claim_or_raise(runner, key, request, scope, ttl, wait)
        yield c
        if not c.resolved:
            raise ClaimNotResolved("key %r was claimed but neither completed "
                                   "nor released" % key)


def _default_request(args: Sequence[Any], kwargs: Any) -> Any:
    return {"args": list(args), "kwargs": kwargs}


def idempotent(fn: Optional[Callable[..., Any]] = None, *, scope: str = "",
               ttl: Optional[Interval] = None, wait: Wait = False,
               request: Optional[Callable[..., Any]] = None,
               key_arg: str = "idempotency_key",
               key: Optional[Callable[..., str]] = None,
               serialize: Optional[Callable[[Any], Any]] = None,
               deserialize: Optional[Callable[[Any], Any]] = None,
               attempts: int = 3) -> Any:
    """
    Decorator: FN(conn, *args, **kwargs) runs once per key.  Call it with
    the key as keyword argument KEY_ARG (default idempotency_key):

        @idempotent(scope="billing")
        def charge(conn, account, amount):
            conn.execute("INSERT INTO charges ...")
            return {"charged": amount}

        charge(conn, "acct-1", 100, idempotency_key="k-1")

    or have KEY select it from the arguments (AWS Powertools'
    event_key_jmespath), and REQUEST select what a reuse of the key is
    compared with (payload_validation_jmespath):

        @idempotent(key=lambda order: order["id"],
                    request=lambda order: {"amount": order["amount"],
                                           "currency": order["currency"]})
        def pay(conn, order): ...

    FN's return value is stored (JSON, as response code 200) with the
    business write in one transaction and returned; a later call with the
    key returns the stored value without calling FN.  SERIALIZE turns the
    value into JSON (say, a datetime into its isoformat()) and DESERIALIZE
    the stored JSON back on a replay (Powertools' output serializer); a
    value that is not JSON without them is a TypeError, and nothing is
    kept.  FN may return a StoredResponse to choose the code, headers or
    raw bytes; the replay then returns a StoredResponse too.  The
    fingerprint is REQUEST(*args, **kwargs), by default the arguments
    themselves: a call with the key and other arguments raises
    KeyMismatch; a call while another holds the key, KeyInProgress.  When
    CONN has no open transaction, one is opened and committed, and a
    deadlock or serialization failure runs FN again (ATTEMPTS in all).
    """
    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if key is not None:
                k = key(*args, **kwargs)
                if not isinstance(k, str) or k == "":
                    raise TypeError("%s(): key(...) must return a non-empty "
                                    "string, not %r" % (f.__name__, k))
            else:
                try:
                    k = kwargs.pop(key_arg)
                except KeyError:
                    raise TypeError("%s() needs the keyword argument %s"
                                    % (f.__name__, key_arg)) from None
            req = request(*args, **kwargs) if request \
                else _default_request(args, kwargs)
            runner = runner_for(conn)

            def once() -> Any:
                with claim_key(runner, k, req, scope=scope, ttl=ttl,
                               wait=wait) as c:
                    if c.replayed:
                        if deserialize is not None:
                            stored = c.response
                            return deserialize(stored.body
                                               if stored is not None
                                               else None)
                        return _replay_value(c.response)
                    result = f(conn, *args, **kwargs)
                    if serialize is None and isinstance(result,
                                                        StoredResponse):
                        c.complete(result.code, result.body,
                                   headers=result.headers, raw=result.raw)
                    else:
                        c.complete(200, _to_json(f, result, serialize))
                    return result
            return run_in_transaction(runner, once, attempts=attempts)
        return wrapper
    if fn is not None:
        return deco(fn)
    return deco


def _to_json(f: Callable[..., Any], value: Any,
             serialize: Optional[Callable[[Any], Any]]) -> Any:
    """VALUE as the JSON to store (through SERIALIZE when given); a
    TypeError naming the hook when it is not JSON."""
    import json
    out = serialize(value) if serialize is not None else value
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError("%s() returned a value that is not JSON (%s); give "
                        "@idempotent(serialize=..., deserialize=...) to "
                        "store it" % (f.__name__, e)) from e
    return out


def _replay_value(resp: Optional[StoredResponse]) -> Any:
    if resp is None:
        return None
    if resp.code == 200 and resp.raw is None and not resp.headers:
        return resp.body
    return resp

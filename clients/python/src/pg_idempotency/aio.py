"""
The asyncio core, on psycopg 3's AsyncConnection: the same calls, context
managers and helpers as pg_idempotency.core, .consumer and .twophase,
awaited.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Iterable,
                    List, Optional, Sequence, TypeVar)

from . import _protocol as P
from ._protocol import (ClaimResult, Headers, KeyRecord, OffsetRange,
                        Position, Recovered, SequenceAnswer, StoredResponse,
                        Tenant)
from ._sql import AsyncRunner, Interval, async_runner_for
from .consumer import record_offset
from .core import (Wait, _default_request, _replay_value, _to_json,
                   wait_bounds)
from .errors import (ClaimNotResolved, KeyExpired, KeyInProgress,
                     KeyMismatch,
                     ProgrammingError, RetryableConflict, classify)

T = TypeVar("T")
log = logging.getLogger("pg_idempotency")


async def run(conn: Any, stmt: P.Statement) -> Any:
    runner = async_runner_for(conn)
    sql, params, read = stmt
    try:
        rows = await runner.execute(sql, params)
    except Exception as e:      # noqa: BLE001 -- mapped or re-raised
        mapped = classify(e)
        if mapped is None or mapped is e:
            raise
        raise mapped from e
    return read(rows)


async def claim(conn: Any, key: str, request: Any = None, *, scope: str = "",
                ttl: Optional[Interval] = None,
                lease: Optional[Interval] = None, wait: Wait = False,
                keep_request: bool = False) -> ClaimResult:
    """As core.claim()."""
    flag, ms = wait_bounds(wait)
    runner = async_runner_for(conn)
    prev = None
    if ms is not None:
        prev = await run(runner, P.set_wait(ms, ms))
    result: ClaimResult = await run(runner, P.claim(
        key, request, scope, ttl, lease, flag, keep_request))
    if prev is not None:
        await run(runner, P.restore_lock_timeout(prev))
    return result


async def complete(conn: Any, key: str, code: int, body: Any = None, *,
                   scope: str = "", token: Optional[int] = None,
                   headers: Optional[Headers] = None,
                   raw: Optional[bytes] = None) -> None:
    """As core.complete()."""
    await run(conn, P.complete(key, code, body, scope, token, headers, raw))


async def checkpoint(conn: Any, key: str, recovery_point: str, *,
                     scope: str = "", token: Optional[int] = None) -> None:
    """As core.checkpoint()."""
    await run(conn, P.checkpoint(key, recovery_point, scope, token))


async def release(conn: Any, key: str, *, scope: str = "",
                  token: Optional[int] = None) -> None:
    """As core.release()."""
    await run(conn, P.release(key, scope, token))


async def lookup(conn: Any, key: str, scope: str = "") -> Optional[KeyRecord]:
    """As core.lookup()."""
    return await run(conn, P.lookup(key, scope))  # type: ignore[no-any-return]


async def recover(conn: Any, lease: Interval, scope: Optional[str] = None,
                  max_keys: int = 10) -> List[Recovered]:
    """As core.recover()."""
    return await run(conn, P.recover(lease, scope, max_keys))  # type: ignore[no-any-return]


async def consume_message(conn: Any, consumer: str, message_id: str,
                          ttl: Optional[Interval] = None, *,
                          tenant: Optional[Tenant] = None) -> bool:
    """As core.consume_message()."""
    return await run(conn, P.consume_message(consumer, message_id, ttl,  # type: ignore[no-any-return]
                                             tenant))


async def consume_messages(conn: Any, consumer: str,
                           message_ids: Sequence[str],
                           ttl: Optional[Interval] = None, *,
                           tenant: Optional[Tenant] = None) -> List[str]:
    """As core.consume_messages()."""
    if not message_ids:
        return []
    return await run(conn, P.consume_messages(consumer, message_ids, ttl,  # type: ignore[no-any-return]
                                              tenant))


async def assign(conn: Any, consumer: str, stream: str, parts: Iterable[int],
                 generation: int, *,
                 tenant: Optional[Tenant] = None) -> Dict[int, Optional[int]]:
    """As core.assign()."""
    return await run(conn, P.assign(consumer, stream, list(parts),  # type: ignore[no-any-return]
                                    generation, tenant))


async def advance(conn: Any, consumer: str, stream: str, part: int,
                  first_offset: int, last_offset: int,
                  generation: Optional[int] = None, *,
                  tenant: Optional[Tenant] = None) -> Optional[OffsetRange]:
    """As core.advance()."""
    return await run(conn, P.advance(consumer, stream, part, first_offset,  # type: ignore[no-any-return]
                                     last_offset, generation, tenant))


async def positions(conn: Any, consumer: str, stream: str, *,
                    tenant: Optional[Tenant] = None) -> List[Position]:
    """As core.positions()."""
    return await run(conn, P.positions(consumer, stream, tenant))  # type: ignore[no-any-return]


async def sequence(conn: Any, consumer: str, producer: str, epoch: int,
                   seq: int, *, strict: bool = False,
                   tenant: Optional[Tenant] = None) -> SequenceAnswer:
    """As core.sequence()."""
    return await run(conn, P.sequence(consumer, producer, epoch, seq,  # type: ignore[no-any-return]
                                      strict, tenant))


async def run_in_transaction(conn: Any, fn: Callable[[], Awaitable[T]], *,
                             attempts: int = 3) -> T:
    """As core.run_in_transaction(), FN a coroutine function."""
    runner = async_runner_for(conn)
    outermost = not runner.in_transaction()
    attempt = 0
    while True:
        attempt += 1
        try:
            if outermost:
                async with runner.transaction():
                    return await fn()
            return await fn()
        except Exception as e:  # noqa: BLE001 -- mapped or re-raised
            mapped = classify(e)
            if isinstance(mapped, RetryableConflict) and outermost and \
                    attempt < attempts:
                continue
            if mapped is None or mapped is e:
                raise
            raise mapped from e


class Claim:
    """As core.Claim, with awaitable methods."""

    def __init__(self, runner: AsyncRunner, key: str, scope: str,
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
        return self.result.status == "completed"

    def _check(self) -> None:
        if self.resolved:
            raise ProgrammingError("key %r is already %s"
                                   % (self.key, self.status))

    async def complete(self, code: int = 200, body: Any = None, *,
                       headers: Optional[Headers] = None,
                       raw: Optional[bytes] = None) -> None:
        self._check()
        await complete(self._runner, self.key, code, body, scope=self.scope,
                       headers=headers, raw=raw)
        self.resolved = True
        self.status = "completed"
        self.response = StoredResponse(code=code, body=body, raw=raw,
                                       headers=dict(headers) if headers else None)  # type: ignore[arg-type]

    async def release(self) -> None:
        self._check()
        await release(self._runner, self.key, scope=self.scope)
        self.resolved = True
        self.status = "released"

    async def checkpoint(self, recovery_point: str) -> None:
        self._check()
        await checkpoint(self._runner, self.key, recovery_point,
                         scope=self.scope)
        self.recovery_point = recovery_point


async def _claim_or_raise(runner: AsyncRunner, key: str, request: Any,
                          scope: str, ttl: Optional[Interval],
                          wait: Wait) -> Claim:
    result = await claim(runner, key, request, scope=scope, ttl=ttl,
                         wait=wait)
    if result.status == "in_progress":
        raise KeyInProgress("another request holds key %r" % key)
    if result.status == "mismatch":
        raise KeyMismatch("key %r was used with a different request" % key)
    if result.status == "expired":
        raise KeyExpired("key %r expired: its response is no longer kept, "
                         "and the request is not run again" % key)
    return Claim(runner, key, scope, result)


@contextlib.asynccontextmanager
async def claim_key(conn: Any, key: str, request: Any = None, *,
                    scope: str = "", ttl: Optional[Interval] = None,
                    wait: Wait = False) -> AsyncIterator[Claim]:
    """As core.claim_key(), ``async with``."""
    runner = async_runner_for(conn)
    if runner.in_transaction():
        c = await _claim_or_raise(runner, key, request, scope, ttl, wait)
        yield c
        if not c.resolved:
            raise ClaimNotResolved("key %r was claimed but neither completed "
                                   "nor released" % key)
        return
    async with runner.transaction():
        c = await _claim_or_raise(runner, key, request, scope, ttl, wait)
        yield c
        if not c.resolved:
            raise ClaimNotResolved("key %r was claimed but neither completed "
                                   "nor released" % key)


def idempotent(fn: Optional[Callable[..., Any]] = None, *, scope: str = "",
               ttl: Optional[Interval] = None, wait: Wait = False,
               request: Optional[Callable[..., Any]] = None,
               key_arg: str = "idempotency_key",
               key: Optional[Callable[..., str]] = None,
               serialize: Optional[Callable[[Any], Any]] = None,
               deserialize: Optional[Callable[[Any], Any]] = None,
               attempts: int = 3) -> Any:
    """As core.idempotent(), for a coroutine function."""
    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        async def wrapper(conn: Any, *args: Any, **kwargs: Any) -> Any:
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
            runner = async_runner_for(conn)

            async def once() -> Any:
                async with claim_key(runner, k, req, scope=scope, ttl=ttl,
                                     wait=wait) as c:
                    if c.replayed:
                        if deserialize is not None:
                            stored = c.response
                            return deserialize(stored.body
                                               if stored is not None
                                               else None)
                        return _replay_value(c.response)
                    result = await f(conn, *args, **kwargs)
                    if serialize is None and isinstance(result,
                                                        StoredResponse):
                        await c.complete(result.code, result.body,
                                         headers=result.headers,
                                         raw=result.raw)
                    else:
                        await c.complete(200, _to_json(f, result, serialize))
                    return result
            return await run_in_transaction(runner, once, attempts=attempts)
        return wrapper
    if fn is not None:
        return deco(fn)
    return deco


async def consume_batch(conn: Any, consumer: str, messages: Sequence[Any],
                        handler: Callable[[Any, Any], Awaitable[Any]], *,
                        message_id: Callable[[Any], Any] = str,
                        ttl: Optional[Interval] = None,
                        tenant: Optional[Tenant] = None,
                        attempts: int = 3) -> List[Any]:
    """As consumer.consume_batch(), HANDLER a coroutine function."""
    msgs = list(messages)
    runner = async_runner_for(conn)

    async def once() -> List[Any]:
        ids = [str(message_id(m)) for m in msgs]
        fresh = set(await consume_messages(runner, consumer, ids, ttl,
                                           tenant=tenant))
        done: List[Any] = []
        for m, i in zip(msgs, ids):
            if i in fresh:
                fresh.discard(i)
                await handler(conn, m)
                done.append(m)
        return done
    return await run_in_transaction(runner, once, attempts=attempts)


class StreamConsumer:
    """As consumer.StreamConsumer, on an AsyncConnection; HANDLER is a
    coroutine function."""

    def __init__(self, conn: Any, consumer: str, stream: str, *,
                 offset: Callable[[Any], int] = record_offset,
                 generation: Optional[int] = None,
                 tenant: Optional[Tenant] = None,
                 attempts: int = 3) -> None:
        P.tenant_param(tenant)      # a bad tenant fails here, not later
        self.runner = async_runner_for(conn)
        self.conn = conn
        self.consumer = consumer
        self.stream = stream
        self.offset = offset
        self.generation = generation
        self.tenant = tenant
        self.attempts = attempts

    async def assign(self, parts: Iterable[int], generation: int
                     ) -> Dict[int, Optional[int]]:
        """As consumer.StreamConsumer.assign()."""
        parts = list(parts)

        async def once() -> Dict[int, Optional[int]]:
            return await assign(self.runner, self.consumer, self.stream,
                                parts, generation, tenant=self.tenant)
        seeks = await run_in_transaction(self.runner, once,
                                         attempts=self.attempts)
        self.generation = generation
        return seeks

    async def process(self, part: int, records: Iterable[Any],
                      handler: Callable[[Any, List[Any]], Awaitable[Any]]
                      ) -> List[Any]:
        """As consumer.StreamConsumer.process()."""
        batch = list(records)
        if not batch:
            return []
        offsets = [self.offset(r) for r in batch]
        first, last = min(offsets), max(offsets)

        async def once() -> List[Any]:
            todo = await advance(self.runner, self.consumer, self.stream,
                                 part, first, last, self.generation,
                                 tenant=self.tenant)
            if todo is None:
                return []
            fresh = [r for r, o in zip(batch, offsets)
                     if todo.first <= o <= todo.last]
            if fresh:
                await handler(self.conn, fresh)
            return fresh
        return await run_in_transaction(self.runner, once,
                                        attempts=self.attempts)

    async def positions(self) -> List[Position]:
        """The stored positions of this consumer on its stream."""
        return await positions(self.runner, self.consumer, self.stream,
                               tenant=self.tenant)

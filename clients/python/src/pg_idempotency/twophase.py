"""
Two-phase mode, for work that calls an external system (a payment
provider, an e-mail service) which cannot join the database transaction:
claim the key with a lease and commit; call; complete with the token (or
release on failure); checkpoint between the steps of multi-step work.  A
Recoverer takes over the claims of processes that died (idem_recover).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator, Optional

from ._protocol import Headers, Recovered, StoredResponse
from ._sql import Interval, Runner, runner_for
from .core import Wait, checkpoint, claim, complete, recover, release
from .errors import (ClaimNotResolved, KeyExpired, KeyInProgress,
                     KeyMismatch,
                     ProgrammingError)

log = logging.getLogger("pg_idempotency")


class Operation:
    """
    A two-phase claim this process holds (token set), or a completed key to
    replay (replayed True, response set).  Each method runs in a
    transaction of its own, or, when the connection has a transaction open
    (with the business write of the step), in a savepoint of it.
    """

    def __init__(self, runner: Runner, key: str, scope: str,
                 token: Optional[int], recovery_point: Optional[str] = None,
                 request: Any = None,
                 response: Optional[StoredResponse] = None) -> None:
        self._runner = runner
        self.key = key
        self.scope = scope
        self.token = token
        self.recovery_point = recovery_point
        self.request = request
        self.response = response
        self.replayed = response is not None
        self.resolved = self.replayed
        self.status = "completed" if self.replayed else "claimed"

    def _check(self) -> None:
        if self.resolved:
            raise ProgrammingError("key %r is already %s"
                                   % (self.key, self.status))

    def checkpoint(self, recovery_point: str) -> None:
        """Record how far the work got; a taker-over starts from there."""
        self._check()
        with self._runner.transaction():
            checkpoint(self._runner, self.key, recovery_point,
                       scope=self.scope, token=self.token)
        self.recovery_point = recovery_point

    def complete(self, code: int = 200, body: Any = None, *,
                 headers: Optional[Headers] = None,
                 raw: Optional[bytes] = None) -> None:
        """Store the response with the token.  StaleToken if the key was
        taken over meanwhile (the transaction then rolls back)."""
        self._check()
        with self._runner.transaction():
            complete(self._runner, self.key, code, body, scope=self.scope,
                     token=self.token, headers=headers, raw=raw)
        self.resolved = True
        self.status = "completed"
        self.response = StoredResponse(code=code, body=body, raw=raw,
                                       headers=dict(headers) if headers else None)  # type: ignore[arg-type]

    def release(self) -> None:
        """Give the claim up: the next claim of the key starts afresh (with
        the last recovery point)."""
        self._check()
        with self._runner.transaction():
            release(self._runner, self.key, scope=self.scope,
                    token=self.token)
        self.resolved = True
        self.status = "released"


@contextlib.contextmanager
def two_phase(conn: Any, key: str, request: Any = None, *, lease: Interval,
              scope: str = "", ttl: Optional[Interval] = None,
              keep_request: bool = False, wait: Wait = False,
              release_on_error: bool = True) -> Iterator[Operation]:
    """
    Claim KEY with a LEASE and commit the claim, then yield an Operation:

        with two_phase(conn, key, body, lease="30 seconds",
                       keep_request=True) as op:
            if op.replayed:
                return op.response
            if op.recovery_point != "charged":
                provider.charge(...)            # outside any transaction
                op.checkpoint("charged")
            op.complete(201, {"status": "ok"})

    CONN must have no transaction open (the claim has to commit before the
    call).  Until the lease runs out, duplicates get KeyInProgress (or wait,
    with WAIT and idempotency.wait_timeout); after it, another claim or a
    Recoverer (with KEEP_REQUEST) takes the key over and this holder's
    token is refused (StaleToken).  An exception in the block releases the
    claim (RELEASE_ON_ERROR), so a retry starts afresh; leaving the block
    without completing or releasing raises ClaimNotResolved (the claim
    stays in progress until its lease lapses).
    """
    runner = runner_for(conn)
    if runner.in_transaction():
        raise ProgrammingError("two_phase() needs a connection without an "
                               "open transaction: its claim commits before "
                               "the external call")
    with runner.transaction():
        result = claim(runner, key, request, scope=scope, ttl=ttl,
                       lease=lease, wait=wait, keep_request=keep_request)
    if result.status == "in_progress":
        raise KeyInProgress("another process holds key %r" % key)
    if result.status == "mismatch":
        raise KeyMismatch("key %r was used with a different request" % key)
    if result.status == "expired":
        raise KeyExpired("key %r expired: its response is no longer kept, "
                         "and the request is not run again" % key)
    op = Operation(runner, key, scope, result.token, result.recovery_point,
                   request, result.response)
    if op.replayed:
        yield op
        return
    try:
        yield op
    except BaseException:
        if release_on_error and not op.resolved:
            _release_quietly(runner, op)
        raise
    if not op.resolved:
        raise ClaimNotResolved("two-phase key %r was neither completed nor "
                               "released; it stays claimed until its lease "
                               "lapses" % key)


def _release_quietly(runner: Runner, op: Operation) -> None:
    try:
        if runner.in_transaction():
            # the block's failed transaction: end it before releasing
            conn = getattr(runner, "connection", None)
            if conn is not None and hasattr(conn, "rollback"):
                conn.rollback()
        op.release()
    except Exception as e:      # noqa: BLE001 -- the lease lapses anyway
        log.warning("pg_idempotency: could not release key %r (%s); it is "
                    "released when its lease lapses", op.key, e)


class Recoverer:
    """
    Takes over lapsed two-phase claims made with keep_request and finishes
    them with HANDLER(op), op being an Operation whose request,
    recovery_point and token are the kept request, the last recovery point
    and the new token.  The handler completes (or releases) the key; if it
    raises, the key is released (ON_ERROR "release") or left to lapse again
    (ON_ERROR "leave").  Run it in a thread or process of its own:

        rec = Recoverer(conn, finish_charge, lease="5 minutes", scope="pay")
        rec.run(stop_event, interval=10)

    Each takeover commits before HANDLER runs (its new token is what
    fences the old holder); concurrent recoverers split the lapsed claims.
    """

    def __init__(self, conn: Any, handler: Callable[[Operation], Any], *,
                 lease: Interval, scope: Optional[str] = None,
                 max_keys: int = 10, on_error: str = "release") -> None:
        if on_error not in ("release", "leave"):
            raise ValueError("on_error is 'release' or 'leave'")
        self._runner = runner_for(conn)
        self.handler = handler
        self.lease = lease
        self.scope = scope
        self.max_keys = max_keys
        self.on_error = on_error

    def take(self) -> "list[Recovered]":
        """Take lapsed claims over (committed); return them."""
        if self._runner.in_transaction():
            raise ProgrammingError("Recoverer needs a connection without an "
                                   "open transaction")
        with self._runner.transaction():
            return recover(self._runner, self.lease, self.scope,
                           self.max_keys)

    def run_once(self) -> int:
        """One round: take lapsed claims over and finish each; returns how
        many were taken."""
        taken = self.take()
        for r in taken:
            op = Operation(self._runner, r.key, r.scope, r.token,
                           r.recovery_point, r.request)
            try:
                self.handler(op)
            except Exception as e:  # noqa: BLE001 -- logged, key handled
                log.warning("pg_idempotency: recovering key %r failed: %s",
                            r.key, e)
                if self.on_error == "release" and not op.resolved:
                    _release_quietly(self._runner, op)
                continue
            if not op.resolved:
                log.warning("pg_idempotency: recovered key %r was neither "
                            "completed nor released; it lapses again",
                            r.key)
        return len(taken)

    def run(self, stop: threading.Event, interval: float = 10.0) -> None:
        """Rounds until STOP is set: at once again after a full round, else
        after INTERVAL seconds."""
        while not stop.is_set():
            n = self.run_once()
            if n < self.max_keys:
                stop.wait(interval)
            else:
                time.sleep(0)

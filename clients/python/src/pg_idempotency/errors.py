"""
Errors, and the mapping of the extension's SQLSTATEs (and of a store that
cannot be reached) onto them.  Every error that an HTTP adapter turns into
an answer carries its status; see the README's status-code table.
"""

from __future__ import annotations

from typing import Any, Optional


class IdempotencyError(Exception):
    """Base class of every error this library raises."""

    #: HTTP status an adapter answers with (None: not an HTTP answer).
    http_status: Optional[int] = None
    #: problem type suffix (see pg_idempotency.http)
    problem: str = "error"
    title: str = "Idempotency error"

    def __init__(self, detail: str = "", *, sqlstate: Optional[str] = None,
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.sqlstate = sqlstate
        if cause is not None:
            self.__cause__ = cause


class KeyInProgress(IdempotencyError):
    """Another request holds the key right now (idem_claim: in_progress)."""
    http_status = 409
    problem = "in-progress"
    title = "A request is outstanding for this Idempotency-Key"


class KeyMismatch(IdempotencyError):
    """The key was used with a different request (idem_claim: mismatch)."""
    http_status = 422
    problem = "mismatch"
    title = "Idempotency-Key is already used for another request"


class KeyExpired(IdempotencyError):
    """
    The key's retention passed and the server remembers it (idem_claim:
    expired, with idempotency.key_memory): its response is no longer kept
    and the request must not run again.  HTTP 410 (expired).
    """
    http_status = 410
    problem = "expired"
    title = "Idempotency-Key has expired"


class Busy(IdempotencyError):
    """
    A wait for the key ran out: lock_timeout (55P03) or statement_timeout
    (57014).  HTTP 409 or 503, as configured (busy_status).
    """
    http_status = 409
    problem = "busy"
    title = "The Idempotency-Key is busy"


class StoreUnavailable(IdempotencyError):
    """The database cannot be reached or has no room (HTTP 503)."""
    http_status = 503
    problem = "unavailable"
    title = "The idempotency store is unavailable"


class RetryableConflict(IdempotencyError):
    """
    A deadlock (40P01) or serialization failure (40001): the transaction
    rolled back and may be run again; raised when the retries ran out (503).
    """
    http_status = 503
    problem = "conflict"
    title = "The request conflicted with another one; retry it"


class ResponseTooLarge(IdempotencyError):
    """
    The response was larger than idempotency.max_response_bytes (54000):
    the transaction rolled back, business write included, so a retry is
    safe.  HTTP 500 (or 413, as configured: too_large_status).
    """
    http_status = 500
    problem = "response-too-large"
    title = "The response is too large to be stored"


class StaleToken(IdempotencyError):
    """
    A two-phase holder's token is no longer the key's (55006): the key was
    taken over after the lease lapsed, or another transaction is writing it.
    """
    http_status = 409
    problem = "taken-over"
    title = "The claim was taken over"


class StaleGeneration(IdempotencyError):
    """
    ID001: a stream call (idem_assign, idem_advance) with a generation lower
    than the one stored for a partition.  The partition was assigned to
    another consumer since (this one is a zombie): the call changed
    nothing, its transaction rolls back with the batch's writes, and this
    consumer must stop processing the partition.  Not an HTTP answer.
    """
    problem = "stale-generation"
    title = "The partition was assigned to another consumer"


class SequenceGap(IdempotencyError):
    """
    ID002: idem_sequence(..., strict=True) saw a sequence number beyond the
    next one expected from the producer; nothing was recorded.
    """
    problem = "sequence-gap"
    title = "A producer sequence number was skipped"


class ProgrammingError(IdempotencyError):
    """
    A misuse of the protocol: a same-transaction claim committed neither
    completed nor released (2D000), completing a key that is not claimed
    (55000), a bad argument (22xxx).  A bug in the application: HTTP 500.
    """
    http_status = 500
    problem = "internal"
    title = "Internal error"


class ClaimNotResolved(ProgrammingError):
    """2D000: a same-transaction claim neither completed nor released."""


class ConfigurationError(ProgrammingError):
    """
    The library is set up so that it cannot keep its contract: an ASGI
    handler that is not ``async def`` or that drops a database call
    without awaiting it, an authentication middleware that runs after the
    idempotency middleware.  Raised at start-up where it can be seen
    then; at request time an HTTP adapter answers 500 (misconfigured),
    rolls back, and logs the message on the "pg_idempotency" logger.
    """
    problem = "misconfigured"
    title = "The server is misconfigured"


class NoCaller(ConfigurationError):
    """
    The request's caller could not be established (the caller function,
    by default the framework's authenticated user, found none) and the
    adapter is not set to take anonymous requests: HTTP 500 (no-caller),
    nothing done.  A library that scopes keys by caller never falls back
    to a scope shared by all callers.
    """
    problem = "no-caller"
    title = "The caller could not be established"


_RETRYABLE = {"40P01", "40001"}
_BUSY = {"55P03", "57014"}


def sqlstate_of(exc: BaseException) -> Optional[str]:
    """The SQLSTATE of a driver error (psycopg 3, psycopg2, or Django's
    wrapper of either), or None."""
    seen = 0
    e: Optional[BaseException] = exc
    while e is not None and seen < 5:
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if isinstance(code, str) and code:
            return code
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def _is_connection_failure(exc: BaseException) -> bool:
    e: Optional[BaseException] = exc
    for _ in range(5):
        if e is None:
            return False
        name = type(e).__name__
        mod = type(e).__module__
        if name in ("OperationalError", "InterfaceError", "PoolTimeout",
                    "PoolClosed", "TooManyRequests") and (
                mod.startswith("psycopg") or mod.startswith("django")):
            return True
        e = e.__cause__ or e.__context__
    return False


def classify(exc: BaseException) -> Optional[IdempotencyError]:
    """
    The IdempotencyError a driver exception stands for, or None when it is
    none of the extension's conditions (an error of the application's own
    SQL, say): 40P01/40001 retryable, 55P03/57014 busy, 54000 too large,
    55006 stale token, ID001 stale generation, ID002 sequence gap, 2D000
    claim not resolved, 55000 not claimed, class 08 and unreachable
    servers unavailable, 53xxx (no resources) unavailable.
    """
    if isinstance(exc, IdempotencyError):
        return exc
    code = sqlstate_of(exc)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if code in _RETRYABLE:
        return RetryableConflict(msg, sqlstate=code, cause=exc)
    if code in _BUSY:
        return Busy(msg, sqlstate=code, cause=exc)
    if code == "54000":
        return ResponseTooLarge(msg, sqlstate=code, cause=exc)
    if code == "55006":
        return StaleToken(msg, sqlstate=code, cause=exc)
    if code == "ID001":
        return StaleGeneration(msg, sqlstate=code, cause=exc)
    if code == "ID002":
        return SequenceGap(msg, sqlstate=code, cause=exc)
    if code == "2D000":
        return ClaimNotResolved(msg, sqlstate=code, cause=exc)
    if code == "55000" and "claim" in msg:
        return ProgrammingError(msg, sqlstate=code, cause=exc)
    if code is not None and (code.startswith("08") or code.startswith("53")
                             or code in ("57P01", "57P02", "57P03")):
        return StoreUnavailable(msg, sqlstate=code, cause=exc)
    if code is None and _is_connection_failure(exc):
        return StoreUnavailable(msg or type(exc).__name__, cause=exc)
    return None


def raise_classified(exc: BaseException) -> Any:
    """Raise classify(exc) from exc if it is one of ours, else exc."""
    mapped = classify(exc)
    if mapped is None or mapped is exc:
        raise exc
    raise mapped from exc

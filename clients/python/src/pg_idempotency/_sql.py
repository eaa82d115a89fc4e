"""
The SQL runner abstraction: the rest of the library runs its statements
through a Runner (or an AsyncRunner), never through a driver directly, so
that psycopg 3, psycopg2 and Django's own connection all work.

Statements use the "format" parameter style (%s), which every supported
driver takes, and cast every parameter explicitly (%s::text, %s::jsonb,
...), so that no driver's type adaptation matters: parameters are str, int,
bool, bytes or None only.  Results are lists of tuples; bytea columns come
back as bytes (psycopg2's memoryview is converted) and JSON is selected as
text and parsed here, so every driver gives the same values.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import (Any, Iterator, List, Optional, Protocol,
                    Sequence, Tuple, Union, runtime_checkable)

Row = Tuple[Any, ...]
Params = Sequence[Any]
#: A ttl or lease: a timedelta, seconds (int or float), or PostgreSQL
#: interval text such as ``"24 hours"``.
Interval = Union[datetime.timedelta, int, float, str]


@runtime_checkable
class Runner(Protocol):
    """Runs SQL on one connection, synchronously."""

    def execute(self, sql: str, params: Params = ()) -> List[Row]:
        """Run one statement; return its rows ([] if it returns none)."""

    def transaction(self) -> "contextlib.AbstractContextManager[Any]":
        """A transaction block: the outermost one commits at its end and
        rolls back on an exception; a nested one is a savepoint."""

    def in_transaction(self) -> bool:
        """Whether a transaction is open on the connection."""


@runtime_checkable
class AsyncRunner(Protocol):
    """Runs SQL on one connection, with asyncio."""

    async def execute(self, sql: str, params: Params = ()) -> List[Row]:
        """Run one statement; return its rows ([] if it returns none)."""

    def transaction(self) -> "contextlib.AbstractAsyncContextManager[Any]":
        """As Runner.transaction(), async."""

    def in_transaction(self) -> bool:
        """Whether a transaction is open on the connection."""


def _fix(row: Sequence[Any]) -> Row:
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)


class PsycopgRunner:
    """A psycopg 3 connection (psycopg.Connection)."""

    def __init__(self, conn: Any) -> None:
        self.connection = conn

    def execute(self, sql: str, params: Params = ()) -> List[Row]:
        cur = self.connection.execute(sql, tuple(params))
        if cur.description is None:
            return []
        return [_fix(r) for r in cur.fetchall()]

    def transaction(self) -> Any:
        return self.connection.transaction()

    def in_transaction(self) -> bool:
        import psycopg
        return bool(self.connection.info.transaction_status !=
                    psycopg.pq.TransactionStatus.IDLE)


class AsyncPsycopgRunner:
    """A psycopg 3 asyncio connection (psycopg.AsyncConnection)."""

    def __init__(self, conn: Any) -> None:
        self.connection = conn

    async def execute(self, sql: str, params: Params = ()) -> List[Row]:
        cur = await self.connection.execute(sql, tuple(params))
        if cur.description is None:
            return []
        return [_fix(r) for r in await cur.fetchall()]

    def transaction(self) -> Any:
        return self.connection.transaction()

    def in_transaction(self) -> bool:
        import psycopg
        return bool(self.connection.info.transaction_status !=
                    psycopg.pq.TransactionStatus.IDLE)


class DbapiRunner:
    """
    Any DB-API 2 connection with the "format" parameter style whose
    transactions are managed here with BEGIN-less DB-API semantics
    (psycopg2): the outermost transaction() commits or rolls back with the
    connection's commit()/rollback(), a nested one uses a savepoint.
    """

    def __init__(self, conn: Any) -> None:
        self.connection = conn
        self._depth = 0

    def execute(self, sql: str, params: Params = ()) -> List[Row]:
        cur = self.connection.cursor()
        try:
            cur.execute(sql, tuple(params))
            if cur.description is None:
                return []
            return [_fix(r) for r in cur.fetchall()]
        finally:
            cur.close()

    def in_transaction(self) -> bool:
        status = getattr(self.connection, "get_transaction_status", None)
        if status is not None:          # psycopg2: 0 is idle
            return bool(status() != 0)
        return self._depth > 0

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        if self._depth == 0 and not self.in_transaction() and \
                not getattr(self.connection, "autocommit", False):
            self._depth += 1
            try:
                yield None
            except BaseException:
                self._depth -= 1
                self.connection.rollback()
                raise
            self._depth -= 1
            self.connection.commit()
            return
        if getattr(self.connection, "autocommit", False) and \
                not self.in_transaction():
            # autocommit: an explicit BEGIN ... COMMIT
            self._depth += 1
            self.execute("BEGIN")
            try:
                yield None
            except BaseException:
                self._depth -= 1
                self.execute("ROLLBACK")
                raise
            self._depth -= 1
            self.execute("COMMIT")
            return
        name = "pg_idempotency_%d" % self._depth
        self._depth += 1
        self.execute("SAVEPOINT " + name)
        try:
            yield None
        except BaseException:
            self._depth -= 1
            self.execute("ROLLBACK TO SAVEPOINT " + name)
            self.execute("RELEASE SAVEPOINT " + name)
            raise
        self._depth -= 1
        self.execute("RELEASE SAVEPOINT " + name)


class DjangoRunner:
    """
    Django's connection for a database alias (its PostgreSQL backend:
    psycopg2 on Django 3.2, psycopg 2 or 3 on later ones).  Transactions
    are django.db.transaction.atomic(using=alias), so they nest with the
    application's own atomic blocks and ATOMIC_REQUESTS.
    """

    def __init__(self, using: Optional[str] = None) -> None:
        from django.db import DEFAULT_DB_ALIAS
        self.using = using or DEFAULT_DB_ALIAS

    @property
    def connection(self) -> Any:
        from django.db import connections
        return connections[self.using]

    def execute(self, sql: str, params: Params = ()) -> List[Row]:
        with self.connection.cursor() as cur:
            cur.execute(sql, list(params))
            if cur.description is None:
                return []
            return [_fix(r) for r in cur.fetchall()]

    def transaction(self) -> Any:
        from django.db import transaction
        return transaction.atomic(using=self.using)

    def in_transaction(self) -> bool:
        return bool(self.connection.in_atomic_block)


def runner_for(obj: Any) -> Runner:
    """
    The Runner for OBJ: a Runner as it is; a psycopg 3 Connection; a Django
    connection wrapper (django.db.connection); or a DB-API connection such
    as psycopg2's.  A psycopg 3 Cursor or a Transaction stands for its
    connection.
    """
    if isinstance(obj, (PsycopgRunner, DbapiRunner, DjangoRunner)):
        return obj
    mod = type(obj).__module__
    if mod.startswith("psycopg.") or mod == "psycopg":
        conn = getattr(obj, "connection", None)
        if type(obj).__name__ in ("Cursor", "ClientCursor", "ServerCursor",
                                  "Transaction", "RawCursor") and conn is not None:
            obj = conn
        if getattr(obj, "pgconn", None) is not None and \
                hasattr(obj, "transaction"):
            if type(obj).__name__.startswith("Async"):
                raise TypeError("an AsyncConnection needs the async API "
                                "(pg_idempotency.aio)")
            return PsycopgRunner(obj)
    if mod.startswith("django.db"):
        return DjangoRunner(getattr(obj, "alias", None))
    if isinstance(obj, Runner):
        return obj
    if hasattr(obj, "cursor") and hasattr(obj, "commit"):
        return DbapiRunner(obj)
    raise TypeError("not a connection pg_idempotency knows: %r" % (obj,))


def async_runner_for(obj: Any) -> AsyncRunner:
    """The AsyncRunner for a psycopg.AsyncConnection (or an AsyncRunner)."""
    if isinstance(obj, AsyncPsycopgRunner):
        return obj
    if type(obj).__module__ == "pg_idempotency.asgi":
        obj = obj.__wrapped__           # connection(request)
    mod = type(obj).__module__
    if (mod.startswith("psycopg.") or mod == "psycopg") and \
            type(obj).__name__.startswith("Async"):
        conn = getattr(obj, "connection", None)
        if type(obj).__name__ != "AsyncConnection" and conn is not None:
            obj = conn
        return AsyncPsycopgRunner(obj)
    if isinstance(obj, AsyncRunner):
        return obj
    raise TypeError("not an async connection pg_idempotency knows: %r"
                    % (obj,))


def interval_sql(value: Optional[Interval]) -> Tuple[str, Optional[str]]:
    """
    An interval parameter: ("%s::interval", text) for VALUE, which may be a
    timedelta, a number of seconds, interval text, or None (SQL NULL).
    """
    if value is None:
        return "%s::interval", None
    if isinstance(value, datetime.timedelta):
        return "%s::interval", "%r seconds" % value.total_seconds()
    if isinstance(value, bool):
        raise TypeError("an interval cannot be a bool")
    if isinstance(value, (int, float)):
        return "%s::interval", "%r seconds" % float(value)
    if isinstance(value, str):
        return "%s::interval", value
    raise TypeError("an interval is a timedelta, seconds or text, not %r"
                    % (value,))


def interval_seconds(value: Interval) -> float:
    """Seconds of a timedelta or number; interval text is parsed for the
    simple forms ("90s", "15 minutes", "24 hours", "7 days")."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    import re
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*", str(value).lower())
    if not m:
        raise ValueError("cannot read interval %r; give a timedelta or seconds"
                         % (value,))
    unit = m.group(2)
    mult = {"": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
            "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
            "min": 60, "mins": 60, "minute": 60, "minutes": 60,
            "h": 3600, "hour": 3600, "hours": 3600,
            "d": 86400, "day": 86400, "days": 86400}.get(unit)
    if mult is None:
        raise ValueError("cannot read interval %r; give a timedelta or seconds"
                         % (value,))
    return float(m.group(1)) * mult



"""
The extension's calls as (SQL, parameters, result reader) triples, shared
by the synchronous API (core.py) and the asyncio one (aio.py), so both send
the very same statements.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import (Any, Callable, Dict, List, Literal, Mapping, Optional,
                    Sequence, Tuple, Union)

from ._sql import Interval, Row, interval_sql

Headers = Mapping[str, Union[str, Sequence[str]]]


class RawJson(str):
    """JSON text passed to the database as it is (not serialized again)."""


_UNSET: Any = object()


def json_param(value: Any) -> Optional[str]:
    """A Python value as JSON text for a %s::jsonb parameter; None is NULL."""
    if value is None:
        return None
    if isinstance(value, RawJson):
        return str(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))


def _json(text: Optional[str]) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class StoredResponse:
    """A response idem_complete stored, as idem_claim replays it."""
    code: int
    #: the JSON body, parsed (None when raw bytes were stored, or none)
    body: Any = None
    #: header names to a value or a list of values, as stored
    headers: Optional[Dict[str, Union[str, List[str]]]] = None
    #: the body's exact bytes, when they were stored that way
    raw: Optional[bytes] = None
    #: the JSON body's text as PostgreSQL renders jsonb (None without one)
    body_text: Optional[str] = None

    def body_bytes(self) -> bytes:
        """The body to send: the raw bytes, else the JSON text, else b""."""
        if self.raw is not None:
            return self.raw
        if self.body_text is not None:
            return self.body_text.encode("utf-8")
        return b""

    def header_items(self) -> List[Tuple[str, str]]:
        """The stored headers as (name, value) pairs, repeats kept."""
        out: List[Tuple[str, str]] = []
        for name, value in (self.headers or {}).items():
            if isinstance(value, list):
                out.extend((name, v) for v in value)
            else:
                out.append((name, value))
        return out


@dataclass(frozen=True)
class ClaimResult:
    """One idem_claim answer."""
    status: str                     # claimed, completed, in_progress, mismatch, expired
    token: Optional[int] = None
    recovery_point: Optional[str] = None
    response: Optional[StoredResponse] = None
    expires_at: Optional[datetime.datetime] = None


@dataclass(frozen=True)
class KeyRecord:
    """One idem_lookup row (status "expired": the key expired and is
    remembered, idempotency.key_memory; every other field is None)."""
    status: str
    token: Optional[int]
    recovery_point: Optional[str]
    response: Optional[StoredResponse]
    claimed_at: Optional[datetime.datetime]
    expires_at: Optional[datetime.datetime]
    lease_expires_at: Optional[datetime.datetime]
    request: Any


@dataclass(frozen=True)
class Recovered:
    """One claim idem_recover took over."""
    key: str
    scope: str
    token: int
    recovery_point: Optional[str]
    request: Any
    lapsed_at: datetime.datetime


Statement = Tuple[str, Tuple[Any, ...], Callable[[List[Row]], Any]]


def _response(code: Optional[int], body_text: Optional[str],
              headers_text: Optional[str],
              raw: Optional[bytes]) -> Optional[StoredResponse]:
    if code is None:
        return None
    return StoredResponse(code=code, body=_json(body_text),
                          headers=_json(headers_text), raw=raw,
                          body_text=body_text)


def claim(key: str, request: Any = None, scope: str = "",
          ttl: Optional[Interval] = None, lease: Optional[Interval] = None,
          wait: bool = False, keep_request: bool = False) -> Statement:
    ttl_sql, ttl_v = interval_sql(ttl)
    lease_sql, lease_v = interval_sql(lease)
    sql = ("SELECT status, token, recovery_point, response_code, "
           "response_body::text, response_headers::text, response_raw, "
           "expires_at FROM idem_claim(%s::text, %s::jsonb, %s::text, "
           + ttl_sql + ", " + lease_sql + ", %s::boolean, %s::boolean)")
    params = (key, json_param(request), scope, ttl_v, lease_v, bool(wait),
              bool(keep_request))

    def read(rows: List[Row]) -> ClaimResult:
        (status, token, point, code, body, headers, raw, expires) = rows[0]
        return ClaimResult(status=status, token=token, recovery_point=point,
                           response=_response(code, body, headers, raw),
                           expires_at=expires)
    return sql, params, read


def _none(rows: List[Row]) -> None:
    return None


def complete(key: str, code: int, body: Any = None, scope: str = "",
             token: Optional[int] = None, headers: Optional[Headers] = None,
             raw: Optional[bytes] = None) -> Statement:
    if raw is not None and body is not None:
        raise ValueError("give a JSON body or raw bytes, not both")
    hdrs = None
    if headers is not None:
        hdrs = {k: (v if isinstance(v, str) else list(v))
                for k, v in headers.items()}
    sql = ("SELECT idem_complete(%s::text, %s::integer, %s::jsonb, %s::text, "
           "%s::bigint, %s::jsonb, %s::bytea)")
    return sql, (key, int(code), json_param(body), scope, token,
                 json_param(hdrs), raw), _none


def checkpoint(key: str, recovery_point: str, scope: str = "",
               token: Optional[int] = None) -> Statement:
    return ("SELECT idem_checkpoint(%s::text, %s::text, %s::text, %s::bigint)",
            (key, recovery_point, scope, token), _none)


def release(key: str, scope: str = "", token: Optional[int] = None
            ) -> Statement:
    return ("SELECT idem_release(%s::text, %s::text, %s::bigint)",
            (key, scope, token), _none)


def lookup(key: str, scope: str = "") -> Statement:
    sql = ("SELECT status, token, recovery_point, response_code, "
           "response_body::text, response_headers::text, response_raw, "
           "claimed_at, expires_at, lease_expires_at, request::text "
           "FROM idem_lookup(%s::text, %s::text)")

    def read(rows: List[Row]) -> Optional[KeyRecord]:
        if not rows:
            return None
        (status, token, point, code, body, headers, raw, claimed, expires,
         lease, request) = rows[0]
        return KeyRecord(status=status, token=token, recovery_point=point,
                         response=_response(code, body, headers, raw),
                         claimed_at=claimed, expires_at=expires,
                         lease_expires_at=lease, request=_json(request))
    return sql, (key, scope), read


def recover(lease: Interval, scope: Optional[str] = None,
            max_keys: int = 10) -> Statement:
    lease_sql, lease_v = interval_sql(lease)
    sql = ("SELECT key, scope, token, recovery_point, request::text, "
           "lapsed_at FROM idem_recover(" + lease_sql +
           ", %s::text, %s::integer)")

    def read(rows: List[Row]) -> List[Recovered]:
        return [Recovered(key=r[0], scope=r[1], token=r[2],
                          recovery_point=r[3], request=_json(r[4]),
                          lapsed_at=r[5]) for r in rows]
    return sql, (lease_v, scope, int(max_keys)), read


#: the tenant whose rows the transaction writes, for the ledgers, stream
#: positions and producer sequences distributed by Citus (extension 0.5.0):
#: text, or an integer sent as its decimal text (the server converts it to
#: the type of the distributed tables' tenant column)
Tenant = Union[str, int]


def tenant_param(tenant: Optional[Tenant]) -> Optional[str]:
    """TENANT as the text parameter of the overloads that take one (the
    consume calls' four-argument form, the stream calls' tenant forms);
    None when there is none (the call without it is made, as before)."""
    if tenant is None:
        return None
    if isinstance(tenant, bool) or not isinstance(tenant, (str, int)):
        raise TypeError("a tenant is a string or an integer, not %r"
                        % (tenant,))
    return str(tenant)


def _fresh(rows: List[Row]) -> bool:
    return bool(rows[0][0])


def _new_ids(rows: List[Row]) -> List[str]:
    return [r[0] for r in rows]


def consume_message(consumer: str, message_id: str,
                    ttl: Optional[Interval] = None,
                    tenant: Optional[Tenant] = None) -> Statement:
    ttl_sql, ttl_v = interval_sql(ttl)
    t = tenant_param(tenant)
    if t is None:
        # 0.4.0's three-argument function: what a client without a tenant
        # has always sent
        return ("SELECT idem_consume_message(%s::text, %s::text, " + ttl_sql
                + ")", (consumer, message_id, ttl_v), _fresh)
    # the four-argument overload (0.5.0): the tenant's shard of a message
    # ledger distributed by Citus; not used by a server whose ledger is not
    return ("SELECT idem_consume_message(%s::text, %s::text, " + ttl_sql +
            ", %s::text)", (consumer, message_id, ttl_v, t), _fresh)


def consume_messages(consumer: str, message_ids: Sequence[str],
                     ttl: Optional[Interval] = None,
                     tenant: Optional[Tenant] = None) -> Statement:
    ttl_sql, ttl_v = interval_sql(ttl)
    t = tenant_param(tenant)
    # the ids go as one text parameter holding a JSON array, which every
    # driver passes the same way (array adaptation differs between them)
    ids = json.dumps([str(m) for m in message_ids], ensure_ascii=False)
    if t is None:
        sql = ("SELECT m FROM idem_consume_messages(%s::text, "
               "ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)), " +
               ttl_sql + ") AS t(m)")
        return sql, (consumer, ids, ttl_v), _new_ids
    sql = ("SELECT m FROM idem_consume_messages(%s::text, "
           "ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)), " + ttl_sql +
           ", %s::text) AS t(m)")
    return sql, (consumer, ids, ttl_v, t), _new_ids


# ------------------------------------------------------------ ordered streams

@dataclass(frozen=True)
class OffsetRange:
    """
    Offsets FIRST to LAST (both included) of one partition: the part of a
    batch idem_advance says is not applied yet.  Offsets may skip inside
    it (compacted logs): it bounds the batch's records, it does not list
    them.
    """
    first: int
    last: int

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and self.first <= offset <= self.last


@dataclass(frozen=True)
class Position:
    """One idem_positions row: the next offset to process of a partition."""
    part: int
    #: None for a partition assigned but never advanced
    next_offset: Optional[int]
    #: the last generation stored (None: only unfenced advances so far)
    generation: Optional[int]
    updated_at: datetime.datetime


#: idem_sequence's answer: "new" or "gap" (process the message),
#: "duplicate" or "fenced" (skip it)
SequenceAnswer = Literal["new", "duplicate", "gap", "fenced"]


def _ints(values: Sequence[int], what: str) -> str:
    """A list of integers as one text parameter holding a JSON array, which
    every driver passes the same way (array adaptation differs)."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError("%s must be integers, not %r" % (what, v))
        out.append(v)
    return json.dumps(out)


def _int(value: Any, what: str, optional: bool = False) -> Optional[int]:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an integer, not %r" % (what, value))
    return value


def assign(consumer: str, stream: str, parts: Sequence[int],
           generation: int, tenant: Optional[Tenant] = None) -> Statement:
    params: Tuple[Any, ...] = (consumer, stream, _ints(parts, "partitions"),
                               _int(generation, "generation"))
    t = tenant_param(tenant)
    sql = ("SELECT part, next_offset FROM idem_assign(%s::text, %s::text, "
           "ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)::integer), "
           "%s::bigint")
    if t is not None:
        # the tenant overload (0.5.0): the tenant's shard of stream
        # positions distributed by Citus; not used by a server whose
        # positions are not (without a tenant: 0.4.0's call, as before)
        sql += ", %s::text"
        params += (t,)
    return sql + ")", params, lambda rows: {r[0]: r[1] for r in rows}


def advance(consumer: str, stream: str, part: int, first_offset: int,
            last_offset: int, generation: Optional[int] = None,
            tenant: Optional[Tenant] = None) -> Statement:
    params: Tuple[Any, ...] = (consumer, stream, _int(part, "part"),
                               _int(first_offset, "first_offset"),
                               _int(last_offset, "last_offset"),
                               _int(generation, "generation", optional=True))
    t = tenant_param(tenant)
    sql = ("SELECT first_offset, last_offset FROM idem_advance(%s::text, "
           "%s::text, %s::integer, %s::bigint, %s::bigint, %s::bigint")
    if t is not None:
        # the overload has no default: generation goes, NULL or not
        sql += ", %s::text"
        params += (t,)

    def read(rows: List[Row]) -> Optional[OffsetRange]:
        if not rows:
            return None
        return OffsetRange(first=rows[0][0], last=rows[0][1])
    return sql + ")", params, read


def positions(consumer: str, stream: str,
              tenant: Optional[Tenant] = None) -> Statement:
    t = tenant_param(tenant)
    if t is None:
        sql = ("SELECT part, next_offset, generation, updated_at "
               "FROM idem_positions(%s::text, %s::text) ORDER BY part")
        params: Tuple[Any, ...] = (consumer, stream)
    else:
        sql = ("SELECT part, next_offset, generation, updated_at "
               "FROM idem_positions(%s::text, %s::text, %s::text) "
               "ORDER BY part")
        params = (consumer, stream, t)

    def read(rows: List[Row]) -> List[Position]:
        return [Position(part=r[0], next_offset=r[1], generation=r[2],
                         updated_at=r[3]) for r in rows]
    return sql, params, read


def sequence(consumer: str, producer: str, epoch: int, seq: int,
             strict: bool = False,
             tenant: Optional[Tenant] = None) -> Statement:
    params: Tuple[Any, ...] = (consumer, producer, _int(epoch, "epoch"),
                               _int(seq, "seq"), bool(strict))
    t = tenant_param(tenant)
    sql = ("SELECT idem_sequence(%s::text, %s::text, %s::bigint, %s::bigint, "
           "%s::boolean")
    if t is not None:
        # the tenant's shard of producer sequences distributed by Citus
        sql += ", %s::text"
        params += (t,)
    return sql + ")", params, lambda rows: str(rows[0][0])


def set_wait(wait_timeout_ms: Optional[int], lock_timeout_ms: Optional[int]
             ) -> Statement:
    """SET LOCAL idempotency.wait_timeout and lock_timeout (either may be
    None: left as is); returns the previous lock_timeout."""
    return ("SELECT current_setting('lock_timeout'), "
            "CASE WHEN %s::text IS NULL THEN NULL ELSE "
            "set_config('idempotency.wait_timeout', %s::text, true) END, "
            "CASE WHEN %s::text IS NULL THEN NULL ELSE "
            "set_config('lock_timeout', %s::text, true) END",
            (_opt(wait_timeout_ms), _opt(wait_timeout_ms),
             _opt(lock_timeout_ms), _opt(lock_timeout_ms)),
            lambda rows: rows[0][0])


def restore_lock_timeout(previous: str) -> Statement:
    return ("SELECT set_config('lock_timeout', %s::text, true)", (previous,),
            _none)


def _opt(ms: Optional[int]) -> Optional[str]:
    return None if ms is None else str(int(ms))

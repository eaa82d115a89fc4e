"""
Queue consumers: record a batch of message ids in the transaction that
does the work (idem_consume_messages), and process only the new ones.
Ordered streams: StreamConsumer moves a partition's position in the
transaction that applies a batch (idem_assign, idem_advance), fenced by
the assignment's generation.
"""

from __future__ import annotations

from typing import (Any, Callable, Dict, Hashable, Iterable, List, Mapping,
                    Optional, TypeVar)

from ._protocol import Position, Tenant, tenant_param
from ._sql import Interval, runner_for
from .core import (advance, assign, consume_messages, positions,
                   run_in_transaction)

M = TypeVar("M")


def consume_batch(conn: Any, consumer: str, messages: Iterable[M],
                  handler: Callable[[Any, M], Any], *,
                  message_id: Callable[[M], Hashable] = str,
                  ttl: Optional[Interval] = None,
                  tenant: Optional[Tenant] = None,
                  attempts: int = 3) -> List[M]:
    """
    Process MESSAGES exactly once for CONSUMER: in one transaction, record
    every id (MESSAGE_ID(message), by default str(message)) with
    idem_consume_messages and call HANDLER(conn, message) for each message
    whose id was new, in input order (a repeated id within the batch is
    handled once, at its first position); then commit.  Returns the
    messages handled.

        consume_batch(conn, "billing", batch, handle,
                      message_id=lambda m: m["id"])

    Redelivered messages are skipped; if anything fails, the transaction
    rolls back, no id is recorded, and the redelivery handles the whole
    batch again.  Batches that share ids wait for each other instead of
    deadlocking (the extension records them in digest order); a deadlock
    with other work (40P01) or a serialization failure (40001) runs the
    batch again, ATTEMPTS times in all, when this opened the transaction.
    In a transaction the caller opened, it runs there and commits with it.

    TENANT, for a message ledger distributed by Citus: the tenant whose
    rows the batch's transaction writes (one for the batch); the ids are
    recorded in its shard.  Without it the batch is recorded as before
    (idem_consume_messages' three-argument form).
    """
    msgs = list(messages)
    runner = runner_for(conn)

    def once() -> List[M]:
        ids = [str(message_id(m)) for m in msgs]
        fresh = set(consume_messages(runner, consumer, ids, ttl,
                                     tenant=tenant))
        done: List[M] = []
        for m, i in zip(msgs, ids):
            if i in fresh:
                fresh.discard(i)
                handler(conn, m)
                done.append(m)
        return done
    return run_in_transaction(runner, once, attempts=attempts)


R = TypeVar("R")


def record_offset(record: Any) -> int:
    """
    The default offset of a record: the record itself if it is an int,
    record["offset"] for a mapping, else record.offset (called if it is a
    method, as confluent-kafka's Message.offset() is).
    """
    if isinstance(record, bool):
        raise TypeError("a bool is not an offset")
    if isinstance(record, int):
        return record
    if isinstance(record, Mapping):
        return int(record["offset"])
    value = record.offset
    return int(value() if callable(value) else value)


class StreamConsumer:
    """
    CONSUMER's side of a partitioned log STREAM (Kafka, Kinesis, Redis
    Streams: offsets that only grow within a partition), with its
    positions kept by the extension in the transaction that applies each
    batch:

        sc = StreamConsumer(conn, "billing", "orders")
        # on assignment (the group's rebalance), with its generation:
        for part, offset in sc.assign(parts, generation).items():
            log.seek(part, offset if offset is not None else EARLIEST)
        # for each batch of one partition:
        sc.process(part, records, handle)   # handle(conn, new_records)

    process() runs idem_advance for the batch's offsets with the
    generation of the last assign() and HANDLER(conn, records) with the
    records not applied yet, in one transaction, then commits; HANDLER is
    not called when the whole batch was applied already.  A rollback
    leaves the position where it was, so the batch is delivered and
    applied again.  Once the partition is assigned with a higher
    generation (to another consumer), this one is a zombie: process()
    raises StaleGeneration before HANDLER runs, nothing is written, and
    the partition must no longer be consumed here.  In a transaction the
    caller opened, both run there and commit with it; otherwise a
    deadlock or serialization failure runs the batch again, ATTEMPTS
    times in all, as consume_batch does.

    TENANT, for stream positions distributed by Citus (extension 0.5.0):
    the tenant whose rows the consumer's transactions write; assign(),
    process() and positions() all pass it, and the positions are kept in
    its shard.  Without it the calls are made as before (the node's own
    positions); a server whose positions are not distributed does not use
    it.
    """

    def __init__(self, conn: Any, consumer: str, stream: str, *,
                 offset: Callable[[Any], int] = record_offset,
                 generation: Optional[int] = None,
                 tenant: Optional[Tenant] = None,
                 attempts: int = 3) -> None:
        tenant_param(tenant)        # a bad tenant fails here, not later
        self.runner = runner_for(conn)
        self.conn = conn
        self.consumer = consumer
        self.stream = stream
        self.offset = offset
        #: the generation process() passes: the last assign()'s (None:
        #: unfenced, only for a consumer without a coordinator)
        self.generation = generation
        #: the tenant every call passes (None: the calls without one)
        self.tenant = tenant
        self.attempts = attempts

    def assign(self, parts: Iterable[int], generation: int
               ) -> Dict[int, Optional[int]]:
        """
        On assignment: record GENERATION for PARTS (idem_assign, committed
        unless the caller's transaction is open) and return where to seek
        each: {part: next offset}, None for a partition never seen.
        Raises StaleGeneration if any has a higher generation stored.
        """
        parts = list(parts)
        seeks = run_in_transaction(
            self.runner,
            lambda: assign(self.runner, self.consumer, self.stream, parts,
                           generation, tenant=self.tenant),
            attempts=self.attempts)
        self.generation = generation
        return seeks

    def process(self, part: int, records: Iterable[R],
                handler: Callable[[Any, List[R]], Any]) -> List[R]:
        """
        Apply a batch of RECORDS read from PART (in offset order) exactly
        once: returns the records HANDLER was given (those not applied
        before; [] when none were, and HANDLER was not called).
        """
        batch = list(records)
        if not batch:
            return []
        offsets = [self.offset(r) for r in batch]
        first, last = min(offsets), max(offsets)

        def once() -> List[R]:
            todo = advance(self.runner, self.consumer, self.stream, part,
                           first, last, self.generation, tenant=self.tenant)
            if todo is None:
                return []
            fresh = [r for r, o in zip(batch, offsets)
                     if todo.first <= o <= todo.last]
            if fresh:
                handler(self.conn, fresh)
            return fresh
        return run_in_transaction(self.runner, once, attempts=self.attempts)

    def positions(self) -> List[Position]:
        """The stored positions of this consumer on its stream."""
        return positions(self.runner, self.consumer, self.stream,
                         tenant=self.tenant)

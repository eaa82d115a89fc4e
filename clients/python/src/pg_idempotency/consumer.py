"""
Queue consumers: record a batch of message ids in the transaction that
does the work (idem_consume_messages), and process only the new ones.
"""

from __future__ import annotations

from typing import (Any, Callable, Hashable, Iterable, List, Optional,
                    TypeVar)

from ._sql import Interval, runner_for
from .core import consume_messages, run_in_transaction

M = TypeVar("M")


def consume_batch(conn: Any, consumer: str, messages: Iterable[M],
                  handler: Callable[[Any, M], Any], *,
                  message_id: Callable[[M], Hashable] = str,
                  ttl: Optional[Interval] = None,
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
    """
    msgs = list(messages)
    runner = runner_for(conn)

    def once() -> List[M]:
        ids = [str(message_id(m)) for m in msgs]
        fresh = set(consume_messages(runner, consumer, ids, ttl))
        done: List[M] = []
        for m, i in zip(msgs, ids):
            if i in fresh:
                fresh.discard(i)
                handler(conn, m)
                done.append(m)
        return done
    return run_in_transaction(runner, once, attempts=attempts)

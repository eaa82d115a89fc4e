"""
pg_idempotency: Python client of the idempotency PostgreSQL extension.

The core (this module, on psycopg 3, psycopg2 or Django's connection):
claim/complete/release/checkpoint/lookup/recover, consume_message(s) and
the ordered-stream calls assign/advance/positions/sequence in the
caller's transaction; claim_key() (a context manager) and
idempotent() (a decorator) that put the claim and the business write in
one transaction; two_phase() and Recoverer for calls to external systems;
consume_batch() for queue consumers and StreamConsumer for partitioned
logs.  pg_idempotency.aio is the same on
asyncio.  The HTTP adapters are pg_idempotency.asgi (Starlette, FastAPI),
pg_idempotency.django and pg_idempotency.flask.
"""

from ._protocol import (ClaimResult, KeyRecord, OffsetRange, Position,
                        RawJson, Recovered, SequenceAnswer, StoredResponse)
from ._sql import (AsyncPsycopgRunner, AsyncRunner, DbapiRunner, DjangoRunner,
                   PsycopgRunner, Runner, async_runner_for, runner_for)
from .consumer import StreamConsumer, consume_batch, record_offset
from .core import (Claim, advance, assign, checkpoint, claim, claim_key,
                   complete, consume_message, consume_messages, idempotent,
                   lookup, positions, recover, release, run_in_transaction,
                   sequence)
from .errors import (Busy, ClaimNotResolved, ConfigurationError,
                     IdempotencyError, KeyExpired, KeyInProgress, KeyMismatch,
                     NoCaller,
                     ProgrammingError, ResponseTooLarge, RetryableConflict,
                     SequenceGap, StaleGeneration, StaleToken,
                     StoreUnavailable, classify, sqlstate_of)
from .twophase import Operation, Recoverer, two_phase

__version__ = "0.5.0"

__all__ = [
    "AsyncPsycopgRunner", "AsyncRunner", "Busy", "Claim", "ClaimNotResolved",
    "ClaimResult", "ConfigurationError", "DbapiRunner", "DjangoRunner",
    "IdempotencyError", "KeyExpired", "KeyInProgress", "KeyMismatch",
    "KeyRecord",
    "NoCaller", "OffsetRange", "Operation",
    "Position", "ProgrammingError", "PsycopgRunner", "RawJson", "Recovered",
    "Recoverer", "ResponseTooLarge", "RetryableConflict", "Runner",
    "SequenceAnswer", "SequenceGap", "StaleGeneration", "StaleToken",
    "StoreUnavailable", "StoredResponse", "StreamConsumer", "advance",
    "assign", "async_runner_for", "checkpoint", "claim", "claim_key",
    "classify", "complete", "consume_batch", "consume_message",
    "consume_messages", "idempotent", "lookup", "positions", "record_offset",
    "recover", "release", "run_in_transaction", "runner_for", "sequence",
    "sqlstate_of", "two_phase", "__version__",
]

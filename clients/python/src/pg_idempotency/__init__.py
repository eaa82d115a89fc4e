"""
pg_idempotency: Python client of the idempotency PostgreSQL extension.

The core (this module, on psycopg 3, psycopg2 or Django's connection):
claim/complete/release/checkpoint/lookup/recover and consume_message(s)
in the caller's transaction; claim_key() (a context manager) and
idempotent() (a decorator) that put the claim and the business write in
one transaction; two_phase() and Recoverer for calls to external systems;
consume_batch() for queue consumers.  pg_idempotency.aio is the same on
asyncio.  The HTTP adapters are pg_idempotency.asgi (Starlette, FastAPI),
pg_idempotency.django and pg_idempotency.flask.
"""

from ._protocol import (ClaimResult, KeyRecord, RawJson, Recovered,
                        StoredResponse)
from ._sql import (AsyncPsycopgRunner, AsyncRunner, DbapiRunner, DjangoRunner,
                   PsycopgRunner, Runner, async_runner_for, runner_for)
from .consumer import consume_batch
from .core import (Claim, checkpoint, claim, claim_key, complete,
                   consume_message, consume_messages, idempotent, lookup,
                   recover, release, run_in_transaction)
from .errors import (Busy, ClaimNotResolved, IdempotencyError, KeyInProgress,
                     KeyMismatch, ProgrammingError, ResponseTooLarge,
                     RetryableConflict, StaleToken, StoreUnavailable,
                     classify, sqlstate_of)
from .twophase import Operation, Recoverer, two_phase

__version__ = "0.4.0"

__all__ = [
    "AsyncPsycopgRunner", "AsyncRunner", "Busy", "Claim", "ClaimNotResolved",
    "ClaimResult", "DbapiRunner", "DjangoRunner", "IdempotencyError",
    "KeyInProgress", "KeyMismatch", "KeyRecord", "Operation",
    "ProgrammingError", "PsycopgRunner", "RawJson", "Recovered", "Recoverer",
    "ResponseTooLarge", "RetryableConflict", "Runner", "StaleToken",
    "StoreUnavailable", "StoredResponse", "async_runner_for", "checkpoint",
    "claim", "claim_key", "classify", "complete", "consume_batch",
    "consume_message", "consume_messages", "idempotent", "lookup", "recover",
    "release", "run_in_transaction", "runner_for", "sqlstate_of", "two_phase",
    "__version__",
]

'use strict';

// Errors of pg-idempotency, and how the SQLSTATEs of the idempotency
// extension (doc/reference.md, "Errors at a glance") map onto them.  Every
// error keeps the SQLSTATE in `code` (as node-postgres errors have it) and the
// driver's error in `cause`, so code that checks `err.code === '55006'` keeps
// working.

class IdempotencyError extends Error {
  constructor(message, options = {}) {
    super(message, options.cause ? { cause: options.cause } : undefined);
    this.name = this.constructor.name;
    if (options.code !== undefined) this.code = options.code;
  }
}

// 2D000: a same-transaction claim was committed neither completed nor
// released (the extension rolled the transaction back), or another misuse of
// the API (complete without a claim: 55000).  A bug in the caller, never
// retried.
class ProgrammingError extends IdempotencyError {}

// The library is set up so that it cannot keep its contract: no caller to
// scope a key by, a request body no parser read before the middleware.
// HTTP: 500 (no-caller, misconfigured), and onError is told why.
class ConfigurationError extends ProgrammingError {}

// idempotent(): another call holds the key right now (idem_claim's
// in_progress).
class KeyInProgressError extends IdempotencyError {}

// idempotent(): the key was used with other arguments (idem_claim's
// mismatch).
class KeyMismatchError extends IdempotencyError {}

// idempotent(): the key expired and the server remembers it (idem_claim's
// expired, idempotency.key_memory): its value is gone and fn must not run
// again.  HTTP: 410 expired.
class KeyExpiredError extends IdempotencyError {}

// 55006 "is stale": the key was taken over (its lease lapsed and another
// caller claimed or recovered it); this holder must stop.
class StaleTokenError extends IdempotencyError {}

// 55P03 (lock_timeout), 57014 (statement_timeout), 55006 "held by another
// transaction": the key is busy.  HTTP: 409, or 503 as configured.
class KeyBusyError extends IdempotencyError {}

// 54000: the response (body or raw bytes, headers, kept request) is over
// idempotency.max_response_bytes.  The transaction rolls back, business write
// included, so a retry is safe.  HTTP: 500, or 413 as configured.
class ResponseTooLargeError extends IdempotencyError {}

// ID001: a stream call (assign, advance) with a generation lower than the
// one stored for a partition: the partition was assigned to another consumer
// since, and this one (a zombie) must stop consuming it.  Nothing changed;
// the transaction rolls back with the batch's writes.
class StaleGenerationError extends IdempotencyError {}

// ID002: sequence(..., { strict: true }) saw a producer skip sequence numbers;
// nothing was recorded.
class SequenceGapError extends IdempotencyError {}

// 40P01 / 40001 still failing after the configured retries.
class TransientError extends IdempotencyError {}

// The database cannot be reached or cannot write (connection refused or
// lost, shutdown, too many connections, a standby).  HTTP: 503.
class StoreUnavailableError extends IdempotencyError {}

const RETRYABLE = new Set(['40P01', '40001']);
const UNAVAILABLE_SQLSTATES = new Set(['57P01', '57P02', '57P03', '53300', '25006']);
const UNAVAILABLE_NODE_CODES = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'ENOTFOUND', 'EPIPE', 'EHOSTUNREACH',
  'ENETUNREACH', 'EAI_AGAIN', 'ENOENT',
]);

function sqlstate(err) {
  return err && typeof err.code === 'string' && /^[0-9A-Z]{5}$/.test(err.code) ? err.code : null;
}

function isRetryable(err) {
  const code = sqlstate(err) || (err && err.cause && sqlstate(err.cause));
  return RETRYABLE.has(code);
}

// True when the error says the database is out of reach (not that a call was
// refused).  node-postgres reports a lost connection without a SQLSTATE.
function isUnavailable(err) {
  if (!err) return false;
  if (err instanceof StoreUnavailableError) return true;
  const code = sqlstate(err);
  if (code) return code.startsWith('08') || UNAVAILABLE_SQLSTATES.has(code);
  if (typeof err.code === 'string' && UNAVAILABLE_NODE_CODES.has(err.code)) return true;
  const msg = String(err.message || '');
  return /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Connection terminated unexpectedly|not queryable/i.test(msg);
}

// Wrap a driver error into the class its SQLSTATE maps to; other errors are
// returned as they are.
function mapError(err) {
  if (!err || err instanceof IdempotencyError) return err;
  const code = sqlstate(err);
  const msg = String(err.message || '');
  switch (code) {
    case '2D000':
      return new ProgrammingError(
        `a same-transaction idempotency claim was neither completed nor released before COMMIT; the transaction was rolled back (${msg})`,
        { code, cause: err });
    case '55000':
      return new ProgrammingError(msg, { code, cause: err });
    case '55006':
      if (/stale/i.test(msg)) return new StaleTokenError(msg, { code, cause: err });
      return new KeyBusyError(msg, { code, cause: err });
    case '55P03':
    case '57014':
      return new KeyBusyError(msg, { code, cause: err });
    case '54000':
      return new ResponseTooLargeError(msg, { code, cause: err });
    case 'ID001':
      return new StaleGenerationError(msg, { code, cause: err });
    case 'ID002':
      return new SequenceGapError(msg, { code, cause: err });
    default:
      if (isUnavailable(err)) return new StoreUnavailableError(msg, { code: code || err.code, cause: err });
      return err;
  }
}

module.exports = {
  IdempotencyError,
  ProgrammingError,
  ConfigurationError,
  KeyInProgressError,
  KeyMismatchError,
  KeyExpiredError,
  StaleTokenError,
  KeyBusyError,
  ResponseTooLargeError,
  StaleGenerationError,
  SequenceGapError,
  TransientError,
  StoreUnavailableError,
  mapError,
  isRetryable,
  isUnavailable,
  sqlstate,
};

'use strict';

// pg-idempotency: the idempotency extension's calls for node-postgres, and
// the helpers that put the dedup record in the caller's own transaction.
// HTTP middleware: require('pg-idempotency/express') and
// require('pg-idempotency/fastify').

const sql = require('./sql');
const core = require('./core');
const errors = require('./errors');
const http = require('./http');

module.exports = {
  // one SQL call each
  claim: sql.claim,
  complete: sql.complete,
  checkpoint: sql.checkpoint,
  release: sql.release,
  lookup: sql.lookup,
  recover: sql.recover,
  consumeMessage: sql.consumeMessage,
  consumeMessages: sql.consumeMessages,
  // helpers
  transaction: core.transaction,
  run: core.run,
  twoPhase: core.twoPhase,
  recoverLapsed: core.recoverLapsed,
  consume: core.consume,
  // HTTP pieces shared by the adapters, for other frameworks
  parseIdempotencyKey: http.parseIdempotencyKey,
  HttpIdempotency: http.HttpIdempotency,
  // errors
  IdempotencyError: errors.IdempotencyError,
  ProgrammingError: errors.ProgrammingError,
  StaleTokenError: errors.StaleTokenError,
  KeyBusyError: errors.KeyBusyError,
  ResponseTooLargeError: errors.ResponseTooLargeError,
  TransientError: errors.TransientError,
  StoreUnavailableError: errors.StoreUnavailableError,
  BadIdempotencyKeyError: http.BadIdempotencyKeyError,
};

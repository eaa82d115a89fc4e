'use strict';

// pg-idempotency: the idempotency extension's calls for node-postgres, and
// the helpers that put the dedup record in the caller's own transaction.
// HTTP middleware: require('pg-idempotency/express') and
// require('pg-idempotency/fastify').

const sql = require('./sql');
const core = require('./core');
const errors = require('./errors');
const http = require('./http');
const outbox = require('./outbox');
const webhooks = require('./webhooks');

// (assignments one by one, so that Node's ES module loader finds every
// name: import { run } from 'pg-idempotency')
// one SQL call each
exports.claim = sql.claim;
exports.complete = sql.complete;
exports.checkpoint = sql.checkpoint;
exports.release = sql.release;
exports.lookup = sql.lookup;
exports.recover = sql.recover;
exports.consumeMessage = sql.consumeMessage;
exports.consumeMessages = sql.consumeMessages;
exports.assign = sql.assign;
exports.advance = sql.advance;
exports.positions = sql.positions;
exports.sequence = sql.sequence;
// helpers
exports.transaction = core.transaction;
exports.run = core.run;
exports.idempotent = core.idempotent;
exports.twoPhase = core.twoPhase;
exports.recoverLapsed = core.recoverLapsed;
exports.consume = core.consume;
exports.streamConsumer = core.streamConsumer;
exports.StreamConsumer = core.StreamConsumer;
// the transactional outbox: publishing, relays, webhooks
exports.publish = outbox.publish;
exports.outboxNext = outbox.outboxNext;
exports.outboxAck = outbox.outboxAck;
exports.outboxDeadLetter = outbox.outboxDeadLetter;
exports.outboxDeadLetters = outbox.outboxDeadLetters;
exports.OutboxRelay = outbox.OutboxRelay;
exports.outboxRelay = outbox.outboxRelay;
exports.webhookSink = outbox.webhookSink;
exports.redisStreamSink = outbox.redisStreamSink;
exports.signWebhook = webhooks.signWebhook;
exports.webhookHeaders = webhooks.webhookHeaders;
exports.verifyWebhook = webhooks.verifyWebhook;
exports.receiveWebhook = webhooks.receiveWebhook;
exports.generateSecret = webhooks.generateSecret;
// HTTP pieces shared by the adapters, for other frameworks
exports.parseIdempotencyKey = http.parseIdempotencyKey;
exports.HttpIdempotency = http.HttpIdempotency;
// errors
exports.IdempotencyError = errors.IdempotencyError;
exports.ProgrammingError = errors.ProgrammingError;
exports.ConfigurationError = errors.ConfigurationError;
exports.KeyInProgressError = errors.KeyInProgressError;
exports.KeyMismatchError = errors.KeyMismatchError;
exports.KeyExpiredError = errors.KeyExpiredError;
exports.StaleTokenError = errors.StaleTokenError;
exports.KeyBusyError = errors.KeyBusyError;
exports.ResponseTooLargeError = errors.ResponseTooLargeError;
exports.StaleGenerationError = errors.StaleGenerationError;
exports.SequenceGapError = errors.SequenceGapError;
exports.TransientError = errors.TransientError;
exports.StoreUnavailableError = errors.StoreUnavailableError;
exports.OutboxLostError = outbox.OutboxLostError;
exports.DeadLetterError = outbox.DeadLetterError;
exports.DeliveryError = outbox.DeliveryError;
exports.WebhookVerificationError = webhooks.WebhookVerificationError;
exports.BadIdempotencyKeyError = http.BadIdempotencyKeyError;

'use strict';

// The transactional outbox's client side: publish() in the business
// transaction, the SQL calls of a relay (next, ack, dead letter), and
// OutboxRelay, which delivers each batch to a sink (an HTTP endpoint with
// Standard Webhooks signatures, or a Redis stream) at least once, with
// retries, backoff and jitter, dead letters and a generation that fences a
// zombie relay.  With extension 0.5.0 on Citus, publish(..., { tenant })
// writes the event into the tenant's shard of the tenant outbox, and
// new OutboxRelay({ ..., tenants: true }) relays every tenant's events from
// the coordinator (the extension's tenant overloads, called only when asked
// for; without Citus' tenant outbox the server does not use the tenant).
// The behaviour, the same in the Python library, is
// ../outbox-behaviour.md's.

const sql = require('./sql');
const { transaction } = require('./core');
const { webhookHeaders } = require('./webhooks');
const {
  IdempotencyError, StaleGenerationError, StoreUnavailableError, TransientError, mapError,
} = require('./errors');

// ---------------------------------------------------------------- errors

// ID003: events of the relay expired (idempotency.outbox_max_age) before it
// acknowledged them.  batch: the batch the loss is reported as (ack it to go
// on), when the server said so.
class OutboxLostError extends IdempotencyError {
  constructor(message, options = {}) {
    super(message, options);
    const m = /the loss is batch ([0-9]+)/.exec(String(options.detail || ''));
    this.batch = m ? m[1] : null;
  }
}

// The relay stopped on an event that kept failing (onDeadLetter: 'stop'):
// the event is recorded as a dead letter and its batch left unacknowledged.
class DeadLetterError extends IdempotencyError {
  constructor(message, event, failure) {
    super(message, failure && failure.cause ? { cause: failure.cause } : {});
    this.event = event;
    this.failure = failure;
  }
}

// One failed delivery attempt.  permanent: not worth another attempt
// (dead-lettered at once).
class DeliveryError extends IdempotencyError {
  constructor(message, options = {}) {
    super(message, options);
    if (options.status !== undefined) this.status = options.status;
    this.permanent = Boolean(options.permanent);
  }
}

function mapOutboxError(err) {
  if (err && err.code === 'ID003' && !(err instanceof OutboxLostError)) {
    return new OutboxLostError(err.message, { code: err.code, cause: err, detail: err.detail });
  }
  return mapError(err);
}

async function q(db, text, values) {
  try {
    return await db.query(text, values);
  } catch (err) {
    throw mapOutboxError(err);
  }
}

// ---------------------------------------------------------------- SQL calls

function int8OrNull(v, name) {
  if (v === undefined || v === null) return null;
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'number' && Number.isSafeInteger(v)) return String(v);
  if (typeof v === 'string' && /^-?[0-9]+$/.test(v)) return v;
  throw new TypeError(`${name} must be an integer (a safe integer, a bigint or a decimal string)`);
}

// publish(db, topic, { payload, key, headers, raw, tenant }) → the event id
// (uuid text).  In db's open transaction, it commits or rolls back with it;
// on a Pool it is a transaction of its own.  tenant (a string or an integer;
// extension 0.5.0): the tenant outbox distributed by Citus, relayed by
// new OutboxRelay({ ..., tenants: true }); not used by a server without it.
// Without a tenant, 0.4.0's call.
async function publish(db, topic, opts = {}) {
  if (typeof topic !== 'string') throw new TypeError('publish needs a topic');
  let raw = opts.raw === undefined ? null : opts.raw;
  if (raw !== null && !Buffer.isBuffer(raw)) {
    if (raw instanceof Uint8Array) raw = Buffer.from(raw);
    else throw new TypeError('raw must be a Buffer');
  }
  const tenant = sql.tenantOf(opts);
  const values = [topic, opts.payload === undefined ? null : JSON.stringify(opts.payload),
    opts.key === undefined || opts.key === null ? null : String(opts.key),
    opts.headers === undefined || opts.headers === null ? null : JSON.stringify(opts.headers),
    raw];
  const { rows } = tenant === null
    ? await q(db, 'SELECT idem_publish($1, $2::jsonb, $3, $4::jsonb, $5::bytea)::text AS event_id', values)
    // the overload with a tenant (0.5.0): the tenant's shard of the tenant
    // outbox on Citus, the node's own outbox elsewhere
    : await q(db, 'SELECT idem_publish($1, $2::jsonb, $3, $4::jsonb, $5::bytea, $6::text)::text AS event_id',
      [...values, tenant]);
  return rows[0].event_id;
}

// Which relay calls to make, from opts.tenant and opts.tenants: undefined
// for 0.4.0's (the node's own outbox); null for the tenant overloads with
// tenant NULL (every tenant's events of the tenant outbox, tenants: true);
// a tenant's text for one tenant's (tenant).  A TypeError for anything else,
// before anything is sent.
function relayTenantOf(opts) {
  const all = opts ? opts.tenants : undefined;
  if (all !== undefined && all !== null && typeof all !== 'boolean') {
    throw new TypeError("tenants is true (every tenant's events) or false; one tenant's events: { tenant }");
  }
  const tenant = sql.tenantOf(opts);
  if (all && tenant !== null) throw new TypeError("give { tenant } (one tenant's events) or { tenants: true } (every tenant's), not both");
  if (all) return null;
  return tenant === null ? undefined : tenant;
}

// text (a call ending in ")") and values as they are, or with the tenant
// argument last: the tenant overload (extension 0.5.0)
function tenantForm(text, values, tenant) {
  if (tenant === undefined) return [text, values];
  return [`${text.slice(0, -1)}, $${values.length + 1}::text)`, [...values, tenant]];
}

function eventOf(r) {
  return {
    eventId: r.event_id,
    key: r.key,
    // the payload as PostgreSQL prints jsonb: the bytes a relay sends
    payloadText: r.payload_text,
    payload: r.payload_text === null ? null : JSON.parse(r.payload_text),
    raw: r.payload_raw,
    headers: r.headers,
    publishedAt: r.published_at,
  };
}

// read from the tenant outbox: the event's tenant as text and its number in
// its (topic, tenant), 1, 2, 3... (a decimal string); null for an event of
// the node's own outbox
function tenantEventOf(r) {
  return { ...eventOf(r), tenant: r.tenant, seq: r.seq };
}

// outboxNext(db, relay, topic, { maxEvents, generation, tenants, tenant })
// → { batch, events }
// The relay's current batch (the same one until it is acknowledged); batch
// null and no events when there is nothing to relay.  batch is a decimal
// string.  tenants: true: every tenant's events of the tenant outbox
// (extension 0.5.0, on the Citus coordinator), tenant: one tenant's; each
// event with its tenant and seq.  Without Citus' tenant outbox, these read
// the node's own outbox (tenant and seq null).
async function outboxNext(db, relay, topic, opts = {}) {
  const tenant = relayTenantOf(opts);
  const [call, values] = tenantForm('idem_outbox_next($1, $2, $3, $4::bigint)',
    [relay, topic, opts.maxEvents === undefined ? 100 : opts.maxEvents,
      int8OrNull(opts.generation, 'generation')], tenant);
  const { rows } = await q(db,
    'SELECT batch::text AS batch, event_id::text AS event_id, key, payload::text AS payload_text,' +
    `       payload_raw, headers, published_at${tenant === undefined ? '' : ', tenant, seq::text AS seq'}` +
    `  FROM ${call}`, values);
  if (rows.length === 0) return { batch: null, events: [] };
  return { batch: rows[0].batch, events: rows.map(tenant === undefined ? eventOf : tenantEventOf) };
}

// outboxAck(db, relay, topic, batch, { generation, tenants, tenant }) → true
// if it moved the relay past the batch, false if the batch was acknowledged
// before.  tenants, tenant: as the batch was taken (outboxNext).
async function outboxAck(db, relay, topic, batch, opts = {}) {
  const [text, values] = tenantForm('SELECT idem_outbox_ack($1, $2, $3::bigint, $4::bigint)',
    [relay, topic, int8OrNull(batch, 'batch'), int8OrNull(opts.generation, 'generation')],
    relayTenantOf(opts));
  const { rows } = await q(db, `${text} AS moved`, values);
  return rows[0].moved;
}

// outboxDeadLetter(db, relay, topic, eventId, { reason, attempts, tenants,
// tenant }): records that the relay gave up on an event of its current
// batch.  tenants, tenant: as the batch was taken (outboxNext).
async function outboxDeadLetter(db, relay, topic, eventId, opts = {}) {
  const [text, values] = tenantForm('SELECT idem_outbox_dead_letter($1, $2, $3::uuid, $4, $5::int)',
    [relay, topic, eventId, opts.reason === undefined ? null : opts.reason,
      opts.attempts === undefined ? null : opts.attempts], relayTenantOf(opts));
  await q(db, text, values);
}

// outboxDeadLetters(db, { relay, topic }) → the calling role's dead letters
// (idem_outbox_dead_letters), of one relay and topic or all.
async function outboxDeadLetters(db, opts = {}) {
  const { rows } = await q(db,
    'SELECT relay, topic, event_id::text AS event_id, key, payload::text AS payload_text, payload_raw,' +
    '       headers, published_at, reason, attempts, failed_at' +
    '  FROM idem_outbox_dead_letters($1, $2)',
    [opts.relay === undefined ? null : opts.relay, opts.topic === undefined ? null : opts.topic]);
  return rows.map((r) => ({
    relay: r.relay,
    topic: r.topic,
    ...eventOf(r),
    reason: r.reason,
    attempts: r.attempts,
    failedAt: r.failed_at,
  }));
}

// ---------------------------------------------------------------- sinks

// The bytes an event goes out as, and their content type: payload_raw when
// the event has one, else the payload's JSON as PostgreSQL prints jsonb, else
// nothing.
function eventBody(event) {
  if (event.raw !== null && event.raw !== undefined) {
    return { body: event.raw, contentType: 'application/octet-stream' };
  }
  if (event.payloadText !== null && event.payloadText !== undefined) {
    return { body: Buffer.from(event.payloadText, 'utf8'), contentType: 'application/json' };
  }
  return { body: Buffer.alloc(0), contentType: null };
}

// headers of the event that are never sent as they are: the signature's,
// and those that describe the connection or the transfer
const RESERVED_HEADERS = new Set([
  'webhook-id', 'webhook-timestamp', 'webhook-signature', 'content-length', 'host',
  'transfer-encoding', 'connection', 'keep-alive', 'upgrade', 'te', 'trailer',
]);

// an event header's value as a field value: a string as it is, a list of
// strings joined with ", " (RFC 9110's combination of field lines), else
// its JSON
function headerValue(value) {
  if (typeof value === 'string') return value;
  if (Array.isArray(value) && value.every((v) => typeof v === 'string')) return value.join(', ');
  return JSON.stringify(value);
}

function reasonOf(err) {
  return String(err && err.message ? err.message : err).slice(0, 1000);
}

// webhookSink({ url, secret, timeout, headers, fetch }) → async (event) =>
// void, throwing DeliveryError when the endpoint did not answer 2xx.
// POSTs the event's body with webhook-id (the event id), webhook-timestamp
// (now, at each attempt) and webhook-signature; the event's headers are
// added (content-type among them), then opts.headers.  url may be a function
// of the event.
function webhookSink(opts = {}) {
  if (!opts.url) throw new TypeError('webhookSink needs { url }');
  if (opts.secret === undefined) throw new TypeError('webhookSink needs { secret } ("whsec_<base64>")');
  // fail early on a bad secret
  webhookHeaders(opts.secret, 'x', 0, '');
  const timeout = opts.timeout === undefined ? 15000 : opts.timeout;
  const doFetch = opts.fetch || globalThis.fetch;
  const now = opts.now || (() => Math.floor(Date.now() / 1000));
  return async function deliverWebhook(event) {
    const { body, contentType } = eventBody(event);
    const headers = {};
    if (contentType) headers['content-type'] = contentType;
    if (event.headers && typeof event.headers === 'object' && !Array.isArray(event.headers)) {
      for (const [name, value] of Object.entries(event.headers)) {
        if (value === null || value === undefined || RESERVED_HEADERS.has(name.toLowerCase())) continue;
        headers[name.toLowerCase()] = headerValue(value);
      }
    }
    for (const [name, value] of Object.entries(opts.headers || {})) headers[name.toLowerCase()] = String(value);
    Object.assign(headers, webhookHeaders(opts.secret, event.eventId, now(), body));
    const url = typeof opts.url === 'function' ? opts.url(event) : opts.url;
    let res;
    try {
      res = await doFetch(url, {
        method: 'POST', headers, body, redirect: 'manual', signal: AbortSignal.timeout(timeout),
      });
    } catch (err) {
      const what = err && (err.name === 'TimeoutError' || err.name === 'AbortError')
        ? `no answer within ${timeout} ms` : reasonOf(err.cause || err);
      throw new DeliveryError(`POST ${url}: ${what}`, { cause: err });
    }
    // the body is read (and dropped) so that the connection can be reused
    try {
      await res.arrayBuffer();
    } catch (err) {
      // a broken answer after its status: the status decides
    }
    if (res.status < 200 || res.status > 299) {
      throw new DeliveryError(`POST ${url}: HTTP ${res.status}`, { status: res.status });
    }
  };
}

// XADD, once per dedup key while the key lives: SET NX EX, then XADD, in
// one script (atomic in Redis)
const XADD_ONCE = "if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then "
  + "return redis.call('XADD', KEYS[1], unpack(ARGV, 2)) end return false";

// redisStreamSink({ client, stream, maxLen, dedupSeconds }) → async (event)
// => void.  XADD <stream> [MAXLEN ~ maxLen] * event_id <id> [key <key>]
// [headers <json>] [payload <json> | payload_raw <bytes>] published_at
// <ISO 8601>.  client: node-redis 4/5 (sendCommand) or ioredis (call);
// stream: a name or a function of the event (default: the relay's topic).
// Redis assigns the entry id; event_id is what a consumer dedups on.
// dedupSeconds: an event already added within that many seconds is not
// added again (key <stream>:dedup:<event id>, set with the XADD in one
// script), so a redelivered batch adds no second entry.
function redisStreamSink(opts = {}) {
  const { client } = opts;
  if (!client) throw new TypeError('redisStreamSink needs { client }');
  let send;
  if (typeof client.sendCommand === 'function') send = (args) => client.sendCommand(args);
  else if (typeof client.call === 'function') send = (args) => client.call(...args);
  else throw new TypeError('redisStreamSink needs a node-redis or ioredis client');
  const dedup = opts.dedupSeconds === undefined || opts.dedupSeconds === null ? null : opts.dedupSeconds;
  if (dedup !== null && !(Number.isInteger(dedup) && dedup > 0)) throw new TypeError('dedupSeconds must be a positive integer');
  return async function deliverRedis(event, ctx = {}) {
    const stream = typeof opts.stream === 'function' ? opts.stream(event)
      : (opts.stream || ctx.topic);
    if (!stream) throw new TypeError('redisStreamSink needs { stream }');
    const args = [];
    if (opts.maxLen !== undefined && opts.maxLen !== null) args.push('MAXLEN', '~', String(opts.maxLen));
    args.push('*', 'event_id', event.eventId);
    if (event.key !== null && event.key !== undefined) args.push('key', event.key);
    if (event.headers !== null && event.headers !== undefined) args.push('headers', JSON.stringify(event.headers));
    if (event.payloadText !== null && event.payloadText !== undefined) args.push('payload', event.payloadText);
    if (event.raw !== null && event.raw !== undefined) args.push('payload_raw', event.raw);
    args.push('published_at', new Date(event.publishedAt).toISOString());
    const command = dedup === null ? ['XADD', String(stream), ...args]
      : ['EVAL', XADD_ONCE, '2', String(stream), `${stream}:dedup:${event.eventId}`, String(dedup), ...args];
    try {
      await send(command);
    } catch (err) {
      throw new DeliveryError(`XADD ${stream}: ${reasonOf(err)}`, { cause: err });
    }
  };
}

// ---------------------------------------------------------------- the relay

function delay(ms, signal) {
  return new Promise((resolve) => {
    if (signal && signal.aborted) {
      resolve();
      return;
    }
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      if (signal) signal.removeEventListener('abort', done);
      resolve();
    }
    if (signal) signal.addEventListener('abort', done, { once: true });
  });
}

function msOption(opts, name, dflt) {
  const v = opts[name] === undefined ? dflt : opts[name];
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new TypeError(`${name} must be a number of milliseconds`);
  return v;
}

// The wait before attempt n + 1 after n failed ones: min(maxDelay,
// initialDelay * 2^(n-1)), of which the upper half is random (jitter).
function backoffDelay(n, initialDelay, maxDelay, random = Math.random) {
  const base = Math.min(maxDelay, initialDelay * 2 ** (n - 1));
  return base / 2 + random() * (base / 2);
}

// new OutboxRelay({ pool, relay, topic, sink, ... })
//   runOnce()   one batch: next, deliver each event in order, ack (with the
//               dead letters) → { batch, delivered, deadLettered, events }
//   run()       batches until stop(); waits pollInterval when idle
//   stop()      ends run() after the event in flight (the batch is not
//               acknowledged: its events are delivered again next time)
// Options: maxEvents (100), generation (null: unfenced), maxAttempts (8),
// initialDelay (1000 ms), maxDelay (60000 ms), onDeadLetter ('continue' or
// 'stop'), pollInterval (1000 ms), acknowledgeLoss (false), onEvent(kind,
// info) for logging and metrics, tenants (false): true relays every tenant's
// events of the tenant outbox (publish(..., { tenant }); extension 0.5.0,
// connected to the Citus coordinator) through the tenant overloads of
// idem_outbox_next, _ack and _dead_letter with tenant NULL; without Citus'
// tenant outbox the server relays its own outbox then.
class OutboxRelay {
  constructor(opts = {}) {
    if (!opts.pool) throw new TypeError('OutboxRelay needs { pool }');
    if (typeof opts.relay !== 'string' || opts.relay === '') throw new TypeError('OutboxRelay needs { relay }, its name');
    if (typeof opts.topic !== 'string' || opts.topic === '') throw new TypeError('OutboxRelay needs { topic }');
    if (typeof opts.sink !== 'function') throw new TypeError('OutboxRelay needs { sink }: webhookSink(...), redisStreamSink(...) or async (event) => ...');
    this.pool = opts.pool;
    this.relay = opts.relay;
    this.topic = opts.topic;
    this.sink = opts.sink;
    this.maxEvents = opts.maxEvents === undefined ? 100 : opts.maxEvents;
    if (!Number.isInteger(this.maxEvents) || this.maxEvents < 1) throw new TypeError('maxEvents must be an integer of at least 1');
    this.generation = opts.generation === undefined ? null : opts.generation;
    int8OrNull(this.generation, 'generation');
    this.maxAttempts = opts.maxAttempts === undefined ? 8 : opts.maxAttempts;
    if (!Number.isInteger(this.maxAttempts) || this.maxAttempts < 1) throw new TypeError('maxAttempts must be an integer of at least 1');
    this.initialDelay = msOption(opts, 'initialDelay', 1000);
    this.maxDelay = msOption(opts, 'maxDelay', 60000);
    this.pollInterval = msOption(opts, 'pollInterval', 1000);
    this.onDeadLetter = opts.onDeadLetter === undefined ? 'continue' : opts.onDeadLetter;
    if (this.onDeadLetter !== 'continue' && this.onDeadLetter !== 'stop') {
      throw new TypeError("onDeadLetter is 'continue' or 'stop'");
    }
    this.acknowledgeLoss = Boolean(opts.acknowledgeLoss);
    relayTenantOf({ tenants: opts.tenants });   // not a boolean: a TypeError here
    this.tenants = Boolean(opts.tenants);
    this.onEvent = opts.onEvent || (() => {});
    this.random = opts.random || Math.random;
    this.sleep = opts.sleep || delay;
    this.controller = new AbortController();
  }

  get stopped() {
    return this.controller.signal.aborted;
  }

  stop() {
    this.controller.abort();
  }

  // deliver one event, retried; → { ok: true } or { ok: false, attempts, error }
  async deliver(event) {
    let attempt = 0;
    for (;;) {
      attempt++;
      try {
        await this.sink(event, { topic: this.topic, relay: this.relay, attempt });
        this.onEvent('delivered', { event, attempt });
        return { ok: true, attempts: attempt };
      } catch (error) {
        this.onEvent('attempt-failed', { event, attempt, error });
        if (this.stopped) return { ok: false, attempts: attempt, error, stopped: true };
        if (attempt >= this.maxAttempts || (error && error.permanent)) {
          return { ok: false, attempts: attempt, error };
        }
        await this.sleep(backoffDelay(attempt, this.initialDelay, this.maxDelay, this.random), this.controller.signal);
        if (this.stopped) return { ok: false, attempts: attempt, error, stopped: true };
      }
    }
  }

  async runOnce() {
    const opts = { generation: this.generation, maxEvents: this.maxEvents, tenants: this.tenants };
    let next;
    try {
      next = await transaction(this.pool, (tx) => outboxNext(tx, this.relay, this.topic, opts));
    } catch (err) {
      const mapped = mapOutboxError(err);
      if (mapped instanceof OutboxLostError && this.acknowledgeLoss && mapped.batch !== null) {
        this.onEvent('loss', { error: mapped });
        await transaction(this.pool, (tx) => outboxAck(tx, this.relay, this.topic, mapped.batch,
          { generation: this.generation, tenants: this.tenants }));
        return { batch: mapped.batch, delivered: 0, deadLettered: 0, events: 0, lost: true };
      }
      throw mapped;
    }
    const { batch, events } = next;
    if (batch === null) {
      this.onEvent('idle', {});
      return { batch: null, delivered: 0, deadLettered: 0, events: 0 };
    }
    const dead = [];
    let delivered = 0;
    for (const event of events) {
      if (this.stopped) return { batch, delivered, deadLettered: 0, events: events.length, acked: false };
      const r = await this.deliver(event);
      if (r.ok) {
        delivered++;
        continue;
      }
      if (r.stopped) return { batch, delivered, deadLettered: 0, events: events.length, acked: false };
      const reason = reasonOf(r.error);
      if (this.onDeadLetter === 'stop') {
        await transaction(this.pool, (tx) => outboxDeadLetter(tx, this.relay, this.topic, event.eventId,
          { reason, attempts: r.attempts, tenants: this.tenants }));
        this.onEvent('dead-letter', { event, attempts: r.attempts, error: r.error });
        throw new DeadLetterError(`event ${event.eventId} failed ${r.attempts} times (${reason}); the relay stops`,
          event, r.error);
      }
      dead.push({ event, reason, attempts: r.attempts, error: r.error });
    }
    await transaction(this.pool, async (tx) => {
      for (const d of dead) {
        await outboxDeadLetter(tx, this.relay, this.topic, d.event.eventId,
          { reason: d.reason, attempts: d.attempts, tenants: this.tenants });
      }
      await outboxAck(tx, this.relay, this.topic, batch, { generation: this.generation, tenants: this.tenants });
    });
    for (const d of dead) this.onEvent('dead-letter', d);
    this.onEvent('acked', { batch, events: events.length });
    return { batch, delivered, deadLettered: dead.length, events: events.length, acked: true };
  }

  // Batches until stop() (or an error that ends the relay: a stale
  // generation, a dead letter with onDeadLetter 'stop', a loss not
  // acknowledged, a programming error).  The database out of reach is waited
  // out (backoff up to maxDelay).
  async run() {
    let failures = 0;
    while (!this.stopped) {
      let r;
      try {
        r = await this.runOnce();
        failures = 0;
      } catch (err) {
        const mapped = mapOutboxError(err);
        if (mapped instanceof StoreUnavailableError || mapped instanceof TransientError) {
          failures++;
          this.onEvent('database-unavailable', { error: mapped });
          await this.sleep(backoffDelay(failures, this.initialDelay, this.maxDelay, this.random), this.controller.signal);
          continue;
        }
        if (mapped instanceof StaleGenerationError) this.onEvent('fenced', { error: mapped });
        throw mapped;
      }
      if (r.batch === null) await this.sleep(this.pollInterval, this.controller.signal);
    }
  }
}

function outboxRelay(opts) {
  return new OutboxRelay(opts);
}

module.exports = {
  OutboxLostError,
  DeadLetterError,
  DeliveryError,
  publish,
  outboxNext,
  outboxAck,
  outboxDeadLetter,
  outboxDeadLetters,
  eventBody,
  webhookSink,
  redisStreamSink,
  backoffDelay,
  OutboxRelay,
  outboxRelay,
  mapOutboxError,
};

'use strict';

// The helpers around the SQL calls: a transaction with retries, the
// same-transaction runner (claim, the caller's work, complete, in one
// transaction), the two-phase runner for calls to external systems, the
// recoverer of lapsed two-phase claims, the batch consumer, and the stream
// consumer (positions of a partitioned log).

const sql = require('./sql');
const {
  mapError, isRetryable, isUnavailable, ProgrammingError, TransientError,
  StoreUnavailableError, ResponseTooLargeError, StaleTokenError,
  KeyInProgressError, KeyMismatchError, KeyExpiredError,
} = require('./errors');

const ISOLATION = {
  'read committed': 'READ COMMITTED',
  'repeatable read': 'REPEATABLE READ',
  serializable: 'SERIALIZABLE',
};

function beginSql(isolationLevel) {
  if (!isolationLevel) return 'BEGIN';
  const level = ISOLATION[String(isolationLevel).toLowerCase()];
  if (!level) throw new TypeError(`unknown isolationLevel ${isolationLevel}`);
  return `BEGIN ISOLATION LEVEL ${level}`;
}

function delay(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function connect(pool) {
  try {
    return await pool.connect();
  } catch (err) {
    const mapped = mapError(err);
    if (mapped instanceof StoreUnavailableError) throw mapped;
    throw new StoreUnavailableError(String(err && err.message), { code: err && err.code, cause: err });
  }
}

// Rolls back; returns the error if the connection is unusable (the client is
// then destroyed instead of going back to the pool).
async function rollback(client) {
  try {
    await client.query('ROLLBACK');
    return undefined;
  } catch (err) {
    return err;
  }
}

// Runs body(client, attempt) in a transaction of its own on a client of
// `pool`.  body returns { value, commit }: commit false rolls back (and
// value is still returned).  40P01 / 40001 roll back and run body again, up
// to opts.retries (default 3) more times.
async function inTransaction(pool, opts, body) {
  const retries = opts.retries === undefined ? 3 : opts.retries;
  for (let attempt = 1; ; attempt++) {
    const client = await connect(pool);
    let broken;
    try {
      await client.query(beginSql(opts.isolationLevel));
      const r = await body(client, attempt);
      if (r.commit === false) {
        broken = await rollback(client);
      } else {
        await client.query('COMMIT');
      }
      return r.value;
    } catch (err) {
      broken = await rollback(client);
      if (isRetryable(err)) {
        if (attempt <= retries) {
          client.release(broken);
          broken = null;
          // a little jitter, so that two retried deadlock victims do not
          // meet again at once
          await delay(Math.floor(Math.random() * 5 * attempt));
          continue;
        }
        throw new TransientError(`gave up after ${attempt} attempts: ${err.message}`,
          { code: err.code, cause: err });
      }
      if (isUnavailable(err)) broken = broken || err;
      throw mapError(err);
    } finally {
      if (broken !== null) client.release(broken);
    }
  }
}

// transaction(pool, fn, opts): BEGIN, fn(client), COMMIT, with retries of
// deadlocks and serialization failures (fn runs again: keep it free of
// effects outside the database).  Returns what fn returns.
function transaction(pool, fn, opts = {}) {
  return inTransaction(pool, opts, async (client, attempt) => ({ value: await fn(client, { attempt }) }));
}

function normalize(response) {
  if (response === undefined || response === null) return { status: 200 };
  if (typeof response !== 'object') throw new TypeError('the handler must return a response object: { status, body, headers, raw }');
  const out = { status: response.status === undefined ? 200 : response.status };
  if (response.body !== undefined) out.body = response.body;
  if (response.headers !== undefined && response.headers !== null) out.headers = response.headers;
  if (response.raw !== undefined && response.raw !== null) out.raw = response.raw;
  return out;
}

function outcomeOf(c) {
  const o = {
    status: c.status,
    replayed: c.status === 'completed',
    stored: c.status === 'completed',
    expiresAt: c.expiresAt,
  };
  if (c.status === 'completed') {
    o.response = { status: c.responseCode };
    if (c.responseBody !== null) o.response.body = c.responseBody;
    if (c.responseHeaders !== null) o.response.headers = c.responseHeaders;
    if (c.responseRaw !== null) o.response.raw = c.responseRaw;
  }
  return o;
}

function checkKey(opts) {
  if (!opts || typeof opts !== 'object') throw new TypeError('options are required');
  if (typeof opts.key !== 'string') throw new TypeError('options.key must be a string');
}

async function setWaitTimeout(db, opts) {
  if (opts.wait && opts.waitTimeout !== undefined && opts.waitTimeout !== null) {
    const ms = sql.durationMs(opts.waitTimeout);
    if (ms === null || ms < 0) throw new TypeError('waitTimeout must be milliseconds or a simple interval');
    await sql.q(db, "SELECT set_config('idempotency.wait_timeout', $1, true)", [String(Math.round(ms))]);
  }
}

// The same-transaction runner's body: claim; if claimed, fn(tx, ctx), then
// complete.  Returns { value: outcome, commit }.
async function claimAndRun(db, opts, fn, savepoint) {
  const scope = opts.scope === undefined ? '' : opts.scope;
  if (savepoint) {
    try {
      await db.query('SAVEPOINT pg_idempotency_run');
    } catch (err) {
      if (err && err.code === '25P01') {
        throw new ProgrammingError('run({ client }) runs inside the caller\'s transaction: call BEGIN first, or pass { pool }',
          { code: err.code, cause: err });
      }
      throw mapError(err);
    }
  }
  const undo = async () => {
    if (savepoint) {
      await db.query('ROLLBACK TO SAVEPOINT pg_idempotency_run');
      await db.query('RELEASE SAVEPOINT pg_idempotency_run');
    }
  };
  try {
    await setWaitTimeout(db, opts);
    const c = await sql.claim(db, opts.key, {
      request: opts.request, scope, ttl: opts.ttl, wait: opts.wait,
    });
    if (c.status !== 'claimed') {
      if (savepoint) await db.query('RELEASE SAVEPOINT pg_idempotency_run');
      return { value: outcomeOf(c) };
    }
    const ctx = {
      key: opts.key,
      scope,
      recoveryPoint: c.recoveryPoint,
      checkpoint: async (point) => {
        await sql.checkpoint(db, opts.key, point, { scope });
        ctx.recoveryPoint = point;
      },
    };
    const response = normalize(await fn(db, ctx));
    const base = { status: 'claimed', replayed: false, expiresAt: c.expiresAt, response };
    if (response.status >= 500 && opts.releaseServerErrors !== false) {
      await undo();
      return { value: { ...base, stored: false }, commit: false };
    }
    await sql.complete(db, opts.key, response, { scope });
    if (savepoint) await db.query('RELEASE SAVEPOINT pg_idempotency_run');
    return { value: { ...base, stored: true } };
  } catch (err) {
    if (savepoint) {
      try {
        await undo();
      } catch (undoErr) {
        // the connection is gone; the caller's transaction with it
      }
    }
    throw mapError(err);
  }
}

// run(opts, fn): the default path.  The claim, fn's business writes and the
// stored response share one transaction: { pool } runs it in a transaction
// of its own (retried on 40P01/40001), { client } inside the caller's open
// transaction (within a savepoint; the caller commits).  fn(tx, ctx) returns
// { status, body, headers, raw }.  A status >= 500 is not stored (the work
// rolls back and the key stays free) unless releaseServerErrors is false.
async function run(opts, fn) {
  checkKey(opts);
  if (typeof fn !== 'function') throw new TypeError('run needs a function');
  if (opts.client) {
    const r = await claimAndRun(opts.client, opts, fn, true);
    return r.value;
  }
  if (!opts.pool) throw new TypeError('run needs { pool } or { client }');
  return inTransaction(opts.pool, opts, (tx) => claimAndRun(tx, opts, fn, false));
}

// idempotent(fn, opts): fn(tx, ...args) made to run once per key, returning
// its value (stored as JSON with the business writes in one transaction)
// and, for a key already done, the stored value without calling fn.
//
//   const charge = idempotent(async (tx, account, amount) => { ... return { id } },
//     { pool, key: (account, amount, ref) => ref, request: (account, amount) => ({ account, amount }) });
//   await charge('acct-1', 500, 'ref-42');
//
// opts.key(...args) selects the key (required); opts.request(...args) what
// a reuse of the key is compared with (default: all the arguments; a reuse
// with others throws KeyMismatchError); opts.serialize(value) turns fn's
// value into JSON (default: JSON.stringify's rules; undefined is stored as
// null) and opts.deserialize(json) back (default: as stored).  A key held
// by a call in flight throws KeyInProgressError (with { wait: true }, it
// waits for it).  Other options: pool or client, scope, ttl, wait,
// waitTimeout, isolationLevel, retries (fn runs again on 40P01/40001: keep
// it free of effects outside the database).
function idempotent(fn, opts = {}) {
  if (typeof fn !== 'function') throw new TypeError('idempotent needs a function');
  if (!opts || typeof opts.key !== 'function') {
    throw new TypeError('idempotent needs { key: (...args) => string }, the selection of the key');
  }
  if (!opts.pool && !opts.client) throw new TypeError('idempotent needs { pool } or { client }');
  const serialize = opts.serialize || ((v) => v);
  const deserialize = opts.deserialize || ((v) => v);
  const requestOf = opts.request || ((...args) => args);
  return async function idempotentCall(...args) {
    const key = opts.key(...args);
    if (typeof key !== 'string' || key === '') {
      throw new TypeError('idempotent: opts.key(...args) must return a non-empty string');
    }
    let value;
    const out = await run({ ...opts, key, request: requestOf(...args) }, async (tx) => {
      value = await fn(tx, ...args);
      let body = serialize(value);
      if (body === undefined) body = null;
      try {
        if (JSON.stringify(body) === undefined) throw new TypeError('not JSON');
      } catch (err) {
        throw new TypeError(`idempotent: the value of ${fn.name || 'the function'} is not JSON ` +
          `(${err.message}); give opts.serialize (and opts.deserialize) to store it`);
      }
      return { status: 200, body };
    });
    if (out.status === 'in_progress') throw new KeyInProgressError(`another call holds key ${JSON.stringify(key)}`);
    if (out.status === 'mismatch') {
      throw new KeyMismatchError(`key ${JSON.stringify(key)} was used with other arguments`);
    }
    if (out.status === 'expired') {
      throw new KeyExpiredError(`key ${JSON.stringify(key)} expired: its value is no longer kept, and the call is not run again`);
    }
    if (out.replayed) {
      const stored = out.response.body;
      return deserialize(stored === undefined ? null : stored);
    }
    return value;
  };
}

async function releaseQuietly(pool, key, scope, token) {
  try {
    await sql.release(pool, key, { scope, token });
  } catch (err) {
    // stale (taken over) or not claimed any more: nothing of ours to give up
  }
}

// The holder's part of two-phase work: fn(ctx) outside any transaction,
// then complete with the token (with opts.beforeComplete's writes in the
// same transaction), release on failure.
async function finishHolder(pool, holder, opts, fn) {
  const { key, scope, token } = holder;
  const ctx = {
    key,
    scope,
    token,
    recoveryPoint: holder.recoveryPoint,
    request: holder.request,
    checkpoint: async (point, write) => {
      await inTransaction(pool, opts, async (tx) => {
        if (write) await write(tx);
        await sql.checkpoint(tx, key, point, { scope, token });
        return {};
      });
      ctx.recoveryPoint = point;
    },
  };
  let response;
  try {
    response = normalize(await fn(ctx));
  } catch (err) {
    if (opts.releaseOnError !== false && !(err instanceof StaleTokenError)) {
      await releaseQuietly(pool, key, scope, token);
    }
    throw err;
  }
  const base = { status: 'claimed', replayed: false, token, response };
  if (response.status >= 500 && opts.releaseServerErrors !== false) {
    await sql.release(pool, key, { scope, token });
    return { ...base, stored: false };
  }
  try {
    await inTransaction(pool, opts, async (tx) => {
      if (opts.beforeComplete) await opts.beforeComplete(tx, response, ctx);
      await sql.complete(tx, key, response, { scope, token });
      return {};
    });
  } catch (err) {
    if (err instanceof ResponseTooLargeError) await releaseQuietly(pool, key, scope, token);
    throw err;
  }
  return { ...base, stored: true };
}

// twoPhase(opts, fn): for work that calls a system outside the database.
// Claims with a lease (and keep_request, so idem_recover can finish it if
// this process dies) and commits; runs fn(ctx) with ctx.token and
// ctx.checkpoint(point[, write]); completes with the token; releases on
// failure.
async function twoPhase(opts, fn) {
  checkKey(opts);
  if (!opts.pool) throw new TypeError('twoPhase needs { pool }');
  if (opts.lease === undefined || opts.lease === null) throw new TypeError('twoPhase needs a lease');
  if (typeof fn !== 'function') throw new TypeError('twoPhase needs a function');
  const scope = opts.scope === undefined ? '' : opts.scope;
  const c = await inTransaction(opts.pool, opts, async (tx) => {
    await setWaitTimeout(tx, opts);
    return {
      value: await sql.claim(tx, opts.key, {
        request: opts.request, scope, ttl: opts.ttl, lease: opts.lease,
        wait: opts.wait, keepRequest: opts.keepRequest !== false,
      }),
    };
  });
  if (c.status !== 'claimed') return outcomeOf(c);
  const out = await finishHolder(opts.pool, {
    key: opts.key, scope, token: c.token, recoveryPoint: c.recoveryPoint, request: opts.request,
  }, opts, fn);
  return { ...out, expiresAt: c.expiresAt };
}

// recoverLapsed(opts, fn): takes over up to opts.maxKeys two-phase claims
// made with keepRequest whose lease lapsed (idem_recover, committed at
// once), and finishes each as twoPhase does: fn(ctx) with the new token, the
// kept request and the last recovery point.  Returns one entry per key: {
// key, scope, outcome } or { key, scope, error }.
async function recoverLapsed(opts, fn) {
  if (!opts || !opts.pool) throw new TypeError('recoverLapsed needs { pool }');
  if (typeof fn !== 'function') throw new TypeError('recoverLapsed needs a function');
  const rows = await inTransaction(opts.pool, opts, async (tx) => ({
    value: await sql.recover(tx, { lease: opts.lease, scope: opts.scope, maxKeys: opts.maxKeys }),
  }));
  const results = [];
  for (const r of rows) {
    try {
      const outcome = await finishHolder(opts.pool, r, opts, fn);
      results.push({ key: r.key, scope: r.scope, outcome });
    } catch (error) {
      results.push({ key: r.key, scope: r.scope, error });
    }
  }
  return results;
}

// consume(opts, messages, fn): records the batch's ids with
// idem_consume_messages in one transaction ({ pool }, retried) or in the
// caller's ({ client }), and calls fn(tx, fresh, { duplicates }) with the
// messages seen for the first time, in input order, each id once.
// opts.tenant: the batch's tenant, for a message ledger distributed by Citus.
async function consume(opts, messages, fn) {
  if (!opts || typeof opts.consumer !== 'string') throw new TypeError('consume needs { consumer }');
  if (!Array.isArray(messages)) throw new TypeError('messages must be an array');
  sql.tenantOf(opts);   // a bad tenant fails before any transaction
  const idOf = opts.id || ((m) => (m !== null && typeof m === 'object' ? m.id : m));
  const body = async (tx) => {
    if (messages.length === 0) return { fresh: [], duplicates: [], result: undefined };
    const ids = messages.map((m) => {
      const id = idOf(m);
      return id === undefined || id === null ? id : String(id);
    });
    const freshIds = new Set(await sql.consumeMessages(tx, opts.consumer, ids, { ttl: opts.ttl, tenant: opts.tenant }));
    const fresh = [];
    const duplicates = [];
    messages.forEach((m, i) => {
      if (freshIds.delete(ids[i])) fresh.push(m);
      else duplicates.push(m);
    });
    const result = fresh.length > 0 && fn ? await fn(tx, fresh, { duplicates }) : undefined;
    return { fresh, duplicates, result };
  };
  if (opts.client) return body(opts.client);
  if (!opts.pool) throw new TypeError('consume needs { pool } or { client }');
  return transaction(opts.pool, body, opts);
}

// The default offset of a record: the record itself if it is a number,
// bigint or string, else record.offset (kafkajs' message.offset is a decimal
// string).
function recordOffset(r) {
  return r !== null && typeof r === 'object' ? r.offset : r;
}

function toBig(v, what) {
  try {
    if (typeof v === 'number' && !Number.isSafeInteger(v)) throw new RangeError();
    return BigInt(v);
  } catch (err) {
    throw new TypeError(`${what} is not an integer offset: ${String(v)}`);
  }
}

// Runs body(tx) in the caller's open transaction ({ client }), within a
// savepoint (so that a missing BEGIN is an error rather than an autocommitted
// position), or in a transaction of its own on { pool }, retried on
// 40P01/40001.
async function inCallerOrOwn(opts, body) {
  if (opts.client) {
    const db = opts.client;
    try {
      await db.query('SAVEPOINT pg_idempotency_stream');
    } catch (err) {
      if (err && err.code === '25P01') {
        throw new ProgrammingError('{ client } runs inside the caller\'s transaction: call BEGIN first, or pass { pool }',
          { code: err.code, cause: err });
      }
      throw mapError(err);
    }
    try {
      const value = await body(db);
      await db.query('RELEASE SAVEPOINT pg_idempotency_stream');
      return value;
    } catch (err) {
      try {
        await db.query('ROLLBACK TO SAVEPOINT pg_idempotency_stream');
        await db.query('RELEASE SAVEPOINT pg_idempotency_stream');
      } catch (undoErr) {
        // the connection is gone; the caller's transaction with it
      }
      throw mapError(err);
    }
  }
  if (!opts.pool) throw new TypeError('a stream consumer needs { pool } or { client }');
  return transaction(opts.pool, body, opts);
}

// One consumer of a partitioned log (Kafka, Kinesis, Redis Streams), its
// positions kept by the extension and moved in the transaction that applies
// each batch.  assign(parts, generation) on assignment: stores the
// generation, returns where to seek.  process(part, records, fn): in one
// transaction, idem_advance for the batch's offsets with that generation,
// fn(tx, fresh, { range, part }) with the records not applied yet (not
// called when there are none), commit.  A stale generation (the partition
// was assigned elsewhere since) is StaleGenerationError before fn runs, and
// nothing is written.  opts.tenant, for stream positions distributed by
// Citus: the tenant whose rows the consumer's transactions write, passed by
// assign, process and positions (none: the calls without it, as before).
class StreamConsumer {
  constructor(opts) {
    if (!opts || typeof opts.consumer !== 'string') throw new TypeError('streamConsumer needs { consumer }');
    if (typeof opts.stream !== 'string') throw new TypeError('streamConsumer needs { stream }');
    if (!opts.pool && !opts.client) throw new TypeError('streamConsumer needs { pool } or { client }');
    this.options = opts;
    this.consumer = opts.consumer;
    this.stream = opts.stream;
    this.offsetOf = opts.offset || recordOffset;
    sql.tenantOf(opts);   // a bad tenant fails here, before any call
    // the tenant every call passes (null: the calls without one)
    this.tenant = opts.tenant === undefined ? null : opts.tenant;
    // the generation process() passes: the last assign()'s (null: unfenced)
    this.generation = opts.generation === undefined ? null : opts.generation;
  }

  async assign(parts, generation) {
    const seeks = await inCallerOrOwn(this.options,
      (tx) => sql.assign(tx, this.consumer, this.stream, parts, generation, { tenant: this.tenant }));
    this.generation = generation;
    return seeks;
  }

  async process(part, records, fn) {
    if (!Array.isArray(records)) throw new TypeError('records must be an array');
    if (records.length === 0) return { fresh: [], range: null, result: undefined };
    const offsets = records.map((r) => toBig(this.offsetOf(r), 'a record\'s offset'));
    let first = offsets[0];
    let last = offsets[0];
    for (const o of offsets) {
      if (o < first) first = o;
      if (o > last) last = o;
    }
    const generation = this.generation;
    const tenant = this.tenant;
    return inCallerOrOwn(this.options, async (tx) => {
      const range = await sql.advance(tx, this.consumer, this.stream, part, first, last, { generation, tenant });
      if (range === null) return { fresh: [], range, result: undefined };
      const lo = BigInt(range.first);
      const hi = BigInt(range.last);
      const fresh = records.filter((_, i) => offsets[i] >= lo && offsets[i] <= hi);
      const result = fresh.length > 0 && fn ? await fn(tx, fresh, { range, part }) : undefined;
      return { fresh, range, result };
    });
  }

  positions() {
    return sql.positions(this.options.client || this.options.pool, this.consumer, this.stream,
      { tenant: this.tenant });
  }
}

function streamConsumer(opts) {
  return new StreamConsumer(opts);
}

module.exports = {
  transaction,
  run,
  idempotent,
  twoPhase,
  recoverLapsed,
  consume,
  StreamConsumer,
  streamConsumer,
  recordOffset,
  // for the HTTP adapters
  inTransaction,
  connect,
  rollback,
  beginSql,
  normalize,
  setWaitTimeout,
};

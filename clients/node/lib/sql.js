'use strict';

// One function per SQL call of the idempotency extension (doc/reference.md).
// Each runs one statement on `db`: a pg Client, a PoolClient inside the
// caller's transaction, or a Pool (a statement of its own).  Driver errors
// are mapped by mapError (errors.js).

const { mapError } = require('./errors');

// Durations: a number is milliseconds; a string is a PostgreSQL interval
// ('30 seconds', '1 day').  null/undefined: the extension's default.
function interval(v, name) {
  if (v === undefined || v === null) return null;
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new TypeError(`${name} must be a finite number of milliseconds`);
    return `${v} milliseconds`;
  }
  if (typeof v === 'string') return v;
  throw new TypeError(`${name} must be a number of milliseconds or an interval string`);
}

// The milliseconds of a duration given as a number, or as a simple interval
// string ('90 seconds', '24 hours', '7d'); null if it cannot be read.
const UNIT_MS = {
  ms: 1, millisecond: 1, milliseconds: 1,
  s: 1000, sec: 1000, secs: 1000, second: 1000, seconds: 1000,
  min: 60000, mins: 60000, minute: 60000, minutes: 60000,
  h: 3600000, hour: 3600000, hours: 3600000,
  d: 86400000, day: 86400000, days: 86400000,
};
function durationMs(v) {
  if (typeof v === 'number') return v;
  if (typeof v !== 'string') return null;
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$/i.exec(v);
  if (!m || !(m[2].toLowerCase() in UNIT_MS)) return null;
  return Number(m[1]) * UNIT_MS[m[2].toLowerCase()];
}

function textOrNull(v) {
  return v === undefined || v === null ? null : String(v);
}

function json(v) {
  return v === undefined ? null : JSON.stringify(v);
}

function scopeOf(opts) {
  return opts && opts.scope !== undefined && opts.scope !== null ? String(opts.scope) : '';
}

function tokenOf(opts) {
  if (!opts || opts.token === undefined || opts.token === null) return null;
  return String(opts.token);
}

async function q(db, text, values) {
  try {
    return await db.query(text, values);
  } catch (err) {
    throw mapError(err);
  }
}

function claimRow(r) {
  return {
    status: r.status,
    token: r.token,
    recoveryPoint: r.recovery_point,
    responseCode: r.response_code,
    responseBody: r.response_body,
    responseHeaders: r.response_headers,
    responseRaw: r.response_raw,
    expiresAt: r.expires_at,
  };
}

const CLAIM_SQL =
  'SELECT status, token::text AS token, recovery_point, response_code, response_body, expires_at,' +
  '       response_headers, response_raw' +
  '  FROM idem_claim($1, request => $2::jsonb, scope => $3, ttl => $4::interval,' +
  '                  lease => $5::interval, wait => $6, keep_request => $7)';

async function claim(db, key, opts = {}) {
  const { rows } = await q(db, CLAIM_SQL, [
    key, json(opts.request), scopeOf(opts), interval(opts.ttl, 'ttl'),
    interval(opts.lease, 'lease'), Boolean(opts.wait), Boolean(opts.keepRequest),
  ]);
  return claimRow(rows[0]);
}

async function complete(db, key, response = {}, opts = {}) {
  const status = response.status === undefined ? 200 : response.status;
  let raw = response.raw === undefined ? null : response.raw;
  if (typeof raw === 'string') raw = Buffer.from(raw, 'utf8');
  await q(db,
    'SELECT idem_complete($1, $2, $3::jsonb, scope => $4, token => $5::bigint,' +
    '                     response_headers => $6::jsonb, response_raw => $7::bytea)',
    [key, status, json(response.body), scopeOf(opts), tokenOf(opts),
      response.headers ? JSON.stringify(response.headers) : null, raw]);
}

async function checkpoint(db, key, recoveryPoint, opts = {}) {
  await q(db, 'SELECT idem_checkpoint($1, $2, scope => $3, token => $4::bigint)',
    [key, recoveryPoint, scopeOf(opts), tokenOf(opts)]);
}

async function release(db, key, opts = {}) {
  await q(db, 'SELECT idem_release($1, scope => $2, token => $3::bigint)',
    [key, scopeOf(opts), tokenOf(opts)]);
}

async function lookup(db, key, opts = {}) {
  const { rows } = await q(db,
    'SELECT status, token::text AS token, recovery_point, response_code, response_body, claimed_at,' +
    '       expires_at, lease_expires_at, response_headers, response_raw, request' +
    '  FROM idem_lookup($1, $2)', [key, scopeOf(opts)]);
  if (rows.length === 0) return null;
  const r = rows[0];
  return {
    status: r.status,
    token: r.token,
    recoveryPoint: r.recovery_point,
    responseCode: r.response_code,
    responseBody: r.response_body,
    responseHeaders: r.response_headers,
    responseRaw: r.response_raw,
    claimedAt: r.claimed_at,
    expiresAt: r.expires_at,
    leaseExpiresAt: r.lease_expires_at,
    request: r.request,
  };
}

async function recover(db, opts = {}) {
  if (opts.lease === undefined || opts.lease === null) throw new TypeError('recover needs a lease');
  const { rows } = await q(db,
    'SELECT key, scope, token::text AS token, recovery_point, request, lapsed_at' +
    '  FROM idem_recover($1::interval, $2, $3)',
    [interval(opts.lease, 'lease'), opts.scope === undefined ? null : opts.scope,
      opts.maxKeys === undefined ? 10 : opts.maxKeys]);
  return rows.map((r) => ({
    key: r.key,
    scope: r.scope,
    token: r.token,
    recoveryPoint: r.recovery_point,
    request: r.request,
    lapsedAt: r.lapsed_at,
  }));
}

// The tenant whose rows the transaction writes (opts.tenant), for a message
// ledger, stream positions and producer sequences distributed by Citus
// (extension 0.5.0): a string, or an integer sent as its decimal text (the
// server converts it to the type of the distributed tables' tenant column);
// null when none was given, and then the call without it is made, as before
// 0.5.0 (the consume calls' three-argument form, 0.4.0's stream calls).
function tenantOf(opts) {
  const t = opts ? opts.tenant : undefined;
  if (t === undefined || t === null) return null;
  if (typeof t === 'string' || typeof t === 'bigint' || (typeof t === 'number' && Number.isSafeInteger(t))) {
    return String(t);
  }
  throw new TypeError(`tenant must be a string or an integer, not ${typeof t === 'number' ? t : typeof t}`);
}

async function consumeMessage(db, consumer, messageId, opts = {}) {
  const tenant = tenantOf(opts);
  const { rows } = tenant === null
    ? await q(db, 'SELECT idem_consume_message($1, $2, $3::interval) AS fresh',
      [consumer, textOrNull(messageId), interval(opts.ttl, 'ttl')])
    // the four-argument overload (extension 0.5.0): the tenant's shard of a
    // message ledger distributed by Citus; not used where it is not
    : await q(db, 'SELECT idem_consume_message($1, $2, $3::interval, $4::text) AS fresh',
      [consumer, textOrNull(messageId), interval(opts.ttl, 'ttl'), tenant]);
  return rows[0].fresh;
}

async function consumeMessages(db, consumer, messageIds, opts = {}) {
  const tenant = tenantOf(opts);
  const { rows } = tenant === null
    ? await q(db,
      'SELECT m FROM idem_consume_messages($1, $2::text[], $3::interval) AS t(m)',
      [consumer, messageIds.map(textOrNull), interval(opts.ttl, 'ttl')])
    : await q(db,
      'SELECT m FROM idem_consume_messages($1, $2::text[], $3::interval, $4::text) AS t(m)',
      [consumer, messageIds.map(textOrNull), interval(opts.ttl, 'ttl'), tenant]);
  return rows.map((r) => r.m);
}

// ---------------------------------------------------------------- streams
// Offsets, generations, epochs and sequence numbers are SQL bigints: they
// are taken as safe integers, bigints or decimal strings, and returned as
// decimal strings (as tokens are), which BigInt() reads exactly.

function int8(v, name, optional = false) {
  if (v === undefined || v === null) {
    if (optional) return null;
    throw new TypeError(`${name} is required`);
  }
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'number' && Number.isSafeInteger(v)) return String(v);
  if (typeof v === 'string' && /^-?[0-9]+$/.test(v)) return v;
  throw new TypeError(`${name} must be an integer: a safe number, a bigint or a decimal string`);
}

function int4(v, name) {
  if (!Number.isSafeInteger(v)) throw new TypeError(`${name} must be an integer`);
  return v;
}

// The stream calls take opts.tenant (tenantOf) for stream positions and
// producer sequences distributed by Citus: given, the call's tenant overload
// (extension 0.5.0, every argument given) reads and writes the tenant's
// shard; a server whose positions are not distributed does not use it (the
// node's own, as without it).  Not given, the very statement of 0.4.0.

// idem_assign: [{ part, nextOffset }] in partition order (nextOffset null for
// a partition never seen).  ID001: StaleGenerationError, nothing changed.
async function assign(db, consumer, stream, parts, generation, opts = {}) {
  if (!Array.isArray(parts)) throw new TypeError('parts must be an array of partition numbers');
  const params = [consumer, stream, parts.map((p) => int4(p, 'a partition')), int8(generation, 'generation')];
  const tenant = tenantOf(opts);
  const { rows } = tenant === null
    ? await q(db,
      'SELECT part, next_offset::text AS next_offset FROM idem_assign($1, $2, $3::integer[], $4::bigint)',
      params)
    : await q(db,
      'SELECT part, next_offset::text AS next_offset FROM idem_assign($1, $2, $3::integer[], $4::bigint, $5::text)',
      [...params, tenant]);
  return rows.map((r) => ({ part: r.part, nextOffset: r.next_offset }));
}

// idem_advance: the part of the batch firstOffset..lastOffset not applied
// yet, { first, last }, or null; moves the position in the caller's
// transaction.
async function advance(db, consumer, stream, part, firstOffset, lastOffset, opts = {}) {
  const params = [consumer, stream, int4(part, 'part'), int8(firstOffset, 'firstOffset'),
    int8(lastOffset, 'lastOffset'), int8(opts.generation, 'generation', true)];
  const tenant = tenantOf(opts);
  const { rows } = tenant === null
    ? await q(db,
      'SELECT first_offset::text AS first, last_offset::text AS last' +
      '  FROM idem_advance($1, $2, $3::integer, $4::bigint, $5::bigint, $6::bigint)',
      params)
    // the overload has no default: the generation goes, null or not
    : await q(db,
      'SELECT first_offset::text AS first, last_offset::text AS last' +
      '  FROM idem_advance($1, $2, $3::integer, $4::bigint, $5::bigint, $6::bigint, $7::text)',
      [...params, tenant]);
  return rows.length === 0 ? null : { first: rows[0].first, last: rows[0].last };
}

async function positions(db, consumer, stream, opts = {}) {
  const tenant = tenantOf(opts);
  const { rows } = tenant === null
    ? await q(db,
      'SELECT part, next_offset::text AS next_offset, generation::text AS generation, updated_at' +
      '  FROM idem_positions($1, $2) ORDER BY part', [consumer, stream])
    : await q(db,
      'SELECT part, next_offset::text AS next_offset, generation::text AS generation, updated_at' +
      '  FROM idem_positions($1, $2, $3::text) ORDER BY part', [consumer, stream, tenant]);
  return rows.map((r) => ({
    part: r.part, nextOffset: r.next_offset, generation: r.generation, updatedAt: r.updated_at,
  }));
}

// idem_sequence: 'new' | 'duplicate' | 'gap' | 'fenced'; with { strict } a gap
// is SequenceGapError (ID002) instead.
async function sequence(db, consumer, producer, epoch, seq, opts = {}) {
  const params = [consumer, producer, int8(epoch, 'epoch'), int8(seq, 'seq'), Boolean(opts.strict)];
  const tenant = tenantOf(opts);
  const { rows } = tenant === null
    ? await q(db, 'SELECT idem_sequence($1, $2, $3::bigint, $4::bigint, $5::boolean) AS answer', params)
    : await q(db, 'SELECT idem_sequence($1, $2, $3::bigint, $4::bigint, $5::boolean, $6::text) AS answer',
      [...params, tenant]);
  return rows[0].answer;
}

module.exports = {
  claim,
  complete,
  checkpoint,
  release,
  lookup,
  recover,
  consumeMessage,
  consumeMessages,
  tenantOf,
  assign,
  advance,
  positions,
  sequence,
  interval,
  durationMs,
  q,
};

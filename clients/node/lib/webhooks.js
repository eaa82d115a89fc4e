'use strict';

// Standard Webhooks (https://www.standardwebhooks.com/): signing what a
// relay sends, verifying what a receiver gets, and the receiver's dedup on
// webhook-id inside its own transaction (idem_consume_message).  The wire
// behaviour is ../outbox-behaviour.md's, the same in the Python library.

const crypto = require('node:crypto');
const sql = require('./sql');
const { transaction } = require('./core');
const { IdempotencyError, isUnavailable } = require('./errors');

// How far a webhook-timestamp may be from now, either way (seconds).
const DEFAULT_TOLERANCE_S = 300;
const PROBLEM_TAG = 'tag:pg-idempotency,2026:';

// A webhook the receiver refuses: status is the HTTP answer (400 malformed,
// 401 signature or timestamp), slug the problem type.
class WebhookVerificationError extends IdempotencyError {
  constructor(status, slug, message) {
    super(message);
    this.status = status;
    this.slug = slug;
  }
}

// The key of a secret: "whsec_<base64>" (the prefix is optional), or the
// key's bytes as a Buffer.
function secretKey(secret) {
  if (Buffer.isBuffer(secret) || secret instanceof Uint8Array) {
    if (secret.length === 0) throw new TypeError('a webhook secret must not be empty');
    return Buffer.from(secret);
  }
  if (typeof secret !== 'string') throw new TypeError('a webhook secret is a "whsec_<base64>" string or a Buffer');
  const b64 = secret.startsWith('whsec_') ? secret.slice(6) : secret;
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64)) throw new TypeError('a webhook secret is "whsec_" and base64');
  const key = Buffer.from(b64, 'base64');
  if (key.length === 0) throw new TypeError('a webhook secret must not be empty');
  return key;
}

// A new secret: "whsec_" and 32 random bytes in base64.
function generateSecret() {
  return `whsec_${crypto.randomBytes(32).toString('base64')}`;
}

function toBuffer(body) {
  if (body === undefined || body === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(body)) return body;
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  throw new TypeError('a webhook body is a Buffer or a string (the bytes as sent)');
}

// "v1,<base64 of HMAC-SHA256(key, id.timestamp.body)>"
function signWebhook(secret, id, timestamp, body) {
  const mac = crypto.createHmac('sha256', secretKey(secret));
  mac.update(`${id}.${timestamp}.`);
  mac.update(toBuffer(body));
  return `v1,${mac.digest('base64')}`;
}

// The headers a relay sends with BODY (timestamp: seconds since the epoch).
function webhookHeaders(secret, id, timestamp, body) {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(timestamp),
    'webhook-signature': signWebhook(secret, id, timestamp, body),
  };
}

function header(headers, name) {
  if (!headers) return undefined;
  let v;
  if (typeof headers.get === 'function') v = headers.get(name);
  else {
    v = headers[name];
    if (v === undefined) {
      const k = Object.keys(headers).find((h) => h.toLowerCase() === name);
      if (k !== undefined) v = headers[k];
    }
  }
  if (Array.isArray(v)) {
    if (v.length !== 1) return v.length === 0 ? undefined : null;
    [v] = v;
  }
  return v === undefined || v === null ? undefined : String(v);
}

// verifyWebhook(secret, headers, body, { tolerance, now }) → { id, timestamp }
// Throws WebhookVerificationError: 400 "webhook-malformed" (a header missing,
// repeated or unreadable), 401 "webhook-timestamp" (more than tolerance
// seconds from now), 401 "webhook-signature" (no v1 signature matches).
// secret may be an array (a rotation: any one matches).  body: the bytes as
// received, before any parser.
function verifyWebhook(secret, headers, body, opts = {}) {
  const secrets = (Array.isArray(secret) ? secret : [secret]).map(secretKey);
  if (secrets.length === 0) throw new TypeError('verifyWebhook needs a secret');
  const tolerance = opts.tolerance === undefined ? DEFAULT_TOLERANCE_S : opts.tolerance;
  const id = header(headers, 'webhook-id');
  const ts = header(headers, 'webhook-timestamp');
  const sigs = header(headers, 'webhook-signature');
  for (const [name, v] of [['webhook-id', id], ['webhook-timestamp', ts], ['webhook-signature', sigs]]) {
    if (v === undefined) throw new WebhookVerificationError(400, 'webhook-malformed', `the ${name} header is missing`);
    if (v === null) throw new WebhookVerificationError(400, 'webhook-malformed', `the ${name} header is repeated`);
  }
  if (id === '' || Buffer.byteLength(id) > 255) {
    throw new WebhookVerificationError(400, 'webhook-malformed', 'the webhook-id header is empty or longer than 255 bytes');
  }
  if (!/^[0-9]{1,12}$/.test(ts)) {
    throw new WebhookVerificationError(400, 'webhook-malformed', 'the webhook-timestamp header is not a number of seconds');
  }
  const timestamp = Number(ts);
  const now = opts.now === undefined ? Math.floor(Date.now() / 1000) : opts.now;
  if (Math.abs(now - timestamp) > tolerance) {
    throw new WebhookVerificationError(401, 'webhook-timestamp',
      `the webhook-timestamp is more than ${tolerance} seconds from now`);
  }
  const buf = toBuffer(body);
  const given = sigs.split(' ').filter((s) => s.startsWith('v1,'))
    .map((s) => Buffer.from(s.slice(3), 'base64'));
  for (const key of secrets) {
    const mac = crypto.createHmac('sha256', key);
    mac.update(`${id}.${ts}.`);
    mac.update(buf);
    const expected = mac.digest();
    // every candidate is compared (no early exit on the first match's
    // position), each in constant time
    let ok = false;
    for (const g of given) {
      if (g.length === expected.length && crypto.timingSafeEqual(g, expected)) ok = true;
    }
    if (ok) return { id, timestamp };
  }
  throw new WebhookVerificationError(401, 'webhook-signature', 'no webhook-signature matches the body');
}

// What a receiver's handler gets.
function webhookEvent(id, timestamp, headers, body) {
  const buf = toBuffer(body);
  return {
    id,
    timestamp,
    headers,
    body: buf,
    text() {
      return buf.toString('utf8');
    },
    json() {
      return JSON.parse(buf.toString('utf8'));
    },
  };
}

// receiveWebhook(opts, { headers, body }, fn) → { id, duplicate, result }
// Verifies the signature, then in one transaction ({ pool }: its own,
// retried on 40P01/40001; { client }: the caller's open one) records
// webhook-id for opts.consumer with idem_consume_message and, when it is
// new, runs fn(tx, event): its writes and the dedup record commit together.
// A redelivery is { duplicate: true } and fn does not run; fn throwing
// rolls both back (the sender retries).  opts.tenant (a string or integer,
// or a function of the verified event giving one), for a message ledger
// distributed by Citus: the tenant whose rows fn writes, in whose shard the
// id is recorded; none (or the function answering none): the
// three-argument call.
async function receiveWebhook(opts, request, fn) {
  if (!opts || typeof opts.consumer !== 'string') throw new TypeError('receiveWebhook needs { consumer }');
  if (opts.secret === undefined) throw new TypeError('receiveWebhook needs { secret }');
  if (typeof fn !== 'function') throw new TypeError('receiveWebhook needs a handler');
  // headersDistinct (Node's http): a header sent twice is seen as such
  const { id, timestamp } = verifyWebhook(opts.secret, request.headersDistinct || request.headers,
    request.body, opts);
  const event = webhookEvent(id, timestamp, request.headers, request.body);
  const tenant = typeof opts.tenant === 'function' ? await opts.tenant(event) : opts.tenant;
  const body = async (tx) => {
    const fresh = await sql.consumeMessage(tx, opts.consumer, id, { ttl: opts.ttl, tenant });
    if (!fresh) return { id, duplicate: true, result: undefined };
    return { id, duplicate: false, result: await fn(tx, event) };
  };
  if (opts.client) return body(opts.client);
  if (!opts.pool) throw new TypeError('receiveWebhook needs { pool } or { client }');
  return transaction(opts.pool, body, opts);
}

// A framework receiver's tenant option, a value or a function of (event,
// request), as receiveWebhook takes it.
function requestTenant(tenant, request) {
  return typeof tenant === 'function' ? (event) => tenant(event, request) : tenant;
}

function problem(status, slug, title, detail) {
  return {
    status,
    headers: { 'content-type': 'application/problem+json', 'content-language': 'en' },
    body: Buffer.from(JSON.stringify({ type: PROBLEM_TAG + slug, title, status, detail })),
  };
}

const TITLES = {
  'webhook-malformed': 'The webhook headers are malformed',
  'webhook-timestamp': 'The webhook timestamp is out of tolerance',
  'webhook-signature': 'The webhook signature does not match',
};

// The HTTP answer of a receiver (the adapters' shared part): 200
// {"id","status":"applied"|"duplicate"}, the problem of a refused webhook,
// 503 when the database is out of reach, 500 when the handler failed (its
// writes rolled back with the dedup record: the sender retries).
async function answerWebhook(opts, request, fn) {
  try {
    const r = await receiveWebhook(opts, request, fn);
    return {
      status: 200,
      headers: { 'content-type': 'application/json' },
      body: Buffer.from(JSON.stringify({ id: r.id, status: r.duplicate ? 'duplicate' : 'applied' })),
      outcome: r,
    };
  } catch (err) {
    if (err instanceof WebhookVerificationError) {
      return { ...problem(err.status, err.slug, TITLES[err.slug], err.message), error: err };
    }
    if (err instanceof TypeError && /^receiveWebhook needs|webhook secret/.test(err.message)) throw err;
    if (opts.onError) opts.onError(err);
    if (isUnavailable(err)) {
      return {
        ...problem(503, 'unavailable', 'The database is unavailable', 'The webhook was not recorded; deliver it again.'),
        error: err,
      };
    }
    return { ...problem(500, 'internal', 'Internal error', 'The webhook was not recorded; deliver it again.'), error: err };
  }
}

module.exports = {
  DEFAULT_TOLERANCE_S,
  WebhookVerificationError,
  generateSecret,
  secretKey,
  signWebhook,
  webhookHeaders,
  verifyWebhook,
  receiveWebhook,
  answerWebhook,
  requestTenant,
  webhookEvent,
};

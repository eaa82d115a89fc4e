'use strict';

// What the Express and Fastify adapters share: the Idempotency-Key field
// (draft-ietf-httpapi-idempotency-key-header: an RFC 8941 String, or a bare
// token as Stripe-style clients send), the key's scope and the request's
// fingerprint, the claim and the answers for each status, the stored
// response and its replay, and the mapping of the extension's SQLSTATEs to
// HTTP answers as RFC 9457 problem documents.  The adapters only capture
// what the handler sends and send what this returns.

const crypto = require('node:crypto');
const sql = require('./sql');
const core = require('./core');
const {
  mapError, isRetryable, isUnavailable, KeyBusyError, ResponseTooLargeError,
  StaleTokenError, TransientError, sqlstate,
} = require('./errors');

const DEFAULT_REPLAY_HEADERS = [
  'content-type', 'content-language', 'content-disposition', 'content-encoding',
  'location', 'etag', 'last-modified', 'link', 'vary', 'cache-control',
];
// never stored nor replayed, whatever the allowlist says: a cookie belongs
// to one client; the others describe one connection or one transfer
const NEVER_REPLAYED = new Set([
  'set-cookie', 'content-length', 'transfer-encoding', 'connection', 'keep-alive',
  'date', 'idempotent-replayed', 'trailer', 'upgrade',
]);

const BARE_KEY_RE = /^[A-Za-z0-9._~:-]+$/;

class BadIdempotencyKeyError extends Error {
  constructor(slug, title, detail) {
    super(detail);
    this.name = 'BadIdempotencyKeyError';
    this.slug = slug;
    this.title = title;
    this.detail = detail;
  }
}

// An RFC 8941 sf-string (section 4.2.5) making up all of raw, or null.
function parseSfString(raw) {
  let out = '';
  for (let i = 1; i < raw.length; i++) {
    const c = raw[i];
    if (c === '\\') {
      i++;
      if (i >= raw.length || (raw[i] !== '"' && raw[i] !== '\\')) return null;
      out += raw[i];
    } else if (c === '"') {
      return i === raw.length - 1 ? out : null;
    } else if (c >= ' ' && c <= '~') {
      out += c;
    } else {
      return null;
    }
  }
  return null; // no closing quote
}

// The key carried by the Idempotency-Key field values of a request (an array
// with one element per field line, as Node's headersDistinct has them).
// Throws BadIdempotencyKeyError: missing, more than one field, malformed,
// empty, too long (bytes; the extension's idempotency.max_key_length).
function parseIdempotencyKey(values, options = {}) {
  const maxKeyLength = options.maxKeyLength || 255;
  if (values === undefined || values === null) values = [];
  else if (!Array.isArray(values)) values = [values];
  if (values.length === 0) {
    throw new BadIdempotencyKeyError('missing-key', 'Idempotency-Key is missing',
      'This operation is idempotent and requires an Idempotency-Key request header field.');
  }
  if (values.length > 1) {
    throw new BadIdempotencyKeyError('multiple-keys', 'More than one Idempotency-Key',
      'A request must not carry more than one Idempotency-Key header field.');
  }
  const raw = String(values[0]).replace(/^[ \t]+|[ \t]+$/g, '');
  let key = null;
  if (raw.startsWith('"')) key = parseSfString(raw);
  else if (BARE_KEY_RE.test(raw)) key = raw;
  if (key === null) {
    throw new BadIdempotencyKeyError('malformed-key', 'Idempotency-Key is malformed',
      'The Idempotency-Key must be a Structured Field String (RFC 8941), such as ' +
      '"8e03978e-40d5-43e8-bc93-6894a57f9324", or a bare token of letters, digits and ._~:-');
  }
  if (key === '') {
    throw new BadIdempotencyKeyError('empty-key', 'Idempotency-Key is empty',
      'The Idempotency-Key must not be empty.');
  }
  if (Buffer.byteLength(key, 'utf8') > maxKeyLength) {
    throw new BadIdempotencyKeyError('key-too-long', 'Idempotency-Key is too long',
      `The Idempotency-Key must be at most ${maxKeyLength} characters long.`);
  }
  return key;
}

function defaultCaller(req) {
  const u = req && req.user;
  if (u === undefined || u === null) return '';
  if (typeof u === 'string' || typeof u === 'number' || typeof u === 'bigint') return String(u);
  const id = u.id !== undefined ? u.id : u.sub !== undefined ? u.sub : u.username;
  return id === undefined || id === null ? '' : String(id);
}

function defaultFingerprint(req) {
  const body = req ? req.body : undefined;
  if (body === undefined || body === null) return null;
  if (Buffer.isBuffer(body) || body instanceof Uint8Array) {
    return { sha256: crypto.createHash('sha256').update(body).digest('hex') };
  }
  return body;
}

function toHeaderValue(v) {
  if (Array.isArray(v)) return v.map(String);
  return String(v);
}

class HttpIdempotency {
  constructor(options = {}) {
    if (!options.pool) throw new TypeError('pg-idempotency: the pool option is required');
    this.pool = options.pool;
    this.ttl = options.ttl === undefined ? '24 hours' : options.ttl;
    this.ttlMs = sql.durationMs(this.ttl);
    if (this.ttlMs === null || !(this.ttlMs > 0)) {
      throw new TypeError('pg-idempotency: ttl must be milliseconds or a simple interval such as "24 hours"');
    }
    this.required = options.required !== false;
    this.methods = options.methods === null ? null
      : new Set((options.methods || ['POST', 'PATCH']).map((m) => String(m).toUpperCase()));
    this.caller = options.caller || defaultCaller;
    this.scope = options.scope || null;
    this.fingerprint = options.fingerprint || defaultFingerprint;
    this.wait = options.wait ? sql.durationMs(options.wait) : 0;
    if (this.wait === null) throw new TypeError('pg-idempotency: wait must be milliseconds');
    this.lease = options.lease === undefined || options.lease === null ? null : options.lease;
    this.keepRequest = Boolean(options.keepRequest);
    const extra = (options.replayHeaders || []).map((h) => String(h).toLowerCase());
    this.replayHeaders = new Set([...DEFAULT_REPLAY_HEADERS, ...extra].filter((h) => !NEVER_REPLAYED.has(h)));
    this.storeServerErrors = Boolean(options.storeServerErrors);
    this.timeoutStatus = options.timeoutStatus === 503 ? 503 : 409;
    this.tooLargeStatus = options.tooLargeStatus === 413 ? 413 : 500;
    this.retryAfter = options.retryAfter === undefined ? 1 : options.retryAfter;
    this.docsUrl = options.docsUrl === undefined ? '/docs/idempotency' : options.docsUrl;
    this.maxKeyLength = options.maxKeyLength || 255;
    this.isolationLevel = options.isolationLevel;
    this.retries = options.retries === undefined ? 3 : options.retries;
    this.onError = options.onError || ((err) => {
      console.error('pg-idempotency:', err); // eslint-disable-line no-console
    });
  }

  applies(method) {
    return this.methods === null || this.methods.has(String(method).toUpperCase());
  }

  // ------------------------------------------------------------ answers

  problem(status, slug, title, detail, extraHeaders = {}) {
    const doc = { type: this.docsUrl ? `${this.docsUrl}#${slug}` : 'about:blank', title, status, detail };
    const headers = { 'content-type': 'application/problem+json', 'content-language': 'en' };
    if (this.docsUrl) headers.link = `<${this.docsUrl}>; rel="describedby"`;
    Object.assign(headers, extraHeaders);
    return { status, headers, body: Buffer.from(JSON.stringify(doc)), problem: slug };
  }

  retryAfterHeaders() {
    return this.retryAfter === null ? {} : { 'retry-after': String(this.retryAfter) };
  }

  inFlight(status = 409) {
    if (status === 503) {
      return this.problem(503, 'in-flight-timeout', 'A request is outstanding for this Idempotency-Key',
        'A request with the same Idempotency-Key is still being processed and did not finish in time. Retry it later.',
        this.retryAfterHeaders());
    }
    return this.problem(409, 'in-flight', 'A request is outstanding for this Idempotency-Key',
      'A request with the same Idempotency-Key for the same operation is being processed. Retry it later.',
      this.retryAfterHeaders());
  }

  errorResponse(err) {
    const e = mapError(err);
    if (isUnavailable(e)) {
      return this.problem(503, 'store-unavailable', 'Idempotency store unavailable',
        'The request could not be recorded; nothing was done. Retry it later.', this.retryAfterHeaders());
    }
    if (e instanceof KeyBusyError) {
      return this.inFlight(e.code === '55006' ? 409 : this.timeoutStatus);
    }
    if (e instanceof ResponseTooLargeError) {
      return this.problem(this.tooLargeStatus, 'response-too-large', 'Response too large to be stored',
        'The response is larger than the idempotency store keeps; the operation was rolled back and may be retried.');
    }
    if (e instanceof TransientError || isRetryable(e)) {
      return this.problem(503, 'transient', 'Transient conflict',
        'The operation was rolled back because of a conflict with another transaction. Retry it.',
        this.retryAfterHeaders());
    }
    if (e instanceof StaleTokenError) {
      return this.problem(409, 'taken-over', 'The request was taken over',
        'This request took longer than its lease and another request for the same Idempotency-Key took it over.');
    }
    if (sqlstate(e) === '22P05') {
      return this.problem(400, 'request-unsupported', 'Request cannot be fingerprinted',
        'The request body holds characters that cannot be stored (such as \\u0000).');
    }
    this.onError(e);
    return this.problem(500, 'internal', 'Internal error', 'The request failed; nothing was done.');
  }

  pickHeaders(headers) {
    const out = {};
    for (const [name, value] of Object.entries(headers || {})) {
      const n = name.toLowerCase();
      if (value === undefined || value === null) continue;
      if (this.replayHeaders.has(n) && !NEVER_REPLAYED.has(n)) out[n] = toHeaderValue(value);
    }
    return Object.keys(out).length ? out : null;
  }

  replayOf(c) {
    const headers = {};
    for (const [name, value] of Object.entries(c.responseHeaders || {})) {
      const n = name.toLowerCase();
      if (this.replayHeaders.has(n) && !NEVER_REPLAYED.has(n)) headers[n] = value;
    }
    let body;
    if (c.responseRaw !== null && c.responseRaw !== undefined) {
      body = c.responseRaw;
    } else if (c.responseBody !== null && c.responseBody !== undefined) {
      body = Buffer.from(JSON.stringify(c.responseBody));
      if (!headers['content-type']) headers['content-type'] = 'application/json; charset=utf-8';
    } else {
      body = Buffer.alloc(0);
    }
    headers['idempotent-replayed'] = 'true';
    return { status: c.responseCode, headers, body, replayed: true };
  }

  answerFor(c) {
    switch (c.status) {
      case 'completed':
        return this.replayOf(c);
      case 'in_progress':
        return this.inFlight(409);
      case 'mismatch':
        return this.problem(422, 'key-reused', 'Idempotency-Key is already used',
          'This Idempotency-Key was used with a different request. A key must not be reused for a different request.');
      default:
        throw new Error(`unexpected idem_claim status ${c.status}`);
    }
  }

  docs() {
    return {
      header: 'Idempotency-Key',
      required: this.required,
      methods: this.methods === null ? null : [...this.methods],
      key_syntax: 'an RFC 8941 String ("..."), or a bare token of letters, digits and ._~:-',
      max_key_length: this.maxKeyLength,
      key_retention_seconds: Math.round(this.ttlMs / 1000),
      key_scope: this.scope ? 'set by the application' : 'the authenticated caller, the method and the path',
      concurrent_requests: this.wait
        ? `wait up to ${this.wait} ms for the first request, then ${this.timeoutStatus}`
        : '409 with Retry-After',
      replay: 'the stored status, body and headers, with Idempotent-Replayed: true',
      replayed_headers: [...this.replayHeaders],
      server_errors: this.storeServerErrors ? 'stored and replayed' : 'not stored: a retry runs again',
    };
  }

  // ------------------------------------------------------------ the flow

  scopeFor(req, method, path) {
    const caller = String(this.caller(req) ?? '');
    let scope = this.scope
      ? String(this.scope(req, { caller, method, path }))
      : `${method} ${path}${caller ? ` ${caller}` : ''}`;
    if (Buffer.byteLength(scope, 'utf8') > this.maxKeyLength) {
      scope = `sha256:${crypto.createHash('sha256').update(scope).digest('hex')}`;
    }
    return scope;
  }

  // begin({ req, method, path, keyValues }) → { reply } or { session }.
  // A session's `view` is what the handler sees as req.idempotency.
  async begin({ req, method, path, keyValues }) {
    let key = null;
    try {
      key = parseIdempotencyKey(keyValues, { maxKeyLength: this.maxKeyLength });
    } catch (err) {
      if (!(err instanceof BadIdempotencyKeyError)) throw err;
      if (err.slug !== 'missing-key' || this.required) {
        return { reply: this.problem(400, err.slug, err.title, err.detail) };
      }
    }
    let scope;
    let request;
    try {
      scope = key === null ? '' : this.scopeFor(req, String(method).toUpperCase(), path);
      request = key === null ? null : this.fingerprint(req);
    } catch (err) {
      return { reply: this.errorResponse(err) };
    }
    if (this.lease !== null && key !== null) return this.beginTwoPhase(key, scope, request);
    return this.beginTransaction(key, scope, request);
  }

  async beginTransaction(key, scope, request) {
    let client;
    try {
      client = await core.connect(this.pool);
    } catch (err) {
      return { reply: this.errorResponse(err) };
    }
    let c = null;
    for (let attempt = 1; ; attempt++) {
      try {
        await client.query(core.beginSql(this.isolationLevel));
        if (key === null) break;
        let previousLockTimeout = null;
        if (this.wait) {
          // bound both waits: for a transaction still open (lock_timeout)
          // and for a committed two-phase holder (idempotency.wait_timeout)
          const r = await client.query(
            "SELECT current_setting('lock_timeout') AS lt, set_config('lock_timeout', $1, true)," +
            "       set_config('idempotency.wait_timeout', $1, true)", [String(this.wait)]);
          previousLockTimeout = r.rows[0].lt;
        }
        c = await sql.claim(client, key, { request, scope, ttl: this.ttl, wait: Boolean(this.wait) });
        if (previousLockTimeout !== null) {
          await client.query("SELECT set_config('lock_timeout', $1, true)", [previousLockTimeout]);
        }
        break;
      } catch (err) {
        const broken = await core.rollback(client);
        if (isRetryable(err) && attempt <= this.retries && !broken) continue;
        client.release(broken || (isUnavailable(err) ? err : undefined));
        return { reply: this.errorResponse(err) };
      }
    }
    if (c !== null && c.status !== 'claimed') {
      const broken = await core.rollback(client); // the claim wrote nothing
      client.release(broken);
      return { reply: this.answerFor(c) };
    }
    const session = { mode: key === null ? 'none' : 'transaction', key, scope, client, done: false };
    session.view = {
      key, scope, tx: client, token: null,
      recoveryPoint: c ? c.recoveryPoint : null,
      replayed: false,
      checkpoint: async (point) => {
        if (key === null) return;
        await sql.checkpoint(client, key, point, { scope });
        session.view.recoveryPoint = point;
      },
    };
    return { session };
  }

  async beginTwoPhase(key, scope, request) {
    let c;
    try {
      c = await core.inTransaction(this.pool, { isolationLevel: this.isolationLevel, retries: this.retries },
        async (tx) => {
          if (this.wait) {
            await tx.query("SELECT set_config('lock_timeout', $1, true), set_config('idempotency.wait_timeout', $1, true)",
              [String(this.wait)]);
          }
          return {
            value: await sql.claim(tx, key, {
              request, scope, ttl: this.ttl, lease: this.lease, wait: Boolean(this.wait),
              keepRequest: this.keepRequest,
            }),
          };
        });
    } catch (err) {
      return { reply: this.errorResponse(err) };
    }
    if (c.status !== 'claimed') return { reply: this.answerFor(c) };
    const session = { mode: 'two-phase', key, scope, token: c.token, done: false };
    session.view = {
      key, scope, tx: null, token: c.token, recoveryPoint: c.recoveryPoint, replayed: false,
      checkpoint: async (point, write) => {
        await core.inTransaction(this.pool, { isolationLevel: this.isolationLevel, retries: this.retries },
          async (tx) => {
            if (write) await write(tx);
            await sql.checkpoint(tx, key, point, { scope, token: c.token });
            return {};
          });
        session.view.recoveryPoint = point;
      },
    };
    return { session };
  }

  // finish(session, { status, headers, body }) → the response to send: the
  // captured one once stored (or released), or a problem document when
  // storing failed (then nothing the handler wrote in the transaction is
  // kept).
  async finish(session, captured) {
    if (session.done) return captured;
    session.done = true;
    const serverError = captured.status >= 500 && !this.storeServerErrors;
    if (session.mode === 'two-phase') return this.finishTwoPhase(session, captured, serverError);
    const { client } = session;
    let broken;
    try {
      if (serverError) {
        broken = await core.rollback(client);
        return captured;
      }
      if (session.mode === 'transaction') {
        await sql.complete(client, session.key, {
          status: captured.status, headers: this.pickHeaders(captured.headers), raw: captured.body,
        }, { scope: session.scope });
      }
      await client.query('COMMIT');
      return captured;
    } catch (err) {
      broken = (await core.rollback(client)) || (isUnavailable(err) ? err : undefined);
      return this.errorResponse(err);
    } finally {
      client.release(broken);
    }
  }

  async finishTwoPhase(session, captured, serverError) {
    const { key, scope, token } = session;
    try {
      if (serverError) {
        await sql.release(this.pool, key, { scope, token });
        return captured;
      }
      await sql.complete(this.pool, key, {
        status: captured.status, headers: this.pickHeaders(captured.headers), raw: captured.body,
      }, { scope, token });
      return captured;
    } catch (err) {
      const e = mapError(err);
      if (e instanceof ResponseTooLargeError) {
        try {
          await sql.release(this.pool, key, { scope, token });
        } catch (releaseErr) {
          // the lease will lapse
        }
      }
      return this.errorResponse(e);
    }
  }

  // The handler never answered (the client went away, or it threw past the
  // framework): roll back, or give the two-phase claim up.
  async abandon(session) {
    if (session.done) return;
    session.done = true;
    if (session.mode === 'two-phase') {
      try {
        await sql.release(this.pool, session.key, { scope: session.scope, token: session.token });
      } catch (err) {
        // stale or gone: the lease lapses
      }
      return;
    }
    const broken = await core.rollback(session.client);
    session.client.release(broken);
  }
}

module.exports = {
  HttpIdempotency,
  parseIdempotencyKey,
  BadIdempotencyKeyError,
  DEFAULT_REPLAY_HEADERS,
};

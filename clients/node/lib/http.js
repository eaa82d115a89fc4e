'use strict';

// What the Express and Fastify adapters share, as clients/http-behaviour.md
// lays it down for both client libraries: the Idempotency-Key field
// (draft-ietf-httpapi-idempotency-key-header: an RFC 8941 String, or a bare
// token as Stripe-style clients send), the key's scope (the caller, the
// method and the route; refused when no caller can be established) and the
// request's fingerprint (the method, path, query and body), the claim and
// the answers for each status, the stored response and its replay, and the
// mapping of the extension's SQLSTATEs to HTTP answers as RFC 9457 problem
// documents.  The adapters only capture what the handler sends and send what
// this returns.

const crypto = require('node:crypto');
const sql = require('./sql');
const core = require('./core');
const {
  mapError, isRetryable, isUnavailable, KeyBusyError, ResponseTooLargeError,
  StaleTokenError, TransientError, ConfigurationError,
} = require('./errors');

const DEFAULT_REPLAY_HEADERS = [
  'content-type', 'content-language', 'content-disposition', 'content-encoding',
  'location', 'etag', 'last-modified', 'link', 'cache-control', 'expires', 'vary',
];
// never stored nor replayed, whatever the allowlist says: a cookie belongs
// to one client; the others describe one connection or one transfer
const NEVER_REPLAYED = new Set([
  'set-cookie', 'set-cookie2', 'content-length', 'transfer-encoding', 'connection',
  'keep-alive', 'upgrade', 'trailer', 'te', 'proxy-authenticate', 'idempotent-replayed',
  'date', 'server',
]);

// the problem types' base when no docsUrl is set (RFC 9457 allows a URI
// that is not dereferenceable; a tag URI never points at a missing page)
const PROBLEM_TAG = 'tag:pg-idempotency,2026:';
const MAX_SCOPE_BYTES = 255;
const SERVER_ERRORS = new Set(['rollback', 'release', 'store']);

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

// An RFC 8941 sf-string (section 4.2.5) at the start of raw: { value, rest }
// (rest: what follows its closing quote), or null.
function parseSfString(raw) {
  let out = '';
  for (let i = 1; i < raw.length; i++) {
    const c = raw[i];
    if (c === '\\') {
      i++;
      if (i >= raw.length || (raw[i] !== '"' && raw[i] !== '\\')) return null;
      out += raw[i];
    } else if (c === '"') {
      return { value: out, rest: raw.slice(i + 1) };
    } else if (c >= ' ' && c <= '~') {
      out += c;
    } else {
      return null;
    }
  }
  return null; // no closing quote
}

function multipleKeys(header) {
  return new BadIdempotencyKeyError('multiple-keys', `More than one ${header}`,
    `A request must carry one ${header} header field.`);
}

// The key carried by the Idempotency-Key field values of a request (an array
// with one element per field line, as Node's headersDistinct has them).
// Throws BadIdempotencyKeyError: missing, more than one (two field lines, or
// a list in one), malformed, empty, too long (bytes; the extension's
// idempotency.max_key_length).
function parseIdempotencyKey(values, options = {}) {
  const maxKeyBytes = options.maxKeyBytes || 255;
  const header = options.header || 'Idempotency-Key';
  if (values === undefined || values === null) values = [];
  else if (!Array.isArray(values)) values = [values];
  if (values.length === 0) {
    throw new BadIdempotencyKeyError('missing-key', `${header} is missing`,
      `This operation is idempotent and requires an ${header} request header field.`);
  }
  if (values.length > 1) throw multipleKeys(header);
  const raw = String(values[0]).replace(/^[ \t]+|[ \t]+$/g, '');
  let key = null;
  if (raw.startsWith('"')) {
    const sf = parseSfString(raw);
    if (sf !== null) {
      const rest = sf.rest.replace(/^[ \t]+/, '');
      if (rest.startsWith(',')) throw multipleKeys(header);
      if (rest === '') key = sf.value;
    }
  } else if (raw.includes(',')) {
    throw multipleKeys(header);
  } else if (BARE_KEY_RE.test(raw)) {
    key = raw;
  }
  if (key === null) {
    throw new BadIdempotencyKeyError('malformed-key', `${header} is malformed`,
      `The ${header} must be a Structured Field String (RFC 8941) of printable ASCII, such as ` +
      '"8e03978e-40d5-43e8-bc93-6894a57f9324", or a bare value of letters, digits and ._~:-.');
  }
  return checkKeyText(key, header, maxKeyBytes);
}

function checkKeyText(key, header, maxKeyBytes) {
  if (key === '') {
    throw new BadIdempotencyKeyError('empty-key', `${header} is empty`,
      `The ${header} must not be empty.`);
  }
  if (Buffer.byteLength(key, 'utf8') > maxKeyBytes) {
    throw new BadIdempotencyKeyError('key-too-long', `${header} is too long`,
      `The ${header} must be at most ${maxKeyBytes} bytes long.`);
  }
  return key;
}

// The default caller: req.user (Passport, @fastify/jwt and most
// authentication middleware put the authenticated user there) by its id,
// sub or username, or itself if it is a string or number; '' when none.
function defaultCaller(req) {
  const u = req && req.user;
  if (u === undefined || u === null || u === false) return '';
  if (typeof u === 'string' || typeof u === 'number' || typeof u === 'bigint') return String(u);
  const id = u.id !== undefined ? u.id : u.sub !== undefined ? u.sub : u.username;
  return id === undefined || id === null ? '' : String(id);
}

function sha256(bytes) {
  return { sha256: crypto.createHash('sha256').update(bytes).digest('hex') };
}

function isJsonType(contentType) {
  return /json/i.test(String(contentType || ''));
}

// A JSON value the extension can store as jsonb (no \u0000), else null.
function storableJson(value) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    return null;
  }
  if (text === undefined || text.includes('\\u0000')) return null;
  return value;
}

// The body part of the fingerprint, as the parser left it in req.body: a
// JSON body as JSON (key order and whitespace do not matter), any other
// body by the SHA-256 of its bytes, no body as null.  Returns { json } or
// { digest }.
function bodyFingerprint(body, contentType) {
  if (body === undefined || body === null) return { json: null };
  if (typeof body === 'string' || Buffer.isBuffer(body) || body instanceof Uint8Array) {
    const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
    if (bytes.length === 0) return { json: null };
    if (isJsonType(contentType)) {
      try {
        const parsed = storableJson(JSON.parse(Buffer.from(bytes).toString('utf8')));
        if (parsed !== null) return { json: parsed };
      } catch (err) {
        // not JSON: by its bytes
      }
    }
    return { digest: sha256(bytes) };
  }
  // parsed by express.json(), express.urlencoded() or Fastify
  const json = storableJson(body);
  return json !== null ? { json } : { digest: sha256(Buffer.from(String(JSON.stringify(body)), 'utf8')) };
}

// One dotted path ("card.last4", "items.0.sku") of a JSON value; null when
// absent.
function select(value, path) {
  let v = value;
  for (const seg of String(path).split('.')) {
    if (Array.isArray(v) && /^[0-9]+$/.test(seg)) v = v[Number(seg)];
    else if (v !== null && typeof v === 'object' && !Array.isArray(v) && Object.hasOwn(v, seg)) v = v[seg];
    else return null;
  }
  return v === undefined ? null : v;
}

// The fingerprint's body: all of it, or the selected fields of a JSON
// object (a body that is not one is taken whole).
function bodyPart(fp, fields) {
  if (fp.digest) return fp.digest;
  const body = fp.json;
  if (!fields || body === null || typeof body !== 'object' || Array.isArray(body)) return body;
  const out = {};
  for (const f of fields) out[f] = select(body, f);
  return out;
}

function decodePath(p) {
  try {
    return decodeURIComponent(p);
  } catch (err) {
    return p;
  }
}

// { path, query } of a request target ("/orders/1?a=b").
function splitTarget(url) {
  const s = String(url || '/');
  const i = s.indexOf('?');
  return i < 0 ? { path: decodePath(s), query: '' } : { path: decodePath(s.slice(0, i)), query: s.slice(i + 1) };
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
    // the server's idempotency.key_memory, as advertised (null: not said)
    this.keyMemoryMs = null;
    if (options.keyMemory !== undefined && options.keyMemory !== null) {
      this.keyMemoryMs = sql.durationMs(options.keyMemory);
      if (this.keyMemoryMs === null || this.keyMemoryMs < 0) {
        throw new TypeError('pg-idempotency: keyMemory must be milliseconds or a simple interval such as "30 days"');
      }
    }
    this.required = options.required !== false;
    this.methods = options.methods === null ? null
      : new Set((options.methods || ['POST', 'PATCH']).map((m) => String(m).toUpperCase()));
    this.header = options.header || 'Idempotency-Key';
    this.keyOf = options.key || null;
    if (this.keyOf !== null && typeof this.keyOf !== 'function') {
      throw new TypeError('pg-idempotency: key must be a function of the request');
    }
    this.caller = options.caller || defaultCaller;
    this.anonymous = Boolean(options.anonymous);
    this.scope = options.scope || null;
    this.fingerprint = options.fingerprint || null;
    this.fingerprintFields = options.fingerprintFields ? [...options.fingerprintFields].map(String) : null;
    if (this.fingerprint && this.fingerprintFields) {
      throw new TypeError('pg-idempotency: give fingerprint or fingerprintFields, not both');
    }
    this.wait = options.wait ? sql.durationMs(options.wait) : 0;
    if (this.wait === null) throw new TypeError('pg-idempotency: wait must be milliseconds or a simple interval');
    this.lease = options.lease === undefined || options.lease === null ? null : options.lease;
    this.keepRequest = Boolean(options.keepRequest);
    const extra = (options.replayHeaders || []).map((h) => String(h).toLowerCase());
    this.replayHeaders = new Set([...DEFAULT_REPLAY_HEADERS, ...extra].filter((h) => !NEVER_REPLAYED.has(h)));
    this.serverErrors = options.serverErrors === undefined ? 'rollback' : options.serverErrors;
    if (!SERVER_ERRORS.has(this.serverErrors)) {
      throw new TypeError("pg-idempotency: serverErrors is 'rollback', 'release' or 'store'");
    }
    this.timeoutStatus = options.timeoutStatus === 503 ? 503 : 409;
    this.tooLargeStatus = options.tooLargeStatus === 413 ? 413 : 500;
    this.retryAfter = options.retryAfter === undefined ? 1 : options.retryAfter;
    this.docsUrl = options.docsUrl || null;
    this.maxKeyBytes = options.maxKeyBytes || 255;
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

  problemType(slug) {
    return this.docsUrl ? `${this.docsUrl}#${slug}` : `${PROBLEM_TAG}${slug}`;
  }

  // An RFC 9457 problem document; 409 and 503 carry Retry-After.
  problem(status, slug, title, detail, extraHeaders = {}) {
    const doc = {
      type: this.problemType(slug), title, status, detail,
      key_retention_seconds: Math.round(this.ttlMs / 1000),
    };
    if (slug === 'expired') doc.key_memory_seconds = this.keyMemorySeconds();
    const headers = { 'content-type': 'application/problem+json', 'content-language': 'en' };
    if (this.docsUrl) headers.link = `<${this.docsUrl}>; rel="describedby"`;
    if ((status === 409 || status === 503) && this.retryAfter !== null) {
      headers['retry-after'] = String(this.retryAfter);
    }
    Object.assign(headers, extraHeaders);
    return { status, headers, body: Buffer.from(JSON.stringify(doc)), problem: slug };
  }

  inProgress() {
    return this.problem(409, 'in-progress', 'A request is outstanding for this Idempotency-Key',
      `A request with the same ${this.header} for the same operation is being processed. Retry it later.`);
  }

  // 410: the key's retention passed and the server still remembers it
  // (idempotency.key_memory): its response is gone and the request must not
  // run a second time
  expired() {
    return this.problem(410, 'expired', 'Idempotency-Key has expired',
      `This ${this.header} was used for a request whose response is no longer kept. ` +
      'The request was not processed again; send a new request with a new key.');
  }

  keyMemorySeconds() {
    return this.keyMemoryMs === null ? null : Math.round(this.keyMemoryMs / 1000);
  }

  busy() {
    return this.problem(this.timeoutStatus, 'busy', 'The Idempotency-Key is busy',
      `A request with the same ${this.header} for the same operation is being processed. Retry it later.`);
  }

  // 500, for a server that cannot keep the contract as it is set up: the
  // client is told nothing was done, onError is told why
  misconfigured(message) {
    this.onError(new ConfigurationError(`pg-idempotency: ${message}`));
    return this.problem(500, 'misconfigured', 'The server is misconfigured',
      'The server cannot process this request as it is set up; nothing was done.');
  }

  noCaller(message) {
    this.onError(new ConfigurationError(`pg-idempotency: ${message}`));
    return this.problem(500, 'no-caller', 'The caller could not be established',
      `This server scopes each ${this.header} by the authenticated caller and could not establish one ` +
      'for this request; nothing was done.');
  }

  errorResponse(err) {
    const e = mapError(err);
    if (isUnavailable(e)) {
      return this.problem(503, 'unavailable', 'The idempotency store is unavailable',
        'The request was not processed; retry it later.');
    }
    if (e instanceof KeyBusyError) {
      return e.code === '55006' ? this.inProgress() : this.busy();
    }
    if (e instanceof ResponseTooLargeError) {
      return this.problem(this.tooLargeStatus, 'response-too-large', 'The response is too large to be stored',
        'The response was larger than the store takes (idempotency.max_response_bytes). Nothing was done; ' +
        'the request can be retried.');
    }
    if (e instanceof TransientError || isRetryable(e)) {
      return this.problem(503, 'conflict', 'The request conflicted with another one; retry it',
        'The request was not processed; retry it later.');
    }
    if (e instanceof StaleTokenError) {
      return this.problem(409, 'taken-over', 'The claim was taken over',
        `This request took longer than its lease and another request for the same ${this.header} took it over.`);
    }
    if (e instanceof ConfigurationError) {
      return this.misconfigured(e.message.replace(/^pg-idempotency: /, ''));
    }
    this.onError(e);
    return this.problem(500, 'internal', 'Internal error', 'The request failed and changed nothing.');
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
      if (!headers['content-type']) headers['content-type'] = 'application/json';
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
        return this.inProgress();
      case 'mismatch':
        return this.problem(422, 'mismatch', 'Idempotency-Key is already used for another request',
          `This ${this.header} was used with a different request. A key must not be reused for another request.`);
      case 'expired':
        return this.expired();
      default:
        throw new Error(`unexpected idem_claim status ${c.status}`);
    }
  }

  // The published policy: the same document as the Python adapters'.
  docs() {
    const waitSeconds = this.wait ? this.wait / 1000 : null;
    let fingerprint = 'the method, path, query and body';
    if (this.fingerprint) fingerprint = 'set by the application';
    else if (this.fingerprintFields) fingerprint = `the method, path, query and the body's ${this.fingerprintFields.join(', ')}`;
    return {
      header: this.header,
      methods: this.methods === null ? null : [...this.methods].sort(),
      required: this.required,
      key_format: this.keyOf ? 'set by the application'
        : `an RFC 8941 String of 1-${this.maxKeyBytes} bytes of printable ASCII, or a bare value of [A-Za-z0-9._~:-]`,
      max_key_bytes: this.maxKeyBytes,
      key_scope: this.scope ? 'set by the application' : 'the authenticated caller, the method and the route',
      anonymous: this.anonymous,
      fingerprint,
      key_retention_seconds: Math.round(this.ttlMs / 1000),
      key_memory_seconds: this.keyMemorySeconds(),
      expired_key: '410 expired',
      concurrent_duplicate: waitSeconds === null ? '409 with Retry-After'
        : `waits up to ${waitSeconds} s for the first request, then ${this.timeoutStatus}`,
      wait_seconds: waitSeconds,
      replay_header: 'Idempotent-Replayed: true',
      replayed_headers: [...this.replayHeaders].sort(),
      server_errors: this.serverErrors,
    };
  }

  // ------------------------------------------------------------ the flow

  // The scope of a request's key: [caller, method, route] as JSON, or
  // "METHOD route" for an anonymous request where anonymous is allowed;
  // null when no caller can be established and anonymous requests are not
  // allowed.  Over 255 bytes: its SHA-256.
  scopeFor(req, method, route, path) {
    const caller = String(this.caller(req) ?? '');
    let scope;
    if (this.scope) {
      const s = this.scope(req, { caller, method, route, path });
      scope = s === undefined || s === null ? '' : String(s);
      if (scope === '' && !this.anonymous) return null;
    } else if (caller !== '') {
      scope = JSON.stringify([caller, method, route]);
    } else if (this.anonymous) {
      scope = `${method} ${route}`;
    } else {
      return null;
    }
    if (Buffer.byteLength(scope, 'utf8') > MAX_SCOPE_BYTES) {
      scope = `sha256:${crypto.createHash('sha256').update(scope).digest('hex')}`;
    }
    return scope;
  }

  // The request's fingerprint: { method, path, query, body }, or what the
  // fingerprint option makes of the request.  One that the store cannot
  // keep as jsonb (a \u0000) is kept by the SHA-256 of its JSON text.
  fingerprintOf(req, method, path, query, contentType) {
    if (this.fingerprint) {
      const fp = this.fingerprint(req);
      if (fp === undefined || fp === null) return null;
      return storableJson(fp) !== null ? fp : sha256(Buffer.from(String(JSON.stringify(fp)), 'utf8'));
    }
    const body = bodyPart(bodyFingerprint(req ? req.body : undefined, contentType), this.fingerprintFields);
    return { method, path, query, body };
  }

  keyFor(req, keyValues) {
    if (!this.keyOf) return parseIdempotencyKey(keyValues, { maxKeyBytes: this.maxKeyBytes, header: this.header });
    const k = this.keyOf(req);
    if (k === undefined || k === null) return parseIdempotencyKey([], { header: this.header });
    return checkKeyText(String(k), this.header, this.maxKeyBytes);
  }

  // begin({ req, method, url, route, keyValues, contentType }) → { reply }
  // or { session }.  url: the request target (path and query); route: the
  // route template that handles it (its path when unknown).  A session's
  // `view` is what the handler sees as req.idempotency.
  async begin({ req, method, url, route, keyValues, contentType }) {
    let key = null;
    const m = String(method).toUpperCase();
    try {
      key = this.keyFor(req, keyValues);
    } catch (err) {
      if (!(err instanceof BadIdempotencyKeyError)) return { reply: this.errorResponse(err) };
      if (err.slug !== 'missing-key' || this.required) {
        return { reply: this.problem(400, err.slug, err.title, err.detail) };
      }
    }
    let scope = '';
    let request = null;
    if (key !== null) {
      const { path, query } = splitTarget(url);
      try {
        scope = this.scopeFor(req, m, route || path, path);
        if (scope === null) {
          return {
            reply: this.noCaller(`no caller for ${m} ${path}: the caller option (default: req.user's id) ` +
              'found none. Put the authentication before the idempotency middleware, or set caller to ' +
              'what identifies the client; only an API without authentication sets anonymous: true.'),
          };
        }
        request = this.fingerprintOf(req, m, path, query, contentType);
      } catch (err) {
        return { reply: this.errorResponse(err) };
      }
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
    const serverError = captured.status >= 500 && this.serverErrors !== 'store';
    if (session.mode === 'two-phase') return this.finishTwoPhase(session, captured, serverError);
    const { client } = session;
    let broken;
    try {
      if (serverError && this.serverErrors === 'rollback') {
        broken = await core.rollback(client);
        return captured;
      }
      if (session.mode === 'transaction') {
        if (serverError) {
          await sql.release(client, session.key, { scope: session.scope });
        } else {
          await sql.complete(client, session.key, {
            status: captured.status, headers: this.pickHeaders(captured.headers), raw: captured.body,
          }, { scope: session.scope });
        }
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
  PROBLEM_TAG,
  splitTarget,
};

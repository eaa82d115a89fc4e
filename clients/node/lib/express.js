'use strict';

// Express 5 middleware: idempotency(options) → (req, res, next).
//
//   app.post('/orders', express.json(), idempotency({ pool }), handler)
//
// It goes after the authentication (the caller is part of the key's scope)
// and after the body parser (the parsed body is part of the request's
// fingerprint): a request with a body that no parser read is refused (500
// misconfigured when a body parser follows the middleware, 415 when none
// does), never fingerprinted without its body.  For a claimed key the
// handler finds the open transaction in req.idempotency.tx; what it sends
// is held back until the response is stored and the transaction committed,
// then sent.  See README.md and ../http-behaviour.md.

const http = require('node:http');
const { HttpIdempotency, splitTarget } = require('./http');
const { answerWebhook, requestTenant, secretKey } = require('./webhooks');

function toBuffer(chunk, encoding) {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (typeof chunk === 'string') return Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8');
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return Buffer.from(String(chunk));
}

function bodyAllowed(status) {
  return !(status < 200 || status === 204 || status === 304);
}

// Send a complete response with the methods of http.ServerResponse itself.
function sendRaw(res, out, end, cb) {
  res.statusCode = out.status;
  res.statusMessage = http.STATUS_CODES[out.status] || 'unknown';
  for (const [name, value] of Object.entries(out.headers || {})) res.setHeader(name, value);
  res.removeHeader('transfer-encoding');
  if (bodyAllowed(out.status)) {
    res.setHeader('content-length', out.body.length);
    end.call(res, out.body, cb);
  } else {
    res.removeHeader('content-length');
    end.call(res, cb);
  }
}

function setHeaders(res, headers) {
  if (!headers) return;
  if (Array.isArray(headers)) {
    const pairs = headers.length && Array.isArray(headers[0])
      ? headers
      : Array.from({ length: headers.length / 2 }, (_, i) => [headers[2 * i], headers[2 * i + 1]]);
    for (const [name, value] of pairs) res.appendHeader(name, value);
  } else {
    for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
  }
}

// Hold back what the handler sends: statusCode and headers stay on res,
// body chunks are kept; on end the engine stores the response, then it is
// sent (or replaced by a problem document if storing failed).
function intercept(res, engine, session, onError) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const chunks = [];
  let ended = false;
  const restore = () => {
    res.writeHead = original.writeHead;
    res.write = original.write;
    res.end = original.end;
    res.flushHeaders = original.flushHeaders;
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== 'string') {
      headers = reason;
      reason = undefined;
    }
    res.statusCode = status;
    if (reason) res.statusMessage = reason;
    setHeaders(res, headers);
    return res;
  };
  res.flushHeaders = function flushHeaders() {};
  res.write = function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    if (ended) return false;
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    if (cb) process.nextTick(cb);
    return true;
  };
  res.end = function end(chunk, encoding, cb) {
    if (typeof chunk === 'function') {
      cb = chunk;
      chunk = undefined;
    } else if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    if (ended) return res;
    ended = true;
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    const captured = { status: res.statusCode, headers: res.getHeaders(), body: Buffer.concat(chunks) };
    engine.finish(session, captured).then((out) => {
      restore();
      if (out !== captured) {
        for (const name of res.getHeaderNames()) res.removeHeader(name);
      }
      sendRaw(res, out, original.end, cb);
    }).catch((err) => {
      restore();
      onError(err);
      if (!res.headersSent) {
        for (const name of res.getHeaderNames()) res.removeHeader(name);
        sendRaw(res, engine.problem(500, 'internal', 'Internal error', 'The request failed.'), original.end);
      }
    });
    return res;
  };
}

const BODY_PARSERS = new Set(['jsonParser', 'urlencodedParser', 'rawParser', 'textParser']);

// The route template that will handle a request the middleware sees before
// routing (app.use): the app's router is walked with its layers' own
// matchers (read only), nested routers included; null when none is found.
function findRoute(stack, path, method, prefix) {
  for (const layer of stack || []) {
    if (!Array.isArray(layer.matchers)) continue;
    let m = false;
    for (const match of layer.matchers) {
      m = match(path);
      if (m) break;
    }
    if (!m) continue;
    if (layer.route) {
      const route = layer.route;
      if (typeof route._handlesMethod !== 'function' || route._handlesMethod(method)) {
        return prefix + String(route.path);
      }
      continue;
    }
    const sub = layer.handle && layer.handle.stack;
    if (Array.isArray(sub) && typeof layer.rawPath === 'string') {
      const mount = layer.slash ? '' : layer.rawPath.replace(/\/+$/, '');
      const rest = path.slice(layer.slash ? 0 : String(m.path).length) || '/';
      const found = findRoute(sub, rest.startsWith('/') ? rest : `/${rest}`, method, prefix + mount);
      if (found) return found;
    }
  }
  return null;
}

function routeOf(req, path) {
  if (req.route && req.route.path !== undefined) return String(req.baseUrl || '') + String(req.route.path);
  const router = req.app && req.app.router;
  return (router && findRoute(router.stack, path, req.method.toLowerCase(), '')) || path;
}

// True when the request carries a body that nothing has read: no body
// parser ran before the middleware, or none takes its Content-Type.
function bodyUnread(req) {
  if (req.body !== undefined || req.readableEnded) return false;
  const length = req.headers['content-length'];
  if (length !== undefined) return Number(length) > 0;
  return req.headers['transfer-encoding'] !== undefined;
}

// True when a body parser comes after the middleware `mw` in the stack it
// runs in (the route's, or the app's).
function parserAfter(req, mw) {
  const stacks = [req.route && req.route.stack, req.app && req.app.router && req.app.router.stack];
  for (const stack of stacks) {
    if (!Array.isArray(stack)) continue;
    const i = stack.findIndex((layer) => layer.handle === mw);
    if (i >= 0) return stack.slice(i + 1).some((layer) => BODY_PARSERS.has(layer.name));
  }
  return false;
}

function idempotency(options = {}) {
  const engine = options instanceof HttpIdempotency ? options : new HttpIdempotency(options);
  const header = engine.header.toLowerCase();
  async function handle(req, res, next) {
    const url = String(req.originalUrl || req.url);
    const { path } = splitTarget(url);
    const keyed = engine.keyOf !== null || (req.headersDistinct[header] || []).length > 0;
    if (keyed && bodyUnread(req)) {
      const reply = parserAfter(req, pgIdempotency)
        ? engine.misconfigured(`${req.method} ${path}: the request body was not parsed before idempotency(); ` +
          'mount it after express.json() (the body is part of the request\'s fingerprint)')
        : engine.problem(415, 'unsupported-media-type', 'Unsupported Content-Type',
          'The request body is of a type this operation does not read.');
      sendRaw(res, reply, res.end);
      return;
    }
    const r = await engine.begin({
      req,
      method: req.method,
      url,
      route: routeOf(req, path),
      keyValues: req.headersDistinct[header],
      contentType: req.headers['content-type'],
    });
    if (r.reply) {
      sendRaw(res, r.reply, res.end);
      return;
    }
    req.idempotency = r.session.view;
    intercept(res, engine, r.session, engine.onError);
    next();
  }
  function pgIdempotency(req, res, next) {
    if (!engine.applies(req.method)) {
      next();
      return;
    }
    handle(req, res, next).catch(next);
  }
  pgIdempotency.engine = engine;
  // GET handler publishing the policy (retention, key syntax, scope): mount
  // it where the docsUrl the problem documents link to says, if set.
  pgIdempotency.docs = function docs(req, res) {
    const body = Buffer.from(JSON.stringify(engine.docs()));
    res.statusCode = 200;
    res.setHeader('content-type', 'application/json; charset=utf-8');
    res.setHeader('content-length', body.length);
    res.end(body);
  };
  return pgIdempotency;
}

// webhookReceiver({ pool, consumer, secret, tolerance, limit, tenant,
// onError }, handler) → (req, res, next): verifies a Standard Webhooks
// delivery and runs handler(tx, event, req) once per webhook-id, in the
// transaction that records it (../outbox-behaviour.md); tenant, a value or
// (event, req) => value: the tenant whose shard records the id, for a
// message ledger distributed by Citus.  The signature covers the body
// as sent: mount it without a body parser before it (it reads the body
// itself), or behind express.raw().
function webhookReceiver(options, handler) {
  if (!options || typeof options.consumer !== 'string') throw new TypeError('webhookReceiver needs { consumer }');
  if (options.secret === undefined) throw new TypeError('webhookReceiver needs { secret }');
  if (!options.pool && !options.client) throw new TypeError('webhookReceiver needs { pool }');
  if (typeof handler !== 'function') throw new TypeError('webhookReceiver needs a handler (tx, event, req) => ...');
  // a bad secret fails here, not at the first webhook
  for (const k of Array.isArray(options.secret) ? options.secret : [options.secret]) secretKey(k);
  const limit = options.limit === undefined ? 1024 * 1024 : options.limit;
  const onError = options.onError || ((err) => console.error('pg-idempotency webhook receiver:', err));
  return function pgIdempotencyWebhook(req, res, next) {
    readRawBody(req, limit).then(async (body) => {
      if (body === null) {
        const err = new Error('the webhook signature covers the raw body, but a body parser read it first: '
          + 'mount webhookReceiver before express.json(), or behind express.raw({ type: \'*/*\' })');
        onError(err);
        sendRaw(res, webhookProblem(500, 'misconfigured', 'The server is misconfigured', err.message), res.end);
        return;
      }
      if (body === undefined) {
        sendRaw(res, webhookProblem(413, 'too-large', 'The webhook is too large',
          `The body is over ${limit} bytes.`), res.end);
        return;
      }
      const out = await answerWebhook({ ...options, onError, tenant: requestTenant(options.tenant, req) },
        { headers: req.headers, headersDistinct: req.headersDistinct, body },
        (tx, event) => handler(tx, event, req));
      sendRaw(res, out, res.end);
    }).catch(next);
  };
}

// the body as sent: req.body from express.raw(), or read here; null when a
// parser took it; undefined when over LIMIT bytes
function readRawBody(req, limit) {
  if (Buffer.isBuffer(req.body)) return Promise.resolve(req.body);
  if (req.body !== undefined || req.readableEnded) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let over = false;
    req.on('data', (c) => {
      size += c.length;
      if (size > limit) over = true;
      else chunks.push(c);
    });
    req.on('end', () => resolve(over ? undefined : Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function webhookProblem(status, slug, title, detail) {
  return {
    status,
    headers: { 'content-type': 'application/problem+json', 'content-language': 'en' },
    body: Buffer.from(JSON.stringify({ type: `tag:pg-idempotency,2026:${slug}`, title, status, detail })),
  };
}

exports.idempotency = idempotency;
exports.webhookReceiver = webhookReceiver;
exports.HttpIdempotency = HttpIdempotency;

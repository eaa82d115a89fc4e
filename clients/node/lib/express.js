'use strict';

// Express 5 middleware: idempotency(options) → (req, res, next).
//
//   app.post('/orders', express.json(), idempotency({ pool }), handler)
//
// Put it after the body parser (the parsed body is the request's
// fingerprint).  For a claimed key the handler finds the open transaction in
// req.idempotency.tx; what it sends is held back until the response is
// stored and the transaction committed, then sent.  See README.md.

const http = require('node:http');
const { HttpIdempotency } = require('./http');

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

function idempotency(options = {}) {
  const engine = options instanceof HttpIdempotency ? options : new HttpIdempotency(options);
  async function handle(req, res, next) {
    const r = await engine.begin({
      req,
      method: req.method,
      path: String(req.originalUrl || req.url).split('?')[0],
      keyValues: req.headersDistinct['idempotency-key'],
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
  // GET handler publishing the policy (retention, key syntax, statuses):
  // mount it at the docsUrl the problem documents link to.
  pgIdempotency.docs = function docs(req, res) {
    const body = Buffer.from(JSON.stringify(engine.docs()));
    res.statusCode = 200;
    res.setHeader('content-type', 'application/json; charset=utf-8');
    res.setHeader('content-length', body.length);
    res.end(body);
  };
  return pgIdempotency;
}

exports.idempotency = idempotency;
exports.HttpIdempotency = HttpIdempotency;

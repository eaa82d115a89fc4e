'use strict';

// The same small orders API on Express 5 and on Fastify 5, with the
// middleware in several configurations, one route each.  Test-only request
// headers: x-user (the authenticated caller; "tester" without it, none with
// x-anonymous: 1), x-test-gate (hold the handler after its INSERT until the
// test opens that gate), x-test-status: 500 (answer 500 after the INSERT),
// x-test-throw (throw after the INSERT).

const express = require('express');
const Fastify = require('fastify');
const { idempotency } = require('../lib/express');
const { fastifyIdempotency } = require('../lib/fastify');

const SCHEMA = `
CREATE TABLE IF NOT EXISTS orders (
  id bigserial PRIMARY KEY,
  route text NOT NULL,
  key text,
  item text,
  caller text
)`;

// route → middleware options
const ROUTES = {
  '/orders': {},
  '/orders-wait': { wait: 60000 },
  '/orders-wait-short': { wait: 300 },
  '/orders-wait-503': { wait: 300, timeoutStatus: 503 },
  '/orders-2p': { lease: 60000, wait: 60000, keepRequest: true },
  '/orders-2p-short': { lease: 1000, keepRequest: true },
  '/optional': { required: false },
  '/stored-5xx': { serverErrors: 'store' },
  '/released-5xx': { serverErrors: 'release' },
  '/anonymous': { anonymous: true },
  '/documented': { docsUrl: 'https://docs.example/idempotency' },
  '/selected': { fingerprintFields: ['item', 'card.last4'] },
  '/webhook': { key: (req) => req.headers['webhook-id'] },
  '/items/:id/refund': {},
  '/declined': {},
  '/export': { replayHeaders: ['x-custom', 'set-cookie'] },
  '/big': {},
  '/big-413': { tooLargeStatus: 413 },
  '/late': { ttl: '1 second', keyMemory: '30 days' },
};

// The business part, framework-free: returns { status, headers, body }
// where body is a Buffer (sent as is) or a value (sent as JSON).
async function business(path, idem, headers, body, ctx) {
  const db = idem && idem.tx ? idem.tx : ctx.pool;
  const gate = headers['x-test-gate'];
  if (path === '/declined') {
    return { status: 402, body: { error: 'card_declined', item: body && body.item } };
  }
  if (path.startsWith('/orders-2p')) await idem.checkpoint('before-insert');
  const { rows } = await db.query(
    'INSERT INTO orders (route, key, item, caller) VALUES ($1, $2, $3, $4) RETURNING id',
    [path, idem ? idem.key : null, body && body.item, ctx.callerOf(headers)]);
  const id = Number(rows[0].id);
  if (gate) {
    if (ctx.onGate) ctx.onGate(gate);
    await ctx.gates.reach(gate);
  }
  if (headers['x-test-status'] === '500') return { status: 500, body: { error: 'injected' } };
  if (headers['x-test-throw']) throw new Error('injected failure after the INSERT');
  if (path === '/export') {
    return {
      status: 201,
      headers: {
        'content-type': 'text/csv',
        location: `/exports/${id}`,
        etag: `"e${id}"`,
        'set-cookie': `session=${id}; HttpOnly`,
        'x-custom': `c${id}`,
        'x-other': 'not replayed',
      },
      body: Buffer.concat([Buffer.from([0xff, 0xfe, 0x00, 0x80]), Buffer.from(`id,item\n${id},${body.item}\n`)]),
    };
  }
  if (path === '/big' || path === '/big-413') {
    return { status: 200, body: { id, filler: 'x'.repeat(100 * 1024) } };
  }
  const recoveryPoint = idem ? idem.recoveryPoint : null;
  return { status: 201, headers: { location: `/orders/${id}` }, body: { id, item: body && body.item, recoveryPoint } };
}

function callerOf(headers) {
  if (headers['x-anonymous'] === '1') return null;
  return headers['x-user'] || 'tester';
}

async function expressApp(ctx) {
  const app = express();
  app.use((req, res, next) => {
    const u = callerOf(req.headers);
    if (u) req.user = { id: u };
    next();
  });
  const json = express.json({ limit: '16kb' });
  let docs = null;
  for (const [path, opts] of Object.entries(ROUTES)) {
    const mw = idempotency({ pool: ctx.pool, onError: ctx.onError, ...opts });
    docs = docs || mw.docs;
    app.post(path, json, mw, async (req, res) => {
      const out = await business(path, req.idempotency, req.headers, req.body, ctx);
      res.status(out.status);
      for (const [n, v] of Object.entries(out.headers || {})) res.setHeader(n, v);
      if (Buffer.isBuffer(out.body)) {
        // in pieces, as a streamed body would come
        res.write(out.body.subarray(0, 3));
        res.end(out.body.subarray(3));
      } else {
        res.json(out.body);
      }
    });
  }
  app.get('/docs/idempotency', docs);
  app.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
    res.status(err.status || 500).json({ error: err.message });
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

async function fastifyApp(ctx) {
  const app = Fastify({ bodyLimit: 16 * 1024 });
  app.addHook('onRequest', async (request) => {
    const u = callerOf(request.headers);
    if (u) request.user = { id: u };
  });
  app.register(fastifyIdempotency, { pool: ctx.pool, onError: ctx.onError, docsRoute: '/docs/idempotency' });
  for (const [path, opts] of Object.entries(ROUTES)) {
    app.post(path, { config: { idempotency: { ...opts } } }, async (request, reply) => {
      const out = await business(path, request.idempotency, request.headers, request.body, ctx);
      reply.code(out.status);
      reply.headers(out.headers || {});
      return reply.send(out.body);
    });
  }
  await app.listen({ port: 0, host: '127.0.0.1' });
  return {
    url: `http://127.0.0.1:${app.server.address().port}`,
    close: () => app.close(),
  };
}

function buildApp(framework, ctx) {
  const c = { callerOf, ...ctx };
  return framework === 'express' ? expressApp(c) : fastifyApp(c);
}

module.exports = { buildApp, SCHEMA, ROUTES, callerOf };

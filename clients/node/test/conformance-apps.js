'use strict';

// The conformance app of clients/conformance/README.md on each Node.js
// adapter: Express 5 and Fastify 5, each with its default options, the
// authentication run before the idempotency middleware (Authorization:
// Bearer NAME makes NAME the caller, as req.user / request.user).

const express = require('express');
const Fastify = require('fastify');
const { Pool } = require('pg');
const { idempotency } = require('../lib/express');
const { fastifyIdempotency } = require('../lib/fastify');

const TABLE = `CREATE TABLE IF NOT EXISTS conformance_charges (
  id bigserial PRIMARY KEY, caller text, route text, amount int, currency text)`;

function bearer(authorization) {
  const m = /^Bearer (\S+)$/.exec(authorization || '');
  return m ? m[1] : null;
}

// The business part, framework-free: { status, headers, body } with body a
// value (sent as JSON) or a string (sent as it is).
async function business(route, { tx, caller, body, params, headers }) {
  const insert = async (amount, currency, name = route) => Number((await tx.query(
    'INSERT INTO conformance_charges (caller, route, amount, currency) VALUES ($1, $2, $3, $4) RETURNING id',
    [caller, name, amount, currency])).rows[0].id);
  const b = body || {};
  switch (route) {
    case '/charges': {
      if (!Number.isSafeInteger(b.amount) || b.amount < 0) {
        return { status: 400, body: { error: 'amount must be a non-negative integer' } };
      }
      const currency = b.currency === undefined ? null : b.currency;
      const id = await insert(b.amount, currency);
      if (headers['test-fail'] === '1') throw new Error('Test-Fail: after the INSERT');
      return {
        status: 201, headers: { location: `/charges/${id}` }, body: { id, caller, amount: b.amount, currency },
      };
    }
    case 'refund': {
      const id = await insert(b.amount, null);
      return { status: 201, body: { order: String(params.id), refund: id } };
    }
    case '/text': {
      const id = await insert(0, null);
      return {
        status: 201,
        headers: {
          'content-type': 'text/plain; charset=utf-8',
          location: `/charges/${id}`,
          'x-not-replayed': 'yes',
          'set-cookie': `session=${id}`,
        },
        body: `charge ${id}\n`,
      };
    }
    case '/big': {
      const id = await insert(0, null);
      return { status: 200, body: { id, padding: 'x'.repeat(b.size) } };
    }
    default:
      throw new Error(`no route ${route}`);
  }
}

const ROUTES = [['/charges', '/charges'], ['/orders/:id/refund', 'refund'], ['/text', '/text'], ['/big', '/big']];

function conformancePool() {
  return new Pool({ max: 24, application_name: 'idem-conformance' });
}

async function expressApp() {
  const pool = conformancePool();
  const app = express();
  app.use((req, res, next) => {
    const name = bearer(req.get('authorization'));
    if (name) req.user = { id: name };
    next();
  });
  const mw = idempotency({ pool });
  for (const [path, route] of ROUTES) {
    app.post(path, express.json(), mw, async (req, res) => {
      const out = await business(route, {
        tx: req.idempotency.tx, caller: req.user ? req.user.id : null, body: req.body, params: req.params,
        headers: req.headers,
      });
      res.status(out.status);
      for (const [n, v] of Object.entries(out.headers || {})) res.setHeader(n, v);
      if (typeof out.body === 'string') res.send(out.body);
      else res.json(out.body);
    });
  }
  app.get('/idempotency', mw.docs);
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(() => resolve()));
      await pool.end();
    },
  };
}

async function fastifyApp() {
  const pool = conformancePool();
  const app = Fastify();
  app.addHook('onRequest', async (request) => {
    const name = bearer(request.headers.authorization);
    if (name) request.user = { id: name };
  });
  app.register(fastifyIdempotency, { pool, docsRoute: '/idempotency' });
  for (const [path, route] of ROUTES) {
    app.post(path, { config: { idempotency: true } }, async (request, reply) => {
      const out = await business(route, {
        tx: request.idempotency.tx, caller: request.user ? request.user.id : null, body: request.body,
        params: request.params, headers: request.headers,
      });
      reply.code(out.status);
      reply.headers(out.headers || {});
      return reply.send(out.body);
    });
  }
  await app.listen({ port: 0, host: '127.0.0.1' });
  return {
    url: `http://127.0.0.1:${app.server.address().port}`,
    close: async () => {
      await app.close();
      await pool.end();
    },
  };
}

const ADAPTERS = { express: expressApp, fastify: fastifyApp };

module.exports = { ADAPTERS, TABLE };

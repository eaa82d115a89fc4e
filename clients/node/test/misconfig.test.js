'use strict';

// Set-ups in which the middleware cannot keep its contract, as apps write
// them by mistake: each either works or is refused loudly, never answered
// with another caller's response or a replay of another body.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const express = require('express');
const Fastify = require('fastify');
const { appPool, uid, request } = require('./helpers');
const { idempotency } = require('../lib/express');
const { fastifyIdempotency } = require('../lib/fastify');
const { ConfigurationError } = require('../lib');

const TAG = 'tag:pg-idempotency,2026:';
const TABLE = 'CREATE TABLE IF NOT EXISTS misconfig (id bigserial PRIMARY KEY, k text, caller text, amount int)';

function auth(req, res, next) {
  const u = req.get('x-user');
  if (u) req.user = { id: u };
  next();
}

async function listen(app) {
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

describe('misconfigurations', () => {
  let pool;
  const errors = [];
  const onError = (err) => errors.push(err);
  const rows = async (k) => Number((await pool.query('SELECT count(*) AS n FROM misconfig WHERE k = $1', [k])).rows[0].n);
  const pay = async (req, res) => {
    const { rows: [r] } = await req.idempotency.tx.query(
      'INSERT INTO misconfig (k, caller, amount) VALUES ($1, $2, $3) RETURNING id',
      [req.idempotency.key, req.user ? req.user.id : null, req.body && req.body.amount]);
    res.status(201).json({ id: r.id, caller: req.user ? req.user.id : null, amount: req.body && req.body.amount });
  };
  const post = (url, key, body, headers = {}) => request(url, {
    headers: { 'idempotency-key': `"${key}"`, ...headers }, body,
  });

  before(async () => {
    pool = appPool(6);
    await pool.query(TABLE);
  });
  after(() => pool.end());

  it('Express, the middleware before the authentication: refused, never another caller\'s response', async () => {
    const app = express();
    app.use(express.json());
    app.use(idempotency({ pool, onError })); // before auth: no req.user yet
    app.use(auth);
    app.post('/pay', pay);
    const srv = await listen(app);
    try {
      const key = uid();
      const errorsBefore = errors.length;
      const alice = await post(`${srv.url}/pay`, key, { amount: 5 }, { 'x-user': 'alice' });
      const bob = await post(`${srv.url}/pay`, key, { amount: 5 }, { 'x-user': 'bob' });
      assert.notEqual(bob.headers['idempotent-replayed'], 'true', 'bob is not served a stored response');
      assert.ok(!bob.text.includes('alice'), `bob never sees alice's answer: ${bob.text}`);
      for (const r of [alice, bob]) {
        assert.equal(r.status, 500);
        assert.equal(r.json().type, `${TAG}no-caller`);
      }
      assert.equal(await rows(key), 0);
      assert.equal(errors.length, errorsBefore + 2);
      assert.ok(errors.slice(errorsBefore).every((e) => e instanceof ConfigurationError));
    } finally {
      await srv.close();
    }
  });

  it('Express, the middleware before the body parser: refused, never a replay of another body', async () => {
    const app = express();
    app.use(auth);
    app.post('/route-level', idempotency({ pool, onError }), express.json(), pay);
    app.use('/app-level', idempotency({ pool, onError }));
    app.use(express.json());
    app.post('/app-level', pay);
    app.post('/parsed', express.json(), idempotency({ pool, onError }), pay);
    const srv = await listen(app);
    try {
      for (const path of ['/route-level', '/app-level']) {
        const key = uid();
        const first = await post(`${srv.url}${path}`, key, { amount: 5 }, { 'x-user': 'alice' });
        const other = await post(`${srv.url}${path}`, key, { amount: 500 }, { 'x-user': 'alice' });
        assert.notEqual(other.headers['idempotent-replayed'], 'true', `${path}: another body is not a replay`);
        for (const r of [first, other]) {
          assert.equal(r.status, 500, path);
          assert.equal(r.json().type, `${TAG}misconfigured`, path);
        }
        assert.equal(await rows(key), 0, path);
        assert.match(errors[errors.length - 1].message, /not parsed before idempotency\(\)/);
      }
      // in order, a body no parser takes is 415, not fingerprinted without it
      const key = uid();
      const text = await request(`${srv.url}/parsed`, {
        headers: { 'idempotency-key': `"${key}"`, 'x-user': 'alice', 'content-type': 'text/plain' }, body: 'amount=5',
      });
      assert.equal(text.status, 415);
      assert.equal(text.json().type, `${TAG}unsupported-media-type`);
      // and a JSON body is fingerprinted: another body with the key is 422
      assert.equal((await post(`${srv.url}/parsed`, key, { amount: 5 }, { 'x-user': 'alice' })).status, 201);
      assert.equal((await post(`${srv.url}/parsed`, key, { amount: 6 }, { 'x-user': 'alice' })).status, 422);
    } finally {
      await srv.close();
    }
  });

  it('Express, mounted with app.use: the route template is found, so a key is not valid on another path', async () => {
    const app = express();
    app.use(auth);
    app.use(express.json());
    app.use(idempotency({ pool, onError }));
    const router = express.Router();
    router.post('/orders/:id/refund', pay);
    app.use('/api', router);
    const srv = await listen(app);
    try {
      const key = uid();
      assert.equal((await post(`${srv.url}/api/orders/1/refund`, key, { amount: 1 }, { 'x-user': 'a' })).status, 201);
      const other = await post(`${srv.url}/api/orders/2/refund`, key, { amount: 1 }, { 'x-user': 'a' });
      assert.equal(other.status, 422);
      const { rows: [r] } = await pool.query(
        'SELECT count(*)::int AS n FROM idem_lookup($1, $2)', [key, JSON.stringify(['a', 'POST', '/api/orders/:id/refund'])]);
      assert.equal(r.n, 1, 'scoped by /api/orders/:id/refund');
    } finally {
      await srv.close();
    }
  });

  it('Fastify, the authentication in a route preHandler (after the plugin\'s): refused', async () => {
    const app = Fastify();
    app.register(fastifyIdempotency, { pool, onError });
    const authenticate = async (request) => {
      const u = request.headers['x-user'];
      if (u) request.user = { id: u };
    };
    app.post('/pay', { config: { idempotency: true }, preHandler: authenticate }, async (request, reply) => {
      const { rows: [r] } = await request.idempotency.tx.query(
        'INSERT INTO misconfig (k, caller, amount) VALUES ($1, $2, $3) RETURNING id',
        [request.idempotency.key, request.user.id, request.body.amount]);
      return reply.code(201).send({ id: r.id, caller: request.user.id });
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const url = `http://127.0.0.1:${app.server.address().port}/pay`;
      const key = uid();
      const alice = await post(url, key, { amount: 5 }, { 'x-user': 'alice' });
      const bob = await post(url, key, { amount: 5 }, { 'x-user': 'bob' });
      assert.ok(!bob.text.includes('alice'), `bob never sees alice's answer: ${bob.text}`);
      for (const r of [alice, bob]) {
        assert.equal(r.status, 500);
        assert.equal(r.json().type, `${TAG}no-caller`);
      }
      assert.equal(await rows(key), 0);
    } finally {
      await app.close();
    }
  });
});

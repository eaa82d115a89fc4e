'use strict';

// A consumed message's tenant (for a message ledger distributed by Citus,
// extension 0.5.0): every entry point that consumes message ids takes the
// option tenant, and passes it through idem_consume_message(s)' four-argument
// form only when it is given; without it, the three-argument call of 0.4.0 is
// made, as before.  The server here does not distribute its ledger, so the
// four-argument form ignores the tenant and the answers cannot tell the forms
// apart: ../../conformance/tenant-spy.sql puts a logging stand-in of each
// form before pg_catalog in search_path, and the tests read which form each
// call resolved to and what it received.  The same calls also run against the
// extension's own functions (no spy).

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const express = require('express');
const Fastify = require('fastify');
const { Pool } = require('pg');
const { uid, request, adminPool, appPool, schemaPool, listen } = require('./helpers');
const idem = require('../lib');
const { webhookReceiver } = require('../lib/express');
const { webhookReceiver: fastifyWebhookReceiver } = require('../lib/fastify');

const SPY_SQL = fs.readFileSync(path.join(__dirname, '..', '..', 'conformance', 'tenant-spy.sql'), 'utf8');
const SECRET = idem.generateSecret();

function spyPool(max = 4) {
  return schemaPool('tenant_spy', max);
}


function delivery(id, body = { n: 1 }) {
  const raw = Buffer.from(JSON.stringify(body));
  return { headers: idem.webhookHeaders(SECRET, id, Math.floor(Date.now() / 1000), raw), body: raw };
}

describe('a consumed message\'s tenant', () => {
  let admin;
  let pool;     // calls resolve to the spies
  let plain;    // calls resolve to the extension's functions

  // [fn, nargs, ids, tenant] of each call the spies saw for consumer (and for
  // one of ids, when given), in order
  const calls = async (consumer, ids = null) => (await admin.query(
    `SELECT fn, nargs, message_ids, tenant FROM tenant_spy.calls
      WHERE consumer = $1 AND ($2::text[] IS NULL OR message_ids && $2::text[]) ORDER BY n`,
    [consumer, ids])).rows.map((r) => [r.fn, r.nargs, r.message_ids, r.tenant]);

  before(async () => {
    admin = adminPool();
    await admin.query(SPY_SQL);
    pool = spyPool();
    plain = appPool(2);
    await plain.query('CREATE TABLE IF NOT EXISTS tenant_received (consumer text, event_id text)');
  });
  after(async () => {
    await pool.end();
    await plain.end();
    await admin.end();
  });

  it('consumeMessage and consumeMessages: four arguments with a tenant, three without', async () => {
    const consumer = uid('c');
    await idem.transaction(pool, async (tx) => {
      assert.equal(await idem.consumeMessage(tx, consumer, 'm1', { tenant: 'acct-1' }), true);
      // one ledger on a server that does not distribute it: the tenant is
      // not part of the id's identity
      assert.equal(await idem.consumeMessage(tx, consumer, 'm1'), false);
      assert.deepEqual(await idem.consumeMessages(tx, consumer, ['m1', 'm2'], { ttl: '1 day', tenant: 42 }), ['m2']);
      assert.deepEqual(await idem.consumeMessages(tx, consumer, ['m3']), ['m3']);
      assert.equal(await idem.consumeMessage(tx, consumer, 'm4', { tenant: null }), true);
      assert.equal(await idem.consumeMessage(tx, consumer, 'm5', { tenant: 9007199254740993n }), true);
    });
    assert.deepEqual(await calls(consumer), [
      ['idem_consume_message', 4, ['m1'], 'acct-1'],
      ['idem_consume_message', 3, ['m1'], null],
      ['idem_consume_messages', 4, ['m1', 'm2'], '42'],
      ['idem_consume_messages', 3, ['m3'], null],
      ['idem_consume_message', 3, ['m4'], null],
      ['idem_consume_message', 4, ['m5'], '9007199254740993'],
    ]);
  });

  it('consume: the batch\'s tenant', async () => {
    const consumer = uid('c');
    const first = await idem.consume({ pool, consumer, tenant: 'acct-2' }, ['a', 'b'], async (tx, fresh) => fresh);
    const second = await idem.consume({ pool, consumer }, ['b', 'c'], async (tx, fresh) => fresh);
    assert.deepEqual(first.fresh, ['a', 'b']);
    assert.deepEqual(second.fresh, ['c']);
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      await idem.consume({ client, consumer, tenant: 'acct-3' }, ['d'], async () => undefined);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    assert.deepEqual(await calls(consumer), [
      ['idem_consume_messages', 4, ['a', 'b'], 'acct-2'],
      ['idem_consume_messages', 3, ['b', 'c'], null],
      ['idem_consume_messages', 4, ['d'], 'acct-3'],
    ]);
  });

  it('a tenant that is not text or an integer sends nothing', async () => {
    const consumer = uid('c');
    for (const bad of [true, 1.5, {}, ['acct'], Number.MAX_SAFE_INTEGER + 2]) {
      await assert.rejects(idem.consumeMessage(pool, consumer, 'm1', { tenant: bad }), TypeError);
      await assert.rejects(idem.consumeMessages(pool, consumer, ['m1'], { tenant: bad }), TypeError);
      await assert.rejects(idem.consume({ pool, consumer, tenant: bad }, ['m1'], async () => undefined), TypeError);
    }
    assert.deepEqual(await calls(consumer), []);
  });

  it('the extension\'s own four-argument form (no spy)', async () => {
    const consumer = uid('c');
    await idem.transaction(plain, async (tx) => {
      assert.equal(await idem.consumeMessage(tx, consumer, 'm1', { tenant: 'acct-1' }), true);
      assert.equal(await idem.consumeMessage(tx, consumer, 'm1', { tenant: 'acct-2' }), false);
      assert.deepEqual(await idem.consumeMessages(tx, consumer, ['m1', 'm2'], { tenant: 'acct-1' }), ['m2']);
      assert.equal(await idem.consumeMessage(tx, consumer, 'm2'), false);
    });
    const client = await plain.connect();
    try {
      await client.query('BEGIN');
      assert.deepEqual(await idem.consumeMessages(client, consumer, ['m2', 'm3'], { ttl: 3600000, tenant: 5 }), ['m3']);
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    assert.equal(await idem.consumeMessage(plain, consumer, 'm3'), true);
    assert.deepEqual(await calls(consumer), []);
  });

  it('receiveWebhook: a tenant, a function of the event, none', async () => {
    const consumer = uid('c');
    const ids = [uid('msg'), uid('msg'), uid('msg'), uid('msg')];
    const seen = [];
    const handler = async (tx, event) => { seen.push(event.id); };
    const r = await idem.receiveWebhook({ pool, consumer, secret: SECRET, tenant: 'acct-4' }, delivery(ids[0]), handler);
    assert.equal(r.duplicate, false);
    const again = await idem.receiveWebhook({ pool, consumer, secret: SECRET, tenant: 'acct-4' }, delivery(ids[0]), handler);
    assert.equal(again.duplicate, true);
    await idem.receiveWebhook({ pool, consumer, secret: SECRET, tenant: async (event) => event.json().tenant },
      delivery(ids[1], { tenant: 'acct-5' }), handler);
    await idem.receiveWebhook({ pool, consumer, secret: SECRET, tenant: () => undefined }, delivery(ids[2]), handler);
    await idem.receiveWebhook({ pool, consumer, secret: SECRET }, delivery(ids[3]), handler);
    assert.deepEqual(seen, ids);
    assert.deepEqual(await calls(consumer), [
      ['idem_consume_message', 4, [ids[0]], 'acct-4'],
      ['idem_consume_message', 4, [ids[0]], 'acct-4'],
      ['idem_consume_message', 4, [ids[1]], 'acct-5'],
      ['idem_consume_message', 3, [ids[2]], null],
      ['idem_consume_message', 3, [ids[3]], null],
    ]);
  });

  describe('the framework receivers: the tenant function gets the event and the request', () => {
    let app;
    let fastify;
    let fastifyUrl;
    const insert = (consumer) => async (tx, event) => {
      await tx.query('INSERT INTO tenant_received VALUES ($1, $2)', [consumer, event.id]);
    };

    before(async () => {
      const e = express();
      e.post('/hooks/:tenant', webhookReceiver({
        pool, consumer: 'express-tenant', secret: SECRET, onError: () => {},
        tenant: (event, req) => req.params.tenant,
      }, insert('express-tenant')));
      e.post('/hooks', webhookReceiver({ pool, consumer: 'express-none', secret: SECRET, onError: () => {} },
        insert('express-none')));
      app = await listen(e);
      fastify = Fastify();
      fastify.register(fastifyWebhookReceiver, {
        url: '/hooks/:tenant', pool, consumer: 'fastify-tenant', secret: SECRET, onError: () => {},
        tenant: (event, req) => req.params.tenant,
        handler: insert('fastify-tenant'),
      });
      fastify.register(fastifyWebhookReceiver, {
        url: '/hooks', pool, consumer: 'fastify-none', secret: SECRET, onError: () => {},
        handler: insert('fastify-none'),
      });
      fastifyUrl = await fastify.listen({ port: 0, host: '127.0.0.1' });
    });
    after(async () => {
      await app.close();
      await fastify.close();
    });

    for (const fw of ['express', 'fastify']) {
      it(fw, async () => {
        const base = fw === 'express' ? app.url : fastifyUrl;
        const tenant = uid('acct');
        const m1 = uid('msg');
        const m2 = uid('msg');
        const d1 = delivery(m1);
        const post = (url, d) => request(url, { headers: { ...d.headers, 'content-type': 'application/json' }, body: d.body });
        let a = await post(`${base}/hooks/${tenant}`, d1);
        assert.equal(a.status, 200, a.text);
        assert.deepEqual(a.json(), { id: m1, status: 'applied' });
        a = await post(`${base}/hooks/${tenant}`, d1);
        assert.deepEqual(a.json(), { id: m1, status: 'duplicate' });
        assert.deepEqual(await calls(`${fw}-tenant`, [m1]), [
          ['idem_consume_message', 4, [m1], tenant],
          ['idem_consume_message', 4, [m1], tenant],
        ]);
        a = await post(`${base}/hooks`, delivery(m2));
        assert.deepEqual(a.json(), { id: m2, status: 'applied' });
        assert.deepEqual(await calls(`${fw}-none`, [m2]), [['idem_consume_message', 3, [m2], null]]);
      });
    }
  });
});

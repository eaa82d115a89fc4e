'use strict';

// A tenant (for a message ledger, stream positions and producer sequences
// distributed by Citus, extension 0.5.0): every entry point that consumes
// message ids takes the option tenant, and passes it through
// idem_consume_message(s)' four-argument form only when it is given; without
// it, the three-argument call of 0.4.0 is made, as before.  Likewise the
// ordered-stream calls (assign, advance, positions, sequence, the
// StreamConsumer): with a tenant, the tenant overloads of idem_assign,
// idem_advance, idem_positions and idem_sequence; without, the very
// statements of 0.4.0.  And the outbox: publish(..., { tenant }) calls
// idem_publish's tenant overload, and an OutboxRelay with { tenants: true }
// the tenant overloads of idem_outbox_next, _ack and _dead_letter with
// tenant NULL; without them, 0.4.0's statements.  The server here does not distribute anything, so the
// forms with a tenant ignore it and the answers cannot tell the forms apart:
// ../../conformance/tenant-spy.sql puts a logging stand-in of each form
// before pg_catalog in search_path, and the tests read which form each call
// resolved to and what it received.  The same calls also run against the
// extension's own functions (no spy).

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const crypto = require('node:crypto');
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

describe('the stream calls\' tenant', () => {
  let admin;
  let pool;     // calls resolve to the spies
  let plain;    // calls resolve to the extension's functions

  // [fn, nargs, stream or producer, other arguments as text, tenant] of each
  // call the spies saw for consumer, in order
  const calls = async (consumer) => (await admin.query(
    `SELECT fn, nargs, stream, args, tenant FROM tenant_spy.calls
      WHERE consumer = $1 ORDER BY n`, [consumer])).rows.map((r) => [r.fn, r.nargs, r.stream, r.args, r.tenant]);
  const parts = (ps) => ps.map((p) => [p.part, p.nextOffset, p.generation]);
  // a Queryable that records what would be sent
  const recorder = () => {
    const sent = [];
    return {
      sent,
      query: async (text, values) => {
        sent.push([text, values]);
        return { rows: [{ answer: 'new' }] };
      },
    };
  };

  before(async () => {
    admin = adminPool();
    await admin.query(SPY_SQL);
    pool = spyPool();
    plain = appPool(2);
  });
  after(async () => {
    await pool.end();
    await plain.end();
    await admin.end();
  });

  it('without a tenant (or a null one), the statements of 0.4.0; with one, the tenant last', async () => {
    const ASSIGN = 'SELECT part, next_offset::text AS next_offset FROM idem_assign($1, $2, $3::integer[], $4::bigint';
    const ADVANCE = 'SELECT first_offset::text AS first, last_offset::text AS last' +
      '  FROM idem_advance($1, $2, $3::integer, $4::bigint, $5::bigint, $6::bigint';
    const POSITIONS = 'SELECT part, next_offset::text AS next_offset, generation::text AS generation, updated_at' +
      '  FROM idem_positions($1, $2';
    const SEQUENCE = 'SELECT idem_sequence($1, $2, $3::bigint, $4::bigint, $5::boolean';
    for (const opts of [undefined, {}, { tenant: null }, { tenant: undefined }]) {
      const db = recorder();
      await idem.assign(db, 'c', 's', [1, 0], 7, opts);
      await idem.advance(db, 'c', 's', 0, 10, 19, opts);
      await idem.advance(db, 'c', 's', 0, 10, 19, { ...opts, generation: 7n });
      await idem.positions(db, 'c', 's', opts);
      await idem.sequence(db, 'c', 'p', 1, '2', opts);
      assert.deepEqual(db.sent, [
        [`${ASSIGN})`, ['c', 's', [1, 0], '7']],
        [`${ADVANCE})`, ['c', 's', 0, '10', '19', null]],
        [`${ADVANCE})`, ['c', 's', 0, '10', '19', '7']],
        [`${POSITIONS}) ORDER BY part`, ['c', 's']],
        [`${SEQUENCE}) AS answer`, ['c', 'p', '1', '2', false]],
      ]);
    }
    const db = recorder();
    await idem.assign(db, 'c', 's', [0], 7, { tenant: 't' });
    await idem.advance(db, 'c', 's', 0, 10, 19, { tenant: 42 });
    await idem.positions(db, 'c', 's', { tenant: 9007199254740993n });
    await idem.sequence(db, 'c', 'p', 1, 2, { strict: true, tenant: 't' });
    assert.deepEqual(db.sent, [
      [`${ASSIGN}, $5::text)`, ['c', 's', [0], '7', 't']],
      [`${ADVANCE}, $7::text)`, ['c', 's', 0, '10', '19', null, '42']],
      [`${POSITIONS}, $3::text) ORDER BY part`, ['c', 's', '9007199254740993']],
      [`${SEQUENCE}, $6::text) AS answer`, ['c', 'p', '1', '2', true, 't']],
    ]);
  });

  it('assign, advance, positions, sequence: the tenant forms with a tenant, 0.4.0\'s without', async () => {
    const consumer = uid('c');
    const stream = uid('s');
    await idem.transaction(pool, async (tx) => {
      assert.deepEqual(await idem.assign(tx, consumer, stream, [1, 0], 3, { tenant: 'acct-1' }),
        [{ part: 0, nextOffset: null }, { part: 1, nextOffset: null }]);
      assert.deepEqual(await idem.advance(tx, consumer, stream, 0, 10, 19, { generation: 3, tenant: 'acct-1' }),
        { first: '10', last: '19' });
      // unfenced, on a partition never assigned: the generation goes, null
      assert.deepEqual(await idem.advance(tx, consumer, stream, 2, 0, 4, { tenant: 42 }), { first: '0', last: '4' });
      // without it: the node's own positions, the same ones here
      assert.deepEqual(await idem.advance(tx, consumer, stream, 0, 15, 24, { generation: 3 }), { first: '20', last: '24' });
      const want = [[0, '25', '3'], [1, null, '3'], [2, '5', null]];
      assert.deepEqual(parts(await idem.positions(tx, consumer, stream, { tenant: 'acct-1' })), want);
      assert.deepEqual(parts(await idem.positions(tx, consumer, stream, { tenant: null })), want);
      assert.equal(await idem.sequence(tx, consumer, 'p1', 1, 1, { tenant: 'acct-1' }), 'new');
      assert.equal(await idem.sequence(tx, consumer, 'p1', 1, 1), 'duplicate');
      assert.equal(await idem.sequence(tx, consumer, 'p1', 1, 3, { tenant: 9007199254740993n }), 'gap');
      assert.equal(await idem.sequence(tx, consumer, 'p1', 1, 4, { strict: true, tenant: 'acct-1' }), 'new');
    });
    assert.deepEqual(await calls(consumer), [
      ['idem_assign', 5, stream, ['{1,0}', '3'], 'acct-1'],
      ['idem_advance', 7, stream, ['0', '10', '19', '3'], 'acct-1'],
      ['idem_advance', 7, stream, ['2', '0', '4', null], '42'],
      ['idem_advance', 6, stream, ['0', '15', '24', '3'], null],
      ['idem_positions', 3, stream, [], 'acct-1'],
      ['idem_positions', 2, stream, [], null],
      ['idem_sequence', 6, 'p1', ['1', '1', 'false'], 'acct-1'],
      ['idem_sequence', 5, 'p1', ['1', '1', 'false'], null],
      ['idem_sequence', 6, 'p1', ['1', '3', 'false'], '9007199254740993'],
      ['idem_sequence', 6, 'p1', ['1', '4', 'true'], 'acct-1'],
    ]);
  });

  it('a StreamConsumer passes its tenant to every call', async () => {
    const consumer = uid('c');
    const stream = uid('s');
    const seen = [];
    const fn = async (tx, fresh) => { seen.push(fresh); };
    const sc = idem.streamConsumer({ pool, consumer, stream, tenant: 'acct-9' });
    assert.equal(sc.tenant, 'acct-9');
    assert.deepEqual(await sc.assign([0], 1), [{ part: 0, nextOffset: null }]);
    assert.deepEqual((await sc.process(0, [5, 6, 7], fn)).fresh, [5, 6, 7]);
    assert.deepEqual((await sc.process(0, [6, 7, 8], fn)).fresh, [8]);
    assert.deepEqual(parts(await sc.positions()), [[0, '9', '1']]);
    // { client }: in the caller's transaction, the same tenant
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      const inTx = new idem.StreamConsumer({ client, consumer, stream, generation: 1, tenant: 12 });
      assert.deepEqual((await inTx.process(0, [9], fn)).fresh, [9]);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const none = idem.streamConsumer({ pool, consumer, stream, generation: 1 });
    assert.equal(none.tenant, null);
    assert.deepEqual((await none.process(0, [10], fn)).fresh, [10]);
    assert.deepEqual(parts(await none.positions()), [[0, '11', '1']]);
    assert.deepEqual(seen, [[5, 6, 7], [8], [9], [10]]);
    assert.deepEqual(await calls(consumer), [
      ['idem_assign', 5, stream, ['{0}', '1'], 'acct-9'],
      ['idem_advance', 7, stream, ['0', '5', '7', '1'], 'acct-9'],
      ['idem_advance', 7, stream, ['0', '6', '8', '1'], 'acct-9'],
      ['idem_positions', 3, stream, [], 'acct-9'],
      ['idem_advance', 7, stream, ['0', '9', '9', '1'], '12'],
      ['idem_advance', 6, stream, ['0', '10', '10', '1'], null],
      ['idem_positions', 2, stream, [], null],
    ]);
  });

  it('a tenant that is not text or an integer sends nothing', async () => {
    const consumer = uid('c');
    const stream = uid('s');
    for (const bad of [true, 1.5, {}, ['acct'], Number.MAX_SAFE_INTEGER + 2, () => 'acct']) {
      await assert.rejects(idem.assign(pool, consumer, stream, [0], 1, { tenant: bad }), TypeError);
      await assert.rejects(idem.advance(pool, consumer, stream, 0, 1, 2, { tenant: bad }), TypeError);
      await assert.rejects(idem.positions(pool, consumer, stream, { tenant: bad }), TypeError);
      await assert.rejects(idem.sequence(pool, consumer, 'p', 1, 1, { tenant: bad }), TypeError);
      assert.throws(() => idem.streamConsumer({ pool, consumer, stream, tenant: bad }), TypeError);
      const db = recorder();
      await assert.rejects(idem.advance(db, consumer, stream, 0, 1, 2, { generation: 1, tenant: bad }), TypeError);
      assert.deepEqual(db.sent, []);
    }
    assert.deepEqual(await calls(consumer), []);
  });

  it('the extension\'s own tenant forms (no spy): a position advanced with a tenant is read back with it', async () => {
    const consumer = uid('c');
    const stream = uid('s');
    await idem.transaction(plain, async (tx) => {
      assert.deepEqual(await idem.assign(tx, consumer, stream, [0, 1], 2, { tenant: 'acct-1' }),
        [{ part: 0, nextOffset: null }, { part: 1, nextOffset: null }]);
      assert.deepEqual(await idem.advance(tx, consumer, stream, 0, 0, 9, { generation: 2, tenant: 'acct-1' }),
        { first: '0', last: '9' });
    });
    // without Citus the tenant is not used: the node's own positions
    assert.deepEqual(parts(await idem.positions(plain, consumer, stream, { tenant: 'acct-1' })),
      [[0, '10', '2'], [1, null, '2']]);
    assert.deepEqual(parts(await idem.positions(plain, consumer, stream)), [[0, '10', '2'], [1, null, '2']]);
    // fenced as without a tenant
    await assert.rejects(idem.advance(plain, consumer, stream, 0, 10, 11, { generation: 1, tenant: 'acct-1' }),
      idem.StaleGenerationError);
    await assert.rejects(idem.advance(plain, consumer, stream, 0, 10, 11, { tenant: 'acct-1' }),
      idem.StaleGenerationError);
    assert.equal(await idem.sequence(plain, consumer, 'p', 1, 1, { tenant: 'acct-1' }), 'new');
    assert.equal(await idem.sequence(plain, consumer, 'p', 1, 1, { tenant: 'acct-1' }), 'duplicate');
    assert.equal(await idem.sequence(plain, consumer, 'p', 1, 1), 'duplicate');
    await assert.rejects(idem.sequence(plain, consumer, 'p', 1, 5, { strict: true, tenant: 'acct-1' }),
      idem.SequenceGapError);
    const sc = idem.streamConsumer({ pool: plain, consumer, stream, tenant: 'acct-1' });
    assert.deepEqual(await sc.assign([0], 3), [{ part: 0, nextOffset: '10' }]);
    assert.deepEqual((await sc.process(0, [8, 9, 10, 11, 12], async () => undefined)).fresh, [10, 11, 12]);
    assert.deepEqual(parts(await sc.positions()), [[0, '13', '3'], [1, null, '2']]);
    assert.deepEqual(await calls(consumer), []);
  });
});

describe('the tenant outbox', () => {
  let admin;
  let pool;     // calls resolve to the spies
  let plain;    // calls resolve to the extension's functions

  // [fn, nargs, relay, other arguments as text, tenant] of each outbox call
  // the spies saw for topic, in order
  const calls = async (topic) => (await admin.query(
    `SELECT fn, nargs, consumer, args, tenant FROM tenant_spy.calls
      WHERE stream = $1 AND (fn LIKE 'idem_outbox%' OR fn = 'idem_publish') ORDER BY n`, [topic]))
    .rows.map((r) => [r.fn, r.nargs, r.consumer, r.args, r.tenant]);
  // a Queryable that records what it sends, and sends it to the extension
  const recorder = () => {
    const sent = [];
    return {
      sent,
      query: async (text, values) => {
        sent.push([text, values]);
        return plain.query(text, values);
      },
    };
  };

  before(async () => {
    admin = adminPool();
    await admin.query(SPY_SQL);
    pool = spyPool();
    plain = appPool(2);
  });
  after(async () => {
    await pool.end();
    await plain.end();
    await admin.end();
  });

  it('without a tenant or tenants, the statements of 0.4.0; with one, the tenant last (null: every tenant)', async () => {
    const PUBLISH = 'SELECT idem_publish($1, $2::jsonb, $3, $4::jsonb, $5::bytea';
    const NEXT = 'SELECT batch::text AS batch, event_id::text AS event_id, key, payload::text AS payload_text,' +
      '       payload_raw, headers, published_at';
    const ACK = 'SELECT idem_outbox_ack($1, $2, $3::bigint, $4::bigint';
    const DEAD = 'SELECT idem_outbox_dead_letter($1, $2, $3::uuid, $4, $5::int';
    const topic = uid('t');
    const db = recorder();
    const e1 = await idem.publish(db, topic, { payload: { n: 1 }, key: 'k' });
    const e2 = await idem.publish(db, topic, { payload: { n: 2 }, tenant: null });
    const e3 = await idem.publish(db, topic, { raw: Buffer.from([1]), tenant: 'acct-1' });
    const e4 = await idem.publish(db, topic, { payload: { n: 4 }, tenant: 42 });
    assert.deepEqual(db.sent, [
      [`${PUBLISH})::text AS event_id`, [topic, '{"n":1}', 'k', null, null]],
      [`${PUBLISH})::text AS event_id`, [topic, '{"n":2}', null, null, null]],
      [`${PUBLISH}, $6::text)::text AS event_id`, [topic, null, null, null, Buffer.from([1]), 'acct-1']],
      [`${PUBLISH}, $6::text)::text AS event_id`, [topic, '{"n":4}', null, null, null, '42']],
    ]);
    db.sent.length = 0;
    const b = await idem.outboxNext(db, 'rel', topic, { maxEvents: 10 });
    assert.deepEqual(b.events.map((e) => e.eventId), [e1, e2, e3, e4]);
    // the node's own outbox: no tenant, no number (and no such fields
    // without the option)
    assert.ok(b.events.every((e) => !('tenant' in e) && !('seq' in e)));
    assert.deepEqual(await idem.outboxNext(db, 'rel', topic, { maxEvents: 10, tenants: false }), b);
    const all = await idem.outboxNext(db, 'rel', topic, { maxEvents: 10, tenants: true });
    assert.deepEqual(all.events.map((e) => [e.eventId, e.tenant, e.seq]), [e1, e2, e3, e4].map((e) => [e, null, null]));
    assert.equal(all.batch, b.batch);
    const one = await idem.outboxNext(db, 'rel', topic, { maxEvents: 10, generation: 5, tenant: 'acct-1' });
    assert.equal(one.events.length, 4);
    await idem.outboxDeadLetter(db, 'rel', topic, e1, { reason: 'no', attempts: 1 });
    await idem.outboxDeadLetter(db, 'rel', topic, e2, { reason: 'no', attempts: 2, tenants: true });
    await idem.outboxDeadLetter(db, 'rel', topic, e3, { tenant: 7n });
    assert.equal(await idem.outboxAck(db, 'rel', topic, b.batch, { generation: 5, tenants: true }), true);
    assert.equal(await idem.outboxAck(db, 'rel', topic, b.batch, { generation: 5 }), false);
    assert.equal(await idem.outboxAck(db, 'rel', topic, b.batch, { generation: 5, tenant: 'acct-1' }), false);
    const FROM4 = '  FROM idem_outbox_next($1, $2, $3, $4::bigint)';
    const FROM5 = '  FROM idem_outbox_next($1, $2, $3, $4::bigint, $5::text)';
    assert.deepEqual(db.sent, [
      [NEXT + FROM4, ['rel', topic, 10, null]],
      [NEXT + FROM4, ['rel', topic, 10, null]],
      [`${NEXT}, tenant, seq::text AS seq${FROM5}`, ['rel', topic, 10, null, null]],
      [`${NEXT}, tenant, seq::text AS seq${FROM5}`, ['rel', topic, 10, '5', 'acct-1']],
      [`${DEAD})`, ['rel', topic, e1, 'no', 1]],
      [`${DEAD}, $6::text)`, ['rel', topic, e2, 'no', 2, null]],
      [`${DEAD}, $6::text)`, ['rel', topic, e3, null, null, '7']],
      [`${ACK}, $5::text) AS moved`, ['rel', topic, b.batch, '5', null]],
      [`${ACK}) AS moved`, ['rel', topic, b.batch, '5']],
      [`${ACK}, $5::text) AS moved`, ['rel', topic, b.batch, '5', 'acct-1']],
    ]);
    assert.deepEqual((await idem.outboxDeadLetters(plain, { relay: 'rel', topic })).map((d) => [d.eventId, d.attempts]),
      [[e1, 1], [e2, 2], [e3, null]]);
  });

  it('publish, next, ack and dead letters reach the tenant forms', async () => {
    const topic = uid('t');
    const [e1, e2, e3] = await idem.transaction(pool, async (tx) => [
      await idem.publish(tx, topic, { payload: { n: 1 }, key: 'k', tenant: 'acct-1' }),
      await idem.publish(tx, topic, { payload: { n: 2 }, headers: { h: 'v' } }),
      await idem.publish(tx, topic, { raw: Buffer.from([2]), tenant: 9 }),
    ]);
    const b = await idem.outboxNext(pool, 'rel', topic, { maxEvents: 10, generation: 3, tenants: true });
    assert.deepEqual(b.events.map((e) => [e.eventId, e.key, e.payload, e.raw, e.headers, e.tenant, e.seq]), [
      [e1, 'k', { n: 1 }, null, null, null, null],
      [e2, null, { n: 2 }, null, { h: 'v' }, null, null],
      [e3, null, null, Buffer.from([2]), null, null, null],
    ]);
    await idem.outboxDeadLetter(pool, 'rel', topic, e2, { reason: 'gone', attempts: 3, tenants: true });
    assert.equal(await idem.outboxAck(pool, 'rel', topic, b.batch, { generation: 3, tenants: true }), true);
    assert.equal((await idem.outboxNext(pool, 'rel', topic, { maxEvents: 10, generation: 3 })).batch, null);
    assert.deepEqual(await calls(topic), [
      ['idem_publish', 6, null, ['{"n": 1}', 'k', null, null], 'acct-1'],
      ['idem_publish', 5, null, ['{"n": 2}', null, '{"h": "v"}', null], null],
      ['idem_publish', 6, null, [null, null, null, '\\x02'], '9'],
      ['idem_outbox_next', 5, 'rel', ['10', '3'], null],
      ['idem_outbox_dead_letter', 6, 'rel', [e2, 'gone', '3'], null],
      ['idem_outbox_ack', 5, 'rel', [b.batch, '3'], null],
      ['idem_outbox_next', 4, 'rel', ['10', '3'], null],
    ]);
  });

  it('a relay of every tenant: the tenant overloads with tenant NULL, delivered as before', async () => {
    const topic = uid('t');
    const ids = [];
    for (let i = 0; i < 5; i++) {
      ids.push(await idem.publish(pool, topic, { payload: { n: i }, tenant: i % 3 ? `acct-${i % 2}` : null }));
    }
    const got = [];
    const endpoint = await listen((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        const id = req.headers['webhook-id'];
        got.push([id, Buffer.concat(chunks).toString('utf8')]);
        res.statusCode = id === ids[1] ? 503 : 204;
        res.end();
      });
    });
    try {
      const relay = new idem.OutboxRelay({
        pool, relay: 'all', topic, maxEvents: 3, generation: 2, tenants: true, maxAttempts: 2,
        sleep: async () => undefined, sink: idem.webhookSink({ url: endpoint.url, secret: SECRET }),
      });
      assert.equal(relay.tenants, true);
      const rounds = [];
      for (;;) {
        const r = await relay.runOnce();
        if (r.batch === null) break;
        rounds.push([r.events, r.delivered, r.deadLettered]);
      }
      assert.deepEqual(rounds, [[3, 2, 1], [2, 2, 0]]);
    } finally {
      await endpoint.close();
    }
    // each event's id is its webhook-id, as without the option
    assert.deepEqual(got.map(([id]) => id), [ids[0], ids[1], ids[1], ids[2], ids[3], ids[4]]);
    assert.deepEqual(got.filter(([id]) => id !== ids[1]).map(([, body]) => JSON.parse(body)),
      [{ n: 0 }, { n: 2 }, { n: 3 }, { n: 4 }]);
    assert.deepEqual((await idem.outboxDeadLetters(pool, { relay: 'all', topic })).map((d) => [d.eventId, d.attempts]),
      [[ids[1], 2]]);
    // the generation fences it as without the option
    const zombie = new idem.OutboxRelay({
      pool, relay: 'all', topic, generation: 1, tenants: true, sink: async () => undefined,
    });
    await assert.rejects(zombie.runOnce(), idem.StaleGenerationError);
    const seen = await calls(topic);
    assert.deepEqual(seen.slice(0, 5).map(([fn, nargs]) => [fn, nargs]),
      [5, 6, 6, 5, 6].map((n) => ['idem_publish', n]));
    assert.deepEqual(seen.slice(5).map(([fn, nargs, relay, , tenant]) => [fn, nargs, relay, tenant]), [
      ['idem_outbox_next', 5, 'all', null],
      ['idem_outbox_dead_letter', 6, 'all', null],
      ['idem_outbox_ack', 5, 'all', null],
      ['idem_outbox_next', 5, 'all', null],
      ['idem_outbox_ack', 5, 'all', null],
      ['idem_outbox_next', 5, 'all', null],
    ]);
  });

  it('a relay without the option makes 0.4.0\'s calls; with it, a dead letter that stops it is a tenant form too', async () => {
    const topic = uid('t');
    const ids = [await idem.publish(pool, topic, { payload: { n: 0 } }), await idem.publish(pool, topic, { payload: { n: 1 } })];
    const got = [];
    const sink = async (event) => {
      got.push([event.eventId, event.tenant, event.seq]);
      if (event.eventId === ids[1]) throw new idem.DeliveryError('refused');
    };
    const relay = new idem.OutboxRelay({ pool, relay: 'own', topic, maxAttempts: 1, onDeadLetter: 'stop', sink });
    assert.equal(relay.tenants, false);
    await assert.rejects(relay.runOnce(), idem.DeadLetterError);
    assert.deepEqual(got, [[ids[0], undefined, undefined], [ids[1], undefined, undefined]]);
    const stop = new idem.OutboxRelay({
      pool, relay: 'own-t', topic, maxAttempts: 1, onDeadLetter: 'stop', tenants: true, sink,
    });
    await assert.rejects(stop.runOnce(), idem.DeadLetterError);
    assert.deepEqual(got.slice(2), [[ids[0], null, null], [ids[1], null, null]]);
    assert.deepEqual((await calls(topic)).map(([fn, nargs, , , tenant]) => [fn, nargs, tenant]), [
      ['idem_publish', 5, null], ['idem_publish', 5, null],
      ['idem_outbox_next', 4, null], ['idem_outbox_dead_letter', 5, null],
      ['idem_outbox_next', 5, null], ['idem_outbox_dead_letter', 6, null],
    ]);
  });

  it('a tenant that is not text or an integer, or tenants that is not a boolean, sends nothing', async () => {
    const topic = uid('t');
    const id = crypto.randomUUID();
    for (const bad of [true, 1.5, {}, ['acct'], Number.MAX_SAFE_INTEGER + 2, () => 'acct']) {
      const db = recorder();
      await assert.rejects(idem.publish(db, topic, { payload: { n: 1 }, tenant: bad }), TypeError);
      await assert.rejects(idem.outboxNext(db, 'r', topic, { tenant: bad }), TypeError);
      await assert.rejects(idem.outboxAck(db, 'r', topic, 1, { tenant: bad }), TypeError);
      await assert.rejects(idem.outboxDeadLetter(db, 'r', topic, id, { tenant: bad }), TypeError);
      assert.deepEqual(db.sent, []);
    }
    for (const bad of ['yes', 1, 0, {}, ['x']]) {
      const db = recorder();
      await assert.rejects(idem.outboxNext(db, 'r', topic, { tenants: bad }), TypeError);
      await assert.rejects(idem.outboxAck(db, 'r', topic, 1, { tenants: bad }), TypeError);
      await assert.rejects(idem.outboxDeadLetter(db, 'r', topic, id, { tenants: bad }), TypeError);
      assert.throws(() => new idem.OutboxRelay({ pool, relay: 'r', topic, tenants: bad, sink: async () => undefined }),
        TypeError);
      assert.deepEqual(db.sent, []);
    }
    // one tenant or every tenant, not both
    const db = recorder();
    await assert.rejects(idem.outboxNext(db, 'r', topic, { tenant: 'acct-1', tenants: true }), TypeError);
    assert.deepEqual(db.sent, []);
    assert.deepEqual(await calls(topic), []);
  });
});

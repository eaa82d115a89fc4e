'use strict';

// The transactional outbox's client side: Standard Webhooks signing and
// verification (the shared cases of ../../conformance/webhooks.json), the
// relay (batches acknowledged after delivery, retries with backoff and
// jitter, dead letters, generations, redelivery after a relay dies), the
// receivers (Express, Fastify: one effect per webhook-id, in the
// receiver's transaction) and the Redis Streams sink.  Against
// ../../conformance/outbox-fake.sql, a stand-in for the extension's outbox
// calls, loaded into schema outbox_fake; and end to end against the
// extension's own calls when it has them (skipped, saying so, when not).

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const { spawn } = require('node:child_process');
const express = require('express');
const Fastify = require('fastify');
const { Pool } = require('pg');
const { uid, request, waitFor, adminPool, schemaPool, listen } = require('./helpers');
const idem = require('../lib');
const { webhookReceiver } = require('../lib/express');
const { webhookReceiver: fastifyWebhookReceiver } = require('../lib/fastify');
const { backoffDelay } = require('../lib/outbox');

const CONFORMANCE = path.join(__dirname, '..', '..', 'conformance');
const cases = JSON.parse(fs.readFileSync(path.join(CONFORMANCE, 'webhooks.json'), 'utf8'));
const FAKE_SQL = fs.readFileSync(path.join(CONFORMANCE, 'outbox-fake.sql'), 'utf8');

const SECRET = idem.generateSecret();

function fakePool(max = 6) {
  return schemaPool('outbox_fake', max);
}


// a relay's sleeps, recorded instead of waited (the waits are the
// arithmetic's business, asserted on their own)
function recordedSleeps() {
  const slept = [];
  const sleep = async (ms) => { slept.push(ms); };
  return { slept, sleep };
}

describe('Standard Webhooks signatures (conformance/webhooks.json)', () => {
  for (const c of cases.sign) {
    it(`signs ${c.id} as the vector says`, () => {
      assert.equal(idem.signWebhook(cases.secret, c.id, c.timestamp, c.body), c.signature);
      assert.equal(idem.signWebhook(cases.secret, c.id, c.timestamp, Buffer.from(c.body)), c.signature);
    });
  }
  for (const c of cases.verify) {
    it(`verify: ${c.name}`, () => {
      if (c.ok) {
        const r = idem.verifyWebhook(cases.secret, c.headers, c.body, { now: c.now });
        assert.equal(r.id, c.headers['webhook-id']);
        return;
      }
      assert.throws(() => idem.verifyWebhook(cases.secret, c.headers, c.body, { now: c.now }), (err) => {
        assert.ok(err instanceof idem.WebhookVerificationError);
        assert.equal(err.status, c.status);
        assert.equal(err.slug, c.slug);
        return true;
      });
    });
  }
  it('a secret rotation: any of the receiver\'s secrets may match', () => {
    const h = idem.webhookHeaders(SECRET, 'msg_1', 1000, 'x');
    assert.equal(idem.verifyWebhook([idem.generateSecret(), SECRET], h, 'x', { now: 1000 }).id, 'msg_1');
    assert.throws(() => idem.verifyWebhook([idem.generateSecret()], h, 'x', { now: 1000 }), /no webhook-signature matches/);
  });
  it('bad secrets are refused when configured, not at the first webhook', () => {
    assert.throws(() => idem.signWebhook('whsec_not base64!', 'a', 1, ''), TypeError);
    assert.throws(() => idem.webhookSink({ url: 'http://127.0.0.1:1', secret: 'whsec_' }), TypeError);
    assert.throws(() => webhookReceiver({ pool: {}, consumer: 'c', secret: ['whsec_AAAA', 'nope!'] }, () => {}), TypeError);
  });
  it('backoff: doubles from initialDelay up to maxDelay, the upper half random', () => {
    assert.equal(backoffDelay(1, 1000, 60000, () => 0), 500);
    assert.equal(backoffDelay(1, 1000, 60000, () => 1), 1000);
    assert.equal(backoffDelay(3, 1000, 60000, () => 0.5), 3000);
    assert.equal(backoffDelay(20, 1000, 60000, () => 1), 60000);
    assert.equal(backoffDelay(20, 1000, 60000, () => 0), 30000);
  });
});

describe('outbox relay and receivers (against the fake outbox)', () => {
  let pool;
  let admin;
  let receiver;      // an Express receiver: POST /hooks
  let fastify;       // a Fastify receiver: POST /hooks
  let fastifyUrl;
  const failures = new Map();   // event id → answers of the receiver to send before it accepts

  before(async () => {
    admin = adminPool();
    pool = fakePool();
    await pool.query(FAKE_SQL);
    await pool.query('CREATE TABLE IF NOT EXISTS received (consumer text, event_id text, n int, body jsonb)');
    const app = express();
    app.post('/hooks', (req, res, next) => {
      const id = req.headers['webhook-id'];
      const left = failures.get(id);
      if (left && left.length) {
        res.status(left.shift()).end();
        return;
      }
      next();
    }, webhookReceiver({ pool, consumer: 'express', secret: SECRET, onError: () => {} }, async (tx, event) => {
      const body = event.json();
      if (body && body.explode) throw new Error('the handler failed');
      await tx.query('INSERT INTO received VALUES ($1, $2, $3, $4)', ['express', event.id, body && body.n, event.text()]);
    }));
    app.post('/parsed', express.json(), webhookReceiver({ pool, consumer: 'parsed', secret: SECRET, onError: () => {} },
      async () => {}));
    receiver = await listen(app);
    fastify = Fastify();
    fastify.register(fastifyWebhookReceiver, {
      url: '/hooks', pool, consumer: 'fastify', secret: SECRET, onError: () => {},
      handler: async (tx, event) => {
        const body = event.json();
        await tx.query('INSERT INTO received VALUES ($1, $2, $3, $4)', ['fastify', event.id, body.n, event.text()]);
      },
    });
    fastifyUrl = await fastify.listen({ port: 0, host: '127.0.0.1' });
  });
  after(async () => {
    await receiver.close();
    await fastify.close();
    await pool.end();
    await admin.end();
  });

  const received = async (consumer, ids) => (await pool.query(
    'SELECT event_id, n FROM received WHERE consumer = $1 AND event_id = ANY($2) ORDER BY n',
    [consumer, ids])).rows;

  const publishMany = async (topic, n, key = null) => {
    const ids = [];
    for (let i = 0; i < n; i++) ids.push(await idem.publish(pool, topic, { payload: { n: i }, key }));
    return ids;
  };

  it('publish writes in the caller\'s transaction: a rollback leaves no event', async () => {
    const topic = uid('t');
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      const id = await idem.publish(c, topic, { payload: { n: 1 } });
      assert.match(id, /^[0-9a-f-]{36}$/);
      await c.query('ROLLBACK');
      await c.query('BEGIN');
      const kept = await idem.publish(c, topic, { payload: { n: 2 }, key: 'order-1', headers: { 'x-kind': 'created' } });
      await c.query('COMMIT');
      const next = await idem.outboxNext(c, 'r', topic);
      assert.equal(next.events.length, 1);
      assert.equal(next.events[0].eventId, kept);
      assert.deepEqual(next.events[0].payload, { n: 2 });
      assert.equal(next.events[0].key, 'order-1');
      assert.deepEqual(next.events[0].headers, { 'x-kind': 'created' });
    } finally {
      c.release();
    }
  });

  it('next returns the same batch until it is acknowledged; ack of an old batch is false', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 5);
    const a = await idem.outboxNext(pool, 'r', topic, { maxEvents: 3 });
    const again = await idem.outboxNext(pool, 'r', topic, { maxEvents: 3 });
    assert.deepEqual(a.events.map((e) => e.eventId), ids.slice(0, 3));
    assert.deepEqual(again, a);
    assert.equal(await idem.outboxAck(pool, 'r', topic, a.batch), true);
    assert.equal(await idem.outboxAck(pool, 'r', topic, a.batch), false);
    const b = await idem.outboxNext(pool, 'r', topic, { maxEvents: 3 });
    assert.deepEqual(b.events.map((e) => e.eventId), ids.slice(3));
    assert.equal(BigInt(b.batch), BigInt(a.batch) + 1n);
  });

  it('a relay delivers every event once, in order, signed; the receiver applies each once', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 7, 'k');
    const relay = idem.outboxRelay({
      pool, relay: 'http', topic, maxEvents: 3,
      sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }),
    });
    const batches = [];
    for (;;) {
      const r = await relay.runOnce();
      if (r.batch === null) break;
      batches.push(r.events);
    }
    assert.deepEqual(batches, [3, 3, 1]);
    assert.deepEqual((await received('express', ids)).map((r) => r.event_id), ids);
  });

  it('the body is the payload as PostgreSQL prints jsonb, or payload_raw as given', async () => {
    const topic = uid('t');
    const got = [];
    const srv = await listen((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        got.push({ headers: req.headers, body: Buffer.concat(chunks) });
        res.end();
      });
    });
    try {
      const j = await idem.publish(pool, topic, { payload: { b: [1, 2], a: 'x' } });
      const r = await idem.publish(pool, topic, {
        raw: Buffer.from([0, 1, 255]), headers: { 'content-type': 'image/png', 'webhook-id': 'forged', 'x-tags': ['a', 'b'] },
      });
      const relay = idem.outboxRelay({ pool, relay: 'bytes', topic, sink: idem.webhookSink({ url: srv.url, secret: SECRET }) });
      await relay.runOnce();
      assert.equal(got.length, 2);
      assert.equal(got[0].body.toString(), '{"a": "x", "b": [1, 2]}');
      assert.equal(got[0].headers['content-type'], 'application/json');
      assert.equal(got[0].headers['webhook-id'], j);
      assert.deepEqual([...got[1].body], [0, 1, 255]);
      assert.equal(got[1].headers['content-type'], 'image/png');
      assert.equal(got[1].headers['x-tags'], 'a, b');
      assert.equal(got[1].headers['webhook-id'], r);
      for (const g of got) {
        const ts = Number(g.headers['webhook-timestamp']);
        assert.ok(Math.abs(ts - Date.now() / 1000) < 300);
        assert.equal(idem.verifyWebhook(SECRET, g.headers, g.body).id, g.headers['webhook-id']);
      }
    } finally {
      await srv.close();
    }
  });

  it('failed attempts are retried with backoff and jitter; a redelivery is not applied twice', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 3);
    failures.set(ids[1], [500, 503, 429]);
    const { slept, sleep } = recordedSleeps();
    const relay = idem.outboxRelay({
      pool, relay: 'retry', topic, sleep, random: () => 0.5, initialDelay: 100, maxDelay: 250,
      sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }),
    });
    const r = await relay.runOnce();
    assert.deepEqual(r, { batch: r.batch, delivered: 3, deadLettered: 0, events: 3, acked: true });
    // 3 failures: waits of 75 (100 → [50, 100]), 150 (200 → [100, 200]), 187.5 (250 capped → [125, 250])
    assert.deepEqual(slept, [75, 150, 187.5]);
    assert.deepEqual((await received('express', ids)).map((x) => x.event_id), ids);
    // the same events once more (a relay that died before its ack): answered 200 "duplicate"
    const sink = idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET });
    const next = await idem.outboxNext(pool, 'again', topic);
    for (const e of next.events) await sink(e);
    assert.equal((await received('express', ids)).length, 3);
  });

  it('an event that keeps failing is a dead letter; the relay goes on (onDeadLetter: continue)', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 3);
    failures.set(ids[0], [500, 500, 500, 500]);
    const { slept, sleep } = recordedSleeps();
    const seen = [];
    const relay = idem.outboxRelay({
      pool, relay: 'dl', topic, sleep, maxAttempts: 4,
      onEvent: (kind) => seen.push(kind),
      sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }),
    });
    const r = await relay.runOnce();
    assert.equal(r.deadLettered, 1);
    assert.equal(r.delivered, 2);
    assert.equal(slept.length, 3);
    assert.ok(seen.includes('dead-letter'));
    const dead = await idem.outboxDeadLetters(pool, { relay: 'dl', topic });
    assert.deepEqual(dead.map((d) => [d.eventId, d.reason, d.attempts, d.payload]),
      [[ids[0], `POST ${receiver.url}/hooks: HTTP 500`, 4, { n: 0 }]]);
    assert.deepEqual(await idem.outboxDeadLetters(pool, { relay: 'other', topic }), []);
    assert.deepEqual((await received('express', ids)).map((x) => x.event_id), ids.slice(1));
    assert.equal((await idem.outboxNext(pool, 'dl', topic)).batch, null);
  });

  it('onDeadLetter: stop records the dead letter and stops without acknowledging', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 3);
    failures.set(ids[1], [500, 500]);
    const { sleep } = recordedSleeps();
    const relay = idem.outboxRelay({
      pool, relay: 'dls', topic, sleep, maxAttempts: 2, onDeadLetter: 'stop',
      sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }),
    });
    await assert.rejects(relay.runOnce(), (err) => err instanceof idem.DeadLetterError && err.event.eventId === ids[1]);
    assert.equal((await idem.outboxDeadLetters(pool, { topic })).length, 1);
    // the batch is still the relay's: the next run delivers it again
    const again = await idem.outboxNext(pool, 'dls', topic);
    assert.deepEqual(again.events.map((e) => e.eventId), ids);
    const r = await relay.runOnce();
    assert.equal(r.delivered, 3);
    assert.deepEqual((await received('express', ids)).map((x) => x.event_id), ids);
  });

  it('generations: a relay taken over is fenced (StaleGenerationError) and acknowledges nothing', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 2);
    const sink = idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET });
    const zombie = idem.outboxRelay({ pool, relay: 'g', topic, generation: 1, sink });
    // the zombie takes the batch, then a new owner with generation 2 takes over
    const taken = await idem.outboxNext(pool, 'g', topic, { generation: 1 });
    assert.equal(taken.events.length, 2);
    const owner = idem.outboxRelay({ pool, relay: 'g', topic, generation: 2, sink });
    await assert.rejects(idem.outboxNext(pool, 'g', topic), idem.StaleGenerationError);
    assert.equal((await owner.runOnce()).delivered, 2);
    await assert.rejects(zombie.runOnce(), idem.StaleGenerationError);
    await assert.rejects(idem.outboxAck(pool, 'g', topic, taken.batch, { generation: 1 }), idem.StaleGenerationError);
    assert.equal((await received('express', ids)).length, 2);
    // run() ends on the fence
    await assert.rejects(zombie.run(), idem.StaleGenerationError);
  });

  it('a loss (ID003) stops the relay with OutboxLostError, or is acknowledged with acknowledgeLoss', async () => {
    const topic = uid('t');
    await publishMany(topic, 3);
    const sink = idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET });
    const { rows } = await pool.query('SELECT outbox_fake.lose($1, $2) AS n', ['loss', topic]);
    assert.equal(rows[0].n, '3');
    const strict = idem.outboxRelay({ pool, relay: 'loss', topic, sink });
    await assert.rejects(strict.runOnce(), (err) => err instanceof idem.OutboxLostError && err.code === 'ID003'
      && err.batch === '1');
    await assert.rejects(strict.run(), idem.OutboxLostError);
    const kinds = [];
    const lenient = idem.outboxRelay({ pool, relay: 'loss', topic, sink, acknowledgeLoss: true,
      onEvent: (kind) => kinds.push(kind) });
    assert.deepEqual(await lenient.runOnce(), { batch: '1', delivered: 0, deadLettered: 0, events: 0, lost: true });
    assert.deepEqual(kinds, ['loss']);
    const after = await idem.publish(pool, topic, { payload: { n: 9 } });
    const r = await lenient.runOnce();
    assert.equal(r.batch, '2');
    assert.deepEqual((await received('express', [after])).map((x) => x.event_id), [after]);
  });

  it('run() goes on until stop(); stop() during a backoff leaves the batch unacknowledged', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 2);
    failures.set(ids[1], [500, 500, 500, 500, 500, 500]);
    let relay;
    const sleep = async (ms, signal) => {
      relay.stop();
      assert.ok(signal.aborted);
    };
    relay = idem.outboxRelay({ pool, relay: 'st', topic, sleep, sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }) });
    await relay.run();
    failures.delete(ids[1]);
    assert.equal((await idem.outboxDeadLetters(pool, { topic })).length, 0);
    assert.deepEqual((await idem.outboxNext(pool, 'st', topic)).events.map((e) => e.eventId), ids);
  });

  it('run() waits out a database out of reach, then delivers', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 2);
    let calls = 0;
    const flaky = {
      connect: async () => {
        calls++;
        if (calls === 1) throw Object.assign(new Error('connect ECONNREFUSED (a test)'), { code: 'ECONNREFUSED' });
        return pool.connect();
      },
    };
    const kinds = [];
    let relay;
    relay = idem.outboxRelay({
      pool: flaky, relay: 'unreachable', topic, sleep: async () => {},
      onEvent: (kind) => {
        kinds.push(kind);
        if (kind === 'idle') relay.stop();
      },
      sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }),
    });
    await relay.run();
    assert.equal(kinds[0], 'database-unavailable');
    assert.deepEqual((await received('express', ids)).map((x) => x.event_id), ids);
  });

  it('receivers answer as outbox-behaviour.md says: applied, duplicate, 401, 400, 500 with nothing kept', async () => {
    const id = uid('msg');
    const body = JSON.stringify({ n: 41 });
    const send = (url, h, b = body) => request(url, { headers: { 'content-type': 'application/json', ...h }, body: b });
    for (const [url, consumer] of [[`${receiver.url}/hooks`, 'express'], [`${fastifyUrl}/hooks`, 'fastify']]) {
      const h = idem.webhookHeaders(SECRET, id, Math.floor(Date.now() / 1000), body);
      let r = await send(url, h);
      assert.equal(r.status, 200, r.text);
      assert.deepEqual(r.json(), { id, status: 'applied' });
      r = await send(url, h);
      assert.deepEqual(r.json(), { id, status: 'duplicate' });
      assert.equal((await received(consumer, [id])).length, 1);
      r = await send(url, { ...h, 'webhook-signature': idem.signWebhook(idem.generateSecret(), id, h['webhook-timestamp'], body) });
      assert.equal(r.status, 401);
      assert.equal(r.headers['content-type'], 'application/problem+json');
      assert.equal(r.json().type, 'tag:pg-idempotency,2026:webhook-signature');
      const old = idem.webhookHeaders(SECRET, uid('msg'), Math.floor(Date.now() / 1000) - 3600, body);
      r = await send(url, old);
      assert.equal(r.status, 401);
      assert.equal(r.json().type, 'tag:pg-idempotency,2026:webhook-timestamp');
      r = await send(url, { 'webhook-id': uid('msg') });
      assert.equal(r.status, 400);
      assert.equal((await received(consumer, [old['webhook-id']])).length, 0);
    }
    // a handler that throws: 500, and the id is not recorded (the redelivery runs it)
    const bad = uid('msg');
    const boom = JSON.stringify({ explode: true });
    const h = idem.webhookHeaders(SECRET, bad, Math.floor(Date.now() / 1000), boom);
    const r = await send(`${receiver.url}/hooks`, h, boom);
    assert.equal(r.status, 500);
    const fresh = await idem.consumeMessage(pool, 'express', bad);
    assert.equal(fresh, true, 'the failed delivery left no dedup record');
  });

  it('a receiver behind a JSON parser is refused (500 misconfigured): the signature needs the raw body', async () => {
    const body = JSON.stringify({ n: 1 });
    const h = idem.webhookHeaders(SECRET, uid('msg'), Math.floor(Date.now() / 1000), body);
    const r = await request(`${receiver.url}/parsed`, { headers: { 'content-type': 'application/json', ...h }, body });
    assert.equal(r.status, 500);
    assert.equal(r.json().type, 'tag:pg-idempotency,2026:misconfigured');
  });

  it('a relay SIGKILLed mid-batch: the next relay delivers the batch again, each event applied once', async () => {
    const topic = uid('t');
    const ids = await publishMany(topic, 20);
    const child = spawn(process.execPath, [path.join(__dirname, 'fixtures', 'outbox-relay.js')], {
      env: {
        ...process.env, RELAY_TOPIC: topic, RELAY_URL: `${receiver.url}/hooks`, RELAY_SECRET: SECRET,
        RELAY_SEARCH_PATH: 'outbox_fake,pg_catalog,public', RELAY_MAX_EVENTS: '20', RELAY_PAUSE_AFTER: '7',
      },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    await waitFor('the relay to deliver 7 events and pause', () => out.includes('paused'));
    child.kill('SIGKILL');
    await new Promise((r) => child.on('exit', r));
    assert.equal((await received('express', ids)).length, 7);
    const relay = idem.outboxRelay({ pool, relay: 'killed', topic, maxEvents: 20,
      sink: idem.webhookSink({ url: `${receiver.url}/hooks`, secret: SECRET }) });
    const r = await relay.runOnce();
    assert.equal(r.delivered, 20);
    assert.deepEqual((await received('express', ids)).map((x) => x.event_id), ids);
  });
});

describe('Redis Streams sink', () => {
  let redisProc;
  let redis;
  let pool;
  const sock = path.join(process.env.IDEM_SCRATCH || '/tmp', `redis-${process.pid}.sock`);

  before(async (t) => {
    const which = spawn('sh', ['-c', 'command -v redis-server']);
    const found = await new Promise((r) => which.on('exit', (code) => r(code === 0)));
    if (!found) return;
    redisProc = spawn('redis-server', ['--port', '0', '--unixsocket', sock, '--save', '', '--appendonly', 'no'],
      { stdio: 'ignore' });
    const { createClient } = require('redis');
    await waitFor('redis-server to listen', () => fs.existsSync(sock));
    redis = createClient({ socket: { path: sock } });
    await redis.connect();
    pool = fakePool(2);
    await pool.query('SELECT 1');
  });
  after(async () => {
    if (redis) await redis.quit();
    if (redisProc) redisProc.kill('SIGTERM');
    if (pool) await pool.end();
  });

  it('XADDs each event with its id, key, headers and payload', async (t) => {
    if (!redis) {
      t.skip('redis-server is not installed (Debian: apt-get install redis-server)');
      return;
    }
    const topic = uid('t');
    const a = await idem.publish(pool, topic, { payload: { n: 1 }, key: 'k1', headers: { h: 'v' } });
    const b = await idem.publish(pool, topic, { raw: Buffer.from('raw bytes') });
    const relay = idem.outboxRelay({ pool, relay: 'redis', topic, sink: idem.redisStreamSink({ client: redis, stream: `s-${topic}` }) });
    assert.equal((await relay.runOnce()).delivered, 2);
    const entries = await redis.xRange(`s-${topic}`, '-', '+');
    assert.deepEqual(entries.map((e) => e.message.event_id), [a, b]);
    assert.equal(entries[0].message.payload, '{"n": 1}');
    assert.equal(entries[0].message.key, 'k1');
    assert.equal(entries[0].message.headers, '{"h":"v"}');
    assert.equal(entries[1].message.payload_raw, 'raw bytes');
    assert.equal(entries[1].message.payload, undefined);
  });

  it('a redelivered batch: a second entry per event, or none within dedupSeconds', async (t) => {
    if (!redis) {
      t.skip('redis-server is not installed (Debian: apt-get install redis-server)');
      return;
    }
    const topic = uid('t');
    const ids = [await idem.publish(pool, topic, { payload: { n: 1 } }), await idem.publish(pool, topic, { payload: { n: 2 } })];
    for (const [stream, dedupSeconds] of [[`plain-${topic}`, null], [`once-${topic}`, 3600]]) {
      const sink = idem.redisStreamSink({ client: redis, stream, dedupSeconds });
      // the batch twice, as a relay killed before its ack and the next one deliver it
      const { events } = await idem.outboxNext(pool, `r-${stream}`, topic);
      for (const e of events) await sink(e, { topic });
      for (const e of events) await sink(e, { topic });
      const got = (await redis.xRange(stream, '-', '+')).map((e) => e.message.event_id);
      assert.deepEqual(got, dedupSeconds ? ids : [...ids, ...ids], stream);
    }
    assert.ok(await redis.ttl(`once-${topic}:dedup:${ids[0]}`) > 3500);
    assert.throws(() => idem.redisStreamSink({ client: redis, dedupSeconds: 0 }), TypeError);
  });
});

describe('end to end against the extension\'s own outbox', () => {
  let pool;
  let present = false;
  before(async () => {
    pool = new Pool({ max: 4 });
    const { rows } = await pool.query(
      "SELECT count(DISTINCT p.proname)::int AS n FROM pg_proc p JOIN pg_extension e ON true JOIN pg_depend d ON d.objid = p.oid AND d.refobjid = e.oid"
      + " WHERE e.extname = 'idempotency' AND p.proname IN ('idem_publish', 'idem_outbox_next', 'idem_outbox_ack', 'idem_outbox_dead_letter')");
    present = rows[0].n === 4;
  });
  after(async () => {
    await pool.end();
  });

  it('publish, relay over HTTP, receive: every committed event once, none of a rollback', async (t) => {
    if (!present) {
      t.skip('the installed extension has no idem_publish/idem_outbox_next/idem_outbox_ack/idem_outbox_dead_letter (the outbox core is not merged yet)');
      return;
    }
    await pool.query('CREATE TABLE IF NOT EXISTS received_e2e (event_id text PRIMARY KEY, n int)');
    const app = express();
    app.post('/hooks', webhookReceiver({ pool, consumer: 'e2e', secret: SECRET }, async (tx, event) => {
      await tx.query('INSERT INTO received_e2e VALUES ($1, $2)', [event.id, event.json().n]);
    }));
    const srv = await listen(app);
    try {
      const topic = uid('t');
      const kept = [];
      for (let i = 0; i < 10; i++) {
        const c = await pool.connect();
        try {
          await c.query('BEGIN');
          const id = await idem.publish(c, topic, { payload: { n: i }, key: 'k' });
          if (i % 3 === 0) await c.query('ROLLBACK');
          else {
            await c.query('COMMIT');
            kept.push(id);
          }
        } finally {
          c.release();
        }
      }
      const relay = idem.outboxRelay({ pool, relay: 'e2e', topic, maxEvents: 4,
        sink: idem.webhookSink({ url: `${srv.url}/hooks`, secret: SECRET }) });
      while ((await relay.runOnce()).batch !== null);
      const rows = (await pool.query('SELECT event_id FROM received_e2e WHERE event_id = ANY($1) ORDER BY n', [kept])).rows;
      assert.deepEqual(rows.map((r) => r.event_id), kept);
      // a dead letter, as the extension records and shows it
      const dead = await idem.publish(pool, topic, { payload: { n: 99 } });
      const failing = idem.outboxRelay({ pool, relay: 'e2e', topic, maxAttempts: 2, sleep: async () => {},
        sink: async () => { throw new idem.DeliveryError('refused'); } });
      assert.equal((await failing.runOnce()).deadLettered, 1);
      assert.deepEqual((await idem.outboxDeadLetters(pool, { relay: 'e2e', topic })).map((d) => [d.eventId, d.reason, d.attempts]),
        [[dead, 'refused', 2]]);
      assert.equal((await failing.runOnce()).batch, null);
    } finally {
      await srv.close();
    }
  });
});

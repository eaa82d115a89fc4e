'use strict';

// The Node.js driver of the clients' conformance suite: every case of
// clients/conformance/cases.json against the conformance app of each
// adapter (conformance-apps.js), over real HTTP.  The Python driver
// (clients/python/tests/test_conformance.py) runs the same cases against
// the Python adapters.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const { Pool } = require('pg');
const { uid, request, waitFor } = require('./helpers');
const { ADAPTERS, TABLE } = require('./conformance-apps');
const suite = require('../../conformance/cases.json');

const BLOCKED_SQL = "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'idem-conformance'" +
  " AND wait_event_type = 'Lock'";

// A request with a body of `length` bytes, its answer read as soon as it
// comes (Express drains the body before its 413, Fastify may answer before
// reading it).
function announce(url, path, headers, length) {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(port), hostname);
    let buf = Buffer.alloc(0);
    // the answer, once its head and the body its Content-Length announces
    // are in (the server need not close: it did not read the body)
    const answer = () => {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return null;
      const head = buf.subarray(0, end).toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(head);
      const len = /\r\ncontent-length: *(\d+)/i.exec(head);
      const body = buf.subarray(end + 4);
      if (!m || (len && body.length < Number(len[1]))) return null;
      return { status: Number(m[1]), headers: {}, body, text: body.toString('utf8') };
    };
    sock.on('data', (c) => {
      buf = Buffer.concat([buf, c]);
      const a = answer();
      if (a) {
        sock.destroy();
        resolve(a);
      }
    });
    sock.on('error', reject);
    sock.on('close', () => reject(new Error(`no answer: ${JSON.stringify(buf.toString('latin1').slice(0, 200))}`)));
    const lines = [`POST ${path} HTTP/1.1`, `Host: ${hostname}`, 'Connection: close',
      'Content-Type: application/json', `Content-Length: ${length}`];
    for (const [k, v] of Object.entries(headers)) for (const one of [].concat(v)) lines.push(`${k}: ${one}`);
    sock.write(`${lines.join('\r\n')}\r\n\r\n`);
    sock.write(Buffer.alloc(length, 0x20), () => {});
    sock.setTimeout(30000, () => sock.destroy(new Error('no answer in 30 s')));
  });
}

function requestOf(send, prefix) {
  const headers = { ...(send.headers || {}) };
  if (send.caller) headers.authorization = `Bearer ${send.caller}`;
  const k = (name) => `${prefix}-${name}`;
  const ofLength = (n) => `${prefix}-`.padEnd(n, 'k');
  if (send.key !== undefined) headers['idempotency-key'] = `"${k(send.key)}"`;
  if (send.bareKey !== undefined) headers['idempotency-key'] = k(send.bareKey);
  if (send.keyOfLength !== undefined) headers['idempotency-key'] = `"${ofLength(send.keyOfLength)}"`;
  if (send.bareKeyOfLength !== undefined) headers['idempotency-key'] = ofLength(send.bareKeyOfLength);
  if (send.rawKeys !== undefined) headers['idempotency-key'] = send.rawKeys;
  let body;
  if (send.json !== undefined) body = JSON.stringify(send.json);
  if (send.body !== undefined) body = send.body;
  if (body !== undefined && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-type')) {
    headers['content-type'] = 'application/json';
  }
  return { method: send.method || 'POST', path: send.path, headers, body };
}

function send(url, step, prefix) {
  const r = requestOf(step.send, prefix);
  if (step.send.announceLength !== undefined) return announce(url, r.path, r.headers, step.send.announceLength);
  return request(`${url}${r.path}`, { method: r.method, headers: r.headers, body: r.body });
}

function check(res, expect, saved, what) {
  const at = `${what}: ${res.status} ${res.text.slice(0, 300)}`;
  if (expect.status !== undefined) assert.equal(res.status, expect.status, at);
  if (expect.statusAtLeast !== undefined) assert.ok(res.status >= expect.statusAtLeast, at);
  if (expect.replayed !== undefined) {
    assert.equal(res.headers['idempotent-replayed'] === 'true', expect.replayed, `${at}: Idempotent-Replayed`);
  }
  if (expect.problem !== undefined) {
    assert.match(String(res.headers['content-type']), /^application\/problem\+json/, at);
    const doc = JSON.parse(res.text);
    assert.equal(doc.type, `${suite.problem_base}${expect.problem}`, at);
    assert.equal(doc.status, res.status, at);
    assert.equal(typeof doc.title, 'string', at);
    assert.equal(doc.key_retention_seconds, suite.key_retention_seconds, at);
    assert.equal(res.headers.link, undefined, `${at}: no Link without docsUrl`);
    if (res.status === 409 || res.status === 503) assert.equal(res.headers['retry-after'], '1', at);
  }
  if (expect.json !== undefined) {
    const doc = JSON.parse(res.text);
    for (const [k, v] of Object.entries(expect.json)) assert.deepEqual(doc[k], v, `${at}: ${k}`);
  }
  for (const h of expect.has || []) assert.notEqual(res.headers[h], undefined, `${at}: has ${h}`);
  for (const h of expect.lacks || []) assert.equal(res.headers[h], undefined, `${at}: lacks ${h}`);
  if (expect.contentTypePrefix !== undefined) {
    assert.ok(String(res.headers['content-type']).startsWith(expect.contentTypePrefix), at);
  }
  if (expect.sameAs !== undefined) {
    const first = saved.get(expect.sameAs);
    assert.equal(res.status, first.status, at);
    assert.deepEqual(res.body, first.body, `${at}: the body bytes of ${expect.sameAs}`);
    for (const h of expect.sameHeaders || []) assert.equal(res.headers[h], first.headers[h], `${at}: ${h}`);
  }
  if (expect.policy) assert.deepEqual(JSON.parse(res.text), suite.policy, at);
}

async function runCase(url, db, c) {
  const prefix = uid('c');
  const saved = new Map();
  const background = new Map();
  let lock = null;
  const count = async () => (await db.query('SELECT count(*)::int AS n FROM conformance_charges')).rows[0].n;
  const before = await count();
  try {
    for (const [i, step] of c.steps.entries()) {
      const what = `step ${i + 1}`;
      if (step.lock) {
        lock = await db.connect();
        await lock.query('BEGIN');
        await lock.query('LOCK TABLE conformance_charges IN EXCLUSIVE MODE');
      } else if (step.unlock) {
        await lock.query('ROLLBACK');
        lock.release();
        lock = null;
      } else if (step.waitBlocked !== undefined) {
        await waitFor('a request waits at its INSERT',
          async () => (await db.query(BLOCKED_SQL)).rows[0].n >= step.waitBlocked);
      } else if (step.join !== undefined) {
        const res = await background.get(step.join);
        check(res, step.expect || {}, saved, `${what} (${step.join})`);
        if (step.save) saved.set(step.save, res);
      } else if (step.parallel !== undefined) {
        const answers = await Promise.all(Array.from({ length: step.parallel }, () => send(url, step, prefix)));
        const fresh = answers.filter((a) => a.status === 201 && a.headers['idempotent-replayed'] !== 'true');
        assert.equal(fresh.length, 1, `${what}: one first answer of ${answers.map((a) => a.status)}`);
        for (const a of answers) {
          if (a === fresh[0]) continue;
          if (a.status === 409) check(a, { problem: 'in-progress' }, saved, what);
          else check(a, { status: 201, replayed: true }, saved, what);
          if (a.status === 201) assert.deepEqual(a.body, fresh[0].body, `${what}: a replay of the first`);
        }
      } else if (step.background !== undefined) {
        const p = send(url, step, prefix);
        p.catch(() => {}); // joined later
        background.set(step.background, p);
      } else {
        const res = await send(url, step, prefix);
        check(res, step.expect || {}, saved, what);
        if (step.save) saved.set(step.save, res);
      }
    }
  } finally {
    if (lock) {
      await lock.query('ROLLBACK').catch(() => {});
      lock.release();
    }
    await Promise.allSettled([...background.values()]);
  }
  assert.equal(await count() - before, c.charges, 'charges made by the case');
}

for (const [adapter, start] of Object.entries(ADAPTERS)) {
  describe(`conformance: ${adapter}`, () => {
    let app;
    let db;
    before(async () => {
      db = new Pool({ max: 3 });
      await db.query(TABLE);
      app = await start();
    });
    after(async () => {
      await app.close();
      await db.end();
    });
    for (const c of suite.cases) {
      it(c.name, () => runCase(app.url, db, c));
    }
  });
}

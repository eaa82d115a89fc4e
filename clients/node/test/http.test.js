'use strict';

// The Express 5 and Fastify 5 middleware against the real extension, over
// real HTTP, with concurrent clients.  Every test runs on both frameworks.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { appPool, uid, request, waitFor, makeGates } = require('./helpers');
const { buildApp, SCHEMA } = require('./apps');
const { ConfigurationError } = require('../lib');

const TAG = 'tag:pg-idempotency,2026:';
// the scope of the test app's default caller on a route
const scopeOf = (route, caller = 'tester') => JSON.stringify([caller, 'POST', route]);
const { startChild } = require('./fixtures/child');
const { lookup } = require('../lib');

for (const framework of ['express', 'fastify']) {
  describe(`${framework} middleware`, () => {
    let pool;
    let watch; // its own connection: the app's pool may be all taken by waiting requests
    let app;
    let gates;
    const errors = [];

    before(async () => {
      pool = appPool(12);
      watch = appPool(1);
      await pool.query(SCHEMA);
      gates = makeGates();
      app = await buildApp(framework, { pool, gates, onError: (err) => errors.push(err) });
    });
    after(async () => {
      await app.close();
      await pool.end();
      await watch.end();
    });

    const post = (path, key, body, headers = {}) => {
      const h = { ...headers };
      if (key !== undefined) h['idempotency-key'] = key;
      return request(`${app.url}${path}`, { headers: h, body });
    };
    const rowsFor = async (key) => Number((await pool.query(
      'SELECT count(*) AS n FROM orders WHERE key = $1', [key])).rows[0].n);
    const rowsForItem = async (item) => Number((await pool.query(
      'SELECT count(*) AS n FROM orders WHERE item = $1', [item])).rows[0].n);
    const sq = (s) => `"${s}"`;

    it('stores the first response and replays it with Idempotent-Replayed', async () => {
      const key = uid();
      const first = await post('/orders', sq(key), { item: 'book', qty: 1 });
      assert.equal(first.status, 201);
      assert.equal(first.headers['idempotent-replayed'], undefined);
      assert.match(first.headers.location, /^\/orders\/\d+$/);
      // the same JSON with other key order and spacing is the same request
      const retry = await post('/orders', sq(key), '{ "qty":1,   "item":"book" }',
        { 'content-type': 'application/json' });
      assert.equal(retry.status, 201);
      assert.equal(retry.headers['idempotent-replayed'], 'true');
      assert.deepEqual(retry.body, first.body);
      assert.equal(retry.headers.location, first.headers.location);
      assert.equal(retry.headers['content-type'], first.headers['content-type']);
      assert.equal(await rowsFor(key), 1);
      // the key lives for the advertised retention (24 hours by default)
      const r = await lookup(pool, key, { scope: scopeOf('/orders') });
      assert.equal(r.status, 'completed');
      assert.equal((r.expiresAt - r.claimedAt) / 1000, 86400);
    });

    it('answers 422 to the key reused with another body, and writes nothing', async () => {
      const key = uid();
      assert.equal((await post('/orders', sq(key), { item: 'pen' })).status, 201);
      const res = await post('/orders', sq(key), { item: 'ink' });
      assert.equal(res.status, 422);
      assert.equal(res.headers['content-type'], 'application/problem+json');
      assert.equal(res.headers.link, undefined, 'no Link without docsUrl');
      const doc = res.json();
      assert.equal(doc.type, `${TAG}mismatch`);
      assert.equal(doc.status, 422);
      assert.equal(doc.key_retention_seconds, 86400);
      assert.equal(await rowsFor(key), 1);
      assert.equal(await rowsForItem('ink'), 0);
      const again = await post('/orders', sq(key), { item: 'pen' });
      assert.equal(again.status, 201);
      assert.equal(again.headers['idempotent-replayed'], 'true');
    });

    it('answers 410 expired to a retry after the retention while the server remembers the key', async () => {
      // idempotency.key_memory is set on the test database (test.sh)
      const key = uid();
      assert.equal((await post('/late', sq(key), { item: 'late' })).status, 201);
      await waitFor('the key expired and remembered', async () => {
        const r = await lookup(pool, key, { scope: scopeOf('/late') });
        return r !== null && r.status === 'expired';
      });
      const res = await post('/late', sq(key), { item: 'late' });
      assert.equal(res.status, 410);
      assert.equal(res.headers['content-type'], 'application/problem+json');
      assert.equal(res.headers['retry-after'], undefined);
      const doc = res.json();
      assert.equal(doc.type, `${TAG}expired`);
      assert.equal(doc.status, 410);
      assert.equal(doc.key_retention_seconds, 1);
      assert.equal(doc.key_memory_seconds, 30 * 86400);
      assert.equal(await rowsFor(key), 1, 'the handler did not run again');
      assert.equal((await post('/late', sq(uid()), { item: 'late' })).status, 201);
    });

    it('answers 400 to each bad key, and writes nothing', async () => {
      const long = 'k'.repeat(256);
      const cases = [
        ['no key', undefined, 'missing-key'],
        ['256 characters', sq(long), 'key-too-long'],
        ['256 characters, bare', long, 'key-too-long'],
        ['two header fields', [sq(uid()), sq(uid())], 'multiple-keys'],
        ['one field with two values', `${sq(uid())}, ${sq(uid())}`, 'multiple-keys'],
        ['one field with two bare values', `${uid()},${uid()}`, 'multiple-keys'],
        ['invalid characters (bare)', 'k y@z', 'malformed-key'],
        ['invalid characters (braces)', '{k}', 'malformed-key'],
        ['unterminated string', '"k-2', 'malformed-key'],
        ['bad escape', '"k\\n"', 'malformed-key'],
        ['parameters', '"k";p=1', 'malformed-key'],
        ['empty string', '""', 'empty-key'],
      ];
      for (const [what, key, slug] of cases) {
        const item = uid('item');
        const res = await post('/orders', key, { item });
        assert.equal(res.status, 400, what);
        assert.equal(res.headers['content-type'], 'application/problem+json', what);
        assert.equal(res.json().type, `${TAG}${slug}`, what);
        assert.equal(await rowsForItem(item), 0, `${what}: no order`);
      }
      // nothing claimed either: the longest legal key, then a retry of it
      const longest = long.slice(1);
      assert.equal((await post('/orders', sq(longest), { item: 'x' })).status, 201);
      assert.equal((await post('/orders', longest, { item: 'x' })).headers['idempotent-replayed'], 'true',
        'a bare key is the same key as its quoted form');
      const esc = `q-${uid()}"\\`;
      assert.equal((await post('/orders', `"${esc.replace(/[\\"]/g, '\\$&')}"`, { item: 'x' })).status, 201);
      assert.equal(await rowsFor(esc), 1, 'escapes are undone');
    });

    it('keeps the keys of two callers apart', async () => {
      const key = uid();
      const a = await post('/orders', sq(key), { item: 'tea' }, { 'x-user': 'alice' });
      const b = await post('/orders', sq(key), { item: 'tea' }, { 'x-user': 'bob' });
      assert.equal(a.status, 201);
      assert.equal(b.status, 201);
      assert.equal(b.headers['idempotent-replayed'], undefined);
      assert.notDeepEqual(a.body, b.body);
      assert.equal(await rowsFor(key), 2);
      const again = await post('/orders', sq(key), { item: 'tea' }, { 'x-user': 'bob' });
      assert.deepEqual(again.body, b.body);
      assert.equal((await lookup(pool, key, { scope: scopeOf('/orders', 'alice') })).status, 'completed');
    });

    it('20 parallel requests with one key make one order; the others get 409 or the replay', async () => {
      const key = uid();
      const gate = uid('gate');
      let settled = 0;
      const all = Array.from({ length: 20 }, () => post('/orders', sq(key), { item: 'lamp' }, { 'x-test-gate': gate })
        .finally(() => { settled++; }));
      await gates.reached(gate);
      // the winner is held after its INSERT; the rest are answered meanwhile
      await waitFor('19 answers while the first request is held', () => settled >= 19);
      gates.open(gate);
      const res = await Promise.all(all);
      const fresh = res.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
      assert.equal(fresh.length, 1);
      for (const r of res) {
        if (r.status === 409) {
          assert.equal(r.headers['retry-after'], '1');
          assert.equal(r.json().type, `${TAG}in-progress`);
        } else {
          assert.equal(r.status, 201);
          assert.deepEqual(r.body, fresh[0].body);
        }
      }
      assert.equal(await rowsFor(key), 1);
      const after1 = await post('/orders', sq(key), { item: 'lamp' });
      assert.equal(after1.headers['idempotent-replayed'], 'true');
      assert.deepEqual(after1.body, fresh[0].body);
    });

    it('with wait, 20 parallel requests make one order and the others wait and replay it', async () => {
      const key = uid();
      const gate = uid('gate');
      const all = Array.from({ length: 20 }, () => post('/orders-wait', sq(key), { item: 'desk' }, { 'x-test-gate': gate }));
      await gates.reached(gate);
      await waitFor('a duplicate waiting for the first request', async () => Number((await watch.query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idem_claim%'"))
        .rows[0].n) > 0);
      gates.open(gate);
      const res = await Promise.all(all);
      assert.deepEqual([...new Set(res.map((r) => r.status))], [201]);
      const fresh = res.filter((r) => r.headers['idempotent-replayed'] === undefined);
      assert.equal(fresh.length, 1);
      for (const r of res) assert.deepEqual(r.body, fresh[0].body);
      assert.equal(await rowsFor(key), 1);
      assert.equal(gates.count(gate), 1, 'one handler ran');
    });

    it('a wait past its bound is 409, or 503 as configured (lock_timeout, 55P03)', async () => {
      for (const [path, status] of [['/orders-wait-short', 409], ['/orders-wait-503', 503]]) {
        const key = uid();
        const gate = uid('gate');
        const first = post(path, sq(key), { item: 'cup' }, { 'x-test-gate': gate });
        await gates.reached(gate);
        const dup = await post(path, sq(key), { item: 'cup' });
        assert.equal(dup.status, status, path);
        assert.equal(dup.headers['retry-after'], '1');
        assert.equal(dup.headers['content-type'], 'application/problem+json');
        assert.equal(dup.json().type, `${TAG}busy`);
        gates.open(gate);
        assert.equal((await first).status, 201);
        assert.equal(await rowsFor(key), 1);
      }
    });

    it('releases a 5xx answer: the write rolls back and a retry runs again', async () => {
      for (const header of [{ 'x-test-status': '500' }, { 'x-test-throw': '1' }]) {
        const key = uid();
        const failed = await post('/orders', sq(key), { item: 'vase' }, header);
        assert.equal(failed.status, 500);
        assert.equal(await rowsFor(key), 0, 'the INSERT rolled back');
        assert.equal(await lookup(pool, key, { scope: scopeOf('/orders') }), null, 'no key recorded');
        const retry = await post('/orders', sq(key), { item: 'vase' });
        assert.equal(retry.status, 201);
        assert.equal(retry.headers['idempotent-replayed'], undefined);
        assert.equal(await rowsFor(key), 1);
      }
    });

    it('stores a 5xx when configured to, and replays stored 4xx answers', async () => {
      const key = uid();
      assert.equal((await post('/stored-5xx', sq(key), { item: 'x' }, { 'x-test-status': '500' })).status, 500);
      const again = await post('/stored-5xx', sq(key), { item: 'x' });
      assert.equal(again.status, 500);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      const k2 = uid();
      const declined = await post('/declined', sq(k2), { item: 'car' });
      assert.equal(declined.status, 402);
      const d2 = await post('/declined', sq(k2), { item: 'car' });
      assert.equal(d2.status, 402);
      assert.equal(d2.headers['idempotent-replayed'], 'true');
      assert.deepEqual(d2.body, declined.body);
    });

    it('replays the status, the allowlisted headers (never Set-Cookie) and the raw bytes', async () => {
      const key = uid();
      const first = await post('/export', sq(key), { item: 'csv' });
      assert.equal(first.status, 201);
      assert.ok(first.headers['set-cookie'], 'the first answer has its cookie');
      assert.equal(first.headers['x-other'], 'not replayed');
      const retry = await post('/export', sq(key), { item: 'csv' });
      assert.equal(retry.status, 201);
      assert.equal(retry.headers['idempotent-replayed'], 'true');
      assert.ok(retry.body.equals(first.body), 'the same bytes');
      assert.equal(retry.body[0], 0xff);
      for (const h of ['content-type', 'location', 'etag', 'x-custom']) {
        assert.equal(retry.headers[h], first.headers[h], h);
      }
      assert.equal(retry.headers['set-cookie'], undefined, 'Set-Cookie is never replayed');
      assert.equal(retry.headers['x-other'], undefined, 'not in the allowlist');
      assert.equal(retry.headers['content-length'], String(first.body.length));
      const stored = await lookup(pool, key, { scope: scopeOf('/export') });
      assert.ok(stored.responseRaw.equals(first.body));
      assert.equal(stored.responseHeaders['set-cookie'], undefined);
    });

    it('a response over max_response_bytes (54000) rolls back and answers 500, or 413 as configured', async () => {
      for (const [path, status] of [['/big', 500], ['/big-413', 413]]) {
        const key = uid();
        const res = await post(path, sq(key), { item: 'huge' });
        assert.equal(res.status, status, path);
        assert.equal(res.json().type, `${TAG}response-too-large`);
        assert.equal(await rowsFor(key), 0, 'the business write rolled back');
        assert.equal(await lookup(pool, key, { scope: scopeOf(path) }), null);
      }
    });

    it('a request body over the framework\'s limit is 413 and writes nothing', async () => {
      const key = uid();
      const res = await post('/orders', sq(key), { item: 'y'.repeat(20 * 1024) });
      assert.equal(res.status, 413);
      assert.equal(await rowsFor(key), 0);
      assert.equal(await lookup(pool, key, { scope: scopeOf('/orders') }), null);
    });

    it('without required, a request without a key runs in a transaction without dedup', async () => {
      const item = uid('item');
      assert.equal((await post('/optional', undefined, { item })).status, 201);
      assert.equal((await post('/optional', undefined, { item })).status, 201);
      assert.equal(await rowsForItem(item), 2);
      const key = uid();
      await post('/optional', sq(key), { item });
      assert.equal((await post('/optional', sq(key), { item })).headers['idempotent-replayed'], 'true');
    });

    it('a server killed before COMMIT leaves nothing: the retry makes the one order', async () => {
      const key = uid();
      const child = startChild('server.js', [framework]);
      try {
        const { listening } = await child.line((m) => m.listening);
        const pending = request(`${listening}/orders`, {
          headers: { 'idempotency-key': sq(key), 'x-test-gate': 'crash' }, body: { item: 'crash' },
        }).catch(() => null);
        await child.line((m) => m.gate === 'crash'); // after its INSERT, before COMMIT
        await child.kill();
        await pending;
      } finally {
        await child.kill();
      }
      // the dead server's backend rolls back when it sees the socket close;
      // until then the key is in flight (409)
      const res = await waitFor('the key free again', async () => {
        const r = await post('/orders', sq(key), { item: 'crash' });
        return r.status === 409 ? null : r;
      });
      assert.equal(res.status, 201);
      assert.equal(res.headers['idempotent-replayed'], undefined);
      assert.equal(await rowsFor(key), 1);
    });

    it('two-phase: a duplicate waits for the holder (idempotency.wait_timeout) and replays its answer', async () => {
      const key = uid();
      const gate = uid('gate');
      const first = post('/orders-2p', sq(key), { item: 'ship' }, { 'x-test-gate': gate });
      await gates.reached(gate); // claim committed, checkpointed, effect done
      const dup = post('/orders-2p', sq(key), { item: 'ship' });
      await waitFor('the duplicate waiting for the committed claim', async () => Number((await watch.query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Extension' AND query LIKE '%idem_claim%'"))
        .rows[0].n) > 0);
      gates.open(gate);
      const [a, b] = await Promise.all([first, dup]);
      assert.equal(a.status, 201);
      assert.equal(a.headers['idempotent-replayed'], undefined);
      assert.equal(b.status, 201);
      assert.equal(b.headers['idempotent-replayed'], 'true');
      assert.deepEqual(b.body, a.body);
      assert.equal(await rowsFor(key), 1);
    });

    it('two-phase: a killed holder\'s lease lapses and the retry takes over from its recovery point', async () => {
      const key = uid();
      const child = startChild('server.js', [framework]);
      try {
        const { listening } = await child.line((m) => m.listening);
        const pending = request(`${listening}/orders-2p-short`, {
          headers: { 'idempotency-key': sq(key), 'x-test-gate': 'lapse' }, body: { item: 'boat' },
        }).catch(() => null);
        await child.line((m) => m.gate === 'lapse');
        await child.kill();
        await pending;
      } finally {
        await child.kill();
      }
      const stuck = await lookup(pool, key, { scope: scopeOf('/orders-2p-short') });
      assert.equal(stuck.status, 'in_progress');
      assert.equal(stuck.recoveryPoint, 'before-insert');
      const res = await waitFor('the lease to lapse', async () => {
        const r = await post('/orders-2p-short', sq(key), { item: 'boat' });
        return r.status === 409 ? null : r;
      });
      assert.equal(res.status, 201);
      assert.equal(res.json().recoveryPoint, 'before-insert', 'the handler saw where the first one got to');
      const replay = await post('/orders-2p-short', sq(key), { item: 'boat' });
      assert.equal(replay.headers['idempotent-replayed'], 'true');
    });

    it('publishes its policy, with the retention', async () => {
      const res = await request(`${app.url}/docs/idempotency`, { method: 'GET' });
      assert.equal(res.status, 200);
      const doc = res.json();
      assert.equal(doc.key_retention_seconds, 86400);
      assert.equal(doc.max_key_bytes, 255);
      assert.equal(doc.header, 'Idempotency-Key');
      assert.equal(doc.key_scope, 'the authenticated caller, the method and the route');
    });

    it('with docsUrl, problem types and a Link point at it', async () => {
      const res = await post('/documented', undefined, { item: 'x' });
      assert.equal(res.status, 400);
      assert.equal(res.json().type, 'https://docs.example/idempotency#missing-key');
      assert.equal(res.headers.link, '<https://docs.example/idempotency>; rel="describedby"');
    });

    it('refuses a request whose caller cannot be established: 500 no-caller, onError told, nothing done', async () => {
      const key = uid();
      const before = errors.length;
      const res = await post('/orders', sq(key), { item: 'ghost' }, { 'x-anonymous': '1' });
      assert.equal(res.status, 500);
      assert.equal(res.json().type, `${TAG}no-caller`);
      assert.equal(await rowsFor(key), 0);
      assert.equal(errors.length, before + 1);
      assert.ok(errors[before] instanceof ConfigurationError);
      assert.match(errors[before].message, /no caller for POST \/orders/);
      // nothing was claimed: the caller's own request runs
      assert.equal((await post('/orders', sq(key), { item: 'ghost' })).status, 201);
    });

    it('with anonymous: true, requests without a caller share the route\'s keys', async () => {
      const key = uid();
      const a = await post('/anonymous', sq(key), { item: 'anon' }, { 'x-anonymous': '1' });
      assert.equal(a.status, 201);
      const b = await post('/anonymous', sq(key), { item: 'anon' }, { 'x-anonymous': '1' });
      assert.equal(b.headers['idempotent-replayed'], 'true');
      assert.deepEqual(b.body, a.body);
      assert.equal((await lookup(pool, key, { scope: 'POST /anonymous' })).status, 'completed');
      // an authenticated caller still has keys of its own
      const c = await post('/anonymous', sq(key), { item: 'anon' }, { 'x-user': 'carol' });
      assert.equal(c.headers['idempotent-replayed'], undefined);
      assert.equal(await rowsFor(key), 2);
    });

    it('scopes a key by the route template: another path of the route is 422', async () => {
      const key = uid();
      assert.equal((await post('/items/1/refund', sq(key), { item: 'r' })).status, 201);
      const other = await post('/items/2/refund', sq(key), { item: 'r' });
      assert.equal(other.status, 422);
      assert.equal(other.json().type, `${TAG}mismatch`);
      assert.equal((await lookup(pool, key, { scope: scopeOf('/items/:id/refund') })).status, 'completed');
      // the query string is part of the request too
      const k2 = uid();
      assert.equal((await post('/orders?amount=5', sq(k2), { item: 'q' })).status, 201);
      assert.equal((await post('/orders?amount=500', sq(k2), { item: 'q' })).status, 422);
    });

    it('fingerprintFields: only the selected fields of the body make the request', async () => {
      const key = uid();
      const first = await post('/selected', sq(key), { item: 'pen', card: { last4: '4242' }, sent_at: 1 });
      assert.equal(first.status, 201);
      const later = await post('/selected', sq(key), { sent_at: 2, card: { last4: '4242', brand: 'x' }, item: 'pen' });
      assert.equal(later.headers['idempotent-replayed'], 'true', 'a client timestamp is not compared');
      const other = await post('/selected', sq(key), { item: 'pen', card: { last4: '1111' }, sent_at: 1 });
      assert.equal(other.status, 422);
    });

    it('the key option takes the key from elsewhere (a webhook-id header)', async () => {
      const id = uid('msg');
      const first = await post('/webhook', undefined, { item: 'hook' }, { 'webhook-id': id });
      assert.equal(first.status, 201);
      const again = await post('/webhook', undefined, { item: 'hook' }, { 'webhook-id': id });
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal((await post('/webhook', undefined, { item: 'hook' })).status, 400, 'missing');
      assert.equal(await rowsFor(id), 1);
    });

    it("serverErrors: 'release' keeps the handler's writes and frees the key", async () => {
      const key = uid();
      assert.equal((await post('/released-5xx', sq(key), { item: 'rel' }, { 'x-test-status': '500' })).status, 500);
      assert.equal(await rowsFor(key), 1, 'the write committed');
      assert.equal((await lookup(pool, key, { scope: scopeOf('/released-5xx') })).status, 'released');
      const retry = await post('/released-5xx', sq(key), { item: 'rel' });
      assert.equal(retry.status, 201);
      assert.equal(retry.headers['idempotent-replayed'], undefined);
    });
  });
}

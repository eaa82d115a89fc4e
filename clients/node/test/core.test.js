'use strict';

// The core: one function per SQL call, the same-transaction runner, the
// two-phase runner and its recoverer, the batch consumer, and the mapping of
// SQLSTATEs to errors, against the real extension.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { appPool, uid, waitFor } = require('./helpers');
const { startChild } = require('./fixtures/child');
const idem = require('../lib');

describe('core', () => {
  let pool;

  before(async () => {
    pool = appPool(8);
    await pool.query(`CREATE TABLE IF NOT EXISTS charges (
      id bigserial PRIMARY KEY, key text, amount int, note text)`);
    await pool.query(`CREATE TABLE IF NOT EXISTS effects (
      id bigserial PRIMARY KEY, key text, step text)`);
    await pool.query(`CREATE TABLE IF NOT EXISTS invoices (
      message_id text, batch text)`);
  });
  after(async () => {
    await pool.end();
  });

  const count = async (table, where, values) => Number((await pool.query(
    `SELECT count(*) AS n FROM ${table} WHERE ${where}`, values)).rows[0].n);

  describe('SQL calls', () => {
    it('claim, complete and lookup, with headers and raw bytes', async () => {
      const key = uid();
      await idem.transaction(pool, async (tx) => {
        const c = await idem.claim(tx, key, { request: { a: 1 }, scope: 's', ttl: '1 hour' });
        assert.equal(c.status, 'claimed');
        assert.equal(typeof c.token, 'string');
        assert.ok(c.expiresAt instanceof Date);
        await idem.checkpoint(tx, key, 'half', { scope: 's' });
        await idem.complete(tx, key, {
          status: 201, headers: { 'Content-Type': 'text/csv' }, raw: Buffer.from([1, 2, 255]),
        }, { scope: 's' });
      });
      const again = await idem.claim(pool, key, { request: { a: 1 }, scope: 's' });
      assert.equal(again.status, 'completed');
      assert.equal(again.responseCode, 201);
      assert.deepEqual(again.responseHeaders, { 'Content-Type': 'text/csv' });
      assert.ok(again.responseRaw.equals(Buffer.from([1, 2, 255])));
      assert.equal((await idem.claim(pool, key, { request: { a: 2 }, scope: 's' })).status, 'mismatch');
      const l = await idem.lookup(pool, key, { scope: 's' });
      assert.equal(l.status, 'completed');
      assert.equal(l.recoveryPoint, 'half');
      assert.equal((l.expiresAt - l.claimedAt) / 1000, 3600);
      assert.equal(await idem.lookup(pool, uid(), { scope: 's' }), null);
    });

    it('consumeMessage and consumeMessages', async () => {
      const consumer = uid('c');
      assert.equal(await idem.consumeMessage(pool, consumer, 'm1'), true);
      assert.equal(await idem.consumeMessage(pool, consumer, 'm1'), false);
      assert.deepEqual(await idem.consumeMessages(pool, consumer, ['m1', 'm2', 'm2', 'm3']), ['m2', 'm3']);
      assert.deepEqual(await idem.consumeMessages(pool, consumer, ['m3']), []);
    });
  });

  describe('errors', () => {
    it('2D000: a claim committed neither completed nor released is a ProgrammingError, and rolls back', async () => {
      const key = uid();
      await assert.rejects(idem.transaction(pool, async (tx) => {
        await idem.claim(tx, key);
        await tx.query('INSERT INTO charges (key, amount) VALUES ($1, 1)', [key]);
      }), (err) => err instanceof idem.ProgrammingError && err.code === '2D000');
      assert.equal(await count('charges', 'key = $1', [key]), 0);
      assert.equal(await idem.lookup(pool, key), null);
    });

    it('55006: a stale token is a StaleTokenError', async () => {
      const key = uid();
      const c = await idem.claim(pool, key, { lease: 50 });
      await waitFor('the lease to lapse', async () => (await idem.claim(pool, key, { lease: 60000 })).status === 'claimed');
      await assert.rejects(idem.complete(pool, key, { status: 200 }, { token: c.token }),
        (err) => err instanceof idem.StaleTokenError && err.code === '55006');
    });

    it('55P03: a wait past lock_timeout is a KeyBusyError', async () => {
      const key = uid();
      const holder = await pool.connect();
      try {
        await holder.query('BEGIN');
        await idem.claim(holder, key);
        await assert.rejects(idem.transaction(pool, async (tx) => {
          await tx.query("SET LOCAL lock_timeout = '100ms'");
          await idem.claim(tx, key, { wait: true });
        }), (err) => err instanceof idem.KeyBusyError && err.code === '55P03');
      } finally {
        await holder.query('ROLLBACK');
        holder.release();
      }
    });

    it('54000: a response over max_response_bytes is a ResponseTooLargeError and nothing is kept', async () => {
      const key = uid();
      await assert.rejects(idem.run({ pool, key }, async (tx) => {
        await tx.query('INSERT INTO charges (key, amount) VALUES ($1, 1)', [key]);
        return { status: 200, body: { filler: 'x'.repeat(100 * 1024) } };
      }), (err) => err instanceof idem.ResponseTooLargeError && err.code === '54000');
      assert.equal(await count('charges', 'key = $1', [key]), 0);
      assert.equal(await idem.lookup(pool, key), null);
    });

    for (const code of ['40001', '40P01']) {
      it(`${code}: the transaction runs again`, async () => {
        const key = uid();
        let attempts = 0;
        const out = await idem.run({ pool, key }, async (tx) => {
          attempts++;
          await tx.query('INSERT INTO charges (key, amount) VALUES ($1, 1)', [key]);
          if (attempts === 1) {
            await tx.query(`DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '${code}'; END $$`);
          }
          return { status: 201, body: { attempts } };
        });
        assert.equal(attempts, 2);
        assert.equal(out.stored, true);
        assert.equal(await count('charges', 'key = $1', [key]), 1);
      });
    }

    it('gives up after the retries with a TransientError', async () => {
      await assert.rejects(idem.transaction(pool, async (tx) => {
        await tx.query("DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '40001'; END $$");
      }, { retries: 1 }), (err) => err instanceof idem.TransientError);
    });

    it('an unreachable database is a StoreUnavailableError', async () => {
      const { Pool } = require('pg');
      const bad = new Pool({ host: '/nonexistent-socket-dir', max: 1 });
      await assert.rejects(idem.run({ pool: bad, key: 'k' }, async () => ({})),
        (err) => err instanceof idem.StoreUnavailableError);
      await bad.end();
    });
  });

  describe('run (same transaction)', () => {
    it('stores the response with the business write, and replays it', async () => {
      const key = uid();
      const work = async (tx) => {
        const { rows } = await tx.query('INSERT INTO charges (key, amount) VALUES ($1, 100) RETURNING id', [key]);
        return { status: 201, body: { charge: Number(rows[0].id) } };
      };
      const first = await idem.run({ pool, key, scope: 'acct-1', request: { amount: 100 } }, work);
      assert.equal(first.status, 'claimed');
      assert.equal(first.stored, true);
      const second = await idem.run({ pool, key, scope: 'acct-1', request: { amount: 100 } }, work);
      assert.equal(second.status, 'completed');
      assert.equal(second.replayed, true);
      assert.deepEqual(second.response.body, first.response.body);
      assert.equal((await idem.run({ pool, key, scope: 'acct-1', request: { amount: 5 } }, work)).status, 'mismatch');
      assert.equal(await count('charges', 'key = $1', [key]), 1);
    });

    it('a thrown error or a 5xx answer keeps nothing', async () => {
      const key = uid();
      const insert = (tx) => tx.query('INSERT INTO charges (key, amount) VALUES ($1, 1)', [key]);
      await assert.rejects(idem.run({ pool, key }, async (tx) => {
        await insert(tx);
        throw new Error('boom');
      }), /boom/);
      const five = await idem.run({ pool, key }, async (tx) => {
        await insert(tx);
        return { status: 503 };
      });
      assert.equal(five.stored, false);
      assert.equal(await count('charges', 'key = $1', [key]), 0);
      assert.equal(await idem.lookup(pool, key), null);
      const ok = await idem.run({ pool, key }, async (tx) => {
        await insert(tx);
        return { status: 200 };
      });
      assert.equal(ok.stored, true);
      assert.equal(await count('charges', 'key = $1', [key]), 1);
    });

    it('runs inside the caller\'s transaction, which decides', async () => {
      const key = uid();
      const client = await pool.connect();
      try {
        await assert.rejects(idem.run({ client, key }, async () => ({})),
          (err) => err instanceof idem.ProgrammingError, 'without BEGIN');
        await client.query('BEGIN');
        await client.query('INSERT INTO charges (key, note) VALUES ($1, $2)', [key, 'outer']);
        // a failing block is undone alone, and the transaction goes on
        await assert.rejects(idem.run({ client, key }, async (tx) => {
          await tx.query('INSERT INTO charges (key, note) VALUES ($1, $2)', [key, 'inner-failed']);
          await tx.query('SELECT 1/0');
        }), /division by zero/);
        const out = await idem.run({ client, key }, async (tx) => {
          await tx.query('INSERT INTO charges (key, note) VALUES ($1, $2)', [key, 'inner']);
          return { status: 201, body: { ok: true } };
        });
        assert.equal(out.stored, true);
        await client.query('ROLLBACK');
        assert.equal(await count('charges', 'key = $1', [key]), 0);
        assert.equal(await idem.lookup(pool, key), null, 'rolled back with the caller');
        await client.query('BEGIN');
        await idem.run({ client, key }, async (tx) => {
          await tx.query('INSERT INTO charges (key, note) VALUES ($1, $2)', [key, 'inner']);
          return { status: 201 };
        });
        await client.query('COMMIT');
      } finally {
        client.release();
      }
      assert.deepEqual((await pool.query('SELECT note FROM charges WHERE key = $1', [key])).rows, [{ note: 'inner' }]);
      assert.equal((await idem.lookup(pool, key)).status, 'completed');
    });
  });

  describe('idempotent (a function made to run once per key)', () => {
    it('returns the function\'s value, and for a key done before the stored value without calling it', async () => {
      let calls = 0;
      const charge = idem.idempotent(async (tx, account, amount, ref) => {
        calls++;
        const { rows } = await tx.query('INSERT INTO charges (key, amount) VALUES ($1, $2) RETURNING id', [ref, amount]);
        return { id: Number(rows[0].id), account, amount };
      }, {
        pool,
        key: (account, amount, ref) => ref,
        request: (account, amount) => ({ account, amount }), // not the reference
      });
      const ref = uid();
      const first = await charge('acct-1', 500, ref);
      assert.equal(first.amount, 500);
      assert.deepEqual(await charge('acct-1', 500, ref), first);
      assert.equal(calls, 1);
      assert.equal(await count('charges', 'key = $1', [ref]), 1);
      await assert.rejects(charge('acct-1', 900, ref), idem.KeyMismatchError);
    });

    it('a value that is not JSON is refused, nothing kept; serialize and deserialize store it', async () => {
      const ref = uid();
      const bad = idem.idempotent(async (tx) => {
        await tx.query('INSERT INTO charges (key, amount) VALUES ($1, 1)', [ref]);
        return { at: 10n };
      }, { pool, key: () => ref });
      await assert.rejects(bad(), (err) => err instanceof TypeError && /serialize/.test(err.message));
      assert.equal(await count('charges', 'key = $1', [ref]), 0, 'rolled back');
      const at = new Date('2026-01-02T03:04:05Z');
      const good = idem.idempotent(async () => ({ at }), {
        pool,
        key: () => ref,
        serialize: (v) => ({ at: v.at.toISOString() }),
        deserialize: (j) => ({ at: new Date(j.at) }),
      });
      assert.equal((await good()).at.getTime(), at.getTime());
      const again = await good();
      assert.ok(again.at instanceof Date, 'the replay is deserialized');
      assert.equal(again.at.getTime(), at.getTime());
    });

    it('a key held by a call in flight is KeyInProgressError', async () => {
      const ref = uid();
      let release;
      const held = new Promise((r) => { release = r; });
      let entered;
      const inside = new Promise((r) => { entered = r; });
      const slow = idem.idempotent(async () => {
        entered();
        await held;
        return 'done';
      }, { pool, key: () => ref });
      const first = slow();
      await inside;
      await assert.rejects(slow(), idem.KeyInProgressError);
      release();
      assert.equal(await first, 'done');
      assert.equal(await slow(), 'done');
    });
  });

  describe('twoPhase', () => {
    it('claims and commits, calls out, completes with the token (with beforeComplete\'s writes)', async () => {
      const key = uid();
      let seenInFlight = null;
      const out = await idem.twoPhase({
        pool, key, lease: 30000, request: { amount: 7 },
        beforeComplete: (tx, response) => tx.query('INSERT INTO charges (key, amount) VALUES ($1, $2)',
          [key, response.body.amount]),
      }, async (ctx) => {
        // the claim is committed: visible to others while the call runs
        seenInFlight = (await idem.lookup(pool, key)).status;
        await ctx.checkpoint('provider-called', (tx) => tx.query(
          'INSERT INTO effects (key, step) VALUES ($1, $2)', [key, 'called']));
        return { status: 201, body: { amount: 7 } };
      });
      assert.equal(seenInFlight, 'in_progress');
      assert.equal(out.stored, true);
      const l = await idem.lookup(pool, key);
      assert.equal(l.status, 'completed');
      assert.equal(l.recoveryPoint, 'provider-called');
      assert.deepEqual(l.request, { amount: 7 }, 'kept for idem_recover');
      assert.equal(await count('charges', 'key = $1', [key]), 1);
      assert.equal(await count('effects', 'key = $1', [key]), 1);
      const replay = await idem.twoPhase({ pool, key, lease: 30000, request: { amount: 7 } }, async () => {
        throw new Error('must not run');
      });
      assert.equal(replay.status, 'completed');
    });

    it('releases on failure, so the retry runs fresh with the recovery point', async () => {
      const key = uid();
      await assert.rejects(idem.twoPhase({ pool, key, lease: 30000 }, async (ctx) => {
        await ctx.checkpoint('step-1');
        throw new Error('provider down');
      }), /provider down/);
      assert.equal((await idem.lookup(pool, key)).status, 'released');
      const out = await idem.twoPhase({ pool, key, lease: 30000 }, async (ctx) => ({
        status: 200, body: { from: ctx.recoveryPoint },
      }));
      assert.deepEqual(out.response.body, { from: 'step-1' });
    });

    it('a killed holder is finished by recoverLapsed (idem_recover), and the old token is refused', async () => {
      const key = uid();
      const scope = uid('scope');
      const child = startChild('twophase.js', [key, scope]);
      let token;
      try {
        ({ token } = await child.line((m) => m.checkpointed));
        await child.kill();
      } finally {
        await child.kill();
      }
      assert.equal(await count('effects', 'key = $1', [key]), 1, 'the first step was done once');
      let results = [];
      await waitFor('the lapsed claim recovered', async () => {
        results = await idem.recoverLapsed({ pool, lease: 30000, scope }, async (ctx) => {
          assert.equal(ctx.key, key);
          assert.equal(ctx.recoveryPoint, 'step-1');
          assert.deepEqual(ctx.request, { amount: 42 });
          assert.ok(BigInt(ctx.token) > BigInt(token));
          // finish from the recovery point on: step 1 is not done again
          await ctx.checkpoint('step-2', (tx) => tx.query('INSERT INTO effects (key, step) VALUES ($1, $2)', [key, 'step-2']));
          return { status: 201, body: { recovered: true } };
        });
        return results.length > 0;
      }, { interval: 100 });
      assert.equal(results.length, 1);
      assert.equal(results[0].error, undefined);
      assert.equal(results[0].outcome.stored, true);
      assert.deepEqual((await pool.query('SELECT step FROM effects WHERE key = $1 ORDER BY id', [key])).rows
        .map((r) => r.step), ['step-1', 'step-2']);
      const replay = await idem.claim(pool, key, { scope, request: { amount: 42 } });
      assert.equal(replay.status, 'completed');
      assert.deepEqual(replay.responseBody, { recovered: true });
      await assert.rejects(idem.complete(pool, key, { status: 200 }, { scope, token }),
        (err) => err instanceof idem.StaleTokenError);
    });
  });

  describe('consume', () => {
    it('records a batch with the work, in input order, each id once', async () => {
      const consumer = uid('billing');
      const msgs = [{ id: 'a' }, { id: 'b' }, { id: 'a' }, { id: 'c' }];
      const first = await idem.consume({ pool, consumer }, msgs, async (tx, fresh) => {
        for (const m of fresh) await tx.query('INSERT INTO invoices VALUES ($1, $2)', [m.id, consumer]);
        return fresh.length;
      });
      assert.deepEqual(first.fresh.map((m) => m.id), ['a', 'b', 'c']);
      assert.deepEqual(first.duplicates.map((m) => m.id), ['a']);
      assert.equal(first.result, 3);
      const redelivery = await idem.consume({ pool, consumer }, [{ id: 'b' }, { id: 'd' }], async (tx, fresh) => {
        for (const m of fresh) await tx.query('INSERT INTO invoices VALUES ($1, $2)', [m.id, consumer]);
      });
      assert.deepEqual(redelivery.fresh.map((m) => m.id), ['d']);
      assert.equal(await count('invoices', 'batch = $1', [consumer]), 4);
    });

    it('a failed batch records nothing: the redelivery does the work', async () => {
      const consumer = uid('billing');
      await assert.rejects(idem.consume({ pool, consumer }, ['x', 'y'], async (tx, fresh) => {
        for (const m of fresh) await tx.query('INSERT INTO invoices VALUES ($1, $2)', [m, consumer]);
        throw new Error('crash');
      }), /crash/);
      const again = await idem.consume({ pool, consumer }, ['x', 'y'], async (tx, fresh) => {
        for (const m of fresh) await tx.query('INSERT INTO invoices VALUES ($1, $2)', [m, consumer]);
      });
      assert.deepEqual(again.fresh, ['x', 'y']);
      assert.equal(await count('invoices', 'batch = $1', [consumer]), 2);
    });

    it('concurrent overlapping batches process each id once', async () => {
      const consumer = uid('billing');
      const ids = Array.from({ length: 30 }, (_, i) => `m${i}`);
      const batches = Array.from({ length: 6 }, (_, b) => ids.filter((_, i) => (i + b) % 3 !== 0).reverse());
      await Promise.all(batches.map((batch) => idem.consume({ pool, consumer }, batch, async (tx, fresh) => {
        for (const m of fresh) await tx.query('INSERT INTO invoices VALUES ($1, $2)', [m, consumer]);
      })));
      const { rows } = await pool.query(
        'SELECT message_id, count(*)::int AS n FROM invoices WHERE batch = $1 GROUP BY 1', [consumer]);
      assert.equal(rows.length, 30);
      assert.ok(rows.every((r) => r.n === 1));
    });

    it('runs in the caller\'s transaction', async () => {
      const consumer = uid('billing');
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const r = await idem.consume({ client, consumer }, ['p'], async (tx, fresh) => fresh.length);
        assert.equal(r.result, 1);
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }
      assert.equal(await idem.consumeMessage(pool, consumer, 'p'), true, 'rolled back with the caller');
    });
  });
});

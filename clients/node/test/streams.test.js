'use strict';

// Ordered streams against the real extension: assign, advance, positions and
// sequence, and the stream consumer (one transaction per batch, only the
// records not applied yet, stale generations fenced, concurrent batches of a
// partition serialized).

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { appPool, uid, waitFor } = require('./helpers');
const idem = require('../lib');

const recs = (first, last) => Array.from({ length: last - first + 1 },
  (_, i) => ({ offset: String(first + i), amount: (first + i) * 10 }));
const offs = (records) => records.map((r) => Number(r.offset));
const range = (first, last) => Array.from({ length: last - first + 1 }, (_, i) => first + i);

describe('ordered streams', () => {
  let pool;

  before(async () => {
    pool = appPool(8);
    await pool.query('CREATE TABLE IF NOT EXISTS applied (consumer text, part int, off bigint)');
  });
  after(async () => {
    await pool.end();
  });

  // the offsets applied (committed) for a consumer's partition, repeats kept
  const applied = async (consumer, part = 0) => (await pool.query(
    'SELECT off::int AS off FROM applied WHERE consumer = $1 AND part = $2 ORDER BY off',
    [consumer, part])).rows.map((r) => r.off);

  // a handler that applies each record (one row) and notes what it got
  const writer = (consumer, part, seen) => async (tx, fresh) => {
    seen.push(offs(fresh));
    for (const r of fresh) await tx.query('INSERT INTO applied VALUES ($1, $2, $3)', [consumer, part, r.offset]);
    return fresh.length;
  };

  const position = async (consumer, stream, part = 0) => (await idem.positions(pool, consumer, stream))
    .find((p) => p.part === part);

  describe('SQL calls', () => {
    it('assign returns where to seek; positions lists them', async () => {
      const consumer = uid('c');
      const stream = uid('s');
      assert.deepEqual(await idem.assign(pool, consumer, stream, [2, 0, 1, 0], 1),
        [{ part: 0, nextOffset: null }, { part: 1, nextOffset: null }, { part: 2, nextOffset: null }]);
      assert.deepEqual(await idem.advance(pool, consumer, stream, 0, 0, 9, { generation: 1 }), { first: '0', last: '9' });
      assert.deepEqual(await idem.assign(pool, consumer, stream, [1, 0], 2n),
        [{ part: 0, nextOffset: '10' }, { part: 1, nextOffset: null }]);
      const ps = await idem.positions(pool, consumer, stream);
      assert.deepEqual(ps.map((p) => [p.part, p.nextOffset, p.generation]),
        [[0, '10', '2'], [1, null, '2'], [2, null, '1']]);
      assert.ok(ps.every((p) => p.updatedAt instanceof Date));
      assert.deepEqual(await idem.positions(pool, consumer, uid('other')), []);
      // unfenced, on a partition never assigned: starts at the batch; offsets
      // beyond 2^53 are exact
      assert.deepEqual(await idem.advance(pool, consumer, stream, 7, '9007199254740993', 9007199254740995n),
        { first: '9007199254740993', last: '9007199254740995' });
      const p7 = await position(consumer, stream, 7);
      assert.equal(p7.nextOffset, '9007199254740996');
      assert.equal(p7.generation, null);
    });

    it('advance returns only the part of a batch not applied yet', async () => {
      const consumer = uid('c');
      const stream = uid('s');
      assert.deepEqual(await idem.advance(pool, consumer, stream, 0, 0, 9), { first: '0', last: '9' });
      assert.deepEqual(await idem.advance(pool, consumer, stream, 0, 5, 14), { first: '10', last: '14' });
      assert.equal(await idem.advance(pool, consumer, stream, 0, 3, 8), null);
      assert.equal((await position(consumer, stream)).nextOffset, '15');
    });

    it('sequence: new, duplicate, gap, fenced; a strict gap is SequenceGapError', async () => {
      const consumer = uid('c');
      const seq = (epoch, n, opts) => idem.sequence(pool, consumer, 'producer-1', epoch, n, opts);
      const answers = [];
      for (const [e, n] of [[1, 1], [1, 1], [1, 2], [1, 5], [0, 9], [2, 0]]) answers.push(await seq(e, n));
      assert.deepEqual(answers, ['new', 'duplicate', 'new', 'gap', 'fenced', 'new']);
      await assert.rejects(seq(2, 5, { strict: true }), (err) => {
        assert.ok(err instanceof idem.SequenceGapError);
        assert.ok(err instanceof idem.IdempotencyError);
        assert.equal(err.code, 'ID002');
        return true;
      });
      // the refused one recorded nothing; a rolled-back answer neither
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        assert.equal(await idem.sequence(client, consumer, 'producer-1', 2, 1, { strict: true }), 'new');
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }
      assert.equal(await seq(2, 1, { strict: true }), 'new');
      assert.equal(await seq(2, 1), 'duplicate');
    });

    it('bad arguments are refused before any SQL', async () => {
      await assert.rejects(idem.assign(pool, 'c', 's', [0, 1.5], 1), TypeError);
      await assert.rejects(idem.assign(pool, 'c', 's', 0, 1), TypeError);
      await assert.rejects(idem.advance(pool, 'c', 's', 0, 2 ** 60, 2 ** 61), TypeError);
      await assert.rejects(idem.sequence(pool, 'c', 'p', 1, 'x'), TypeError);
    });
  });

  describe('streamConsumer', () => {
    it('hands the function only the records not applied yet', async () => {
      const consumer = uid('c');
      const stream = uid('s');
      const sc = idem.streamConsumer({ pool, consumer, stream });
      assert.deepEqual(await sc.assign([0], 7), [{ part: 0, nextOffset: null }]);
      const seen = [];
      const h = writer(consumer, 0, seen);
      const first = await sc.process(0, recs(0, 9), h);
      assert.deepEqual(offs(first.fresh), range(0, 9));
      assert.equal(first.result, 10);
      // a redelivery overlapping the last batch: only 10..14 are new
      const second = await sc.process(0, recs(5, 14), h);
      assert.deepEqual(second.range, { first: '10', last: '14' });
      assert.deepEqual(offs(second.fresh), range(10, 14));
      assert.deepEqual(seen, [range(0, 9), range(10, 14)]);
      // all old: the function is not called
      assert.deepEqual(await sc.process(0, recs(3, 8), h), { fresh: [], range: null, result: undefined });
      assert.equal(seen.length, 2);
      // offsets may skip (a compacted log); numbers, strings and bigints
      const sparse = [{ offset: 15 }, { offset: '17' }, { offset: 20n }];
      assert.deepEqual((await sc.process(0, sparse, h)).fresh, sparse);
      assert.deepEqual(await sc.process(0, [], h), { fresh: [], range: null, result: undefined });
      assert.deepEqual(await applied(consumer), [...range(0, 14), 15, 17, 20]);
      assert.deepEqual((await sc.positions()).map((p) => [p.part, p.nextOffset, p.generation]), [[0, '21', '7']]);
      // after a restart: seek to the next offset
      const again = idem.streamConsumer({ pool, consumer, stream, offset: (n) => n });
      assert.deepEqual(await again.assign([0, 1], 8), [{ part: 0, nextOffset: '21' }, { part: 1, nextOffset: null }]);
      assert.deepEqual((await again.process(0, [20, 21, 22])).fresh, [21, 22]);
    });

    it('a rolled-back batch is delivered again: the position did not move', async () => {
      const consumer = uid('c');
      const stream = uid('s');
      const sc = idem.streamConsumer({ pool, consumer, stream });
      await sc.assign([0], 1);
      const seen = [];
      const h = writer(consumer, 0, seen);
      await sc.process(0, recs(0, 4), h);
      await assert.rejects(sc.process(0, recs(5, 9), async (tx, fresh) => {
        await h(tx, fresh);
        throw new Error('crash mid-batch');
      }), /crash mid-batch/);
      assert.equal((await position(consumer, stream)).nextOffset, '5');
      assert.deepEqual(await applied(consumer), range(0, 4));
      // in the caller's transaction ({ client }), rolled back by the caller
      const client = await pool.connect();
      try {
        const inTx = idem.streamConsumer({ client, consumer, stream, generation: 1 });
        await client.query('BEGIN');
        assert.deepEqual(offs((await inTx.process(0, recs(5, 9), h)).fresh), range(5, 9));
        await client.query('ROLLBACK');
        // { client } outside a transaction is refused, and advances nothing
        await assert.rejects(inTx.process(0, recs(5, 9), h), idem.ProgrammingError);
      } finally {
        client.release();
      }
      assert.equal((await position(consumer, stream)).nextOffset, '5');
      // the redelivery applies the whole batch, once
      assert.deepEqual(offs((await sc.process(0, recs(5, 9), h)).fresh), range(5, 9));
      assert.deepEqual(await applied(consumer), range(0, 9));
    });

    it('a lower generation is refused with StaleGenerationError and changes nothing', async () => {
      const consumer = uid('c');
      const stream = uid('s');
      const seen = [];
      const zombie = idem.streamConsumer({ pool, consumer, stream });
      await zombie.assign([0, 1], 1);
      await zombie.process(0, recs(0, 4), writer(consumer, 0, seen));
      // a rebalance gives partition 0 to another consumer
      const successor = idem.streamConsumer({ pool, consumer, stream });
      assert.deepEqual(await successor.assign([0], 2), [{ part: 0, nextOffset: '5' }]);
      let ran = false;
      await assert.rejects(zombie.process(0, recs(5, 9), async () => { ran = true; }), (err) => {
        assert.ok(err instanceof idem.StaleGenerationError);
        assert.equal(err.code, 'ID001');
        return true;
      });
      assert.equal(ran, false);
      const p = await position(consumer, stream);
      assert.deepEqual([p.nextOffset, p.generation], ['5', '2']);
      // re-assigning with the old generation is refused, partition 1 included
      await assert.rejects(zombie.assign([0, 1], 1), idem.StaleGenerationError);
      assert.equal((await position(consumer, stream, 1)).generation, '1');
      // the core call, in the caller's transaction, which rolls back
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        await client.query('INSERT INTO applied VALUES ($1, 0, 99)', [consumer]);
        await assert.rejects(idem.advance(client, consumer, stream, 0, 5, 9, { generation: 1 }),
          idem.StaleGenerationError);
        await client.query('ROLLBACK');
      } finally {
        client.release();
      }
      assert.deepEqual(await applied(consumer), range(0, 4));
      // fencing is per partition: the zombie still owns partition 1
      assert.deepEqual(offs((await zombie.process(1, recs(0, 2), writer(consumer, 1, seen))).fresh), [0, 1, 2]);
      // the successor goes on from the position
      assert.deepEqual(offs((await successor.process(0, recs(5, 9), writer(consumer, 0, seen))).fresh), range(5, 9));
      assert.deepEqual(await applied(consumer), range(0, 9));
    });

    it('concurrent batches of one partition wait for each other: no offset is applied twice', async () => {
      const consumer = uid('c');
      const stream = uid('s');
      const a = idem.streamConsumer({ pool, consumer, stream });
      await a.assign([0], 1);
      const cb = await pool.connect();
      try {
        const pidB = (await cb.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
        const b = idem.streamConsumer({ client: cb, consumer, stream, generation: 1 });
        const seenA = [];
        const seenB = [];
        let inA;
        const reachedA = new Promise((resolve) => { inA = resolve; });
        let goA;
        const released = new Promise((resolve) => { goA = resolve; });
        const pa = a.process(0, recs(0, 9), async (tx, fresh) => {
          await writer(consumer, 0, seenA)(tx, fresh);
          inA();
          await released;
        });
        pa.catch(() => inA());
        await reachedA;
        await cb.query('BEGIN');
        let bDone = false;
        const pb = b.process(0, recs(5, 14), writer(consumer, 0, seenB))
          .then(async (r) => { await cb.query('COMMIT'); return r; })
          .finally(() => { bDone = true; });
        let waited = false;
        try {
          await waitFor('b waiting for a\'s lock on the partition', async () => {
            const { rows } = await pool.query('SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1', [pidB]);
            waited = rows.length === 1 && rows[0].wait_event_type === 'Lock';
            return waited || bDone;
          });
        } finally {
          goA();
        }
        const [ra, rb] = await Promise.all([pa, pb]);
        assert.ok(waited, 'b\'s batch did not wait for a\'s uncommitted one');
        assert.deepEqual(offs(ra.fresh), range(0, 9));
        assert.deepEqual(offs(rb.fresh), range(10, 14));
        assert.deepEqual(seenB, [range(10, 14)]);
      } finally {
        cb.release();
      }
      assert.deepEqual(await applied(consumer), range(0, 14));
      assert.equal((await position(consumer, stream)).nextOffset, '15');
    });
  });
});

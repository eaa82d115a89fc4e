// Type-checked (tsc -p test/types), never run: the declarations of
// pg-idempotency against the uses the README shows, through the package's
// own "exports" (a self-reference, as an installed package resolves).

import express from 'express';
import Fastify from 'fastify';
import { Pool } from 'pg';
import {
  run, twoPhase, recoverLapsed, consume, consumeMessage, consumeMessages, claim, complete, lookup, transaction,
  StaleTokenError, ResponseTooLargeError, Outcome,
  assign, advance, positions, sequence, streamConsumer, StreamConsumer, StaleGenerationError, SequenceGapError,
  Seek, OffsetRange, Position, SequenceAnswer, Tenant, StreamTenantOptions, idempotent, KeyMismatchError, ConfigurationError,
} from 'pg-idempotency';
import { idempotency, webhookReceiver } from 'pg-idempotency/express';
import { fastifyIdempotency, webhookReceiver as fastifyWebhookReceiver } from 'pg-idempotency/fastify';
import {
  publish, OutboxRelay, webhookSink, redisStreamSink, verifyWebhook, receiveWebhook, generateSecret,
  DeadLetterError, OutboxLostError, WebhookVerificationError, RelayRound,
  outboxNext, outboxAck, outboxDeadLetter, OutboxEvent,
} from 'pg-idempotency';

const pool = new Pool();

async function core(): Promise<void> {
  const out: Outcome = await run({ pool, key: 'k', scope: 'acct-1', request: { amount: 1 } }, async (tx, ctx) => {
    await tx.query('INSERT INTO charges (amount) VALUES ($1)', [1]);
    await ctx.checkpoint('inserted');
    return { status: 201, body: { ok: true } };
  });
  if (out.replayed && out.response) console.log(out.response.status, out.response.body);

  const client = await pool.connect();
  await client.query('BEGIN');
  await run({ client, key: 'k2' }, async () => ({ status: 200 }));
  await client.query('COMMIT');
  client.release();

  await twoPhase({
    pool, key: 'order-7', lease: '30 seconds', request: { amount: 5 },
    beforeComplete: async (tx, response) => tx.query('UPDATE orders SET status = $1', [response.status]),
  }, async (ctx) => {
    await ctx.checkpoint('charged', (tx) => tx.query('SELECT 1'));
    return { status: 201, raw: Buffer.from('ok'), headers: { 'content-type': 'text/plain' } };
  });

  const results = await recoverLapsed({ pool, lease: 30000, maxKeys: 5 }, async (ctx) => ({ status: 200, body: ctx.request }));
  for (const r of results) if (r.error) console.error(r.key, r.error);

  const batch = await consume({ pool, consumer: 'billing' }, [{ id: 'm1', amount: 3 }], async (tx, fresh) => {
    for (const m of fresh) await tx.query('INSERT INTO invoices (amount) VALUES ($1)', [m.amount]);
    return fresh.length;
  });
  const n: number | undefined = batch.result;
  console.log(n);
  // a ledger distributed by Citus: the batch's tenant
  await consume({ pool, consumer: 'billing', tenant: 'acct-1' }, ['m2'], async () => undefined);
  await consumeMessage(pool, 'billing', 'm3', { ttl: '1 day', tenant: 42 });
  const ids: string[] = await consumeMessages(pool, 'billing', ['m4'], { tenant: 7n });
  void ids;

  const c = await claim(pool, 'k3', { lease: 1000, keepRequest: true, request: null });
  try {
    await complete(pool, 'k3', { status: 200 }, { token: c.token });
  } catch (err) {
    if (err instanceof StaleTokenError || err instanceof ResponseTooLargeError) console.error(err.code);
  }
  const l = await lookup(pool, 'k3');
  if (l && l.status !== 'expired') console.log(l.expiresAt.getTime() - l.claimedAt.getTime());
  else if (l) console.log(l.status, l.token === null);
  await transaction(pool, async (tx) => tx.query('SELECT 1'), { isolationLevel: 'serializable', retries: 5 });
}

interface LogRecord { offset: string; value: Buffer }

async function streams(generation: number, records: LogRecord[]): Promise<void> {
  const sc = streamConsumer<LogRecord>({ pool, consumer: 'billing', stream: 'orders' });
  const seeks: Seek[] = await sc.assign([0, 1], generation);
  for (const s of seeks) console.log(s.part, s.nextOffset === null ? 'earliest' : BigInt(s.nextOffset));
  try {
    const out = await sc.process(0, records, async (tx, fresh, { range }) => {
      for (const r of fresh) await tx.query('INSERT INTO invoices (body) VALUES ($1)', [r.value]);
      return range.last;
    });
    const last: string | undefined = out.result;
    const fresh: LogRecord[] = out.fresh;
    console.log(last, fresh.length, out.range?.first);
  } catch (err) {
    if (err instanceof StaleGenerationError) console.error('lost the partition', err.code);
  }
  const ps: Position[] = await sc.positions();
  console.log(ps.map((p) => [p.part, p.nextOffset, p.generation, p.updatedAt.getTime()]));
  const typed: StreamConsumer<number> = new StreamConsumer<number>({
    pool, consumer: 'c', stream: 's', offset: (n) => n, generation: 3n, retries: 1,
  });
  await typed.process(0, [1, 2, 3]);
  // stream positions distributed by Citus: the consumer's tenant
  const tenanted = streamConsumer<LogRecord>({ pool, consumer: 'billing', stream: 'orders', tenant: 'acct-1' });
  const t: Tenant | null = tenanted.tenant;
  console.log(t, (await tenanted.positions()).length);
  new StreamConsumer<number>({ pool, consumer: 'c', stream: 's', tenant: 42n, offset: (n) => n });

  const client = await pool.connect();
  await client.query('BEGIN');
  await assign(client, 'c', 's', [0], '7');
  const r: OffsetRange | null = await advance(client, 'c', 's', 0, 10, 19n, { generation: 7 });
  if (r) console.log(BigInt(r.last) - BigInt(r.first));
  await positions(client, 'c', 's');
  await assign(client, 'c', 's', [0], 8, { tenant: 'acct-1' });
  await advance(client, 'c', 's', 0, 20, 29, { generation: null, tenant: 7 });
  const tp: Position[] = await positions(client, 'c', 's', { tenant: 9007199254740993n });
  console.log(tp.length);
  await sequence(client, 'c', 'producer-1', 1, 43, { strict: false, tenant: 'acct-1' });
  const opts: StreamTenantOptions = { tenant: null };
  await positions(client, 'c', 's', opts);
  // @ts-expect-error a tenant is a string or an integer
  await positions(client, 'c', 's', { tenant: true });
  try {
    const a: SequenceAnswer = await sequence(client, 'c', 'producer-1', 1, '42', { strict: true });
    if (a === 'new' || a === 'gap') console.log('process');
  } catch (err) {
    if (err instanceof SequenceGapError) console.error(err.code);
  }
  await client.query('COMMIT');
  client.release();
}

const app = express();
const mw = idempotency({
  pool, ttl: '24 hours', wait: 5000, timeoutStatus: 503, replayHeaders: ['x-request-id'], serverErrors: 'release',
  fingerprintFields: ['amount', 'currency'], caller: (req) => req.user?.id, anonymous: false, maxKeyBytes: 255,
});
const hook = idempotency({ pool, key: (req) => req.get('webhook-id'), docsUrl: 'https://docs.example/idempotency' });
void hook;
const charge = idempotent(async (tx, account: string, amount: number) => {
  await tx.query('SELECT 1');
  return { account, amount, at: new Date() };
}, {
  pool, key: (account, amount) => `${account}-${amount}`, serialize: (v) => ({ ...v, at: v.at.toISOString() }),
  deserialize: (j) => ({ ...j, at: new Date(j.at) }),
});
void charge('acct-1', 5).then((r) => r.at.getTime()).catch((e) => e instanceof KeyMismatchError || e instanceof ConfigurationError);
app.get('/docs/idempotency', mw.docs);
app.post('/orders', express.json(), mw, async (req, res) => {
  const tx = req.idempotency?.tx;
  if (!tx) throw new Error('no transaction');
  const { rows } = await tx.query<{ id: string }>('INSERT INTO orders (item) VALUES ($1) RETURNING id', [req.body.item]);
  res.status(201).json({ id: rows[0].id });
});

const fastify = Fastify();
fastify.register(fastifyIdempotency, { pool, docsRoute: '/docs/idempotency', lease: null });
fastify.post('/orders', { config: { idempotency: { wait: 1000 } } }, async (request, reply) => {
  const ctx = request.idempotency;
  if (!ctx || !ctx.tx) throw new Error('no transaction');
  await ctx.tx.query('SELECT 1');
  return reply.code(201).send({ key: ctx.key });
});

async function outbox(): Promise<void> {
  await transaction(pool, async (tx) => {
    const id: string = await publish(tx, 'orders', { payload: { order: 1 }, key: 'order-1' });
    return id;
  });
  const secret = generateSecret();
  const relay = new OutboxRelay({
    pool, relay: 'shipping', topic: 'orders', generation: 3, onDeadLetter: 'stop',
    sink: webhookSink({ url: 'http://127.0.0.1:1/hooks', secret }),
  });
  const round: RelayRound = await relay.runOnce();
  void round.batch;
  relay.stop();
  await relay.run().catch((e) => e instanceof DeadLetterError || e instanceof OutboxLostError);
  // the tenant outbox distributed by Citus: published with the tenant, relayed
  // on the coordinator for every tenant
  await publish(pool, 'orders', { payload: { order: 2 }, tenant: 'acct-1' });
  await publish(pool, 'orders', { payload: { order: 3 }, tenant: 42n });
  const tenants = new OutboxRelay({
    pool, relay: 'shipping', topic: 'orders', tenants: true,
    sink: async (event: OutboxEvent) => { console.log(event.eventId, event.tenant, event.seq); },
  });
  const all: boolean = tenants.tenants;
  void all;
  const b = await outboxNext(pool, 'shipping', 'orders', { tenants: true, maxEvents: 10 });
  const seq: string | null | undefined = b.events[0].seq;
  void seq;
  if (b.batch !== null) await outboxAck(pool, 'shipping', 'orders', b.batch, { tenants: true });
  await outboxDeadLetter(pool, 'one', 'orders', 'x', { reason: 'gone', tenant: 'acct-1' });
  // @ts-expect-error a tenant is a string or an integer
  await publish(pool, 'orders', { tenant: true });
  // @ts-expect-error tenants is a boolean
  void new OutboxRelay({ pool, relay: 'r', topic: 'orders', sink: async () => undefined, tenants: 'acct-1' });
  // @ts-expect-error one tenant or every tenant, not both
  await outboxNext(pool, 'shipping', 'orders', { tenants: true, tenant: 'acct-1' });
  void redisStreamSink({ client: {}, stream: 'orders' });
  try {
    verifyWebhook([secret], { 'webhook-id': 'x' }, Buffer.from(''));
  } catch (e) {
    if (e instanceof WebhookVerificationError) void e.status;
  }
  const r = await receiveWebhook({ pool, consumer: 'c', secret }, { headers: {}, body: '' }, async (tx, event) => {
    await tx.query('SELECT $1', [event.id]);
    return event.json();
  });
  void r.duplicate;
  await receiveWebhook({ pool, consumer: 'c', secret, tenant: (event) => event.json().tenant },
    { headers: {}, body: '' }, async () => undefined);
  const app2 = express();
  app2.post('/hooks/:tenant', webhookReceiver({ pool, consumer: 'shipping', secret, tenant: (event, req) => String(req.params.tenant) },
    async () => undefined));
  app2.post('/hooks', webhookReceiver({ pool, consumer: 'shipping', secret }, async (tx, event) => {
    await tx.query('INSERT INTO shipments VALUES ($1)', [event.json().order]);
  }));
  const f2 = Fastify();
  f2.register(fastifyWebhookReceiver, {
    url: '/hooks', pool, consumer: 'shipping', secret,
    handler: async (tx, event) => { await tx.query('SELECT $1', [event.id]); },
  });
  f2.register(fastifyWebhookReceiver, {
    url: '/hooks/:tenant', pool, consumer: 'shipping', secret,
    tenant: (event, request) => (request.params as { tenant: string }).tenant,
    handler: async () => undefined,
  });
}

void core;
void outbox;
void streams;

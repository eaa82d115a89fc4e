// The same package imported from an ES module (type-checked only).
import {
  run, HttpIdempotency, parseIdempotencyKey, streamConsumer, StaleGenerationError, publish, OutboxRelay, webhookSink,
} from 'pg-idempotency';
import { idempotency } from 'pg-idempotency/express';
import { fastifyIdempotency } from 'pg-idempotency/fastify';
import pg from 'pg';

const pool = new pg.Pool();
const engine = new HttpIdempotency({ pool });
const key: string = parseIdempotencyKey(['"abc"']);
void run({ pool, key }, async () => undefined);
void idempotency(engine);
void fastifyIdempotency;
void streamConsumer({ pool, consumer: 'c', stream: 's' }).assign([0], 1);
void StaleGenerationError;
void publish(pool, 'orders', { payload: { order: 1 } });
void new OutboxRelay({ pool, relay: 'r', topic: 'orders', sink: webhookSink({ url: 'http://127.0.0.1:1/', secret: 'whsec_AAAA' }) });

// Express 5 middleware of pg-idempotency (TypeScript users: @types/express).

import type { RequestHandler } from 'express';
import type {
  HttpOptions, HttpIdempotency, IdempotencyContext, ReceiveWebhookOptions, Tenant, TenantAnswer, WebhookEvent,
} from './index';
import type { PoolClient } from 'pg';

export { HttpIdempotency } from './index';

export interface IdempotencyMiddleware extends RequestHandler {
  readonly engine: HttpIdempotency;
  /** GET handler that publishes the policy: mount it at options.docsUrl. */
  readonly docs: RequestHandler;
}

export function idempotency(options: HttpOptions | HttpIdempotency): IdempotencyMiddleware;

export interface WebhookReceiverOptions extends Omit<ReceiveWebhookOptions, 'tenant'> {
  /** bytes (1 MiB) */
  limit?: number;
  /** The delivery's tenant, or a function of the verified event and the request giving it (for a message ledger distributed by Citus). */
  tenant?: Tenant | null | ((event: WebhookEvent, req: import('express').Request) => TenantAnswer);
}
/** A Standard Webhooks receiver: the handler runs once per webhook-id, in the transaction that records it. */
export function webhookReceiver(options: WebhookReceiverOptions,
  handler: (tx: PoolClient, event: WebhookEvent, req: import('express').Request) => unknown): RequestHandler;

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** Set by pg-idempotency's middleware on the routes it runs on. */
      idempotency?: IdempotencyContext;
    }
  }
}

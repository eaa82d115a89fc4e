// Fastify 5 plugin of pg-idempotency.

import type { FastifyPluginCallback } from 'fastify';
import type { HttpOptions, IdempotencyContext, ReceiveWebhookOptions, Tenant, TenantAnswer, WebhookEvent } from './index';
import type { FastifyRequest } from 'fastify';
import type { PoolClient } from 'pg';

export { HttpIdempotency } from './index';

export interface FastifyIdempotencyOptions extends HttpOptions {
  /** Path of the GET route that publishes the policy (default: docsUrl when it is a path, else none); false: none. */
  docsRoute?: string | false;
}

export const fastifyIdempotency: FastifyPluginCallback<FastifyIdempotencyOptions>;

export interface WebhookReceiverOptions extends Omit<ReceiveWebhookOptions, 'tenant'> {
  url?: string;
  bodyLimit?: number;
  /** The delivery's tenant, or a function of the verified event and the request giving it (for a message ledger distributed by Citus). */
  tenant?: Tenant | null | ((event: WebhookEvent, request: FastifyRequest) => TenantAnswer);
  handler: (tx: PoolClient, event: WebhookEvent, request: FastifyRequest) => unknown;
}
/** A POST route receiving Standard Webhooks: the handler runs once per webhook-id, in the transaction that records it. */
export const webhookReceiver: FastifyPluginCallback<WebhookReceiverOptions>;

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by pg-idempotency on the routes that opt in; null elsewhere. */
    idempotency: IdempotencyContext | null;
  }
  interface FastifyContextConfig {
    /** true, or options that override the plugin's for this route. */
    idempotency?: boolean | Partial<HttpOptions>;
  }
}

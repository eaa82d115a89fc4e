// Fastify 5 plugin of pg-idempotency.

import type { FastifyPluginCallback } from 'fastify';
import type { HttpOptions, IdempotencyContext } from './index';

export { HttpIdempotency } from './index';

export interface FastifyIdempotencyOptions extends HttpOptions {
  /** Path of the GET route that publishes the policy (default: docsUrl when it is a path, else none); false: none. */
  docsRoute?: string | false;
}

export const fastifyIdempotency: FastifyPluginCallback<FastifyIdempotencyOptions>;

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

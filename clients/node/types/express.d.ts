// Express 5 middleware of pg-idempotency (TypeScript users: @types/express).

import type { RequestHandler } from 'express';
import type { HttpOptions, HttpIdempotency, IdempotencyContext } from './index';

export { HttpIdempotency } from './index';

export interface IdempotencyMiddleware extends RequestHandler {
  readonly engine: HttpIdempotency;
  /** GET handler that publishes the policy: mount it at options.docsUrl. */
  readonly docs: RequestHandler;
}

export function idempotency(options: HttpOptions | HttpIdempotency): IdempotencyMiddleware;

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** Set by pg-idempotency's middleware on the routes it runs on. */
      idempotency?: IdempotencyContext;
    }
  }
}

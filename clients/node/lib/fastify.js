'use strict';

// Fastify 5 plugin: fastify.register(fastifyIdempotency, options), then
// opt routes in with { config: { idempotency: true } } (or an object of
// options for that route).  The claim is made in preHandler, after the body
// is parsed and after onRequest/preValidation authentication (request.user
// is the default caller).  For a claimed key the handler finds the open
// transaction in request.idempotency.tx; the reply is stored in onSend,
// before it is sent, and the transaction committed.  See README.md and
// ../http-behaviour.md.

const { HttpIdempotency } = require('./http');

const kState = Symbol('pg-idempotency');

async function payloadToBuffer(payload) {
  if (payload === undefined || payload === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8');
  if (payload instanceof Uint8Array) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  if (typeof payload.pipe === 'function' || typeof payload[Symbol.asyncIterator] === 'function') {
    const chunks = [];
    for await (const chunk of payload) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
    return Buffer.concat(chunks);
  }
  return Buffer.from(String(payload));
}

function sendReply(reply, out) {
  reply.code(out.status);
  reply.headers(out.headers || {});
  return reply.send(out.body);
}

function fastifyIdempotency(fastify, options, done) {
  const base = new HttpIdempotency(options);
  const perRoute = new WeakMap();
  const engineFor = (cfg) => {
    if (cfg === true) return base;
    let engine = perRoute.get(cfg);
    if (!engine) {
      engine = new HttpIdempotency({ ...options, ...cfg });
      perRoute.set(cfg, engine);
    }
    return engine;
  };

  fastify.decorateRequest('idempotency', null);

  fastify.addHook('preHandler', async (request, reply) => {
    const config = request.routeOptions && request.routeOptions.config;
    const cfg = config && config.idempotency;
    if (!cfg) return undefined;
    const engine = engineFor(cfg);
    if (!engine.applies(request.method)) return undefined;
    const r = await engine.begin({
      req: request,
      method: request.method,
      url: request.url,
      route: request.routeOptions && request.routeOptions.url,
      keyValues: request.raw.headersDistinct[engine.header.toLowerCase()],
      contentType: request.headers['content-type'],
    });
    if (r.reply) {
      sendReply(reply, r.reply);
      return reply;
    }
    request.idempotency = r.session.view;
    request[kState] = { engine, session: r.session };
    return undefined;
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const state = request[kState];
    if (!state || state.session.done) return payload;
    const body = await payloadToBuffer(payload);
    const captured = { status: reply.statusCode, headers: reply.getHeaders(), body };
    const out = await state.engine.finish(state.session, captured);
    if (out === captured) return body;
    for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
    reply.code(out.status);
    reply.headers(out.headers);
    return out.body;
  });

  // a reply that never went through onSend (hijacked, or the connection
  // failed): roll back / give the claim up
  fastify.addHook('onResponse', async (request) => {
    const state = request[kState];
    if (state && !state.session.done) await state.engine.abandon(state.session);
  });

  const docsRoute = options.docsRoute === undefined
    ? (typeof base.docsUrl === 'string' && base.docsUrl.startsWith('/') ? base.docsUrl : false)
    : options.docsRoute;
  if (docsRoute) {
    fastify.get(docsRoute, async () => base.docs());
  }
  done();
}

// what fastify-plugin does: the hooks apply to every route of the instance
// the plugin is registered on, not only to those registered inside it
fastifyIdempotency[Symbol.for('skip-override')] = true;
fastifyIdempotency[Symbol.for('fastify.display-name')] = 'pg-idempotency';

exports.fastifyIdempotency = fastifyIdempotency;
exports.HttpIdempotency = HttpIdempotency;

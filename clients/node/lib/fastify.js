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
const { answerWebhook, requestTenant, secretKey } = require('./webhooks');

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

// fastify.register(webhookReceiver, { url, pool, consumer, secret, handler,
// tolerance, bodyLimit, tenant, onError }): a POST route at url that
// verifies a Standard Webhooks delivery and runs handler(tx, event, request)
// once per webhook-id, in the transaction that records it
// (../outbox-behaviour.md); tenant, a value or (event, request) => value: the
// tenant whose shard records the id, for a message ledger distributed by
// Citus.
// The route reads its body as bytes (a parser of its own, in the plugin's
// encapsulated context: the app's other routes keep theirs).
function webhookReceiver(fastify, options, done) {
  if (!options || typeof options.consumer !== 'string') throw new TypeError('webhookReceiver needs { consumer }');
  if (options.secret === undefined) throw new TypeError('webhookReceiver needs { secret }');
  if (!options.pool && !options.client) throw new TypeError('webhookReceiver needs { pool }');
  if (typeof options.handler !== 'function') throw new TypeError('webhookReceiver needs { handler: (tx, event, request) => ... }');
  // a bad secret fails here, not at the first webhook
  for (const k of Array.isArray(options.secret) ? options.secret : [options.secret]) secretKey(k);
  const onError = options.onError || ((err) => fastify.log.error({ err }, 'pg-idempotency webhook receiver'));
  fastify.removeAllContentTypeParsers();
  fastify.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: options.bodyLimit },
    (request, body, next) => next(null, body));
  fastify.post(options.url || '/', async (request, reply) => {
    const body = request.body === undefined || request.body === null ? Buffer.alloc(0) : request.body;
    const out = await answerWebhook({ ...options, onError, tenant: requestTenant(options.tenant, request) },
      { headers: request.headers, headersDistinct: request.raw.headersDistinct, body },
      (tx, event) => options.handler(tx, event, request));
    return sendReply(reply, out);
  });
  done();
}

exports.fastifyIdempotency = fastifyIdempotency;
exports.webhookReceiver = webhookReceiver;
exports.HttpIdempotency = HttpIdempotency;

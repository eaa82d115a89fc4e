'use strict';

// Shared by the tests: pools (the application role from the PG* environment
// that test.sh sets, and the cluster's superuser for inspection), a raw HTTP
// client that can send two header fields of one name, waiting on
// conditions (never on fixed delays), and gates that hold a handler until
// the test lets it go.

const http = require('node:http');
const crypto = require('node:crypto');
const { Pool } = require('pg');

// How long a condition may take to become true: a bound for a hung test,
// not a guess at how fast the machine is.
const WAIT_MS = Number(process.env.IDEM_TEST_WAIT_MS || 120000);

function appPool(max = 10) {
  return new Pool({ max });
}

// the application role's pool with SCHEMA first on its search_path, before
// pg_catalog, where the extension's functions are: the conformance fakes
// and spies stand in for them there
function schemaPool(schema, max) {
  return new Pool({ max, options: `-c search_path=${schema},pg_catalog,public` });
}

// an HTTP server on 127.0.0.1, port 0 → { url, close }
function listen(handler) {
  return new Promise((resolve) => {
    const server = http.createServer(handler);
    server.listen(0, '127.0.0.1', () => {
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
      });
    });
  });
}

function adminPool() {
  return new Pool({ max: 2, user: process.env.IDEM_ADMIN_USER });
}

function uid(prefix = 'k') {
  return `${prefix}-${crypto.randomUUID()}`;
}

// request(url, { method, headers, body }) → { status, headers, body, text, json }
// headers: an object whose array values are sent as separate field lines.
function request(url, { method = 'POST', headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    let payload = body;
    const h = { ...headers };
    if (payload !== undefined && !Buffer.isBuffer(payload) && typeof payload !== 'string') {
      payload = JSON.stringify(payload);
      if (!Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) h['content-type'] = 'application/json';
    }
    const req = http.request(url, { method, headers: h, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const buf = Buffer.concat(chunks);
        resolve({
          status: res.statusCode,
          headers: res.headers,
          distinct: res.headersDistinct,
          body: buf,
          text: buf.toString('utf8'),
          json() {
            return JSON.parse(buf.toString('utf8'));
          },
        });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

async function waitFor(what, fn, { timeout = WAIT_MS, interval = 20 } = {}) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

// Gates, by name: a handler calls `await gates.reach(name)`, which resolves
// once the test calls gates.open(name); gates.reached(name) resolves when a
// handler got there.
function makeGates() {
  const entries = new Map();
  const get = (name) => {
    let e = entries.get(name);
    if (!e) {
      e = {};
      e.opened = new Promise((r) => { e.open = r; });
      e.arrived = new Promise((r) => { e.arrive = r; });
      e.count = 0;
      entries.set(name, e);
    }
    return e;
  };
  return {
    reach(name) {
      const e = get(name);
      e.count++;
      e.arrive();
      return e.opened;
    },
    reached(name) {
      return get(name).arrived;
    },
    open(name) {
      get(name).open();
    },
    count(name) {
      return get(name).count;
    },
  };
}

module.exports = {
  appPool, schemaPool, adminPool, listen, uid, request, waitFor, makeGates, WAIT_MS,
};

'use strict';

// Packaging: `npm pack` makes a tarball that installs into a scratch app (in
// a temporary directory), where the README's quickstarts (the frameworks' and
// the stream consumer's), taken from the README inside the tarball, run as
// written against the extension; the package also imports from an ES module,
// and its declarations type-check from the installed copy.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const net = require('node:net');
const { execFileSync, spawn } = require('node:child_process');
const { Client } = require('pg');
const { adminPool, uid, request, waitFor } = require('./helpers');

const PKG_DIR = path.resolve(__dirname, '..');
const NPM = process.platform === 'win32' ? 'npm.cmd' : 'npm';

function sh(cmd, args, opts = {}) {
  return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], ...opts });
}

function installedVersion(name) {
  return JSON.parse(fs.readFileSync(path.join(PKG_DIR, 'node_modules', name, 'package.json'), 'utf8')).version;
}

// The code block that follows <!-- quickstart:NAME --> (or the marker) in a
// README.
function quickstart(readme, name, marker = new RegExp(`<!-- quickstart:${name} -->`)) {
  const m = new RegExp(`${marker.source}\\s*\`\`\`[a-z]*\\n([\\s\\S]*?)\`\`\``).exec(readme);
  assert.ok(m, `README has the ${name} quickstart`);
  return m[1];
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

describe('npm pack, installed into a scratch app', () => {
  let dir;
  let tarball;
  let readme;
  let admin;
  const db = `quickstart_${uid('db').replace(/[^a-z0-9]/gi, '_').toLowerCase()}`.slice(0, 60);

  before(async () => {
    dir = fs.mkdtempSync(path.join(process.env.IDEM_SCRATCH || os.tmpdir(), 'pack-'));
    const out = sh(NPM, ['pack', '--pack-destination', dir, '--loglevel', 'warn'], { cwd: PKG_DIR });
    tarball = path.join(dir, out.trim().split('\n').pop().trim());
    admin = adminPool();
    await admin.query(`CREATE DATABASE ${db} OWNER ${process.env.PGUSER}`);
  });
  after(async () => {
    await admin.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
    await admin.end();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('packs the library, its declarations, README and LICENSE, and nothing of the tests', () => {
    const files = sh('tar', ['tzf', tarball]).split('\n').filter(Boolean);
    for (const f of ['package.json', 'README.md', 'CHANGELOG.md', 'LICENSE', 'lib/index.js', 'lib/express.js',
      'lib/fastify.js', 'types/index.d.ts', 'types/express.d.ts', 'types/fastify.d.ts']) {
      assert.ok(files.includes(`package/${f}`), f);
    }
    assert.deepEqual(files.filter((f) => /test|node_modules|\.tgz$/.test(f)), []);
  });

  it('the README installs what npm pack makes, by the name and version it has', () => {
    const text = fs.readFileSync(path.join(PKG_DIR, 'README.md'), 'utf8');
    const { version } = JSON.parse(fs.readFileSync(path.join(PKG_DIR, 'package.json'), 'utf8'));
    const block = quickstart(text, 'install', /<!-- install -->/);
    assert.match(block, /^npm pack\b/m);
    assert.ok(text.includes(`npm install /path/to/pg-idempotency-${version}.tgz pg`), 'the install line');
    assert.equal(path.basename(tarball), `pg-idempotency-${version}.tgz`);
    assert.ok(!/^npm install pg-idempotency\b/m.test(text), 'never from the registry, where the name is not ours');
  });

  it('installs, and the README quickstarts run as written', async () => {
    const app = path.join(dir, 'app');
    fs.mkdirSync(app);
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'scratch-app', private: true }));
    const deps = ['pg', 'express', 'fastify', '@types/pg', '@types/express', '@types/node']
      .map((n) => `${n}@${installedVersion(n)}`);
    sh(NPM, ['install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel', 'error', tarball, ...deps],
      { cwd: app });
    readme = fs.readFileSync(path.join(app, 'node_modules', 'pg-idempotency', 'README.md'), 'utf8');

    // the SQL: the extension as a superuser, the table as the app's role
    const su = new Client({ user: process.env.IDEM_ADMIN_USER, database: db });
    await su.connect();
    await su.query(quickstart(readme, 'sql-superuser'));
    await su.end();
    const appDb = new Client({ database: db });
    await appDb.connect();
    await appDb.query(quickstart(readme, 'sql'));
    try {
      for (const framework of ['express', 'fastify']) {
        const file = path.join(app, `${framework}.js`);
        fs.writeFileSync(file, quickstart(readme, framework));
        const port = await freePort();
        const child = spawn(process.execPath, [file], {
          cwd: app, env: { ...process.env, PGDATABASE: db, PORT: String(port) }, stdio: ['ignore', 'inherit', 'inherit'],
        });
        const exited = new Promise((resolve) => child.on('exit', resolve));
        try {
          const url = `http://127.0.0.1:${port}/orders`;
          await waitFor(`the ${framework} quickstart listening`, () => request(url, { body: {} })
            .then(() => true, () => false), { interval: 50 });
          const item = uid(framework);
          const key = `"${uid()}"`;
          // the Express quickstart authenticates (its token), Fastify's is anonymous
          const auth = { authorization: 'Bearer alice-token' };
          const first = await request(url, { headers: { 'idempotency-key': key, ...auth }, body: { item } });
          assert.equal(first.status, 201, framework);
          assert.equal(first.json().item, item);
          const retry = await request(url, { headers: { 'idempotency-key': key, ...auth }, body: { item } });
          assert.equal(retry.status, 201);
          assert.equal(retry.headers['idempotent-replayed'], 'true');
          assert.deepEqual(retry.body, first.body);
          const nokey = await request(url, { headers: auth, body: { item } });
          assert.equal(nokey.status, 400);
          assert.equal(nokey.headers['content-type'], 'application/problem+json');
          assert.equal(nokey.json().type, 'tag:pg-idempotency,2026:missing-key');
          if (framework === 'express') {
            const stranger = await request(url, { headers: { 'idempotency-key': key }, body: { item } });
            assert.equal(stranger.status, 401, 'the authentication runs first');
          }
          const { rows } = await appDb.query('SELECT count(*)::int AS n FROM orders WHERE item = $1', [item]);
          assert.equal(rows[0].n, 1, `${framework}: one order`);
        } finally {
          child.kill('SIGKILL');
          await exited;
        }
      }
      // the stream quickstart, twice: the second run finds the batch applied
      const streamFile = path.join(app, 'stream.js');
      fs.writeFileSync(streamFile, quickstart(readme, 'stream'));
      for (let run = 0; run < 2; run++) {
        sh(process.execPath, [streamFile], { cwd: app, env: { ...process.env, PGDATABASE: db } });
        const { rows } = await appDb.query(
          "SELECT item, count(*)::int AS n FROM orders WHERE item IN ('nib', 'cap') GROUP BY item ORDER BY item");
        assert.deepEqual(rows, [{ item: 'cap', n: 1 }, { item: 'nib', n: 1 }], `stream quickstart, run ${run + 1}`);
      }
    } finally {
      await appDb.end();
    }

    // an ES module importing the named exports
    const esm = sh(process.execPath, ['--input-type=module', '-e', `
      import { run, twoPhase, consume, StaleTokenError, streamConsumer, StaleGenerationError, idempotent,
        ConfigurationError, publish, OutboxRelay, webhookSink, redisStreamSink, verifyWebhook,
        receiveWebhook } from 'pg-idempotency';
      import { idempotency, webhookReceiver } from 'pg-idempotency/express';
      import { fastifyIdempotency, webhookReceiver as fastifyWebhookReceiver } from 'pg-idempotency/fastify';
      console.log([run, twoPhase, consume, StaleTokenError, streamConsumer, StaleGenerationError, idempotency,
        fastifyIdempotency, idempotent, ConfigurationError, publish, OutboxRelay, webhookSink, redisStreamSink,
        verifyWebhook, receiveWebhook, webhookReceiver, fastifyWebhookReceiver].map((f) => typeof f).join(' '));
    `], { cwd: app });
    assert.equal(esm.trim(), Array(18).fill('function').join(' '));

    // the declarations, from the installed package
    fs.writeFileSync(path.join(app, 'tsconfig.json'), JSON.stringify({
      compilerOptions: {
        module: 'node16', moduleResolution: 'node16', strict: true, noEmit: true, esModuleInterop: true, types: ['node'],
      },
      files: ['check.ts'],
    }));
    fs.copyFileSync(path.join(PKG_DIR, 'test', 'types', 'usage.ts'), path.join(app, 'check.ts'));
    sh(process.execPath, [path.join(PKG_DIR, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', app], { cwd: app });
  });
});

'use strict';

// examples/http-node/server.js -- the payments API of examples/http on
// pg-idempotency's Express 5 middleware (clients/node).  POST /payments takes
// an API key (Authorization: Bearer) and an Idempotency-Key; the payment's
// INSERT, the claim of the key and the stored response commit in one
// transaction, and a retry gets the stored response back.  Keys are the
// account's own: another account's reuse of one is its own payment.  See
// README.md.
//
//   PGDATABASE=payments PGUSER=payments_app PORT=8080 node server.js
//
// PAYMENTS_API_KEYS: "key:account,..." (default sk_test_1:acct_1).
// PAYMENTS_TEST_HOOKS=1 (test.sh): a request with `Test-Fail: after-insert`
// throws after its INSERT.

const express = require('express');
const { Pool } = require('pg');
const { idempotency } = require('pg-idempotency/express');

const hooks = process.env.PAYMENTS_TEST_HOOKS === '1';
const app = express();
// the policy page the problem documents link to is mounted below
const idem = idempotency({ pool: new Pool(), docsUrl: '/docs/idempotency' }); // connects with the PG* environment

// stands for the service's authentication: req.user is the account, set before idem (it scopes the keys)
const accounts = new Map((process.env.PAYMENTS_API_KEYS || 'sk_test_1:acct_1').split(',').map((p) => p.split(':')));
function authenticate(req, res, next) {
  const account = accounts.get((req.get('authorization') || '').replace(/^Bearer /, ''));
  if (!account) return res.status(401).json({ title: 'an API key is required: Authorization: Bearer <key>' });
  req.user = { id: account };
  return next();
}

// the body is checked before the key is claimed: a client may fix it and retry with the same key
function validPayment(req, res, next) {
  const { amount, currency } = req.body ?? {};
  if (Number.isSafeInteger(amount) && amount > 0 && /^[a-z]{3}$/.test(currency)) return next();
  res.status(400).json({ title: 'amount (a positive integer) and currency (3 lowercase letters) are required' });
}

app.get('/docs/idempotency', idem.docs); // the retention and key syntax the 4xx answers link to
app.post('/payments', authenticate, express.json(), validPayment, idem, async (req, res) => {
  const { amount, currency } = req.body;
  const { rows: [p] } = await req.idempotency.tx.query(
    'INSERT INTO payments (amount, currency, idempotency_key) VALUES ($1, $2, $3) RETURNING id, created_at',
    [amount, currency, req.idempotency.key]);
  if (hooks && req.get('Test-Fail') === 'after-insert') throw new Error('Test-Fail: after-insert');
  res.status(201).location(`/payments/${p.id}`).json({ id: `pay_${p.id}`, amount, currency, created: p.created_at });
});

app.listen(Number(process.env.PORT) || 3000, process.env.HOST || '127.0.0.1');

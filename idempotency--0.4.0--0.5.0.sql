/* idempotency--0.4.0--0.5.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- 0.5.0: the transactional outbox, expired keys remembered (see
-- CHANGELOG.md, "0.5.0").  Every existing call keeps its meaning.

-- 0.5.0: expired keys remembered (idempotency.key_memory; the memory's
-- tables are made on first use by maintenance, like the ledgers)
COMMENT ON FUNCTION pg_catalog.idem_claim(text, jsonb, text, interval, interval, boolean, boolean) IS
'claims an idempotency key: claimed (do the work), completed (replay the stored response), in_progress (409), mismatch (422) or expired (410: remembered after its ttl, idempotency.key_memory)';

COMMENT ON FUNCTION pg_catalog.idem_lookup(text, text) IS
'the calling role''s own live record of one idempotency key, for support work (status expired: remembered after its ttl)';

/* idempotency--0.4.0--0.5.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- 0.5.0: the transactional outbox, expired keys remembered (see
-- CHANGELOG.md, "0.5.0").  Every existing call keeps its meaning.

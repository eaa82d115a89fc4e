/* idempotency--0.2.0--0.3.0.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- 0.3.0 reads a digest's lane as a little-endian integer on every machine
-- (0.2.0 used the machine's byte order: the same on little-endian
-- machines).  On a big-endian machine, the rows 0.2.0 wrote move to their
-- lanes here, in the updating transaction; elsewhere nothing is read or
-- written.  The ledgers are otherwise unchanged.

CREATE FUNCTION idempotency.relocate_lanes(always boolean DEFAULT true)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_relocate_lanes'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION idempotency.relocate_lanes(boolean) IS
'moves ledger rows written by 0.2.0 on a big-endian machine to the lanes 0.3.0 looks them up in';

REVOKE ALL ON FUNCTION idempotency.relocate_lanes(boolean) FROM PUBLIC;

SELECT idempotency.relocate_lanes(false);

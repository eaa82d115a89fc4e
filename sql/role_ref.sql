--
-- The type idempotency.role_ref (0.5.0; src/role_ref.c): a role stored as
-- this node's OID, whose text and binary forms are the role's name, so
-- that a copy of a row to another node (Citus' shard moves, pg_dump)
-- finds the role there by its name.  The role column of the tables that
-- idempotency.citus_distribute() distributes is one (test/t/038 moves
-- them between nodes where the roles have other OIDs).  Here, without
-- Citus: the text round trip, "-" for a role that no longer exists, bad
-- input and its SQLSTATEs, the binary form through COPY, the casts, and
-- that the oid btree serves a role_ref column.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
DROP ROLE IF EXISTS regress_rr_alice, "regress_RR Mixed", "123", "-";
RESET client_min_messages;

CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

CREATE ROLE regress_rr_alice;
CREATE ROLE "regress_RR Mixed";
CREATE ROLE "123";
CREATE ROLE "-";

-- text: a name as regrole reads and writes it, quoted where it needs it;
-- the OID is this node's
SELECT r AS text_in, r::text AS text_out, r::oid = o::oid AS same_oid
  FROM (VALUES ('regress_rr_alice'::idempotency.role_ref, 'regress_rr_alice'::regrole),
               ('REGRESS_RR_ALICE'::idempotency.role_ref, 'regress_rr_alice'::regrole),
               ('"regress_RR Mixed"'::idempotency.role_ref, '"regress_RR Mixed"'::regrole),
               ('"123"'::idempotency.role_ref, '"123"'::regrole),
               ('"-"'::idempotency.role_ref, '"-"'::regrole)) AS v (r, o);
SELECT r::text::idempotency.role_ref::oid = r::oid AS round_trip
  FROM (SELECT oid::idempotency.role_ref AS r FROM pg_roles
         WHERE rolname IN ('regress_rr_alice', 'regress_RR Mixed', '123', '-')) AS s;

-- "-" is a role that no longer exists (OID 0), and is written for one:
-- never its number, which may be another role's elsewhere
SELECT '-'::idempotency.role_ref::oid AS dash, 0::oid::idempotency.role_ref AS zero;
CREATE ROLE regress_rr_gone;
CREATE TEMP TABLE rr (role idempotency.role_ref NOT NULL, n int);
INSERT INTO rr VALUES ('regress_rr_gone'::regrole, 1), ('regress_rr_alice'::regrole, 2),
                      ('regress_rr_alice'::regrole::oid, 3), (0::oid, 4);
DROP ROLE regress_rr_gone;
SELECT n, role, role::oid <> 0 AS has_oid FROM rr ORDER BY n;
-- a name no role has reads as 0, which no role matches
SELECT 'regress_rr_nobody'::idempotency.role_ref::oid AS nobody;

-- bad input: a bare number (an OID) is refused, and a name that is not one
SELECT pg_temp.try($$SELECT '123'::idempotency.role_ref$$);
SELECT pg_temp.try($$SELECT '16384'::idempotency.role_ref$$);
SELECT pg_temp.try($$SELECT 'a.b'::idempotency.role_ref$$);
SELECT pg_temp.try($$SELECT '"unterminated'::idempotency.role_ref$$);
SELECT pg_temp.try($$SELECT ''::idempotency.role_ref$$);
SELECT pg_temp.try($$SELECT 'two words'::idempotency.role_ref$$);
-- an integer is no role_ref (only an oid or a regrole is)
SELECT pg_temp.try($$INSERT INTO rr VALUES (10, 5)$$);

-- casts: implicitly an oid or a regrole, so the oid operators and
-- functions of oids take it; an oid or a regrole on assignment
SELECT n, role = 'regress_rr_alice'::regrole AS eq_regrole,
       role = 'regress_rr_alice'::regrole::oid AS eq_oid,
       role OPERATOR(pg_catalog.=) role AS eq_self,
       CASE WHEN n = 1 THEN 'dropped' ELSE role::regrole::text END AS as_regrole,
       CASE WHEN n = 1 THEN 'dropped' ELSE pg_get_userbyid(role)::text END AS userbyid,
       role IN (SELECT oid FROM pg_authid) AS in_authid,
       format('%s', role) AS formatted
  FROM rr ORDER BY n;
SELECT castsource::regtype, casttarget::regtype, castmethod, castcontext
  FROM pg_cast
 WHERE 'idempotency.role_ref'::regtype IN (castsource, casttarget)
 ORDER BY 1::text, 2::text;
PREPARE rr_of(oid) AS SELECT count(*) FROM rr WHERE role = $1;
EXECUTE rr_of('regress_rr_alice'::regrole);
DEALLOCATE rr_of;
SELECT count(*) AS joined FROM rr a JOIN rr b ON a.role = b.role;

-- an index on a role_ref column is oid's btree, and a query on the role
-- uses it
CREATE INDEX rr_role_idx ON rr (role, n);
SELECT o.opcname FROM pg_index i JOIN pg_opclass o ON o.oid = i.indclass[0]
 WHERE i.indexrelid = 'rr_role_idx'::regclass;
SET enable_seqscan = off;
SET plan_cache_mode = force_generic_plan;
PREPARE rr_by(oid) AS SELECT n FROM rr WHERE role = $1;
EXPLAIN (COSTS OFF) EXECUTE rr_by('regress_rr_alice'::regrole);
DEALLOCATE rr_by;
PREPARE rr_by(regrole) AS SELECT n FROM rr WHERE role OPERATOR(pg_catalog.=) $1;
EXPLAIN (COSTS OFF) EXECUTE rr_by('regress_rr_alice');
DEALLOCATE rr_by;
RESET plan_cache_mode;
RESET enable_seqscan;

-- binary: the name, unquoted (empty for a role that no longer exists)
SELECT n, idempotency.role_ref_send(role) FROM rr ORDER BY n;
SELECT idempotency.role_ref_send('"regress_RR Mixed"');
-- through binary COPY: read back by name
CREATE TEMP TABLE rr_copy (role idempotency.role_ref, n int);
COPY rr TO '/tmp/idem_regress_role_ref.bin' WITH (FORMAT binary);
COPY rr_copy FROM '/tmp/idem_regress_role_ref.bin' WITH (FORMAT binary);
-- (the dropped role's row arrives as 0)
SELECT a.n, CASE WHEN a.role::oid = b.role::oid THEN 'same'
                 WHEN b.role::oid = 0 THEN 'zero' END AS copied
  FROM rr a JOIN rr_copy b USING (n) ORDER BY a.n;
-- a binary name no role has reads as 0; malformed ones are refused
-- (22P03): a zero byte, a name longer than a role name can be.  Each file
-- is one row of one field: the COPY signature, the field's length, its
-- bytes, and the trailer.
CREATE FUNCTION pg_temp.copy_one(field bytea) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  f bytea := '\x5047434f50590aff0d0a00'::bytea || '\x0000000000000000'::bytea
             || '\x0001'::bytea || int4send(length(field)) || field || '\xffff'::bytea;
  lo oid;
  r text;
BEGIN
  TRUNCATE rr_copy;
  lo := lo_from_bytea(0, f);
  PERFORM lo_export(lo, '/tmp/idem_regress_role_ref.bin');
  PERFORM lo_unlink(lo);
  r := pg_temp.try($s$COPY rr_copy (role) FROM '/tmp/idem_regress_role_ref.bin' WITH (FORMAT binary)$s$);
  RETURN r || ' ' || coalesce((SELECT string_agg(role::oid::text, ',') FROM rr_copy), '');
END
$$;
SELECT pg_temp.copy_one(convert_to('regress_rr_alice', 'UTF8')) =
       'ok ' || 'regress_rr_alice'::regrole::oid AS this_nodes_oid;
SELECT pg_temp.copy_one(convert_to('regress_rr_nobody', 'UTF8')) AS unknown_name;
SELECT pg_temp.copy_one('') AS empty;
SELECT pg_temp.copy_one('\x616200'::bytea) AS zero_byte;
SELECT pg_temp.copy_one(convert_to(repeat('x', 64), 'UTF8')) AS too_long;

DROP TABLE rr, rr_copy;
DROP ROLE regress_rr_alice, "regress_RR Mixed", "123", "-";

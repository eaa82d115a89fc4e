
# test/t/040_upgrade.pl -- ALTER EXTENSION idempotency UPDATE from 0.1.0.
#
# A database on 0.1.0 with live keys (completed, two-phase in progress,
# released) and consumed messages is updated to the current version; every
# row stays as it was and behaves as before (replays, duplicates, the lease
# holder's token), every partition's digest index is rebuilt on (role,
# digest), and the updated extension is object for object the same as a
# fresh install of the current version (members, definitions,
# privileges).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
max_prepared_transactions = 10
});
$node->start;

my $current = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'});
isnt($current, '0.1.0', "the current version ($current) is newer than 0.1.0");

$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('upgraded', q{CREATE EXTENSION idempotency VERSION '0.1.0'});
$node->safe_psql('fresh', q{CREATE EXTENSION idempotency});

# ---------------------------------------------------------------- 0.1.0 data
my $token = $node->safe_psql('upgraded', q{
	CREATE ROLE app;
	GRANT USAGE ON SCHEMA public TO app;
	SET ROLE app;
	BEGIN;
	SELECT status FROM idem_claim('paid', '{"amount": 10}');
	SELECT idem_complete('paid', 201, '{"charge": 1}');
	COMMIT;
	BEGIN;
	SELECT status FROM idem_claim('released', '{"amount": 20}');
	SELECT idem_release('released');
	COMMIT;
	SELECT idem_consume_message('billing', 'm1');
	SELECT count(*) FROM idem_consume_messages('billing', ARRAY['m2', 'm3']);
	SELECT token FROM idem_claim('slow', '{"amount": 30}', ttl => '1 hour', lease => '30 minutes');
});
$token = (split /\n/, $token)[-1];
like($token, qr/^\d+$/, 'a two-phase claim holds a token');
$node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT idem_checkpoint('slow', 'step-1', token => } . $token . q{);
});

# the key ledger's columns of 0.3.x (0.4.0 adds six, NULL in old rows)
my $rows_sql = q{
SELECT string_agg(format('%s %s', tableoid::regclass, t), E'\n' ORDER BY t::text)
  FROM (SELECT tableoid, (k.expires_at, k.digest, k.role, k.lane, k.state, k.token,
                          k.claimed_at, k.lease_until, k.fingerprint, k.recovery_point,
                          k.response_code, k.response_body)::text AS t
          FROM idempotency.keys k
        UNION ALL
        SELECT tableoid, m::text FROM idempotency.messages m) s};
my $rows_before = $node->safe_psql('upgraded', $rows_sql);
my $partitions_before = $node->safe_psql('upgraded',
	q{SELECT string_agg(partition::text || ' ' || lower_bound || ' ' || upper_bound, E'\n' ORDER BY partition::text)
	    FROM idempotency.partitions});

# A publication that carries every table's updates (as change data capture
# tools make them): 0.5.0 refuses an update of a ledger row that such a
# publication carries without a replica identity, so the update gives the
# published ledgers one
$node->safe_psql('upgraded', 'CREATE PUBLICATION everything FOR ALL TABLES');

# ---------------------------------------------------------------- update
$node->safe_psql('upgraded', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('upgraded',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$current, "ALTER EXTENSION UPDATE reaches $current");

is($node->safe_psql('upgraded', $rows_sql), $rows_before,
	'every key and message row is unchanged, in the same partition');
is($node->safe_psql('upgraded', q{
	SELECT count(*) FROM idempotency.keys
	 WHERE num_nonnulls(kept_key, kept_scope, kept_request, recover_at,
	                    response_headers, response_raw) > 0}),
	'0', 'the columns 0.4.0 adds are NULL in every existing row');
is($node->safe_psql('upgraded',
		q{SELECT string_agg(partition::text || ' ' || lower_bound || ' ' || upper_bound, E'\n' ORDER BY partition::text)
		    FROM idempotency.partitions}),
	$partitions_before, 'the partitions are unchanged');
# 0.4.0: the digest index is on (role, digest) in every partition (and the
# tables), none is on (digest) alone any more, and it is the first of each
# partition's indexes (the one a probe opens first)
is($node->safe_psql('upgraded', q{
	SELECT string_agg(DISTINCT (SELECT string_agg(regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', ''),
	                                              '; ' ORDER BY i.indexrelid)
	                              FROM pg_index i WHERE i.indrelid = c.oid), E'\n')
	  FROM pg_class c
	 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
	   AND c.relname ~ '^(keys|messages)'}),
	"btree (role, digest) WITH (deduplicate_items=off)\n"
	. "btree (role, digest) WITH (deduplicate_items=off); btree (role, recover_at) WHERE (recover_at IS NOT NULL)",
	'every ledger table and partition has its digest index on (role, digest), first, and none on (digest)');

# the digest filters are built, keyed with the secret the update made
# (while the older version was installed none is made), and the behaviour
# below is checked through them
$node->safe_psql('upgraded', 'SELECT idem_maintain()');
filters_ready($node, 'upgraded', 'after the update and a maintenance run');
my $identities = q{
	SELECT string_agg(DISTINCT c.relreplident::text, ',')
	  FROM pg_class c
	 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind IN ('r', 'p')
	   AND c.relname ~ '^(keys|messages)' AND c.relname !~ '_memory'};
is($node->safe_psql('upgraded', $identities), 'f',
	'the published ledgers, their partitions and those maintenance made since are REPLICA IDENTITY FULL');

# ---------------------------------------------------------------- behaviour
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT format('%s %s %s', status, response_code, response_body)
	  FROM idem_claim('paid', '{"amount": 10}')}),
	'completed 201 {"charge": 1}', 'a completed key replays its response');
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT status FROM idem_claim('paid', '{"amount": 11}')}),
	'mismatch', 'and still checks the request fingerprint');
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT format('%s %s', status, recovery_point IS NULL) FROM idem_claim('slow', '{"amount": 30}')}),
	'in_progress t', 'a two-phase claim is still in progress for others');
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT idem_complete('slow', 200, '{"done": true}', token => } . $token . q{);
	SELECT status || ' ' || recovery_point FROM idem_lookup('slow')}),
	"\ncompleted step-1", 'its holder completes it with the token it got before the update');
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	BEGIN;
	SELECT status FROM idem_claim('released', '{"amount": 20}');
	SELECT idem_complete('released', 201, '{}');
	COMMIT;
	SELECT status FROM idem_lookup('released')}),
	"claimed\n\ncompleted", 'a released key can be claimed again');
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT idem_consume_message('billing', 'm1')::text || ' ' ||
	       (SELECT string_agg(x, ',') FROM idem_consume_messages('billing', ARRAY['m2', 'm3', 'm4']) AS t(x))}),
	'false m4', 'consumed messages are still duplicates');
is($node->safe_psql('upgraded', q{
	SET ROLE app;
	SELECT count(*) FROM idem_lookup('paid')}),
	'1', 'lookup sees the pre-update key');

# new in 0.2.0
is($node->safe_psql('upgraded',
		q{SELECT claims > 0 FROM idempotency.stats WHERE datname = current_database()}),
	't', 'the statistics view exists and counts');
my ($ret, $out, $err) = $node->psql('upgraded', q{SET ROLE app; SELECT * FROM idempotency.stats});
like($err, qr/permission denied/, 'and is closed to ordinary roles');

# ---------------------------------------------------------------- lanes written big-endian
# 0.2.0 read a digest's lane bytes in the machine's order; 0.3.0 reads them
# little-endian everywhere.  Rows a big-endian machine wrote (simulated
# here by moving rows to the lanes a big-endian 0.2.0 computed) are missed
# by lookups until idempotency.relocate_lanes() moves them back.
$node->safe_psql('postgres', 'CREATE DATABASE big_endian');
$node->safe_psql('big_endian', q{CREATE EXTENSION idempotency VERSION '0.2.0'});
$node->safe_psql('big_endian', q{
	SELECT idem_maintain();
	SELECT count(*) FROM idem_consume_messages('billing',
	         ARRAY(SELECT 'be-' || i FROM generate_series(1, 50) i));});
# (the lane value keeps its layout bits: lane count in bits 8-14, the
# digest form in the sign; the lane number is bytes 12-15 big-endian)
my $be_lane = q{((lane::int & -256) +
                 (get_byte(uuid_send(digest), 12)::bigint * 16777216 +
                  get_byte(uuid_send(digest), 13) * 65536 +
                  get_byte(uuid_send(digest), 14) * 256 +
                  get_byte(uuid_send(digest), 15)) % ((lane::int & 32512) >> 8))::int2};
my $misplaced = $node->safe_psql('big_endian',
	"WITH m AS (UPDATE idempotency.messages SET lane = $be_lane WHERE lane <> $be_lane RETURNING 1)
	 SELECT count(*) FROM m");
cmp_ok($misplaced, '>', 10, "$misplaced of 50 message rows sit in the lanes of a big-endian 0.2.0");
is($node->safe_psql('big_endian', q{
		BEGIN;
		SELECT count(*) FROM generate_series(1, 50) i WHERE idem_consume_message('billing', 'be-' || i);
		ROLLBACK;}),
	$misplaced, 'lookups miss them');
$node->safe_psql('big_endian', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('big_endian', 'SELECT idempotency.relocate_lanes()'),
	$misplaced, 'idempotency.relocate_lanes() moves each of them to its lane');
is($node->safe_psql('big_endian', q{
		SELECT count(*) FROM generate_series(1, 50) i WHERE idem_consume_message('billing', 'be-' || i)}),
	'0', 'after which every message id is a duplicate again');
is($node->safe_psql('big_endian', "SELECT count(*) FROM idempotency.messages WHERE lane <> $be_lane"),
	$misplaced, 'and sits in its own lane');
is($node->safe_psql('big_endian', 'SELECT idempotency.relocate_lanes()'), '0',
	'a second run finds nothing to move');
is($node->safe_psql('big_endian', $identities), 'd',
	'without a publication, the update leaves the ledgers\' replica identity as it was');

# ---------------------------------------------------------------- same objects as a fresh install
my $objects_sql = q{
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'idempotency'),
members AS (
  SELECT d.classid, d.objid
    FROM pg_depend d, ext
   WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e')
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
  SELECT pg_describe_object(classid, objid, 0) AS line FROM members
  UNION ALL
  SELECT pg_get_functiondef(objid) || ' ACL ' || coalesce(p.proacl::text, 'default')
    FROM members JOIN pg_proc p ON p.oid = objid WHERE classid = 'pg_proc'::regclass
  UNION ALL
  SELECT c.relname || ' ' || coalesce(pg_get_viewdef(c.oid), '') || ' ACL ' || coalesce(c.relacl::text, 'default')
    FROM members JOIN pg_class c ON c.oid = objid WHERE classid = 'pg_class'::regclass
  UNION ALL
  SELECT n.nspname || ' ACL ' || coalesce(n.nspacl::text, 'default')
    FROM members JOIN pg_namespace n ON n.oid = objid WHERE classid = 'pg_namespace'::regclass
  UNION ALL
  SELECT 'comment ' || pg_describe_object(classid, objid, 0) || ': ' || obj_description(objid, classid::regclass::name)
    FROM members WHERE obj_description(objid, classid::regclass::name) IS NOT NULL
  UNION ALL
  SELECT 'dumped ' || c.tab::regclass::text || ' ' || coalesce(c.cond, '')
    FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS c(tab, cond)
   WHERE e.extname = 'idempotency'
) s};
my $fresh = $node->safe_psql('fresh', $objects_sql);
my $updated = $node->safe_psql('upgraded', $objects_sql);
ok(length($fresh) > 1000, 'the fresh install has members to compare');
is($updated, $fresh,
	'the updated extension has the same members, definitions, privileges, comments and dump conditions as a fresh install');

$node->stop;
done_testing();

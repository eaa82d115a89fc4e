
# test/t/001_dump_restore.pl -- pg_dump / pg_restore keep the ledger.
#
# The storage table idempotency.messages and its partitions are not members
# of the extension, so pg_dump carries them with their rows.  After a restore
# the same message ids are duplicates, new ones are new, the partitions are
# the same, idem_maintain() works and re-adds the AUTO dependency on the
# extension that pg_dump does not carry (so DROP EXTENSION takes the storage
# again).  The lock secret (idempotency.lock_secret) is not dumped: each
# restored database has one of its own, made by its CREATE EXTENSION.  Custom format through pg_restore, twice in a row, and plain format
# through psql.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump_restore');
$node->init;
$node->start;

my $tmp = PostgreSQL::Test::Utils::tempdir;

# rows, with the partition each one sits in
my $rows_sql = q{
SELECT coalesce(string_agg(format('%s %s %s %s %s', tableoid::regclass, expires_at,
                                  digest, role, lane), E'\n'
                           ORDER BY digest, role, expires_at), '')
  FROM idempotency.messages};

# partitions as the view shows them
my $partitions_sql = q{
SELECT coalesce(string_agg(format('%s %s %s %s %s %s', table_name, partition, lanes, lane,
                                  lower_bound, upper_bound), E'\n'
                           ORDER BY partition::text), '')
  FROM idempotency.partitions};

# the AUTO dependencies of the storage table on the extension
my $autodep_sql = q{
SELECT count(*) FROM pg_depend
 WHERE classid = 'pg_class'::regclass
   AND objid = 'idempotency.messages'::regclass
   AND refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND deptype = 'a'};

# partitions that do not have exactly one valid index, on (role, digest)
my $bad_index_sql = q{
SELECT count(*) FROM pg_inherits i
 WHERE i.inhparent = 'idempotency.messages'::regclass
   AND (SELECT array_agg(regexp_replace(pg_get_indexdef(x.indexrelid), '^.* USING ', ''))
          FROM pg_index x WHERE x.indrelid = i.inhrelid AND x.indisvalid)
       IS DISTINCT FROM ARRAY['btree (role, digest) WITH (deduplicate_items=off)']};

# every message of the source, as one query: true if any of them is new
my $any_new_sql = q{
SELECT bool_or(n) FROM (
  SELECT idem_consume_message('orders', 'order-' || g) FROM generate_series(1, 20) g
  UNION ALL
  SELECT idem_consume_message('webhooks', 'evt-' || g, '1 day') FROM generate_series(1, 10) g
  UNION ALL
  SELECT idem_consume_message('relayout', 'r-' || g) FROM generate_series(1, 10) g
  UNION ALL
  SELECT count(*) > 0 FROM idem_consume_messages('batch', ARRAY['b1', 'b2', 'b3'], '2 hours')
) s(n)};

# every key row with its partition, state, token and stored response
my $keys_rows_sql = q{
SELECT coalesce(string_agg(format('%s %s', tableoid::regclass, k), E'\n' ORDER BY k::text), '')
  FROM idempotency.keys k};

# ------------------------------------------------------------------ source
$node->safe_psql('postgres', 'CREATE ROLE idem_tap_app LOGIN');
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql(
	'src', q{
CREATE EXTENSION idempotency;
SELECT idem_consume_message('orders', 'order-' || g) FROM generate_series(1, 20) g;
SELECT idem_consume_message('webhooks', 'evt-' || g, '1 day') FROM generate_series(1, 10) g;
SELECT * FROM idem_consume_messages('batch', ARRAY['b1', 'b2', 'b3'], '2 hours');
SELECT idem_maintain();
-- a second partition layout, as after changing partition_interval
SET idempotency.partition_interval = '6h';
SELECT idem_maintain();
SELECT idem_consume_message('relayout', 'r-' || g) FROM generate_series(1, 10) g;
});
# a message of another role: the regrole column must survive the trip
$node->safe_psql('src',
	q{SET ROLE idem_tap_app; SELECT idem_consume_message('orders', 'app-only');});

# live keys: completed with a response, two-phase in progress with a
# recovery point, released; one of another role
my $slow_token = $node->safe_psql('src', q{
BEGIN;
SELECT status FROM idem_claim('paid', '{"amount": 10}');
SELECT idem_complete('paid', 201, '{"charge": "ch_1"}');
COMMIT;
BEGIN;
SELECT status FROM idem_claim('dropped', NULL);
SELECT idem_release('dropped');
COMMIT;
SELECT token FROM idem_claim('slow', '{"amount": 30}', ttl => '2 hours', lease => '1 hour');
});
$slow_token = (split /\n/, $slow_token)[-1];
$node->safe_psql('src', "SELECT idem_checkpoint('slow', 'step-1', token => $slow_token)");
$node->safe_psql('src', q{SET ROLE idem_tap_app; BEGIN;
SELECT status FROM idem_claim('paid', '{"amount": 99}');
SELECT idem_complete('paid', 200, '{"app": true}');
COMMIT;});
# since 0.4.0: a response with headers and raw bytes; a two-phase claim
# kept with its request, whose lease lapses before the dump
$node->safe_psql('src', q{BEGIN;
SELECT status FROM idem_claim('csv');
SELECT idem_complete('csv', 201, response_headers => '{"Location": "/exports/1", "Content-Type": "text/csv"}',
                     response_raw => '\x612c620a00ff');
COMMIT;
SELECT status FROM idem_claim('kept', '{"amount": 40}', ttl => '2 hours', lease => '1 second', keep_request => true);});
ok($node->poll_query_until('src', q{SELECT lease_expires_at < clock_timestamp() FROM idem_lookup('kept')}),
	'src: the kept claim\'s lease has lapsed');
my $src_keys = $node->safe_psql('src', $keys_rows_sql);
is($node->safe_psql('src', 'SELECT count(*) FROM idempotency.keys'), 6, 'src: six live keys');

my $src_rows       = $node->safe_psql('src', $rows_sql);
my $src_partitions = $node->safe_psql('src', $partitions_sql);
my $src_count = $node->safe_psql('src', 'SELECT count(*) FROM idempotency.messages');
is($src_count, 44, 'src: one row per consumed message');
is($node->safe_psql('src', q{SELECT count(DISTINCT lanes) FROM idempotency.partitions WHERE table_name = 'messages'}),
	2, 'src: partitions of two layouts exist');
is($node->safe_psql('src', $any_new_sql), 'f', 'src: every consumed message is a duplicate');

# the lock secret's bytes (src/lock_secret.c), as hex
my $secret_sql = q{SELECT string_agg(encode(secret, 'hex'), ',') FROM idempotency.lock_secret};
my $src_secret = $node->safe_psql('src', $secret_sql);
like($src_secret, qr/^[0-9a-f]{32}$/, 'src: one lock secret of 16 bytes');

# checks a restored database against the state it was dumped from
sub check_restored
{
	my ($db, $what, $want_count, $want_rows, $want_partitions) = @_;

	# the secret is not dumped: the restore's CREATE EXTENSION makes one
	my $secret = $node->safe_psql($db, $secret_sql);
	like($secret, qr/^[0-9a-f]{32}$/, "$db: one lock secret of 16 bytes");
	isnt($secret, $src_secret, "$db: its own, not src's");

	is($node->safe_psql($db, $bad_index_sql), 0,
		"$db: every partition has its (role, digest) index");
	is($node->safe_psql($db, 'SELECT count(*) FROM idempotency.messages'),
		$want_count, "$db: same row count as $what");
	is($node->safe_psql($db, $rows_sql), $want_rows,
		"$db: same rows, in the same partitions, as $what");
	is($node->safe_psql($db, $partitions_sql), $want_partitions,
		"$db: partitions view shows the same partitions as $what");
	is($node->safe_psql($db, $any_new_sql), 'f',
		"$db: message ids consumed in src are duplicates");
	is( $node->safe_psql(
			$db,
			q{SET ROLE idem_tap_app; SELECT idem_consume_message('orders', 'app-only');}),
		'f',
		"$db: a message of another role is still that role's duplicate");
	is( $node->safe_psql(
			$db,
			q{BEGIN; SELECT idem_consume_message('orders', 'app-only'); ROLLBACK;}),
		't',
		"$db: ... and new to the superuser");
	is( $node->safe_psql(
			$db,
			qq{SELECT idem_consume_message('orders', '$db-new-1') AND
                      idem_consume_message('webhooks', '$db-new-2', '1 day')}),
		't',
		"$db: new message ids are new");
	is( $node->safe_psql(
			$db,
			qq{SELECT idem_consume_message('orders', '$db-new-1') OR
                      idem_consume_message('webhooks', '$db-new-2', '1 day')}),
		'f',
		"$db: ... and duplicates the second time");
	is( $node->safe_psql($db, 'SELECT count(*) FROM idempotency.messages'),
		$want_count + 2, "$db: the new messages were stored");
	like(
		$node->safe_psql(
			$db,
			q{SELECT format('%s/%s', partitions_created, partitions_dropped) FROM idem_maintain()}
		),
		qr{^\d+/\d+$},
		"$db: idem_maintain() works after the restore");
	is($node->safe_psql($db, $autodep_sql), 1,
		"$db: idem_maintain() left one AUTO dependency on the extension");
	is($node->safe_psql($db, $bad_index_sql), 0,
		"$db: partitions made after the restore have their (role, digest) index too");

	# keys
	is($node->safe_psql($db, $keys_rows_sql), $src_keys,
		"$db: every key row (state, token, fingerprint, response) as in src");
	is($node->safe_psql($db, q{
		SELECT format('%s %s %s', status, response_code, response_body)
		  FROM idem_claim('paid', '{"amount": 10}')}),
		'completed 201 {"charge": "ch_1"}', "$db: a completed key replays its response");
	is($node->safe_psql($db, q{SELECT status FROM idem_claim('paid', '{"amount": 11}')}),
		'mismatch', "$db: ... and checks the request fingerprint");
	is($node->safe_psql($db, q{SET ROLE idem_tap_app;
		SELECT format('%s %s', status, response_body) FROM idem_claim('paid', '{"amount": 99}')}),
		'completed {"app": true}', "$db: another role's key is still its own");
	is($node->safe_psql($db, q{SELECT status FROM idem_claim('slow', '{"amount": 30}')}),
		'in_progress', "$db: a two-phase claim is still in progress");
	is($node->safe_psql($db, qq{BEGIN;
		SELECT idem_complete('slow', 200, '{}', token => $slow_token);
		SELECT status || ' ' || recovery_point FROM idem_lookup('slow');
		ROLLBACK;}),
		"\ncompleted step-1", "$db: its holder's token still completes it");
	is($node->safe_psql($db, q{SELECT status FROM idem_lookup('dropped')}),
		'released', "$db: a released key is still released");
	is($node->safe_psql($db, q{
		SELECT format('%s %s %s %s', status, response_code, response_headers ->> 'Location', response_raw)
		  FROM idem_claim('csv')}),
		'completed 201 /exports/1 \x612c620a00ff', "$db: headers and raw bytes replay");
	is($node->safe_psql($db, q{BEGIN;
		SELECT format('%s %s', key, request) FROM idem_recover('1 minute');
		ROLLBACK;}),
		'kept {"amount": 40}', "$db: the lapsed kept claim is recovered, with its request");
	return;
}

# ------------------------------------------- custom format, pg_restore
my $dump1 = "$tmp/src.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump1, '-d', $node->connstr('src') ],
	'pg_dump -Fc of src');
$node->safe_psql('postgres', 'CREATE DATABASE dst');
$node->command_checks_all(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst'), $dump1 ],
	0, [qr/^$/], [qr/^$/],
	'pg_restore into dst succeeds without a message');
check_restored('dst', 'src', $src_count, $src_rows, $src_partitions);

# ------------------------------------------- a second round trip
my $dst_count = $node->safe_psql('dst', 'SELECT count(*) FROM idempotency.messages');
my $dst_rows       = $node->safe_psql('dst', $rows_sql);
my $dst_partitions = $node->safe_psql('dst', $partitions_sql);
my $dump2          = "$tmp/dst.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump2, '-d', $node->connstr('dst') ],
	'pg_dump -Fc of the restored dst');
$node->safe_psql('postgres', 'CREATE DATABASE dst2');
$node->command_checks_all(
	[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst2'), $dump2 ],
	0, [qr/^$/], [qr/^$/],
	'pg_restore of the second dump into dst2 succeeds without a message');
check_restored('dst2', 'dst', $dst_count, $dst_rows, $dst_partitions);

# ------------------------------------------- DROP EXTENSION after a restore
my ($rc, $stdout, $stderr) = $node->psql('dst', 'DROP EXTENSION idempotency');
is($rc, 0, 'dst: DROP EXTENSION (without CASCADE) succeeds after the restore')
  or diag($stderr);
is( $node->safe_psql(
		'dst',
		q{SELECT count(*) FROM pg_class WHERE relname ~ '^messages(_|$)'
             OR relnamespace = to_regnamespace('idempotency')}),
	0,
	'dst: DROP EXTENSION removed the restored storage and its partitions');
is($node->safe_psql('dst', q{SELECT to_regnamespace('idempotency') IS NULL}),
	't', 'dst: schema idempotency is gone');
is( $node->safe_psql(
		'dst',
		q{CREATE EXTENSION IF NOT EXISTS idempotency; SELECT idem_consume_message('orders', 'order-1')}),
	't',
	'dst: after re-creating the extension the ledger starts empty');

# ------------------------------------------- plain format, psql
my $plain = "$tmp/src.sql";
$node->command_ok([ 'pg_dump', '-Fp', '-f', $plain, '-d', $node->connstr('src') ],
	'pg_dump -Fp of src');
my $plain_text = slurp_file($plain);
unlike($plain_text, qr/\Q$src_secret\E/, 'the plain dump does not hold the lock secret');
unlike($plain_text, qr/(COPY|INSERT INTO) idempotency\.lock_secret/, '... nor any row of its table');
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->command_checks_all(
	[
		'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-o', '/dev/null',
		'-f', $plain, '-d', $node->connstr('plain')
	],
	0, [qr/^$/], [qr/^$/],
	'plain dump restored with psql succeeds without a message');
check_restored('plain', 'src', $src_count, $src_rows, $src_partitions);

# ------------------------------------------- idem_maintain() as the first call
# made by idem_maintain() itself, the table gets exactly one AUTO dependency
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION idempotency; SELECT idem_maintain();');
is($node->safe_psql('fresh', $autodep_sql), 1,
	'fresh: storage made by idem_maintain() has one AUTO dependency on the extension');

$node->stop;
done_testing();

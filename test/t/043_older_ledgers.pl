# test/t/043_older_ledgers.pl -- the 0.4.0 library with key ledgers and SQL
# objects of 0.3.1.
#
# 1. Before ALTER EXTENSION UPDATE (the library installed, the extension
#    still 0.3.1), idempotency.import_key() takes a 0.3.1 record: its
#    fields of 0.4.0 are absent, not read from uninitialized memory (a
#    0.4.0 build crashed the server here).
# 2. A 0.3.1 database dumped and restored into a server with 0.4.0: the
#    restore makes the extension 0.4.0 (pg_dump names no version) and the
#    key ledger with its 0.3.1 columns.  The first claim adds the columns of
#    0.4.0 (a NOTICE says so), so that headers, raw bytes and kept requests
#    are stored, never dropped.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('older');
$node->init;
$node->start;

# ---------------------------------------------------------------- 1
$node->safe_psql('postgres', q{CREATE EXTENSION idempotency VERSION '0.3.1'});
is($node->safe_psql('postgres', q{
	SELECT idempotency.import_key(ROW('postgres', gen_random_uuid(), now() + interval '1 hour',
	                                  'completed', 5, now(), NULL, NULL, NULL, 200, NULL)::idempotency.key_record)}),
	'inserted', '0.3.1 SQL: import_key takes a 0.3.1 record');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.export_keys() e,
	       LATERAL idempotency.import_key(e) AS outcome}),
	'1', 'and its own export again');

# ---------------------------------------------------------------- 2
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT status FROM idem_claim('old-key', '{"a": 1}');
	SELECT idem_complete('old-key', 201, '{"b": 2}');
	COMMIT;});
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency.keys'::regclass AND attnum > 0}),
	'12', 'the 0.3.1 ledger has 12 columns');
my $dump = $node->basedir . '/v031.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, $node->connstr('postgres') ], 'pg_dump of the 0.3.1 database');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a server with 0.4.0');
is($node->safe_psql('restored', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.4.0', 'the restored extension is 0.4.0');

my ($stdout, $stderr);
$node->psql('restored', q{
	SELECT status FROM idem_claim('new-key', '{"n": 1}', lease => '1 hour', keep_request => true)},
	stdout => \$stdout, stderr => \$stderr);
is($stdout, 'claimed', 'a claim with keep_request on the restored ledger');
like($stderr, qr/adding the columns of version 0\.4\.0 to table "idempotency\.keys"/,
	'it added the columns of 0.4.0 first');
is($node->safe_psql('restored', q{SELECT request FROM idem_lookup('new-key')}),
	'{"n": 1}', 'the request is kept');
is($node->safe_psql('restored', q{
	SELECT idem_complete('new-key', 201, NULL, '', (SELECT token FROM idem_lookup('new-key')),
	                     response_headers => '{"Location": "/x"}', response_raw => '\x01');
	SELECT format('%s %s %s', status, response_headers, response_raw) FROM idem_claim('new-key')}),
	"\ncompleted {\"Location\": \"/x\"} \\x01", 'headers and raw bytes are stored and replayed');
is($node->safe_psql('restored', q{SELECT format('%s %s', status, response_body) FROM idem_claim('old-key', '{"a": 1}')}),
	'completed {"b": 2}', 'the restored key still replays');
is($node->safe_psql('restored', q{SELECT count(*) FROM pg_indexes WHERE indexname = 'keys_recover_idx'}),
	'1', 'and the recovery index is there');

$node->stop;
done_testing();

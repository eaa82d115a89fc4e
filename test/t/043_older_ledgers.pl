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
# 3. The digest indexes of 0.3.1, on (digest) alone, in the restored
#    database: keys and message ids written by 0.3.1, and others written
#    into the same partitions by 0.4.0 before maintenance, are found; a
#    maintenance round that cannot have its locks within a second (a writer
#    keeps its transaction open) leaves them for the next; then
#    maintenance rebuilds them on (role, digest) (0.4.0's, which no role's
#    probe reads another role's entries through) in every partition and
#    the parent, and every row is still found, and new partitions get that
#    index.  The 0.3.1 database itself keeps the (digest) index under the
#    0.4.0 library (an older library may still probe it) until ALTER
#    EXTENSION UPDATE, which rebuilds it, and its rows are found after.

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
	CREATE ROLE other;
	BEGIN;
	SELECT status FROM idem_claim('old-key', '{"a": 1}');
	SELECT idem_complete('old-key', 201, '{"b": 2}');
	COMMIT;
	SELECT idem_consume_message('c', 'old-message');
	SET ROLE other;
	SELECT idem_consume_message('c', 'old-message');
	RESET ROLE;
	SELECT idem_maintain();});

# each partition's digest index: "(digest)", "(role, digest)" or several,
# as "partition: index, ..." lines
my $digest_indexes_sql = q{
SELECT string_agg(format('%s: %s', p.partition,
                         (SELECT string_agg(pg_get_indexdef(i.indexrelid, 0, true), ', ' ORDER BY i.indexrelid)
                            FROM pg_index i WHERE i.indrelid = p.partition
                             AND i.indkey::text IN ('2', '3 2') AND i.indpred IS NULL)), E'\n'
                  ORDER BY p.partition::text)
  FROM idempotency.partitions p WHERE p.table_name LIKE 'TABLE'};
sub digest_index_kinds
{
	my ($db, $table) = @_;
	my %kinds;
	(my $sql = $digest_indexes_sql) =~ s{TABLE}{$table // '%'}e;
	foreach my $line (split /\n/, $node->safe_psql($db, $sql))
	{
		my ($part, $defs) = split /: /, $line, 2;
		my $kind = !defined $defs ? 'none'
		  : $defs =~ /^CREATE INDEX \S+ ON \S+ USING btree \(role, digest\) WITH \(deduplicate_items=off\)$/ ? '(role, digest)'
		  : $defs =~ /^CREATE INDEX \S+ ON \S+ USING btree \(digest\)( WITH \(deduplicate_items=off\))?$/ ? '(digest)'
		  : $defs;
		$kinds{$kind}++;
	}
	return join(', ', map { "$kinds{$_} $_" } sort keys %kinds);
}
my $nparts = $node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.partitions');
is(digest_index_kinds('postgres'), "$nparts (digest)",
	'0.3.1 SQL with the 0.4.0 library: every partition keeps its (digest) index, also after maintenance');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'idempotency.keys'::regclass AND attnum > 0}),
	'12', 'the 0.3.1 ledger has 12 columns');
my $dump = $node->basedir . '/v031.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, $node->connstr('postgres') ], 'pg_dump of the 0.3.1 database');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a server with 0.4.0 or later');
is($node->safe_psql('restored', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$node->safe_psql('restored', q{SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'}),
	'the restored extension is the installed default version (0.4.0 or later)');

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

# ---------------------------------------------------------------- 3
my $restored_parts = $node->safe_psql('restored', 'SELECT count(*) FROM idempotency.partitions');
is(digest_index_kinds('restored'), "$restored_parts (digest)",
	'restored: every partition has the (digest) index of 0.3.1');
is($node->safe_psql('restored', q{
	SELECT idem_consume_message('c', 'old-message')::text || ' ' ||
	       idem_consume_message('c', 'new-message')::text}),
	'false true', 'restored: a message id consumed by 0.3.1 is a duplicate; a new one is new');
is($node->safe_psql('restored', q{
	SET ROLE other;
	SELECT idem_consume_message('c', 'old-message')::text || ' ' ||
	       idem_consume_message('c', 'new-message')::text}),
	'false true', 'restored: and another role\'s are its own');

# a transaction that wrote into the ledger and stays open: the rebuild
# waits a second for its locks, gives up and says so; the rest of the
# round is done, and nothing changed
my $holder = $node->background_psql('restored');
$holder->query_safe('BEGIN');
$holder->query_safe(q{SELECT idem_consume_message('c', 'held-open')});
my $message_parts = $node->safe_psql('restored',
	q{SELECT count(*) FROM idempotency.partitions WHERE table_name = 'messages'});
my $offset = -s $node->logfile;
like($node->safe_psql('restored', 'SELECT idem_maintain()'), qr/^\(\d+,\d+\)$/,
	'restored: maintenance runs while a writer keeps its transaction open');
my $log = slurp_file($node->logfile, $offset);
like($log,
	qr/could not rebuild the digest index of table "idempotency\.messages" now, will retry: canceling statement due to lock timeout/,
	'restored: the rebuild of the message ledger could not have its locks in time, and says it will retry');
is(digest_index_kinds('restored', 'messages'), "$message_parts (digest)",
	'restored: and left its (digest) indexes as they were');
like($log, qr/rebuilt the digest index of table "idempotency\.keys" on \(role, digest\)/,
	'restored: the same round rebuilt the key ledger\'s, and said so');
is($node->safe_psql('restored', q{SELECT idem_consume_message('c', 'old-message')}), 'f',
	'restored: a message id of 0.3.1 is still a duplicate meanwhile');
$holder->query_safe('COMMIT');
$holder->quit;

$offset = -s $node->logfile;
$node->safe_psql('restored', 'SELECT idem_maintain()');
like(slurp_file($node->logfile, $offset),
	qr/rebuilt the digest index of table "idempotency\.messages" on \(role, digest\)/,
	'restored: the next round rebuilds the message ledger\'s, and says so');
$restored_parts = $node->safe_psql('restored', 'SELECT count(*) FROM idempotency.partitions');
is(digest_index_kinds('restored'), "$restored_parts (role, digest)",
	'restored: every partition now has one (role, digest) index and no (digest) one');
is($node->safe_psql('restored', q{
	SELECT string_agg(indexdef, E'\n' ORDER BY indexname) FROM pg_indexes
	 WHERE schemaname = 'idempotency' AND tablename IN ('keys', 'messages')}),
	"CREATE INDEX keys_recover_idx ON ONLY idempotency.keys USING btree (role, recover_at) WHERE (recover_at IS NOT NULL)\n"
	. "CREATE INDEX keys_role_digest_idx ON ONLY idempotency.keys USING btree (role, digest) WITH (deduplicate_items=off)\n"
	. "CREATE INDEX messages_role_digest_idx ON ONLY idempotency.messages USING btree (role, digest) WITH (deduplicate_items=off)",
	'restored: the tables\' indexes are those of 0.4.0');
is($node->safe_psql('restored', q{
	SELECT count(*) FROM idempotency.partitions p
	 WHERE p.table_name = 'keys'
	   AND (SELECT pg_get_indexdef(min(i.indexrelid)) FROM pg_index i WHERE i.indrelid = p.partition) !~ '\(role, digest\)'}),
	'0', 'restored: the digest index is the first of every key partition\'s indexes');
is($node->safe_psql('restored', q{
	SELECT idem_consume_message('c', 'old-message')::text || ' ' ||
	       idem_consume_message('c', 'new-message')::text || ' ' ||
	       (SELECT format('%s %s', status, response_body) FROM idem_claim('old-key', '{"a": 1}'))}),
	'false false completed {"b": 2}', 'restored: every row is still found after');
is($node->safe_psql('restored', q{
	SET ROLE other;
	SELECT idem_consume_message('c', 'old-message')::text || ' ' ||
	       idem_consume_message('c', 'new-message')::text || ' ' ||
	       idem_consume_message('c', 'other-new')::text}),
	'false false true', 'restored: another role\'s too');
$node->safe_psql('restored', q{SET idempotency.partition_interval = '6h'; SELECT idem_maintain()});
$restored_parts = $node->safe_psql('restored', 'SELECT count(*) FROM idempotency.partitions');
is(digest_index_kinds('restored'), "$restored_parts (role, digest)",
	'restored: partitions made after have the (role, digest) index');

# the 0.3.1 database, updated
$node->safe_psql('postgres', 'ALTER EXTENSION idempotency UPDATE');
$nparts = $node->safe_psql('postgres', 'SELECT count(*) FROM idempotency.partitions');
is(digest_index_kinds('postgres'), "$nparts (role, digest)",
	'ALTER EXTENSION UPDATE from 0.3.1 rebuilds every partition\'s digest index on (role, digest)');
is($node->safe_psql('postgres', q{
	SELECT idem_consume_message('c', 'old-message')::text || ' ' ||
	       (SELECT format('%s %s', status, response_body) FROM idem_claim('old-key', '{"a": 1}'))}),
	'false completed {"b": 2}', 'and the rows written by 0.3.1 are found after');
is($node->safe_psql('postgres', q{SET ROLE other; SELECT idem_consume_message('c', 'old-message')}),
	'f', 'another role\'s too');

$node->stop;
done_testing();


# test/t/039_key_memory_hostile.pl -- the hostile review of
# idempotency.key_memory (issue 35), with the library preloaded (the
# pieces' digest filters):
#
# 1. Rows written into a piece of the memory by other means than
#    maintenance (here the memory's data restored on its own, after a
#    maintenance round gave the empty restored pieces READY filters) are
#    not hidden by the filters: the remembered key is still answered
#    "expired", the message id false.  The filters' hooks watch the memory
#    tables and their pieces as they watch the ledgers: such a write makes
#    the database's filters UNUSABLE, and the next round builds the pieces'
#    filters from their chunks.  (Before, the empty READY filter ruled the
#    key out: "claimed", and the operation ran a second time.)
#
# Every wait polls for a condition.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $node = PostgreSQL::Test::Cluster->new('key_memory_hostile');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1h'
idempotency.key_memory = '1h'
idempotency.partition_interval = '1s'
idempotency.key_ttl = '1s'
idempotency.message_ttl = '1s'
idempotency.premake = 0
log_min_messages = warning
});
$node->start;

# a maintenance round of our own, run to its end (the worker's round, woken
# by a CREATE EXTENSION, makes idem_maintain() skip: wait for it, again)
sub maintain
{
	my ($db) = @_;
	foreach (1 .. 100)
	{
		my ($rc, $out, $err) = $node->psql($db, 'SELECT idem_maintain()', on_error_die => 1);
		return unless $err =~ /already running/;
		$node->poll_query_until($db, q{
			SELECT NOT EXISTS (SELECT FROM pg_stat_activity
							   WHERE datname = current_database()
								 AND query = 'idempotency maintenance')})
		  or die 'the worker round did not end';
	}
	die 'idem_maintain() skipped 100 times';
}

# the states of the filters of the pieces of database $db
sub piece_filters
{
	my ($db) = @_;
	return $node->safe_psql(
		$db, q{SELECT coalesce(string_agg(coalesce(f.state, 'none'), ',' ORDER BY i.inhrelid), '')
		         FROM pg_inherits i
		         LEFT JOIN idempotency.filter_info() f ON f.partition = i.inhrelid
		        WHERE i.inhparent IN ('idempotency.keys_memory'::regclass,
		                              'idempotency.messages_memory'::regclass)});
}

my $answers_sql = q{
BEGIN;
SELECT (SELECT status FROM idem_claim('order-1')) || ' '
    || idem_consume_message('orders', 'msg-1')::text || ' '
    || (SELECT status FROM idem_claim('order-2'));
ROLLBACK;};

# ------------------------------------- 1. the memory's data restored alone
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION idempotency');
maintain('src');
$node->safe_psql(
	'src', q{
BEGIN;
SELECT status FROM idem_claim('order-1', ttl => '1 second');
SELECT idem_complete('order-1', 201, '{"id": 1}');
COMMIT;
SELECT idem_consume_message('orders', 'msg-1', ttl => '1 second');
});
ok( poll_until(
		'the rows moved to the memory',
		sub {
			maintain('src');
			$node->safe_psql(
				'src', q{SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
				            AND to_regclass('idempotency.messages_memory') IS NOT NULL
				            AND (SELECT count(*) FROM idempotency.keys) = 0
				            AND (SELECT count(*) FROM idempotency.messages) = 0}) eq 't';
		}),
	'maintenance dropped the expired partitions into the memory');
is($node->safe_psql('src', $answers_sql), 'expired false claimed', 'remembered in src');
my @pieces = split /\n/, $node->safe_psql(
	'src', q{SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	          WHERE i.inhparent IN ('idempotency.keys_memory'::regclass,
	                                'idempotency.messages_memory'::regclass)
	          ORDER BY 1});
is(scalar(@pieces), 2, 'one piece per ledger');

my $tmp = PostgreSQL::Test::Utils::tempdir;
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', $node->connstr('src') ],
	'pg_dump of src');
$node->safe_psql('postgres', 'CREATE DATABASE dst');
{
	local $ENV{PGAPPNAME} = 'pg_restore';
	$node->command_ok(
		[ 'pg_restore', '--exit-on-error', '--schema-only', '-d', $node->connstr('dst'), "$tmp/src.dump" ],
		'the schema restored into dst');
}
# a maintenance round between the schema and the data (the worker's, a
# pg_cron job's): the restored pieces are empty, their filters READY
maintain('dst');
is(piece_filters('dst'), 'ready,ready', 'the empty restored pieces have READY filters');
{
	local $ENV{PGAPPNAME} = 'pg_restore';
	$node->command_ok(
		[
			'pg_restore', '--exit-on-error', '--data-only',
			(map { ('-t', $_) } @pieces),
			'-d', $node->connstr('dst'), "$tmp/src.dump"
		],
		"the memory's data restored into dst");
}
is($node->safe_psql('dst', $answers_sql), 'expired false claimed',
	'the restored memory answers: its filters do not hide the restored rows');
maintain('dst');
is(piece_filters('dst'), 'ready,ready', 'the next round builds the filters again');
is($node->safe_psql('dst', $answers_sql), 'expired false claimed',
	'the filters built from the restored chunks keep the answers');

$node->stop;
done_testing();

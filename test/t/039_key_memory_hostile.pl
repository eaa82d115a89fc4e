
# test/t/039_key_memory_hostile.pl -- the hostile review of
# idempotency.key_memory (issue 35), with the library preloaded (the
# memory's digest filter, one per ledger for all its pieces):
#
# 1. Rows written into a piece of the memory by other means than
#    maintenance (here the memory's data restored on its own, after a
#    maintenance round gave the empty restored pieces READY filters) are
#    not hidden by the filters: the remembered key is still answered
#    "expired", the message id false.  The filters' hooks watch the memory
#    tables and their pieces as they watch the ledgers: such a write makes
#    the database's filters UNUSABLE, and the next round builds the
#    memory's filters from the pieces' chunks.  (Before, the empty READY
#    filter ruled the key out: "claimed", and the operation ran a second
#    time.)
# 2. A maintenance run that dropped an expired partition into the memory,
#    its transaction still open (idem_maintain() in a transaction of its
#    own that has not committed yet, or the worker's run going on with the
#    next partitions, the outbox and the filter builds): a claim of a key
#    never seen, and a consume of a new message id, do not wait for it.
#    The partition's filter, which says the key is not there, is kept
#    until the drop commits (before, it was freed at the drop, so every
#    new key of the partition's lane locked the partition to look for its
#    row, and waited for the whole maintenance transaction: here until
#    lock_timeout).  A late retry of a key the partition held waits for
#    the drop, and is answered "expired" once it commits.
# 3. The memory's filter built again by a maintenance run (after such a
#    write, or a restart) holds every chunk of its pieces, also one written
#    after the run took its snapshot: the build reads every tuple version
#    (SnapshotAny), as the builds of the ledgers' filters do.  Here a
#    superuser puts a role's chunk back into a piece while a maintenance
#    run's snapshot (a REPEATABLE READ transaction) predates it; before,
#    the rebuilt READY filter missed the chunk, and the role's key was
#    claimed again.
# 4. An import of remembered keys and ids (import_key_memory(),
#    import_message_memory(): a tenant moved from another node) writes
#    its piece without the executor, as maintenance does: it adds its pairs
#    to the memory's filter, which stays READY, and does not switch the
#    database's filters off (an INSERT into the same piece does).
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

# the states of the filters of the memory of each ledger of database $db
# (keys, messages), and of its pieces' own if any (none: one filter per
# memory)
sub memory_filters
{
	my ($db) = @_;
	return $node->safe_psql(
		$db, q{SELECT coalesce(string_agg(coalesce(f.state, 'none'), ',' ORDER BY m.n), '')
		           || ' ' || (SELECT count(*) FROM idempotency.filter_info() f2
		                        JOIN pg_inherits i ON i.inhrelid = f2.partition
		                       WHERE i.inhparent IN ('idempotency.keys_memory'::regclass,
		                                             'idempotency.messages_memory'::regclass))
		         FROM (VALUES (1, 'idempotency.keys_memory'::regclass),
		                      (2, 'idempotency.messages_memory'::regclass)) m (n, t)
		         LEFT JOIN idempotency.filter_info() f ON f.partition = m.t});
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
is(memory_filters('dst'), 'ready,ready 0', 'the memory of the empty restored pieces has READY filters');
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
is(memory_filters('dst'), 'ready,ready 0', 'the next round builds the filters again');
is($node->safe_psql('dst', $answers_sql), 'expired false claimed',
	'the filters built from the restored chunks keep the answers');

# ------------------ 2. a claim of a new key does not wait for maintenance
$node->safe_psql('postgres', 'CREATE DATABASE w');
$node->safe_psql('w', 'CREATE EXTENSION idempotency');
# partitions made 30 s ahead: the calls below find theirs made (a call
# that must make one waits for a run that made partitions, another wait)
$node->safe_psql('w', 'ALTER DATABASE w SET idempotency.premake = 30');
maintain('w');
$node->safe_psql(
	'w', q{
BEGIN;
SELECT status FROM idem_claim('late', ttl => '1 second');
SELECT idem_complete('late', 201, '{"id": 1}');
COMMIT;
SELECT idem_consume_message('orders', 'late', ttl => '1 second');
});
ok( $node->poll_query_until(
		'w', q{SELECT clock_timestamp() > max(p.upper_bound)
		         FROM idempotency.partitions p
		        WHERE EXISTS (SELECT FROM idempotency.keys k WHERE k.tableoid = p.partition)
		           OR EXISTS (SELECT FROM idempotency.messages m WHERE m.tableoid = p.partition)}),
	'the partitions of the key and the id have ended');
is( $node->safe_psql(
		'w', q{SELECT count(*) FILTER (WHERE f.state = 'ready') || ' of ' || count(*)
		         FROM idempotency.partitions p
		         LEFT JOIN idempotency.filter_info() f ON f.partition = p.partition
		        WHERE EXISTS (SELECT FROM idempotency.keys k WHERE k.tableoid = p.partition)
		           OR EXISTS (SELECT FROM idempotency.messages m WHERE m.tableoid = p.partition)}),
	'2 of 2', 'the two partitions have READY filters');

my $maint = $node->background_psql('w');
ok( $maint->query_safe(q{
	BEGIN;
	SELECT partitions_dropped >= 2 FROM idem_maintain();}) =~ /^t$/m,
	'a maintenance run, its transaction open, dropped the partitions into the memory');

# a new key and a new id: no wait (lock_timeout would end one)
my ($rc, $out, $err) = $node->psql(
	'w', q{
SET lock_timeout = '2s';
BEGIN;
SELECT (SELECT status FROM idem_claim('new-key')) || ' '
    || idem_consume_message('orders', 'new-id')::text;
ROLLBACK;});
is($out, 'claimed true', 'a new key and a new message id do not wait for the maintenance transaction')
  or diag($err);

# the late retry of the key the partition held waits for the drop
my $late = $node->background_psql('w');
my $late_pid = $late->query_safe('SELECT pg_backend_pid()');
$late->query_until(qr/started/, q{
	\echo started
	SELECT status FROM idem_claim('late');
});
ok( $node->poll_query_until(
		'w', "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $late_pid AND NOT granted)"),
	'the late retry waits for the drop of its partition');
$maint->query_safe('COMMIT');
$maint->quit;
my $answer = $late->query_safe('SELECT 1');
like($answer, qr/^expired\n1$/, 'and is answered "expired" once the drop committed');
$late->quit;
is( $node->safe_psql(
		'w', q{BEGIN;
		       SELECT (SELECT status FROM idem_claim('late')) || ' '
		           || idem_consume_message('orders', 'late')::text
		           || ' ' || (SELECT count(*) FROM idempotency.keys_memory)::text;
		       ROLLBACK;}),
	'expired false 1', 'the memory holds the key and the id');

# -------------- 3. the memory's filter rebuilt holds chunks newer than the run
$node->safe_psql('postgres', 'CREATE DATABASE x');
$node->safe_psql('x', 'CREATE EXTENSION idempotency');
$node->safe_psql('x', 'ALTER DATABASE x SET idempotency.premake = 30');
$node->safe_psql('x', 'CREATE ROLE bob; GRANT USAGE ON SCHEMA idempotency TO bob');
maintain('x');
$node->safe_psql(
	'x', q{
BEGIN;
SELECT status FROM idem_claim('order-a', ttl => '1 second');
SELECT idem_complete('order-a', 201);
SET LOCAL ROLE bob;
SELECT status FROM idem_claim('order-b', ttl => '1 second');
SELECT idem_complete('order-b', 201);
COMMIT;
});
my $bob_sql = q{
BEGIN;
SET LOCAL ROLE bob;
SELECT status FROM idem_claim('order-b');
ROLLBACK;};
ok( poll_until(
		'the keys moved to the memory',
		sub {
			maintain('x');
			$node->safe_psql(
				'x', q{SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
				            AND (SELECT count(*) FROM idempotency.keys) = 0}) eq 't';
		}),
	'maintenance dropped the keys of both roles into the memory');
is($node->safe_psql('x', $bob_sql), 'expired', "bob's key is remembered");
my $piece = $node->safe_psql(
	'x', q{SELECT tableoid::regclass FROM idempotency.keys_memory
	        WHERE role = 'bob'::regrole});
$node->safe_psql(
	'x', qq{
CREATE TABLE public.saved AS SELECT * FROM $piece WHERE role = 'bob'::regrole;
DELETE FROM $piece WHERE role = 'bob'::regrole;});

# a maintenance run whose snapshot predates the chunk put back
my $rr = $node->background_psql('x');
$rr->query_safe(q{BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class;});
$node->safe_psql('x', "INSERT INTO $piece SELECT * FROM public.saved");
is($node->safe_psql('x', "SELECT state FROM idempotency.filter_info() WHERE partition = 'idempotency.keys_memory'::regclass"),
	'unusable', "the INSERT into the piece made the memory's filter unusable");
$rr->query_safe('SELECT idem_maintain(); COMMIT;');
$rr->quit;
is($node->safe_psql('x', "SELECT state FROM idempotency.filter_info() WHERE partition = 'idempotency.keys_memory'::regclass"),
	'ready', "the run built the memory's filter again");
is($node->safe_psql('x', $bob_sql), 'expired',
	"bob's key, whose chunk is newer than the run's snapshot, is still remembered");

# ------------- 4. an import writes its piece without the executor's hooks
# src's remembered key and id (part 1), exported, imported into w, whose
# memory's filters are READY: they stay READY, with the imported pairs.
maintain('w');
is(memory_filters('w'), 'ready,ready 0', "w's memory has READY filters");
my $key_record = $node->safe_psql('src',
	q{SELECT format('(%s,%s,%s)', role, digest, expired_by)
	    FROM idempotency.export_key_memory(NULL)});
my $id_record = $node->safe_psql('src',
	q{SELECT format('(%s,%s,%s)', role, digest, expired_by)
	    FROM idempotency.export_message_memory(NULL)});
is( $node->safe_psql(
		'w', qq{SELECT idempotency.import_key_memory('$key_record'::idempotency.memory_record)
		           || ' ' || idempotency.import_message_memory('$id_record'::idempotency.memory_record)}),
	'inserted inserted', "src's key and id imported into w");
is(memory_filters('w'), 'ready,ready 0',
	"the import leaves w's filters READY: it is no external write");
is($node->safe_psql('w', $answers_sql), 'expired false claimed',
	'the imported key and id answer from the filters READY, a new key is claimed');
# the control: the same pair written into the import piece with an INSERT
my $import_piece = $node->safe_psql(
	'w', q{SELECT c.oid::regclass FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
	        WHERE i.inhparent = 'idempotency.keys_memory'::regclass
	          AND c.relname LIKE 'keys\_memory\_import\_%'});
isnt($import_piece, '', 'the import wrote a piece of imported keys');
$node->safe_psql('w', "INSERT INTO $import_piece SELECT * FROM $import_piece");
like(memory_filters('w'), qr/^unusable,unusable 0$/,
	'an INSERT into the same piece switches the filters off');
is($node->safe_psql('w', $answers_sql), 'expired false claimed', 'the answers stay');

$node->stop;
done_testing();


# test/t/037_key_memory.pl -- idempotency.key_memory: expired keys and
# message ids remembered, under load, through a crash and a dump/restore.
#
# 1. The torture workload of 022 (Torture::run_torture: eight clients on 200
#    hot keys and 200 hot message ids, 1 s partitions, keys and ids living
#    2 s, the worker and an idem_maintain() loop dropping a partition per
#    ledger every second) with key_memory = 3 s: a key is remembered for at
#    least 3 s after it expires, so two charges of one key are at least
#    ttl + memory (5 s) apart, and so are two effects of one message id:
#    no key or id runs twice across the whole window.  Keys and ids are
#    still charged again once forgotten.
# 2. The memory outlives a crash (immediate stop): a key whose partition
#    maintenance dropped into the memory is answered "expired" after the
#    restart, a message id false; and pg_dump / pg_restore carry it to
#    another database, where the same answers come, and the memory's pieces
#    are dropped there once it has passed.
# 3. The update from 0.4.0: a key and a message id that expired on 0.4.0
#    are remembered after ALTER EXTENSION UPDATE, in the ledger and then
#    in the memory.
# 4. pg_upgrade (to a new cluster of the same major) carries the memory.

use strict;
use warnings;

use Cwd ();
use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $seconds = $ENV{TORTURE_SECONDS} || 20;

my $node = PostgreSQL::Test::Cluster->new('key_memory');
$node->init;
$node->append_conf('postgresql.conf', torture_conf() . "idempotency.key_memory = '3s'\n");
$node->start;

# ------------------------------------------------------------- 1. torture
$node->safe_psql('postgres', 'CREATE DATABASE torture');
create_business_schema($node, 'torture');
run_torture(
	$node,
	db            => 'torture',
	label         => 'memory',
	seconds       => $seconds,
	maintain_loop => 1,
	memory_us     => 3_000_000);

# ------------------------------------------- 2. crash, dump and restore
# from here on the worker runs one round per database at start and then
# sleeps (naptime 1 h): the test calls idem_maintain() itself, and no drop
# of a partition runs while pg_dump reads the database
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.key_memory = '1h'});
$node->safe_psql('postgres', q{ALTER SYSTEM SET idempotency.naptime = '1h'});
$node->restart;
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION idempotency');
$node->safe_psql(
	'src', q{
BEGIN;
SELECT status FROM idem_claim('order-1', ttl => '1 second');
SELECT idem_complete('order-1', 201, '{"id": 1}');
COMMIT;
SELECT idem_consume_message('orders', 'msg-1', ttl => '1 second');
});

# maintenance drops the partitions into the memory once they have ended
ok( poll_until(
		'the rows moved to the memory',
		sub {
			$node->safe_psql('src', 'SELECT idem_maintain()');
			$node->safe_psql(
				'src', q{SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
				            AND to_regclass('idempotency.messages_memory') IS NOT NULL}) eq 't'
			  && $node->safe_psql(
				'src', q{SELECT (SELECT count(*) FROM idempotency.keys) = 0
			                 AND (SELECT count(*) FROM idempotency.messages) = 0
			                 AND (SELECT count(*) FROM idempotency.keys_memory) > 0
			                 AND (SELECT count(*) FROM idempotency.messages_memory) > 0}) eq 't';
		}),
	'maintenance dropped the expired partitions into the memory');

my $answers_sql = q{
BEGIN;
SELECT (SELECT status FROM idem_claim('order-1')) || ' '
    || (SELECT status FROM idem_lookup('order-1')) || ' '
    || idem_consume_message('orders', 'msg-1')::text || ' '
    || (SELECT status FROM idem_claim('order-2'));
ROLLBACK;};
is($node->safe_psql('src', $answers_sql), 'expired expired false claimed',
	'remembered: the key is expired, the message id consumed, a new key claimed');

$node->stop('immediate');
$node->start;
is($node->safe_psql('src', $answers_sql), 'expired expired false claimed',
	'the memory outlives a crash');
# the worker's round at start is over before pg_dump reads src
ok( poll_until(
		"the worker's first round in src",
		sub {
			$node->safe_psql(
				'src', q{SELECT coalesce(maintenance_runs, 0) > 0 FROM idempotency.stats
				          WHERE datname = 'src'}) eq 't';
		}),
	'the worker maintained src once since the restart');
# the worker's round gave the memory of each ledger its digest filter again
# (shared memory starts empty; one filter for all the pieces), built from
# the chunks: the answers stay
is( $node->safe_psql(
		'src', q{SELECT count(*) FILTER (WHERE f.state = 'ready') || ' of ' || count(*)
		           FROM (VALUES ('idempotency.keys_memory'::regclass),
		                        ('idempotency.messages_memory'::regclass)) m (t)
		           LEFT JOIN idempotency.filter_info() f ON f.partition = m.t}),
	'2 of 2', 'the memory of each ledger has a READY filter after the restart');
is( $node->safe_psql(
		'src', q{SELECT count(*) FROM idempotency.filter_info() f
		           JOIN pg_inherits i ON i.inhrelid = f.partition
		          WHERE i.inhparent IN ('idempotency.keys_memory'::regclass,
		                                'idempotency.messages_memory'::regclass)}),
	'0', 'and no piece has a filter of its own');
is($node->safe_psql('src', $answers_sql), 'expired expired false claimed',
	'the filters rebuilt from the pieces keep the answers');

my $tmp = PostgreSQL::Test::Utils::tempdir;
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', $node->connstr('src') ],
	'pg_dump of a database with a memory');
$node->safe_psql('postgres', 'CREATE DATABASE dst');
# the restore names itself, so that the worker, woken by its CREATE
# EXTENSION, leaves the database alone until it is over (the TAP
# framework's PGAPPNAME would name it otherwise)
{
	local $ENV{PGAPPNAME} = 'pg_restore';
	$node->command_ok(
		[ 'pg_restore', '--exit-on-error', '-d', $node->connstr('dst'), "$tmp/src.dump" ],
		'pg_restore of it');
}
is($node->safe_psql('dst', $answers_sql), 'expired expired false claimed',
	'the restored database remembers the same keys and ids');
# pg_restore does not carry the AUTO dependency of the memory tables on
# the extension (they are not members); maintenance (the test's, or the
# worker's once the restore is over) gives it back
$node->safe_psql('dst', 'SELECT idem_maintain()');
is( $node->safe_psql(
		'dst', q{SELECT count(*) FROM pg_depend
		          WHERE objid IN ('idempotency.keys_memory'::regclass, 'idempotency.messages_memory'::regclass)
		            AND refclassid = 'pg_extension'::regclass AND deptype = 'a'}),
	'2', 'maintenance gives it back, so that DROP EXTENSION takes the memory');

# the memory passes: the pieces go, the key and the id are new again
$node->safe_psql(
	'dst', q{
ALTER DATABASE dst SET idempotency.key_memory = '1s';
});
ok( poll_until(
		'the pieces forgotten',
		sub {
			$node->safe_psql('dst', 'SELECT idem_maintain()');
			$node->safe_psql(
				'dst', q{SELECT (SELECT count(*) FROM idempotency.keys_memory)
				              + (SELECT count(*) FROM idempotency.messages_memory) = 0}) eq 't';
		}),
	'maintenance drops the pieces once the memory has passed');
is( $node->safe_psql(
		'dst', q{
BEGIN;
SELECT (SELECT status FROM idem_claim('order-1')) || ' '
    || idem_consume_message('orders', 'msg-1')::text;
ROLLBACK;}),
	'claimed true',
	'after the memory, the key and the id are new');
$node->safe_psql('dst', 'DROP EXTENSION idempotency');
is( $node->safe_psql(
		'dst', q{SELECT count(*) FROM pg_class
		          WHERE relname LIKE 'keys\_memory%' OR relname LIKE 'messages\_memory%'}),
	'0', 'DROP EXTENSION takes the memory tables with it');

# ------------------------------------------ 2b. the memory's filter in a run
# The run that writes the memory's first piece (a partition dropped into
# it) fills the memory's filter from the pieces, the one its own
# transaction wrote included: a filter filled without it rules out its
# key ("claimed").  A later run writes a new piece and drops the first
# (the memory has passed for it): the filter keeps the dropped piece's
# bits (freeing it would have calls probe the pieces, and wait for the
# run's transaction on the one it drops) and takes the new piece's pairs.
$node->safe_psql('postgres', 'CREATE DATABASE refill');
$node->safe_psql('refill', 'CREATE EXTENSION idempotency');
ok( poll_until(
		"the worker's first round in refill",
		sub {
			$node->safe_psql(
				'refill', q{SELECT coalesce(maintenance_runs, 0) > 0 FROM idempotency.stats
				             WHERE datname = 'refill'}) eq 't';
		}),
	'the worker maintained refill once (it sleeps an hour after)');
is( $node->safe_psql(
		'refill', q{
SET idempotency.partition_interval = '1s';
SET idempotency.key_ttl = '1s';
SET idempotency.premake = 0;
SET idempotency.key_memory = '3s';
CREATE FUNCTION pg_temp.remember(k text) RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
  PERFORM idem_claim(k, ttl => '1 second');
  PERFORM idem_complete(k, 200);
  RETURN (SELECT p.upper_bound FROM idempotency.partitions p
           WHERE p.partition = (SELECT k2.tableoid FROM idempotency.keys k2
                                 WHERE k2.expires_at > now() ORDER BY k2.expires_at DESC LIMIT 1));
END $$;
CREATE FUNCTION pg_temp.wait_until(t timestamptz) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  WHILE clock_timestamp() <= t LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT pg_temp.remember('first') AS first_ends \gset
SELECT pg_temp.wait_until(:'first_ends') \gset
SELECT count(*) AS n FROM idem_maintain() \gset
SELECT (SELECT state FROM idempotency.filter_info()
         WHERE partition = 'idempotency.keys_memory'::regclass) || ' '
    || (SELECT status FROM idem_claim('first', ttl => '1 second', lease => '1 second'))
    AS first_run \gset
SELECT count(*) AS n FROM idem_maintain() \gset
SELECT pg_temp.remember('second') AS second_ends \gset
SELECT pg_temp.wait_until(:'second_ends') \gset
-- the memory passes for the first piece (its range is its partition's)
SELECT pg_temp.wait_until(:'first_ends'::timestamptz + interval '3.1 seconds') \gset
SELECT partitions_dropped AS n FROM idem_maintain() \gset
SELECT (SELECT count(*) FROM pg_inherits
         WHERE inhparent = 'idempotency.keys_memory'::regclass) || ' '
    || (SELECT state FROM idempotency.filter_info()
         WHERE partition = 'idempotency.keys_memory'::regclass) || ' '
    || (SELECT status FROM idem_claim('second', ttl => '1 second', lease => '1 second')) || ' '
    || (SELECT status FROM idem_claim('first', ttl => '1 second', lease => '1 second'))
    || ' (first run: ' || :'first_run' || ')';
}),
	'1 ready expired claimed (first run: ready expired)',
	'the filter the first piece\'s run filled holds it; the run that drops it keeps the filter and adds the new piece');

# ------------------------------------------------- 3. the update from 0.4.0
# A database on 0.4.0 (no memory there) whose key and message id expired
# before the update: after ALTER EXTENSION UPDATE, the expired rows are
# remembered, and maintenance moves them into the memory.
$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', q{CREATE EXTENSION idempotency VERSION '0.4.0'});
$node->safe_psql(
	'old', q{
BEGIN;
SELECT status FROM idem_claim('order-1', ttl => '1 second');
SELECT idem_complete('order-1', 201, '{"id": 1}');
COMMIT;
SELECT idem_consume_message('orders', 'msg-1', ttl => '1 second');
});
ok( poll_until(
		'the rows of 0.4.0 ended',
		sub {
			$node->safe_psql(
				'old', q{SELECT clock_timestamp() > max(p.upper_bound)
				           FROM idempotency.partitions p
				          WHERE EXISTS (SELECT FROM idempotency.keys k WHERE k.tableoid = p.partition)
				             OR EXISTS (SELECT FROM idempotency.messages m WHERE m.tableoid = p.partition)}) eq 't';
		}),
	'the key and the id written on 0.4.0 expired and their partitions ended');
$node->safe_psql('old', 'ALTER EXTENSION idempotency UPDATE');
is($node->safe_psql('old', q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'0.5.0', 'updated to 0.5.0');
is($node->safe_psql('old', $answers_sql), 'expired expired false claimed',
	'after the update, what expired on 0.4.0 is remembered');
ok( poll_until(
		'the rows of 0.4.0 moved to the memory',
		sub {
			$node->safe_psql('old', 'SELECT idem_maintain()');
			$node->safe_psql(
				'old', q{SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
				            AND (SELECT count(*) FROM idempotency.keys) = 0
				            AND (SELECT count(*) FROM idempotency.messages) = 0}) eq 't';
		}),
	'maintenance moved them into the memory');
is($node->safe_psql('old', $answers_sql), 'expired expired false claimed',
	'and the memory answers for them');

# ------------------------------------------------------- 4. pg_upgrade
# pg_upgrade to a new cluster (of the same major: the suite has no other
# here; 041_pg_upgrade.pl runs 17 to 18 where both are installed) carries
# the memory tables with their pieces, as it carries the ledgers.
$node->stop;
my $new = PostgreSQL::Test::Cluster->new('key_memory_new');
$new->init;
$new->append_conf('postgresql.conf', torture_conf()
	  . "idempotency.key_memory = '1h'\nidempotency.naptime = '1h'\n");
my $bindir = $node->config_data('--bindir');
# pg_upgrade writes its scripts into the current directory: a scratch one
my $cwd = Cwd::getcwd();
chdir PostgreSQL::Test::Utils::tempdir or die "chdir: $!";
command_ok(
	[
		"$bindir/pg_upgrade", '--no-sync',
		'-d', $node->data_dir, '-D', $new->data_dir,
		'-b', $bindir, '-B', $bindir,
		'-s', $new->host, '-p', $node->port, '-P', $new->port
	],
	'pg_upgrade moves a cluster with a memory');
chdir $cwd or die "chdir: $!";
$new->start;
for my $db ('src', 'old')
{
	is($new->safe_psql($db, $answers_sql), 'expired expired false claimed',
		"after pg_upgrade, database $db remembers the same keys and ids");
}
$new->stop;
done_testing();

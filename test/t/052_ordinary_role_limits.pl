
# test/t/052_ordinary_role_limits.pl -- what one ordinary role does with the
# extension never makes another role's calls fail, nor stops maintenance.
#
#   1. A fake restore: a role that names its connection "pg_restore" (any
#      role can) and stays connected does not hold maintenance off; a role
#      that may restore the ledgers (the superuser) still does.
#   2. A view that pins expired partitions: any role can make an object
#      depend on a partition by OID (a regclass constant needs no privilege
#      on the table); maintenance still drops the partition, and the object
#      goes with it.
#   3. A backfill that writes many keys into a partition its own
#      transaction made keeps a lock per key until it commits: it is bounded
#      by max_locks_per_transaction, so the shared lock table never fills
#      and other roles' claims go on (on 0.3.0 they failed with "out of
#      shared memory"); and where a partition maker worker can be started
#      (with or without preloading), no lock is kept at all.
#   4. A ttl flood: a role claiming keys with hundreds of distinct long
#      ttls does not multiply a lane's partitions (on 0.3.0 each ttl made
#      one, and past 256 every role's claims in the lane failed).
# Every wait polls for a condition.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# ---------------------------------------------------------------- 1, 2
my $node = PostgreSQL::Test::Cluster->new('limits');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 1
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
log_min_messages = warning
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE app LOGIN;
	CREATE ROLE creep LOGIN;
	CREATE SCHEMA creep AUTHORIZATION creep;
	CREATE EXTENSION idempotency;
});

sub stat_of
{
	my ($column) = @_;
	return $node->safe_psql('postgres',
		"SELECT coalesce(max($column), 0) FROM idempotency.stats WHERE datname = 'postgres'");
}

ok($node->poll_query_until('postgres',
		q{SELECT partitions_dropped > 0 FROM idempotency.stats WHERE datname = 'postgres'}),
	'the worker maintains the database');

# 1. an ordinary role's "pg_restore"
my $fake = $node->background_psql('postgres', extra_params => [ '-U', 'app' ]);
$fake->query_safe(q{SET application_name = 'pg_restore'});
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_restore' AND usename = 'app'}),
	'1', 'an ordinary role is connected as "pg_restore"');
my $dropped = stat_of('partitions_dropped');
ok($node->poll_query_until('postgres',
		"SELECT partitions_dropped >= $dropped + 4 FROM idempotency.stats WHERE datname = 'postgres'"),
	'maintenance goes on dropping partitions meanwhile');
$fake->quit;

# ... the superuser's restore still holds maintenance off
my $restore = $node->background_psql('postgres');
$restore->query_safe(q{SET application_name = 'pg_restore'});
my $off = -s $node->logfile;
$node->append_conf('postgresql.conf', 'log_min_messages = log');
$node->reload;
ok($node->wait_for_log(qr/pg_restore is connected to database "postgres", not maintaining it this round/, $off),
	'a restoring superuser still holds maintenance off');

# 2. a view on every partition there is, by OID, made while that restore
# still holds maintenance off: a regclass constant takes no lock, so a view
# made while its partition is being dropped would miss the drop's CASCADE
# (or record no dependency at all), and stay (2 of 12 views in a
# newcomer's run on a busy machine)
$node->safe_psql('postgres', q{
	SET ROLE app;
	SELECT idem_consume_message('c', 'm' || i) FROM generate_series(1, 20) AS i;
});
my $pinned = $node->safe_psql('postgres', q{
	SELECT string_agg(c.oid::text, ',') FROM pg_class c
	 WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r'
	   AND c.relispartition});
# (a partition gone since $pinned was read is skipped)
my $views = $node->safe_psql('postgres', qq{
	SET ROLE creep;
	DO \$\$
	DECLARE
		r oid;
	BEGIN
		FOREACH r IN ARRAY '{$pinned}'::oid[] LOOP
			BEGIN
				EXECUTE format('CREATE VIEW creep.pin_%s AS SELECT %L::regclass AS r', r, r);
			EXCEPTION WHEN undefined_object OR undefined_table THEN
				NULL;
			END;
		END LOOP;
	END \$\$;
	SELECT count(*) FROM pg_views WHERE schemaname = 'creep' AND viewname LIKE 'pin\\_%'});
my @pinned = split /,/, $pinned;
my $npinned = scalar @pinned;
ok($views > 0 && $views == $npinned,
	"an ordinary role makes $views views that depend on the partitions, one on each ($npinned)");
$restore->quit;
$node->append_conf('postgresql.conf', 'log_min_messages = warning');
$node->reload;
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_class WHERE oid IN ($pinned)"),
	'maintenance drops every one of those partitions when it expires');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_class WHERE relnamespace = 'creep'::regnamespace}),
	'0', 'and the views went with them');
is($node->safe_psql('postgres',
		q{SELECT coalesce(last_maintenance_error, '') FROM idempotency.stats WHERE datname = 'postgres'}),
	'', 'without a failed round since');
$node->stop;

# ---------------------------------------------------------------- 3
# No preloading.  A small lock table: (max_connections + autovacuum workers
# + 1 + max_worker_processes + max_wal_senders) * max_locks_per_transaction.
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->append_conf('postgresql.conf', q{
max_connections = 10
max_locks_per_transaction = 64
max_worker_processes = 0
max_parallel_workers = 0
log_min_messages = warning
});
$plain->start;
$plain->safe_psql('postgres', q{
	CREATE ROLE victim LOGIN;
	CREATE ROLE backfill LOGIN;
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
});

# 3. a backfill into a partition its own transaction made (no worker slot)
my $bf = $plain->background_psql('postgres', on_error_stop => 0);
my ($out, $err);
$bf->query_safe('SET ROLE backfill');
$bf->query_safe('BEGIN');
($out) = $bf->query(q{
	DO $$
	BEGIN
		FOR i IN 1..100000 LOOP
			BEGIN
				PERFORM idem_claim('backfill-' || i, ttl => '10 days', lease => '1 day');
			EXCEPTION WHEN out_of_memory THEN
				RAISE NOTICE 'the lock table is full after % keys', i - 1;
				EXIT;
			END;
		END LOOP;
	END
	$$});
$err = $bf->{stderr};
$bf->{stderr} = '';
like($err, qr/too many keys written into partitions made by this transaction/,
	'the backfill is refused once it keeps max_locks_per_transaction key locks');
unlike($err, qr/the lock table is full/, 'before the lock table is full');
my ($vret, $vout, $verr) = $plain->psql('postgres', q{
	SET ROLE victim;
	SELECT count(*) FROM (SELECT idem_claim('v-' || i, lease => '1 minute') FROM generate_series(1, 50) AS i) s});
is($vret, 0, 'meanwhile another role claims 50 keys') or diag($verr);
$bf->query_safe('ROLLBACK');
$bf->quit;

# where a partition maker can run (no preloading needed), the backfill
# keeps no lock and is not bounded
$plain->append_conf('postgresql.conf', 'max_worker_processes = 4');
$plain->restart;
$bf = $plain->background_psql('postgres');
$bf->query_safe('SET ROLE backfill');
$bf->query_safe('BEGIN');
$bf->query_safe(q{SELECT count(*) FROM (SELECT idem_claim('backfill-' || i, ttl => '12 days', lease => '1 day')
                                          FROM generate_series(1, 3000) AS i) s});
is($plain->safe_psql('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND a.usename = 'backfill'}),
	'0', 'with a partition maker, a backfill of 3000 keys keeps no key lock');
my ($wret, $wout, $werr) = $plain->psql('postgres', q{
	SET ROLE victim;
	SELECT count(*) FROM (SELECT idem_claim('w-' || i, lease => '1 minute') FROM generate_series(1, 50) AS i) s});
is($wret, 0, 'and another role claims meanwhile') or diag($werr);
$bf->query_safe('COMMIT');
$bf->quit;

$plain->stop;

# ---------------------------------------------------------------- 4
# One partition per hour (a lane per layout), ttls up to 30 days, each
# claim in a transaction of its own.
my $flood = PostgreSQL::Test::Cluster->new('flood');
$flood->init;
$flood->append_conf('postgresql.conf', q{
idempotency.key_ttl = 3600
idempotency.partition_interval = 3600
log_min_messages = warning
});
$flood->start;
$flood->safe_psql('postgres', q{
	CREATE ROLE flooder LOGIN;
	CREATE ROLE victim LOGIN;
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
});
my $claims = join '', map {
	"SELECT status FROM idem_claim('flood-$_', ttl => '$_ hours', lease => '30 minutes');\n"
} grep { $_ % 2 == 0 } 2 .. 719;
my ($fret, $fout, $ferr) = $flood->psql('postgres', "SET ROLE flooder;\n$claims");
is($ferr, '', 'a role claims keys with 359 distinct ttls of up to 30 days, one transaction each');
# maintenance comes by, as pg_cron would, and makes the partitions ahead
$flood->safe_psql('postgres', 'SELECT idem_maintain()');
my $lane_max = $flood->safe_psql('postgres', q{
	SELECT max(n) FROM (SELECT count(*) AS n FROM idempotency.partition_info()
	                     WHERE table_name = 'keys' AND upper_bound > now() GROUP BY lanes, lane) s});
cmp_ok($lane_max, '<=', 1 + 4 + 2 * 16,
	"no lane has more than premake + 4 + 2 * 16 live key partitions ($lane_max)");
($fret, $fout, $ferr) = $flood->psql('postgres', q{
	SET ROLE victim;
	SELECT status FROM idem_claim('after-the-flood', ttl => '3 hours', lease => '1 minute')});
is($fout, 'claimed', 'another role still claims, with a ttl of its own') or diag($ferr);
$flood->stop;

done_testing();

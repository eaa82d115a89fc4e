
# test/t/031_pg_cron.pl -- maintenance without preloading idempotency:
# idem_maintain() scheduled by pg_cron, as README documents.
#
# pg_cron (Debian's postgresql-15-cron, 1.4) is really installed and runs
# the schedule '* * * * *' in background workers; the test waits for its
# runs (up to about two minutes: pg_cron 1.4 schedules by the minute) and
# checks that they made the partitions ahead and dropped the expired ones.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'pg_cron'
cron.database_name = 'postgres'
cron.use_background_workers = on
max_worker_processes = 16
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
});
$node->start;

$node->safe_psql('postgres', 'CREATE EXTENSION pg_cron');
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempotency%'}),
	'0', 'idempotency is not preloaded: no launcher');

# Partitions made on demand now, so that there is something to expire.
$node->safe_psql('postgres', q{SELECT idem_consume_message('c', 'm1')});
$node->safe_psql('postgres', q{BEGIN;
SELECT status FROM idem_claim('k1');
SELECT idem_complete('k1', 200, '{}');
COMMIT;});
my ($first, $first_end) = split /\|/, $node->safe_psql('postgres',
	q{SELECT partition::text || '|' || upper_bound FROM idempotency.partitions
	   ORDER BY partition::text LIMIT 1});
ok(defined $first_end && $first ne '', 'partitions exist before the schedule');

# README: SELECT cron.schedule('idempotency', '* * * * *', 'SELECT idem_maintain()')
$node->safe_psql('postgres',
	q{SELECT cron.schedule('idempotency', '* * * * *', 'SELECT idem_maintain()')});

$PostgreSQL::Test::Utils::timeout_default = 240
  if $PostgreSQL::Test::Utils::timeout_default < 240;
# pg_cron starts runs on the minute: the first one may come before that
# partition's range has ended (the test started just before a minute), so
# wait for a run that started after it ended
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) > 0 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	 WHERE j.jobname = 'idempotency' AND d.status = 'succeeded'
	   AND d.start_time > '$first_end'::timestamptz}),
	'pg_cron ran idem_maintain() after the first partition ended');

is($node->safe_psql('postgres', q{
	SELECT count(*) FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	 WHERE j.jobname = 'idempotency' AND d.status <> 'succeeded'}),
	'0', 'no run failed');

is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_class WHERE oid::regclass::text = '$first'"),
	'0', 'the run dropped the expired partition');

# Made ahead: both ledgers cover the time of the run up to its ttl, so the
# run created partitions (the ones made on demand expired a minute ago).
is($node->safe_psql('postgres', q{
	SELECT count(DISTINCT table_name) FROM idempotency.partitions p,
	       (SELECT max(start_time) AS t FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	         WHERE j.jobname = 'idempotency' AND d.status = 'succeeded') r
	 WHERE p.lower_bound <= r.t AND p.upper_bound > r.t}),
	'2', 'the run made partitions ahead for both ledgers');

like($node->safe_psql('postgres', q{
	SELECT return_message FROM cron.job_run_details d JOIN cron.job j USING (jobid)
	 WHERE j.jobname = 'idempotency' ORDER BY runid LIMIT 1}),
	qr/^SELECT 1$/, 'pg_cron reports the run');

$node->stop;
done_testing();

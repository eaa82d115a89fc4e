
# test/t/029_index_access_methods.pl -- a DBA's indexes of other access
# methods on ledger partitions are kept complete, and leave nothing behind.
#
# The extension writes index entries itself, for every index of a
# partition.  Since PostgreSQL 17 an access method may keep state across
# the inserts of one statement (BRIN keeps a pinned buffer of its range
# map) and must be given the chance to release it (index_insert_cleanup):
# before 0.3.1 that never happened, so a transaction that wrote into a
# partition with a BRIN index ended with "resource was not closed"
# warnings, one per row.  Here the DBA adds BRIN, hash and btree indexes to
# every partition; a batch of 2,000 message ids, keys claimed and completed
# in one transaction and a two-phase claim write into them: no warning in
# the client's output or the server log, and each index finds every row.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('index_ams');
$node->init;
$node->append_conf('postgresql.conf', q{
log_min_messages = warning
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
	CREATE ROLE app;
});

# the DBA's indexes, on every partition of both ledgers
$node->safe_psql('postgres', q{
DO $$
DECLARE
	p regclass;
BEGIN
	FOR p IN SELECT partition FROM idempotency.partition_info() LOOP
		EXECUTE format('CREATE INDEX ON %s USING brin (expires_at)', p);
		EXECUTE format('CREATE INDEX ON %s USING hash (role)', p);
		EXECUTE format('CREATE INDEX ON %s (lane, expires_at)', p);
	END LOOP;
END $$;
});

my $offset = -s $node->logfile;
my ($ret, $out, $err) = $node->psql('postgres', q{
	SET client_min_messages = warning;
	SET ROLE app;
	BEGIN;
	SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'm' || i FROM generate_series(1, 2000) i));
	SELECT count(*) FROM (SELECT idem_claim('k' || i) FROM generate_series(1, 200) i) s;
	SELECT count(*) FROM (SELECT idem_complete('k' || i, 200, '{"ok": true}') FROM generate_series(1, 200) i) s;
	SELECT status FROM idem_claim('two-phase', lease => '1 hour');
	COMMIT;
});
is($ret, 0, 'the transaction commits');
is($err, '', 'with no warning');
my $log = slurp_file($node->logfile, $offset);
unlike($log, qr/WARNING|resource was not closed|leak/, 'and none in the server log');

# every index finds every row
foreach my $ledger ('messages', 'keys')
{
	my $rows = $node->safe_psql('postgres', "SELECT count(*) FROM idempotency.$ledger");
	foreach my $probe (
		[ 'brin',  q{expires_at > '-infinity'} ],
		[ 'hash',  q{role = 'app'::regrole} ],
		[ 'btree', q{lane > -32768 AND expires_at > '-infinity'} ])
	{
		my ($am, $cond) = @$probe;
		is($node->safe_psql('postgres', qq{
				SET enable_seqscan = off;
				SET enable_indexscan = @{[ $am eq 'brin' ? 'off' : 'on' ]};
				SET enable_bitmapscan = on;
				SELECT count(*) FROM idempotency.$ledger WHERE $cond}),
			$rows, "$ledger: the $am index finds all $rows rows");
	}
}

$node->stop;
done_testing();

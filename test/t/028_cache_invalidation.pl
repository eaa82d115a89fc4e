
# test/t/028_cache_invalidation.pl -- a backend's first read of the list of
# partitions does not drop an invalidation that arrives while it reads.
#
# The list is read from pg_inherits under a catalog snapshot; a partition
# attached and committed after that snapshot is missing from what was
# read, and only the relcache invalidation of the ledger's table tells the
# reader to read again.  Before 0.3.1 the invalidation was matched against
# the table's OID, which a first read had not yet recorded, so it was lost:
# the backend kept a list without the new partition until the next DDL on
# the ledger (a day by default).
#
# Made deterministic with locks: a session warms its caches so that its
# first read of the list starts the pg_inherits scan without waiting, then
# waits inside it for pg_class, which another session holds while it
# attaches a partition and commits.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cache');
$node->init;
$node->append_conf('postgresql.conf', q{
idempotency.partition_interval = 60
idempotency.key_ttl = 120
idempotency.message_ttl = 120
log_min_messages = warning
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
});

my $reader = $node->background_psql('postgres', on_error_stop => 0);
# everything the first read needs before its scan, in this backend's caches
$reader->query_safe(q{
	PREPARE list AS SELECT count(*) FROM idempotency.partition_info() WHERE table_name = 'messages';
	SELECT 'idempotency.messages'::regclass, 'idempotency.keys'::regclass;
	SET enable_seqscan = off;
	SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency.messages'::regclass;
	RESET enable_seqscan;
});
my $pid = $reader->query_safe('SELECT pg_backend_pid()');

# a third session watches, its statement planned before pg_class is taken
my $watch = $node->background_psql('postgres', on_error_stop => 0);
$watch->query_safe(qq{
	PREPARE waiting AS SELECT count(*) FROM pg_stat_activity WHERE pid = $pid AND wait_event_type = 'Lock';
	EXECUTE waiting;
});

my $ddl = $node->background_psql('postgres', on_error_stop => 0);
$ddl->query_safe(q{
	BEGIN;
	LOCK TABLE pg_catalog.pg_class IN ACCESS EXCLUSIVE MODE;
});
$reader->query_until(qr/reading/, q{
	\echo reading
	EXECUTE list;
});
my $waits = 0;
foreach (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
{
	$waits = $watch->query_safe('EXECUTE waiting');
	last if $waits eq '1';
	select(undef, undef, undef, 0.1);
}
is($waits, '1', 'the first read of the list waits for pg_class inside its scan');
$ddl->query_safe(q{
	SET idempotency.premake = 5;
	SELECT idem_maintain();
	COMMIT;
});
$ddl->quit;

my $actual = $node->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.partition_info() WHERE table_name = 'messages'});
$reader->query_safe('SELECT 1');	# the first read's answer
is($reader->query_safe('EXECUTE list'), $actual,
	'the next read in that backend has every partition, the one attached meanwhile included');
$reader->quit;
$watch->quit;

$node->stop;
done_testing();

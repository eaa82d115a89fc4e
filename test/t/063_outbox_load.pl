
# test/t/063_outbox_load.pl -- no event lost, none twice, one key's events
# in commit order, under a mixed load.
#
# Eight pgbench clients publish for OUTBOX_LOAD_SECONDS (default 10): each
# transaction publishes one or two events of one of 16 keys, holds its
# transaction open for up to 300 ms one time in ten (a slow business
# transaction that commits after many others with higher event numbers),
# and rolls back one time in ten.  Each records what it published in a
# table of its own, in the same transaction (so a rolled-back transaction
# leaves nothing), with the key's commit rank (a counter per key updated
# in the transaction, so same-key transactions commit in rank order).
# Meanwhile a relay takes batches of up to 50 events and records each event
# with its receiving order in the transaction that acknowledges the batch,
# and idem_maintain() runs between batches with a retention of one second,
# so segments are made and dropped under the load.  After the load the
# relay drains the outbox.
#
# Checked: the events received are exactly the events committed (none
# missing, none of a rolled-back transaction), each received once, and the
# events of every key received in commit-rank order; the relay has no lag.
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/063_outbox_load.pl

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seconds = $ENV{OUTBOX_LOAD_SECONDS} // 10;

my $node = PostgreSQL::Test::Cluster->new('outbox_load');
$node->init;
$node->append_conf('postgresql.conf', q{
max_connections = 30
idempotency.outbox_retention = '1s'
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE TABLE published (event_id uuid PRIMARY KEY, key text NOT NULL, rank int NOT NULL);
CREATE TABLE key_rank (key text PRIMARY KEY, n int NOT NULL);
INSERT INTO key_rank SELECT 'k' || i, 0 FROM generate_series(0, 15) AS i;
CREATE TABLE received (event_id uuid NOT NULL, key text, ord bigserial, batch bigint NOT NULL);
-- one relay step: a batch recorded and acknowledged in one transaction
CREATE FUNCTION relay_once() RETURNS int LANGUAGE plpgsql AS $$
DECLARE b bigint; k int;
BEGIN
  INSERT INTO received (event_id, key, batch)
  SELECT n.event_id, n.key, n.batch FROM idem_outbox_next('load', 'orders', 50) AS n;
  GET DIAGNOSTICS k = ROW_COUNT;
  IF k > 0 THEN
    SELECT max(batch) INTO b FROM received;
    PERFORM idem_outbox_ack('load', 'orders', b);
  END IF;
  RETURN k;
END $$;
-- the first event makes the events table
INSERT INTO published SELECT idem_publish('orders', '{"first": true}', 'k0'), 'k0', 0;
});

my $script = $node->basedir . '/publish.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
\set key random(0, 15)
\set two random(1, 2)
\set slow random(1, 10)
\set abort random(1, 10)
BEGIN;
UPDATE key_rank SET n = n + 1 WHERE key = 'k' || :key;
INSERT INTO published SELECT idem_publish('orders', jsonb_build_object('i', i), 'k' || :key), 'k' || :key,
                             (SELECT n FROM key_rank WHERE key = 'k' || :key)
  FROM generate_series(1, :two) AS i;
SELECT pg_sleep(CASE WHEN :slow = 1 THEN random() * 0.3 ELSE 0 END);
\if :abort = 1
ROLLBACK;
\else
COMMIT;
\endif
});

my ($out, $err) = ('', '');
my $bench = IPC::Run::start(
	[
		'pgbench', '-n', '-c', '8', '-j', '2', '-T', $seconds,
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres'
	],
	'<', \undef, '>', \$out, '2>', \$err);

# relay and maintain while the load runs
my $steps = 0;
while ($bench->pumpable)
{
	$node->safe_psql('postgres', 'SELECT relay_once()');
	$node->safe_psql('postgres', 'SELECT idem_maintain()') if ++$steps % 5 == 0;
	$bench->pump_nb;
}
$bench->finish;
is($bench->result(0), 0, 'pgbench exits 0') or diag($err);
like($out, qr/number of failed transactions: 0 /, 'no failed transaction') if $out =~ /failed/;

# drain
for (1 .. 10000)
{
	last if $node->safe_psql('postgres', 'SELECT relay_once()') eq '0';
}
$node->safe_psql('postgres', 'SELECT idem_maintain()');

my $published = $node->safe_psql('postgres', 'SELECT count(*) FROM published');
note("published and committed: $published events; relay steps during the load: $steps");
cmp_ok($published, '>', 100, 'the load published events');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM published AS p
	 WHERE NOT EXISTS (SELECT FROM received AS r WHERE r.event_id = p.event_id)}),
	'0', 'every committed event was received')
  or diag($node->safe_psql('postgres', q{
	SELECT string_agg(format('%s %s %s', p.event_id, p.key, p.rank), E'\n')
	  FROM published AS p
	 WHERE NOT EXISTS (SELECT FROM received AS r WHERE r.event_id = p.event_id)}));
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM received AS r
	 WHERE NOT EXISTS (SELECT FROM published AS p WHERE p.event_id = r.event_id)}),
	'0', 'no event of a rolled-back transaction was received');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT event_id FROM received GROUP BY event_id HAVING count(*) > 1) AS d}),
	'0', 'no event was received twice');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM (
	  SELECT p.key, p.rank, lag(p.rank) OVER (PARTITION BY p.key ORDER BY r.ord) AS before
	    FROM received AS r JOIN published AS p USING (event_id)) AS s
	 WHERE s.rank < s.before}),
	'0', 'the events of every key were received in commit order');
is($node->safe_psql('postgres', q{SELECT lag_events FROM idem_outbox_relays() WHERE relay = 'load'}),
	'0', 'the relay has no lag');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM idempotency.outbox_segments}),
	'<=', 3, 'segments were dropped under the load')
  or diag($node->safe_psql('postgres', q{SELECT string_agg(seg || ' ' || opened_at, E'\n') FROM idempotency.outbox_segments}));

$node->stop;
done_testing();

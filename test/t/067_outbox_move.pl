
# test/t/067_outbox_move.pl -- a tenant's outbox moved between two clusters
# under publishing load: every committed event of its topic reaches its
# relay exactly once, on one node or the other, each key's events in
# commit order; the tenant that stays is undisturbed.
#
# Node A: four pgbench clients publish for OUTBOX_MOVE_SECONDS (default 4)
# into topic "acme" (the tenant that moves) and "stay" (one that stays),
# one or two events of one of 8 keys per transaction, one in ten rolled
# back, recording what they published (with the key's commit rank) in the
# same transaction; relays "hook" and "tap" (smaller batches) relay acme
# and "stay-hook" relays stay, each recording what it received in the
# transaction that acknowledges the batch.  Then the move: the handler's
# lock on the tenant's row stops acme's writes (pgbench goes on with
# stay), acme's relays stop (hook with a batch handed out and not
# acknowledged: a relay that died before delivering it), acme's relays and
# events are exported to files and imported on node B in one transaction
# (and once more: a retried import), with the key ranks (the business
# rows); then acme is published on node B (pgbench) while its relays run
# there, and node A keeps publishing to stay.
#
# Checked: hook received every committed acme event exactly once across
# the two nodes, none of a rolled-back transaction, each key's events in
# commit order; tap every one at least once (two relays may each have
# acknowledged an event the other had not: then the one whose name sorts
# first, hook, gets exactly its own, doc/reference.md); stay-hook
# every stay event once; the retried import wrote nothing; no lag is left.
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/067_outbox_move.pl

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seconds = $ENV{OUTBOX_MOVE_SECONDS} // 4;

my $setup = q{
CREATE EXTENSION idempotency;
CREATE ROLE app LOGIN;
CREATE TABLE tenant (name text PRIMARY KEY, here boolean NOT NULL);
CREATE TABLE published (event_id uuid PRIMARY KEY, topic text NOT NULL, key text NOT NULL,
                        rank int NOT NULL);
CREATE TABLE key_rank (topic text, key text, n int NOT NULL, PRIMARY KEY (topic, key));
CREATE TABLE received (relay text NOT NULL, topic text NOT NULL, event_id uuid NOT NULL,
                       ord bigserial);
GRANT ALL ON tenant, published, key_rank, received, received_ord_seq TO app;
-- one relay step: a batch recorded and acknowledged in one transaction
CREATE FUNCTION relay_once(r text, t text, n int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE b bigint; k int;
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS batch (batch bigint, event_id uuid);
  TRUNCATE batch;
  INSERT INTO batch SELECT x.batch, x.event_id FROM idem_outbox_next(r, t, n) AS x;
  GET DIAGNOSTICS k = ROW_COUNT;
  IF k > 0 THEN
    INSERT INTO received (relay, topic, event_id) SELECT r, t, event_id FROM batch;
    SELECT max(batch) INTO b FROM batch;
    PERFORM idem_outbox_ack(r, t, b);
  END IF;
  RETURN k;
END $$;
};

my $a = PostgreSQL::Test::Cluster->new('move_a');
$a->init;
$a->append_conf('postgresql.conf', "max_connections = 30\n");
$a->start;
$a->safe_psql('postgres', $setup . q{
INSERT INTO tenant VALUES ('acme', true);
INSERT INTO key_rank SELECT t, 'k' || i, 0 FROM generate_series(0, 7) AS i, unnest(ARRAY['acme', 'stay']) AS t;
});

# node B: the role has another OID there (imports name it)
my $b = PostgreSQL::Test::Cluster->new('move_b');
$b->init;
$b->append_conf('postgresql.conf', "max_connections = 30\n");
$b->start;
$b->safe_psql('postgres', "CREATE ROLE filler_1; CREATE ROLE filler_2;\n" . $setup . q{
INSERT INTO tenant VALUES ('acme', false);
});
isnt($a->safe_psql('postgres', "SELECT 'app'::regrole::oid"),
	$b->safe_psql('postgres', "SELECT 'app'::regrole::oid"),
	'the application role has different OIDs on the two nodes');

# a transaction of the application: acme's events only while the tenant is
# here (checked under its row's share lock, which the move's update waits
# for), else the staying tenant's
my $script = $a->basedir . '/publish.sql';
PostgreSQL::Test::Utils::append_to_file($script, q{
\set key random(0, 7)
\set two random(1, 2)
\set which random(1, 2)
\set abort random(1, 10)
BEGIN;
SELECT CASE WHEN :which = 1 AND here THEN 1 ELSE 2 END AS t
  FROM tenant WHERE name = 'acme' FOR SHARE \gset
UPDATE key_rank SET n = n + 1
 WHERE topic = (ARRAY['acme', 'stay'])[:t] AND key = 'k' || :key;
INSERT INTO published SELECT idem_publish((ARRAY['acme', 'stay'])[:t], jsonb_build_object('i', i), 'k' || :key),
                             (ARRAY['acme', 'stay'])[:t], 'k' || :key,
                             (SELECT n FROM key_rank
                               WHERE topic = (ARRAY['acme', 'stay'])[:t] AND key = 'k' || :key)
  FROM generate_series(1, :two) AS i;
\if :abort = 1
ROLLBACK;
\else
COMMIT;
\endif
});
my $script_b = $b->basedir . '/publish.sql';
PostgreSQL::Test::Utils::append_to_file($script_b, q{
\set key random(0, 7)
\set two random(1, 2)
\set abort random(1, 10)
BEGIN;
UPDATE key_rank SET n = n + 1 WHERE topic = 'acme' AND key = 'k' || :key;
INSERT INTO published SELECT idem_publish('acme', jsonb_build_object('i', i), 'k' || :key),
                             'acme', 'k' || :key,
                             (SELECT n FROM key_rank WHERE topic = 'acme' AND key = 'k' || :key)
  FROM generate_series(1, :two) AS i;
\if :abort = 1
ROLLBACK;
\else
COMMIT;
\endif
});

sub pgbench
{
	my ($node, $file, $secs) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-c', '4', '-j', '2', '-T', $secs, '-U', 'app',
			'-f', $file, '-h', $node->host, '-p', $node->port, 'postgres'
		],
		'<', \undef, '>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

sub relay
{
	my ($node, $relay, $topic, $n) = @_;
	return $node->safe_psql('postgres',
		"SET ROLE app; SELECT relay_once('$relay', '$topic', $n)");
}

# ---------------------------------------------------------------- on A
my $load_a = pgbench($a, $script, 3 * $seconds);
my $steps = 0;
my $until = time() + $seconds;
while (time() < $until)
{
	relay($a, 'hook', 'acme', 50);
	relay($a, 'tap', 'acme', 7) if ++$steps % 2 == 0;
	relay($a, 'stay-hook', 'stay', 50);
	$load_a->{h}->pump_nb if $load_a->{h}->pumpable;
}

# ---------------------------------------------------------------- the move
# stop acme's writes: the handler's share lock makes this wait for the
# transactions in progress; acme's relays stop, hook with a batch handed
# out that it never delivered
$a->safe_psql('postgres', q{UPDATE tenant SET here = false WHERE name = 'acme'});
$a->safe_psql('postgres', q{SET ROLE app; SELECT count(*) FROM idem_outbox_next('hook', 'acme', 5)});
my $dir = $a->basedir;
$a->safe_psql('postgres', qq{
COPY (SELECT * FROM idempotency.export_relays(ARRAY['acme'])) TO '$dir/relays.copy';
COPY (SELECT * FROM idempotency.export_events(ARRAY['acme'])) TO '$dir/events.copy';
COPY (SELECT * FROM key_rank WHERE topic = 'acme') TO '$dir/ranks.copy';
});
my $exported = $a->safe_psql('postgres',
	q{SELECT count(*) FROM idempotency.export_events(ARRAY['acme'])});
note("acme events exported: $exported");
cmp_ok($exported, '>', 0, 'the move exports undelivered events');

my $import = qq{
CREATE TEMP TABLE relays (LIKE idempotency.relay_record);
CREATE TEMP TABLE events (LIKE idempotency.event_record);
COPY relays FROM '$dir/relays.copy';
COPY events FROM '$dir/events.copy';
BEGIN;
CREATE TEMP TABLE outcome AS
SELECT 'relay' AS what, idempotency.import_relay(r) AS outcome FROM relays r ORDER BY r.relay;
INSERT INTO outcome SELECT 'event', idempotency.import_event(e) FROM events e ORDER BY e.ord;
COMMIT;
SELECT string_agg(what || ' ' || outcome || ' ' || n, ', ' ORDER BY what, outcome)
  FROM (SELECT what, outcome, count(*) AS n FROM outcome GROUP BY 1, 2) s;
};
my $first = $b->safe_psql('postgres', $import);
note("import: $first");
like($first, qr/event inserted $exported/, 'every exported event is imported');
is($b->safe_psql('postgres', $import), "event kept $exported, relay kept 2",
	'a retried import writes nothing');
$b->safe_psql('postgres', qq{
COPY key_rank FROM '$dir/ranks.copy';
UPDATE tenant SET here = true WHERE name = 'acme';
});

# ---------------------------------------------------------------- on B
my $load_b = pgbench($b, $script_b, $seconds);
$until = time() + $seconds;
while (time() < $until)
{
	relay($b, 'hook', 'acme', 50);
	relay($b, 'tap', 'acme', 7) if ++$steps % 2 == 0;
	relay($a, 'stay-hook', 'stay', 50);
	$load_a->{h}->pump_nb if $load_a->{h}->pumpable;
	$load_b->{h}->pump_nb if $load_b->{h}->pumpable;
}
for my $load ($load_a, $load_b)
{
	$load->{h}->finish;
	is($load->{h}->result(0), 0, 'pgbench exits 0') or diag(${ $load->{err} });
}

# drain
for my $r ([ $b, 'hook', 'acme' ], [ $b, 'tap', 'acme' ], [ $a, 'stay-hook', 'stay' ])
{
	for (1 .. 10000)
	{
		last if relay($r->[0], $r->[1], $r->[2], 1000) eq '0';
	}
}

# ---------------------------------------------------------------- checks
# what each node published (committed) and each relay received, in order
sub rows
{
	my ($node, $sql) = @_;
	return [ map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres', $sql) ];
}
my %published;    # event_id => [topic, key, rank]
for my $node ($a, $b)
{
	$published{ $_->[0] } = [ @$_[ 1 .. 3 ] ]
	  for @{ rows($node, 'SELECT event_id, topic, key, rank FROM published') };
}
my @acme = grep { $published{$_}[0] eq 'acme' } keys %published;
my @stay = grep { $published{$_}[0] eq 'stay' } keys %published;
note(sprintf('committed: %d acme events (%d on B), %d stay events', scalar @acme,
	$b->safe_psql('postgres', 'SELECT count(*) FROM published'), scalar @stay));
cmp_ok(scalar @acme, '>', 50, 'acme was published');
cmp_ok($b->safe_psql('postgres', 'SELECT count(*) FROM published'), '>', 0,
	'acme was published on B after the move');

sub received
{
	my ($relay, $topic) = @_;
	my @ids;
	for my $node ($a, $b)    # A's receipts, then B's
	{
		push @ids, map { $_->[0] } @{ rows($node,
			"SELECT event_id FROM received WHERE relay = '$relay' AND topic = '$topic' ORDER BY ord") };
	}
	return @ids;
}

sub check_relay
{
	my ($relay, $topic, $expected, $exactly_once) = @_;
	my @got = received($relay, $topic);
	my %count;
	$count{$_}++ for @got;
	my @missing = grep { !$count{$_} } @$expected;
	my @foreign = grep { !$published{$_} || $published{$_}[0] ne $topic } keys %count;
	my @twice = grep { $count{$_} > 1 } keys %count;
	is(scalar @missing, 0, "$relay received every committed $topic event")
	  or diag("missing: @missing[0 .. ($#missing < 9 ? $#missing : 9)]");
	is(scalar @foreign, 0, "$relay received no event of a rolled-back transaction or another topic");
	if ($exactly_once)
	{
		is(scalar @twice, 0, "$relay received no event twice") or diag("twice: @twice");
	}
	else
	{
		note("$relay received " . scalar(@twice) . ' events more than once');
	}
	# each key's events, first receipts, in commit rank order
	my (%seen, %last, $out_of_order);
	for my $id (@got)
	{
		next if $seen{$id}++;
		my ($t, $key, $rank) = @{ $published{$id} // next };
		$out_of_order++ if defined $last{$key} && $rank < $last{$key};
		$last{$key} = $rank;
	}
	ok(!$out_of_order, "$relay received each key's events in commit order");
}

check_relay('hook', 'acme', \@acme, 1);
check_relay('tap', 'acme', \@acme, 0);
check_relay('stay-hook', 'stay', \@stay, 1);
is($b->safe_psql('postgres',
	q{SET ROLE app; SELECT string_agg(relay || ' ' || lag_events, ', ' ORDER BY relay) FROM idem_outbox_relays()}),
	'hook 0, tap 0', 'no lag is left on B');

$a->stop;
$b->stop;
done_testing();

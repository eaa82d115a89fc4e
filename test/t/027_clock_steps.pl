
# test/t/027_clock_steps.pl -- one winner per key when the server's clock
# steps backwards and forwards (libfaketime, from Debian's faketime).
#
# A partition's range is judged ended by each backend's own reading of the
# clock, and a clock can step back (an NTP correction, a VM resumed).  Here
# the server runs with a clock we move:
#   1. with the clock past the end of a partition, a backend looks the key
#      up (and so sees that partition ended); the clock steps back before
#      that end; another transaction claims the key, its row going to that
#      partition, and holds it; the clock steps forward again: the first
#      backend's claim is told in_progress, not claimed (0.3.0 skipped the
#      partition here: two winners);
#   2. the same for a message id: the redelivery waits for the holder and
#      answers false;
#   3. the holder completes; with the clock stepped back the stored
#      response replays, and once the clock is past the key's expiry it is
#      claimed afresh;
#   4. with idempotency.key_memory: a partition dropped into the memory,
#      the clock steps back into its range and a key is claimed there
#      again, so that the partition is made again under the same name and
#      bounds; once it has ended, maintenance cannot write its piece (the
#      first one is still there): it leaves that partition, whose key is
#      still answered "expired" from it, with a warning, and goes on (on
#      dev050 every run failed with 42P07 from then on, and so never
#      reached the step that forgets the first piece); once the memory has
#      passed (the setting lowered), the first piece is forgotten, the
#      partition dropped without a piece, and both keys are new again.
# Skipped, saying so, where libfaketime is not installed.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my ($libfaketime) = grep { -f $_ } map { "$_/faketime/libfaketime.so.1" }
  ('/usr/lib/x86_64-linux-gnu', '/usr/lib/aarch64-linux-gnu', '/usr/lib64', '/usr/lib');
plan skip_all => 'libfaketime is not installed (Debian package faketime)'
  unless defined $libfaketime;

my $node = PostgreSQL::Test::Cluster->new('clock');
$node->init;
$node->append_conf('postgresql.conf', q{
idempotency.partition_interval = 1
idempotency.key_ttl = 2
idempotency.message_ttl = 2
idempotency.premake = 40
log_min_messages = warning
});

# the server's clock: our offset from the real one, read at every call
my $clockfile = $node->basedir . '/clock';
sub set_clock
{
	my ($offset) = @_;
	open my $fh, '>', "$clockfile.new" or die $!;
	print $fh "$offset\n";
	close $fh;
	rename "$clockfile.new", $clockfile or die $!;
}
set_clock('+0s');
{
	local $ENV{LD_PRELOAD} = $libfaketime;
	local $ENV{FAKETIME_TIMESTAMP_FILE} = $clockfile;
	local $ENV{FAKETIME_NO_CACHE} = '1';
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = '1';
	$node->start;
}
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
});
my $t0 = $node->safe_psql('postgres', 'SELECT extract(epoch FROM now())');
ok($t0 > 0, 'the server runs under the moved clock');

# the rows are claimed with a 60-second ttl (so that, on a busy machine
# too, they are live for the steps below while the clock is back), in
# partitions made ahead; how far ahead those partitions end
my $end = $node->safe_psql('postgres', q{
	SELECT extract(epoch FROM max(upper_bound) - clock_timestamp())
	  FROM idempotency.partition_info()
	 WHERE lower_bound <= clock_timestamp() + interval '70 seconds'});

# 1, 2: the clock well past every partition such a row can be in
my $ahead = int($end) + 5;
set_clock("+${ahead}s");
my $s3 = $node->background_psql('postgres', on_error_stop => 0);
is($s3->query_safe(q{SELECT count(*) FROM idem_lookup('k')}), '0', 'a backend looks the key up, past the partition\'s end');
$s3->query_safe(q{SELECT count(*) FROM (SELECT idem_consume_message('other', 'o')) s});
$s3->query_safe(q{SELECT pg_current_xact_id()});

# back before that end: a transaction claims the key and consumes the id
set_clock('+0s');
my $s2 = $node->background_psql('postgres', on_error_stop => 0);
$s2->query_safe('BEGIN');
is($s2->query_safe(q{SELECT status FROM idem_claim('k', ttl => '60 seconds')}), 'claimed',
	'with the clock stepped back, another transaction claims the key');
is($s2->query_safe(q{SELECT idem_consume_message('c', 'm', ttl => '60 seconds')}), 't',
	'and consumes the message');

# forward again
set_clock("+${ahead}s");
is($s3->query_safe(q{SELECT status FROM idem_claim('k', lease => '1 second')}), 'in_progress',
	'with the clock forward again, the first backend is told in_progress');
$s3->query_until(qr/waiting/, q{
	\echo waiting
	SELECT 'answer: ' || idem_consume_message('c', 'm', ttl => '60 seconds');
});
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity
		   WHERE wait_event_type = 'Lock' AND query LIKE '%idem_consume_message%'}),
	'its consume of the message waits for the holder');

# 3. the holder completes and commits with the clock stepped back
set_clock('+0s');
$s2->query_safe(q{SELECT idem_complete('k', 201, '{"done": true}')});
$s2->query_safe('COMMIT');
$s2->quit;
like($s3->query_safe('SELECT 1'), qr/answer: f/, 'the redelivery answers false');
is($node->safe_psql('postgres',
		q{SELECT status || ' ' || response_code FROM idem_claim('k')}),
	'completed 201', 'while the clock is before its expiry, the key replays');
set_clock("+${ahead}s");
is($node->safe_psql('postgres', q{SELECT status FROM idem_claim('k', lease => '1 second')}),
	'claimed', 'past its expiry, it is claimed afresh');
$s3->quit;

# 4. the key memory, and a clock stepped back into a dropped partition

# runs idem_maintain() in "mem" until the query answers true (at most 3 min)
sub maintain_until
{
	my ($query) = @_;
	foreach (1 .. 1800)
	{
		$node->safe_psql('mem', 'SELECT idem_maintain()');
		return 1 if $node->safe_psql('mem', $query) eq 't';
		select(undef, undef, undef, 0.1);
	}
	return 0;
}
my $offset = $ahead;
set_clock("+${offset}s");
$node->safe_psql('postgres', q{
	CREATE DATABASE mem;
	ALTER DATABASE mem SET idempotency.key_memory = '1h';
	ALTER DATABASE mem SET idempotency.premake = 0;});
$node->safe_psql('mem', 'CREATE EXTENSION idempotency; SELECT idem_maintain();');
$node->safe_psql('mem', q{
	BEGIN;
	SELECT status FROM idem_claim('first', ttl => '10 milliseconds');
	SELECT idem_complete('first', 200);
	COMMIT;});
my $first_partition = $node->safe_psql('mem', q{SELECT tableoid::regclass FROM idempotency.keys});
ok( maintain_until(q{
		SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
		   AND (SELECT count(*) FROM idempotency.keys) = 0}),
	'the partition of the first key is dropped into the memory');

# step back into its range (its lower bound is the piece's expires_at),
# early enough in it that a key with a short ttl lands there
my $again;
foreach my $try (1 .. 20)
{
	my ($whole, $frac) = split /\|/, $node->safe_psql('mem', q{
		SELECT floor(s)::int || '|' || (s - floor(s))
		  FROM (SELECT extract(epoch FROM clock_timestamp() - min(expires_at)) AS s
		          FROM idempotency.keys_memory) m});
	if ($frac > 0.7)
	{
		select(undef, undef, undef, 1.05 - $frac);
		next;
	}
	set_clock('+' . ($offset - $whole) . 's');
	$node->safe_psql('mem', qq{
		BEGIN;
		SELECT status FROM idem_claim('again-$try', ttl => '10 milliseconds');
		SELECT idem_complete('again-$try', 200);
		COMMIT;});
	set_clock("+${offset}s");
	my $where = $node->safe_psql('mem', qq{
		SELECT tableoid::regclass FROM idempotency.keys WHERE expires_at < clock_timestamp() - interval '1 second'
		 ORDER BY expires_at DESC LIMIT 1});
	if ($where eq $first_partition)
	{
		$again = "again-$try";
		last;
	}
}
ok(defined $again, "with the clock stepped back, a key lands in a partition made again as $first_partition");

# maintenance goes on
my $log_offset = -s $node->logfile;
foreach my $run (1 .. 2)
{
	my ($rc, $out, $err) = $node->psql('mem', 'SELECT idem_maintain()');
	is($rc, 0, "maintenance run $run succeeds") or diag($err);
}
like(slurp_file($node->logfile, $log_offset),
	qr/could not remember the keys of expired partition "\Q$first_partition\E"/,
	'and warns that the partition is left, its piece not written');
is( $node->safe_psql('mem', qq{
		BEGIN;
		SELECT (SELECT status FROM idem_claim('first')) || ' ' || (SELECT status FROM idem_claim('$again'));
		ROLLBACK;}),
	'expired expired', 'both keys are remembered meanwhile (one by the piece, one by the partition)');

# once the memory has passed (the setting lowered to 1 s): the first piece
# forgotten, the partition dropped without a piece
$node->safe_psql('mem', q{ALTER DATABASE mem SET idempotency.key_memory = '1s'});
ok( maintain_until(q{
		SELECT (SELECT count(*) FROM idempotency.keys_memory) = 0
		   AND (SELECT count(*) FROM idempotency.keys) = 0}),
	'once the memory has passed, the piece and the partition are gone');
is( $node->safe_psql('mem', qq{
		BEGIN;
		SELECT (SELECT status FROM idem_claim('first')) || ' ' || (SELECT status FROM idem_claim('$again'));
		ROLLBACK;}),
	'claimed claimed', 'and both keys are new again');

$node->stop;
done_testing();

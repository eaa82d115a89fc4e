
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
#      claimed afresh.
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

$node->stop;
done_testing();

# test/t/036_ttl_time_zones.pl -- a ttl or a lease is a duration: '1 day' is
# 24 hours whatever the session's TimeZone, also on the day a daylight-saving
# change happens, and a ttl equal to idempotency.max_ttl is accepted then.
#
# Until 0.4.0 the extension added intervals with timestamptz + interval,
# which counts days in the session's zone: in Europe/Berlin on 30 October
# 2027, ttl => '1 day' was 25 hours, and ttl => '30 days' with max_ttl at 30
# days was refused ("ttl exceeds idempotency.max_ttl").  The calendar sweep
# (test/calendar.sh) found it at its DST points; this test pins one.
#
# The server runs with its wall clock moved to 2027-10-30 12:00 UTC
# (test/lib/clockshift.c), thirteen hours before Berlin goes from CEST to
# CET: every '1 day' interval taken from then on spans the change.
#
# Needs a C compiler (for test/lib/clockshift.c).

use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/test/lib/clockshift.c";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find test/lib/clockshift.c') unless defined $root;

my $lib = PostgreSQL::Test::Utils::tempdir() . '/clockshift.so';
system('cc', '-shared', '-fPIC', '-O2', '-o', $lib, "$root/test/lib/clockshift.c", '-ldl') == 0
  or BAIL_OUT('could not build test/lib/clockshift.c');

my $node = PostgreSQL::Test::Cluster->new('zones');
$node->init;
$node->append_conf('postgresql.conf', q{
log_min_messages = warning
idempotency.max_ttl = '30d'
});
{
	local $ENV{LD_PRELOAD} = $lib;
	local $ENV{IDEM_CLOCK_START} = '1824897600';    # 2027-10-30 12:00:00 UTC
	$node->start;
}
is($node->safe_psql('postgres', q{SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')}),
	'2027-10-30', 'the server runs on 30 October 2027');
is($node->safe_psql('postgres', q{
	SET TimeZone = 'Europe/Berlin';
	SELECT (now() + interval '1 day') - now()}),
	'1 day 01:00:00', "in Europe/Berlin, now() + '1 day' is 25 hours today (PostgreSQL's own arithmetic)");

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

# within a minute of so many hours (the clock a call reads is a moment
# after its transaction's now(); a later statement's now() a moment after)
sub about
{
	my ($what, $hours) = @_;
	return "$what BETWEEN interval '$hours hours -1 minute' AND interval '$hours hours 1 minute'";
}

for my $zone ('Europe/Berlin', 'UTC', 'Australia/Adelaide', 'Asia/Kathmandu')
{
	my $set = "SET TimeZone = '$zone';";
	is($node->safe_psql('postgres', qq{$set
		SELECT @{[ about('expires_at - now()', 24) ]}
		  FROM idem_claim('day-$zone', ttl => '1 day', lease => '1 hour')}),
		't', "$zone: a key claimed with ttl '1 day' expires 24 hours later");
	is($node->safe_psql('postgres', qq{$set
		SELECT c.status || ' ' || (@{[ about('c.expires_at - now()', 720) ]})
		  FROM idem_claim('max-$zone', ttl => '30 days', lease => '1 hour') c}),
		'claimed true', "$zone: ttl '30 days' is accepted with max_ttl 30 days, and is 720 hours");
	is($node->safe_psql('postgres', qq{$set
		SELECT status FROM idem_claim('lease-$zone', ttl => '2 days', lease => '1 day');
		SELECT @{[ about('max(lease_until) - now()', 24) ]} FROM idempotency.keys}),
		"claimed\nt", "$zone: a lease of '1 day' lasts 24 hours");
	is($node->safe_psql('postgres', qq{$set
		SELECT idem_consume_message('c', 'm-$zone', '1 day');
		SELECT @{[ about('max(expires_at) - now()', 24) ]} FROM idempotency.messages}),
		"t\nt", "$zone: a message id consumed with ttl '1 day' expires 24 hours later");
}

$node->stop;
done_testing();

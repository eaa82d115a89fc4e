# test/t/090_instructions.pl -- a performance regression guard that cannot be
# flaky: CPU instructions per call, counted by callgrind, against committed
# figures.
#
# bench/callgrind.sh counts the instructions one call takes (the difference
# of two single-user server runs of N and 2N calls, divided by N): the same
# binary on the same input gives the same count however busy the machine
# is.  This test runs it for claim+complete, consume, a batch id and
# replay, with as many calls as the committed figures were made with (the
# header of bench/results/callgrind-pgNN.txt: a replay's count moved by 7 %
# between 200 and 1,000 calls on Debian's server), and fails if a count is
# more than MARGIN above the committed figure for this major.  A change that makes
# a call cheaper passes; commit the new figures with it (bench/README.md,
# "Instructions per call").  Never a time or a throughput.
#
# The figures depend on the server's exact build: this test runs only where
# the committed file's header names this server's version (Debian's
# PostgreSQL 15 on this project's machines), and skips elsewhere, saying
# why.  Needs valgrind (skipped without it; a failure with IDEM_NO_SKIP=1).
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/090_instructions.pl

use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

# instructions per call may grow by this much before the test fails
my $MARGIN = 0.05;
my @WORKLOADS = qw(claim_complete consume batch replay);

my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/bench/callgrind.sh";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find the top of the source tree (bench/callgrind.sh)')
  unless defined $root;

my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
my $version = `$pg_config --version`;
chomp $version;
my ($major) = $version =~ /PostgreSQL (\d+)/;
my $committed_path = "$root/bench/results/callgrind-pg$major.txt";

sub skip_all
{
	my ($why) = @_;
	BAIL_OUT("not skipped with IDEM_NO_SKIP=1: $why") if $ENV{IDEM_NO_SKIP};
	plan skip_all => $why;
}

sub figures
{
	my ($text) = @_;
	my %f;
	$f{$1} = $2 while $text =~ /^(\w+)\s+(\d+)\s*$/mg;
	return %f;
}

skip_all('valgrind is not installed') if system('command -v valgrind >/dev/null') != 0;
plan skip_all => "no committed figures for PostgreSQL $major ($committed_path)"
  unless -f $committed_path;
my $committed = slurp_file($committed_path);
my ($committed_version) = $committed =~ /^# instructions per call \(callgrind\), (PostgreSQL [^,]+),/m;
plan skip_all => "the committed figures are for $committed_version, this server is $version"
  unless defined $committed_version && $committed_version eq $version;
my %expected = figures($committed);
my ($CALLS) = $committed =~ /^# instructions per call \(callgrind\), [^\n]*, (\d+) calls per run$/m;
BAIL_OUT("no call count in the header of $committed_path") unless defined $CALLS;

my $out = PostgreSQL::Test::Utils::tempdir() . '/callgrind.txt';
my ($stdout, $stderr) = ('', '');
my $ok = IPC::Run::run(
	[ 'bash', "$root/bench/callgrind.sh" ],
	'>', \$stdout, '2>', \$stderr,
	init => sub {
		$ENV{PG_CONFIG} = $pg_config;
		$ENV{CALLS} = $CALLS;
		$ENV{WORKLOADS} = join(' ', @WORKLOADS);
		$ENV{OUT} = $out;
	});
ok($ok, 'bench/callgrind.sh ran') or diag($stderr);
my %measured = figures(-f $out ? slurp_file($out) : '');

for my $w (@WORKLOADS)
{
	SKIP:
	{
		skip "no committed figure for $w", 1 unless defined $expected{$w};
		my $got = $measured{$w};
		ok(defined $got && $got <= $expected{$w} * (1 + $MARGIN),
			sprintf('%s: %s instructions per call, committed %d (at most +%d%%)',
				$w, $got // 'none', $expected{$w}, $MARGIN * 100));
		note(sprintf('%s: %+.1f%% against the committed figure',
				$w, 100 * ($got / $expected{$w} - 1)))
		  if defined $got;
	}
}

done_testing();

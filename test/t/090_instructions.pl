# test/t/090_instructions.pl -- a performance regression guard that cannot be
# flaky: CPU instructions per call, counted by callgrind, against committed
# figures.
#
# bench/callgrind.sh counts the instructions one call takes (the difference
# of two single-user server runs of N and 2N calls, divided by N): the same
# binary on the same input gives the same count however busy the machine
# is.  This test runs it for the extension's workloads of each committed
# file, with as many calls as its figures were made with (its header: a
# replay's count moved by 7 % between 200 and 1,000 calls on Debian's
# server), and fails if a count is more than MARGIN above the committed
# figure for this major:
#
#   bench/results/callgrind-pgNN.txt          without preloading
#   bench/results/callgrind-pgNN-preload.txt  preloaded (CALLGRIND_PRELOAD=1:
#                                             the digest filters), as
#                                             production runs it
#
# (the raw SQL baselines in those files, names with "raw" or "pl_", are
# figures to compare with, not guarded).  A change that makes
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
my @files = grep { -f $_->[0] } (
	[ "$root/bench/results/callgrind-pg$major.txt", 0 ],
	[ "$root/bench/results/callgrind-pg$major-preload.txt", 1 ]);

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
plan skip_all => "no committed figures for PostgreSQL $major (bench/results/callgrind-pg$major*.txt)"
  unless @files;

for my $file (@files)
{
	my ($committed_path, $preload) = @$file;
	my $committed = slurp_file($committed_path);
	my ($committed_version) = $committed =~ /^# instructions per call \(callgrind\), (PostgreSQL [^,]+),/m;
	plan skip_all => "the committed figures are for $committed_version, this server is $version"
	  unless defined $committed_version && $committed_version eq $version;
	my %expected = figures($committed);
	my @workloads = sort grep { !/raw|pl_/ } keys %expected;
	my ($CALLS) = $committed =~ /^# instructions per call \(callgrind\), [^\n]*, (\d+) calls per run$/m;
	BAIL_OUT("no call count in the header of $committed_path") unless defined $CALLS;
	my $mode = $preload ? 'preloaded' : 'not preloaded';

	my $out = PostgreSQL::Test::Utils::tempdir() . '/callgrind.txt';
	my ($stdout, $stderr) = ('', '');
	my $ok = IPC::Run::run(
		[ 'bash', "$root/bench/callgrind.sh" ],
		'>', \$stdout, '2>', \$stderr,
		init => sub {
			$ENV{PG_CONFIG} = $pg_config;
			$ENV{CALLS} = $CALLS;
			$ENV{WORKLOADS} = join(' ', @workloads);
			$ENV{OUT} = $out;
			$ENV{CALLGRIND_PRELOAD} = $preload;
		});
	ok($ok, "bench/callgrind.sh ran ($mode)") or diag($stderr);
	my %measured = figures(-f $out ? slurp_file($out) : '');

	for my $w (@workloads)
	{
		my $got = $measured{$w};
		ok(defined $got && $got <= $expected{$w} * (1 + $MARGIN),
			sprintf('%s, %s: %s instructions per call, committed %d (at most +%d%%)',
				$w, $mode, $got // 'none', $expected{$w}, $MARGIN * 100));
		note(sprintf('%s, %s: %+.1f%% against the committed figure',
				$w, $mode, 100 * ($got / $expected{$w} - 1)))
		  if defined $got;
	}
}

done_testing();

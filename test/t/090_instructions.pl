# test/t/090_instructions.pl -- a performance regression guard that cannot be
# flaky and holds on any machine: the extension's CPU instructions per call
# over those of the plain SQL doing the same job, both counted by callgrind
# in the same run, against committed ratios.
#
# bench/callgrind-ratios.sh runs bench/callgrind.sh for each pair of
# workloads (extension / baseline: consume / INSERT ... ON CONFLICT DO
# NOTHING, claim + complete / INSERT + UPDATE, replay / SELECT or the
# PL/pgSQL design, a batch id / INSERT ... SELECT ... ON CONFLICT DO
# NOTHING RETURNING), not preloaded and preloaded, in single-user servers
# whose clock and locale are pinned (the count of a call does not depend
# on the date, the time of day or the environment), and prints the ratio
# of each pair.  This test fails if a ratio is more than MARGIN above the
# committed one for this major (bench/results/callgrind-ratios-pgNN.txt).
#
# Why ratios: an absolute count is not the same on another machine (glibc
# and OpenSSL choose their code by what the CPU has, and the server's
# minor release and build move it), and a guard against absolute figures
# from the developers' machine failed on a newcomer's.  Both counts of a
# ratio are taken on the same server, CPU and environment, moments apart:
# what moves the ratio is what the extension does.  A change that makes
# calls cheaper passes; commit the new ratios with it (bench/README.md,
# "Instructions per call").  Never a time or a throughput, and no absolute
# count is compared with anything.
#
# Needs valgrind (skipped without it; a failure with IDEM_NO_SKIP=1) and a
# C compiler (test/lib/clockshift.c); skipped where no ratios are committed
# for this major, and on an assert-enabled server.
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/090_instructions.pl

use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

# a ratio may grow by this much before the test fails: what a CPU's own
# choice of code moves it by stays well inside (bench/README.md,
# "Instructions per call": the same ratios with OpenSSL's and glibc's
# vector code turned off)
my $MARGIN = 0.05;

my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/bench/callgrind-ratios.sh";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find the top of the source tree (bench/callgrind-ratios.sh)')
  unless defined $root;

my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
my $version = `$pg_config --version`;
chomp $version;
my ($major) = $version =~ /PostgreSQL (\d+)/;
my $committed_path = "$root/bench/results/callgrind-ratios-pg$major.txt";

sub skip_all
{
	my ($why) = @_;
	BAIL_OUT("not skipped with IDEM_NO_SKIP=1: $why") if $ENV{IDEM_NO_SKIP};
	plan skip_all => $why;
}

# "PRELOAD PAIR" => [ratio, extension count, baseline count]
sub ratios
{
	my ($text) = @_;
	my %r;
	while ($text =~ /^([01])\s+(\S+\/\S+)\s+([0-9.]+)\s+(\d+)\s+(\d+)\s*$/mg)
	{
		$r{"$1 $2"} = [ $3, $4, $5 ];
	}
	return %r;
}

# IDEM_INSTRUCTIONS=0 skips the whole test: test/run-all.sh counts the
# instructions with this machine's major only, not again in the roots of
# the other majors (five minutes of callgrind each, most of the TAP suite's
# CPU there); run it in a root by hand for that major's ratios.
plan skip_all => 'the instructions are counted with another server of this run (IDEM_INSTRUCTIONS=0)'
  if ($ENV{IDEM_INSTRUCTIONS} // '1') eq '0';
skip_all('valgrind is not installed') if system('command -v valgrind >/dev/null') != 0;
plan skip_all => "no committed ratios for PostgreSQL $major ($committed_path)"
  unless -f $committed_path;
# the ratios are those of a release build: an assert-enabled server (the
# cassert suite's, -O1 and every Assert) spends its instructions elsewhere
plan skip_all => 'an assert-enabled server: the committed ratios are of release builds'
  if `$pg_config --configure` =~ /--enable-cassert/;

my %expected = ratios(slurp_file($committed_path));
my ($calls) = slurp_file($committed_path) =~ /^# PostgreSQL [^\n]*, (\d+) calls per run$/m;
BAIL_OUT("no ratios or no call count in $committed_path")
  unless %expected && defined $calls;

my $out = PostgreSQL::Test::Utils::tempdir() . '/ratios.txt';
my ($stdout, $stderr) = ('', '');
my $ok = IPC::Run::run(
	[ 'bash', "$root/bench/callgrind-ratios.sh" ],
	'>', \$stdout, '2>', \$stderr,
	init => sub {
		$ENV{PG_CONFIG} = $pg_config;
		$ENV{CALLS} = $calls;
		$ENV{OUT} = $out;
		delete $ENV{BENCH_SMOKE};
		delete $ENV{CALLGRIND_CLOCK};
	});
ok($ok, 'bench/callgrind-ratios.sh ran') or diag($stderr);
my %measured = ratios(-f $out ? slurp_file($out) : '');
note($stdout);

for my $pair (sort keys %expected)
{
	my ($want) = @{ $expected{$pair} };
	my $got = $measured{$pair};
	my ($preload, $name) = split / /, $pair;
	my $mode = $preload ? 'preloaded' : 'not preloaded';
	ok(defined $got && $got->[0] <= $want * (1 + $MARGIN),
		sprintf('%s, %s: %s of the baseline, committed %.3f (at most +%d%%)',
			$name, $mode, defined $got ? sprintf('%.3f', $got->[0]) : 'none',
			$want, $MARGIN * 100));
	note(sprintf('%s, %s: %+.1f%% against the committed ratio (%d / %d instructions)',
			$name, $mode, 100 * ($got->[0] / $want - 1), $got->[1], $got->[2]))
	  if defined $got;
}

done_testing();

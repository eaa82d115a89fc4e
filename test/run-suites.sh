#!/usr/bin/env bash
#
# test/run-suites.sh -- build, install and test the idempotency extension
# against one PostgreSQL major, on this machine.  test/run-all.sh (the
# README's test command) runs it for every major, here or in a Debian root
# file system; run it directly for quick work on the host's major:
#
#   bash test/run-suites.sh                      # every suite
#   SUITES="regress isolation" bash test/run-suites.sh
#
# Suites, in order: regress (sql/*.sql, pg_regress), isolation
# (specs/*.spec, pg_isolation_regress), tap (test/t/*.pl, prove with
# PostgreSQL::Test::Cluster), pgtap (test/pgtap/*.sql, pg_prove on a
# throwaway cluster), demo (examples/demo.sql, which checks its own result,
# on a throwaway cluster), examples (every examples/*/test.sh: each starts
# and stops its own clusters, run as the test user with PG_CONFIG, SRC (the
# scratch copy) and EXAMPLES_PORT_BASE set), clients (every
# clients/*/test.sh, the Node.js and Python libraries, likewise with
# CLIENTS_PORT_BASE), packaging (test/packaging/*.sh:
# the Debian package, the PGXN archive and the Prometheus exporter, each run
# as root with PG_CONFIG, SRC and CLUSTER_USER set), cassert (regress,
# isolation and TAP again, on the assert-enabled PostgreSQL 15 of
# test/lib/cassert.sh, built from Debian 12's source package and cached under
# /var/cache/idempotency/cassert; whatever PG_CONFIG names, and on Debian 12
# only, so test/run-all.sh runs it with the host's major), calendar (CI's
# part of the calendar sweep, test/calendar.sh with CALENDAR_MODE=ci: the
# regress and pgTAP suites, and the worker's and expiry's TAP tests, at a
# faked date that rotates from run to run and at a random one, printed;
# test/run-all.sh runs it with the host's major).  A test of examples or
# packaging passes with exit 0, and is skipped with exit 77 and its reason
# (test/lib/skip.sh), which the summary shows.  A suite with no test files
# is skipped, and so is one whose every test was skipped.
#
# Citus, for examples/citus and test/t/038_citus_ledgers.pl, is built and
# installed here (as root) from its pinned release: downloaded, or from a
# local copy (test/lib/citus.sh, IDEM_VENDOR_DIR).  Where neither can be
# had, those tests are skipped and say why; IDEM_NO_SKIP=1 (CI) makes that a
# failure for examples/citus.
#
# As root (CI, fresh Debian): installs missing packages with apt, builds
# and tests as the unprivileged user "postgres" (IDEM_TEST_USER to change it)
# in a fresh copy of the tree under $TMPDIR, and installs as root.
# As a non-root user: the packages must already be installed (the script
# says which are missing); it builds and tests as you, and runs
# "make install" through sudo if you cannot write PostgreSQL's directories.
#
# Environment:
#   SUITES          suites to run (default: "regress isolation tap pgtap demo examples clients packaging cassert calendar")
#   PG_CONFIG       default /usr/lib/postgresql/15/bin/pg_config
#   IDEM_PROVE_JOBS TAP tests run at once (prove -j; default 2)
#   PGTAP_PORT      port of the pgTAP cluster (default 54393; unix socket only)
#   DEMO_PORT       port of the demo cluster (default 54395; unix socket only)
#   SUITE_TIMEOUT   seconds one suite may take (default 1800: a bound for a
#                   hung suite; the tap suite takes 10 minutes on a quiet
#                   2-core machine and more than 15 on a loaded one)
#   KEEP_WORKDIR=1  keep the scratch directory (it is always kept on failure)
#   IDEM_PROVE_TESTS  the TAP tests to run (default: every test/t/*.pl)
#   IDEM_RESULTS    file to append one line per suite to: "SUITE STATUS SECONDS"
#                   (STATUS: passed, failed, skipped), and one per skipped
#                   test of a suite: "SUITE:TEST skipped (REASON)", for
#                   test/run-all.sh
#   IDEM_NO_SKIP=1  a test that cannot run here for want of something it
#                   needs (Citus' sources) fails instead of being skipped
#   IDEM_VENDOR_DIR, IDEM_CITUS_URL, IDEM_CITUS_CACHE: where Citus comes
#                   from (test/lib/citus.sh)
#   IDEM_SERVER_SPECIFIC_ONLY=1  leave out the tests whose outcome does not
#                   depend on the server, which another run of the same
#                   command makes: of examples and packaging, only
#                   SERVER_SPECIFIC_TESTS run (Citus, built for each major,
#                   and the Debian package); of tap, the PgBouncer and
#                   Redis Streams tests skip themselves.  test/run-all.sh
#                   sets it for every major but one, and the cassert suite
#                   for its TAP part
#   IDEM_UPGRADE_FROM  a major whose server is installed beside this one
#                   (the 18 root has 17): the extension is built and
#                   installed for it too, and the tap suite's pg_upgrade
#                   test upgrades from it
#
# The last line of output is "N passed, N failed, N skipped": suites that
# passed and failed (one that could not run or was interrupted counts as
# failed), and suites and tests that were skipped (a skipped test of a suite
# that ran counts as skipped, not as passed).  The exit status is non-zero if anything failed.  Every server started here,
# including pg_regress and TAP ones left behind by an interrupted run, is
# stopped on exit, INT and TERM.

set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/build.sh
. "$SRC/test/lib/build.sh"

ALL_SUITES="regress isolation tap pgtap demo examples clients packaging cassert calendar"
SERVER_SPECIFIC_TESTS=(examples/citus/test.sh test/packaging/10_debian.sh
	test/packaging/30_prometheus.sh)
SUITES=${SUITES:-$ALL_SUITES}
# TAP tests run two at a time: most of their time is spent waiting (for
# servers, workers, locks, timeouts), and each has its own servers, sockets
# and ports; they are written to pass on a busy machine (doc/testing.md)
PROVE_JOBS=${IDEM_PROVE_JOBS:-2}
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PGTAP_PORT=${PGTAP_PORT:-54393}
DEMO_PORT=${DEMO_PORT:-54395}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-1800}

for s in $SUITES; do
	case " $ALL_SUITES " in
	*" $s "*) ;;
	*)
		echo "run-suites: unknown suite '$s' (known: $ALL_SUITES)" >&2
		exit 2
		;;
	esac
done

say() { printf '\n==== %s\n' "$*"; }

WORK=""
UPGRADE_WORK=""
CASSERT_WORK=""
CHILD=""
CURRENT=""
declare -A RESULT=()
PASSED=0
FAILED=0
SKIPPED=0
# the skipped tests of each suite, one line each: "TEST REASON"
declare -A SKIPPED_TESTS=()
SKIP_FILE=""

# Long-running steps run in their own session (setsid) in the background, so
# that a signal to this script interrupts "wait" at once and cleanup can end
# the whole step (make, pg_regress, prove, ...) before stopping servers.
# (RUN_DIR: where, default the scratch copy)
run_child() {
	(cd "${RUN_DIR:-$WORK}" && exec setsid "$@") &
	CHILD=$!
	wait "$CHILD"
	local rc=$?
	CHILD=""
	return "$rc"
}

stop_child() {
	[ -n "$CHILD" ] || return 0
	kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null
	for _ in $(seq 1 30); do
		kill -0 "$CHILD" 2>/dev/null || break
		sleep 1
	done
	kill -KILL -- "-$CHILD" 2>/dev/null
	wait "$CHILD" 2>/dev/null
	CHILD=""
}

# On every exit: stop what is running, then print the summary as the last
# line.  Suites without a result (setup failed, or interrupted) count as
# failed.
cleanup() {
	local rc=$? s
	trap - EXIT INT TERM
	stop_child
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		cluster_stop_any_under "$WORK" || rc=1
	fi
	if [ -n "$CASSERT_WORK" ]; then
		cluster_stop_any_under "$CASSERT_WORK" || rc=1
	fi
	for s in $SUITES; do
		if [ -z "${RESULT[$s]:-}" ]; then
			if [ "$s" = "$CURRENT" ]; then
				RESULT[$s]="FAILED (interrupted)"
			else
				RESULT[$s]="FAILED (not run)"
			fi
			FAILED=$((FAILED + 1))
		fi
	done
	[ "$FAILED" -eq 0 ] || [ "$rc" -ne 0 ] || rc=1
	if [ -n "$WORK" ]; then
		rm -rf "$WORK.skip"
		if [ "$rc" -eq 0 ] && [ "${KEEP_WORKDIR:-0}" != 1 ]; then
			rm -rf "$WORK" ${UPGRADE_WORK:+"$UPGRADE_WORK"} ${CASSERT_WORK:+"$CASSERT_WORK"}
		else
			echo "run-suites: scratch directory kept: $WORK${UPGRADE_WORK:+ (and $UPGRADE_WORK)}${CASSERT_WORK:+ (and $CASSERT_WORK)}"
		fi
	fi
	say "summary"
	for s in $SUITES; do
		printf '%-10s %s\n' "$s" "${RESULT[$s]}"
		while read -r t reason; do
			[ -n "$t" ] && printf '           %s skipped (%s)\n' "$t" "$reason"
		done <<<"${SKIPPED_TESTS[$s]:-}"
	done
	if [ -n "${IDEM_RESULTS:-}" ]; then
		for s in $SUITES; do
			printf '%s %s\n' "$s" "${RESULT[$s]}"
			while read -r t reason; do
				[ -n "$t" ] && printf '%s:%s skipped (%s)\n' "$s" "$t" "$reason"
			done <<<"${SKIPPED_TESTS[$s]:-}"
		done >>"$IDEM_RESULTS"
	fi
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "run-suites: interrupted" >&2; exit 130' INT
trap 'echo "run-suites: terminated" >&2; exit 143' TERM

# ---------------------------------------------------------------- setup
say "dependencies"
deps_ensure || exit 1
CLUSTER_USER=$(deps_test_user) || exit 1
export CLUSTER_USER
if [ "$(id -u)" -eq 0 ]; then
	AS_USER=(runuser -u "$CLUSTER_USER" --)
else
	AS_USER=()
fi
echo "building and testing as user $CLUSTER_USER with $PG_CONFIG ($("$PG_CONFIG" --version))"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-test.XXXXXX") || exit 1
chmod 755 "$WORK"
idem_copy_tree "$SRC" "$WORK" || exit 1
echo "scratch copy: $WORK"
# where a skipped test writes its reason (test/lib/skip.sh): in a directory
# of the test user's beside the scratch copy (which the packaging suite
# archives), not in $TMPDIR itself, whose sticky bit could keep the test
# user and root from writing each other's files
SKIP_FILE="$WORK.skip/reason"
mkdir -p "$WORK.skip" || exit 1
if [ "$(id -u)" -eq 0 ]; then
	chown "$CLUSTER_USER:" "$WORK.skip" || exit 1
fi

say "build"
if ! idem_build "$WORK"; then
	echo "run-suites: build failed; no suite was run" >&2
	exit 1
fi
say "install"
if ! idem_install "$WORK"; then
	echo "run-suites: make install failed; no suite was run" >&2
	exit 1
fi
if [ -n "${IDEM_UPGRADE_FROM:-}" ]; then
	# the same source, built and installed for the older major, whose
	# clusters the tap suite's pg_upgrade test upgrades from; beside the
	# scratch copy, not in it, or "make dist" there would archive it too
	UPGRADE_WORK="$WORK.upgrade-from"
	say "build and install for PostgreSQL $IDEM_UPGRADE_FROM (upgrade tests)"
	if ! (PG_CONFIG=/usr/lib/postgresql/$IDEM_UPGRADE_FROM/bin/pg_config &&
		idem_copy_tree "$SRC" "$UPGRADE_WORK" &&
		idem_build "$UPGRADE_WORK" && idem_install "$UPGRADE_WORK"); then
		echo "run-suites: build for PostgreSQL $IDEM_UPGRADE_FROM failed; no suite was run" >&2
		exit 1
	fi
	export IDEM_UPGRADE_FROM_BINDIR=/usr/lib/postgresql/$IDEM_UPGRADE_FROM/bin
fi

# ---------------------------------------------------------------- helpers
# Run a command as the test user in the scratch copy, bounded in time.
in_work() {
	run_child "${AS_USER[@]}" timeout -k 30 "$SUITE_TIMEOUT" "$@"
}

have_files() {
	compgen -G "$WORK/$1" >/dev/null
}

show_file() {
	local f="$1" lines="${2:-400}"
	[ -f "$f" ] || return 0
	echo "---- ${f#"$WORK"/} (last $lines lines)"
	tail -n "$lines" "$f"
}

mk_installcheck() {
	# pgxs runs regress, isolation and TAP in one "installcheck"; emptying the
	# other two variables on the command line selects one of them.
	in_work make installcheck PG_CONFIG="$PG_CONFIG" "$@"
}

suite_regress() {
	local rc
	have_files 'sql/*.sql' || return 3
	mk_installcheck ISOLATION= TAP_TESTS=
	rc=$?
	[ "$rc" -eq 0 ] && return 0
	show_file "$WORK/regression.diffs" 1000
	show_file "$WORK/tmp_check_regress/log/postmaster.log" 100
	return "$rc"
}

suite_isolation() {
	local rc
	have_files 'specs/*.spec' || return 3
	mk_installcheck REGRESS= TAP_TESTS=
	rc=$?
	[ "$rc" -eq 0 ] && return 0
	show_file "$WORK/output_iso/regression.diffs" 1000
	show_file "$WORK/tmp_check_iso/log/postmaster.log" 100
	show_file "$WORK/output_iso_preload/regression.diffs" 1000
	show_file "$WORK/tmp_check_iso_preload/log/postmaster.log" 100
	return "$rc"
}

suite_tap() {
	local f rc
	have_files 'test/t/*.pl' || return 3
	# 038_citus_ledgers.pl runs Citus (it skips, saying why, without it)
	[ -f "$WORK/test/t/038_citus_ledgers.pl" ] && citus_for_tests
	mk_installcheck REGRESS= ISOLATION= PROVE_FLAGS="--timer -j$PROVE_JOBS" \
		${IDEM_PROVE_TESTS:+PROVE_TESTS="$IDEM_PROVE_TESTS"}
	rc=$?
	[ "$rc" -eq 0 ] && return 0
	for f in "$WORK"/tmp_check/log/*; do
		show_file "$f" 300
	done
	return "$rc"
}

suite_pgtap() {
	local dir="$WORK/pgtap_cluster" conf=() line rc=0
	have_files 'test/pgtap/*.sql' || return 3
	# same server settings as the pg_regress instances
	if [ -f "$WORK/test/idempotency.conf" ]; then
		while IFS= read -r line; do
			conf+=("$line")
		done <"$WORK/test/idempotency.conf"
	fi
	conf+=("fsync = off")
	cluster_start "$dir" "$PGTAP_PORT" "${conf[@]}" || return 1
	if (cd "$WORK" && cluster_psql "$dir" -q -c 'CREATE DATABASE idempotency_pgtap' &&
		CLUSTER_DB=idempotency_pgtap cluster_psql "$dir" -q -c 'CREATE EXTENSION pgtap'); then
		in_work env PGHOST="$dir/sock" PGPORT="$PGTAP_PORT" \
			PGDATABASE=idempotency_pgtap PATH="$("$PG_CONFIG" --bindir):$PATH" \
			make pgtap PG_CONFIG="$PG_CONFIG"
		rc=$?
	else
		rc=1
	fi
	if [ "$rc" -ne 0 ]; then
		show_file "$dir/postgresql.log" 200
	fi
	cluster_stop "$dir" || [ "$rc" -ne 0 ] || rc=1
	return "$rc"
}

suite_demo() {
	local dir="$WORK/demo_cluster" rc
	have_files 'examples/demo.sql' || return 3
	cluster_start "$dir" "$DEMO_PORT" "fsync = off" || return 1
	in_work env PGHOST="$dir/sock" PGPORT="$DEMO_PORT" PGDATABASE=postgres \
		"$("$PG_CONFIG" --bindir)/psql" -X -v ON_ERROR_STOP=1 -a \
		-f examples/demo.sql >"$WORK/demo.out" 2>&1
	rc=$?
	if [ "$rc" -eq 0 ]; then
		echo "examples/demo.sql ran to the end (output in demo.out)"
	else
		show_file "$WORK/demo.out" 200
		show_file "$dir/postgresql.log" 100
	fi
	cluster_stop "$dir" || [ "$rc" -ne 0 ] || rc=1
	return "$rc"
}

# Suites of test scripts (examples, packaging) count their tests here:
# test_ran SUITE TEST START RC reports one (RC 0 passed, 77 skipped, with
# the reason the test wrote to SKIP_FILE, else failed); tests_result gives
# the suite's status: 1 if a test failed, 77 if every test was skipped,
# else 0.
TESTS_PASSED=0
TESTS_FAILED=0
TESTS_SKIPPED=0

test_ran() {
	local suite="$1" t="$2" start="$3" rc="$4" reason
	case $rc in
	0)
		echo "---- $t: passed ($((SECONDS - start))s)"
		TESTS_PASSED=$((TESTS_PASSED + 1))
		;;
	77)
		reason=$(head -n 1 "$SKIP_FILE" 2>/dev/null)
		echo "---- $t: skipped (${reason:-it says why above})"
		SKIPPED_TESTS[$suite]+="$t ${reason:-no reason given}"$'\n'
		TESTS_SKIPPED=$((TESTS_SKIPPED + 1))
		;;
	*)
		echo "---- $t: FAILED ($((SECONDS - start))s)"
		TESTS_FAILED=$((TESTS_FAILED + 1))
		;;
	esac
}

# run before each test of such a suite
test_start() {
	rm -f "$SKIP_FILE"
	echo "---- $1"
}

# left_to_another_run TEST: true (and says so) when
# IDEM_SERVER_SPECIFIC_ONLY=1 and TEST's outcome does not depend on the server
left_to_another_run() {
	local t
	[ "${IDEM_SERVER_SPECIFIC_ONLY:-0}" = 1 ] || return 1
	for t in "${SERVER_SPECIFIC_TESTS[@]}"; do
		[ "$t" = "$1" ] && return 1
	done
	echo "---- $1: not run here (its outcome does not depend on the server; another major of this run runs it)"
	return 0
}

tests_result() {
	if [ "$TESTS_FAILED" -gt 0 ]; then
		return 1
	elif [ "$TESTS_PASSED" -eq 0 ] && [ "$TESTS_SKIPPED" -gt 0 ]; then
		return 77
	fi
	return 0
}

# Citus for the tests that run it (test/t/038_citus_ledgers.pl in the tap
# suite, examples/citus in the examples suite), built here (as root; a later
# run reuses the build) and installed into the server under test, once per
# run; where it cannot be had, CITUS_REASON says why (the tests skip with it).
CITUS_DONE=0
CITUS_REASON=""
citus_for_tests() {
	[ "$CITUS_DONE" = 1 ] && return 0
	CITUS_DONE=1
	# shellcheck source=test/lib/citus.sh
	. "$SRC/test/lib/citus.sh"
	if [ "$(id -u)" -eq 0 ]; then
		citus_ensure
		case $? in
		0) ;;
		77) CITUS_REASON=$CITUS_UNAVAILABLE ;;
		*) echo "run-suites: could not install Citus: the tests that run it will fail" ;;
		esac
	elif ! citus_installed; then
		CITUS_REASON="Citus is not installed for $("$PG_CONFIG" --version), and building and installing it needs root"
	fi
}

suite_examples() {
	local t n=0 base=54400 start
	have_files 'examples/*/test.sh' || return 3
	# examples/citus runs Citus; where it cannot be had, the test is told
	# why and skipped
	[ -f "$WORK/examples/citus/test.sh" ] && citus_for_tests
	for t in "$WORK"/examples/*/test.sh; do
		left_to_another_run "${t#"$WORK"/}" && continue
		test_start "${t#"$WORK"/}"
		start=$SECONDS
		in_work env SRC="$WORK" PG_CONFIG="$PG_CONFIG" IDEM_SKIP_FILE="$SKIP_FILE" \
			IDEM_CITUS_UNAVAILABLE="$CITUS_REASON" \
			EXAMPLES_PORT_BASE=$((base + n * 10)) bash "$t"
		test_ran examples "${t#"$WORK"/}" "$start" $?
		n=$((n + 1))
	done
	tests_result
}

# the client libraries (clients/*/test.sh): each starts its own cluster
suite_clients() {
	local t n=0 base=54600 start
	have_files 'clients/*/test.sh' || return 3
	for t in "$WORK"/clients/*/test.sh; do
		test_start "${t#"$WORK"/}"
		start=$SECONDS
		in_work env SRC="$WORK" PG_CONFIG="$PG_CONFIG" IDEM_SKIP_FILE="$SKIP_FILE" \
			CLIENTS_PORT_BASE=$((base + n * 10)) bash "$t"
		test_ran clients "${t#"$WORK"/}" "$start" $?
		n=$((n + 1))
	done
	tests_result
}

suite_packaging() {
	local t start
	have_files 'test/packaging/*.sh' || return 3
	if [ "$(id -u)" -ne 0 ]; then
		echo "the packaging tests install packages: run as root"
		return 1
	fi
	for t in "$WORK"/test/packaging/*.sh; do
		left_to_another_run "${t#"$WORK"/}" && continue
		test_start "${t#"$WORK"/}"
		start=$SECONDS
		run_child timeout -k 30 "$SUITE_TIMEOUT" env SRC="$WORK" IDEM_SKIP_FILE="$SKIP_FILE" \
			PG_CONFIG="$PG_CONFIG" CLUSTER_USER="$CLUSTER_USER" bash "$t"
		test_ran packaging "${t#"$WORK"/}" "$start" $?
	done
	tests_result
}

# The whole suite again (regress, isolation, TAP) on the assert-enabled
# PostgreSQL 15 (test/lib/cassert.sh): Assert() in the server's code the
# extension calls, CLOBBER_FREED_MEMORY, MEMORY_CONTEXT_CHECKING, and the
# other checks of --enable-cassert.  The server is built on first use (as
# root; a few minutes) and kept under /var/cache/idempotency/cassert; the
# extension is built for it beside the scratch copy and installed into its
# prefix.  Each part is bounded by SUITE_TIMEOUT.
suite_cassert() {
	local pgc rc part rcs=0 f
	if [ "$(id -u)" -eq 0 ]; then
		# in its own session too: an interrupt ends the build at once
		# shellcheck disable=SC2016 # $1 is for the inner shell
		run_child timeout -k 30 3600 bash -c '. "$1/test/lib/deps.sh" && . "$1/test/lib/cassert.sh" && cassert_ensure' \
			cassert "$SRC" || return 1
	else
		# shellcheck source=test/lib/cassert.sh
		. "$SRC/test/lib/cassert.sh"
		cassert_ensure || return 1
	fi
	# shellcheck source=test/lib/cassert.sh
	. "$SRC/test/lib/cassert.sh"
	pgc=$(cassert_pg_config)
	# beside the scratch copy, not in it ("make dist" would archive it)
	CASSERT_WORK="$WORK.cassert"
	echo "the extension, built for $("$pgc" --version) with assertions ($pgc)"
	{ idem_copy_tree "$SRC" "$CASSERT_WORK" &&
		PG_CONFIG=$pgc idem_build "$CASSERT_WORK" >"$CASSERT_WORK.build.log" 2>&1 &&
		PG_CONFIG=$pgc idem_install "$CASSERT_WORK" >>"$CASSERT_WORK.build.log" 2>&1; } || {
		tail -n 50 "$CASSERT_WORK.build.log"
		return 1
	}
	rm -f "$CASSERT_WORK.build.log"
	for part in regress isolation tap; do
		echo "---- cassert: $part"
		case $part in
		regress) RUN_DIR=$CASSERT_WORK in_work make installcheck PG_CONFIG="$pgc" ISOLATION= TAP_TESTS= ;;
		isolation) RUN_DIR=$CASSERT_WORK in_work make installcheck PG_CONFIG="$pgc" REGRESS= TAP_TESTS= ;;
		tap)
			RUN_DIR=$CASSERT_WORK in_work env IDEM_BENCH_SMOKE=0 IDEM_SERVER_SPECIFIC_ONLY=1 \
				make installcheck PG_CONFIG="$pgc" REGRESS= ISOLATION= \
				PROVE_FLAGS="--timer -j$PROVE_JOBS" ${IDEM_PROVE_TESTS:+PROVE_TESTS="$IDEM_PROVE_TESTS"}
			;;
		esac
		rc=$?
		[ "$rc" -eq 0 ] && continue
		echo "---- cassert: $part FAILED (exit $rc)"
		[ "$rcs" -eq 0 ] && rcs=$rc
		case $part in
		regress)
			show_file "$CASSERT_WORK/regression.diffs" 1000
			show_file "$CASSERT_WORK/tmp_check_regress/log/postmaster.log" 100
			;;
		isolation)
			show_file "$CASSERT_WORK/output_iso/regression.diffs" 1000
			show_file "$CASSERT_WORK/tmp_check_iso/log/postmaster.log" 100
			show_file "$CASSERT_WORK/output_iso_preload/regression.diffs" 1000
			show_file "$CASSERT_WORK/tmp_check_iso_preload/log/postmaster.log" 100
			;;
		tap)
			for f in "$CASSERT_WORK"/tmp_check/log/*; do
				show_file "$f" 300
			done
			;;
		esac
	done
	return "$rcs"
}

suite_calendar() {
	have_files 'test/calendar.sh' || return 3
	in_work env CALENDAR_MODE=ci ${CALENDAR_POINTS:+CALENDAR_POINTS="$CALENDAR_POINTS"} \
		${CALENDAR_SEED:+CALENDAR_SEED="$CALENDAR_SEED"} bash test/calendar.sh
}

# ---------------------------------------------------------------- suites
for s in $SUITES; do
	say "suite $s"
	CURRENT=$s
	start=$SECONDS
	TESTS_PASSED=0
	TESTS_FAILED=0
	TESTS_SKIPPED=0
	"suite_$s"
	rc=$?
	took=$((SECONDS - start))
	# the skipped tests of a suite that ran count one by one
	[ "$rc" -eq 77 ] || SKIPPED=$((SKIPPED + TESTS_SKIPPED))
	case $rc in
	0)
		if [ "$TESTS_SKIPPED" -gt 0 ]; then
			RESULT[$s]="passed (${took}s; $TESTS_PASSED passed, $TESTS_SKIPPED skipped)"
		else
			RESULT[$s]="passed (${took}s)"
		fi
		PASSED=$((PASSED + 1))
		;;
	3)
		RESULT[$s]="skipped (no test files)"
		SKIPPED=$((SKIPPED + 1))
		echo "no test files: skipped"
		;;
	77)
		RESULT[$s]="skipped (every test skipped)"
		SKIPPED=$((SKIPPED + 1))
		;;
	124 | 137)
		RESULT[$s]="FAILED (timed out after ${SUITE_TIMEOUT}s)"
		FAILED=$((FAILED + 1))
		;;
	*)
		RESULT[$s]="FAILED (${took}s)"
		FAILED=$((FAILED + 1))
		;;
	esac
	CURRENT=""
done

# cleanup (the EXIT trap) prints the summary and sets the exit status
true

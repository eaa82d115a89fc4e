#!/usr/bin/env bash
#
# test/release.sh -- the quality gates run before each release, not in CI
# (too slow for its budget): the make targets of test/release.mk call it.
#
#   bash test/release.sh valgrind          # make valgrind
#   bash test/release.sh discard-caches    # make discard-caches
#   bash test/release.sh sqlsmith          # make sqlsmith
#   bash test/release.sh amcheck           # make amcheck
#
# valgrind: the regress suite and the isolation specs on the assert-enabled
#   PostgreSQL 15 (test/lib/cassert.sh, built with -DUSE_VALGRIND), each
#   server of pg_regress started under Valgrind's memcheck with
#   PostgreSQL's own suppressions (src/tools/valgrind.supp) and
#   --trace-children=yes: a "postgres" in a bin directory of its own runs
#   memcheck on the real one, and pg_regress is pointed at that directory.
#   Reports the suites' results and memcheck's errors over every process;
#   fails on a failed test or on any error.  VALGRIND_TIMING_SPECS (default
#   below) run under memcheck too, but their output is not compared (and a
#   step may wait 300 s at most): it depends on calls finishing within one-
#   or two-second ttls or partitions, or on a 1 ms lock_timeout firing
#   before isolationtester looks, which memcheck's 20-50x slowdown breaks on
#   a busy machine.  VALGRIND_REGRESS and VALGRIND_SPECS choose
#   other tests (default: every one, but the regress test discard_caches,
#   which turns debug_discard_caches on: under memcheck too a call that
#   makes a partition outlasts its 300 s statement_timeout; without the
#   setting its calls are those of the other tests, and make discard-caches
#   runs it).
# discard-caches: the regress tests that make and drop partitions and the
#   isolation specs that exercise the partition cache and its invalidation,
#   on the assert-enabled server with debug_discard_caches = 1 (every cache
#   entry dropped at every chance: a use of a stale relcache or syscache
#   entry then fails at once).  By default (DISCARD_CACHES_SCOPE=tested)
#   only for what is under test: a regress test from its CREATE EXTENSION
#   on, every session of a spec (the spec's setup and teardown, on
#   isolationtester's control connection, go at normal speed: CREATE
#   EXTENSION alone takes 25 s with the setting); the expected outputs are
#   the tests' own.  DISCARD_CACHES_SCOPE=server sets it for the whole
#   server instead, setup included.  The regress and the isolation part run
#   at once, each on a server of its own; DISCARD_CACHES_SECONDS (default
#   5400) is the budget of each: past it, the run fails.
# sqlsmith: Debian's sqlsmith (random queries over every function and table
#   of the catalog) against a database with the extension preloaded and a
#   populated ledger (test/lib/sqlsmith_setup.sql), for SQLSMITH_SECONDS
#   (default 600) as the unprivileged role sqlsmith_user and as much again
#   as a superuser, on each server of SQLSMITH_SERVERS (default
#   "cassert 15 17 18": the assert-enabled 15, Debian's 15 on this machine,
#   17 and 18 in their root file systems, test/lib/roots.sh), in each pass
#   of SQLSMITH_PASSES (default "general extension"): the general pass
#   offers sqlsmith the whole catalog (less a denylist), where it almost
#   never calls the extension; the targeted one (extension) offers it only
#   the extension's API, wrappers of the functions it cannot call as they
#   are, a few functions that build their arguments, and views that call
#   the API over a table of arguments (test/lib/sqlsmith_target.sql), so
#   that most of its queries call the API with random arguments.  Reports,
#   per server, role and pass, the queries run and per second, how many of
#   them name the API, the calls of each of the extension's functions that
#   returned (track_functions, counted across sqlsmith's resets of the
#   statistics), the errors by SQLSTATE class (all, and those raised in the
#   extension's code), server crashes ("terminated by signal" in the server
#   log), assertion failures ("TRAP:"), FATAL and PANIC lines of sqlsmith's
#   sessions, and internal errors (class XX) raised in the extension's own
#   code; then, per server, amcheck over every ledger index and a check
#   that the ledger still answers.  Fails on any crash, assertion failure,
#   PANIC, internal error of the extension's code, or amcheck or ledger
#   failure.
# amcheck: test/lib/amcheck_ledger.sql (bt_index_check with heapallindexed
#   over every ledger index, each partition locked first) against the
#   database named by PGHOST, PGPORT, PGDATABASE, PGUSER (a superuser), as
#   "make pgtap" does: for a DBA, or after a load.  The load tests run the
#   same script at their end.
#
# As root (the first three): builds the assert-enabled server if the cache
# has none (about 10 minutes; test/lib/cassert.sh), installs what it needs
# with apt (valgrind, sqlsmith), builds the extension as the unprivileged
# user postgres (IDEM_TEST_USER) in a scratch copy, and installs it into the
# assert-enabled server's own prefix.  Debian's PostgreSQL 15 on this
# machine is not touched: the extension is installed into a staging
# directory that the server reads through Debian's extension_destdir
# setting.  In the roots of 17 and 18 it is installed into the root.  Every
# server runs as that user on a unix socket in the scratch directory, on the
# ports from IDEM_RELEASE_PORT_BASE (default 56000) up, and is stopped on
# exit, pass or fail.  The scratch directory is removed unless the run
# failed or KEEP_WORKDIR=1.
#
# Environment: VALGRIND_TIMING_SPECS, VALGRIND_REGRESS, VALGRIND_SPECS, VALGRIND_TIMEOUT (default 7200 s, a
# bound for a hung run), DISCARD_CACHES_SECONDS, DISCARD_CACHES_REGRESS,
# DISCARD_CACHES_SPECS, DISCARD_CACHES_SCOPE, SQLSMITH_SECONDS, SQLSMITH_RUN_SECONDS,
# SQLSMITH_SERVERS, SQLSMITH_PASSES, SQLSMITH_SEED
# (default: the time; each sqlsmith run prints its own), the settings of
# test/lib/cassert.sh and test/lib/roots.sh, IDEM_RELEASE_PORT_BASE,
# KEEP_WORKDIR.

set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/build.sh
. "$SRC/test/lib/build.sh"
# shellcheck source=test/lib/cassert.sh
. "$SRC/test/lib/cassert.sh"
# shellcheck source=test/lib/roots.sh
. "$SRC/test/lib/roots.sh"

PORT_BASE=${IDEM_RELEASE_PORT_BASE:-56000}
# ttls and partitions of one or two seconds that the calls must beat, a
# 1 ms lock_timeout that must fire before isolationtester looks (see the
# header)
VALGRIND_TIMING_SPECS=${VALGRIND_TIMING_SPECS-cache_errors ended_partition ended_writer maintain_drop short_ttl}
VALGRIND_TIMEOUT=${VALGRIND_TIMEOUT:-7200}
# the regress tests make valgrind leaves out (see the header)
VALGRIND_SKIP_REGRESS="discard_caches"
DISCARD_CACHES_SECONDS=${DISCARD_CACHES_SECONDS:-5400}
# the regress tests that make and drop partitions (maintain: idem_maintain,
# premake, drops; consume and keys: partitions made on first use, lanes,
# expiry), and the specs about the partition cache: its invalidation
# (cache_errors, maintain_drop, keys_nowait), partitions made or found at a
# lane's boundary (consume_boundary, keys_boundary, lookup_moves)
DISCARD_CACHES_REGRESS=${DISCARD_CACHES_REGRESS:-consume keys maintain}
DISCARD_CACHES_SPECS=${DISCARD_CACHES_SPECS:-cache_errors maintain_drop keys_nowait consume_boundary keys_boundary lookup_moves}
# tested: debug_discard_caches = 1 in the tested sessions only (from CREATE
# EXTENSION on in a regress test, in every session of a spec; see
# discard_caches_inputs); server: on the whole server, the tests' setup
# (CREATE EXTENSION, the specs' setup and teardown) included
DISCARD_CACHES_SCOPE=${DISCARD_CACHES_SCOPE:-tested}
SQLSMITH_SECONDS=${SQLSMITH_SECONDS:-600}
# the length of one sqlsmith run within that (it reads the catalog when it
# starts, and partitions it read are dropped within a minute)
SQLSMITH_RUN_SECONDS=${SQLSMITH_RUN_SECONDS:-30}
SQLSMITH_SERVERS=${SQLSMITH_SERVERS:-cassert 15 17 18}
# general: the whole catalog; extension: the extension's API (see the header)
SQLSMITH_PASSES=${SQLSMITH_PASSES:-general extension}
SQLSMITH_SEED=${SQLSMITH_SEED:-$(date +%s)}

say() { printf '\n==== %s\n' "$*"; }
die() {
	echo "release: $*" >&2
	exit 1
}

WORK=""
CHILD=""
FAILED=0
# background pollers (make sqlsmith's snapshots of the call counts), and
# background steps in sessions of their own (make discard-caches' parts)
POLLERS=()
BG_GROUPS=()
DISCARD_PID=""

# Long steps run in their own session, so that a signal to this script ends
# the whole step (make, pg_regress, sqlsmith) before the servers are stopped.
run_child() {
	setsid "$@" &
	CHILD=$!
	wait "$CHILD"
	local rc=$?
	CHILD=""
	return "$rc"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$CHILD" ]; then
		kill -TERM -- "-$CHILD" 2>/dev/null
		sleep 2
		kill -KILL -- "-$CHILD" 2>/dev/null
		wait "$CHILD" 2>/dev/null
	fi
	local p
	for p in "${POLLERS[@]}"; do
		kill "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	for p in "${BG_GROUPS[@]}"; do
		kill -TERM -- "-$p" 2>/dev/null
	done
	[ ${#BG_GROUPS[@]} -eq 0 ] || sleep 2
	for p in "${BG_GROUPS[@]}"; do
		kill -KILL -- "-$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		cluster_stop_any_under "$WORK" || rc=1
	fi
	root_umount_all || rc=1
	[ "$FAILED" -eq 0 ] || [ "$rc" -ne 0 ] || rc=1
	if [ -n "$WORK" ]; then
		if [ "$rc" -eq 0 ] && [ "${KEEP_WORKDIR:-0}" != 1 ]; then
			rm -rf "$WORK"
		else
			echo "release: scratch directory kept: $WORK"
		fi
	fi
	exit "$rc"
}

# The scratch directory, owned by the test user (whose servers write in it).
make_workdir() {
	CLUSTER_USER=$(deps_test_user) || exit 1
	export CLUSTER_USER
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-release.XXXXXX") || exit 1
	chmod 755 "$WORK"
	chown "$CLUSTER_USER:" "$WORK" || exit 1
	trap cleanup EXIT
	trap 'echo "release: interrupted" >&2; exit 130' INT
	trap 'echo "release: terminated" >&2; exit 143' TERM
}

# as_user CMD...: CMD as the test user, in the scratch copy of the tree
as_user() {
	run_child runuser -u "$CLUSTER_USER" -- env -C "$WORK/src" "$@"
}

# build_extension DESTDIR: build the extension for $PG_CONFIG in a scratch
# copy ($WORK/src) and install it (into DESTDIR, when given: a staging
# directory, not the server's own directories)
build_extension() {
	local destdir="${1:-}"
	rm -rf "$WORK/src"
	idem_copy_tree "$SRC" "$WORK/src" || return 1
	idem_build "$WORK/src" >"$WORK/build.log" 2>&1 || {
		tail -n 30 "$WORK/build.log"
		return 1
	}
	(cd "$WORK/src" && make install PG_CONFIG="$PG_CONFIG" ${destdir:+DESTDIR="$destdir"}) \
		>>"$WORK/build.log" 2>&1 || {
		tail -n 30 "$WORK/build.log"
		return 1
	}
}

# The assert-enabled server, with the extension installed in it.
setup_cassert() {
	[ "$(id -u)" -eq 0 ] || die "run as root: the assert-enabled server is built and the extension installed into it"
	[ $# -eq 0 ] || deps_ensure "$@" || exit 1
	cassert_ensure || exit 1
	PG_CONFIG=$(cassert_pg_config)
	export PG_CONFIG
	make_workdir
	say "the extension, built for $("$PG_CONFIG" --version) (assertions on) and installed into $(cassert_prefix)"
	build_extension || die "could not build or install the extension"
}

# installcheck NAME TIMEOUT MAKE-ARGS...: "make installcheck" in the scratch
# copy as the test user, bounded in time; prints the diffs on failure
installcheck() {
	local name="$1" limit="$2" rc
	shift 2
	as_user env PGCTLTIMEOUT=600 PGISOLATIONTIMEOUT=1200 \
		timeout -k 30 "$limit" make installcheck PG_CONFIG="$PG_CONFIG" "$@"
	rc=$?
	if [ "$rc" -ne 0 ]; then
		[ "$rc" -eq 124 ] && echo "release: $name timed out after ${limit}s"
		for f in "$WORK/src/regression.diffs" "$WORK/src/output_iso/regression.diffs" \
			"$WORK/src/output_iso_preload/regression.diffs"; do
			[ -f "$f" ] && tail -n 300 "$f"
		done
	fi
	return "$rc"
}

# the specs of $1 (default: every spec of specs/) that are (when $3 is
# "in") or are not (else) among those of $2
specs_of() {
	local all="$1" among=" $2 " pick="${3:-}" f s out=()
	if [ -z "$all" ]; then
		for f in "$SRC"/specs/*.spec; do
			[ -e "$f" ] || die "no isolation specs in $SRC/specs"
			all+=" $(basename "$f" .spec)"
		done
	fi
	for s in $all; do
		if [[ "$among" == *" $s "* ]]; then
			[ "$pick" = in ] && out+=("$s")
		else
			[ "$pick" = in ] || out+=("$s")
		fi
	done
	echo "${out[*]}"
}

# ---------------------------------------------------------------- valgrind
gate_valgrind() {
	local bin real logs supp specs timing start rc_r rc_i rc_t errors procs suppressed bad f regress
	setup_cassert valgrind
	real=$("$PG_CONFIG" --bindir)
	supp="$(cassert_prefix)/share/valgrind.supp"
	bin="$WORK/valgrind-bin"
	logs="$WORK/valgrind-logs"
	mkdir -p "$bin" "$logs" || exit 1
	chown "$CLUSTER_USER:" "$logs" || exit 1
	for f in "$real"/*; do
		ln -s "$f" "$bin/" || exit 1
	done
	rm -f "$bin/postgres"
	# every process of the server under memcheck: the postmaster, the
	# backends and workers it forks (memcheck follows forks), and what they
	# exec (--trace-children=yes); one log per process.  No leak check:
	# memory contexts free everything at once.  initdb runs the real
	# postgres, found beside the real initdb (symbolic links are resolved).
	cat >"$bin/postgres" <<EOF
#!/bin/sh
exec valgrind --trace-children=yes --track-origins=yes --num-callers=40 \\
	--leak-check=no --error-limit=no --gen-suppressions=all \\
	--suppressions=$supp \\
	--error-markers=VALGRINDERROR-BEGIN,VALGRINDERROR-END \\
	--log-file=$logs/%p.log $real/postgres "\$@"
EOF
	chmod 755 "$bin/postgres"
	specs=$(specs_of "${VALGRIND_SPECS:-}" "$VALGRIND_TIMING_SPECS")
	timing=$(specs_of "${VALGRIND_SPECS:-}" "$VALGRIND_TIMING_SPECS" in)

	start=$SECONDS
	say "valgrind: regress suite (memcheck on every server process)"
	regress=${VALGRIND_REGRESS:-}
	if [ -z "$regress" ]; then
		for f in "$SRC"/sql/*.sql; do
			f=$(basename "$f" .sql)
			[[ " $VALGRIND_SKIP_REGRESS " == *" $f "* ]] || regress+=" $f"
		done
	fi
	installcheck regress "$VALGRIND_TIMEOUT" ISOLATION= TAP_TESTS= \
		REGRESS="${regress# }" \
		TEST_PORT=$((PORT_BASE + 1)) EXTRA_REGRESS_OPTS="--bindir=$bin"
	rc_r=$?
	say "valgrind: isolation specs: $specs"
	rc_i=0
	if [ -n "$specs" ]; then
		installcheck isolation "$VALGRIND_TIMEOUT" REGRESS= TAP_TESTS= ISOLATION="$specs" \
			TEST_PORT_ISO=$((PORT_BASE + 2)) EXTRA_REGRESS_OPTS="--bindir=$bin"
		rc_i=$?
	fi
	rc_t=0
	if [ -n "$timing" ]; then
		say "valgrind: isolation specs run for memcheck only, output not compared: $timing"
		# on an instance of their own, after the others' (whose diffs stay);
		# a step that waits for a partition that, late, it missed gives up
		# after 300 s
		as_user env PGCTLTIMEOUT=600 PGISOLATIONTIMEOUT=300 timeout -k 30 "$VALGRIND_TIMEOUT" \
			make installcheck PG_CONFIG="$PG_CONFIG" REGRESS= TAP_TESTS= ISOLATION="$timing" ISOLATION_PRELOAD= \
			ISOLATION_OPTS="--inputdir=. --outputdir=output_iso_timing --temp-config=test/idempotency.conf --temp-instance=./tmp_check_iso_timing --port=$((PORT_BASE + 5))" \
			EXTRA_REGRESS_OPTS="--bindir=$bin"
		rc_t=$?
	fi

	procs=$(find "$logs" -name '*.log' | wc -l)
	errors=$(cat "$logs"/*.log 2>/dev/null |
		sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' | awk '{s += $1} END {print s + 0}')
	suppressed=$(cat "$logs"/*.log 2>/dev/null |
		sed -n 's/.*ERROR SUMMARY: .*(suppressed: \([0-9]*\) from.*/\1/p' | awk '{s += $1} END {print s + 0}')
	bad=$(grep -l VALGRINDERROR-BEGIN "$logs"/*.log 2>/dev/null)
	if [ -n "$bad" ]; then
		say "valgrind: the errors (at most 3 processes shown; all in $logs)"
		for f in $(head -n 3 <<<"$bad"); do
			echo "---- $f"
			sed -n '/VALGRINDERROR-BEGIN/,/VALGRINDERROR-END/p' "$f" | head -n 200
		done
	fi
	say "valgrind: summary"
	printf 'regress:   %s (%d tests%s)\n' "$([ "$rc_r" -eq 0 ] && echo passed || echo FAILED)" \
		"$(wc -w <<<"$regress")" "$([ -n "${VALGRIND_REGRESS:-}" ] || echo "; left out: $VALGRIND_SKIP_REGRESS")"
	printf 'isolation: %s (%d specs)\n' "$([ "$rc_i" -eq 0 ] && echo passed || echo FAILED)" \
		"$(wc -w <<<"$specs")"
	printf 'isolation, memcheck only: %s (%s; output %s)\n' "${timing:-none}" \
		"$([ "$rc_t" -eq 124 ] && echo timed out || echo ran)" \
		"$([ "$rc_t" -eq 0 ] && echo as expected || echo not compared)"
	printf 'memcheck:  %d errors (%d suppressed) in %d processes, %d s\n' \
		"$errors" "$suppressed" "$procs" "$((SECONDS - start))"
	if [ "$rc_r" -ne 0 ] || [ "$rc_i" -ne 0 ] || [ "$rc_t" -eq 124 ] || [ "$errors" -ne 0 ]; then
		FAILED=1
		[ "$procs" -gt 0 ] && KEEP_WORKDIR=1
	fi
}

# ---------------------------------------------------------------- discard caches
# discard_caches_inputs DIR: the gate's copies of the regress tests of
# DISCARD_CACHES_REGRESS (DIR/sql, DIR/expected) and of the specs of
# DISCARD_CACHES_SPECS (DIR/specs, DIR/expected), which turn
# debug_discard_caches on for what is under test only: in a regress test,
# from each CREATE EXTENSION on (it is turned off before each DROP
# EXTENSION); in a spec, in every session's setup (the spec's own setup and
# teardown, on isolationtester's control connection, run without).  The
# expected outputs are the tests' own, with the SET and RESET lines where
# psql echoes them; nothing else changes.
discard_caches_inputs() {
	local dir="$1" t
	mkdir -p "$dir/sql" "$dir/expected" "$dir/specs" || return 1
	for t in $DISCARD_CACHES_REGRESS; do
		if [ ! -f "$SRC/sql/$t.sql" ] || [ ! -f "$SRC/expected/$t.out" ]; then
			echo "release: no regress test $t"
			return 1
		fi
		awk -v mode=sql "$_DISCARD_REGRESS_AWK" "$SRC/sql/$t.sql" >"$dir/sql/$t.sql" &&
			awk -v mode=out "$_DISCARD_REGRESS_AWK" "$SRC/sql/$t.sql" "$SRC/expected/$t.out" \
				>"$dir/expected/$t.out" || return 1
	done
	for t in $DISCARD_CACHES_SPECS; do
		if [ ! -f "$SRC/specs/$t.spec" ] || [ ! -f "$SRC/expected/$t.out" ]; then
			echo "release: no isolation spec $t"
			return 1
		fi
		awk "$_DISCARD_SPEC_AWK" "$SRC/specs/$t.spec" >"$dir/specs/$t.spec" &&
			cp "$SRC/expected/$t.out" "$dir/expected/$t.out" || return 1
		# a step that a 1 ms lock_timeout ends (cache_errors) may be seen
		# waiting first: its backend, slowed by the setting, may not have
		# handled the timeout when isolationtester looks, on a busy
		# machine.  The same error, reported once the next step has run,
		# is accepted too (an alternative expected output, $t_1.out).
		awk "$_DISCARD_LOCK_TIMEOUT_AWK" "$SRC/expected/$t.out" >"$dir/expected/${t}_1.out" ||
			rm -f "$dir/expected/${t}_1.out"
	done
	chown -R "$CLUSTER_USER:" "$dir"
}

# a regress test's input (mode=sql) or expected output (mode=out, after the
# input file): SET debug_discard_caches = 1 after each CREATE EXTENSION,
# RESET before each DROP EXTENSION.  In the output, the SET goes where psql
# echoes it: after the statement's own output (a NOTICE), before the echo of
# the next input line that is not blank (psql does not echo those).
# shellcheck disable=SC2016 # awk's $0, not the shell's
_DISCARD_REGRESS_AWK='
	BEGIN { on = "SET debug_discard_caches = 1;"; off = "RESET debug_discard_caches;" }
	mode == "out" && FNR == NR {
		if (after && $0 != "") { next_line[++n] = $0; after = 0 }
		if ($0 ~ /^CREATE EXTENSION/) after = 1
		next
	}
	{
		if (mode == "out" && waiting && $0 == next_line[k]) { print on; waiting = 0 }
		if ($0 ~ /^DROP EXTENSION/) print off
		print
		if ($0 ~ /^CREATE EXTENSION/) {
			if (mode == "sql") print on
			else { k++; waiting = 1 }
		}
	}
	END { if (waiting) print on }'

# an isolation test's expected output, with each step that ends in a lock
# timeout and is followed by a step without output shown waiting instead,
# its error after that step; fails if there is none
# shellcheck disable=SC2016 # awk's $0, not the shell's
_DISCARD_LOCK_TIMEOUT_AWK='
	{ line[NR] = $0 }
	END {
		for (i = 1; i <= NR; i++) {
			if (line[i] ~ /^step [^:]+: / && line[i + 1] == "ERROR:  canceling statement due to lock timeout" &&
			    line[i + 2] ~ /^step [^:]+: .*;$/ && line[i + 3] ~ /^step /) {
				name = line[i]; sub(/^step /, "", name); sub(/:.*/, "", name)
				print line[i] " <waiting ...>"
				print line[i + 2]
				print "step " name ": <... completed>"
				print line[i + 1]
				i += 2
				changed = 1
				continue
			}
			print line[i]
		}
		exit !changed
	}'

# a spec: SET debug_discard_caches = 1 in every session's setup (its own
# setup, or one added); fails if a session was missed
# shellcheck disable=SC2016 # awk's $0, not the shell's
_DISCARD_SPEC_AWK='
	BEGIN { dc = "SET debug_discard_caches = 1;" }
	{
		if (state == 1) {
			if ($0 ~ /^[ \t]*(#.*)?$/) { print; next }
			if ($0 ~ /^[ \t]*setup([ \t{]|$)/) state = 2
			else { print "setup { " dc " }"; set++; state = 0 }
		}
		if (state == 2 && index($0, "{")) { sub(/\{/, "{ " dc " "); set++; state = 0 }
		print
		if ($0 ~ /^[ \t]*session[ \t]/) { state = 1; sessions++ }
	}
	END { if (set != sessions) { print "discard-caches: " sessions " sessions, " set " set" > "/dev/stderr"; exit 1 } }'

# discard_part LOG MAKE-ARGS...: "make installcheck" in the scratch copy as
# the test user, in the background and in a session of its own (BG_GROUPS, so
# that cleanup ends the whole part), bounded by the budget; its pid in
# DISCARD_PID
discard_part() {
	local log="$1"
	shift
	setsid runuser -u "$CLUSTER_USER" -- env -C "$WORK/src" PGCTLTIMEOUT=600 \
		PGISOLATIONTIMEOUT="$DISCARD_CACHES_SECONDS" timeout -k 30 "$DISCARD_CACHES_SECONDS" \
		make installcheck PG_CONFIG="$PG_CONFIG" "$@" >"$log" 2>&1 &
	DISCARD_PID=$!
	BG_GROUPS+=("$DISCARD_PID")
}

gate_discard_caches() {
	local in conf preload_conf scope start pid_r pid_i done_pid rc round rc_r=1 rc_i=1 t_r=0 t_i=0 f d
	setup_cassert
	case $DISCARD_CACHES_SCOPE in
	tested)
		# the gate's copies of the tests, on servers with the suites' settings
		in="$WORK/discard"
		discard_caches_inputs "$in" || die "could not make the gate's copies of the tests"
		conf=test/idempotency.conf
		preload_conf=test/idempotency-preload.conf
		scope="in the tested sessions"
		;;
	server)
		# the tests as they are, on servers that discard caches everywhere
		in=.
		conf="$WORK/discard_caches.conf"
		preload_conf="$WORK/discard_caches_preload.conf"
		{
			cat "$SRC/test/idempotency.conf"
			echo "debug_discard_caches = 1"
		} >"$conf" || exit 1
		{
			cat "$SRC/test/idempotency-preload.conf"
			echo "debug_discard_caches = 1"
		} >"$preload_conf" || exit 1
		chmod 644 "$conf" "$preload_conf"
		scope="on the whole server"
		;;
	*) die "DISCARD_CACHES_SCOPE: tested or server, not '$DISCARD_CACHES_SCOPE'" ;;
	esac

	start=$SECONDS
	say "discard-caches: regress tests ($DISCARD_CACHES_REGRESS) and isolation specs ($DISCARD_CACHES_SPECS) at once, each on a server of its own, debug_discard_caches = 1 $scope, budget ${DISCARD_CACHES_SECONDS}s"
	discard_part "$WORK/discard-regress.log" ISOLATION= ISOLATION_PRELOAD= TAP_TESTS= \
		REGRESS="$DISCARD_CACHES_REGRESS" \
		REGRESS_OPTS="--inputdir=$in --outputdir=output_discard_regress --temp-config=$conf --temp-instance=./tmp_check_discard_regress --port=$((PORT_BASE + 3))"
	pid_r=$DISCARD_PID
	# the specs twice, as make installcheck runs them: without preloading,
	# and on a server that preloads the library (the digest filters in
	# every probe, test/idempotency-preload.conf)
	discard_part "$WORK/discard-isolation.log" REGRESS= TAP_TESTS= ISOLATION="$DISCARD_CACHES_SPECS" \
		ISOLATION_OPTS="--inputdir=$in --outputdir=output_discard_iso --temp-config=$conf --temp-instance=./tmp_check_discard_iso --port=$((PORT_BASE + 4))" \
		ISOLATION_PRELOAD="$DISCARD_CACHES_SPECS" \
		ISOLATION_PRELOAD_OPTS="--inputdir=$in --outputdir=output_discard_iso_preload --temp-config=$preload_conf --temp-instance=./tmp_check_discard_iso_preload --port=$((PORT_BASE + 5))"
	pid_i=$DISCARD_PID
	# the first part to end, then the other
	wait -n -p done_pid "$pid_r" "$pid_i"
	rc=$?
	for round in 1 2; do
		if [ "$done_pid" = "$pid_r" ]; then
			rc_r=$rc t_r=$((SECONDS - start))
			echo "discard-caches: regress part ended in ${t_r}s (exit $rc)"
			done_pid=$pid_i
		else
			rc_i=$rc t_i=$((SECONDS - start))
			echo "discard-caches: isolation part ended in ${t_i}s (exit $rc)"
			done_pid=$pid_r
		fi
		if [ "$round" = 1 ]; then
			wait "$done_pid"
			rc=$?
		fi
	done
	BG_GROUPS=()
	for f in "$WORK/discard-regress.log" "$WORK/discard-isolation.log"; do
		echo "---- ${f##*/}"
		grep -E '^(\+\+\+|ok|not ok|test |     [a-z_]+ |=====|\(using|# )|tests passed|failed' "$f" | tail -n 40
	done
	[ "$rc_r" -eq 124 ] && echo "release: the regress part timed out after ${DISCARD_CACHES_SECONDS}s"
	[ "$rc_i" -eq 124 ] && echo "release: the isolation part timed out after ${DISCARD_CACHES_SECONDS}s"
	for d in output_discard_regress output_discard_iso output_discard_iso_preload; do
		[ -f "$WORK/src/$d/regression.diffs" ] && tail -n 300 "$WORK/src/$d/regression.diffs"
	done
	say "discard-caches: summary (debug_discard_caches = 1 $scope)"
	printf 'regress:   %s in %d s (%s)\n' "$([ "$rc_r" -eq 0 ] && echo passed || echo FAILED)" "$t_r" "$DISCARD_CACHES_REGRESS"
	printf 'isolation: %s in %d s (%s; without preloading, then preloaded)\n' \
		"$([ "$rc_i" -eq 0 ] && echo passed || echo FAILED)" "$t_i" "$DISCARD_CACHES_SPECS"
	printf 'total:     %d s (the parts ran at once, each with a %d s budget)\n' "$((SECONDS - start))" "$DISCARD_CACHES_SECONDS"
	[ "$rc_r" -eq 0 ] && [ "$rc_i" -eq 0 ] || FAILED=1
}

# ---------------------------------------------------------------- sqlsmith
# sqlsmith_one LABEL PORT STAGED: the sqlsmith runs against one server
# ($PG_CONFIG's), with the extension built and installed already (into the
# staging directory $WORK/stage when STAGED is 1): for each pass of
# SQLSMITH_PASSES, as sqlsmith_user and as a superuser.  Appends its figures
# to $WORK/sqlsmith.results ("LABEL ROLE PASS key=value ..." lines) and
# $WORK/sqlsmith.calls, and returns non-zero if a gate failed.
sqlsmith_one() {
	local label="$1" port="$2" staged="$3" dir conf=() log db=smith
	local pass role user seed out deadline left runs rc fails=0 secs n path xopts poller
	local crashes traps panics fatals xx_ext classes ext_classes off0 off1 amcheck calls named
	dir="$WORK/smith-$label"
	log="$dir/postgresql.log"
	conf=("shared_preload_libraries = 'idempotency'"
		# partitions that end and are dropped every few seconds while
		# sqlsmith runs: the worker every second, 10 s partitions, 1 min
		# default ttls
		"idempotency.naptime = 1" "idempotency.partition_interval = '10s'"
		"idempotency.key_ttl = '1min'" "idempotency.message_ttl = '1min'"
		"fsync = off" "max_connections = 30"
		# the SQLSTATE and application of each line, for the error counts
		"log_line_prefix = '%m [%p] %a %e '" "log_error_verbosity = verbose"
		"log_min_messages = warning"
		# to count the calls of the extension's functions
		"track_functions = 'all'")
	if [ "$staged" = 1 ]; then
		# Debian's extension_destdir: control and script files, and
		# $libdir modules, are looked for under the staging directory first
		conf+=("extension_destdir = '$WORK/stage'"
			"dynamic_library_path = '$WORK/stage$("$PG_CONFIG" --pkglibdir):\$libdir'")
	fi
	cluster_start "$dir" "$port" "${conf[@]}" || return 1
	cluster_psql "$dir" -q -c "CREATE DATABASE $db" || return 1
	CLUSTER_DB=$db cluster_psql "$dir" -q -f "$SRC/test/lib/sqlsmith_setup.sql" >"$dir/setup.log" 2>&1 || {
		cat "$dir/setup.log"
		return 1
	}
	# partitions made and expired: wait until the worker has dropped the
	# short-ttl rows' partitions (they end within seconds)
	deadline=$((SECONDS + 300))
	until [ "$(CLUSTER_DB=$db cluster_psql "$dir" -At -c \
		"SELECT partitions_dropped > 0 FROM idempotency.stats WHERE datname = current_database()")" = t ]; do
		[ "$SECONDS" -lt "$deadline" ] || {
			echo "release: no partition was dropped within 300 s"
			return 1
		}
		sleep 1
	done
	echo "$label: ledger populated: $(CLUSTER_DB=$db cluster_psql "$dir" -At -c \
		"SELECT format('%s keys, %s messages, %s partitions, %s made and %s dropped so far',
		        (SELECT count(*) FROM idempotency.keys), (SELECT count(*) FROM idempotency.messages),
		        (SELECT count(*) FROM idempotency.partitions), partitions_created, partitions_dropped)
		   FROM idempotency.stats WHERE datname = current_database()")"

	for pass in $SQLSMITH_PASSES; do
		case $pass in
		general) xopts=() ;;
		extension)
			# what the targeted pass reads instead of the catalog, and
			# the arguments of its calls (test/lib/sqlsmith_target.sql);
			# catalog relations are left out of its queries
			CLUSTER_DB=$db cluster_psql "$dir" -q -f "$SRC/test/lib/sqlsmith_target.sql" \
				>"$dir/target.log" 2>&1 || {
				cat "$dir/target.log"
				return 1
			}
			xopts=(--exclude-catalog)
			;;
		*)
			echo "release: unknown sqlsmith pass '$pass' (general extension)"
			return 1
			;;
		esac
		for role in sqlsmith_user superuser; do
			user=$role
			[ "$role" = superuser ] && user=$CLUSTER_USER
			# the schema whose pg_proc sqlsmith reads instead of the catalog's
			case $pass/$role in
			general/*) path=sqlsmith_denylist ;;
			extension/sqlsmith_user) path=sqlsmith_target_user ;;
			extension/superuser) path=sqlsmith_target ;;
			esac
			off0=$(stat -c %s "$log")
			calls="$dir/calls-$pass-$role"
			: >"$calls"
			ext_calls_poll "$dir" "$db" "$calls" &
			poller=$!
			POLLERS+=("$poller")
			deadline=$((SECONDS + SQLSMITH_SECONDS))
			runs=0
			# sqlsmith reads the catalog once, when it starts, and the
			# ledger's partitions are made and dropped every 10 s: a run
			# lasts SQLSMITH_RUN_SECONDS, then the next one starts (with the
			# next seed) from the catalog as it is then.  One ends early
			# when its connection breaks (a crash); the runs go on until
			# the time is up.
			while left=$((deadline - SECONDS)) && [ "$left" -gt 0 ]; do
				seed=$((SQLSMITH_SEED + runs))
				runs=$((runs + 1))
				out="$dir/sqlsmith-$pass-$role-$runs.out"
				[ "$left" -le "$SQLSMITH_RUN_SECONDS" ] || left=$SQLSMITH_RUN_SECONDS
				[ "$runs" -gt 1 ] || echo "$label, $role, $pass pass: sqlsmith --seed=$seed.. for ${SQLSMITH_SECONDS}s, ${left}s a run"
				# every query as it is sent (--dump-all-queries, on
				# standard output) is read by api_named, which keeps only
				# the count of those that name the extension's API
				cluster_as_user timeout -s INT -k 30 "$left" sqlsmith --verbose --dump-all-queries \
					--seed="$seed" "${xopts[@]}" \
					--target="host=$dir/sock port=$port dbname=$db user=$user options='-csearch_path=$path,pg_catalog,public'" \
					2>"$out" | api_named >"$out.named"
				rc=${PIPESTATUS[0]}
				if [ "$rc" -ne 124 ] && [ "$rc" -ne 0 ]; then
					echo "$label, $role, $pass pass: sqlsmith ended early (exit $rc): $(tail -n 3 "$out" | tr '\n' ' ')"
					# the server restarts after a crash: wait for it
					cluster_as_user env PATH="$("$PG_CONFIG" --bindir):$PATH" \
						pg_isready -q -t 120 -h "$dir/sock" -p "$port" || {
						echo "release: the server did not come back"
						return 1
					}
					sleep 1
				fi
			done
			# the last counts of sqlsmith's backend are in once it has
			# ended: a last poll after it
			sleep 3
			kill "$poller" 2>/dev/null
			wait "$poller" 2>/dev/null
			POLLERS=()
			ext_calls_once "$dir" "$db" >>"$calls"
			off1=$(stat -c %s "$log")
			tail -c +$((off0 + 1)) "$log" | head -c $((off1 - off0)) >"$dir/server-$pass-$role.log"
			secs=$SQLSMITH_SECONDS
			# the queries of each sqlsmith run: the last of its reports
			# ("queries: N", every 800 queries and when it ends; a run that
			# lost its connection to a crash may not say)
			n=0
			for out in "$dir"/sqlsmith-"$pass"-"$role"-*.out; do
				n=$((n + $(sed -n 's/^queries: \([0-9]*\)$/\1/p' "$out" | tail -n 1 | grep . || echo 0)))
			done
			named=$(cat "$dir"/sqlsmith-"$pass"-"$role"-*.out.named | awk '{q += $1; a += $2} END {printf "%d/%d", a, q}')
			crashes=$(grep -c 'terminated by signal' "$dir/server-$pass-$role.log")
			traps=$(grep -c 'TRAP:' "$dir/server-$pass-$role.log")
			panics=$(grep -c ' PANIC: ' "$dir/server-$pass-$role.log")
			# (sqlsmith's sessions are named sqlsmith::dut, sqlsmith::schema;
			# a run ended while its query runs leaves "connection to client
			# lost", not counted)
			fatals=$(grep -E ' \[[0-9]+\] sqlsmith[^ ]* [0-9A-Z]{5} FATAL: ' "$dir/server-$pass-$role.log" |
				grep -vc ' 08006 FATAL: .*connection to client lost')
			# errors of sqlsmith's sessions by SQLSTATE class
			classes=$(sed -En 's/.* \[[0-9]+\] sqlsmith[^ ]* ([0-9A-Z]{2})[0-9A-Z]{3} ERROR: .*/\1/p' \
				"$dir/server-$pass-$role.log" | sort | uniq -c | sort -rn | awk '{printf "%s%s:%s", sep, $2, $1; sep=","}')
			# the errors raised in the extension's own code, by class, and
			# the internal ones (XX) among them
			ext_classes=$(errors_in_extension "$dir/server-$pass-$role.log" classes)
			xx_ext=$(errors_in_extension "$dir/server-$pass-$role.log" xx)
			printf '%s %s %s queries=%d seconds=%d qps=%d runs=%d naming_api=%s api_calls=%d crashes=%d traps=%d panics=%d fatals=%d xx_extension=%d errors=%s extension_errors=%s\n' \
				"$label" "$role" "$pass" "$n" "$secs" "$((n / secs))" "$runs" "$named" \
				"$(calls_total "$calls")" "$crashes" "$traps" "$panics" "$fatals" "$xx_ext" \
				"${classes:-none}" "${ext_classes:-none}" >>"$WORK/sqlsmith.results"
			printf '%s %s %s: %s\n' "$label" "$role" "$pass" "$(calls_total "$calls" each)" >>"$WORK/sqlsmith.calls"
			tail -n 1 "$WORK/sqlsmith.results"
			tail -n 1 "$WORK/sqlsmith.calls"
			# the internal errors (class XX) of any code, for a look: the
			# server's own are known sqlsmith findings, not the extension's
			sed -En 's/.* \[[0-9]+\] sqlsmith[^ ]* (XX[0-9A-Z]{3}) ERROR: +XX[0-9A-Z]{3}: (.{0,100}).*/  \1 \2/p' \
				"$dir/server-$pass-$role.log" | sort | uniq -c | sort -rn | head -n 10
			if [ "$crashes" -ne 0 ] || [ "$traps" -ne 0 ] || [ "$panics" -ne 0 ] || [ "$xx_ext" -ne 0 ]; then
				fails=1
				grep -E -B2 -A12 'TRAP:|terminated by signal|PANIC: ' "$dir/server-$pass-$role.log" | head -n 120
				errors_in_extension "$dir/server-$pass-$role.log" show | head -n 60
			fi
		done
	done

	# the ledger after the fuzzing: every index intact, and it still answers
	amcheck=$(CLUSTER_DB=$db cluster_psql "$dir" -q -f "$SRC/test/lib/amcheck_ledger.sql" 2>&1)
	if [[ "$amcheck" == *"NOTICE:  amcheck: "* ]] && [[ "$amcheck" != *ERROR* ]]; then
		echo "$label: ${amcheck##*NOTICE:  }"
		echo "$label amcheck: ${amcheck##*NOTICE:  }" >>"$WORK/sqlsmith.calls"
	else
		echo "$label: amcheck FAILED: $amcheck"
		echo "$label amcheck: FAILED" >>"$WORK/sqlsmith.calls"
		fails=1
	fi
	n=$(CLUSTER_DB=$db cluster_psql "$dir" -At -c \
		"SELECT count(*) FILTER (WHERE NOT idem_consume_message('su-billing', 'msg-' || g, '1 hour'))
		        + count(*) FILTER (WHERE (SELECT status FROM idem_claim('su-done-' || g, jsonb_build_object('n', g))) = 'completed')
		   FROM generate_series(1, 100) g" 2>&1)
	if [ "$n" = 200 ]; then
		echo "$label: the ledger still answers: 100 messages are duplicates, 100 keys replay"
		echo "$label ledger: still answers (100 duplicates, 100 replays)" >>"$WORK/sqlsmith.calls"
	else
		echo "$label: the ledger after the fuzzing: want 200 duplicates and replays, got $n"
		echo "$label ledger: FAILED ($n of 200)" >>"$WORK/sqlsmith.calls"
		fails=1
	fi
	cluster_stop "$dir" || fails=1
	return "$fails"
}

# The calls of the extension's functions (those of its pg_depend members:
# the idem_* functions and those of schema idempotency, not the targeted
# pass's wrappers) are counted from track_functions' statistics, which
# count a call that returned (not one that ended in an error).  sqlsmith
# may reset them (pg_stat_reset(), pg_stat_reset_single_function_counters())
# and a crash discards them, so a poller takes a snapshot every second while
# sqlsmith runs; calls_total adds up the counts between resets.  A line:
# "<the database's stats_reset, or -> function=calls ...".  What a reset
# loses: the calls counted since the snapshot before it (a second's).
_EXT_CALLS_SQL="SELECT coalesce((SELECT extract(epoch FROM stats_reset)::text FROM pg_stat_database
                                  WHERE datname = current_database()), '-')
                       || ' ' || string_agg(p.proname || '=' || coalesce(pg_stat_get_function_calls(p.oid), 0),
                                            ' ' ORDER BY p.proname)
                  FROM pg_proc p
                  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'"

# ext_calls_once DIR DB: one snapshot line
ext_calls_once() {
	CLUSTER_DB=$2 cluster_psql "$1" -At -c "$_EXT_CALLS_SQL" 2>/dev/null
}

# ext_calls_poll DIR DB FILE: a snapshot every second into FILE, until
# killed (a failed one, while the server restarts after a crash, is skipped)
ext_calls_poll() {
	trap 'exit 0' TERM
	while :; do
		ext_calls_once "$1" "$2" >>"$3"
		sleep 1
	done
}

# calls_total FILE [each]: the calls since the first snapshot of FILE, summed
# over the extension's functions (with "each": "function=calls ..." of those
# called, most called first)
calls_total() {
	awk -v each="${2:-}" '
		NF < 2 { next }
		{
			# a reset of the whole database: what was counted before it is in
			if (NR > 1 && $1 != marker)
				for (f in last) { acc[f] += last[f]; last[f] = 0 }
			marker = $1
			for (i = 2; i <= NF; i++) {
				eq = index($i, "="); f = substr($i, 1, eq - 1); v = substr($i, eq + 1) + 0
				if (!(f in base)) { base[f] = (NR == 1) ? v : 0; last[f] = base[f] }
				# a reset of one function, or of all by a crash
				if (v < last[f]) acc[f] += last[f]
				last[f] = v
			}
		}
		END {
			for (f in last) { c = acc[f] + last[f] - base[f]; total += c; if (c > 0) out = out sprintf("%d %s\n", c, f) }
			if (each == "") { print total + 0; exit }
			n = split(out, lines, "\n"); s = ""
			# most called first (a simple selection: 25 functions at most)
			for (k = 1; k < n; k++) for (j = k + 1; j < n; j++) {
				split(lines[k], a, " "); split(lines[j], b, " ")
				if (b[1] + 0 > a[1] + 0) { t = lines[k]; lines[k] = lines[j]; lines[j] = t }
			}
			for (k = 1; k < n; k++) { split(lines[k], a, " "); s = s sep a[2] "=" a[1]; sep = " " }
			print (s == "" ? "no call returned" : s)
		}' "$1"
}

# api_named: reads the queries sqlsmith dumps (each ends with a line that
# ends with ";") and prints "<queries> <those naming the API>": a function
# of the extension (idem_*, idempotency.<function>), a wrapper of the
# targeted pass (sqlsmith_target.*), a view that calls one (public.smith_*
# but the table of arguments, idempotency.partitions, idempotency.stats)
api_named() {
	awk '
		{ q = q "\n" $0 }
		/;[[:space:]]*$/ {
			n++
			v = q
			gsub(/public\.smith_args/, "", v)
			if (q ~ /[^a-z_]idem_[a-z_]+\(/ || q ~ /idempotency\.[a-z_]+\(/ || q ~ /sqlsmith_target\.[a-z_]+\(/ ||
			    v ~ /public\.smith_/ || q ~ /idempotency\.(partitions|stats)[^a-z_]/)
				named++
			q = ""
		}
		END { print n + 0, named + 0 }'
}

# errors_in_extension LOG MODE: the errors of sqlsmith's sessions in LOG
# whose LOCATION is a function of the extension's library (one of its
# symbols, or named as its functions are): "xx" counts the
# internal ones (class XX), "classes" prints the count per SQLSTATE class
# ("22:12,XX:1"), "show" prints the internal ones with their LOCATION
errors_in_extension() {
	local log="$1" mode="$2" funcs="$WORK/idempotency.functions"
	nm --defined-only "$WORK/src/idempotency.so" 2>/dev/null |
		awk '$2 ~ /^[Tt]$/ {print $3}' >"$funcs"
	# an ERROR line, then its DETAIL, HINT, CONTEXT lines, then LOCATION
	awk -v mode="$mode" -v funcs="$funcs" '
		BEGIN { while ((getline f < funcs) > 0) ours[f] = 1 }
		/ sqlsmith[^ ]* [0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z][0-9A-Z] ERROR: / {
			pending = $0
			state = pending; sub(/ ERROR: .*/, "", state); sub(/.* /, "", state)
			next
		}
		pending != "" && / LOCATION: / {
			fn = $0; sub(/.* LOCATION: */, "", fn); sub(/,.*/, "", fn)
			# (a static function inlined is not among the symbols; every
			# function of the extension is named Idem... or idem_...)
			if (fn in ours || fn ~ /^(Idem|idem_)/) {
				class = substr(state, 1, 2); byclass[class]++
				if (class == "XX") { xx++; if (mode == "show") print pending "\n" $0 }
			}
			pending = ""
			next
		}
		/ (ERROR|FATAL|PANIC|WARNING|LOG|STATEMENT): / { pending = "" }
		END {
			if (mode == "xx") print xx + 0
			if (mode == "classes") {
				for (c in byclass) { s = s sep c ":" byclass[c]; sep = "," }
				print (s == "" ? "none" : s)
			}
		}' "$log"
}

# The servers of SQLSMITH_SERVERS, one after the other.
gate_sqlsmith() {
	local s port n=0 rc dir
	[ "$(id -u)" -eq 0 ] || die "run as root: servers are built, and the extension installed, for the runs"
	deps_ensure sqlsmith binutils || exit 1
	make_workdir
	: >"$WORK/sqlsmith.results"
	: >"$WORK/sqlsmith.calls"
	chown "$CLUSTER_USER:" "$WORK/sqlsmith.results" "$WORK/sqlsmith.calls"
	for s in $SQLSMITH_SERVERS; do
		port=$((PORT_BASE + 10 + n))
		n=$((n + 1))
		say "sqlsmith on $s: passes $SQLSMITH_PASSES, each ${SQLSMITH_SECONDS}s as sqlsmith_user and ${SQLSMITH_SECONDS}s as a superuser"
		case $s in
		cassert)
			cassert_ensure || {
				FAILED=1
				continue
			}
			PG_CONFIG=$(cassert_pg_config) build_extension &&
				PG_CONFIG=$(cassert_pg_config) sqlsmith_one cassert "$port" 0
			;;
		15)
			PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config build_extension "$WORK/stage" &&
				PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config sqlsmith_one 15 "$port" 1
			;;
		17 | 18)
			sqlsmith_in_root "$s" "$port"
			;;
		*)
			echo "release: unknown server '$s' (cassert 15 17 18)"
			false
			;;
		esac
		rc=$?
		[ "$rc" -eq 0 ] || FAILED=1
	done
	say "sqlsmith: summary (${SQLSMITH_SECONDS}s per role, pass and server; seeds from $SQLSMITH_SEED)"
	# naming_api: queries that name the extension's API / queries;
	# api_calls: calls of its functions that returned
	column -t <"$WORK/sqlsmith.results" 2>/dev/null || cat "$WORK/sqlsmith.results"
	say "sqlsmith: calls of each of the extension's functions that returned, per server, role and pass"
	cat "$WORK/sqlsmith.calls"
	[ "$FAILED" -eq 0 ] && echo "0 crashes, 0 assertion failures, no internal error of the extension, ledgers intact"
}

# sqlsmith_in_root MAJOR PORT: the same inside the root of MAJOR (its own
# Debian PostgreSQL, the extension installed into it as the suites do)
sqlsmith_in_root() {
	local v="$1" port="$2" dir rc
	dir=$(root_dir "$v")
	deps_ensure mmdebstrap || return 1
	root_ensure "$v" || return 1
	rm -rf --one-file-system "$dir/tmp/idempotency-release-src"
	mkdir -p "$dir/tmp/idempotency-release-src" || return 1
	tar -C "$SRC" --exclude=./.git --exclude='./tmp_check*' --exclude='*.o' \
		--exclude='*.so' --exclude='*.bc' -cf - . |
		tar -C "$dir/tmp/idempotency-release-src" -xf - || return 1
	root_mount "$dir" || return 1
	root_run "$dir" env SQLSMITH_SECONDS="$SQLSMITH_SECONDS" SQLSMITH_SEED="$SQLSMITH_SEED" \
		SQLSMITH_PASSES="$SQLSMITH_PASSES" SQLSMITH_RUN_SECONDS="$SQLSMITH_RUN_SECONDS" \
		IDEM_RELEASE_PORT_BASE="$port" PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" \
		bash /tmp/idempotency-release-src/test/release.sh sqlsmith-here "$v"
	rc=$?
	cat "$dir/tmp/idempotency-release-src/sqlsmith.results" >>"$WORK/sqlsmith.results" 2>/dev/null
	cat "$dir/tmp/idempotency-release-src/sqlsmith.calls" >>"$WORK/sqlsmith.calls" 2>/dev/null
	root_umount "$dir" || rc=1
	rm -rf --one-file-system "$dir/tmp/idempotency-release-src"
	return "$rc"
}

# Inside a root: the runs against its server, installed into it.
gate_sqlsmith_here() {
	local label="$1" rc
	deps_ensure sqlsmith binutils || exit 1
	make_workdir
	: >"$WORK/sqlsmith.results"
	: >"$WORK/sqlsmith.calls"
	chown "$CLUSTER_USER:" "$WORK/sqlsmith.results" "$WORK/sqlsmith.calls"
	build_extension || exit 1
	sqlsmith_one "$label" "$PORT_BASE" 0
	rc=$?
	cp "$WORK/sqlsmith.results" "$SRC/sqlsmith.results"
	cp "$WORK/sqlsmith.calls" "$SRC/sqlsmith.calls"
	[ "$rc" -eq 0 ] || FAILED=1
}

# ---------------------------------------------------------------- amcheck
gate_amcheck() {
	psql -X -v ON_ERROR_STOP=1 -q -f "$SRC/test/lib/amcheck_ledger.sql"
}

case "${1:-}" in
valgrind) gate_valgrind ;;
discard-caches) gate_discard_caches ;;
sqlsmith) gate_sqlsmith ;;
sqlsmith-here) gate_sqlsmith_here "${2:?major}" ;;
amcheck) gate_amcheck ;;
*)
	echo "usage: bash test/release.sh valgrind | discard-caches | sqlsmith | amcheck" >&2
	exit 2
	;;
esac

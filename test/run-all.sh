#!/usr/bin/env bash
#
# test/run-all.sh -- build, install and test the idempotency extension on
# every supported PostgreSQL major, then across majors.
#
#   bash test/run-all.sh                               # everything
#   PG_VERSIONS=15 bash test/run-all.sh                # one major
#   PG_VERSIONS="15 18" SUITES="regress isolation" bash test/run-all.sh
#
# For each major of PG_VERSIONS (default "15 17 18"), test/run-suites.sh
# builds, installs and runs the suites:
#   - on this machine, for the major its own Debian release packages
#     (PostgreSQL 15 on Debian 12);
#   - otherwise inside a Debian root file system of the release that
#     packages it (17: trixie, 18: sid; see test/lib/roots.sh), made with
#     mmdebstrap on first use and kept under /var/cache/idempotency/roots.
#     The source tree is copied in; /proc and /dev are mounted while the
#     suites run and unmounted after, pass or fail.  In the 18 root, the
#     extension is also built for PostgreSQL 17, which its tap suite
#     upgrades from with pg_upgrade.
# The cassert suite (the regress, isolation and TAP suites on the
# assert-enabled PostgreSQL 15 of test/lib/cassert.sh) runs with the major
# of this machine only: that server is built from Debian 12's source package
# and cached under /var/cache/idempotency/cassert.
# Then, when SUITES names "upgrade" and PG_VERSIONS has 15 and 18, the
# cross-major suite: a PostgreSQL 15 cluster on this machine, dumped with
# PostgreSQL 18's pg_dump and restored into PostgreSQL 18 in its root
# (test/upgrade/dump_restore.sh).
#
# Environment: SUITES (default: every suite of test/run-suites.sh, and
# "upgrade"), PG_VERSIONS, and the settings of test/run-suites.sh and
# test/lib/roots.sh, which are passed on (IDEM_NO_SKIP=1, which .ci/run
# sets, makes a test that cannot get what it needs here fail instead of
# being skipped: Citus' sources, see test/lib/citus.sh).  Needs root for the
# majors that run in a root file system.  The local copy of Citus' sources
# (IDEM_VENDOR_DIR, default ../shared/vendor beside the tree), when there is
# one, is copied into the roots too.
#
# Prints a summary per major, and ends with "N passed, N failed, N
# skipped", counting suites over every major, and skipped tests of suites
# that ran (a skipped test counts as skipped, not as passed).  The exit
# status is non-zero if anything failed.

set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/roots.sh
. "$SRC/test/lib/roots.sh"

VERSION_SUITES="regress isolation tap pgtap demo examples clients packaging cassert calendar"
# suites of VERSION_SUITES that run with this machine's major only (the
# calendar sweep's outcome depends on the date, not on the major)
HOST_ONLY_SUITES="cassert calendar"
# suites of VERSION_SUITES that run with one major only, the last of
# PG_VERSIONS (18 by default, whose Debian root has Node.js and every
# Python package the clients need, whatever this machine has): the client
# libraries speak SQL, which the majors answer alike.  In the same way,
# the other majors run only the tests whose outcome depends on the server
# (IDEM_SERVER_SPECIFIC_ONLY=1, see test/run-suites.sh).
ONE_MAJOR_SUITES="clients"
CROSS_SUITES="upgrade"
PG_VERSIONS=${PG_VERSIONS:-15 17 18}
SUITES=${SUITES:-$VERSION_SUITES $CROSS_SUITES}
export SUITES

for s in $SUITES; do
	case " $VERSION_SUITES $CROSS_SUITES " in
	*" $s "*) ;;
	*)
		echo "run-all: unknown suite '$s' (known: $VERSION_SUITES $CROSS_SUITES)" >&2
		exit 2
		;;
	esac
done
for v in $PG_VERSIONS; do
	case $v in
	15 | 17 | 18) ;;
	*)
		echo "run-all: unsupported PostgreSQL major '$v' (tested: 15 17 18)" >&2
		exit 2
		;;
	esac
done

# suites of run-suites.sh among SUITES
INNER_SUITES=""
for s in $SUITES; do
	case " $VERSION_SUITES " in *" $s "*) INNER_SUITES="$INNER_SUITES $s" ;; esac
done
INNER_SUITES=${INNER_SUITES# }

say() { printf '\n######## %s\n' "$*"; }

# without LIST OMIT: the words of LIST that are not in OMIT
without() {
	local w out=()
	for w in $1; do
		[[ " $2 " == *" $w "* ]] || out+=("$w")
	done
	echo "${out[*]}"
}

# The PostgreSQL major this machine's Debian release packages.
host_major() {
	# shellcheck disable=SC1091
	case "$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")" in
	bookworm) echo 15 ;;
	trixie) echo 17 ;;
	forky | sid) echo 18 ;;
	*) echo none ;;
	esac
}

RESULTS=$(mktemp "${TMPDIR:-/tmp}/idempotency-results.XXXXXX") || exit 1
declare -A SUMMARY=()
PASSED=0
FAILED=0
SKIPPED=0

cleanup() {
	local rc=$? v line
	trap - EXIT INT TERM
	root_umount_all || rc=1
	say "summary"
	for v in $PG_VERSIONS cross; do
		[ -n "${SUMMARY[$v]:-}" ] || continue
		if [ "$v" = cross ]; then
			echo "across majors:"
		else
			echo "PostgreSQL $v:"
		fi
		while IFS= read -r line; do
			printf '  %s\n' "$line"
		done <<<"${SUMMARY[$v]}"
	done
	rm -f "$RESULTS"
	[ "$FAILED" -eq 0 ] || [ "$rc" -ne 0 ] || rc=1
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
	exit "$rc"
}
trap cleanup EXIT
trap 'echo "run-all: interrupted" >&2; exit 130' INT
trap 'echo "run-all: terminated" >&2; exit 143' TERM

# Counts the results of one major's run (lines "SUITE STATUS...", and
# "SUITE:TEST skipped (REASON)" for the skipped tests of a suite) into
# SUMMARY; suites of that run without a result line failed to run.
record() {
	local key="$1" file="$2" suites="$3" s line status
	for s in $suites; do
		line=$(grep -m1 "^$s " "$file" 2>/dev/null)
		status=${line#"$s "}
		[ -n "$line" ] || status="FAILED (not run)"
		SUMMARY[$key]+="$(printf '%-10s %s' "$s" "$status")"$'\n'
		case $status in
		passed*) PASSED=$((PASSED + 1)) ;;
		skipped*) SKIPPED=$((SKIPPED + 1)) ;;
		*) FAILED=$((FAILED + 1)) ;;
		esac
		while IFS= read -r line; do
			[ -n "$line" ] || continue
			SUMMARY[$key]+="$(printf '%-10s %s' "" "${line#"$s:"}")"$'\n'
			# a suite skipped as a whole counted once, above
			case $status in skipped*) ;; *) SKIPPED=$((SKIPPED + 1)) ;; esac
		done < <(grep "^$s:" "$file" 2>/dev/null)
	done
	SUMMARY[$key]=${SUMMARY[$key]%$'\n'}
}

# Runs the suites of major $1 in its root file system.
run_in_root() {
	local v="$1" dir inner_results rc from_env=() vendor_env
	dir=$(root_dir "$v")
	if ! root_ensure "$v"; then
		echo "run-all: no root file system for PostgreSQL $v" >&2
		return 1
	fi
	rm -rf --one-file-system "$dir/tmp/idempotency-src" "$dir/tmp/idempotency-vendor"
	mkdir -p "$dir/tmp/idempotency-src" || return 1
	tar -C "$SRC" --exclude=./.git --exclude='./tmp_check*' --exclude='*.o' \
		--exclude='*.so' --exclude='*.bc' -cf - . |
		tar -C "$dir/tmp/idempotency-src" -xf - || return 1
	# the local copy of released third-party sources the examples build
	# (Citus), if there is one; without it, the root has none either (and
	# downloads them, or skips the test that needs them)
	vendor_env=()
	if [ -d "${IDEM_VENDOR_DIR:-$SRC/../shared/vendor}" ]; then
		cp -r "${IDEM_VENDOR_DIR:-$SRC/../shared/vendor}" "$dir/tmp/idempotency-vendor" || return 1
		vendor_env=(IDEM_VENDOR_DIR=/tmp/idempotency-vendor)
	fi
	inner_results=/tmp/idempotency-results
	: >"$dir$inner_results"
	[ "$v" = 18 ] && from_env=(IDEM_UPGRADE_FROM=17)

	root_mount "$dir" || return 1
	# the bench scripts' smoke run (091_bench_smoke.pl) and the instruction
	# counts (090_instructions.pl) are the host's
	root_run "$dir" env SUITES="$SUITES_OF_ROOT" IDEM_RESULTS="$inner_results" \
		IDEM_BENCH_SMOKE=0 IDEM_INSTRUCTIONS=0 \
		IDEM_SERVER_SPECIFIC_ONLY="${SERVER_SPECIFIC_ONLY:-0}" \
		"${vendor_env[@]}" "${from_env[@]}" \
		PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" \
		bash /tmp/idempotency-src/test/run-suites.sh
	rc=$?
	root_umount "$dir" || rc=1
	cp "$dir$inner_results" "$RESULTS.$v" 2>/dev/null
	return "$rc"
}

# ---------------------------------------------------------------- majors
HOST_MAJOR=$(host_major)
# the major that runs ONE_MAJOR_SUITES and every test of examples and packaging
read -ra majors <<<"$PG_VERSIONS"
ONE_MAJOR=${majors[${#majors[@]} - 1]}
NEED_ROOTS=0
for v in $PG_VERSIONS; do
	[ "$v" = "$HOST_MAJOR" ] || NEED_ROOTS=1
done
if [ "$NEED_ROOTS" = 1 ]; then
	say "host tools for the root file systems"
	deps_ensure mmdebstrap || exit 1
fi

if [ -n "$INNER_SUITES" ]; then
	for v in $PG_VERSIONS; do
		: >"$RESULTS.$v"
		if [ "$v" = "$ONE_MAJOR" ]; then
			suites=$INNER_SUITES
			specific=0
		else
			suites=$(without "$INNER_SUITES" "$ONE_MAJOR_SUITES")
			specific=1
		fi
		if [ "$v" = "$HOST_MAJOR" ]; then
			say "PostgreSQL $v (this machine)"
			env SUITES="$suites" IDEM_RESULTS="$RESULTS.$v" \
				IDEM_SERVER_SPECIFIC_ONLY=$specific \
				PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" \
				bash "$SRC/test/run-suites.sh"
		else
			suites=$(without "$suites" "$HOST_ONLY_SUITES")
			if [ -n "$suites" ]; then
				say "PostgreSQL $v (Debian $(root_suite "$v") root in $(root_dir "$v"))"
				SUITES_OF_ROOT=$suites SERVER_SPECIFIC_ONLY=$specific run_in_root "$v"
			fi
		fi
		record "$v" "$RESULTS.$v" "$suites"
		rm -f "$RESULTS.$v"
	done
fi

# ---------------------------------------------------------------- across majors
case " $SUITES " in
*" upgrade "*)
	: >"$RESULTS.cross"
	if [[ " $PG_VERSIONS " == *" 15 "* && " $PG_VERSIONS " == *" 18 "* ]]; then
		say "suite upgrade: PostgreSQL 15 (this machine) dumped and restored into 18"
		start=$SECONDS
		if bash "$SRC/test/upgrade/dump_restore.sh" 15 18; then
			echo "upgrade passed ($((SECONDS - start))s)" >>"$RESULTS.cross"
		else
			echo "upgrade FAILED ($((SECONDS - start))s)" >>"$RESULTS.cross"
		fi
	else
		echo "upgrade skipped (needs PostgreSQL 15 and 18 in PG_VERSIONS)" >>"$RESULTS.cross"
	fi
	record cross "$RESULTS.cross" upgrade
	rm -f "$RESULTS.cross"
	;;
esac

# cleanup (the EXIT trap) prints the summary and sets the exit status
true

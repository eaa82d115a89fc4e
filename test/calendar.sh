#!/usr/bin/env bash
#
# test/calendar.sh -- the calendar sweep: the suites whose outcome could
# depend on the date or the time zone, run at faked dates chosen to break
# things, with the server's and the sessions' TimeZone set to the point's
# zone.
#
#   bash test/calendar.sh                       # every point (make calendar)
#   CALENDAR_MODE=ci bash test/calendar.sh      # CI's part: see below
#   CALENDAR_POINTS="2026-11-28T00:00:00Z@UTC" bash test/calendar.sh
#   CALENDAR_SEED=12345 CALENDAR_POINTS=random bash test/calendar.sh
#
# A point is an instant in UTC and a zone, INSTANT@ZONE.  Each point runs
# with the wall clock of every process of the run (pg_regress, the
# servers, psql, prove) moved by the same offset, by an LD_PRELOAD library
# of our own (test/lib/clockshift.c; libfaketime, which 027_clock_steps.pl
# uses, answers the real clock to a signal handler that runs while the
# process waits, so PostgreSQL's lock_timeout never fires when the clock
# is moved forwards); the monotonic clock is left alone, so waits and
# timeouts take their real time, and the clock keeps running from there:
# a point just before midnight crosses it while the suites run.  The zone is the
# server's TimeZone and log_timezone, and the sessions' (PGTZ, which
# pg_regress and pg_isolation_regress would otherwise set to PST8PDT: a
# launcher sets it again for psql and isolationtester).
#
# The points (POINTS below): the last day of a month, 28 and 29 February
# of a leap year, 31 December to 1 January (in UTC, and in Pacific/Chatham,
# +13:45, where the local new year comes at 10:15 UTC), both DST changes of
# Europe/Berlin and the end of DST in Australia/Adelaide (+10:30 to
# +09:30), the end of a month in Asia/Kathmandu (+05:45), and the two
# instants at which a newcomer's run of 0.4.0 failed (2026-11-26 20:00 and
# 2026-11-28; the security tests' list of the relations a hostile caller
# may make). "random" is a point drawn from CALENDAR_SEED (default: drawn
# and printed): an instant from 2026 to 2040 and a zone of ZONES.  Every
# point is printed with the command that replays it.
#
# Suites at each point (CALENDAR_SUITES, default "regress pgtap isolation
# tap", and "regress pgtap tap" with CALENDAR_MODE=ci): regress (sql/, make installcheck), pgtap (test/pgtap/, on a
# cluster of test/lib/cluster.sh), isolation (specs/, both passes) and tap
# (CALENDAR_TAP_TESTS, default the worker's and the maintenance and expiry
# tests: test/t/030_worker.pl, 032_worker_waits.pl and 035_digest_filters.pl;
# 027_clock_steps.pl fakes clocks of its own).
#
# CALENDAR_MODE=ci, what test/run-suites.sh's "calendar" suite runs (CI's
# budget cannot take the whole sweep: it takes about 40 minutes): two
# points, regress and pgtap at each, and the tap tests at the first:
#   - one fixed point, rotating: the one whose index is the number of days
#     since 1970-01-01 of the real date, modulo the number of points, so
#     that consecutive days' runs cover the list;
#   - one random point (CALENDAR_SEED, printed).
# The whole sweep is the release-time target "make calendar"
# (test/release.mk).
#
# Environment: PG_CONFIG, CALENDAR_MODE, CALENDAR_POINTS (space-separated
# points, or "random"), CALENDAR_SEED, CALENDAR_SUITES, CALENDAR_TAP_TESTS,
# CALENDAR_PORT (default 55300; the regress and isolation instances take
# CALENDAR_PORT .. +3, the pgTAP cluster +4).  Runs as an ordinary user (it
# starts servers) in a source tree whose extension is installed for
# PG_CONFIG.  Exit status 0 when every point passed.

set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"

export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
MODE=${CALENDAR_MODE:-full}
if [ "$MODE" = ci ]; then
	SUITES=${CALENDAR_SUITES:-regress pgtap tap}
else
	SUITES=${CALENDAR_SUITES:-regress pgtap isolation tap}
fi
TAP_TESTS=${CALENDAR_TAP_TESTS:-test/t/030_worker.pl test/t/032_worker_waits.pl test/t/035_digest_filters.pl}
PORT=${CALENDAR_PORT:-55300}

POINTS=(
	"2027-04-30T23:59:30Z@UTC"              # the last day of a month, at midnight
	"2028-02-28T23:59:30Z@UTC"              # 28 February of a leap year
	"2028-02-29T23:59:30Z@UTC"              # 29 February, into 1 March
	"2026-12-31T23:59:30Z@UTC"              # 31 December to 1 January
	"2026-12-31T10:14:30Z@Pacific/Chatham"  # the local new year at +13:45
	"2027-03-28T00:59:30Z@Europe/Berlin"    # DST begins: 02:00 is 03:00
	"2027-10-31T00:59:30Z@Europe/Berlin"    # DST ends: 03:00 is 02:00 again
	"2027-04-03T16:29:30Z@Australia/Adelaide" # DST ends at +10:30 (03:00 local)
	"2026-11-30T18:14:30Z@Asia/Kathmandu"   # the local end of a month at +05:45
	"2026-11-26T20:00:00Z@UTC"              # a newcomer's failing run of 0.4.0
	"2026-11-28T00:00:00Z@UTC"              # ... and the day after
)
ZONES=(UTC Europe/Berlin America/New_York Asia/Kathmandu Australia/Adelaide
	Pacific/Chatham Pacific/Kiritimati Pacific/Pago_Pago America/St_Johns)

say() { printf '\n==== calendar: %s\n' "$*"; }
die() {
	echo "calendar: $*" >&2
	exit 2
}

[ "$(id -u)" -ne 0 ] || die "run as an ordinary user (initdb refuses root)"

# a point drawn from a seed: an instant from 2026-01-01 to 2040-12-31, on a
# whole second, and a zone
random_point() {
	local seed=$1 lo hi
	lo=$(date -u -d 2026-01-01 +%s)
	hi=$(date -u -d 2041-01-01 +%s)
	RANDOM=$seed
	local r=$(((RANDOM << 30 | RANDOM << 15 | RANDOM) % (hi - lo)))
	printf '%s@%s\n' "$(date -u -d "@$((lo + r))" +%Y-%m-%dT%H:%M:%SZ)" \
		"${ZONES[$((RANDOM % ${#ZONES[@]}))]}"
}

SEED=${CALENDAR_SEED:-$(((RANDOM << 15 | RANDOM) % 1000000))}
if [ -n "${CALENDAR_POINTS:-}" ]; then
	read -r -a CHOSEN <<<"$CALENDAR_POINTS"
elif [ "$MODE" = ci ]; then
	day=$(($(date -u +%s) / 86400))
	CHOSEN=("${POINTS[$((day % ${#POINTS[@]}))]}" random)
else
	CHOSEN=("${POINTS[@]}" random)
fi
for i in "${!CHOSEN[@]}"; do
	[ "${CHOSEN[$i]}" != random ] || CHOSEN[$i]=$(random_point "$SEED")
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-calendar.XXXXXX") || exit 2
trap 'cluster_stop_all; cluster_stop_any_under "$WORK"; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
chmod 755 "$WORK"
# shellcheck source=test/lib/clockshift.sh
. "$SRC/test/lib/clockshift.sh"
CLOCKSHIFT=$(clockshift_build "$WORK/lib") || die "could not build test/lib/clockshift.c (needs a C compiler)"

# one suite at the current point; the environment has the fake clock
run_suite() {
	local suite=$1 tmp=$2 rc
	local opts="--temp-config=$tmp/zone.conf --launcher=$tmp/launcher"
	case $suite in
	regress)
		(cd "$SRC" && make -s installcheck PG_CONFIG="$PG_CONFIG" ISOLATION= TAP_TESTS= \
			TEST_PORT="$PORT" EXTRA_REGRESS_OPTS="$opts")
		rc=$?
		[ "$rc" -eq 0 ] || cat "$SRC/regression.diffs" 2>/dev/null | head -n 300
		;;
	isolation)
		(cd "$SRC" && make -s installcheck PG_CONFIG="$PG_CONFIG" REGRESS= TAP_TESTS= \
			TEST_PORT_ISO=$((PORT + 1)) TEST_PORT_ISO_PRELOAD=$((PORT + 2)) \
			EXTRA_REGRESS_OPTS="$opts")
		rc=$?
		if [ "$rc" -ne 0 ]; then
			cat "$SRC"/output_iso/regression.diffs "$SRC"/output_iso_preload/regression.diffs \
				2>/dev/null | head -n 300
		fi
		;;
	pgtap)
		local dir="$tmp/pgtap" conf=()
		while IFS= read -r line; do conf+=("$line"); done <"$SRC/test/idempotency.conf"
		while IFS= read -r line; do conf+=("$line"); done <"$tmp/zone.conf"
		conf+=("fsync = off")
		if cluster_start "$dir" $((PORT + 4)) "${conf[@]}" >/dev/null &&
			cluster_psql "$dir" -q -c 'CREATE DATABASE idempotency_pgtap' &&
			CLUSTER_DB=idempotency_pgtap cluster_psql "$dir" -q -c 'CREATE EXTENSION pgtap'; then
			(cd "$SRC" && PGHOST="$dir/sock" PGPORT=$((PORT + 4)) PGDATABASE=idempotency_pgtap \
				PATH="$("$PG_CONFIG" --bindir):$PATH" make -s pgtap PG_CONFIG="$PG_CONFIG")
			rc=$?
		else
			rc=1
		fi
		[ "$rc" -eq 0 ] || tail -n 100 "$dir/postgresql.log" 2>/dev/null
		cluster_stop "$dir" || [ "$rc" -ne 0 ] || rc=1
		;;
	tap)
		(cd "$SRC" && TEMP_CONFIG="$tmp/zone.conf" make -s installcheck PG_CONFIG="$PG_CONFIG" \
			REGRESS= ISOLATION= PROVE_TESTS="$TAP_TESTS")
		rc=$?
		if [ "$rc" -ne 0 ]; then
			for f in "$SRC"/tmp_check/log/*; do
				[ -f "$f" ] && { echo "---- $f"; tail -n 100 "$f"; }
			done
		fi
		;;
	*) die "unknown suite $suite" ;;
	esac
	return "$rc"
}

case " $SUITES " in *" tap "*) [ "$MODE" != ci ] || TAP_AT_FIRST_ONLY=1 ;; esac
failed=()
n=0
for point in "${CHOSEN[@]}"; do
	n=$((n + 1))
	instant=${point%@*}
	zone=${point#*@}
	[ "$instant" != "$point" ] && [ -n "$zone" ] || die "a point is INSTANT@ZONE: $point"
	target=$(date -u -d "${instant/T/ }" +%s 2>/dev/null) || die "not an instant: $instant"
	[ -f "/usr/share/zoneinfo/$zone" ] || die "unknown zone: $zone"
	tmp="$WORK/point$n"
	mkdir -p "$tmp"
	printf "timezone = '%s'\nlog_timezone = '%s'\n" "$zone" "$zone" >"$tmp/zone.conf"
	printf '#!/bin/sh\nPGTZ=%s exec "$@"\n' "$zone" >"$tmp/launcher"
	chmod +x "$tmp/launcher"
	suites=$SUITES
	if [ "${TAP_AT_FIRST_ONLY:-0}" = 1 ] && [ "$n" -gt 1 ]; then
		suites=$(printf '%s\n' $SUITES | grep -vx tap | tr '\n' ' ')
	fi
	say "point $n of ${#CHOSEN[@]}: $instant in $zone (local $(TZ=$zone date -d "@$target" '+%F %T %Z')); suites: $suites"
	echo "replay: CALENDAR_POINTS='$point' CALENDAR_SUITES='$suites' bash test/calendar.sh"
	for suite in $suites; do
		start=$SECONDS
		# the offset from the real clock, taken just before the suite
		# starts, so that every suite starts at the point's instant
		offset=$((target - $(date -u +%s)))
		(
			export LD_PRELOAD="$CLOCKSHIFT${LD_PRELOAD:+ $LD_PRELOAD}"
			export IDEM_CLOCK_OFFSET=$offset
			export PGTZ=$zone
			echo "---- $suite at $(date -u '+%F %T') UTC (faked)"
			run_suite "$suite" "$tmp"
		)
		rc=$?
		if [ "$rc" -eq 0 ]; then
			echo "---- $suite at $point: passed ($((SECONDS - start))s)"
		else
			echo "---- $suite at $point: FAILED ($((SECONDS - start))s)"
			failed+=("$suite@$point")
		fi
	done
done

say "summary"
if [ "${#failed[@]}" -eq 0 ]; then
	echo "every suite passed at ${#CHOSEN[@]} points (random seed $SEED)"
	exit 0
fi
echo "FAILED at ${#failed[@]} (suite at point):"
for f in "${failed[@]}"; do
	echo "  $f   replay: CALENDAR_POINTS='${f#*@}' CALENDAR_SUITES='${f%%@*}' bash test/calendar.sh"
done
exit 1

#!/usr/bin/env bash
# bench/wait.sh -- how long after the holder's COMMIT does a waiter have
# its answer? (issue 23: idem_claim(..., wait => true) with
# idempotency.wait_timeout, 0.4.0)
#
#   bash bench/wait.sh                  # 200 rounds per server, about 2 minutes
#   WAIT_ROUNDS=50 bash bench/wait.sh
#   BENCH_SMOKE=1 bash bench/wait.sh    # seconds: does the script still work?
#
# Two throwaway clusters side by side, the same but for one line: "preload"
# has shared_preload_libraries = 'idempotency' (the waiter sleeps on a
# shared-memory wake-up slot and the holder's commit wakes it, src/wait.c),
# "nopreload" has not (the waiter polls: after 1 ms, then twice as long each
# time, at most every 50 ms).  Both: synchronous_commit = off (the figure is
# the wake-up, not the WAL flush of the holder's COMMIT),
# track_commit_timestamp = on (for the server-side figure).
#
# In each round, on each server (interleaved, the first server alternating),
# one key (bench/wait_latency.py, Python with psycopg 3: one long-lived
# connection per role, the holder and the waiter in separate processes):
# the holder commits a two-phase claim; the waiter calls idem_claim(key,
# wait => true) with idempotency.wait_timeout = 30 s and is seen asleep in
# pg_stat_activity; 100-200 ms later (uniformly random, so that the
# polling waiter is at its 50 ms interval and the commit falls anywhere in
# it) the holder completes the key with its token and COMMITs.  Measured:
#
#   COMMIT to answer   from just before the holder's client sends COMMIT to
#                      the waiter's client holding the answer (one
#                      monotonic clock, two processes): what an application
#                      sees, including the holder's COMMIT itself
#   server side        from the holder's commit timestamp to the waiter's
#                      clock_timestamp() after idem_claim returned: the
#                      wake-up alone, without either client
#
# Goals: with preload, median COMMIT to answer <= 5 ms; every waiter answers
# completed.  The rest (p99, no preload, server side) is shown for
# information.  p50 and p99 by nearest rank (bench/lib.sh).
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   WAIT_ROUNDS     rounds (one wait per server each)          [200/5]
#   WAIT_DELAY_MS   "MIN MAX": ms from the waiter seen asleep to the
#                   holder's completion                        ["100 200"]
#   WAIT_PORT       port of the preload cluster; nopreload's is the next
#                   one (unix sockets only)                    [54491]
#   BENCH_PYTHON    a Python 3 with psycopg 3                  [/usr/bin/python3]
#   BENCH_BUILD     auto|1|0: make install first (auto: when the library
#                   directory is writable)                     [auto]
#   PGBIN           PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_RESULTS   directory of the results file  [bench/results, bench/results/smoke]
#
# Output: a summary, also in wait-latest.txt in BENCH_RESULTS with one raw
# line per wait.  Exit status (bench/lib.sh, bench_status): 0 every goal
# PASS, 3 some goal FAIL or SKIP, 1 the run failed.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck disable=SC2034 # BENCH_NAME and BUILD are read by bench/lib.sh
BENCH_NAME=wait.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin)
export PG_CONFIG=$PGBIN/pg_config
ROUNDS=${WAIT_ROUNDS:-$(bench_size 200 5)}
read -r DELAY_MIN DELAY_MAX <<<"${WAIT_DELAY_MS:-100 200}"
PORT=${WAIT_PORT:-54491}
PYTHON=${BENCH_PYTHON:-/usr/bin/python3}
# shellcheck disable=SC2034
BUILD=${BENCH_BUILD:-auto}
RESDIR=$(bench_resdir)
mkdir -p "$RESDIR"
OUT=$RESDIR/wait-latest.txt
: >"$OUT"
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

case $ROUNDS in ''|*[!0-9]*|0) die "WAIT_ROUNDS must be a positive integer" ;; esac
"$PYTHON" -c 'import psycopg' 2>/dev/null ||
    die "$PYTHON cannot import psycopg (Debian: apt-get install python3-psycopg)"

T0=$(date +%s)
bench_build "$REPO"
CONF=("synchronous_commit = off" "track_commit_timestamp = on" "fsync = off"
      "log_min_messages = warning")
bench_cluster "$PORT" "${CONF[@]}" "shared_preload_libraries = 'idempotency'"
C_PRE=$C
C_NOPRE=$WORK/nopreload
cluster_start "$C_NOPRE" $((PORT + 1)) "${CONF[@]}" || die "the nopreload cluster did not start"
PGVER=$(qval postgres "SHOW server_version")

for c in "$C_PRE" "$C_NOPRE"; do
    C=$c q postgres -o /dev/null -c "CREATE EXTENSION idempotency" -c "SELECT idem_maintain()" ||
        die "CREATE EXTENSION idempotency failed in $c"
done
C=$C_PRE
EXTVER=$(qval postgres "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
PRELOADED=$(qval postgres "SHOW shared_preload_libraries")

say "== bench/wait.sh  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  PostgreSQL $PGVER  extension $EXTVER"
say "rounds  : $ROUNDS per server, servers interleaved; holder completes ${DELAY_MIN}-${DELAY_MAX} ms after the waiter is seen asleep"
say "servers : synchronous_commit=off track_commit_timestamp=on; preload: shared_preload_libraries='$PRELOADED', nopreload: none"
say "machine : $(nproc) cores, $(uname -r)"

note "waiting $ROUNDS times on each server ..."
LOG=$WORK/wait.log
dsn() { printf 'host=%s port=%s dbname=postgres' "$1/sock" "$(cat "$1/port")"; }
cluster_as_user "$PYTHON" "$HERE/wait_latency.py" "$ROUNDS" "$DELAY_MIN" "$DELAY_MAX" \
    "preload=$(dsn "$C_PRE")" "nopreload=$(dsn "$C_NOPRE")" >"$LOG" ||
    { cat "$LOG" >&2; die "bench/wait_latency.py failed"; }
while read -r line; do raw "raw $line"; done <"$LOG"

field() {  # mode name -> the values of field name in mode's rounds
    awk -v m="mode=$1" -v f="$2" '$2 == m { for (i = 3; i <= NF; i++) { split($i, kv, "=");
        if (kv[1] == f) print kv[2] } }' "$LOG"
}
stat() {  # mode field p -> p-quantile, 3 decimals
    local v
    v=$(field "$1" "$2" | pct "$3")
    awk -v v="$v" 'BEGIN { if (v == "NA") print v; else printf "%.3f\n", v }'
}

say ""
hdr=$(printf '%-10s %6s %11s   %-29s %-29s %s' "server" "waits" "completed" \
      "COMMIT to answer p50 / p99" "server side p50 / p99" "holder's COMMIT p50")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
for m in preload nopreload; do
    n=$(field "$m" status | wc -l)
    ok=$(field "$m" status | grep -c '^completed$' || true)
    say "$(printf '%-10s %6s %11s   %-29s %-29s %s' "$m" "$n" "$ok" \
        "$(stat "$m" commit_to_answer_ms 0.5) / $(stat "$m" commit_to_answer_ms 0.99) ms" \
        "$(stat "$m" server_ms 0.5) / $(stat "$m" server_ms 0.99) ms" \
        "$(stat "$m" commit_ms 0.5) ms")"
done
say ""

# a wait that was not made, or did not answer completed, counts against
# the run: a figure of waits that did not happen is no figure
missed=0
for m in preload nopreload; do
    ok=$(field "$m" status | grep -c '^completed$' || true)
    missed=$((missed + ROUNDS - ok))
done
check "preload: COMMIT to answer, median (ms)" "$(stat preload commit_to_answer_ms 0.5)" "<=" 5
info  "preload: COMMIT to answer, p99 (ms)" "$(stat preload commit_to_answer_ms 0.99)"
info  "preload: server side (commit timestamp to answer), median (ms)" "$(stat preload server_ms 0.5)"
info  "nopreload (polling): COMMIT to answer, median (ms)" "$(stat nopreload commit_to_answer_ms 0.5)"
info  "nopreload (polling): COMMIT to answer, p99 (ms)" "$(stat nopreload commit_to_answer_ms 0.99)"
info  "nopreload / preload, median COMMIT to answer" \
    "$(div "$(stat nopreload commit_to_answer_ms 0.5)" "$(stat preload commit_to_answer_ms 0.5)")"
check "waits that did not answer completed" "$missed" "=" 0

say ""
say "command: WAIT_ROUNDS=$ROUNDS WAIT_DELAY_MS='$DELAY_MIN $DELAY_MAX' bash bench/wait.sh"
say "elapsed: $(( $(date +%s) - T0 )) s"
exit "$(bench_status)"

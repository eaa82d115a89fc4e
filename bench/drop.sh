#!/usr/bin/env bash
# bench/drop.sh -- expiry by dropping a partition vs DELETE, under load (issue 4).
#
#   bash bench/drop.sh            # as root or as any user; about 4-5 minutes
#   BENCH_SMOKE=1 bash bench/drop.sh   # seconds: does the script still work?
#
# Fills partitions of idempotency.messages with 1,000,000 ids each, lets them
# expire one after the other, and drops each with idem_maintain() while
# pgbench runs a steady claim+complete+consume load (4 clients).  Baseline: a
# plain table with the same rows (same columns, btree on the digest) and
# DELETE FROM t WHERE expires_at < now(), then the VACUUM it needs.
#
# p99 latency of the load is measured in the 10 s before each drop and in
# the window from the drop's start to 1 s after its end (likewise for the
# DELETE and the VACUUM); the drop is repeated (DROP_REPEAT) because a 1 s
# window on a shared 2-core machine is noisy, and the bar takes the median.
# Time and WAL of a drop and of the DELETE are measured with no load running
# (a second database holds its own copy of everything), right after a
# CHECKPOINT, so both pay the full-page images a real expiry pays.
# Bars (issue 4): p99 during the drop <= 2x steady, zero errors, WAL of the
# expiry <= 5% of the DELETE's.
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SMOKE        1 = the smallest run that goes through every step, for
#                      the test suite; exit status 0 whatever the figures [0]
#   DROP_ROWS          ids in each expiring partition                 [1000000/10000]
#   DROP_REPEAT        partitions dropped under load, one at a time   [3/1]
#   DROP_INTERVAL      seconds: partition_interval = message_ttl = key_ttl [30/3]
#   DROP_WARMUP        seconds of load before the first steady window [5/1]
#   DROP_STEADY        seconds of each steady window                  [10/2]
#   DROP_FILL_SECONDS  expected seconds to fill one partition (default:
#                      from a timed 10,000-id batch); sets how far ahead
#                      the first partition expires                   [auto]
#   DROP_PORT          server port (unix socket only)                 [54461]
#   DROP_KEEP          1 = keep the temp dir (cluster stopped)        [0]
#   PGBIN              PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_RESULTS      directory of the results files  [bench/results, bench/results/smoke]
#
# Uses the installed extension (it builds nothing).  Output: a summary on
# stdout, also written to drop-<timestamp>.txt in BENCH_RESULTS with the raw
# figures and a per-second timeline of the load.  Exit status (bench/lib.sh,
# bench_status): 0 every bar PASS, 3 some bar FAIL or SKIP, 1 the run itself
# failed.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH_NAME=drop.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin) || exit 1
export PG_CONFIG=$PGBIN/pg_config
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

ROWS=${DROP_ROWS:-$(bench_size 1000000 10000)}
REPEAT=${DROP_REPEAT:-$(bench_size 3 1)}
FILL_EST=${DROP_FILL_SECONDS:-auto}
PORT=${DROP_PORT:-54461}
KEEP=${DROP_KEEP:-0}
# partition_interval = message_ttl = key_ttl: one lane
INTERVAL=${DROP_INTERVAL:-$(bench_size 30 3)}
PREMAKE=20          # partitions made ahead at set-up: none is made during the run
# ttl of the load's keys and messages: never in a partition we drop, and
# within the partitions made ahead
LOAD_TTL=$(bench_size '5 min' '20 s')
WARMUP=${DROP_WARMUP:-$(bench_size 5 1)}    # seconds of load before the first steady window
STEADY=${DROP_STEADY:-$(bench_size 10 2)}   # seconds of each steady window
# seconds set aside for the checkpoint and for the quiet phase (and as
# slack before the first partition expires)
SLACK=$(bench_size 20 4)
CLIENTS=4
THREADS=2
LOAD_DB=drop_load   # load; partitions dropped and plain table DELETEd under load
QUIET_DB=drop_quiet # one partition dropped and the plain table DELETEd with no load

for v in REPEAT INTERVAL WARMUP STEADY; do
    case ${!v} in ''|*[!0-9]*|0) echo "drop.sh: DROP_$v must be a positive integer" >&2; exit 1 ;; esac
done

RESDIR=$(bench_resdir)
mkdir -p "$RESDIR" || exit 1
TS=$(date +%Y%m%d-%H%M%S)
OUT=$RESDIR/drop-$TS.txt
: >"$OUT" || exit 1


WORK=$(mktemp -d /tmp/idem-drop.XXXXXX) || exit 1
chmod 755 "$WORK"
[ "$(id -u)" = 0 ] && chown "${CLUSTER_USER:-postgres}:" "$WORK"
C=$WORK/cluster
PGB_PID=        # pid of pgbench itself
PGB_BG=         # the background job running it

# shellcheck disable=SC2317 # run by the EXIT trap (shellcheck misses it after a final exit)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$PGB_PID" ]; then kill -TERM "$PGB_PID" 2>/dev/null; fi
    if [ -n "$PGB_BG" ]; then wait "$PGB_BG" 2>/dev/null; fi
    cluster_stop_all
    if [ "$KEEP" = 1 ]; then note "temp dir kept: $WORK"; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cp -r "$HERE/sql" "$WORK/sql"
[ "$(id -u)" = 0 ] && chown -R "${CLUSTER_USER:-postgres}:" "$WORK/sql"


T0=$(date +%s)

# ---------------------------------------------------------------- cluster
note "starting a cluster in $WORK ..."
cluster_start "$C" "$PORT" \
    "synchronous_commit = off" \
    "shared_buffers = 1GB" \
    "max_wal_size = 16GB" \
    "checkpoint_timeout = 30min" \
    "autovacuum = off" \
    "log_min_messages = warning" \
    "idempotency.partition_interval = '${INTERVAL}s'" \
    "idempotency.message_ttl = '${INTERVAL}s'" \
    "idempotency.key_ttl = '${INTERVAL}s'" \
    "idempotency.premake = $PREMAKE" || die "cluster did not start"

PGVER=$(qval postgres "SHOW server_version") || die "cannot connect"
for db in "$LOAD_DB" "$QUIET_DB" drop_calib; do
    qval postgres "CREATE DATABASE $db" >/dev/null || die "CREATE DATABASE $db failed"
    q "$db" -At -c "CREATE EXTENSION idempotency" >/dev/null || die "CREATE EXTENSION failed in $db"
done
EXTVER=$(qval "$LOAD_DB" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
GITREV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')

# Both ledgers exist, and every partition the run needs is made now.  The
# probe's rows get a long ttl: they are in no partition the run drops.
for db in "$LOAD_DB" "$QUIET_DB"; do
    q "$db" -At -c "BEGIN" -c "SELECT status FROM idem_claim('setup', '{}', ttl => '10 min')" \
        -c "SELECT idem_complete('setup', 200)" -c "SELECT idem_consume_message('setup', 'setup', '10 min')" \
        -c "COMMIT" -c "SELECT * FROM idem_maintain()" >/dev/null || die "extension set-up failed in $db"
done

# ---------------------------------------------------------------- fill
# Partition 0 in QUIET_DB with upper bound U0, then partitions 1..REPEAT in
# LOAD_DB with upper bounds U1 + (k - 1) * INTERVAL.  Partition 0 only has to
# expire some time before the quiet phase; U0 is set generously from one
# timed batch of 10,000 ids.  U1 is set from the measured time of filling
# partition 0, so that all the fills, the quiet phase and the first steady
# window fit before it.

# fill DB K U: partition number K, rows expiring 1 s before upper bound U
# (epoch); sets PART_DB[K], PART[K], UPPER[K], PART_BYTES[K]
declare -A PART_DB PART UPPER PART_BYTES
fill() {
    local db=$1 k=$2 u=$3 expires upper n
    expires=$(qval postgres "SELECT to_timestamp($u - 1)")
    upper=$(qval postgres "SELECT to_timestamp($u)")
    q "$db" -c "SET bench.rows = $ROWS" -c "SET bench.expires_at = '$expires'" -c "SET bench.upper = '$upper'" \
        -f "$WORK/sql/drop_fill.sql" >"$WORK/fill-$k.log" 2>&1 || { cat "$WORK/fill-$k.log" >&2; die "fill $k in $db failed"; }
    PART_DB[$k]=$db
    UPPER[$k]=$u
    PART[$k]=$(qval "$db" "SELECT partition FROM idempotency.partitions WHERE table_name = 'messages' AND upper_bound = '$upper'")
    [ -n "${PART[$k]}" ] || die "no partition with upper bound $upper in $db"
    # every filled row is in that one partition
    n=$(qval "$db" "SELECT count(*) FROM ${PART[$k]}")
    [ "$n" = "$ROWS" ] || die "$db: ${PART[$k]} holds $n rows, expected $ROWS"
    PART_BYTES[$k]=$(qval "$db" "SELECT pg_total_relation_size('${PART[$k]}')")
    raw "fill $k: $db ${PART[$k]} rows=$n bytes=${PART_BYTES[$k]} expires_at=$expires done at $(date -u +%T.%N)"
}
# boundary SECONDS: the first partition boundary at least SECONDS from now
boundary() { awk -v n="$(now)" -v b="$1" -v i="$INTERVAL" 'BEGIN{ printf "%d", (int((n + b) / i) + 1) * i }'; }
# the baseline in DB: a plain table with a copy of the rows of partition K
plain() {
    q "$1" -v part="${PART[$2]}" -f "$WORK/sql/drop_plain.sql" >/dev/null || die "plain table set-up failed in $1"
    q "$1" -c "VACUUM ANALYZE" || die "VACUUM failed in $1"
    raw "$1: plain_expiry bytes=$(qval "$1" "SELECT pg_total_relation_size('plain_expiry')") rows=$(qval "$1" "SELECT count(*) FROM plain_expiry")"
}

# premaintain DB U: in the background, at U - INTERVAL + 2 (or now if that
# has passed and U is still more than 2 s away), run idem_maintain() in DB,
# which drops the empty partitions made ahead at set-up that expire before
# U.  Then the one partition ending at U (with its empty twin in the key
# ledger) is all that the measured drop at U finds expired.
PREMAINT=()
premaintain() {
    (
        sleep_until $(($2 - INTERVAL + 2))
        if [ "$(date +%s)" -lt $(($2 - 2)) ]; then
            raw "$1: idem_maintain() before $(date -u -d "@$2" +%T): $(qval "$1" "SELECT partitions_created || ' made, ' || partitions_dropped || ' dropped' FROM idem_maintain()")"
        fi
    ) &
    PREMAINT+=($!)
}

NFILL=$((REPEAT + 1))
if [ "$FILL_EST" = auto ]; then
    # into partitions made beforehand, as the fills' are: a transaction that
    # makes the ledger itself keeps a lock per id it writes, and may hold
    # only max_locks_per_transaction of them
    qval drop_calib "SELECT partitions_created FROM idem_maintain()" >/dev/null \
        || die "idem_maintain() failed in drop_calib"
    b0=$(now)
    qval drop_calib "SELECT count(*) FROM idem_consume_messages('calib', ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, 10000)))" >/dev/null \
        || die "calibration batch failed"
    b1=$(now)
    FILL_EST=$(awk -v a="$b0" -v b="$b1" -v n="$ROWS" 'BEGIN{ printf "%d", (b - a) * n / 10000 + 1 }')
    raw "calibration: one batch of 10000 ids in $(awk -v a="$b0" -v b="$b1" 'BEGIN{printf "%.3f", b - a}') s"
fi
qval postgres "DROP DATABASE drop_calib" >/dev/null
# a fill takes up to about 3 times what one batch in an empty table suggests
U0=$(boundary $((FILL_EST * 5 + SLACK)))
note "filling $NFILL partitions with $ROWS ids each (estimate ${FILL_EST}s each) ..."
premaintain "$QUIET_DB" "$U0"
f0=$(now)
fill "$QUIET_DB" 0 "$U0"
fa=$(now)
plain "$QUIET_DB" 0
fb=$(now)
# the REPEAT fills (x1.3), the same set-up in LOAD_DB (x2: three times the
# rows to vacuum), SLACK for the checkpoint and the quiet phase, then the
# warm-up and the first steady window
U1=$(boundary "$(awk -v f="$(awk -v a="$f0" -v b="$fa" 'BEGIN{print b - a}')" -v w="$(awk -v a="$fa" -v b="$fb" 'BEGIN{print b - a}')" \
    -v r="$REPEAT" -v s=$((WARMUP + STEADY + SLACK)) 'BEGIN{ printf "%d", r * f * 1.3 + 2 * w + s }')")
raw "U0 $(date -u -d "@$U0" +%T), U1 $(date -u -d "@$U1" +%T)"
premaintain "$LOAD_DB" "$U1"
for ((k = 1; k <= REPEAT; k++)); do fill "$LOAD_DB" "$k" $((U1 + (k - 1) * INTERVAL)); done
plain "$LOAD_DB" 1
f1=$(now)
FILL_SECS=$(awk -v a="$f0" -v b="$f1" 'BEGIN{printf "%.1f", b - a}')
raw "fill and plain tables: ${FILL_SECS}s for $NFILL x $ROWS ids"
qval postgres "CHECKPOINT" >/dev/null

# wait_expired K: poll until partition K is expired
wait_expired() {
    local k=$1 st deadline=$((UPPER[$1] + 60))
    while :; do
        st=$(qval "${PART_DB[$k]}" "SELECT CASE WHEN to_regclass('${PART[$k]}') IS NULL THEN 'gone'
                                     ELSE (SELECT expired::text FROM idempotency.partitions
                                            WHERE partition = to_regclass('${PART[$k]}')) END")
        [ "$st" = true ] && return 0
        [ "$st" = gone ] && die "${PART[$k]} in ${PART_DB[$k]} was dropped before its measurement"
        [ "$(date +%s)" -lt "$deadline" ] || die "${PART[$k]} in ${PART_DB[$k]} not expired by $(date -u -d "@$deadline")"
        sleep 0.1
    done
}

# measure DB SQL: run SQL in one session; prints its own output, then a last
# line "start|end|WAL bytes" (epoch seconds, WAL from the insert position)
measure() {
    q "$1" -At -f - <<EOF
SELECT pg_current_wal_insert_lsn() AS l0, extract(epoch FROM clock_timestamp()) AS t0 \gset
$2
SELECT :'t0', extract(epoch FROM clock_timestamp()), pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'l0');
EOF
}
# the drop: idem_maintain() with premake 0 in the calling session, so that it
# only drops (the partitions it would make were made at set-up)
DROP_SQL="SET idempotency.premake = 0;
SELECT partitions_created || ' ' || partitions_dropped FROM idem_maintain();"
DELETE_SQL="DELETE FROM plain_expiry WHERE expires_at < now();"
VACUUM_SQL="VACUUM plain_expiry;"

# ---------------------------------------------------------------- quiet phase
note "quiet phase: drop, DELETE and VACUUM with no load ..."
wait "${PREMAINT[0]}"
wait_expired 0
WAIT_SECS=$(awk -v a="$f1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
res=$(measure "$QUIET_DB" "$DROP_SQL") || die "idem_maintain() failed in $QUIET_DB"
raw "quiet drop: $(echo "$res" | tr '\n' ' ')"
read -r QD_CREATED QD_DROPPED <<<"$(echo "$res" | head -n1)"
IFS='|' read -r QD0 QD1 QD_WAL <<<"$(echo "$res" | tail -n1)"
QD_GONE=$(qval "$QUIET_DB" "SELECT to_regclass('${PART[0]}') IS NULL")
res=$(measure "$QUIET_DB" "$DELETE_SQL") || die "DELETE failed in $QUIET_DB"
raw "quiet delete: $res"
IFS='|' read -r QX0 QX1 QX_WAL <<<"$res"
res=$(measure "$QUIET_DB" "$VACUUM_SQL") || die "VACUUM failed in $QUIET_DB"
raw "quiet vacuum: $res"
IFS='|' read -r QV0 QV1 QV_WAL <<<"$res"
QX_LEFT=$(qval "$QUIET_DB" "SELECT count(*) FROM plain_expiry")

# ---------------------------------------------------------------- load phase
qval postgres "CHECKPOINT" >/dev/null
ROLLBACK0=$(qval postgres "SELECT xact_rollback FROM pg_stat_database WHERE datname = '$LOAD_DB'")
note "load phase: pgbench -c $CLIENTS -j $THREADS; $REPEAT drops, then DELETE and VACUUM under load ..."
# shellcheck disable=SC2016 # $$ and $1 are the inner shell's
(cd "$WORK" && cluster_run "$C" sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$WORK/pgbench.pid" \
    pgbench -n -M prepared -c "$CLIENTS" -j "$THREADS" -T 3600 -l --log-prefix="$WORK/pgblog" \
    -D ttl="$LOAD_TTL" -f "$WORK/sql/drop_load.sql" "$LOAD_DB") >"$WORK/pgbench.out" 2>"$WORK/pgbench.err" &
PGB_BG=$!
until [ -s "$WORK/pgbench.pid" ]; do
    kill -0 "$PGB_BG" 2>/dev/null || die "pgbench did not start: $(cat "$WORK/pgbench.err")"
    sleep 0.05
done
PGB_PID=$(cat "$WORK/pgbench.pid")
# the load is on once every client has connected
deadline=$(( $(date +%s) + 300 ))
until [ "$(qval postgres "SELECT count(*) FROM pg_stat_activity WHERE datname = '$LOAD_DB' AND application_name = 'pgbench'")" -ge "$CLIENTS" ]; do
    kill -0 "$PGB_BG" 2>/dev/null || die "pgbench exited: $(cat "$WORK/pgbench.err")"
    [ "$(date +%s)" -lt "$deadline" ] || die "pgbench's $CLIENTS clients did not all connect within 300 s"
    sleep 0.05
done
L0=$(now)
wait "${PREMAINT[1]}"
declare -A LD0 LD1 LD_CREATED LD_DROPPED LD_GONE
next=$(plus "$L0" $((WARMUP + STEADY)))   # earliest start of the next drop
DROPS=()        # the partitions whose drop was measured
for ((k = 1; k <= REPEAT; k++)); do
    if [ "$(qval "$LOAD_DB" "SELECT to_regclass('${PART[$k]}') IS NULL")" = t ]; then
        # the schedule slipped: it had expired by the previous drop, and went with it
        raw "partition $k was dropped together with an earlier one: not measured on its own"
        note "partition $k expired before the previous drop and went with it (set DROP_FILL_SECONDS higher)"
        continue
    fi
    wait_expired "$k"
    sleep_until "$next"
    DROPS+=("$k")
    res=$(measure "$LOAD_DB" "$DROP_SQL") || die "idem_maintain() failed under load"
    raw "load drop $k: $(echo "$res" | tr '\n' ' ')"
    read -r LD_CREATED[$k] LD_DROPPED[$k] <<<"$(echo "$res" | head -n1)"
    IFS='|' read -r LD0[$k] LD1[$k] _ <<<"$(echo "$res" | tail -n1)"
    LD_GONE[$k]=$(qval "$LOAD_DB" "SELECT to_regclass('${PART[$k]}') IS NULL")
    next=$(plus "${LD1[$k]}" $((1 + STEADY)))
done
sleep_until "$next"
res=$(measure "$LOAD_DB" "$DELETE_SQL") || die "DELETE failed under load"
raw "load delete: $res"
IFS='|' read -r LX0 LX1 _ <<<"$res"
sleep_until "$(plus "$LX1" 1)"
res=$(measure "$LOAD_DB" "$VACUUM_SQL") || die "VACUUM failed under load"
raw "load vacuum: $res"
IFS='|' read -r LV0 LV1 _ <<<"$res"
sleep_until "$(plus "$LV1" 3)"
kill -0 "$PGB_BG" 2>/dev/null || note "pgbench ended early"
# before pgbench goes: its clients disconnecting mid-transaction roll back
ROLLBACK1=$(qval postgres "SELECT xact_rollback FROM pg_stat_database WHERE datname = '$LOAD_DB'")
# SIGTERM, not SIGINT: a script started in the background by a shell
# without job control has SIGINT ignored, and so has every process it
# starts; pgbench would run its hour out
kill -TERM "$PGB_PID" 2>/dev/null
wait "$PGB_BG" 2>/dev/null
PGB_BG=
PGB_PID=
T1=$(date +%s)

# ---------------------------------------------------------------- analysis
# per-transaction log lines: client_id xact_no latency_us script_no epoch us
# (latency "failed" for a failed transaction) -> "epoch latency_ms client"
LOG=$WORK/lat.txt
cat "$WORK"/pgblog.* 2>/dev/null |
    awk '{ printf "%.6f %s %s\n", $5 + $6 / 1e6, ($3 == "failed" ? "failed" : $3 / 1000), $1 }' |
    sort -g >"$LOG"
[ -s "$LOG" ] || die "pgbench wrote no transaction log; stderr: $(head -n 5 "$WORK/pgbench.err")"
FAILED_LOG=$(awk '$2 == "failed"' "$LOG" | wc -l)
ABORTED=$(grep -cE 'aborted|ERROR|FATAL' "$WORK/pgbench.err")
# every client must still be committing at the end (an error ends a client)
LIVE_CLIENTS=$(awk -v t="$LV1" '$1 >= t { c[$3] = 1 } END { n = 0; for (k in c) n++; print n }' "$LOG")
RB=$((ROLLBACK1 - ROLLBACK0))
ERRORS=$((FAILED_LOG + ABORTED + RB + (CLIENTS - LIVE_CLIENTS)))

# win A B: "n tps p50 p99 max" of the transactions completed in [A, B)
# (quantiles by nearest rank: pct in bench/lib.sh)
win() {
    local lat n
    lat=$(awk -v a="$1" -v b="$2" '$1 >= a && $1 < b && $2 != "failed" { print $2 }' "$LOG")
    n=$(printf '%s' "$lat" | grep -c .)
    if [ "$n" = 0 ]; then
        echo "0 0 NA NA NA"
        return
    fi
    awk -v n="$n" -v a="$1" -v b="$2" -v p50="$(pct 0.5 <<<"$lat")" \
        -v p99="$(pct 0.99 <<<"$lat")" -v mx="$(pct 1 <<<"$lat")" \
        'BEGIN{ printf "%d %.0f %.2f %.2f %.2f\n", n, n / (b - a), p50, p99, mx }'
}
# timeline A B STEP ORIGIN: one line per STEP seconds from A to B,
# "start-ORIGIN txns p99 max" (s, ms; p99 by nearest rank, as pct)
timeline() {
    awk -v a="$1" -v b="$2" -v st="$3" '$1 >= a && $1 < b && $2 != "failed" { print int(($1 - a) / st), $2 }' "$LOG" |
        sort -k1,1n -k2,2g |
        awk -v st="$3" -v off="$(awk -v a="$1" -v o="$4" 'BEGIN{print a - o}')" '
            function flush(  i) { if (n) { i = int(0.99 * n + 0.999999); printf "%+8.2f %6d %8.2f %8.2f\n", off + k * st, n, x[i], x[n] } }
            $1 != k { flush(); k = $1; n = 0 }
            { x[++n] = $2 }
            END { flush() }'
}
f() { echo "$1" | awk -v k="$2" '{print $k}'; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", (b - a) * 1000}'; }
mb() { awk -v b="$1" 'BEGIN{ if (b >= 1048576) printf "%.1f MB", b / 1048576; else printf "%.1f kB", b / 1024 }'; }

declare -A W_STEADY W_DROP R_P99
RATIOS=()
ALL_GONE=1
[ "$QD_GONE" = t ] || ALL_GONE=0
for k in "${DROPS[@]}"; do
    W_STEADY[$k]=$(win "$(plus "${LD0[$k]}" "-$STEADY")" "${LD0[$k]}")
    W_DROP[$k]=$(win "${LD0[$k]}" "$(plus "${LD1[$k]}" 1)")
    R_P99[$k]=$(div "$(f "${W_DROP[$k]}" 4)" "$(f "${W_STEADY[$k]}" 4)")
    RATIOS+=("${R_P99[$k]}")
    [ "${LD_GONE[$k]}" = t ] || ALL_GONE=0
    raw "drop $k windows (n tps p50 p99 max): steady=${W_STEADY[$k]} drop=${W_DROP[$k]}"
done
W_STEADY2=$(win "$(plus "$LX0" "-$STEADY")" "$LX0")
W_DEL=$(win "$LX0" "$(plus "$LX1" 1)")
W_VAC=$(win "$LV0" "$(plus "$LV1" 1)")
raw "delete windows (n tps p50 p99 max): steady=$W_STEADY2 delete=$W_DEL vacuum=$W_VAC"
raw "errors: failed_in_log=$FAILED_LOG aborted_lines=$ABORTED xact_rollback_delta=$RB live_clients=$LIVE_CLIENTS/$CLIENTS"
{
    echo "timeline of the load, per second from the start of drop 1 (s, txns, p99 ms, max ms); events:"
    for k in "${DROPS[@]}"; do
        echo "  drop $k at $(awk -v a="${LD0[$k]}" -v o="${LD0[1]}" 'BEGIN{printf "%+.2f", a - o}') s, $(ms "${LD0[$k]}" "${LD1[$k]}") ms"
    done
    echo "  DELETE at $(awk -v a="$LX0" -v o="${LD0[1]}" 'BEGIN{printf "%+.2f", a - o}') s, $(ms "$LX0" "$LX1") ms"
    echo "  VACUUM at $(awk -v a="$LV0" -v o="${LD0[1]}" 'BEGIN{printf "%+.2f", a - o}') s, $(ms "$LV0" "$LV1") ms"
    timeline "$(plus "${LD0[1]}" -$((WARMUP + STEADY)))" "$(plus "$LV1" 3)" 1 "${LD0[1]}"
    for k in "${DROPS[@]}"; do
        echo "around drop $k, per 100 ms from its start:"
        timeline "$(plus "${LD0[$k]}" -1)" "$(plus "${LD1[$k]}" 2)" 0.1 "${LD0[$k]}"
    done
} >>"$OUT"

QD_MS=$(ms "$QD0" "$QD1"); QX_MS=$(ms "$QX0" "$QX1"); QV_MS=$(ms "$QV0" "$QV1")
QXV_MS=$(awk -v a="$QX_MS" -v b="$QV_MS" 'BEGIN{printf "%.1f", a + b}')
QXV_WAL=$((${QX_WAL%.*} + ${QV_WAL%.*}))
LX_MS=$(ms "$LX0" "$LX1"); LV_MS=$(ms "$LV0" "$LV1")

R_P99_MED=$(median "${RATIOS[@]}")
R_P99_MAX=$(printf '%s\n' "${RATIOS[@]}" | pct 1)
R_WAL=$(div "$QD_WAL" "$QX_WAL")
R_WALV=$(div "$QD_WAL" "$QXV_WAL")
R_TIME=$(div "$QD_MS" "$QX_MS")
R_TIMEV=$(div "$QD_MS" "$QXV_MS")
R_DELP99=$(div "$(f "$W_DEL" 4)" "$(f "$W_STEADY2" 4)")
R_VACP99=$(div "$(f "$W_VAC" 4)" "$(f "$W_STEADY2" 4)")

say ""
say "bench/drop.sh: expiry of a $ROWS-row partition vs DELETE (issue 4)   $(date -u '+%Y-%m-%d %H:%M UTC')"
say "PostgreSQL $PGVER, extension $EXTVER as installed (working tree at git $GITREV), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "settings: partition_interval = message_ttl = key_ttl = ${INTERVAL}s: one lane, partitions ${INTERVAL}s wide, each expiring"
say "          partition holds exactly the $ROWS filled rows; premake $PREMAKE at set-up, 0 in the measured idem_maintain() calls;"
say "          synchronous_commit off, full_page_writes on, shared_buffers 1GB, autovacuum off (VACUUM run explicitly), no checkpoint during the measurements"
say "partitions: $NFILL x $ROWS rows, $(mb "${PART_BYTES[1]}") each (heap + index), filled with idem_consume_messages, 10,000 ids per batch"
say "          (${FILL_SECS}s in all, then ${WAIT_SECS}s until the first expired)"
say "baseline: plain_expiry, a copy of the same rows (same columns, btree on digest); DELETE FROM plain_expiry WHERE expires_at < now(); then VACUUM plain_expiry"
say "load: pgbench -n -M prepared -c $CLIENTS -j $THREADS, one transaction = BEGIN; idem_claim; idem_complete; idem_consume_message; COMMIT"
say "          (fresh random key and id, ttl $LOAD_TTL)"
say ""
hdr=$(printf '%-50s %7s %7s %8s %8s %8s' "under load: window" "txns" "tps" "p50 ms" "p99 ms" "max ms")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
row() { say "$(printf '%-50s %7s %7s %8s %8s %8s' "$1" "$(f "$2" 1)" "$(f "$2" 2)" "$(f "$2" 3)" "$(f "$2" 4)" "$(f "$2" 5)")"; }
for k in "${DROPS[@]}"; do
    row "drop $k: steady, ${STEADY} s before" "${W_STEADY[$k]}"
    row "drop $k: idem_maintain() $(ms "${LD0[$k]}" "${LD1[$k]}") ms, + 1 s" "${W_DROP[$k]}"
    say "$(printf '%-50s %s' "" "p99 ratio ${R_P99[$k]}; made ${LD_CREATED[$k]}, dropped ${LD_DROPPED[$k]} partitions")"
done
row "DELETE: steady, ${STEADY} s before" "$W_STEADY2"
row "DELETE ${LX_MS} ms, + 1 s" "$W_DEL"
row "VACUUM ${LV_MS} ms, + 1 s" "$W_VAC"
say ""
hdr=$(printf '%-50s %12s %14s' "no load (after CHECKPOINT)" "time ms" "WAL")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
say "$(printf '%-50s %12s %14s' "drop: idem_maintain() ($QD_DROPPED dropped, $QD_CREATED made)" "$QD_MS" "$(mb "$QD_WAL")")"
say "$(printf '%-50s %12s %14s' "DELETE (leaves $QX_LEFT rows)" "$QX_MS" "$(mb "$QX_WAL")")"
say "$(printf '%-50s %12s %14s' "VACUUM after the DELETE" "$QV_MS" "$(mb "$QV_WAL")")"
say "$(printf '%-50s %12s %14s' "DELETE + VACUUM" "$QXV_MS" "$(mb "$QXV_WAL")")"
say ""

hdr=$(printf '%-62s %10s  %-9s %s' "bar" "value" "target" "result")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
check "p99 during the drop / steady p99 (median of ${#DROPS[@]} drops)" "$R_P99_MED" "<=" 2.0
info  "  the same, worst of the ${#DROPS[@]} drops"                     "$R_P99_MAX"
check "errors under load (failed, aborted, rolled back)"            "$ERRORS" "=" 0
check "every partition dropped by its first idem_maintain() (1=yes)" "$ALL_GONE" "=" 1
check "WAL: expiry by drop / DELETE"                               "$R_WAL" "<=" 0.05
info  "WAL: expiry by drop / (DELETE + VACUUM)"                    "$R_WALV"
info  "time: expiry by drop / DELETE"                              "$R_TIME"
info  "time: expiry by drop / (DELETE + VACUUM)"                   "$R_TIMEV"
info  "baseline: p99 during DELETE / steady p99"                   "$R_DELP99"
info  "baseline: p99 during VACUUM / steady p99"                   "$R_VACP99"
say ""
say "elapsed $((T1 - T0))s; results and timeline: $OUT"
exit "$(bench_status)"

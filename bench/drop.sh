#!/usr/bin/env bash
# bench/drop.sh -- expiry by dropping a partition vs DELETE, under load (issue 4).
#
#   bash bench/drop.sh            # as root or as any user; about 3-4 minutes
#
# Fills one partition of idempotency.messages with 1,000,000 ids, lets it
# expire, and drops it with idem_maintain() while pgbench runs a steady
# claim+complete+consume load (4 clients).  Baseline: a plain table with the
# same rows (same columns, btree on the digest) and
# DELETE FROM t WHERE expires_at < now(), then the VACUUM it needs.
#
# p99 latency of the load is measured in the 10 s before the drop and in the
# window from the drop's start to 1 s after its end (likewise for the DELETE
# and the VACUUM).  Time and WAL of the drop and of the DELETE are measured
# with no load running (a second database holds a second copy of everything),
# right after a CHECKPOINT, so both pay the full-page images a real expiry
# pays.  Bars (issue 4): p99 during the drop <= 2x steady, zero errors, WAL of
# the expiry <= 5% of the DELETE's.
#
# Environment (defaults in brackets):
#   DROP_ROWS          ids in the expiring partition                  [1000000]
#   DROP_FILL_BUDGET   seconds allowed for filling it (default: from a
#                      timed 10,000-id batch)                          [auto]
#   DROP_PORT          server port (unix socket only)                  [54461]
#   DROP_KEEP          1 = keep the temp dir (cluster stopped)         [0]
#   PGBIN              PostgreSQL binaries       [/usr/lib/postgresql/15/bin]
#
# Uses the installed extension (it builds nothing).  Output: a summary on
# stdout, also written to bench/results/drop-<timestamp>.txt with the raw
# figures.  Exit status: 0 every bar PASS, 3 some bar FAIL, 1 the run failed.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
export PG_CONFIG=$PGBIN/pg_config
# shellcheck source=../test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

ROWS=${DROP_ROWS:-1000000}
BUDGET=${DROP_FILL_BUDGET:-auto}
PORT=${DROP_PORT:-54461}
KEEP=${DROP_KEEP:-0}
INTERVAL=30         # partition_interval = message_ttl = key_ttl: one lane
PREMAKE=20          # partitions made ahead at set-up: none is made during the run
WARMUP=5            # seconds of load before the first steady window
STEADY=10           # seconds of each steady window
CLIENTS=4
THREADS=2
LOAD_DB=drop_load   # load, dropped under load, plain table DELETEd under load
QUIET_DB=drop_quiet # dropped and DELETEd with no load: time and WAL

RESDIR=$HERE/results
mkdir -p "$RESDIR" || exit 1
TS=$(date +%Y%m%d-%H%M%S)
OUT=$RESDIR/drop-$TS.txt
: >"$OUT" || exit 1

say()  { printf '%s\n' "$*" | tee -a "$OUT"; }
raw()  { printf '%s\n' "$*" >>"$OUT"; }
note() { printf '%s\n' "$*" >&2; }
die()  { note "drop.sh: $*"; raw "run failed: $*"; exit 1; }
now()  { date +%s.%N; }
# sleep_until EPOCH: wait for a point in time (the measurement windows are
# defined by time, there is no condition to poll for)
sleep_until() {
    local d
    d=$(awk -v t="$1" -v n="$(now)" 'BEGIN{ d = t - n; printf "%.3f", (d > 0 ? d : 0) }')
    sleep "$d"
}

WORK=$(mktemp -d /tmp/idem-drop.XXXXXX) || exit 1
chmod 755 "$WORK"
[ "$(id -u)" = 0 ] && chown "${CLUSTER_USER:-postgres}:" "$WORK"
C=$WORK/cluster
PGB_PID=        # pid of pgbench itself
PGB_BG=         # the background job running it

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$PGB_PID" ]; then kill -INT "$PGB_PID" 2>/dev/null; fi
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

q()    { local db=$1; shift; cluster_psql "$C" -q -d "$db" "$@"; }
qval() { q "$1" -At -c "$2"; }

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

# both ledgers exist, and every partition the run needs is made now
for db in "$LOAD_DB" "$QUIET_DB"; do
    q "$db" -At -c "BEGIN" -c "SELECT status FROM idem_claim('setup', '{}')" \
        -c "SELECT idem_complete('setup', 200)" -c "SELECT idem_consume_message('setup', 'setup')" \
        -c "COMMIT" -c "SELECT * FROM idem_maintain()" >/dev/null || die "extension set-up failed in $db"
done

# ---------------------------------------------------------------- fill
# Fill time decides how far ahead the partition's upper bound must be: time
# one batch of 10,000 ids in a scratch database.
if [ "$BUDGET" = auto ]; then
    b0=$(now)
    qval drop_calib "SELECT count(*) FROM idem_consume_messages('calib', ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, 10000)))" >/dev/null \
        || die "calibration batch failed"
    b1=$(now)
    # two fills one after the other; x1.5 for a machine shared with others,
    # +10 s margin
    BUDGET=$(awk -v a="$b0" -v b="$b1" -v n="$ROWS" 'BEGIN{ printf "%d", (b - a) * n / 10000 * 2 * 1.5 + 10 }')
    raw "calibration: one batch of 10000 ids in $(awk -v a="$b0" -v b="$b1" 'BEGIN{printf "%.3f", b - a}') s"
fi
qval postgres "DROP DATABASE drop_calib" >/dev/null
# the partition's upper bound U: the first boundary BUDGET seconds from now;
# its rows expire 1 s before U
U=$(awk -v n="$(now)" -v b="$BUDGET" -v i="$INTERVAL" 'BEGIN{ printf "%d", (int((n + b) / i) + 1) * i }')
EXPIRES_AT=$(qval postgres "SELECT to_timestamp($U - 1)")
UPPER=$(qval postgres "SELECT to_timestamp($U)")
note "filling one partition in each of $LOAD_DB and $QUIET_DB with $ROWS ids (expiring at $EXPIRES_AT; budget ${BUDGET}s) ..."
f0=$(now)
fillok=1
for db in "$LOAD_DB" "$QUIET_DB"; do
    q "$db" -c "SET bench.rows = $ROWS" -c "SET bench.expires_at = '$EXPIRES_AT'" \
        -f "$WORK/sql/drop_fill.sql" >"$WORK/fill-$db.log" 2>&1 || { fillok=0; break; }
    # Expired partitions other than the big one (the set-up probe's) go now,
    # so that the measured idem_maintain() calls drop only partitions ending
    # at U.  Not if U is near: this call must not drop the big partition.
    if [ "$(date +%s)" -lt $((U - 2)) ]; then
        raw "$db: idem_maintain() before U: $(qval "$db" "SELECT partitions_created || ' created, ' || partitions_dropped || ' dropped' FROM idem_maintain()")"
    fi
done
f1=$(now)
[ "$fillok" = 1 ] || { cat "$WORK"/fill-*.log >&2; die "fill failed"; }
FILL_SECS=$(awk -v a="$f0" -v b="$f1" 'BEGIN{printf "%.1f", b - a}')
raw "fill: ${FILL_SECS}s for 2 x $ROWS ids"

declare -A PART PART_ROWS PART_BYTES
for db in "$LOAD_DB" "$QUIET_DB"; do
    PART[$db]=$(qval "$db" "SELECT partition FROM idempotency.partitions WHERE table_name = 'messages' AND upper_bound = '$UPPER'")
    [ -n "${PART[$db]}" ] || die "no partition with upper bound $UPPER in $db"
    # every filled row is in that one partition
    n_in=$(qval "$db" "SELECT count(*) FROM ${PART[$db]}")
    n_all=$(qval "$db" "SELECT count(*) FROM idempotency.messages")
    [ "$n_in" = "$ROWS" ] || die "$db: ${PART[$db]} holds $n_in rows, expected $ROWS"
    PART_ROWS[$db]=$n_in
    raw "$db: ${PART[$db]} rows=$n_in; all message rows=$n_all"
    # the baseline: the same rows in a plain table
    q "$db" -v part="${PART[$db]}" -f "$WORK/sql/drop_plain.sql" >/dev/null || die "plain table set-up failed in $db"
    q "$db" -c "VACUUM ANALYZE" || die "VACUUM failed in $db"
    PART_BYTES[$db]=$(qval "$db" "SELECT pg_total_relation_size('${PART[$db]}')")
    raw "$db: partition bytes=${PART_BYTES[$db]}; plain_expiry bytes=$(qval "$db" "SELECT pg_total_relation_size('plain_expiry')") rows=$(qval "$db" "SELECT count(*) FROM plain_expiry")"
done
qval postgres "CHECKPOINT" >/dev/null

# ---------------------------------------------------------------- wait for expiry
note "waiting for the partitions to expire at $UPPER ..."
deadline=$(( U + 60 ))
for db in "$LOAD_DB" "$QUIET_DB"; do
    while :; do
        st=$(qval "$db" "SELECT CASE WHEN to_regclass('${PART[$db]}') IS NULL THEN 'gone'
                                     ELSE (SELECT expired::text FROM idempotency.partitions
                                            WHERE partition = to_regclass('${PART[$db]}')) END")
        [ "$st" = true ] && break
        [ "$st" = gone ] && die "${PART[$db]} in $db was dropped before the measurement"
        [ "$(date +%s)" -lt "$deadline" ] || die "${PART[$db]} in $db not expired by $(date -d "@$deadline")"
        sleep 0.2
    done
done
WAIT_SECS=$(awk -v a="$f1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')

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
res=$(measure "$QUIET_DB" "$DROP_SQL") || die "idem_maintain() failed in $QUIET_DB"
raw "quiet drop: $(echo "$res" | tr '\n' ' ')"
read -r QD_CREATED QD_DROPPED <<<"$(echo "$res" | head -n1)"
IFS='|' read -r QD0 QD1 QD_WAL <<<"$(echo "$res" | tail -n1)"
QD_GONE=$(qval "$QUIET_DB" "SELECT to_regclass('${PART[$QUIET_DB]}') IS NULL")
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
note "load phase: pgbench -c $CLIENTS -j $THREADS; drop, DELETE and VACUUM under load ..."
(cd "$WORK" && cluster_run "$C" sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$WORK/pgbench.pid" \
    pgbench -n -M prepared -c "$CLIENTS" -j "$THREADS" -T 3600 -l --log-prefix="$WORK/pgblog" \
    -f "$WORK/sql/drop_load.sql" "$LOAD_DB") >"$WORK/pgbench.out" 2>"$WORK/pgbench.err" &
PGB_BG=$!
until [ -s "$WORK/pgbench.pid" ]; do
    kill -0 "$PGB_BG" 2>/dev/null || die "pgbench did not start: $(cat "$WORK/pgbench.err")"
    sleep 0.05
done
PGB_PID=$(cat "$WORK/pgbench.pid")
# the load is on once every client has connected
until [ "$(qval postgres "SELECT count(*) FROM pg_stat_activity WHERE datname = '$LOAD_DB' AND application_name = 'pgbench'")" -ge "$CLIENTS" ]; do
    kill -0 "$PGB_BG" 2>/dev/null || die "pgbench exited: $(cat "$WORK/pgbench.err")"
    sleep 0.05
done
L0=$(now)
sleep_until "$(awk -v t="$L0" -v w="$WARMUP" -v s="$STEADY" 'BEGIN{printf "%.3f", t + w + s}')"
res=$(measure "$LOAD_DB" "$DROP_SQL") || die "idem_maintain() failed under load"
raw "load drop: $(echo "$res" | tr '\n' ' ')"
read -r LD_CREATED LD_DROPPED <<<"$(echo "$res" | head -n1)"
IFS='|' read -r LD0 LD1 LD_WAL <<<"$(echo "$res" | tail -n1)"
LD_GONE=$(qval "$LOAD_DB" "SELECT to_regclass('${PART[$LOAD_DB]}') IS NULL")
sleep_until "$(awk -v t="$LD1" -v s="$STEADY" 'BEGIN{printf "%.3f", t + 1 + s}')"
res=$(measure "$LOAD_DB" "$DELETE_SQL") || die "DELETE failed under load"
raw "load delete: $res"
IFS='|' read -r LX0 LX1 LX_WAL <<<"$res"
sleep_until "$(awk -v t="$LX1" 'BEGIN{printf "%.3f", t + 1}')"
res=$(measure "$LOAD_DB" "$VACUUM_SQL") || die "VACUUM failed under load"
raw "load vacuum: $res"
IFS='|' read -r LV0 LV1 LV_WAL <<<"$res"
sleep_until "$(awk -v t="$LV1" 'BEGIN{printf "%.3f", t + 3}')"
kill -0 "$PGB_BG" 2>/dev/null || note "pgbench ended early"
# before pgbench goes: its clients disconnecting mid-transaction roll back
ROLLBACK1=$(qval postgres "SELECT xact_rollback FROM pg_stat_database WHERE datname = '$LOAD_DB'")
kill -INT "$PGB_PID" 2>/dev/null
wait "$PGB_BG" 2>/dev/null
PGB_BG=
PGB_PID=
T1=$(date +%s)

# ---------------------------------------------------------------- analysis
# per-transaction log lines: client_id xact_no latency_us script_no epoch us;
# latency "failed" for a failed transaction
LOG=$WORK/lat.txt
cat "$WORK"/pgblog.* 2>/dev/null | awk '{ printf "%.6f %s %s\n", $5 + $6 / 1e6, ($3 == "failed" ? "failed" : $3 / 1000), $1 }' | sort -g >"$LOG"
[ -s "$LOG" ] || die "pgbench wrote no transaction log; stderr: $(head -n 5 "$WORK/pgbench.err")"
FAILED_LOG=$(awk '$2 == "failed"' "$LOG" | wc -l)
ABORTED=$(grep -cE 'aborted|ERROR|FATAL' "$WORK/pgbench.err")
# every client must still be committing at the end (an error ends a client)
LIVE_CLIENTS=$(awk -v t="$LV1" '$1 >= t { c[$3] = 1 } END { n = 0; for (k in c) n++; print n }' "$LOG")
RB=$(( ROLLBACK1 - ROLLBACK0 ))
ERRORS=$(( FAILED_LOG + ABORTED + RB + (CLIENTS - LIVE_CLIENTS) ))

# win A B: "n tps p50 p99 max" of transactions completed in [A, B)
win() {
    awk -v a="$1" -v b="$2" '$1 >= a && $1 < b && $2 != "failed" { print $2 }' "$LOG" | sort -g |
        awk -v a="$1" -v b="$2" '{ x[NR] = $1 }
            function q(p,  i) { i = int(p * NR + 0.999999); if (i < 1) i = 1; return x[i] }
            END { if (NR == 0) { print "0 0 NA NA NA"; exit }
                  printf "%d %.0f %.2f %.2f %.2f\n", NR, NR / (b - a), q(0.5), q(0.99), x[NR] }'
}
# per-second p99 over a steady window: "min median max"
persec() {
    local a=$1 s i
    for ((i = 0; i < STEADY; i++)); do
        s=$(awk -v a="$a" -v i="$i" 'BEGIN{printf "%.6f", a + i}')
        win "$s" "$(awk -v s="$s" 'BEGIN{printf "%.6f", s + 1}')" | awk '{print $4}'
    done | sort -g | awk '{x[NR] = $1} END { printf "%s %s %s\n", x[1], x[int((NR + 1) / 2)], x[NR] }'
}
plus() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a + b}'; }
W_STEADY=$(win "$(plus "$LD0" -$STEADY)" "$LD0")
W_DROP=$(win "$LD0" "$(plus "$LD1" 1)")
W_STEADY2=$(win "$(plus "$LX0" -$STEADY)" "$LX0")
W_DEL=$(win "$LX0" "$(plus "$LX1" 1)")
W_VAC=$(win "$LV0" "$(plus "$LV1" 1)")
PS_STEADY=$(persec "$(plus "$LD0" -$STEADY)")
raw "windows (n tps p50 p99 max): steady=$W_STEADY drop=$W_DROP steady2=$W_STEADY2 delete=$W_DEL vacuum=$W_VAC persec_steady=$PS_STEADY"
raw "errors: failed_in_log=$FAILED_LOG aborted_lines=$ABORTED xact_rollback_delta=$RB live_clients=$LIVE_CLIENTS/$CLIENTS"

f() { echo "$1" | awk -v k="$2" '{print $k}'; }
ms() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", (b - a) * 1000}'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "NA" || b == "NA" || a == "" || b == "" || b + 0 == 0) print "NA"; else printf "%.4g", a / b }'; }
verdict() {  # value op target
    awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN{
        if (v == "NA" || v == "") { print "FAIL"; exit }
        ok = (op == "<=") ? (v + 0 <= t + 0) : (op == "=") ? (v + 0 == t + 0) : (v + 0 >= t + 0)
        print ok ? "PASS" : "FAIL" }'
}
mb() { awk -v b="$1" 'BEGIN{ if (b >= 1048576) printf "%.1f MB", b / 1048576; else printf "%.1f kB", b / 1024 }'; }

QD_MS=$(ms "$QD0" "$QD1"); QX_MS=$(ms "$QX0" "$QX1"); QV_MS=$(ms "$QV0" "$QV1")
QXV_MS=$(awk -v a="$QX_MS" -v b="$QV_MS" 'BEGIN{printf "%.1f", a + b}')
QXV_WAL=$(( ${QX_WAL%.*} + ${QV_WAL%.*} ))
LD_MS=$(ms "$LD0" "$LD1"); LX_MS=$(ms "$LX0" "$LX1"); LV_MS=$(ms "$LV0" "$LV1")

R_P99=$(div "$(f "$W_DROP" 4)" "$(f "$W_STEADY" 4)")
R_WAL=$(div "$QD_WAL" "$QX_WAL")
R_WALV=$(div "$QD_WAL" "$QXV_WAL")
R_TIME=$(div "$QD_MS" "$QX_MS")
R_TIMEV=$(div "$QD_MS" "$QXV_MS")
R_DELP99=$(div "$(f "$W_DEL" 4)" "$(f "$W_STEADY2" 4)")
R_VACP99=$(div "$(f "$W_VAC" 4)" "$(f "$W_STEADY2" 4)")

say ""
say "bench/drop.sh: expiry of a $ROWS-row partition vs DELETE (issue 4)   $(date -u '+%Y-%m-%d %H:%M UTC')"
say "PostgreSQL $PGVER, extension $EXTVER as installed (working tree at git $GITREV), $(nproc) cores"
say "settings: partition_interval = message_ttl = key_ttl = ${INTERVAL}s (one lane, partitions ${INTERVAL}s wide), premake $PREMAKE at set-up;"
say "          synchronous_commit off, full_page_writes on, shared_buffers 1GB, autovacuum off (VACUUM run explicitly), no checkpoint during the measurements"
say "partition: ${PART[$LOAD_DB]} (and its copy in $QUIET_DB), ${PART_ROWS[$LOAD_DB]} rows, $(mb "${PART_BYTES[$LOAD_DB]}") (heap + index),"
say "          filled with idem_consume_messages, 10,000 ids per batch, all expiring at $EXPIRES_AT (fill ${FILL_SECS}s, then ${WAIT_SECS}s until expired)"
say "baseline: plain_expiry, a copy of the same rows (same columns, btree on digest); DELETE FROM plain_expiry WHERE expires_at < now(); then VACUUM plain_expiry"
say "load: pgbench -n -M prepared -c $CLIENTS -j $THREADS, one transaction = BEGIN; idem_claim; idem_complete; idem_consume_message; COMMIT (fresh random key)"
say ""
hdr=$(printf '%-50s %7s %7s %8s %8s %8s' "under load: window" "txns" "tps" "p50 ms" "p99 ms" "max ms")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
row() { say "$(printf '%-50s %7s %7s %8s %8s %8s' "$1" "$(f "$2" 1)" "$(f "$2" 2)" "$(f "$2" 3)" "$(f "$2" 4)" "$(f "$2" 5)")"; }
row "steady, ${STEADY} s before the drop" "$W_STEADY"
say "$(printf '%-50s %34s' "  p99 of each second of it (min / median / max)" "$(echo "$PS_STEADY" | awk '{printf "%s / %s / %s", $1, $2, $3}')")"
row "drop: idem_maintain() ${LD_MS} ms, + 1 s" "$W_DROP"
row "steady, ${STEADY} s before the DELETE" "$W_STEADY2"
row "DELETE ${LX_MS} ms, + 1 s" "$W_DEL"
row "VACUUM ${LV_MS} ms, + 1 s" "$W_VAC"
say "(under load the drop call made $LD_CREATED and dropped $LD_DROPPED partitions; big partition gone: $LD_GONE)"
say ""
hdr=$(printf '%-50s %12s %14s' "no load (after CHECKPOINT)" "time ms" "WAL")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
say "$(printf '%-50s %12s %14s' "drop: idem_maintain() ($QD_DROPPED dropped, $QD_CREATED made)" "$QD_MS" "$(mb "$QD_WAL")")"
say "$(printf '%-50s %12s %14s' "DELETE (leaves $QX_LEFT rows)" "$QX_MS" "$(mb "$QX_WAL")")"
say "$(printf '%-50s %12s %14s' "VACUUM after the DELETE" "$QV_MS" "$(mb "$QV_WAL")")"
say "$(printf '%-50s %12s %14s' "DELETE + VACUUM" "$QXV_MS" "$(mb "$QXV_WAL")")"
say ""

ALLPASS=1
bar() {  # label value op target [info]
    local v
    if [ -n "${5:-}" ]; then v=info; else v=$(verdict "$2" "$3" "$4"); fi
    [ "$v" = FAIL ] && ALLPASS=0
    say "$(printf '%-58s %10s  %-2s %-5s %s' "$1" "$2" "$3" "$4" "$v")"
}
hdr=$(printf '%-58s %10s  %-8s %s' "bar" "value" "target" "result")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
bar "p99 during the drop / steady p99"                      "$R_P99" "<=" 2.0
bar "errors under load (failed, aborted, rolled back)"       "$ERRORS" "=" 0
bar "partition dropped by the first idem_maintain() (1=yes)" "$([ "$LD_GONE" = t ] && [ "$QD_GONE" = t ] && echo 1 || echo 0)" "=" 1
bar "WAL: expiry by drop / DELETE"                          "$R_WAL" "<=" 0.05
bar "WAL: expiry by drop / (DELETE + VACUUM)"               "$R_WALV" "" "" info
bar "time: expiry by drop / DELETE"                         "$R_TIME" "" "" info
bar "time: expiry by drop / (DELETE + VACUUM)"              "$R_TIMEV" "" "" info
bar "baseline: p99 during DELETE / steady p99"              "$R_DELP99" "" "" info
bar "baseline: p99 during VACUUM / steady p99"              "$R_VACP99" "" "" info
say ""
say "elapsed $((T1 - T0))s; results: bench/results/drop-$TS.txt"
[ "$ALLPASS" = 1 ] && exit 0 || exit 3

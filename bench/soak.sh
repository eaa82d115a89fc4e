#!/usr/bin/env bash
# bench/soak.sh -- soak test: mixed load on 10-second partitions (issue 5).
#
#   bash bench/soak.sh                 # 10 minutes (SOAK_SECONDS=600)
#   SOAK_SECONDS=60 bash bench/soak.sh # quick check
#   BENCH_SMOKE=1 bash bench/soak.sh   # seconds: does the script still work?
#
# Runs a mixed pgbench load (fresh claims, replays of completed keys, single
# and batch consumes with redeliveries, two-phase claims with a lease) at a
# fixed rate for SOAK_SECONDS on a throwaway cluster with
# idempotency.partition_interval = '10s' and key_ttl = message_ttl = '20s',
# so partitions are made and dropped all the time.  Maintenance is the
# background worker (shared_preload_libraries = 'idempotency', naptime 1 s)
# when the installed extension has one, else a loop calling idem_maintain()
# every second.
#
# Every SOAK_SAMPLE seconds it records the partitions of each ledger and
# their total size (pg_total_relation_size: heap, indexes, TOAST), the size
# of the system catalogs, the memory of the backends serving the load
# (Rss, Pss, Private_Dirty from /proc/<pid>/smaps_rollup) and of the
# launcher, and the memory contexts of one load backend
# (pg_log_backend_memory_contexts: grand total and CacheMemoryContext).
#
# A series is flat (PASS) if the mean of the last third of the samples is
# within SOAK_TOLERANCE (20%) of the mean of the middle third (the first
# third is warm-up: caches fill, the first partitions appear): the
# verdict of bench/lib.sh on |last / middle - 1| <= SOAK_TOLERANCE.  The
# ledger sizes, the partition counts and the load backends' private memory
# must be flat, and pgbench must report no failed transaction.
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SMOKE      1 = the smallest run that goes through every step, for
#                    the test suite; exit status 0 whatever the figures [0]
#   SOAK_SECONDS     length of the load                              [600/10]
#   SOAK_SAMPLE      seconds between samples                         [10/2]
#   SOAK_RATE        pgbench transactions per second (-R)            [800/200]
#   SOAK_TOLERANCE   allowed last-third / middle-third deviation     [0.20]
#   SOAK_MAINT       worker | loop | auto (worker if it works)       [auto]
#   SOAK_PORT        server port (unix socket only)                  [54462]
#   SOAK_KEEP        1 = keep the temp dir (cluster stopped)         [0]
#   PGBIN            PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_RESULTS    directory of the results files  [bench/results, bench/results/smoke]
#
# Uses the installed extension (it builds nothing).  Output: the curve and
# the verdicts on stdout (also soak-<timestamp>.txt in BENCH_RESULTS), every
# sample in soak-<timestamp>.csv there.  Exit status (bench/lib.sh,
# bench_status): 0 all flat and no errors, 3 otherwise, 1 the run itself
# failed.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH_NAME=soak.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin) || exit 1
export PG_CONFIG=$PGBIN/pg_config
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

SECS=${SOAK_SECONDS:-$(bench_size 600 10)}
SAMPLE=${SOAK_SAMPLE:-$(bench_size 10 2)}
RATE=${SOAK_RATE:-$(bench_size 800 200)}
TOL=${SOAK_TOLERANCE:-0.20}
MAINT=${SOAK_MAINT:-auto}
PORT=${SOAK_PORT:-54462}
KEEP=${SOAK_KEEP:-0}
CLIENTS=4
THREADS=2
DB=soak
# script@weight: a weighted mix, one script per transaction (the lease
# script is two transactions)
SCRIPTS=(soak_claim.sql@4 soak_replay.sql@3 soak_consume.sql@4 soak_batch.sql@1 soak_lease.sql@1)

for v in SECS SAMPLE RATE; do
    case ${!v} in ''|*[!0-9]*|0) echo "soak.sh: $v must be a positive integer" >&2; exit 1 ;; esac
done
[ "$SECS" -ge $((3 * SAMPLE + 1)) ] || { echo "soak.sh: SOAK_SECONDS must be more than 3 x SOAK_SAMPLE" >&2; exit 1; }
case $MAINT in worker|loop|auto) ;; *) echo "soak.sh: SOAK_MAINT must be worker, loop or auto" >&2; exit 1 ;; esac

RESDIR=$(bench_resdir)
mkdir -p "$RESDIR" || exit 1
TS=$(date +%Y%m%d-%H%M%S)
OUT=$RESDIR/soak-$TS.txt
CSV=$RESDIR/soak-$TS.csv
: >"$OUT" || exit 1

WORK=$(mktemp -d /tmp/idem-soak.XXXXXX) || exit 1
chmod 755 "$WORK"
[ "$(id -u)" = 0 ] && chown "${CLUSTER_USER:-postgres}:" "$WORK"
C=$WORK/cluster
PGB_BG=         # background job running pgbench
LOOP_BG=        # background maintenance loop

# shellcheck disable=SC2317 # run by the EXIT trap (shellcheck misses it after a final exit)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$PGB_BG" ]; then kill "$PGB_BG" 2>/dev/null; wait "$PGB_BG" 2>/dev/null; fi
    if [ -n "$LOOP_BG" ]; then kill "$LOOP_BG" 2>/dev/null; wait "$LOOP_BG" 2>/dev/null; fi
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
CONF=(
    "synchronous_commit = off"
    "shared_buffers = 256MB"
    "max_wal_size = 4GB"
    "idempotency.partition_interval = '10s'"
    "idempotency.message_ttl = '20s'"
    "idempotency.key_ttl = '20s'"
    "idempotency.naptime = 1"
)
USE_WORKER=0
if [ "$MAINT" != loop ]; then
    note "starting a cluster in $WORK with shared_preload_libraries = 'idempotency' ..."
    if cluster_start "$C" "$PORT" "${CONF[@]}" "shared_preload_libraries = 'idempotency'" 2>"$WORK/start.err"; then
        USE_WORKER=1
    else
        [ "$MAINT" = worker ] && { cat "$WORK/start.err" >&2; die "the server does not start with shared_preload_libraries = 'idempotency'"; }
        note "the server does not start with the library preloaded; maintenance loop instead"
        cluster_stop "$C"
        rm -rf "$C"
    fi
fi
if [ "$USE_WORKER" = 0 ]; then
    cluster_start "$C" "$PORT" "${CONF[@]}" || die "cluster did not start"
fi
PGVER=$(qval postgres "SHOW server_version") || die "cannot connect"
qval postgres "CREATE DATABASE $DB" >/dev/null || die "CREATE DATABASE failed"
q "$DB" -At -c "CREATE EXTENSION idempotency" >/dev/null || die "CREATE EXTENSION failed"
EXTVER=$(qval "$DB" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
GITREV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')
HAVE_STATS=0
qval "$DB" "SELECT maintenance_runs FROM idempotency.stats LIMIT 1" >/dev/null 2>&1 && HAVE_STATS=1
if [ "$USE_WORKER" = 1 ] && [ "$HAVE_STATS" = 1 ]; then
    # the worker is working once it has run in this database
    deadline=$(( $(date +%s) + 30 ))
    until [ "$(qval "$DB" "SELECT coalesce(max(maintenance_runs), 0) FROM idempotency.stats WHERE datname = current_database()")" -gt 0 ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            [ "$MAINT" = worker ] && die "the background worker did not run maintenance in $DB within 30 s"
            note "the background worker did not run within 30 s; maintenance loop instead"
            USE_WORKER=0
            break
        fi
        sleep 0.2
    done
else
    [ "$MAINT" = worker ] && die "no idempotency.stats view: the installed extension has no background worker"
    USE_WORKER=0
fi
if [ "$USE_WORKER" = 0 ]; then
    MAINT_DESC="a shell loop calling idem_maintain() every second (new session each time)"
    (while :; do q "$DB" -At -c "SELECT * FROM idem_maintain()" >/dev/null 2>>"$WORK/maint.err"; sleep 1; done) &
    LOOP_BG=$!
else
    MAINT_DESC="the background worker (shared_preload_libraries = 'idempotency', naptime 1 s)"
fi
# both ledgers exist before the load starts
q "$DB" -At -c "BEGIN" -c "SELECT status FROM idem_claim('setup', '{}')" -c "SELECT idem_complete('setup', 200)" \
    -c "COMMIT" -c "SELECT idem_consume_message('setup', 'setup')" -c "SELECT * FROM idem_maintain()" >/dev/null \
    || die "extension set-up failed"

# ---------------------------------------------------------------- load
PGB_ARGS=(-n -M prepared -c "$CLIENTS" -j "$THREADS" -T "$SECS" -R "$RATE" -P "$SAMPLE")
for s in "${SCRIPTS[@]}"; do PGB_ARGS+=(-f "$WORK/sql/$s"); done
note "load: pgbench ${PGB_ARGS[*]//$WORK\/sql\//} $DB for ${SECS}s; maintenance by $MAINT_DESC ..."
(cd "$WORK" && cluster_run "$C" pgbench "${PGB_ARGS[@]}" "$DB") >"$WORK/pgbench.out" 2>"$WORK/pgbench.err" &
PGB_BG=$!
until [ "$(qval postgres "SELECT count(*) FROM pg_stat_activity WHERE datname = '$DB' AND application_name = 'pgbench'")" -ge "$CLIENTS" ]; do
    kill -0 "$PGB_BG" 2>/dev/null || die "pgbench exited: $(head -n 5 "$WORK/pgbench.err")"
    sleep 0.05
done
L0=$(now)
PIDS=$(qval postgres "SELECT string_agg(pid::text, ' ' ORDER BY pid) FROM pg_stat_activity WHERE datname = '$DB' AND application_name = 'pgbench'")
CTX_PID=${PIDS%% *}    # memory contexts of this one are logged at each sample
raw "load backends: $PIDS (memory contexts logged for $CTX_PID)"

if [ "$HAVE_STATS" = 1 ]; then
    STATS_SQL="(SELECT maintenance_runs || ',' || partitions_created || ',' || partitions_dropped
                  FROM idempotency.stats WHERE datname = current_database())"
else
    STATS_SQL="',,'"
fi
# one line: keys_parts,msg_parts,keys_bytes,msg_bytes,catalog_bytes,commits,rollbacks,runs,created,dropped
SAMPLE_SQL="SELECT (SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass)
    || ',' || (SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency.messages'::regclass)
    || ',' || (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass)
    || ',' || (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0) FROM pg_inherits WHERE inhparent = 'idempotency.messages'::regclass)
    || ',' || (SELECT sum(pg_total_relation_size(oid)) FROM pg_class WHERE relnamespace = 'pg_catalog'::regnamespace AND relkind = 'r')
    || ',' || (SELECT xact_commit || ',' || xact_rollback FROM pg_stat_database WHERE datname = current_database())
    || ',' || coalesce($STATS_SQL, ',,')"

# mem PIDS: "n,rss,pss,private_dirty (kB, mean over the pids),private_dirty max"
mem() {
    local p f
    for p in "$@"; do
        f=/proc/$p/smaps_rollup
        [ -r "$f" ] && awk '/^Rss:/ {r = $2} /^Pss:/ {s = $2} /^Private_Dirty:/ {d = $2} END { print r, s, d }' "$f"
    done | awk '{ n++; r += $1; s += $2; d += $3; if ($3 > m) m = $3 }
                END { if (n) printf "%d,%.0f,%.0f,%.0f,%d\n", n, r / n, s / n, d / n, m; else print "0,,,," }'
}

echo "t_s,tps,keys_partitions,messages_partitions,keys_bytes,messages_bytes,catalog_bytes,backends,backend_rss_kb,backend_pss_kb,backend_private_dirty_kb,backend_private_dirty_max_kb,launcher_private_dirty_kb,ctx_grand_total_bytes,ctx_cache_bytes,maintenance_runs,partitions_created,partitions_dropped,rollbacks" >"$CSV"
NS=$(( (SECS - 1) / SAMPLE ))
: >"$WORK/samples"
for ((i = 1; i <= NS; i++)); do
    sleep_until "$(plus "$L0" $((i * SAMPLE)))"
    ts=$(now)
    s=$(qval "$DB" "$SAMPLE_SQL") || { note "sample $i failed"; continue; }
    # shellcheck disable=SC2086 # a list of pids
    m=$(mem $PIDS)
    LPID=$(qval postgres "SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency launcher'" 2>/dev/null)
    lm=
    [ -n "$LPID" ] && lm=$(mem "$LPID" | cut -d, -f4)
    qval postgres "SELECT pg_log_backend_memory_contexts($CTX_PID)" >/dev/null 2>&1
    printf '%s|%s|%s|%s\n' "$ts" "$s" "$m" "${lm:-}" >>"$WORK/samples"
    note "  $(awk -v a="$L0" -v b="$ts" 'BEGIN{printf "%4.0f", b - a}') s: $s | $m | ${lm:-}"
done
wait "$PGB_BG"
PGB_RC=$?
PGB_BG=
[ -n "$LOOP_BG" ] && { kill "$LOOP_BG" 2>/dev/null; wait "$LOOP_BG" 2>/dev/null; LOOP_BG=; }
T1=$(date +%s)
cat "$WORK/pgbench.out" >>"$OUT"
raw "pgbench exit status $PGB_RC; stderr (progress lines) follows"
cat "$WORK/pgbench.err" >>"$OUT"

# memory contexts of CTX_PID, in the order logged: "grand_total|cache_total"
# (the nth dump belongs to the nth sample)
grep -E "\[$CTX_PID\] LOG:  (Grand total|level: 1; CacheMemoryContext)" "$C/postgresql.log" |
    awk '/CacheMemoryContext/ { match($0, /CacheMemoryContext: [0-9]+/); c = substr($0, RSTART + 20, RLENGTH - 20) }
         /Grand total/ { match($0, /Grand total: [0-9]+/); print substr($0, RSTART + 13, RLENGTH - 13) "|" c; c = "" }' >"$WORK/ctx"

# ---------------------------------------------------------------- CSV
# samples: "epoch|keys_p,msg_p,keys_b,msg_b,cat_b,commits,rollbacks,runs,created,dropped|n,rss,pss,pd,pdmax|launcher_pd"
# + "|ctx_total|ctx_cache"
paste -d'|' "$WORK/samples" "$WORK/ctx" | head -n "$(wc -l <"$WORK/samples")" |
    awk -F'|' -v l0="$L0" '{
        split($2, s, ","); split($3, m, ",")
        t = $1 - l0
        tps = (pt != "") ? (s[6] - pc) / (t - pt) : ""
        pt = t; pc = s[6]
        if (r0 == "") r0 = s[7]
        printf "%.0f,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n",
            t, (tps == "" ? "" : sprintf("%.0f", tps)), s[1], s[2], s[3], s[4], s[5],
            m[1], m[2], m[3], m[4], m[5], $4, $5, $6, s[8], s[9], s[10], s[7] - r0
    }' >>"$CSV"
NROWS=$(($(wc -l <"$CSV") - 1))
[ "$NROWS" -ge 3 ] || die "only $NROWS samples"

# ---------------------------------------------------------------- report
FAILED=$(awk '/^number of failed transactions:/ { print $5; exit }' "$WORK/pgbench.out")
ABORTED=$(grep -cE 'aborted|ERROR|FATAL' "$WORK/pgbench.err")
TPS=$(awk -F'= ' '/^tps = / { split($2, a, " "); print a[1] }' "$WORK/pgbench.out")
ROLLBACKS=$(tail -n1 "$CSV" | awk -F, '{print $19}')
MAINT_ERR=
[ "$HAVE_STATS" = 1 ] && MAINT_ERR=$(qval "$DB" "SELECT last_maintenance_error FROM idempotency.stats WHERE datname = current_database()")
[ -s "$WORK/maint.err" ] && MAINT_ERR+=$(head -n 3 "$WORK/maint.err")
MIX=
[ "$HAVE_STATS" = 1 ] && MIX=$(qval "$DB" "SELECT format('claims %s, replays %s, in_progress %s, mismatches %s, consumed %s, duplicates %s, maintenance runs %s, partitions made %s, dropped %s',
        claims, replays, conflicts, mismatches, consumed, duplicates, maintenance_runs, partitions_created, partitions_dropped)
    FROM idempotency.stats WHERE datname = current_database()")
ERRORS=$(( ${FAILED:-0} + ABORTED + (PGB_RC != 0) ))

say ""
say "bench/soak.sh: ${SECS}s of mixed load on 10-second partitions (issue 5)   $(date -u '+%Y-%m-%d %H:%M UTC')"
say "PostgreSQL $PGVER, extension $EXTVER as installed (working tree at git $GITREV), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
say "settings: partition_interval 10s, key_ttl = message_ttl = 20s (2 lanes, partitions 20s wide), premake 1; maintenance: $MAINT_DESC"
say "load: pgbench -n -M prepared -c $CLIENTS -j $THREADS -R $RATE, scripts (weight): ${SCRIPTS[*]}"
say "      (claim+complete of a fresh key; replay/claim of one of 2,000 keys + lookup; consume of one of 20,000 ids;"
say "       batch of 100 of 1,000,000 ids; two-phase claim with lease, checkpoint, complete with token)"
say "memory: mean over the $CLIENTS load backends of /proc/<pid>/smaps_rollup; contexts of backend $CTX_PID via pg_log_backend_memory_contexts"
say ""
hdr=$(printf '%6s %6s %5s %5s %9s %9s %9s %8s %8s %8s %9s %9s %8s %6s' \
    "t s" "tps" "k.prt" "m.prt" "keys kB" "msgs kB" "catlg kB" "rss kB" "pss kB" "privd kB" "ctx kB" "cache kB" "lnch kB" "drops")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
tail -n +2 "$CSV" | awk -F, '
    function kb(x) { return (x == "") ? "-" : sprintf("%.0f", x / 1024) }
    function v(x) { return (x == "") ? "-" : x }
    { printf "%6s %6s %5s %5s %9s %9s %9s %8s %8s %8s %9s %9s %8s %6s\n",
        $1, v($2), $3, $4, kb($5), kb($6), kb($7), v($9), v($10), v($11), kb($14), kb($15), v($13), v($18) }' | tee -a "$OUT"
say ""

# thirds COLUMN: "middle-mean last-mean ratio deviation" over samples 2..
# (the first sample has no tps), thirds of the samples by position;
# deviation = |ratio - 1|, NA where a third has no value
thirds() {
    tail -n +2 "$CSV" | awk -F, -v c="$1" '
        { x[NR] = $c }
        END {
            n = NR; a = int(n / 3); b = int(2 * n / 3)
            for (i = a + 1; i <= b; i++) if (x[i] != "") { sm += x[i]; nm++ }
            for (i = b + 1; i <= n; i++) if (x[i] != "") { sl += x[i]; nl++ }
            if (!nm || !nl) { print "NA NA NA NA"; exit }
            mm = sm / nm; ml = sl / nl
            r = (mm == 0) ? (ml == 0 ? 1 : 999) : ml / mm
            printf "%.6g %.6g %.3f %.3f\n", mm, ml, r, (r > 1 ? r - 1 : 1 - r)
        }'
}
hdr=$(printf '%-46s %14s %14s %8s  %s' "series (last third vs middle third)" "middle mean" "last mean" "ratio" "flat (|ratio - 1| <= $TOL)")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
line() {  # label column required(1/0)
    local mm ml ratio dev v
    read -r mm ml ratio dev <<<"$(thirds "$2")"
    v=$(verdict "$dev" "<=" "$TOL")
    if [ "$3" = 1 ]; then bench_judge "$v"; else v="$v (info)"; fi
    say "$(printf '%-46s %14s %14s %8s  %s' "$1" "$mm" "$ml" "$ratio" "$v")"
}
line "idempotency.keys bytes"                        5 1
line "idempotency.messages bytes"                    6 1
line "idempotency.keys partitions"                   3 1
line "idempotency.messages partitions"               4 1
line "load backends Private_Dirty kB (mean)"         11 1
line "load backends Private_Dirty kB (max)"          12 1
line "load backend memory contexts, grand total"     14 1
line "load backends Pss kB (mean)"                   10 0
line "load backend CacheMemoryContext"               15 0
line "launcher Private_Dirty kB"                     13 0
line "system catalogs bytes"                         7 0
line "tps (commits/s, all transactions)"             2 0
say ""
say "pgbench: tps ${TPS:-?} (target rate $RATE), failed transactions ${FAILED:-?}, aborted-client lines $ABORTED, exit status $PGB_RC;"
[ -n "$MIX" ] && say "idempotency.stats: $MIX"
say "         rolled back in the database during the load: ${ROLLBACKS:-?}; last maintenance error: ${MAINT_ERR:-none}"
check "errors (failed transactions, aborted clients, pgbench status)" "$ERRORS" "=" 0
say "criterion: a series is flat (PASS) if mean(last third) / mean(middle third) is within 1 +/- $TOL; required: ledger bytes and"
say "           partitions, load backends' Private_Dirty and memory-context total; the rest is shown for information"
say ""
say "elapsed $((T1 - T0))s; samples: $CSV; summary and pgbench output: $OUT"
exit "$(bench_status)"

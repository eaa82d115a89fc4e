#!/usr/bin/env bash
# bench/run.sh -- throughput and storage benchmark for the idempotency extension.
#
# One command, one throwaway PostgreSQL 15 cluster, every variant side by side,
# ratios with PASS/FAIL against the issue's bars.  See bench/README.md.
#
#   bash bench/run.sh
#   BENCH_SMOKE=1 bash bench/run.sh     # seconds: does the script still work?
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SMOKE         1 = the smallest run that goes through every step, for
#                       the test suite; exit status 0 whatever the figures [0]
#   BENCH_GROUP         all | messages | keys: which group of variants [all]
#   BENCH_SECONDS       seconds per pgbench measurement            [15/1]
#   BENCH_ROUNDS        rounds of A B C ... interleaving           [5/1]
#   BENCH_WARMUP        seconds of warm-up per variant (0 = none)  [2/0]
#   BENCH_STORAGE_ROWS  ids inserted for the storage bar (0 = skip) [1000000/2000]
#   BENCH_REPLAY_KEYS   completed keys per design for the replay variants [100000/1000]
#   BENCH_PERF_SECONDS  perf profile of the consume path (0 = skip) [10/0]
#   BENCH_WAL_CALLS     calls per variant in the WAL phase (0 = skip) [5000/200]
#   BENCH_BUILD         auto|1|0: make install first (auto = if root) [auto]
#   BENCH_REV           build this git revision (git archive) instead of the working tree []
#   BENCH_PRELOAD       1 = shared_preload_libraries='idempotency' (the digest filters, as production runs it), 0 = not [1]
#   BENCH_PORT          server port (unix socket only)             [54401]
#   BENCH_KEEP          1 = keep the temp dir (cluster stopped)    [0]
#   BENCH_VARIANTS      run only these variants (space-separated names, see README); the
#                       round-trip floor (floor_stmt, floor_txn) of a pair of them is added [all]
#   BENCH_PERF_VARIANTS variants to profile                         [idem_p2 idem_batch keys_idem]
#   BENCH_EXTRA         1 = also plain 1000-row batch and the batch on 24 partitions (+~2 min) [0]
#   PGBIN               PostgreSQL binaries     [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_PG            PostgreSQL major to measure; one this machine's Debian
#                       does not package runs in its Debian root (test/lib/roots.sh) []
#   BENCH_RESULTS       directory of the results files  [bench/results, bench/results/smoke]
#
# Exit status (bench/lib.sh, bench_status): 0 all bars PASS; 3 some bar FAIL or
# SKIP; 1 the run itself failed.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH_NAME=run.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"

# ---------------------------------------------------------------- another major
# BENCH_PG=NN: PostgreSQL NN, in its Debian root if this machine's Debian
# does not package it (bench/lib.sh, bench_in_root)
bench_in_root run.sh
PGBIN_SET=${PGBIN:+1}
PGBIN=$(bench_pgbin)
PORT=${BENCH_PORT:-54401}
SECS=${BENCH_SECONDS:-$(bench_size 15 1)}
ROUNDS=${BENCH_ROUNDS:-$(bench_size 5 1)}
WARMUP=${BENCH_WARMUP:-$(bench_size 2 0)}
NROWS=${BENCH_STORAGE_ROWS:-$(bench_size 1000000 2000)}
REPLAY_KEYS=${BENCH_REPLAY_KEYS:-$(bench_size 100000 1000)}
PERF_SECS=${BENCH_PERF_SECONDS:-$(bench_size 10 0)}
WAL_CALLS=${BENCH_WAL_CALLS:-$(bench_size 5000 200)}
BUILD=${BENCH_BUILD:-auto}
PRELOAD=${BENCH_PRELOAD:-1}
KEEP=${BENCH_KEEP:-0}
EXTRA=${BENCH_EXTRA:-0}
ONLY=${BENCH_VARIANTS:-}
PERF_VARIANTS=${BENCH_PERF_VARIANTS:-idem_p2 idem_batch keys_idem}
GROUP=${BENCH_GROUP:-all}
REV=${BENCH_REV:-}
CLIENTS=4
THREADS=2

RESDIR=$(bench_resdir)
mkdir -p "$RESDIR"
LATEST=$RESDIR/latest.txt          # summary + raw per-run figures
PGBLOG=$RESDIR/pgbench-latest.log  # full pgbench output of every run
: >"$LATEST"
: >"$PGBLOG"
rm -f "$RESDIR/build-latest.log"

T0=$(date +%s)
# shellcheck disable=SC2016 # the single quotes are part of the command line shown
CMDLINE="${BENCH_SMOKE:+BENCH_SMOKE=$BENCH_SMOKE }BENCH_SECONDS=$SECS BENCH_ROUNDS=$ROUNDS BENCH_WARMUP=$WARMUP BENCH_STORAGE_ROWS=$NROWS BENCH_REPLAY_KEYS=$REPLAY_KEYS BENCH_PERF_SECONDS=$PERF_SECS BENCH_WAL_CALLS=$WAL_CALLS BENCH_PRELOAD=$PRELOAD BENCH_EXTRA=$EXTRA${BENCH_GROUP:+ BENCH_GROUP=$GROUP}${ONLY:+ BENCH_VARIANTS='$ONLY'}${BENCH_PERF_VARIANTS:+ BENCH_PERF_VARIANTS='$PERF_VARIANTS'}${REV:+ BENCH_REV=$REV}${BENCH_BUILD:+ BENCH_BUILD=$BUILD}${BENCH_PORT:+ BENCH_PORT=$PORT}${PGBIN_SET:+ PGBIN=$PGBIN} bash bench/run.sh"
PGB_OPTS=(-n -M prepared -c "$CLIENTS" -j "$THREADS")

OUT=$LATEST
export PG_CONFIG=$PGBIN/pg_config
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

# ---------------------------------------------------------------- variants
# message group (idempotency.messages) and key group (idempotency.keys), in
# the order they are interleaved in a round; *_EXTRA only with BENCH_EXTRA=1
# or when named in BENCH_VARIANTS
MSG_ALL=(plain_insert plain_func idem_p2 idem_p24 idem_p48 idem_batch idem_batch24 plain_batch)
MSG_EXTRA=" idem_batch24 plain_batch "
KEY_ALL=(keys_raw keys_plpgsql keys_idem replay_plpgsql replay_idem)
# The round-trip floors: statements that do no work, with the shape of a
# workload (floor_stmt: one statement, as consume and replay; floor_txn:
# BEGIN, two statements, COMMIT, as claim + complete).  A floor is measured,
# in every round like the others, when both sides of a pair it is the floor
# of are (FLOOR_PAIRS: floor ext raw), or when BENCH_VARIANTS names it.
FLOOR_ALL=(floor_stmt floor_txn)
FLOOR_PAIRS=("floor_stmt idem_p2 plain_insert" "floor_txn keys_idem keys_raw"
             "floor_stmt replay_idem replay_plpgsql")
EXT_MSG=" idem_p2 idem_p24 idem_p48 idem_batch idem_batch24 "   # need the extension
EXT_KEY=" keys_idem replay_idem "                                 # need idem_claim/idem_complete
case $GROUP in
    all)      CAND=("${MSG_ALL[@]}" "${KEY_ALL[@]}") ;;
    messages) CAND=("${MSG_ALL[@]}") ;;
    keys)     CAND=("${KEY_ALL[@]}") ;;
    *)        die "BENCH_GROUP='$GROUP': use all, messages or keys" ;;
esac
for w in $ONLY; do
    case " ${MSG_ALL[*]} ${KEY_ALL[*]} ${FLOOR_ALL[*]} " in *" $w "*) ;;
        *) die "BENCH_VARIANTS: unknown variant '$w' (known: ${MSG_ALL[*]} ${KEY_ALL[*]} ${FLOOR_ALL[*]})" ;; esac
done
in_list() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }   # word list
any_of() {  # "list A" "list B" -> true if some word of A is in B
    local w; for w in $1; do in_list "$w" "$2" && return 0; done; return 1
}
SEL=" "
for v in "${CAND[@]}"; do
    if [ -n "$ONLY" ]; then
        in_list "$v" "$ONLY" && SEL+="$v "
    else
        case "$MSG_EXTRA" in *" $v "*) [ "$EXTRA" = 1 ] || continue ;; esac
        SEL+="$v "
    fi
done
for p in "${FLOOR_PAIRS[@]}"; do
    read -r fl ext rw <<<"$p"
    { in_list "$ext" "$SEL" && in_list "$rw" "$SEL"; } || in_list "$fl" "$ONLY" || continue
    in_list "$fl" "$SEL" || SEL+="$fl "
done
VARIANTS=()   # in round order: floor_stmt first, floor_txn before the key group
for v in floor_stmt "${MSG_ALL[@]}" floor_txn "${KEY_ALL[@]}"; do
    in_list "$v" "$SEL" && VARIANTS+=("$v")
done
[ ${#VARIANTS[@]} -gt 0 ] || die "BENCH_GROUP=$GROUP BENCH_VARIANTS='$ONLY' selects nothing"

for b in initdb pg_ctl psql pgbench; do
    [ -x "$PGBIN/$b" ] || die "$PGBIN/$b not found (set PGBIN)"
done

WORK=$(mktemp -d /tmp/idem-bench.XXXXXX)
chmod 755 "$WORK"
[ "$(id -u)" = 0 ] && chown "${CLUSTER_USER:-postgres}:" "$WORK"
C=$WORK/cluster
BG_PID=
PERF_PID=

# shellcheck disable=SC2317 # run by the EXIT trap (shellcheck misses it after a final exit)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$PERF_PID" ]; then kill "$PERF_PID" 2>/dev/null || true; fi
    if [ -n "$BG_PID" ]; then kill "$BG_PID" 2>/dev/null || true; fi
    cluster_stop_all
    if [ "$KEEP" = 1 ]; then
        note "temp dir kept: $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cp -r "$HERE/sql" "$WORK/sql"
[ "$(id -u)" = 0 ] && chown -R "${CLUSTER_USER:-postgres}:" "$WORK/sql"

# tps x ids per transaction = ids per second (ERR stays ERR)
mul()    { awk -v a="$1" -v b="$2" 'BEGIN{ if (a=="ERR" || a=="") print "ERR"; else printf "%.1f", a*b }'; }

# ---------------------------------------------------------------- build/install
SRCDESC="working tree at git $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
git -C "$REPO" diff --quiet HEAD -- src sql '*.sql' Makefile 2>/dev/null || SRCDESC+=" + uncommitted changes"
[ "$BUILD" = 0 ] && SRCDESC="installed extension (BENCH_BUILD=0; $SRCDESC)"
EXT_OK=1
EXT_WHY=
KEYS_OK=1
KEYS_WHY=
PROBE_NOTE=
EXTVER=
PKGLIBDIR=$("$PGBIN/pg_config" --pkglibdir)
if [ "$BUILD" = 1 ] || { [ "$BUILD" = auto ] && [ -w "$PKGLIBDIR" ]; }; then
    [ -w "$PKGLIBDIR" ] || die "BENCH_BUILD=1 but $PKGLIBDIR is not writable (make install needs root)"
    SRC=$REPO
    if [ -n "$REV" ]; then
        # build a committed revision, not the working tree others are editing
        SRC=$WORK/src
        mkdir -p "$SRC"
        git -C "$REPO" archive "$REV" | tar -x -C "$SRC" || die "git archive $REV failed"
        (cd "$SRC" && make PG_CONFIG="$PGBIN/pg_config" clean) >/dev/null 2>&1 || true   # no stale committed objects
        SRCDESC="git $(git -C "$REPO" rev-parse --short "$REV") (BENCH_REV=$REV)"
    fi
    note "building and installing the extension from $SRCDESC (make install) ..."
    if ! (cd "$SRC" && make PG_CONFIG="$PGBIN/pg_config" install) >"$WORK/build.log" 2>&1; then
        EXT_OK=0
        EXT_WHY="make install failed"
        note "---- make install failed; last lines:"; tail -n 20 "$WORK/build.log" >&2
        cp "$WORK/build.log" "$RESDIR/build-latest.log"
    fi
fi

# ---------------------------------------------------------------- cluster
note "starting a cluster in $WORK ..."
CONF=("synchronous_commit = off" "shared_buffers = 1GB" "max_wal_size = 4GB"
      "checkpoint_timeout = 30min" "log_min_messages = warning")
[ "$PRELOAD" = 1 ] && CONF+=("shared_preload_libraries = 'idempotency'")
cluster_start "$C" "$PORT" "${CONF[@]}" || die "the cluster did not start"

PGVER=$(qval postgres "SHOW server_version")

# ---------------------------------------------------------------- extension probe
if [ "$EXT_OK" = 1 ]; then
    qval postgres "CREATE DATABASE bench_probe" >/dev/null
    # the spec says consuming works before any maintenance; check that first
    if ! probe=$(q bench_probe -At -c "CREATE EXTENSION idempotency" \
                   -c "SELECT idem_consume_message('probe', 'x')" 2>&1); then
        if probe2=$(q bench_probe -At -c "CREATE EXTENSION IF NOT EXISTS idempotency" \
                      -c "SELECT * FROM idem_maintain()" -c "SELECT idem_consume_message('probe', 'x')" 2>&1); then
            PROBE_NOTE="idem_consume_message() failed before idem_maintain() had run: $(printf '%s' "$probe" | grep -m1 -E 'ERROR|FATAL')"
            note "!!! $PROBE_NOTE"
        else
            EXT_OK=0
            EXT_WHY="extension not usable: $(printf '%s\n%s' "$probe" "$probe2" | grep -m1 -E 'ERROR|FATAL' || printf '%s' "$probe" | head -n1)"
        fi
    fi
    [ "$EXT_OK" = 1 ] && EXTVER=$(qval bench_probe "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
    # the key ledger: one same-transaction claim + complete
    if [ "$EXT_OK" = 1 ] && ! probe=$(q bench_probe -At -c "SELECT * FROM idem_maintain()" \
            -c "BEGIN" -c "SELECT status FROM idem_claim('probe', '{}')" \
            -c "SELECT idem_complete('probe', 200)" -c "COMMIT" 2>&1); then
        KEYS_OK=0
        KEYS_WHY="key ledger not usable: $(printf '%s' "$probe" | grep -m1 -E 'ERROR|FATAL' || printf '%s' "$probe" | head -n1)"
    fi
    qval postgres "DROP DATABASE bench_probe" >/dev/null
fi
if [ "$EXT_OK" = 0 ]; then
    KEYS_OK=0
    KEYS_WHY=$EXT_WHY
    note "!!! $EXT_WHY -- running the baselines only; extension bars will be SKIP"
elif [ "$KEYS_OK" = 0 ] && any_of "${KEY_ALL[*]}" "${VARIANTS[*]}"; then
    note "!!! $KEYS_WHY -- key baselines only; key bars will be SKIP"
fi

# ---------------------------------------------------------------- databases
# every database starts fresh from template1 with the same state
declare -A LIVE=()

mkdb_plain() {   # name setup.sql
    qval postgres "CREATE DATABASE $1" >/dev/null
    q "$1" -f "$WORK/sql/$2" >/dev/null
}

live_parts() {   # db live_partitions*.sql table -> count of live partitions
    q "$1" -At -f "$WORK/sql/$2" 2>/dev/null \
        || qval "$1" "SELECT count(*) FROM idempotency.partitions WHERE table_name = '$3' AND upper_bound > now()" 2>/dev/null \
        || qval "$1" "SELECT count(*) FROM pg_partition_tree('idempotency.$3'::regclass) WHERE isleaf" 2>/dev/null \
        || echo "?"
}

mkdb_idem() {   # name partition_interval -- message ledger, message_ttl 1d
    local db=$1 iv=$2
    qval postgres "CREATE DATABASE $db" >/dev/null
    q postgres -c "ALTER DATABASE $db SET idempotency.message_ttl = '1d'" \
               -c "ALTER DATABASE $db SET idempotency.partition_interval = '$iv'" \
               -c "ALTER DATABASE $db SET idempotency.premake = 0" >/dev/null
    q "$db" -f "$WORK/sql/setup_idem.sql" >"$WORK/setup_$db.log" 2>&1 \
        || { cat "$WORK/setup_$db.log" >&2; die "extension setup failed in $db"; }
    LIVE[$db]=$(live_parts "$db" live_partitions.sql messages)
}

mkdb_keys() {   # name -- key ledger, key_ttl 1d / partition_interval 1d (the defaults): 1 lane, 2 live partitions
    local db=$1
    qval postgres "CREATE DATABASE $db" >/dev/null
    q postgres -c "ALTER DATABASE $db SET idempotency.key_ttl = '1d'" \
               -c "ALTER DATABASE $db SET idempotency.partition_interval = '1d'" \
               -c "ALTER DATABASE $db SET idempotency.premake = 0" >/dev/null
    q "$db" -f "$WORK/sql/setup_keys_idem.sql" >"$WORK/setup_$db.log" 2>&1 \
        || { cat "$WORK/setup_$db.log" >&2; die "key ledger setup failed in $db"; }
    LIVE[$db]=$(live_parts "$db" live_partitions_keys.sql keys)
}

mkdb_replay() {   # name -- REPLAY_KEYS completed keys in both designs, one database
    local db=$1
    if [ "$KEYS_OK" = 1 ]; then
        mkdb_keys "$db"
        q "$db" -f "$WORK/sql/setup_keys_plain.sql" >/dev/null
        q "$db" -c "SET bench.replay_keys = $REPLAY_KEYS" -f "$WORK/sql/replay_fill.sql" >"$WORK/fill_$db.log" 2>&1 \
            || { cat "$WORK/fill_$db.log" >&2; die "replay_fill.sql failed in $db"; }
    else
        # no usable key ledger: fill only the PL/pgSQL side (the pl_ statements of replay_fill.sql)
        mkdb_plain "$db" setup_keys_plain.sql
        { echo "SET bench.replay_keys = $REPLAY_KEYS;"
          awk 'BEGIN{RS=";"} /pl_claim|pl_complete/{print $0 ";"}' "$WORK/sql/replay_fill.sql"; } \
            | q "$db" >"$WORK/fill_$db.log" 2>&1 \
            || { cat "$WORK/fill_$db.log" >&2; die "replay fill (PL/pgSQL side) failed in $db"; }
    fi
    q "$db" -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
}

declare -A V_DB=( [plain_insert]=bench_plain [plain_func]=bench_plainfn [idem_p2]=bench_p2
                  [idem_p24]=bench_p24 [idem_p48]=bench_p48 [idem_batch]=bench_batch
                  [idem_batch24]=bench_batch24 [plain_batch]=bench_plainbatch
                  [keys_idem]=bench_keys [keys_raw]=bench_keysraw [keys_plpgsql]=bench_keyspl
                  [replay_idem]=bench_replay [replay_plpgsql]=bench_replay
                  [floor_stmt]=bench_floor [floor_txn]=bench_floor )
declare -A V_SQL=( [plain_insert]=plain_insert.sql [plain_func]=plain_func.sql [idem_p2]=idem_single.sql
                   [idem_p24]=idem_single.sql [idem_p48]=idem_single.sql [idem_batch]=idem_batch.sql
                   [idem_batch24]=idem_batch.sql [plain_batch]=plain_batch.sql
                   [keys_idem]=keys_idem.sql [keys_raw]=keys_raw.sql [keys_plpgsql]=keys_plpgsql.sql
                   [replay_idem]=replay_idem.sql [replay_plpgsql]=replay_plpgsql.sql
                   [floor_stmt]=floor_stmt.sql [floor_txn]=floor_txn.sql )
declare -A V_IDS=( [plain_insert]=1 [plain_func]=1 [idem_p2]=1 [idem_p24]=1 [idem_p48]=1 [idem_batch]=1000
                   [idem_batch24]=1000 [plain_batch]=1000
                   [keys_idem]=1 [keys_raw]=1 [keys_plpgsql]=1 [replay_idem]=1 [replay_plpgsql]=1
                   [floor_stmt]=1 [floor_txn]=1 )
declare -A V_LABEL=( [plain_insert]="(a) plain INSERT .. ON CONFLICT"
                     [plain_func]="(b) plain_consume() PL/pgSQL"
                     [idem_p2]="idem_consume_message, 1d/1d"
                     [idem_p24]="idem_consume_message, 1d/2h"
                     [idem_p48]="idem_consume_message, 1d/1h"
                     [idem_batch]="idem_consume_messages x1000"
                     [idem_batch24]="idem_consume_messages x1000, 1d/2h"
                     [plain_batch]="(extra) plain INSERT..SELECT x1000"
                     [keys_raw]="keys (a) raw SQL insert + update"
                     [keys_plpgsql]="keys (b) pl_claim+pl_complete"
                     [keys_idem]="keys idem_claim+idem_complete"
                     [replay_plpgsql]="replay (b) pl_claim, completed key"
                     [replay_idem]="replay idem_claim, completed key"
                     [floor_stmt]="floor: SELECT 1"
                     [floor_txn]="floor: BEGIN; SELECT 1 x2; COMMIT" )

# drop the variants whose extension side is not usable (their bars are SKIP)
keep=()
for v in "${VARIANTS[@]}"; do
    if in_list "$v" "$EXT_MSG" && [ "$EXT_OK" = 0 ]; then continue; fi
    if in_list "$v" "$EXT_KEY" && [ "$KEYS_OK" = 0 ]; then continue; fi
    keep+=("$v")
done
VARIANTS=("${keep[@]}")
[ ${#VARIANTS[@]} -gt 0 ] || die "nothing left to measure: ${KEYS_WHY:-$EXT_WHY}"
MSG_RUN=0; KEY_RUN=0   # which groups are in this run (their bars are printed)
any_of "${MSG_ALL[*]}" "${VARIANTS[*]}" && MSG_RUN=1
any_of "${KEY_ALL[*]}" "${VARIANTS[*]}" && KEY_RUN=1
if [ -n "$ONLY" ]; then   # a named extension variant that was dropped still belongs to its group
    any_of "$ONLY" "${MSG_ALL[*]}" && MSG_RUN=1
    any_of "$ONLY" "${KEY_ALL[*]}" && KEY_RUN=1
fi

note "creating databases ..."
declare -A MADE=()
for v in "${VARIANTS[@]}"; do
    db=${V_DB[$v]}
    [ -n "${MADE[$db]:-}" ] && continue
    MADE[$db]=1
    case $db in
        bench_plain|bench_plainfn|bench_plainbatch) mkdb_plain "$db" setup_plain.sql ;;
        bench_p2|bench_batch)     mkdb_idem "$db" 1d ;;   # 1 lane, 2 live partitions (batch: own db, 1000x the rows)
        bench_p24|bench_batch24)  mkdb_idem "$db" 2h ;;   # 12 lanes x 2 = 24 live partitions
        bench_p48)                mkdb_idem "$db" 1h ;;   # 24 lanes, ~48 live partitions ("hourly")
        bench_keys)               mkdb_keys "$db" ;;
        bench_keysraw|bench_keyspl) mkdb_plain "$db" setup_keys_plain.sql ;;
        bench_replay)             note "  filling bench_replay (replay_fill.sql: $REPLAY_KEYS completed keys per design) ..."
                                  mkdb_replay "$db" ;;
        bench_floor)              qval postgres "CREATE DATABASE $db" >/dev/null ;;   # the floors touch no table
        *) die "no set-up for database $db" ;;
    esac
done

# ---------------------------------------------------------------- pgbench runs
declare -A TPS=() CPU=()

# run_pgbench also leaves the server's CPU time per transaction of the run
# (bench/lib.sh, bench_cpu_us) in $WORK/cpu_last
run_pgbench() {   # variant tag pgbench-option... -> echoes tps or ERR
    local v=$1 tag=$2 out rc=0 tps failed t0 t1 ntx
    shift 2
    t0=$(bench_pm_ticks "$C")
    out=$(cluster_run "$C" pgbench "$@" -D replay_keys="$REPLAY_KEYS" \
             -f "$WORK/sql/${V_SQL[$v]}" "${V_DB[$v]}" 2>&1) || rc=$?
    t1=$(bench_pm_ticks "$C")
    ntx=$(printf '%s\n' "$out" | awk '/^number of transactions actually processed:/{print $6; exit}')
    bench_cpu_us "$t0" "$t1" "${ntx:-NA}" >"$WORK/cpu_last"
    {
        echo "=== $tag $v db=${V_DB[$v]} script=${V_SQL[$v]} rc=$rc server_cpu_us_per_tx=$(cat "$WORK/cpu_last")"
        echo "$out"
    } >>"$PGBLOG"
    tps=$(printf '%s\n' "$out" | awk '/^tps = /{print $3; exit}')
    failed=$(printf '%s\n' "$out" | awk -F': *' '/number of failed transactions/{split($2,a," "); print a[1]; exit}')
    if [ "$rc" != 0 ] || [ -z "$tps" ] || { [ -n "$failed" ] && [ "$failed" != 0 ]; }; then
        note "!!! $tag $v: pgbench rc=$rc failed=${failed:-?}:"
        printf '%s\n' "$out" | grep -E 'error|ERROR|abort' | head -n 5 >&2 || true
        echo ERR
    else
        echo "$tps"
    fi
}

NV=${#VARIANTS[@]}
NPERF=0
if [ "$PERF_SECS" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v perf >/dev/null 2>&1; then
    for v in $PERF_VARIANTS; do in_list "$v" "${VARIANTS[*]}" && NPERF=$((NPERF + 1)); done
fi
RUN_STORAGE=0
[ "$NROWS" -gt 0 ] && [ "$MSG_RUN" = 1 ] && RUN_STORAGE=1   # storage belongs to the message group
EST=$(( NV * (WARMUP + SECS * ROUNDS) + NPERF * (PERF_SECS + 6) ))
note "variants: ${VARIANTS[*]}"
note "measuring: $NV variants x $ROUNDS rounds x ${SECS}s (+ warm-up ${WARMUP}s each), $NPERF perf profiles; ~${EST}s of pgbench$([ "$WAL_CALLS" -gt 0 ] && echo ", then WAL per call")$([ "$RUN_STORAGE" = 1 ] && echo ", then storage")"

if [ "$WARMUP" -gt 0 ]; then
    for v in "${VARIANTS[@]}"; do run_pgbench "$v" warmup "${PGB_OPTS[@]}" -T "$WARMUP" >/dev/null; done
fi

raw "# raw: round variant database tps ids_per_second server_cpu_us_per_tx"
for r in $(seq 1 "$ROUNDS"); do
    for v in "${VARIANTS[@]}"; do
        t=$(run_pgbench "$v" "round$r" "${PGB_OPTS[@]}" -T "$SECS")
        TPS[$v,$r]=$t
        CPU[$v,$r]=NA
        [ "$t" = ERR ] || CPU[$v,$r]=$(cat "$WORK/cpu_last")
        ids=$(mul "$t" "${V_IDS[$v]}")
        raw "raw round=$r variant=$v db=${V_DB[$v]} tps=$t ids_per_s=$ids cpu_us=${CPU[$v,$r]}"
        note "  round $r  $(printf '%-14s %12s tps %14s ids/s %10s us cpu/tx' "$v" "$t" "$ids" "${CPU[$v,$r]}")"
    done
done

# ---------------------------------------------------------------- perf profile
# Profiles the pgbench backends of one variant in an extra run (not during the
# measured rounds, so the profiler does not skew the ratios).
perf_profile() {   # variant outfile
    local v=$1 out=$2 pids db=${V_DB[$1]}
    note "profiling $v ($db) for ${PERF_SECS}s with perf ..."
    cluster_run "$C" pgbench "${PGB_OPTS[@]}" -T $((PERF_SECS + 4)) -D replay_keys="$REPLAY_KEYS" \
        -f "$WORK/sql/${V_SQL[$v]}" "$db" >"$WORK/perf-pgbench.log" 2>&1 &
    BG_PID=$!
    sleep 2
    pids=$(qval postgres "SELECT string_agg(pid::text, ',') FROM pg_stat_activity
                           WHERE datname = '$db' AND application_name = 'pgbench'")
    if [ -n "$pids" ]; then
        perf record -q -g -o "$WORK/perf.data" -p "$pids" -- sleep "$PERF_SECS" >/dev/null 2>&1 || true
        {
            echo "# perf record -g -p <pgbench backends> during: pgbench ${PGB_OPTS[*]} -f bench/sql/${V_SQL[$v]} $db"
            echo "# ---- by shared object"
            perf report -i "$WORK/perf.data" --no-children --stdio -g none --sort dso --percent-limit 0.5 2>/dev/null | grep -v '^$' | sed -E 's/( +-)+ *$//'
            echo "# ---- top symbols (self time)"
            perf report -i "$WORK/perf.data" --no-children --stdio -g none --sort dso,symbol --percent-limit 0.3 2>/dev/null | grep -v '^$' | sed -E 's/( +-)+ *$//'
            echo "# ---- inclusive time (children: self + callees), entries >= 0.5%"
            perf report -i "$WORK/perf.data" --children --stdio -g none --sort dso,symbol --percent-limit 0.5 2>/dev/null | grep -v '^$' | sed -E 's/( +-)+ *$//'
            echo "# ---- with call chains (caller), entries >= 2%"
            perf report -i "$WORK/perf.data" --no-children --stdio -g caller,0.5,callee --percent-limit 2 2>/dev/null
        } >"$out" || true
        rm -f "$WORK/perf.data"
    else
        note "!!! no pgbench backends found for perf"
    fi
    wait "$BG_PID" || true
    BG_PID=
}

PERF_DONE=()
PERF_INCL_RE='idempotency\.so|plpgsql\.so|cryptohash|ExecInsert|ExecModifyTable|heap_insert|btinsert|_bt_first|_bt_search|index_getnext|LockAcquireExtended|LockRelease|table_open|relation_open|index_open|BuildIndexInfo|RelationGetIndexList|AcceptInvalidationMessages|CommitTransaction|StartTransaction|XLogInsert|ExecInitModifyTable|ExecInitNode|ExecutorStart|ExecutorEnd|PortalRun|exec_execute_message|pq_getbyte|secure_read|secure_write|ExecCheckIndexConstraints|ExecInsertIndexTuples|uuid|gen_random_uuid|pg_strong_random|ExecUpdate|heap_update|heap_hot_search|heapam_index_fetch|simple_heap|CatalogTuple|jsonb|sha256|SPI_|exec_stmt|plpgsql_exec'
if [ "$EXT_OK" = 1 ] && [ "$PERF_SECS" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v perf >/dev/null 2>&1; then
        rm -f "$RESDIR"/perf-*.txt
        for v in $PERF_VARIANTS; do
            in_list "$v" "${VARIANTS[*]}" || continue
            perf_profile "$v" "$RESDIR/perf-$v-latest.txt"
            [ -s "$RESDIR/perf-$v-latest.txt" ] && PERF_DONE+=("$v")
        done
    else
        note "(perf profile skipped: needs root and perf)"
    fi
fi

# ---------------------------------------------------------------- WAL per call
# Each variant alone, after the timed rounds: WAL_CALLS calls (ids, for the
# batches: WAL_CALLS / 1000 transactions) on one client with pgbench -t, and
# the WAL the cluster inserted meanwhile, pg_current_wal_insert_lsn() after
# minus before, divided by the calls.  Bytes do not depend on the load: one
# client on a busy machine measures them as well as any.  For this phase
# full_page_writes is off (the figure is the records a call writes, not the
# page images the first change of a page after a checkpoint adds, which
# depend on when checkpoints come) and autovacuum is off (running workers
# cancelled), so that nothing but the variant writes; both are reset
# afterwards.  The floors write nothing: their figure is the background's.
declare -A WAL=() WAL_N=()   # variant -> WAL bytes per call (per id for the batches) | calls
wal_phase() {
    local v n ids lsn0 lsn1 bytes t
    note "WAL per call: $WAL_CALLS calls of each variant, one client (full_page_writes and autovacuum off) ..."
    q postgres -c "ALTER SYSTEM SET full_page_writes = off" -c "ALTER SYSTEM SET autovacuum = off" \
               -c "SELECT pg_reload_conf()" >/dev/null
    for _ in $(seq 1 30); do   # the checkpointer applies full_page_writes on its reload; workers end on cancel
        sleep 1
        [ "$(qval postgres "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
                             WHERE backend_type = 'autovacuum worker'")" = 0 ] && break
    done
    for v in "${VARIANTS[@]}"; do
        ids=${V_IDS[$v]}
        n=$(( (WAL_CALLS + ids - 1) / ids ))
        WAL_N[$v]=$(( n * ids ))
        lsn0=$(qval postgres "SELECT pg_current_wal_insert_lsn()")
        t=$(run_pgbench "$v" wal -n -M prepared -c 1 -j 1 -t "$n")
        lsn1=$(qval postgres "SELECT pg_current_wal_insert_lsn()")
        bytes=$(qval postgres "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
        [ "$t" = ERR ] && bytes=ERR
        WAL[$v]=$(awk -v b="$bytes" -v n="${WAL_N[$v]}" 'BEGIN{ if (b == "ERR") print b; else printf "%.1f", b / n }')
        raw "raw wal variant=$v db=${V_DB[$v]} transactions=$n calls=${WAL_N[$v]} bytes=$bytes bytes_per_call=${WAL[$v]}"
        note "  wal  $(printf '%-14s %8s calls %10s bytes per call' "$v" "${WAL_N[$v]}" "${WAL[$v]}")"
    done
    q postgres -c "ALTER SYSTEM RESET full_page_writes" -c "ALTER SYSTEM RESET autovacuum" \
               -c "SELECT pg_reload_conf()" >/dev/null
}
[ "$WAL_CALLS" -gt 0 ] && wal_phase

# ---------------------------------------------------------------- storage
ST_PLAIN=; ST_IDEM=
if [ "$RUN_STORAGE" = 1 ]; then
    note "storage: $NROWS random UUID ids into the plain table and through idem_consume_messages ..."
    qval postgres "CREATE DATABASE bench_storage" >/dev/null
    q bench_storage -f "$WORK/sql/setup_plain.sql" >/dev/null
    s0=$(date +%s.%N)
    q bench_storage -c "SET bench.rows = $NROWS" -f "$WORK/sql/storage_plain.sql" >/dev/null
    s1=$(date +%s.%N)
    ST_PLAIN_SECS=$(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%.1f", b-a}')
    if [ "$EXT_OK" = 1 ]; then
        q postgres -c "ALTER DATABASE bench_storage SET idempotency.message_ttl = '1d'" \
                   -c "ALTER DATABASE bench_storage SET idempotency.partition_interval = '1d'" \
                   -c "ALTER DATABASE bench_storage SET idempotency.premake = 0" >/dev/null
        q bench_storage -c "CREATE EXTENSION idempotency" -c "SELECT * FROM idem_maintain()" >/dev/null
        s0=$(date +%s.%N)
        if q bench_storage -c "SET bench.rows = $NROWS" -f "$WORK/sql/storage_idem.sql" >"$WORK/storage_idem.log" 2>&1; then
            :
        else
            note "!!! storage load through idem_consume_messages failed:"; cat "$WORK/storage_idem.log" >&2
        fi
        s1=$(date +%s.%N)
        ST_IDEM_SECS=$(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%.1f", b-a}')
    fi
    q bench_storage -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
    while IFS='|' read -r kind rows total heap idx nrel; do
        raw "raw storage kind=$kind rows=$rows total_bytes=$total heap_bytes=$heap index_bytes=$idx relations=$nrel"
        case $kind in
            plain) ST_PLAIN="$rows|$total|$heap|$idx|$nrel" ;;
            idem)  ST_IDEM="$rows|$total|$heap|$idx|$nrel" ;;
        esac
    done < <(q bench_storage -At -F'|' -f "$WORK/sql/storage_sizes.sql" 2>/dev/null || true)
fi

# ---------------------------------------------------------------- report
med() {  # variant -> median tps over rounds (a failed round, ERR, has no value)
    local v=$1 r vals=()
    for r in $(seq 1 "$ROUNDS"); do vals+=("${TPS[$v,$r]:-ERR}"); done
    median "${vals[@]}"
}
ratio_rounds() {  # numvariant numfactor denvariant denfactor -> "median|r1 r2 r3"
    local nv=$1 nf=$2 dv=$3 df=$4 r list=()
    for r in $(seq 1 "$ROUNDS"); do
        list+=("$(div "$(mul "${TPS[$nv,$r]:-ERR}" "$nf")" "$(mul "${TPS[$dv,$r]:-ERR}" "$df")")")
    done
    printf '%s|%s' "$(median "${list[@]}")" "${list[*]}"
}
# The server-side cost above the round-trip floor: per round, the time per
# transaction (1/tps) above the floor's, the extension's over the raw SQL's:
# (1/tps_ext - 1/tps_floor) / (1/tps_raw - 1/tps_floor).  NA in a round
# where a side failed, NA(raw<=floor) where the raw SQL was no slower than
# the floor (the denominator is not positive: nothing above the floor to
# compare with); the median skips both.
floor_rounds() {  # extvariant rawvariant floorvariant -> "median|r1 r2 r3"
    local e=$1 w=$2 f=$3 r list=()
    for r in $(seq 1 "$ROUNDS"); do
        list+=("$(awk -v e="${TPS[$e,$r]:-ERR}" -v w="${TPS[$w,$r]:-ERR}" -v f="${TPS[$f,$r]:-ERR}" \
                      -v re="$_BENCH_NUM" 'BEGIN{
            if (e !~ re || w !~ re || f !~ re || e <= 0 || w <= 0 || f <= 0) { print "NA"; exit }
            d = 1 / w - 1 / f
            if (d <= 0) { print "NA(raw<=floor)"; exit }
            printf "%.4g\n", (1 / e - 1 / f) / d }')")
    done
    printf '%s|%s' "$(median "${list[@]}")" "${list[*]}"
}
cpu_med() {  # variant -> median server CPU per transaction over rounds (us)
    local v=$1 r vals=()
    for r in $(seq 1 "$ROUNDS"); do vals+=("${CPU[$v,$r]:-NA}"); done
    median "${vals[@]}"
}
# base / extension of the server's CPU per transaction: the ratio of the
# medians over rounds (above 1: the extension costs the server less), and
# the per-round ratios
cpu_ratio() {  # basevariant extvariant -> "ratio|r1 r2 ..."
    local b=$1 e=$2 r list=()
    for r in $(seq 1 "$ROUNDS"); do list+=("$(div "${CPU[$b,$r]:-NA}" "${CPU[$e,$r]:-NA}")"); done
    printf '%s|%s' "$(div "$(cpu_med "$b")" "$(cpu_med "$e")")" "${list[*]}"
}
usec() {  # tps -> microseconds per transaction (NA stays NA)
    awk -v t="$1" -v re="$_BENCH_NUM" 'BEGIN{ if (t !~ re || t <= 0) print "NA"; else printf "%.1f", 1e6 / t }'
}

GITREV=$SRCDESC
T1=$(date +%s)

say ""
say "== idempotency bench  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  $GITREV  PostgreSQL $PGVER  extension ${EXTVER:-n/a}"
say "command : $CMDLINE"
say "pgbench : pgbench ${PGB_OPTS[*]} -T $SECS -f bench/sql/<script>.sql <db>   ($ROUNDS rounds, variants interleaved, medians)"
say "server  : synchronous_commit=off shared_buffers=1GB max_wal_size=4GB checkpoint_timeout=30min$([ "$PRELOAD" = 1 ] && echo " shared_preload_libraries=idempotency")"
say "machine : $(nproc) cores, $(uname -r); absolute numbers are context only -- compare the ratios"
[ "$EXT_OK" = 0 ] && say "NOTE    : $EXT_WHY -- extension variants not measured"
[ "$EXT_OK" = 1 ] && [ "$KEYS_OK" = 0 ] && [ "$KEY_RUN" = 1 ] && say "NOTE    : $KEYS_WHY -- keys_idem and replay_idem not measured"
[ -n "${PROBE_NOTE:-}" ] && say "NOTE    : $PROBE_NOTE"
say ""
hdr=$(printf '%-34s %-13s %6s %7s %12s %14s %10s   %s' "variant" "database" "parts" "ids/tx" "median tps" "median ids/s" "cpu us/tx" "tps per round")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
for v in "${VARIANTS[@]}"; do
    m=$(med "$v")
    per=""
    for r in $(seq 1 "$ROUNDS"); do per+="$(awk -v x="${TPS[$v,$r]:-ERR}" 'BEGIN{if (x=="ERR") print x; else printf "%.0f", x}') "; done
    say "$(printf '%-34s %-13s %6s %7s %12s %14s %10s   %s' "${V_LABEL[$v]}" "${V_DB[$v]}" "${LIVE[${V_DB[$v]}]:--}" \
        "${V_IDS[$v]}" "$(awk -v x="$m" 'BEGIN{if (x=="NA") print x; else printf "%.0f", x}')" \
        "$(awk -v x="$m" -v k="${V_IDS[$v]}" 'BEGIN{if (x=="NA") print x; else printf "%.0f", x*k}')" "$(cpu_med "$v")" "$per")"
done
say "(cpu us/tx: the server's CPU time per transaction, user + system of its backends, median over rounds; bench/lib.sh, bench_cpu_us)"

[ "$MSG_RUN" = 1 ] && say "(parts = live partitions of idempotency.messages, upper > now(), measured after idem_maintain(); 1d/2h = message_ttl/partition_interval, premake 0)"
[ "$KEY_RUN" = 1 ] && say "(keys: parts = live partitions of idempotency.keys (key_ttl 1d, partition_interval 1d, premake 0); (a)/(b) databases have no extension; both replay variants share bench_replay, $REPLAY_KEYS completed keys per design)"
say ""

# bar LABEL "ratio|per-round ratios" [OP TARGET]: a bar of the issue
# (bench/lib.sh, check), or a figure for information without OP and TARGET
bar() {
    local label=$1 val=${2%%|*} per=${2#*|}
    [ "$per" = "$2" ] && per=""
    if [ $# -ge 4 ]; then
        check "$label" "$val" "$3" "$4" "${per:+rounds: $per}"
    else
        info "$label" "$val" "${per:+rounds: $per}"
    fi
}
aim_bar() {  # LABEL "ratio|per-round ratios" OP TARGET: an aim of the issue (bench/lib.sh, aim)
    local label=$1 val=${2%%|*} per=${2#*|}
    [ "$per" = "$2" ] && per=""
    aim "$label" "$val" "$3" "$4" "${per:+rounds: $per}"
}
hdr=$(printf '%-62s %10s  %-9s %-4s  %s' "bar (ratio = median over rounds of per-round ratios)" "ratio" "target" "result" "")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
if [ "$MSG_RUN" = 1 ]; then
bar "idem_consume_message (2 parts) / (a) plain INSERT"           "$(ratio_rounds idem_p2 1 plain_insert 1)" ">=" 1.10
bar "idem_consume_message (2 parts) / (b) plain_consume() plpgsql" "$(ratio_rounds idem_p2 1 plain_func 1)"   ">=" 1.15
bar "idem_consume_message 24 parts / 2 parts"                      "$(ratio_rounds idem_p24 1 idem_p2 1)"     ">=" 0.85
bar "idem_consume_message hourly (~48 parts) / 2 parts"            "$(ratio_rounds idem_p48 1 idem_p2 1)"
bar "idem_consume_messages x1000 ids/s / single-call ids/s"        "$(ratio_rounds idem_batch 1000 idem_p2 1)" ">=" 5
if [ "$EXTRA" = 1 ] || any_of "idem_batch24 plain_batch" "${VARIANTS[*]}"; then
bar "idem_consume_messages x1000 / plain INSERT..SELECT x1000"     "$(ratio_rounds idem_batch 1 plain_batch 1)"
bar "idem_consume_messages x1000: 24 parts / 2 parts"             "$(ratio_rounds idem_batch24 1 idem_batch 1)"
fi
bar "(b) plain_consume() / (a) plain INSERT"                       "$(ratio_rounds plain_func 1 plain_insert 1)"
aim_bar "above the floor: consume / (a) plain INSERT"             "$(floor_rounds idem_p2 plain_insert floor_stmt)" "<=" 0.8
fi

if [ "$RUN_STORAGE" = 1 ]; then
    IFS='|' read -r p_rows p_tot p_heap p_idx p_n <<<"${ST_PLAIN:-||||}"
    IFS='|' read -r i_rows i_tot i_heap i_idx i_n <<<"${ST_IDEM:-||||}"
    bar "storage bytes/id: extension / plain table" "$(div "${i_tot:-}" "${p_tot:-}")" "<=" 0.75
fi

if [ "$KEY_RUN" = 1 ]; then
bar "keys: claim+complete / (a) raw SQL insert + update"           "$(ratio_rounds keys_idem 1 keys_raw 1)"      ">=" 1.20
bar "keys: claim+complete / (b) PL/pgSQL pl_claim+pl_complete"     "$(ratio_rounds keys_idem 1 keys_plpgsql 1)"  ">=" 1.4
bar "keys: replay (completed key) / (b) PL/pgSQL replay"           "$(ratio_rounds replay_idem 1 replay_plpgsql 1)" ">=" 1.5
bar "keys: (b) PL/pgSQL design / (a) raw SQL"                      "$(ratio_rounds keys_plpgsql 1 keys_raw 1)"
aim_bar "above the floor: claim+complete / (a) raw SQL"           "$(floor_rounds keys_idem keys_raw floor_txn)" "<=" 0.8
aim_bar "above the floor: replay / (b) PL/pgSQL replay"           "$(floor_rounds replay_idem replay_plpgsql floor_stmt)" "<=" 0.8
fi

# The goals of issue 36, in the server's CPU per transaction: base /
# extension, the ratio of the medians over rounds (above 1: the extension
# costs the server less).  A pair is judged when both of its variants ran.
cpu_bar() {  # label base ext op target
    { in_list "$2" "${VARIANTS[*]}" && in_list "$3" "${VARIANTS[*]}"; } || return 0
    local r
    r=$(cpu_ratio "$2" "$3")
    check "$1" "${r%%|*}" "$4" "$5" "$(cpu_med "$2") / $(cpu_med "$3") us; rounds: ${r#*|}"
}
cpu_bar "cpu/tx: (a) plain INSERT / consume"                       plain_insert idem_p2 ">=" 1.25
cpu_bar "cpu/tx: (a) raw SQL insert + update / claim+complete"     keys_raw keys_idem ">=" 1.25
cpu_bar "cpu/tx: (b) PL/pgSQL replay / replay"                     replay_plpgsql replay_idem ">=" 1.5
cpu_bar "cpu/tx: plain INSERT..SELECT x1000 / batch x1000"         plain_batch idem_batch ">=" 1.0

# the floor pairs in time per transaction, for reading the aims
FLOOR_ROWS=()
[ "$MSG_RUN" = 1 ] && FLOOR_ROWS+=("consume idem_p2 plain_insert floor_stmt")
[ "$KEY_RUN" = 1 ] && FLOOR_ROWS+=("claim+complete keys_idem keys_raw floor_txn" "replay replay_idem replay_plpgsql floor_stmt")
if [ ${#FLOOR_ROWS[@]} -gt 0 ] && any_of "${FLOOR_ALL[*]}" "${VARIANTS[*]}"; then
    say ""
    say "time per transaction, 1e6 / median tps (us of the machine per transaction at $CLIENTS clients, not latency):"
    say "$(printf '  %-16s %10s %10s %10s %12s %12s %12s' workload floor raw ext "raw - floor" "ext - floor" "floor / raw")"
    for row in "${FLOOR_ROWS[@]}"; do
        read -r wl e w f <<<"$row"
        in_list "$f" "${VARIANTS[*]}" || continue
        uf=$(usec "$(med "$f")"); uw=$(usec "$(med "$w")"); ue=$(usec "$(med "$e")")
        say "$(printf '  %-16s %10s %10s %10s %12s %12s %12s' "$wl" "$uf" "$uw" "$ue" \
            "$(awk -v a="$uw" -v b="$uf" 'BEGIN{ if (a == "NA" || b == "NA") print "NA"; else printf "%.1f", a - b }')" \
            "$(awk -v a="$ue" -v b="$uf" 'BEGIN{ if (a == "NA" || b == "NA") print "NA"; else printf "%.1f", a - b }')" \
            "$(div "$uf" "$uw")")"
    done
fi

# WAL per call
if [ "$WAL_CALLS" -gt 0 ]; then
    say ""
    say "WAL per call (pg_current_wal_insert_lsn() after - before $WAL_CALLS calls of each variant on one client,"
    say "pgbench -t, after the rounds; full_page_writes and autovacuum off for the phase; batches: per id):"
    say "$(printf '  %-38s %8s %12s' variant calls "bytes/call")"
    for v in "${VARIANTS[@]}"; do
        say "$(printf '  %-38s %8s %12s' "${V_LABEL[$v]}" "${WAL_N[$v]:-}" "${WAL[$v]:-NA}")"
    done
    walr() { div "${WAL[$1]:-NA}" "${WAL[$2]:-NA}"; }   # NA where the denominator wrote nothing
    if [ "$MSG_RUN" = 1 ]; then
        info "WAL per call: consume / (a) plain INSERT"                  "$(walr idem_p2 plain_insert)"
        info "WAL per call: consume / (b) plain_consume() PL/pgSQL"      "$(walr idem_p2 plain_func)"
        info "WAL per id: batch x1000 / single consume"                  "$(walr idem_batch idem_p2)"
        if in_list plain_batch "${VARIANTS[*]}"; then
        info "WAL per id: batch x1000 / plain INSERT..SELECT x1000"      "$(walr idem_batch plain_batch)"
        fi
    fi
    if [ "$KEY_RUN" = 1 ]; then
        info "WAL per call: claim+complete / (a) raw SQL"                "$(walr keys_idem keys_raw)"
        info "WAL per call: claim+complete / (b) PL/pgSQL"               "$(walr keys_idem keys_plpgsql)"
        info "WAL per call: replay / (b) PL/pgSQL replay"                "$(walr replay_idem replay_plpgsql)" \
             "bytes per call: ${WAL[replay_idem]:-NA} vs ${WAL[replay_plpgsql]:-NA}"
    fi
fi

# storage details
if [ "$RUN_STORAGE" = 1 ]; then
    bpr() { awk -v b="$1" -v n="$NROWS" 'BEGIN{ if (b=="" || b+0==0) print "NA"; else printf "%.1f", b/n }'; }
    say ""
    say "storage ($NROWS random UUID ids; VACUUM ANALYZE + CHECKPOINT; pg_total_relation_size):"
    say "$(printf '  %-42s rows %8s  total %6s B/id (heap %6s, indexes %6s)  %s relations, load %ss' \
        "plain_messages" "${p_rows:-?}" "$(bpr "${p_tot:-}")" "$(bpr "${p_heap:-}")" "$(bpr "${p_idx:-}")" "${p_n:-?}" "${ST_PLAIN_SECS:-?}")"
    if [ "$EXT_OK" = 1 ]; then
        say "$(printf '  %-42s rows %8s  total %6s B/id (heap %6s, indexes %6s)  %s relations, load %ss' \
            "idempotency.messages (1d/1d, batches 10k)" "${i_rows:-?}" "$(bpr "${i_tot:-}")" "$(bpr "${i_heap:-}")" "$(bpr "${i_idx:-}")" "${i_n:-?}" "${ST_IDEM_SECS:-?}")"
        [ -n "${i_rows:-}" ] && [ -n "${ST_IDEM_SECS:-}" ] && \
            say "  load rate: extension $(div "$NROWS" "$ST_IDEM_SECS") ids/s (one session, batches of 10k), plain INSERT..SELECT $(div "$NROWS" "$ST_PLAIN_SECS") ids/s"
    fi
fi

for v in "${PERF_DONE[@]}"; do
    f=$RESDIR/perf-$v-latest.txt
    say ""
    say "perf: ${V_LABEL[$v]} ($v), ${PERF_SECS}s, self time; full report with call chains: $RESDIR/perf-$v-latest.txt"
    awk '/^# ---- by shared object/{f=1; next} /^# ----/{f=0} f && /%/' "$f" \
        | awk '{printf "%s%s %s", (NR>1 ? ", " : "  by object: "), $1, $2} END{print ""}' | tee -a "$LATEST"
    awk '/^# ---- top symbols/{f=1; next} /^# ----/{f=0} f && /%/' "$f" | head -n 20 | tee -a "$LATEST"
    say "  inclusive time (self + callees) of some functions on the path:"
    awk '/^# ---- inclusive/{f=1; next} /^# ----/{f=0} f && /%/' "$f" \
        | grep -E "$PERF_INCL_RE" | head -n 30 | tee -a "$LATEST"
done

say ""
say "elapsed: $((T1 - T0))s   raw figures: $LATEST   pgbench output: $PGBLOG"
exit "$(bench_status)"

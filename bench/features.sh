#!/usr/bin/env bash
# bench/features.sh -- what 0.4.0's new features cost, and whether calls that
# do not use them cost what they did in 0.3.1 (issue 23)
#
#   bash bench/features.sh                          # about 10 minutes
#   BENCH_BASE_PGBIN=/pg031/usr/lib/postgresql/15/bin bash bench/features.sh
#   BENCH_SMOKE=1 bash bench/features.sh            # seconds: does the script still work?
#
# Two throwaway clusters side by side, the same settings (bench/run.sh's:
# synchronous_commit = off, shared_buffers = 1GB, no preload unless
# BENCH_PRELOAD=1, which preloads both): "new", the extension installed for
# PGBIN (built and installed from this tree first, as bench/run.sh does),
# and "base", the release it is compared with: the extension installed for
# BENCH_BASE_PGBIN, or else BENCH_BASE_REV (v0.3.1) built from this
# repository's git into a private copy of PGBIN's PostgreSQL in the temp
# dir (PostgreSQL is relocatable).  A smoke run without BENCH_BASE_PGBIN
# uses the build under test as its base (it builds nothing; its figures
# mean nothing anyway).  Both sides are driven by the same pgbench.
#
# Throughput (pgbench -n -M prepared -c 4 -j 2, a new random key each
# transaction, request {"amount": 100, "currency": "eur"}, response 201;
# BENCH_ROUNDS rounds of BENCH_SECONDS each, every variant once per round
# in turn; the ratio of each bar is the median of its per-round ratios):
#
#   plain_base, plain_new   BEGIN; idem_claim; idem_complete; COMMIT
#                           (sql/keys_idem.sql, as bench/run.sh's keys_idem)
#   twophase_base, twophase_new
#                           idem_claim(..., lease => '1 min') and, in a
#                           second transaction, idem_complete(..., token)
#                           (sql/keys_2p.sql)
#   keep_new                the same with keep_request => true
#                           (sql/keys_2p_keep.sql)
#   headers_new             as plain_new, completed with response_headers
#                           (Location, Content-Type) and response_raw (9
#                           bytes) instead of a jsonb body
#                           (sql/keys_headers_raw.sql)
#
# Storage: BENCH_STORAGE_KEYS keys claimed and completed as plain_ does
# (sql/storage_keys.sql) in a fresh database of each cluster; VACUUM FULL
# (the completions leave dead versions behind), ANALYZE, CHECKPOINT; bytes
# per key of the key ledger's heap, its indexes and TOAST, and pgstattuple's
# tuple_len per key (sql/storage_keys_sizes.sql).
#
# Bars: plain and two-phase calls on new / base >= 0.95 (no regression on
# calls that use none of the features; the per-round noise is about
# +-10 %), heap bytes per key new / base <= 1 (rows that use none of the
# new columns do not grow).  The cost of keep_request and of headers + raw
# bytes is shown for information.
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SECONDS       seconds per measurement                    [15/1]
#   BENCH_ROUNDS        rounds of interleaved variants             [5/1]
#   BENCH_WARMUP        seconds of warm-up per variant (0: none)   [2/0]
#   BENCH_STORAGE_KEYS  keys per side for the storage bar          [200000/2000]
#   BENCH_VARIANTS      only these variants                        [all six]
#   BENCH_BASE_PGBIN    bin dir of a PostgreSQL with the base release installed
#   BENCH_BASE_REV      the base release to build without it       [v0.3.1]
#   BENCH_PRELOAD       1 = shared_preload_libraries on both sides [0]
#   FEATURES_PORT       port of "new"; "base" gets the next one    [54493]
#   BENCH_BUILD         auto|1|0: make install of this tree first  [auto]
#   PGBIN               PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_RESULTS       directory of the results files  [bench/results, bench/results/smoke]
#
# Output: a summary, also in features-latest.txt in BENCH_RESULTS with the
# raw per-round figures; pgbench's output in features-pgbench-latest.log.
# Exit status (bench/lib.sh, bench_status): 0 every bar PASS, 3 some bar
# FAIL or SKIP, 1 the run failed.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck disable=SC2034 # BENCH_NAME and BUILD are read by bench/lib.sh
BENCH_NAME=features.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
PGBIN=$(bench_pgbin)
export PG_CONFIG=$PGBIN/pg_config
SECS=${BENCH_SECONDS:-$(bench_size 15 1)}
ROUNDS=${BENCH_ROUNDS:-$(bench_size 5 1)}
WARMUP=${BENCH_WARMUP:-$(bench_size 2 0)}
NKEYS=${BENCH_STORAGE_KEYS:-$(bench_size 200000 2000)}
BASE_PGBIN=${BENCH_BASE_PGBIN:-}
BASE_REV=${BENCH_BASE_REV:-v0.3.1}
PRELOAD=${BENCH_PRELOAD:-0}
PORT=${FEATURES_PORT:-54493}
# shellcheck disable=SC2034
BUILD=${BENCH_BUILD:-auto}
RESDIR=$(bench_resdir)
mkdir -p "$RESDIR"
OUT=$RESDIR/features-latest.txt
PGBLOG=$RESDIR/features-pgbench-latest.log
: >"$OUT"
: >"$PGBLOG"
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

ALL_VARIANTS=(plain_base plain_new twophase_base twophase_new keep_new headers_new)
read -r -a VARIANTS <<<"${BENCH_VARIANTS:-${ALL_VARIANTS[*]}}"
declare -A V_SIDE=() V_SQL=()
for v in "${ALL_VARIANTS[@]}"; do
    V_SIDE[$v]=${v##*_}
    case $v in
        plain_*)    V_SQL[$v]=keys_idem.sql ;;
        twophase_*) V_SQL[$v]=keys_2p.sql ;;
        keep_*)     V_SQL[$v]=keys_2p_keep.sql ;;
        headers_*)  V_SQL[$v]=keys_headers_raw.sql ;;
    esac
done
for v in "${VARIANTS[@]}"; do
    [ -n "${V_SQL[$v]:-}" ] || die "unknown variant $v (names: ${ALL_VARIANTS[*]})"
done
for x in SECS ROUNDS; do
    case ${!x} in ''|*[!0-9]*|0) die "$x must be a positive integer" ;; esac
done
PRELOAD_CONF=
[ "$PRELOAD" != 1 ] || PRELOAD_CONF="shared_preload_libraries = 'idempotency'"
# shellcheck disable=SC2016 # the single quotes are part of the text
CMDLINE="BENCH_SECONDS=$SECS BENCH_ROUNDS=$ROUNDS BENCH_STORAGE_KEYS=$NKEYS${BENCH_VARIANTS:+ BENCH_VARIANTS='$BENCH_VARIANTS'}${PRELOAD_CONF:+ BENCH_PRELOAD=1} bash bench/features.sh"

T0=$(date +%s)
bench_build "$REPO"
CONF=("synchronous_commit = off" "shared_buffers = 1GB" "max_wal_size = 4GB"
      "checkpoint_timeout = 30min" "log_min_messages = warning")
[ -z "$PRELOAD_CONF" ] || CONF+=("$PRELOAD_CONF")
bench_cluster "$PORT" "${CONF[@]}"
C_NEW=$C
C_BASE=$WORK/base
cp -r "$HERE/sql" "$WORK/sql"
[ "$(id -u)" != 0 ] || chown -R "${CLUSTER_USER:-postgres}:" "$WORK/sql"

# ---------------------------------------------------------------- the base
# copy_pg PG_CONFIG DEST: a copy of that PostgreSQL's programs, libraries,
# shared files and headers under DEST, each at its own path below DEST, so
# that the relative layout (all that a relocated PostgreSQL needs) is kept
copy_pg() {
    local d
    for d in "$("$1" --bindir)" "$("$1" --pkglibdir)" "$("$1" --sharedir)" "$("$1" --includedir)"; do
        [ -e "$2$d" ] && continue
        mkdir -p "$2$(dirname "$d")"
        cp -a "$d" "$2$d"
    done
}
BASE_WHAT=
if [ -n "$BASE_PGBIN" ]; then
    BASE_WHAT="the extension installed for $BASE_PGBIN"
elif [ "${BENCH_SMOKE:-0}" = 1 ]; then
    BASE_PGBIN=$PGBIN
    BASE_WHAT="the build under test (a smoke run without BENCH_BASE_PGBIN)"
else
    if ! command -v git >/dev/null || ! git -C "$REPO" rev-parse -q --verify "$BASE_REV^{commit}" >/dev/null; then
        die "no git revision $BASE_REV in $REPO to build the base from; set BENCH_BASE_PGBIN"
    fi
    note "building $BASE_REV into a copy of $PGBIN's PostgreSQL ..."
    copy_pg "$PG_CONFIG" "$WORK/basepg"
    BASE_PGBIN=$WORK/basepg$("$PG_CONFIG" --bindir)
    mkdir -p "$WORK/basesrc"
    git -C "$REPO" archive "$BASE_REV" | tar -x -C "$WORK/basesrc"
    (cd "$WORK/basesrc" && make -s PG_CONFIG="$BASE_PGBIN/pg_config" install) >"$WORK/basebuild.log" 2>&1 ||
        { tail -n 20 "$WORK/basebuild.log" >&2; die "building $BASE_REV failed"; }
    BASE_WHAT="$BASE_REV ($(git -C "$REPO" rev-parse --short "$BASE_REV^{commit}")), built into a copy of $PGBIN's PostgreSQL"
fi
PG_CONFIG=$BASE_PGBIN/pg_config cluster_start "$C_BASE" $((PORT + 1)) "${CONF[@]}" ||
    die "the base cluster did not start"

declare -A SIDE_C=([new]=$C_NEW [base]=$C_BASE)
qs() { local side=$1; shift; C=${SIDE_C[$side]} q "$@"; }
qsval() { qs "$1" "$2" -At -c "$3"; }

declare -A EXTVER=() PGVER=()
for side in new base; do
    qs "$side" postgres -o /dev/null -c "CREATE EXTENSION idempotency" ||
        die "CREATE EXTENSION idempotency failed on the $side side"
    EXTVER[$side]=$(qsval "$side" postgres "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
    PGVER[$side]=$(qsval "$side" postgres "SHOW server_version")
    qs "$side" postgres -o /dev/null -c "DROP EXTENSION idempotency"
done

# one database per variant: the settings of bench/run.sh's key databases
# (1 lane, 2 live partitions), the extension, one probe claim + complete
mkdb() {   # side database
    qsval "$1" postgres "CREATE DATABASE $2" >/dev/null
    qs "$1" postgres -o /dev/null \
        -c "ALTER DATABASE $2 SET idempotency.key_ttl = '1d'" \
        -c "ALTER DATABASE $2 SET idempotency.partition_interval = '1d'" \
        -c "ALTER DATABASE $2 SET idempotency.premake = 0"
    qs "$1" "$2" -f "$WORK/sql/setup_keys_idem.sql" >"$WORK/setup_$1_$2.log" 2>&1 ||
        { cat "$WORK/setup_$1_$2.log" >&2; die "key ledger setup failed in $2 ($1)"; }
}
note "creating databases ..."
for v in "${VARIANTS[@]}"; do mkdb "${V_SIDE[$v]}" "b_$v"; done

# ---------------------------------------------------------------- throughput
PGB_OPTS=(-n -M prepared -c 4 -j 2)
declare -A TPS=()
run_pgbench() {   # variant seconds tag -> echoes tps or ERR
    local v=$1 secs=$2 tag=$3 out rc=0 tps failed
    out=$(cluster_run "${SIDE_C[${V_SIDE[$v]}]}" pgbench "${PGB_OPTS[@]}" -T "$secs" \
             -f "$WORK/sql/${V_SQL[$v]}" "b_$v" 2>&1) || rc=$?
    { echo "=== $tag $v side=${V_SIDE[$v]} script=${V_SQL[$v]} rc=$rc"; echo "$out"; } >>"$PGBLOG"
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
note "measuring: ${#VARIANTS[@]} variants x $ROUNDS rounds x ${SECS}s (+ warm-up ${WARMUP}s each)"
if [ "$WARMUP" -gt 0 ]; then
    for v in "${VARIANTS[@]}"; do run_pgbench "$v" "$WARMUP" warmup >/dev/null; done
fi
for r in $(seq 1 "$ROUNDS"); do
    for v in "${VARIANTS[@]}"; do
        t=$(run_pgbench "$v" "$SECS" "round$r")
        TPS[$v,$r]=$t
        raw "raw round=$r variant=$v side=${V_SIDE[$v]} tps=$t"
        note "  round $r  $(printf '%-14s %12s tps' "$v" "$t")"
    done
done

# ---------------------------------------------------------------- storage
declare -A ST=()
if [ "$NKEYS" -gt 0 ]; then
    for side in new base; do
        note "storage ($side): $NKEYS keys claimed and completed ..."
        mkdb "$side" b_storage
        qs "$side" b_storage -o /dev/null -c "CREATE EXTENSION IF NOT EXISTS pgstattuple" 2>/dev/null ||
            note "(no pgstattuple on the $side side: tuple bytes not measured)"
        qs "$side" b_storage -o /dev/null -c "SET bench.rows = $NKEYS" -f "$WORK/sql/storage_keys.sql" ||
            die "the storage fill failed ($side)"
        qs "$side" b_storage -o /dev/null -c "VACUUM FULL idempotency.keys" -c "ANALYZE" -c "CHECKPOINT"
        ST[$side]=$(qs "$side" b_storage -At -F'|' -f "$WORK/sql/storage_keys_sizes.sql")
        raw "raw storage side=$side extension=${EXTVER[$side]} rows|heap|indexes|toast|relations|tuple_len=${ST[$side]}"
    done
fi

# ---------------------------------------------------------------- report
in_run() { local x; for x in "${VARIANTS[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
med() {
    local v=$1 r vals=()
    for r in $(seq 1 "$ROUNDS"); do vals+=("${TPS[$v,$r]:-ERR}"); done
    median "${vals[@]}"
}
ratio_rounds() {  # num den -> "median|r1 r2 ..."
    local r list=()
    for r in $(seq 1 "$ROUNDS"); do list+=("$(div "${TPS[$1,$r]:-ERR}" "${TPS[$2,$r]:-ERR}")"); done
    printf '%s|%s' "$(median "${list[@]}")" "${list[*]}"
}
bar() {  # label "ratio|per-round" [op target]
    local label=$1 val=${2%%|*} per=${2#*|}
    [ "$per" = "$2" ] && per=""
    if [ $# -ge 4 ]; then check "$label" "$val" "$3" "$4" "${per:+rounds: $per}"
    else info "$label" "$val" "${per:+rounds: $per}"; fi
}

say ""
say "== bench/features.sh  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  PostgreSQL ${PGVER[new]}"
say "new     : extension ${EXTVER[new]}, installed for $PGBIN"
say "base    : extension ${EXTVER[base]}, $BASE_WHAT"
say "command : $CMDLINE"
say "pgbench : pgbench ${PGB_OPTS[*]} -T $SECS -f bench/sql/<script> <db>   ($ROUNDS rounds, variants interleaved, medians)"
say "servers : synchronous_commit=off shared_buffers=1GB max_wal_size=4GB checkpoint_timeout=30min${PRELOAD_CONF:+ $PRELOAD_CONF}, both sides"
say "machine : $(nproc) cores, $(uname -r); absolute numbers are context only -- compare the ratios"
say ""
hdr=$(printf '%-15s %-5s %-22s %12s   %s' "variant" "side" "script" "median tps" "tps per round")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
for v in "${VARIANTS[@]}"; do
    per=""
    for r in $(seq 1 "$ROUNDS"); do per+="$(awk -v x="${TPS[$v,$r]:-ERR}" 'BEGIN{if (x=="ERR") print x; else printf "%.0f", x}') "; done
    say "$(printf '%-15s %-5s %-22s %12s   %s' "$v" "${V_SIDE[$v]}" "${V_SQL[$v]}" \
        "$(awk -v x="$(med "$v")" 'BEGIN{if (x=="NA") print x; else printf "%.0f", x}')" "$per")"
done
say ""
hdr=$(printf '%-62s %10s  %-9s %-4s' "bar (ratio = median over rounds of per-round ratios)" "ratio" "target" "result")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
if in_run plain_new || in_run plain_base; then
    bar "same-transaction claim+complete: ${EXTVER[new]} / ${EXTVER[base]}" "$(ratio_rounds plain_new plain_base)" ">=" 0.95
fi
if in_run twophase_new || in_run twophase_base; then
    bar "two-phase claim, complete with token: ${EXTVER[new]} / ${EXTVER[base]}" "$(ratio_rounds twophase_new twophase_base)" ">=" 0.95
fi
if in_run keep_new; then
    bar "two-phase with keep_request / without (${EXTVER[new]})" "$(ratio_rounds keep_new twophase_new)"
fi
if in_run headers_new; then
    bar "complete with headers + raw bytes / jsonb body (${EXTVER[new]})" "$(ratio_rounds headers_new plain_new)"
fi

if [ "$NKEYS" -gt 0 ]; then
    per_key() { awk -v b="$1" -v n="$rows" 'BEGIN{ if (b == "" || b == "NA") print "NA"; else printf "%.2f", b / n }'; }
    declare -A HEAP=() IDX=() TOT=() TUP=()
    say ""
    say "storage: $NKEYS keys claimed and completed (same transaction, no new feature) per side, and the probe key;"
    say "VACUUM FULL, ANALYZE, CHECKPOINT; bytes per key of idempotency.keys (all its partitions)"
    for side in new base; do
        IFS='|' read -r rows heap idx toast nrel tup <<<"${ST[$side]}"
        # the keys of the fill and the probe of setup_keys_idem.sql
        [ "$rows" = $((NKEYS + 1)) ] || die "storage ($side): $rows keys in the ledger, expected $((NKEYS + 1))"
        HEAP[$side]=$(per_key "$heap"); IDX[$side]=$(per_key "$idx")
        TOT[$side]=$(per_key "$((heap + idx + toast))"); TUP[$side]=$(per_key "$tup")
        say "$(printf '  %-5s %-7s heap %6s  indexes %6s  toast %4s  total %6s B/key; live tuple bytes %6s B/key; %s relations' \
            "$side" "${EXTVER[$side]}" "${HEAP[$side]}" "${IDX[$side]}" "$(per_key "$toast")" "${TOT[$side]}" "${TUP[$side]}" "$nrel")"
        say "        ($rows rows: heap $heap, indexes $idx, toast $toast, live tuples ${tup} bytes)"
    done
    bar "storage: heap bytes per key ${EXTVER[new]} / ${EXTVER[base]}" "$(div "${HEAP[new]}" "${HEAP[base]}")" "<=" 1
    bar "storage: live tuple bytes per key ${EXTVER[new]} / ${EXTVER[base]}" "$(div "${TUP[new]}" "${TUP[base]}")"
    bar "storage: total bytes per key ${EXTVER[new]} / ${EXTVER[base]}" "$(div "${TOT[new]}" "${TOT[base]}")"
fi

say ""
say "elapsed: $(( $(date +%s) - T0 ))s   raw figures: $OUT   pgbench output: $PGBLOG"
exit "$(bench_status)"

#!/usr/bin/env bash
# bench/streams.sh -- records per second and bytes on disk of a stream
# consumer's dedup bookkeeping: positions (idem_advance, 0.4.0) against the
# per-message ledger (idem_consume_messages) and against a hand-written
# offsets table (issue 25)
#
#   bash bench/streams.sh                   # about 16 minutes
#   BENCH_SECONDS=5 BENCH_ROUNDS=2 STREAMS_RECORDS=1000000 bash bench/streams.sh
#   BENCH_SMOKE=1 bash bench/streams.sh     # seconds: does the script still work?
#
# One throwaway cluster (bench/run.sh's settings: synchronous_commit = off,
# shared_buffers = 1GB, autovacuum on, no preload), the extension installed
# for PGBIN (built and installed from this tree first when PostgreSQL's
# library directory is writable, as bench/run.sh does).
#
# Throughput (pgbench -n -M prepared -c 4 -j 2; BENCH_ROUNDS rounds of
# BENCH_SECONDS each, every variant once per round in turn; the ratio of
# each bar is the median of its per-round ratios).  Each client consumes
# its own partition of stream 'orders' (partition = :client_id, 0-3, as a
# consumer group's members own theirs), and each transaction does the
# dedup bookkeeping of the next B records of it and nothing else (no
# business write: the same on every side, it would only dilute the
# ratios).  Offsets only grow and batches never overlap: a client's
# transaction n covers offsets base + (n-1)B .. base + nB - 1, where base
# is larger in each pgbench run than any offset of the runs before.  For
# B in 1, 100 and 1000, one database per variant:
#
#   advance_B   SELECT ... FROM idem_advance('bench', 'orders', part,
#               first, last, 1): one call covering the B offsets, with the
#               generation (1) the partitions were assigned with at set-up
#               by idem_assign (sql/streams_advance.sql)
#   ledger_B    SELECT count(*) FROM idem_consume_messages('bench',
#               ARRAY[B ids]), each id 'p<part>-<offset>' (made in the
#               statement from generate_series); the ledger as bench/run.sh
#               measures it: message_ttl 1d, partition_interval 1d, 1 lane,
#               2 live partitions (sql/streams_ledger.sql)
#   offsets_B   INSERT INTO offsets (consumer, stream, part, next_offset)
#               VALUES (..., last + 1) ON CONFLICT (consumer, stream, part)
#               DO UPDATE SET next_offset = greatest(offsets.next_offset,
#               EXCLUDED.next_offset): the table applications hand-write
#               (sql/streams_offsets.sql, sql/streams_setup_offsets.sql).
#               It does less than idem_advance: it does not answer which
#               of the records to process, fences no zombie and keeps no
#               role apart
#
# Records per second = tps x B.
#
# Bytes on disk: STREAMS_RECORDS records through each design in a fresh
# database of each (sql/streams_load.sql: a server-side loop, one
# transaction per call; records in batches of STREAMS_LOAD_BATCH for
# idem_advance and the offsets table, of 10,000 for the ledger, as
# bench/run.sh fills it; batch j goes to partition j % 4 with its record
# numbers as offsets).  The sizes are taken after a tenth of the records
# and again after all of them, as the load left them (no VACUUM of ours:
# HOT pruning and autovacuum, as in production): pg_total_relation_size
# (heap + indexes + TOAST) of idempotency.positions, of the offsets table,
# and summed over the leaf partitions of idempotency.messages
# (sql/streams_sizes.sql).
#
# Goals: with batches of 100, idem_advance records/s >= 10 x the ledger's
# and >= the offsets table's (ratio >= 1); positions' bytes constant in the
# number of records: bytes after all records - bytes after a tenth <= one
# page (8192).  The other ratios, the ledger's bytes per record and the
# offsets table's growth are shown for information.
#
# Environment (defaults in brackets; [full/smoke] where BENCH_SMOKE=1 changes them):
#   BENCH_SECONDS       seconds per measurement                    [15/1]
#   BENCH_ROUNDS        rounds of interleaved variants             [5/1]
#   BENCH_WARMUP        seconds of warm-up per variant (0: none)   [2/0]
#   BENCH_VARIANTS      only these variants                        [all nine]
#   STREAMS_RECORDS     records per design for bytes on disk (0: skip;
#                       a multiple of 10)                          [10000000/20000]
#   STREAMS_LOAD_BATCH  records per idem_advance / upsert in that load [100]
#   STREAMS_PORT        server port (unix socket only)             [54501]
#   BENCH_BUILD         auto|1|0: make install of this tree first  [auto]
#   PGBIN               PostgreSQL binaries  [PG_CONFIG's bin dir, else /usr/lib/postgresql/15/bin]
#   BENCH_PG            PostgreSQL major to measure; one this machine's Debian
#                       does not package runs in its Debian root (test/lib/roots.sh) []
#   BENCH_RESULTS       directory of the results files  [bench/results, bench/results/smoke]
#
# Output: a summary, also in streams-latest.txt in BENCH_RESULTS with the
# raw per-round figures and sizes; pgbench's output in
# streams-pgbench-latest.log.  Exit status (bench/lib.sh, bench_status): 0
# every goal PASS, 3 some goal FAIL or SKIP, 1 the run failed.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck disable=SC2034 # BENCH_NAME and BUILD are read by bench/lib.sh
BENCH_NAME=streams.sh
# shellcheck source=bench/lib.sh
. "$HERE/lib.sh"
# BENCH_PG=NN: PostgreSQL NN, in its Debian root if this machine's Debian
# does not package it (bench/lib.sh, bench_in_root)
bench_in_root streams.sh
PGBIN=$(bench_pgbin)
export PG_CONFIG=$PGBIN/pg_config
SECS=${BENCH_SECONDS:-$(bench_size 15 1)}
ROUNDS=${BENCH_ROUNDS:-$(bench_size 5 1)}
WARMUP=${BENCH_WARMUP:-$(bench_size 2 0)}
NREC=${STREAMS_RECORDS:-$(bench_size 10000000 20000)}
LOAD_BATCH=${STREAMS_LOAD_BATCH:-100}
LEDGER_LOAD_BATCH=10000
PORT=${STREAMS_PORT:-54501}
# shellcheck disable=SC2034
BUILD=${BENCH_BUILD:-auto}
RESDIR=$(bench_resdir)
mkdir -p "$RESDIR"
OUT=$RESDIR/streams-latest.txt
PGBLOG=$RESDIR/streams-pgbench-latest.log
: >"$OUT"
: >"$PGBLOG"
# shellcheck source=test/lib/cluster.sh
. "$REPO/test/lib/cluster.sh"

BATCHES=(1 100 1000)
DESIGNS=(advance ledger offsets)
ALL_VARIANTS=()
for b in "${BATCHES[@]}"; do
    for d in "${DESIGNS[@]}"; do ALL_VARIANTS+=("${d}_$b"); done
done
read -r -a VARIANTS <<<"${BENCH_VARIANTS:-${ALL_VARIANTS[*]}}"
declare -A V_B=() V_DESIGN=() V_SQL=()
for v in "${ALL_VARIANTS[@]}"; do
    V_DESIGN[$v]=${v%_*}
    V_B[$v]=${v##*_}
    V_SQL[$v]=streams_${v%_*}.sql
done
for v in "${VARIANTS[@]}"; do
    [ -n "${V_SQL[$v]:-}" ] || die "unknown variant $v (names: ${ALL_VARIANTS[*]})"
done
for x in SECS ROUNDS LOAD_BATCH; do
    case ${!x} in ''|*[!0-9]*|0) die "$x must be a positive integer" ;; esac
done
case $NREC in ''|*[!0-9]*) die "STREAMS_RECORDS must be a number" ;; esac
[ $((NREC % 10)) = 0 ] || die "STREAMS_RECORDS must be a multiple of 10"
# shellcheck disable=SC2016 # the single quotes are part of the text
CMDLINE="BENCH_SECONDS=$SECS BENCH_ROUNDS=$ROUNDS STREAMS_RECORDS=$NREC${BENCH_VARIANTS:+ BENCH_VARIANTS='$BENCH_VARIANTS'} bash bench/streams.sh"

T0=$(date +%s)
bench_build "$REPO"
CONF=("synchronous_commit = off" "shared_buffers = 1GB" "max_wal_size = 4GB"
      "checkpoint_timeout = 30min" "log_min_messages = warning")
bench_cluster "$PORT" "${CONF[@]}"
cp -r "$HERE/sql" "$WORK/sql"
[ "$(id -u)" != 0 ] || chown -R "${CLUSTER_USER:-postgres}:" "$WORK/sql"

q postgres -o /dev/null -c "CREATE EXTENSION idempotency" ||
    die "CREATE EXTENSION idempotency failed"
EXTVER=$(qval postgres "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
PGVER=$(qval postgres "SHOW server_version")
q postgres -o /dev/null -c "DROP EXTENSION idempotency"
[ "$(qval postgres "SELECT count(*) FROM pg_available_extension_versions WHERE name = 'idempotency' AND version = '$EXTVER'")" = 1 ] ||
    die "no extension version $EXTVER"

# mkdb DB DESIGN: a database for one design, set up as sql/streams_setup_*.sql
mkdb() {
    qval postgres "CREATE DATABASE $1" >/dev/null
    if [ "$2" = offsets ]; then
        q "$1" -o /dev/null -f "$WORK/sql/streams_setup_offsets.sql" ||
            die "offsets table setup failed in $1"
    else
        q postgres -o /dev/null \
            -c "ALTER DATABASE $1 SET idempotency.message_ttl = '1d'" \
            -c "ALTER DATABASE $1 SET idempotency.partition_interval = '1d'" \
            -c "ALTER DATABASE $1 SET idempotency.premake = 0"
        q "$1" -o /dev/null -f "$WORK/sql/streams_setup_idem.sql" >"$WORK/setup_$1.log" 2>&1 ||
            { cat "$WORK/setup_$1.log" >&2; die "extension setup failed in $1 (idem_advance: 0.4.0 or later)"; }
    fi
}
note "creating databases ..."
for v in "${VARIANTS[@]}"; do mkdb "b_$v" "${V_DESIGN[$v]}"; done

# ---------------------------------------------------------------- throughput
PGB_OPTS=(-n -M prepared -c 4 -j 2)
# every pgbench run starts its offsets above those of the runs before
STEP=1000000000000
RUN_NO=0
declare -A TPS=() CPU=() LAST_BASE=()
# run_pgbench also leaves the server's CPU time per transaction of the run
# (bench/lib.sh, bench_cpu_us) in $WORK/cpu_last
run_pgbench() {   # variant seconds tag -> echoes tps or ERR
    local v=$1 secs=$2 tag=$3 out rc=0 tps failed t0 t1 ntx
    t0=$(bench_pm_ticks "$C")
    out=$(cluster_run "$C" pgbench "${PGB_OPTS[@]}" -T "$secs" \
             -D n=0 -D "base=$((RUN_NO * STEP))" -D "B=${V_B[$v]}" \
             -f "$WORK/sql/${V_SQL[$v]}" "b_$v" 2>&1) || rc=$?
    t1=$(bench_pm_ticks "$C")
    ntx=$(printf '%s\n' "$out" | awk '/^number of transactions actually processed:/{print $6; exit}')
    bench_cpu_us "$t0" "$t1" "${ntx:-NA}" >"$WORK/cpu_last"
    { echo "=== $tag $v B=${V_B[$v]} base=$((RUN_NO * STEP)) script=${V_SQL[$v]} rc=$rc server_cpu_us_per_tx=$(cat "$WORK/cpu_last")"; echo "$out"; } >>"$PGBLOG"
    tps=$(printf '%s\n' "$out" | awk '/^tps = /{print $3; exit}')
    printf '%s\n' "$out" | awk '/^number of transactions actually processed:/{print $6; exit}' >>"$WORK/processed_$v"
    failed=$(printf '%s\n' "$out" | awk -F': *' '/number of failed transactions/{split($2,a," "); print a[1]; exit}')
    if [ "$rc" != 0 ] || [ -z "$tps" ] || { [ -n "$failed" ] && [ "$failed" != 0 ]; }; then
        note "!!! $tag $v: pgbench rc=$rc failed=${failed:-?}:"
        printf '%s\n' "$out" | grep -E 'error|ERROR|abort' | head -n 5 >&2 || true
        echo ERR
    else
        echo "$tps"
    fi
}
# the run number is counted here, not in run_pgbench's subshell
next_run() { RUN_NO=$((RUN_NO + 1)); }
note "measuring: ${#VARIANTS[@]} variants x $ROUNDS rounds x ${SECS}s (+ warm-up ${WARMUP}s each)"
if [ "$WARMUP" -gt 0 ]; then
    for v in "${VARIANTS[@]}"; do next_run; run_pgbench "$v" "$WARMUP" warmup >/dev/null; done
fi
recs() { awk -v t="$1" -v b="$2" -v re="$_BENCH_NUM" 'BEGIN{ if (t !~ re) print "NA"; else printf "%.3f\n", t * b }'; }
for r in $(seq 1 "$ROUNDS"); do
    for v in "${VARIANTS[@]}"; do
        next_run
        LAST_BASE[$v]=$((RUN_NO * STEP))
        t=$(run_pgbench "$v" "$SECS" "round$r")
        TPS[$v,$r]=$t
        CPU[$v,$r]=NA
        [ "$t" = ERR ] || CPU[$v,$r]=$(cat "$WORK/cpu_last")
        raw "raw round=$r variant=$v batch=${V_B[$v]} tps=$t records_per_s=$(recs "$t" "${V_B[$v]}") cpu_us=${CPU[$v,$r]}"
        note "  round $r  $(printf '%-13s %12s tps %14s records/s %10s us cpu/tx' "$v" "$t" "$(recs "$t" "${V_B[$v]}")" "${CPU[$v,$r]}")"
    done
done

# Every transaction of every run did the bookkeeping of B new records:
# the positions (and the offsets table) are past the last run's offsets by
# B times the transactions it reported, and the ledger holds B ids per
# transaction of all runs (and the set-up's probe id)
for v in "${VARIANTS[@]}"; do
    B=${V_B[$v]}
    done_tx=$(tail -n 1 "$WORK/processed_$v")
    case ${V_DESIGN[$v]} in
        advance) got=$(qval "b_$v" "SELECT sum(greatest(next_offset - ${LAST_BASE[$v]}, 0) / $B) FROM idem_positions('bench', 'orders')")
                 want=$done_tx ;;
        offsets) got=$(qval "b_$v" "SELECT sum(greatest(next_offset - ${LAST_BASE[$v]}, 0) / $B) FROM offsets")
                 want=$done_tx ;;
        ledger)  got=$(qval "b_$v" "SELECT count(*) FROM idempotency.messages")
                 want=$(awk -v b="$B" '{ s += $1 } END { print s * b + 1 }' "$WORK/processed_$v") ;;
    esac
    [ "$got" = "$want" ] || die "$v: the bookkeeping does not add up ($got records where pgbench reported $want)"
done

# ---------------------------------------------------------------- bytes on disk
declare -A ST=()
if [ "$NREC" -gt 0 ]; then
    TENTH=$((NREC / 10))
    for d in "${DESIGNS[@]}"; do
        mkdb "s_$d" "$d"
        batch=$LOAD_BATCH
        [ "$d" != ledger ] || batch=$LEDGER_LOAD_BATCH
        from=0
        for upto in "$TENTH" "$NREC"; do
            note "bytes on disk ($d): records $from .. $((upto - 1)), $batch per call ..."
            t1=$(now)
            q "s_$d" -o /dev/null -c "SET bench.design = '$d'" -c "SET bench.first_record = $from" \
                -c "SET bench.end_record = $upto" -c "SET bench.batch = $batch" \
                -f "$WORK/sql/streams_load.sql" || die "the load of $d failed"
            secs=$(awk -v a="$t1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}')
            q "s_$d" -o /dev/null -c "CHECKPOINT"
            ST[$d,$upto]=$(q "s_$d" -At -F'|' -v "design=$d" -f "$WORK/sql/streams_sizes.sql") ||
                die "the sizes of $d could not be read"
            raw "raw storage design=$d records=$upto batch=$batch load_s=$secs rows|total|heap|indexes|relations=${ST[$d,$upto]}"
            from=$upto
        done
    done
fi

# ---------------------------------------------------------------- report
in_run() { local x; for x in "${VARIANTS[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
med_recs() {
    local v=$1 r vals=()
    for r in $(seq 1 "$ROUNDS"); do vals+=("$(recs "${TPS[$v,$r]:-ERR}" "${V_B[$v]}")"); done
    median "${vals[@]}"
}
ratio_rounds() {  # num den -> "median|r1 r2 ..." of records per second
    local r list=()
    for r in $(seq 1 "$ROUNDS"); do
        list+=("$(div "$(recs "${TPS[$1,$r]:-ERR}" "${V_B[$1]}")" "$(recs "${TPS[$2,$r]:-ERR}" "${V_B[$2]}")")")
    done
    printf '%s|%s' "$(median "${list[@]}")" "${list[*]}"
}
bar() {  # label "ratio|per-round" [op target]
    local label=$1 val=${2%%|*} per=${2#*|}
    [ "$per" = "$2" ] && per=""
    if [ $# -ge 4 ]; then check "$label" "$val" "$3" "$4" "${per:+rounds: $per}"
    else info "$label" "$val" "${per:+rounds: $per}"; fi
}
int() { awk -v x="$1" -v re="$_BENCH_NUM" 'BEGIN{ if (x !~ re) print "NA"; else printf "%.0f", x }'; }
cpu_med() {  # variant -> median server CPU per transaction over rounds (us)
    local v=$1 r vals=()
    for r in $(seq 1 "$ROUNDS"); do vals+=("${CPU[$v,$r]:-NA}"); done
    median "${vals[@]}"
}
# base / extension of the server's CPU per transaction: the ratio of the
# medians over rounds (above 1: the extension costs the server less), and
# the per-round ratios
cpu_ratio() {  # base ext -> "ratio|r1 r2 ..."
    local r list=()
    for r in $(seq 1 "$ROUNDS"); do list+=("$(div "${CPU[$1,$r]:-NA}" "${CPU[$2,$r]:-NA}")"); done
    printf '%s|%s' "$(div "$(cpu_med "$1")" "$(cpu_med "$2")")" "${list[*]}"
}

say ""
say "== bench/streams.sh  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  PostgreSQL $PGVER  extension $EXTVER"
say "command : $CMDLINE"
say "pgbench : pgbench ${PGB_OPTS[*]} -T $SECS -D n=0 -D base=<run> -D B=<batch> -f bench/sql/streams_<design>.sql <db>"
say "          ($ROUNDS rounds, variants interleaved, medians; one partition per client, offsets only grow)"
say "server  : synchronous_commit=off shared_buffers=1GB max_wal_size=4GB checkpoint_timeout=30min, autovacuum on"
say "machine : $(nproc) cores, $(uname -r); absolute numbers are context only -- compare the ratios"
say ""
hdr=$(printf '%-13s %5s %11s %14s %10s   %s' "variant" "batch" "median tps" "records/s" "cpu us/tx" "records/s per round")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
for v in "${VARIANTS[@]}"; do
    per=""
    for r in $(seq 1 "$ROUNDS"); do per+="$(int "$(recs "${TPS[$v,$r]:-ERR}" "${V_B[$v]}")") "; done
    tl=()
    for r in $(seq 1 "$ROUNDS"); do tl+=("${TPS[$v,$r]:-ERR}"); done
    say "$(printf '%-13s %5s %11s %14s %10s   %s' "$v" "${V_B[$v]}" "$(int "$(median "${tl[@]}")")" \
        "$(int "$(med_recs "$v")")" "$(cpu_med "$v")" "${per% }")"
done
say "(cpu us/tx: the server's CPU time per transaction, user + system of its backends, median over rounds; bench/lib.sh, bench_cpu_us)"
say ""
hdr=$(printf '%-62s %10s  %-9s %-4s' "goal (records/s ratio = median over rounds of per-round ratios)" "ratio" "target" "result")
say "$hdr"
say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
pair() {  # num den [op target]: a bar when either variant ran
    if in_run "$1" || in_run "$2"; then bar "$1 / $2" "$(ratio_rounds "$1" "$2")" "${@:3}"; fi
}
pair advance_100 ledger_100 ">=" 10
pair advance_100 offsets_100 ">=" 1
pair advance_1 ledger_1
pair advance_1000 ledger_1000
pair advance_1 offsets_1
pair advance_1000 offsets_1000
pair advance_1000 advance_1
pair ledger_1000 ledger_1
pair offsets_1000 offsets_1
# issue 36: the server's CPU per transaction, base / extension (ratio of the
# medians; above 1: the extension costs the server less)
cpu_pair() {  # base ext [op target]
    if in_run "$1" && in_run "$2"; then
        local r
        r=$(cpu_ratio "$1" "$2")
        if [ $# -ge 4 ]; then
            check "cpu/tx: $1 / $2" "${r%%|*}" "$3" "$4" "$(cpu_med "$1") / $(cpu_med "$2") us; rounds: ${r#*|}"
        else
            info "cpu/tx: $1 / $2" "${r%%|*}" "$(cpu_med "$1") / $(cpu_med "$2") us; rounds: ${r#*|}"
        fi
    fi
}
cpu_pair offsets_100 advance_100 ">=" 1
cpu_pair offsets_1 advance_1
cpu_pair offsets_1000 advance_1000
cpu_pair ledger_100 advance_100

if [ "$NREC" -gt 0 ]; then
    say ""
    say "bytes on disk: $NREC records per design (a tenth, then the rest), 4 partitions; heap + indexes + TOAST"
    say "as the load left them (idem_advance and upserts: $LOAD_BATCH records per call; ledger: $LEDGER_LOAD_BATCH ids per call)"
    hdr=$(printf '%-9s %12s %12s %14s %12s %12s %10s %16s' "design" "records" "rows" "total bytes" "heap" "indexes" "tables" "bytes per record")
    say "$hdr"
    say "$(printf '%s' "$hdr" | tr -c '\n' '-')"
    declare -A TOT=()
    for d in "${DESIGNS[@]}"; do
        for upto in "$TENTH" "$NREC"; do
            IFS='|' read -r rows tot heap idx nrel <<<"${ST[$d,$upto]}"
            TOT[$d,$upto]=$tot
            case $d in
                ledger) want=$((upto + 1)) ;;   # and the probe id of the set-up
                *)      want=4 ;;               # one row per partition
            esac
            [ "$rows" = "$want" ] || die "bytes on disk ($d): $rows rows after $upto records, expected $want"
            say "$(printf '%-9s %12s %12s %14s %12s %12s %10s %16s' "$d" "$upto" "$rows" "$tot" "$heap" "$idx" "$nrel" \
                "$(awk -v b="$tot" -v n="$upto" 'BEGIN{printf "%.2f", b / n}')")"
        done
    done
    say ""
    check "positions: bytes after $NREC records - after $TENTH" \
        "$((TOT[advance,$NREC] - TOT[advance,$TENTH]))" "<=" 8192 "(one page)"
    info "offsets table: bytes after $NREC records - after $TENTH" \
        "$((TOT[offsets,$NREC] - TOT[offsets,$TENTH]))"
    info "ledger: bytes per record after $NREC records" \
        "$(awk -v b="${TOT[ledger,$NREC]}" -v n="$NREC" 'BEGIN{printf "%.2f", b / n}')"
    info "ledger / positions: bytes after $NREC records" \
        "$(div "${TOT[ledger,$NREC]}" "${TOT[advance,$NREC]}")"
fi

say ""
say "elapsed: $(( $(date +%s) - T0 ))s   raw figures: $OUT   pgbench output: $PGBLOG"
exit "$(bench_status)"

# shellcheck shell=bash
#
# bench/lib.sh -- output, statistics, verdicts and cluster helpers shared by
# the bench scripts.  Source it first thing after setting BENCH_NAME (the
# script's name, for messages); it defines functions, and unsets PGAPPNAME
# (below).  OUT (the results file) must be set before anything is written
# to it.
#
# ---------------------------------------------------------------- output
#   say TEXT       print and append to $OUT
#   raw TEXT       append to $OUT only
#   note TEXT      print to stderr
#   die TEXT       note, record the failure in $OUT, exit 1
#   now            the clock, seconds since the epoch with nanoseconds
#   plus A B       A + B, 6 decimals
#   sleep_until T  wait until clock time T (measurement windows and samples
#                  are defined by time; there is no condition to poll for)

say()  { printf '%s\n' "$*" | tee -a "$OUT"; }
raw()  { printf '%s\n' "$*" >>"$OUT"; }
note() { printf '%s\n' "$*" >&2; }
die()  {
    note "$BENCH_NAME: $*"
    [ -z "${OUT:-}" ] || raw "run failed: $*"
    exit 1
}
now()  { date +%s.%N; }
plus() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a + b}'; }
sleep_until() {
    local d
    d=$(awk -v t="$1" -v n="$(now)" 'BEGIN{ d = t - n; printf "%.3f", (d > 0 ? d : 0) }')
    sleep "$d"
}

# ---------------------------------------------------------------- statistics
# A figure that could not be measured is NA (ERR where a pgbench run
# failed, or empty); every helper here takes those as "no value" and
# passes NA on, so that a missing figure is never read as 0.
#
#   median X...    the median of the numbers among X (NA if none): the
#                  middle one as given, or the mean of the two middle ones
#                  with 6 significant digits
#   div A B        A / B with 4 significant digits (NA if either has no
#                  value, or B is 0); ratios from 10^-4 (WAL of a drop vs a
#                  DELETE) to 10^2 keep their precision
#   pct P          the P-quantile (0 < P <= 1) of the numbers on stdin, by
#                  nearest rank (the smallest value with at least P of them
#                  at or below it; P = 1 is the maximum), NA if none

# a number: optional sign, digits with an optional fraction, optional exponent
_BENCH_NUM='^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'

median() {
    printf '%s\n' "$@" | awk -v re="$_BENCH_NUM" '$0 ~ re' | sort -g |
        awk '{ a[NR] = $1 }
             END { if (NR == 0) print "NA"
                   else if (NR % 2) print a[(NR + 1) / 2]
                   else printf "%.6g\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
div() {
    awk -v a="$1" -v b="$2" -v re="$_BENCH_NUM" 'BEGIN{
        if (a !~ re || b !~ re || b + 0 == 0) print "NA"; else printf "%.4g\n", a / b }'
}
pct() {
    awk -v re="$_BENCH_NUM" '$1 ~ re { print $1 }' | sort -g |
        awk -v p="$1" '{ x[NR] = $1 }
            END { if (NR == 0) { print "NA"; exit }
                  i = int(p * NR); if (i < p * NR) i++; if (i < 1) i = 1
                  print x[i] }'
}

# ---------------------------------------------------------------- verdicts
# One rule for every bar, goal and bound of every bench script:
#
#   verdict VALUE OP TARGET
#       PASS if VALUE is a number and "VALUE OP TARGET" holds (OP: >=, <=
#       or =), FAIL if it is a number and it does not, SKIP if VALUE has no
#       value (NA, ERR, empty: not measured).  A run passes only if every
#       required verdict is PASS: SKIP does not pass, because a figure that
#       was not measured cannot have met its goal.
#   check LABEL VALUE OP TARGET [NOTE]
#       a required verdict, printed as a line of the report (say) and
#       counted for bench_status
#   info LABEL VALUE [NOTE]
#       a figure printed in the same layout, not judged
#   aim LABEL VALUE OP TARGET [NOTE]
#       an aim (a figure an issue would like, short of a goal): judged by
#       the same rule and printed in the same layout, its note starting
#       with "aim", and not counted for bench_status
#   bench_judge VERDICT
#       count a verdict computed with "verdict" (for a script that prints
#       its own table)
#   bench_status
#       the exit status of a run that got to its end: 0 if every counted
#       verdict was PASS, else 3 (1 is left to die: the run itself failed).
#       With BENCH_SMOKE=1 the figures come from runs of a second or two and
#       mean nothing: 0 whatever they are.  A script ends with
#       exit "$(bench_status)".

BENCH_NOT_PASSED=0

verdict() {
    awk -v v="$1" -v op="$2" -v t="$3" -v re="$_BENCH_NUM" 'BEGIN{
        if (v !~ re) { print "SKIP"; exit }
        if (op == ">=")      ok = (v + 0 >= t + 0)
        else if (op == "<=") ok = (v + 0 <= t + 0)
        else if (op == "=")  ok = (v + 0 == t + 0)
        else { print "verdict: unknown operator " op > "/dev/stderr"; exit 2 }
        print (ok ? "PASS" : "FAIL") }'
}
bench_judge() {
    [ "$1" = PASS ] || BENCH_NOT_PASSED=$((BENCH_NOT_PASSED + 1))
}
# the layout of check and info lines: label, value, operator and target, verdict, note
_bench_line() {
    local line
    line=$(printf '%-62s %10s  %-2s %-6s %-4s  %s' "$1" "$2" "$3" "$4" "$5" "$6")
    say "${line%"${line##*[! ]}"}"
}
check() {
    local v
    v=$(verdict "$2" "$3" "$4") || die "check '$1': bad operator '$3'"
    bench_judge "$v"
    _bench_line "$1" "$2" "$3" "$4" "$v" "${5:-}"
}
info() {
    _bench_line "$1" "$2" "" "" info "${3:-}"
}
aim() {
    local v
    v=$(verdict "$2" "$3" "$4") || die "aim '$1': bad operator '$3'"
    _bench_line "$1" "$2" "$3" "$4" "$v" "aim${5:+; $5}"
}
bench_status() {
    if [ "$BENCH_NOT_PASSED" = 0 ]; then
        echo 0
    elif [ "${BENCH_SMOKE:-0}" = 1 ]; then
        note "$BENCH_NAME: smoke run: $BENCH_NOT_PASSED goals not met (not judged in a smoke run)"
        echo 0
    else
        echo 3
    fi
}

# ---------------------------------------------------------------- server CPU
# The server's CPU time per transaction of a pgbench run, beside its
# throughput.  On a machine with few cores the client and the kernel take
# a share of every transaction that both sides of a ratio pay alike, which
# pulls throughput ratios towards 1; the CPU time of the backends that ran
# the transactions is what the server itself spent.  A process's CPU time
# is added to its parent's cutime and cstime (/proc/PID/stat, fields 16 and
# 17) when the parent reaps it: the postmaster's grow by what every backend
# used, once it has exited.  So a run's figure is the growth of the
# postmaster's over the run, from before pgbench connects to after its
# backends have been reaped, divided by the transactions pgbench made: it
# counts each backend's start and exit too (4 per run), and an autovacuum
# worker that exited meanwhile, which are small beside a run of seconds.
# Resolution: a clock tick (10 ms) over the whole run.
#
#   bench_pm_ticks DIR   the cutime + cstime of the postmaster of the cluster
#                        in DIR (test/lib/cluster.sh), in clock ticks, once
#                        none of its children serves a connection or waits to
#                        be reaped (at most 10 s; the figure then may miss a
#                        backend, and NA is printed instead)
#   bench_cpu_us T0 T1 N microseconds of server CPU per transaction: ticks T0
#                        to T1 over N transactions (NA if any is missing)

bench_pm_ticks() {
    local pm i
    pm=$(head -n 1 "$1/data/postmaster.pid" 2>/dev/null) || { echo NA; return 0; }
    for i in $(seq 1 500); do
        # a backend's process title names its client ([local] on a unix
        # socket); a child reaped not yet is a zombie
        if ! ps --ppid "$pm" -o stat=,args= 2>/dev/null |
                awk '$1 ~ /^Z/ || /\[local\]/ { f = 1 } END { exit !f }'; then
            awk '{ sub(/^.*\) /, ""); print $14 + $15 }' "/proc/$pm/stat" 2>/dev/null || echo NA
            return 0
        fi
        sleep 0.02
    done
    echo NA
}
bench_cpu_us() {
    awk -v a="$1" -v b="$2" -v n="$3" -v hz="$(getconf CLK_TCK)" -v re="$_BENCH_NUM" 'BEGIN{
        if (a !~ re || b !~ re || n !~ re || n + 0 <= 0) print "NA"
        else printf "%.4g\n", (b - a) * 1e6 / hz / n }'
}

# ---------------------------------------------------------------- settings
# Every script takes its PostgreSQL from PGBIN, its sizes and times from its
# own variables (see each script's header) and writes to BENCH_RESULTS:
#
#   bench_pgbin        PostgreSQL's bin directory: PGBIN if set, else the
#                      bin directory of PG_CONFIG if set (the server PGXS
#                      builds for), else Debian's PostgreSQL 15
#   bench_size FULL SMOKE
#                      the default of a size or time setting: FULL, or
#                      SMOKE when BENCH_SMOKE=1 (a run of seconds that only
#                      shows the script works; a setting given explicitly
#                      still wins)
#   bench_resdir       where the results go: BENCH_RESULTS if set, else
#                      bench/results, or bench/results/smoke for a smoke run
#                      (so that it never overwrites the committed figures)

bench_pgbin() {
    if [ -n "${PGBIN:-}" ]; then
        printf '%s\n' "$PGBIN"
    elif [ -n "${PG_CONFIG:-}" ]; then
        "$PG_CONFIG" --bindir
    else
        printf '%s\n' /usr/lib/postgresql/15/bin
    fi
}
bench_size() {
    if [ "${BENCH_SMOKE:-0}" = 1 ]; then printf '%s\n' "$2"; else printf '%s\n' "$1"; fi
}
bench_resdir() {
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    if [ -n "${BENCH_RESULTS:-}" ]; then
        printf '%s\n' "$BENCH_RESULTS"
    elif [ "${BENCH_SMOKE:-0}" = 1 ]; then
        printf '%s\n' "$here/results/smoke"
    else
        printf '%s\n' "$here/results"
    fi
}

# ---------------------------------------------------------------- another major
#   bench_in_root SCRIPT
#                      BENCH_PG=NN runs a script against PostgreSQL NN: on
#                      this machine if its Debian packages NN (then this
#                      returns and the script goes on with that major's
#                      PGBIN), otherwise inside the Debian root file system
#                      of test/lib/roots.sh (made if missing; as root) on a
#                      copy of this tree without its results; the run's
#                      results are copied back to bench_resdir and the
#                      caller exits with the run's status.
bench_in_root() {
    local script=$1 repo R rc resdir inner
    [ -n "${BENCH_PG:-}" ] || return 0
    if [ -x "/usr/lib/postgresql/$BENCH_PG/bin/pgbench" ]; then
        PGBIN=${PGBIN:-/usr/lib/postgresql/$BENCH_PG/bin}
        return 0
    fi
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    # shellcheck source=test/lib/deps.sh
    . "$repo/test/lib/deps.sh"
    # shellcheck source=test/lib/roots.sh
    . "$repo/test/lib/roots.sh"
    [ "$(id -u)" = 0 ] || { echo "$script: BENCH_PG=$BENCH_PG needs root (a root file system)" >&2; exit 1; }
    root_ensure "$BENCH_PG" || exit 1
    R=$(root_dir "$BENCH_PG")
    rm -rf --one-file-system "$R/tmp/idempotency-bench"
    mkdir -p "$R/tmp/idempotency-bench"
    tar -C "$repo" --exclude=./.git --exclude=./bench/results --exclude='*.o' --exclude='*.so' \
        --exclude='*.bc' -cf - . | tar -C "$R/tmp/idempotency-bench" -xf -
    trap 'root_umount_all' EXIT
    root_mount "$R"
    # the results go to the copy's own directory (BENCH_RESULTS may name
    # one outside the root), and are copied back from there
    rc=0
    root_run "$R" env PGBIN="/usr/lib/postgresql/$BENCH_PG/bin" BENCH_PG= BENCH_RESULTS= \
        bash "/tmp/idempotency-bench/bench/$script" || rc=$?
    resdir=$(bench_resdir)
    mkdir -p "$resdir"
    inner=$R/tmp/idempotency-bench/bench/results
    [ "${BENCH_SMOKE:-0}" != 1 ] || inner=$inner/smoke
    cp "$inner/"* "$resdir/" 2>/dev/null || true
    exit "$rc"
}

# The scripts find the backends of their load by pgbench's application
# name, which PGAPPNAME would replace (PostgreSQL::Test::Utils sets it to
# the test's name, for one): the load's clients would never be found.
unset PGAPPNAME

# ---------------------------------------------------------------- clusters
# The throwaway cluster of a bench script is test/lib/cluster.sh's, which
# the script sources (with PG_CONFIG set) along with this file.
#
#   q DB [PSQL_ARG...]   psql -q to database DB of the cluster in $C
#   qval DB SQL          the value SQL returns there (psql -At)
#   bench_build REPO     make install from REPO when BUILD is 1, or auto and
#                        PostgreSQL's library directory is writable
#   bench_cluster PORT [CONF_LINE...]
#                        a new temporary directory WORK with the cluster in
#                        C = WORK/cluster, started by cluster_start with the
#                        CONF_LINEs; a trap stops it and removes WORK on
#                        exit, pass or fail (bench/scale.sh, bench/bigtxn.sh)

q()    { local db=$1; shift; cluster_psql "$C" -q -d "$db" "$@"; }
qval() { q "$1" -At -c "$2"; }

bench_build() {
    local repo="$1" libdir log
    libdir=$("$PG_CONFIG" --pkglibdir)
    if [ "$BUILD" = 1 ] || { [ "$BUILD" = auto ] && [ -w "$libdir" ]; }; then
        note "building and installing the extension (make install) ..."
        log=$(mktemp "/tmp/idem-${BENCH_NAME%.sh}-build.XXXXXX")
        (cd "$repo" && make -s PG_CONFIG="$PG_CONFIG" install) >"$log" 2>&1 ||
            { tail -n 20 "$log" >&2; rm -f "$log"; die "make install failed"; }
        rm -f "$log"
    fi
}

_bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    cluster_stop_all
    rm -rf "$WORK"
    exit "$rc"
}

bench_cluster() {
    local port="$1"
    shift
    WORK=$(mktemp -d "/tmp/idem-${BENCH_NAME%.sh}.XXXXXX")
    chmod 755 "$WORK"
    [ "$(id -u)" != 0 ] || chown "${CLUSTER_USER:-postgres}:" "$WORK"
    C=$WORK/cluster
    trap _bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    cluster_start "$C" "$port" "$@" || die "the cluster did not start"
}

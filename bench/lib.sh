# shellcheck shell=bash
#
# bench/lib.sh -- output, timing and cluster helpers shared by the bench
# scripts.  Source it after setting BENCH_NAME (the script's name, for
# messages) and OUT (the results file); it defines functions, and unsets
# PGAPPNAME (below).
#
#   say TEXT       print and append to $OUT
#   raw TEXT       append to $OUT only
#   note TEXT      print to stderr
#   die TEXT       note, record the failure in $OUT, exit 1
#   now            the clock, seconds since the epoch with nanoseconds
#   plus A B       A + B, 6 decimals
#   sleep_until T  wait until clock time T (measurement windows and samples
#                  are defined by time; there is no condition to poll for)
#   median X...    the median of the numbers (NA if none)
#   div A B        A / B, 3 decimals (NA if either is empty or ERR, or B is 0)

say()  { printf '%s\n' "$*" | tee -a "$OUT"; }
raw()  { printf '%s\n' "$*" >>"$OUT"; }
note() { printf '%s\n' "$*" >&2; }
die()  { note "$BENCH_NAME: $*"; raw "run failed: $*"; exit 1; }
now()  { date +%s.%N; }
plus() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a + b}'; }
sleep_until() {
    local d
    d=$(awk -v t="$1" -v n="$(now)" 'BEGIN{ d = t - n; printf "%.3f", (d > 0 ? d : 0) }')
    sleep "$d"
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR==0) {print "NA"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }
div()    { awk -v a="$1" -v b="$2" 'BEGIN{ if (a=="" || b=="" || a=="ERR" || b=="ERR" || b+0==0) print "NA"; else printf "%.3f", a/b }'; }

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
    [ "$(id -u)" = 0 ] && chown "${CLUSTER_USER:-postgres}:" "$WORK"
    C=$WORK/cluster
    trap _bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    cluster_start "$C" "$port" "$@" || die "the cluster did not start"
}

# shellcheck shell=bash
#
# bench/lib.sh -- output, timing and cluster helpers shared by the bench
# scripts.  Source it after setting BENCH_NAME (the script's name, for
# messages) and OUT (the results file); it defines functions only.
#
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
die()  { note "$BENCH_NAME: $*"; raw "run failed: $*"; exit 1; }
now()  { date +%s.%N; }
plus() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a + b}'; }
sleep_until() {
    local d
    d=$(awk -v t="$1" -v n="$(now)" 'BEGIN{ d = t - n; printf "%.3f", (d > 0 ? d : 0) }')
    sleep "$d"
}

# ---------------------------------------------------------------- clusters
# For the scripts that start a throwaway cluster (bench/scale.sh,
# bench/bigtxn.sh); they set PGBIN and BUILD first.
#
#   pg CMD...            run CMD as the unprivileged "postgres" user when
#                        this shell is root (initdb refuses root)
#   bench_build REPO     make install from REPO when BUILD is 1, or auto and
#                        PostgreSQL's library directory is writable
#   bench_cluster PORT [CONF_LINE...]
#                        initdb in a new temporary directory WORK (data in
#                        PGD = WORK/data), unix socket in WORK only, the
#                        CONF_LINEs appended, start it; a trap stops it and
#                        removes WORK on exit, pass or fail
#   q DB [PSQL_ARG...]   psql -X -q -v ON_ERROR_STOP=1 to database DB

pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

bench_build() {
    local repo="$1" libdir
    libdir=$("$PGBIN/pg_config" --pkglibdir)
    if [ "$BUILD" = 1 ] || { [ "$BUILD" = auto ] && [ -w "$libdir" ]; }; then
        note "building and installing the extension (make install) ..."
        (cd "$repo" && make -s PG_CONFIG="$PGBIN/pg_config" install) >"/tmp/$BENCH_NAME-build.log" 2>&1 ||
            { tail -n 20 "/tmp/$BENCH_NAME-build.log" >&2; die "make install failed"; }
    fi
}

_bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -f "$PGD/postmaster.pid" ]; then
        pg "$PGBIN/pg_ctl" -D "$PGD" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    exit "$rc"
}

bench_cluster() {
    local port="$1"
    shift
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
        die "running as root but there is no 'postgres' user"
    fi
    WORK=$(mktemp -d "/tmp/idem-${BENCH_NAME%.sh}.XXXXXX")
    chmod 755 "$WORK"
    [ "$(id -u)" = 0 ] && chown postgres: "$WORK"
    PGD=$WORK/data
    BENCH_PORT_IN_USE=$port
    trap _bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    pg "$PGBIN/initdb" -D "$PGD" -A trust -U postgres -E UTF8 --locale=C --no-sync >"$WORK/initdb.log" 2>&1 ||
        { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
    {
        echo "port = $port"
        echo "listen_addresses = ''"
        echo "unix_socket_directories = '$WORK'"
        printf '%s\n' "$@"
    } >>"$PGD/postgresql.conf"
    pg "$PGBIN/pg_ctl" -D "$PGD" -l "$WORK/server.log" -w -t 60 start >/dev/null ||
        { tail -n 30 "$WORK/server.log" >&2; die "server did not start"; }
}

q() {
    local db="$1"
    shift
    pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p "$BENCH_PORT_IN_USE" -U postgres -d "$db" "$@"
}

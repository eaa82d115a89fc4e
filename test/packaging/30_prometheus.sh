#!/usr/bin/env bash
#
# test/packaging/30_prometheus.sh -- contrib/prometheus/idempotency-queries.yaml
# in Debian's prometheus-postgres-exporter, read back over HTTP.
#
# Run as root by test/run-suites.sh (suite "packaging") with SRC, PG_CONFIG
# and CLUSTER_USER set, on every major: with the exporter of the release
# it runs on, 0.11.1 on Debian 12 (15), 0.17.1 in the trixie root (17),
# 0.19.1 in the sid root (18).  The one query file serves them all; what
# differs between the exporter's generations is taken into account here,
# as doc/monitoring.md tells users to:
#
#   - the collectors a second exporter must switch off to export only the
#     query file (0.11: database, bgwriter; 0.17 and 0.19 have more, and
#     bgwriter became stat_bgwriter): every collector the exporter's --help
#     shows as enabled by default gets --no-collector.NAME;
#   - from 0.12 on, the multi-target endpoint /probe?target=DSN, the way
#     upstream means to replace DATA_SOURCE_NAME lists: tested with a third
#     exporter that has no DATA_SOURCE_NAME (0.11 has no /probe).
#
# IDEM_EXPORTER=/path/to/prometheus-postgres-exporter runs another binary
# (say, one unpacked from a newer release's .deb) instead of
# /usr/bin/prometheus-postgres-exporter, which is then not installed.
#
# A throwaway server preloads the library, with 2-second partitions and the
# background worker napping (idempotency.naptime = 1d: it runs at start,
# then maintenance is up to the test).  Two databases, app and app2, get
# known load (claims, replays, conflicts, mismatches, consumed and duplicate
# message ids), some of it with a 4-second ttl, so that partitions expire.
# In app, a session holds the locks maintenance needs on both ledgers: the
# expired partitions stay (maintenance is "stuck") and a maintenance run
# fails (lock_timeout 100 ms).  The exporters run as CLUSTER_USER,
# connecting as a role with only pg_monitor and listening on 127.0.0.1, in
# the set-ups doc/monitoring.md describes: the usual one (default metrics
# and the query file, DATA_SOURCE_NAME the application database app), one
# for several databases (only the query file, one DSN per database: app and
# app2) and, from 0.12 on, one that has no DSN and is asked for one
# database per request on /probe.  Then, fetching with curl:
#
#   1. quiet: every metric of the query file, for each database (and
#      ledger), equals what idempotency.stats and idempotency.partitions
#      say, read just before and just after the fetch (values that move
#      with the clock, like the age of the oldest expired partition, must
#      lie between the two), and no other idempotency series is exported:
#      from the usual exporter (app), the second one (app and app2, in one
#      fetch) and /probe (app, then app2); the counters equal the known
#      load; app shows the failed run and an expired partition of a
#      positive age; the exporters report no scrape or query-file error;
#      the second and the /probe exporters export nothing of the server but
#      the query file's metrics; every metric the alert rules use is
#      exported.  A copy of the fetched metrics with one value changed,
#      and one with a series more, are shown to fail the comparison.
#   2. under load (pgbench in app, in rounds until the fetches are done):
#      three fetches, each after the load has committed more claims, each
#      between the view's values before and after it, counters never going
#      down.
#   3. after a successful idem_maintain(): the failure flag is 0 and the
#      dropped partitions are counted.
#
# Every wait is for a condition, bounded by WAIT_SECONDS (default 300: the
# bound is for a hung test, not for a slow machine).  On exit, pass or
# fail: the exporters, pgbench, the lock-holding session and the server are
# stopped.  Ports: IDEM_PACKAGING_PORT_BASE + 3 (server, unix socket), + 4,
# + 5 and + 6 (the exporters, 127.0.0.1).

set -uo pipefail

: "${SRC:?}" "${PG_CONFIG:?}" "${CLUSTER_USER:?}"
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/packaging.sh
. "$SRC/test/lib/packaging.sh"

if [ -n "${IDEM_EXPORTER:-}" ]; then
	deps_ensure curl perl || exit 1
	EXPORTER=$IDEM_EXPORTER
else
	deps_ensure prometheus-postgres-exporter curl perl || exit 1
	EXPORTER=/usr/bin/prometheus-postgres-exporter
fi
exporter_version=$("$EXPORTER" --version 2>&1 | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p' | head -n 1)
if [ -z "$exporter_version" ]; then
	echo "30_prometheus: $EXPORTER --version names no version:"
	"$EXPORTER" --version 2>&1 | head -n 5
	exit 1
fi
# /probe (multi-target) came with 0.12
HAS_PROBE=0
if [ "$(printf '%s\n' 0.12 "$exporter_version" | sort -V | head -n 1)" = 0.12 ]; then
	HAS_PROBE=1
fi
# --no-collector.NAME for every collector enabled by default: what a
# second exporter needs to export nothing of the server but the query file
mapfile -t NO_COLLECTORS < <("$EXPORTER" --help 2>&1 | perl -0777 -ne '
	print "--no-collector.$1\n"
	  while /--collector\.(\w+)\s+Enable the \w+ collector\s+\(default:\s+enabled\)/g')
if [ ${#NO_COLLECTORS[@]} -eq 0 ]; then
	echo "30_prometheus: $EXPORTER --help lists no collector enabled by default"
	exit 1
fi

QUERIES=$SRC/contrib/prometheus/idempotency-queries.yaml
ALERTS=$SRC/contrib/prometheus/idempotency-alerts.yml
T=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-prometheus.XXXXXX") || exit 1
chmod 755 "$T"
chown "$CLUSTER_USER:" "$T" || exit 1
DIR=$T/cluster
PORT=$(pkg_port 3)
HTTP=127.0.0.1:$(pkg_port 4)
HTTP_MULTI=127.0.0.1:$(pkg_port 5)
HTTP_PROBE=127.0.0.1:$(pkg_port 6)
WAIT_SECONDS=${WAIT_SECONDS:-300}
EXPORTER_PID=""
MULTI_PID=""
PROBE_PID=""
BLOCKER_PID=""
LOAD_PID=""

# stop_pid PID: TERM, and wait until it is gone (the exporters are not
# children of this shell: they were started in a command substitution)
stop_pid() {
	local pid="$1"
	[ -n "$pid" ] || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	return 0
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	exec 7>&- 2>/dev/null
	touch "$T/stop"
	stop_pid "$EXPORTER_PID"
	stop_pid "$MULTI_PID"
	stop_pid "$PROBE_PID"
	stop_pid "$LOAD_PID"
	stop_pid "$BLOCKER_PID"
	cluster_stop_all || rc=1
	if [ "$rc" -eq 0 ]; then
		rm -rf "$T"
	else
		echo "30_prometheus: work directory kept: $T"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

psql_db() {
	local db="$1"
	shift
	CLUSTER_DB=$db cluster_psql "$DIR" -X -q -At "$@"
}

# wait_until DESCRIPTION DB SQL [PID]: poll until SQL answers t, for at
# most WAIT_SECONDS; with PID, give up as soon as that process is gone
wait_until() {
	local desc="$1" db="$2" sql="$3" pid="${4:-}" end=$((SECONDS + WAIT_SECONDS))
	while [ "$SECONDS" -lt "$end" ]; do
		[ "$(psql_db "$db" -c "$sql" 2>/dev/null)" = t ] && return 0
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			pkg_fail "waiting until $desc: process $pid has ended"
			return 1
		fi
		sleep 0.2
	done
	pkg_fail "timed out after ${WAIT_SECONDS}s waiting until $desc"
	return 1
}

# --------------------------------------------------------------- the server
pkg_say "server with shared_preload_libraries = 'idempotency', 2 s partitions"
cluster_start "$DIR" "$PORT" "shared_preload_libraries = 'idempotency'" \
	"idempotency.naptime = '1d'" "idempotency.partition_interval = '2s'" \
	"idempotency.message_ttl = '4s'" "idempotency.key_ttl = '4s'" \
	"autovacuum = off" "fsync = off" || exit 1
for db in app app2; do
	cluster_psql "$DIR" -q -c "CREATE DATABASE $db" || exit 1
	psql_db "$db" -c 'CREATE EXTENSION idempotency' || exit 1
done
psql_db postgres -c 'CREATE ROLE prometheus LOGIN; GRANT pg_monitor TO prometheus' || exit 1
# restarted, the launcher runs a round over both databases (the statistics
# start from zero), then naps for a day
cluster_stop "$DIR" && cluster_start "$DIR" "$PORT" || exit 1
for db in app app2; do
	wait_until "the worker has maintained $db" "$db" \
		"SELECT maintenance_runs >= 1 AND last_maintenance_error IS NULL
		   FROM idempotency.stats WHERE datname = current_database()" || exit 1
done

# -------------------------------------------------------------- known load
# app: 41 claims (40 completed, 1 two-phase with a lease), 15 replays,
# 4 mismatches, 3 conflicts; 120 message ids consumed, 30 duplicates.
# app2: 3 claims, 7 consumed, 2 duplicates.  The 4-second ttls (the
# defaults here) fill partitions that expire while the test runs.
pkg_say "known load"
psql_db app -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
BEGIN;
SELECT count(*) FROM generate_series(1, 40) i,
       idem_claim('k' || i, '{"a": 1}', ttl => '1 hour') c WHERE c.status = 'claimed';
SELECT count(idem_complete('k' || i, 201, '{"ok": true}')) FROM generate_series(1, 40) i;
COMMIT;
SELECT count(*) FROM generate_series(1, 15) i, idem_claim('k' || i, '{"a": 1}') c WHERE c.status = 'completed';
SELECT count(*) FROM generate_series(1, 4) i, idem_claim('k' || i, '{"a": 2}') c WHERE c.status = 'mismatch';
SELECT status FROM idem_claim('leased', lease => '1 hour', ttl => '1 hour');
SELECT count(*) FROM generate_series(1, 3) i, idem_claim('leased' || left('', i)) c WHERE c.status = 'in_progress';
SELECT count(*) FILTER (WHERE idem_consume_message('q', 'm' || i, '1 hour')) FROM generate_series(1, 100) i;
SELECT count(*) FILTER (WHERE idem_consume_message('q', 'm' || i, '1 hour')) FROM generate_series(1, 30) i;
SELECT count(*) FILTER (WHERE idem_consume_message('q', 'short' || i)) FROM generate_series(1, 20) i;
SQL
psql_db app2 -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || exit 1
SELECT count(*) FILTER (WHERE idem_consume_message('q', 'm' || i)) FROM generate_series(1, 7) i;
SELECT count(*) FILTER (WHERE idem_consume_message('q', 'm' || i)) FROM generate_series(1, 2) i;
BEGIN;
SELECT count(*) FROM generate_series(1, 3) i, idem_claim('k' || i, ttl => '1 hour') c;
SELECT count(idem_release('k' || i)) FROM generate_series(1, 3) i;
COMMIT;
SQL

# Maintenance is stuck and failing in app: a session holds SHARE UPDATE
# EXCLUSIVE on both ledgers, which every maintenance run needs (to ATTACH
# and to DROP), so no run can drop a partition or succeed until phase 3.
# (The background worker may still run a round now and then, waking
# early: such a round fails the same way, and only counts.)
mkfifo "$T/blocker.in" || exit 1
CLUSTER_DB=app cluster_psql "$DIR" -q <"$T/blocker.in" >"$T/blocker.out" 2>&1 &
BLOCKER_PID=$!
exec 7>"$T/blocker.in"
echo "BEGIN; LOCK TABLE idempotency.keys, idempotency.messages IN SHARE UPDATE EXCLUSIVE MODE;" >&7
wait_until "the locks are held" app \
	"SELECT count(*) = 2 FROM pg_locks WHERE relation IN ('idempotency.keys'::regclass,
	   'idempotency.messages'::regclass) AND mode = 'ShareUpdateExclusiveLock' AND granted" || exit 1
wait_until "a partition of app has expired" app \
	"SELECT count(*) FILTER (WHERE expired) > 0 FROM idempotency.partitions" || exit 1
# premake = 8: the run has partitions to make, whatever the worker made
if psql_db app -c "SET lock_timeout = '100ms'; SET idempotency.premake = 8; SELECT * FROM idem_maintain()" \
	>"$T/maintain.out" 2>&1; then
	pkg_fail "idem_maintain() succeeded although its locks were held"
fi
pkg_check "the failed run is in idempotency.stats ($(head -n 1 "$T/maintain.out"))" test \
	"$(psql_db app -c "SELECT maintenance_runs >= 2 AND last_maintenance_error IS NOT NULL
	                     FROM idempotency.stats WHERE datname = current_database()")" = t

release_blocker() {
	[ -n "$BLOCKER_PID" ] || return 0
	echo "COMMIT;" >&7
	exec 7>&-
	wait "$BLOCKER_PID"
	BLOCKER_PID=""
}

# ------------------------------------------------------- the view's values
# One line per metric the query file should export for a database:
# NAME <tab> LABELS <tab> VALUE, from the views directly.
snapshot() {
	local out="$1" db
	shift
	: >"$out"
	for db in "$@"; do
		psql_db "$db" -F $'\t' >>"$out" <<'SQL'
SELECT 'idempotency_stats_' || m.name, 'datname=' || s.datname, m.value
  FROM idempotency.stats s,
       LATERAL (VALUES ('claims_total', s.claims::numeric), ('replays_total', s.replays),
                       ('conflicts_total', s.conflicts), ('mismatches_total', s.mismatches),
                       ('consumed_total', s.consumed), ('duplicates_total', s.duplicates),
                       ('partitions_created_total', s.partitions_created),
                       ('partitions_dropped_total', s.partitions_dropped),
                       ('holder_waits_total', s.holder_waits), ('recoveries_total', s.recoveries),
                       ('positions_advanced_total', s.positions_advanced),
                       ('stale_generations_total', s.stale_generations),
                       ('sequence_duplicates_total', s.sequence_duplicates),
                       ('sequence_gaps_total', s.sequence_gaps),
                       ('sequences_fenced_total', s.sequences_fenced),
                       ('streams_removed_total', s.streams_removed),
                       ('maintenance_runs_total', s.maintenance_runs),
                       ('last_maintenance_failed',
                        CASE WHEN s.last_maintenance_error IS NULL THEN 0 ELSE 1 END),
                       ('last_maintenance_timestamp_seconds',
                        coalesce(extract(epoch FROM s.last_maintenance), 0)),
                       ('last_error_timestamp_seconds',
                        coalesce(extract(epoch FROM s.last_error_at), 0)),
                       ('maintenance_held_off',
                        CASE WHEN s.maintenance_held_off IS NULL THEN 0 ELSE 1 END),
                       ('reset_timestamp_seconds', extract(epoch FROM s.stats_reset))) m(name, value)
 WHERE s.datname = current_database()
UNION ALL
SELECT 'idempotency_partitions_' || m.name,
       'datname=' || current_database() || ',ledger=' || l.ledger, m.value
  FROM (VALUES ('messages'), ('keys')) l(ledger),
       LATERAL (SELECT count(*) AS n,
                       count(*) FILTER (WHERE expired) AS expired,
                       sum(bytes) AS bytes,
                       sum(rows_estimate) AS rows_estimate,
                       extract(epoch FROM now() - min(upper_bound) FILTER (WHERE expired)) AS age
                  FROM idempotency.partitions WHERE table_name = l.ledger) p,
       LATERAL (VALUES ('count', p.n::numeric), ('expired', p.expired),
                       ('bytes', coalesce(p.bytes, 0)), ('rows_estimate', coalesce(p.rows_estimate, 0)),
                       ('oldest_expired_age_seconds', coalesce(p.age, 0))) m(name, value);
SQL
	done
}

# compare METRICS BEFORE AFTER: every line of the snapshots has its metric
# in METRICS (same name, labels among the metric's), with a value between
# the two snapshots' (1 ms of slack for timestamps printed as floats), and
# METRICS has no idempotency series besides (a metric the snapshots do not
# know, or a database exported twice or not asked for)
compare() {
	perl -e '
		my ($metrics, $before, $after) = @ARGV;
		my %m;
		open(my $fh, "<", $metrics) or die "$metrics: $!";
		while (<$fh>) {
			next if /^#/ || !/^(\w+)(?:\{(.*)\})?\s+(\S+)$/;
			my ($name, $labels, $value) = ($1, $2 // "", $3);
			my %l = $labels =~ /(\w+)="((?:[^"\\]|\\.)*)"/g;
			push @{$m{$name}}, [\%l, $value];
		}
		sub snap { my %s; open(my $fh, "<", $_[0]) or die "$_[0]: $!";
			while (<$fh>) { chomp; my ($n, $l, $v) = split /\t/; $s{"$n\t$l"} = $v; } \%s }
		my ($sb, $sa) = (snap($before), snap($after));
		my ($bad, $n) = (0, 0);
		for my $key (sort keys %$sb) {
			my ($name, $labels) = split /\t/, $key;
			my %want = map { split /=/, $_, 2 } split /,/, $labels;
			my @hits = grep { my $l = $_->[0]; !grep { ($l->{$_} // "\0") ne $want{$_} } keys %want }
			  @{$m{$name} // []};
			my ($lo, $hi) = sort { $a <=> $b } ($sb->{$key}, $sa->{$key} // $sb->{$key});
			$n++;
			if (@hits != 1) {
				printf "   %s{%s}: %d series exported, want 1\n", $name, $labels, scalar @hits;
				$bad++;
			} elsif ($hits[0][1] < $lo - 0.001 || $hits[0][1] > $hi + 0.001) {
				printf "   %s{%s} = %s, the view says %s\n", $name, $labels, $hits[0][1],
				  $lo == $hi ? $lo : "$lo .. $hi";
				$bad++;
			}
		}
		my $exported = 0;
		$exported += @{$m{$_}} for grep { /^idempotency_/ } keys %m;
		if ($exported != $n) {
			printf "   %d idempotency series exported, the views give %d\n", $exported, $n;
			$bad++;
		}
		print "   compared $n values\n" unless $bad;
		exit($bad ? 1 : 0);
	' "$@"
}

# fetch DESCRIPTION OUT URL DB...: read the views, fetch URL (/metrics or
# /probe) into OUT, read the views again, and compare.  A maintenance round between the
# two reads (the worker's, see above) can drop partitions, and the values
# would not lie between the two reads: then fetch again (at most 5 times).
fetch() {
	local desc="$1" out="$2" url="$3"
	shift 3
	for _ in 1 2 3 4 5; do
		snapshot "$T/before.tsv" "$@"
		scrape "$out" "$url" || {
			pkg_fail "$desc: fetching $url"
			return 1
		}
		snapshot "$T/after.tsv" "$@"
		if diff <(grep maintenance_runs "$T/before.tsv") <(grep maintenance_runs "$T/after.tsv") >/dev/null; then
			pkg_check "$desc" compare "$out" "$T/before.tsv" "$T/after.tsv"
			return
		fi
		echo "   (a maintenance round ran meanwhile: again)"
	done
	pkg_fail "$desc: a maintenance round ran during each of 5 fetches"
}

# metric METRICS NAME LABELS: the value of one series ("" if absent)
metric() {
	perl -ne '
		BEGIN { ($name, $want) = splice(@ARGV, 1, 2); }
		next unless /^\Q$name\E\{(.*)\}\s+(\S+)$/ || /^\Q$name\E()\s+(\S+)$/;
		my ($labels, $v) = ($1, $2);
		my %l = $labels =~ /(\w+)="([^"]*)"/g;
		my $ok = 1;
		for (split /,/, $want) { my ($k, $x) = split /=/; $ok = 0 if ($l{$k} // "") ne $x }
		print "$v\n" if $ok;' "$1" "$2" "$3" | head -n 1
}

# scrape FILE URL (an HTTP error status fails: the exporter answers 500
# when it collects one series twice)
scrape() {
	curl -sS --fail --max-time 120 "$2" >"$1"
}

# probe_url ADDRESS DB: the multi-target request for database DB, its DSN
# in the URL form that /probe understands (it turns a key=value DSN into a
# URL, which fails for a unix socket directory)
probe_url() {
	local target="postgresql:///$2?host=$DIR/sock&port=$PORT&user=prometheus"
	printf 'http://%s/probe?target=%s\n' "$1" \
		"$(perl -e '($_ = shift) =~ s/([^A-Za-z0-9._~-])/sprintf("%%%02X", ord $1)/ge; print' "$target")"
}

# server_metrics METRICS: the names of the series that are neither the
# query file's nor the exporter's own (its scrapes, its process, Go)
server_metrics() {
	grep -v '^#' "$1" | sed 's/[{ ].*//' | sort -u |
		grep -Ev '^(idempotency_|pg_exporter_|pg_up$|postgres_exporter_|go_|process_|promhttp_)'
}

# ------------------------------------------------------------ the exporters
# start_exporter LOGFILE ADDRESS DSNS FLAGS...: prints its pid (DSNS
# empty: no DATA_SOURCE_NAME)
start_exporter() {
	local log="$1" address="$2" dsns="$3"
	shift 3
	setpriv --reuid="$CLUSTER_USER" --regid="$CLUSTER_USER" --init-groups \
		env -i PATH=/usr/bin:/bin HOME=/ ${dsns:+DATA_SOURCE_NAME="$dsns"} \
		"$EXPORTER" --web.listen-address="$address" --extend.query-path="$QUERIES" \
		--log.level=warn "$@" >"$log" 2>&1 7>&- &
	echo $!
}

# wait_for_exporter PID URL LOG: until URL has idempotency metrics (at most
# WAIT_SECONDS; gives up if the exporter exits)
wait_for_exporter() {
	local pid="$1" url="$2" log="$3" end=$((SECONDS + WAIT_SECONDS))
	while [ "$SECONDS" -lt "$end" ]; do
		if scrape "$T/first.prom" "$url" 2>/dev/null && grep -q '^idempotency_' "$T/first.prom"; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	cat "$log"
	curl -sS --max-time 30 "$url" | head -n 20
	pkg_fail "the exporter at $url did not serve idempotency metrics"
	return 1
}

dsn="host=$DIR/sock port=$PORT user=prometheus sslmode=disable"
URL=http://$HTTP/metrics
URL_MULTI=http://$HTTP_MULTI/metrics
pkg_say "prometheus-postgres-exporter $exporter_version on $HTTP: default metrics, database app"
EXPORTER_PID=$(start_exporter "$T/exporter.log" "$HTTP" "$dsn dbname=app")
wait_for_exporter "$EXPORTER_PID" "$URL" "$T/exporter.log" || exit 1
# several databases of one server: one DSN each, and only the query file
# (0.11 would export the built-in metrics once per DSN, the same series
# twice; later versions collect the server once, from the first DSN, which
# the usual exporter does already)
pkg_say "and on $HTTP_MULTI: the query file only, databases app and app2 (${NO_COLLECTORS[*]})"
MULTI_PID=$(start_exporter "$T/multi.log" "$HTTP_MULTI" "$dsn dbname=app,$dsn dbname=app2" \
	--disable-default-metrics --disable-settings-metrics "${NO_COLLECTORS[@]}")
wait_for_exporter "$MULTI_PID" "$URL_MULTI" "$T/multi.log" || exit 1
# the multi-target way: no DSN, one database per request
if [ "$HAS_PROBE" = 1 ]; then
	pkg_say "and on $HTTP_PROBE: the query file only, no DSN, each database on /probe"
	PROBE_PID=$(start_exporter "$T/probe.log" "$HTTP_PROBE" "" \
		--disable-default-metrics --disable-settings-metrics "${NO_COLLECTORS[@]}")
	wait_for_exporter "$PROBE_PID" "$(probe_url "$HTTP_PROBE" app)" "$T/probe.log" || exit 1
else
	pkg_say "(no /probe before 0.12: the multi-target set-up is not tested with $exporter_version)"
fi

# --------------------------------------------------------------- 1. quiet
pkg_say "1. maintenance stuck and failed, no load"
fetch "the second exporter: every metric of both databases equals the views' values" \
	"$T/multi.prom" "$URL_MULTI" app app2
fetch "every metric equals the views' values (stats, partitions)" "$T/quiet.prom" "$URL" app
# a wrong value, and a series the views do not have, must be noticed
perl -pe 's/^(idempotency_stats_claims_total\{[^}]*datname="app"[^}]*\}) (\S+)$/"$1 " . ($2 + 1)/e' \
	"$T/quiet.prom" >"$T/wrong.prom"
if compare "$T/wrong.prom" "$T/before.tsv" "$T/after.tsv" >/dev/null; then
	pkg_fail "the comparison accepted a claims counter off by one"
else
	echo "ok: the comparison fails when one exported value is off by one"
fi
perl -ne 'print; print "$1app3$2\n" if /^(idempotency_stats_claims_total\{[^}]*datname=")app("[^}]*\} \S+)$/' \
	"$T/quiet.prom" >"$T/extra.prom"
if ! grep -q 'datname="app3"' "$T/extra.prom"; then
	pkg_fail "could not add a series to the fetched metrics"
elif compare "$T/extra.prom" "$T/before.tsv" "$T/after.tsv" >/dev/null; then
	pkg_fail "the comparison accepted a series of a database it was not asked for"
else
	echo "ok: the comparison fails when one idempotency series is exported more"
fi
if [ "$HAS_PROBE" = 1 ]; then
	for db in app app2; do
		fetch "/probe, database $db: every metric equals the views' values" \
			"$T/probe-$db.prom" "$(probe_url "$HTTP_PROBE" "$db")" "$db"
	done
fi

expect() {
	local name="$1" labels="$2" expected="$3" got
	got=$(metric "$T/multi.prom" "$name" "$labels")
	if [ -n "$got" ] && perl -e 'exit(!($ARGV[0] == $ARGV[1]))' "$got" "$expected"; then
		printf 'ok: %s{%s} = %s\n' "$name" "$labels" "$expected"
	else
		pkg_fail "$name{$labels} is '${got}', the load says $expected"
	fi
}
expect idempotency_stats_claims_total datname=app 41
expect idempotency_stats_replays_total datname=app 15
expect idempotency_stats_mismatches_total datname=app 4
expect idempotency_stats_conflicts_total datname=app 3
expect idempotency_stats_consumed_total datname=app 120
expect idempotency_stats_duplicates_total datname=app 30
expect idempotency_stats_last_maintenance_failed datname=app 1
expect idempotency_stats_claims_total datname=app2 3
expect idempotency_stats_consumed_total datname=app2 7
expect idempotency_stats_duplicates_total datname=app2 2
expect idempotency_stats_last_maintenance_failed datname=app2 0
age=$(metric "$T/quiet.prom" idempotency_partitions_oldest_expired_age_seconds datname=app,ledger=messages)
pkg_check "the oldest expired message partition of app has a positive age ($age s)" \
	perl -e 'exit(!($ARGV[0] > 0))' "${age:-0}"
# (the check below can fail: the usual exporter exports the server's)
pkg_check "quiet: the usual exporter exports the server's metrics too ($(server_metrics "$T/quiet.prom" | wc -l) names)" \
	test -n "$(server_metrics "$T/quiet.prom")"
fetched=(quiet multi)
[ "$HAS_PROBE" = 1 ] && fetched+=(probe-app probe-app2)
for f in "${fetched[@]}"; do
	pkg_check "$f: no scrape error (pg_exporter_last_scrape_error 0)" test \
		"$(metric "$T/$f.prom" pg_exporter_last_scrape_error "")" = 0
	pkg_check "$f: the query file loaded (pg_exporter_user_queries_load_error 0)" test \
		"$(metric "$T/$f.prom" pg_exporter_user_queries_load_error "")" = 0
	[ "$f" = quiet ] && continue
	extra=$(server_metrics "$T/$f.prom" | head -n 5 | tr '\n' ' ')
	pkg_check "$f: nothing of the server but the query file's metrics${extra:+ (also: $extra...)}" \
		test -z "$extra"
done
absent=""
for m in $(grep -o '\bidempotency_[a-z_]*' "$ALERTS" | sort -u); do
	grep -q "^${m}[{ ]" "$T/quiet.prom" || absent+=" $m"
done
pkg_check "every metric the alert rules use is exported${absent:+ (missing:$absent)}" test -z "$absent"

# ----------------------------------------------------------- 2. under load
release_blocker

pkg_say "2. under load"
cat >"$T/load.sql" <<'SQL'
\set id random(1, 1000000000000)
BEGIN;
SELECT status FROM idem_claim('load-' || :id, '{"a": 1}', ttl => '1 hour');
SELECT idem_complete('load-' || :id, 200);
SELECT idem_consume_message('load', 'load-' || :id, '1 hour');
COMMIT;
SQL
chown "$CLUSTER_USER:" "$T/load.sql"
# rounds of pgbench until the fetches are done ($T/stop), not a fixed number
# of transactions: how many a machine commits while the fetches run is not
# known; a round that fails ends the load
(
	while [ ! -e "$T/stop" ]; do
		CLUSTER_DB=app cluster_run "$DIR" pgbench -n -c 2 -j 2 -t 200 -f "$T/load.sql" \
			>>"$T/pgbench.log" 2>&1 || exit 1
	done
) &
LOAD_PID=$!
prev=0
for i in 1 2 3; do
	wait_until "the load has committed more claims" app \
		"SELECT claims > 41 + $prev FROM idempotency.stats WHERE datname = current_database()" \
		"$LOAD_PID" || break
	fetch "fetch $i under load: every metric between the views' values before and after" \
		"$T/load$i.prom" "$URL" app
	now=$(metric "$T/load$i.prom" idempotency_stats_claims_total datname=app)
	pkg_check "fetch $i: claims_total went on from $((41 + prev)) to $now" \
		perl -e 'exit(!($ARGV[0] > $ARGV[1]))' "${now:-0}" $((41 + prev))
	prev=$(( ${now%.*} - 41 ))
	pkg_check "fetch $i: no scrape error" test "$(metric "$T/load$i.prom" pg_exporter_last_scrape_error "")" = 0
done
touch "$T/stop"
if wait "$LOAD_PID"; then
	echo "ok: pgbench ran without errors"
else
	tail -n 20 "$T/pgbench.log"
	pkg_fail "pgbench failed"
fi
LOAD_PID=""

# ------------------------------------------------------- 3. maintenance back
pkg_say "3. a successful maintenance run"
psql_db app -c 'SELECT * FROM idem_maintain()' >/dev/null || pkg_fail "idem_maintain()"
fetch "every metric equals the views' values" "$T/after.prom" "$URL" app
pkg_check "the failure flag is back to 0" test \
	"$(metric "$T/after.prom" idempotency_stats_last_maintenance_failed datname=app)" = 0
dropped=$(metric "$T/after.prom" idempotency_stats_partitions_dropped_total datname=app)
pkg_check "the dropped partitions are counted ($dropped)" perl -e 'exit(!($ARGV[0] > 0))' "${dropped:-0}"

logs=("$T/exporter.log" "$T/multi.log")
[ "$HAS_PROBE" = 1 ] && logs+=("$T/probe.log")
if grep -qE 'idempotency_(stats|partitions)' "${logs[@]}"; then
	grep -E 'idempotency_(stats|partitions)' "${logs[@]}" | head -n 5
	pkg_fail "the exporter logged errors about the idempotency queries"
fi

pkg_result

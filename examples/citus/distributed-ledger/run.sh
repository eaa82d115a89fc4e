#!/bin/bash
# examples/citus/distributed-ledger/run.sh -- issue 37: the key and message
# ledgers distributed by Citus (idempotency.citus_distribute()) and
# co-located with the payments, kept exactly-once through Citus' own shard
# operations under load.
#
# Run as the user that owns the servers (not root), with Citus installed
# for $PG_CONFIG and this tree's extension installed:
#   PG_CONFIG=... WORK=/tmp/dl BASE=56501 bash run.sh
# examples/citus/test.sh runs it after its own checks (so the test command's
# examples suite does, on every major, with the Citus it builds), with
# KEYS=1000; PY names the Python with psycopg 3 (default /usr/bin/python3);
# KEYS the most keys each step sends (default 3000).
# Starts a coordinator and two workers (unix sockets under $WORK, ports
# $BASE..$BASE+2), then, while 4 clients send and re-send payments through
# the coordinator (load.py), in turn:
#   1. adds the second worker and runs citus_rebalance_start() to completion;
#   2. moves the shard of tenant t00 with force_logical;
#   3. splits a shard in two with force_logical, both halves on the other
#      worker;
#   4. isolates tenant acme to a shard of its own (block_writes, see
#      README.md) and moves that shard with force_logical;
# with a relay of the tenant outbox on the coordinator throughout
# (relay.py: each payment publishes an event with its tenant);
# then re-sends every key (each must replay its own payment, its event
# must be a duplicate), checks each tenant's ledger rows against its
# payments and events (check.sql), that every payment's event reached the
# relay's sink in its tenant's order (relay_check.py), and runs a control
# that must find keys paid twice and events applied twice: the same move
# in a database "ctl" of the same servers whose ledgers are not
# distributed (each worker's own, as before 0.5.0).  Last, the key memory
# (database "mem", 1 s partitions and ttls, key_memory 1 h): 40 payments
# of one tenant expire, maintenance keeps their partitions, the tenant's
# shards move with force_logical, and every key sent again answers
# "expired" (nothing paid), every event a duplicate; once key_memory (3 s)
# has passed, maintenance drops them.
# Exit status 0 when all checks pass and the control fails as it must.
set -u
PG_CONFIG=${PG_CONFIG:?set PG_CONFIG}
BIN=$("$PG_CONFIG" --bindir)
WORK=${WORK:-/tmp/idem-citus-dl}
BASE=${BASE:-56501}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/usr/bin/python3}
KEYS=${KEYS:-3000}
declare -A PORT=([coord]=$BASE [w1]=$((BASE + 1)) [w2]=$((BASE + 2)))
fails=0

sql() { local n=$1; shift; "$BIN/psql" -X -q -At -h "$WORK/$n/sock" -p "${PORT[$n]}" -d postgres "$@"; }
ctl() { local n=$1; shift; sql "$n" -d ctl "$@"; }
say() { printf '== %s\n' "$*"; }

rm -rf "$WORK"; mkdir -p "$WORK"
for n in coord w1 w2; do
	"$BIN/initdb" -D "$WORK/$n" -A trust -U "$(id -un)" >/dev/null || exit 1
	mkdir -p "$WORK/$n/sock"
	cat >>"$WORK/$n/postgresql.conf" <<CONF
port = ${PORT[$n]}
listen_addresses = ''
unix_socket_directories = '$WORK/$n/sock'
shared_preload_libraries = 'citus'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_worker_processes = 20
fsync = off
citus.shard_count = 4
citus.local_hostname = '$WORK/$n/sock'
citus.node_conninfo = 'sslmode=prefer'
CONF
	# PostgreSQL 15.20 and later refuse output plugins not listed here;
	# a non-blocking split decodes with Citus' own ("citus")
	if "$BIN/postgres" --describe-config 2>/dev/null | grep -q '^output_plugin_libraries'; then
		echo "output_plugin_libraries = 'pgoutput, citus'" >>"$WORK/$n/postgresql.conf"
	fi
	"$BIN/pg_ctl" -D "$WORK/$n" -l "$WORK/$n.log" -w start >/dev/null || exit 1
	PGOPTIONS='-c client_min_messages=warning' sql "$n" -c "CREATE EXTENSION citus" -c "CREATE DATABASE ctl" || exit 1
	sql "$n" -d ctl -c "CREATE EXTENSION citus" || exit 1
	# the key memory's database: 1 s partitions, keys and ids living 1 s,
	# remembered an hour (set on every node: maintenance decides on the
	# coordinator what it keeps, the calls answer on the workers)
	PGOPTIONS='-c client_min_messages=warning' sql "$n" -c "CREATE DATABASE mem" || exit 1
	sql "$n" -d mem -c "CREATE EXTENSION citus" || exit 1
	sql "$n" -c "SET citus.enable_ddl_propagation = off" \
		-c "ALTER DATABASE mem SET idempotency.partition_interval = '1s'" \
		-c "ALTER DATABASE mem SET idempotency.key_ttl = '1s'" \
		-c "ALTER DATABASE mem SET idempotency.message_ttl = '1s'" \
		-c "ALTER DATABASE mem SET idempotency.premake = 10" \
		-c "ALTER DATABASE mem SET idempotency.key_memory = '1h'" || exit 1
done
trap 'for n in coord w1 w2; do "$BIN/pg_ctl" -D "$WORK/$n" -m fast stop >/dev/null 2>&1; done' EXIT

sql coord -c "SELECT citus_set_coordinator_host('$WORK/coord/sock', ${PORT[coord]})" >/dev/null
# The application's role (setup.sql): an ordinary role, which Citus makes
# on each worker as it adds it.  The first worker's OID counter is moved on
# first, so that the role's OID differs between the two workers (checked
# below): a row moved between them must be its own by name, not by OID.
sql w1 -c "SELECT count(lo_unlink(lo_create(0))) FROM generate_series(1, 500)" >/dev/null || exit 1
sql coord -c "CREATE ROLE idem_app LOGIN" >/dev/null || exit 1
# one worker first: step 1 adds the second
sql coord -f "$HERE/setup.sql" -v w1host="$WORK/w1/sock" -v w1port="${PORT[w1]}" -v distribute=on >/dev/null || exit 1
# the control's database: the same tables and handlers, the ledgers not
# distributed, both workers from the start
ctl coord -c "SELECT citus_set_coordinator_host('$WORK/coord/sock', ${PORT[coord]})" >/dev/null || exit 1
ctl coord -f "$HERE/setup.sql" -v w1host="$WORK/w1/sock" -v w1port="${PORT[w1]}" -v distribute=off >/dev/null || exit 1
ctl coord -c "SELECT citus_add_node('$WORK/w2/sock', ${PORT[w2]})" >/dev/null || exit 1
export CO="host=$WORK/coord/sock port=${PORT[coord]} dbname=postgres"
# the clients, the relay and the replays run as the application's role
export APP_USER=idem_app
W1="'$WORK/w1/sock', ${PORT[w1]}"
W2="'$WORK/w2/sock', ${PORT[w2]}"

load() { # tag, operation
	say "$1: $2"
	timeout 900 "$PY" "$HERE/load.py" "$2" "$1" "$KEYS" || fails=$((fails + 1))
}
other_of() { # shard -> "host', port" of the worker that does not hold it
	if [ "$(sql coord -c "SELECT nodeport FROM citus_shards WHERE shardid = $1 LIMIT 1")" = "${PORT[w1]}" ]; then
		echo "$W1|$W2"
	else
		echo "$W2|$W1"
	fi
}

# the relay of the tenant outbox, on the coordinator, through all four
# operations: every payment's event into the sink, once at least
rm -f "$WORK/relay.stop" "$WORK/relay.sink"
"$PY" "$HERE/relay.py" "$WORK/relay.sink" "$WORK/relay.stop" >"$WORK/relay.out" 2>&1 &
relay_pid=$!

load rebalance "SELECT citus_add_node($W2);; SELECT citus_rebalance_start();; SELECT citus_rebalance_wait();; SELECT state FROM citus_rebalance_status()"

s=$(sql coord -c "SELECT get_shard_id_for_distribution_column('payments', 't00')")
IFS='|' read -r from to <<<"$(other_of "$s")"
load move "SELECT citus_move_shard_placement($s, $from, $to, shard_transfer_mode => 'force_logical')"

s=$(sql coord -c "SELECT get_shard_id_for_distribution_column('payments', 't01')")
read -r lo hi <<<"$(sql coord -F ' ' -c "SELECT shardminvalue, shardmaxvalue FROM pg_dist_shard WHERE shardid = $s")"
IFS='|' read -r from to <<<"$(other_of "$s")"
tonode=$(sql coord -c "SELECT nodeid FROM pg_dist_node WHERE nodeport = ${to##*, }")
load split "SELECT citus_split_shard_by_split_points($s, ARRAY['$(((lo + hi) / 2))'], ARRAY[$tonode, $tonode], shard_transfer_mode => 'force_logical')"

s=$(sql coord -c "SELECT get_shard_id_for_distribution_column('payments', 'acme')")
IFS='|' read -r from to <<<"$(other_of "$s")"
load isolate "SELECT isolate_tenant_to_new_shard('payments', 'acme', 'CASCADE', shard_transfer_mode => 'block_writes');; SELECT citus_move_shard_placement(get_shard_id_for_distribution_column('payments', 'acme'), $from, $to, shard_transfer_mode => 'force_logical')"

say "the application's role has another OID on each worker"
o1=$(sql w1 -c "SELECT oid FROM pg_roles WHERE rolname = 'idem_app'")
o2=$(sql w2 -c "SELECT oid FROM pg_roles WHERE rolname = 'idem_app'")
echo "idem_app: OID $o1 on the first worker, $o2 on the second"
if [ -z "$o1" ] || [ "$o1" = "$o2" ]; then
	say "the role's OIDs do not differ: the moves would not show that rows stay its own"
	fails=$((fails + 1))
fi

say "every key of every step, once more"
"$PY" "$HERE/replay_all.py" || fails=$((fails + 1))
sql coord -v ON_ERROR_STOP=1 -f "$HERE/check.sql" || fails=$((fails + 1))

say "the tenant outbox: every payment's event relayed from the coordinator, in each tenant's order"
touch "$WORK/relay.stop"
wait "$relay_pid" || fails=$((fails + 1))
cat "$WORK/relay.out"
"$PY" "$HERE/relay_check.py" "$WORK/relay.sink" || fails=$((fails + 1))

say "maintenance on the workers leaves the distributed ledgers' partitions to the coordinator"
# Citus drops the shards that the moves above left behind in its own time
# (deferred cleanup), which would change the count below: drop them first
sql coord -c "CALL citus_cleanup_orphaned_resources()" >/dev/null || fails=$((fails + 1))
for n in w1 w2; do
	parts="SELECT count(*) FROM pg_class WHERE relname ~ '^(keys|messages)_n'"
	before=$(sql "$n" -c "SET citus.override_table_visibility = off" -c "$parts")
	# a horizon further out than the coordinator's: a worker that did not
	# leave them alone would try to make more
	got=$(sql "$n" -c "SET idempotency.premake = 4" \
		-c "SELECT partitions_created || '|' || partitions_dropped FROM idem_maintain()" 2>&1)
	after=$(sql "$n" -c "SET citus.override_table_visibility = off" -c "$parts")
	if [ "$got" != "0|0" ] || [ "$before" != "$after" ]; then
		say "$n: idem_maintain() answered '$got', ledger partitions and shards $before before, $after after"
		fails=$((fails + 1))
	fi
done

say "control: the same move where the ledgers are each worker's own (must pay keys and apply events twice)"
s=$(ctl coord -c "SELECT get_shard_id_for_distribution_column('payments', 't02')")
from=$(ctl coord -c "SELECT nodeport FROM citus_shards WHERE shardid = $s LIMIT 1")
if [ "$from" = "${PORT[w1]}" ]; then from=$W1 to=$W2; else from=$W2 to=$W1; fi
if CO="host=$WORK/coord/sock port=${PORT[coord]} dbname=ctl" timeout 900 "$PY" "$HERE/load.py" \
	"SELECT citus_move_shard_placement($s, $from, $to, shard_transfer_mode => 'force_logical')" control "$KEYS"; then
	say "control found nothing: the checks cannot fail"
	fails=$((fails + 1))
else
	say "control failed as it must"
fi
say "key memory: expired keys and ids of a tenant answered after a force_logical move, forgotten once key_memory has passed"
mem() { local n=$1; shift; sql "$n" -d mem "$@"; }
mem coord -c "SELECT citus_set_coordinator_host('$WORK/coord/sock', ${PORT[coord]})" >/dev/null || exit 1
mem coord -f "$HERE/setup.sql" -v w1host="$WORK/w1/sock" -v w1port="${PORT[w1]}" -v distribute=on >/dev/null || exit 1
mem coord -c "SELECT citus_add_node('$WORK/w2/sock', ${PORT[w2]})" -c "SELECT count(*) FROM idem_maintain()" >/dev/null || exit 1
# 40 payments and their events for tenant t03, each key living 1 s, each
# call alone (delegated to the tenant's worker)
sends() {
	local i
	for i in $(seq 1 40); do
		echo "SELECT status FROM create_payment('t03', 'mem-$i', 5);"
		echo "SELECT apply_event('t03', 'mem-$i');"
	done | mem coord | sort | uniq -c | awk '{ printf "%s%s %s", sep, $2, $1; sep = "," }'
}
paid=$(sends)
# wait until every partition that can hold them has ended, then maintenance
ends=$(mem coord -c "SELECT max(upper_bound) FROM idempotency.partitions
                      WHERE lower_bound <= (SELECT max(expires_at) FROM idempotency.keys)
                         OR lower_bound <= (SELECT max(expires_at) FROM idempotency.messages)")
until [ "$(mem coord -c "SELECT clock_timestamp() > '$ends'")" = t ]; do sleep 0.1; done
mem coord -c "SELECT count(*) FROM idem_maintain()" >/dev/null || exit 1
kept=$(mem coord -c "SELECT count(*) FROM idempotency.keys WHERE tenant = 't03'")
s=$(mem coord -c "SELECT get_shard_id_for_distribution_column('payments', 't03')")
from=$(mem coord -c "SELECT nodeport FROM citus_shards WHERE shardid = $s LIMIT 1")
if [ "$from" = "${PORT[w1]}" ]; then from=$W1 to=$W2; else from=$W2 to=$W1; fi
mem coord -c "SELECT citus_move_shard_placement($s, $from, $to, shard_transfer_mode => 'force_logical')" \
	-c "SELECT count(*) FROM idem_maintain()" >/dev/null || exit 1
# every key once more: "expired" (nothing paid), every event a duplicate
again=$(sends)
payments=$(mem coord -c "SELECT count(*) FROM payments WHERE tenant = 't03'")
say "sent: '$paid'; $kept key rows kept after their partitions ended, moved to port ${to##*, }; sent again: '$again'; $payments payments"
if [ "$paid" != "created 40,t 40" ] || [ "$kept" != 40 ] || [ "$again" != "expired 40,f 40" ] || [ "$payments" != 40 ]; then
	say "key memory: want 'created 40,t 40', 40 kept, 'expired 40,f 40', 40 payments"
	fails=$((fails + 1))
fi
# key_memory (3 s here) passes: maintenance drops the kept partitions
until [ "$(mem coord -c "SELECT clock_timestamp() > '$ends'::timestamptz + interval '3.1 seconds'")" = t ]; do sleep 0.1; done
left=$(mem coord -c "SET idempotency.key_memory = '3s'" -c "SELECT count(*) FROM idem_maintain()" \
	-c "SELECT (SELECT count(*) FROM idempotency.keys WHERE tenant = 't03') + (SELECT count(*) FROM idempotency.messages WHERE tenant = 't03')
	           + (SELECT count(*) FROM idempotency.partitions WHERE upper_bound <= '$ends')" | tail -1)
say "after key_memory: $left rows and partitions left"
[ "$left" = 0 ] || fails=$((fails + 1))

say "$fails failures"
[ "$fails" = 0 ]

#!/bin/bash
# examples/citus/distributed-ledger/callgrind.sh -- instructions per request
# of create_payment() on a worker, in run.sh's database "ctl" (the worker's
# own ledger, as before 0.5.0: "own") and in "postgres" (the ledgers
# distributed by idempotency.citus_distribute(): the tenant's ledger shard,
# "routed").
#
# Run after run.sh, as the same user, on the worker it leaves stopped:
#   PG_CONFIG=... WORK=/tmp/dl bash callgrind.sh
# Each database runs 200 and then 400 calls with new keys for the tenants
# whose shards are on w1 in it, in single-user mode under callgrind; the
# difference of the two totals divided by 200 is the cost of one request
# (claim, the payment's INSERT, complete, and since the tenant outbox the
# payment's event: idem_publish(..., tenant), into the worker's own outbox
# in "ctl", the tenant's shard of the tenant outbox in "postgres").  Counts do not depend on the
# machine's load.
set -eu
PG_CONFIG=${PG_CONFIG:?set PG_CONFIG}
BIN=$("$PG_CONFIG" --bindir)
WORK=${WORK:-/tmp/idem-citus-dl}
OUT=${OUT:-$WORK/callgrind}
DATA=$WORK/w1
mkdir -p "$OUT"
run=$(date +%s)

single() { local db=$1; shift; "$BIN/postgres" --single -D "$DATA" "$@" "$db"; }

# the worker's own ledger gets its partitions made ahead by its own
# maintenance, as a 0.4.0 worker's background worker does (the distributed
# ledger's are made ahead by the coordinator's): both then probe as many
echo "SELECT * FROM idem_maintain();" | single ctl >/dev/null 2>&1

declare -A total
for cfg in own routed; do
	db=postgres
	[ "$cfg" = own ] && db=ctl
	# the example's tenants whose payments shard is on w1 in that database
	tenants=$(echo "SELECT string_agg(t, ',') FROM (SELECT 'acme' UNION ALL SELECT format('t%s', lpad(i::text, 2, '0')) FROM generate_series(0, 23) i) s(t) WHERE EXISTS (SELECT FROM pg_dist_placement p JOIN pg_dist_local_group l USING (groupid) WHERE p.shardid = get_shard_id_for_distribution_column('payments', t))" |
		single "$db" 2>/dev/null | sed -n 's/.*string_agg = "\([^"]*\)".*/\1/p')
	[ -n "$tenants" ] || { echo "no tenant on w1 found in $DATA, database $db" >&2; exit 1; }
	IFS=, read -r -a ts <<<"$tenants"
	for n in 200 400; do
		sql=$OUT/$cfg-$n.sql
		for ((i = 0; i < n; i++)); do
			echo "SELECT * FROM create_payment('${ts[i % ${#ts[@]}]}', 'cg-$run-$cfg-$n-$i', 5);"
		done >"$sql"
		valgrind --tool=callgrind --callgrind-out-file="$OUT/$cfg-$n.out" \
			"$BIN/postgres" --single -D "$DATA" "$db" \
			<"$sql" >"$OUT/$cfg-$n.log" 2>&1
		created=$(grep -c 'status = "created"' "$OUT/$cfg-$n.log" || true)
		[ "$created" = "$n" ] || { echo "$cfg $n: $created of $n created (see $OUT/$cfg-$n.log)" >&2; exit 1; }
		total[$cfg-$n]=$(sed -n 's/^summary: //p' "$OUT/$cfg-$n.out")
	done
	echo "$cfg: $(((total[$cfg-400] - total[$cfg-200]) / 200)) instructions per request (${#ts[@]} tenants)"
done
echo "ratio routed/own: $(awk -v a=$((total[routed-400] - total[routed-200])) -v b=$((total[own-400] - total[own-200])) 'BEGIN { printf "%.3f", a / b }')"

#!/usr/bin/env bash
#
# clients/node/test.sh -- the Node.js client's suite (pg-idempotency) against
# the installed extension: starts a throwaway cluster as an unprivileged user
# on a private unix socket (test/lib/cluster.sh), makes a database with the
# extension and an ordinary application role, runs "npm test" (npm ci, the
# node:test suite with real HTTP servers and concurrent clients, the outbox
# relay and webhook receivers (test/outbox.test.js: against
# conformance/outbox-fake.sql, and end to end against the extension's outbox
# when it has one; Redis Streams when redis-server is installed), the packed
# tarball installed into a scratch app whose README quickstarts are run as
# written, and the TypeScript check of the .d.ts files), and stops the
# cluster, pass or fail.
#
#   bash clients/node/test.sh                      # as root or not
#   PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config bash clients/node/test.sh
#
# Needs Node.js 20 or later with npm (/usr/bin/node or on PATH; as root, a
# missing one is installed with apt, Debian 13 and later ship 20+) and the
# npm registry, or an npm cache that holds the locked packages.
#
# Environment: SRC (repository, default: two levels up), PG_CONFIG (the
# server, default 15), CLIENTS_PORT_BASE (the cluster's socket port, default
# EXAMPLES_PORT_BASE or 54480), NODE (a node binary to prefer), CLUSTER_USER
# (as root: who runs the server, default postgres), KEEP_WORKDIR=1.
# Exit status 0 = pass.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PORT=${CLIENTS_PORT_BASE:-${EXAMPLES_PORT_BASE:-54480}}
if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
fi

# shellcheck source=test/lib/skip.sh
. "$SRC/test/lib/skip.sh"
say() { echo "== node client: $*"; }
fail() {
	echo "node client test: $*" >&2
	exit 1
}

# ---------------------------------------------------------------- node, npm
node_ok() {
	local major
	major=$("$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null) || return 1
	[ "${major:-0}" -ge 20 ]
}
find_node() {
	local n
	for n in ${NODE:-} node /usr/bin/node; do
		if command -v "$n" >/dev/null 2>&1 && node_ok "$n"; then
			command -v "$n"
			return 0
		fi
	done
	return 1
}
apt_install() {
	[ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
	say "installing $* with apt"
	DEBIAN_FRONTEND=noninteractive apt-get -qq update >/dev/null &&
		DEBIAN_FRONTEND=noninteractive apt-get -qq install -y --no-install-recommends "$@" >/dev/null
}
NODE_BIN=$(find_node) || {
	apt_install nodejs npm || true
	NODE_BIN=$(find_node) ||
		skip_unavailable "needs Node.js 20 or later with npm (found: $(node --version 2>/dev/null || echo none)); Debian 12's nodejs is 18: install Node 20 (NodeSource) or run on Debian 13"
}
NODE_DIR=$(dirname "$NODE_BIN")
export PATH="$NODE_DIR:$PATH"
# npm trusts the certificate authorities this machine trusts (Node.js
# itself knows only its own list; a TLS proxy's authority is in the system's)
if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -r /etc/ssl/certs/ca-certificates.crt ]; then
	export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
if ! command -v npm >/dev/null 2>&1; then
	apt_install npm || true
	command -v npm >/dev/null 2>&1 || fail "needs npm beside $NODE_BIN"
fi
echo "node $("$NODE_BIN" --version), npm $(npm --version), $("$PG_CONFIG" --version)"

# ---------------------------------------------------------------- cluster
WORK=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		cluster_stop_any_under "$WORK" || rc=1
		if [ "$rc" -ne 0 ] && [ -f "$WORK/cluster/postgresql.log" ]; then
			echo "---- postgresql.log (last 30 lines)"
			tail -n 30 "$WORK/cluster/postgresql.log"
		fi
		if [ "$rc" -eq 0 ] && [ "${KEEP_WORKDIR:-0}" != 1 ]; then
			rm -rf "$WORK"
		else
			echo "scratch directory kept: $WORK"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-node.XXXXXX") || exit 1
chmod 755 "$WORK"
DB="$WORK/cluster"
say "cluster on socket port $PORT"
cluster_start "$DB" "$PORT" "fsync = off" "max_connections = 100" \
	"shared_preload_libraries = 'idempotency'" || exit 1
if [ "$(id -u)" -eq 0 ]; then ADMIN=$CLUSTER_USER; else ADMIN=$(id -un); fi
cluster_psql "$DB" -q <<'SQL' || exit 1
CREATE ROLE idem_app LOGIN;
CREATE DATABASE idem_node OWNER idem_app;
-- the 54000 tests need responses over the bound; small ones are cheaper
ALTER DATABASE idem_node SET idempotency.max_response_bytes = '64kB';
-- expired keys are remembered (the 410 expired tests); keys of the other
-- tests live for hours
ALTER DATABASE idem_node SET idempotency.key_memory = '1h';
SQL
cluster_psql "$DB" -q -d idem_node <<'SQL' || exit 1
CREATE EXTENSION idempotency;
ALTER SCHEMA public OWNER TO idem_app;
SQL

# ---------------------------------------------------------------- suite
export PGHOST="$DB/sock" PGPORT="$PORT" PGDATABASE=idem_node PGUSER=idem_app
export IDEM_ADMIN_USER="$ADMIN" IDEM_SCRATCH="$WORK"
say "npm test"
cd "$HERE" || exit 1
npm test

#!/usr/bin/env bash
#
# examples/demo.sh -- build and install the idempotency extension, start a
# throwaway PostgreSQL 15 cluster and run examples/demo.sql in it with psql
# (every line echoed): a redelivered message is processed exactly once.
#
#   bash examples/demo.sh
#
# As root (fresh Debian 12): installs missing packages with apt and runs the
# cluster as the unprivileged user "postgres".  As a non-root user: the
# packages must already be installed, and "make install" goes through sudo
# if PostgreSQL's directories are not writable.  See test/run-all.sh.
#
# Environment: PG_CONFIG (default /usr/lib/postgresql/15/bin/pg_config),
# DEMO_PORT (default 54394; the cluster listens on a unix socket only).
# The cluster and its scratch directory are removed on exit, pass or fail.

set -uo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/build.sh
. "$SRC/test/lib/build.sh"

export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
DEMO_PORT=${DEMO_PORT:-54394}

WORK=""
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	cluster_stop_all || rc=1
	if [ -n "$WORK" ]; then
		cluster_stop_any_under "$WORK" || rc=1
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deps_ensure || exit 1
CLUSTER_USER=$(deps_test_user) || exit 1
export CLUSTER_USER

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-demo.XXXXXX") || exit 1
chmod 755 "$WORK"
idem_copy_tree "$SRC" "$WORK/src" || exit 1
{ idem_build "$WORK/src" && idem_install "$WORK/src"; } >"$WORK/build.log" 2>&1 || {
	cat "$WORK/build.log" >&2
	echo "demo: build or install failed" >&2
	exit 1
}

cluster_start "$WORK/cluster" "$DEMO_PORT" "log_min_messages = warning" || exit 1
echo "demo: PostgreSQL $("$PG_CONFIG" --version | awk '{print $2}') on socket $WORK/cluster/sock, port $DEMO_PORT"
echo
(cd "$WORK/src" && cluster_psql "$WORK/cluster" -a -f examples/demo.sql)

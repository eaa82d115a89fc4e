#!/usr/bin/env bash
#
# clients/python/test.sh -- the Python client's test suite against the
# real extension:
#
#   1. installs the Debian packages it needs when they are missing (as
#      root, with apt-get from the machine's own Debian suites; as another
#      user it only checks and says which are missing);
#   2. starts a throwaway PostgreSQL cluster (test/lib/cluster.sh) as an
#      unprivileged user on a private unix socket, and creates the
#      extension in database "clients";
#   3. runs the pytest suite (clients/python/tests) with Debian's python3:
#      the core on psycopg 3 and psycopg2, the two-phase helper and the
#      recoverer, the consumer helper, the asyncio core, the ASGI
#      (FastAPI, Starlette), Django and Flask adapters behind real HTTP
#      servers with real concurrent clients (from the source tree), the
#      outbox relay and webhook receivers (test_outbox.py: against
#      conformance/outbox-fake.sql, and end to end against the extension's
#      outbox when it has one; Redis Streams when redis-server and
#      python3-redis are installed, else skipped, saying so), and
#      test_wheel.py: the wheel built offline with Debian's tools (python3
#      -m build --no-isolation, else pip wheel --no-build-isolation) in a
#      copy of this directory, installed into a "python3 -m venv
#      --system-site-packages", and the README's quickstarts run as
#      written from it;
#   4. stops the cluster, pass or fail.
#
# Environment: SRC (the repository, default two levels up), PG_CONFIG
# (default /usr/lib/postgresql/15/bin/pg_config), CLIENTS_PORT_BASE
# (default 54480: the cluster's socket port; HTTP servers bind port 0 on
# 127.0.0.1), PYTEST_ARGS (extra pytest arguments, e.g. "-k asgi"),
# KEEP_WORKDIR=1 (keep the scratch directory).  Exit status 0 = pass.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SRC=${SRC:-$(cd "$HERE/../.." && pwd -P)}
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BASE=${CLIENTS_PORT_BASE:-54480}
# Debian's interpreter: python3 on PATH may be another build (pyenv, a
# venv) without Debian's packages
PY=/usr/bin/python3

say() { printf '\n== python client: %s\n' "$*"; }

PACKAGES=(python3 python3-psycopg python3-psycopg-pool python3-psycopg2
	python3-django python3-flask python3-fastapi python3-starlette
	python3-uvicorn python3-pytest python3-venv
	python3-setuptools python3-wheel python3-pip python3-build)
say "Debian packages"
deps_ensure "${PACKAGES[@]}" || exit 1

if [ "$(id -u)" -eq 0 ]; then
	export CLUSTER_USER=${CLUSTER_USER:-postgres}
	id -u "$CLUSTER_USER" >/dev/null 2>&1 || deps_test_user >/dev/null || exit 1
	DBUSER=$CLUSTER_USER
else
	DBUSER=$(id -un)
fi

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

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-python.XXXXXX") || exit 1
chmod 755 "$WORK"

say "cluster ($("$PG_CONFIG" --version), socket port $BASE)"
cluster_start "$WORK/cluster" "$BASE" "fsync = off" "max_connections = 120" \
	"shared_preload_libraries = 'idempotency'" || exit 1
cluster_psql "$WORK/cluster" -q <<'SQL' || exit 1
CREATE DATABASE clients;
\c clients
CREATE EXTENSION idempotency;
-- the applications of the tests run as an ordinary role with a schema
-- of their own; the tests check the database as the superuser
CREATE ROLE app LOGIN;
CREATE SCHEMA AUTHORIZATION app;
-- small enough that a test can go over it (54000)
ALTER DATABASE clients SET idempotency.max_response_bytes = '64kB';
-- expired keys are remembered (the 410 expired tests); keys of the other
-- tests live for hours
ALTER DATABASE clients SET idempotency.key_memory = '1h';
SQL

export PGHOST="$WORK/cluster/sock" PGPORT="$BASE" PGDATABASE=clients
export IDEM_TEST_SUPERUSER="$DBUSER" IDEM_TEST_APP_USER=app
export IDEM_TEST_WORK="$WORK" IDEM_TEST_CLIENT_DIR="$HERE"
export PYTHONDONTWRITEBYTECODE=1
start=$SECONDS
say "tests (source tree)"
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
(cd "$HERE" && PYTHONPATH="$HERE/src" "$PY" -m pytest -p no:cacheprovider \
	--basetemp="$WORK/pytest" -q -rs ${PYTEST_ARGS:-} tests)
rc=$?
echo "python client: pytest exited $rc after $((SECONDS - start)) s"
exit "$rc"

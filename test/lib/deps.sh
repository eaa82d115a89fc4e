# shellcheck shell=bash
#
# test/lib/deps.sh -- system dependencies and the unprivileged test user,
# shared by test/run-all.sh and examples/demo.sh.  Source it; it defines
# functions and variables only.
#
#   deps_packages M  print the Debian packages the tests of PostgreSQL M need
#   deps_ensure [P..] install the missing ones of packages P (default: those
#                    of deps_packages for PG_CONFIG's major) with apt (as
#                    root; "apt-get update" runs once, and only when
#                    something is missing).  As non-root it only checks and
#                    fails with the apt-get command to run.
#   deps_test_user   print the unprivileged user to build and test as: when
#                    root, $IDEM_TEST_USER or "postgres" (created as a system
#                    user if absent); when not root, the current user.

# Everything the tests of PostgreSQL major MAJOR need, as Debian packages:
# "make", "make installcheck" (pg_regress, pg_isolation_regress, prove with
# PostgreSQL::Test::Cluster), "make pgtap" (pg_prove), the examples' tests
# (python3-psycopg, curl, pgbouncer, plproxy, the Citus build), the client
# libraries' tests (FastAPI, Starlette, Django, Flask, pytest, the wheel
# build; Node.js 20 and npm where Debian has them), the DBA
# operations tests (pg_repack), the clock tests (faketime), the streams
# tests and example (redis-server, python3-redis), the smoke run
# of bench/callgrind.sh (valgrind) and the packaging tests (pg_buildext and
# dpkg-buildpackage, whose implicit build dependency is build-essential;
# pgxnclient; postgres_exporter).  The Perl modules PostgreSQL::Test::* use
# beyond IPC::Run and Test::More are core modules from the perl package.
deps_packages() {
	local m="$1"
	printf '%s\n' \
		"postgresql-$m" "postgresql-client-$m" "postgresql-server-dev-$m" \
		"postgresql-$m-pgtap" "postgresql-$m-cron" "postgresql-$m-plproxy" \
		"postgresql-$m-repack" \
		libtap-parser-sourcehandler-pgtap-perl pgbouncer \
		libipc-run-perl libtest-simple-perl perl \
		python3 python3-psycopg python3-redis redis-server \
		curl make gcc libc6-dev faketime valgrind \
		patch liblz4-dev libzstd-dev libcurl4-openssl-dev libicu-dev libkrb5-dev \
		build-essential debhelper dpkg-dev fakeroot postgresql-server-dev-all \
		pgxnclient prometheus-postgres-exporter \
		python3-psycopg-pool python3-psycopg2 python3-django python3-flask \
		python3-fastapi python3-starlette python3-uvicorn python3-pytest \
		python3-venv python3-setuptools python3-wheel python3-pip python3-build
	# the Node.js client needs Node 20 or later with npm: Debian 13 and
	# later ship it; on Debian 12 it comes from elsewhere (NodeSource), and
	# Debian's nodejs 18 is not asked for
	if ! _deps_node_ok && [ "$(_deps_codename)" != bookworm ]; then
		printf '%s\n' nodejs npm
	fi
}

# Is there a Node.js 20 or later, with npm?
_deps_node_ok() {
	local major
	command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || return 1
	major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) || return 1
	[ "${major:-0}" -ge 20 ]
}

# The Debian release this runs on (bookworm, trixie, ...), or nothing.
_deps_codename() {
	sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null
}

# The major of $PG_CONFIG.
deps_major() {
	"${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" --version 2>/dev/null |
		sed -n 's/^PostgreSQL \([0-9][0-9]*\).*/\1/p'
}

# Packages of the arguments that are not installed.
_deps_missing() {
	local pkg
	for pkg in "$@"; do
		if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
			printf '%s\n' "$pkg"
		fi
	done
}

# deps_ensure [PACKAGE...]: install the missing ones of PACKAGEs, or, with
# none given, of deps_packages for PG_CONFIG's major (15 by default).
deps_ensure() {
	local missing=() want=("$@")
	if ! command -v dpkg-query >/dev/null 2>&1; then
		echo "deps: not a Debian system; assuming the dependencies are installed" >&2
		return 0
	fi
	if [ ${#want[@]} -eq 0 ]; then
		mapfile -t want < <(deps_packages "$(deps_major || echo 15)")
	fi
	mapfile -t missing < <(_deps_missing "${want[@]}")
	if [ ${#missing[@]} -eq 0 ]; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: missing packages: ${missing[*]}" >&2
		echo "deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
		return 1
	fi
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q || return 1
	apt-get install -q -y --no-install-recommends -o Dpkg::Use-Pty=0 \
		"${missing[@]}" || return 1
}

deps_test_user() {
	local user
	if [ "$(id -u)" -ne 0 ]; then
		id -un
		return 0
	fi
	user="${IDEM_TEST_USER:-postgres}"
	if ! id -u "$user" >/dev/null 2>&1; then
		echo "deps: creating unprivileged user $user" >&2
		useradd --system --user-group --create-home --shell /bin/bash "$user" >&2 || return 1
	fi
	if [ "$(id -u "$user")" -eq 0 ]; then
		echo "deps: test user $user must not be root" >&2
		return 1
	fi
	printf '%s\n' "$user"
}

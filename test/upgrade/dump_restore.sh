#!/usr/bin/env bash
#
# test/upgrade/dump_restore.sh FROM TO -- a cluster of PostgreSQL FROM (this
# machine's major) moved to PostgreSQL TO (in its Debian root file system,
# test/lib/roots.sh) with TO's pg_dump and pg_restore, as the PostgreSQL
# documentation recommends: the newer major's pg_dump reads the older
# server.
#
#   bash test/upgrade/dump_restore.sh 15 18
#
# The extension is built and installed on both sides from this tree.  The
# FROM cluster runs here, its socket in a directory inside the TO root so
# that the TO side reaches it; test/upgrade/setup.sql makes its state,
# test/upgrade/verify.sql checks it after the restore into TO, whose
# cluster preloads the extension (its worker leaves the database alone
# while pg_restore is connected).  Roles are not in a database dump: the
# role "app" is made on TO first, as "pg_dumpall --globals-only" would.
# Every server is stopped and the root unmounted on exit, pass or fail.
# Exit status 0 = pass.  Needs root.

set -uo pipefail

FROM=${1:?usage: dump_restore.sh FROM TO}
TO=${2:?usage: dump_restore.sh FROM TO}
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/build.sh
. "$SRC/test/lib/build.sh"
# shellcheck source=test/lib/roots.sh
. "$SRC/test/lib/roots.sh"

FROM_PORT=${IDEM_DUMP_FROM_PORT:-54601}
TO_PORT=${IDEM_DUMP_TO_PORT:-54602}
ROOT=$(root_dir "$TO")
XV=/tmp/idempotency-dump-restore		# inside the root
WORK=""

if [ "$(id -u)" -ne 0 ]; then
	echo "dump_restore: needs root (it runs PostgreSQL $TO in a root file system)" >&2
	exit 1
fi

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	PG_CONFIG=/usr/lib/postgresql/$FROM/bin/pg_config cluster_stop_all || rc=1
	if [ -d "$ROOT$XV/to" ] && mountpoint -q "$ROOT/proc"; then
		root_run "$ROOT" env PG_CONFIG="/usr/lib/postgresql/$TO/bin/pg_config" \
			bash -c ". /tmp/idempotency-src/test/lib/cluster.sh && cluster_stop $XV/to" || rc=1
	fi
	root_umount_all || rc=1
	[ -n "$WORK" ] && rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() { printf -- '--- %s\n' "$*"; }

# ------------------------------------------------------------ both sides
export PG_CONFIG=/usr/lib/postgresql/$FROM/bin/pg_config
deps_ensure || exit 1
CLUSTER_USER=$(deps_test_user) || exit 1
export CLUSTER_USER
root_ensure "$TO" || exit 1

step "build and install for PostgreSQL $FROM (this machine)"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-dump.XXXXXX") || exit 1
chmod 755 "$WORK"
idem_copy_tree "$SRC" "$WORK/src" >/dev/null || exit 1
idem_build "$WORK/src" >/dev/null || exit 1
idem_install "$WORK/src" >/dev/null || exit 1

step "build and install for PostgreSQL $TO (root $ROOT)"
rm -rf --one-file-system "$ROOT/tmp/idempotency-src" "$ROOT$XV"
mkdir -p "$ROOT/tmp/idempotency-src" "$ROOT$XV" || exit 1
chmod 1777 "$ROOT$XV"
tar -C "$SRC" --exclude=./.git --exclude='./tmp_check*' --exclude='*.o' \
	--exclude='*.so' --exclude='*.bc' -cf - . |
	tar -C "$ROOT/tmp/idempotency-src" -xf - || exit 1
root_mount "$ROOT" || exit 1
in_root() {
	root_run "$ROOT" env PG_CONFIG="/usr/lib/postgresql/$TO/bin/pg_config" bash -c "
		. /tmp/idempotency-src/test/lib/cluster.sh &&
		. /tmp/idempotency-src/test/lib/deps.sh &&
		. /tmp/idempotency-src/test/lib/build.sh &&
		CLUSTER_USER=\$(deps_test_user) && export CLUSTER_USER && $1"
}
in_root "idem_copy_tree /tmp/idempotency-src $XV/src >/dev/null &&
	idem_build $XV/src >/dev/null && idem_install $XV/src >/dev/null" || exit 1

# ------------------------------------------------------------ the old cluster
step "PostgreSQL $FROM: the state to move (test/upgrade/setup.sql)"
cluster_start "$ROOT$XV/from" "$FROM_PORT" "fsync = off" || exit 1
cluster_psql "$ROOT$XV/from" -q -c 'CREATE EXTENSION idempotency' || exit 1
# (through stdin: the test user may not read the source tree)
cluster_psql "$ROOT$XV/from" -q <"$SRC/test/upgrade/setup.sql" >/dev/null || exit 1
# PostgreSQL 15.20 stores an attribute option 18.6 does not know: see
# test/upgrade/strip_attver.sql
echo "pg_attver stripped from $(cluster_psql "$ROOT$XV/from" -qAt \
	<"$SRC/test/upgrade/strip_attver.sql") columns"

# ------------------------------------------------------------ dump, restore
step "PostgreSQL $TO: pg_dump of the $FROM server, pg_restore, verify.sql"
in_root "
	set -e
	cluster_start $XV/to $TO_PORT 'fsync = off' \"shared_preload_libraries = 'idempotency'\"
	cluster_psql $XV/to -q -c 'CREATE ROLE app'
	cluster_psql $XV/to -q -c 'CREATE DATABASE moved'
	cluster_run $XV/to pg_dump -h $XV/from/sock -p $FROM_PORT -Fc -f $XV/dump postgres
	cluster_run $XV/to pg_restore --exit-on-error -d moved $XV/dump
	echo 'restored; checking (test/upgrade/verify.sql):'
	CLUSTER_DB=moved cluster_psql $XV/to -qAt </tmp/idempotency-src/test/upgrade/verify.sql >$XV/verify.out
	cat $XV/verify.out
" || exit 1

checks=$(grep -c 'SELECT pg_temp.check(' "$SRC/test/upgrade/verify.sql")
passed=$(grep -c '^ok: ' "$ROOT$XV/verify.out")
if [ "$passed" -ne "$checks" ]; then
	echo "dump_restore: $passed of $checks checks passed" >&2
	exit 1
fi
echo "dump_restore: all $checks checks passed on PostgreSQL $TO after a dump of $FROM"

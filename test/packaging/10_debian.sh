#!/usr/bin/env bash
#
# test/packaging/10_debian.sh -- the Debian package, as users get it.
#
# Run as root by test/run-suites.sh (suite "packaging") with SRC (the built
# scratch copy), PG_CONFIG and CLUSTER_USER set.  For PG_CONFIG's major NN:
#
#   1. debian/control is what "pg_buildext updatecontrol" makes of
#      debian/control.in for Debian unstable's major (18): the committed
#      file is not stale; debian/changelog's upstream version is the control
#      file's default_version; debian/copyright carries LICENSE's terms.
#   2. dpkg-buildpackage -b, as CLUSTER_USER, with PG_SUPPORTED_VERSIONS=NN
#      (each Debian release builds for its own major; other majors are
#      tested in their own roots), makes exactly postgresql-NN-idempotency.
#   3. Its files, outside /usr/share/doc, are exactly those "make install
#      DESTDIR=..." installs (the comparison is first shown to fail on a
#      list with a file missing); the docs include the copyright file and
#      the exporter's query file and alert rules as examples.
#   4. apt installs it; dpkg lists the same files and owns the library.
#   5. debian/tests/installcheck (the autopkgtest, as autopkgtest runs it,
#      as root) passes: the regression and isolation suites against the
#      installed files.
#   6. A server with shared_preload_libraries = 'idempotency' loads the
#      packaged library; its background worker maintains a database.
#   7. apt purges it: dpkg forgets it and none of its files is left.
#
# On exit, pass or fail: the package is purged if still installed, the
# throwaway server stopped, and "make install" from SRC is run again so
# that later suites find the extension installed.  Ports: IDEM_PACKAGING_PORT_BASE
# + 0 (server) and + 1 (pg_virtualenv's cluster).

set -uo pipefail

: "${SRC:?}" "${PG_CONFIG:?}" "${CLUSTER_USER:?}"
# shellcheck source=test/lib/cluster.sh
. "$SRC/test/lib/cluster.sh"
# shellcheck source=test/lib/deps.sh
. "$SRC/test/lib/deps.sh"
# shellcheck source=test/lib/build.sh
. "$SRC/test/lib/build.sh"
# shellcheck source=test/lib/packaging.sh
. "$SRC/test/lib/packaging.sh"

PKG=postgresql-$PKG_MAJOR-idempotency
UNSTABLE_MAJOR=18
T=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-deb.XXXXXX") || exit 1
chmod 755 "$T"
chown "$CLUSTER_USER:" "$T" || exit 1
export DEBIAN_FRONTEND=noninteractive

as_user() {
	(cd "$T" && runuser -u "$CLUSTER_USER" -- "$@")
}

installed() {
	[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$PKG" 2>/dev/null)" = "ii " ]
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	cluster_stop_all || rc=1
	if dpkg-query -W -f='${db:Status-Abbrev}' "$PKG" 2>/dev/null | grep -q '^[ihr]'; then
		apt-get purge -q -y "$PKG" >/dev/null 2>&1 || rc=1
	fi
	pkg_restore_install || rc=1
	if [ "$rc" -eq 0 ]; then
		rm -rf "$T"
	else
		echo "10_debian: work directory kept: $T"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deps_ensure build-essential debhelper dpkg-dev fakeroot postgresql-server-dev-all || exit 1

# --------------------------------------------------------------- 1. sources
pkg_say "PostgreSQL $PKG_MAJOR, extension $PKG_VERSION, package $PKG"
idem_copy_tree "$SRC" "$T/pristine" || exit 1
(cd "$T/pristine" && make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null 2>&1)

pkg_check "debian/control is up to date with debian/control.in (for $UNSTABLE_MAJOR, Debian unstable)" \
	as_user env -C "$T/pristine" PG_SUPPORTED_VERSIONS=$UNSTABLE_MAJOR pg_buildext checkcontrol

deb_version=$(cd "$T/pristine" && dpkg-parsechangelog -S Version)
pkg_check "debian/changelog's version $deb_version is $PKG_VERSION-<revision>" \
	test "${deb_version%-*}" = "$PKG_VERSION"

license_text() {
	# the license terms as words, from LICENSE or from debian/copyright's
	# "License: PostgreSQL" paragraph
	tr -s ' \n\t' '\n\n\n' | grep -v '^\.\?$' | tr 'A-Z' 'a-z'
}
sed -n '/^Permission/,$p' "$SRC/LICENSE" | license_text >"$T/license.upstream"
awk '/^License: PostgreSQL$/ { on = 1; next } on && /^[^ ]/ { on = 0 } on' \
	"$SRC/debian/copyright" | sed -n '/Permission/,$p' | license_text >"$T/license.debian"
pkg_check "debian/copyright carries the terms of LICENSE" \
	cmp -s "$T/license.upstream" "$T/license.debian"
grep -q '"license": "postgresql"' "$SRC/META.json" ||
	pkg_fail "META.json's license is not postgresql"

# ---------------------------------------------------------------- 2. build
pkg_say "dpkg-buildpackage -b (PG_SUPPORTED_VERSIONS=$PKG_MAJOR)"
mkdir -p "$T/build" && chown "$CLUSTER_USER:" "$T/build" || exit 1
idem_copy_tree "$T/pristine" "$T/build/idempotency-$PKG_VERSION" || exit 1
start=$SECONDS
if ! as_user env -C "$T/build/idempotency-$PKG_VERSION" PG_SUPPORTED_VERSIONS="$PKG_MAJOR" \
	sh -c 'pg_buildext updatecontrol && dpkg-buildpackage -us -uc -b' \
	>"$T/build.log" 2>&1; then
	tail -n 60 "$T/build.log"
	pkg_fail "dpkg-buildpackage failed (log: $T/build.log)"
	exit 1
fi
echo "built in $((SECONDS - start))s"
# (besides its -dbgsym package of detached debug symbols)
debs=()
for f in "$T"/build/*.deb; do
	case $f in *-dbgsym_*) ;; *) [ -e "$f" ] && debs+=("${f##*/}") ;; esac
done
pkg_check "exactly one package was built: ${debs[*]}" \
	test "${#debs[@]}" -eq 1 -a "${debs[0]:-}" = "${PKG}_${deb_version}_$(dpkg --print-architecture).deb"
DEB=$T/build/${debs[0]:-none}
[ -f "$DEB" ] || exit 1
pkg_check "it depends on postgresql-$PKG_MAJOR" \
	sh -c "dpkg-deb -f '$DEB' Depends | grep -Eq '(^|, )postgresql-$PKG_MAJOR( |,|\$)'"

# --------------------------------------------------- 3. files = make install
dpkg-deb --fsys-tarfile "$DEB" | tar -t | sed -e 's|^\./|/|' | grep -v '/$' |
	sort >"$T/deb.all"
grep -v '^/usr/share/doc/' "$T/deb.all" >"$T/deb.files"
mkdir -p "$T/destdir" && chown "$CLUSTER_USER:" "$T/destdir"
as_user make -s -C "$SRC" install DESTDIR="$T/destdir" PG_CONFIG="$PG_CONFIG" >/dev/null || exit 1
(cd "$T/destdir" && find . -type f -o -type l) | sed -e 's|^\./|/|' | sort >"$T/make-install.files"
pkg_self_test_lists "$T/make-install.files"
pkg_same_lists "the package installs exactly the files of make install" \
	"$T/make-install.files" "$T/deb.files"
# docs are compressed when over 4 kB (dh_compress), the examples never
for f in 'copyright' 'changelog\.gz' 'changelog\.Debian\.gz' 'README\.md(\.gz)?' \
	'reference\.md(\.gz)?' 'monitoring\.md(\.gz)?' \
	'examples/idempotency-queries\.yaml' 'examples/idempotency-alerts\.yml'; do
	grep -qE "^/usr/share/doc/$PKG/$f\$" "$T/deb.all" ||
		pkg_fail "the package lacks /usr/share/doc/$PKG/$f"
done

# ----------------------------------------------------------------- 4. install
pkg_say "apt-get install $DEB"
if ! apt-get install -q -y --no-install-recommends -o Dpkg::Use-Pty=0 "$DEB" >"$T/apt-install.log" 2>&1; then
	cat "$T/apt-install.log"
	pkg_fail "apt-get install failed"
	exit 1
fi
pkg_check "$PKG is installed" installed
dpkg -L "$PKG" | while IFS= read -r f; do
	if [ -f "$f" ] || [ -L "$f" ]; then printf '%s\n' "$f"; fi
done | sort >"$T/dpkg.files"
pkg_same_lists "dpkg lists the package's files as installed" "$T/deb.all" "$T/dpkg.files"
owner=$(dpkg -S "$("$PG_CONFIG" --pkglibdir)/idempotency.so" 2>/dev/null | cut -d: -f1)
pkg_check "the library belongs to $PKG (dpkg -S: $owner)" test "$owner" = "$PKG"

# --------------------------------------------------- 5. installed-package tests
pkg_say "debian/tests/installcheck (autopkgtest) against the installed package"
start=$SECONDS
# Without the isolation specs' second, preloaded pass: the isolation suite
# of this run has made it with the same code and major.  With
# IDEM_SERVER_SPECIFIC_ONLY=1 (test/run-suites.sh: the majors but one of
# test/run-all.sh), the regression suite only: the package's isolation
# specs run with one major, and this major's isolation suite has run them.
vars="ISOLATION_PRELOAD="
[ "${IDEM_SERVER_SPECIFIC_ONLY:-0}" = 1 ] && vars="ISOLATION= ISOLATION_PRELOAD="
if (cd "$T/pristine" && PGPORT=$(pkg_port 1) AUTOPKGTEST_TMP="$T" \
	IDEM_INSTALLCHECK_MAKEVARS="$vars" \
	sh debian/tests/installcheck) >"$T/installcheck.log" 2>&1; then
	grep -E '^(### |# |ok |not ok| *All [0-9]+ tests)|tests passed' "$T/installcheck.log" | tail -n 20
	echo "ok: installcheck passed in $((SECONDS - start))s"
else
	tail -n 150 "$T/installcheck.log"
	pkg_fail "debian/tests/installcheck failed"
fi

# -------------------------------------------- 6. preloaded, worker running
pkg_say "a server preloading the packaged library"
dir=$T/preload
if cluster_start "$dir" "$(pkg_port 0)" "shared_preload_libraries = 'idempotency'" \
	"idempotency.naptime = 1" "fsync = off"; then
	cluster_psql "$dir" -q -c 'CREATE EXTENSION idempotency' >/dev/null || pkg_fail "CREATE EXTENSION"
	pkg_check "the installed extension is version $PKG_VERSION" test \
		"$(cluster_psql "$dir" -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" = "$PKG_VERSION"
	# waited for (300 s at most: a bound for a hung worker, not for a slow
	# machine)
	ok=0
	end=$((SECONDS + 300))
	while [ "$SECONDS" -lt "$end" ]; do
		if [ "$(cluster_psql "$dir" -At -c "SELECT maintenance_runs > 0 AND last_maintenance_error IS NULL
			FROM idempotency.stats WHERE datname = current_database()" 2>/dev/null)" = t ]; then
			ok=1
			break
		fi
		sleep 0.2
	done
	pkg_check "its background worker maintains the database (idempotency.stats)" test "$ok" = 1
	pkg_check "a call works" test \
		"$(cluster_psql "$dir" -At -c "SELECT idem_consume_message('packaging', 'm1')")" = t
	cluster_stop "$dir" || pkg_fail "stopping the server"
else
	pkg_fail "a server with the packaged library preloaded did not start"
fi

# ------------------------------------------------------------------ 7. purge
pkg_say "apt-get purge $PKG"
if apt-get purge -q -y -o Dpkg::Use-Pty=0 "$PKG" >"$T/apt-purge.log" 2>&1; then
	pkg_check "dpkg has forgotten $PKG" \
		test -z "$(dpkg-query -W -f='${db:Status-Abbrev}' "$PKG" 2>/dev/null | tr -d ' ')"
	left=$(while IFS= read -r f; do
		if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\n' "$f"; fi
	done <"$T/deb.all")
	pkg_check "none of its files is left${left:+: $left}" test -z "$left"
	pkg_check "nor its doc directory" test ! -e "/usr/share/doc/$PKG"
else
	cat "$T/apt-purge.log"
	pkg_fail "apt-get purge failed"
fi

pkg_result

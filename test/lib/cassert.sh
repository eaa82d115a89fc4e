# shellcheck shell=bash
#
# test/lib/cassert.sh -- an assert-enabled, Valgrind-ready PostgreSQL 15,
# the server PostgreSQL's own developers test against: built from Debian's
# own source package of the release this machine runs (bookworm), and kept
# under /var/cache so that later runs reuse it.  Source it after
# test/lib/deps.sh; it defines functions only.
#
#   cassert_prefix       where the build is installed
#                        ($IDEM_CASSERT_DIR/pg15-UPSTREAM_VERSION)
#   cassert_pg_config    its pg_config
#   cassert_ready        true if the cache holds a complete build made with
#                        the current settings
#   cassert_ensure       (as root) build and install it unless it is ready;
#                        a non-root caller gets it only when it is ready
#
# What is built, and why:
#   - PostgreSQL from the upstream sources of Debian's postgresql-15 source
#     package (fetched with "apt-get source" through a deb-src line for
#     bookworm, which this file adds in its own sources file; nothing else
#     of the host's apt changes).  Debian's patches are not applied: they
#     move the installation into /usr/lib/postgresql/15 (the host's own
#     server) and the default socket into /var/run; none changes the server's
#     behaviour.  Configured with --enable-cassert (Assert() and the memory
#     and cache checks that come with it: CLOBBER_FREED_MEMORY,
#     MEMORY_CONTEXT_CHECKING, the debug_discard_caches setting),
#     --enable-debug, --enable-tap-tests (PostgreSQL::Test::Cluster for the
#     extension's TAP suite), OpenSSL, ICU, LZ4 and zstd as Debian's server
#     has them, and CFLAGS with -DUSE_VALGRIND, which marks palloc'd memory
#     for Valgrind's memcheck (test/release.mk).  The contrib modules are
#     installed too (amcheck for the load tests), and PostgreSQL's Valgrind
#     suppressions (src/tools/valgrind.supp) as PREFIX/share/valgrind.supp.
#   - The extensions the TAP and pgTAP suites load into that server: pg_cron
#     (031_pg_cron.pl bails out without it, which stops the TAP run), pgTAP
#     and pg_repack (025_dba_operations.pl).  Each is built from its Debian
#     source package when the archive serves its sources; when it does not
#     (the mirror here serves only some source packages), the files of
#     Debian's binary package for PostgreSQL 15 are installed instead: same
#     major, same ABI (an extension built without asserts loads into an
#     assert-enabled server; the magic block does not record them).  The
#     stamp file says which.
#
# The build takes about 10 minutes on 2 cores.  It is done in a scratch
# directory and installed into the prefix, which is emptied first; the stamp
# file (PREFIX/.idempotency-cassert, the settings the build was made with)
# is written last, so an interrupted build is redone, not used.  A lock
# file serialises two runs that would build at once.  A copy of a build
# (cp -a PREFIX OTHER_DIR/pg15-VERSION, then IDEM_CASSERT_DIR=OTHER_DIR) is
# used as it is, never built again (see cassert_ready).
#
# Settings (environment):
#   IDEM_CASSERT_DIR       default /var/cache/idempotency/cassert
#   IDEM_CASSERT_VERSION   the Debian source version of postgresql-15
#                          (default 15.18-0+deb12u1: bookworm's; the source of
#                          the security updates is not served)
#   IDEM_CASSERT_CFLAGS    default "-O1 -g -fno-omit-frame-pointer -DUSE_VALGRIND"
#   IDEM_CASSERT_JOBS      make -j (default 2: the machine is shared)
#   IDEM_CASSERT_REFRESH=1 build again even if the cache has a build

IDEM_CASSERT_DIR=${IDEM_CASSERT_DIR:-/var/cache/idempotency/cassert}
IDEM_CASSERT_VERSION=${IDEM_CASSERT_VERSION:-15.18-0+deb12u1}
IDEM_CASSERT_CFLAGS=${IDEM_CASSERT_CFLAGS:--O1 -g -fno-omit-frame-pointer -DUSE_VALGRIND}
IDEM_CASSERT_JOBS=${IDEM_CASSERT_JOBS:-2}

# the deb-src line "apt-get source" needs; in a file of its own, so that the
# host's own apt sources are not edited
_CASSERT_DEBSRC=/etc/apt/sources.list.d/idempotency-deb-src.sources
# the extensions, as "source-package binary-package" pairs
_CASSERT_EXTENSIONS=("pg-cron postgresql-15-cron" "pgtap postgresql-15-pgtap"
	"pg-repack postgresql-15-repack")
# what the build needs from apt (the release tarball has the generated
# parser files, so no bison or flex)
_CASSERT_BUILD_DEPS=(gcc make perl libipc-run-perl pkg-config dpkg-dev
	libreadline-dev zlib1g-dev libssl-dev libicu-dev liblz4-dev libzstd-dev
	valgrind)

cassert_prefix() {
	printf '%s/pg15-%s\n' "$IDEM_CASSERT_DIR" "${IDEM_CASSERT_VERSION%%-*}"
}

cassert_pg_config() {
	printf '%s/bin/pg_config\n' "$(cassert_prefix)"
}

# The configure options; with the version and the extensions, what the stamp
# records (a change of any of them makes a new build).
_cassert_configure_args() {
	printf '%s\n' --prefix="$(cassert_prefix)" --enable-cassert --enable-debug \
		--enable-tap-tests --with-openssl --with-icu --with-lz4 --with-zstd \
		--without-llvm
}

_cassert_settings() {
	printf 'version=%s\n' "$IDEM_CASSERT_VERSION"
	printf 'cflags=%s\n' "$IDEM_CASSERT_CFLAGS"
	printf 'configure=%s\n' "$(_cassert_configure_args | paste -sd' ' -)"
	printf 'extensions=%s\n' "${_CASSERT_EXTENSIONS[*]}"
}

# A build copied to another IDEM_CASSERT_DIR counts as ready there:
# PostgreSQL is relocatable (its programs find their files from where they
# are), and the stamp's --prefix, the directory it was built for, is read
# as the copy's.  (Its programs' run path still names the first directory's
# lib, which a copy can do without: libpq is the only library of it they
# load, and the system's serves as well.)
cassert_ready() {
	local stamp prefix
	prefix=$(cassert_prefix)
	stamp="$prefix/.idempotency-cassert"
	[ -f "$stamp" ] && [ "${IDEM_CASSERT_REFRESH:-0}" != 1 ] &&
		[ "$(grep -v '^#' "$stamp" | sed "s|--prefix=[^ ]*|--prefix=$prefix|")" = "$(_cassert_settings)" ]
}

# Adds the deb-src line for bookworm (once), and reads the source indexes.
_cassert_debsrc() {
	# shellcheck disable=SC1091
	if [ "$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")" != bookworm ]; then
		echo "cassert: the assert-enabled server is built from Debian 12 (bookworm)'s postgresql-15 source; this is not bookworm" >&2
		return 1
	fi
	if [ ! -f "$_CASSERT_DEBSRC" ]; then
		cat >"$_CASSERT_DEBSRC" <<'EOF' || return 1
# deb-src only, for the idempotency extension's tests (test/lib/cassert.sh):
# the source packages of PostgreSQL 15 and its extensions
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	fi
	# the source index may be missing though the file is there (a fresh
	# apt-get update failed, or lists were cleaned)
	if ! apt-cache showsrc postgresql-15 2>/dev/null | grep -q '^Version:'; then
		apt-get update -q || return 1
	fi
}

# _cassert_fetch_source PKG[=VERSION] DIR: the unpacked source of PKG in DIR
# (without Debian's patches); fails if the archive does not serve it.
_cassert_fetch_source() {
	local pkg="$1" dir="$2" dl="$2.dl"
	rm -rf "$dl" "$dir"
	mkdir -p "$dl" || return 1
	(cd "$dl" && apt-get source -q --download-only "$pkg") || return 1
	dpkg-source -x --skip-patches "$dl"/*.dsc "$dir" >/dev/null || return 1
	rm -rf "$dl"
}

# _cassert_extension SRCPKG BINPKG WORK LOG: build SRCPKG against the new
# server and install it; failing that, install BINPKG's files for
# PostgreSQL 15.  Prints how it was had ("source VERSION" or "deb VERSION").
_cassert_extension() {
	local src="$1" bin="$2" work="$3" log="$4" pgc prefix x f
	pgc=$(cassert_pg_config)
	prefix=$(cassert_prefix)
	if _cassert_fetch_source "$src" "$work/$src" >>"$log" 2>&1 &&
		(cd "$work/$src" && make -j"$IDEM_CASSERT_JOBS" PG_CONFIG="$pgc" &&
			make install PG_CONFIG="$pgc") >>"$log" 2>&1; then
		printf 'source %s\n' "$(dpkg-parsechangelog -l "$work/$src/debian/changelog" -S Version 2>/dev/null)"
		return 0
	fi
	echo "cassert: no source of $src to build (see $log); installing $bin's files" >&2
	x="$work/$bin"
	rm -rf "$x"
	mkdir -p "$x" || return 1
	(cd "$x" && apt-get download -q "$bin") >>"$log" 2>&1 || return 1
	dpkg-deb -x "$x"/*.deb "$x/root" || return 1
	# the Debian layout of PostgreSQL 15's files, mapped onto the prefix's
	for f in "$x/root/usr/lib/postgresql/15/lib/"*.so; do
		[ -e "$f" ] && { install -m 755 "$f" "$("$pgc" --pkglibdir)/" || return 1; }
	done
	for f in "$x/root/usr/lib/postgresql/15/bin/"*; do
		[ -e "$f" ] && { install -m 755 "$f" "$prefix/bin/" || return 1; }
	done
	for f in "$x/root/usr/share/postgresql/15/extension/"*; do
		[ -e "$f" ] && { install -m 644 "$f" "$("$pgc" --sharedir)/extension/" || return 1; }
	done
	printf 'deb %s\n' "$(dpkg-deb -f "$x"/*.deb Version)"
}

cassert_ensure() {
	local prefix work log lock fd rc upstream ext how args
	prefix=$(cassert_prefix)
	cassert_ready && return 0
	if [ "$(id -u)" -ne 0 ]; then
		echo "cassert: no assert-enabled server in $prefix, and building it needs root" >&2
		return 1
	fi
	mkdir -p "$IDEM_CASSERT_DIR" || return 1
	lock="$IDEM_CASSERT_DIR/.lock"
	exec {fd}>"$lock" || return 1
	if ! flock -w 3600 "$fd"; then
		echo "cassert: another build held $lock for an hour" >&2
		exec {fd}>&-
		return 1
	fi
	# another run may have built it while this one waited
	if cassert_ready; then
		exec {fd}>&-
		return 0
	fi
	work=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-cassert.XXXXXX") || {
		exec {fd}>&-
		return 1
	}
	log="$IDEM_CASSERT_DIR/build.log"
	: >"$log"
	upstream=${IDEM_CASSERT_VERSION%%-*}
	echo "cassert: building PostgreSQL $upstream with assertions into $prefix (about 10 minutes; log: $log)"
	# a subshell for the steps, so that one failure ends them all (not
	# followed by || : that would turn set -e off inside); the lock and the
	# scratch directory are released below whatever happens
	(
		set -e
		deps_ensure "${_CASSERT_BUILD_DEPS[@]}"
		_cassert_debsrc
		_cassert_fetch_source "postgresql-15=$IDEM_CASSERT_VERSION" "$work/postgresql" >>"$log" 2>&1
		cd "$work/postgresql"
		mapfile -t args < <(_cassert_configure_args)
		{
			echo "cassert: configure ${args[*]} CFLAGS=$IDEM_CASSERT_CFLAGS"
			./configure "${args[@]}" CFLAGS="$IDEM_CASSERT_CFLAGS"
			make -j"$IDEM_CASSERT_JOBS"
			make -C contrib -j"$IDEM_CASSERT_JOBS"
			# never a partial mix of an old and a new build
			rm -rf --one-file-system "$prefix"
			make install
			make -C contrib install
		} >>"$log" 2>&1
		install -m 644 src/tools/valgrind.supp "$prefix/share/valgrind.supp"
		{
			echo "# made by test/lib/cassert.sh on $(date -u +%FT%TZ)"
			for ext in "${_CASSERT_EXTENSIONS[@]}"; do
				# shellcheck disable=SC2086 # "source-package binary-package"
				how=$(_cassert_extension $ext "$work" "$log")
				echo "# ${ext%% *}: $how"
			done
		} >"$work/stamp"
		_cassert_settings >>"$work/stamp"
		mv "$work/stamp" "$prefix/.idempotency-cassert"
	)
	rc=$?
	if [ "$rc" -ne 0 ]; then
		echo "cassert: the build failed; the end of $log:" >&2
		tail -n 60 "$log" >&2
	else
		echo "cassert: built; $(grep "^# [a-z-]*: " "$prefix/.idempotency-cassert" | sed "s/^# //" | paste -sd";" - | sed "s/;/; /g")"
	fi
	rm -rf --one-file-system "$work"
	exec {fd}>&-
	return "$rc"
}

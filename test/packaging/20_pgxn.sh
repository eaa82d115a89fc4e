#!/usr/bin/env bash
#
# test/packaging/20_pgxn.sh -- the PGXN release archive, as users get it.
#
# Run as root by test/run-suites.sh (suite "packaging") with SRC (the built
# scratch copy), PG_CONFIG and CLUSTER_USER set; on every major (Debian's
# pgxnclient is in each release).
#
#   1. META.json is valid against the PGXN Meta Spec 1.0.0
#      (test/lib/pgxn_meta.pl), and each of a set of broken copies (a
#      missing key, a license, version, range or tag the spec refuses, an
#      unknown key, ...) is refused: the validator can fail.
#   2. "make dist", as CLUSTER_USER in a clean copy of the tree, makes
#      idempotency-VERSION.zip: one top directory idempotency-VERSION/, the
#      files a build needs, no build output; the META.json inside is valid
#      and names files the archive has.  "make dist" refuses when
#      META.json's version disagrees with the control file.
#   3. With the make install files removed, "pgxn install" of the archive
#      (as root, as "sudo pgxn install" would) installs the extension.
#   4. "pgxn load" creates it in a database of a throwaway server, and it
#      works; "pgxn check" runs the regression suite of the
#      archive against the installed files (the TAP suite is the test
#      command's job).
#
# On exit, pass or fail: the server is stopped and "make install" from SRC
# is run again.  Ports: IDEM_PACKAGING_PORT_BASE + 2.

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

T=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-pgxn.XXXXXX") || exit 1
chmod 755 "$T"
chown "$CLUSTER_USER:" "$T" || exit 1
ARCHIVE=$T/idempotency-$PKG_VERSION.zip
VALIDATOR=$SRC/test/lib/pgxn_meta.pl

as_user() {
	(cd "$T" && runuser -u "$CLUSTER_USER" -- "$@")
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	cluster_stop_all || rc=1
	pkg_restore_install || rc=1
	if [ "$rc" -eq 0 ]; then
		rm -rf "$T"
	else
		echo "20_pgxn: work directory kept: $T"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deps_ensure pgxnclient python3 perl make || exit 1

# -------------------------------------------------------- 1. META.json
pkg_say "META.json against the PGXN Meta Spec 1.0.0"
perl "$VALIDATOR" --root "$SRC" "$SRC/META.json" || pkg_fail "META.json is not valid"

# Each broken copy must be refused (exit status 1), for the reason given.
broken() {
	local desc="$1" code="$2" out rc
	perl -MJSON::PP -e '
		my $j = JSON::PP->new->canonical->pretty;
		open(my $fh, "<", $ARGV[0]) or die; local $/;
		my $m = $j->decode(<$fh>);
		eval $ARGV[1]; die $@ if $@;
		print $j->encode($m);' "$SRC/META.json" "$code" >"$T/broken.json" || {
		pkg_fail "could not make the broken copy: $desc"
		return
	}
	out=$(perl "$VALIDATOR" --root "$SRC" "$T/broken.json")
	rc=$?
	if [ "$rc" -eq 1 ]; then
		printf 'ok: refused: %s (%s)\n' "$desc" "$(head -n 1 <<<"$out" | sed 's/^[^:]*: //')"
	else
		pkg_fail "the validator accepted a META.json with $desc"
	fi
}
broken "no license" 'delete $m->{license}'
broken "an unknown license string" '$m->{license} = "postgres"'
broken "a two-part version" '$m->{version} = "0.3"'
broken "no provides file" 'delete $m->{provides}{idempotency}{file}'
broken "a provides file the tree lacks" '$m->{provides}{idempotency}{file} = "sql/nothing.sql"'
broken "a provides version with a v" '$m->{provides}{idempotency}{version} = "v0.3.0"'
broken "a misspelt prereqs phase" '$m->{prereqs}{runtim} = delete $m->{prereqs}{runtime}'
broken "a misspelt prereqs relation" '$m->{prereqs}{runtime}{required} = delete $m->{prereqs}{runtime}{requires}'
broken "a version range without patch level" '$m->{prereqs}{runtime}{requires}{PostgreSQL} = ">= 15"'
broken "a range with an unknown operator" '$m->{prereqs}{runtime}{requires}{PostgreSQL} = "=> 15.0.0"'
broken "meta-spec 2.0.0" '$m->{"meta-spec"}{version} = "2.0.0"'
broken "a tag with a slash" 'push @{$m->{tags}}, "a/b"'
broken "an unknown top-level key" '$m->{homepage} = "https://example.org/"'
broken "a name with a space" '$m->{name} = "idem potency"'
broken "an empty maintainer list" '$m->{maintainer} = []'
broken "resources without a URI" '$m->{resources} = { homepage => "example.org" }'
broken "no meta-spec" 'delete $m->{"meta-spec"}'
printf '{"name": "idempotency", ' >"$T/truncated.json"
perl "$VALIDATOR" "$T/truncated.json" >/dev/null
pkg_check "a META.json that is not JSON is refused (status 2)" test $? -eq 2

# ------------------------------------------------------------ 2. make dist
pkg_say "make dist"
idem_copy_tree "$SRC" "$T/tree" || exit 1
(cd "$T/tree" && make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null 2>&1)
if ! as_user env DIST_DIR="$T" make -s -C "$T/tree" dist PG_CONFIG="$PG_CONFIG"; then
	pkg_fail "make dist failed"
	exit 1
fi
pkg_check "the archive is named after the control file's version: $(basename "$ARCHIVE")" test -f "$ARCHIVE"
python3 -c 'import sys, zipfile
for n in zipfile.ZipFile(sys.argv[1]).namelist(): print(n)' "$ARCHIVE" | sort >"$T/archive.list"
top=$(grep -v "^idempotency-$PKG_VERSION/" "$T/archive.list")
pkg_check "every entry is under idempotency-$PKG_VERSION/${top:+ (not: $top)}" test -z "$top"
for f in META.json LICENSE README.md CHANGELOG.md Makefile idempotency.control \
	"idempotency--$PKG_VERSION.sql" src/idempotency.c src/idempotency.h \
	doc/reference.md sql/consume.sql expected/consume.out specs/keys_claim.spec \
	expected/keys_claim.out test/idempotency.conf; do
	grep -qx "idempotency-$PKG_VERSION/$f" "$T/archive.list" || pkg_fail "the archive lacks $f"
done
junk=$(grep -E '\.(o|so|bc|zip|deb)$|/\.git/|/results/|/tmp_check|regression\.(diffs|out)$' "$T/archive.list")
pkg_check "it holds no build or test output${junk:+: $junk}" test -z "$junk"
mkdir "$T/unpacked"
python3 -m zipfile -e "$ARCHIVE" "$T/unpacked"
perl "$VALIDATOR" --root "$T/unpacked/idempotency-$PKG_VERSION" \
	"$T/unpacked/idempotency-$PKG_VERSION/META.json" >/dev/null
pkg_check "its META.json is valid and names files it has" test $? -eq 0
pkg_check "its META.json is the tree's" cmp -s "$SRC/META.json" "$T/unpacked/idempotency-$PKG_VERSION/META.json"

sed -i 's/"version": "'"$PKG_VERSION"'",/"version": "9.9.9",/' "$T/tree/META.json"
if as_user env DIST_DIR="$T" make -s -C "$T/tree" dist PG_CONFIG="$PG_CONFIG" >"$T/dist-mismatch.out" 2>&1; then
	pkg_fail "make dist made an archive although META.json says 9.9.9"
else
	printf 'ok: make dist refuses a META.json version that is not the control file'"'"'s (%s)\n' \
		"$(grep -m1 'META.json version' "$T/dist-mismatch.out" | sed 's/^ *//')"
fi

# ----------------------------------------------------------- 3. pgxn install
pkg_say "pgxn install $ARCHIVE"
pkglibdir=$("$PG_CONFIG" --pkglibdir)
extdir=$("$PG_CONFIG" --sharedir)/extension
(cd "$SRC" && make -s uninstall PG_CONFIG="$PG_CONFIG") >/dev/null
pkg_check "make uninstall removed the library and the control file" \
	test ! -e "$pkglibdir/idempotency.so" -a ! -e "$extdir/idempotency.control"
if (cd "$T" && pgxn install --pg_config "$PG_CONFIG" "$ARCHIVE") >"$T/install.log" 2>&1; then
	echo "ok: pgxn install"
else
	tail -n 40 "$T/install.log"
	pkg_fail "pgxn install failed"
fi
pkg_check "pgxn install put the library and the control file in place" \
	test -f "$pkglibdir/idempotency.so" -a -f "$extdir/idempotency.control" \
	-a -f "$extdir/idempotency--$PKG_VERSION.sql"

# ------------------------------------------------------ 4. pgxn load, check
dir=$T/cluster
port=$(pkg_port 2)
if cluster_start "$dir" "$port" "fsync = off"; then
	cluster_psql "$dir" -q -c 'CREATE DATABASE idem_pgxn' || pkg_fail "CREATE DATABASE"
	if as_user pgxn load --yes --pg_config "$PG_CONFIG" -h "$dir/sock" -p "$port" \
		-d idem_pgxn -U "$CLUSTER_USER" "$ARCHIVE" >"$T/load.log" 2>&1; then
		echo "ok: pgxn load"
	else
		cat "$T/load.log"
		pkg_fail "pgxn load failed"
	fi
	pkg_check "the database has the extension, version $PKG_VERSION" test \
		"$(CLUSTER_DB=idem_pgxn cluster_psql "$dir" -At -c \
			"SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" = "$PKG_VERSION"
	pkg_check "and it works" test \
		"$(CLUSTER_DB=idem_pgxn cluster_psql "$dir" -At -c \
			"SELECT idem_consume_message('pgxn', 'm1') AND NOT idem_consume_message('pgxn', 'm1')")" = t
	cluster_stop "$dir" || pkg_fail "stopping the server"
else
	pkg_fail "the throwaway server did not start"
fi

pkg_say "pgxn check $ARCHIVE (regression suite)"
# "make installcheck" of the archive runs every suite of its Makefile; the
# wrapper keeps the regression suite, which shows that the archive builds,
# installs and works, and leaves out the TAP tests and the isolation specs
# (minutes long; the same code's are run by test/run-all.sh)
printf '#!/bin/sh\nexec make TAP_TESTS= ISOLATION= ISOLATION_PRELOAD= "$@"\n' >"$T/make-without-tap"
chmod 755 "$T/make-without-tap"
start=$SECONDS
if as_user env TMPDIR="$T" pgxn check --pg_config "$PG_CONFIG" \
	--make "$T/make-without-tap" "$ARCHIVE" >"$T/check.log" 2>&1; then
	grep -E 'tests passed|failed' "$T/check.log"
	echo "ok: pgxn check passed in $((SECONDS - start))s"
else
	tail -n 150 "$T/check.log"
	pkg_fail "pgxn check failed"
fi

pkg_result

#!/usr/bin/env bash
#
# tools/dist.sh -- the release archive PGXN takes ("make dist"):
# idempotency-VERSION.zip, every file under one top directory
# idempotency-VERSION/, written to the top of the tree (or to $DIST_DIR).
#
# VERSION is the control file's default_version; the script refuses to make
# an archive when META.json (version, provides.idempotency.version),
# CHANGELOG.md (a "## [VERSION]" section) or debian/changelog disagree
# with it.
#
# The archive holds the tree as it is, without version control, build and
# test output (the same files as .gitignore keeps out of git) and without
# earlier archives; make it from a clean checkout of the release tag.  In a
# git checkout, files git does not track are named on stderr.  Needs
# python3 (its zipfile module writes the archive) and perl (JSON::PP).

set -euo pipefail

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$top"

name=idempotency
version=$(sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" "$name.control")
if [ -z "$version" ]; then
	echo "dist: no default_version in $name.control" >&2
	exit 1
fi

# ------------------------------------------------------------ versions agree
problems=$(perl -MJSON::PP -e '
	my ($version) = @ARGV;
	open(my $fh, "<", "META.json") or die "META.json: $!\n";
	local $/;
	my $meta = JSON::PP->new->decode(<$fh>);
	print "META.json version is $meta->{version}\n"
	  if ($meta->{version} // "") ne $version;
	my $p = $meta->{provides}{idempotency}{version} // "";
	print "META.json provides.idempotency.version is $p\n" if $p ne $version;
' "$version" 2>&1) || true
if ! grep -Eq "^## \[?${version//./\\.}\]?( |$)" CHANGELOG.md; then
	problems+=$'\n'"CHANGELOG.md has no section for $version"
fi
deb_version=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' debian/changelog)
if [ "${deb_version%-*}" != "$version" ]; then
	problems+=$'\n'"debian/changelog is at $deb_version"
fi
problems=$(printf '%s\n' "$problems" | sed '/^$/d')
if [ -n "$problems" ]; then
	echo "dist: $name.control says $version, but:" >&2
	printf '  %s\n' "$problems" >&2
	exit 1
fi

# ------------------------------------------------------------ the files
dest=$(cd "${DIST_DIR:-$top}" && pwd -P)
archive=$dest/$name-$version.zip
stage=$(mktemp -d "${TMPDIR:-/tmp}/$name-dist.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# what .gitignore keeps out (the clients' installed packages and build
# output too), and what packaging and releases leave behind
find . \
	\( -name .git -o -name 'tmp_check*' -o -path ./results -o -path ./output_iso -o -path ./output_iso_preload \
	-o -path ./log -o -path ./bench/results -o -path ./debian/.debhelper \
	-o -path ./debian/tmp -o -path './debian/postgresql-*-idempotency' \
	-o -name node_modules -o -name __pycache__ -o -name .pytest_cache \
	-o -name '*.egg-info' -o -path ./clients/python/build -o -path ./clients/python/dist \) -prune -o \
	\( -type f -o -type l \) \
	! -name '*.o' ! -name '*.so' ! -name '*.bc' ! -name '*.zip' ! -name '*.deb' \
	! -name '*.tgz' ! -name '*.whl' \
	! -path ./regression.diffs ! -path ./regression.out \
	! -path ./debian/files ! -path './debian/*.substvars' \
	! -path ./debian/debhelper-build-stamp \
	-print | sed 's|^\./||' | LC_ALL=C sort >"$stage/files"

if git -C "$top" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	untracked=$(git -C "$top" ls-files | LC_ALL=C sort | LC_ALL=C comm -23 "$stage/files" -)
	if [ -n "$untracked" ]; then
		echo "dist: warning: files git does not track are in the archive:" >&2
		printf '  %s\n' "$untracked" >&2
	fi
fi

mkdir "$stage/$name-$version"
tar -C "$top" -cf - -T "$stage/files" | tar -C "$stage/$name-$version" -xf -
rm -f "$archive"
(cd "$stage" && python3 -m zipfile -c "$archive" "$name-$version/")
echo "$archive ($(wc -l <"$stage/files") files)"

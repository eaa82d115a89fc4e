# test/t/005_docs.pl -- the documentation matches the extension.
#
# Checks doc/reference.md, META.json and CHANGELOG.md against the extension
# as installed (CREATE EXTENSION idempotency on a node that preloads the
# library, so that every setting is defined) and against the source tree:
#
#   - every function of the extension (pg_depend deptype 'e') has a heading
#     that starts with its signature as the catalog has it (IN arguments with
#     their defaults, casts dropped, timestamptz for timestamp with time
#     zone), names its result type unless it returns a record, and its
#     section names every argument and result column;
#   - every view has a heading, and its section a table row "| `column` |"
#     per column giving the column's type as a code span;
#   - every idempotency.* setting in pg_settings has a heading, and its
#     section gives its type, unit, default, minimum, maximum and context as
#     code spans, as pg_settings has them;
#   - no heading documents a function, view or setting that does not exist,
#     except under a "##" section titled with a version later than the
#     control file's default_version (reference written ahead of the code);
#   - every SQLSTATE named in the reference is raised by an errcode() in src/
#     or by PostgreSQL on the extension's behalf (%PG_RAISED below), is
#     followed by its own condition name where one is given, and every
#     errcode() in src/ is named in the reference;
#   - META.json parses, follows meta-spec 1.0.0, and its version, the
#     control file's default_version and the installed extension's version
#     agree; the files it names exist;
#   - CHANGELOG.md has a section for that version, and debian/changelog's
#     latest entry is that version (with a Debian revision);
#   - README.md stays a newcomer's page: at most 15 KB (the reference lives
#     in doc/reference.md);
#   - every relative link in README.md, doc/*.md, bench/README.md,
#     CHANGELOG.md and examples/*/README.md names a file of the tree, and
#     its #anchor a heading of that file (GitHub's anchors);
#   - every metric contrib/prometheus/idempotency-queries.yaml defines is
#     documented in doc/monitoring.md, and every metric the alert rules use
#     is one the query file defines.
#
# While a version bump is under way (META.json already at the next version,
# the control file not yet), the version checks fail, and say so.
#
# Run: make installcheck REGRESS= ISOLATION= PROVE_TESTS=test/t/005_docs.pl
# (from the top of the tree, as a user that may run initdb).

use strict;
use warnings;
use utf8;

use Cwd qw(abs_path);
use Encode qw(encode);
use FindBin;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The top of the tree: two levels above this file, or TESTDIR (set by PGXS
# to the directory make ran in).
my $root;
for my $candidate ("$FindBin::RealBin/../..", $ENV{TESTDIR} // '')
{
	next if $candidate eq '' || !-f "$candidate/idempotency.control";
	$root = abs_path($candidate);
	last;
}
BAIL_OUT('cannot find the top of the source tree (idempotency.control)')
  unless defined $root;

# SQLSTATEs PostgreSQL raises on the extension's behalf, which the
# reference may name although no errcode() in src/ raises them.
my %PG_RAISED = (
	'42501' => 'privilege checks: EXECUTE, SET on a parameter, schema USAGE',
	'42704' => 'get_role_oid(): an imported row names a role this node lacks',
	'55P03' => 'lock_timeout while a call waits',
	'57014' => 'statement_timeout while a call waits',
	'40P01' => 'deadlock detection while a call waits',
	'42602' => 'unknown name under the reserved idempotency. prefix',
	'22023' => 'a setting out of range or malformed',
	'25000' => 'PreventCommandIfParallelMode(), called by the writing functions',
	'55P02' => 'SET of a sighup setting in a session',
	'22P02' => 'the input function of a distributed ledger\'s tenant type (citus.c)',);

sub slurp_utf8
{
	my ($path) = @_;
	open(my $fh, '<:encoding(UTF-8)', $path) or die "could not open $path: $!";
	local $/;
	my $text = <$fh>;
	close($fh);
	return $text;
}

# version strings compare numerically, part by part
sub version_cmp
{
	my @a = split /\./, shift;
	my @b = split /\./, shift;
	while (@a || @b)
	{
		my $c = (shift(@a) // 0) <=> (shift(@b) // 0);
		return $c if $c;
	}
	return 0;
}

# ------------------------------------------------------------ the tree
my $control = slurp_utf8("$root/idempotency.control");
my ($control_version) = $control =~ /^\s*default_version\s*=\s*'([^']+)'/m;
ok(defined $control_version, 'idempotency.control has a default_version')
  or BAIL_OUT('no default_version in idempotency.control');

# ------------------------------------------------------- the reference
#
# Headings outside fenced code blocks, each with its section (the lines up
# to the next heading of the same or a higher level) and the words of its
# heading and of the code spans in its section.
my $reference_path = "$root/doc/reference.md";
my @lines = split /\n/, slurp_utf8($reference_path);
my @headings;
my @code_spans;    # every code span of the reference, outside fences
{
	my $in_fence = 0;
	my $pending_version;    # version of the "##" section we are in, if later
	for my $i (0 .. $#lines)
	{
		my $line = $lines[$i];
		if ($line =~ /^\s*(```|~~~)/)
		{
			$in_fence = !$in_fence;
			next;
		}
		next if $in_fence;
		push @code_spans, $1 while $line =~ /`([^`]+)`/g;
		next unless $line =~ /^(#{1,6})\s+(.*?)\s*#*\s*$/;
		my ($level, $text) = (length($1), $2);
		(my $plain = $text) =~ s/`//g;
		if ($level <= 2)
		{
			$pending_version = undef;
			$pending_version = $1
			  if $level == 2
			  && $plain =~ /\b(\d+\.\d+\.\d+)\b/
			  && version_cmp($1, $control_version) > 0;
		}
		push @headings,
		  {
			line => $i,
			level => $level,
			plain => $plain,
			pending => $pending_version
		  };
	}
	for my $h (0 .. $#headings)
	{
		my $end = $#lines;
		for my $next ($h + 1 .. $#headings)
		{
			if ($headings[$next]{level} <= $headings[$h]{level})
			{
				$end = $headings[$next]{line} - 1;
				last;
			}
		}
		my @section;
		my $in = 0;
		for my $line (@lines[ $headings[$h]{line} + 1 .. $end ])
		{
			if ($line =~ /^\s*(```|~~~)/) { $in = !$in; next; }
			push @section, $line unless $in;
		}
		my %words = map { $_ => 1 } ($headings[$h]{plain} =~ /\w+/g);
		my %spans;
		for my $line (@section)
		{
			while ($line =~ /`([^`]+)`/g)
			{
				$spans{$1} = 1;
				$words{$_} = 1 for ($1 =~ /\w+/g);
			}
		}
		$headings[$h]{section} = \@section;
		$headings[$h]{words} = \%words;
		$headings[$h]{spans} = \%spans;
	}
}

# ------------------------------------------------------------ the node
my $node = PostgreSQL::Test::Cluster->new('docs');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idempotency'");
$node->start;

is( $node->safe_psql(
		'postgres',
		"SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency'"
	),
	$control_version,
	"the installed extension is this tree's (default_version $control_version; "
	  . 'otherwise run make install)');

$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');

my $members = q{
  FROM pg_catalog.pg_depend d
 WHERE d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
   AND d.refobjid = (SELECT oid FROM pg_catalog.pg_extension
                      WHERE extname = 'idempotency')
   AND d.deptype = 'e'};

# name, IN arguments as in a heading, result, every argument name
my @functions = map { [ split /\x1f/, $_, -1 ] } split /\n/,
  $node->safe_psql(
	'postgres', qq{
SELECT concat_ws(chr(31),
         CASE WHEN n.nspname = 'pg_catalog' THEN p.proname
              ELSE n.nspname || '.' || p.proname END,
         coalesce((SELECT string_agg(a.name || ' ' ||
                                     replace(format_type(a.typ, NULL),
                                             'timestamp with time zone', 'timestamptz') ||
                                     coalesce(' DEFAULT ' ||
                                              regexp_replace(pg_get_function_arg_default(p.oid, a.i::int),
                                                             '::[a-z ]+(\\[\\])?\$', ''), ''),
                                     ', ' ORDER BY a.i)
                     FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]),
                                 coalesce(p.proargnames, array_fill(''::text, ARRAY[p.pronargs])),
                                 coalesce(p.proargmodes, array_fill('i'::"char", ARRAY[p.pronargs])))
                          WITH ORDINALITY AS a(typ, name, mode, i)
                    WHERE a.mode IN ('i', 'b', 'v')), ''),
         pg_get_function_result(p.oid),
         coalesce(array_to_string(p.proargnames, ' '), ''))
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.oid IN (SELECT d.objid $members AND d.classid = 'pg_proc'::regclass)
 ORDER BY 1});
ok(scalar(@functions) > 0, 'the extension has functions');

# view, column, type
my @view_columns = map { [ split /\x1f/, $_, -1 ] } split /\n/,
  $node->safe_psql(
	'postgres', qq{
SELECT concat_ws(chr(31), c.oid::regclass::text, a.attname,
                 replace(format_type(a.atttypid, a.atttypmod),
                         'timestamp with time zone', 'timestamptz'))
  FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relkind IN ('v', 'm')
   AND c.oid IN (SELECT d.objid $members AND d.classid = 'pg_class'::regclass)
 ORDER BY c.oid::regclass::text, a.attnum});
my %views;
push @{ $views{ $_->[0] } }, [ $_->[1], $_->[2] ] for @view_columns;
ok(scalar(keys %views) > 0, 'the extension has views');

# name, type, unit, default, min, max, context
my @settings = map { [ split /\x1f/, $_, -1 ] } split /\n/,
  $node->safe_psql(
	'postgres', q{
SELECT concat_ws(chr(31), name, vartype, coalesce(unit, ''), coalesce(boot_val, ''),
                 coalesce(min_val, ''), coalesce(max_val, ''), context)
  FROM pg_settings WHERE name LIKE 'idempotency.%' ORDER BY name});
ok(scalar(@settings) > 0, 'idempotency.* settings are defined');

# ------------------------------------------- every object is documented
for my $f (@functions)
{
	my ($name, $args, $result, $argnames) = @$f;
	my $signature = "$name($args)";
	my ($h) = grep { index($_->{plain}, $signature) == 0 } @headings;
	if (!ok($h, "function $signature has a heading in doc/reference.md"))
	{
		my @near = grep { index($_->{plain}, "$name(") == 0 } @headings;
		diag(encode('UTF-8', "reference heading: $_->{plain}")) for @near;
		diag("no heading starts with $name(") unless @near;
		next;
	}
	if ($result !~ /\brecord\b|^TABLE\(/)
	{
		ok($h->{plain} =~ /(?:→|->)\s*\Q$result\E\s*$/,
			"heading of $name gives its result type $result")
		  or diag(encode('UTF-8', "heading: $h->{plain}"));
	}
	my @missing = grep { $_ ne '' && !$h->{words}{$_} } split / /, $argnames;
	ok(!@missing,
		"section of $name names every argument and result column")
	  or diag("not named: @missing");
}

for my $view (sort keys %views)
{
	my ($h) = grep { $_->{plain} =~ /^(?:View\s+)?\Q$view\E$/ } @headings;
	next unless ok($h, "view $view has a heading in doc/reference.md");
	for my $col (@{ $views{$view} })
	{
		my ($column, $type) = @$col;
		my ($row) = grep { /^\|\s*`\Q$column\E`\s*\|/ } @{ $h->{section} };
		ok($row, "view $view: column $column has a row in its table")
		  && like($row, qr/`\Q$type\E`/,
			"view $view: column $column is documented as $type");
	}
}

for my $s (@settings)
{
	my ($name, $vartype, $unit, $boot, $min, $max, $context) = @$s;
	my ($h) = grep { $_->{plain} eq $name } @headings;
	next unless ok($h, "setting $name has a heading in doc/reference.md");
	my %want = (
		type => $vartype,
		unit => $unit,
		default => $boot,
		minimum => $min,
		maximum => $max,
		context => $context);
	for my $what (qw(type unit default minimum maximum context))
	{
		next if $want{$what} eq '';
		ok($h->{spans}{ $want{$what} },
			"setting $name: section gives its $what `$want{$what}`");
	}
}

# ------------------------------- every documented object exists
{
	my %function_names = map { $_->[0] => 1 } @functions;
	my %setting_names = map { $_->[0] => 1 } @settings;
	for my $h (@headings)
	{
		my ($kind, $name, $exists);
		if ($h->{plain} =~ /^((?:idem_|idempotency\.)\w+)\(/)
		{
			($kind, $name, $exists) = ('function', $1, $function_names{$1});
		}
		elsif ($h->{plain} =~ /^View\s+(\S+)$/)
		{
			($kind, $name, $exists) = ('view', $1, $views{$1});
		}
		elsif ($h->{plain} =~ /^(idempotency\.\w+)$/)
		{
			($kind, $name, $exists) = ('setting', $1, $setting_names{$1});
		}
		else
		{
			next;
		}
		if (defined $h->{pending})
		{
			note("$kind $name: documented for $h->{pending}, "
				  . ($exists ? 'present' : 'not present yet'));
			next;
		}
		ok($exists, "documented $kind $name exists in the extension");
	}
}

# ------------------------------------------------------------- SQLSTATEs
SKIP:
{
	my $errcodes_path = $node->config_data('--sharedir') . '/errcodes.txt';
	skip "no $errcodes_path", 1 unless -f $errcodes_path;

	my (%code_of_macro, %names_of_code);
	for (split /\n/, slurp_utf8($errcodes_path))
	{
		next unless /^([0-9A-Z]{5})\s+[EWS]\s+(ERRCODE_\w+)(?:\s+(\w+))?/;
		$code_of_macro{$2} = $1;
		$names_of_code{$1}{$3} = 1 if defined $3;
	}

	# the extension's own SQLSTATEs (class ID, no condition names):
	# "#define ERRCODE_IDEM_... MAKE_SQLSTATE('I','D','0','0','1')"
	my %own_code;
	opendir(my $ch, "$root/src") or die "could not open $root/src: $!";
	for my $file (sort grep { /\.[ch]$/ } readdir($ch))
	{
		my $text = slurp_utf8("$root/src/$file");
		while ($text =~ /#define\s+(ERRCODE_IDEM_\w+)\s+MAKE_SQLSTATE\('(.)',\s*'(.)',\s*'(.)',\s*'(.)',\s*'(.)'\)/g)
		{
			$code_of_macro{$1} = "$2$3$4$5$6";
			$own_code{"$2$3$4$5$6"} = 1;
		}
	}
	closedir($ch);

	my %raised;    # SQLSTATE => where
	opendir(my $dh, "$root/src") or die "could not open $root/src: $!";
	for my $file (sort grep { /\.[ch]$/ } readdir($dh))
	{
		my $text = slurp_utf8("$root/src/$file");
		while ($text =~ /\berrcode\(\s*(ERRCODE_\w+)\s*\)/g)
		{
			my $code = $code_of_macro{$1};
			ok(defined $code, "src/$file: $1 is a known errcode") or next;
			$raised{$code} //= "src/$file";
		}
	}
	closedir($dh);

	my %documented = map { $_ => 1 } grep { $names_of_code{$_} || $own_code{$_} } @code_spans;
	for my $code (sort keys %documented)
	{
		ok( $raised{$code} || $PG_RAISED{$code},
			"SQLSTATE $code named in the reference is raised by src/ or by PostgreSQL"
		);
	}
	for my $code (sort keys %raised)
	{
		ok($documented{$code},
			"SQLSTATE $code raised in $raised{$code} is named in the reference");
	}

	# "`22004` null_value_not_allowed": the name belongs to the code
	for my $line (@lines)
	{
		while ($line =~ /`([0-9A-Z]{5})`\s+([a-z][a-z0-9]*_[a-z0-9_]+)/g)
		{
			my ($code, $name) = ($1, $2);
			next unless $names_of_code{$code};
			ok($names_of_code{$code}{$name},
				"SQLSTATE $code is condition $name")
			  or diag("condition names of $code: "
				  . join(', ', sort keys %{ $names_of_code{$code} }));
		}
	}
}

# ------------------------------------------------ META.json, CHANGELOG.md
# the file is read as UTF-8 characters, so decode without ->utf8
my $meta = eval { JSON::PP->new->decode(slurp_utf8("$root/META.json")) };
ok($meta, 'META.json parses') or diag($@);
SKIP:
{
	skip 'META.json does not parse', 1 unless $meta;

	for my $key (qw(name abstract version maintainer license provides meta-spec))
	{
		ok(exists $meta->{$key}, "META.json has $key");
	}
	is($meta->{'meta-spec'}{version}, '1.0.0', 'META.json: meta-spec 1.0.0');
	is($meta->{name}, 'idempotency', 'META.json: name');
	is($meta->{version}, $control_version,
		"META.json version matches default_version '$control_version' of "
		  . 'idempotency.control (a mismatch is expected while a version bump '
		  . 'is under way: META.json goes first, the control file and install '
		  . 'script follow)');

	my $provides = $meta->{provides}{idempotency} // {};
	is($provides->{version}, $meta->{version},
		'META.json: provides.idempotency.version is the release version');
	for my $key (qw(file docfile))
	{
		my $path = $provides->{$key} // '';
		ok($path ne '' && -f "$root/$path",
			"META.json: provides.idempotency.$key '$path' exists in the tree");
	}

	# the supported range: ">= 15.0.0, < 19.0.0" (meta-spec version range)
	my $pg = $meta->{prereqs}{runtime}{requires}{PostgreSQL} // '';
	like($pg, qr/^>= \d+\.\d+\.\d+, < \d+\.\d+\.\d+$/,
		'META.json: prereqs.runtime.requires.PostgreSQL is a version range');
	my ($min_major, $past_major) = $pg =~ /^>= (\d+)\.\d+\.\d+, < (\d+)\./;
	my $makefile = slurp_utf8("$root/Makefile");
	if ($makefile =~ /VERSION_NUM\)\s+-lt\s+(\d+)0000\b/)
	{
		is($min_major, $1,
			'META.json: minimum PostgreSQL is the Makefile\'s minimum');
	}
	my $readme = slurp_utf8("$root/README.md");
	for my $major ($min_major .. $past_major - 1)
	{
		like($readme, qr/^\| $major \|/m,
			"README: the supported versions table has a row for PostgreSQL $major");
	}

	my $changelog = slurp_utf8("$root/CHANGELOG.md");
	for my $version ($control_version, $meta->{version})
	{
		like($changelog, qr/^##\s+\[?\Q$version\E\]?(?:\s|$)/m,
			"CHANGELOG.md has a section for $version");
	}
}

# ------------------------------------------------------- debian/changelog
{
	my ($deb_version) =
	  slurp_utf8("$root/debian/changelog") =~ /\A\S+ \(([^)]+)\)/;
	like($deb_version // '', qr/^\Q$control_version\E-[0-9A-Za-z.+~]+$/,
		"debian/changelog's latest entry is $control_version-<revision>");
}

# ---------------------------------------------------------------- README
my $readme_bytes = -s "$root/README.md";
ok($readme_bytes <= 15 * 1024,
	"README.md is at most 15 KB ($readme_bytes bytes): the reference belongs in doc/");

# -------------------------------------------------------------- links
# GitHub's anchor for a heading: lower case, punctuation dropped (but
# hyphens and underscores), spaces to hyphens; repeats get -1, -2, ...
sub anchors_of
{
	my ($path) = @_;
	my (%anchors, %seen);
	my $in_fence = 0;
	for my $line (split /\n/, slurp_utf8($path))
	{
		if ($line =~ /^\s*(```|~~~)/) { $in_fence = !$in_fence; next; }
		next if $in_fence || $line !~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
		my $text = $1;
		$text =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;    # links keep their text
		my $slug = lc $text;
		$slug =~ s/[^\p{Word}\- ]//g;
		$slug =~ s/ /-/g;
		my $n = $seen{$slug}++;
		$anchors{ $n ? "$slug-$n" : $slug } = 1;
	}
	return \%anchors;
}

# The relative links of markdown TEXT, a file at path DOC of the tree:
# returns how many there are and a description of each broken one.
my %anchor_cache;
sub check_links
{
	my ($doc, $text) = @_;
	(my $dir = $doc) =~ s{[^/]*$}{};
	my @bad;
	my $n = 0;
	my $in_fence = 0;
	for my $line (split /\n/, $text)
	{
		if ($line =~ /^\s*(```|~~~)/) { $in_fence = !$in_fence; next; }
		next if $in_fence;
		(my $prose = $line) =~ s/`[^`]*`//g;
		while ($prose =~ /\]\(([^)\s]+)\)/g)
		{
			my $target = $1;
			next if $target =~ m{^[a-z][a-z0-9+.-]*:}i;    # http:, mailto:
			$n++;
			my ($file, $anchor) = $target =~ /^([^#]*)(?:#(.*))?$/;
			my $path = $file eq '' ? $doc : "$dir$file";
			1 while $path =~ s{(^|/)(?!\.\./)[^/]+/\.\./}{$1};
			$path =~ s{/$}{};
			if (!-e "$root/$path")
			{
				push @bad, "$target (no $path)";
				next;
			}
			next unless defined $anchor && $anchor ne '';
			if ($path !~ /\.md$/ || -d "$root/$path")
			{
				push @bad, "$target (an anchor into a file that is not markdown)";
				next;
			}
			$anchor_cache{$path} //= anchors_of("$root/$path");
			push @bad, "$target (no heading #$anchor in $path)"
			  unless $anchor_cache{$path}{$anchor};
		}
	}
	return ($n, @bad);
}

{
	# the check can fail: a missing file and a missing heading are caught
	my ($n, @bad) = check_links('README.md',
		    "[a](doc/nothing.md), [b](doc/reference.md#no-such-heading), "
		  . "[c](doc/reference.md#views), `[d](not/a/link.md)`");
	ok($n == 3 && @bad == 2,
		'the link check finds a missing file and a missing heading')
	  or diag("links: $n, broken: @bad");

	opendir(my $dh, "$root/doc") or die "could not open $root/doc: $!";
	my @docs = map { "doc/$_" } sort grep { /\.md$/ } readdir($dh);
	closedir($dh);
	opendir($dh, "$root/examples") or die "could not open $root/examples: $!";
	push @docs, map { "examples/$_/README.md" }
	  sort grep { !/^\./ && -f "$root/examples/$_/README.md" } readdir($dh);
	closedir($dh);
	for my $doc ('README.md', 'CHANGELOG.md', 'bench/README.md', @docs)
	{
		($n, @bad) = check_links($doc, slurp_utf8("$root/$doc"));
		if (!ok(!@bad, "$doc: its $n relative links resolve"))
		{
			diag("broken link in $doc: $_") for @bad;
		}
	}
}

# ------------------------------------------------------------ monitoring
{
	require CPAN::Meta::YAML;
	my $queries_path = "$root/contrib/prometheus/idempotency-queries.yaml";
	my $yaml = CPAN::Meta::YAML->read_string(slurp_utf8($queries_path))
	  or BAIL_OUT("$queries_path: " . CPAN::Meta::YAML->errstr);
	my %defined;
	for my $namespace (sort keys %{ $yaml->[0] })
	{
		for my $m (@{ $yaml->[0]{$namespace}{metrics} // [] })
		{
			my ($column, $spec) = %$m;
			next if ($spec->{usage} // '') eq 'LABEL';
			$defined{"${namespace}_$column"} = 1;
		}
	}
	ok(scalar(keys %defined) > 0, 'the query file defines metrics');
	my $monitoring = slurp_utf8("$root/doc/monitoring.md");
	my @undocumented = grep { $monitoring !~ /`\Q$_\E`/ } sort keys %defined;
	ok(!@undocumented,
		'doc/monitoring.md documents every metric of the query file')
	  or diag("not documented: @undocumented");
	my $alerts = slurp_utf8("$root/contrib/prometheus/idempotency-alerts.yml");
	my %used = map { $_ => 1 } $alerts =~ /\b(idempotency_[a-z_]+)/g;
	my @unknown = grep { !$defined{$_} } sort keys %used;
	ok(!@unknown && %used,
		'the alert rules use only metrics the query file defines')
	  or diag("unknown: @unknown");
}

$node->stop;
done_testing();

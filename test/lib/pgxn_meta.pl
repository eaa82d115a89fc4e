#!/usr/bin/perl
#
# test/lib/pgxn_meta.pl -- validate a META.json against the PGXN Meta Spec
# 1.0.0 (https://pgxn.org/meta/spec.txt), as PGXN Manager does on upload.
# Debian packages no validator (PGXN::Meta::Validator is on CPAN only), so
# this one checks what the spec requires:
#
#   - the required keys (name, abstract, version, maintainer, license,
#     provides, meta-spec), and no keys but the spec's and custom "x_" ones,
#     at the top and in every nested object the spec defines;
#   - name and prerequisite names are Terms (two or more characters, no
#     slash, backslash, control or space character); tags are Tags;
#   - versions are semantic versions (major.minor.patch, optional
#     pre-release and build parts);
#   - license is a known license string, a list of them, or an object of
#     name => URL;
#   - maintainer is a non-empty string or a list of them;
#   - provides maps each extension to an object with file and version
#     (and optionally abstract, docfile, docpath);
#   - prereqs: phases configure/build/test/runtime/develop, relations
#     requires/recommends/suggests/conflicts, each prerequisite a version
#     range ("0", a version, or comma-separated "op version" parts);
#   - resources: homepage, bugtracker {web, mailto}, repository {url, web,
#     type}; no_index {file, directory}; release_status; meta-spec version
#     1.0.x and its URL.
#
# With --root DIR, the files provides names must exist below DIR.
#
#   perl test/lib/pgxn_meta.pl [--root DIR] META.json
#
# Prints one line per problem; exit status 0 if there is none, 1 if there
# are, 2 if the file cannot be read or is not JSON.

use strict;
use warnings;

use JSON::PP;

my $root;
if (@ARGV && $ARGV[0] eq '--root')
{
	shift @ARGV;
	$root = shift @ARGV;
}
my $path = shift @ARGV or die "usage: $0 [--root DIR] META.json\n";

open(my $fh, '<:raw', $path) or do { print "$path: $!\n"; exit 2 };
my $text = do { local $/; <$fh> };
close($fh);
my $meta = eval { JSON::PP->new->utf8->decode($text) };
if (!defined $meta)
{
	print "$path: not JSON: $@";
	exit 2;
}

my @problems;
sub problem { push @problems, join('', @_) }

my %LICENSES = map { $_ => 1 } qw(
  agpl_3 apache_1_1 apache_2_0 artistic_1 artistic_2 bsd freebsd gfdl_1_2
  gfdl_1_3 gpl_1 gpl_2 gpl_3 lgpl_2_1 lgpl_3_0 mit mozilla_1_0 mozilla_1_1
  openssl perl_5 postgresql qpl_1_0 ssleay sun zlib open_source restricted
  unrestricted unknown);

my $NUM = qr/(?:0|[1-9][0-9]*)/;
my $IDENT = qr/(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)/;
my $SEMVER = qr/$NUM\.$NUM\.$NUM(?:-$IDENT(?:\.$IDENT)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?/;

sub is_string { my ($v) = @_; defined $v && !ref $v && !JSON::PP::is_bool($v) }
sub is_object { ref $_[0] eq 'HASH' }
sub is_array  { ref $_[0] eq 'ARRAY' }
sub custom_key { $_[0] =~ /^[xX]_./ }

sub check_keys
{
	my ($where, $obj, $allowed, $required) = @_;
	for my $k (sort keys %$obj)
	{
		problem("$where: unknown key \"$k\"")
		  unless $allowed->{$k} || custom_key($k);
	}
	for my $k (@$required)
	{
		problem("$where: required key \"$k\" is missing")
		  unless exists $obj->{$k};
	}
}

sub check_term
{
	my ($where, $v) = @_;
	problem("$where: \"", $v // 'null', "\" is not a Term (2+ characters, no slash, backslash, space or control character)")
	  unless is_string($v) && $v =~ m{^[^/\\\s\p{Cntrl}]{2,}$};
}

sub check_version
{
	my ($where, $v) = @_;
	problem("$where: \"", $v // 'null', "\" is not a semantic version (major.minor.patch)")
	  unless is_string($v) && $v =~ /^$SEMVER$/;
}

sub check_nonempty
{
	my ($where, $v) = @_;
	problem("$where: must be a non-empty string")
	  unless is_string($v) && length $v;
}

sub check_uri
{
	my ($where, $v) = @_;
	problem("$where: \"", $v // 'null', "\" is not a URI")
	  unless is_string($v) && $v =~ m{^[A-Za-z][A-Za-z0-9+.-]*:\S+$};
}

sub check_path
{
	my ($where, $v) = @_;
	problem("$where: \"", $v // 'null', "\" is not a relative path")
	  unless is_string($v) && length($v) >= 2 && $v !~ m{^/} && $v !~ m{(^|/)\.\.(/|$)} && $v !~ /\\/;
}

sub check_range
{
	my ($where, $v) = @_;
	return if defined $v && !ref $v && $v =~ /^0$/ && !JSON::PP::is_bool($v);
	my $part = qr/(?:(?:[=!]=|[<>]=?)\s*)?$SEMVER/;
	problem("$where: \"", $v // 'null', "\" is not a version range (0, a version, or \"op version\" parts separated by commas)")
	  unless is_string($v) && ($v eq '0' || $v =~ /^$part(?:,\s*$part)*$/);
}

# ------------------------------------------------------------ top level
if (!is_object($meta))
{
	print "$path: the top level is not an object\n";
	exit 1;
}
check_keys('META.json', $meta,
	{ map { $_ => 1 } qw(name abstract description version maintainer license
		  provides meta-spec generated_by tags no_index prereqs release_status resources) },
	[qw(name abstract version maintainer license provides meta-spec)]);

check_term('name', $meta->{name}) if exists $meta->{name};
check_version('version', $meta->{version}) if exists $meta->{version};
for my $k (qw(abstract description generated_by))
{
	check_nonempty($k, $meta->{$k}) if exists $meta->{$k};
}

if (exists $meta->{maintainer})
{
	my $m = $meta->{maintainer};
	if (is_array($m))
	{
		problem('maintainer: empty list') unless @$m;
		check_nonempty("maintainer[$_]", $m->[$_]) for 0 .. $#$m;
	}
	else
	{
		check_nonempty('maintainer', $m);
	}
}

if (exists $meta->{license})
{
	my $l = $meta->{license};
	if (is_object($l))
	{
		problem('license: empty object') unless %$l;
		check_uri("license.$_", $l->{$_}) for sort keys %$l;
	}
	else
	{
		my @l = is_array($l) ? @$l : ($l);
		problem('license: empty list') unless @l;
		for my $x (@l)
		{
			problem("license: \"", $x // 'null', "\" is not a license string of the spec")
			  unless is_string($x) && $LICENSES{$x};
		}
	}
}

if (exists $meta->{'meta-spec'})
{
	my $ms = $meta->{'meta-spec'};
	if (!is_object($ms))
	{
		problem('meta-spec: must be an object');
	}
	else
	{
		check_keys('meta-spec', $ms, { version => 1, url => 1 }, ['version']);
		problem("meta-spec.version: \"", $ms->{version} // 'null', "\" is not 1.0.x")
		  unless is_string($ms->{version}) && $ms->{version} =~ /^1\.0\.[0-9]+$/;
		problem("meta-spec.url: \"$ms->{url}\" is not the spec's URL")
		  if exists $ms->{url}
		  && !(is_string($ms->{url}) && $ms->{url} =~ m{^https?://pgxn\.org/meta/spec\.txt$});
	}
}

if (exists $meta->{provides})
{
	my $p = $meta->{provides};
	if (!is_object($p) || !%$p)
	{
		problem('provides: must be a non-empty object');
	}
	else
	{
		for my $ext (sort keys %$p)
		{
			check_term("provides key", $ext);
			my $e = $p->{$ext};
			if (!is_object($e))
			{
				problem("provides.$ext: must be an object");
				next;
			}
			check_keys("provides.$ext", $e,
				{ map { $_ => 1 } qw(file version abstract docfile docpath) },
				[qw(file version)]);
			check_path("provides.$ext.file", $e->{file}) if exists $e->{file};
			check_version("provides.$ext.version", $e->{version}) if exists $e->{version};
			check_nonempty("provides.$ext.abstract", $e->{abstract}) if exists $e->{abstract};
			check_path("provides.$ext.docfile", $e->{docfile}) if exists $e->{docfile};
			check_nonempty("provides.$ext.docpath", $e->{docpath}) if exists $e->{docpath};
			if (defined $root)
			{
				for my $k (qw(file docfile))
				{
					next unless is_string($e->{$k});
					problem("provides.$ext.$k: $e->{$k} is not in $root")
					  unless -f "$root/$e->{$k}";
				}
			}
		}
	}
}

if (exists $meta->{tags})
{
	my $t = $meta->{tags};
	if (!is_array($t) || !@$t)
	{
		problem('tags: must be a non-empty list');
	}
	else
	{
		my %seen;
		for my $tag (@$t)
		{
			problem("tags: \"", $tag // 'null', "\" is not a Tag (2 to 255 characters, no slash, backslash or control character)")
			  unless is_string($tag) && $tag =~ m{^[^/\\\p{Cntrl}]{2,255}$};
			problem("tags: \"$tag\" appears twice") if is_string($tag) && $seen{$tag}++;
		}
	}
}

if (exists $meta->{release_status})
{
	problem("release_status: \"", $meta->{release_status} // 'null', "\" is not stable, testing or unstable")
	  unless is_string($meta->{release_status})
	  && $meta->{release_status} =~ /^(?:stable|testing|unstable)$/;
}

if (exists $meta->{prereqs})
{
	my $pr = $meta->{prereqs};
	if (!is_object($pr) || !%$pr)
	{
		problem('prereqs: must be a non-empty object');
	}
	else
	{
		check_keys('prereqs', $pr,
			{ map { $_ => 1 } qw(configure build test runtime develop) }, []);
		for my $phase (grep { !custom_key($_) } sort keys %$pr)
		{
			my $ph = $pr->{$phase};
			if (!is_object($ph) || !%$ph)
			{
				problem("prereqs.$phase: must be a non-empty object");
				next;
			}
			check_keys("prereqs.$phase", $ph,
				{ map { $_ => 1 } qw(requires recommends suggests conflicts) }, []);
			for my $rel (grep { !custom_key($_) } sort keys %$ph)
			{
				my $r = $ph->{$rel};
				if (!is_object($r) || !%$r)
				{
					problem("prereqs.$phase.$rel: must be a non-empty object");
					next;
				}
				for my $dep (sort keys %$r)
				{
					check_term("prereqs.$phase.$rel key", $dep);
					check_range("prereqs.$phase.$rel.$dep", $r->{$dep});
				}
			}
		}
	}
}

if (exists $meta->{resources})
{
	my $r = $meta->{resources};
	if (!is_object($r) || !%$r)
	{
		problem('resources: must be a non-empty object');
	}
	else
	{
		check_keys('resources', $r, { homepage => 1, bugtracker => 1, repository => 1 }, []);
		check_uri('resources.homepage', $r->{homepage}) if exists $r->{homepage};
		if (exists $r->{bugtracker})
		{
			my $b = $r->{bugtracker};
			if (!is_object($b) || !(exists $b->{web} || exists $b->{mailto}))
			{
				problem('resources.bugtracker: must be an object with web or mailto');
			}
			else
			{
				check_keys('resources.bugtracker', $b, { web => 1, mailto => 1 }, []);
				check_uri('resources.bugtracker.web', $b->{web}) if exists $b->{web};
				problem('resources.bugtracker.mailto: not an email address')
				  if exists $b->{mailto}
				  && !(is_string($b->{mailto}) && $b->{mailto} =~ /^[^@\s]+@[^@\s]+$/);
			}
		}
		if (exists $r->{repository})
		{
			my $rp = $r->{repository};
			if (!is_object($rp)
				|| !((exists $rp->{url} && exists $rp->{type}) || exists $rp->{web}))
			{
				problem('resources.repository: must be an object with url and type, or web');
			}
			else
			{
				check_keys('resources.repository', $rp, { url => 1, web => 1, type => 1 }, []);
				check_uri("resources.repository.$_", $rp->{$_})
				  for grep { exists $rp->{$_} } qw(url web);
				problem('resources.repository.type: must be a lower-case word')
				  if exists $rp->{type}
				  && !(is_string($rp->{type}) && $rp->{type} =~ /^[a-z]+$/);
			}
		}
	}
}

if (exists $meta->{no_index})
{
	my $n = $meta->{no_index};
	if (!is_object($n) || !(exists $n->{file} || exists $n->{directory}))
	{
		problem('no_index: must be an object with file or directory');
	}
	else
	{
		check_keys('no_index', $n, { file => 1, directory => 1 }, []);
		for my $k (grep { exists $n->{$_} } qw(file directory))
		{
			my @v = is_array($n->{$k}) ? @{ $n->{$k} } : ($n->{$k});
			problem("no_index.$k: empty list") unless @v;
			check_path("no_index.$k", $_) for @v;
		}
	}
}

print "$path: $_\n" for @problems;
print "$path: valid (PGXN Meta Spec 1.0.0)\n" unless @problems;
exit(@problems ? 1 : 0);

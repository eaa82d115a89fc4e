# test/t/053_tenant_locks.pl -- the locks one ordinary role's stream calls
# take never stall nor fail another role's calls.
#
#   1. Stream lock collisions on purpose.  Until 0.4.0 was released, the
#      lock of a stream position or producer sequence was keyed on a
#      Jenkins hash (lookup3) of the caller's names, which is easily
#      inverted: role "mallory" reads role "alice"'s lock tag in pg_locks
#      while alice is in a transaction, computes a 12-byte stream (and
#      producer) name of its own whose old tag is the same (the inversion
#      below, a few thousand tries), holds it in an open transaction, and
#      alice's idem_advance and idem_sequence hung until their lock
#      timeout.  Now the tag holds the role's OID in a field of its own and
#      a keyed hash of the names (test/t/056_lock_tags.pl: no role can
#      compute it for names it guesses): alice's calls go on, every stream
#      lock carries its holder's role, and two roles using the very same
#      names do not wait for each other.
#   2. The shared lock table.  Each position or producer a transaction
#      assigns, advances or checks keeps a lock until the transaction ends,
#      in the lock table every session shares.  Until 0.4.0 was released
#      nothing bounded them: mallory's open transaction took locks until
#      the table was full, and alice's calls and new connections failed
#      with 53200 (out of shared memory).  Now a transaction holds at most
#      max_locks_per_transaction of them; mallory's next one is refused
#      with 53000, while alice's calls and new connections go on.  The key
#      locks of a batch (idem_consume_messages, many claims in one
#      transaction) are not kept at all once the partitions exist.
# Every lock wait here is bounded by lock_timeout: on the old code they
# time out, on the new code nothing waits at all.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('tenant_locks');
$node->init;
# a small lock table, (max_connections + autovacuum_max_workers + 1 +
# max_worker_processes + max_wal_senders) * max_locks_per_transaction
$node->append_conf('postgresql.conf', q{
max_connections = 10
max_locks_per_transaction = 64
log_min_messages = warning
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE alice LOGIN;
	CREATE ROLE mallory LOGIN;
	CREATE EXTENSION idempotency;
});

# ---------------------------------------------------------------- 1
# lookup3 as PostgreSQL's hash_bytes_extended() computes it on a
# little-endian machine, 32-bit words as Perl integers, 64-bit values as
# [high, low] pairs.
use constant M32 => 0xffffffff;

sub rot { my ($x, $k) = @_; return (($x << $k) | ($x >> (32 - $k))) & M32; }

sub mix
{
	my ($a, $b, $c) = @_;
	$a = ($a - $c) & M32; $a ^= rot($c, 4);  $c = ($c + $b) & M32;
	$b = ($b - $a) & M32; $b ^= rot($a, 6);  $a = ($a + $c) & M32;
	$c = ($c - $b) & M32; $c ^= rot($b, 8);  $b = ($b + $a) & M32;
	$a = ($a - $c) & M32; $a ^= rot($c, 16); $c = ($c + $b) & M32;
	$b = ($b - $a) & M32; $b ^= rot($a, 19); $a = ($a + $c) & M32;
	$c = ($c - $b) & M32; $c ^= rot($b, 4);  $b = ($b + $a) & M32;
	return ($a, $b, $c);
}

sub unmix
{
	my ($a, $b, $c) = @_;
	$b = ($b - $a) & M32; $c ^= rot($b, 4);  $c = ($c + $b) & M32;
	$a = ($a - $c) & M32; $b ^= rot($a, 19); $b = ($b + $a) & M32;
	$c = ($c - $b) & M32; $a ^= rot($c, 16); $a = ($a + $c) & M32;
	$b = ($b - $a) & M32; $c ^= rot($b, 8);  $c = ($c + $b) & M32;
	$a = ($a - $c) & M32; $b ^= rot($a, 6);  $b = ($b + $a) & M32;
	$c = ($c - $b) & M32; $a ^= rot($c, 4);  $a = ($a + $c) & M32;
	return ($a, $b, $c);
}

sub final
{
	my ($a, $b, $c) = @_;
	$c ^= $b; $c = ($c - rot($b, 14)) & M32;
	$a ^= $c; $a = ($a - rot($c, 11)) & M32;
	$b ^= $a; $b = ($b - rot($a, 25)) & M32;
	$c ^= $b; $c = ($c - rot($b, 16)) & M32;
	$a ^= $c; $a = ($a - rot($c, 4)) & M32;
	$b ^= $a; $b = ($b - rot($a, 14)) & M32;
	$c ^= $b; $c = ($c - rot($b, 24)) & M32;
	return ($a, $b, $c);
}

sub unfinal
{
	my ($a, $b, $c) = @_;
	$c = ($c + rot($b, 24)) & M32; $c ^= $b;
	$b = ($b + rot($a, 14)) & M32; $b ^= $a;
	$a = ($a + rot($c, 4)) & M32;  $a ^= $c;
	$c = ($c + rot($b, 16)) & M32; $c ^= $b;
	$b = ($b + rot($a, 25)) & M32; $b ^= $a;
	$a = ($a + rot($c, 11)) & M32; $a ^= $c;
	$c = ($c + rot($b, 14)) & M32; $c ^= $b;
	return ($a, $b, $c);
}

# hash_bytes_extended(bytes, seed) for a seed below 2^32, as [high, low]
sub hbe
{
	my ($bytes, $seed) = @_;
	my @k = unpack('C*', $bytes);
	my $init = (0x9e3779b9 + scalar(@k) + 3923095) & M32;
	my ($a, $b, $c) = ($init, $init, $init);
	if ($seed != 0)
	{
		$b = ($b + $seed) & M32;
		($a, $b, $c) = mix($a, $b, $c);
	}
	while (@k >= 12)
	{
		my @w = splice(@k, 0, 12);
		$a = ($a + ($w[0] | $w[1] << 8 | $w[2] << 16 | $w[3] << 24)) & M32;
		$b = ($b + ($w[4] | $w[5] << 8 | $w[6] << 16 | $w[7] << 24)) & M32;
		$c = ($c + ($w[8] | $w[9] << 8 | $w[10] << 16 | $w[11] << 24)) & M32;
		($a, $b, $c) = mix($a, $b, $c);
	}
	push @k, (0) x (11 - @k);
	$a = ($a + ($k[0] | $k[1] << 8 | $k[2] << 16 | $k[3] << 24)) & M32;
	$b = ($b + ($k[4] | $k[5] << 8 | $k[6] << 16 | $k[7] << 24)) & M32;
	$c = ($c + ($k[8] << 8 | $k[9] << 16 | $k[10] << 24)) & M32;
	($a, $b, $c) = final($a, $b, $c);
	return [ $b, $c ];
}

# 64-bit arithmetic on [high, low]
sub add64
{
	my ($x, $y) = @_;
	my $lo = $x->[1] + $y->[1];
	return [ ($x->[0] + $y->[0] + ($lo >> 32)) & M32, $lo & M32 ];
}
sub neg64 { my ($x) = @_; return add64([ ~$x->[0] & M32, ~$x->[1] & M32 ], [ 0, 1 ]); }
sub sub64 { my ($x, $y) = @_; return add64($x, neg64($y)); }
sub xor64 { my ($x, $y) = @_; return [ $x->[0] ^ $y->[0], $x->[1] ^ $y->[1] ]; }
sub shl54 { my ($x) = @_; return [ ($x->[1] << 22) & M32, 0 ]; }
sub shr7 { my ($x) = @_; return [ $x->[0] >> 7, (($x->[0] << 25) | ($x->[1] >> 7)) & M32 ]; }
my $K = [ 0x49a0f4dd, 0x15e5a8e3 ];    # hash_combine64's constant

# the old tag: hash_combine64(hbe(a, role), hbe(b, part))
sub old_tag
{
	my ($role, $a, $b, $part) = @_;
	my $ha = hbe($a, $role);
	my $hb = hbe($b, $part);
	return xor64($ha, add64(add64(add64($hb, $K), shl54($ha)), shr7($ha)));
}

# A 12-byte name b (ASCII, no NUL) with old_tag(role, a, b, 0) == target:
# the hb it needs, then final() and mix() run backwards from it, for one
# free 32-bit word after another until the key words are ASCII.
sub collide
{
	my ($role, $a, $target) = @_;
	my $ha = hbe($a, $role);
	my $hb = sub64(sub64(sub64(xor64($target, $ha), $K), shl54($ha)), shr7($ha));
	my $init = (0x9e3779b9 + 12 + 3923095) & M32;
	for (my $free = 1; $free < 10_000_000; $free++)
	{
		my ($a1, $b1, $c1) = unmix(unfinal(($free * 2654435761) & M32, @$hb));
		my $bytes = pack('V3', ($a1 - $init) & M32, ($b1 - $init) & M32, ($c1 - $init) & M32);
		next if $bytes =~ /[^\x01-\x7f]/;
		my $check = old_tag($role, $a, $bytes, 0);
		die "inversion is wrong" unless $check->[0] == $target->[0] && $check->[1] == $target->[1];
		return $bytes;
	}
	die "no ASCII name found";
}

my %oid = map { $_ => $node->safe_psql('postgres', "SELECT '$_'::regrole::oid") } qw(alice mallory);

# The Perl lookup3 is the server's: hashtextextended() is
# hash_bytes_extended() over the text's bytes.  (Not on a big-endian
# machine, whose lookup3 reads the words the other way: the crafted names
# are then not tried.)
my $server = $node->safe_psql('postgres', qq{
	SELECT lpad(to_hex(hashtextextended('c', $oid{alice})), 16, '0') || ' ' ||
	       lpad(to_hex(hashtextextended('a 12-byte id', 0)), 16, '0')});
my $mine = join ' ', map { sprintf('%08x%08x', @$_) } hbe('c', $oid{alice}), hbe('a 12-byte id', 0);
my $little_endian = ($server eq $mine);
note "the server's lookup3 ($server) is not the little-endian one ($mine)" unless $little_endian;

# alice's locks, as any role sees them in pg_locks while she is in a
# transaction
my $alice = $node->background_psql('postgres', extra_params => [ '-U', 'alice' ]);
$alice->query_safe('BEGIN');
$alice->query_safe(q{SELECT * FROM idem_advance('c', 'orders', 0, 0, 9, 1)});
$alice->query_safe(q{SELECT idem_sequence('c', 'producer', 1, 1)});
my %seen = map { my ($kind, $hi, $lo) = split /\|/; ($kind => [ $hi + 0, $lo + 0 ]) }
  split /\n/, $node->safe_psql('postgres', q{
	SELECT l.objsubid, l.classid, l.objid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	 WHERE l.locktype = 'advisory' AND a.usename = 'alice' ORDER BY 1}, extra_params => [ '-U', 'mallory' ]);
is(join(',', sort keys %seen), '18759,18760', "mallory sees alice's position and sequence locks");
$alice->query_safe('COMMIT');

# mallory's names whose locks had alice's tags under the old hash
# (consumer "x", partition 0), held in an open transaction
my $mallory = $node->background_psql('postgres', extra_params => [ '-U', 'mallory' ]);
$mallory->query_safe('BEGIN');
SKIP:
{
	skip 'lookup3 of a big-endian machine', 3 unless $little_endian;
	my $stream = collide($oid{mallory}, 'x', $seen{18759});
	my $producer = collide($oid{mallory}, 'x', $seen{18760});
	note "mallory's stream name (hex) " . unpack('H*', $stream) . ', producer ' . unpack('H*', $producer);
	$mallory->query_safe(sprintf(q{SELECT * FROM idem_advance('x', convert_from('\x%s', 'UTF8'), 0, 0, 0)},
			unpack('H*', $stream)));
	$mallory->query_safe(sprintf(q{SELECT idem_sequence('x', convert_from('\x%s', 'UTF8'), 1, 1)},
			unpack('H*', $producer)));

	my ($ret, $out, $err) = $node->psql('postgres', q{
		SET lock_timeout = '5s';
		SELECT first_offset || '..' || last_offset FROM idem_advance('c', 'orders', 0, 10, 19, 1);
		SELECT idem_sequence('c', 'producer', 1, 2);}, extra_params => [ '-U', 'alice' ]);
	is($err, '', 'alice advances and checks her sequence while mallory holds the crafted names');
	is($out, "10..19\nnew", 'and gets her answers');
	is($node->safe_psql('postgres', q{
			SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			 WHERE l.locktype = 'advisory' AND a.usename = 'mallory'}),
		'2', 'mallory holds both meanwhile');
}

# every stream lock held carries its holder's role
$mallory->query_safe(q{SELECT * FROM idem_assign('x', 'shared', ARRAY[0, 1, 2], 1)});
$mallory->query_safe(q{SELECT idem_sequence('x', 'shared', 1, 1)});
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.objsubid IN (18759, 18760)
		   AND l.classid <> a.usesysid}),
	'0', 'every stream lock held carries its holder\'s role');

# the very same names under two roles: neither waits for the other
my ($ret, $out, $err) = $node->psql('postgres', q{
	SET lock_timeout = '5s';
	SELECT count(*) FROM idem_assign('x', 'shared', ARRAY[0, 1, 2], 1);
	SELECT idem_sequence('x', 'shared', 1, 1);}, extra_params => [ '-U', 'alice' ]);
is($err, '', 'alice uses the names mallory holds in an open transaction');
is($out, "3\nnew", 'as her own');
$mallory->query_safe('COMMIT');
$alice->quit;

# ---------------------------------------------------------------- 2
# mallory takes stream locks in an open transaction, in ever smaller
# chunks, until it can take no more: at its limit (53000), or (on the old
# code) when the lock table is full (53200)
$mallory->query_safe(q{
	CREATE FUNCTION pg_temp.fill() RETURNS text LANGUAGE plpgsql AS $$
	DECLARE
		chunk int := 1000;
		first int := 0;
	BEGIN
		LOOP
			BEGIN
				PERFORM idem_assign('fill', 'orders', ARRAY(SELECT generate_series(first, first + chunk - 1)), 1);
				first := first + chunk;
			EXCEPTION WHEN insufficient_resources OR out_of_memory THEN
				IF chunk = 1 THEN
					RETURN SQLSTATE || ' after ' || first || ' partitions';
				END IF;
				chunk := chunk / 10;
			END;
		END LOOP;
	END $$});
$mallory->query_safe('BEGIN');
my $filled = $mallory->query_safe('SELECT pg_temp.fill()');
my $limit = $mallory->query_safe('SHOW max_locks_per_transaction');
is($filled, "53000 after $limit partitions",
	'mallory is refused (53000) once its transaction holds max_locks_per_transaction stream locks');
# (psql, not safe_psql: on the old code no new connection could be made)
($ret, $out, $err) = $node->psql('postgres', q{
	SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	 WHERE l.locktype = 'advisory' AND a.usename = 'mallory'});
is($out, $limit, 'and keeps holding them') or diag($err);
($ret, $out, $err) = $node->psql('postgres', q{
	SET lock_timeout = '5s';
	SELECT count(*) FROM idem_assign('c', 'orders', ARRAY(SELECT generate_series(0, 9)), 2);
	SELECT first_offset || '..' || last_offset FROM idem_advance('c', 'orders', 0, 20, 29, 2);
	SELECT idem_sequence('c', 'producer', 1, 3);}, extra_params => [ '-U', 'alice' ]);
is($err, '', 'meanwhile alice assigns ten partitions, advances one and checks a sequence, in a new connection');
is($out, "10\n20..29\nnew", 'with her answers');
$mallory->query_safe('ROLLBACK');
$mallory->quit;

# The key locks of a batch go as each id is recorded (the partitions are
# made: a key written into a partition its own transaction made keeps its
# lock, bounded as test/t/052_ordinary_role_limits.pl shows).
$node->safe_psql('postgres', 'SELECT idem_maintain()');
$mallory = $node->background_psql('postgres', extra_params => [ '-U', 'mallory' ]);
$mallory->query_safe('BEGIN');
is($mallory->query_safe(q{
		SELECT count(*) FROM idem_consume_messages('batch', ARRAY(SELECT 'm' || g FROM generate_series(1, 5000) g))}),
	'5000', 'mallory consumes a batch of 5,000 message ids in an open transaction');
$mallory->query_safe(q{SELECT count(*) FROM (SELECT idem_claim('k' || g) FROM generate_series(1, 1000) g) s});
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND a.usename = 'mallory'}),
	'0', 'and claims 1,000 keys: its transaction keeps no key lock');
$mallory->query_safe('ROLLBACK');
$mallory->quit;

$node->stop;

done_testing();


# test/t/056_lock_tags.pl -- no role learns from pg_locks which keys,
# message ids or stream names another role is writing.
#
# Every role can read pg_locks, with the holder's process (and through
# pg_stat_activity its role).  A call holds an advisory lock whose tag is
# derived from the caller's key (and role), for the length of its probe, or
# to the end of its transaction when it wrote into a partition that
# transaction made; a stream call holds one derived from its names to the
# end of its transaction.  Until 0.4.0's review those tags were public
# functions of the role's OID and the names: role b computed, for a guessed
# key or stream name, the tag role a's lock would have, and found it in
# pg_locks while a was writing.  Now the part of the tag derived from the
# names is a keyed hash (SipHash-2-4) under a per-database secret that no
# ordinary role can read (idempotency.lock_secret), beside the holder's
# role in a field of its own.
#
#   1. a holds a key lock, a message id's lock (written into partitions its
#      own transaction made: no partition maker can start here) and stream
#      locks in an open transaction.  b reads them in pg_locks, computes the
#      tags every earlier form gives for a's names among its guesses, and
#      finds none of them; b's own lock on the same key tells it nothing
#      either.  A superuser, who can read the secret, computes a's tags
#      exactly (the C code's SipHash against this file's, which is checked
#      against the reference vector).  b cannot read the secret, neither as
#      a member of pg_monitor.
#   2. The update window.  A database still on 0.3.1, under this library:
#      its key locks keep the public form, as a session still running a
#      0.3.1 library takes them for the same key.  A call that took that
#      lock and then waited for ALTER EXTENSION UPDATE's locks goes on with
#      the keyed one once the update has committed (the form a call started
#      after the update takes), and holds no lock of the old form.

use strict;
use warnings;
no warnings 'portable';    # 64-bit hexadecimal constants

use Digest::SHA qw(sha256);
use Math::BigInt;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use constant M32 => 0xffffffff;
use constant {
	LOCK_KEY => 0x4944,
	LOCK_POSITION => 0x4947,
	LOCK_SEQUENCE => 0x4948,
	LEDGER_MESSAGES => 0,
	LEDGER_KEYS => 1,
};

# ---------------------------------------------------------------- hashes
# SipHash-2-4 (Aumasson and Bernstein), 64-bit words as Perl integers
sub add64
{
	my ($x, $y) = @_;
	my $lo = ($x & M32) + ($y & M32);
	return (((($x >> 32) + ($y >> 32) + ($lo >> 32)) & M32) << 32) | ($lo & M32);
}
sub rotl64 { my ($x, $n) = @_; return (($x << $n) | ($x >> (64 - $n))) & 0xffffffffffffffff; }

sub siphash24
{
	my ($key, $msg) = @_;
	my ($k0, $k1) = unpack('Q<Q<', $key);
	my @v = ($k0 ^ 0x736f6d6570736575, $k1 ^ 0x646f72616e646f6d,
		$k0 ^ 0x6c7967656e657261, $k1 ^ 0x7465646279746573);
	my $round = sub {
		$v[0] = add64($v[0], $v[1]); $v[1] = rotl64($v[1], 13); $v[1] ^= $v[0]; $v[0] = rotl64($v[0], 32);
		$v[2] = add64($v[2], $v[3]); $v[3] = rotl64($v[3], 16); $v[3] ^= $v[2];
		$v[0] = add64($v[0], $v[3]); $v[3] = rotl64($v[3], 21); $v[3] ^= $v[0];
		$v[2] = add64($v[2], $v[1]); $v[1] = rotl64($v[1], 17); $v[1] ^= $v[2]; $v[2] = rotl64($v[2], 32);
	};
	my $len = length($msg);
	foreach my $m (unpack('Q<*', $msg . ("\0" x (7 - $len % 8)) . chr($len & 0xff)))
	{
		$v[3] ^= $m;
		$round->() for 1 .. 2;
		$v[0] ^= $m;
	}
	$v[2] ^= 0xff;
	$round->() for 1 .. 4;
	return $v[0] ^ $v[1] ^ $v[2] ^ $v[3];
}
is(sprintf('%016x', siphash24(pack('C*', 0 .. 15), pack('C*', 0 .. 14))), 'a129ca6149be45e5',
	'the SipHash-2-4 of this file gives the reference vector of its paper');

# The SHA-256 a key's digest is taken from (src/keyhash.c): the
# namespace's length, the namespace, the key.  Bytes 4-15 are the digest's
# (in its current and legacy forms alike).
sub digest_sha { my ($ns, $key) = @_; return sha256(pack('N', length($ns)) . $ns . $key); }

# Tags as [classid, objid] (pg_locks' names for fields 2 and 3 of an
# advisory tag), as text "classid/objid".
sub tag { return join('/', @{ $_[0] }); }

# The key lock of 0.3.1 (and of 0.4.0 before its review, and of any
# database not updated to 0.4.0): bytes 4-11 of the digest, read as a
# little-endian 64-bit integer, XOR (role * 0x9E3779B97F4A7C15 + ledger).
sub public_key_tag
{
	my ($role, $ledger, $ns, $key) = @_;
	my ($lo, $hi) = unpack('V2', substr(digest_sha($ns, $key), 4, 8));
	my $m = (Math::BigInt->new($role) * Math::BigInt->from_hex('9E3779B97F4A7C15') + $ledger)
	  % (Math::BigInt->new(2)**64);
	my $hex = substr(('0' x 16) . substr($m->as_hex, 2), -16);
	return tag([ $hi ^ hex(substr($hex, 0, 8)), $lo ^ hex(substr($hex, 8, 8)) ]);
}

# The stream lock of 0.4.0 between the fix of crafted collisions and its
# review: the role, and 32 bits of SHA-256 over the kind, the role, the
# partition, the first name's length and both names.
sub public_stream_tag
{
	my ($kind, $role, $first, $second, $part) = @_;
	return tag([ $role, unpack('V', sha256(pack('N4', $kind, $role, $part, length($first)) . $first . $second)) ]);
}

# The tags now, which only the secret's readers can compute: the role, and
# 32 bits of SipHash-2-4 under the database's secret.
sub keyed_key_tag
{
	my ($secret, $role, $ledger, $ns, $key) = @_;
	return tag([ $role,
		siphash24($secret, pack('N2', $ledger, $role) . substr(digest_sha($ns, $key), 4, 12)) & M32 ]);
}
sub keyed_stream_tag
{
	my ($secret, $kind, $role, $first, $second, $part) = @_;
	return tag([ $role,
		siphash24($secret, pack('N4', $kind, $role, $part, length($first)) . $first . $second) & M32 ]);
}

# ---------------------------------------------------------------- node
my $node = PostgreSQL::Test::Cluster->new('lock_tags');
$node->init;
# no worker slot: a call makes a missing partition in its own transaction,
# and keeps the key lock of the row it writes there to the transaction's end
$node->append_conf('postgresql.conf', q{
max_worker_processes = 0
max_parallel_workers = 0
autovacuum = off
log_min_messages = warning
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE ROLE a LOGIN;
	CREATE ROLE b LOGIN;
	CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
});
my %oid = map { $_ => $node->safe_psql('postgres', "SELECT '$_'::regrole::oid") } qw(a b);

# a role's key and stream locks (not the ledger-wide ones, whose tags
# derive from nothing a caller chose), as any role reads them: "kind
# classid/objid" lines
sub locks_of
{
	my ($db, $role, $reader) = @_;
	return $node->safe_psql($db, qq{
		SELECT l.objsubid || ' ' || l.classid || '/' || l.objid
		  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.granted
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND l.objsubid IN (18756, 18759, 18760)
		   AND a.usename = '$role'
		 ORDER BY 1}, extra_params => [ '-U', $reader ]);
}
sub secret_of
{
	my ($db) = @_;
	my $hex = $node->safe_psql($db, q{SELECT encode(secret, 'hex') FROM idempotency.lock_secret});
	return pack('H*', $hex);
}

# ---------------------------------------------------------------- 1
my $sa = $node->background_psql('postgres', extra_params => [ '-U', 'a' ]);
$sa->query_safe('BEGIN');
is($sa->query_safe(q{SELECT status FROM idem_claim('order-7', '{"n": 1}', 'payments', ttl => '10 days')}),
	'claimed', 'a claims order-7 in a partition its own transaction makes');
is($sa->query_safe(q{SELECT idem_consume_message('orders', 'msg-7', ttl => '25 days')}),
	't', 'and consumes msg-7 there');
$sa->query_safe(q{SELECT * FROM idem_advance('c', 'refunds', 2, 0, 9, 1)});
$sa->query_safe(q{SELECT idem_sequence('c', 'shop-3', 1, 1)});

my @held = split /\n/, locks_of('postgres', 'a', 'b');
is(join(',', map { (split / /)[0] } @held), join(',', LOCK_KEY, LOCK_KEY, LOCK_POSITION, LOCK_SEQUENCE),
	'b sees two key locks and two stream locks of a');
my %held = map { my ($kind, $t) = split / /; ($t => $kind) } @held;
is(scalar(grep { (split m{/})[0] ne $oid{a} } keys %held), 0,
	'every lock of a holds a\'s role in a field of its own');

# b's guesses: keys, message ids and stream names, a's among them
my %public;
foreach my $i (1 .. 9)
{
	$public{ public_key_tag($oid{a}, LEDGER_KEYS, 'payments', "order-$i") } = "key order-$i";
	$public{ public_key_tag($oid{a}, LEDGER_MESSAGES, 'orders', "msg-$i") } = "message msg-$i";
}
foreach my $stream (qw(orders payments refunds))
{
	$public{ public_stream_tag(LOCK_POSITION, $oid{a}, 'c', $stream, $_) } = "stream $stream/$_" for 0 .. 3;
}
$public{ public_stream_tag(LOCK_SEQUENCE, $oid{a}, 'c', "shop-$_", 0) } = "producer shop-$_" for 1 .. 9;
my @found = map { "$public{$_} ($_)" } grep { exists $public{$_} } keys %held;
is(join(', ', sort @found), '', 'no lock of a has a tag b computes from its guesses, a\'s names among them');

# what only the secret's readers compute
my $secret = secret_of('postgres');
is(length($secret), 16, 'the database has a secret of 16 bytes');
my %keyed = (
	keyed_key_tag($secret, $oid{a}, LEDGER_KEYS, 'payments', 'order-7') => LOCK_KEY,
	keyed_key_tag($secret, $oid{a}, LEDGER_MESSAGES, 'orders', 'msg-7') => LOCK_KEY,
	keyed_stream_tag($secret, LOCK_POSITION, $oid{a}, 'c', 'refunds', 2) => LOCK_POSITION,
	keyed_stream_tag($secret, LOCK_SEQUENCE, $oid{a}, 'c', 'shop-3', 0) => LOCK_SEQUENCE);
is(join(',', map { "$held{$_} $_" } sort keys %held), join(',', map { "$keyed{$_} $_" } sort keys %keyed),
	'with the secret, a\'s four tags are computed exactly');
$sa->query_safe('ROLLBACK');
$sa->quit;

# b's own lock on the very same key, once a's transaction is over (a holds
# the partition it made until then)
my $sb = $node->background_psql('postgres', extra_params => [ '-U', 'b' ]);
$sb->query_safe('BEGIN');
is($sb->query_safe(q{SELECT status FROM idem_claim('order-7', '{"n": 1}', 'payments', ttl => '10 days')}),
	'claimed', 'b claims order-7 in a partition its own transaction makes');
my @b_held = split /\n/, locks_of('postgres', 'b', 'b');
is(scalar(@b_held), 1, 'b holds its key lock');
my %a_objids = map { (split m{/})[1] => 1 } grep { $held{$_} == LOCK_KEY } keys %held;
my $b_objid = (split m{/}, (split / /, $b_held[0] // '')[1] // '')[1] // '';
ok(!$a_objids{$b_objid}, 'its tag tells b nothing of a\'s: they differ beyond the role field');
$sb->query_safe('ROLLBACK');
$sb->quit;

foreach my $reader (qw(b watcher))
{
	my ($ret, $out, $err) = $node->psql('postgres', q{SELECT secret FROM idempotency.lock_secret},
		extra_params => [ '-U', $reader ]);
	like($err, qr/permission denied/, "$reader cannot read the secret");
}
is($node->safe_psql('postgres', q{
		SELECT count(*) FROM information_schema.role_table_grants
		 WHERE table_schema = 'idempotency' AND table_name = 'lock_secret'
		   AND grantee <> (SELECT tableowner FROM pg_tables WHERE tablename = 'lock_secret')}),
	'0', 'nobody but its owner holds a privilege on it');

# ---------------------------------------------------------------- 2
$node->safe_psql('postgres', 'CREATE DATABASE older');
$node->safe_psql('older', q{
	CREATE EXTENSION idempotency VERSION '0.3.1';
	SELECT idem_maintain();
});
my $old = $node->background_psql('older', extra_params => [ '-U', 'a' ]);
$old->query_safe('BEGIN');
$old->query_safe(q{SELECT idem_consume_message('orders', 'msg-7', ttl => '25 days')});
is(locks_of('older', 'a', 'b'), LOCK_KEY . ' ' . public_key_tag($oid{a}, LEDGER_MESSAGES, 'orders', 'msg-7'),
	'on 0.3.1, the key lock has the public form a 0.3.1 library takes for the same message id');
$old->query_safe('ROLLBACK');

# a call that waits for the update's locks, holding the lock of the old
# form (a consume: idem_claim()'s result type gains columns in the update,
# and a claim planned before it fails when it returns)
my $update = $node->background_psql('older');
$update->query_safe('BEGIN');
$update->query_safe('ALTER EXTENSION idempotency UPDATE');
$old->query_safe('BEGIN');
$old->query_until(qr/waiting/, q{
	\echo waiting
	SELECT 'answer: ' || idem_consume_message('orders', 'msg-8', ttl => '25 days');
});
ok($node->poll_query_until('older', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND query LIKE '%msg-8%'}),
	'during the update, a consume waits for its locks');
is(locks_of('older', 'a', 'b'), LOCK_KEY . ' ' . public_key_tag($oid{a}, LEDGER_MESSAGES, 'orders', 'msg-8'),
	'holding the key lock of the public form');
$update->query_safe('COMMIT');
$update->quit;
like($old->query_safe('SELECT 1'), qr/answer: true/, 'once the update commits, the consume goes on');
my $older_secret = secret_of('older');
is(length($older_secret), 16, 'the update made a secret');
isnt(unpack('H*', $older_secret), unpack('H*', $secret), 'of its own');
is(locks_of('older', 'a', 'b'),
	LOCK_KEY . ' ' . keyed_key_tag($older_secret, $oid{a}, LEDGER_MESSAGES, 'orders', 'msg-8'),
	'and holds the keyed lock, the one a call made after the update takes, not the public one');
$old->query_safe('ROLLBACK');
$old->quit;

$node->stop;
done_testing();

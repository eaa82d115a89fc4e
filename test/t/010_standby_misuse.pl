# test/t/010_standby_misuse.pl -- the extension on a streaming standby, and
# settings written to the configuration files.
#
# A primary and a streaming standby.  The standby is made before the
# extension exists, so CREATE EXTENSION, the ledgers and their partitions
# (and the lock secret, which every call reads to compute its key's lock
# tag) all arrive by replay.  On the standby every writing function fails with
# SQLSTATE 25006 and writes nothing, idem_lookup() returns what the primary
# committed (also to a session that was open while new partitions were
# replayed), never a row the primary has not committed, and never another
# role's key; the partitions view works; nothing crashes and no internal
# error is logged.
#
# Then, on the primary: bad values of idempotency.* settings through ALTER
# SYSTEM are refused (which on PostgreSQL 15 needs the library loaded in the
# session); bad values nothing could check (postgresql.conf, ALTER DATABASE
# in a session without the library) are reported by every backend that
# loads the library, which keeps the default and works.
#
# Run with the TAP suite: SUITES=tap bash test/run-all.sh

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
max_prepared_transactions = 5
log_error_verbosity = verbose
});
$primary->start;
$primary->backup('before_extension');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'before_extension', has_streaming => 1);
$standby->start;

# runs one statement on a node; returns its SQLSTATE (from the verbose
# error message), or "ok" and the output
sub sqlstate_of
{
	my ($node, $sql, $db) = @_;
	my ($rc, $stdout, $stderr) =
	  $node->psql($db // 'postgres', $sql,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return "ok: $stdout" if $rc == 0;
	return $1 if $stderr =~ /ERROR:  ([0-9A-Z]{5}):/;
	return "unexpected: $stderr";
}

# ----------------------------------------------------------- on the primary
$primary->safe_psql('postgres', q{
CREATE EXTENSION idempotency;
CREATE ROLE idem_tap_app;
});
$primary->wait_for_catchup($standby);

# the lock secret arrives by replay: the standby's calls (idem_lookup()
# computes its key's lock tag) read the primary's
my $secret_sql = q{SELECT string_agg(encode(secret, 'hex'), ',') FROM idempotency.lock_secret};
is($standby->safe_psql('postgres', $secret_sql), $primary->safe_psql('postgres', $secret_sql),
	'the standby has the lock secret of the primary');

is($standby->safe_psql('postgres',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	$primary->safe_psql('postgres',
		q{SELECT extversion FROM pg_extension WHERE extname = 'idempotency'}),
	'standby: the extension arrived by replay');
is($standby->safe_psql('postgres',
		q{SELECT to_regclass('idempotency.keys') IS NULL, count(*) FROM idem_lookup('done')}),
	't|0', 'standby: idem_lookup before the key ledger exists returns no row');

# fixtures: a completed key with a scope, a two-phase claim in progress with
# a recovery point, a released key, consumed messages, the same key of
# another role, and a claim in a prepared (uncommitted) transaction
$primary->safe_psql('postgres', q{
BEGIN;
SELECT status FROM idem_claim('done', '{"amount": 5}', scope => 'tenant-1');
SELECT idem_complete('done', 201, '{"charge": 42}', scope => 'tenant-1');
COMMIT;
SELECT idem_consume_message('billing', 'm-1');
SELECT * FROM idem_consume_messages('billing', ARRAY['m-2', 'm-3']);
});
my $held_token = $primary->safe_psql('postgres',
	q{SELECT token FROM idem_claim('held', lease => '1 hour')});
$primary->safe_psql('postgres',
	qq{SELECT idem_checkpoint('held', 'charged', token => $held_token)});
my $released_token = $primary->safe_psql('postgres',
	q{SELECT token FROM idem_claim('released', lease => '1 hour')});
$primary->safe_psql('postgres',
	qq{SELECT idem_release('released', token => $released_token)});
$primary->safe_psql('postgres', q{
SET ROLE idem_tap_app;
BEGIN;
SELECT status FROM idem_claim('done', scope => 'tenant-1');
SELECT idem_complete('done', 409, '"app"', scope => 'tenant-1');
COMMIT;
});
$primary->safe_psql('postgres', q{
BEGIN;
SELECT status FROM idem_claim('prepared', lease => '1 hour');
PREPARE TRANSACTION 'idem_tap_prepared';
});
$primary->wait_for_catchup($standby);

my $keys_before = $standby->safe_psql('postgres',
	q{SELECT count(*) || '/' || md5(string_agg(k::text, ',' ORDER BY k::text)) FROM idempotency.keys k});
my $messages_before = $standby->safe_psql('postgres',
	q{SELECT count(*) || '/' || md5(string_agg(m::text, ',' ORDER BY m::text)) FROM idempotency.messages m});
is($keys_before, $primary->safe_psql('postgres',
		q{SELECT count(*) || '/' || md5(string_agg(k::text, ',' ORDER BY k::text)) FROM idempotency.keys k}),
	'standby: the key ledger is the primary\'s');

# ------------------------------------------------ writing on the standby
my %writes = (
	'idem_consume_message'            => q{SELECT idem_consume_message('billing', 'm-9')},
	'idem_consume_message (consumed)' => q{SELECT idem_consume_message('billing', 'm-1')},
	'idem_consume_messages'           => q{SELECT * FROM idem_consume_messages('billing', ARRAY['m-1', 'm-9'])},
	'idem_consume_messages (empty)'   => q{SELECT * FROM idem_consume_messages('billing', ARRAY[]::text[])},
	'idem_claim (new key)'            => q{SELECT * FROM idem_claim('new')},
	'idem_claim (completed key)'      => q{SELECT * FROM idem_claim('done', '{"amount": 5}', scope => 'tenant-1')},
	'idem_claim (wait)'               => q{SELECT * FROM idem_claim('held', wait => true)},
	'idem_claim (lease)'              => q{SELECT * FROM idem_claim('new', lease => '1 minute')},
	'idem_complete'                   => qq{SELECT idem_complete('held', 200, token => $held_token)},
	'idem_checkpoint'                 => qq{SELECT idem_checkpoint('held', 'x', token => $held_token)},
	'idem_release'                    => qq{SELECT idem_release('held', token => $held_token)},
	'idem_complete (no claim)'        => q{SELECT idem_complete('nope', 200)},
	'idem_maintain'                   => q{SELECT * FROM idem_maintain()},
);
foreach my $what (sort keys %writes)
{
	is(sqlstate_of($standby, $writes{$what}), '25006',
		"standby: $what fails with 25006");
}
is(sqlstate_of($standby, q{SET ROLE idem_tap_app; SELECT idem_consume_message('billing', 'm-9')}),
	'25006', 'standby: an ordinary role\'s write fails with 25006 too');
my ($rc, $out, $err) = $standby->psql('postgres', q{SELECT idem_consume_message('billing', 'm-9')});
like($err, qr/cannot execute idem_consume_message\(\) during recovery/,
	'standby: the message names the function and recovery');
like($err, qr/HINT:  Call it on the primary server\./, 'standby: ... with a hint');

is($standby->safe_psql('postgres',
		q{SELECT count(*) || '/' || md5(string_agg(k::text, ',' ORDER BY k::text)) FROM idempotency.keys k}),
	$keys_before, 'standby: the key ledger is unchanged by the refused calls');
is($standby->safe_psql('postgres',
		q{SELECT count(*) || '/' || md5(string_agg(m::text, ',' ORDER BY m::text)) FROM idempotency.messages m}),
	$messages_before, 'standby: the message ledger is unchanged by the refused calls');

# ------------------------------------------------ reading on the standby
is($standby->safe_psql('postgres',
		q{SELECT status, response_code, response_body, lease_expires_at IS NULL,
		         expires_at > now() + interval '23 hours'
		    FROM idem_lookup('done', 'tenant-1')}),
	'completed|201|{"charge": 42}|t|t',
	'standby: idem_lookup returns the key claimed and completed on the primary');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('done')}),
	'0', 'standby: ... in its scope only');
is($standby->safe_psql('postgres',
		q{SELECT status, token, recovery_point, lease_expires_at > now() FROM idem_lookup('held')}),
	"in_progress|$held_token|charged|t",
	'standby: idem_lookup shows a two-phase claim in progress, its token and recovery point');
is($standby->safe_psql('postgres', q{SELECT status, token FROM idem_lookup('released')}),
	"released|$released_token", 'standby: idem_lookup shows a released key');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('prepared')}),
	'0', 'standby: a claim the primary has prepared but not committed is not there');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idem_lookup('never')}),
	'0', 'standby: idem_lookup of an unknown key returns no row');
is($standby->safe_psql('postgres',
		q{SET ROLE idem_tap_app; SELECT status, response_code, response_body FROM idem_lookup('done', 'tenant-1')}),
	'completed|409|"app"', 'standby: another role sees its own key, not the superuser\'s');
is($standby->safe_psql('postgres',
		q{BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
		  SELECT status FROM idem_lookup('done', 'tenant-1'); COMMIT;}),
	'completed', 'standby: idem_lookup in a read-only repeatable-read transaction');
is(sqlstate_of($standby, q{SELECT * FROM idem_lookup(NULL)}), '22004',
	'standby: a bad argument is still its own error');
is(sqlstate_of($standby, q{SELECT * FROM idem_lookup(repeat('k', 256))}), '22001',
	'standby: ... also for a key over the length limit');
is($standby->safe_psql('postgres',
		q{SELECT count(*) > 0, bool_and(bytes > 0) FROM idempotency.partitions}),
	't|t', 'standby: the partitions view works');
is($standby->safe_psql('postgres',
		q{SET idempotency.key_ttl = '1h'; SHOW idempotency.key_ttl}),
	'1h', 'standby: settings can be changed in a session');

# a standby session kept open while the primary makes new partitions (a ttl
# beyond any partition made so far), commits, releases and completes: it
# sees each change once it is replayed
my $session = $standby->background_psql('postgres');
is($session->query_safe(q{SELECT count(*) FROM idem_lookup('late')}),
	'0', 'standby session: no key "late" yet');
is($session->query_safe(q{SELECT status FROM idem_lookup('held')}),
	'in_progress', 'standby session: "held" in progress');
$primary->safe_psql('postgres', qq{
BEGIN;
SELECT status FROM idem_claim('late', ttl => '20 days');
SELECT idem_complete('late', 202, '"late"');
COMMIT;
SELECT idem_complete('held', 200, '"held"', token => $held_token);
COMMIT PREPARED 'idem_tap_prepared';
SELECT idem_consume_message('billing', 'm-late', '25 days');
});
$primary->wait_for_catchup($standby);
is($session->query_safe(
		q{SELECT status, response_code, response_body, expires_at > now() + interval '19 days' FROM idem_lookup('late')}),
	'completed|202|"late"|t',
	'standby session: a key in a partition made after the session started');
is($session->query_safe(q{SELECT status, response_code, response_body FROM idem_lookup('held')}),
	'completed|200|"held"', 'standby session: "held" completed on the primary');
is($session->query_safe(q{SELECT status FROM idem_lookup('prepared')}),
	'in_progress', 'standby session: the prepared claim, once committed');
$session->quit;

# ---------------------------------------------- nothing broke on the standby
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't',
	'standby: still a standby, accepting queries');
my $standby_log = slurp_file($standby->logfile);
unlike($standby_log, qr/XX000|PANIC|TRAP:|terminated by signal/,
	'standby: no internal error, crash or assertion failure in the log');
like($standby_log, qr/ERROR:  25006: cannot execute idem_claim\(\) during recovery/,
	'standby: the refused writes are in its log with their SQLSTATE');

# ---------------------------------------------- settings in configuration files
# With the library loaded in the session, ALTER SYSTEM checks the value
my @settings = split /\n/, $primary->safe_psql('postgres', q{
LOAD 'idempotency';
SELECT name FROM pg_settings WHERE name LIKE 'idempotency.%' AND vartype = 'integer' ORDER BY name});
cmp_ok(scalar(@settings), '>=', 6, 'primary: the integer settings are listed');
my $auto_conf = $primary->data_dir . '/postgresql.auto.conf';
my $auto_before = slurp_file($auto_conf);
foreach my $name (@settings)
{
	foreach my $bad ('-1', '0', 'garbage', '1 fortnight', '2147483648')
	{
		# premake, wait_timeout and key_memory (off) take 0
		next
		  if $bad eq '0'
		  && grep { $name eq "idempotency.$_" } qw(premake wait_timeout key_memory);
		is(sqlstate_of($primary, qq{LOAD 'idempotency';\nALTER SYSTEM SET $name = '$bad';}),
			'22023', "primary: ALTER SYSTEM SET $name = '$bad' is refused");
	}
}
# the prefix is reserved: an unknown name under it is refused (42704 before
# PostgreSQL 17, which checks reserved prefixes first: 42602)
my $pg17 = $primary->pg_version >= 17;
is(sqlstate_of($primary, qq{LOAD 'idempotency';\nALTER SYSTEM SET idempotency.unknown_setting = 1;}),
	$pg17 ? '42602' : '42704',
	'primary: ALTER SYSTEM SET of an unknown idempotency.* setting is refused');
is(slurp_file($auto_conf), $auto_before, 'primary: postgresql.auto.conf is unchanged');

# Without the library loaded in the session, PostgreSQL 15's ALTER SYSTEM
# does not know the settings and refuses them; 17 stores them unchecked (as
# ALTER DATABASE does), and a bad value is caught where the library loads
# (below)
is(sqlstate_of($primary, q{ALTER SYSTEM SET idempotency.key_ttl = '1h'}),
	$pg17 ? 'ok: ' : '42704',
	'primary: ALTER SYSTEM SET idempotency.key_ttl without the library loaded: '
	  . ($pg17 ? 'stored' : 'refused'));
is(sqlstate_of($primary, qq{LOAD 'idempotency';\nALTER SYSTEM SET idempotency.key_ttl = '1h';}),
	'ok: ', 'primary: ... and accepted after LOAD \'idempotency\'');
$primary->safe_psql('postgres', q{ALTER SYSTEM RESET ALL});

# A bad value where nothing can check it (postgresql.conf, or ALTER DATABASE
# in a session that has not loaded the library, which stores placeholders):
# every backend that loads the library warns, keeps the default, and works
$primary->append_conf('postgresql.conf', q{idempotency.key_ttl = 'garbage'});
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_file_settings WHERE name = 'idempotency.key_ttl' AND setting = 'garbage'})
  or die 'the reload was not seen';
is($primary->safe_psql('postgres',
		q{ALTER DATABASE postgres SET idempotency.message_ttl = 'forever'; SELECT 'stored'}),
	'stored', 'primary: ALTER DATABASE stores a placeholder value unchecked');
($rc, $out, $err) = $primary->psql('postgres', q{
SELECT status FROM idem_claim('after-garbage', lease => '1 hour');
SELECT idem_consume_message('billing', 'after-garbage');
SHOW idempotency.key_ttl;
SHOW idempotency.message_ttl;
SELECT expires_at - claimed_at FROM idem_lookup('after-garbage');});
is($rc, 0, 'primary: calls work with bad values in postgresql.conf and the database\'s settings');
is($out, "claimed\nt\n1d\n7d\n1 day", 'primary: ... with the default key_ttl and message_ttl');
like($err, qr/WARNING:  invalid value for parameter "idempotency.key_ttl": "garbage"/,
	'primary: ... and a warning naming the setting in postgresql.conf');
like($err, qr/WARNING:  invalid value for parameter "idempotency.message_ttl": "forever"/,
	'primary: ... and one naming the database\'s setting');
$primary->safe_psql('postgres', q{ALTER DATABASE postgres RESET ALL});

my $primary_log = slurp_file($primary->logfile);
unlike($primary_log, qr/XX000|PANIC|TRAP:|terminated by signal/,
	'primary: no internal error, crash or assertion failure in the log');

$standby->stop;
$primary->stop;
done_testing();

# test/t/033_wait_holders.pl -- waiting for the holder of a two-phase claim
# with the library preloaded: shared-memory wake-ups.
#
# specs/wait_holder.spec runs each outcome without preload (polling).
# Here, with wake-up slots in shared memory:
#
# 1. A waiter sleeps on its slot's condition variable (wait event
#    "Extension") until the holder's completion commits, and answers
#    "completed" with the stored response; while the holder's transaction
#    that completes the key is open, the waiter still sleeps (it is woken by
#    the commit, not by the update).
# 2. A holder whose client dies (SIGKILL of the client process, not of a
#    server process) never completes: the waiter claims the key when the
#    lease lapses, with a new token and the holder's last recovery point.
# 3. Two waiters on a released key: one claims it, the other goes on waiting
#    for the new holder and replays its completion.
# 4. Through a new connection for every transaction (as a transaction
#    pooler hands them out), SET LOCAL idempotency.wait_timeout is all a
#    waiter needs: it keeps no session state.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = PostgreSQL::Test::Cluster->new('waits');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 3600
client_connection_check_interval = '200ms'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency; SELECT idem_maintain()');

# the backend (other than the caller) running a waiter's claim, and its
# wait event
my $waiter_state = q{
	SELECT coalesce(wait_event_type || ':' || wait_event, 'running')
	  FROM pg_stat_activity
	 WHERE query LIKE '%wait => true%' AND state = 'active' AND pid <> pg_backend_pid()};

sub token_of
{
	my ($key) = @_;
	return $node->safe_psql('postgres', qq{SELECT token FROM idem_lookup('$key')});
}

# ---------------------------------------------------------------- 1
$node->safe_psql('postgres',
	q{SELECT status FROM idem_claim('pay-1', '{"amount": 5}', lease => '1 hour')});
my $waiter = $node->background_psql('postgres');
$waiter->query_safe(q{SET idempotency.wait_timeout = '5min'});
$waiter->query_until(qr/started/, q{
	\echo started
	SELECT 'answer ' || status || ' ' || response_code || ' ' || response_body::text
	  FROM idem_claim('pay-1', '{"amount": 5}', lease => '1 hour', wait => true);
	\echo answered
});
ok($node->poll_query_until('postgres', $waiter_state, 'Extension:Extension'),
	'the waiter sleeps on its wake-up slot');

my $holder = $node->background_psql('postgres');
my $token = token_of('pay-1');
$holder->query_safe(qq{BEGIN; SELECT idem_complete('pay-1', 201, '{"charge": "ch_1"}', token => $token)});
is($node->safe_psql('postgres', $waiter_state), 'Extension:Extension',
	'while the completing transaction is open, the waiter still sleeps');
$holder->query_safe('COMMIT');
$waiter->{stdout} = '';
pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/answered/);
like($waiter->{stdout}, qr/answer completed 201 \{"charge": "ch_1"\}/,
	'once it commits, the waiter replays the stored response');

# a waiter woken by the commit: time from COMMIT to its answer
$node->safe_psql('postgres',
	q{SELECT status FROM idem_claim('pay-2', '{"amount": 6}', lease => '1 hour')});
$waiter->query_until(qr/started/, q{
	\echo started
	SELECT status || ' ' || response_code FROM idem_claim('pay-2', '{"amount": 6}', lease => '1 hour', wait => true);
	\echo answered
});
ok($node->poll_query_until('postgres', $waiter_state, 'Extension:Extension'),
	'a second waiter sleeps');
$token = token_of('pay-2');
my $committed_at = time();
$holder->query_safe(qq{SELECT idem_complete('pay-2', 200, NULL, token => $token)});
$waiter->{stdout} = '';
pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/answered/);
my $latency = time() - $committed_at;
like($waiter->{stdout}, qr/completed 200/, 'it answers with the completion');
cmp_ok($latency, '<', 60, 'woken by the commit, long before its lease or bound');
note(sprintf('commit to answer, one sample: %.1f ms', $latency * 1000));

# ---------------------------------------------------------------- 2
my ($out, $err) = ('', '');
my $dying = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'),
	  '-c', q{SELECT status FROM idem_claim('pay-3', '{"amount": 7}', lease => '3 seconds')},
	  '-c', q{SELECT idem_checkpoint('pay-3', 'card-authorized', token => (SELECT token FROM idem_lookup('pay-3')))},
	  '-c', q{\echo holding},
	  '-c', q{SELECT pg_sleep(600)} ],
	'<', \undef, '>', \$out, '2>', \$err);
pump_until($dying, IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default), \$out, qr/holding/);
my $dying_backend = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid()});
$waiter->query_until(qr/started/, q{
	\echo started
	SELECT status || ' ' || (token IS NOT NULL) || ' ' || recovery_point
	  FROM idem_claim('pay-3', '{"amount": 7}', lease => '1 hour', wait => true);
	\echo answered
});
ok($node->poll_query_until('postgres', $waiter_state, 'Extension:Extension'),
	'a waiter sleeps on a holder that is about to die');
$dying->signal('KILL');
$dying->finish;
ok($node->poll_query_until('postgres',
		qq{SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = '$dying_backend')}),
	'the dead client\'s backend has gone');
$waiter->{stdout} = '';
pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/answered/);
like($waiter->{stdout}, qr/claimed true card-authorized/,
	'the lease lapses: the waiter claims the key, with a new token and the last recovery point');
is($node->safe_psql('postgres', q{SELECT status FROM idem_lookup('pay-3')}), 'in_progress',
	'and holds it');

# ---------------------------------------------------------------- 3
$node->safe_psql('postgres',
	q{SELECT status FROM idem_claim('pay-4', '{"amount": 8}', lease => '1 hour')});
my $second = $node->background_psql('postgres');
$second->query_safe(q{SET idempotency.wait_timeout = '5min'});
for my $w ($waiter, $second)
{
	$w->{stdout} = '';
	$w->query_until(qr/started/, q{
		\echo started
		SELECT 'answer ' || status FROM idem_claim('pay-4', '{"amount": 8}', lease => '1 hour', wait => true);
		\echo answered
	});
}
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) = 2 FROM ($waiter_state) s(e) WHERE e = 'Extension:Extension'}),
	'two waiters sleep');
$token = token_of('pay-4');
$holder->query_safe(qq{SELECT idem_release('pay-4', token => $token)});
# one of them claims the key; the other goes on sleeping
ok($node->poll_query_until('postgres', q{SELECT status = 'in_progress' FROM idem_lookup('pay-4')}),
	'one waiter claimed the released key');
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) = 1 FROM ($waiter_state) s(e) WHERE e = 'Extension:Extension'}),
	'the other waits on the new holder');
$token = token_of('pay-4');
$holder->query_safe(qq{SELECT idem_complete('pay-4', 200, '{"by": "new holder"}', token => $token)});
my @answers;
for my $w ($waiter, $second)
{
	pump_until($w->{run}, $w->{timeout}, \$w->{stdout}, qr/answered/);
	push @answers, $w->{stdout} =~ /answer (\w+)/;
}
is(join(',', sort @answers), 'claimed,completed',
	'one claimed the released key, the other replays the new holder\'s completion');

# ---------------------------------------------------------------- 4
$node->safe_psql('postgres',
	q{SELECT status FROM idem_claim('pay-5', '{"amount": 9}', lease => '1 hour')});
my $pooled = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c',
	  q{BEGIN; SET LOCAL idempotency.wait_timeout = '5min';
	    SELECT 'answer ' || status || ' ' || response_code FROM idem_claim('pay-5', '{"amount": 9}', lease => '1 hour', wait => true);
	    COMMIT;} ],
	'<', \undef, '>', \$out, '2>', \$err);
$out = '';
ok($node->poll_query_until('postgres', $waiter_state, 'Extension:Extension'),
	'a waiter in a one-transaction connection sleeps');
$token = token_of('pay-5');
$node->safe_psql('postgres', qq{SELECT idem_complete('pay-5', 202, NULL, token => $token)});
$pooled->finish;
like($out, qr/answer completed 202/, 'and replays the completion');
is($node->safe_psql('postgres', q{SHOW idempotency.wait_timeout}), '0',
	'the setting stays with that transaction (default 0)');

# ---------------------------------------------------------------- 5
# the longest wait_timeout and a lease of 29 days: the sleep is cut to what
# a condition variable takes, and the waiter still wakes at the commit
$node->safe_psql('postgres',
	q{SELECT status FROM idem_claim('pay-6', '{"amount": 10}', ttl => '30 days', lease => '29 days')});
$waiter->{stdout} = '';
$waiter->query_safe(q{SET idempotency.wait_timeout = 2147483647});
$waiter->query_until(qr/started/, q{
	\echo started
	SELECT 'answer ' || status FROM idem_claim('pay-6', '{"amount": 10}', lease => '1 hour', wait => true);
	\echo answered
});
ok($node->poll_query_until('postgres', $waiter_state, 'Extension:Extension'),
	'a waiter with the longest wait_timeout sleeps');
$token = token_of('pay-6');
$holder->query_safe(qq{SELECT idem_complete('pay-6', 200, NULL, token => $token)});
pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/answered/);
like($waiter->{stdout}, qr/answer completed/, 'and is woken by the completion');

$waiter->quit;
$second->quit;
$holder->quit;
$node->stop;
done_testing();


# test/t/022_torture.pl -- exactly-once under contention while partitions
# roll over every second.
#
# For TORTURE_SECONDS (default 60) eight pgbench clients hammer 200 hot
# idempotency keys and 200 hot message ids (Torture::torture_scripts):
# same-transaction claims (half of them with wait => true, one request in
# twenty with another body), two-phase claims with a 250 ms lease that
# often lapses before phase two (so keys are taken over and stale tokens
# refused), single and batch consumes.  Keys and message ids live 2 s
# (idempotency.key_ttl / message_ttl), idempotency.partition_interval is
# 1 s, so every second a partition per ledger is made and one dropped: by
# the background worker (naptime 1 s) and by a ninth client calling
# idem_maintain() every 200 ms, concurrently with each other and with the
# load.  Every key and id is claimed again and again, live, in progress, and
# after it expired, while the partition it sat in is dropped.
#
# The invariant.  Keys expire, so the same key is legitimately charged once
# per ttl window; a duplicate is a second charge within one window.  Each
# charge row stores the fencing token and the expires_at of the claim under
# which it was done (the claim's answer; a two-phase client passes them on
# to phase two).  A claim at clock time t gets expires_at = t + ttl, and a
# key can be claimed again only when its previous record is absent, released,
# lapsed or expired.  A charge is only written in the transaction that
# completes the claim, and a claim completes at most once (a second
# complete, or one with a stale token after a takeover, is refused and rolls
# the charge back).  So the charged claims of one key are completed records,
# and the next one was made no earlier than the previous one's expiry:
#
#     for two charges of one key, expiries differ by >= key_ttl, and the
#     later one has the larger token.
#
# Two charges under one claim (same expiry) or under overlapping claims
# violate it.  Messages: idem_consume_message() answers true at decision
# time d, and the next true for that id comes at d' >= d + message_ttl; the
# consumer reads the clock before the call (before_us <= d) and the effect
# row's default reads it after (after_us >= d), so for two effects x, y of
# one id, y.after_us >= x.before_us + ttl or the other way round
# (conservative: it can only miss duplicates closer than ttl by less than
# the call's own duration).  Right after the load, the completed unexpired
# rows of the key ledger must be exactly the charges of unexpired claims
# (same token and expiry), every charged live key replays, and every
# message processed within the last (ttl - 1 s) is still consumed.
#
# Also: both pgbench runs exit 0 with zero failed transactions (in_progress,
# mismatch and a refused stale token are answers, not errors; the stale
# token is caught by the two-phase client's phase-two function), the
# partitions present at the start are all dropped during the run, every
# partition that ended during the run is dropped (waited for after it: on
# a busy machine maintenance may lag behind the load for a while), the
# storage is small then, and the server log has no ERROR (except autovacuum
# being cancelled by a DROP).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;

my $seconds = $ENV{TORTURE_SECONDS} || 60;

my $node = PostgreSQL::Test::Cluster->new('torture');
$node->init;
$node->append_conf('postgresql.conf', torture_conf());
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE torture');
create_business_schema($node, 'torture');

run_torture(
	$node,
	db            => 'torture',
	label         => 'direct',
	seconds       => $seconds,
	maintain_loop => 1);

$node->stop;
done_testing();

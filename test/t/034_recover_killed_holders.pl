# test/t/034_recover_killed_holders.pl -- idem_recover() finishes the work of
# holders that died.
#
# 1,000 two-phase claims made with keep_request are committed by client
# processes that are then killed with SIGKILL (the client, not a server
# process, which would restart every session) before they complete
# anything.  Four recoverer sessions meanwhile loop over idem_recover(): for
# each key they get, they do the "side effect" (a row in table effects) and
# complete the key with their token, in one transaction.
#
# Then: every key is completed exactly once, by the recoverer whose effect
# row is the key's only one (0 double effects); and every late call of an
# old holder with the token it got (complete, checkpoint, release) is
# refused as stale.

use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $keys = 1000;
my $holders = 10;
my $per_holder = $keys / $holders;

my $node = PostgreSQL::Test::Cluster->new('recover');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = 3600
max_connections = 40
client_connection_check_interval = '200ms'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idempotency;
	SELECT idem_maintain();
	CREATE TABLE effects (key text NOT NULL, recoverer text NOT NULL, token bigint NOT NULL);
	CREATE PROCEDURE recoverer(me text, keys integer) LANGUAGE plpgsql AS $$
	DECLARE
	  r record;
	  deadline timestamptz := clock_timestamp() + interval '5 minutes';
	BEGIN
	  LOOP
	    FOR r IN SELECT * FROM idem_recover('1 minute', 'pay', 10) LOOP
	      INSERT INTO effects VALUES (r.key, me, r.token);
	      PERFORM idem_complete(r.key, 200, jsonb_build_object('by', me, 'amount', r.request -> 'amount'),
	                            'pay', r.token);
	    END LOOP;
	    COMMIT;
	    EXIT WHEN (SELECT count(DISTINCT key) FROM effects) >= keys
	           OR clock_timestamp() > deadline;
	    PERFORM pg_sleep(0.02);
	  END LOOP;
	END $$;
});

# ---------------------------------------------------------------- holders
my @holders;
for my $h (1 .. $holders)
{
	my ($from, $to) = (($h - 1) * $per_holder + 1, $h * $per_holder);
	my $sql = qq{
		SELECT 'held ' || key || ' ' || c.token
		  FROM generate_series($from, $to) g, LATERAL (SELECT 'order-' || g AS key) k,
		       LATERAL idem_claim(k.key, jsonb_build_object('amount', g), 'pay',
		                          lease => '2 seconds', keep_request => true) c;
		\\echo holding
		SELECT pg_sleep(600);
	};
	my %h = (out => '', err => '');
	$h{run} = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
		'<', \$sql, '>', \$h{out}, '2>', \$h{err});
	push @holders, \%h;
}
my %old_token;
for my $h (@holders)
{
	pump_until($h->{run}, IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default),
		\$h->{out}, qr/holding/);
	$old_token{$1} = $2 while $h->{out} =~ /held (\S+) (\d+)/g;
}
is(scalar(keys %old_token), $keys, "$holders clients claimed $keys keys with keep_request and committed");

# the recoverers start while the leases still run
my @recoverers;
for my $r (1 .. 4)
{
	my ($out, $err) = ('', '');
	push @recoverers, IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
		  '-c', "CALL recoverer('r$r', $keys)" ],
		'<', \undef, '>', \$out, '2>', \$err);
}

# every holder's client dies before completing anything
$_->{run}->signal('KILL') for @holders;
$_->{run}->finish for @holders;
ok($node->poll_query_until('postgres',
		q{SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid())}),
	'the killed clients\' backends have gone');

my $ok = 1;
for my $r (@recoverers)
{
	$ok &&= $r->finish;
}
ok($ok, 'the four recoverers ran to the end without error');

# ---------------------------------------------------------------- outcomes
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM generate_series(1, $keys) g,
	       LATERAL idem_lookup('order-' || g, 'pay') l
	 WHERE l.status = 'completed'}),
	$keys, 'every key is completed');
is($node->safe_psql('postgres', q{SELECT count(*) - count(DISTINCT key) FROM effects}),
	'0', '0 double effects: each key\'s work was done once');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM effects e,
	       LATERAL idem_lookup(e.key, 'pay') l
	 WHERE l.token = e.token AND l.response_body ->> 'by' = e.recoverer
	   AND (l.response_body -> 'amount')::int = substr(e.key, 7)::int}),
	$keys, 'each key was completed by the one recoverer that did its work, with the kept request');
note($node->safe_psql('postgres',
	q{SELECT string_agg(recoverer || ': ' || n, ', ' ORDER BY recoverer)
	    FROM (SELECT recoverer, count(*) AS n FROM effects GROUP BY 1) s}));

# every late call of an old holder is refused as stale
my $calls = join("\n", map {
	my $t = $old_token{$_};
	"SELECT try(\$\$SELECT idem_complete('$_', 200, NULL, 'pay', $t)\$\$);\n" .
	"SELECT try(\$\$SELECT idem_checkpoint('$_', 'late', 'pay', $t)\$\$);\n" .
	"SELECT try(\$\$SELECT idem_release('$_', 'pay', $t)\$\$);"
} sort keys %old_token);
$node->safe_psql('postgres', q{
	CREATE FUNCTION try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
	BEGIN
	  EXECUTE stmt;
	  RETURN 'ok';
	EXCEPTION WHEN OTHERS THEN
	  RETURN CASE WHEN SQLERRM LIKE '%is stale' THEN SQLSTATE || ' stale' ELSE SQLSTATE || ' ' || SQLERRM END;
	END $$;
});
my $late = $node->safe_psql('postgres', $calls);
my %count;
$count{$_}++ for split /\n/, $late;
is_deeply(\%count, { '55006 stale' => 3 * $keys },
	'all 3,000 late calls of the old holders (complete, checkpoint, release) are refused as stale');

$node->stop;
done_testing();

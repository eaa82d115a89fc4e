
# test/t/055_who_has_what.pl -- no role learns which keys or message ids
# another role holds from the statistics every role can read.
#
# Role b calls every function that takes a key or a message id (lookup,
# claim, complete, checkpoint, release, consume one, consume a batch) once
# with a key role a holds and once with a key nobody holds, each in the
# same namespace and, with one lane per ledger, in the same partitions.
# Around each call it reads what PostgreSQL shows every role
# (pg_stat_all_indexes, pg_statio_all_indexes, pg_stat_all_tables,
# pg_statio_all_tables, for every relation of schema idempotency) and, as a
# member of pg_monitor, what the extension shows (idempotency.stats,
# idempotency.partitions, idempotency.filter_info()).  Every counter must
# move the same way in both cases.  Up to 0.4.0's review, a partition's
# digest index was on (digest) alone and its digest filter knew digests
# only: b's probe read a's index entry and heap row (idx_tup_read and
# idx_tup_fetch grew by one) exactly when a held the key, and with the
# filters b's probe of a partition happened (idx_scan) only then.
#
# Run twice: without preloading (no filters), and preloaded with the digest
# filters READY in every live partition.  Nothing else runs meanwhile:
# autovacuum is off, and the preloaded server has no slot for the
# maintenance worker (maintenance runs when the test calls it).
#
# Then twice more with idempotency.key_memory (0.5.0): a's keys and ids
# have expired and maintenance has dropped them into the memory's pieces;
# b's calls with a key a's memory holds and with nobody's move every
# counter the same way (pieces are probed per role: their chunks and index
# lead with the role, the memory's filters, shared or each backend's own,
# hold (role, digest) pairs).

use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Torture;
use Digest::SHA;

# counters of every relation of schema idempotency, and of the extension
my $counters_sql = q{
SELECT format('index %s scan=%s tup_read=%s tup_fetch=%s blks_read=%s blks_hit=%s',
              s.indexrelname, s.idx_scan, s.idx_tup_read, s.idx_tup_fetch,
              io.idx_blks_read, io.idx_blks_hit)
  FROM pg_stat_all_indexes s JOIN pg_statio_all_indexes io USING (indexrelid)
 WHERE s.schemaname = 'idempotency'
UNION ALL
SELECT format('table %s seq_scan=%s seq_tup_read=%s idx_scan=%s idx_tup_fetch=%s ins=%s upd=%s del=%s hot_upd=%s live=%s dead=%s'
              ' heap_read=%s heap_hit=%s idx_read=%s idx_hit=%s toast_read=%s toast_hit=%s',
              s.relname, s.seq_scan, s.seq_tup_read, coalesce(s.idx_scan, 0),
              coalesce(s.idx_tup_fetch, 0), s.n_tup_ins, s.n_tup_upd, s.n_tup_del, s.n_tup_hot_upd,
              s.n_live_tup, s.n_dead_tup,
              io.heap_blks_read, io.heap_blks_hit, coalesce(io.idx_blks_read, 0),
              coalesce(io.idx_blks_hit, 0), coalesce(io.toast_blks_read, 0),
              coalesce(io.toast_blks_hit, 0))
  FROM pg_stat_all_tables s JOIN pg_statio_all_tables io USING (relid)
 WHERE s.schemaname = 'idempotency'
UNION ALL
SELECT format('partition %s rows=%s bytes=%s', partition, coalesce(rows_estimate, -1), bytes)
  FROM idempotency.partitions};
my $stats_sql = q{
UNION ALL
SELECT format('stats %s claims=%s replays=%s conflicts=%s mismatches=%s consumed=%s duplicates=%s'
              ' created=%s dropped=%s holder_waits=%s recoveries=%s runs=%s',
              datname, claims, replays, conflicts, mismatches, consumed, duplicates,
              partitions_created, partitions_dropped, holder_waits, recoveries,
              maintenance_runs)
  FROM idempotency.stats WHERE datname = current_database()
UNION ALL
SELECT format('filter %s state=%s digests=%s bytes=%s', partition, state, digests, bytes)
  FROM idempotency.filter_info()};

# what b calls; %k is the key or message id
my @ops = (
	[ 'idem_lookup', q{SELECT count(*) FROM idem_lookup('%k', 'payments')} ],
	[ 'idem_claim', q{BEGIN; SELECT status FROM idem_claim('%k', '{"n": 1}', 'payments'); ROLLBACK} ],
	[ 'idem_claim with a lease',
	  q{BEGIN; SELECT status FROM idem_claim('%k', '{"n": 1}', 'payments', lease => '1 hour', wait => true); ROLLBACK} ],
	[ 'idem_complete', q{SELECT idem_complete('%k', 200, '{}', 'payments')} ],
	[ 'idem_complete with a token', q{SELECT idem_complete('%k', 200, '{}', 'payments', token => 1)} ],
	[ 'idem_checkpoint', q{SELECT idem_checkpoint('%k', 'step', 'payments', token => 1)} ],
	[ 'idem_release', q{SELECT idem_release('%k', 'payments', token => 1)} ],
	[ 'idem_consume_message', q{BEGIN; SELECT idem_consume_message('orders', '%k'); ROLLBACK} ],
	[ 'idem_consume_messages', q{BEGIN; SELECT count(*) FROM idem_consume_messages('orders', ARRAY['%k']); ROLLBACK} ],
);

# name => counters, from the lines of $counters_sql
sub read_counters
{
	my ($node, $preloaded) = @_;
	my %c;
	my $out = $node->safe_psql('postgres',
		"SET ROLE b; SELECT pg_stat_clear_snapshot(); $counters_sql" . ($preloaded ? $stats_sql : ''));
	foreach my $line (split /\n/, $out)
	{
		my ($kind, $name, @fields) = split / /, $line;
		$c{"$kind $name"} = { map { split /=/, $_, 2 } @fields };
	}
	return \%c;
}

# what changed between two readings, as text (numbers as differences,
# others as "old>new"); relations of one lane are the same for every key
sub delta
{
	my ($before, $after) = @_;
	my @lines;
	foreach my $name (sort(keys %$before, grep { !exists $before->{$_} } keys %$after))
	{
		my $b = $before->{$name} // {};
		my $a = $after->{$name} // {};
		my @changed;
		foreach my $f (sort(keys %$a, grep { !exists $a->{$_} } keys %$b))
		{
			my ($x, $y) = ($b->{$f} // '', $a->{$f} // '');
			next if $x eq $y;
			push @changed,
				($x =~ /^-?\d+$/ && $y =~ /^-?\d+$/) ? "$f+" . ($y - $x) : "$f:$x>$y";
		}
		push @lines, "$name @changed" if @changed;
	}
	return join("\n", @lines);
}

# b calls one function with one key, reading the counters around the call
sub observe
{
	my ($node, $preloaded, $sql, $key) = @_;
	(my $call = $sql) =~ s/%k/$key/g;
	my $before = read_counters($node, $preloaded);
	# each statement on its own: the flush is forced when the session goes
	# idle after the call to pg_stat_force_next_flush()
	$node->psql('postgres', qq{
		SET ROLE b;
		$call;
		ROLLBACK;
		SELECT pg_stat_force_next_flush();
		SELECT 1;}, on_error_stop => 0);
	return delta($before, read_counters($node, $preloaded));
}

# The digest filters' bits of a row as 0.4.0 chose them before its review
# (filter.c): a public function of the role's OID and the digest.  Returns
# the block and the sorted bit numbers a (role, scope, key) sets in the
# first segment of a one-page filter.
sub public_filter_bits
{
	use integer;
	no warnings 'portable';
	my ($role, $scope, $key) = @_;
	my $mix = sub {
		my $x = shift;
		# logical shifts: integer's >> is arithmetic
		$x ^= ($x >> 33) & 0x7FFFFFFF;
		$x *= 0xFF51AFD7ED558CCD;
		$x ^= ($x >> 33) & 0x7FFFFFFF;
		$x *= 0xC4CEB9FE1A85EC53;
		$x ^= ($x >> 33) & 0x7FFFFFFF;
		return $x;
	};
	my $sha = Digest::SHA::sha256(pack('N', length $scope) . $scope . $key);
	my $item = unpack('q<', substr($sha, 4, 8)) ^ $mix->($role + 0x2545F4914F6CDD1D);
	my $h = $mix->($item ^ 0x9E3779B97F4A7C15);
	my $block = ($h >> 32) & 127;
	my $first = $h & 511;
	my $step = (($h >> 9) & 511) | 1;
	my %bits = map { (($first + $_ * $step) & 511) => 1 } 0 .. 6;
	return join(' ', $block, sort { $a <=> $b } keys %bits);
}

# Role b crafts a key of its own whose bits in a's partition's filter are
# those of a key of a's (bits chosen by public functions, as before 0.4.0's
# review, made these two keys share them): b's probe of its key must not go
# to the partition's index because a holds the other one.  The pair is
# found by a birthday search over 2^14 keys of each role (24 bits to
# match), as b could find a key for any one of a's it guesses (2^24 hashes).
sub crafted_filter_probe
{
	my ($node) = @_;
	my ($role_a, $role_b) = split /\|/, $node->safe_psql('postgres',
		q{SELECT 'a'::regrole::oid || '|' || 'b'::regrole::oid});
	is($node->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.filter_info()
		 WHERE partition::text LIKE 'idempotency.keys%' AND (segments <> 1 OR bytes <> 8192)}),
		'0', 'crafted keys: every filter of the keys is of one page');
	my (%of_a, $key_a, $key_b);
	$of_a{ public_filter_bits($role_a, 'payments', "crafted-a-$_") } = "crafted-a-$_"
		foreach 1 .. 16384;
	foreach my $i (1 .. 16384)
	{
		my $match = $of_a{ public_filter_bits($role_b, 'payments', "crafted-b-$i") };
		next unless defined $match;
		($key_a, $key_b) = ($match, "crafted-b-$i");
		last;
	}
	ok(defined $key_b, "crafted keys: b's $key_b has the public bits of a's $key_a");
	return unless defined $key_b;

	$node->safe_psql('postgres', qq{
		SET ROLE a;
		BEGIN;
		SELECT status FROM idem_claim('$key_a', '{"n": 1}', 'payments');
		SELECT idem_complete('$key_a', 201, '{"ok": true}', 'payments');
		COMMIT;
	});
	my $lookup = q{SELECT count(*) FROM idem_lookup('%k', 'payments')};
	my $crafted = observe($node, 1, $lookup, $key_b);
	my $free = observe($node, 1, $lookup, 'crafted-free');
	is($crafted, $free,
		"crafted keys: b's lookup of $key_b moves every counter b can read as one of a key nobody's bits");
}

foreach my $preloaded (0, 1)
{
	my $mode = $preloaded ? 'preloaded, digest filters' : 'not preloaded';
	my $node = PostgreSQL::Test::Cluster->new($preloaded ? 'preloaded' : 'plain');
	$node->init;
	# one lane per ledger: every key's live rows are in the same partitions
	$node->append_conf('postgresql.conf', q{
autovacuum = off
max_prepared_transactions = 10
idempotency.partition_interval = '1d'
idempotency.key_ttl = '1d'
idempotency.message_ttl = '1d'
log_min_messages = warning
});
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
max_worker_processes = 1
idempotency.filter_memory = '8MB'
}) if $preloaded;
	$node->start;
	$node->safe_psql('postgres', q{
		CREATE EXTENSION idempotency;
		CREATE ROLE a;
		CREATE ROLE b IN ROLE pg_monitor;
		SELECT idem_maintain();
	});

	# a holds held-1 .. held-N as completed keys and consumed message ids
	my $n = scalar @ops;
	$node->safe_psql('postgres', qq{
		SET ROLE a;
		SELECT count(*) FROM idem_consume_messages('orders',
			ARRAY(SELECT 'held-' || i FROM generate_series(1, $n) i));
		DO \$\$
		BEGIN
			FOR i IN 1 .. $n LOOP
				PERFORM idem_claim('held-' || i, '{"n": 1}', 'payments');
				PERFORM idem_complete('held-' || i, 201, '{"ok": true}', 'payments');
			END LOOP;
		END \$\$;
	});
	is($node->safe_psql('postgres', q{SELECT count(DISTINCT lanes) || ' ' || max(lanes) FROM idempotency.partitions}),
		'1 1', "$mode: one lane per ledger");
	is($node->safe_psql('postgres', q{
		SELECT count(*) FROM idempotency.keys WHERE role = 'a'::regrole AND state = 'c'}),
		$n, "$mode: a holds $n completed keys");
	if ($preloaded)
	{
		$node->safe_psql('postgres', 'SELECT idem_maintain()');
		filters_ready($node, 'postgres', $mode);
	}

	my $i = 0;
	my $writes = 0;
	foreach my $op (@ops)
	{
		my ($what, $sql) = @$op;
		$i++;
		my $held = observe($node, $preloaded, $sql, "held-$i");
		my $free = observe($node, $preloaded, $sql, "free-$i");
		# without the filters every call probes; with them, no probe of
		# b's is needed (no key of b's is anywhere), and only writes show
		if ($preloaded)
		{
			$writes++ if $free =~ /^table \S+ .*\bins\+1/m;
		}
		else
		{
			like($free, qr/^index \S+ .*\bscan\+1/m, "$mode: $what probes an index (b can see that)");
		}
		is($held, $free,
			"$mode: $what moves every counter b can read the same way for a's key as for nobody's");
	}
	ok($writes >= 4, "$mode: b sees its own writes ($writes calls wrote a row)") if $preloaded;
	crafted_filter_probe($node) if $preloaded;

	$node->stop;
}

# ------------------------------------------------------- the key memory
foreach my $preloaded (0, 1)
{
	my $mode = ($preloaded ? 'preloaded, digest filters' : 'not preloaded') . ', key memory';
	my $node = PostgreSQL::Test::Cluster->new($preloaded ? 'memory_preloaded' : 'memory_plain');
	$node->init;
	# one lane per ledger; b's rows go to partitions made ahead (10 min)
	$node->append_conf('postgresql.conf', q{
autovacuum = off
idempotency.partition_interval = '10s'
idempotency.key_ttl = '10s'
idempotency.message_ttl = '10s'
idempotency.premake = 60
idempotency.key_memory = '1h'
log_min_messages = warning
});
	$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
max_worker_processes = 1
idempotency.filter_memory = '8MB'
}) if $preloaded;
	$node->start;
	$node->safe_psql('postgres', q{
		CREATE EXTENSION idempotency;
		CREATE ROLE a;
		CREATE ROLE b IN ROLE pg_monitor;
		SELECT idem_maintain();
	});
	# a key of a's for each try of each call (below): a try that is made
	# again observes a key b has not probed yet, as its free key is
	my $tries = 5;
	my $n = $tries * scalar @ops;
	$node->safe_psql('postgres', qq{
		SET ROLE a;
		SELECT count(*) FROM idem_consume_messages('orders',
			ARRAY(SELECT 'held-' || i FROM generate_series(1, $n) i), ttl => '1 second');
		DO \$\$
		BEGIN
			FOR i IN 1 .. $n LOOP
				PERFORM idem_claim('held-' || i, '{"n": 1}', 'payments', ttl => '1 second');
				PERFORM idem_complete('held-' || i, 201, '{"ok": true}', 'payments');
			END LOOP;
		END \$\$;
	});
	# maintenance drops a's partitions into the memory once they have ended
	my $moved = 0;
	foreach (1 .. 600)
	{
		$node->safe_psql('postgres', 'SELECT idem_maintain()');
		$moved = $node->safe_psql('postgres', q{
			SELECT to_regclass('idempotency.keys_memory') IS NOT NULL
			   AND to_regclass('idempotency.messages_memory') IS NOT NULL}) eq 't'
		  && $node->safe_psql('postgres', q{
			SELECT (SELECT count(*) FROM idempotency.keys) = 0
			   AND (SELECT count(*) FROM idempotency.messages) = 0
			   AND (SELECT count(*) FROM idempotency.keys_memory) > 0
			   AND (SELECT count(*) FROM idempotency.messages_memory) > 0}) eq 't';
		last if $moved;
		select(undef, undef, undef, 0.2);
	}
	ok($moved, "$mode: a's keys and ids are in the memory");
	is($node->safe_psql('postgres', q{
		SET ROLE a;
		BEGIN;
		SELECT (SELECT status FROM idem_claim('held-1', '{"n": 1}', 'payments')) || ' '
		    || idem_consume_message('orders', 'held-1')::text;
		ROLLBACK;}),
		'expired false', "$mode: a's key is answered expired, its id false");
	if ($preloaded)
	{
		is($node->safe_psql('postgres', q{
			SELECT count(*) FILTER (WHERE f.state IS DISTINCT FROM 'ready') || ' of ' || count(*)
			  FROM (VALUES ('idempotency.keys_memory'::regclass),
			               ('idempotency.messages_memory'::regclass)) m (t)
			  LEFT JOIN idempotency.filter_info() f ON f.partition = m.t}),
			'0 of 2', "$mode: the memory of each ledger has a READY filter");
	}

	# a pair of calls is observed again if a partition ended meanwhile (a
	# call looks into the ended partitions not dropped yet, each a probe)
	my $ended_sql = q{SELECT count(*) FROM idempotency.partitions WHERE upper_bound <= clock_timestamp()};
	my $i = 0;
	foreach my $op (@ops)
	{
		my ($what, $sql) = @$op;
		$i++;
		my ($held, $free);
		foreach my $try (1 .. $tries)
		{
			my $ended = $node->safe_psql('postgres', $ended_sql);
			# b's first rows in the partitions it writes to now (which
			# change every 10 s), so that neither call of the pair is the
			# one that gives them their first page
			$node->safe_psql('postgres', qq{
				SET ROLE b;
				BEGIN;
				SELECT idem_consume_message('orders', 'warm-$i-$try');
				SELECT status FROM idem_claim('warm-$i-$try', '{"n": 1}', 'payments');
				ROLLBACK;});
			# (not the held key of an earlier try: b's rolled-back row of
			# it would be found by this probe, and the free key has none)
			$held = observe($node, $preloaded, $sql, 'held-' . ($tries * ($i - 1) + $try));
			$free = observe($node, $preloaded, $sql, "free-$i-$try");
			last if $node->safe_psql('postgres', $ended_sql) eq $ended;
		}
		if (!$preloaded)
		{
			# each call is a backend's first: it builds its own filter of
			# the memory, reading the (small, unindexed) pieces whole
			like($free, qr/^table keys_memory\S* .*\bseq_scan\+1|^table messages_memory\S* .*\bseq_scan\+1/m,
				"$mode: $what reads a piece for its backend's filter of the memory (b can see that)")
			  if $what =~ /^idem_(claim|consume_messages?|lookup)$/;
		}
		is($held, $free,
			"$mode: $what moves every counter b can read the same way for a key a's memory holds as for nobody's");
	}

	$node->stop;
}

done_testing();

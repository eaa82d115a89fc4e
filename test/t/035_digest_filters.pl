
# test/t/035_digest_filters.pl -- the digest filters (src/filter.h) never
# hide a row: a call skips a partition only if no row of its key can be
# there, whatever wrote the rows and whenever.
#
#   - partitions the extension makes are born with a READY filter, and
#     every row written through the extension is in its partition's filter;
#   - after a restart (shared memory lost) rows are still found, before and
#     after maintenance builds the filters again from the heap, also while
#     other sessions write into the partitions being built;
#   - rows written by other means (COPY, INSERT ... SELECT as a superuser,
#     a COPY by a role with INSERT on some columns only) make the
#     database's filters UNUSABLE at once, and the next build includes
#     them; a refused COPY changes nothing; maintenance takes column grants
#     on the ledgers back;
#   - rows a superuser's event trigger writes into a partition between the
#     library's CREATE TABLE and its ATTACH are found (no empty READY
#     filter for a partition that is not empty);
#   - a database with a logical replication subscription gets no filters;
#   - a pool too small for every partition leaves some without one, and
#     every answer stays right; the log names the database holding it;
#   - a database gives room back, down to its share, when another needs it;
#   - idempotency.filter_memory = 0 turns them off.
#
# Each check asserts what the protocol promises (a redelivered id answers
# false, a completed key replays), which a filter that missed a row would
# break; the filters' own state is read from idempotency.filter_info().

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('filters');
$node->init;
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
idempotency.filter_memory = '8MB'
log_min_messages = warning
});
$node->start;

# a maintenance round of our own, run to its end.  The worker's round (a
# CREATE EXTENSION in any database wakes the launcher, which then visits
# every database) makes idem_maintain() skip: wait for it to end, and run
# ours again.
sub maintain
{
	my ($n, $db) = @_;
	foreach (1 .. 100)
	{
		my ($rc, $out, $err) = $n->psql($db, 'SELECT idem_maintain()', on_error_die => 1);
		return unless $err =~ /already running/;
		$n->poll_query_until($db, q{
			SELECT NOT EXISTS (SELECT FROM pg_stat_activity
							   WHERE datname = current_database()
								 AND query = 'idempotency maintenance')})
		  or die "the worker's maintenance round in $db did not end";
	}
	die "idem_maintain() in $db kept finding a round under way";
}
$node->safe_psql('postgres', 'CREATE EXTENSION idempotency');
maintain($node, 'postgres');

# every live partition the extension made has a READY filter
sub filter_states
{
	my ($db) = @_;
	return $node->safe_psql($db // 'postgres', q{
		SELECT coalesce(string_agg(state || '=' || n, ' ' ORDER BY state), 'none')
		  FROM (SELECT state, count(*) AS n FROM idempotency.filter_info() GROUP BY 1) s});
}
is($node->safe_psql('postgres', q{SELECT setting || unit || ' ' || context FROM pg_settings
	WHERE name = 'idempotency.filter_memory'}), '8192kB postmaster',
	'idempotency.filter_memory: set in postgresql.conf, kB, at server start');
my $live = $node->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.partitions WHERE NOT expired});
is(filter_states(), "ready=$live",
	'every live partition the extension made has a READY filter');

# ids and keys written through the extension
sub write_batch
{
	my ($db, $prefix, $from, $to) = @_;
	return $node->safe_psql($db, qq{
		SELECT count(*) FROM idem_consume_messages('c',
			ARRAY(SELECT '$prefix' || g FROM generate_series($from, $to) g))});
}
is(write_batch('postgres', 'm', 1, 20000), '20000', '20,000 new ids consumed');
$node->safe_psql('postgres', q{
	DO $$
	BEGIN
		FOR i IN 1 .. 300 LOOP
			PERFORM idem_claim('k' || i, '{"n": 1}');
			PERFORM idem_complete('k' || i, 201, '{"ok": true}');
		END LOOP;
	END $$});

# the answers every later check compares with: nothing consumed twice,
# every key replayed
sub check_answers
{
	my ($what, $db, $prefix, $n) = @_;
	$db //= 'postgres';
	$prefix //= 'm';
	$n //= 20000;
	is(write_batch($db, $prefix, 1, $n), '0',
		"$what: every redelivered id answers false");
	is($node->safe_psql($db, q{
		SELECT count(*) FROM generate_series(1, 300) g,
			LATERAL idem_claim('k' || g, '{"n": 1}') c
		 WHERE c.status <> 'completed' OR c.response_code <> 201}), '0',
		"$what: every completed key replays its response")
	  if $db eq 'postgres';
}
check_answers('with the filters made with the partitions');
ok($node->safe_psql('postgres', q{
	SELECT sum(digests) FROM idempotency.filter_info()}) >= 20300,
	'the filters hold every digest written');

# a restart loses the filters; rows are found without them, then with the
# ones maintenance builds from the heap
$node->restart;
check_answers('after a restart');
maintain($node, 'postgres');
is(filter_states(), "ready=$live", 'maintenance builds a filter for every live partition');
check_answers('with the filters built from the heap');

# builds while other sessions write into the partitions being built: each
# writer consumes its own new ids in many small transactions; after the
# build, every id any of them consumed must answer false
$node->restart;
my @writers;
foreach my $w (1 .. 2)
{
	my $h = $node->background_psql('postgres', on_error_stop => 1);
	$h->query_until(qr/started/, qq{
		\\echo started
		DO \$\$
		BEGIN
			FOR i IN 1 .. 4000 LOOP
				PERFORM idem_consume_message('c', 'w$w-' || i);
				COMMIT;
			END LOOP;
		END \$\$;
	});
	push @writers, $h;
}
foreach (1 .. 3)
{
	maintain($node, 'postgres');
}
$_->quit foreach @writers;
maintain($node, 'postgres');
is(filter_states(), "ready=$live", 'every filter is READY after builds under concurrent writes');
foreach my $w (1 .. 2)
{
	is(write_batch('postgres', "w$w-", 1, 4000), '0',
		"writer $w: every id it consumed while filters were built answers false");
}
check_answers('after builds under concurrent writes');

# rows written by other means: another database's ledger rows, copied in
# with COPY and with INSERT ... SELECT as a superuser
my $dump = $node->basedir . '/ext_rows.copy';
$node->safe_psql('postgres', qq{
	SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'x' || g FROM generate_series(1, 500) g));
	COPY (SELECT * FROM idempotency.messages WHERE digest IN
			(SELECT digest FROM idempotency.export_messages(ARRAY['c'])
			  WHERE digest NOT IN (SELECT digest FROM idempotency.messages m2 WHERE false)))
		TO '$dump';
});
$node->safe_psql('postgres', q{CREATE DATABASE other});
$node->safe_psql('other', 'CREATE EXTENSION idempotency');
maintain($node, 'other');
is(write_batch('other', 'y', 1, 100), '100', 'the other database takes its own ids');
like(filter_states('other'), qr/^ready=\d+$/, 'its filters are READY');
my $copy = $node->background_psql('other', on_error_stop => 1);
$copy->query_safe(qq{
	BEGIN;
	COPY idempotency.messages FROM '$dump';
});
like(filter_states('other'), qr/^unusable=\d+$/,
	'a COPY into the ledger makes every filter of the database UNUSABLE at once');
maintain($node, 'other');
like(filter_states('other'), qr/^unusable=\d+$/,
	'no filter is built while the transaction that ran the COPY is open');
$copy->query_safe('COMMIT');
$copy->quit;
is(write_batch('other', 'x', 1, 500), '0', 'the copied ids are found');
maintain($node, 'other');
like(filter_states('other'), qr/^ready=\d+$/, 'once the COPY has ended, maintenance builds them again');
is(write_batch('other', 'x', 1, 500), '0', 'the copied ids are in the rebuilt filters');

# INSERT ... SELECT by a superuser, in a third database
$node->safe_psql('postgres', q{CREATE DATABASE third});
$node->safe_psql('third', 'CREATE EXTENSION idempotency');
maintain($node, 'third');
$node->safe_psql('third', q{
	CREATE TABLE saved (LIKE idempotency.messages);
});
$node->safe_psql('third', qq{COPY saved FROM '$dump'});
$node->safe_psql('third', q{INSERT INTO idempotency.messages SELECT * FROM saved});
like(filter_states('third'), qr/^unusable=\d+$/, 'an INSERT into the ledger makes the filters UNUSABLE');
is(write_batch('third', 'x', 1, 500), '0', 'ids inserted by hand are found');

# an INSERT in a WITH clause (the statement is a SELECT)
$node->safe_psql('postgres', q{CREATE DATABASE fourth});
$node->safe_psql('fourth', 'CREATE EXTENSION idempotency');
maintain($node, 'fourth');
$node->safe_psql('fourth', q{
	CREATE TABLE saved (LIKE idempotency.messages);
});
$node->safe_psql('fourth', qq{COPY saved FROM '$dump'});
is(write_batch('fourth', 'y', 1, 100), '100', 'the fourth database takes its own ids');
$node->safe_psql('fourth', q{
	WITH w AS (INSERT INTO idempotency.messages SELECT * FROM saved RETURNING 1)
	SELECT count(*) FROM w});
like(filter_states('fourth'), qr/^unusable=\d+$/, 'an INSERT in a WITH clause makes the filters UNUSABLE');
is(write_batch('fourth', 'x', 1, 500), '0', 'ids inserted by a WITH clause are found');

# a partition moved to another schema, written there, moved back
maintain($node, 'fourth');
like(filter_states('fourth'), qr/^ready=\d+$/, 'the fourth database has its filters again');
my $part = $node->safe_psql('fourth', q{
	SELECT tableoid::regclass FROM idempotency.messages GROUP BY 1 ORDER BY count(*) DESC LIMIT 1});
(my $bare = $part) =~ s/^idempotency\.//;
$node->safe_psql('fourth', qq{
	TRUNCATE saved;
	INSERT INTO saved SELECT * FROM $part;
	DELETE FROM $part;
	VACUUM $part;
	ALTER TABLE $part SET SCHEMA public;});
maintain($node, 'fourth');
like(filter_states('fourth'), qr/^ready=\d+$/, 'a partition moved out of the schema: filters rebuilt');
$node->safe_psql('fourth', qq{INSERT INTO public.$bare SELECT * FROM saved});
$node->safe_psql('fourth', qq{ALTER TABLE public.$bare SET SCHEMA idempotency});
my $moved = $node->safe_psql('fourth', q{SELECT count(*) FROM saved});
ok($moved > 0, "$moved rows written into a partition while it was in another schema");
is($node->safe_psql('fourth', q{
	SELECT count(*) FROM idem_consume_messages('c',
		ARRAY(SELECT 'x' || g FROM generate_series(1, 500) g))}), '0',
	'rows written into a ledger partition in another schema are found');

# a COPY that is still reading while another session makes partitions: no
# filter is made READY while an external write is under way (a statement
# that routes rows through the ledger's table may see partitions made
# after its start was noticed, and write into them)
my $fifo = $node->basedir . '/copy.fifo';
system('mkfifo', $fifo) == 0 or die "mkfifo: $!";
chmod 0666, $fifo;
$node->safe_psql('postgres', q{CREATE DATABASE fifth});
$node->safe_psql('fifth', 'CREATE EXTENSION idempotency');
maintain($node, 'fifth');
$node->safe_psql('postgres', q{SELECT idem_consume_message('c', 'near-1')});
my $near_row = $node->safe_psql('postgres', q{
	SELECT m.expires_at || E'\t' || m.digest || E'\t' || m.role || E'\t' || m.lane
	  FROM idempotency.messages m
	  JOIN idempotency.export_messages(ARRAY['c']) e ON e.digest = m.digest
	 ORDER BY m.expires_at DESC LIMIT 1});
my $copier = $node->background_psql('fifth', on_error_stop => 0);
$copier->query_until(qr/copying/, qq{
	\\echo copying
	COPY idempotency.messages FROM '$fifo';
});
open(my $fh, '>', $fifo) or die "open $fifo: $!";
$fh->autoflush(1);
is($node->safe_psql('fifth', q{
	SELECT count(*) FROM idem_consume_messages('c',
		ARRAY(SELECT 'far-' || g FROM generate_series(1, 100) g), '29 days')}),
	'100', 'calls make the far partitions of every lane while the COPY runs');
is($node->safe_psql('fifth', q{
	SELECT count(*) FROM idempotency.filter_info() f
	  JOIN idempotency.partitions p ON p.partition = f.partition
	 WHERE f.state = 'ready' AND p.upper_bound > now() + interval '20 days'}), '0',
	'no partition made while the COPY runs has a READY filter');
print $fh "$near_row\n";
close($fh);
$copier->quit;
maintain($node, 'fifth');
like(filter_states('fifth'), qr/^ready=\d+$/, 'once the COPY has ended, every filter is built');
is($node->safe_psql('fifth', q{
	SELECT count(*) FROM idem_consume_messages('c',
		ARRAY(SELECT 'far-' || g FROM generate_series(1, 100) g), '29 days')}),
	'0', 'the ids consumed while the COPY ran are found');

# user code that the library's own statements fire is looked at too: a
# trigger on the stream positions (maintenance deletes unused ones each
# run) that writes ledger rows once armed (the background worker's round
# may fire it too, before or after: either way a write is a write)
$node->safe_psql('postgres', q{CREATE DATABASE sixth});
$node->safe_psql('sixth', 'CREATE EXTENSION idempotency');
maintain($node, 'sixth');
$node->safe_psql('sixth', q{
	CREATE TABLE saved (LIKE idempotency.messages);
	CREATE TABLE armed ();
	CREATE FUNCTION sneak() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF EXISTS (SELECT FROM public.armed) THEN
			INSERT INTO idempotency.messages SELECT * FROM public.saved;
			DELETE FROM public.saved;
		END IF;
		RETURN NULL;
	END $$;
	CREATE TRIGGER sneak AFTER DELETE ON idempotency.positions
		FOR EACH STATEMENT EXECUTE FUNCTION sneak();
});
$node->safe_psql('sixth', qq{COPY saved FROM '$dump'});
is(write_batch('sixth', 'y', 1, 100), '100', 'the sixth database takes its own ids');
maintain($node, 'sixth');
like(filter_states('sixth'), qr/^ready=\d+$/, 'its filters are READY (the trigger is not armed)');
$node->safe_psql('sixth', 'INSERT INTO armed DEFAULT VALUES');
maintain($node, 'sixth');
is($node->safe_psql('sixth', 'SELECT count(*) FROM saved'), '0',
	"maintenance's DELETE of unused positions fired the trigger");
like(filter_states('sixth'), qr/^unusable=\d+$/,
	'a write fired by the library\'s own statement makes the filters UNUSABLE');
is(write_batch('sixth', 'x', 1, 500), '0', 'the ids the trigger wrote are found');

# a role that may not write the ledgers cannot switch the filters off
$node->safe_psql('sixth', 'DROP TRIGGER sneak ON idempotency.positions');
maintain($node, 'sixth');
$node->safe_psql('sixth', 'CREATE ROLE watcher LOGIN IN ROLE pg_monitor');
like(filter_states('sixth'), qr/^ready=\d+$/, 'filters READY again');
my ($rc, $out, $err) = $node->psql('sixth',
	q{SET ROLE watcher; UPDATE idempotency.keys SET state = 'c' WHERE false});
like($err, qr/permission denied/, 'a pg_monitor member may not update the key ledger');
like(filter_states('sixth'), qr/^ready=\d+$/, 'and its refused statement leaves the filters READY');
($rc, $out, $err) = $node->psql('sixth',
	"SET ROLE watcher;\nCOPY idempotency.messages FROM STDIN;\n\\.\n");
like($err, qr/permission denied/, 'nor COPY into the message ledger');
like(filter_states('sixth'), qr/^ready=\d+$/, 'and its refused COPY leaves the filters READY');

# COPY FROM into a ledger by a role whose only privilege is INSERT on the
# columns it copies (COPY needs no more): noted once COPY's own privilege
# check has passed, whatever granted it; maintenance then takes the column
# grant back
$node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_consume_messages('colc', ARRAY(SELECT 'col-' || g FROM generate_series(1, 50) g))});
my $col_rows = $node->safe_psql('postgres', q{
	SELECT string_agg(m.expires_at || E'\t' || m.digest || E'\t' || m.role || E'\t' || m.lane, E'\n')
	  FROM idempotency.messages m
	 WHERE m.digest IN (SELECT digest FROM idempotency.export_messages(ARRAY['colc']))});
$node->safe_psql('sixth', q{
	CREATE ROLE colcopy LOGIN;
	GRANT USAGE ON SCHEMA idempotency TO colcopy;
	GRANT INSERT (expires_at, digest, role, lane) ON idempotency.messages TO colcopy;
});
like(filter_states('sixth'), qr/^ready=\d+$/, 'filters READY before the column-privileged COPY');
$node->safe_psql('sixth',
	"SET ROLE colcopy;\nCOPY idempotency.messages (expires_at, digest, role, lane) FROM STDIN;\n$col_rows\n\\.\n");
like(filter_states('sixth'), qr/^unusable=\d+$/,
	'a COPY by a role with INSERT on some columns only makes the filters UNUSABLE');
my $colc_again = q{
	SELECT count(*) FROM idem_consume_messages('colc', ARRAY(SELECT 'col-' || g FROM generate_series(1, 50) g))};
is($node->safe_psql('sixth', $colc_again), '0', 'the ids it copied are found');
maintain($node, 'sixth');
is($node->safe_psql('sixth', q{
	SELECT has_column_privilege('colcopy', 'idempotency.messages', 'digest', 'INSERT')}),
	'f', 'maintenance takes the column grant back');
like(filter_states('sixth'), qr/^ready=\d+$/, 'and builds the filters again');
is($node->safe_psql('sixth', $colc_again), '0', 'with the copied ids in them');

# a superuser's event trigger that writes rows into each partition the
# library makes, after its CREATE TABLE and before its ATTACH (which the
# hooks let through as the library's own): the rows are in the partition
# before it is a ledger's, so it must not be given an empty READY filter
$node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_consume_messages('evc', ARRAY(SELECT 'evt-' || g FROM generate_series(1, 20) g))});
# each row with the name of its partition but the lower bound: the trigger
# writes it into every new partition of that lane, at the partition's
# lower bound (which fits whatever the day)
my $evt_rows = $node->safe_psql('postgres', q{
	SELECT string_agg(regexp_replace(m.tableoid::regclass::text, '^idempotency\.|[0-9]{8}_[0-9]{6}$', '', 'g')
	                  || E'\t' || m.digest || E'\t' || m.role || E'\t' || m.lane, E'\n')
	  FROM idempotency.messages m
	 WHERE m.digest IN (SELECT digest FROM idempotency.export_messages(ARRAY['evc']))});
$node->safe_psql('postgres', 'CREATE DATABASE seventh');
# armed before the extension exists (the worker may maintain the database
# as soon as CREATE EXTENSION commits)
$node->safe_psql('seventh', q{
BEGIN;
CREATE TABLE saved (prefix text, digest uuid, role regrole, lane smallint);
COPY saved FROM STDIN;
} . $evt_rows . q{
\.
CREATE FUNCTION sneak_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE
	r record;
	n text;
BEGIN
	FOR r IN SELECT * FROM pg_event_trigger_ddl_commands()
			  WHERE command_tag = 'CREATE TABLE' AND schema_name = 'idempotency'
				AND object_identity ~ '_[0-9]{8}_[0-9]{6}$'
	LOOP
		n := regexp_replace(r.object_identity, '^idempotency\.', '');
		EXECUTE format('INSERT INTO %s SELECT $1 + interval ''1 second'', digest, role, lane FROM public.saved WHERE prefix = $2',
					   r.object_identity)
			USING to_timestamp(substring(n FROM '[0-9]{8}_[0-9]{6}$'), 'YYYYMMDD_HH24MISS')::timestamp AT TIME ZONE 'UTC',
				  regexp_replace(n, '[0-9]{8}_[0-9]{6}$', '');
	END LOOP;
END $$;
CREATE EVENT TRIGGER sneak_ddl ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
	EXECUTE FUNCTION sneak_ddl();
CREATE EXTENSION idempotency;
COMMIT;
});
maintain($node, 'seventh');
ok($node->safe_psql('seventh', q{
	SELECT count(*) FROM idempotency.messages m JOIN saved s USING (digest)
	 WHERE m.expires_at > now()}) > 0,
	'the event trigger wrote live rows into partitions the library made');
is($node->safe_psql('seventh', q{
	SELECT count(*) FROM idem_consume_messages('evc', ARRAY(SELECT 'evt-' || g FROM generate_series(1, 20) g))}),
	'0', 'every id the event trigger wrote is found');
$node->safe_psql('seventh', 'DROP EVENT TRIGGER sneak_ddl');

# a subscription: no filters in its database while it exists
$node->safe_psql('postgres', q{SET client_min_messages = error; CREATE PUBLICATION everything FOR ALL TABLES});
my $connstr = $node->connstr('postgres');
$node->safe_psql('third', qq{
	CREATE SUBSCRIPTION sub CONNECTION \$c\$$connstr\$c\$ PUBLICATION everything
		WITH (connect = false, enabled = false, create_slot = false, slot_name = NONE)});
maintain($node, 'third');
unlike(filter_states('third'), qr/ready/, 'no filter is READY in a database with a subscription');
is(write_batch('third', 'x', 1, 500), '0', 'the ids are still found');
$node->safe_psql('third', q{DROP SUBSCRIPTION sub});
maintain($node, 'third');
like(filter_states('third'), qr/^ready=\d+$/, 'filters come back once the subscription is gone');
is(write_batch('third', 'x', 1, 500), '0', 'and hold the ids inserted by hand');

# a pool too small for every partition: some go without, answers stay right
$node->stop;
my $small = PostgreSQL::Test::Cluster->new('small');
$small->init;
$small->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
idempotency.filter_memory = '64kB'
log_min_messages = warning
});
$small->start;
$small->safe_psql('postgres', 'CREATE EXTENSION idempotency');
maintain($small, 'postgres');
is($small->safe_psql('postgres', q{
	SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 's' || g FROM generate_series(1, 30000) g))}),
	'30000', 'a small pool: 30,000 new ids consumed');
my $without = $small->safe_psql('postgres', q{
	SELECT count(*) FROM idempotency.partitions p
	 WHERE NOT expired
	   AND NOT EXISTS (SELECT FROM idempotency.filter_info() f
					   WHERE f.partition = p.partition AND f.state = 'ready')});
ok($without > 0, "a small pool: $without live partitions have no usable filter");
# the server's log says so, with what to do, once for the whole storm
my $small_log = slurp_file($small->logfile);
my @full = ($small_log =~ /LOG:  idempotency\.filter_memory is full/g);
is(scalar @full, 1, 'a small pool: the log says filter_memory is full, once');
like($small_log,
	qr/DETAIL:  The partition with OID \d+ of the messages ledger in database "postgres" has no digest filter; lookups in it read its index\. Database "postgres" holds the most of the pool: 64 kB of 64 kB, in 8 filters\. This is logged at most once every 10 minutes\.\n.*HINT:  Raise idempotency\.filter_memory/,
	'a small pool: the message names the partition and the database holding the pool, and says what to do');
is($small->safe_psql('postgres', q{
	SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 's' || g FROM generate_series(1, 30000) g))}),
	'0', 'a small pool: every redelivered id answers false');
$small->stop;

# the pool is shared fairly between databases: one alone may take all of
# it, and gives room back, down to its share (the pool divided by the
# databases holding filters), when another needs it
my $shared = PostgreSQL::Test::Cluster->new('shared');
$shared->init;
$shared->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.naptime = '1d'
idempotency.filter_memory = '128kB'
log_min_messages = warning
});
$shared->start;
# what each database holds: its filters and their bytes
sub held
{
	my ($db) = @_;
	return $shared->safe_psql($db, q{
		SELECT count(*) || ' filters, ' || coalesce(sum(bytes), 0)::bigint / 1024 || ' kB'
		  FROM idempotency.filter_info() WHERE state = 'ready'});
}
foreach my $db ('hog', 'fair')
{
	$shared->safe_psql('postgres', "CREATE DATABASE $db");
}
$shared->safe_psql('hog', 'CREATE EXTENSION idempotency');
maintain($shared, 'hog');
is(held('hog'), '16 filters, 128 kB', 'a database alone takes the whole pool (16 pages, one per filter)');
like(slurp_file($shared->logfile),
	qr/DETAIL:  The partition with OID \d+ of the messages ledger in database "hog" has no digest filter; lookups in it read its index\. Database "hog" holds the most of the pool: 128 kB of 128 kB, in 16 filters\./,
	'the log of the full pool names the database that holds it');
$shared->safe_psql('fair', 'CREATE EXTENSION idempotency');
maintain($shared, 'fair');
is(held('fair'), '8 filters, 64 kB', 'a second database gets its share of the pool');
is(held('hog'), '8 filters, 64 kB', 'taken back from the first, down to its share');
maintain($shared, 'hog');
maintain($shared, 'fair');
is(held('hog') . '; ' . held('fair'), '8 filters, 64 kB; 8 filters, 64 kB',
	'neither takes room back from the other once both hold their share');
foreach my $db ('hog', 'fair')
{
	is($shared->safe_psql($db, q{
		SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'f' || g FROM generate_series(1, 2000) g))}),
		'2000', "$db: new ids consumed");
	is($shared->safe_psql($db, q{
		SELECT count(*) FROM idem_consume_messages('c', ARRAY(SELECT 'f' || g FROM generate_series(1, 2000) g))}),
		'0', "$db: every redelivered id answers false");
}
$shared->stop;

# idempotency.filter_memory = 0: no filters at all
my $off = PostgreSQL::Test::Cluster->new('off');
$off->init;
$off->append_conf('postgresql.conf', q{
shared_preload_libraries = 'idempotency'
idempotency.filter_memory = 0
log_min_messages = warning
});
$off->start;
$off->safe_psql('postgres', 'CREATE EXTENSION idempotency');
maintain($off, 'postgres');
$off->safe_psql('postgres', q{
	SELECT count(*) FROM idem_consume_messages('c', ARRAY['a', 'b']);
});
is($off->safe_psql('postgres', 'SELECT count(*) FROM idempotency.filter_info()'), '0',
	'filter_memory = 0: no filters');
is($off->safe_psql('postgres', q{SELECT count(*) FROM idem_consume_messages('c', ARRAY['a', 'b'])}),
	'0', 'filter_memory = 0: redeliveries answer false');
$off->stop;

done_testing();

/*-------------------------------------------------------------------------
 *
 * outbox_maintain.c
 *	  What maintenance does to the outbox: a new segment once the newest
 *	  has taken events for an interval, old segments dropped once their
 *	  events are acknowledged and kept long enough, or once they are older
 *	  than idempotency.outbox_max_age whatever the relays (the loss then
 *	  recorded with every relay that had not acknowledged them), and old
 *	  dead letters removed.
 *
 * A segment other than the newest takes no new event once every
 * transaction that locked it while it was the newest has ended
 * (outbox_storage.c).  Maintenance takes its ACCESS EXCLUSIVE lock without
 * waiting, and only then looks at its events: none is in progress, none
 * can be added, and the relays that read it wait for the drop (or, if it
 * is kept, for this transaction).  A segment whose lock cannot be had now
 * is left for the next run, as the ledgers' partitions are; so is one
 * this session reads itself (a cursor, or the statement that runs
 * maintenance: relation_checks.c).
 *
 * A segment goes when, for every relay of every role, every committed
 * event of the relay's topic in the segment is acknowledged by it
 * (IdemRelayDelivered), and idempotency.outbox_retention has passed since
 * it stopped taking events (when the next segment was opened).  Events of
 * a topic that no relay reads are kept for the retention only: a relay
 * made later reads what is still kept, as a new Kafka consumer group does.
 * Past idempotency.outbox_max_age since maintenance first found it written
 * by no transaction (quiet_at: its lock had, after it stopped taking events;
 * a transaction that commits late holds it off), a segment goes whatever
 * the relays: each relay that had not acknowledged
 * some of its events has the loss (how many, the first and last event
 * numbers and publication times) added to its row under its relay lock,
 * and its next idem_outbox_next() reports it (outbox_relay.c).  Segments
 * are dropped, never DELETEd from: no dead tuples, no vacuum debt.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_maintain.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "outbox.h"
#include "privilege.h"
#include "relation_checks.h"
#include "stats.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* One segment as maintenance sees it */
typedef struct IdemSegmentInfo
{
	int32		seg;
	Oid			relid;
	TimestampTz opened_at;		/* 0: unknown (row missing) */
	TimestampTz quiet_at;		/* 0: not found quiet yet */
} IdemSegmentInfo;

/* One relay as maintenance sees it */
typedef struct IdemMaintRelay
{
	IdemRelayState *st;
	bool		locked;			/* its relay lock is held */
	/* a loss found in the segment looked at */
	int64		lost;
	int64		first_ev;
	int64		last_ev;
	TimestampTz from;
	TimestampTz to;
} IdemMaintRelay;

static int	IdemReadSegmentTimes(IdemSegmentInfo **out);
static void IdemForgetSegment(int32 seg);
static void IdemSegmentQuiet(int32 seg, TimestampTz now);
static bool IdemSegmentDelivered(Relation heap, Relation index,
								 IdemMaintRelay *relays, int nrelays,
								 Snapshot snapshot, bool count_losses);
static bool IdemRecordLosses(IdemMaintRelay *relays, int nrelays);

/*
 * IdemReadSegmentTimes sets *out to the attached segments, oldest first,
 * with the time each was opened, and returns how many.
 */
static int
IdemReadSegmentTimes(IdemSegmentInfo **out)
{
	IdemOutboxSegment *segs;
	int			n = IdemOutboxSegments(&segs);
	IdemSegmentInfo *info = palloc0(Max(n, 1) * sizeof(IdemSegmentInfo));
	IdemSavedUser save;
	int			rc;
	uint64		r;
	int			i;

	for (i = 0; i < n; i++)
	{
		info[i].seg = segs[i].seg;
		info[i].relid = segs[i].relid;
	}
	pfree(segs);
	IdemOwnerSPIBegin(&save);
	rc = SPI_execute("SELECT seg, opened_at, quiet_at FROM idempotency.outbox_segments",
					 true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
	for (r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		int32		seg = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r],
													  SPI_tuptable->tupdesc, 1,
													  &isnull));
		TimestampTz at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[r],
														   SPI_tuptable->tupdesc,
														   2, &isnull));
		Datum		quiet = SPI_getbinval(SPI_tuptable->vals[r],
										  SPI_tuptable->tupdesc, 3, &isnull);

		for (i = 0; i < n; i++)
			if (info[i].seg == seg)
			{
				info[i].opened_at = at;
				info[i].quiet_at = isnull ? 0 : DatumGetTimestampTz(quiet);
			}
	}
	IdemOwnerSPIEnd(&save);
	*out = info;
	return n;
}

/* removes a dropped segment's row from idempotency.outbox_segments */
static void
IdemForgetSegment(int32 seg)
{
	IdemSavedUser save;
	SPIPlanPtr	plan;
	Oid			argtype = INT4OID;
	Datum		arg = Int32GetDatum(seg);
	int			rc;

	IdemOwnerSPIBegin(&save);
	plan = SPI_prepare("DELETE FROM idempotency.outbox_segments"
					   " WHERE seg OPERATOR(pg_catalog.=) $1", 1, &argtype);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	rc = SPI_execute_plan(plan, &arg, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	IdemOwnerSPIEnd(&save);
}

/*
 * IdemSegmentQuiet records that maintenance found segment "seg" written by
 * no transaction at "now": its ACCESS EXCLUSIVE lock was had after the next
 * segment's creation had committed, so every transaction that wrote to it
 * has ended and none can write to it again.  outbox_max_age counts from
 * then: a transaction that commits late (a prepared one, a long one) keeps
 * the segment's events from going before a relay could read them.
 */
static void
IdemSegmentQuiet(int32 seg, TimestampTz now)
{
	IdemSavedUser save;
	SPIPlanPtr	plan;
	Oid			argtypes[2] = {INT4OID, TIMESTAMPTZOID};
	Datum		args[2];
	int			rc;

	args[0] = Int32GetDatum(seg);
	args[1] = TimestampTzGetDatum(now);
	IdemOwnerSPIBegin(&save);
	plan = SPI_prepare("UPDATE idempotency.outbox_segments SET quiet_at = $2"
					   " WHERE seg OPERATOR(pg_catalog.=) $1 AND quiet_at IS NULL",
					   2, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	rc = SPI_execute_plan(plan, args, NULL, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	IdemOwnerSPIEnd(&save);
}

/*
 * IdemSegmentDelivered: has every relay acknowledged every committed event
 * of its topic in the segment?  Only entries above the relay's low water
 * are looked at.  With count_losses, goes on after the first one that is
 * not, and adds each to its relay's loss; without, stops there.
 */
static bool
IdemSegmentDelivered(Relation heap, Relation index, IdemMaintRelay *relays,
					 int nrelays, Snapshot snapshot, bool count_losses)
{
	TupleTableSlot *slot = table_slot_create(heap, NULL);
	bool		delivered = true;
	int			i;

	for (i = 0; i < nrelays && (delivered || count_losses); i++)
	{
		IdemMaintRelay *r = &relays[i];
		IndexScanDesc scan;
		ScanKeyData keys[3];
		ItemPointer tid;

		/* ScanKeyInit compares in collation "C", the index column's */
		ScanKeyInit(&keys[0], OUTBOX_INDEX_ROLE, BTEqualStrategyNumber,
					F_OIDEQ, ObjectIdGetDatum(r->st->role));
		ScanKeyInit(&keys[1], OUTBOX_INDEX_TOPIC, BTEqualStrategyNumber,
					F_TEXTEQ, PointerGetDatum(r->st->topic));
		ScanKeyInit(&keys[2], OUTBOX_INDEX_EV_ID, BTGreaterStrategyNumber,
					F_INT8GT, Int64GetDatum(IdemRelayLowWater(r->st)));
		scan = IdemIndexBeginScan(heap, index, snapshot, 3);
		scan->xs_want_itup = true;
		index_rescan(scan, keys, 3, NULL, 0);
		while ((tid = index_getnext_tid(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull;
			int64		ev = DatumGetInt64(index_getattr(scan->xs_itup,
														 OUTBOX_INDEX_EV_ID,
														 scan->xs_itupdesc,
														 &isnull));
			int64		txid = DatumGetInt64(index_getattr(scan->xs_itup,
														   OUTBOX_INDEX_TXID,
														   scan->xs_itupdesc,
														   &isnull));
			TimestampTz at;

			CHECK_FOR_INTERRUPTS();
			if (IdemRelayDelivered(r->st, ev, txid))
				continue;
			if (!index_fetch_heap(scan, slot))
				continue;		/* rolled back */
			delivered = false;
			if (!count_losses)
				break;
			at = DatumGetTimestampTz(slot_getattr(slot,
												  Anum_outbox_published_at,
												  &isnull));
			if (r->lost == 0)
			{
				r->first_ev = r->last_ev = ev;
				r->from = r->to = at;
			}
			r->first_ev = Min(r->first_ev, ev);
			r->last_ev = Max(r->last_ev, ev);
			r->from = Min(r->from, at);
			r->to = Max(r->to, at);
			r->lost++;
		}
		index_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(slot);
	return delivered;
}

/*
 * IdemRecordLosses adds each relay's loss to its row (the caller holds
 * every relay lock).
 */
static bool
IdemRecordLosses(IdemMaintRelay *relays, int nrelays)
{
	int			i;

	for (i = 0; i < nrelays; i++)
	{
		IdemMaintRelay *r = &relays[i];
		IdemRelayState *st = r->st;

		if (r->lost == 0)
			continue;
		if (st->lost_events == 0)
		{
			st->lost_first_ev = r->first_ev;
			st->lost_last_ev = r->last_ev;
			st->lost_from = r->from;
			st->lost_to = r->to;
		}
		st->lost_first_ev = Min(st->lost_first_ev, r->first_ev);
		st->lost_last_ev = Max(st->lost_last_ev, r->last_ev);
		st->lost_from = Min(st->lost_from, r->from);
		st->lost_to = Max(st->lost_to, r->to);
		st->lost_events += r->lost;
		IdemRelayStore(st);
		IdemStatsAdd(IDEM_STAT_OUTBOX_LOST, r->lost);
		ereport(LOG,
				(errmsg("outbox relay \"%s\" of topic \"%s\" lost " INT64_FORMAT " events older than \"%s\"",
						IdemKeyForMessage(text_to_cstring(st->relay)),
						IdemKeyForMessage(text_to_cstring(st->topic)),
						r->lost, "idempotency.outbox_max_age")));
		r->lost = 0;
	}
	return true;
}

/*
 * IdemOutboxMaintain runs the outbox's part of one maintenance run (see
 * the file header) in the current transaction, and sets how many segments
 * it made and dropped.
 */
void
IdemOutboxMaintain(TimestampTz now, int *created, int *dropped)
{
	IdemSegmentInfo *segs;
	int			nsegs;
	List	   *relay_list;
	IdemMaintRelay *relays;
	int			nrelays;
	ListCell   *lc;
	int			i;
	bool		made = false;
	TimestampTz keep_after = now - (int64) idem_outbox_retention * USECS_PER_SEC;
	TimestampTz lose_after = now - (int64) idem_outbox_max_age * USECS_PER_SEC;

	*created = 0;
	*dropped = 0;
	/* an extension not yet updated to 0.5.0 has no outbox */
	if (!OidIsValid(IdemOutboxMemberRelid("outbox_segments")) ||
		!OidIsValid(IdemOutboxMemberRelid("outbox_relays")))
		return;
	IdemOutboxRestrictAcls();
	(void) IdemRelayDeadLettersExpire(lose_after);
	(void) IdemRelaysOfGoneRolesForget();
	if (!OidIsValid(IdemOutboxParent(false)))
		return;
	IdemOutboxEnsureDependency();

	/*
	 * A new segment once the newest has taken events for an interval; not
	 * while this session reads idempotency.outbox (the statement that runs
	 * maintenance, a cursor): ATTACH PARTITION would refuse it (55006), and
	 * the next run makes it.
	 */
	nsegs = IdemReadSegmentTimes(&segs);
	if (nsegs > 0 &&
		(segs[nsegs - 1].opened_at == 0 ||
		 segs[nsegs - 1].opened_at + IdemOutboxIntervalUs() <= now) &&
		!IdemRelationInUseHere(IdemOutboxParent(false)))
	{
		int32		next = segs[nsegs - 1].seg + 1;

		if (next <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("the outbox has used every segment number")));
		(void) IdemOutboxCreateSegment(next);
		(*created)++;
		made = true;
		AcceptInvalidationMessages();
		pfree(segs);
		nsegs = IdemReadSegmentTimes(&segs);
	}
	if (nsegs < 2)
		return;

	/* the relays of every role, read as committed */
	relay_list = IdemRelayList(InvalidOid, true);
	nrelays = list_length(relay_list);
	relays = palloc0(Max(nrelays, 1) * sizeof(IdemMaintRelay));
	i = 0;
	foreach(lc, relay_list)
		relays[i++].st = (IdemRelayState *) lfirst(lc);

	/* every segment but the newest, oldest first */
	for (i = 0; i < nsegs - 1; i++)
	{
		TimestampTz closed_at = segs[i + 1].opened_at;
		bool		expired;
		bool		find_quiet;
		Relation	heap;
		Relation	index;
		Snapshot	snapshot;
		bool		delivered;
		char	   *sql;

		CHECK_FOR_INTERRUPTS();
		if (closed_at == 0)
			continue;

		/*
		 * Not found quiet yet: is it now?  Not in the run that made the
		 * next segment: until that commits, publishers still take this one
		 * as the newest.
		 */
		find_quiet = (segs[i].quiet_at == 0 && !(made && i == nsegs - 2));
		if (!find_quiet && closed_at > keep_after)
			continue;
		if (!ConditionalLockRelationOid(segs[i].relid, AccessExclusiveLock))
			continue;
		if (find_quiet)
		{
			IdemSegmentQuiet(segs[i].seg, now);
			segs[i].quiet_at = now;
		}
		if (closed_at > keep_after)
		{
			UnlockRelationOid(segs[i].relid, AccessExclusiveLock);
			continue;
		}

		/*
		 * Read by this session (the statement that runs maintenance, a
		 * cursor of its transaction): the lock was had all the same (a
		 * session's locks never conflict), but DROP TABLE would refuse it
		 * (55006).  Left for the next run, before any loss is recorded.
		 */
		if (IdemRelationInUseHere(segs[i].relid))
		{
			UnlockRelationOid(segs[i].relid, AccessExclusiveLock);
			continue;
		}
		expired = (segs[i].quiet_at != 0 && segs[i].quiet_at <= lose_after);
		heap = try_relation_open(segs[i].relid, NoLock);
		if (heap == NULL)
			continue;

		/*
		 * Past the max age: the lock of every relay that loses events here,
		 * at once or not this run, and its position as committed under it.
		 * Which relays lose events is read first from their positions as
		 * committed: a relay only moves forward, so one that loses none
		 * then loses none under its lock either, and its row is not
		 * written.  Not every relay's lock: any role makes relays at will
		 * (a call of idem_outbox_next() with a new name), and as many
		 * locks at once would exhaust the shared lock table, failing
		 * this run and lock requests all over the cluster while it runs.
		 * For the same reason a segment whose losers would take more than
		 * max_locks_per_transaction locks is left (and said so).
		 */
		if (expired)
		{
			int			k;
			int			losers = 0;
			bool		all = true;
			bool	   *loses = palloc0(Max(nrelays, 1) * sizeof(bool));

			snapshot = RegisterSnapshot(GetLatestSnapshot());
			index = IdemOutboxSegmentIndex(heap, AccessShareLock);
			(void) IdemSegmentDelivered(heap, index, relays, nrelays,
										snapshot, true);
			index_close(index, AccessShareLock);
			UnregisterSnapshot(snapshot);
			for (k = 0; k < nrelays; k++)
			{
				loses[k] = relays[k].lost > 0;
				if (loses[k] && !relays[k].locked)
					losers++;
				relays[k].lost = 0;
			}
			if (losers > max_locks_per_xact)
			{
				ereport(LOG,
						(errmsg("outbox segment \"%s.%s\" is past \"%s\" but is kept: %d relays lose events in it, more than \"%s\" (%d)",
								IDEM_SCHEMA_NAME, RelationGetRelationName(heap),
								"idempotency.outbox_max_age", losers,
								"max_locks_per_transaction", max_locks_per_xact),
						 errhint("Acknowledge or remove the relays that stopped, or raise \"%s\".",
								 "max_locks_per_transaction")));
				pfree(loses);
				relation_close(heap, NoLock);
				UnlockRelationOid(segs[i].relid, AccessExclusiveLock);
				continue;
			}
			for (k = 0; k < nrelays && all; k++)
			{
				bool		acquired;

				if (!loses[k] || relays[k].locked)
					continue;
				IdemRelayLock(relays[k].st->role, relays[k].st->relay,
							  relays[k].st->topic, true, &acquired);
				relays[k].locked = acquired;
				all = acquired;
			}
			pfree(loses);
			if (!all)
			{
				relation_close(heap, NoLock);
				continue;		/* the locks taken stay to the end */
			}
			for (k = 0; k < nrelays; k++)
			{
				IdemRelayState *fresh;

				if (!relays[k].locked)
					continue;
				fresh = palloc(sizeof(IdemRelayState));
				IdemRelayLoad(relays[k].st->role, relays[k].st->relay,
							  relays[k].st->topic, fresh);
				if (fresh->found)
					relays[k].st = fresh;
			}
		}

		snapshot = RegisterSnapshot(GetLatestSnapshot());
		index = IdemOutboxSegmentIndex(heap, AccessShareLock);
		delivered = IdemSegmentDelivered(heap, index, relays, nrelays,
										 snapshot, expired);
		index_close(index, AccessShareLock);
		UnregisterSnapshot(snapshot);
		relation_close(heap, NoLock);
		if (!delivered && !expired)
		{
			UnlockRelationOid(segs[i].relid, AccessExclusiveLock);
			continue;
		}
		if (!delivered)
			(void) IdemRecordLosses(relays, nrelays);

		sql = psprintf("DROP TABLE %s.%s", IDEM_SCHEMA_NAME,
					   quote_identifier(get_rel_name(segs[i].relid)));
		IdemExecAsOwner(sql, 0);
		pfree(sql);
		IdemForgetSegment(segs[i].seg);
		IdemStatsAdd(IDEM_STAT_OUTBOX_SEGMENTS_DROPPED, 1);
		(*dropped)++;
	}
	pfree(relays);
	pfree(segs);
}

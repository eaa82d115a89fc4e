/*-------------------------------------------------------------------------
 *
 * outbox_relay.c
 *	  Relays: idem_outbox_next(), idem_outbox_ack() and
 *	  idem_outbox_dead_letter(), the windows they read, and what a relay
 *	  has delivered (for maintenance and monitoring).
 *
 * A relay's position (outbox_position.c) is a window between two
 * snapshots, lo and up, that the relay took itself, PgQ's ticks: the
 * window's events are those of the topic whose transaction is visible in
 * up and not in lo, in ev_id order.  Every committed event lands in
 * exactly one window, the first whose up sees its transaction, however
 * late that commits after events with higher ev_ids: nothing is skipped.
 * An event of a rolled-back transaction, or of a rolled-back
 * subtransaction, is never visible, so never returned (events are fetched
 * from the heap under a snapshot taken after up, which sees every
 * committed event of the window).  Events of one key are in the order of
 * their transactions' commits: publishers of a key hold its lock to the
 * end of their transaction and take their ev_id under it
 * (outbox_publish.c), so a later committer of a key has the higher ev_id,
 * and it commits in the same window or a later one.
 *
 * Where a window's events are: each event's ev_id is taken after its
 * transaction's xid was assigned.  A transaction that got its xid after lo
 * was taken (xid >= lo.xmax, which is the next xid as read after the
 * snapshot: IdemOutboxTakeSnap) therefore has events with ev_ids above
 * lo_seq, an ev_id taken before lo; and every event visible in up has an
 * ev_id below up_seq_after, taken after up.  A transaction running when lo
 * was taken (every one is in lo.xip) that commits in this window may have
 * older events: when it was first seen running, in the xip of some
 * window's upper snapshot, it had got its xid after that window's lower
 * snapshot, so its events are above that window's lo_seq, its "floor",
 * which each new window carries over for the transactions still running.
 * A window is read from the lowest floor of the transactions of lo.xip that
 * committed in it (or lo_seq) up to up_seq_after, through each segment's
 * index on (role, topic, ev_id) INCLUDE (txid): which window an entry
 * belongs to is read from the index tuple; the heap is read only for the
 * window's own events.
 *
 * A relay takes batches of a window in ev_id order: next() fixes the
 * current batch's last ev_id (batch_end) and returns the same batch again
 * until ack() moves acked_ev past it; once the window is exhausted, the
 * next call opens a new window whose lo is the old up.  Batch numbers grow
 * by one per ack.  An empty new window is stored only if the stored one is
 * older than a second, so that a relay polling an idle topic does not
 * write on every call.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_relay.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "outbox.h"
#include "stats.h"

#include "access/detoast.h"
#include "access/genam.h"
#include "access/relscan.h"
#include "access/subtrans.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_outbox_next);
PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_dead_letter);

/* An empty window is stored only if the stored one is older than this */
#define IDEM_RELAY_IDLE_WRITE_US	USECS_PER_SEC

/*
 * Columns of idem_outbox_next()'s result; the overload with a tenant has
 * two more (tenant, seq), NULL for the events of the node's own outbox
 */
#define Natts_next					7
#define Natts_next_tenant			9

/* ----------------------------------------------------------------
 * Snapshots
 * ----------------------------------------------------------------
 */

static int
IdemCompareInt64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/* is txid among the snapshot's running transactions? */
bool
IdemOutboxSnapRunning(const IdemOutboxSnap *snap, int64 txid)
{
	if (txid < snap->xmin || txid >= snap->xmax || snap->nxip == 0)
		return false;
	return bsearch(&txid, snap->xip, snap->nxip, sizeof(int64),
				   IdemCompareInt64) != NULL;
}

/*
 * IdemOutboxSnapVisible: had transaction txid ended when the snapshot was
 * taken (pg_visible_in_snapshot)?  Whether it committed is the heap's
 * business.
 */
bool
IdemOutboxSnapVisible(const IdemOutboxSnap *snap, int64 txid)
{
	if (txid < snap->xmin)
		return true;
	if (txid >= snap->xmax)
		return false;
	return !IdemOutboxSnapRunning(snap, txid);
}

/* a snapshot's 32-bit xid as a 64-bit one (xid8funcs.c's rule) */
static int64
IdemWidenXid(TransactionId xid, FullTransactionId next)
{
	uint32		epoch = EpochFromFullTransactionId(next);

	if (!TransactionIdIsNormal(xid))
		return (int64) xid;
	if (xid > XidFromFullTransactionId(next))
		epoch--;
	return (int64) U64FromFullTransactionId(FullTransactionIdFromEpochAndXid(epoch, xid));
}

/*
 * IdemOutboxTakeSnap fills *snap with a snapshot taken now, in the form
 * relays store (64-bit xids plus the xid base), counting this transaction
 * as running (PostgreSQL leaves a backend's own xid out of its snapshots).
 *
 * A snapshot's xmax is one past the latest completed xid, and its xip
 * lists only running xids below it: a transaction that already had its
 * xid, above every completed one, is running but not listed.  The windows
 * (see the file header) need every transaction running at the snapshot
 * listed, since only a listed one gets a floor: such a transaction may
 * have taken its ev_ids before the window's lower bound was read, and
 * would be skipped when it commits.  So xmax becomes the next xid as read
 * after the snapshot, and the xids from the old xmax up to it are listed
 * as running, each as its top-level transaction (pg_subtrans), once: none
 * of them is visible in the snapshot, so visibility is unchanged, and
 * those assigned after it are listed needlessly but harmlessly.
 */
void
IdemOutboxTakeSnap(IdemOutboxSnap *snap)
{
	int64		base = IdemOutboxXidBase();	/* first: it may run SPI */
	Snapshot	s = GetLatestSnapshot();
	FullTransactionId next = ReadNextFullTransactionId();
	FullTransactionId own = GetTopFullTransactionIdIfAny();
	int64		from = IdemWidenXid(s->xmax, next);
	int64		upto = (int64) U64FromFullTransactionId(next);
	int64		extra = Max(upto - from, 0);
	int64		x;
	int			n = 0;
	int			i;

	if (extra > MaxAllocSize / sizeof(int64) - s->xcnt - 1)
		elog(ERROR, "too many transaction ids in progress for an outbox snapshot: " INT64_FORMAT,
			 extra);
	snap->xmin = IdemWidenXid(s->xmin, next) + base;
	snap->xmax = upto + base;
	snap->xip = palloc((s->xcnt + 1 + extra) * sizeof(int64));
	for (i = 0; i < s->xcnt; i++)
		snap->xip[n++] = IdemWidenXid(s->xip[i], next) + base;
	for (x = from; x < upto; x++)
	{
		FullTransactionId fx = FullTransactionIdFromU64((uint64) x);
		TransactionId xid = XidFromFullTransactionId(fx);
		TransactionId top;

		if (!TransactionIdIsNormal(xid))
			continue;
		top = SubTransGetTopmostTransaction(xid);
		snap->xip[n++] = IdemWidenXid(TransactionIdIsValid(top) ? top : xid,
									  next) + base;
	}
	if (FullTransactionIdIsValid(own))
	{
		int64		mine = (int64) U64FromFullTransactionId(own) + base;

		if (mine >= snap->xmin && mine < snap->xmax)
			snap->xip[n++] = mine;
	}
	/* sorted, without duplicates (a PREPARE, a subtransaction's top) */
	qsort(snap->xip, n, sizeof(int64), IdemCompareInt64);
	snap->nxip = 0;
	for (i = 0; i < n; i++)
		if (snap->nxip == 0 || snap->xip[snap->nxip - 1] != snap->xip[i])
			snap->xip[snap->nxip++] = snap->xip[i];
}

/*
 * IdemRelayOpenWindow moves a relay to a new window: lo becomes the old
 * up, carrying the floors of the transactions still running (see the file
 * header), and up a snapshot taken now, between two ev_ids.  The window
 * is read from the lowest floor of the transactions of lo.xip that have
 * ended in up, or from lo_seq.
 */
static void
IdemRelayOpenWindow(IdemRelayState *st)
{
	IdemOutboxSnap lo = st->up;
	int64	   *floor = palloc(Max(lo.nxip, 1) * sizeof(int64));
	int64		from;
	int			i;

	for (i = 0; i < lo.nxip; i++)
	{
		int64	   *old = st->lo.nxip == 0 ? NULL :
			bsearch(&lo.xip[i], st->lo.xip, st->lo.nxip, sizeof(int64),
					IdemCompareInt64);

		floor[i] = old != NULL ? st->lo_floor[old - st->lo.xip] : st->lo_seq;
	}
	st->lo = lo;
	st->lo_floor = floor;
	st->lo_seq = st->up_seq_before;

	st->up_seq_before = IdemOutboxNextEvId();
	IdemOutboxTakeSnap(&st->up);
	st->up_seq_after = IdemOutboxNextEvId();
	st->up_at = GetCurrentTimestamp();

	from = st->lo_seq;
	for (i = 0; i < st->lo.nxip; i++)
		if (IdemOutboxSnapVisible(&st->up, st->lo.xip[i]))
			from = Min(from, st->lo_floor[i]);
	st->acked_ev = from;
	st->window_done = false;
}

/*
 * IdemRelayPlaceImported gives a relay imported in this transaction
 * (outbox_transfer.c, just before it commits) a window that holds this
 * transaction's events.  "snap" is a snapshot the import took when it
 * decided what to do with the relay, after this transaction got its xid
 * (so listed in it as running, or below its xmin), and "seq_before" an
 * ev_id taken just before it.  The window's upper snapshot is "snap" with
 * this transaction counted as ended (it is, for anyone who reads the
 * position: the position commits with it); its lower one is "snap" with
 * this transaction running, so that the window holds this transaction's
 * events alone, or (from_start) a snapshot that sees nothing, so that it
 * also holds every event the topic kept when the import decided, as a
 * relay never seen reads them.  Whatever commits after "snap" was taken
 * lands in a later window, as for any relay: the transactions running
 * then are running in both snapshots, read from the floor 0 (their events
 * may be older than anything known here), and those that began later
 * have ev_ids above seq_before.  The caller sets acked_ev, the ev_id up to
 * which the window's events are acknowledged (0: none).
 */
void
IdemRelayPlaceImported(IdemRelayState *st, const IdemOutboxSnap *snap,
					   int64 seq_before, bool from_start)
{
	int64		mine = IdemOutboxCurrentTxid();
	IdemOutboxSnap up;
	IdemOutboxSnap lo;
	int			i;
	int			n = 0;

	Assert(mine < snap->xmax);

	/* up: this transaction ended */
	up.xmin = snap->xmin;
	up.xmax = snap->xmax;
	up.xip = palloc(Max(snap->nxip, 1) * sizeof(int64));
	for (i = 0; i < snap->nxip; i++)
		if (snap->xip[i] != mine)
			up.xip[n++] = snap->xip[i];
	up.nxip = n;

	/* lo: this transaction running (listed, below xmin or not) */
	if (from_start)
	{
		lo.xmin = 0;
		lo.xmax = 0;
		lo.nxip = 0;
		lo.xip = palloc(sizeof(int64));
	}
	else
	{
		lo.xmin = Min(up.xmin, mine);
		lo.xmax = up.xmax;
		lo.xip = palloc((up.nxip + 1) * sizeof(int64));
		memcpy(lo.xip, up.xip, up.nxip * sizeof(int64));
		lo.xip[up.nxip] = mine;
		lo.nxip = up.nxip + 1;
		qsort(lo.xip, lo.nxip, sizeof(int64), IdemCompareInt64);
	}
	st->lo = lo;
	st->lo_floor = palloc0(Max(lo.nxip, 1) * sizeof(int64));
	st->lo_seq = 0;
	st->up = up;
	st->up_seq_before = seq_before;
	st->up_seq_after = IdemOutboxNextEvId();	/* above this one's events */
	st->up_at = GetCurrentTimestamp();
	st->acked_ev = 0;
	st->window_done = false;
	st->handed_out = false;
	st->batch_end = 0;
	st->batch_events = 0;
}

/* is an event of transaction txid in the relay's current window? */
bool
IdemRelayInWindow(const IdemRelayState *st, int64 txid)
{
	return IdemOutboxSnapVisible(&st->up, txid) &&
		!IdemOutboxSnapVisible(&st->lo, txid);
}

/*
 * IdemRelayDelivered: has the relay acknowledged the event (ev, txid), if
 * it committed?  Before its window, or in it and acknowledged.
 */
bool
IdemRelayDelivered(const IdemRelayState *st, int64 ev, int64 txid)
{
	if (IdemOutboxSnapVisible(&st->lo, txid))
		return true;
	if (IdemOutboxSnapVisible(&st->up, txid))
		return st->window_done || ev <= st->acked_ev;
	return false;
}

/*
 * IdemRelayLowWater returns an ev_id at or below which the relay has
 * acknowledged every committed event: events of later windows are above
 * up_seq_before or above the floor of their transaction, running when up
 * was taken; events of the current window not acknowledged are above
 * acked_ev.
 */
int64
IdemRelayLowWater(const IdemRelayState *st)
{
	int64		lw = st->up_seq_before;
	int			i;

	for (i = 0; i < st->up.nxip; i++)
	{
		int64	   *old = st->lo.nxip == 0 ? NULL :
			bsearch(&st->up.xip[i], st->lo.xip, st->lo.nxip, sizeof(int64),
					IdemCompareInt64);

		lw = Min(lw, old != NULL ? st->lo_floor[old - st->lo.xip] : st->lo_seq);
	}
	if (!st->window_done)
		lw = Min(lw, st->acked_ev);
	return lw;
}

/* ----------------------------------------------------------------
 * Reading a topic's events in ev_id order, across segments
 * ----------------------------------------------------------------
 */

struct IdemSegScan
{
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		has;			/* ev and txid are the next entry's */
	int64		ev;
	int64		txid;
};

static void
IdemSegScanAdvance(IdemSegScan *ss)
{
	ItemPointer tid = index_getnext_tid(ss->scan, ForwardScanDirection);
	bool		isnull;

	if (tid == NULL)
	{
		ss->has = false;
		return;
	}
	ss->ev = DatumGetInt64(index_getattr(ss->scan->xs_itup, OUTBOX_INDEX_EV_ID,
										 ss->scan->xs_itupdesc, &isnull));
	ss->txid = DatumGetInt64(index_getattr(ss->scan->xs_itup, OUTBOX_INDEX_TXID,
										   ss->scan->xs_itupdesc, &isnull));
	ss->has = true;
}

/*
 * IdemEventScanBegin starts reading the index entries of topic "topic" of
 * "role" with after < ev_id < before in every segment, merged in ev_id order;
 * heap tuples are fetched under "snapshot".  Segments are locked in
 * ACCESS SHARE until the transaction ends (a drop waits for them); one
 * dropped since the list was read is left out.
 */
void
IdemEventScanBegin(IdemEventScan *es, Oid role, text *topic, int64 after,
				   int64 before, Snapshot snapshot)
{
	IdemOutboxSegment *segs;
	int			n;
	int			i;

	AcceptInvalidationMessages();
	n = IdemOutboxSegments(&segs);
	es->segs = palloc0(Max(n, 1) * sizeof(IdemSegScan));
	es->nsegs = 0;
	es->current = -1;
	for (i = 0; i < n; i++)
	{
		IdemSegScan *ss;
		ScanKeyData keys[4];

		LockRelationOid(segs[i].relid, AccessShareLock);
		if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(segs[i].relid)))
		{
			UnlockRelationOid(segs[i].relid, AccessShareLock);
			continue;
		}
		ss = &es->segs[es->nsegs++];
		ss->heap = table_open(segs[i].relid, NoLock);
		ss->index = IdemOutboxSegmentIndex(ss->heap, AccessShareLock);
		ss->slot = table_slot_create(ss->heap, NULL);
		/* ScanKeyInit compares in collation "C", the index column's */
		ScanKeyInit(&keys[0], OUTBOX_INDEX_ROLE, BTEqualStrategyNumber,
					F_OIDEQ, ObjectIdGetDatum(role));
		ScanKeyInit(&keys[1], OUTBOX_INDEX_TOPIC, BTEqualStrategyNumber,
					F_TEXTEQ, PointerGetDatum(topic));
		ScanKeyInit(&keys[2], OUTBOX_INDEX_EV_ID, BTGreaterStrategyNumber,
					F_INT8GT, Int64GetDatum(after));
		ScanKeyInit(&keys[3], OUTBOX_INDEX_EV_ID, BTLessStrategyNumber,
					F_INT8LT, Int64GetDatum(before));
		ss->scan = IdemIndexBeginScan(ss->heap, ss->index, snapshot, 4);
		ss->scan->xs_want_itup = true;
		index_rescan(ss->scan, keys, 4, NULL, 0);
		IdemSegScanAdvance(ss);
	}
	pfree(segs);
}

/* the next entry in ev_id order: its ev_id and txid */
bool
IdemEventScanNext(IdemEventScan *es, int64 *ev, int64 *txid)
{
	int			best = -1;
	int			i;

	CHECK_FOR_INTERRUPTS();
	if (es->current >= 0)
		IdemSegScanAdvance(&es->segs[es->current]);
	for (i = 0; i < es->nsegs; i++)
		if (es->segs[i].has && (best < 0 || es->segs[i].ev < es->segs[best].ev))
			best = i;
	es->current = best;
	if (best < 0)
		return false;
	*ev = es->segs[best].ev;
	*txid = es->segs[best].txid;
	return true;
}

/* the heap tuple of the entry returned last, if the snapshot sees it */
TupleTableSlot *
IdemEventScanFetch(IdemEventScan *es)
{
	IdemSegScan *ss = &es->segs[es->current];

	if (index_fetch_heap(ss->scan, ss->slot))
		return ss->slot;
	return NULL;
}

void
IdemEventScanEnd(IdemEventScan *es)
{
	int			i;

	for (i = 0; i < es->nsegs; i++)
	{
		IdemSegScan *ss = &es->segs[i];

		index_endscan(ss->scan);
		ExecDropSingleTupleTableSlot(ss->slot);
		index_close(ss->index, NoLock);
		table_close(ss->heap, NoLock);
	}
	pfree(es->segs);
	es->nsegs = 0;
}

/* a column of an event as a datum that does not point into TOAST */
Datum
IdemEventValue(TupleTableSlot *slot, int attnum, bool *isnull)
{
	Datum		d = slot->tts_values[attnum - 1];

	*isnull = slot->tts_isnull[attnum - 1];
	if (!*isnull &&
		TupleDescAttr(slot->tts_tupleDescriptor, attnum - 1)->attlen == -1 &&
		VARATT_IS_EXTERNAL(DatumGetPointer(d)))
		d = PointerGetDatum(detoast_external_attr((struct varlena *) DatumGetPointer(d)));
	return d;
}

/* adds one event to idem_outbox_next()'s result */
static void
IdemEmitEvent(ReturnSetInfo *rsinfo, int64 batch, TupleTableSlot *slot)
{
	Datum		v[Natts_next_tenant];
	bool		n[Natts_next_tenant];

	slot_getallattrs(slot);
	v[7] = v[8] = (Datum) 0;
	n[7] = n[8] = true;
	v[0] = Int64GetDatum(batch);
	n[0] = false;
	v[1] = IdemEventValue(slot, Anum_outbox_event_id, &n[1]);
	v[2] = IdemEventValue(slot, Anum_outbox_key, &n[2]);
	v[3] = IdemEventValue(slot, Anum_outbox_payload, &n[3]);
	v[4] = IdemEventValue(slot, Anum_outbox_payload_raw, &n[4]);
	v[5] = IdemEventValue(slot, Anum_outbox_headers, &n[5]);
	v[6] = IdemEventValue(slot, Anum_outbox_published_at, &n[6]);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
}

/*
 * IdemRelayEmit adds to the result (if rsinfo is not NULL) the events of
 * the relay's window with after < ev_id < before, in ev_id order, at most
 * "max" of them (0: all); returns how many, and sets *last to the last
 * one's ev_id.
 */
static int
IdemRelayEmit(const IdemRelayState *st, int64 after, int64 before,
			  int max, ReturnSetInfo *rsinfo, int64 *last)
{
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IdemEventScan es;
	int64		ev;
	int64		txid;
	int			n = 0;

	IdemEventScanBegin(&es, st->role, st->topic, after, before, snapshot);
	while (IdemEventScanNext(&es, &ev, &txid))
	{
		TupleTableSlot *slot;

		if (!IdemRelayInWindow(st, txid))
			continue;
		slot = IdemEventScanFetch(&es);
		if (slot == NULL)
			continue;			/* rolled back */
		if (rsinfo != NULL)
			IdemEmitEvent(rsinfo, st->batch, slot);
		*last = ev;
		if (++n == max)
			break;
	}
	IdemEventScanEnd(&es);
	UnregisterSnapshot(snapshot);
	return n;
}

/*
 * IdemRelayLag sets *events to how many committed events of the topic the
 * relay has not acknowledged, and *seconds to the age of the first of
 * them in ev_id order (0 if none).  It reads every such entry: it costs in
 * proportion to the lag.
 */
void
IdemRelayLag(const IdemRelayState *st, int64 *events, double *seconds)
{
	Snapshot	snapshot;
	IdemEventScan es;
	int64		ev;
	int64		txid;
	TimestampTz now = GetCurrentTimestamp();

	*events = 0;
	*seconds = 0;
	if (!OidIsValid(IdemOutboxParent(false)))
		return;
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IdemEventScanBegin(&es, st->role, st->topic, IdemRelayLowWater(st),
					   PG_INT64_MAX, snapshot);
	while (IdemEventScanNext(&es, &ev, &txid))
	{
		TupleTableSlot *slot;

		if (IdemRelayDelivered(st, ev, txid))
			continue;
		slot = IdemEventScanFetch(&es);
		if (slot == NULL)
			continue;
		if (*events == 0)
		{
			bool		isnull;
			TimestampTz at = DatumGetTimestampTz(slot_getattr(slot,
															  Anum_outbox_published_at,
															  &isnull));

			if (now > at)
				*seconds = (double) (now - at) / USECS_PER_SEC;
		}
		(*events)++;
	}
	IdemEventScanEnd(&es);
	UnregisterSnapshot(snapshot);
}

/* ----------------------------------------------------------------
 * The SQL functions
 * ----------------------------------------------------------------
 */

/*
 * IdemRelayFence applies a call's generation to the relay's position as
 * idem_advance() does to a stream partition's: NULL is refused once the
 * relay has one, a lower one is refused, a higher one is stored.  Returns
 * true if the position changed.
 */
static bool
IdemRelayFence(IdemRelayState *st, bool fenced, int64 generation)
{
	if (!fenced)
	{
		if (!st->has_generation)
			return false;
		IdemStatsAdd(IDEM_STAT_STALE_GENERATIONS, 1);
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STALE_GENERATION),
				 errmsg("relay \"%s\" of topic \"%s\" is fenced, and no generation was given",
						IdemKeyForMessage(text_to_cstring(st->relay)),
						IdemKeyForMessage(text_to_cstring(st->topic))),
				 errdetail("The relay has generation " INT64_FORMAT ".",
						   st->generation),
				 errhint("Pass the generation of the relay process.  Nothing was changed.")));
	}
	if (st->has_generation && generation < st->generation)
	{
		IdemStatsAdd(IDEM_STAT_STALE_GENERATIONS, 1);
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STALE_GENERATION),
				 errmsg("generation " INT64_FORMAT " of relay \"%s\" of topic \"%s\" is stale",
						generation,
						IdemKeyForMessage(text_to_cstring(st->relay)),
						IdemKeyForMessage(text_to_cstring(st->topic))),
				 errdetail("The relay has been taken over with generation " INT64_FORMAT " since.",
						   st->generation),
				 errhint("Stop relaying: another relay process owns it now.  Nothing was changed.")));
	}
	if (st->has_generation && generation == st->generation)
		return false;
	st->has_generation = true;
	st->generation = generation;
	return true;
}

/* the generation argument: NULL (unfenced) or not negative */
static bool
IdemGenerationArg(FunctionCallInfo fcinfo, int argno, int64 *generation)
{
	if (PG_ARGISNULL(argno))
		return false;
	*generation = PG_GETARG_INT64(argno);
	if (*generation < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("generation must not be negative")));
	return true;
}

/* raises the report of a loss (see IdemOutboxMaintain) as batch st->batch */
static void
IdemRelayReportLoss(const IdemRelayState *st)
{
	char	   *from = pstrdup(timestamptz_to_str(st->lost_from));
	char	   *to = pstrdup(timestamptz_to_str(st->lost_to));
	char	   *relay = IdemKeyForMessage(text_to_cstring(st->relay));
	char	   *topic = IdemKeyForMessage(text_to_cstring(st->topic));

	ereport(ERROR,
			(errcode(ERRCODE_IDEM_OUTBOX_LOST),
			 errmsg("relay \"%s\" of topic \"%s\" lost " INT64_FORMAT " events that expired before it acknowledged them",
					relay, topic, st->lost_events),
			 errdetail("Events published from %s to %s (event numbers " INT64_FORMAT " to " INT64_FORMAT ") were dropped after \"%s\"; the loss is batch " INT64_FORMAT ".",
					   from, to, st->lost_first_ev, st->lost_last_ev,
					   "idempotency.outbox_max_age", st->batch),
			 errhint("Acknowledge the loss with idem_outbox_ack(relay, topic, " INT64_FORMAT ") to go on.",
					 st->batch)));
}

/*
 * idem_outbox_next(relay text, topic text, max_events int DEFAULT 100,
 *					generation bigint DEFAULT NULL)
 *		RETURNS TABLE (batch bigint, event_id uuid, key text, payload jsonb,
 *					   payload_raw bytea, headers jsonb,
 *					   published_at timestamptz)
 *
 * The relay's current batch: the same events again until idem_outbox_ack()
 * acknowledges it, else the next events of its window (at most
 * max_events), else those of a new window; no row when there are none.
 */
Datum
idem_outbox_next(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			role = GetUserId();
	text	   *relay;
	text	   *topic;
	int32		max_events;
	int64		generation = 0;
	bool		fenced;
	IdemRelayState st;
	bool		dirty;
	bool		stored;
	int			n = 0;
	int64		last = 0;

	IdemCheckLibraryVersion();
	relay = IdemCheckKeyArg(fcinfo, 0, "relay");
	topic = IdemCheckKeyArg(fcinfo, 1, "topic");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_events must not be null")));
	max_events = PG_GETARG_INT32(2);
	if (max_events < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_events must be at least 1")));
	fenced = IdemGenerationArg(fcinfo, 3, &generation);
	IdemCheckWritable("idem_outbox_next()");

	/* with a tenant: the tenant outbox on the coordinator (outbox_tenant.c) */
	if (PG_NARGS() > 4 && IdemTenantRelayDistributed())
	{
		IdemTenantRelayNext(fcinfo, role, relay, topic, max_events, fenced,
							generation,
							PG_ARGISNULL(4) ? NULL : PG_GETARG_TEXT_PP(4));
		return (Datum) 0;
	}
	InitMaterializedSRF(fcinfo, 0);

	IdemRelayLock(role, relay, topic, false, NULL);
	IdemRelayLoad(role, relay, topic, &st);
	dirty = !st.found;
	if (fenced || st.has_generation)
		dirty |= IdemRelayFence(&st, fenced, generation);
	if (!st.handed_out && st.lost_events > 0)
		IdemRelayReportLoss(&st);

	stored = OidIsValid(IdemOutboxParent(false));	/* any event ever */

	if (st.handed_out)
	{
		/* the batch again: its events (one dropped since may be missing) */
		if (stored)
			n = IdemRelayEmit(&st, st.acked_ev, st.batch_end + 1,
							  0, rsinfo, &last);

		/*
		 * Every event of the batch went past the max age: no row would
		 * carry the batch's number, so the relay could neither acknowledge
		 * it nor learn of the loss, and would get an empty batch for ever.
		 * Report the loss as this batch: its acknowledgement moves the
		 * relay past the batch, and the loss is reported once more, as the
		 * next batch (the relay may have delivered the batch's events
		 * before they went, so acknowledging a batch never acknowledges a
		 * loss it did not report).
		 */
		if (n == 0 && st.lost_events > 0)
			IdemRelayReportLoss(&st);
	}
	else if (stored)
	{
		if (!st.window_done)
		{
			n = IdemRelayEmit(&st, st.acked_ev, st.up_seq_after,
							  max_events, rsinfo, &last);
			if (n == 0)
			{
				st.window_done = true;
				dirty = true;
			}
		}
		if (n == 0)
		{
			TimestampTz stored_at = st.up_at;

			IdemRelayOpenWindow(&st);
			n = IdemRelayEmit(&st, st.acked_ev, st.up_seq_after,
							  max_events, rsinfo, &last);
			if (n == 0)
				st.window_done = true;
			if (n > 0 || stored_at == 0 ||
				st.up_at - stored_at >= IDEM_RELAY_IDLE_WRITE_US)
				dirty = true;
		}
		if (n > 0)
		{
			st.handed_out = true;
			st.batch_end = last;
			st.batch_events = n;
			dirty = true;
		}
	}
	if (dirty)
		IdemRelayStore(&st);
	return (Datum) 0;
}

/*
 * idem_outbox_ack(relay text, topic text, batch bigint,
 *				   generation bigint DEFAULT NULL) RETURNS boolean
 *
 * Acknowledges the relay's current batch (or a reported loss): true if it
 * moved the relay past it, false if that batch was acknowledged before.
 */
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();
	text	   *relay;
	text	   *topic;
	int64		batch;
	int64		generation = 0;
	bool		fenced;
	IdemRelayState st;
	bool		dirty;

	IdemCheckLibraryVersion();
	relay = IdemCheckKeyArg(fcinfo, 0, "relay");
	topic = IdemCheckKeyArg(fcinfo, 1, "topic");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch must not be null")));
	batch = PG_GETARG_INT64(2);
	fenced = IdemGenerationArg(fcinfo, 3, &generation);
	IdemCheckWritable("idem_outbox_ack()");

	/* with a tenant: the tenant outbox on the coordinator (outbox_tenant.c) */
	if (PG_NARGS() > 4 && IdemTenantRelayDistributed())
		PG_RETURN_BOOL(IdemTenantRelayAck(role, relay, topic, batch, fenced,
										  generation,
										  PG_ARGISNULL(4) ? NULL : PG_GETARG_TEXT_PP(4)));

	IdemRelayLock(role, relay, topic, false, NULL);
	IdemRelayLoad(role, relay, topic, &st);
	if (!st.found)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relay \"%s\" of topic \"%s\" has taken no batch",
						IdemKeyForMessage(text_to_cstring(relay)),
						IdemKeyForMessage(text_to_cstring(topic))),
				 errhint("Call idem_outbox_next() first.")));
	dirty = false;
	if (fenced || st.has_generation)
		dirty = IdemRelayFence(&st, fenced, generation);
	if (batch < st.batch)
	{
		if (dirty)
			IdemRelayStore(&st);
		PG_RETURN_BOOL(false);
	}
	if (batch > st.batch || (!st.handed_out && st.lost_events == 0))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("batch " INT64_FORMAT " of relay \"%s\" of topic \"%s\" has not been handed out",
						batch, IdemKeyForMessage(text_to_cstring(relay)),
						IdemKeyForMessage(text_to_cstring(topic))),
				 st.handed_out || st.lost_events > 0 ?
				 errdetail("The relay's current batch is " INT64_FORMAT ".", st.batch) :
				 errdetail("The relay's next batch, " INT64_FORMAT ", has not been taken by idem_outbox_next() yet.",
						   st.batch)));
	if (st.handed_out)
	{
		st.acked_ev = st.batch_end;
		st.handed_out = false;
		IdemStatsAdd(IDEM_STAT_OUTBOX_RELAYED, st.batch_events);
		st.batch_events = 0;
	}
	else
	{
		/* the loss reported as this batch */
		st.lost_events = 0;
	}
	st.batch++;
	st.acked_at = GetCurrentTimestamp();
	IdemRelayStore(&st);
	PG_RETURN_BOOL(true);
}

/*
 * idem_outbox_dead_letter(relay text, topic text, event_id uuid,
 *						   reason text DEFAULT NULL,
 *						   attempts integer DEFAULT NULL) RETURNS void
 *
 * Records, in the caller's transaction, that the relay gave up on one
 * event of its current batch, with a copy of the event, so that
 * idem_outbox_dead_letters() shows it after the event's segment is gone.
 * The relay then acknowledges the batch as usual.
 */
Datum
idem_outbox_dead_letter(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();
	text	   *relay;
	text	   *topic;
	pg_uuid_t  *event_id;
	text	   *reason = NULL;
	int32		attempts = 0;
	IdemRelayState st;
	Snapshot	snapshot;
	IdemEventScan es;
	int64		ev;
	int64		txid;
	bool		found = false;

	IdemCheckLibraryVersion();
	relay = IdemCheckKeyArg(fcinfo, 0, "relay");
	topic = IdemCheckKeyArg(fcinfo, 1, "topic");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("event_id must not be null")));
	event_id = PG_GETARG_UUID_P(2);
	if (!PG_ARGISNULL(3))
	{
		reason = PG_GETARG_TEXT_PP(3);
		if (VARSIZE_ANY_EXHDR(reason) > idem_max_response_bytes)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("reason is longer than \"idempotency.max_response_bytes\" (%d)",
							idem_max_response_bytes)));
	}
	if (!PG_ARGISNULL(4))
	{
		attempts = PG_GETARG_INT32(4);
		if (attempts < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("attempts must not be negative")));
	}
	IdemCheckWritable("idem_outbox_dead_letter()");

	/* with a tenant: the tenant outbox on the coordinator (outbox_tenant.c) */
	if (PG_NARGS() > 5 && IdemTenantRelayDistributed())
	{
		IdemTenantRelayDeadLetter(role, relay, topic, event_id, reason,
								  !PG_ARGISNULL(4), attempts,
								  PG_ARGISNULL(5) ? NULL : PG_GETARG_TEXT_PP(5));
		PG_RETURN_VOID();
	}

	IdemRelayLock(role, relay, topic, false, NULL);
	IdemRelayLoad(role, relay, topic, &st);
	if (st.handed_out && OidIsValid(IdemOutboxParent(false)))
	{
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		IdemEventScanBegin(&es, st.role, st.topic, st.acked_ev,
						   st.batch_end + 1, snapshot);
		while (!found && IdemEventScanNext(&es, &ev, &txid))
		{
			TupleTableSlot *slot;
			bool		isnull;
			HeapTuple	tuple;

			if (!IdemRelayInWindow(&st, txid))
				continue;
			slot = IdemEventScanFetch(&es);
			if (slot == NULL)
				continue;
			if (memcmp(DatumGetUUIDP(slot_getattr(slot, Anum_outbox_event_id, &isnull)),
					   event_id, UUID_LEN) != 0)
				continue;
			tuple = ExecCopySlotHeapTuple(slot);
			IdemRelayDeadLetterPut(&st, tuple, slot->tts_tupleDescriptor,
								   reason, !PG_ARGISNULL(4), attempts);
			found = true;
		}
		IdemEventScanEnd(&es);
		UnregisterSnapshot(snapshot);
	}
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("event %s is not in the current batch of relay \"%s\" of topic \"%s\"",
						DatumGetCString(DirectFunctionCall1(uuid_out, UUIDPGetDatum(event_id))),
						IdemKeyForMessage(text_to_cstring(relay)),
						IdemKeyForMessage(text_to_cstring(topic))),
				 errhint("Record a dead letter after idem_outbox_next() returned the event, before acknowledging its batch.")));
	PG_RETURN_VOID();
}

/*-------------------------------------------------------------------------
 *
 * relocate.c
 *	  idempotency.relocate_lanes(): move ledger rows that sit in another
 *	  lane than the one their digest gives.
 *
 * Before 0.3.0 the lane of a digest was computed from four of its bytes
 * read in the machine's own byte order; since 0.3.0 they are read as a
 * little-endian integer on every machine (see IdemLaneValue).  On
 * little-endian machines nothing changed.  Rows written by 0.2.0 on a
 * big-endian machine (or restored from one) sit in other lanes than the
 * ones lookups now probe, and would be missed: this moves each such row
 * to the partition of its lane, making that partition if needed, in the
 * caller's transaction.  The update script from 0.2.0 runs it where it can
 * matter (on big-endian machines); anyone can run it after restoring a
 * ledger written on one.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/relocate.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "keyhash.h"
#include "protocol.h"
#include "relation_checks.h"
#include "storage.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(idem_relocate_lanes);

/* A row to move: a copy of it, and where it is now */
typedef struct IdemMisplaced
{
	HeapTuple	tuple;
	IdemPartition from;
	int16		lane;			/* the lane it belongs to */
} IdemMisplaced;

static List *IdemFindMisplaced(IdemLedger ledger);
static void IdemMoveRow(IdemLedger ledger, IdemMisplaced *m);
static void IdemLayoutOfLane(IdemLedger ledger, int16 lane, IdemLayout *layout);

/*
 * idempotency.relocate_lanes(always boolean DEFAULT true) RETURNS bigint
 *
 * Moves every misplaced row of both ledgers to its lane; returns how many
 * rows it moved.  With always = false, does nothing on little-endian
 * machines, where no row can be misplaced by 0.2.0.
 */
Datum
idem_relocate_lanes(PG_FUNCTION_ARGS)
{
	int64		moved = 0;
	int			ledger;

	IdemCheckLibraryVersion();
#ifndef WORDS_BIGENDIAN
	if (!PG_ARGISNULL(0) && !PG_GETARG_BOOL(0))
		PG_RETURN_INT64(0);
#endif

	IdemCheckWritable("idempotency.relocate_lanes()");
	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		List	   *misplaced;
		ListCell   *lc;

		if (!IdemLedgerDefined(ledger) ||
			!OidIsValid(IdemLedgerParent(ledger, false)))
			continue;
		misplaced = IdemFindMisplaced(ledger);
		foreach(lc, misplaced)
		{
			IdemMoveRow(ledger, (IdemMisplaced *) lfirst(lc));
			moved++;
		}
		list_free_deep(misplaced);
	}
	PG_RETURN_INT64(moved);
}

/*
 * IdemFindMisplaced returns the rows of a ledger, as this transaction sees
 * them, whose lane is not the one their digest gives under their layout.
 */
static List *
IdemFindMisplaced(IdemLedger ledger)
{
	List	   *partitions = IdemAllPartitions(ledger);
	List	   *result = NIL;
	ListCell   *lc;

	foreach(lc, partitions)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);
		Relation	heap;
		TableScanDesc scan;
		HeapTuple	tup;

		LockRelationOid(p->relid, RowExclusiveLock);
		heap = table_open(p->relid, NoLock);
		scan = table_beginscan(heap, GetActiveSnapshot(), 0, NULL);
		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull;
			pg_uuid_t  *digest;
			int16		lane;
			int16		want;
			IdemMisplaced *m;

			CHECK_FOR_INTERRUPTS();
			digest = DatumGetUUIDP(heap_getattr(tup, Anum_ledger_digest,
												RelationGetDescr(heap), &isnull));
			lane = DatumGetInt16(heap_getattr(tup, Anum_ledger_lane,
											  RelationGetDescr(heap), &isnull));
			want = IdemLaneValue(digest, IdemLaneLanes(lane), IdemLaneIsLegacy(lane));
			if (want == lane)
				continue;
			m = palloc(sizeof(IdemMisplaced));
			m->tuple = heap_copytuple(tup);
			m->from = *p;
			m->lane = want;
			result = lappend(result, m);
		}
		table_endscan(scan);
		table_close(heap, NoLock);
	}
	list_free_deep(partitions);
	return result;
}

/*
 * IdemLayoutOfLane sets *layout to the layout of lane value "lane": its lane
 * count, and the width of the widest partition of that lane count and
 * digest form (partitions are clipped to their neighbours, never widened,
 * and those beyond the horizon are not of this kind: far lanes are of
 * current partitions only).
 */
static void
IdemLayoutOfLane(IdemLedger ledger, int16 lane, IdemLayout *layout)
{
	List	   *partitions = IdemAllPartitions(ledger);
	ListCell   *lc;

	layout->lanes = IdemLaneLanes(lane);
	layout->width_us = 0;
	foreach(lc, partitions)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);

		if (IdemLaneLanes(p->lane) == layout->lanes &&
			IdemLaneIsLegacy(p->lane) == IdemLaneIsLegacy(lane) &&
			!IdemLaneIsFar(p->lane))
			layout->width_us = Max(layout->width_us, p->upper - p->lower);
	}
	list_free_deep(partitions);
	if (layout->width_us == 0)
		elog(ERROR, "no partition of lane %d's layout to size a new one by", (int) lane);
	layout->width_us -= layout->width_us % layout->lanes;
	layout->interval_us = layout->width_us / layout->lanes;
}

/*
 * IdemMoveRow deletes a misplaced row and inserts it again, with its lane
 * set right, into the partition of that lane that covers its expiry (of
 * the same layout, made if missing), under the row's key lock.
 */
static void
IdemMoveRow(IdemLedger ledger, IdemMisplaced *m)
{
	Relation	from;
	TupleDesc	desc;
	Datum		values[IDEM_LEDGER_MAX_NATTS];
	bool		nulls[IDEM_LEDGER_MAX_NATTS];
	TimestampTz expires_at;
	IdemPartition target;
	IdemOpenPartition op;
	LOCKTAG		keytag;

	from = table_open(m->from.relid, NoLock);
	desc = RelationGetDescr(from);
	heap_deform_tuple(m->tuple, desc, values, nulls);
	table_close(from, NoLock);
	expires_at = DatumGetTimestampTz(values[Anum_ledger_expires_at - 1]);

	IdemSetKeyLockTag(&keytag, ledger, DatumGetObjectId(values[Anum_ledger_role - 1]),
					  DatumGetUUIDP(values[Anum_ledger_digest - 1]));
	(void) LockAcquire(&keytag, ExclusiveLock, false, false);

	if (!IdemLanePartitionAt(ledger, m->lane, expires_at, &target))
	{
		IdemLayout	layout;

		IdemLayoutOfLane(ledger, m->lane, &layout);
		(void) IdemCreateLanePartition(ledger, &layout, m->lane, expires_at);
		if (!IdemLanePartitionAt(ledger, m->lane, expires_at, &target))
			elog(ERROR, "partition made for lane %d is not in the partition cache",
				 (int) m->lane);
	}

	from = table_open(m->from.relid, NoLock);
	/* refused as a DELETE is without a replica identity (relation_checks.c) */
	IdemCheckDirectWrite(from, CMD_DELETE);
	simple_heap_delete(from, &m->tuple->t_self);
	table_close(from, NoLock);

	LockRelationOid(target.relid, RowExclusiveLock);
	IdemOpenPartitionRels(&op, ledger, &target, RowExclusiveLock, false);
	values[Anum_ledger_lane - 1] = Int16GetDatum(m->lane);
	/* in a partition made by this transaction: keep the key lock, as calls do */
	if (!IdemInsertRow(&op, values, nulls, NULL))
		LockRelease(&keytag, ExclusiveLock, false);
	IdemClosePartitions(&op, 1);
}

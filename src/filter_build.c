/*-------------------------------------------------------------------------
 *
 * filter_build.c
 *	  Making the digest filters of partitions: an empty one for a partition
 *	  the extension has just made (IdemFilterCreated), and one read from
 *	  the heap for each live partition that lacks one, at the end of each
 *	  maintenance run (IdemFilterBuildDatabase).
 *
 * Neither is made in a database with a logical replication subscription,
 * nor while an external write is under way or when one overlapped the
 * making (filter_hooks.c).  Why a filter made so holds every row of its
 * partition is in filter.h, "How that holds".
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/filter_build.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "filter.h"
#include "filter_internal.h"
#include "memory.h"
#include "storage.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_subscription.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

static bool IdemFilterHasSubscription(void);

/*
 * IdemFilterCreated gives a partition this transaction just made (and
 * nobody else can see yet) an empty READY filter, sized like its siblings,
 * unless the database has a subscription or an external write is under
 * way or overlaps the making of the filter (IdemFilterFinish), or the
 * partition is not empty.  It can be: between the library's CREATE TABLE
 * and its ATTACH (which the hooks let through as the library's own),
 * whatever that DDL fires (a superuser's event trigger) may have written
 * rows into the table while it was not yet a ledger's, which no hook
 * noticed.  Such a partition gets its filter from maintenance, built from
 * its heap.  Nothing runs between the look at its size and the filter
 * becoming READY, and no other transaction can write into it before this
 * one commits.
 */
void
IdemFilterCreated(IdemLedger ledger, Oid relid, int16 lane)
{
	uint64		seq;
	uint64		incarnation;
	uint64		secret_id;
	int			s;
	Relation	rel;
	bool		empty;

	if (!IdemFilterUsable(lane) || !OidIsValid(relid) ||
		!IdemFilterKeyed(&secret_id) ||
		IdemFilterExternalBusy(&seq) || IdemFilterHasSubscription())
		return;
	/* made by this transaction, which holds its lock */
	rel = try_relation_open(relid, NoLock);
	if (rel == NULL)
		return;
	empty = RelationGetNumberOfBlocks(rel) == 0;
	relation_close(rel, NoLock);
	if (!empty)
		return;
	s = IdemFilterTake(relid, lane, ledger,
					   Max(IdemFilterSizeHint(MyDatabaseId, ledger, lane),
						   IDEM_FILTER_PAGE_ITEMS),
					   secret_id, &incarnation);
	if (s >= 0)
		(void) IdemFilterFinish(s, incarnation, seq);
}

/* does this database have a logical replication subscription? */
static bool
IdemFilterHasSubscription(void)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		has;

	/* what is committed now, not what a cached catalog snapshot saw */
	InvalidateCatalogSnapshot();
	rel = table_open(SubscriptionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_subscription_subdbid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(MyDatabaseId));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	has = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return has;
}

/*
 * IdemFilterBuildPartition builds the filter of one partition from its
 * heap (see filter.h, "How that holds").  Returns true if it became
 * READY.
 */
static bool
IdemFilterBuildPartition(IdemLedger ledger, const IdemPartition *part)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	uint64		seq;
	uint64		incarnation;
	uint64		secret_id;
	int			s;
	IdemFilterSlot *slot;
	uint64		hint;
	uint64		n = 0;
	bool		complete = true;

	if (!IdemFilterKeyed(&secret_id))
		return false;
	if (!ConditionalLockRelationOid(part->relid, AccessShareLock))
		return false;
	rel = try_relation_open(part->relid, NoLock);
	if (rel == NULL)
		return false;
	/* no filters for a ledger distributed by Citus (doc/scale-out.md) */
	if (!IdemLedgerHasColumns(ledger, RelationGetDescr(rel)->natts) ||
		RelationGetDescr(rel)->natts == IdemTenantAttnum(ledger) ||
		IdemFilterExternalBusy(&seq) || IdemFilterHasSubscription())
	{
		relation_close(rel, AccessShareLock);
		return false;
	}

	/* published before the scan: writers add to it from now on */
	hint = (uint64) RelationGetNumberOfBlocks(rel) *
		(ledger == IDEM_LEDGER_MESSAGES ? 128 : 48);
	s = IdemFilterTake(part->relid, part->lane, ledger,
					   Max(hint, IDEM_FILTER_PAGE_ITEMS), secret_id,
					   &incarnation);
	if (s < 0)
	{
		relation_close(rel, AccessShareLock);
		return false;
	}
	slot = &idem_filter_slots[s];

	/* every tuple version: live, dead or in progress */
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		bool		isnull;
		bool		role_isnull;
		Datum		d = heap_getattr(tuple, Anum_ledger_digest,
									 RelationGetDescr(rel), &isnull);
		Datum		r = heap_getattr(tuple, Anum_ledger_role,
									 RelationGetDescr(rel), &role_isnull);

		if (!isnull && !role_isnull)
			IdemFilterAddTo(slot, IdemFilterItem(DatumGetObjectId(r),
												 DatumGetUUIDP(d),
												 secret_id));
		if ((++n & 4095) == 0)
		{
			CHECK_FOR_INTERRUPTS();
			/* made UNUSABLE (a full pool, an external write), or freed */
			if (pg_atomic_read_u64(&slot->incarnation) != incarnation ||
				pg_atomic_read_u32(&slot->state) != IDEM_FILTER_FILLING)
			{
				complete = false;
				break;
			}
		}
	}
	table_endscan(scan);
	relation_close(rel, AccessShareLock);

	if (!complete)
		return false;
	return IdemFilterFinish(s, incarnation, seq);
}

/*
 * IdemFilterBuildDatabase, run at the end of each maintenance run: frees
 * the filters of this database's partitions that are gone, and builds
 * those its live partitions lack (or that became UNUSABLE), unless the
 * database has a subscription.  Returns how many it built.
 */
int
IdemFilterBuildDatabase(void)
{
	int			built = 0;
	int			ledger;
	Oid		   *all;
	int			nall = 0;
	int			size = 64;
	TimestampTz started = GetCurrentTransactionStartTimestamp();

	if (idem_filter_shared == NULL || RecoveryInProgress())
		return 0;

	AcceptInvalidationMessages();
	all = palloc(size * sizeof(Oid));
	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		ListCell   *lc;

		if (!IdemLedgerDefined(ledger) ||
			!OidIsValid(IdemLedgerParent(ledger, false)))
			continue;
		foreach(lc, IdemAllPartitions(ledger))
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);

			if (nall == size)
			{
				size *= 2;
				all = repalloc(all, size * sizeof(Oid));
			}
			all[nall++] = p->relid;
		}
	}

	/* and the memory tables, whose filters memory.c fills */
	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		Oid			parent = IdemMemoryParent(ledger);

		if (!OidIsValid(parent))
			continue;
		if (nall == size)
		{
			size *= 2;
			all = repalloc(all, size * sizeof(Oid));
		}
		all[nall++] = parent;
	}

	/*
	 * and the partitions this transaction dropped, whose filters it frees
	 * when it commits (filter_pool.c, IdemFilterForgetAtCommit)
	 */
	{
		const Oid  *dropped;
		int			ndropped = IdemFilterDroppedRelids(&dropped);
		int			i;

		for (i = 0; i < ndropped; i++)
		{
			if (nall == size)
			{
				size *= 2;
				all = repalloc(all, size * sizeof(Oid));
			}
			all[nall++] = dropped[i];
		}
	}

	/* free the slots of partitions gone (made before this run began) */
	IdemFilterForgetSlots(MyDatabaseId, started, all, nall);

	if (IdemFilterHasSubscription())
	{
		/* none usable here (a subscription made before any was noticed) */
		IdemFilterSweepUnusable();
		pfree(all);
		return 0;
	}

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		ListCell   *lc;

		if (!IdemLedgerDefined(ledger) ||
			!OidIsValid(IdemLedgerParent(ledger, false)))
			continue;
		foreach(lc, IdemAllPartitions(ledger))
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);
			uint64		incarnation;
			IdemFilterSlot *slot;

			if (IdemLaneIsLegacy(p->lane) || p->upper <= started)
				continue;
			slot = IdemFilterFind(p->relid, &incarnation);
			if (slot != NULL &&
				pg_atomic_read_u32(&slot->state) == IDEM_FILTER_READY)
				continue;
			/* none, UNUSABLE, or FILLING from a build that did not finish */
			if (IdemFilterBuildPartition(ledger, p))
				built++;
		}
	}
	built += IdemMemoryBuildFilters();
	pfree(all);
	return built;
}

/*
 * IdemFilterFillBegin takes a slot for the filter of a ledger's memory
 * "relid" (the memory table), sized for n pairs, and publishes it FILLING;
 * false (and no filter) where filters are not used or none can be had.
 * The caller adds every pair of every piece (IdemFilterFillAdd), then
 * makes it READY (IdemFilterFillEnd).  Pieces are written under the
 * maintenance lock, which the caller holds: no write races the filling.
 */
bool
IdemFilterFillBegin(IdemLedger ledger, Oid relid, int16 lane, uint64 n,
					IdemFilterFill *fill)
{
	fill->slot = -1;
	if (!IdemFilterUsable(lane) || !OidIsValid(relid) ||
		!IdemFilterKeyed(&fill->secret_id) ||
		IdemFilterExternalBusy(&fill->seq) || IdemFilterHasSubscription())
		return false;
	fill->slot = IdemFilterTake(relid, lane, ledger,
								Max(n, IDEM_FILTER_PAGE_ITEMS),
								fill->secret_id, &fill->incarnation);
	return fill->slot >= 0;
}

/* IdemFilterFillAdd adds one pair to a filter being filled */
void
IdemFilterFillAdd(IdemFilterFill *fill, Oid role, const pg_uuid_t *digest)
{
	if (fill->slot >= 0)
		IdemFilterAddTo(&idem_filter_slots[fill->slot],
						IdemFilterItem(role, digest, fill->secret_id));
}

/* IdemFilterFillEnd makes a filled filter READY; true if it became so */
bool
IdemFilterFillEnd(IdemFilterFill *fill)
{
	if (fill->slot < 0)
		return false;
	return IdemFilterFinish(fill->slot, fill->incarnation, fill->seq);
}

/* IdemFilterIsReady: has relation "relid" a READY filter? */
bool
IdemFilterIsReady(Oid relid)
{
	uint64		incarnation;
	IdemFilterSlot *slot;

	if (idem_filter_shared == NULL)
		return false;
	slot = IdemFilterFind(relid, &incarnation);
	return slot != NULL &&
		pg_atomic_read_u32(&slot->state) == IDEM_FILTER_READY;
}

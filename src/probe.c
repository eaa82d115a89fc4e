/*-------------------------------------------------------------------------
 *
 * probe.c
 *	  The dedup protocol: one winner per key across all live partitions.
 *
 * PostgreSQL's unique indexes are per partition, so they cannot stop two
 * transactions from writing the same key into two different partitions
 * (different ttls, or a claim on each side of a partition boundary).  The
 * protocol used instead:
 *
 *	1. take a heavyweight lock on a hash of (ledger, role, digest);
 *	2. probe every live partition of the key's lane with a dirty snapshot,
 *	   which sees rows of transactions still in progress;
 *	3. if no live row was found, insert one;
 *	4. release the key lock at once (not at commit).
 *
 * The lock makes steps 2-3 atomic per key, and because the inserted row is
 * visible to dirty probes before the lock is released, the next caller
 * either finds a committed row, or finds an in-progress one and waits for
 * that transaction (XactLockTableWait) before trying again.  Locks on keys
 * are therefore held for microseconds, not for the caller's transaction,
 * and a transaction may touch any number of keys.
 *
 * The one exception: a row inserted into a partition this transaction made
 * itself (because maintenance had not made it) is invisible to everyone
 * else until commit, so its key lock is kept until the transaction ends.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/probe.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "nodes/makefuncs.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/* Columns of the message ledger */
#define Anum_messages_expires_at	1
#define Anum_messages_digest		2
#define Anum_messages_role			3
#define Anum_messages_lane			4
#define Natts_messages				4

/* Live partitions one lane may have before lookups refuse */
#define IDEM_MAX_PROBES				256

typedef enum IdemFound
{
	IDEM_FOUND_NONE,
	IDEM_FOUND_MINE,
	IDEM_FOUND_DONE,
	IDEM_FOUND_BUSY				/* inserted by a transaction in progress */
} IdemFound;

/* An open partition: its heap and digest index */
typedef struct IdemOpenPartition
{
	IdemPartition part;
	Relation	heap;
	Relation	index;
} IdemOpenPartition;

static int	IdemOpenLivePartitions(IdemLedger ledger, const pg_uuid_t *digest,
								   TimestampTz now, IdemOpenPartition *open);
static void IdemClosePartitions(IdemOpenPartition *open, int nopen);
static IdemFound IdemProbePartition(IdemOpenPartition *op,
									TupleTableSlot *slot, Oid role,
									const pg_uuid_t *digest, TimestampTz now,
									TransactionId *xwait);
static bool IdemInsertMessage(IdemOpenPartition *op, Oid role,
							  const pg_uuid_t *digest, TimestampTz expires_at);
static IndexInfo *IdemDigestIndexInfo(void);

/*
 * IdemRecordMessage records message "digest" of role "role" in the message
 * ledger unless a live record exists, waiting for transactions in progress
 * that hold one.  Returns IDEM_ABSENT if it recorded the message.
 */
IdemProbeStatus
IdemRecordMessage(Oid role, const pg_uuid_t *digest, TimestampTz now,
				  TimestampTz expires_at)
{
	LOCKTAG		keytag;
	IdemOpenPartition open[IDEM_MAX_PROBES];

	(void) IdemLedgerParent(IDEM_LEDGER_MESSAGES, true);
	IdemSetKeyLockTag(&keytag, IDEM_LEDGER_MESSAGES, role, digest);

	for (;;)
	{
		int			nopen;
		int			i;
		IdemFound	found = IDEM_FOUND_NONE;
		TransactionId xwait = InvalidTransactionId;
		IdemPartition target;
		TupleTableSlot *slot = NULL;
		bool		keep_key_lock;

		CHECK_FOR_INTERRUPTS();

		(void) LockAcquire(&keytag, ExclusiveLock, false, false);

		/* see every partition committed before we got the key lock */
		AcceptInvalidationMessages();
		nopen = IdemOpenLivePartitions(IDEM_LEDGER_MESSAGES, digest, now, open);

		for (i = 0; i < nopen && found == IDEM_FOUND_NONE; i++)
		{
			if (slot == NULL)
				slot = table_slot_create(open[i].heap, NULL);
			found = IdemProbePartition(&open[i], slot, role, digest, now, &xwait);
		}
		if (slot != NULL)
			ExecDropSingleTupleTableSlot(slot);

		if (found == IDEM_FOUND_BUSY)
		{
			/* wait for the holder to finish, then look again */
			IdemClosePartitions(open, nopen);
			LockRelease(&keytag, ExclusiveLock, false);
			XactLockTableWait(xwait, NULL, NULL, XLTW_None);
			continue;
		}
		if (found != IDEM_FOUND_NONE)
		{
			IdemClosePartitions(open, nopen);
			LockRelease(&keytag, ExclusiveLock, false);
			return found == IDEM_FOUND_MINE ? IDEM_FOUND_OWN : IDEM_FOUND_COMMITTED;
		}

		/* the target is live and in the key's lane, so it is open already */
		if (IdemPartitionFor(IDEM_LEDGER_MESSAGES, digest, expires_at, &target))
		{
			for (i = 0; i < nopen; i++)
			{
				if (open[i].part.relid == target.relid)
					break;
			}
			if (i == nopen)
			{
				/* the partition set changed under us: start over */
				IdemClosePartitions(open, nopen);
				LockRelease(&keytag, ExclusiveLock, false);
				continue;
			}
			keep_key_lock = IdemInsertMessage(&open[i], role, digest, expires_at);
			IdemClosePartitions(open, nopen);
			if (!keep_key_lock)
				LockRelease(&keytag, ExclusiveLock, false);
			return IDEM_ABSENT;
		}
		else
		{
			IdemLayout	layout;

			/* maintenance has not made it: make it here, then start over */
			IdemClosePartitions(open, nopen);
			IdemCurrentLayout(IDEM_LEDGER_MESSAGES, &layout);
			(void) IdemCreatePartition(IDEM_LEDGER_MESSAGES, &layout,
									   IdemLaneValue(digest, layout.lanes) & 0xFF,
									   expires_at);
			LockRelease(&keytag, ExclusiveLock, false);
		}
	}
}

/*
 * IdemOpenLivePartitions opens, in RowExclusiveLock mode, the live
 * partitions a key's row can be in and their digest indexes.  Locking can
 * deliver invalidations that change the set (a partition was dropped or
 * made), so it repeats until the set is stable.  Returns how many.
 */
static int
IdemOpenLivePartitions(IdemLedger ledger, const pg_uuid_t *digest,
					   TimestampTz now, IdemOpenPartition *open)
{
	IdemPartition parts[IDEM_MAX_PROBES];

	for (;;)
	{
		uint64		generation = IdemPartitionsGeneration();
		int			n;
		int			i;

		CHECK_FOR_INTERRUPTS();
		n = IdemLivePartitionsForKey(ledger, digest, now, parts,
									 IDEM_MAX_PROBES);
		for (i = 0; i < n; i++)
			LockRelationOid(parts[i].relid, RowExclusiveLock);
		if (generation != IdemPartitionsGeneration())
			continue;

		for (i = 0; i < n; i++)
		{
			if (!OidIsValid(parts[i].indexrelid))
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("partition \"%s\" has no digest index",
								get_rel_name(parts[i].relid)),
						 errhint("Partitions of the idempotency ledgers must keep the index they were made with.")));
			open[i].part = parts[i];
			open[i].heap = table_open(parts[i].relid, NoLock);
			open[i].index = index_open(parts[i].indexrelid, RowExclusiveLock);
		}
		return n;
	}
}

/* closes what IdemOpenLivePartitions opened, keeping the locks */
static void
IdemClosePartitions(IdemOpenPartition *open, int nopen)
{
	int			i;

	for (i = 0; i < nopen; i++)
	{
		index_close(open[i].index, NoLock);
		table_close(open[i].heap, NoLock);
	}
}

/*
 * IdemProbePartition looks for a live row of (role, digest) in one
 * partition with a dirty snapshot.  For a row of a transaction still in
 * progress, returns IDEM_FOUND_BUSY and that transaction in *xwait.
 */
static IdemFound
IdemProbePartition(IdemOpenPartition *op, TupleTableSlot *slot, Oid role,
				   const pg_uuid_t *digest, TimestampTz now,
				   TransactionId *xwait)
{
	SnapshotData dirty;
	IndexScanDesc scan;
	ScanKeyData skey;
	IdemFound	result = IDEM_FOUND_NONE;

	InitDirtySnapshot(dirty);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_UUID_EQ,
				UUIDPGetDatum(digest));
	scan = index_beginscan(op->heap, op->index, &dirty, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);

	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		TransactionId xmin;

		if (DatumGetObjectId(slot_getattr(slot, Anum_messages_role, &isnull)) != role)
			continue;
		if (DatumGetTimestampTz(slot_getattr(slot, Anum_messages_expires_at,
											 &isnull)) <= now)
			continue;			/* expired: as if absent */

		/* a dirty snapshot does not report our own insertions in xmin */
		xmin = DatumGetTransactionId(slot_getsysattr(slot,
													 MinTransactionIdAttributeNumber,
													 &isnull));
		if (TransactionIdIsCurrentTransactionId(xmin))
			result = IDEM_FOUND_MINE;
		else if (TransactionIdIsValid(dirty.xmin))
		{
			*xwait = dirty.xmin;
			result = IDEM_FOUND_BUSY;
		}
		else
			result = IDEM_FOUND_DONE;
		break;
	}

	index_endscan(scan);
	ExecClearTuple(slot);
	return result;
}

/*
 * IdemInsertMessage inserts a row into open partition "op", which the caller
 * has checked covers (lane, expires_at), and its index entry.  Returns true
 * if the partition was made by this transaction, in which case the caller
 * must keep the key lock until the transaction ends.
 */
static bool
IdemInsertMessage(IdemOpenPartition *op, Oid role, const pg_uuid_t *digest,
				  TimestampTz expires_at)
{
	Datum		values[Natts_messages];
	bool		nulls[Natts_messages] = {false};
	Datum		indexvalue;
	bool		indexnull = false;
	HeapTuple	tuple;

	if (RelationGetDescr(op->heap)->natts != Natts_messages)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s\" does not have the columns of the message ledger",
						RelationGetRelationName(op->heap))));

	values[Anum_messages_expires_at - 1] = TimestampTzGetDatum(expires_at);
	values[Anum_messages_digest - 1] = UUIDPGetDatum(digest);
	values[Anum_messages_role - 1] = ObjectIdGetDatum(role);
	values[Anum_messages_lane - 1] = Int16GetDatum(op->part.lane);
	tuple = heap_form_tuple(RelationGetDescr(op->heap), values, nulls);
	simple_heap_insert(op->heap, tuple);

	indexvalue = UUIDPGetDatum(digest);
	(void) index_insert(op->index, &indexvalue, &indexnull, &tuple->t_self,
						op->heap, UNIQUE_CHECK_NO, false, IdemDigestIndexInfo());
	heap_freetuple(tuple);

	return op->heap->rd_createSubid != InvalidSubTransactionId;
}

/*
 * IdemDigestIndexInfo returns the IndexInfo of a digest index (one key
 * column, the digest).  It is the same for every partition, so it is built
 * once per backend.
 */
static IndexInfo *
IdemDigestIndexInfo(void)
{
	static IndexInfo *info = NULL;

	if (info == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

		info = makeIndexInfo(1, 1, BTREE_AM_OID, NIL, NIL,
							 false, false, false, false);
		info->ii_IndexAttrNumbers[0] = Anum_messages_digest;
		MemoryContextSwitchTo(oldcxt);
	}
	return info;
}

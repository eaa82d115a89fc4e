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

static void IdemLockPartitions(IdemLedger ledger, const pg_uuid_t *digest,
							   TimestampTz now, IdemPartition *parts, int *nparts);
static Oid	IdemPartitionIndex(Relation heap);
static IdemFound IdemProbePartition(Relation heap, Relation index, Oid role,
									const pg_uuid_t *digest, TimestampTz now,
									TransactionId *xwait);
static bool IdemInsertMessage(Oid relid, Oid role, const pg_uuid_t *digest,
							  TimestampTz expires_at, int16 lane);

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
	IdemPartition parts[IDEM_MAX_PROBES];

	(void) IdemLedgerParent(IDEM_LEDGER_MESSAGES, true);
	IdemSetKeyLockTag(&keytag, IDEM_LEDGER_MESSAGES, role, digest);

	for (;;)
	{
		int			nparts;
		int			i;
		IdemFound	found = IDEM_FOUND_NONE;
		TransactionId xwait = InvalidTransactionId;
		IdemPartition target;
		bool		keep_key_lock;

		CHECK_FOR_INTERRUPTS();

		(void) LockAcquire(&keytag, ExclusiveLock, false, false);

		/* see every partition committed before we got the key lock */
		AcceptInvalidationMessages();
		IdemLockPartitions(IDEM_LEDGER_MESSAGES, digest, now, parts, &nparts);

		for (i = 0; i < nparts && found == IDEM_FOUND_NONE; i++)
		{
			Relation	heap = table_open(parts[i].relid, NoLock);
			Relation	index = index_open(IdemPartitionIndex(heap),
										   RowExclusiveLock);

			found = IdemProbePartition(heap, index, role, digest, now, &xwait);
			index_close(index, NoLock);
			table_close(heap, NoLock);
		}

		if (found == IDEM_FOUND_BUSY)
		{
			/* wait for the holder to finish, then look again */
			LockRelease(&keytag, ExclusiveLock, false);
			XactLockTableWait(xwait, NULL, NULL, XLTW_None);
			continue;
		}
		if (found != IDEM_FOUND_NONE)
		{
			LockRelease(&keytag, ExclusiveLock, false);
			return found == IDEM_FOUND_MINE ? IDEM_FOUND_OWN : IDEM_FOUND_COMMITTED;
		}

		if (!IdemPartitionFor(IDEM_LEDGER_MESSAGES, digest, expires_at, &target))
		{
			IdemLayout	layout;

			/* maintenance has not made it: make it here, then start over */
			IdemCurrentLayout(IDEM_LEDGER_MESSAGES, &layout);
			(void) IdemCreatePartition(IDEM_LEDGER_MESSAGES, &layout,
									   IdemLaneValue(digest, layout.lanes) & 0xFF,
									   expires_at);
			LockRelease(&keytag, ExclusiveLock, false);
			continue;
		}

		keep_key_lock = IdemInsertMessage(target.relid, role, digest,
										  expires_at, target.lane);
		if (!keep_key_lock)
			LockRelease(&keytag, ExclusiveLock, false);
		return IDEM_ABSENT;
	}
}

/*
 * IdemLockPartitions fills "parts" with the live partitions a key's row can
 * be in, each locked in RowExclusiveLock mode.  Locking can deliver
 * invalidations that change the set (a partition was dropped or made), so
 * it repeats until the set is stable.
 */
static void
IdemLockPartitions(IdemLedger ledger, const pg_uuid_t *digest,
				   TimestampTz now, IdemPartition *parts, int *nparts)
{
	for (;;)
	{
		uint64		generation = IdemPartitionsGeneration();
		int			n;
		int			i;

		n = IdemLivePartitionsForKey(ledger, digest, now, parts,
									 IDEM_MAX_PROBES);
		for (i = 0; i < n; i++)
			LockRelationOid(parts[i].relid, RowExclusiveLock);
		if (generation == IdemPartitionsGeneration())
		{
			*nparts = n;
			return;
		}
	}
}

/*
 * IdemPartitionIndex returns the OID of a partition's digest index: the
 * only index the extension gives its partitions.
 */
static Oid
IdemPartitionIndex(Relation heap)
{
	List	   *indexes = RelationGetIndexList(heap);
	Oid			result;

	if (indexes == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s\" has no index",
						RelationGetRelationName(heap)),
				 errhint("Partitions of the idempotency ledgers must keep the index they were made with.")));
	result = linitial_oid(indexes);
	list_free(indexes);
	return result;
}

/*
 * IdemProbePartition looks for a live row of (role, digest) in one
 * partition with a dirty snapshot.  For a row of a transaction still in
 * progress, returns IDEM_FOUND_BUSY and that transaction in *xwait.
 */
static IdemFound
IdemProbePartition(Relation heap, Relation index, Oid role,
				   const pg_uuid_t *digest, TimestampTz now,
				   TransactionId *xwait)
{
	SnapshotData dirty;
	IndexScanDesc scan;
	ScanKeyData skey;
	TupleTableSlot *slot;
	IdemFound	result = IDEM_FOUND_NONE;

	InitDirtySnapshot(dirty);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_UUID_EQ,
				UUIDPGetDatum(digest));
	slot = table_slot_create(heap, NULL);
	scan = index_beginscan(heap, index, &dirty, 1, 0);
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
	ExecDropSingleTupleTableSlot(slot);
	return result;
}

/*
 * IdemInsertMessage inserts a row into partition "relid", which the caller
 * has checked covers (lane, expires_at), and its index entry.  Returns true
 * if the partition was made by this transaction, in which case the caller
 * must keep the key lock until the transaction ends.
 */
static bool
IdemInsertMessage(Oid relid, Oid role, const pg_uuid_t *digest,
				  TimestampTz expires_at, int16 lane)
{
	Relation	heap = table_open(relid, RowExclusiveLock);
	Relation	index;
	IndexInfo  *indexInfo;
	Datum		values[Natts_messages];
	bool		nulls[Natts_messages] = {false};
	Datum		indexvalue;
	bool		indexnull = false;
	HeapTuple	tuple;
	bool		created_here;

	if (RelationGetDescr(heap)->natts != Natts_messages)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s\" does not have the columns of the message ledger",
						RelationGetRelationName(heap))));

	values[Anum_messages_expires_at - 1] = TimestampTzGetDatum(expires_at);
	values[Anum_messages_digest - 1] = UUIDPGetDatum(digest);
	values[Anum_messages_role - 1] = ObjectIdGetDatum(role);
	values[Anum_messages_lane - 1] = Int16GetDatum(lane);
	tuple = heap_form_tuple(RelationGetDescr(heap), values, nulls);
	simple_heap_insert(heap, tuple);

	index = index_open(IdemPartitionIndex(heap), RowExclusiveLock);
	indexInfo = BuildIndexInfo(index);
	indexvalue = UUIDPGetDatum(digest);
	(void) index_insert(index, &indexvalue, &indexnull, &tuple->t_self, heap,
						UNIQUE_CHECK_NO, false, indexInfo);

	created_here = heap->rd_createSubid != InvalidSubTransactionId;

	index_close(index, NoLock);
	table_close(heap, NoLock);
	heap_freetuple(tuple);
	return created_here;
}

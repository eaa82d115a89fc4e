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
 * This file has the pieces both ledgers use; consume.c and keys.c run the
 * protocol with them.
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
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

static IndexInfo *IdemDigestIndexInfo(void);

/*
 * IdemOpenLivePartitions opens, in the given lock mode, the live partitions
 * a key's row can be in, and their digest indexes, checking that they have
 * the ledger's columns.  Locking can deliver
 * invalidations that change the set (a partition was dropped or made), so it
 * repeats until the set is stable.  Returns how many.
 */
int
IdemOpenLivePartitions(IdemLedger ledger, const pg_uuid_t *digest,
					   TimestampTz now, LOCKMODE lockmode,
					   IdemOpenPartition *open)
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
			LockRelationOid(parts[i].relid, lockmode);
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
			if (RelationGetDescr(open[i].heap)->natts != IdemLedgerNatts(ledger))
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("partition \"%s\" does not have the columns of table \"%s.%s\"",
								RelationGetRelationName(open[i].heap),
								IDEM_SCHEMA_NAME, IdemLedgerName(ledger))));
			open[i].index = index_open(parts[i].indexrelid, lockmode);
		}
		return n;
	}
}

/* closes what IdemOpenLivePartitions opened, keeping the locks */
void
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
 * IdemProbe looks for a live (not expired) row of (role, digest) in the open
 * partitions.  With no snapshot given, it uses a dirty snapshot, which also
 * sees rows of transactions in progress: a row that another transaction is
 * inserting, updating or deleting is reported BUSY with that transaction in
 * xwait.  Writers probe that way, holding the key lock.
 *
 * A reader that holds no key lock passes an MVCC snapshot instead, and gets
 * the row version that snapshot sees, DONE or MINE, never BUSY.  Without the
 * key lock a dirty probe could miss a row that a writer moves meanwhile: the
 * index scan reads a leaf page's entries first and visits the rows after, so
 * it can copy the entries before the new version's entry is added and visit
 * the old version after the writer has committed, and then see neither
 * version live.  Under an MVCC snapshot one of the two is always visible.
 *
 * With want_tuple, a copy of the row is returned in palloc'd memory.
 */
void
IdemProbe(IdemOpenPartition *open, int nopen, Oid role,
		  const pg_uuid_t *digest, TimestampTz now, bool want_tuple,
		  Snapshot snapshot, IdemProbeResult *result)
{
	TupleTableSlot *slot = NULL;
	int			i;

	result->found = IDEM_FOUND_NONE;
	result->xwait = InvalidTransactionId;
	result->which = -1;
	result->tuple = NULL;
	ItemPointerSetInvalid(&result->tid);

	for (i = 0; i < nopen && result->found == IDEM_FOUND_NONE; i++)
	{
		SnapshotData dirty;
		IndexScanDesc scan;
		ScanKeyData skey;

		if (slot == NULL)
			slot = table_slot_create(open[i].heap, NULL);

		InitDirtySnapshot(dirty);
		ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_UUID_EQ,
					UUIDPGetDatum(digest));
		scan = index_beginscan(open[i].heap, open[i].index,
							   snapshot != NULL ? snapshot : &dirty, 1, 0);
		index_rescan(scan, &skey, 1, NULL, 0);

		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			TransactionId xmin;

			if (DatumGetObjectId(slot_getattr(slot, Anum_ledger_role, &isnull)) != role)
				continue;
			if (DatumGetTimestampTz(slot_getattr(slot, Anum_ledger_expires_at,
												 &isnull)) <= now)
				continue;		/* expired: as if absent */

			/* a dirty snapshot does not report our own changes in xmin */
			xmin = DatumGetTransactionId(slot_getsysattr(slot,
														 MinTransactionIdAttributeNumber,
														 &isnull));
			if (TransactionIdIsCurrentTransactionId(xmin))
				result->found = IDEM_FOUND_MINE;
			else if (snapshot != NULL)
				result->found = IDEM_FOUND_DONE;
			else if (TransactionIdIsValid(dirty.xmin))
			{
				result->found = IDEM_FOUND_BUSY;
				result->xwait = dirty.xmin;
			}
			else if (TransactionIdIsValid(dirty.xmax))
			{
				result->found = IDEM_FOUND_BUSY;
				result->xwait = dirty.xmax;
			}
			else
				result->found = IDEM_FOUND_DONE;

			result->which = i;
			result->tid = slot->tts_tid;
			if (want_tuple)
				result->tuple = ExecCopySlotHeapTuple(slot);
			break;
		}
		index_endscan(scan);
		ExecClearTuple(slot);
	}
	if (slot != NULL)
		ExecDropSingleTupleTableSlot(slot);
}

/*
 * IdemOpenTarget returns the index, among the open partitions, of the one a
 * new row of this digest expiring at expires_at goes to.  The target is live
 * and in the key's lane, so normally it is open already.  Returns -1 if the
 * caller must start over: the partition set changed, or the target did not
 * exist and has just been made (in this transaction, as maintenance had not
 * made it).
 */
int
IdemOpenTarget(IdemLedger ledger, const pg_uuid_t *digest,
			   TimestampTz expires_at, IdemOpenPartition *open, int nopen)
{
	IdemPartition target;
	IdemLayout	layout;
	int			lane_number;
	int			i;

	if (IdemPartitionFor(ledger, digest, expires_at, &target))
	{
		for (i = 0; i < nopen; i++)
		{
			if (open[i].part.relid == target.relid)
				return i;
		}
		return -1;
	}

	IdemCurrentLayout(ledger, &layout);
	lane_number = IdemLaneValue(digest, layout.lanes) & 0xFF;
	if (!IdemWorkerMakePartition(ledger, &layout, lane_number, expires_at))
		(void) IdemCreatePartition(ledger, &layout, lane_number, expires_at);
	return -1;
}

/* the transaction and command of this backend's last ledger write */
static TransactionId last_write_xid = InvalidTransactionId;
static CommandId last_write_cid = InvalidCommandId;

/* notes a ledger write by the current command */
static void
IdemNoteWrite(void)
{
	last_write_xid = GetTopTransactionIdIfAny();
	last_write_cid = GetCurrentCommandId(false);
}

/*
 * IdemSeeOwnWrites makes the ledger rows this statement wrote visible to
 * the row updates and deletes that follow (a claim completed or released by
 * the same SQL statement): PostgreSQL refuses to update a row inserted by
 * the command that is running.  It advances the command counter only when
 * this command wrote a ledger row, so the usual call pays nothing.
 */
void
IdemSeeOwnWrites(void)
{
	if (TransactionIdIsValid(last_write_xid) &&
		last_write_cid == GetCurrentCommandId(false) &&
		TransactionIdEquals(last_write_xid, GetTopTransactionIdIfAny()))
		CommandCounterIncrement();
}

/*
 * IdemInsertRow inserts a row into open partition "op", which the caller
 * has checked covers its (lane, expires_at), and its index entry, and sets
 * *newtid (if not NULL) to where the row went.  Returns
 * true if the partition was made by this transaction, in which case the
 * caller must keep the key lock until the transaction ends.
 */
bool
IdemInsertRow(IdemOpenPartition *op, Datum *values, bool *nulls,
			  ItemPointer newtid)
{
	HeapTuple	tuple;
	Datum		indexvalue = values[Anum_ledger_digest - 1];
	bool		indexnull = false;

	tuple = heap_form_tuple(RelationGetDescr(op->heap), values, nulls);
	simple_heap_insert(op->heap, tuple);
	(void) index_insert(op->index, &indexvalue, &indexnull, &tuple->t_self,
						op->heap, UNIQUE_CHECK_NO, false, IdemDigestIndexInfo());
	if (newtid != NULL)
		*newtid = tuple->t_self;
	heap_freetuple(tuple);
	IdemNoteWrite();

	return op->heap->rd_createSubid != InvalidSubTransactionId;
}

/*
 * IdemUpdateRow replaces row "tid" of open partition "op" by newtuple, which
 * keeps the digest and expiry of the old one (so the row never moves to
 * another partition).  The caller holds the key lock and has checked that
 * no other transaction is changing the row.  Returns true if the partition
 * was made by this transaction, as IdemInsertRow does.
 */
bool
IdemUpdateRow(IdemOpenPartition *op, ItemPointer tid, HeapTuple newtuple)
{
	IdemSeeOwnWrites();
	simple_heap_update(op->heap, tid, newtuple);
	IdemNoteWrite();
	if (!HeapTupleIsHeapOnly(newtuple))
	{
		bool		isnull;
		Datum		indexvalue = heap_getattr(newtuple, Anum_ledger_digest,
											  RelationGetDescr(op->heap),
											  &isnull);

		(void) index_insert(op->index, &indexvalue, &isnull, &newtuple->t_self,
							op->heap, UNIQUE_CHECK_NO, false,
							IdemDigestIndexInfo());
	}
	return op->heap->rd_createSubid != InvalidSubTransactionId;
}

/*
 * IdemDigestIndexInfo returns the IndexInfo of a digest index (one key
 * column, the digest).  It is the same for every partition of every ledger,
 * so it is built once per backend.
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
		info->ii_IndexAttrNumbers[0] = Anum_ledger_digest;
		MemoryContextSwitchTo(oldcxt);
	}
	return info;
}

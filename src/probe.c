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
 * itself (because maintenance had not made it, and no partition maker
 * could) is invisible to everyone else until commit, so its key lock is
 * kept until the transaction ends (at most max_locks_per_transaction of
 * them, see IdemCountKeptKeyLock), unless the transaction made the
 * ledger's table too (see IdemMustKeepKeyLock).
 *
 * In detail, a call: takes the key lock (an advisory lock tag, field4
 * 0x4944, see IdemSetKeyLockTag); accepts invalidation messages (at the
 * start of IdemOpProbe), so that partitions committed before the lock was
 * granted are known; opens and locks the live partitions of the key's lane,
 * never the parent; checks that the key lock is still of the form in force
 * (keyed or not, see IdemOpProbe); probes them with a dirty snapshot;
 * writes; releases the key lock.
 *
 * Every call that writes a ledger row runs the protocol through one API,
 * an IdemOp:
 *
 *	IdemOpInit			the key: ledger, role, digest, lock tag, clock
 *	IdemOpRun			lock, probe, and the caller's step, over and over:
 *						a step answers IDEM_STEP_DONE, or IDEM_STEP_WAIT (a
 *						row is being written: wait for its writer),
 *						IDEM_STEP_WAIT_HOLDER (a committed two-phase claim
 *						is held: wait for its holder, see wait.c) or
 *						IDEM_STEP_MAKE_TARGET (the new row's partition is
 *						missing: have it made); the clock is read again
 *						after each wait
 *	IdemOpFindTarget	the partition a new row goes to
 *	IdemOpInsert, IdemOpReplace, IdemOpUpdate
 *						write the row, noting when the key lock must be kept
 *	IdemOpEnd			close the partitions, release the key lock
 *
 * A claim (keys.c), a consume (consume.c) and an import (keys.c, for
 * transfer.c) are steps; idem_complete() and its siblings, which never
 * wait and never make partitions, use IdemOpLock, IdemOpFetchOwn or
 * IdemOpProbe, IdemOpUpdate and IdemOpEnd directly; idem_lookup() probes
 * under an MVCC snapshot without the key lock.  Below them, the pieces:
 * opening the partitions a key's row can be in (and asking the lock
 * manager about ended ones), the probe, and writing rows with their index
 * entries.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/probe.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "compat.h"
#include "filter.h"
#include "keyhash.h"
#include "lock_secret.h"
#include "memory.h"
#include "protocol.h"
#include "relation_checks.h"
#include "storage.h"
#include "wait.h"
#include "worker.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/partition.h"
#include "catalog/pg_am.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "nodes/makefuncs.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

static bool IdemLockEndedPartition(Oid relid);
static bool IdemMayHaveWriters(Oid relid);
static bool IdemMustKeepKeyLock(Relation partition);
static void IdemOpMakeTarget(IdemOp *op);
static void IdemOpRetag(IdemOp *op);
static void IdemOpDeform(IdemOp *op, TupleDesc tupdesc);
static void IdemUnlockEnded(IdemPartition *parts, int n, bool *locked);
static bool IdemSamePartitions(IdemLedger ledger, const pg_uuid_t *digest,
							   TimestampTz now, const IdemPartition *parts,
							   int n);
static bool IdemOpenCacheLookup(IdemOpenCache *cache, IdemLedger ledger,
								const pg_uuid_t *digest, TimestampTz now,
								LOCKMODE lockmode, IdemOpenPartition **open,
								int *nopen);

/*
 * IdemOpenLivePartitions opens, in the given lock mode, the partitions a
 * key's live row can be in (see IdemLivePartitionsForKey) and their indexes,
 * checking that they have the ledger's columns, into *open, a palloc'd
 * array (of at least one element, so that a caller may put one partition
 * there itself).  Locking can deliver invalidations that change the set (a
 * partition was dropped or made): when the ledger caches moved meanwhile,
 * the set is read again, and if it is not the one locked, it starts over.
 * (Starting over whenever they moved would never end where they always
 * move: under debug_discard_caches, every lock taken and every read of the
 * catalogs discards them.)  Returns how many it opened.
 *
 * A partition whose range has ended is probed under a lock that
 * IdemClosePartitions releases, unless no transaction can still be
 * writing into it (IdemLockEndedPartition): calls hold no lock on ended
 * partitions past their probe, so that maintenance can drop them.
 *
 * A partition whose digest filter rules the role's key out (filter.h) is
 * neither locked nor opened: no row of the key can be there.  If a new row
 * is to go there, IdemOpFindTarget opens it then; *open has room for every
 * partition listed.
 *
 * The live partitions come first in *open, the ended ones after them, so
 * that a probe that finds the key's live row stops before the ended ones
 * (IdemProbe stops at the first row it finds).  The answer is the same in
 * either order: a key has one live row, and an expired row only adds
 * "remembered", which counts only when no live row is found, that is once
 * every partition has been probed.  It matters where ended partitions are
 * many: a ledger distributed by Citus keeps them for key_memory
 * (maintain.c), key_memory / partition_interval of them per lane, which
 * every call on a live key (a completion, a replay) would otherwise probe
 * first, as partitions come in order of their ranges.
 */
int
IdemOpenLivePartitions(IdemLedger ledger, Oid role, const pg_uuid_t *digest,
					   TimestampTz now, LOCKMODE lockmode,
					   IdemOpenPartition **open, int *capacity)
{
	for (;;)
	{
		uint64		generation = IdemPartitionsGeneration();
		IdemPartition *parts;
		bool	   *locked;
		int			n;
		int			i;
		int			pass;
		int			nopen;

		CHECK_FOR_INTERRUPTS();
		n = IdemLivePartitionsForKey(ledger, digest, now, &parts);
		locked = palloc(Max(n, 1) * sizeof(bool));
		for (i = 0; i < n; i++)
		{
			locked[i] = true;
			if (IdemFilterRulesOut(parts[i].relid, parts[i].lane, role, digest))
			{
				/* not opened; an ended one is not unlocked either */
				locked[i] = false;
				parts[i].ended = false;
			}
			else if (!parts[i].ended)
				LockRelationOid(parts[i].relid, lockmode);
			else if (IdemRelationOidLockedByMe(parts[i].relid,
												RowExclusiveLock, true))
			{
				/* this transaction wrote into it: keep it like a live one */
				LockRelationOid(parts[i].relid, lockmode);
				parts[i].ended = false;
			}
			else if (!IdemLockEndedPartition(parts[i].relid))
				locked[i] = false;
		}
		if (generation != IdemPartitionsGeneration() &&
			!IdemSamePartitions(ledger, digest, now, parts, n))
		{
			IdemUnlockEnded(parts, n, locked);
			pfree(parts);
			pfree(locked);
			continue;
		}

		*open = palloc(Max(n, 1) * sizeof(IdemOpenPartition));
		if (capacity != NULL)
			*capacity = Max(n, 1);
		nopen = 0;
		for (pass = 0; pass < 2; pass++)
		{
			/* the live partitions, then the ended ones */
			for (i = 0; i < n; i++)
			{
				if (!locked[i] || parts[i].ended != (pass == 1))
					continue;
				IdemOpenPartitionRels(&(*open)[nopen], ledger, &parts[i],
									  parts[i].ended ? AccessShareLock : lockmode,
									  true);
				nopen++;
			}
		}
		pfree(parts);
		pfree(locked);
		return nopen;
	}
}

/*
 * IdemLockEndedPartition locks an ended partition ACCESS SHARE for a probe
 * and returns true, or returns false, with nothing locked, if no other
 * transaction can still be writing into it.
 *
 * A transaction that wrote a row there (while the partition was live)
 * still holds ROW EXCLUSIVE on it until it ends, and may be writing the
 * very key the caller probes: a caller that skipped the partition would
 * miss that row and not wait for its writer (specs/ended_writer.spec).
 * Which transactions hold a weak relation lock is known only to each of
 * them (the lock manager's fast path keeps it in the holder's own slots),
 * and asking means visiting every backend's slots under its fast-path
 * LWLock.  Up to 0.4.0 every such probe asked, with a conditional SHARE
 * lock, a strong lock: that cost more than the probe it might save (21,800
 * instructions per call, bench/README.md, "The guard: ratios counted side
 * by side"), grew with max_connections and held up every backend taking a
 * fast-path lock meanwhile.  So the partition is simply probed, under an
 * ACCESS SHARE lock taken without waiting: a weak lock, in this backend's
 * own fast-path slots, and one the writers' locks do not conflict with.
 * The probe then finds any row of the key a transaction is writing there
 * and waits for that transaction, as in a live partition.
 *
 * ACCESS SHARE is refused at once only when someone holds, or waits for,
 * ACCESS EXCLUSIVE on the partition: maintenance dropping it.  Then the
 * question is asked (IdemMayHaveWriters), and the caller waits for the
 * lock only if a writer may be there: a DROP queued behind such a writer
 * is not granted before the writer ends, and the caller, which must wait
 * for the writer anyway, waits for the DROP too (and then finds the
 * partition gone, see IdemOpenLivePartitions); with no writer there, the
 * caller neither probes nor waits for the DROP.
 */
static bool
IdemLockEndedPartition(Oid relid)
{
	if (ConditionalLockRelationOid(relid, AccessShareLock))
		return true;
	if (!IdemMayHaveWriters(relid))
		return false;
	LockRelationOid(relid, AccessShareLock);
	return true;
}

/*
 * IdemMayHaveWriters: may another transaction hold ROW EXCLUSIVE on this
 * ended partition, that is, may it have written rows there and still be
 * running?  Every writer keeps that lock until it ends.  Asked, without
 * waiting for anyone, when ACCESS SHARE could not be had at once (see
 * IdemLockEndedPartition):
 *	- if someone holds a lock that conflicts with writes (a DROP of the
 *	  partition by maintenance, whose transaction is still open), nobody
 *	  can be writing there;
 *	- if nobody holds a lock that conflicts with SHARE (ROW EXCLUSIVE is
 *	  one), nobody is writing there either: the DROP is only queued,
 *	  behind readers.
 * Otherwise there may be a writer: the caller probes the partition.  On a
 * standby, where no such lock can be taken, the answer is always yes.
 * Both questions visit every backend's fast-path slots: they are asked
 * only while a DROP is under way.
 */
static bool
IdemMayHaveWriters(Oid relid)
{
	LOCKTAG		tag;
	VirtualTransactionId *holders;
	int			nholders;

	if (RecoveryInProgress())
		return true;
	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	holders = GetLockConflicts(&tag, RowExclusiveLock, &nholders);
	pfree(holders);
	if (nholders > 0)
		return false;
	holders = GetLockConflicts(&tag, ShareLock, &nholders);
	pfree(holders);
	return nholders > 0;
}

/*
 * IdemSamePartitions: does the list of the partitions a key's live row can
 * be in, read now (after the invalidations that locking them delivered),
 * name the same partitions as parts[0..n-1]?
 */
static bool
IdemSamePartitions(IdemLedger ledger, const pg_uuid_t *digest,
				   TimestampTz now, const IdemPartition *parts, int n)
{
	IdemPartition *again;
	int			m;
	int			i;
	bool		same;

	m = IdemLivePartitionsForKey(ledger, digest, now, &again);
	same = (m == n);
	for (i = 0; same && i < n; i++)
		same = (again[i].relid == parts[i].relid);
	pfree(again);
	return same;
}

/* releases the locks IdemOpenLivePartitions took on ended partitions */
static void
IdemUnlockEnded(IdemPartition *parts, int n, bool *locked)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		if (parts[i].ended && locked[i])
			UnlockRelationOid(parts[i].relid, AccessShareLock);
	}
}

/*
 * IdemOpenPartitionRels opens partition "part" of a ledger, which the caller
 * has locked in lock mode "lockmode", into "op", checking that it has the
 * ledger's columns; with "probe", also its digest index (others, and
 * without "probe" all of them, when a write needs their entries).
 */
void
IdemOpenPartitionRels(IdemOpenPartition *op, IdemLedger ledger,
					  const IdemPartition *part, LOCKMODE lockmode, bool probe)
{
	op->part = *part;
	op->heap = table_open(part->relid, NoLock);
	if (!IdemLedgerHasColumns(ledger, RelationGetDescr(op->heap)->natts) ||
		(ledger == IDEM_LEDGER_KEYS && lockmode == RowExclusiveLock &&
		 RelationGetDescr(op->heap)->natts < Natts_keys &&
		 IdemInstalledVersionAtLeast("0.4.0")))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s\" does not have the columns of table \"%s.%s\"",
						RelationGetRelationName(op->heap),
						IDEM_SCHEMA_NAME, IdemLedgerName(ledger))));
	IdemOpenPartitionIndexes(op, lockmode, probe);
}

/*
 * IdemClosePartitions closes what IdemOpenLivePartitions opened, keeping the
 * locks, except those taken only to look into ended partitions: on the
 * partition and on the indexes the probe opened (a DROP needs them all).
 */
void
IdemClosePartitions(IdemOpenPartition *open, int nopen)
{
	int			i;
	int			j;

	for (i = 0; i < nopen; i++)
	{
		if (open[i].part.ended)
			for (j = 0; j < open[i].nopened; j++)
				UnlockRelationOid(open[i].index_oids[j], open[i].index_lockmode);
		IdemClosePartitionIndexes(&open[i]);
		table_close(open[i].heap, NoLock);
		if (open[i].part.ended)
			UnlockRelationOid(open[i].part.relid, AccessShareLock);
	}
}

/*
 * IdemOpenCacheInit prepares an empty cache of open partitions for a call
 * that writes many rows, in a memory context of its own below the current
 * one.
 */
void
IdemOpenCacheInit(IdemOpenCache *cache)
{
	cache->cxt = AllocSetContextCreate(CurrentMemoryContext,
									   "idempotency open partitions",
									   ALLOCSET_SMALL_SIZES);
	cache->generation = IdemPartitionsGeneration();
	cache->nentries = 0;
}

/* closes the cache's partitions, keeping their locks */
static void
IdemOpenCacheClose(IdemOpenCache *cache)
{
	int			i;

	for (i = 0; i < cache->nentries; i++)
		IdemClosePartitions(cache->entries[i].open, cache->entries[i].nopen);
	cache->nentries = 0;
	MemoryContextReset(cache->cxt);
}

/* IdemOpenCacheEnd closes what the cache holds and frees it */
void
IdemOpenCacheEnd(IdemOpenCache *cache)
{
	IdemOpenCacheClose(cache);
	MemoryContextDelete(cache->cxt);
	cache->cxt = NULL;
}

/*
 * IdemOpenCacheLookup sets *open and *nopen to the cache's open partitions
 * for a key with this digest, opening and keeping them if the cache has
 * room, and returns true; or returns false, and the caller opens them
 * itself (IdemOpenLivePartitions), if the set is not one the cache can
 * keep: one with a partition whose range has ended (whether to look into
 * it is asked of the lock manager on every probe, see
 * IdemOpenLivePartitions), or one met while the ledger caches changed
 * under the locks just taken.
 *
 * An entry is the exact list of partitions IdemLivePartitionsForKey gives,
 * all live, opened in lock mode "lockmode" in the cache's memory (their
 * other indexes are opened when a write needs them, and what inserting
 * builds lives there too, see IdemIndexInfo).  The caller has accepted
 * invalidation messages under its key lock: if the ledger caches changed
 * since the entries were opened (a partition was made or dropped), every
 * entry is closed first, so a partition made meanwhile is never missed.  The locks themselves are the
 * transaction's either way: a partition's lock is kept to the end of the
 * transaction once a live row was probed or written there, so holding the
 * relation open for the rest of the call changes nothing for anyone else
 * (no index can be made or dropped on it meanwhile but a concurrent build,
 * which waits for this transaction before it takes entries).
 */
static bool
IdemOpenCacheLookup(IdemOpenCache *cache, IdemLedger ledger,
					const pg_uuid_t *digest, TimestampTz now,
					LOCKMODE lockmode, IdemOpenPartition **open, int *nopen)
{
	IdemOpenCacheEntry *entry;
	IdemPartition *parts;
	MemoryContext oldcxt;
	uint64		generation;
	int			n;
	int			i;
	int			e;

	/* the list may rebuild the ledger cache: read the generation after it */
	n = IdemLivePartitionsForKey(ledger, digest, now, &parts);
	generation = IdemPartitionsGeneration();
	if (cache->generation != generation)
	{
		IdemOpenCacheClose(cache);
		cache->generation = generation;
	}

	for (i = 0; i < n; i++)
	{
		if (parts[i].ended)
		{
			pfree(parts);
			return false;
		}
	}

	for (e = 0; e < cache->nentries; e++)
	{
		entry = &cache->entries[e];
		if (entry->nopen != n)
			continue;
		for (i = 0; i < n; i++)
			if (entry->open[i].part.relid != parts[i].relid)
				break;
		if (i == n)
		{
			pfree(parts);
			*open = entry->open;
			*nopen = n;
			return true;
		}
	}
	if (cache->nentries == IDEM_OPEN_CACHE_ENTRIES)
	{
		pfree(parts);
		return false;
	}

	for (i = 0; i < n; i++)
		LockRelationOid(parts[i].relid, lockmode);
	if (generation != IdemPartitionsGeneration())
	{
		/* the set changed under the locks (kept): start from the catalog */
		pfree(parts);
		return false;
	}

	oldcxt = MemoryContextSwitchTo(cache->cxt);
	entry = &cache->entries[cache->nentries];
	entry->open = palloc(Max(n, 1) * sizeof(IdemOpenPartition));
	entry->nopen = 0;
	cache->nentries++;
	for (i = 0; i < n; i++)
	{
		IdemOpenPartitionRels(&entry->open[i], ledger, &parts[i], lockmode, true);
		entry->nopen++;
	}
	MemoryContextSwitchTo(oldcxt);
	pfree(parts);

	/*
	 * Opening the indexes may have accepted invalidations (a partition made
	 * or dropped meanwhile): then this entry is not kept, and the caller
	 * starts from the catalog.
	 */
	if (generation != IdemPartitionsGeneration())
	{
		cache->nentries--;
		IdemClosePartitions(entry->open, entry->nopen);
		return false;
	}
	*open = entry->open;
	*nopen = n;
	return true;
}

/*
 * IdemProbe looks for a live row of (role, digest) in the open partitions,
 * through each one's digest index: on (role, digest), so that the scan
 * never reads an entry or a row of another role (whose counters every role
 * can read in pg_stat_all_indexes: doc/security.md, "Who holds what"), or
 * in a partition made before 0.4.0 and not rebuilt yet, on (digest), the
 * role then checked on each row.  A partition whose digest filter rules
 * the role's key out is skipped.
 * A row is live until its expiry has passed and the transaction that wrote
 * it has ended: a row written by a transaction in progress (this one or
 * another) is never treated as expired, so a ttl shorter than the writer's
 * transaction cannot let a second caller in before the first has ended.
 *
 * With no snapshot given, it uses a dirty snapshot, which also sees rows of
 * transactions in progress: a row that another transaction is inserting,
 * updating or deleting is reported BUSY with that transaction in xwait.
 * Writers probe that way, holding the key lock.
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
		  const IdemDigest *digest, TimestampTz now, bool want_tuple,
		  Snapshot snapshot, IdemProbeResult *result)
{
	TupleTableSlot *slot = NULL;
	int			i;

	result->found = IDEM_FOUND_NONE;
	result->xwait = InvalidTransactionId;
	result->which = -1;
	result->tuple = NULL;
	result->remembered = false;
	ItemPointerSetInvalid(&result->tid);

	for (i = 0; i < nopen && result->found == IDEM_FOUND_NONE; i++)
	{
		SnapshotData dirty;
		IndexScanDesc scan;
		ScanKeyData skeys[2];
		int			nkeys = 0;
		pg_uuid_t	legacy;

		/* no row of this role and digest was ever written there (filter.h) */
		if (IdemFilterRulesOut(open[i].part.relid, open[i].part.lane, role,
							   &digest->uuid))
			continue;
		if (slot == NULL)
			slot = table_slot_create(open[i].heap, NULL);

		/* legacy partitions hold the key's digest in its legacy form */
		InitDirtySnapshot(dirty);
		if (IdemLaneIsLegacy(open[i].part.lane))
			IdemLegacyDigest(digest, &legacy);
		if (open[i].index_by_role)
			ScanKeyInit(&skeys[nkeys++], 1, BTEqualStrategyNumber, F_OIDEQ,
						ObjectIdGetDatum(role));
		ScanKeyInit(&skeys[nkeys], nkeys + 1, BTEqualStrategyNumber, F_UUID_EQ,
					UUIDPGetDatum(IdemLaneIsLegacy(open[i].part.lane) ?
								  &legacy : &digest->uuid));
		nkeys++;
		scan = IdemIndexBeginScan(open[i].heap, open[i].index,
								  snapshot != NULL ? snapshot : &dirty, nkeys);
		index_rescan(scan, skeys, nkeys, NULL, 0);

		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			bool		expired;
			TransactionId xmin;

			/* (the index's own key, but for a (digest) index) */
			if (DatumGetObjectId(slot_getattr(slot, Anum_ledger_role, &isnull)) != role)
				continue;
			expired = DatumGetTimestampTz(slot_getattr(slot, Anum_ledger_expires_at,
													   &isnull)) <= now;

			/* a dirty snapshot does not report our own changes in xmin */
			xmin = DatumGetTransactionId(slot_getsysattr(slot,
														 MinTransactionIdAttributeNumber,
														 &isnull));
			if (TransactionIdIsCurrentTransactionId(xmin))
				result->found = IDEM_FOUND_MINE;
			else if (snapshot == NULL && TransactionIdIsValid(dirty.xmin))
			{
				/* being written: live until its writer ends, expired or not */
				result->found = IDEM_FOUND_BUSY;
				result->xwait = dirty.xmin;
			}
			else if (expired)
			{
				/* committed and expired: as if absent, unless remembered */
				result->remembered |= IdemMemoryRowRemembered(slot, &open[i].part,
															   now);
				continue;
			}
			else if (snapshot != NULL)
				result->found = IDEM_FOUND_DONE;
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
 * IdemOpMakeTarget makes the partition a new row of the operation's key
 * expiring at op->expires_at goes to (as IdemOpFindTarget chose it), unless
 * it exists by now: by a partition maker worker, which commits it at once,
 * or if none can be used, in the caller's transaction.
 *
 * The caller must not hold its key lock here, unless this transaction holds
 * DDL locks on the ledger already (IdemPartitionDDLHeld): the worker may
 * wait for a transaction that made a partition and now waits for that key,
 * and that cycle would be invisible to the deadlock detector.  Without DDL
 * locks of its own, IdemOpRun releases the key lock, has the partition
 * made, and starts over.
 */
static void
IdemOpMakeTarget(IdemOp *op)
{
	IdemPartition target;
	int			lane_number = IdemLaneNumber(op->lane);

	AcceptInvalidationMessages();
	if (IdemPartitionFor(op->ledger, &op->digest.uuid, op->lane, op->far,
						 op->expires_at, &target))
		return;
	IdemCheckPartitionMadeHere(op->ledger);
	if (!IdemWorkerMakePartition(op->ledger, &op->layout, lane_number, op->far,
								 op->expires_at))
		(void) IdemCreatePartition(op->ledger, &op->layout, lane_number,
								   op->far, op->expires_at);
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
 * IdemMustKeepKeyLock: must a row written into this partition keep its key
 * lock until the transaction ends?  Yes if this transaction made the
 * partition (nobody else sees it, or the row, before the commit), unless
 * it made the ledger's table too: every other writer of the ledger then
 * waits for the ledger's creation lock, which this transaction holds to
 * its end (see IdemLedgerParent), and sees the rows once it has it.  So
 * the first call in a new database, which makes the ledger, may write any
 * number of keys.
 */
static bool
IdemMustKeepKeyLock(Relation partition)
{
	Oid			parentid;
	Relation	parent;
	bool		parent_is_new;

	if (partition->rd_createSubid == InvalidSubTransactionId)
		return false;
	parentid = get_partition_parent(RelationGetRelid(partition), false);
	parent = RelationIdGetRelation(parentid);	/* locked: we made it */
	parent_is_new = RelationIsValid(parent) &&
		parent->rd_createSubid != InvalidSubTransactionId;
	if (RelationIsValid(parent))
		RelationClose(parent);
	return !parent_is_new;
}

/*
 * IdemInsertRow inserts a row into open partition "op", which the caller
 * has checked covers its (lane, expires_at), and its entries into every
 * index of the partition, and sets *newtid (if not NULL) to where the row
 * went.  Returns true if the partition was made by this transaction, in
 * which case the caller must keep the key lock until the transaction ends.
 */
bool
IdemInsertRow(IdemOpenPartition *op, Datum *values, bool *nulls,
			  ItemPointer newtid)
{
	HeapTuple	tuple;
	bool		keeps_key_lock = IdemMustKeepKeyLock(op->heap);
	int			natts = RelationGetDescr(op->heap)->natts;
	Datum		with_tenant[IDEM_LEDGER_MAX_NATTS];
	bool		with_tenant_nulls[IDEM_LEDGER_MAX_NATTS];

	/*
	 * A partition of a ledger distributed by Citus: the row's tenant, its
	 * distribution column, is the one the call was routed by (citus.c).
	 * A write that was not routed (an import) cannot tell it.
	 */
	if (natts == IdemTenantAttnum(IDEM_LEDGER_KEYS) ||
		natts == IdemTenantAttnum(IDEM_LEDGER_MESSAGES))
	{
		IdemLedger	ledger = natts == IdemTenantAttnum(IDEM_LEDGER_KEYS) ?
			IDEM_LEDGER_KEYS : IDEM_LEDGER_MESSAGES;

		memcpy(with_tenant, values, (natts - 1) * sizeof(Datum));
		memcpy(with_tenant_nulls, nulls, (natts - 1) * sizeof(bool));
		if (!IdemCitusCallTenant(ledger, &with_tenant[natts - 1]))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot write into ledger \"%s.%s\" without a tenant",
							IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
					 errdetail("The ledger is distributed by Citus: each row is written to the shard of its tenant."),
					 errhint("Move rows into the ledger before idempotency.citus_distribute(), not after.")));
		with_tenant_nulls[natts - 1] = false;
		values = with_tenant;
		nulls = with_tenant_nulls;
	}

	if (keeps_key_lock)
		IdemCountKeptKeyLock();
	tuple = heap_form_tuple(RelationGetDescr(op->heap), values, nulls);
	simple_heap_insert(op->heap, tuple);
	IdemInsertIndexEntries(op, tuple, IDEM_INDEX_UPDATE_ALL);
	/* after the inserts, before the key lock goes (see filter.h) */
	IdemFilterAdd(op->part.relid, op->part.lane,
				  DatumGetObjectId(values[Anum_ledger_role - 1]),
				  DatumGetUUIDP(values[Anum_ledger_digest - 1]));
	if (newtid != NULL)
		*newtid = tuple->t_self;
	heap_freetuple(tuple);
	IdemNoteWrite();

	return keeps_key_lock;
}

/* the transaction whose kept key locks kept_key_locks counts */
static TransactionId kept_key_locks_xid = InvalidTransactionId;
static int	kept_key_locks = 0;

/*
 * IdemCountKeptKeyLock counts, before the write, a key lock this
 * transaction is about to keep until it ends, because it writes the key's
 * row into a partition it made itself; and refuses the write if the
 * transaction keeps max_locks_per_transaction of them already.  Each kept
 * lock takes an entry of the lock table every backend shares: without a
 * bound, one transaction writing a million keys (a backfill, in a database
 * where no partition maker worker could be started) would fill the table,
 * and every other session's next lock would fail.  Only this transaction
 * fails instead, before it has written the row.  (A lock kept by a
 * subtransaction that rolled back is still counted: the count errs on the
 * safe side.)
 */
void
IdemCountKeptKeyLock(void)
{
	TransactionId xid = GetTopTransactionId();

	if (!TransactionIdEquals(xid, kept_key_locks_xid))
	{
		kept_key_locks_xid = xid;
		kept_key_locks = 0;
	}
	if (kept_key_locks >= max_locks_per_xact)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("too many keys written into partitions made by this transaction"),
				 errdetail("Each such key holds a lock until the transaction ends, and this transaction holds %d, the limit set by \"%s\".",
						   kept_key_locks, "max_locks_per_transaction"),
				 errhint("Have the partitions made first (run idem_maintain() in a transaction of its own), or write the keys in smaller transactions.")));
	kept_key_locks++;
}

/*
 * IdemUpdateRow replaces row "tid" of open partition "op" by newtuple, which
 * keeps the digest and expiry of the old one (so the row never moves to
 * another partition), with the index entries the new version needs.  The
 * caller holds the key lock and has checked that no other transaction is
 * changing the row.  Returns true if the partition was made by this
 * transaction, as IdemInsertRow does.
 */
bool
IdemUpdateRow(IdemOpenPartition *op, ItemPointer tid, HeapTuple newtuple)
{
	IdemIndexUpdate which;

	/* refused as an UPDATE is without a replica identity (relation_checks.c) */
	IdemCheckDirectWrite(op->heap, CMD_UPDATE);
	IdemSeeOwnWrites();
	which = IdemSimpleHeapUpdate(op->heap, tid, newtuple);
	IdemNoteWrite();
	IdemInsertIndexEntries(op, newtuple, which);
	return IdemMustKeepKeyLock(op->heap);
}

/* ----------------------------------------------------------------
 * One operation on one key: the protocol's steps
 * ----------------------------------------------------------------
 */

/*
 * IdemOpInit prepares an operation on the key (or message id) with this
 * digest, of role "role", in a ledger: its key lock's tag and the clock.
 * Nothing is locked or opened yet.
 */
void
IdemOpInit(IdemOp *op, IdemLedger ledger, Oid role, const IdemDigest *digest)
{
	op->ledger = ledger;
	op->role = role;
	op->digest = *digest;
	op->keyed_tag = IdemSetKeyLockTag(&op->keytag, ledger, role, &digest->uuid);
	op->layout.lanes = 0;		/* computed when a row is to be written */
	op->far = false;
	op->now = GetCurrentTimestamp();
	op->expires_at = 0;
	op->key_locked = false;
	op->keep_key_lock = false;
	op->nopen = 0;
	op->capacity = 0;
	op->lockmode = NoLock;
	op->open = NULL;
	op->cache = NULL;
	op->cached = false;
	op->target = -1;
	op->probe.found = IDEM_FOUND_NONE;
	op->probe.tuple = NULL;
	op->wait_until = 0;
	op->poll_ms = 0;
}

/*
 * IdemOpRun runs the protocol to an answer: take the key lock (or, with
 * nowait, try to), probe every partition the key's live row can be in,
 * and let "step" decide what to answer or write, given what was found.
 * When the step finds a row that another transaction is writing
 * (IDEM_STEP_WAIT), the operation waits for that transaction to end; when
 * the partition its new row belongs in is missing (IDEM_STEP_MAKE_TARGET),
 * it has that partition made (IdemOpMakeTarget); either way it then starts over, with the
 * clock read again.  The step is called with the key lock held (unless
 * nowait was refused it, see op->key_locked) and the partitions open;
 * they are released when it has answered, the key lock kept to the end of
 * the transaction if the step wrote into a partition this transaction made
 * (see IdemOpInsert).
 */
void
IdemOpRun(IdemOp *op, bool nowait, IdemStepFunc step, void *arg)
{
	for (;;)
	{
		IdemStep	next;

		CHECK_FOR_INTERRUPTS();
		(void) IdemOpLock(op, nowait);
		IdemOpProbe(op, RowExclusiveLock, NULL);
		next = step(op, arg);
		if (next == IDEM_STEP_DONE)
		{
			IdemOpEnd(op);
			return;
		}
		if (next == IDEM_STEP_WAIT)
		{
			TransactionId xwait = op->probe.xwait;

			IdemOpEnd(op);
			XactLockTableWait(xwait, NULL, NULL, XLTW_None);
		}
		else if (next == IDEM_STEP_WAIT_HOLDER)
		{
			/* read while the holder cannot change the row (see wait.c) */
			uint64		seen = IdemWaitSeen(&op->keytag);

			Assert(!op->keep_key_lock);
			IdemOpEnd(op);
			IdemWaitForHolder(&op->keytag, seen, op->wait_until, &op->poll_ms);
		}
		else
		{
			/*
			 * The key lock goes before the partition is made, unless this
			 * transaction holds DDL locks on the ledger already (see
			 * IdemOpMakeTarget).
			 */
			op->keep_key_lock |= IdemPartitionDDLHeld(op->ledger);
			IdemOpEnd(op);
			IdemOpMakeTarget(op);
		}
		op->now = GetCurrentTimestamp();
	}
}

/*
 * IdemOpLock takes the key lock; with nowait, returns false instead of
 * waiting if another transaction holds it.
 */
bool
IdemOpLock(IdemOp *op, bool nowait)
{
	op->key_locked = LockAcquire(&op->keytag, ExclusiveLock, false, nowait) !=
		LOCKACQUIRE_NOT_AVAIL;
	return op->key_locked;
}

/*
 * IdemOpProbe opens, in the given lock mode, every partition the key's live
 * row can be in, and probes them with the given MVCC snapshot or, if none,
 * a dirty one (see IdemProbe()).  The row found, if any, is deformed into
 * op->values/op->nulls (in the key ledger, whose callers read it).
 * Partitions committed before the key lock was taken are seen.
 *
 * The key lock's form may have changed since the operation computed it:
 * an ALTER EXTENSION UPDATE to 0.4.0 that committed while this call waited
 * for its locks on the partitions makes every call that starts now take
 * the keyed form (lock_secret.c).  Once the partitions are locked (the
 * update waits for whoever has them locked, and whoever waited for the
 * update has now seen it commit), the form is checked again, and the lock
 * of the current form taken before the probe, so that two calls on one key
 * never probe under locks of different forms.
 */
void
IdemOpProbe(IdemOp *op, LOCKMODE lockmode, Snapshot snapshot)
{
	for (;;)
	{
		AcceptInvalidationMessages();
		op->cached = op->cache != NULL && snapshot == NULL &&
			IdemOpenCacheLookup(op->cache, op->ledger, &op->digest.uuid,
								op->now, lockmode, &op->open, &op->nopen);
		if (!op->cached)
			op->nopen = IdemOpenLivePartitions(op->ledger, op->role,
											   &op->digest.uuid, op->now,
											   lockmode, &op->open,
											   &op->capacity);
		else
			op->capacity = op->nopen;
		if (likely(IdemKeyedLockTags() == op->keyed_tag))
			break;
		IdemOpRetag(op);
	}
	op->lockmode = lockmode;
	op->target = -1;
	IdemProbe(op->open, op->nopen, op->role, &op->digest, op->now,
			  op->ledger == IDEM_LEDGER_KEYS, snapshot, &op->probe);
	if (op->probe.tuple != NULL)
		IdemOpDeform(op, RelationGetDescr(op->open[op->probe.which].heap));
	/* no live row: is the key remembered? (memory.c) */
	IdemMemoryProbe(op);
}

/*
 * IdemOpRetag closes the partitions IdemOpProbe opened and gives the
 * operation the key lock of the form now in force: the old one goes
 * (unless the operation keeps it to the transaction's end), and if the
 * operation held it, the new one is taken, waiting for it if need be.
 */
static void
IdemOpRetag(IdemOp *op)
{
	bool		locked = op->key_locked;

	if (op->nopen > 0 && !op->cached)
		IdemClosePartitions(op->open, op->nopen);
	op->nopen = 0;
	op->open = NULL;
	op->cached = false;
	if (locked && !op->keep_key_lock)
		LockRelease(&op->keytag, ExclusiveLock, false);
	op->keyed_tag = IdemSetKeyLockTag(&op->keytag, op->ledger, op->role,
									  &op->digest.uuid);
	if (locked)
		(void) LockAcquire(&op->keytag, ExclusiveLock, false, false);
}

/*
 * IdemOpDeform deforms the row found into op->values/op->nulls; columns a
 * key ledger made before 0.4.0 does not have are NULL.
 */
static void
IdemOpDeform(IdemOp *op, TupleDesc tupdesc)
{
	int			i;

	heap_deform_tuple(op->probe.tuple, tupdesc, op->values, op->nulls);
	for (i = tupdesc->natts; i < IDEM_LEDGER_MAX_NATTS; i++)
		op->nulls[i] = true;
}

/*
 * IdemOpFetchOwn reads the current version of a row this transaction
 * wrote, at "tid" in partition "part", into op as if a probe had found it
 * (MINE), without a probe: no other transaction changes a row whose writer
 * is still in progress.  Returns false, with nothing open, if the row is
 * not there any more (its version was undone); the caller probes instead.
 */
bool
IdemOpFetchOwn(IdemOp *op, const IdemPartition *part, ItemPointer tid)
{
	HeapTupleData tuple;
	Buffer		buffer;
	Relation	heap;
	bool		isnull;

	if (!OidIsValid(part->relid))
		return false;

	LockRelationOid(part->relid, RowExclusiveLock);
	op->open = palloc(sizeof(IdemOpenPartition));
	IdemOpenPartitionRels(&op->open[0], op->ledger, part, RowExclusiveLock,
						  false);
	op->nopen = 1;
	op->capacity = 1;
	op->lockmode = RowExclusiveLock;
	op->target = -1;
	heap = op->open[0].heap;
	tuple.t_self = *tid;
	if (!heap_fetch(heap, SnapshotSelf, &tuple, &buffer, false))
	{
		IdemClosePartitions(op->open, op->nopen);
		op->nopen = 0;
		return false;
	}
	op->probe.tuple = heap_copytuple(&tuple);
	ReleaseBuffer(buffer);

	if (!TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(op->probe.tuple->t_data)) ||
		DatumGetObjectId(heap_getattr(op->probe.tuple, Anum_ledger_role,
									  RelationGetDescr(heap), &isnull)) != op->role)
	{
		IdemClosePartitions(op->open, op->nopen);
		op->nopen = 0;
		return false;
	}

	op->probe.found = IDEM_FOUND_MINE;
	op->probe.xwait = InvalidTransactionId;
	op->probe.which = 0;
	op->probe.tid = *tid;
	IdemOpDeform(op, RelationGetDescr(heap));
	return true;
}

/*
 * IdemOpFindTarget finds, among the open partitions, the one a new row
 * expiring at op->expires_at, written at op->now, goes to (see
 * IdemPartitionFor), and sets op->target to it.  The target is live and in
 * one of the key's lanes, so it is open if it exists, unless its digest
 * filter ruled the key out: then it is locked and opened here.  Returns
 * false if it is not there (the caller's step answers
 * IDEM_STEP_MAKE_TARGET; if it was made meanwhile, the step runs again).
 */
bool
IdemOpFindTarget(IdemOp *op)
{
	IdemPartition target;
	int			i;

	op->target = -1;
	if (op->layout.lanes == 0)
	{
		IdemCurrentLayout(op->ledger, &op->layout);
		op->lane = IdemLaneValue(&op->digest.uuid, op->layout.lanes, false);
	}
	op->far = IdemTargetIsFar(op->ledger, &op->layout, op->now, op->expires_at);
	if (!IdemPartitionFor(op->ledger, &op->digest.uuid, op->lane, op->far,
						  op->expires_at, &target))
		return false;
	for (i = 0; i < op->nopen; i++)
	{
		if (op->open[i].part.relid == target.relid)
		{
			op->target = i;
			return true;
		}
	}

	/*
	 * Left closed by the filter: open it now, if it is still the target
	 * once locked (locking accepts invalidations: it may have been dropped
	 * and made again meanwhile; comparing the caches' generation instead
	 * would never succeed under debug_discard_caches, where every lock
	 * discards them), and the key lock still of the form in force (the
	 * probe locked no partition, so an update may have committed since it
	 * checked, see IdemOpProbe: the caller starts over, and the probe takes
	 * the lock of the new form).
	 */
	if (op->nopen < op->capacity && !op->cached)
	{
		IdemPartition again;

		LockRelationOid(target.relid, op->lockmode);
		if (IdemKeyedLockTags() == op->keyed_tag &&
			IdemPartitionFor(op->ledger, &op->digest.uuid, op->lane, op->far,
							 op->expires_at, &again) &&
			again.relid == target.relid)
		{
			again.ended = false;
			IdemOpenPartitionRels(&op->open[op->nopen], op->ledger, &again,
								  op->lockmode, false);
			op->target = op->nopen++;
			return true;
		}
	}
	return false;
}

/*
 * IdemOpInsert inserts a new row into the target partition (IdemOpFindTarget):
 * op->values/op->nulls, with its expiry (op->expires_at), digest, role and
 * lane filled in here, and sets *newtid (if not NULL) to where it went.
 */
void
IdemOpInsert(IdemOp *op, ItemPointer newtid)
{
	IdemOpenPartition *target = &op->open[op->target];

	Assert(op->target >= 0);
	op->values[Anum_ledger_expires_at - 1] = TimestampTzGetDatum(op->expires_at);
	op->values[Anum_ledger_digest - 1] = UUIDPGetDatum(&op->digest.uuid);
	op->values[Anum_ledger_role - 1] = ObjectIdGetDatum(op->role);
	op->values[Anum_ledger_lane - 1] = Int16GetDatum(target->part.lane);
	op->nulls[Anum_ledger_expires_at - 1] = false;
	op->nulls[Anum_ledger_digest - 1] = false;
	op->nulls[Anum_ledger_role - 1] = false;
	op->nulls[Anum_ledger_lane - 1] = false;
	if (IdemInsertRow(target, op->values, op->nulls, newtid))
		op->keep_key_lock = true;
}

/*
 * IdemOpReplace writes a new version of the key in place of the row the
 * probe found: that row goes, and the new one (op->values, as for
 * IdemOpInsert) goes to the target partition, that of its expiry.
 * Concurrent probes see both as being written by this transaction until it
 * ends.
 */
void
IdemOpReplace(IdemOp *op, ItemPointer newtid)
{
	IdemOpenPartition *found = &op->open[op->probe.which];

	/* refused as a DELETE is without a replica identity (relation_checks.c) */
	IdemCheckDirectWrite(found->heap, CMD_DELETE);
	IdemSeeOwnWrites();
	simple_heap_delete(found->heap, &op->probe.tid);
	if (IdemMustKeepKeyLock(found->heap))
		op->keep_key_lock = true;
	IdemOpInsert(op, newtid);
}

/*
 * IdemOpUpdate updates the row the probe found, in place, to op->values
 * (same digest and expiry, so same partition), and sets *newtid (if not
 * NULL) to where the new version went.
 */
void
IdemOpUpdate(IdemOp *op, ItemPointer newtid)
{
	IdemOpenPartition *found = &op->open[op->probe.which];
	HeapTuple	newtuple = heap_form_tuple(RelationGetDescr(found->heap),
										   op->values, op->nulls);

	if (IdemUpdateRow(found, &op->probe.tid, newtuple))
		op->keep_key_lock = true;
	if (newtid != NULL)
		*newtid = newtuple->t_self;
	heap_freetuple(newtuple);
}

/*
 * IdemOpEnd closes the partitions and releases the key lock, unless the
 * operation wrote into a partition this transaction made (whose rows
 * nobody else sees until it commits), when the lock is kept until the
 * transaction ends.
 */
void
IdemOpEnd(IdemOp *op)
{
	if (op->nopen > 0 && !op->cached)
		IdemClosePartitions(op->open, op->nopen);
	op->nopen = 0;
	op->open = NULL;			/* the call's memory, or the cache's */
	op->cached = false;
	if (op->key_locked && !op->keep_key_lock)
		LockRelease(&op->keytag, ExclusiveLock, false);
	op->key_locked = false;
}

/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  The dedup protocol: the key lock, the dirty probe of the partitions a
 *	  key's live row can be in, and the insert (probe.c), with the indexes
 *	  of those partitions (indexes.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/protocol.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_PROTOCOL_H
#define IDEMPOTENCY_PROTOCOL_H

#include "idempotency.h"
#include "compat.h"
#include "storage.h"

#include "access/htup.h"
#include "storage/itemptr.h"
#include "storage/lock.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"

/* Indexes of an open partition kept in IdemOpenPartition itself */
#define IDEM_INLINE_INDEXES			2

/*
 * An open partition: its heap and its indexes (indexes.c).  The digest
 * index is opened with the partition; the others only when a write needs
 * their entries (IdemOpenAllIndexes), in the order of index_oids.
 */
typedef struct IdemOpenPartition
{
	IdemPartition part;			/* part.ended: locked only while open */
	Relation	heap;
	Relation	index;			/* the digest index probes use */
	bool		index_by_role;	/* ... on (role, digest), not (digest) */
	int			nindexes;		/* every index, the digest one among them */
	int			nopened;		/* indexes[0 .. nopened) are open */
	bool		all_open;		/* ... all of them, and simple is known */
	LOCKMODE	index_lockmode;
	Oid		   *index_oids;		/* of every index, in OID order */
	Relation   *indexes;
	struct IndexInfo **infos;	/* of each index, built on first insert */
	MemoryContext cxt;			/* where the partition was opened: infos and
								 * index arrays live there, as long as it */
	bool		simple;			/* every index takes plain column values
								 * (known once all are open) */
	Oid			inline_oids[IDEM_INLINE_INDEXES];
	Relation	inline_indexes[IDEM_INLINE_INDEXES];
	struct IndexInfo *inline_infos[IDEM_INLINE_INDEXES];
} IdemOpenPartition;

/* What a probe found */
typedef enum IdemFound
{
	IDEM_FOUND_NONE,			/* no live row */
	IDEM_FOUND_MINE,			/* live row written by this transaction */
	IDEM_FOUND_DONE,			/* live row committed by another transaction */
	IDEM_FOUND_BUSY				/* live row another transaction is writing */
} IdemFound;

typedef struct IdemProbeResult
{
	IdemFound	found;
	TransactionId xwait;		/* for BUSY: the transaction to wait for */
	int			which;			/* index of the partition among those open */
	ItemPointerData tid;		/* the row */
	HeapTuple	tuple;			/* copy of the row, if asked for */
	bool		remembered;		/* with no live row: the key expired and is
								 * remembered (memory.c) */
} IdemProbeResult;

/*
 * The partitions one call that writes many rows (a batch) keeps open across
 * its ids: entries of the same partition set are reused while the ledger
 * caches' generation is unchanged and none of the partitions has ended
 * (see IdemOpenCacheLookup).  Memory and relations stay until
 * IdemOpenCacheEnd.
 */
#define IDEM_OPEN_CACHE_ENTRIES 16

typedef struct IdemOpenCacheEntry
{
	int			nopen;
	IdemOpenPartition *open;
} IdemOpenCacheEntry;

typedef struct IdemOpenCache
{
	MemoryContext cxt;			/* holds the entries and their index state */
	uint64		generation;		/* IdemPartitionsGeneration() they match */
	int			nentries;
	IdemOpenCacheEntry entries[IDEM_OPEN_CACHE_ENTRIES];
} IdemOpenCache;

/*
 * One operation on one key (or message id) of one ledger, through the
 * protocol of probe.c: the key lock, the partitions the key's live row can
 * be in, what the probe found there, and the row to write.
 */
typedef struct IdemOp
{
	IdemLedger	ledger;
	Oid			role;
	IdemDigest	digest;
	LOCKTAG		keytag;			/* the key lock (IdemSetKeyLockTag) */
	bool		keyed_tag;		/* ... in the keyed form (lock_secret.c) */
	IdemLayout	layout;			/* of new partitions (IdemOpFindTarget) */
	int16		lane;			/* the digest's lane under that layout */
	bool		far;			/* a new row goes to a far partition */
	TimestampTz now;			/* the clock; read again after every wait */
	TimestampTz expires_at;		/* of the row to write: set by the step */
	bool		key_locked;		/* holds the key lock now */
	bool		keep_key_lock;	/* ... until the transaction ends */
	int			nopen;
	int			capacity;		/* open has room for this many */
	LOCKMODE	lockmode;		/* in which the partitions are open */
	IdemOpenPartition *open;	/* palloc'd by the probe, or the cache's */
	IdemOpenCache *cache;		/* of a batch, or NULL */
	bool		cached;			/* open is the cache's: not closed at the end */
	int			target;			/* the open partition a new row goes to */
	IdemProbeResult probe;		/* what the probe found */
	TimestampTz wait_until;		/* for IDEM_STEP_WAIT_HOLDER: set by the step */
	int			poll_ms;		/* ... its polling interval without preload */
	Datum		values[IDEM_LEDGER_MAX_NATTS];	/* the row found, then the
												 * row written */
	bool		nulls[IDEM_LEDGER_MAX_NATTS];
} IdemOp;

/* What a step of an operation decided (see IdemOpRun) */
typedef enum IdemStep
{
	IDEM_STEP_DONE,				/* answered (and written, if it writes) */
	IDEM_STEP_WAIT,				/* wait for the row's writer, start over */
	IDEM_STEP_MAKE_TARGET,		/* have the new row's partition made, start
								 * over */
	IDEM_STEP_WAIT_HOLDER		/* wait for the holder of a committed
								 * two-phase claim to finish, up to
								 * op->wait_until, start over */
} IdemStep;

typedef IdemStep (*IdemStepFunc) (IdemOp *op, void *arg);

extern void IdemOpInit(IdemOp *op, IdemLedger ledger, Oid role,
					   const IdemDigest *digest);
extern void IdemOpRun(IdemOp *op, bool nowait, IdemStepFunc step, void *arg);
extern bool IdemOpLock(IdemOp *op, bool nowait);
extern void IdemOpProbe(IdemOp *op, LOCKMODE lockmode, Snapshot snapshot);
extern bool IdemOpFetchOwn(IdemOp *op, const IdemPartition *part,
						   ItemPointer tid);
extern bool IdemOpFindTarget(IdemOp *op);
extern void IdemOpInsert(IdemOp *op, ItemPointer newtid);
extern void IdemOpReplace(IdemOp *op, ItemPointer newtid);
extern void IdemOpUpdate(IdemOp *op, ItemPointer newtid);
extern void IdemOpEnd(IdemOp *op);

extern int	IdemOpenLivePartitions(IdemLedger ledger, Oid role,
								   const pg_uuid_t *digest, TimestampTz now,
								   LOCKMODE lockmode, IdemOpenPartition **open,
								   int *capacity);
extern void IdemOpenPartitionRels(IdemOpenPartition *op, IdemLedger ledger,
								  const IdemPartition *part, LOCKMODE lockmode,
								  bool probe);
extern void IdemClosePartitions(IdemOpenPartition *open, int nopen);
extern void IdemOpenCacheInit(IdemOpenCache *cache);
extern void IdemOpenCacheEnd(IdemOpenCache *cache);
extern void IdemProbe(IdemOpenPartition *open, int nopen, Oid role,
					  const IdemDigest *digest, TimestampTz now,
					  bool want_tuple, Snapshot snapshot,
					  IdemProbeResult *result);
extern bool IdemInsertRow(IdemOpenPartition *op, Datum *values, bool *nulls,
						  ItemPointer newtid);
extern void IdemCountKeptKeyLock(void);
extern bool IdemUpdateRow(IdemOpenPartition *op, ItemPointer tid,
						  HeapTuple newtuple);
extern void IdemSeeOwnWrites(void);

/* Indexes of the partitions (indexes.c) */
extern void IdemOpenPartitionIndexes(IdemOpenPartition *op, LOCKMODE lockmode,
									 bool find_digest);
extern void IdemClosePartitionIndexes(IdemOpenPartition *op);
extern void IdemInsertIndexEntries(IdemOpenPartition *op, HeapTuple tuple,
								   IdemIndexUpdate which);
extern Relation IdemRecoverIndex(IdemOpenPartition *op);
extern void IdemOpenAllIndexes(IdemOpenPartition *op);

#endif							/* IDEMPOTENCY_PROTOCOL_H */

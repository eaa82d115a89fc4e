/*-------------------------------------------------------------------------
 *
 * filter_internal.h
 *	  What the files of the digest filters share, and no other file uses:
 *	  the layout of the pool in shared memory (filter_pool.c), the calls
 *	  building (filter_build.c) and the hooks (filter_hooks.c) make into
 *	  it, and what a filter holds of a row.  Other files call filter.h.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/filter_internal.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_FILTER_INTERNAL_H
#define IDEMPOTENCY_FILTER_INTERNAL_H

#include "idempotency.h"

#include "access/xlog.h"
#include "port/atomics.h"
#include "storage/lwlock.h"

/* pages of the pool, and digests a page holds at the designed load */
#define IDEM_FILTER_PAGE_BYTES		8192
#define IDEM_FILTER_BITS_PER_ITEM	10
#define IDEM_FILTER_PAGE_ITEMS \
	(IDEM_FILTER_PAGE_BYTES * 8 / IDEM_FILTER_BITS_PER_ITEM)
#define IDEM_FILTER_MAX_SEGMENTS	16
/* external writes are counted per database, in this many buckets */
#define IDEM_FILTER_DB_BUCKETS		64
/* databases that may hold filters at once (see IdemFilterDb) */
#define IDEM_FILTER_MAX_DBS			256
#define IdemFilterBucket(db)		((db) % IDEM_FILTER_DB_BUCKETS)

/* A slot's state, and a filter's */
typedef enum IdemFilterState
{
	IDEM_FILTER_FREE = 0,
	IDEM_FILTER_FILLING,		/* writers add, probes do not trust it yet */
	IDEM_FILTER_READY,			/* holds every digest of the partition */
	IDEM_FILTER_UNUSABLE		/* may miss some: not used, built again */
} IdemFilterState;

typedef struct IdemFilterSegment
{
	uint32		first_page;
	uint32		npages;			/* a power of two */
	uint32		capacity;		/* digests before the next segment */
	pg_atomic_uint32 count;		/* digests added (may overshoot a little) */
} IdemFilterSegment;

typedef struct IdemFilterSlot
{
	pg_atomic_uint64 incarnation;	/* changes when taken or freed */
	pg_atomic_uint32 state;		/* IdemFilterState */
	pg_atomic_uint32 nsegments; /* published after the segment is set up */
	Oid			db;				/* fixed while the slot is taken */
	Oid			relid;
	int16		dbent;			/* its database's IdemFilterDb */
	int16		lane;
	uint8		ledger;
	TimestampTz made_at;
	uint64		secret_id;		/* IdemLockSecretId() its items are keyed with */
	IdemFilterSegment seg[IDEM_FILTER_MAX_SEGMENTS];
} IdemFilterSlot;

/*
 * What one database holds of the pool, for the fair share (see
 * IdemFilterReclaim) and the log of a full pool.  Under the lock; an entry
 * is free (db InvalidOid) once its database holds no slot.
 */
typedef struct IdemFilterDb
{
	Oid			db;
	int32		slots;
	int32		pages;
	NameData	name;			/* as its backends knew it */
} IdemFilterDb;

typedef struct IdemFilterShared
{
	LWLock	   *lock;			/* slots' identity, page map, hash */
	int			nslots;
	int			npages;
	pg_atomic_uint64 generation;	/* bumped when a slot is taken or freed */
	pg_atomic_uint64 next_incarnation;
	/* per database (bucket): external writes started, and open
	 * transactions that ran one */
	pg_atomic_uint64 external_seq[IDEM_FILTER_DB_BUCKETS];
	pg_atomic_uint32 external_busy[IDEM_FILTER_DB_BUCKETS];
	/* when a full pool was last logged (IdemFilterReportFull) */
	pg_atomic_uint64 full_logged_at;
	int			nfree;
	IdemFilterDb dbs[IDEM_FILTER_MAX_DBS];
	/* followed by: int freelist[nslots], uint64 page_map[], slots[] */
} IdemFilterShared;

/* The pool (filter_pool.c): NULL without preload, or with filter_memory 0 */
extern IdemFilterShared *idem_filter_shared;
extern IdemFilterSlot *idem_filter_slots;

/* Slots of the pool (filter_pool.c) */
extern IdemFilterSlot *IdemFilterFind(Oid relid, uint64 *incarnation);
extern void IdemFilterPruneLocal(void);
extern void IdemFilterAddTo(IdemFilterSlot *slot, uint64 item);
extern int	IdemFilterTake(Oid relid, int16 lane, int ledger, uint64 hint,
						   uint64 secret_id, uint64 *incarnation);
extern bool IdemFilterKeyed(uint64 *secret_id);
extern uint64 IdemFilterItem(Oid role, const pg_uuid_t *digest,
							 uint64 secret_id);
extern bool IdemFilterFinish(int s, uint64 incarnation, uint64 seq);
extern void IdemFilterForgetSlots(Oid db, TimestampTz made_before,
								  const Oid *keep, int nkeep);
extern uint64 IdemFilterSizeHint(Oid db, int ledger, int16 lane);
extern void IdemFilterSweepUnusable(void);
extern int	IdemFilterDroppedRelids(const Oid **relids);
extern void IdemFilterAtXactEnd(bool committed);

/* External writes (filter_hooks.c) */
extern bool IdemFilterExternalBusy(uint64 *seq);

/* filters apply to current (not legacy) lanes, on a primary, when preloaded */
static inline bool
IdemFilterUsable(int16 lane)
{
	return idem_filter_shared != NULL && !IdemLaneIsLegacy(lane) &&
		!RecoveryInProgress();
}

/* MurmurHash3's 64-bit finalizer: every input bit moves every output bit */
static inline uint64
IdemFilterMix(uint64 x)
{
	x ^= x >> 33;
	x *= UINT64CONST(0xFF51AFD7ED558CCD);
	x ^= x >> 33;
	x *= UINT64CONST(0xC4CEB9FE1A85EC53);
	x ^= x >> 33;
	return x;
}

#endif							/* IDEMPOTENCY_FILTER_INTERNAL_H */

/*-------------------------------------------------------------------------
 *
 * filter_pool.c
 *	  The digest filters' pool in shared memory: its pages and slots, the
 *	  bits of each filter, the fair share of the databases, the calls of
 *	  the protocol (IdemFilterRulesOut, IdemFilterAdd), the freeing of
 *	  filters, idempotency.filter_memory and idempotency.filter_info().
 *
 * What a filter promises, and how that holds, is in filter.h; building
 * filters is in filter_build.c, the hooks that switch them off in
 * filter_hooks.c.
 *
 * Layout: a pool of 8 kB pages and a table of slots, one per filtered
 * partition, found by (database, relid) through a shared hash and, in each
 * backend, a local cache validated by the slot's incarnation, which
 * changes whenever a slot is taken or freed.  A filter is a list of
 * segments, each a power-of-two run of pages of 512-bit blocks: a row
 * sets 7 bits of one block (a blocked Bloom filter: one cache line per
 * test), chosen from 64 bits of SipHash-2-4 under the database's secret
 * (lock_secret.c) of its role's OID and bytes 4-15 of its digest
 * (IdemFilterDigestHash).  The role is in the bits so that whether a
 * role's probe skips a partition never depends on another role's rows:
 * with digests alone, a role's probe of a key it never wrote went to the
 * partition's index exactly when another role held that key, which every
 * role could see in pg_stat_all_indexes (doc/security.md, "Who holds
 * what").  The secret is in the bits so that no role can compute which
 * bits a key sets: with public functions of the role and the digest, a
 * role computed a key of its own with the bits of another role's key it
 * guessed, and its probe of that key went to the index exactly when the
 * other role held the guessed one.  A slot remembers the secret it was
 * made under (IdemLockSecretId): under another, it is no answer, and a
 * writer makes it UNUSABLE; before the update from 0.3.1, which makes the
 * secret, no filter is made.  OIDs and the secret are stable while the
 * filters live (shared memory, built from the heap's role column after a
 * restart).  When a segment has
 * taken its designed number of digests, the next one, twice as large, is
 * added; a lookup tests every segment.  When the pool has no room for a
 * segment, the filter becomes UNUSABLE.  Bits are set with atomic ORs and
 * never cleared; a partition's filter is freed when maintenance drops the
 * partition, or when the worker finds it gone.
 *
 * The pool is shared fairly by the databases (IdemFilterReclaim): one alone
 * may take all of it; when there is no room, a database holding less than
 * its share (the pool's pages divided by the databases holding filters)
 * frees the largest filter of the database holding the most, while that
 * one holds more than its share.  What each database holds is counted in
 * a table of IDEM_FILTER_MAX_DBS entries, with its name for the log.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/filter_pool.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "filter.h"
#include "filter_internal.h"
#include "keyhash.h"
#include "lock_secret.h"

#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#define IDEM_FILTER_BLOCK_BITS		512
#define IDEM_FILTER_BLOCK_WORDS		(IDEM_FILTER_BLOCK_BITS / 32)
#define IDEM_FILTER_PAGE_BLOCKS		(IDEM_FILTER_PAGE_BYTES * 8 / IDEM_FILTER_BLOCK_BITS)
#define IDEM_FILTER_PAGE_WORDS		(IDEM_FILTER_PAGE_BYTES / 4)
/* bits set per digest */
#define IDEM_FILTER_K				7
/* slots: one per page of the pool, within these bounds */
#define IDEM_FILTER_MIN_SLOTS		64
#define IDEM_FILTER_MAX_SLOTS		16384
/* a full pool is logged at most this often (IdemFilterReportFull) */
#define IDEM_FILTER_FULL_LOG_SECS	600

/* idempotency.filter_memory, in kB (0: no filters) */
int			idem_filter_memory = 64 * 1024;

static const char *const filter_state_names[] = {
	"free", "filling", "ready", "unusable"
};

/* Why a partition goes without a filter, for IdemFilterReportFull */
typedef struct IdemFilterNoRoom
{
	int			ledger;
	Oid			relid;
	NameData	db_name;		/* of the partition's database */
	bool		too_many_dbs;	/* no IdemFilterDb entry left */
	NameData	top_name;		/* the database holding the most pages */
	int32		top_pages;
	int32		top_slots;
} IdemFilterNoRoom;

typedef struct IdemFilterKey
{
	Oid			db;
	Oid			relid;
} IdemFilterKey;

typedef struct IdemFilterEntry
{
	IdemFilterKey key;
	int			slot;
} IdemFilterEntry;

IdemFilterShared *idem_filter_shared = NULL;
static int *filter_freelist = NULL;
static uint64 *filter_page_map = NULL;
IdemFilterSlot *idem_filter_slots = NULL;
static pg_atomic_uint32 *filter_pages = NULL;
static HTAB *filter_hash = NULL;

/* This backend's cache of slots, by relid (of its database) */
typedef struct IdemFilterLocal
{
	Oid			relid;			/* hash key */
	int			slot;			/* -1: none, as of absent_gen */
	uint64		incarnation;
	uint64		absent_gen;
} IdemFilterLocal;

static HTAB *filter_local = NULL;

/* This database's name, once IdemFilterTake ran */
static NameData my_db_name;

PG_FUNCTION_INFO_V1(idem_filter_info);

static void IdemFilterNoteNoRoom(IdemFilterNoRoom *report, int ledger,
								 Oid relid, int dbent);
static void IdemFilterReportFull(const IdemFilterNoRoom *report);
static int	IdemFilterDbEntry(void);
static bool IdemFilterReclaim(int dbent, uint32 need);
static bool IdemFilterGrow(IdemFilterSlot *slot, uint64 items,
						   uint64 min_items);
static void IdemFilterFreeSlot(int slot);
static bool IdemFilterAddSegment(IdemFilterSlot *slot, uint64 items);
static bool IdemFilterTest(IdemFilterSlot *slot, uint64 item);

/* ----------------------------------------------------------------
 * Shared memory and the setting
 * ----------------------------------------------------------------
 */

static int
IdemFilterPages(void)
{
	return (int) Min((int64) idem_filter_memory / (IDEM_FILTER_PAGE_BYTES / 1024),
					 (int64) INT_MAX / 2);
}

static int
IdemFilterSlots(void)
{
	return Max(IDEM_FILTER_MIN_SLOTS,
			   Min(IdemFilterPages(), IDEM_FILTER_MAX_SLOTS));
}

static Size
IdemFilterHeaderSize(void)
{
	Size		size = MAXALIGN(sizeof(IdemFilterShared));

	size = add_size(size, MAXALIGN(mul_size(IdemFilterSlots(), sizeof(int))));
	size = add_size(size, MAXALIGN(mul_size((IdemFilterPages() + 63) / 64,
											sizeof(uint64))));
	size = add_size(size, mul_size(IdemFilterSlots(), sizeof(IdemFilterSlot)));
	return size;
}

/*
 * IdemFilterShmemSize returns the shared memory the filters need (none if
 * idempotency.filter_memory is 0).
 */
Size
IdemFilterShmemSize(void)
{
	if (idem_filter_memory == 0)
		return 0;
	return add_size(add_size(IdemFilterHeaderSize(),
							 mul_size(IdemFilterPages(), IDEM_FILTER_PAGE_BYTES)),
					hash_estimate_size(IdemFilterSlots(), sizeof(IdemFilterEntry)));
}

/*
 * IdemFilterShmemInit attaches to (or creates) the filters' shared state.
 * Called from the shmem_startup hook with AddinShmemInitLock held.
 */
void
IdemFilterShmemInit(void)
{
	bool		found;
	bool		found_pages;
	HASHCTL		info;
	char	   *p;
	int			i;

	if (idem_filter_memory == 0)
		return;

	idem_filter_shared = ShmemInitStruct("idempotency filters",
									IdemFilterHeaderSize(), &found);
	p = (char *) idem_filter_shared + MAXALIGN(sizeof(IdemFilterShared));
	filter_freelist = (int *) p;
	p += MAXALIGN(mul_size(IdemFilterSlots(), sizeof(int)));
	filter_page_map = (uint64 *) p;
	p += MAXALIGN(mul_size((IdemFilterPages() + 63) / 64, sizeof(uint64)));
	idem_filter_slots = (IdemFilterSlot *) p;
	filter_pages = ShmemInitStruct("idempotency filter pages",
								   mul_size(IdemFilterPages(),
											IDEM_FILTER_PAGE_BYTES),
								   &found_pages);
	if (!found)
	{
		idem_filter_shared->lock = &(GetNamedLWLockTranche(IDEM_LWLOCK_TRANCHE))[1].lock;
		idem_filter_shared->nslots = IdemFilterSlots();
		idem_filter_shared->npages = IdemFilterPages();
		pg_atomic_init_u64(&idem_filter_shared->generation, 1);
		pg_atomic_init_u64(&idem_filter_shared->next_incarnation, 1);
		pg_atomic_init_u64(&idem_filter_shared->full_logged_at, 0);
		for (i = 0; i < IDEM_FILTER_DB_BUCKETS; i++)
		{
			pg_atomic_init_u64(&idem_filter_shared->external_seq[i], 0);
			pg_atomic_init_u32(&idem_filter_shared->external_busy[i], 0);
		}
		idem_filter_shared->nfree = idem_filter_shared->nslots;
		memset(idem_filter_shared->dbs, 0, sizeof(idem_filter_shared->dbs));
		for (i = 0; i < idem_filter_shared->nslots; i++)
		{
			IdemFilterSlot *slot = &idem_filter_slots[i];

			filter_freelist[i] = idem_filter_shared->nslots - 1 - i;
			pg_atomic_init_u64(&slot->incarnation, 0);
			pg_atomic_init_u32(&slot->state, IDEM_FILTER_FREE);
			pg_atomic_init_u32(&slot->nsegments, 0);
		}
		memset(filter_page_map, 0,
			   ((idem_filter_shared->npages + 63) / 64) * sizeof(uint64));
	}

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(IdemFilterKey);
	info.entrysize = sizeof(IdemFilterEntry);
	filter_hash = ShmemInitHash("idempotency filters by partition",
								IdemFilterSlots(), IdemFilterSlots(),
								&info, HASH_ELEM | HASH_BLOBS);
}

/*
 * IdemFilterDefineSettings defines idempotency.filter_memory (_PG_init,
 * only while shared_preload_libraries is processed: a PGC_POSTMASTER
 * setting cannot be defined later, and means nothing without preloading)
 */
void
IdemFilterDefineSettings(void)
{
	DefineCustomIntVariable("idempotency.filter_memory",
							gettext_noop("Sets the shared memory of the digest filters that let calls skip partitions a new key cannot be in."),
							gettext_noop("About 2 bytes per live key or message id; 0 turns the filters off. Used only with shared_preload_libraries."),
							&idem_filter_memory,
							64 * 1024, 0, INT_MAX / 2,
							PGC_POSTMASTER, GUC_UNIT_KB,
							NULL, NULL, NULL);
}

/* ----------------------------------------------------------------
 * Finding a partition's filter
 * ----------------------------------------------------------------
 */

/*
 * IdemFilterFind returns the slot of partition "relid" of this database and
 * its incarnation, or NULL if it has none.  The local cache answers
 * without a lock while nothing was taken or freed since it looked.
 */
IdemFilterSlot *
IdemFilterFind(Oid relid, uint64 *incarnation)
{
	IdemFilterLocal *local;
	bool		found;

	if (filter_local == NULL)
	{
		HASHCTL		info;

		memset(&info, 0, sizeof(info));
		info.keysize = sizeof(Oid);
		info.entrysize = sizeof(IdemFilterLocal);
		info.hcxt = TopMemoryContext;
		filter_local = hash_create("idempotency filter cache", 64, &info,
								   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}

	local = hash_search(filter_local, &relid, HASH_ENTER, &found);
	if (found)
	{
		if (local->slot >= 0)
		{
			IdemFilterSlot *slot = &idem_filter_slots[local->slot];

			if (pg_atomic_read_u64(&slot->incarnation) == local->incarnation)
			{
				*incarnation = local->incarnation;
				return slot;
			}
		}
		else if (pg_atomic_read_u64(&idem_filter_shared->generation) == local->absent_gen)
			return NULL;
	}

	/* look it up */
	{
		IdemFilterKey key;
		IdemFilterEntry *entry;

		key.db = MyDatabaseId;
		key.relid = relid;
		LWLockAcquire(idem_filter_shared->lock, LW_SHARED);
		entry = hash_search(filter_hash, &key, HASH_FIND, NULL);
		if (entry != NULL)
		{
			local->slot = entry->slot;
			local->incarnation =
				pg_atomic_read_u64(&idem_filter_slots[entry->slot].incarnation);
		}
		else
		{
			local->slot = -1;
			local->absent_gen = pg_atomic_read_u64(&idem_filter_shared->generation);
		}
		LWLockRelease(idem_filter_shared->lock);
	}
	if (local->slot < 0)
		return NULL;
	*incarnation = local->incarnation;
	return &idem_filter_slots[local->slot];
}

/*
 * IdemFilterPruneLocal drops this backend's cache of slots once it has
 * grown large (at the end of each transaction: filter_hooks.c)
 */
void
IdemFilterPruneLocal(void)
{
	if (filter_local != NULL && hash_get_num_entries(filter_local) > 4096)
	{
		hash_destroy(filter_local);
		filter_local = NULL;
	}
}

/* ----------------------------------------------------------------
 * Bits
 * ----------------------------------------------------------------
 */

/* 64 bits of an item for segment "seg", mixed */
static inline uint64
IdemFilterHash(uint64 item, int seg)
{
	return IdemFilterMix(item ^
						 (uint64) (seg + 1) * UINT64CONST(0x9E3779B97F4A7C15));
}

/*
 * the first word of the block a hash selects in a segment, or NULL if the
 * segment does not describe pages of the pool: a slot freed and taken
 * again while it was read can show a torn segment, which must never
 * address memory outside the pool (its bits are then no answer: the
 * caller's incarnation check fails)
 */
static inline pg_atomic_uint32 *
IdemFilterBlock(const IdemFilterSegment *seg, uint64 h)
{
	uint32		first = seg->first_page;
	uint32		npages = seg->npages;
	uint32		block;

	pg_compiler_barrier();
	if (npages == 0 || (npages & (npages - 1)) != 0 ||
		first >= (uint32) idem_filter_shared->npages ||
		npages > (uint32) idem_filter_shared->npages - first)
		return NULL;
	block = (uint32) (h >> 32) & (npages * IDEM_FILTER_PAGE_BLOCKS - 1);
	return filter_pages + (Size) first * IDEM_FILTER_PAGE_WORDS +
		(Size) block * IDEM_FILTER_BLOCK_WORDS;
}

/* does segment "seg" have every bit of this item? */
static inline bool
IdemFilterSegmentHas(const IdemFilterSegment *seg, int segno, uint64 item)
{
	uint64		h = IdemFilterHash(item, segno);
	pg_atomic_uint32 *block = IdemFilterBlock(seg, h);
	uint32		a = (uint32) h & (IDEM_FILTER_BLOCK_BITS - 1);
	uint32		b = (((uint32) h >> 9) & (IDEM_FILTER_BLOCK_BITS - 1)) | 1;
	int			i;

	if (block == NULL)
		return true;			/* no answer: "maybe" */
	for (i = 0; i < IDEM_FILTER_K; i++)
	{
		uint32		bit = (a + i * b) & (IDEM_FILTER_BLOCK_BITS - 1);

		if ((pg_atomic_read_u32(&block[bit >> 5]) & ((uint32) 1 << (bit & 31))) == 0)
			return false;
	}
	return true;
}

static inline void
IdemFilterSegmentSet(const IdemFilterSegment *seg, int segno, uint64 item)
{
	uint64		h = IdemFilterHash(item, segno);
	pg_atomic_uint32 *block = IdemFilterBlock(seg, h);
	uint32		a = (uint32) h & (IDEM_FILTER_BLOCK_BITS - 1);
	uint32		b = (((uint32) h >> 9) & (IDEM_FILTER_BLOCK_BITS - 1)) | 1;
	int			i;

	if (block == NULL)
		return;					/* a slot freed meanwhile: nothing to add */
	for (i = 0; i < IDEM_FILTER_K; i++)
	{
		uint32		bit = (a + i * b) & (IDEM_FILTER_BLOCK_BITS - 1);
		uint32		mask = (uint32) 1 << (bit & 31);

		if ((pg_atomic_read_u32(&block[bit >> 5]) & mask) == 0)
			pg_atomic_fetch_or_u32(&block[bit >> 5], mask);
	}
}

/* tests every segment: false means the item was never added */
static bool
IdemFilterTest(IdemFilterSlot *slot, uint64 item)
{
	uint32		nseg = Min(pg_atomic_read_u32(&slot->nsegments),
						   IDEM_FILTER_MAX_SEGMENTS);
	uint32		s;

	pg_read_barrier();
	for (s = 0; s < nseg; s++)
	{
		if (IdemFilterSegmentHas(&slot->seg[s], s, item))
			return true;
	}
	return false;
}

/*
 * IdemFilterAddTo adds an item to the last segment of a slot, adding a
 * segment when that one is full; if the pool has no room, the slot
 * becomes UNUSABLE.  Never raises an error: the row is already written.
 */
void
IdemFilterAddTo(IdemFilterSlot *slot, uint64 item)
{
	for (;;)
	{
		uint32		nseg = pg_atomic_read_u32(&slot->nsegments);
		IdemFilterSegment *seg;

		pg_read_barrier();
		if (nseg == 0 || nseg > IDEM_FILTER_MAX_SEGMENTS)
			return;				/* being freed */
		seg = &slot->seg[nseg - 1];
		if (pg_atomic_fetch_add_u32(&seg->count, 1) < seg->capacity)
		{
			IdemFilterSegmentSet(seg, nseg - 1, item);
			return;
		}

		/* full: the next segment, unless another backend added it */
		LWLockAcquire(idem_filter_shared->lock, LW_EXCLUSIVE);
		if (pg_atomic_read_u32(&slot->nsegments) == nseg &&
			pg_atomic_read_u32(&slot->state) != IDEM_FILTER_FREE &&
			!IdemFilterGrow(slot, (uint64) seg->capacity * 2,
							(uint64) seg->capacity * 2))
		{
			uint32		state = pg_atomic_read_u32(&slot->state);
			bool		made_unusable = false;
			IdemFilterNoRoom report;

			if (state == IDEM_FILTER_READY || state == IDEM_FILTER_FILLING)
				made_unusable =
					pg_atomic_compare_exchange_u32(&slot->state, &state,
												   IDEM_FILTER_UNUSABLE);
			if (made_unusable)
				IdemFilterNoteNoRoom(&report, slot->ledger, slot->relid,
									 slot->dbent);
			LWLockRelease(idem_filter_shared->lock);
			if (made_unusable)
				IdemFilterReportFull(&report);
			return;
		}
		LWLockRelease(idem_filter_shared->lock);
	}
}

/* ----------------------------------------------------------------
 * Slots and pages
 * ----------------------------------------------------------------
 */

/* the pages a slot's segments hold */
static uint32
IdemFilterSlotPages(IdemFilterSlot *slot)
{
	uint32		nseg = Min(pg_atomic_read_u32(&slot->nsegments),
						   IDEM_FILTER_MAX_SEGMENTS);
	uint32		pages = 0;
	uint32		i;

	for (i = 0; i < nseg; i++)
		pages += slot->seg[i].npages;
	return pages;
}

/*
 * IdemFilterAddSegment gives a slot a new, zeroed segment for "items"
 * digests, published last.  Returns false if the pool has no room or the
 * slot has all its segments.  Called with the lock held exclusively.
 */
static bool
IdemFilterAddSegment(IdemFilterSlot *slot, uint64 items)
{
	uint32		nseg = pg_atomic_read_u32(&slot->nsegments);
	uint64		want = (items + IDEM_FILTER_PAGE_ITEMS - 1) / IDEM_FILTER_PAGE_ITEMS;
	uint32		npages = 1;
	uint32		first;
	IdemFilterSegment *seg;

	if (nseg >= IDEM_FILTER_MAX_SEGMENTS)
		return false;
	while (npages < want && npages <= (uint32) idem_filter_shared->npages / 2)
		npages *= 2;
	if (npages > (uint32) idem_filter_shared->npages)
		return false;

	/* the first aligned run of npages free pages */
	for (first = 0; first + npages <= (uint32) idem_filter_shared->npages; first += npages)
	{
		uint32		p;

		for (p = first; p < first + npages; p++)
			if (filter_page_map[p / 64] & ((uint64) 1 << (p % 64)))
				break;
		if (p == first + npages)
			break;
	}
	if (first + npages > (uint32) idem_filter_shared->npages)
		return false;

	{
		uint32		p;

		for (p = first; p < first + npages; p++)
			filter_page_map[p / 64] |= (uint64) 1 << (p % 64);
	}
	memset(filter_pages + (Size) first * IDEM_FILTER_PAGE_WORDS, 0,
		   (Size) npages * IDEM_FILTER_PAGE_BYTES);
	seg = &slot->seg[nseg];
	seg->first_page = first;
	seg->npages = npages;
	seg->capacity = (uint32) Min((uint64) npages * IDEM_FILTER_PAGE_ITEMS,
								 (uint64) PG_UINT32_MAX / 2);
	pg_atomic_init_u32(&seg->count, 0);
	idem_filter_shared->dbs[slot->dbent].pages += npages;
	pg_write_barrier();
	pg_atomic_write_u32(&slot->nsegments, nseg + 1);
	return true;
}

/*
 * IdemFilterGrow gives a slot a new segment for "items" digests or, if the
 * pool has no run of pages that long, a smaller one, down to "min_items";
 * when none fits, room is taken back from a database holding more than
 * its share (IdemFilterReclaim) and it tries again.  Returns false if no
 * segment could be added.  Called with the lock held exclusively.
 */
static bool
IdemFilterGrow(IdemFilterSlot *slot, uint64 items, uint64 min_items)
{
	uint32		need = (uint32) Min((min_items + IDEM_FILTER_PAGE_ITEMS - 1) /
									IDEM_FILTER_PAGE_ITEMS,
									(uint64) idem_filter_shared->npages);

	items = Max(items, 1);
	for (;;)
	{
		uint64		h;

		for (h = items;; h /= 2)
		{
			if (IdemFilterAddSegment(slot, h))
				return true;
			if (h <= min_items || h <= IDEM_FILTER_PAGE_ITEMS)
				break;
		}
		if (!IdemFilterReclaim(slot->dbent, Max(need, 1)))
			return false;
	}
}

/*
 * IdemFilterDbEntry returns the index of this database's IdemFilterDb,
 * made if it has none (named by my_db_name), or -1 if every entry is
 * taken by a database that holds a slot.  Called with the lock held
 * exclusively.
 */
static int
IdemFilterDbEntry(void)
{
	int			free_entry = -1;
	int			i;

	for (i = 0; i < IDEM_FILTER_MAX_DBS; i++)
	{
		IdemFilterDb *e = &idem_filter_shared->dbs[i];

		if (e->db == MyDatabaseId)
			return i;
		/* (one left by a database whose slot could not be had is free) */
		if ((!OidIsValid(e->db) || e->slots == 0) && free_entry < 0)
			free_entry = i;
	}
	if (free_entry >= 0)
	{
		IdemFilterDb *e = &idem_filter_shared->dbs[free_entry];

		e->db = MyDatabaseId;
		e->slots = 0;
		e->pages = 0;
		e->name = my_db_name;
	}
	return free_entry;
}

/*
 * IdemFilterReclaim makes room for database entry "dbent", which needs
 * "need" more pages, when the pool has none: the pool is shared fairly
 * between the databases that hold filters.  A database's share is the
 * pool divided by the number of databases holding filters (counting this
 * one).  If this one would stay within its share with "need" pages more,
 * and the database holding the most pages holds more than its share, the
 * largest filter of that database is freed (its partition is probed
 * through its index until that database's maintenance builds the filter
 * again, if it gets room).  So a database alone may take the whole pool,
 * and gives room back, down to its share, as others need it; none takes
 * room from a database within its share.  Returns true if it freed a
 * filter.  Called with the lock held exclusively.
 */
static bool
IdemFilterReclaim(int dbent, uint32 need)
{
	IdemFilterDb *me = &idem_filter_shared->dbs[dbent];
	int			top = -1;
	int			holders = 0;
	int32		share;
	int			victim = -1;
	uint32		victim_pages = 0;
	IdemFilterKey key;
	IdemFilterEntry *entry;
	int			i;

	for (i = 0; i < IDEM_FILTER_MAX_DBS; i++)
	{
		IdemFilterDb *e = &idem_filter_shared->dbs[i];

		if (!OidIsValid(e->db) || e->slots == 0)
			continue;
		holders++;
		if (top < 0 || e->pages > idem_filter_shared->dbs[top].pages)
			top = i;
	}
	if (me->slots == 0)
		holders++;
	share = idem_filter_shared->npages / Max(holders, 1);
	if (top < 0 || top == dbent ||
		idem_filter_shared->dbs[top].pages <= share ||
		(int64) me->pages + need > share)
		return false;

	/* the largest filter of that database */
	for (i = 0; i < idem_filter_shared->nslots; i++)
	{
		IdemFilterSlot *slot = &idem_filter_slots[i];
		uint32		pages;

		if (pg_atomic_read_u32(&slot->state) == IDEM_FILTER_FREE ||
			slot->dbent != top)
			continue;
		pages = IdemFilterSlotPages(slot);
		if (victim < 0 || pages > victim_pages)
		{
			victim = i;
			victim_pages = pages;
		}
	}
	if (victim < 0)
		return false;
	key.db = idem_filter_slots[victim].db;
	key.relid = idem_filter_slots[victim].relid;
	entry = hash_search(filter_hash, &key, HASH_FIND, NULL);
	IdemFilterFreeSlot(victim);
	if (entry != NULL && entry->slot == victim)
		hash_search(filter_hash, &key, HASH_REMOVE, NULL);
	return true;
}

/*
 * IdemFilterNoteNoRoom fills in *report, for IdemFilterReportFull, about
 * partition "relid" of "ledger" of database entry "dbent" (-1: none could
 * be had) left without a filter.  Called with the lock held.
 */
static void
IdemFilterNoteNoRoom(IdemFilterNoRoom *report, int ledger, Oid relid,
					 int dbent)
{
	int			top = -1;
	int			i;

	memset(report, 0, sizeof(*report));
	report->ledger = ledger;
	report->relid = relid;
	report->too_many_dbs = (dbent < 0);
	report->db_name = dbent >= 0 ? idem_filter_shared->dbs[dbent].name : my_db_name;
	for (i = 0; i < IDEM_FILTER_MAX_DBS; i++)
	{
		IdemFilterDb *e = &idem_filter_shared->dbs[i];

		if (OidIsValid(e->db) && e->slots > 0 &&
			(top < 0 || e->pages > idem_filter_shared->dbs[top].pages))
			top = i;
	}
	if (top >= 0)
	{
		report->top_name = idem_filter_shared->dbs[top].name;
		report->top_pages = idem_filter_shared->dbs[top].pages;
		report->top_slots = idem_filter_shared->dbs[top].slots;
	}
}

/*
 * IdemFilterReportFull logs that a partition goes without a filter because
 * the pool has no room for it, naming the database that holds the most of
 * the pool: at most once every IDEM_FILTER_FULL_LOG_SECS in the whole
 * server, since maintenance tries again at each run.  LOG: the server's
 * log, never the client; it neither reads the catalog nor raises an error
 * (the caller may have just written its row).
 */
static void
IdemFilterReportFull(const IdemFilterNoRoom *report)
{
	TimestampTz now = GetCurrentTimestamp();
	uint64		last = pg_atomic_read_u64(&idem_filter_shared->full_logged_at);

	/* (a clock stepped backwards logs again) */
	if (last != 0 && (TimestampTz) last <= now &&
		!TimestampDifferenceExceeds((TimestampTz) last, now,
									IDEM_FILTER_FULL_LOG_SECS * 1000))
		return;
	/* one backend of those that see it at once */
	if (!pg_atomic_compare_exchange_u64(&idem_filter_shared->full_logged_at,
										&last, (uint64) now))
		return;
	if (report->too_many_dbs)
		ereport(LOG,
				(errmsg("idempotency.filter_memory is full"),
				 errdetail("The partition with OID %u of the %s ledger in database \"%s\" has no digest filter: at most %d databases hold filters at once. Lookups in it read its index. This is logged at most once every %d minutes.",
						   report->relid,
						   report->ledger == IDEM_LEDGER_MESSAGES ? "messages" : "keys",
						   NameStr(report->db_name), IDEM_FILTER_MAX_DBS,
						   IDEM_FILTER_FULL_LOG_SECS / 60)));
	else
		ereport(LOG,
				(errmsg("idempotency.filter_memory is full"),
				 errdetail("The partition with OID %u of the %s ledger in database \"%s\" has no digest filter; lookups in it read its index. Database \"%s\" holds the most of the pool: %d kB of %d kB, in %d filters. This is logged at most once every %d minutes.",
						   report->relid,
						   report->ledger == IDEM_LEDGER_MESSAGES ? "messages" : "keys",
						   NameStr(report->db_name), NameStr(report->top_name),
						   report->top_pages * (IDEM_FILTER_PAGE_BYTES / 1024),
						   idem_filter_shared->npages * (IDEM_FILTER_PAGE_BYTES / 1024),
						   report->top_slots, IDEM_FILTER_FULL_LOG_SECS / 60),
				 errhint("Raise idempotency.filter_memory (2 to 3 bytes per live key or message id, in all databases together) and restart the server.")));
}

/*
 * IdemFilterTake gives partition "relid" of this database a slot, FILLING,
 * sized for "hint" digests (or fewer, if the pool has no room for as
 * many), replacing any slot it had, and sets *incarnation to the slot's.
 * Room held by a database beyond its share may be taken back for it
 * (IdemFilterReclaim).  Returns the slot, or -1 if there is no room (the
 * partition then has no filter).  IdemFilterFinish makes it READY.  In a
 * transaction (the first call reads this database's name).
 */
int
IdemFilterTake(Oid relid, int16 lane, int ledger, uint64 hint,
			   uint64 secret_id, uint64 *incarnation)
{
	IdemFilterKey key;
	IdemFilterEntry *entry;
	bool		found;
	int			s;
	int			dbent;
	IdemFilterSlot *slot;
	IdemFilterNoRoom report;

	if (NameStr(my_db_name)[0] == '\0')
	{
		char	   *name = get_database_name(MyDatabaseId);

		namestrcpy(&my_db_name, name ? name : "?");
	}

	key.db = MyDatabaseId;
	key.relid = relid;
	LWLockAcquire(idem_filter_shared->lock, LW_EXCLUSIVE);
	entry = hash_search(filter_hash, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		IdemFilterFreeSlot(entry->slot);
		hash_search(filter_hash, &key, HASH_REMOVE, NULL);
	}
	dbent = IdemFilterDbEntry();
	if (dbent < 0)
		goto no_room;
	while (idem_filter_shared->nfree == 0)
	{
		if (!IdemFilterReclaim(dbent, 1))
			goto no_room;
	}
	s = filter_freelist[--idem_filter_shared->nfree];
	slot = &idem_filter_slots[s];
	Assert(pg_atomic_read_u32(&slot->state) == IDEM_FILTER_FREE);
	slot->db = MyDatabaseId;
	slot->relid = relid;
	slot->dbent = (int16) dbent;
	slot->lane = lane;
	slot->ledger = (uint8) ledger;
	slot->made_at = GetCurrentTimestamp();
	slot->secret_id = secret_id;
	pg_atomic_write_u32(&slot->nsegments, 0);
	/* counted before it may take room back: it holds a slot */
	idem_filter_shared->dbs[dbent].slots++;
	/* a smaller first segment if the pool has no run that long */
	if (!IdemFilterGrow(slot, hint, IDEM_FILTER_PAGE_ITEMS))
	{
		if (--idem_filter_shared->dbs[dbent].slots == 0)
			idem_filter_shared->dbs[dbent].db = InvalidOid;
		slot->relid = InvalidOid;
		slot->db = InvalidOid;
		filter_freelist[idem_filter_shared->nfree++] = s;
		goto no_room;
	}
	*incarnation = pg_atomic_fetch_add_u64(&idem_filter_shared->next_incarnation, 1);
	pg_atomic_write_u64(&slot->incarnation, *incarnation);
	pg_write_barrier();
	pg_atomic_write_u32(&slot->state, IDEM_FILTER_FILLING);
	entry = hash_search(filter_hash, &key, HASH_ENTER_NULL, &found);
	if (entry == NULL)
	{
		IdemFilterFreeSlot(s);
		goto no_room;
	}
	entry->slot = s;
	pg_memory_barrier();
	pg_atomic_fetch_add_u64(&idem_filter_shared->generation, 1);
	LWLockRelease(idem_filter_shared->lock);
	return s;

no_room:
	IdemFilterNoteNoRoom(&report, ledger, relid, dbent);
	LWLockRelease(idem_filter_shared->lock);
	IdemFilterReportFull(&report);
	return -1;
}

/*
 * IdemFilterFinish makes slot "s", taken with this incarnation and with
 * external_seq read as "seq" before it was taken, READY: only if it is
 * still that slot, still FILLING (neither freed, nor made UNUSABLE by an
 * external write or a full pool), and no external write started since.
 * Otherwise it becomes UNUSABLE (if still that slot).  Returns true if it
 * became READY.
 */
bool
IdemFilterFinish(int s, uint64 incarnation, uint64 seq)
{
	IdemFilterSlot *slot = &idem_filter_slots[s];
	uint32		expected = IDEM_FILTER_FILLING;
	bool		ready = false;

	pg_memory_barrier();
	LWLockAcquire(idem_filter_shared->lock, LW_EXCLUSIVE);
	if (pg_atomic_read_u64(&slot->incarnation) == incarnation)
	{
		if (pg_atomic_read_u64(&idem_filter_shared->external_seq[IdemFilterBucket(MyDatabaseId)]) == seq)
			ready = pg_atomic_compare_exchange_u32(&slot->state, &expected,
												   IDEM_FILTER_READY);
		else
			(void) pg_atomic_compare_exchange_u32(&slot->state, &expected,
												  IDEM_FILTER_UNUSABLE);
	}
	LWLockRelease(idem_filter_shared->lock);
	return ready;
}

/*
 * IdemFilterFreeSlot returns a slot and its pages to the pool; the caller
 * removes its hash entry.  The incarnation changes first, so that a
 * backend reading the slot meanwhile notices.  A slot already free is left
 * alone.  Called with the lock held exclusively.
 */
static void
IdemFilterFreeSlot(int s)
{
	IdemFilterSlot *slot = &idem_filter_slots[s];
	uint32		nseg = Min(pg_atomic_read_u32(&slot->nsegments),
						   IDEM_FILTER_MAX_SEGMENTS);
	uint32		i;

	if (pg_atomic_read_u32(&slot->state) == IDEM_FILTER_FREE)
		return;
	Assert(idem_filter_shared->nfree < idem_filter_shared->nslots);
	/* what its database holds */
	{
		IdemFilterDb *e = &idem_filter_shared->dbs[slot->dbent];

		e->pages -= (int32) IdemFilterSlotPages(slot);
		if (--e->slots <= 0)
		{
			Assert(e->pages == 0);
			e->db = InvalidOid;
			e->slots = 0;
			e->pages = 0;
		}
	}
	pg_atomic_write_u64(&slot->incarnation,
						pg_atomic_fetch_add_u64(&idem_filter_shared->next_incarnation, 1));
	pg_atomic_write_u32(&slot->state, IDEM_FILTER_FREE);
	pg_atomic_write_u32(&slot->nsegments, 0);
	pg_memory_barrier();
	for (i = 0; i < nseg; i++)
	{
		uint32		p;

		for (p = slot->seg[i].first_page;
			 p < slot->seg[i].first_page + slot->seg[i].npages; p++)
			filter_page_map[p / 64] &= ~((uint64) 1 << (p % 64));
	}
	slot->relid = InvalidOid;
	slot->db = InvalidOid;
	filter_freelist[idem_filter_shared->nfree++] = s;
	pg_atomic_fetch_add_u64(&idem_filter_shared->generation, 1);
}

/*
 * IdemFilterForgetSlots frees the slots of database "db" (any database if
 * InvalidOid) taken before "made_before" whose partition is not among
 * keep[0 .. nkeep - 1] (whose database, with db InvalidOid).  A slot is
 * freed only through its own hash entry.
 */
void
IdemFilterForgetSlots(Oid db, TimestampTz made_before, const Oid *keep,
					  int nkeep)
{
	int			i;

	LWLockAcquire(idem_filter_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < idem_filter_shared->nslots; i++)
	{
		IdemFilterSlot *slot = &idem_filter_slots[i];
		IdemFilterKey key;
		IdemFilterEntry *entry;
		Oid			what;
		int			k;

		if (pg_atomic_read_u32(&slot->state) == IDEM_FILTER_FREE ||
			slot->made_at >= made_before ||
			(OidIsValid(db) && slot->db != db))
			continue;
		what = OidIsValid(db) ? slot->relid : slot->db;
		for (k = 0; k < nkeep; k++)
			if (keep[k] == what)
				break;
		if (k < nkeep)
			continue;
		key.db = slot->db;
		key.relid = slot->relid;
		entry = hash_search(filter_hash, &key, HASH_FIND, NULL);
		if (entry == NULL || entry->slot != i)
			continue;
		IdemFilterFreeSlot(i);
		hash_search(filter_hash, &key, HASH_REMOVE, NULL);
	}
	LWLockRelease(idem_filter_shared->lock);
}

/*
 * IdemFilterSizeHint: how many digests a new partition of this ledger and
 * layout will likely take: the most any filter of the same database,
 * ledger and layout holds now (partitions of one layout cover equal time).
 */
uint64
IdemFilterSizeHint(Oid db, int ledger, int16 lane)
{
	uint64		most = 0;
	int			i;

	LWLockAcquire(idem_filter_shared->lock, LW_SHARED);
	for (i = 0; i < idem_filter_shared->nslots; i++)
	{
		IdemFilterSlot *slot = &idem_filter_slots[i];
		uint32		nseg;
		uint64		n = 0;
		uint32		s;

		if (pg_atomic_read_u32(&slot->state) == IDEM_FILTER_FREE ||
			slot->db != db || slot->ledger != ledger ||
			slot->lane == IDEM_FILTER_MEMORY_LANE ||
			IdemLaneLanes(slot->lane) != IdemLaneLanes(lane) ||
			IdemLaneIsFar(slot->lane) != IdemLaneIsFar(lane))
			continue;
		nseg = pg_atomic_read_u32(&slot->nsegments);
		for (s = 0; s < nseg; s++)
			n += Min(pg_atomic_read_u32(&slot->seg[s].count), slot->seg[s].capacity);
		most = Max(most, n);
	}
	LWLockRelease(idem_filter_shared->lock);
	return most + most / 4;
}

/*
 * IdemFilterSweepUnusable makes every filter of this database UNUSABLE.
 * Under the lock (shared): a slot's database and state do not change while
 * it is held (taking, finishing and freeing slots hold it exclusively), so
 * a failed compare-and-swap can only mean another sweep made it UNUSABLE.
 */
void
IdemFilterSweepUnusable(void)
{
	int			i;

	LWLockAcquire(idem_filter_shared->lock, LW_SHARED);
	for (i = 0; i < idem_filter_shared->nslots; i++)
	{
		IdemFilterSlot *slot = &idem_filter_slots[i];
		uint32		state = pg_atomic_read_u32(&slot->state);

		pg_read_barrier();
		if ((state == IDEM_FILTER_READY || state == IDEM_FILTER_FILLING) &&
			slot->db == MyDatabaseId)
			(void) pg_atomic_compare_exchange_u32(&slot->state, &state,
												  IDEM_FILTER_UNUSABLE);
	}
	LWLockRelease(idem_filter_shared->lock);
}

/*
 * Are filters keyed in this database (the installed extension has the
 * secret: 0.4.0 or later)?  If so, sets *secret_id to the secret's
 * (IdemLockSecretId).  Before ALTER EXTENSION UPDATE from 0.3.1 no filter
 * is made or used: its bits would be public functions of the rows.
 */
bool
IdemFilterKeyed(uint64 *secret_id)
{
	if (!IdemKeyedLockTags())
		return false;
	*secret_id = IdemLockSecretId();
	return true;
}

/*
 * What a filter holds of a row: a keyed hash of its role and its digest
 * (IdemFilterDigestHash), under the secret "secret_id" names.  The last
 * one computed is kept: a probe tests each partition twice, and there
 * may be many.
 */
uint64
IdemFilterItem(Oid role, const pg_uuid_t *digest, uint64 secret_id)
{
	static bool valid = false;
	static Oid	last_role;
	static uint64 last_secret_id;
	static pg_uuid_t last_digest;
	static uint64 last_item;

	if (!valid || last_role != role || last_secret_id != secret_id ||
		memcmp(&last_digest, digest, sizeof(pg_uuid_t)) != 0)
	{
		valid = false;
		last_item = IdemFilterDigestHash(role, digest);
		last_role = role;
		last_secret_id = secret_id;
		last_digest = *digest;
		valid = true;
	}
	return last_item;
}

/* ----------------------------------------------------------------
 * What the protocol calls
 * ----------------------------------------------------------------
 */

/*
 * IdemFilterPairs: how many pairs the READY filter of relation "relid" has
 * taken (those of rows or pieces gone included); -1 if it has none READY.
 */
int64
IdemFilterPairs(Oid relid)
{
	IdemFilterSlot *slot;
	uint64		incarnation;
	uint32		nseg;
	uint32		s;
	int64		n = 0;

	if (idem_filter_shared == NULL)
		return -1;
	slot = IdemFilterFind(relid, &incarnation);
	if (slot == NULL || pg_atomic_read_u32(&slot->state) != IDEM_FILTER_READY)
		return -1;
	nseg = Min(pg_atomic_read_u32(&slot->nsegments), IDEM_FILTER_MAX_SEGMENTS);
	pg_read_barrier();
	for (s = 0; s < nseg; s++)
		n += Min(pg_atomic_read_u32(&slot->seg[s].count), slot->seg[s].capacity);
	return n;
}

/* IdemFiltersShared: are there shared filters in this backend? */
bool
IdemFiltersShared(void)
{
	return idem_filter_shared != NULL;
}

/*
 * IdemFilterKeyedItem sets *item to what a filter holds of the pair, under
 * the database's secret (*secret_id names it); false if there is none.
 */
bool
IdemFilterKeyedItem(Oid role, const pg_uuid_t *digest, uint64 *secret_id,
					uint64 *item)
{
	if (!IdemFilterKeyed(secret_id))
		return false;
	*item = IdemFilterItem(role, digest, *secret_id);
	return true;
}

/*
 * IdemFilterRulesOut: is it certain that partition "relid" (of lane value
 * "lane") holds no row of this role with this digest?  False whenever that
 * is not known (no filter, not READY, a standby, no preload).
 */
bool
IdemFilterRulesOut(Oid relid, int16 lane, Oid role, const pg_uuid_t *digest)
{
	IdemFilterSlot *slot;
	uint64		incarnation;
	uint64		secret_id;
	bool		has;

	if (!IdemFilterUsable(lane))
		return false;
	slot = IdemFilterFind(relid, &incarnation);
	if (slot == NULL || pg_atomic_read_u32(&slot->state) != IDEM_FILTER_READY)
		return false;
	/* the segments a READY filter was made with, at least */
	pg_read_barrier();
	/* made under another secret than this backend's: no answer */
	if (!IdemFilterKeyed(&secret_id) || slot->secret_id != secret_id)
		return false;
	has = IdemFilterTest(slot, IdemFilterItem(role, digest, secret_id));
	pg_read_barrier();
	/* freed meanwhile (its pages may hold another filter's bits): no answer */
	if (pg_atomic_read_u64(&slot->incarnation) != incarnation ||
		pg_atomic_read_u32(&slot->state) != IDEM_FILTER_READY)
		return false;
	return !has;
}

/*
 * IdemFilterAdd notes that a row of this role with this digest was just
 * written into partition "relid" (of lane value "lane").  Called after the
 * row's heap and index inserts, with the key lock held.
 */
void
IdemFilterAdd(Oid relid, int16 lane, Oid role, const pg_uuid_t *digest)
{
	IdemFilterSlot *slot;
	uint64		incarnation;
	uint64		secret_id;
	uint32		state;

	if (!IdemFilterUsable(lane))
		return;
	/* the row is in place before we look for its partition's slot */
	pg_memory_barrier();
	slot = IdemFilterFind(relid, &incarnation);
	if (slot == NULL)
		return;
	state = pg_atomic_read_u32(&slot->state);
	if (state != IDEM_FILTER_READY && state != IDEM_FILTER_FILLING)
		return;

	/*
	 * A filter made under another secret (or none: a session that has not
	 * yet seen ALTER EXTENSION UPDATE) cannot take this row: it may miss
	 * it from now on, and is built again by maintenance.
	 */
	if (!IdemFilterKeyed(&secret_id))
		secret_id = 0;
	pg_read_barrier();
	if (secret_id == 0 || slot->secret_id != secret_id)
	{
		if (pg_atomic_read_u64(&slot->incarnation) == incarnation)
			(void) pg_atomic_compare_exchange_u32(&slot->state, &state,
												  IDEM_FILTER_UNUSABLE);
		return;
	}
	IdemFilterAddTo(slot, IdemFilterItem(role, digest, secret_id));
}

/* ----------------------------------------------------------------
 * Freeing filters: of a partition dropped, of databases gone
 * ----------------------------------------------------------------
 */

/*
 * The partitions (and pieces of the memory) this transaction dropped: their
 * filters are freed when it commits (IdemFilterAtXactEnd), not at the drop.
 * Until then the other sessions still see the partition, and a call that
 * looks into an ended partition for a remembered key (memory.c) asks its
 * filter first: kept, the filter tells a key that is not there without the
 * lock that would wait for the drop's transaction (the rest of a
 * maintenance run, or an idem_maintain() not committed yet).  A rollback
 * keeps them: the partition is back, and nothing wrote into it meanwhile
 * (the drop held it ACCESS EXCLUSIVE).  A savepoint rolled back over a
 * drop leaves its partition without a filter once the transaction commits,
 * which only costs probes.  In TopTransactionContext.
 */
static Oid *dropped_relids = NULL;
static int	ndropped = 0;
static int	maxdropped = 0;

/*
 * IdemFilterForgetAtCommit: the filter of partition "relid", just dropped
 * by this transaction, is to be freed when the transaction commits.
 */
void
IdemFilterForgetAtCommit(Oid relid)
{
	if (idem_filter_shared == NULL)
		return;
	if (ndropped == maxdropped)
	{
		maxdropped = Max(16, maxdropped * 2);
		if (dropped_relids == NULL)
			dropped_relids = MemoryContextAlloc(TopTransactionContext,
												maxdropped * sizeof(Oid));
		else
			dropped_relids = repalloc(dropped_relids, maxdropped * sizeof(Oid));
	}
	dropped_relids[ndropped++] = relid;
}

/*
 * IdemFilterDroppedRelids: the partitions this transaction dropped, whose
 * filters it frees when it commits (for IdemFilterBuildDatabase, which
 * must not free them before).
 */
int
IdemFilterDroppedRelids(const Oid **relids)
{
	*relids = dropped_relids;
	return ndropped;
}

/*
 * IdemFilterAtXactEnd, from the transaction callback (filter_hooks.c):
 * frees the filters of the partitions the transaction dropped if it
 * committed, keeps them otherwise (also at PREPARE: the next maintenance
 * round frees them once the drop has committed).
 */
void
IdemFilterAtXactEnd(bool committed)
{
	int			i;

	if (committed)
		for (i = 0; i < ndropped; i++)
			IdemFilterForget(dropped_relids[i]);
	dropped_relids = NULL;		/* freed with TopTransactionContext */
	ndropped = 0;
	maxdropped = 0;
}

/* IdemFilterForget frees the filter of a partition that was dropped */
void
IdemFilterForget(Oid relid)
{
	IdemFilterKey key;
	IdemFilterEntry *entry;

	if (idem_filter_shared == NULL)
		return;
	key.db = MyDatabaseId;
	key.relid = relid;
	LWLockAcquire(idem_filter_shared->lock, LW_EXCLUSIVE);
	entry = hash_search(filter_hash, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		IdemFilterFreeSlot(entry->slot);
		hash_search(filter_hash, &key, HASH_REMOVE, NULL);
	}
	LWLockRelease(idem_filter_shared->lock);
}

/*
 * IdemFilterForgetDatabase frees every filter of this database (the
 * extension is gone from it).
 */
void
IdemFilterForgetDatabase(void)
{
	if (idem_filter_shared != NULL)
		IdemFilterForgetSlots(MyDatabaseId, DT_NOEND, NULL, 0);
}

/*
 * IdemFilterForgetDatabases frees the filters of databases that are gone
 * (called by the launcher with the databases it listed at listed_at; a
 * filter made since may be of a database made since).
 */
void
IdemFilterForgetDatabases(const Oid *dbs, int ndbs, TimestampTz listed_at)
{
	if (idem_filter_shared != NULL)
		IdemFilterForgetSlots(InvalidOid, listed_at, dbs, ndbs);
}

/* ----------------------------------------------------------------
 * idempotency.filter_info()
 * ----------------------------------------------------------------
 */

/*
 * idempotency.filter_info(OUT partition regclass, OUT state text,
 *						   OUT digests bigint, OUT capacity bigint,
 *						   OUT bytes bigint, OUT segments int)
 *		RETURNS SETOF record
 *
 * The digest filters of this database's partitions.  Without preload, or
 * with idempotency.filter_memory = 0, no rows.
 */
Datum
idem_filter_info(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	typedef struct
	{
		Oid			relid;
		uint32		state;
		int64		digests;
		int64		capacity;
		int64		bytes;
		int32		segments;
	} FilterRow;
	FilterRow  *rows;
	int			nrows = 0;
	int			i;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	if (idem_filter_shared == NULL)
		return (Datum) 0;

	/* copied under the lock, returned after it */
	rows = palloc(idem_filter_shared->nslots * sizeof(FilterRow));
	LWLockAcquire(idem_filter_shared->lock, LW_SHARED);
	for (i = 0; i < idem_filter_shared->nslots; i++)
	{
		IdemFilterSlot *slot = &idem_filter_slots[i];
		uint32		state = pg_atomic_read_u32(&slot->state);
		uint32		nseg;
		uint32		s;
		FilterRow  *r;

		if (state == IDEM_FILTER_FREE || slot->db != MyDatabaseId)
			continue;
		r = &rows[nrows++];
		r->relid = slot->relid;
		r->state = state;
		r->digests = r->capacity = r->bytes = 0;
		nseg = Min(pg_atomic_read_u32(&slot->nsegments), IDEM_FILTER_MAX_SEGMENTS);
		for (s = 0; s < nseg; s++)
		{
			r->digests += Min(pg_atomic_read_u32(&slot->seg[s].count),
							  slot->seg[s].capacity);
			r->capacity += slot->seg[s].capacity;
			r->bytes += (int64) slot->seg[s].npages * IDEM_FILTER_PAGE_BYTES;
		}
		r->segments = (int32) nseg;
	}
	LWLockRelease(idem_filter_shared->lock);

	for (i = 0; i < nrows; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};

		values[0] = ObjectIdGetDatum(rows[i].relid);
		values[1] = CStringGetTextDatum(filter_state_names[rows[i].state]);
		values[2] = Int64GetDatum(rows[i].digests);
		values[3] = Int64GetDatum(rows[i].capacity);
		values[4] = Int64GetDatum(rows[i].bytes);
		values[5] = Int32GetDatum(rows[i].segments);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	pfree(rows);
	return (Datum) 0;
}

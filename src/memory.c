/*-------------------------------------------------------------------------
 *
 * memory.c
 *	  Expired keys and message ids remembered (idempotency.key_memory).
 *
 * Once a key or message id has expired, its row is as if absent: a late
 * retry would run the operation again.  With idempotency.key_memory > 0
 * the pair (role, digest) of every expired row is remembered for that long
 * after its partition's range ended, and a call that finds no live row but
 * a remembered one answers for it: idem_claim() "expired" (writing
 * nothing), idem_consume_message() false, idem_lookup() "expired".
 *
 * Where a remembered pair is:
 *	- in the ledger, while the expired row's partition is not dropped yet:
 *	  IdemProbe() (probe.c) sees the row and asks IdemMemoryRowRemembered();
 *	  a partition whose range has ended, which the protocol leaves out
 *	  unless a writer may still be in it, is probed here (IdemMemoryProbe);
 *	- in the ledger's memory, idempotency.keys_memory or
 *	  idempotency.messages_memory, once maintenance has dropped the
 *	  partition: IdemMemoryRemember, run in the drop's own subtransaction
 *	  (storage.c, IdemDropPartition) with the partition locked ACCESS
 *	  EXCLUSIVE, reads its rows and writes one piece, a partition of the
 *	  memory table with the dropped partition's lane and bounds.  The piece
 *	  and the DROP commit or roll back together: a crash neither loses nor
 *	  doubles a piece.  Not for a ledger distributed by Citus (citus.c):
 *	  a piece is the node's, mixing tenants, and Citus would not move it
 *	  with them, so maintenance keeps its ended partitions instead until
 *	  key_memory has passed (maintain.c); their rows, in the tenants'
 *	  shards, answer as above on whichever node a tenant's shard is.
 *
 * A piece holds, per role, the role's digests sorted and cut into chunks of
 * at most a heap page: one row (expires_at, role, lane, last, digests) per
 * chunk, "last" its greatest digest, "digests" a byte string of one byte p,
 * the p bytes every digest of the chunk starts with, and each digest's
 * remaining 16 - p bytes in order.  A digest's first 4 bytes depend on its
 * namespace only, so the chunks of a namespace with many keys take 12 bytes
 * or less per key; with one namespace per key, 15 or 16.  Pages are filled
 * in turn, without a free space map (three pages a piece).  A piece of
 * more than IDEM_MEMORY_INDEX_PAGES pages gets an index on (role, last),
 * which finds the one chunk that can hold a digest with one descent; a
 * smaller one has none (a B-tree takes two pages however small: at 2,000
 * keys a day it doubled a piece) and a probe reads its few pages.  A binary
 * search in the chunk answers exactly: nothing probabilistic decides an
 * answer.  With the library preloaded the memory of each ledger has one
 * digest filter (filter.h) for all its pieces, filled from their chunks by
 * maintenance (IdemMemoryBuildFilters) and given the pairs of each piece
 * written since: a key no piece holds is ruled out with one test, however
 * many pieces there are; a piece dropped leaves its bits until maintenance
 * fills the filter again.  Without shared filters (not preloaded, or
 * filter_memory 0) each backend builds a filter of its own from the
 * pieces on first use (IdemMemoryLocalBuild) and throws it away with the
 * pieces' cache, which every ATTACH, DROP or import of a piece
 * invalidates.  A filter only rules out, a "maybe" is answered by the
 * probes.  The role leads every chunk's key, as in the ledgers
 * (doc/design.md, "Who holds what"): one role's probe never returns,
 * fetches or searches another role's chunk.
 *
 * Imported pairs (memory_transfer.c: a tenant moved from another node) go
 * into pieces of their own, lane IDEM_MEMORY_IMPORT_LANE, a UTC day wide,
 * indexed, one chunk per pair whose expires_at is when its key had expired
 * (IdemMemoryImport); a probe answers for such a chunk only while that is
 * less than key_memory ago.
 *
 * Forgetting: maintenance drops a piece once key_memory has passed since
 * its range ended (IdemMemoryForget), whole, like the ledgers' partitions.
 * A call consults only pieces whose range ended less than key_memory ago,
 * so that lowering the setting takes effect at once.  Pieces are written
 * once and then only read (an import adds chunks of a single digest to
 * the pieces of imported keys), all under the maintenance lock, and calls
 * release their locks on a piece as soon as they have read it, so that
 * dropping it waits for nobody.
 *
 * Like the ledgers, the memory tables are made on first use as the owner
 * of schema idempotency, are not members of the extension (pg_dump and
 * pg_upgrade carry them with their rows) and depend AUTO on it.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/memory.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "filter.h"
#include "keyhash.h"
#include "memory.h"
#include "privilege.h"
#include "protocol.h"
#include "storage.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/datetime.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

/* The columns of a memory table */
#define Anum_memory_expires_at		1	/* the piece's lower bound; imported:
											 * when the key had expired */
#define Anum_memory_role			2
#define Anum_memory_lane			3
#define Anum_memory_last			4	/* the chunk's greatest digest */
#define Anum_memory_digests			5	/* p, prefix, suffixes */
#define Natts_memory				5

/*
 * The most bytes of digests one chunk holds: with the row's other columns
 * and its header (60 bytes), a chunk fills at most one heap page, stored in
 * line (the column's storage is PLAIN).
 */
#define IDEM_MEMORY_CHUNK_BYTES		(MaxHeapTupleSize - 64)

/*
 * A piece of more pages than this gets a (role, last) index; a smaller one
 * is read whole by a probe.  A B-tree takes two pages (its metapage and a
 * leaf) however few its entries: on a piece of 16 pages or more, at most
 * an eighth of the heap.
 */
#define IDEM_MEMORY_INDEX_PAGES		16

/*
 * The memory's filter is made for this many times the pairs its pieces
 * hold: a false positive costs a probe of every piece of the key's lane
 * (29 with a month of daily pieces), not of one partition, so it is made
 * at 20 bits a pair (about 0.03 % false positives) rather than at the
 * partitions' 10 (about 1 %): 2.5 bytes of filter memory a pair.
 */
#define IDEM_MEMORY_FILTER_SLACK	2

int			idem_key_memory = 0;

/* The memory table of each ledger */
static const char *const memory_names[IDEM_NUM_LEDGERS] = {
	[IDEM_LEDGER_MESSAGES] = "messages_memory",
	[IDEM_LEDGER_KEYS] = "keys_memory",
};

/*
 * A backend's own filter of a ledger's memory, without shared filters
 * (IdemMemoryLocalBuild): a blocked Bloom filter of 512-bit blocks, 7 bits
 * a pair in one block, 20 bits a pair, keyed like the shared ones.
 */
typedef struct IdemMemoryLocalFilter
{
	bool		valid;			/* built for the cache's pieces */
	bool		usable;			/* false: too large, or no secret */
	uint64		secret_id;
	uint32		nblocks;		/* a power of two */
	uint64	   *words;			/* nblocks * 8 */
} IdemMemoryLocalFilter;

/*
 * At most this many pairs in a backend's own filter: 1.25 MB, and about
 * 280 million instructions to build (560 a pair, most of it SipHash)
 */
#define IDEM_MEMORY_LOCAL_MAX_PAIRS	500000

/*
 * The pieces of each memory table, read from the catalogs like the
 * ledgers' partitions (IdemReadPartitions) and kept until a relcache
 * invalidation of the table (sent by ATTACH and DROP of a piece).
 */
typedef struct IdemMemoryCache
{
	bool		valid;
	uint64		invalidations;
	Oid			parent;
	int			npieces;
	IdemPartition *pieces;		/* sorted by (lane, lower) */
	bool		has_legacy;		/* a piece of a legacy lane (no filter) */
	IdemMemoryLocalFilter local;	/* of these pieces */
} IdemMemoryCache;

static IdemMemoryCache memory_cache[IDEM_NUM_LEDGERS];

/* this maintenance run dropped a piece of the ledger's memory */
static bool memory_dropped[IDEM_NUM_LEDGERS];
static MemoryContext IdemMemoryContext = NULL;

/* One remembered pair, while a piece is being written */
typedef struct IdemMemoryPair
{
	Oid			role;
	pg_uuid_t	digest;
} IdemMemoryPair;

static void IdemMemoryRelcacheCallback(Datum arg, Oid relid);
static IdemMemoryCache *IdemGetMemoryCache(IdemLedger ledger);
static bool IdemMemoryLocalRulesOut(IdemLedger ledger, Oid role,
									const pg_uuid_t *digest);
static void IdemMemoryLocalBuild(IdemLedger ledger);
static uint64 IdemMemoryLocalMix(uint64 x);
static uint64 IdemMemoryPairsEstimate(IdemLedger ledger);
static Oid	IdemMemoryMakeParent(IdemLedger ledger);
static bool IdemMemoryLaneOf(const IdemDigest *digest, int16 lane,
							 pg_uuid_t *form);
static bool IdemMemoryRecallsBeyond(IdemLedger ledger, Oid role,
									const IdemDigest *digest, TimestampTz now,
									const IdemOpenPartition *probed,
									int nprobed);
static bool IdemMemoryProbeEnded(IdemLedger ledger, const IdemPartition *part,
								 Oid role, const IdemDigest *digest,
								 TimestampTz now);
static bool IdemMemoryProbePiece(Oid relid, Oid role, const pg_uuid_t *digest,
								 TimestampTz since);
static bool IdemMemoryChunkHas(bytea *chunk, const pg_uuid_t *digest);
static bool IdemMemoryChunkAnswers(TupleTableSlot *slot,
								   const pg_uuid_t *digest, TimestampTz since);
static void IdemMemoryChunkFill(bytea *chunk, Oid role, IdemFilterFill *fill);
static int	IdemMemoryPairCmp(const void *a, const void *b);
static int	IdemMemoryCommonPrefix(const pg_uuid_t *a, const pg_uuid_t *b);
static void IdemMemoryInsertChunk(Relation rel, const IdemPartition *piece,
								  Oid role, const IdemMemoryPair *pairs,
								  int n, int prefix, bool indexed);
static Oid	IdemMemoryIndexOf(Relation heap);
static void IdemMemoryAttach(IdemLedger ledger, const char *name,
							 const IdemPartition *piece, int lock_timeout_ms);

/*
 * IdemMemoryDefineSettings defines idempotency.key_memory (from _PG_init).
 */
void
IdemMemoryDefineSettings(void)
{
	DefineCustomIntVariable("idempotency.key_memory",
							gettext_noop("Sets how long an expired idempotency key or message id is remembered after its partition is dropped."),
							gettext_noop("A remembered key is answered \"expired\" by idem_claim() and a remembered message id false by idem_consume_message(); 0 remembers nothing."),
							&idem_key_memory,
							0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* IdemMemoryInit registers the invalidation callback of the pieces' cache */
void
IdemMemoryInit(void)
{
	IdemRegisterRelcacheCallback(IdemMemoryRelcacheCallback);
}

static void
IdemMemoryRelcacheCallback(Datum arg, Oid relid)
{
	int			ledger;

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		IdemMemoryCache *cache = &memory_cache[ledger];

		if (!OidIsValid(relid) || !OidIsValid(cache->parent) ||
			relid == cache->parent)
		{
			cache->valid = false;
			cache->invalidations++;
		}
	}
}

/*
 * IdemGetMemoryCache returns the pieces of a ledger's memory, read again if
 * an invalidation arrived since they were read.
 */
static IdemMemoryCache *
IdemGetMemoryCache(IdemLedger ledger)
{
	IdemMemoryCache *cache = &memory_cache[ledger];
	uint64		invalidations;
	Oid			nspid;
	Oid			parent = InvalidOid;
	IdemPartition *parts = NULL;
	int			n = 0;

	if (cache->valid)
		return cache;
	if (IdemMemoryContext == NULL)
		IdemMemoryContext = AllocSetContextCreate(CacheMemoryContext,
												  "idempotency memory cache",
												  ALLOCSET_SMALL_SIZES);
	invalidations = cache->invalidations;
	nspid = get_namespace_oid(IDEM_SCHEMA_NAME, true);
	if (OidIsValid(nspid))
		parent = get_relname_relid(memory_names[ledger], nspid);
	/* from here on, an invalidation of the table makes the result stale */
	cache->parent = parent;
	if (OidIsValid(parent))
		n = IdemReadPartitions(parent, IDEM_MEMORY_IMPORT_LANE, &parts);

	if (cache->pieces != NULL)
		pfree(cache->pieces);
	cache->pieces = NULL;
	cache->npieces = 0;
	cache->has_legacy = false;
	if (cache->local.words != NULL)
		pfree(cache->local.words);
	memset(&cache->local, 0, sizeof(cache->local));
	if (n > 0)
	{
		int			i;

		cache->pieces = MemoryContextAlloc(IdemMemoryContext,
										   n * sizeof(IdemPartition));
		memcpy(cache->pieces, parts, n * sizeof(IdemPartition));
		cache->npieces = n;
		for (i = 0; i < n; i++)
			if (IdemLaneIsLegacy(parts[i].lane))
				cache->has_legacy = true;
	}
	if (parts != NULL)
		pfree(parts);
	cache->valid = (cache->invalidations == invalidations);
	return cache;
}

/*
 * IdemMemoryParent returns the OID of a ledger's memory table, or
 * InvalidOid if it has not been made.
 */
Oid
IdemMemoryParent(IdemLedger ledger)
{
	return IdemGetMemoryCache(ledger)->parent;
}

/*
 * IdemMemoryPieces returns palloc'd copies of the pieces of a ledger's
 * memory, in (lane, lower) order.
 */
List *
IdemMemoryPieces(IdemLedger ledger)
{
	IdemMemoryCache *cache = IdemGetMemoryCache(ledger);
	List	   *result = NIL;
	int			i;

	for (i = 0; i < cache->npieces; i++)
	{
		IdemPartition *p = palloc(sizeof(IdemPartition));

		*p = cache->pieces[i];
		result = lappend(result, p);
	}
	return result;
}

/*
 * IdemIsMemoryRelation: is relid a ledger's memory table or one of its
 * pieces?  For the digest filters' hooks (filter_hooks.c): a row written
 * into a piece by anything but maintenance or an import (a restore of its
 * data, an INSERT by a superuser) is not in the memory's filter, so it is
 * an external write like one into a ledger.
 */
bool
IdemIsMemoryRelation(Oid relid)
{
	int			ledger;

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		IdemMemoryCache *cache = IdemGetMemoryCache(ledger);
		int			i;

		if (!OidIsValid(cache->parent))
			continue;
		if (relid == cache->parent)
			return true;
		for (i = 0; i < cache->npieces; i++)
			if (cache->pieces[i].relid == relid)
				return true;
	}
	return false;
}

/*
 * IdemMemoryMakeParent makes a ledger's memory table if it does not exist
 * (as the owner of schema idempotency, under the ledger's creation lock)
 * and returns its OID.
 */
static Oid
IdemMemoryMakeParent(IdemLedger ledger)
{
	const char *name = memory_names[ledger];
	LOCKTAG		tag;
	char	   *sql;
	Oid			parent;
	ObjectAddress table;
	ObjectAddress extension;

	parent = IdemMemoryParent(ledger);
	if (OidIsValid(parent))
		return parent;

	IdemSetLedgerLockTag(&tag, ledger, IDEM_LOCK_CREATE);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	AcceptInvalidationMessages();
	parent = IdemMemoryParent(ledger);
	if (OidIsValid(parent))
		return parent;

	sql = psprintf("CREATE TABLE idempotency.%s ("
				   "expires_at pg_catalog.timestamptz NOT NULL, "
				   "role pg_catalog.regrole NOT NULL, "
				   "lane pg_catalog.int2 NOT NULL, "
				   "last pg_catalog.uuid NOT NULL, "
				   "digests pg_catalog.bytea NOT NULL"
				   ") PARTITION BY RANGE (lane, expires_at); "
				   "ALTER TABLE idempotency.%s ALTER COLUMN digests SET STORAGE PLAIN; "
				   "COMMENT ON TABLE idempotency.%s IS %s",
				   name, name, name,
				   quote_literal_cstr(ledger == IDEM_LEDGER_KEYS ?
									  "Expired idempotency keys remembered (idempotency.key_memory); managed by the idempotency extension." :
									  "Expired message ids remembered (idempotency.key_memory); managed by the idempotency extension."));
	IdemExecAsOwner(sql, 0);
	pfree(sql);

	memory_cache[ledger].valid = false;
	parent = IdemMemoryParent(ledger);
	if (!OidIsValid(parent))
		elog(ERROR, "could not find table \"%s.%s\" after creating it",
			 IDEM_SCHEMA_NAME, name);
	IdemRestrictTableAcl(parent);

	/* DROP EXTENSION takes the table with it */
	ObjectAddressSet(table, RelationRelationId, parent);
	ObjectAddressSet(extension, ExtensionRelationId,
					 get_extension_oid("idempotency", false));
	recordDependencyOn(&table, &extension, DEPENDENCY_AUTO);
	CommandCounterIncrement();
	return parent;
}

/*
 * IdemMemoryUpkeep, every maintenance round: the AUTO dependency of each
 * memory table on the extension (pg_restore does not carry it), and no
 * privilege for anyone but the owner on the tables and their pieces.
 */
void
IdemMemoryUpkeep(void)
{
	int			ledger;

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		Oid			parent = IdemMemoryParent(ledger);
		List	   *pieces;
		ListCell   *lc;

		if (!OidIsValid(parent))
			continue;
		IdemEnsureRelationDependency(parent);
		IdemRestrictTableAcl(parent);
		pieces = IdemMemoryPieces(ledger);
		foreach(lc, pieces)
			IdemRestrictTableAcl(((IdemPartition *) lfirst(lc))->relid);
		list_free_deep(pieces);
	}
}

/* ----------------------------------------------------------------
 * Answering: is a key remembered?
 * ----------------------------------------------------------------
 */

/*
 * IdemMemoryRowRemembered, for IdemProbe(): is the committed, expired row
 * in the slot, of partition "part", remembered now?  Yes while
 * key_memory has not passed since the partition's range ended, unless it
 * is a released key (nothing ran under it, so a retry may run).
 */
bool
IdemMemoryRowRemembered(TupleTableSlot *slot, const IdemPartition *part,
						TimestampTz now)
{
	bool		isnull;

	if (idem_key_memory <= 0 ||
		part->upper <= now - (int64) idem_key_memory * USECS_PER_SEC)
		return false;
	/* the key ledger's rows have a state */
	if (slot->tts_tupleDescriptor->natts >= Anum_keys_state &&
		DatumGetChar(slot_getattr(slot, Anum_keys_state, &isnull)) == KEY_RELEASED)
		return false;
	return true;
}

/*
 * IdemMemoryProbe, at the end of every probe of the protocol (IdemOpProbe):
 * when no live row was found and none of the expired rows seen is
 * remembered, looks further: in the ended partitions the probe left out,
 * then in the memory's pieces.  Sets op->probe.remembered.
 */
void
IdemMemoryProbe(IdemOp *op)
{
	if (idem_key_memory <= 0 || op->probe.found != IDEM_FOUND_NONE ||
		op->probe.remembered)
		return;
	op->probe.remembered = IdemMemoryRecallsBeyond(op->ledger, op->role,
												   &op->digest, op->now,
												   op->open, op->nopen);
}

/*
 * IdemMemoryRecalls: is the key (or message id) remembered without a live
 * row, in an ended partition not dropped yet or in the memory?  The
 * caller has found no live row (under the key lock, for a writer).
 *
 * The ended partitions come first: a partition that maintenance is
 * dropping is locked here, which waits for the drop's transaction, and a
 * drop that committed has committed its piece too, which the memory's
 * cache, read after that lock, then lists.
 */
bool
IdemMemoryRecalls(IdemLedger ledger, Oid role, const IdemDigest *digest,
				  TimestampTz now)
{
	return IdemMemoryRecallsBeyond(ledger, role, digest, now, NULL, 0);
}

/*
 * IdemMemoryRecallsBeyond is IdemMemoryRecalls for a caller whose probe
 * has just searched the partitions probed[0 .. nprobed) for the key, still
 * holding their locks, and found neither a live row nor a remembered one:
 * those are not probed again.  The protocol's probe searches every ended
 * partition it can lock at once (probe.c, IdemLockEndedPartition), so an
 * ended partition is probed here only if the probe left it out (a drop
 * under way).  This halves what a key never seen costs on a ledger
 * distributed by Citus, whose ended partitions are kept for key_memory
 * (maintain.c), one probe of each instead of two.
 */
static bool
IdemMemoryRecallsBeyond(IdemLedger ledger, Oid role, const IdemDigest *digest,
						TimestampTz now, const IdemOpenPartition *probed,
						int nprobed)
{
	TimestampTz since = now - (int64) idem_key_memory * USECS_PER_SEC;
	IdemPartition *parts;
	IdemMemoryCache *cache;
	int			n;
	int			i;
	bool		found = false;
	bool		ruled_out;

	if (idem_key_memory <= 0)
		return false;

	n = IdemLivePartitionsForKey(ledger, &digest->uuid, now, &parts);
	for (i = 0; i < n && !found; i++)
	{
		int			j;

		if (!parts[i].ended || parts[i].upper <= since ||
			IdemFilterRulesOut(parts[i].relid, parts[i].lane, role,
							   &digest->uuid))
			continue;
		for (j = 0; j < nprobed; j++)
			if (probed[j].part.relid == parts[i].relid)
				break;
		if (j < nprobed)
			continue;			/* searched by the caller's probe */
		found = IdemMemoryProbeEnded(ledger, &parts[i], role, digest, now);
	}
	pfree(parts);
	if (found)
		return true;

	/*
	 * The memory's filter (one for all its pieces) rules out a key none of
	 * them holds with one test; pieces of legacy lanes, which it does not
	 * cover, are probed all the same.
	 */
	cache = IdemGetMemoryCache(ledger);
	if (cache->npieces == 0)
		return false;
	if (IdemFiltersShared())
		ruled_out = IdemFilterRulesOut(cache->parent, IDEM_FILTER_MEMORY_LANE,
									   role, &digest->uuid);
	else
		ruled_out = IdemMemoryLocalRulesOut(ledger, role, &digest->uuid);
	cache = IdemGetMemoryCache(ledger);
	if (ruled_out && !cache->has_legacy)
		return false;

	/*
	 * The pieces of the key's lanes whose range ended less than key_memory
	 * ago; copied, since locking a piece may rebuild the cache.
	 */
	n = 0;
	parts = palloc(cache->npieces * sizeof(IdemPartition));
	for (i = 0; i < cache->npieces; i++)
	{
		if (cache->pieces[i].upper > since &&
			(!ruled_out || IdemLaneIsLegacy(cache->pieces[i].lane)))
			parts[n++] = cache->pieces[i];
	}
	for (i = 0; i < n && !found; i++)
	{
		pg_uuid_t	form;

		if (IdemMemoryLaneOf(digest, parts[i].lane, &form))
			found = IdemMemoryProbePiece(parts[i].relid, role, &form,
										 parts[i].lane == IDEM_MEMORY_IMPORT_LANE ?
										 since : DT_NOBEGIN);
	}
	pfree(parts);
	return found;
}

/*
 * IdemMemoryLocalRulesOut, without shared filters: does this backend's own
 * filter of the ledger's memory rule the pair out?  The filter is built on
 * first use after the pieces' cache was read (a piece attached, dropped or
 * imported into sends an invalidation of the memory table, which throws
 * both away), so that a never-seen key costs one test here too; the
 * build reads every piece once per backend and per change of the memory.
 */
static bool
IdemMemoryLocalRulesOut(IdemLedger ledger, Oid role, const pg_uuid_t *digest)
{
	IdemMemoryCache *cache = IdemGetMemoryCache(ledger);
	IdemMemoryLocalFilter *f;
	uint64		secret_id;
	uint64		item;
	uint64		h;
	const uint64 *block;
	int			i;

	if (!cache->local.valid)
		IdemMemoryLocalBuild(ledger);
	cache = IdemGetMemoryCache(ledger);
	f = &cache->local;
	if (!f->valid || !f->usable ||
		!IdemFilterKeyedItem(role, digest, &secret_id, &item) ||
		secret_id != f->secret_id)
		return false;
	h = IdemMemoryLocalMix(item);
	block = f->words + (Size) (h & (f->nblocks - 1)) * 8;
	for (i = 0; i < 7; i++)
	{
		uint32		bit = (uint32) (item >> (9 * i)) & 511;

		if ((block[bit >> 6] & ((uint64) 1 << (bit & 63))) == 0)
			return true;
	}
	return false;
}

/* MurmurHash3's 64-bit finalizer: the block, from other bits of the item */
static uint64
IdemMemoryLocalMix(uint64 x)
{
	x ^= x >> 33;
	x *= UINT64CONST(0xFF51AFD7ED558CCD);
	x ^= x >> 33;
	x *= UINT64CONST(0xC4CEB9FE1A85EC53);
	x ^= x >> 33;
	return x;
}

/*
 * IdemMemoryLocalBuild builds this backend's filter of a ledger's memory
 * from the chunks of its pieces of current lanes, under a snapshot taken
 * now.  Left unusable if the pieces hold more than
 * IDEM_MEMORY_LOCAL_MAX_PAIRS (calls probe them), if there is no secret,
 * or if a piece cannot be read; not valid (built again by the next call)
 * if the pieces' cache was read again meanwhile.
 */
static void
IdemMemoryLocalBuild(IdemLedger ledger)
{
	IdemMemoryCache *cache = IdemGetMemoryCache(ledger);
	uint64		generation = cache->invalidations;
	List	   *pieces = IdemMemoryPieces(ledger);
	ListCell   *lc;
	uint64		pairs = 0;
	uint64		secret_id;
	uint64		item;
	uint32		nblocks = 1;
	uint64	   *words = NULL;
	bool		usable = true;
	Snapshot	snapshot;
	pg_uuid_t	zero = {{0}};

	if (!IdemFilterKeyedItem(InvalidOid, &zero, &secret_id, &item))
		usable = false;

	/*
	 * The pieces' sizes, then their chunks, each piece under a lock of its
	 * own released before the next (a call's transaction keeps no lock on
	 * them).  A piece written, dropped or imported into meanwhile
	 * invalidates the cache: the filter is then not kept.
	 */
	foreach(lc, pieces)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);
		Relation	rel;

		if (!usable)
			break;
		if (IdemLaneIsLegacy(p->lane))
			continue;
		LockRelationOid(p->relid, AccessShareLock);
		rel = try_relation_open(p->relid, NoLock);
		if (rel == NULL)
		{
			UnlockRelationOid(p->relid, AccessShareLock);
			continue;
		}
		if (RelationGetDescr(rel)->natts != Natts_memory)
			usable = false;
		pairs += (uint64) RelationGetNumberOfBlocks(rel) * (BLCKSZ / 12);
		relation_close(rel, AccessShareLock);
	}
	if (pairs > IDEM_MEMORY_LOCAL_MAX_PAIRS)
		usable = false;
	if (usable)
	{
		while ((uint64) nblocks * 512 < pairs * 20)
			nblocks *= 2;
		words = MemoryContextAllocZero(IdemMemoryContext,
									   (Size) nblocks * 8 * sizeof(uint64));
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		foreach(lc, pieces)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);
			Relation	rel;
			TableScanDesc scan;
			HeapTuple	tuple;

			if (IdemLaneIsLegacy(p->lane))
				continue;
			LockRelationOid(p->relid, AccessShareLock);
			rel = try_relation_open(p->relid, NoLock);
			if (rel == NULL)
			{
				UnlockRelationOid(p->relid, AccessShareLock);
				continue;
			}
			scan = table_beginscan(rel, snapshot, 0, NULL);
			while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
			{
				TupleDesc	desc = RelationGetDescr(rel);
				bool		isnull[2];
				Datum		chunk = heap_getattr(tuple, Anum_memory_digests, desc, &isnull[0]);
				Datum		role = heap_getattr(tuple, Anum_memory_role, desc, &isnull[1]);
				const uint8 *data;
				int			len;
				int			prefix;
				int			width;
				int			i;
				pg_uuid_t	digest;

				CHECK_FOR_INTERRUPTS();
				if (isnull[0] || isnull[1])
					continue;
				data = (const uint8 *) VARDATA_ANY(DatumGetByteaPP(chunk));
				len = VARSIZE_ANY_EXHDR(DatumGetByteaPP(chunk));
				if (len < 1 || data[0] >= IDEM_DIGEST_LEN || len < 1 + data[0])
					continue;
				prefix = data[0];
				width = IDEM_DIGEST_LEN - prefix;
				memcpy(digest.data, data + 1, prefix);
				for (i = 0; 1 + prefix + (i + 1) * width <= len; i++)
				{
					uint64		h;
					uint64	   *block;
					int			k;

					memcpy(digest.data + prefix, data + 1 + prefix + i * width, width);
					(void) IdemFilterKeyedItem(DatumGetObjectId(role), &digest,
											   &secret_id, &item);
					h = IdemMemoryLocalMix(item);
					block = words + (Size) (h & (nblocks - 1)) * 8;
					for (k = 0; k < 7; k++)
					{
						uint32		bit = (uint32) (item >> (9 * k)) & 511;

						block[bit >> 6] |= (uint64) 1 << (bit & 63);
					}
				}
			}
			table_endscan(scan);
			relation_close(rel, AccessShareLock);
		}
		UnregisterSnapshot(snapshot);
	}
	list_free_deep(pieces);

	/* the pieces' cache read again meanwhile: built for other pieces */
	cache = IdemGetMemoryCache(ledger);
	if (cache->invalidations != generation || !cache->valid)
	{
		if (words != NULL)
			pfree(words);
		return;
	}
	if (cache->local.words != NULL)
		pfree(cache->local.words);
	cache->local.words = words;
	cache->local.nblocks = nblocks;
	cache->local.secret_id = secret_id;
	cache->local.usable = usable;
	cache->local.valid = true;
}

/*
 * IdemMemoryLaneOf: would the digest's row be in lane "lane"?  If so, sets
 * *form to the digest in the form that lane's rows store (legacy lanes:
 * the form before 0.3.0).
 */
static bool
IdemMemoryLaneOf(const IdemDigest *digest, int16 lane, pg_uuid_t *form)
{
	bool		legacy = IdemLaneIsLegacy(lane);
	int16		value;

	/* the pieces of imported keys take every key */
	if (lane == IDEM_MEMORY_IMPORT_LANE)
	{
		*form = digest->uuid;
		return true;
	}
	value = IdemLaneValue(&digest->uuid, IdemLaneLanes(lane), legacy);

	if (!legacy && IdemLaneIsFar(lane))
		value = IdemFarLane(value);
	if (value != lane)
		return false;
	if (legacy)
		IdemLegacyDigest(digest, form);
	else
		*form = digest->uuid;
	return true;
}

/*
 * IdemMemoryProbeEnded probes an ended ledger partition for an expired row
 * of the key that is remembered (see IdemProbe), under a lock of its own
 * that it releases before it returns.  A partition dropped meanwhile has
 * nothing.
 */
static bool
IdemMemoryProbeEnded(IdemLedger ledger, const IdemPartition *part, Oid role,
					 const IdemDigest *digest, TimestampTz now)
{
	IdemOpenPartition open;
	IdemProbeResult result;
	IdemPartition p = *part;

	LockRelationOid(p.relid, AccessShareLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(p.relid)))
	{
		UnlockRelationOid(p.relid, AccessShareLock);
		return false;
	}
	p.ended = true;				/* IdemClosePartitions releases the lock */
	IdemOpenPartitionRels(&open, ledger, &p, AccessShareLock, true);
	IdemProbe(&open, 1, role, digest, now, false, NULL, &result);
	IdemClosePartitions(&open, 1);
	return result.remembered ||
		(result.found != IDEM_FOUND_NONE && result.found != IDEM_FOUND_BUSY);
}

/*
 * IdemMemoryProbePiece: does piece "relid" remember the role's digest?  A
 * piece of more than IDEM_MEMORY_INDEX_PAGES pages has a (role, last)
 * index: one descent to the role's first chunk whose last digest is not
 * smaller, and a binary search in that chunk.  A smaller piece has none
 * (the index would cost more than its heap): its few pages are read, and
 * the chunk of the role whose range holds the digest is searched.  A
 * piece of imported keys (since > DT_NOBEGIN) answers only for a chunk
 * whose key expired after "since".  The locks are released at once.
 */
static bool
IdemMemoryProbePiece(Oid relid, Oid role, const pg_uuid_t *digest,
					 TimestampTz since)
{
	Relation	heap;
	Oid			indexoid;
	TupleTableSlot *slot;
	bool		found = false;

	LockRelationOid(relid, AccessShareLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
	{
		UnlockRelationOid(relid, AccessShareLock);
		return false;
	}
	heap = table_open(relid, NoLock);
	if (RelationGetDescr(heap)->natts != Natts_memory)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("piece \"%s\" of the idempotency memory does not have its columns",
						RelationGetRelationName(heap))));
	indexoid = IdemMemoryIndexOf(heap);
	slot = table_slot_create(heap, NULL);
	if (OidIsValid(indexoid))
	{
		Relation	index = index_open(indexoid, AccessShareLock);
		IndexScanDesc scan;
		ScanKeyData skeys[2];
		bool		isnull;

		ScanKeyInit(&skeys[0], 1, BTEqualStrategyNumber, F_OIDEQ,
					ObjectIdGetDatum(role));
		ScanKeyInit(&skeys[1], 2, BTGreaterEqualStrategyNumber, F_UUID_GE,
					UUIDPGetDatum(digest));
		scan = IdemIndexBeginScan(heap, index, SnapshotSelf, 2);
		index_rescan(scan, skeys, 2, NULL, 0);

		/*
		 * The first chunk whose last digest is not smaller is the only one
		 * that can hold it, but for imported chunks of that one digest
		 */
		while (!found && index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			found = IdemMemoryChunkAnswers(slot, digest, since);
			if (memcmp(DatumGetUUIDP(slot_getattr(slot, Anum_memory_last,
												  &isnull))->data,
					   digest->data, IDEM_DIGEST_LEN) != 0)
				break;
		}
		index_endscan(scan);
		index_close(index, NoLock);
		UnlockRelationOid(indexoid, AccessShareLock);
	}
	else
	{
		TableScanDesc scan = table_beginscan(heap, SnapshotSelf, 0, NULL);

		/* every chunk of the role whose last digest is not smaller */
		while (!found &&
			   table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d;

			d = slot_getattr(slot, Anum_memory_role, &isnull);
			if (isnull || DatumGetObjectId(d) != role)
				continue;
			d = slot_getattr(slot, Anum_memory_last, &isnull);
			if (isnull ||
				memcmp(DatumGetUUIDP(d)->data, digest->data, IDEM_DIGEST_LEN) < 0)
				continue;
			found = IdemMemoryChunkAnswers(slot, digest, since);
		}
		table_endscan(scan);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(heap, NoLock);
	UnlockRelationOid(relid, AccessShareLock);
	return found;
}

/*
 * IdemMemoryChunkAnswers: does the chunk in the slot hold the digest, with
 * its key expired after "since" (DT_NOBEGIN: whenever)?
 */
static bool
IdemMemoryChunkAnswers(TupleTableSlot *slot, const pg_uuid_t *digest,
					   TimestampTz since)
{
	bool		isnull;
	Datum		d;

	if (since != DT_NOBEGIN)
	{
		d = slot_getattr(slot, Anum_memory_expires_at, &isnull);
		if (isnull || DatumGetTimestampTz(d) <= since)
			return false;
	}
	d = slot_getattr(slot, Anum_memory_digests, &isnull);
	return !isnull && IdemMemoryChunkHas(DatumGetByteaPP(d), digest);
}

/* the OID of a piece's (role, last) index: its first index on role */
static Oid
IdemMemoryIndexOf(Relation heap)
{
	List	   *indexes = RelationGetIndexList(heap);
	ListCell   *lc;
	Oid			result = InvalidOid;

	foreach(lc, indexes)
	{
		HeapTuple	tup = SearchSysCache1(INDEXRELID,
										  ObjectIdGetDatum(lfirst_oid(lc)));
		Form_pg_index form;

		if (!HeapTupleIsValid(tup))
			continue;
		form = (Form_pg_index) GETSTRUCT(tup);
		if (form->indnatts == 2 &&
			form->indkey.values[0] == Anum_memory_role &&
			form->indkey.values[1] == Anum_memory_last &&
			form->indisvalid && heap_attisnull(tup, Anum_pg_index_indpred, NULL) &&
			heap_attisnull(tup, Anum_pg_index_indexprs, NULL))
			result = form->indexrelid;
		ReleaseSysCache(tup);
		if (OidIsValid(result))
			break;
	}
	list_free(indexes);
	return result;
}

/*
 * IdemMemoryChunkHas: does the chunk (see the top of the file) hold the
 * digest?  Its entries are sorted: a binary search.
 */
static bool
IdemMemoryChunkHas(bytea *chunk, const pg_uuid_t *digest)
{
	const uint8 *data = (const uint8 *) VARDATA_ANY(chunk);
	int			len = VARSIZE_ANY_EXHDR(chunk);
	int			prefix;
	int			width;
	int			lo;
	int			hi;

	if (len < 1)
		return false;
	prefix = data[0];
	if (prefix >= IDEM_DIGEST_LEN || len < 1 + prefix)
		return false;
	if (memcmp(data + 1, digest->data, prefix) != 0)
		return false;
	width = IDEM_DIGEST_LEN - prefix;
	data += 1 + prefix;
	lo = 0;
	hi = (len - 1 - prefix) / width;
	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int			c = memcmp(data + mid * width, digest->data + prefix, width);

		if (c == 0)
			return true;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* ----------------------------------------------------------------
 * Remembering a partition, forgetting pieces
 * ----------------------------------------------------------------
 */

static int
IdemMemoryPairCmp(const void *a, const void *b)
{
	const IdemMemoryPair *x = (const IdemMemoryPair *) a;
	const IdemMemoryPair *y = (const IdemMemoryPair *) b;

	if (x->role != y->role)
		return x->role < y->role ? -1 : 1;
	return memcmp(x->digest.data, y->digest.data, IDEM_DIGEST_LEN);
}

/* how many leading bytes two digests share, at most 15 */
static int
IdemMemoryCommonPrefix(const pg_uuid_t *a, const pg_uuid_t *b)
{
	int			i;

	for (i = 0; i < IDEM_DIGEST_LEN - 1; i++)
		if (a->data[i] != b->data[i])
			break;
	return i;
}

/*
 * IdemMemoryRemember, called by IdemDropPartition in the drop's
 * subtransaction before the DROP (with key_memory > 0): locks the ledger
 * partition "relid" ACCESS EXCLUSIVE (waiting at most lock_timeout_ms: the
 * lock the DROP takes anyway, so that no writer is in it any more), reads
 * the (role, digest) pairs of its committed rows, released keys left out,
 * and writes them into a new piece of the ledger's memory with the
 * partition's lane and bounds.  "arg" points to the ledger.  A partition
 * without rows to remember makes no piece.
 */
void
IdemMemoryRemember(Oid relid, int lock_timeout_ms, void *arg)
{
	IdemLedger	ledger = *(IdemLedger *) arg;
	const char *ledger_name = IdemLedgerName(ledger);
	char	   *relname = get_rel_name(relid);
	IdemPartition piece = {0};
	List	   *parts;
	ListCell   *lc;
	bool		known = false;
	char	   *sql;
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;
	Snapshot	snapshot;
	IdemMemoryPair *pairs;
	Size		allocated = 1024;
	Size		n = 0;
	Size		i;
	Size		nunique;
	bool		with_state;
	StringInfoData name;
	Oid			parent;
	Oid			piece_relid;
	Relation	piece_rel;
	BlockNumber pages;

	if (relname == NULL)
		return;

	/* the partition's lane and bounds */
	parts = IdemAllPartitions(ledger);
	foreach(lc, parts)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);

		if (p->relid == relid)
		{
			piece = *p;
			known = true;
		}
	}
	list_free_deep(parts);
	if (!known)
		return;

	sql = psprintf("LOCK TABLE idempotency.%s IN ACCESS EXCLUSIVE MODE",
				   quote_identifier(relname));
	IdemExecAsOwner(sql, lock_timeout_ms);
	pfree(sql);

	/* every committed row: nobody writes there any more */
	rel = table_open(relid, NoLock);
	with_state = RelationGetDescr(rel)->natts >= Anum_keys_state;
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	pairs = palloc_extended(allocated * sizeof(IdemMemoryPair), MCXT_ALLOC_HUGE);
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;

		CHECK_FOR_INTERRUPTS();
		if (with_state &&
			DatumGetChar(slot_getattr(slot, Anum_keys_state, &isnull)) == KEY_RELEASED)
			continue;
		if (n == allocated)
		{
			allocated *= 2;
			pairs = repalloc_huge(pairs, allocated * sizeof(IdemMemoryPair));
		}
		pairs[n].role = DatumGetObjectId(slot_getattr(slot, Anum_ledger_role, &isnull));
		pairs[n].digest = *DatumGetUUIDP(slot_getattr(slot, Anum_ledger_digest, &isnull));
		n++;
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	table_close(rel, NoLock);
	if (n == 0)
	{
		pfree(pairs);
		return;
	}
	qsort(pairs, n, sizeof(IdemMemoryPair), IdemMemoryPairCmp);
	nunique = 1;
	for (i = 1; i < n; i++)
		if (IdemMemoryPairCmp(&pairs[i], &pairs[nunique - 1]) != 0)
			pairs[nunique++] = pairs[i];
	n = nunique;

	/* <memory table><the partition's name after its ledger's name> */
	parent = IdemMemoryMakeParent(ledger);
	initStringInfo(&name);
	appendStringInfoString(&name, memory_names[ledger]);
	if (strncmp(relname, ledger_name, strlen(ledger_name)) == 0)
		appendStringInfoString(&name, relname + strlen(ledger_name));
	else
		appendStringInfo(&name, "_%u", relid);
	sql = psprintf("CREATE TABLE idempotency.%s (LIKE idempotency.%s INCLUDING STORAGE)",
				   quote_identifier(name.data), memory_names[ledger]);
	IdemExecAsOwner(sql, lock_timeout_ms);
	pfree(sql);
	piece_relid = get_relname_relid(name.data,
									get_namespace_oid(IDEM_SCHEMA_NAME, false));
	if (!OidIsValid(piece_relid))
		elog(ERROR, "could not find table \"%s.%s\" after creating it",
			 IDEM_SCHEMA_NAME, name.data);

	/* the chunks, role by role, each as long as a page allows */
	piece_rel = table_open(piece_relid, RowExclusiveLock);
	i = 0;
	while (i < n)
	{
		Size		j = i;
		int			prefix = IDEM_DIGEST_LEN - 1;

		while (j + 1 < n && pairs[j + 1].role == pairs[i].role)
		{
			int			p = Min(prefix,
								IdemMemoryCommonPrefix(&pairs[i].digest,
													   &pairs[j + 1].digest));
			Size		count = j + 2 - i;

			if (1 + p + count * (IDEM_DIGEST_LEN - p) > IDEM_MEMORY_CHUNK_BYTES)
				break;
			prefix = p;
			j++;
		}
		CHECK_FOR_INTERRUPTS();
		IdemMemoryInsertChunk(piece_rel, &piece, pairs[i].role, &pairs[i],
							  (int) (j + 1 - i), prefix, false);
		i = j + 1;
	}
	pages = RelationGetNumberOfBlocks(piece_rel);
	table_close(piece_rel, NoLock);
	CommandCounterIncrement();

	/*
	 * The memory's filter, if it has one, takes the pairs (filter.h): the
	 * caller holds the maintenance lock, under which the filter is filled.
	 */
	if (!IdemLaneIsLegacy(piece.lane))
		for (i = 0; i < n; i++)
			IdemFilterAdd(parent, IDEM_FILTER_MEMORY_LANE, pairs[i].role,
						  &pairs[i].digest);
	pfree(pairs);

	/* a piece too small for an index to pay is read whole by a probe */
	if (pages > IDEM_MEMORY_INDEX_PAGES)
	{
		sql = psprintf("CREATE INDEX ON idempotency.%s (role, last) "
					   "WITH (deduplicate_items = off)",
					   quote_identifier(name.data));
		IdemExecAsOwner(sql, lock_timeout_ms);
		pfree(sql);
	}

	/* attached with the partition's bounds: ATTACH builds its index */
	IdemMemoryAttach(ledger, name.data, &piece, lock_timeout_ms);
	pfree(name.data);
}

/*
 * IdemMemoryAttach attaches table "name" of schema idempotency to a
 * ledger's memory as the piece of "piece"'s lane and bounds, and takes
 * every privilege on it back.
 */
static void
IdemMemoryAttach(IdemLedger ledger, const char *name,
				 const IdemPartition *piece, int lock_timeout_ms)
{
	StringInfoData sql;

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "ALTER TABLE idempotency.%s ATTACH PARTITION idempotency.%s "
					 "FOR VALUES FROM (%d, ",
					 memory_names[ledger], quote_identifier(name), piece->lane);
	IdemAppendTimestamp(&sql, piece->lower);
	appendStringInfo(&sql, ") TO (%d, ", piece->lane);
	IdemAppendTimestamp(&sql, piece->upper);
	appendStringInfoString(&sql, ")");
	IdemExecAsOwner(sql.data, lock_timeout_ms);
	pfree(sql.data);
	IdemRestrictTableAcl(get_relname_relid(name,
										   get_namespace_oid(IDEM_SCHEMA_NAME, false)));
	memory_cache[ledger].valid = false;
	CommandCounterIncrement();
}

/*
 * IdemMemoryInsertChunk writes one chunk of a piece: the role's digests
 * pairs[0 .. n-1], sorted, all starting with the same "prefix" bytes; its
 * expires_at is piece->lower.  With "indexed", also the entries of the
 * piece's indexes (plain columns: (role, last)); a piece written by
 * maintenance gets its index once its chunks are in.
 */
static void
IdemMemoryInsertChunk(Relation rel, const IdemPartition *piece, Oid role,
					  const IdemMemoryPair *pairs, int n, int prefix,
					  bool indexed)
{
	int			width = IDEM_DIGEST_LEN - prefix;
	Size		len = 1 + prefix + (Size) n * width;
	bytea	   *chunk = palloc(VARHDRSZ + len);
	uint8	   *data = (uint8 *) VARDATA(chunk);
	Datum		values[Natts_memory];
	bool		nulls[Natts_memory] = {false, false, false, false, false};
	HeapTuple	tuple;
	int			i;

	SET_VARSIZE(chunk, VARHDRSZ + len);
	data[0] = (uint8) prefix;
	memcpy(data + 1, pairs[0].digest.data, prefix);
	for (i = 0; i < n; i++)
		memcpy(data + 1 + prefix + i * width, pairs[i].digest.data + prefix, width);

	values[Anum_memory_expires_at - 1] = TimestampTzGetDatum(piece->lower);
	values[Anum_memory_role - 1] = ObjectIdGetDatum(role);
	values[Anum_memory_lane - 1] = Int16GetDatum(piece->lane);
	values[Anum_memory_last - 1] = UUIDPGetDatum(&pairs[n - 1].digest);
	values[Anum_memory_digests - 1] = PointerGetDatum(chunk);
	tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	/* pages are filled in turn: no free space map (3 pages) to keep */
	heap_insert(rel, tuple, GetCurrentCommandId(true), HEAP_INSERT_SKIP_FSM,
				NULL);
	if (indexed)
	{
		List	   *indexes = RelationGetIndexList(rel);
		ListCell   *lc;

		foreach(lc, indexes)
		{
			Relation	index = index_open(lfirst_oid(lc), RowExclusiveLock);
			IndexInfo  *info = BuildIndexInfo(index);
			Datum		ivalues[INDEX_MAX_KEYS];
			bool		inulls[INDEX_MAX_KEYS];
			int			k;

			if (info->ii_Expressions != NIL || info->ii_Predicate != NIL)
				elog(ERROR, "index \"%s\" of a piece of the idempotency memory is not on plain columns",
					 RelationGetRelationName(index));
			for (k = 0; k < info->ii_NumIndexAttrs; k++)
			{
				AttrNumber	attnum = info->ii_IndexAttrNumbers[k];

				if (attnum < 1 || attnum > Natts_memory)
					elog(ERROR, "index \"%s\" of a piece of the idempotency memory is not on plain columns",
						 RelationGetRelationName(index));
				ivalues[k] = values[attnum - 1];
				inulls[k] = false;
			}
			(void) index_insert(index, ivalues, inulls, &tuple->t_self, rel,
								UNIQUE_CHECK_NO, false, info);
			index_close(index, NoLock);
		}
		list_free(indexes);
	}
	heap_freetuple(tuple);
	pfree(chunk);
}

/*
 * IdemMemoryBuildFilters, from IdemFilterBuildDatabase (each maintenance
 * run, under the maintenance lock): fills the filter of each ledger's
 * memory that has none READY (after a restart, or after an external write
 * that made the database's filters UNUSABLE), or whose pairs are a third or
 * more of pieces dropped since it was filled, from the chunks of all its
 * pieces of current lanes,
 * those this transaction wrote included.  If a piece cannot be read at
 * once, the filter is left for the next run: a filter missing a piece
 * would rule out its keys.  Returns how many filters became READY.
 */
int
IdemMemoryBuildFilters(void)
{
	int			built = 0;
	int			ledger;

	/* the pieces this transaction wrote too */
	CommandCounterIncrement();
	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		Oid			parent = IdemMemoryParent(ledger);
		List	   *pieces;
		ListCell   *lc;
		uint64		hint = 0;
		bool		complete = true;
		IdemFilterFill fill;

		CHECK_FOR_INTERRUPTS();
		if (!OidIsValid(parent))
			continue;
		if (IdemFilterIsReady(parent))
		{
			/*
			 * Filled again once a third of its pairs or more are of pieces
			 * dropped since (the pieces' pairs estimated from their pages at
			 * 12 bytes a pair, which they take at most), in a run that drops
			 * no piece: none is then locked by this transaction while calls
			 * probe the pieces, until it is READY again.
			 */
			if (memory_dropped[ledger] ||
				(double) IdemFilterPairs(parent) <=
				1.5 * (double) IdemMemoryPairsEstimate(ledger))
				continue;
			IdemFilterForget(parent);
		}
		pieces = IdemMemoryPieces(ledger);

		/*
		 * The filter's size, from the pieces' pages.  Nothing writes or
		 * drops a piece but under the maintenance lock, which the caller
		 * holds: the pieces stay as they are until the filling has read
		 * them, each under a lock of its own, one at a time.
		 */
		foreach(lc, pieces)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);
			Relation	rel;

			if (IdemLaneIsLegacy(p->lane))
				continue;
			if (!ConditionalLockRelationOid(p->relid, AccessShareLock))
			{
				complete = false;
				break;
			}
			rel = try_relation_open(p->relid, NoLock);
			if (rel == NULL)
			{
				UnlockRelationOid(p->relid, AccessShareLock);
				continue;		/* dropped: nothing to hold */
			}
			hint += (uint64) RelationGetNumberOfBlocks(rel) * (BLCKSZ / 12) *
				IDEM_MEMORY_FILTER_SLACK;
			relation_close(rel, AccessShareLock);
		}
		if (!complete ||
			!IdemFilterFillBegin(ledger, parent, IDEM_FILTER_MEMORY_LANE, hint,
								 &fill))
		{
			list_free_deep(pieces);
			continue;
		}

		foreach(lc, pieces)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);
			Relation	rel;
			TableScanDesc scan;
			HeapTuple	tuple;

			CHECK_FOR_INTERRUPTS();
			if (IdemLaneIsLegacy(p->lane))
				continue;
			if (!ConditionalLockRelationOid(p->relid, AccessShareLock))
			{
				complete = false;
				break;
			}
			rel = try_relation_open(p->relid, NoLock);
			if (rel == NULL)
			{
				UnlockRelationOid(p->relid, AccessShareLock);
				continue;
			}
			if (RelationGetDescr(rel)->natts != Natts_memory)
			{
				relation_close(rel, AccessShareLock);
				complete = false;
				break;
			}

			/*
			 * every tuple version, dead or alive, as the ledgers' builds do
			 * (filter_build.c): a chunk committed after this run's snapshot
			 * was taken (an external write the hooks noticed, which had
			 * ended when the fill began) is in the filter too; a superset
			 * does no harm
			 */
			scan = table_beginscan(rel, SnapshotAny, 0, NULL);
			while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
			{
				bool		isnull;
				bool		role_isnull;
				Datum		chunk = heap_getattr(tuple, Anum_memory_digests,
												 RelationGetDescr(rel), &isnull);
				Datum		role = heap_getattr(tuple, Anum_memory_role,
												RelationGetDescr(rel), &role_isnull);

				if (!isnull && !role_isnull)
					IdemMemoryChunkFill(DatumGetByteaPP(chunk),
										DatumGetObjectId(role), &fill);
			}
			table_endscan(scan);
			relation_close(rel, AccessShareLock);
		}
		list_free_deep(pieces);

		/* a filter missing a piece would rule out its keys: none */
		if (!complete)
			IdemFilterForget(parent);
		else if (IdemFilterFillEnd(&fill))
			built++;
	}
	memset(memory_dropped, 0, sizeof(memory_dropped));
	return built;
}

/*
 * IdemMemoryPairsEstimate: about how many pairs the pieces of current lanes
 * of a ledger's memory hold, from their pages (12 bytes a pair); a piece
 * whose lock cannot be had at once counts as none.
 */
static uint64
IdemMemoryPairsEstimate(IdemLedger ledger)
{
	List	   *pieces = IdemMemoryPieces(ledger);
	ListCell   *lc;
	uint64		pairs = 0;

	foreach(lc, pieces)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);
		Relation	rel;

		if (IdemLaneIsLegacy(p->lane) ||
			!ConditionalLockRelationOid(p->relid, AccessShareLock))
			continue;
		rel = try_relation_open(p->relid, NoLock);
		if (rel == NULL)
		{
			UnlockRelationOid(p->relid, AccessShareLock);
			continue;
		}
		pairs += (uint64) RelationGetNumberOfBlocks(rel) * (BLCKSZ / 12);
		relation_close(rel, AccessShareLock);
	}
	list_free_deep(pieces);
	return pairs;
}

/* IdemMemoryChunkFill adds every digest of a chunk to a filter */
static void
IdemMemoryChunkFill(bytea *chunk, Oid role, IdemFilterFill *fill)
{
	const uint8 *data = (const uint8 *) VARDATA_ANY(chunk);
	int			len = VARSIZE_ANY_EXHDR(chunk);
	int			prefix;
	int			width;
	int			i;
	pg_uuid_t	digest;

	if (len < 1 || data[0] >= IDEM_DIGEST_LEN || len < 1 + data[0])
		return;
	prefix = data[0];
	width = IDEM_DIGEST_LEN - prefix;
	memcpy(digest.data, data + 1, prefix);
	for (i = 0; 1 + prefix + (i + 1) * width <= len; i++)
	{
		memcpy(digest.data + prefix, data + 1 + prefix + i * width, width);
		IdemFilterFillAdd(fill, role, &digest);
	}
}

/*
 * IdemMemoryForget drops every piece whose range ended key_memory ago or
 * more (every piece, with key_memory 0), each waiting at most
 * lock_timeout_ms for its locks (else it is left for the next run).
 * Returns how many it dropped.
 */
int
IdemMemoryForget(TimestampTz now, int lock_timeout_ms)
{
	TimestampTz since = now - (int64) idem_key_memory * USECS_PER_SEC;
	int			dropped = 0;
	int			ledger;

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		List	   *pieces = IdemMemoryPieces(ledger);
		ListCell   *lc;
		bool		stale = false;

		foreach(lc, pieces)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);

			CHECK_FOR_INTERRUPTS();
			if (p->upper <= since &&
				IdemDropPartition(p->relid, lock_timeout_ms, false, NULL, NULL))
			{
				dropped++;
				stale = true;
			}
		}
		list_free_deep(pieces);

		/*
		 * The memory's filter keeps the dropped pieces' bits (they rule out
		 * nothing they should not): freeing it now would have every call
		 * probe the pieces, and wait for this transaction on the ones it
		 * drops.  IdemMemoryBuildFilters fills it again in a later run.
		 */
		if (stale)
			memory_dropped[ledger] = true;
	}
	return dropped;
}

/* ----------------------------------------------------------------
 * Moving a tenant's memory (memory_transfer.c)
 * ----------------------------------------------------------------
 */

/*
 * IdemMemoryForEach calls fn for every (role, digest) pair the pieces of a
 * ledger's memory remember after "since", with the instant by which its
 * key had expired (its piece's upper bound; an imported key's own).  A
 * piece of a legacy lane (digests of another form) is an error: its keys
 * could not be found by the new node.
 */
void
IdemMemoryForEach(IdemLedger ledger, TimestampTz since,
				  IdemMemoryPairFn fn, void *arg)
{
	List	   *pieces = IdemMemoryPieces(ledger);
	ListCell   *lc;

	foreach(lc, pieces)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);
		Relation	rel;
		TableScanDesc scan;
		HeapTuple	tuple;

		if (p->upper <= since)
			continue;
		if (IdemLaneIsLegacy(p->lane))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot export the memory of \"%s.%s\" while it holds keys written before version 0.3.0",
							IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
					 errdetail("Piece \"%s\" is remembered until idempotency.key_memory after %s.",
							   get_rel_name(p->relid), timestamptz_to_str(p->upper))));
		LockRelationOid(p->relid, AccessShareLock);
		rel = try_relation_open(p->relid, NoLock);
		if (rel == NULL)
		{
			UnlockRelationOid(p->relid, AccessShareLock);
			continue;
		}
		scan = table_beginscan(rel, GetActiveSnapshot(), 0, NULL);
		while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			TupleDesc	desc = RelationGetDescr(rel);
			bool		isnull[3];
			Datum		chunk = heap_getattr(tuple, Anum_memory_digests, desc, &isnull[0]);
			Datum		role = heap_getattr(tuple, Anum_memory_role, desc, &isnull[1]);
			Datum		at = heap_getattr(tuple, Anum_memory_expires_at, desc, &isnull[2]);
			TimestampTz expired_by = p->upper;
			const uint8 *data;
			int			len;
			int			prefix;
			int			width;
			int			i;
			pg_uuid_t	digest;

			CHECK_FOR_INTERRUPTS();
			if (isnull[0] || isnull[1] || isnull[2])
				continue;
			if (p->lane == IDEM_MEMORY_IMPORT_LANE)
			{
				expired_by = DatumGetTimestampTz(at);
				if (expired_by <= since)
					continue;
			}
			data = (const uint8 *) VARDATA_ANY(DatumGetByteaPP(chunk));
			len = VARSIZE_ANY_EXHDR(DatumGetByteaPP(chunk));
			if (len < 1 || data[0] >= IDEM_DIGEST_LEN || len < 1 + data[0])
				continue;
			prefix = data[0];
			width = IDEM_DIGEST_LEN - prefix;
			memcpy(digest.data, data + 1, prefix);
			for (i = 0; 1 + prefix + (i + 1) * width <= len; i++)
			{
				memcpy(digest.data + prefix, data + 1 + prefix + i * width, width);
				fn(DatumGetObjectId(role), &digest, expired_by, arg);
			}
		}
		table_endscan(scan);
		relation_close(rel, AccessShareLock);
	}
	list_free_deep(pieces);
}

/*
 * IdemMemoryImport remembers the role's digest, whose key had expired by
 * "expired_by" on another node, for idempotency.key_memory after that,
 * unless this node remembers it already (or it is past the memory).  The
 * pair goes into a piece of imported keys (lane IDEM_MEMORY_IMPORT_LANE, a
 * UTC day wide, made on first use with its index), in a chunk of its own
 * whose expires_at is expired_by; the memory's filter takes it.  Under the
 * maintenance lock, taken here: neither a filling of the filter nor a drop
 * of the piece runs meanwhile.
 */
IdemImportOutcome
IdemMemoryImport(IdemLedger ledger, Oid role, const pg_uuid_t *uuid,
				 TimestampTz expired_by)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz since = now - (int64) idem_key_memory * USECS_PER_SEC;
	IdemDigest	digest;
	LOCKTAG		tag;
	IdemMemoryCache *cache;
	IdemPartition piece = {0};
	bool		have_piece = false;
	Oid			parent;
	Relation	rel;
	IdemMemoryPair pair;
	int			i;

	if (idem_key_memory <= 0 || expired_by <= since)
		return IDEM_IMPORT_EXPIRED;

	IdemSetLedgerLockTag(&tag, 0, IDEM_LOCK_MAINTAIN);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	AcceptInvalidationMessages();

	memset(&digest, 0, sizeof(digest));
	digest.uuid = *uuid;
	if (IdemMemoryRecalls(ledger, role, &digest, now))
		return IDEM_IMPORT_KEPT;

	/* the day's piece of imported keys */
	piece.lane = IDEM_MEMORY_IMPORT_LANE;
	piece.lower = expired_by - ((expired_by % USECS_PER_DAY) + USECS_PER_DAY) % USECS_PER_DAY;
	piece.upper = piece.lower + USECS_PER_DAY;
	parent = IdemMemoryMakeParent(ledger);
	cache = IdemGetMemoryCache(ledger);
	for (i = 0; i < cache->npieces; i++)
	{
		if (cache->pieces[i].lane == IDEM_MEMORY_IMPORT_LANE &&
			cache->pieces[i].lower == piece.lower)
		{
			piece = cache->pieces[i];
			have_piece = true;
			break;
		}
	}
	if (!have_piece)
	{
		char	   *name;
		char	   *sql;
		struct pg_tm tm;
		fsec_t		fsec;

		if (timestamp2tm(piece.lower, NULL, &tm, &fsec, NULL, NULL) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
					 errmsg("timestamp out of range")));
		name = psprintf("%s_import_%04d%02d%02d", memory_names[ledger],
						tm.tm_year, tm.tm_mon, tm.tm_mday);
		sql = psprintf("CREATE TABLE idempotency.%s (LIKE idempotency.%s INCLUDING STORAGE); "
					   "CREATE INDEX ON idempotency.%s (role, last) "
					   "WITH (deduplicate_items = off)",
					   quote_identifier(name), memory_names[ledger],
					   quote_identifier(name));
		IdemExecAsOwner(sql, 0);
		pfree(sql);
		IdemMemoryAttach(ledger, name, &piece, 0);
		piece.relid = get_relname_relid(name,
										get_namespace_oid(IDEM_SCHEMA_NAME, false));
		if (!OidIsValid(piece.relid))
			elog(ERROR, "could not find table \"%s.%s\" after creating it",
				 IDEM_SCHEMA_NAME, name);
		pfree(name);
	}

	/* a chunk of the one digest, expiring with it, and its index entry */
	pair.role = role;
	pair.digest = *uuid;
	rel = table_open(piece.relid, RowExclusiveLock);
	piece.lower = expired_by;	/* the chunk's expires_at */
	IdemMemoryInsertChunk(rel, &piece, role, &pair, 1, IDEM_DIGEST_LEN - 1,
						  true);
	table_close(rel, NoLock);
	/* the backends' own filters of the memory are built again */
	CacheInvalidateRelcacheByRelid(parent);
	CommandCounterIncrement();
	IdemFilterAdd(parent, IDEM_FILTER_MEMORY_LANE, role, uuid);
	return IDEM_IMPORT_INSERTED;
}

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
 *	  doubles a piece.
 *
 * A piece holds, per role, the role's digests sorted and cut into chunks of
 * at most a heap page: one row (expires_at, role, lane, last, digests) per
 * chunk, "last" its greatest digest, "digests" a byte string of one byte p,
 * the p bytes every digest of the chunk starts with, and each digest's
 * remaining 16 - p bytes in order.  A digest's first 4 bytes depend on its
 * namespace only, so the chunks of a namespace with many keys take 12 bytes
 * or less per key; with one namespace per key, 15 or 16.  The index on
 * (role, last) finds the one chunk that can hold a digest with one descent,
 * and a binary search in it answers exactly: nothing probabilistic decides
 * an answer.  With the library preloaded each piece also has a digest
 * filter (filter.h), filled with its pairs when it is written and from its
 * chunks after a restart (IdemMemoryBuildFilters): a key the piece does
 * not hold is ruled out without a probe, as for the ledger's partitions; a
 * filter only rules out, a "maybe" is answered by the probe.  The role
 * leads the index, as in the ledgers (doc/design.md,
 * "Who holds what"): one role's probe never returns, fetches or searches
 * another role's chunk.
 *
 * Forgetting: maintenance drops a piece once key_memory has passed since
 * its range ended (IdemMemoryForget), whole, like the ledgers' partitions.
 * A call consults only pieces whose range ended less than key_memory ago,
 * so that lowering the setting takes effect at once.  Pieces are written
 * once and then only read (an import adds chunks of a single digest to
 * them), and calls release their locks on a piece as soon as they have
 * read it, so that dropping it waits for nobody.
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
#include "utils/syscache.h"
#include "utils/timestamp.h"

/* The columns of a memory table */
#define Anum_memory_expires_at		1	/* the piece's lower bound */
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

int			idem_key_memory = 0;

/* The memory table of each ledger */
static const char *const memory_names[IDEM_NUM_LEDGERS] = {
	[IDEM_LEDGER_MESSAGES] = "messages_memory",
	[IDEM_LEDGER_KEYS] = "keys_memory",
};

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
} IdemMemoryCache;

static IdemMemoryCache memory_cache[IDEM_NUM_LEDGERS];
static MemoryContext IdemMemoryContext = NULL;

/* One remembered pair, while a piece is being written */
typedef struct IdemMemoryPair
{
	Oid			role;
	pg_uuid_t	digest;
} IdemMemoryPair;

static void IdemMemoryRelcacheCallback(Datum arg, Oid relid);
static IdemMemoryCache *IdemGetMemoryCache(IdemLedger ledger);
static Oid	IdemMemoryMakeParent(IdemLedger ledger);
static bool IdemMemoryLaneOf(const IdemDigest *digest, int16 lane,
							 pg_uuid_t *form);
static bool IdemMemoryProbeEnded(IdemLedger ledger, const IdemPartition *part,
								 Oid role, const IdemDigest *digest,
								 TimestampTz now);
static bool IdemMemoryProbePiece(Oid relid, Oid role, const pg_uuid_t *digest);
static bool IdemMemoryChunkHas(bytea *chunk, const pg_uuid_t *digest);
static void IdemMemoryChunkFill(bytea *chunk, Oid role, IdemFilterFill *fill);
static int	IdemMemoryPairCmp(const void *a, const void *b);
static int	IdemMemoryCommonPrefix(const pg_uuid_t *a, const pg_uuid_t *b);
static void IdemMemoryInsertChunk(Relation rel, const IdemPartition *piece,
								  Oid role, const IdemMemoryPair *pairs,
								  int n, int prefix);
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
		n = IdemReadPartitions(parent, &parts);

	if (cache->pieces != NULL)
		pfree(cache->pieces);
	cache->pieces = NULL;
	cache->npieces = 0;
	if (n > 0)
	{
		cache->pieces = MemoryContextAlloc(IdemMemoryContext,
										   n * sizeof(IdemPartition));
		memcpy(cache->pieces, parts, n * sizeof(IdemPartition));
		cache->npieces = n;
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
 * into a piece by anything but maintenance (a restore of its data, an
 * INSERT by a superuser) is in no piece's filter, so it is an external
 * write like one into a ledger.
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
				   "CREATE INDEX %s_role_last_idx ON idempotency.%s (role, last) "
				   "WITH (deduplicate_items = off); "
				   "COMMENT ON TABLE idempotency.%s IS %s",
				   name, name, name, name, name,
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
	op->probe.remembered = IdemMemoryRecalls(op->ledger, op->role,
											 &op->digest, op->now);
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
	TimestampTz since = now - (int64) idem_key_memory * USECS_PER_SEC;
	IdemPartition *parts;
	IdemMemoryCache *cache;
	int			n;
	int			i;
	bool		found = false;

	if (idem_key_memory <= 0)
		return false;

	n = IdemLivePartitionsForKey(ledger, &digest->uuid, now, &parts);
	for (i = 0; i < n && !found; i++)
	{
		if (!parts[i].ended || parts[i].upper <= since ||
			IdemFilterRulesOut(parts[i].relid, parts[i].lane, role,
							   &digest->uuid))
			continue;
		found = IdemMemoryProbeEnded(ledger, &parts[i], role, digest, now);
	}
	pfree(parts);
	if (found)
		return true;

	/*
	 * The pieces of the key's lanes whose range ended less than key_memory
	 * ago; copied, since locking a piece may rebuild the cache.
	 */
	cache = IdemGetMemoryCache(ledger);
	n = 0;
	parts = palloc(Max(cache->npieces, 1) * sizeof(IdemPartition));
	for (i = 0; i < cache->npieces; i++)
	{
		if (cache->pieces[i].upper > since)
			parts[n++] = cache->pieces[i];
	}
	for (i = 0; i < n && !found; i++)
	{
		pg_uuid_t	form;

		/* a piece's filter rules out the keys it does not hold */
		if (IdemMemoryLaneOf(digest, parts[i].lane, &form) &&
			!IdemFilterRulesOut(parts[i].relid, parts[i].lane, role, &form))
			found = IdemMemoryProbePiece(parts[i].relid, role, &form);
	}
	pfree(parts);
	return found;
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
	int16		value = IdemLaneValue(&digest->uuid, IdemLaneLanes(lane), legacy);

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
 * IdemMemoryProbePiece: does piece "relid" remember the role's digest?  One
 * descent of its (role, last) index to the role's first chunk whose last
 * digest is not smaller, and a binary search in that chunk.  The locks are
 * released at once: the piece does not change.
 */
static bool
IdemMemoryProbePiece(Oid relid, Oid role, const pg_uuid_t *digest)
{
	Relation	heap;
	Relation	index;
	Oid			indexoid;
	IndexScanDesc scan;
	ScanKeyData skeys[2];
	TupleTableSlot *slot;
	bool		found = false;

	LockRelationOid(relid, AccessShareLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
	{
		UnlockRelationOid(relid, AccessShareLock);
		return false;
	}
	heap = table_open(relid, NoLock);
	if (RelationGetDescr(heap)->natts != Natts_memory ||
		!OidIsValid(indexoid = IdemMemoryIndexOf(heap)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("piece \"%s\" of the idempotency memory does not have its columns and index",
						RelationGetRelationName(heap))));
	index = index_open(indexoid, AccessShareLock);

	ScanKeyInit(&skeys[0], 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(role));
	ScanKeyInit(&skeys[1], 2, BTGreaterEqualStrategyNumber, F_UUID_GE,
				UUIDPGetDatum(digest));
	slot = table_slot_create(heap, NULL);
	scan = IdemIndexBeginScan(heap, index, SnapshotSelf, 2);
	index_rescan(scan, skeys, 2, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		chunk = slot_getattr(slot, Anum_memory_digests, &isnull);

		if (!isnull)
			found = IdemMemoryChunkHas(DatumGetByteaPP(chunk), digest);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(heap, NoLock);
	UnlockRelationOid(indexoid, AccessShareLock);
	UnlockRelationOid(relid, AccessShareLock);
	return found;
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
	Oid			piece_relid;
	Relation	piece_rel;
	IdemFilterFill fill;

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
	(void) IdemMemoryMakeParent(ledger);
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

	/* its filter, with every pair (filter.h); READY once they are in */
	if (IdemFilterFillBegin(ledger, piece_relid, piece.lane, n, &fill))
		for (i = 0; i < n; i++)
			IdemFilterFillAdd(&fill, pairs[i].role, &pairs[i].digest);

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
							  (int) (j + 1 - i), prefix);
		i = j + 1;
	}
	table_close(piece_rel, NoLock);
	pfree(pairs);
	(void) IdemFilterFillEnd(&fill);
	CommandCounterIncrement();

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
 * pairs[0 .. n-1], sorted, all starting with the same "prefix" bytes.
 */
static void
IdemMemoryInsertChunk(Relation rel, const IdemPartition *piece, Oid role,
					  const IdemMemoryPair *pairs, int n, int prefix)
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
	simple_heap_insert(rel, tuple);
	heap_freetuple(tuple);
	pfree(chunk);
}

/*
 * IdemMemoryBuildFilters, from IdemFilterBuildDatabase (each maintenance
 * run): fills the filter of every piece that has none READY (after a
 * restart, or an external write that made the database's filters
 * UNUSABLE) from its chunks.  A piece whose lock cannot be had at once is
 * left for the next run.  Returns how many filters became READY.
 */
int
IdemMemoryBuildFilters(void)
{
	int			built = 0;
	int			ledger;

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		List	   *pieces = IdemMemoryPieces(ledger);
		ListCell   *lc;

		foreach(lc, pieces)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);
			Relation	rel;
			TableScanDesc scan;
			HeapTuple	tuple;
			IdemFilterFill fill;

			CHECK_FOR_INTERRUPTS();
			if (IdemLaneIsLegacy(p->lane) || IdemFilterIsReady(p->relid) ||
				!ConditionalLockRelationOid(p->relid, AccessShareLock))
				continue;
			rel = try_relation_open(p->relid, NoLock);
			if (rel == NULL)
				continue;
			if (RelationGetDescr(rel)->natts != Natts_memory ||
				!IdemFilterFillBegin(ledger, p->relid, p->lane,
									 (uint64) RelationGetNumberOfBlocks(rel) *
									 (BLCKSZ / 12), &fill))
			{
				relation_close(rel, AccessShareLock);
				continue;
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
			if (IdemFilterFillEnd(&fill))
				built++;
		}
		list_free_deep(pieces);
	}
	return built;
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

		foreach(lc, pieces)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);

			CHECK_FOR_INTERRUPTS();
			if (p->upper <= since &&
				IdemDropPartition(p->relid, lock_timeout_ms, NULL, NULL))
				dropped++;
		}
		list_free_deep(pieces);
	}
	return dropped;
}

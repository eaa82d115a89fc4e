/*-------------------------------------------------------------------------
 *
 * outbox_storage.c
 *	  The outbox's storage: the events table and its segments, the event
 *	  number sequence, and the database's xid base.
 *
 * Events live in idempotency.outbox, partitioned by LIST (seg): each
 * partition is one "segment", and publishers write into the newest one
 * only.  Maintenance makes a new segment once the newest has taken events
 * for an interval (a quarter of idempotency.outbox_retention, between one
 * second and one day), and drops old ones once every relay of their
 * topics has acknowledged their events and the retention has passed
 * (outbox_maintain.c).  Segments are made by the storage owner, like the
 * ledgers' partitions, with CREATE TABLE ... (LIKE ...) and ATTACH
 * PARTITION, which takes SHARE UPDATE EXCLUSIVE on the parent: publishers
 * and relays never lock the parent, only segments, so neither waits for
 * the DDL.  The parent is made on first use, not by CREATE EXTENSION, so
 * that pg_dump carries it and its segments like the ledgers; by a storage
 * maker (a background worker) in a transaction of its own where one can be
 * started, so that the first publisher's transaction holds nothing other
 * roles' publishers wait for (IdemOutboxParent).
 *
 * Why not the ledgers' partitions (storage.c): a ledger row's partition
 * follows from its digest and expiry, and a lookup must find every
 * partition a key's live row can be in; an event goes wherever publishers
 * are writing now, is found by its topic and event number, and its
 * segment goes when relays are done with it, not at a time known when the
 * row is written.  What the two share is how DDL runs (privilege.c:
 * IdemExecAsOwner, IdemRestrictTableAcl).
 *
 * Publishers choose the newest segment of this backend's cache, lock it
 * (ROW EXCLUSIVE, which reads the invalidations that a new segment's
 * ATTACH sent) and check that it is still the newest; a transaction that
 * already had a segment locked may go on writing into it after a newer
 * one was made.  So no publisher writes into a segment made before the
 * newest one once every transaction that locked it while it was the
 * newest has ended: maintenance drops a segment only under ACCESS
 * EXCLUSIVE, which waits for those.
 *
 * The xid base: event rows and relays' snapshots hold 64-bit xids plus a
 * per-database offset kept in idempotency.outbox_xid_base.  pg_dump
 * carries events and positions, not that row; restored into a cluster
 * whose xid counter is behind the dumped one's (another cluster, or a copy
 * of the same one made earlier: a base backup restored, a point-in-time
 * recovery), new transactions would get xids that the restored snapshots
 * call finished, and their events would never be relayed.  So the row,
 * made by the extension's scripts (CREATE EXTENSION, also the one a
 * restore runs), is checked on first use: the base is raised, if it must,
 * above every xid stored, and the row's own xmin recorded as checked.  New
 * transactions then compare after everything restored, and restored
 * events and positions keep their order among themselves.  A row written
 * since (by hand, by a restore) is checked again.  The check writes in
 * place, under a lock released at once (IdemOutboxRaiseBase): nobody waits
 * for the transaction of the caller that made it.  pg_upgrade keeps the xid
 * counter and the row as it was (its xmin too): the base stays.

 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_storage.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "keyhash.h"
#include "outbox.h"
#include "privilege.h"
#include "stats.h"
#include "storage.h"
#include "worker.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_index.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "commands/dbcommands.h"
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

/* The events table and its segments */
#define OUTBOX_TABLE		"outbox"
#define OUTBOX_INDEX		"outbox_topic_ev_idx"
#define OUTBOX_COLUMNS \
	"seg pg_catalog.int4 NOT NULL, " \
	"role pg_catalog.oid NOT NULL, " \
	"topic pg_catalog.text COLLATE pg_catalog.\"C\" NOT NULL, " \
	"ev_id pg_catalog.int8 NOT NULL, " \
	"txid pg_catalog.int8 NOT NULL, " \
	"event_id pg_catalog.uuid NOT NULL, " \
	"published_at pg_catalog.timestamptz NOT NULL, " \
	"key pg_catalog.text, " \
	"headers pg_catalog.jsonb, " \
	"payload pg_catalog.jsonb, " \
	"payload_raw pg_catalog.bytea"

/* The extension's own tables and sequences the outbox uses */
typedef enum IdemOutboxMember
{
	MEMBER_EVENT_SEQ = 0,
	MEMBER_SEGMENTS,
	MEMBER_RELAYS,
	MEMBER_DEAD_LETTERS,
	MEMBER_XID_BASE,
	NUM_MEMBERS
} IdemOutboxMember;

static const char *const member_names[NUM_MEMBERS] = {
	[MEMBER_EVENT_SEQ] = "outbox_event_seq",
	[MEMBER_SEGMENTS] = "outbox_segments",
	[MEMBER_RELAYS] = "outbox_relays",
	[MEMBER_DEAD_LETTERS] = "outbox_dead_letters",
	[MEMBER_XID_BASE] = "outbox_xid_base",
};

/* This backend's view of the storage; see IdemOutboxRelcacheCallback */
typedef struct IdemOutboxCache
{
	bool		valid;			/* parent and segments read, none changed */
	uint64		invalidations;
	Oid			parent;			/* InvalidOid: not made yet */
	int			nsegments;
	IdemOutboxSegment *segments;	/* sorted by seg */
	Oid			members[NUM_MEMBERS];	/* InvalidOid: look up again */
	bool		base_valid;		/* xid base read, and checked */
	int64		base;
} IdemOutboxCache;

static IdemOutboxCache cache;
static MemoryContext OutboxCacheContext = NULL;
static uint64 segments_generation = 0;

/* Statements on the outbox's member tables, run as the storage owner */
typedef enum IdemOutboxStmt
{
	STMT_BASE_PEEK,
	STMT_SEGMENT_PUT,
	NUM_STMTS
} IdemOutboxStmt;

typedef struct IdemOutboxStmtDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[3];
} IdemOutboxStmtDef;

static const IdemOutboxStmtDef stmt_defs[NUM_STMTS] = {
	[STMT_BASE_PEEK] = {
		"SELECT base, checked_xmin, xmin FROM idempotency.outbox_xid_base",
		0, {InvalidOid}
	},
	[STMT_SEGMENT_PUT] = {
		"INSERT INTO idempotency.outbox_segments (seg, opened_at) VALUES ($1, $2)"
		" ON CONFLICT (seg) DO NOTHING",
		2, {INT4OID, TIMESTAMPTZOID}
	},
};

static SPIPlanPtr stmt_plans[NUM_STMTS];

static void IdemOutboxRelcacheCallback(Datum arg, Oid relid);
static void IdemOutboxRebuild(void);
static int	IdemOutboxReadSegments(Oid parent, IdemOutboxSegment **out);
static int	IdemOutboxExec(IdemOutboxStmt which, Datum *values,
						   const bool *isnull, bool read_only);
static int64 IdemOutboxHighestStoredTxid(void);
static bool IdemOutboxPeekBase(int64 *base, bool *checked);
static int64 IdemOutboxRaiseBase(Oid relid, int64 high);
static void IdemOutboxCreateParent(void);
static void IdemOutboxStorageLock(void);
static bool IdemOutboxMayUseMaker(void);

/*
 * IdemOutboxStorageInit registers the relcache callback that invalidates
 * this backend's view of the outbox's storage.  Called once from _PG_init.
 */
void
IdemOutboxStorageInit(void)
{
	IdemRegisterRelcacheCallback(IdemOutboxRelcacheCallback);
}

/*
 * IdemOutboxRelcacheCallback forgets what it knows of the storage when the
 * relcache entry of the events table, of one of its segments or of one of
 * the outbox's member tables is invalidated (ATTACH, DETACH, DROP, DROP
 * EXTENSION, ...), or all of them, and, while it knows of no events
 * table, when any relation's is (the table's creation).  Topic ids and the
 * xid base are forgotten with the member tables: a dropped and recreated
 * extension starts over.  No catalog access here.
 */
static void
IdemOutboxRelcacheCallback(Datum arg, Oid relid)
{
	int			i;

	/*
	 * With no events table known, any relation's invalidation may be the
	 * one of its creation (by another backend: a storage maker, or the
	 * first publisher itself): without this, a backend that looked
	 * before the first idem_publish() would go on seeing no events table,
	 * and its relay no events, until it reconnected.
	 */
	bool		hit = (relid == InvalidOid || relid == cache.parent ||
					   !OidIsValid(cache.parent));

	for (i = 0; !hit && i < cache.nsegments; i++)
		hit = (cache.segments[i].relid == relid);
	if (hit)
	{
		cache.valid = false;
		cache.invalidations++;
		segments_generation++;
	}
	hit = (relid == InvalidOid);
	for (i = 0; !hit && i < NUM_MEMBERS; i++)
		hit = (cache.members[i] == relid);
	if (hit)
	{
		for (i = 0; i < NUM_MEMBERS; i++)
			cache.members[i] = InvalidOid;
		cache.base_valid = false;
	}
}

/*
 * IdemOutboxMemberRelid returns the OID of one of the extension's tables or
 * sequences in schema idempotency, or InvalidOid if it does not exist
 * (the extension is older than 0.5.0).
 */
Oid
IdemOutboxMemberRelid(const char *name)
{
	int			i;
	Oid			nsp;

	for (i = 0; i < NUM_MEMBERS; i++)
	{
		if (strcmp(member_names[i], name) != 0)
			continue;
		if (OidIsValid(cache.members[i]))
			return cache.members[i];
		nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);
		if (!OidIsValid(nsp))
			return InvalidOid;
		cache.members[i] = get_relname_relid(name, nsp);
		return cache.members[i];
	}
	elog(ERROR, "\"%s\" is not a table of the outbox", name);
	return InvalidOid;			/* keep compiler quiet */
}

/* the OID of a member, or an error saying the extension needs an update */
static Oid
IdemOutboxRequireMember(IdemOutboxMember which)
{
	Oid			relid = IdemOutboxMemberRelid(member_names[which]);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the outbox's table \"%s.%s\" does not exist",
						IDEM_SCHEMA_NAME, member_names[which]),
				 errhint("Run ALTER EXTENSION idempotency UPDATE.")));
	return relid;
}

/*
 * IdemOutboxRebuild reads the events table and its segments from the
 * catalogs into the cache, valid only if no invalidation arrived meanwhile.
 */
static void
IdemOutboxRebuild(void)
{
	uint64		invalidations = cache.invalidations;
	Oid			nsp;
	Oid			parent = InvalidOid;
	IdemOutboxSegment *segs = NULL;
	int			n = 0;

	if (OutboxCacheContext == NULL)
		OutboxCacheContext = AllocSetContextCreate(CacheMemoryContext,
												   "idempotency outbox cache",
												   ALLOCSET_SMALL_SIZES);
	nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);
	if (OidIsValid(nsp))
		parent = get_relname_relid(OUTBOX_TABLE, nsp);
	/* from here on an invalidation of the parent counts */
	cache.parent = parent;
	if (OidIsValid(parent))
	{
		IdemOutboxSegment *read;

		n = IdemOutboxReadSegments(parent, &read);
		segs = MemoryContextAlloc(OutboxCacheContext,
								  Max(n, 1) * sizeof(IdemOutboxSegment));
		memcpy(segs, read, n * sizeof(IdemOutboxSegment));
		pfree(read);
	}
	if (cache.segments)
		pfree(cache.segments);
	cache.segments = segs;
	cache.nsegments = n;
	cache.valid = (cache.invalidations == invalidations);
	segments_generation++;
}

/*
 * IdemOutboxReadSegments sets *out to a palloc'd array of the segments of
 * the events table, sorted by seg, read from pg_inherits and relpartbound
 * without locking the parent, and returns how many.  Partitions whose
 * detach is pending, and bounds of another shape than FOR VALUES IN (one
 * integer), are left out.
 */
static int
IdemOutboxReadSegments(Oid parent, IdemOutboxSegment **out)
{
	Relation	inhrel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;
	int			allocated = 8;
	int			n = 0;
	IdemOutboxSegment *segs = palloc(allocated * sizeof(IdemOutboxSegment));
	int			i;

	inhrel = table_open(InheritsRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_inherits_inhparent, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(parent));
	scan = systable_beginscan(inhrel, InheritsParentIndexId, true, NULL, 1, &key);
	while ((tup = systable_getnext(scan)) != NULL)
	{
		Form_pg_inherits inh = (Form_pg_inherits) GETSTRUCT(tup);
		HeapTuple	reltup;
		Datum		datum;
		bool		isnull;
		PartitionBoundSpec *spec;
		Const	   *value;

		CHECK_FOR_INTERRUPTS();
		if (inh->inhdetachpending)
			continue;
		reltup = SearchSysCache1(RELOID, ObjectIdGetDatum(inh->inhrelid));
		if (!HeapTupleIsValid(reltup))
			continue;
		datum = SysCacheGetAttr(RELOID, reltup, Anum_pg_class_relpartbound,
								&isnull);
		if (isnull)
		{
			ReleaseSysCache(reltup);
			continue;
		}
		spec = (PartitionBoundSpec *) stringToNode(TextDatumGetCString(datum));
		ReleaseSysCache(reltup);
		if (!IsA(spec, PartitionBoundSpec) ||
			spec->strategy != PARTITION_STRATEGY_LIST || spec->is_default ||
			list_length(spec->listdatums) != 1 ||
			!IsA(linitial(spec->listdatums), Const))
			continue;
		value = linitial_node(Const, spec->listdatums);
		if (value->constisnull || value->consttype != INT4OID)
			continue;
		if (n == allocated)
		{
			allocated *= 2;
			segs = repalloc(segs, allocated * sizeof(IdemOutboxSegment));
		}
		segs[n].seg = DatumGetInt32(value->constvalue);
		segs[n].relid = inh->inhrelid;
		n++;
	}
	systable_endscan(scan);
	table_close(inhrel, AccessShareLock);

	/* sort by seg: insertion sort, the list is short and mostly sorted */
	for (i = 1; i < n; i++)
	{
		IdemOutboxSegment s = segs[i];
		int			j = i - 1;

		while (j >= 0 && segs[j].seg > s.seg)
		{
			segs[j + 1] = segs[j];
			j--;
		}
		segs[j + 1] = s;
	}
	*out = segs;
	return n;
}

/*
 * IdemOutboxSegments sets *out to a palloc'd copy of the segments, oldest
 * first, and returns how many there are (none if the table is not made).
 */
int
IdemOutboxSegments(IdemOutboxSegment **out)
{
	if (!cache.valid)
		IdemOutboxRebuild();
	*out = palloc(Max(cache.nsegments, 1) * sizeof(IdemOutboxSegment));
	memcpy(*out, cache.segments, cache.nsegments * sizeof(IdemOutboxSegment));
	return cache.nsegments;
}

/*
 * IdemOutboxSegmentsGeneration returns a counter that changes whenever the
 * cache of segments is invalidated or rebuilt.
 */
uint64
IdemOutboxSegmentsGeneration(void)
{
	return segments_generation;
}

/* takes the lock that serializes making the outbox's storage */
static void
IdemOutboxStorageLock(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, IDEM_LOCK_OUTBOX_STORAGE);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/*
 * IdemOutboxParent returns the OID of the events table, making it (with its
 * first segment) if it does not exist and "create" is true.  A storage
 * maker (a background worker, worker.c) makes them in a transaction of its
 * own, so that the caller's transaction holds nothing other roles'
 * publishers would wait for.  Where one cannot be used, they are made in
 * the caller's transaction, under the outbox's storage lock, which is then
 * held until the transaction ends: other first publishers wait for it and
 * find the table.
 */
Oid
IdemOutboxParent(bool create)
{
	if (!cache.valid)
		IdemOutboxRebuild();
	if (OidIsValid(cache.parent) || !create)
		return cache.parent;

	if (IdemOutboxMayUseMaker() && IdemWorkerMakeOutboxStorage())
	{
		IdemOutboxRebuild();
		if (OidIsValid(cache.parent) && cache.nsegments > 0)
			return cache.parent;
	}

	IdemOutboxStorageLock();
	AcceptInvalidationMessages();
	IdemOutboxRebuild();
	if (!OidIsValid(cache.parent))
		IdemOutboxCreateParent();
	if (!cache.valid)
		IdemOutboxRebuild();
	if (!OidIsValid(cache.parent))
		elog(ERROR, "could not find table \"%s.%s\" after creating it",
			 IDEM_SCHEMA_NAME, OUTBOX_TABLE);
	if (cache.nsegments == 0)
		(void) IdemOutboxCreateSegment(1);
	return cache.parent;
}

/*
 * IdemOutboxMayUseMaker: may a storage maker make the events table for this
 * transaction, without waiting for it (which waits for the maker)?  Not if
 * this transaction holds the storage lock (it made storage already), nor
 * if it made the outbox's own tables (CREATE EXTENSION or the update in
 * this transaction: the maker would not see them yet).
 */
static bool
IdemOutboxMayUseMaker(void)
{
	LOCKTAG		tag;
	HeapTuple	tup;
	bool		ours;
	Oid			seq = IdemOutboxMemberRelid(member_names[MEMBER_EVENT_SEQ]);

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, IDEM_LOCK_OUTBOX_STORAGE);
	if (IdemLockHeldByMe(&tag, ExclusiveLock))
		return false;
	if (!OidIsValid(seq))
		return false;
	/* the maker records the segment's time there */
	if (IdemRelationOidLockedByMe(IdemOutboxMemberRelid(member_names[MEMBER_SEGMENTS]),
								  ShareLock, true))
		return false;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(seq));
	if (!HeapTupleIsValid(tup))
		return false;
	ours = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tup->t_data));
	ReleaseSysCache(tup);
	return !ours;
}

/*
 * IdemOutboxCreateParent makes the events table as the storage owner,
 * grants it to nobody and makes DROP EXTENSION take it.  The caller holds
 * the storage lock.
 */
static void
IdemOutboxCreateParent(void)
{
	StringInfoData sql;

	(void) IdemOutboxRequireMember(MEMBER_EVENT_SEQ);
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE idempotency.%s (%s) PARTITION BY LIST (seg); "
					 "CREATE INDEX %s ON idempotency.%s (role, topic, ev_id) INCLUDE (txid); "
					 "COMMENT ON TABLE idempotency.%s IS %s",
					 OUTBOX_TABLE, OUTBOX_COLUMNS, OUTBOX_INDEX, OUTBOX_TABLE,
					 OUTBOX_TABLE,
					 quote_literal_cstr("Events of idem_publish(), one partition per segment; managed by the idempotency extension."));
	IdemExecAsOwner(sql.data, 0);
	pfree(sql.data);
	CommandCounterIncrement();
	IdemOutboxRebuild();
	if (!OidIsValid(cache.parent))
		elog(ERROR, "could not find table \"%s.%s\" after creating it",
			 IDEM_SCHEMA_NAME, OUTBOX_TABLE);
	IdemRestrictTableAcl(cache.parent);
	IdemOutboxEnsureDependency();
}

/*
 * IdemOutboxCreateSegment makes segment "seg" (a new partition of the
 * events table, as the storage owner) and records when it was opened, in
 * the caller's transaction, under the storage lock (held until it ends).
 * Returns its OID.
 */
Oid
IdemOutboxCreateSegment(int32 seg)
{
	StringInfoData sql;
	char		name[NAMEDATALEN];
	Datum		args[2];
	Oid			relid;
	IdemSavedUser save;

	IdemOutboxStorageLock();
	(void) IdemOutboxRequireMember(MEMBER_SEGMENTS);
	snprintf(name, sizeof(name), "%s_%06d", OUTBOX_TABLE, seg);
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE idempotency.%s (LIKE idempotency.%s INCLUDING ALL); "
					 "ALTER TABLE idempotency.%s ATTACH PARTITION idempotency.%s FOR VALUES IN (%d)",
					 quote_identifier(name), OUTBOX_TABLE, OUTBOX_TABLE,
					 quote_identifier(name), seg);
	IdemExecAsOwner(sql.data, 0);
	pfree(sql.data);
	relid = get_relname_relid(name, get_namespace_oid(IDEM_SCHEMA_NAME, false));
	if (!OidIsValid(relid))
		elog(ERROR, "could not find segment \"%s.%s\" after creating it",
			 IDEM_SCHEMA_NAME, name);
	IdemRestrictTableAcl(relid);

	args[0] = Int32GetDatum(seg);
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	IdemOwnerSPIBegin(&save);
	(void) IdemOutboxExec(STMT_SEGMENT_PUT, args, NULL, false);
	IdemOwnerSPIEnd(&save);

	/* our own ATTACH invalidated the cache; make the next reader see it */
	CommandCounterIncrement();
	IdemStatsAdd(IDEM_STAT_OUTBOX_SEGMENTS_CREATED, 1);
	return relid;
}

/*
 * IdemOutboxNewestSegment locks the newest segment in "lockmode" and
 * returns its OID (and its seg), making the events table first if it does
 * not exist.  The lock reads the invalidations a newer segment's ATTACH
 * sent, so the newest is checked again after it; a transaction that holds
 * the lock already keeps the segment it had (see the file header).
 */
Oid
IdemOutboxNewestSegment(LOCKMODE lockmode, int32 *seg)
{
	for (;;)
	{
		uint64		generation;
		IdemOutboxSegment newest;
		int			i;
		bool		still;

		(void) IdemOutboxParent(true);
		if (!cache.valid)
			IdemOutboxRebuild();
		if (cache.nsegments == 0)
		{
			/* segments dropped by hand: make one after the highest seen */
			IdemOutboxStorageLock();
			AcceptInvalidationMessages();
			IdemOutboxRebuild();
			if (cache.nsegments == 0)
				(void) IdemOutboxCreateSegment(1);
			continue;
		}
		newest = cache.segments[cache.nsegments - 1];
		generation = segments_generation;
		LockRelationOid(newest.relid, lockmode);
		if (generation == segments_generation)
		{
			*seg = newest.seg;
			return newest.relid;
		}
		/* something changed: is it still there, and still the newest? */
		if (!cache.valid)
			IdemOutboxRebuild();
		still = false;
		for (i = 0; i < cache.nsegments; i++)
			if (cache.segments[i].relid == newest.relid)
				still = true;
		if (still && cache.segments[cache.nsegments - 1].relid == newest.relid)
		{
			*seg = newest.seg;
			return newest.relid;
		}
		if (!still)
			UnlockRelationOid(newest.relid, lockmode);
		/* a newer segment: take that one (the lock on this one stays) */
	}
}

/*
 * IdemOutboxSegmentIndex opens, in "lockmode", the index of a segment that
 * relays read: a valid btree on (role, topic, ev_id) INCLUDE (txid), with no
 * expression or predicate.  The segment must be locked.  An error if it
 * has none (dropped, or left invalid by a failed REINDEX CONCURRENTLY).
 */
Relation
IdemOutboxSegmentIndex(Relation heap, LOCKMODE lockmode)
{
	List	   *indexoids = RelationGetIndexList(heap);
	ListCell   *lc;

	foreach(lc, indexoids)
	{
		Relation	index = index_open(lfirst_oid(lc), lockmode);
		Form_pg_index form = index->rd_index;

		if (form->indisvalid && form->indisready && form->indislive &&
			index->rd_rel->relam == BTREE_AM_OID &&
			form->indnkeyatts == 3 && form->indnatts == 4 &&
			form->indkey.values[0] == Anum_outbox_role &&
			form->indkey.values[1] == Anum_outbox_topic &&
			form->indkey.values[2] == Anum_outbox_ev_id &&
			form->indkey.values[3] == Anum_outbox_txid &&
			index->rd_indcollation[OUTBOX_INDEX_TOPIC - 1] == C_COLLATION_OID &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		{
			list_free(indexoids);
			return index;
		}
		index_close(index, lockmode);
	}
	list_free(indexoids);
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("outbox segment \"%s.%s\" has no usable index",
					IDEM_SCHEMA_NAME, RelationGetRelationName(heap)),
			 errdetail("Relays need a valid btree index on columns \"role\", \"topic\" and \"ev_id\", including \"txid\", without predicate or expression."),
			 errhint("Recreate it with CREATE INDEX ON %s.%s (role, topic, ev_id) INCLUDE (txid), or REINDEX TABLE %s.%s.",
					 IDEM_SCHEMA_NAME,
					 quote_identifier(RelationGetRelationName(heap)),
					 IDEM_SCHEMA_NAME,
					 quote_identifier(RelationGetRelationName(heap)))));
	return NULL;				/* keep compiler quiet */
}

/*
 * IdemOutboxNextEvId takes the next event number.  The sequence is not
 * cached (CACHE 1), so numbers are taken in the order of real time across
 * backends, which the windows of outbox_relay.c rely on.
 */
int64
IdemOutboxNextEvId(void)
{
	return nextval_internal(IdemOutboxRequireMember(MEMBER_EVENT_SEQ), false);
}

/*
 * IdemOutboxExec runs one of the statements on the member tables under a
 * fresh snapshot, between SPI_connect and SPI_finish, as whoever the
 * caller made current (the storage owner).  Returns SPI_processed.
 */
static int
IdemOutboxExec(IdemOutboxStmt which, Datum *values, const bool *isnull,
			   bool read_only)
{
	const IdemOutboxStmtDef *def = &stmt_defs[which];

	return IdemExecKeptPlan(&stmt_plans[which], def->sql, def->nargs,
							def->argtypes, values, isnull, read_only);
}

/*
 * IdemOutboxXidBase returns the database's xid base (see the file header),
 * read once per backend once checked.  The row is made by the extension's
 * scripts, unchecked; the first call after that (CREATE EXTENSION, or a
 * restore, whose CREATE EXTENSION makes the row again: pg_dump does not
 * carry it) checks it: it raises the base, if it must, above every xid
 * stored, and records the row's xmin as checked.  All of that is written in
 * place, under a lock released at once: no caller's transaction holds
 * anything another one waits for, and a raise stays even if the caller
 * rolls back (a higher base is as right as the lower one).  Where nothing
 * may be written (a standby, a read-only transaction), an unchecked base is
 * worked out on each call and not kept.
 */
int64
IdemOutboxXidBase(void)
{
	Oid			relid;
	IdemSavedUser save;
	bool		writable = !RecoveryInProgress() && !XactReadOnly;
	int64		base;
	bool		checked;
	LOCKTAG		tag;

	if (cache.base_valid)
		return cache.base;

	relid = IdemOutboxRequireMember(MEMBER_XID_BASE);
	IdemOwnerSPIBegin(&save);
	if (!IdemOutboxPeekBase(&base, &checked))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the outbox's xid base is missing"),
				 errdetail("Table \"%s.%s\" has no row.",
						   IDEM_SCHEMA_NAME, member_names[MEMBER_XID_BASE]),
				 errhint("As its owner, run INSERT INTO %s.%s (system_identifier, base) VALUES (0, 0).",
						 IDEM_SCHEMA_NAME, member_names[MEMBER_XID_BASE])));
	if (!checked && !writable)
	{
		int64		high = IdemOutboxHighestStoredTxid();
		int64		next = (int64) U64FromFullTransactionId(ReadNextFullTransactionId());

		IdemOwnerSPIEnd(&save);
		return Max(base, high - next + 1);
	}
	if (!checked)
	{
		/* one checker at a time, for as long as the check takes only */
		SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 1, IDEM_LOCK_OUTBOX_STORAGE);
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
		if (!IdemOutboxPeekBase(&base, &checked))
			elog(ERROR, "the outbox's xid base row went away");
		if (!checked)
			base = IdemOutboxRaiseBase(relid, IdemOutboxHighestStoredTxid());
		LockRelease(&tag, ExclusiveLock, false);
	}
	IdemOwnerSPIEnd(&save);

	cache.base = base;
	cache.base_valid = true;
	return cache.base;
}

/*
 * IdemOutboxPeekBase reads the xid base row as committed (and as this
 * transaction wrote it): its base, and whether it was checked since it was
 * written (its checked_xmin is its own xmin: a row that pg_restore or
 * CREATE EXTENSION wrote is not).  False if there is no row.  Inside SPI.
 */
static bool
IdemOutboxPeekBase(int64 *base, bool *checked)
{
	bool		isnull;
	int64		checked_xmin;
	TransactionId xmin;

	(void) IdemOutboxExec(STMT_BASE_PEEK, NULL, NULL, true);
	if (SPI_processed == 0)
		return false;
	*base = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 1, &isnull));
	checked_xmin = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 2,
											   &isnull));
	xmin = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 3,
											   &isnull));
	*checked = (checked_xmin == (int64) xmin);
	return true;
}

/*
 * IdemOutboxRaiseBase sets, in place, the base of the xid base row to what
 * makes every xid from now on compare after "high" (the highest one
 * stored), if it is not that high already, and records the row as checked.
 * Returns the base.  In place (as VACUUM writes pg_class's counters): the
 * row's lock is never taken, so nobody waits for this transaction.  The
 * caller holds the base's advisory lock.
 */
static int64
IdemOutboxRaiseBase(Oid relid, int64 high)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(rel);
	int			natts = desc->natts;
	HeapTuple	oldtup;
	HeapTuple	newtup;
	void	   *state;
	Datum	   *values = palloc(natts * sizeof(Datum));
	bool	   *nulls = palloc(natts * sizeof(bool));
	bool	   *replace = palloc0(natts * sizeof(bool));
	int			att_sysid = 0;
	int			att_base = 0;
	int			att_checked = 0;
	int			i;
	int64		base;
	int64		next;

	for (i = 0; i < natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->atttypid != INT8OID)
			continue;
		if (strcmp(NameStr(att->attname), "system_identifier") == 0)
			att_sysid = i + 1;
		else if (strcmp(NameStr(att->attname), "base") == 0)
			att_base = i + 1;
		else if (strcmp(NameStr(att->attname), "checked_xmin") == 0)
			att_checked = i + 1;
	}
	if (att_sysid == 0 || att_base == 0 || att_checked == 0)
		elog(ERROR, "table \"%s.%s\" does not have the expected columns",
			 IDEM_SCHEMA_NAME, member_names[MEMBER_XID_BASE]);

	IdemInplaceUpdateBegin(rel, &oldtup, &state);
	if (!HeapTupleIsValid(oldtup))
		elog(ERROR, "the outbox's xid base row went away");
	heap_deform_tuple(oldtup, desc, values, nulls);
	if (nulls[att_base - 1] || nulls[att_sysid - 1] || nulls[att_checked - 1])
	{
		IdemInplaceUpdateCancel(state);
		elog(ERROR, "the outbox's xid base row has a null");
	}
	base = DatumGetInt64(values[att_base - 1]);
	next = (int64) U64FromFullTransactionId(ReadNextFullTransactionId());
	if (next + base <= high)
	{
		ereport(LOG,
				(errmsg("raising the outbox's xid base of database \"%s\" from " INT64_FORMAT " to " INT64_FORMAT,
						get_database_name(MyDatabaseId), base, high - next + 1),
				 errdetail("Its events and relay positions hold transaction ids ahead of this cluster's: they were restored from another cluster, or from this one before it was reset to an earlier state.")));
		base = high - next + 1;
	}
	values[att_base - 1] = Int64GetDatum(base);
	values[att_sysid - 1] = Int64GetDatum((int64) GetSystemIdentifier());
	values[att_checked - 1] =
		Int64GetDatum((int64) HeapTupleHeaderGetRawXmin(oldtup->t_data));
	replace[att_base - 1] = replace[att_sysid - 1] = replace[att_checked - 1] = true;
	newtup = heap_modify_tuple(oldtup, desc, values, nulls, replace);
	IdemInplaceUpdateFinish(state, newtup);
	heap_freetuple(newtup);
	heap_freetuple(oldtup);
	table_close(rel, RowExclusiveLock);
	pfree(values);
	pfree(nulls);
	pfree(replace);
	return base;
}

/*
 * IdemOutboxHighestStoredTxid returns the highest xid (with its base) that
 * any event or relay position of the database holds, or 0.  Run as the
 * storage owner, inside SPI, once after CREATE EXTENSION or a restore.
 */
static int64
IdemOutboxHighestStoredTxid(void)
{
	int64		high = 0;
	int			rc;
	bool		isnull;
	Datum		d;

	rc = SPI_execute("SELECT pg_catalog.max(x) FROM ("
					 "SELECT pg_catalog.max(r.up_xmax) AS x FROM idempotency.outbox_relays AS r"
					 " UNION ALL SELECT pg_catalog.max(r.lo_xmax) FROM idempotency.outbox_relays AS r) AS s",
					 true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
		high = DatumGetInt64(d);
	if (OidIsValid(IdemOutboxParent(false)))
	{
		rc = SPI_execute("SELECT pg_catalog.max(txid) FROM idempotency.outbox", true, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			high = Max(high, DatumGetInt64(d));
	}
	return high;
}

/*
 * IdemOutboxCurrentTxid returns this transaction's top-level xid as events
 * store it (64 bits, plus the base), assigning one if it has none.
 */
int64
IdemOutboxCurrentTxid(void)
{
	int64		base = IdemOutboxXidBase();

	return (int64) U64FromFullTransactionId(GetTopFullTransactionId()) + base;
}

/*
 * IdemOutboxRestrictAcls takes back every privilege granted on the events
 * table, its segments and the outbox's member tables (see
 * IdemRestrictTableAcl): they hold every role's events and positions.
 */
void
IdemOutboxRestrictAcls(void)
{
	IdemOutboxSegment *segs;
	int			n;
	int			i;

	for (i = 0; i < NUM_MEMBERS; i++)
	{
		Oid			relid = IdemOutboxMemberRelid(member_names[i]);

		if (OidIsValid(relid) && get_rel_relkind(relid) == RELKIND_RELATION)
			IdemRestrictTableAcl(relid);
	}
	if (!OidIsValid(IdemOutboxParent(false)))
		return;
	IdemRestrictTableAcl(cache.parent);
	n = IdemOutboxSegments(&segs);	/* a copy: revoking invalidates */
	for (i = 0; i < n; i++)
		IdemRestrictTableAcl(segs[i].relid);
	pfree(segs);
}

/*
 * IdemOutboxEnsureDependency records the AUTO dependency of the events
 * table on the extension when it is missing (pg_dump does not carry it), so
 * that DROP EXTENSION takes the table with it.
 */
void
IdemOutboxEnsureDependency(void)
{
	IdemEnsureRelationDependency(IdemOutboxParent(false));
}

/*
 * IdemOutboxIntervalUs returns how long a segment takes events before
 * maintenance makes the next one: a quarter of idempotency.outbox_retention,
 * at least one second and at most one day.
 */
int64
IdemOutboxIntervalUs(void)
{
	int64		interval = (int64) idem_outbox_retention * USECS_PER_SEC / 4;

	return Min(Max(interval, USECS_PER_SEC), USECS_PER_DAY);
}

/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  The partitioned tables of the ledgers: their creation, the backend's
 *	  cache of their live partitions, and partition DDL.
 *
 * Each ledger is one table partitioned by RANGE (lane, expires_at).  A
 * partition holds one lane and one range of expiry times.  A row's lane is
 * a hash of its digest, so a key only ever lives in the partitions of its
 * own lane, and a lookup touches the two or three live partitions of that
 * lane however many partitions the ledger has.  Lane boundaries are
 * staggered by one partition interval, so one lane partition becomes
 * droppable every interval (doc/design.md, "Lanes"; the layout's formula
 * is at IdemCurrentLayout and IdemPartitionBounds).
 *
 * Both ledgers' tables start with the same four columns, (expires_at
 * timestamptz, digest uuid, role regrole (an idempotency.role_ref, the
 * same four bytes, once citus_distribute() distributed the ledger:
 * role_ref.c), lane int2), and each partition
 * has a btree on (role, digest): probe.c relies on both.  (A ledger
 * distributed by Citus has, instead, a unique one on (role, digest, lane,
 * expires_at, tenant), its replica identity, which probes use by its first
 * two columns: indexes.c.)  (Before 0.4.0 it
 * was on digest alone, which let one role's probe read another role's
 * entry: see IdemUpgradeLedgerIndex.)  The key ledger has more columns
 * after them (ledger_defs; six more since 0.4.0, which a table made for
 * an earlier installed version lacks until the update adds them).  Tables
 * and partitions are made as the owner of schema idempotency
 * (privilege.c), whatever the caller.
 *
 * The tables are created on first use, not by the extension script: they
 * are not extension members, which keeps pg_dump/pg_restore of them and of
 * partitions made at run time working.  An AUTO dependency on the extension
 * makes DROP EXTENSION remove them.
 *
 * The list of partitions is read from pg_inherits and pg_class.relpartbound
 * without locking the parent, and cached per backend until a relcache
 * invalidation of the parent (sent by ATTACH, DETACH and DROP of any of its
 * partitions) arrives.  Calls that use the ledgers never lock the parent, so
 * DDL on the parent never waits for them and never blocks them.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/storage.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "compat.h"
#include "filter.h"
#include "keyhash.h"
#include "privilege.h"
#include "relation_checks.h"
#include "stats.h"
#include "storage.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/index.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_index.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

/* How long maintenance waits for each lock IdemUpgradeLedgerIndex takes */
#define IDEM_UPGRADE_LOCK_TIMEOUT_MS	1000

/* Partition boundaries are aligned to the Unix epoch */
#define IDEM_ORIGIN \
	((TimestampTz) (UNIX_EPOCH_JDATE - POSTGRES_EPOCH_JDATE) * USECS_PER_DAY)

/* What one ledger's table looks like */
typedef struct IdemLedgerDef
{
	const char *name;			/* table name in schema idempotency */
	const char *columns;		/* column list of CREATE TABLE */
	const char *indexes;		/* index definitions before 0.4.0 */
	const char *columns_040;	/* columns added by 0.4.0, or NULL */
	const char *indexes_040;	/* index definitions since 0.4.0 */
	const char *comment;
} IdemLedgerDef;

static const IdemLedgerDef ledger_defs[IDEM_NUM_LEDGERS] = {
	[IDEM_LEDGER_MESSAGES] = {
		"messages",
		"expires_at pg_catalog.timestamptz NOT NULL, "
		"digest pg_catalog.uuid NOT NULL, "
		"role pg_catalog.regrole NOT NULL, "
		"lane pg_catalog.int2 NOT NULL",
		"CREATE INDEX messages_digest_idx ON idempotency.messages (digest) WITH (deduplicate_items = off)",
		NULL,
		/* keep in step with the update script from 0.3.1 */
		"CREATE INDEX messages_role_digest_idx ON idempotency.messages (role, digest) "
		"WITH (deduplicate_items = off)",
		"Processed-message ledger of idem_consume_message(); managed by the idempotency extension."
	},
	[IDEM_LEDGER_KEYS] = {
		"keys",
		"expires_at pg_catalog.timestamptz NOT NULL, "
		"digest pg_catalog.uuid NOT NULL, "
		"role pg_catalog.regrole NOT NULL, "
		"lane pg_catalog.int2 NOT NULL, "
		"state pg_catalog.\"char\" NOT NULL, "
		"token pg_catalog.int8 NOT NULL, "
		"claimed_at pg_catalog.timestamptz NOT NULL, "
		"lease_until pg_catalog.timestamptz, "
		"fingerprint pg_catalog.bytea, "
		"recovery_point pg_catalog.text, "
		"response_code pg_catalog.int4, "
		"response_body pg_catalog.jsonb",
		"CREATE INDEX keys_digest_idx ON idempotency.keys (digest) WITH (deduplicate_items = off)",
		/* keep these in step with the update script from 0.3.1 */
		", kept_key pg_catalog.text, "
		"kept_scope pg_catalog.text, "
		"kept_request pg_catalog.jsonb, "
		"recover_at pg_catalog.timestamptz, "
		"response_headers pg_catalog.jsonb, "
		"response_raw pg_catalog.bytea",
		"CREATE INDEX keys_role_digest_idx ON idempotency.keys (role, digest) "
		"WITH (deduplicate_items = off); "
		"CREATE INDEX keys_recover_idx ON idempotency.keys (role, recover_at) "
		"WHERE recover_at IS NOT NULL",
		"Idempotency-key ledger of idem_claim(); managed by the idempotency extension."
	},
};

/*
 * The backend's view of one ledger.  "valid" is set only once a rebuild has
 * read everything without error and no invalidation arrived meanwhile, so
 * an error while reading (a cancel, a lock timeout, out of memory) leaves
 * the cache to be read again by the next call, never valid and incomplete.
 */
typedef struct IdemLedgerCache
{
	bool		valid;
	uint64		invalidations;	/* bumped by every invalidation of it */
	Oid			routed;			/* a shard's cache: the shard's table */
	Oid			parent;			/* InvalidOid if the table does not exist */
	int			parent_natts;	/* its columns */
	Oid			tenant_type;	/* the type of its "tenant" column (a ledger
								 * distributed by Citus), or InvalidOid */
	int			npartitions;
	IdemPartition *partitions;	/* sorted by (lane, lower) */
	Oid		   *relids;			/* the partitions' OIDs, sorted */
	int			nlayouts;
	int16		layouts[2 * IDEM_MAX_LANES];	/* distinct layouts present: the
												 * lane value of their lane 0 */
} IdemLedgerCache;

static IdemLedgerCache ledger_cache[IDEM_NUM_LEDGERS];

/*
 * The caches of the local shards of ledgers distributed by Citus (citus.c),
 * one per shard's table, made when a call is first routed to it; the same
 * invalidations apply.  NULL until then: nothing changes without Citus.
 */
typedef struct IdemShardCacheEntry
{
	Oid			relid;			/* hash key: the shard's table */
	IdemLedgerCache cache;
} IdemShardCacheEntry;

static HTAB *shard_caches = NULL;

/*
 * The table read in place of a ledger's (citus.c): the local shard of a
 * distributed ledger, set by a routed call for that call only (citus.c
 * clears it when the call returns or its (sub)transaction aborts);
 * InvalidOid otherwise.
 */
static Oid	ledger_parent_override[IDEM_NUM_LEDGERS];
static MemoryContext IdemCacheContext = NULL;
static uint64 cache_generation = 0;

static void IdemRelcacheCallback(Datum arg, Oid relid);
static IdemLedgerCache *IdemGetLedgerCache(IdemLedger ledger);
static IdemLedgerCache *IdemShardCache(Oid relid);
static void IdemInvalidateCache(IdemLedgerCache *cache, Oid relid);
static void IdemRebuildLedgerCache(IdemLedger ledger, IdemLedgerCache *cache);
static void IdemUpgradeLedgerColumns(IdemLedger ledger);
static int	IdemRelNatts(Oid relid);
static Oid	IdemIdentityIndexOf(IdemLedger ledger, Oid partition);
static char IdemReplicaIdentityOf(Oid relid);
static Oid	IdemTenantColumnType(IdemLedger ledger, Oid relid, int natts);
static bool IdemReadBound(PartitionBoundSpec *spec, int16 also_lane, int16 *lane,
						  TimestampTz *lower, TimestampTz *upper);
static int	IdemFirstInLane(IdemLedgerCache *cache, int16 lane);
static int	IdemOidCmp(const void *a, const void *b);
static void *IdemCacheCopy(void *data, Size size);
static void IdemSetLedgerCache(IdemLedgerCache *cache, Oid parent,
							   IdemPartition *parts, Oid *relids, int n,
							   const int16 *layouts, int nlayouts);

/*
 * IdemStorageInit registers the relcache callback that invalidates the
 * partition cache.  Called once from _PG_init.
 */
void
IdemStorageInit(void)
{
	IdemRegisterRelcacheCallback(IdemRelcacheCallback);
}

/* the extension's relcache callbacks, called by IdemRelcacheDispatch */
#define IDEM_MAX_RELCACHE_HANDLERS 16
static IdemRelcacheHandler relcache_handlers[IDEM_MAX_RELCACHE_HANDLERS];
static int	n_relcache_handlers = 0;

static void
IdemRelcacheDispatch(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < n_relcache_handlers; i++)
		relcache_handlers[i] (arg, relid);
}

/*
 * IdemRegisterRelcacheCallback adds a handler of relcache invalidations.
 * The extension registers one callback with PostgreSQL for all of them:
 * PostgreSQL has room for ten per backend (MAX_RELCACHE_CALLBACKS), and
 * with Citus preloaded (five) one each ran out ("out of
 * relcache_callback_list slots", FATAL at the first use of the extension).
 */
void
IdemRegisterRelcacheCallback(IdemRelcacheHandler handler)
{
	if (n_relcache_handlers == 0)
		CacheRegisterRelcacheCallback(IdemRelcacheDispatch, (Datum) 0);
	if (n_relcache_handlers >= IDEM_MAX_RELCACHE_HANDLERS)
		elog(FATAL, "out of idempotency relcache handler slots");
	relcache_handlers[n_relcache_handlers++] = handler;
}

/*
 * IdemRelcacheCallback marks a ledger's cache stale when the relcache entry
 * of its parent table is invalidated (PostgreSQL does that whenever a
 * partition is attached, detached or dropped), or that of one of its
 * partitions (any DDL on it, REINDEX, VACUUM FULL, ...), or all of them;
 * the same for the caches of the shards of distributed ledgers.  No
 * catalog access here.
 */
static void
IdemRelcacheCallback(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < IDEM_NUM_LEDGERS; i++)
		IdemInvalidateCache(&ledger_cache[i], relid);
	if (shard_caches != NULL)
	{
		HASH_SEQ_STATUS status;
		IdemShardCacheEntry *entry;

		hash_seq_init(&status, shard_caches);
		while ((entry = hash_seq_search(&status)) != NULL)
			IdemInvalidateCache(&entry->cache, relid);
	}
}

static void
IdemInvalidateCache(IdemLedgerCache *cache, Oid relid)
{
	if (relid == InvalidOid || relid == cache->parent ||
		relid == cache->routed ||
		(cache->npartitions > 0 &&
		 bsearch(&relid, cache->relids, cache->npartitions, sizeof(Oid),
				 IdemOidCmp) != NULL))
	{
		cache->valid = false;
		cache->invalidations++;
		cache_generation++;
	}
}

static int
IdemOidCmp(const void *a, const void *b)
{
	Oid			x = *(const Oid *) a;
	Oid			y = *(const Oid *) b;

	return (x > y) - (x < y);
}

const char *
IdemLedgerName(IdemLedger ledger)
{
	return ledger_defs[ledger].name;
}

/*
 * IdemLedgerHasColumns: does a table with "natts" columns have the columns
 * of a ledger?  The key ledger has six more since 0.4.0 (kept requests,
 * response headers and raw responses), added by the update from 0.3.1; a
 * table made before the update has only the first ones, and this library
 * then writes only those (the functions able to fill the others come with
 * the update).
 */
bool
IdemLedgerHasColumns(IdemLedger ledger, int natts)
{
	if (natts == IdemTenantAttnum(ledger))
		return true;			/* distributed by Citus: "tenant" last */
	if (ledger == IDEM_LEDGER_MESSAGES)
		return natts == Natts_messages;
	return natts == Natts_keys || natts == Natts_keys_v1;
}

/*
 * IdemLedgerTenantType returns the type of the "tenant" column of the
 * ledger's own table, which a ledger distributed by Citus has
 * (idempotency.citus_distribute()), or InvalidOid: the ledger is then not
 * distributed, and calls are not routed (citus.c).  From the partition
 * cache: no catalog access once it is valid.
 */
Oid
IdemLedgerTenantType(IdemLedger ledger)
{
	IdemLedgerCache *cache = &ledger_cache[ledger];

	if (!cache->valid)
		IdemRebuildLedgerCache(ledger, cache);
	return OidIsValid(cache->parent) ? cache->tenant_type : InvalidOid;
}

/*
 * IdemIdentityIndexOf returns the index of "partition" that is attached to
 * the ledger's idempotency.<ledger>_identity_idx (citus_distribute()), the
 * partition's replica identity, or InvalidOid if there is none.
 */
static Oid
IdemIdentityIndexOf(IdemLedger ledger, Oid partition)
{
	char		name[NAMEDATALEN];
	Oid			parent_index;
	List	   *children;
	ListCell   *lc;

	snprintf(name, sizeof(name), "%s_identity_idx", IdemLedgerName(ledger));
	parent_index = get_relname_relid(name, get_namespace_oid(IDEM_SCHEMA_NAME, false));
	if (!OidIsValid(parent_index))
		return InvalidOid;
	children = find_inheritance_children(parent_index, NoLock);
	foreach(lc, children)
	{
		Oid			child = lfirst_oid(lc);

		if (IndexGetRelation(child, true) == partition)
			return child;
	}
	return InvalidOid;
}

/*
 * IdemTenantColumnType returns the type of column "tenant" of table relid
 * of "natts" columns when it is the last one, after the ledger's own.
 */
static Oid
IdemTenantColumnType(IdemLedger ledger, Oid relid, int natts)
{
	HeapTuple	tup;
	Oid			type = InvalidOid;

	if (natts != IdemTenantAttnum(ledger))
		return InvalidOid;
	tup = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relid),
						  Int16GetDatum(IdemTenantAttnum(ledger)));
	if (HeapTupleIsValid(tup))
	{
		Form_pg_attribute att = (Form_pg_attribute) GETSTRUCT(tup);

		if (!att->attisdropped &&
			strcmp(NameStr(att->attname), IDEM_TENANT_COLUMN) == 0)
			type = att->atttypid;
		ReleaseSysCache(tup);
	}
	return type;
}

/*
 * IdemLedgerDefaultTtl returns the default ttl (seconds) of a ledger, which
 * also sizes its partitions.
 */
int
IdemLedgerDefaultTtl(IdemLedger ledger)
{
	return ledger == IDEM_LEDGER_MESSAGES ? idem_message_ttl : idem_key_ttl;
}

/*
 * IdemCurrentLayout computes the layout that new partitions of a ledger get
 * under the current settings: as many lanes as partition intervals fit in
 * the ledger's default ttl (at most IDEM_MAX_LANES), each partition spanning
 * lanes * interval, and lane n starting n intervals after lane 0.  A row
 * written with the default ttl then lands in the second live partition of
 * its lane, and lookups probe two or three.
 *
 * When the interval is so short that IDEM_MAX_LANES lanes span less than
 * half the ttl, partitions are widened to half the ttl (and the stagger with
 * them), so that a lane never has more than a handful of live partitions.
 */
void
IdemCurrentLayout(IdemLedger ledger, IdemLayout *layout)
{
	int64		ttl_us = (int64) IdemLedgerDefaultTtl(ledger) * USECS_PER_SEC;
	int64		interval_us = (int64) idem_partition_interval * USECS_PER_SEC;
	int64		lanes;
	int64		width_us;

	lanes = (ttl_us + interval_us / 2) / interval_us;
	lanes = Max(lanes, 1);
	lanes = Min(lanes, IDEM_MAX_LANES);
	width_us = lanes * interval_us;
	if (width_us < ttl_us / 2)
	{
		/* whole seconds, divisible by the lane count */
		width_us = ttl_us / 2;
		width_us -= width_us % (lanes * USECS_PER_SEC);
		width_us = Max(width_us, lanes * interval_us);
	}

	layout->lanes = (int) lanes;
	layout->width_us = width_us;
	layout->interval_us = width_us / lanes;
}

/*
 * IdemPartitionBounds returns the aligned range of lane "lane_number" of a
 * layout that contains time t.
 */
void
IdemPartitionBounds(const IdemLayout *layout, int lane_number, TimestampTz t,
					TimestampTz *lower, TimestampTz *upper)
{
	TimestampTz offset = IDEM_ORIGIN + lane_number * layout->interval_us;
	int64		k;

	k = (t - offset) / layout->width_us;
	if ((t - offset) < 0 && (t - offset) % layout->width_us != 0)
		k--;					/* floor division */
	*lower = offset + k * layout->width_us;
	*upper = *lower + layout->width_us;
}

/*
 * IdemTargetIsFar: does a new row expiring at expires_at, written at "now",
 * go to a far partition of its lane ("layout" is the current one)?  It does when its expiry is beyond the
 * horizon maintenance keeps made (the default ttl plus premake partitions
 * of the current layout from now) by more than one partition width: a row
 * with the default ttl, or a little more, never does.
 *
 * Any role can ask for any ttl up to idempotency.max_ttl.  Rows with such
 * ttls go to "far" partitions, which have their own lane value (so that
 * they never meet the lane's other partitions) and are wider: at most
 * IDEM_FAR_PARTITIONS of them cover max_ttl.  Without them, a role that
 * asked for many distinct long ttls would make one partition per ttl in a
 * lane (720 with one-hour partitions and a 30-day max_ttl), which every
 * call with a key in that lane then probes.  Rows with the default ttl
 * never go there, so they keep being dropped within one partition width
 * of their expiry; a row in a far partition may stay on disk up to that
 * partition's width past its expiry.
 */
bool
IdemTargetIsFar(IdemLedger ledger, const IdemLayout *layout, TimestampTz now,
				TimestampTz expires_at)
{
	return expires_at >= now +
		(int64) IdemLedgerDefaultTtl(ledger) * USECS_PER_SEC +
		(idem_premake + 1) * layout->width_us;
}

/*
 * IdemNewPartitionBounds returns the range a new partition of lane
 * "lane_number" of a layout gets to hold time "at" (before it is clipped to
 * its neighbours): the layout's range containing "at", or for a far
 * partition (see IdemTargetIsFar) the aligned range of the smallest width
 * that is the layout's width times a power of two and at least
 * idempotency.max_ttl / IDEM_FAR_PARTITIONS.  Far ranges keep the lane's
 * stagger, so that a range of one width either holds one of a smaller
 * width or does not meet it.
 */
void
IdemNewPartitionBounds(const IdemLayout *layout, int lane_number, bool far,
					   TimestampTz at, TimestampTz *lower, TimestampTz *upper)
{
	IdemLayout	wide = *layout;

	if (far)
	{
		int64		max_ttl_us = (int64) idem_max_ttl * USECS_PER_SEC;

		while (wide.width_us < max_ttl_us / IDEM_FAR_PARTITIONS &&
			   wide.width_us <= PG_INT64_MAX / 4)
			wide.width_us *= 2;
	}
	IdemPartitionBounds(&wide, lane_number, at, lower, upper);
}

/*
 * IdemPartitionsGeneration returns a counter that changes whenever a ledger
 * cache is invalidated or rebuilt from an existing table; callers holding
 * copies of cache entries compare it before and after taking locks.
 */
uint64
IdemPartitionsGeneration(void)
{
	return cache_generation;
}

static IdemLedgerCache *
IdemGetLedgerCache(IdemLedger ledger)
{
	IdemLedgerCache *cache;

	/* a call routed to a shard (citus.c) reads that shard's cache */
	if (OidIsValid(ledger_parent_override[ledger]))
		cache = IdemShardCache(ledger_parent_override[ledger]);
	else
		cache = &ledger_cache[ledger];
	if (!cache->valid)
		IdemRebuildLedgerCache(ledger, cache);
	return cache;
}

/*
 * IdemShardCache returns the cache of the partitions of a shard's table
 * "relid", a new empty one the first time.
 */
static IdemLedgerCache *
IdemShardCache(Oid relid)
{
	IdemShardCacheEntry *entry;
	bool		found;

	if (shard_caches == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(IdemShardCacheEntry);
		ctl.hcxt = CacheMemoryContext;
		shard_caches = hash_create("idempotency shard partition caches", 64,
								   &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	entry = hash_search(shard_caches, &relid, HASH_ENTER, &found);
	if (!found)
	{
		memset(&entry->cache, 0, sizeof(IdemLedgerCache));
		entry->cache.routed = relid;
	}
	return &entry->cache;
}

/*
 * IdemSetLedgerParentOverride makes "relid" (a partitioned table like the
 * ledger's: the local shard of a distributed ledger) the table the ledger's
 * cache reads, until set again; InvalidOid makes it the ledger's own table
 * again (citus.c).
 */
void
IdemSetLedgerParentOverride(IdemLedger ledger, Oid relid)
{
	ledger_parent_override[ledger] = relid;
}

/*
 * IdemRebuildLedgerCache reads the ledger's partitions from the catalogs.
 *
 * Everything is read into new memory first; the cache is changed only at
 * the end, and marked valid only if no invalidation arrived while reading.
 */
static void
IdemRebuildLedgerCache(IdemLedger ledger, IdemLedgerCache *cache)
{
	uint64		invalidations = cache->invalidations;
	Oid			nspid;
	Oid			parent = InvalidOid;
	int			n;
	IdemPartition *parts;
	Oid		   *relids;
	int16		layouts[2 * IDEM_MAX_LANES];
	int			nlayouts;
	int			i;

	if (IdemCacheContext == NULL)
		IdemCacheContext = AllocSetContextCreate(CacheMemoryContext,
												 "idempotency partition cache",
												 ALLOCSET_SMALL_SIZES);

	nspid = get_namespace_oid(IDEM_SCHEMA_NAME, true);
	if (OidIsValid(cache->routed))
		parent = cache->routed;
	else if (OidIsValid(nspid))
		parent = get_relname_relid(ledger_defs[ledger].name, nspid);
	if (!OidIsValid(parent))
	{
		/* nothing to cache; look again next time */
		IdemSetLedgerCache(cache, InvalidOid, NULL, NULL, 0, NULL, 0);
		return;
	}

	/*
	 * From here on, an invalidation of the table counts (see
	 * IdemRelcacheCallback): one that arrives while we read, from a
	 * partition attached after our catalog snapshot, must make the result
	 * invalid, also when this is the backend's first read.
	 */
	cache->parent = parent;
	cache->parent_natts = IdemRelNatts(parent);
	cache->tenant_type = IdemTenantColumnType(ledger, parent,
											  cache->parent_natts);

	/*
	 * Read into the caller's memory, copied into the cache's only at the
	 * end: an error while reading (a cancel, a lock timeout) leaves
	 * nothing behind for the backend's life.
	 */
	n = IdemReadPartitions(parent, 0, &parts);

	/* the OIDs, sorted, for the invalidation callback */
	relids = palloc(Max(n, 1) * sizeof(Oid));
	for (i = 0; i < n; i++)
		relids[i] = parts[i].relid;
	qsort(relids, n, sizeof(Oid), IdemOidCmp);

	/* distinct layouts present (lane counts, current or legacy) */
	nlayouts = 0;
	for (i = 0; i < n; i++)
	{
		int16		layout = IdemLaneValueOf(IdemLaneLanes(parts[i].lane), 0,
											 IdemLaneIsLegacy(parts[i].lane));
		int			k;

		for (k = 0; k < nlayouts; k++)
			if (layouts[k] == layout)
				break;
		if (k == nlayouts && nlayouts < lengthof(layouts))
			layouts[nlayouts++] = layout;
	}

	/* into the cache's memory: the cache now owns both copies */
	parts = IdemCacheCopy(parts, n * sizeof(IdemPartition));
	relids = IdemCacheCopy(relids, n * sizeof(Oid));
	IdemSetLedgerCache(cache, parent, parts, relids, n, layouts, nlayouts);
	cache->valid = (cache->invalidations == invalidations);
	cache_generation++;
}

/*
 * IdemReadPartitions sets *out to a palloc'd array of the partitions of
 * table "parent", sorted by (lane, lower), read from pg_inherits and
 * pg_class.relpartbound without locking the parent, and returns how many.
 * Partitions whose detach is pending and partitions whose bounds are not
 * of the (lane, lane) x (lower, upper) shape this extension makes are left
 * out.
 */
int
IdemReadPartitions(Oid parent, int16 also_lane, IdemPartition **out)
{
	Relation	inhrel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;
	int			allocated = 16;
	int			n = 0;
	IdemPartition *parts = palloc(allocated * sizeof(IdemPartition));
	int			i;

	inhrel = table_open(InheritsRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_inherits_inhparent, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(parent));
	scan = systable_beginscan(inhrel, InheritsParentIndexId, true, NULL,
							  1, &key);
	while ((tup = systable_getnext(scan)) != NULL)
	{
		Form_pg_inherits inh = (Form_pg_inherits) GETSTRUCT(tup);
		HeapTuple	reltup;
		Datum		datum;
		bool		isnull;
		PartitionBoundSpec *spec;
		IdemPartition p;

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
			!IdemReadBound(spec, also_lane, &p.lane, &p.lower, &p.upper))
			continue;
		p.relid = inh->inhrelid;

		if (n == allocated)
		{
			allocated *= 2;
			parts = repalloc(parts, allocated * sizeof(IdemPartition));
		}
		parts[n++] = p;
	}
	systable_endscan(scan);
	table_close(inhrel, AccessShareLock);

	/* sort by (lane, lower): insertion sort, lists are short and mostly sorted */
	for (i = 1; i < n; i++)
	{
		IdemPartition p = parts[i];
		int			j = i - 1;

		while (j >= 0 &&
			   (parts[j].lane > p.lane ||
				(parts[j].lane == p.lane && parts[j].lower > p.lower)))
		{
			parts[j + 1] = parts[j];
			j--;
		}
		parts[j + 1] = p;
	}
	*out = parts;
	return n;
}

/*
 * IdemCacheCopy returns a copy of "size" bytes at "data" in the partition
 * cache's memory, and frees "data".  If the allocation fails, "data" is
 * left to the caller's memory context.
 */
static void *
IdemCacheCopy(void *data, Size size)
{
	void	   *copy = MemoryContextAlloc(IdemCacheContext, Max(size, 1));

	memcpy(copy, data, size);
	pfree(data);
	return copy;
}

/*
 * IdemSetLedgerCache replaces the contents of a ledger's cache (not its
 * validity), freeing the old ones.  Nothing here can fail.
 */
static void
IdemSetLedgerCache(IdemLedgerCache *cache, Oid parent, IdemPartition *parts,
				   Oid *relids, int n, const int16 *layouts, int nlayouts)
{
	if (cache->partitions)
		pfree(cache->partitions);
	if (cache->relids)
		pfree(cache->relids);
	cache->parent = parent;
	cache->partitions = parts;
	cache->relids = relids;
	cache->npartitions = n;
	cache->nlayouts = nlayouts;
	if (nlayouts > 0)
		memcpy(cache->layouts, layouts, nlayouts * sizeof(int16));
}

/*
 * IdemReadBound extracts (lane, lower, upper) from a range bound of the form
 * FROM (lane, lower) TO (lane, upper).  Returns false for any other shape,
 * or a lane value no layout has, unless it is "also_lane" (0: none).
 */
static bool
IdemReadBound(PartitionBoundSpec *spec, int16 also_lane, int16 *lane,
			  TimestampTz *lower, TimestampTz *upper)
{
	PartitionRangeDatum *lo_lane,
			   *lo_time,
			   *hi_lane,
			   *hi_time;

	if (spec->strategy != PARTITION_STRATEGY_RANGE || spec->is_default ||
		list_length(spec->lowerdatums) != 2 ||
		list_length(spec->upperdatums) != 2)
		return false;

	lo_lane = linitial_node(PartitionRangeDatum, spec->lowerdatums);
	lo_time = lsecond_node(PartitionRangeDatum, spec->lowerdatums);
	hi_lane = linitial_node(PartitionRangeDatum, spec->upperdatums);
	hi_time = lsecond_node(PartitionRangeDatum, spec->upperdatums);
	if (lo_lane->kind != PARTITION_RANGE_DATUM_VALUE ||
		lo_time->kind != PARTITION_RANGE_DATUM_VALUE ||
		hi_lane->kind != PARTITION_RANGE_DATUM_VALUE ||
		hi_time->kind != PARTITION_RANGE_DATUM_VALUE ||
		!IsA(lo_lane->value, Const) || !IsA(lo_time->value, Const) ||
		!IsA(hi_lane->value, Const) || !IsA(hi_time->value, Const))
		return false;

	if (DatumGetInt16(castNode(Const, lo_lane->value)->constvalue) !=
		DatumGetInt16(castNode(Const, hi_lane->value)->constvalue))
		return false;

	*lane = DatumGetInt16(castNode(Const, lo_lane->value)->constvalue);
	*lower = DatumGetTimestampTz(castNode(Const, lo_time->value)->constvalue);
	*upper = DatumGetTimestampTz(castNode(Const, hi_time->value)->constvalue);
	if (also_lane != 0 && *lane == also_lane)
		return true;
	return IdemLaneLanes(*lane) >= 1 && IdemLaneLanes(*lane) <= IDEM_MAX_LANES &&
		IdemLaneNumber(*lane) < IdemLaneLanes(*lane) &&
		!(IdemLaneIsLegacy(*lane) && IdemLaneIsFar(*lane)) &&
		(((uint16) *lane) & 0x0040) == 0;
}

/* index of the first cached partition of a lane (binary search) */
static int
IdemFirstInLane(IdemLedgerCache *cache, int16 lane)
{
	int			lo = 0,
				hi = cache->npartitions;

	while (lo < hi)
	{
		int			mid = (lo + hi) / 2;

		if (cache->partitions[mid].lane < lane)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * IdemLivePartitionsForKey sets *out to a palloc'd array of every partition
 * a live row of the key with this digest can be in, and returns how many
 * there are: the partitions of its lanes, under each layout present, those
 * whose range has ended (not dropped yet) included: a row of a transaction
 * in progress counts as live whatever its expiry (see IdemProbe).  The
 * ended ones have "ended" set; IdemOpenLivePartitions asks the lock manager
 * whether a transaction that wrote into them is still running.
 *
 * (Until 0.3.1 an ended partition was skipped once every transaction older
 * than the next transaction ID seen at its end had ended.  That relied on
 * writers never writing into a partition after its end by the clock of the
 * backend that saw the end, which a writer whose wait outlasted its ttl, or
 * a clock that steps backwards, broke: two callers could both claim a key.
 * Ended partitions are few, between their end and maintenance's drop, so
 * the lock manager is asked every time.)
 *
 * There is no upper limit: how many partitions a lane has is not for any
 * one role to decide (see IdemTargetIsFar), and a transaction left open
 * for long keeps ended partitions in the list, however many there are.
 */
int
IdemLivePartitionsForKey(IdemLedger ledger, const pg_uuid_t *digest,
						 TimestampTz now, IdemPartition **out)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	int			n = 0;
	int			allocated = 8;
	int			k;

	*out = palloc(allocated * sizeof(IdemPartition));
	for (k = 0; k < cache->nlayouts * 2; k++)
	{
		int16		layout = cache->layouts[k / 2];
		int16		lane = IdemLaneValue(digest, IdemLaneLanes(layout),
										 IdemLaneIsLegacy(layout));
		int			i;

		/* each layout's lane, then (but for legacy ones) its far lane */
		if (k % 2 == 1)
		{
			if (IdemLaneIsLegacy(layout))
				continue;
			lane = IdemFarLane(lane);
		}
		for (i = IdemFirstInLane(cache, lane);
			 i < cache->npartitions && cache->partitions[i].lane == lane;
			 i++)
		{
			IdemPartition *p = &cache->partitions[i];
			bool		ended = (p->upper <= now);

			if (n == allocated)
			{
				allocated *= 2;
				*out = repalloc(*out, allocated * sizeof(IdemPartition));
			}
			(*out)[n] = *p;
			(*out)[n].ended = ended;
			n++;
		}
	}
	return n;
}

/*
 * IdemPartitionFor finds the partition a new row of this digest expiring at
 * expires_at goes to: one made since 0.3.0 (legacy partitions take no new
 * rows), of the lane's far partitions if "far" (see IdemTargetIsFar),
 * preferring the layout of the current settings, under which the digest's
 * lane is "lane".
 */
bool
IdemPartitionFor(IdemLedger ledger, const pg_uuid_t *digest, int16 lane,
				 bool far, TimestampTz expires_at, IdemPartition *out)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	int			k;

	/* the current layout's lane, the digest's lane under it */
	if (IdemLanePartitionAt(ledger, far ? IdemFarLane(lane) : lane,
							expires_at, out))
		return true;

	/* any other layout made since 0.3.0 */
	for (k = 0; k < cache->nlayouts; k++)
	{
		int			lanes = IdemLaneLanes(cache->layouts[k]);
		int16		other;

		if (IdemLaneIsLegacy(cache->layouts[k]) || lanes == IdemLaneLanes(lane))
			continue;
		other = IdemLaneValue(digest, lanes, false);
		if (IdemLanePartitionAt(ledger, far ? IdemFarLane(other) : other,
								expires_at, out))
			return true;
	}
	return false;
}

/*
 * IdemLanePartitionAt finds the partition of lane value "lane" whose range
 * contains t.
 */
bool
IdemLanePartitionAt(IdemLedger ledger, int16 lane, TimestampTz t,
					IdemPartition *out)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	int			i;

	for (i = IdemFirstInLane(cache, lane);
		 i < cache->npartitions && cache->partitions[i].lane == lane;
		 i++)
	{
		if (cache->partitions[i].lower <= t && t < cache->partitions[i].upper)
		{
			*out = cache->partitions[i];
			return true;
		}
	}
	return false;
}

/*
 * IdemIsLedgerRelation: is relid a ledger's table, or one of the partitions
 * the ledger caches list (in whatever schema it lives)?
 */
bool
IdemIsLedgerRelation(Oid relid)
{
	int			ledger;

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		IdemLedgerCache *cache;

		if (!IdemLedgerDefined(ledger))
			continue;
		cache = IdemGetLedgerCache(ledger);
		if (!OidIsValid(cache->parent))
			continue;
		if (relid == cache->parent ||
			(cache->npartitions > 0 &&
			 bsearch(&relid, cache->relids, cache->npartitions, sizeof(Oid),
					 IdemOidCmp) != NULL))
			return true;
	}
	return false;
}

/*
 * IdemLedgerDefined tells whether this version of the extension has a table
 * for the ledger.
 */
bool
IdemLedgerDefined(IdemLedger ledger)
{
	return ledger_defs[ledger].columns != NULL;
}

/*
 * IdemAllPartitions returns palloc'd copies of every cached partition of a
 * ledger, in (lane, lower) order.
 */
List *
IdemAllPartitions(IdemLedger ledger)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	List	   *result = NIL;
	int			i;

	for (i = 0; i < cache->npartitions; i++)
	{
		IdemPartition *p = palloc(sizeof(IdemPartition));

		*p = cache->partitions[i];
		result = lappend(result, p);
	}
	return result;
}

/*
 * IdemLedgerParent returns the OID of a ledger's partitioned table, creating
 * it (as the owner of schema idempotency) if it does not exist and "create"
 * is true.  Concurrent creators serialize on the ledger's creation lock; the
 * table belongs to the creating transaction until it commits.
 */
Oid
IdemLedgerParent(IdemLedger ledger, bool create)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	const IdemLedgerDef *def = &ledger_defs[ledger];
	LOCKTAG		tag;
	StringInfoData sql;
	ObjectAddress table;
	ObjectAddress extension;
	bool		with_040;

	if (OidIsValid(cache->parent) && create && def->columns_040 != NULL &&
		cache->parent_natts < Natts_keys)
		IdemUpgradeLedgerColumns(ledger);
	if (OidIsValid(cache->parent) || !create)
		return cache->parent;

	if (def->columns == NULL)
		elog(ERROR, "ledger \"%s\" is not available in this version", def->name);

	IdemSetLedgerLockTag(&tag, ledger, IDEM_LOCK_CREATE);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	AcceptInvalidationMessages();
	cache->valid = false;
	cache = IdemGetLedgerCache(ledger);
	if (OidIsValid(cache->parent))
	{
		/* made by another session meanwhile: we hold no DDL lock then */
		LockRelease(&tag, ExclusiveLock, false);
		return cache->parent;
	}

	/*
	 * The table of the installed version: this library also serves a
	 * database whose extension is not updated yet, whose sessions may run
	 * an older library that writes only the older columns and probes only
	 * a (digest) index.
	 */
	with_040 = IdemInstalledVersionAtLeast("0.4.0");
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE idempotency.%s (%s%s) PARTITION BY RANGE (lane, expires_at); ",
					 def->name, def->columns,
					 with_040 && def->columns_040 != NULL ? def->columns_040 : "");
	appendStringInfoString(&sql, with_040 ? def->indexes_040 : def->indexes);
	appendStringInfo(&sql, "; COMMENT ON TABLE idempotency.%s IS %s",
					 def->name, quote_literal_cstr(def->comment));
	IdemExecAsOwner(sql.data, 0);
	pfree(sql.data);

	cache->valid = false;
	cache = IdemGetLedgerCache(ledger);
	if (!OidIsValid(cache->parent))
		elog(ERROR, "could not find table \"%s.%s\" after creating it",
			 IDEM_SCHEMA_NAME, def->name);
	/* granted to nobody, whatever the owner's default privileges say */
	IdemRestrictTableAcl(cache->parent);

	/* DROP EXTENSION takes the table with it */
	ObjectAddressSet(table, RelationRelationId, cache->parent);
	ObjectAddressSet(extension, ExtensionRelationId,
					 get_extension_oid("idempotency", false));
	recordDependencyOn(&table, &extension, DEPENDENCY_AUTO);
	CommandCounterIncrement();

	return cache->parent;
}

/* the number of columns of a table (dropped ones included), 0 if gone */
static int
IdemRelNatts(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	int			natts = 0;

	if (HeapTupleIsValid(tup))
	{
		natts = ((Form_pg_class) GETSTRUCT(tup))->relnatts;
		ReleaseSysCache(tup);
	}
	return natts;
}

/*
 * IdemUpgradeLedgerColumns gives the key ledger the columns of 0.4.0 when
 * the installed extension is 0.4.0 or later but the table has only those of
 * 0.3: the update from 0.3.1 adds them, but a table restored from a 0.3.1
 * dump into a 0.4.0 install, or made by a transaction that committed after
 * the update looked for it, lacks them, and a write would drop what goes
 * into them.  Run by the first claim or maintenance that finds it so, as
 * the storage owner under the ledger's creation lock (a concurrent caller
 * waits, then finds it done).  The statements are the update script's;
 * keep them in step with ledger_defs.
 */
static void
IdemUpgradeLedgerColumns(IdemLedger ledger)
{
	IdemLedgerCache *cache;
	LOCKTAG		tag;

	if (!IdemInstalledVersionAtLeast("0.4.0"))
		return;
	IdemSetLedgerLockTag(&tag, ledger, IDEM_LOCK_CREATE);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	AcceptInvalidationMessages();
	cache = IdemGetLedgerCache(ledger);
	if (OidIsValid(cache->parent) && cache->parent_natts < Natts_keys)
	{
		ereport(NOTICE,
				(errmsg("adding the columns of version 0.4.0 to table \"%s.%s\"",
						IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
				 errdetail("The table was made for an earlier version of the extension (restored from its dump, or made while the extension was updated).")));
		(void) IdemExecAsOwner("ALTER TABLE idempotency.keys"
							   " ADD COLUMN IF NOT EXISTS kept_key pg_catalog.text,"
							   " ADD COLUMN IF NOT EXISTS kept_scope pg_catalog.text,"
							   " ADD COLUMN IF NOT EXISTS kept_request pg_catalog.jsonb,"
							   " ADD COLUMN IF NOT EXISTS recover_at pg_catalog.timestamptz,"
							   " ADD COLUMN IF NOT EXISTS response_headers pg_catalog.jsonb,"
							   " ADD COLUMN IF NOT EXISTS response_raw pg_catalog.bytea;"
							   " CREATE INDEX IF NOT EXISTS keys_recover_idx"
							   " ON idempotency.keys (role, recover_at)"
							   " WHERE recover_at IS NOT NULL", 0);
		CommandCounterIncrement();
		cache->valid = false;
	}
}

/*
 * IdemUnlessLockTimeout runs work(arg) in a subtransaction.  If it fails
 * because a lock could not be had within the lock timeout it set (55P03),
 * the subtransaction is rolled back, *why gets the error's message (in the
 * caller's memory context) and it returns false: the caller leaves the
 * work for the next run.  Any other error propagates.
 */
bool
IdemUnlessLockTimeout(void (*work) (void *arg), void *arg, char **why)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	bool		done = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		work(arg);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		done = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(edata);
		*why = pstrdup(edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return done;
}

/* IdemUpgradeLedgerIndex's statements, for IdemUnlessLockTimeout */
static void
IdemExecUpgradeSql(void *sql)
{
	IdemExecAsOwner((const char *) sql, IDEM_UPGRADE_LOCK_TIMEOUT_MS);
}

/*
 * IdemUpgradeLedgerIndex gives a ledger's table the digest index of 0.4.0,
 * on (role, digest), in place of the one on (digest) alone that earlier
 * versions made, once the installed extension is 0.4.0 or later: CREATE
 * INDEX on the table builds it in every partition (or takes one a DBA
 * built there beforehand with CREATE INDEX CONCURRENTLY), and every
 * partition made from then on gets it.  With a (digest) index, a role's
 * probe read the entry and the row of another role that held the same key,
 * which every role sees in pg_stat_all_indexes (doc/security.md, "Who
 * holds what").  The update from 0.3.1 does the same; this is for a table
 * that came another way (restored from an earlier version's dump into a
 * 0.4.0 install).  Until it has run, probes use the (digest) indexes
 * (indexes.c), so no row is missed either way.
 *
 * Run by maintenance, as the storage owner, under the ledger's creation
 * lock, in a subtransaction: the build takes SHARE on every partition and
 * the drop of the old index ACCESS EXCLUSIVE, each waited for at most
 * IDEM_UPGRADE_LOCK_TIMEOUT_MS, else nothing is done and the next run
 * tries again.  On the key ledger, the recovery index is made again after
 * it, so that the digest index stays first among each partition's indexes
 * (the one a probe opens first, see IdemOpenPartitionIndexes).  Returns
 * true if it rebuilt the index.
 */
bool
IdemUpgradeLedgerIndex(IdemLedger ledger)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	Oid			parent = cache->parent;
	Oid			old_index = InvalidOid;
	char	   *old_name;
	bool		has_new = false;
	Relation	indrel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	LOCKTAG		tag;
	StringInfoData sql;
	bool		done;
	char	   *why;

	if (!OidIsValid(parent) || !IdemInstalledVersionAtLeast("0.4.0"))
		return false;

	/* the table's own indexes: is there a (role, digest), a (digest) one? */
	indrel = table_open(IndexRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_index_indrelid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(parent));
	scan = systable_beginscan(indrel, IndexIndrelidIndexId, true, NULL, 1, &key);
	while ((tup = systable_getnext(scan)) != NULL)
	{
		Form_pg_index form = (Form_pg_index) GETSTRUCT(tup);

		if (!heap_attisnull(tup, Anum_pg_index_indexprs, NULL) ||
			!heap_attisnull(tup, Anum_pg_index_indpred, NULL) ||
			form->indnatts != form->indnkeyatts)
			continue;
		if (form->indnatts == 2 &&
			form->indkey.values[0] == Anum_ledger_role &&
			form->indkey.values[1] == Anum_ledger_digest)
			has_new = true;
		else if (form->indnatts == 1 &&
				 form->indkey.values[0] == Anum_ledger_digest &&
				 !OidIsValid(old_index))
			old_index = form->indexrelid;
	}
	systable_endscan(scan);
	table_close(indrel, AccessShareLock);
	if (has_new || !OidIsValid(old_index) ||
		(old_name = get_rel_name(old_index)) == NULL)
		return false;

	IdemSetLedgerLockTag(&tag, ledger, IDEM_LOCK_CREATE);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE INDEX ON idempotency.%s (role, digest) WITH (deduplicate_items = off); "
					 "DROP INDEX idempotency.%s",
					 IdemLedgerName(ledger), quote_identifier(old_name));
	if (ledger == IDEM_LEDGER_KEYS &&
		OidIsValid(get_relname_relid("keys_recover_idx",
									 get_rel_namespace(parent))))
		appendStringInfoString(&sql,
							   "; DROP INDEX idempotency.keys_recover_idx"
							   "; CREATE INDEX keys_recover_idx ON idempotency.keys (role, recover_at)"
							   " WHERE recover_at IS NOT NULL");

	done = IdemUnlessLockTimeout(IdemExecUpgradeSql, sql.data, &why);
	if (!done)
	{
		ereport(LOG,
				(errmsg("could not rebuild the digest index of table \"%s.%s\" now, will retry: %s",
						IDEM_SCHEMA_NAME, IdemLedgerName(ledger), why)));
		pfree(why);
	}
	pfree(sql.data);

	if (done)
	{
		ereport(LOG,
				(errmsg("rebuilt the digest index of table \"%s.%s\" on (role, digest)",
						IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
				 errdetail("The table was made by an earlier version of the extension, whose index was on (digest) alone.")));
		CommandCounterIncrement();
	}
	return done;
}

/*
 * IdemEnsureExtensionDependency re-creates the AUTO dependency of a ledger's
 * table on the extension when it is missing, as it is after pg_restore
 * (pg_dump does not carry dependencies of non-member objects).
 */
void
IdemEnsureExtensionDependency(IdemLedger ledger)
{
	IdemEnsureRelationDependency(IdemLedgerParent(ledger, false));
}

/*
 * IdemEnsureRelationDependency re-creates the AUTO dependency of a table
 * the extension made on first use (a ledger's, or its memory's) on the
 * extension when it is missing.
 */
void
IdemEnsureRelationDependency(Oid parent)
{
	Oid			extoid;
	Relation	deprel;
	ScanKeyData key[2];
	SysScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	if (!OidIsValid(parent))
		return;
	extoid = get_extension_oid("idempotency", false);

	deprel = table_open(DependRelationId, AccessShareLock);
	ScanKeyInit(&key[0], Anum_pg_depend_classid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(RelationRelationId));
	ScanKeyInit(&key[1], Anum_pg_depend_objid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(parent));
	scan = systable_beginscan(deprel, DependDependerIndexId, true, NULL, 2, key);
	while ((tup = systable_getnext(scan)) != NULL)
	{
		Form_pg_depend dep = (Form_pg_depend) GETSTRUCT(tup);

		if (dep->refclassid == ExtensionRelationId && dep->refobjid == extoid)
			found = true;
	}
	systable_endscan(scan);
	table_close(deprel, AccessShareLock);

	if (!found)
	{
		ObjectAddress table;
		ObjectAddress extension;

		ObjectAddressSet(table, RelationRelationId, parent);
		ObjectAddressSet(extension, ExtensionRelationId, extoid);
		recordDependencyOn(&table, &extension, DEPENDENCY_AUTO);
		CommandCounterIncrement();
	}
}

/*
 * IdemRestrictLedgerPrivileges takes back every privilege anyone but the
 * owner holds on a ledger's table and on each of its partitions (see
 * IdemRestrictTableAcl).  New tables are made that way; maintenance runs
 * this every round for those that came another way: restored by
 * pg_restore into a database whose restoring role has default privileges,
 * made by an older version of the extension, or granted by hand.
 */
void
IdemRestrictLedgerPrivileges(IdemLedger ledger)
{
	IdemLedgerCache *cache = IdemGetLedgerCache(ledger);
	Oid		   *relids;
	int			n = cache->npartitions;
	int			i;

	if (!OidIsValid(cache->parent))
		return;
	IdemRestrictTableAcl(cache->parent);
	/* a copy: revoking invalidates the cache */
	relids = palloc(Max(n, 1) * sizeof(Oid));
	memcpy(relids, cache->relids, n * sizeof(Oid));
	for (i = 0; i < n; i++)
		IdemRestrictTableAcl(relids[i]);
	pfree(relids);
}

/*
 * IdemPartitionDDLHeld: has this transaction made a partition of the ledger
 * itself (so that it holds the ledger's creation lock, and DDL locks on its
 * parent, until it ends)?  A call that has must not release a key lock to
 * take it again later: another transaction may be holding that key lock
 * while it waits for our creation lock.
 */
bool
IdemPartitionDDLHeld(IdemLedger ledger)
{
	LOCKTAG		tag;

	IdemSetLedgerLockTag(&tag, ledger, IDEM_LOCK_CREATE);
	return IdemLockHeldByMe(&tag, ExclusiveLock);
}

/*
 * IdemCheckPartitionMadeHere refuses to make a partition for a call routed
 * to a shard of a distributed ledger (citus.c): only the coordinator's
 * maintenance makes them, on every worker at once.  Called before a
 * partition maker is asked too: its DDL on the distributed table would wait
 * for this call's locks while the call waits for it.
 */
void
IdemCheckPartitionMadeHere(IdemLedger ledger)
{
	if (OidIsValid(ledger_parent_override[ledger]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the ledger shard \"%s\" has no partition for this key's expiry",
						get_rel_name(ledger_parent_override[ledger])),
				 errhint("The partitions of a ledger distributed by Citus are made by idem_maintain() on the coordinator.")));
}

/*
 * IdemCreatePartition makes the partition of lane "lane_number" of a layout
 * (or of that lane's far partitions) that contains time "at": see
 * IdemCreateLanePartition.
 */
Oid
IdemCreatePartition(IdemLedger ledger, const IdemLayout *layout,
					int lane_number, bool far, TimestampTz at)
{
	int16		lane = IdemLaneValueOf(layout->lanes, lane_number, false);

	return IdemCreateLanePartition(ledger, layout, far ? IdemFarLane(lane) : lane,
								   at);
}

/*
 * IdemCreateLanePartition makes the partition of lane value "lane" (current,
 * far or legacy; its lane count and number those of "layout") that contains
 * time "at", clipped so that it does not overlap partitions the lane
 * already has, and returns its OID.  If a partition of that lane
 * already contains "at" (another session made it while we waited for the
 * creation lock), that partition is returned instead.
 *
 * The table is created with CREATE TABLE ... (LIKE ...) and ATTACH PARTITION,
 * which takes only SHARE UPDATE EXCLUSIVE on the parent.  It runs in the
 * caller's transaction; the creation lock is held until it ends.
 */
Oid
IdemCreateLanePartition(IdemLedger ledger, const IdemLayout *layout,
						int16 lane, TimestampTz at)
{
	const IdemLedgerDef *def = &ledger_defs[ledger];
	int			lane_number = IdemLaneNumber(lane);
	bool		far = IdemLaneIsFar(lane);
	bool		legacy = IdemLaneIsLegacy(lane);
	IdemLedgerCache *cache;
	LOCKTAG		tag;
	TimestampTz lower,
				upper;
	StringInfoData name;
	StringInfoData idxname;
	bool		old_layout;
	StringInfoData sql;
	struct pg_tm tm;
	fsec_t		fsec;
	int			i;
	Oid			relid;
	bool		distributed;
	bool		coordinator;

	IdemCheckPartitionMadeHere(ledger);
	(void) IdemLedgerParent(ledger, true);
	distributed = IdemCitusDistributed(IdemLedgerParent(ledger, false),
									   &coordinator);

	IdemSetLedgerLockTag(&tag, ledger, IDEM_LOCK_CREATE);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	AcceptInvalidationMessages();
	cache = IdemGetLedgerCache(ledger);

	Assert(IdemLaneLanes(lane) == layout->lanes);
	IdemNewPartitionBounds(layout, lane_number, far, at, &lower, &upper);
	for (i = IdemFirstInLane(cache, lane);
		 i < cache->npartitions && cache->partitions[i].lane == lane;
		 i++)
	{
		IdemPartition *p = &cache->partitions[i];

		if (p->lower <= at && at < p->upper)
		{
			/*
			 * Made by another session while we waited.  We made nothing, so
			 * we let the creation lock go: holding it to the end of the
			 * transaction would make us a creator that later key locks
			 * must not wait behind (see IdemPartitionDDLHeld).
			 */
			LockRelease(&tag, ExclusiveLock, false);
			return p->relid;
		}
		if (p->upper <= at && p->upper > lower)
			lower = p->upper;
		if (p->lower > at && p->lower < upper)
			upper = p->lower;
	}

	/*
	 * messages_n<lanes>_<lane>_<lower bound, UTC>, or _f<lane>_ for a far
	 * partition; "n" tells them from the legacy partitions of the same lane
	 * and range, messages_<lanes>_..., which only relocate_lanes() still
	 * makes (for rows of a legacy lane that has lost its partition)
	 */
	if (timestamp2tm(lower, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	initStringInfo(&name);
	appendStringInfo(&name, "%s_%s%d_%s%d_%04d%02d%02d_%02d%02d%02d",
					 def->name, legacy ? "" : "n", layout->lanes,
					 far ? "f" : "", lane_number,
					 tm.tm_year, tm.tm_mon, tm.tm_mday,
					 tm.tm_hour, tm.tm_min, tm.tm_sec);
	if (fsec != 0)
		appendStringInfo(&name, "_%06d", (int) fsec);

	/*
	 * The digest index comes from the table's (LIKE ... INCLUDING ALL), as
	 * <partition>_role_digest_idx, without deduplication (a role's digest
	 * almost never repeats: the pass before each leaf split finds nothing
	 * to merge).  Under a table made before 0.4.0 and not rebuilt yet (see
	 * IdemUpgradeLedgerIndex), whose <table>_digest_idx is on (digest) and
	 * may deduplicate, it is <partition>_digest_idx, made not to here.
	 */
	initStringInfo(&idxname);
	appendStringInfo(&idxname, "%s_digest_idx", def->name);
	old_layout = OidIsValid(get_relname_relid(idxname.data,
											  get_namespace_oid(IDEM_SCHEMA_NAME, false)));
	resetStringInfo(&idxname);
	appendStringInfo(&idxname, "%s_digest_idx", name.data);
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE idempotency.%s (LIKE idempotency.%s INCLUDING ALL); ",
					 quote_identifier(name.data), def->name);
	if (old_layout)
		appendStringInfo(&sql,
						 "ALTER INDEX IF EXISTS idempotency.%s SET (deduplicate_items = off); ",
						 quote_identifier(idxname.data));

	/*
	 * A ledger distributed by Citus (citus.c): each statement runs on its
	 * own, as Citus sends a statement's text to the workers and refuses a
	 * text of several ("cannot execute multiple utility events"); the
	 * partition gets a replica identity in the same transaction, on its
	 * shards too, so that Citus can move it logically at any time: its
	 * index of the ledger's <ledger>_identity_idx, unique on (role, digest,
	 * lane, expires_at, tenant), made by citus_distribute() (see
	 * doc/scale-out.md), or FULL on a ledger distributed without it.
	 */
	if (distributed)
	{
		IdemCitusExecDdl(sql.data, IDEM_CITUS_DDL_LOCK_TIMEOUT_MS);
		resetStringInfo(&sql);
	}
	appendStringInfo(&sql,
					 "ALTER TABLE idempotency.%s ATTACH PARTITION idempotency.%s "
					 "FOR VALUES FROM (%d, ",
					 def->name, quote_identifier(name.data), lane);
	IdemAppendTimestamp(&sql, lower);
	appendStringInfo(&sql, ") TO (%d, ", lane);
	IdemAppendTimestamp(&sql, upper);
	appendStringInfoString(&sql, ")");
	if (distributed)
		IdemCitusExecDdl(sql.data, IDEM_CITUS_DDL_LOCK_TIMEOUT_MS);
	else
		IdemExecAsOwner(sql.data, 0);
	relid = get_relname_relid(name.data, get_namespace_oid(IDEM_SCHEMA_NAME, false));
	if (distributed)
	{
		Oid			identity = IdemIdentityIndexOf(ledger, relid);

		resetStringInfo(&sql);
		if (OidIsValid(identity))
			appendStringInfo(&sql, "ALTER TABLE idempotency.%s REPLICA IDENTITY USING INDEX %s",
							 quote_identifier(name.data),
							 quote_identifier(get_rel_name(identity)));
		else
			appendStringInfo(&sql, "ALTER TABLE idempotency.%s REPLICA IDENTITY FULL",
							 quote_identifier(name.data));
		IdemCitusExecDdl(sql.data, IDEM_CITUS_DDL_LOCK_TIMEOUT_MS);
	}
	else if (IdemReplicaIdentityOf(IdemLedgerParent(ledger, false)) == REPLICA_IDENTITY_FULL)
	{
		/*
		 * A ledger table a DBA gave REPLICA IDENTITY FULL, so that a
		 * publication may carry its updates and deletes (without one, the
		 * calls that make them are refused, as an UPDATE or a DELETE is:
		 * relation_checks.c): its partitions have none of their own (no
		 * primary key), and each new one is made FULL too, in the same
		 * transaction.
		 */
		resetStringInfo(&sql);
		appendStringInfo(&sql, "ALTER TABLE idempotency.%s REPLICA IDENTITY FULL",
						 quote_identifier(name.data));
		IdemExecAsOwner(sql.data, 0);
	}

	IdemRestrictTableAcl(relid);
	IdemFilterCreated(ledger, relid, lane);
	pfree(sql.data);
	pfree(idxname.data);
	pfree(name.data);

	/* our own ATTACH invalidated the cache; make the next reader see it */
	CommandCounterIncrement();
	IdemStatsAdd(IDEM_STAT_PARTITIONS_CREATED, 1);
	return relid;
}

/* relation "relid"'s pg_class.relreplident (REPLICA_IDENTITY_DEFAULT if gone) */
static char
IdemReplicaIdentityOf(Oid relid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	char		identity = REPLICA_IDENTITY_DEFAULT;

	if (HeapTupleIsValid(tuple))
	{
		identity = ((Form_pg_class) GETSTRUCT(tuple))->relreplident;
		ReleaseSysCache(tuple);
	}
	return identity;
}

/*
 * IdemDropPrepareMayFail: may an error of a drop's "prepare" step leave the
 * partition for the next run instead of failing the maintenance run?  Not
 * a cancel or a shutdown (57), an I/O error (58) or an internal error (XX).
 */
static bool
IdemDropPrepareMayFail(int sqlerrcode)
{
	int			category = ERRCODE_TO_CATEGORY(sqlerrcode);

	return category != ERRCODE_OPERATOR_INTERVENTION &&
		category != ERRCODE_SYSTEM_ERROR &&
		category != ERRCODE_INTERNAL_ERROR;
}

/*
 * IdemDropPartition drops one partition, waiting at most lock_timeout_ms for
 * its locks.  Returns false, leaving everything as it was, if the locks
 * could not be had in time, or if this session uses the partition (below);
 * other errors propagate.  "prepare", if not
 * NULL, runs first in the same subtransaction (memory.c writes the piece
 * that remembers the partition's keys there), so that it commits or rolls
 * back with the DROP; an error of its own (but a cancel, a shutdown, an
 * I/O or internal error) also returns false, with a WARNING.
 *
 * A partition this session itself still uses (read by the statement that
 * runs maintenance, or by a cursor of its transaction) is left as well:
 * DROP TABLE would refuse it (CheckTableNotInUse, 55006), failing the run.
 *
 * Only the partition and its parent are locked: the ledgers' readers and
 * writers never lock the parent, and no live row is in an expired partition,
 * so nobody waits for this; with idempotency.key_memory, only a call
 * looking for its remembered key in the ended partition (memory.c), which
 * the partition's filter, kept until the drop commits, does not rule out.
 *
 * Of a ledger distributed by Citus ("distributed", on the coordinator),
 * the DROP also drops the partition's shards on every worker, where the
 * tenants' calls lock the shard: it waits at most lock_timeout_ms there
 * too (IdemCitusExecDdl), and a lock not had in time on a worker rolls
 * back the whole subtransaction, the workers' savepoints included.
 *
 * CASCADE: an expired partition goes with whatever another role made
 * depend on it.  Any role can make a view or a column default that names a
 * partition by OID (a regclass constant needs no privilege on the table);
 * with RESTRICT, one such object would keep an expired partition, and so
 * every row in it, for ever.  The partitions are the extension's storage:
 * nothing of anyone else's belongs on them.
 */
bool
IdemDropPartition(Oid relid, int lock_timeout_ms, bool distributed,
				  IdemDropPrepare prepare, void *arg)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	char	   *relname = get_rel_name(relid);
	char	   *nspname;
	bool		dropped = false;
	volatile bool preparing = false;

	if (relname == NULL)
		return false;			/* already gone */
	nspname = get_namespace_name(get_rel_namespace(relid));
	if (nspname == NULL)
		return false;
	if (IdemRelationInUseHere(relid))
	{
		ereport(DEBUG1,
				(errmsg_internal("could not drop expired partition \"%s.%s\" now, will retry: this session uses it",
								 nspname, relname)));
		return false;
	}

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		char	   *sql;

		sql = psprintf("DROP TABLE %s.%s CASCADE",
					   quote_identifier(nspname),
					   quote_identifier(relname));

		if (prepare != NULL)
		{
			preparing = true;
			prepare(relid, lock_timeout_ms, arg);
			preparing = false;
		}
		if (distributed)
			IdemCitusExecDdl(sql, lock_timeout_ms);
		else
			IdemExecAsOwner(sql, lock_timeout_ms);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		dropped = true;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;

		if (edata->sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE)
			ereport(DEBUG1,
					(errmsg_internal("could not drop expired partition \"%s.%s\" now, will retry: %s",
									 IDEM_SCHEMA_NAME, relname, edata->message)));
		else if (preparing && IdemDropPrepareMayFail(edata->sqlerrcode))
		{
			/*
			 * The memory's piece could not be written (a piece of the same
			 * name or range still there after the clock stepped back, no
			 * memory for a huge partition): the partition stays, and its
			 * keys are answered from it while the memory lasts; the rest of
			 * the run goes on, so that the memory's old pieces are
			 * forgotten and the partition is dropped without a piece once
			 * its keys need no remembering (IdemDropExpiredPartitions).
			 */
			ereport(WARNING,
					(errcode(edata->sqlerrcode),
					 errmsg("could not remember the keys of expired partition \"%s.%s\", leaving it for the next run",
							IDEM_SCHEMA_NAME, relname),
					 errdetail_internal("%s", edata->message)));
		}
		else
			ReThrowError(edata);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	if (dropped)
	{
		/* kept until the drop commits (see IdemFilterForgetAtCommit) */
		IdemFilterForgetAtCommit(relid);
		IdemStatsAdd(IDEM_STAT_PARTITIONS_DROPPED, 1);
	}
	return dropped;
}

/* appends t as a quoted timestamptz literal in UTC */
void
IdemAppendTimestamp(StringInfo buf, TimestampTz t)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	appendStringInfo(buf, "'%04d-%02d-%02d %02d:%02d:%02d.%06d+00'",
					 tm.tm_year, tm.tm_mon, tm.tm_mday,
					 tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec);
}

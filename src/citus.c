/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Ledgers distributed by Citus: a key's row lives in the ledger shard
 *	  co-located with its tenant's rows, so Citus moves, splits and
 *	  isolates it with them.  This file routes a call to that shard.
 *
 * Issue 37 (doc/scale-out.md, "Citus' own shard operations").  A ledger
 * is distributed when idempotency.citus_distribute() gave its table a last
 * column "tenant" and distributed it by that column, co-located with the
 * tenant's tables; nothing else ever looks at Citus.  On a node where a
 * ledger is distributed, a call on a key (scope = tenant) or a message id
 * (idem_consume_message(..., tenant => ...)):
 *
 *	1. finds the ledger shard of the tenant (= scope) with Citus'
 *	   get_shard_id_for_distribution_column();
 *	2. takes that shard's metadata lock in SHARE mode with Citus'
 *	   lock_shard_metadata(), to the end of the transaction, the mode of
 *	   Citus' own writes: a move's final write block (EXCLUSIVE) waits for
 *	   the call, and a call that starts during the block waits for the move;
 *	3. checks, after the lock and with a new snapshot, that the shard's
 *	   placement is on this node: 40001 if not on a worker (the tenant
 *	   moved; the client's retry is delegated to its new node), 0A000 on
 *	   the coordinator (the call was not delegated);
 *	4. makes the local shard's partitioned table, idempotency.keys_<shard>
 *	   or messages_<shard>,
 *	   the parent the storage cache reads (IdemSetLedgerParentOverride),
 *	   for this call only: IdemCitusEndCall() when it returns, or the
 *	   abort of its (sub)transaction when it fails, makes the ledger's own
 *	   table the one read again, so that maintenance or an export run next
 *	   in the backend reads the local ledgers, not the last call's shard;
 *	   and keeps the tenant, as a value of the column's type, for the rows
 *	   the call writes (IdemCitusCallTenant, probe.c's IdemInsertRow).
 *
 * The stream positions and producer sequences of the calls that name their
 * tenant are keyed tables that citus_distribute() made and distributed by
 * their column "tenant", idempotency.tenant_positions and tenant_sequences
 * (streams.c): IdemCitusRouteTable runs steps 1-3 for one of them and
 * returns its local shard's table, which the caller opens itself (no
 * override, nothing kept past the call but steps 1-3's answer, as for the
 * ledgers).
 *
 * Steps 1 and 2 call Citus' SQL functions through fmgr (looked up by name
 * and signature once per backend: the library is never linked against
 * Citus), step 3 reads Citus' catalog pg_dist_placement by its shardid
 * index and keeps a "here" per shard and backend until Citus invalidates
 * it (IdemCitusShardIsLocal says why that is safe), step 4 keeps each
 * shard's table per backend (storage.c keeps its partitions per shard).
 * All of it runs once per transaction and tenant: the lock, held to the
 * end of the transaction, keeps the placement where step 3 found it, so a
 * second call of the transaction on the same tenant (idem_complete()
 * after idem_claim()) reuses the answer.  The lock also keeps the tenant's
 * shards of the other tables of the shard's co-location group where they
 * are (Citus moves and splits a group's shards together), so the routing
 * of such a table in the same transaction (the tenant outbox's heads and
 * events after idem_claim()) skips steps 1 and 2: its shard is the one of
 * the same hash range (IdemCitusColocatedLocked).  What is looked up once is
 * forgotten when Citus' catalogs, the distributed table or the shard's
 * table are invalidated (a placement changed, DROP EXTENSION citus, a
 * shard dropped).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/citus.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "privilege.h"
#include "storage.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/lockdefs.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/varlena.h"

/*
 * Citus' interface as this backend found it: its two functions, ready to
 * call, and its placement catalog.  Looked up on the first routing, again
 * after an invalidation of that catalog (Citus dropped or updated).
 */
typedef struct IdemCitusApi
{
	bool		valid;
	MemoryContext cxt;			/* the FmgrInfos' and the call expression's */
	FmgrInfo	shard_fn;		/* get_shard_id_for_distribution_column() */
	FmgrInfo	lock_fn;		/* lock_shard_metadata() */
	Oid			placement_rel;	/* pg_catalog.pg_dist_placement */
	Oid			shard_rel;		/* pg_catalog.pg_dist_shard */
	Oid			partition_rel;	/* pg_catalog.pg_dist_partition */
	Oid			placement_idx;	/* its index on shardid */
	AttrNumber	placement_shardid;
	AttrNumber	placement_groupid;
	Oid			local_group_rel;	/* pg_catalog.pg_dist_local_group */
	int32		local_group;	/* this node's group, -1 until read */
} IdemCitusApi;

static IdemCitusApi citus_api;

/*
 * What this backend knows of a shard, until it is invalidated: step 3's
 * answer when it was "here" (never "elsewhere": a refused call is not
 * worth keeping, and a shard that moves here must not be refused) and
 * step 4's local table.  See IdemCitusShardIsLocal for why a "here" kept
 * across transactions is safe.
 */
typedef struct IdemShardTable
{
	int64		shard;			/* hash key */
	Oid			relid;			/* InvalidOid once invalidated */
	Oid			dist_rel;		/* the distributed table it is a shard of */
	bool		here;			/* step 3 found it here; false once invalidated */
} IdemShardTable;

static HTAB *shard_tables = NULL;

/*
 * The routing of the running call, per ledger: whether it overrides the
 * ledger's table, and the call's tenant as a value of the ledger's tenant
 * column (valid in the call's memory).  Cleared when the call returns
 * (IdemCitusEndCall) and, for a call that fails, when its (sub)transaction
 * aborts: whatever the backend runs next (maintenance, an export) reads
 * the ledgers' own tables.
 */
static bool call_routed[IDEM_NUM_LEDGERS];
static Datum call_tenant[IDEM_NUM_LEDGERS];
static bool xact_callbacks_registered = false;

/*
 * The last routing of this backend per ledger: valid within its
 * (sub)transaction only, whose shard lock keeps the placement.  The end of
 * every transaction forgets it (subxid InvalidSubTransactionId), and so
 * does the abort of the subtransaction it was made in.
 */
typedef struct IdemRouted
{
	SubTransactionId subxid;
	char		tenant[NAMEDATALEN * 4];
	int			tenant_len;
	Oid			relid;
	Oid			dist_rel;		/* the distributed table of the shard */
	int64		shard;
} IdemRouted;

/* one per ledger, and one per keyed table of IdemCitusRouteTable */
static IdemRouted routed[IDEM_NUM_LEDGERS + IDEM_CITUS_NUM_TABLES];

const char *const IdemCitusTableNames[IDEM_CITUS_NUM_TABLES] = {
	[IDEM_CITUS_TENANT_POSITIONS] = "tenant_positions",
	[IDEM_CITUS_TENANT_SEQUENCES] = "tenant_sequences",
	[IDEM_CITUS_TENANT_OUTBOX_HEADS] = "tenant_outbox_heads",
	[IDEM_CITUS_TENANT_EVENTS] = "tenant_events",
};

/*
 * Which pairs of distributed tables are in one co-location group
 * (IdemCitusColocated): the last pairs asked about, each until Citus'
 * catalogs or either table are invalidated (Citus invalidates a table
 * whose group changes: update_distributed_table_colocation(),
 * alter_distributed_table()).
 */
#define IDEM_COLOCATED_PAIRS	4
typedef struct IdemColocatedPair
{
	Oid			a;				/* the lower OID; InvalidOid: unused */
	Oid			b;
	bool		same;
} IdemColocatedPair;
static IdemColocatedPair colocated_pairs[IDEM_COLOCATED_PAIRS];
static int	colocated_next = 0;

/*
 * The shard of distributed table dist_rel co-located with shard "src" (of
 * src_dist_rel): the one of the same hash range (IdemCitusColocatedShard),
 * kept per backend until Citus' catalogs or either table are invalidated
 * (a split or an isolation makes new shards, and invalidates the tables).
 */
typedef struct IdemColocatedShardKey
{
	int64		src;
	Oid			dist_rel;
} IdemColocatedShardKey;
typedef struct IdemColocatedShard
{
	IdemColocatedShardKey key;	/* hash key (zeroed padding) */
	Oid			src_dist_rel;
	int64		shard;
} IdemColocatedShard;
static HTAB *colocated_shards = NULL;

/*
 * The distributed tables of IdemCitusRouteTable, looked up by name: kept
 * per table and backend once found with a tenant column, until an
 * invalidation of the table (dropped, renamed, altered) or of the
 * extension's schema.
 */
typedef struct IdemCitusTableLookup
{
	Oid			rel;			/* InvalidOid: look up */
	AttrNumber	att;
	Oid			type;
} IdemCitusTableLookup;
static IdemCitusTableLookup table_lookups[IDEM_CITUS_NUM_TABLES];

/* the input function of the tenant column's type, for a type not text */
static Oid	tenant_input_type = InvalidOid;
static FmgrInfo tenant_input_fn;
static Oid	tenant_input_ioparam;

static void IdemCitusXactCallback(XactEvent event, void *arg);
static void IdemCitusSubXactCallback(SubXactEvent event,
									 SubTransactionId mySubid,
									 SubTransactionId parentSubid, void *arg);
static void IdemCitusClearCall(void);
static void IdemCitusRelcacheCallback(Datum arg, Oid relid);
static void IdemCitusLookupApi(void);
static Oid	IdemCitusFunction(const char *name, int nargs, const Oid *argtypes,
							  Oid rettype);
static Oid	IdemCitusRouteShard(IdemRouted *r, Oid rel, int ledger,
								const char *relname, const char *kind,
								text *tenant);
static int64 IdemCitusShard(Oid rel, int ledger, const char *relname,
							text *tenant, Oid *dist_rel);
static void IdemCitusLockShard(int64 shard);
static IdemShardTable *IdemCitusShardEntry(int64 shard, bool create);
static bool IdemCitusShardIsLocal(int64 shard, Oid dist_rel);
static int32 IdemCitusReadLocalGroup(Oid local_group_rel);
static Oid	IdemCitusShardTable(const char *relname, int64 shard);
static Datum IdemCitusTenantValue(Oid type, text *tenant);
static const IdemRouted *IdemCitusColocatedLocked(const IdemRouted *r,
												  Oid dist_rel, text *tenant);
static int64 IdemCitusColocatedShard(int64 src, Oid src_dist_rel, Oid dist_rel);
static int64 IdemCitusReadColocatedShard(int64 src, Oid dist_rel);
static void IdemCitusNamespaceCallback(Datum arg, int cacheid, uint32 hashvalue);
static bool IdemCitusColocated(Oid a, Oid b);
static int32 IdemCitusColocationId(Relation rel, Oid index, AttrNumber relid_att,
								   AttrNumber group_att, Snapshot snapshot,
								   Oid relid);

/*
 * IdemCitusEndCall ends the routing of the call that returns: the ledgers'
 * own tables are read again.  Every call that routes calls it before it
 * returns; one that fails is cleared by the abort callbacks below.
 */
void
IdemCitusEndCall(void)
{
	IdemCitusClearCall();
}

static void
IdemCitusClearCall(void)
{
	int			i;

	for (i = 0; i < IDEM_NUM_LEDGERS; i++)
	{
		if (call_routed[i])
		{
			IdemSetLedgerParentOverride((IdemLedger) i, InvalidOid);
			call_routed[i] = false;
			call_tenant[i] = (Datum) 0;
		}
	}
}

/*
 * IdemCitusCallTenant sets *value to the running call's tenant, as a value
 * of the tenant column of "ledger", if the call was routed; false if not.
 */
bool
IdemCitusCallTenant(IdemLedger ledger, Datum *value)
{
	if (!call_routed[ledger])
		return false;
	*value = call_tenant[ledger];
	return true;
}

/*
 * At the end of the transaction, whatever its outcome, no call runs: the
 * routing of one that failed goes, and so does the routing kept for the
 * transaction (its shard lock is released).
 */
static void
IdemCitusXactCallback(XactEvent event, void *arg)
{
	int			i;

	IdemCitusClearCall();
	for (i = 0; i < lengthof(routed); i++)
		routed[i].subxid = InvalidSubTransactionId;
}

/*
 * A subtransaction that aborts ends the call that failed in it (a
 * PL/pgSQL exception block), and releases the shard lock taken in it: a
 * routing kept for it is forgotten.
 */
static void
IdemCitusSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	int			i;

	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	IdemCitusClearCall();
	for (i = 0; i < lengthof(routed); i++)
		if (routed[i].subxid == mySubid)
			routed[i].subxid = InvalidSubTransactionId;
}

/*
 * IdemCitusRoute makes the local shard of "ledger" that holds "tenant" the
 * ledger's table for the rest of this call, or refuses the call if that
 * shard is not on this node.  Nothing happens unless the ledger is
 * distributed (its table has a "tenant" column: citus_distribute()).
 * "what" names the argument that gives the tenant, for the error when it
 * is NULL.
 */
void
IdemCitusRoute(IdemLedger ledger, text *tenant, const char *what)
{
	IdemRouted *r = &routed[ledger];
	Oid			tenant_type;
	Oid			relid;

	tenant_type = IdemLedgerTenantType(ledger);
	if (!OidIsValid(tenant_type))
		return;
	if (tenant == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null when ledger \"%s.%s\" is distributed by Citus",
						what, IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
				 errhint("Pass the tenant whose rows the call's transaction writes.")));

	/* a tenant that is not a value of the column's type: 22P02 and such */
	call_tenant[ledger] = IdemCitusTenantValue(tenant_type, tenant);
	relid = IdemCitusRouteShard(r, InvalidOid, (int) ledger,
								IdemLedgerName(ledger), "Ledger", tenant);
	IdemSetLedgerParentOverride(ledger, relid);
	call_routed[ledger] = true;
}

/*
 * IdemCitusRouteTable is IdemCitusRoute for a keyed table of schema
 * idempotency that idempotency.citus_distribute() made and distributed by
 * its column "tenant" (the tenant positions and sequences, streams.c):
 * it returns the OID of the local shard's table that holds "tenant", after
 * the same steps 1-3, and sets *tenant_type and *tenant_value to the column's type
 * and the tenant as a value of it (in the call's memory).  InvalidOid if
 * the table does not exist: nothing is distributed, and the caller uses
 * the node's own table.  The caller holds the routing to the end of its
 * call only (no override: it opens the shard's table itself).
 */
Oid
IdemCitusRouteTable(IdemCitusTable table, text *tenant, const char *what,
					Oid *tenant_type, Datum *tenant_value)
{
	const char *relname = IdemCitusTableNames[table];
	IdemCitusTableLookup *t = &table_lookups[table];
	Oid			rel = t->rel;
	AttrNumber	att = t->att;

	if (!OidIsValid(rel) || !xact_callbacks_registered)
	{
		Oid			nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);

		rel = OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;
		if (!OidIsValid(rel))
			return InvalidOid;
		att = get_attnum(rel, IDEM_TENANT_COLUMN);
		if (att == InvalidAttrNumber)
			return InvalidOid;
		t->type = get_atttype(rel, att);
		t->att = att;
		/* kept only once the callback that forgets it is registered */
		if (xact_callbacks_registered)
			t->rel = rel;
	}
	if (tenant == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null when table \"%s.%s\" is distributed by Citus",
						what, IDEM_SCHEMA_NAME, relname),
				 errhint("Pass the tenant whose rows the call's transaction writes.")));
	*tenant_type = t->type;
	*tenant_value = IdemCitusTenantValue(*tenant_type, tenant);
	return IdemCitusRouteShard(&routed[IDEM_NUM_LEDGERS + table], rel, -1,
							   relname, "Table", tenant);
}

/*
 * IdemCitusRouteShard runs steps 1-3 for table "relname" (its OID "rel",
 * or InvalidOid for ledger "ledger": its own table, looked up only when
 * the answer is not remembered) and "tenant", and returns the OID of the local shard's table (step 4's
 * lookup), or fails with 40001 or 0A000.  "kind" starts the error's
 * detail ("Ledger", "Table").  Remembers the answer in *r for the rest of
 * the (sub)transaction.
 */
static Oid
IdemCitusRouteShard(IdemRouted *r, Oid rel, int ledger, const char *relname,
					const char *kind, text *tenant)
{
	IdemSavedUser save;
	int64		shard = 0;
	Oid			dist_rel;
	Oid			relid;
	const IdemRouted *from;

	/*
	 * Routed already in this (sub)transaction: the lock keeps the placement.
	 * (Not across subtransactions: one that rolls back releases the lock.)
	 */
	if (r->subxid != InvalidSubTransactionId &&
		r->subxid == GetCurrentSubTransactionId() &&
		r->tenant_len == VARSIZE_ANY_EXHDR(tenant) &&
		memcmp(r->tenant, VARDATA_ANY(tenant), r->tenant_len) == 0)
		return r->relid;

	/* registered on the first routing: nothing changes for anyone else */
	if (!xact_callbacks_registered)
	{
		RegisterXactCallback(IdemCitusXactCallback, NULL);
		RegisterSubXactCallback(IdemCitusSubXactCallback, NULL);
		IdemRegisterRelcacheCallback(IdemCitusRelcacheCallback);
		CacheRegisterSyscacheCallback(NAMESPACEOID,
									  IdemCitusNamespaceCallback, (Datum) 0);
		xact_callbacks_registered = true;
	}
	if (!citus_api.valid)
		IdemCitusLookupApi();

	/*
	 * 1 and 2: the shard, locked as Citus' own writes lock it, as the
	 * ledgers' owner (lock_shard_metadata() wants the table's owner),
	 * unless this (sub)transaction holds the lock of a co-located shard of
	 * the tenant already (IdemCitusColocatedLocked).
	 */
	IdemBecomeStorageOwner(&save);
	dist_rel = OidIsValid(rel) ? rel : IdemLedgerParent((IdemLedger) ledger, false);
	from = OidIsValid(dist_rel) ?
		IdemCitusColocatedLocked(r, dist_rel, tenant) : NULL;
	if (from != NULL)
		shard = IdemCitusColocatedShard(from->shard, from->dist_rel, dist_rel);
	if (shard == 0)
		shard = IdemCitusShard(rel, ledger, relname, tenant, &dist_rel);
	if (from == NULL)
		IdemCitusLockShard(shard);
	IdemRestoreUser(&save);

	/*
	 * 3: after the lock, a move that committed is seen: its invalidations
	 * are read now (a lock that is not a relation's does not read them),
	 * and the placement with a new snapshot.  On a worker the tenant moved
	 * (its retry is delegated to the new node); on the coordinator, the
	 * call was not delegated.
	 */
	AcceptInvalidationMessages();
	if (!IdemCitusShardIsLocal(shard, dist_rel))
	{
		if (citus_api.local_group == 0)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("the tenant's ledger shard is not on this node"),
					 errdetail("%s \"%s.%s\" is distributed by Citus, and its shard " INT64_FORMAT " is on a worker.",
							   kind, IDEM_SCHEMA_NAME, relname, shard),
					 errhint("Call the function that calls this one delegated to the tenant's node (create_distributed_function() with its tenant argument).")));
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("the tenant's ledger shard is not on this node"),
				 errdetail("Its ledger shard " INT64_FORMAT " is on another node.", shard),
				 errhint("Retry: the tenant has moved, and the retry goes to its new node.")));
	}

	/* 4: the local shard's table */
	relid = IdemCitusShardTable(relname, shard);
	if (VARSIZE_ANY_EXHDR(tenant) <= (int) sizeof(r->tenant))
	{
		r->subxid = GetCurrentSubTransactionId();
		r->tenant_len = VARSIZE_ANY_EXHDR(tenant);
		memcpy(r->tenant, VARDATA_ANY(tenant), r->tenant_len);
		r->relid = relid;
		r->dist_rel = dist_rel;
		r->shard = shard;
	}
	return relid;
}

/*
 * IdemCitusColocatedLocked: has this (sub)transaction routed "tenant" to
 * a shard of another table in the co-location group of dist_rel, whose
 * metadata lock it holds (the tenant outbox's heads and events after the
 * key ledger's claim, all co-located with the application's tables by
 * citus_distribute())?  That lock keeps the shard of dist_rel where it is
 * too: Citus moves, splits and isolates the shards of a co-location group
 * together, and takes the metadata lock of every one of them (EXCLUSIVE)
 * before it changes their placements; and the invalidations read after
 * that lock was had are those of any such change that committed before.
 * So the second lock, a call of Citus' lock_shard_metadata() (the most of
 * a routing's cost), adds nothing; and the shard is the one of the same
 * hash range as the locked one (IdemCitusColocatedShard), without a call
 * of get_shard_id_for_distribution_column().  Same (sub)transaction only,
 * as the routings kept in routed[].  Returns that routing, or NULL.
 */
static const IdemRouted *
IdemCitusColocatedLocked(const IdemRouted *r, Oid dist_rel, text *tenant)
{
	SubTransactionId subxid = GetCurrentSubTransactionId();
	int			len = VARSIZE_ANY_EXHDR(tenant);
	int			i;

	for (i = 0; i < lengthof(routed); i++)
	{
		const IdemRouted *e = &routed[i];

		if (e != r && e->subxid == subxid && e->tenant_len == len &&
			OidIsValid(e->dist_rel) && e->dist_rel != dist_rel &&
			memcmp(e->tenant, VARDATA_ANY(tenant), len) == 0 &&
			IdemCitusColocated(e->dist_rel, dist_rel))
			return e;
	}
	return NULL;
}

/*
 * IdemCitusColocatedShard returns the shard of distributed table dist_rel
 * co-located with shard "src" of src_dist_rel (the two tables in one
 * co-location group): the shard of the same hash range, as Citus pairs
 * the shards of a group; 0 if there is none (a table not distributed by
 * hash: the caller asks Citus).  Kept per backend (colocated_shards).
 */
static int64
IdemCitusColocatedShard(int64 src, Oid src_dist_rel, Oid dist_rel)
{
	IdemColocatedShardKey key;
	IdemColocatedShard *entry;
	int64		shard;

	if (colocated_shards == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(IdemColocatedShardKey);
		ctl.entrysize = sizeof(IdemColocatedShard);
		ctl.hcxt = CacheMemoryContext;
		colocated_shards = hash_create("idempotency co-located shards", 64,
									   &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	memset(&key, 0, sizeof(key));
	key.src = src;
	key.dist_rel = dist_rel;
	entry = hash_search(colocated_shards, &key, HASH_FIND, NULL);
	if (entry != NULL)
		return entry->shard;
	shard = IdemCitusReadColocatedShard(src, dist_rel);
	if (shard == 0)
		return 0;
	/* entered once read (reading may have accepted invalidations) */
	entry = hash_search(colocated_shards, &key, HASH_ENTER, NULL);
	entry->src_dist_rel = src_dist_rel;
	entry->shard = shard;
	return shard;
}

/*
 * IdemCitusReadColocatedShard reads pg_dist_shard under the latest
 * snapshot: the hash range of shard "src", then the shard of dist_rel with
 * that range; 0 if either is missing or has no range.
 */
static int64
IdemCitusReadColocatedShard(int64 src, Oid dist_rel)
{
	Oid			shardid_idx = get_relname_relid("pg_dist_shard_shardid_index",
												PG_CATALOG_NAMESPACE);
	Oid			relid_idx = get_relname_relid("pg_dist_shard_logical_relid_index",
											  PG_CATALOG_NAMESPACE);
	AttrNumber	relid_att = get_attnum(citus_api.shard_rel, "logicalrelid");
	AttrNumber	shardid_att = get_attnum(citus_api.shard_rel, "shardid");
	AttrNumber	min_att = get_attnum(citus_api.shard_rel, "shardminvalue");
	AttrNumber	max_att = get_attnum(citus_api.shard_rel, "shardmaxvalue");
	Relation	rel;
	TupleDesc	desc;
	Snapshot	snapshot;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *min = NULL;
	char	   *max = NULL;
	int64		shard = 0;

	if (!OidIsValid(citus_api.shard_rel) || !OidIsValid(shardid_idx) ||
		!OidIsValid(relid_idx) || relid_att == InvalidAttrNumber ||
		shardid_att == InvalidAttrNumber || min_att == InvalidAttrNumber ||
		max_att == InvalidAttrNumber)
		return 0;
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rel = table_open(citus_api.shard_rel, AccessShareLock);
	desc = RelationGetDescr(rel);

	ScanKeyInit(&key, shardid_att, BTEqualStrategyNumber, F_INT8EQ,
				Int64GetDatum(src));
	scan = systable_beginscan(rel, shardid_idx, true, snapshot, 1, &key);
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		min_null;
		bool		max_null;
		Datum		mind = heap_getattr(tup, min_att, desc, &min_null);
		Datum		maxd = heap_getattr(tup, max_att, desc, &max_null);

		if (!min_null && !max_null)
		{
			min = TextDatumGetCString(mind);
			max = TextDatumGetCString(maxd);
		}
	}
	systable_endscan(scan);

	if (min != NULL)
	{
		ScanKeyInit(&key, relid_att, BTEqualStrategyNumber, F_OIDEQ,
					ObjectIdGetDatum(dist_rel));
		scan = systable_beginscan(rel, relid_idx, true, snapshot, 1, &key);
		while (HeapTupleIsValid(tup = systable_getnext(scan)))
		{
			bool		min_null;
			bool		max_null;
			Datum		mind = heap_getattr(tup, min_att, desc, &min_null);
			Datum		maxd = heap_getattr(tup, max_att, desc, &max_null);
			char	   *tmin;
			char	   *tmax;
			bool		same;

			if (min_null || max_null)
				continue;
			tmin = TextDatumGetCString(mind);
			tmax = TextDatumGetCString(maxd);
			same = strcmp(tmin, min) == 0 && strcmp(tmax, max) == 0;
			pfree(tmin);
			pfree(tmax);
			if (same)
			{
				bool		isnull;

				shard = DatumGetInt64(heap_getattr(tup, shardid_att, desc,
												   &isnull));
				break;
			}
		}
		systable_endscan(scan);
		pfree(min);
		pfree(max);
	}
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snapshot);
	return shard;
}

/*
 * IdemCitusColocated: are distributed tables a and b in one co-location
 * group (pg_dist_partition.colocationid, read under the latest snapshot)?
 * The answers for the last pairs asked are kept (colocated_pairs).
 */
static bool
IdemCitusColocated(Oid a, Oid b)
{
	Oid			index;
	AttrNumber	relid_att;
	AttrNumber	group_att;
	Relation	rel;
	Snapshot	snapshot;
	int32		ga;
	int32		gb;
	bool		same;
	int			i;

	if (a > b)
	{
		Oid			t = a;

		a = b;
		b = t;
	}
	for (i = 0; i < IDEM_COLOCATED_PAIRS; i++)
		if (colocated_pairs[i].a == a && colocated_pairs[i].b == b)
			return colocated_pairs[i].same;
	index = get_relname_relid("pg_dist_partition_logical_relid_index",
							  PG_CATALOG_NAMESPACE);
	if (!OidIsValid(a) || !OidIsValid(citus_api.partition_rel) ||
		!OidIsValid(index))
		return false;
	relid_att = get_attnum(citus_api.partition_rel, "logicalrelid");
	group_att = get_attnum(citus_api.partition_rel, "colocationid");
	if (relid_att == InvalidAttrNumber || group_att == InvalidAttrNumber)
		return false;
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rel = table_open(citus_api.partition_rel, AccessShareLock);
	ga = IdemCitusColocationId(rel, index, relid_att, group_att, snapshot, a);
	gb = IdemCitusColocationId(rel, index, relid_att, group_att, snapshot, b);
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snapshot);
	same = ga != 0 && ga == gb;
	/* kept once read (reading may have accepted invalidations) */
	colocated_pairs[colocated_next].a = a;
	colocated_pairs[colocated_next].b = b;
	colocated_pairs[colocated_next].same = same;
	colocated_next = (colocated_next + 1) % IDEM_COLOCATED_PAIRS;
	return same;
}

/* the colocationid of distributed table relid in pg_dist_partition, or 0 */
static int32
IdemCitusColocationId(Relation rel, Oid index, AttrNumber relid_att,
					  AttrNumber group_att, Snapshot snapshot, Oid relid)
{
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	int32		group = 0;

	ScanKeyInit(&key, relid_att, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, index, true, snapshot, 1, &key);
	if (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, group_att, RelationGetDescr(rel),
									 &isnull);

		if (!isnull)
			group = DatumGetInt32(d);
	}
	systable_endscan(scan);
	return group;
}

/*
 * IdemCitusTenantValue converts the tenant, given as text, to a value of
 * the ledger's tenant column of type "type" (that of the distribution
 * column of the tables the ledger is co-located with): text and varchar
 * as they are, any other type by its input function, in the call's memory.
 */
static Datum
IdemCitusTenantValue(Oid type, text *tenant)
{
	if (type == TEXTOID || type == VARCHAROID)
		return PointerGetDatum(tenant);
	if (type != tenant_input_type)
	{
		Oid			input;

		getTypeInputInfo(type, &input, &tenant_input_ioparam);
		fmgr_info_cxt(input, &tenant_input_fn, TopMemoryContext);
		tenant_input_type = type;
	}
	return InputFunctionCall(&tenant_input_fn, text_to_cstring(tenant),
							 tenant_input_ioparam, -1);
}

/*
 * Citus' catalogs, a distributed table or a shard's table invalidated:
 * look them up again.  A change of a shard's placements invalidates the
 * distributed table the shard is of (IdemCitusShardIsLocal says how), the
 * shard's "here" goes; Citus' catalogs themselves (TRUNCATE, Citus
 * updated or dropped) or all relations: every shard's.  No catalog access
 * here.
 */
static void
IdemCitusRelcacheCallback(Datum arg, Oid relid)
{
	bool		catalog;
	int			i;

	catalog = (relid == InvalidOid || relid == citus_api.placement_rel ||
			   relid == citus_api.local_group_rel ||
			   relid == citus_api.shard_rel ||
			   relid == citus_api.partition_rel);
	if (catalog)
		citus_api.valid = false;
	for (i = 0; i < IDEM_COLOCATED_PAIRS; i++)
		if (catalog || relid == colocated_pairs[i].a ||
			relid == colocated_pairs[i].b)
			colocated_pairs[i].a = colocated_pairs[i].b = InvalidOid;
	for (i = 0; i < IDEM_CITUS_NUM_TABLES; i++)
		if (relid == InvalidOid || relid == table_lookups[i].rel)
			table_lookups[i].rel = InvalidOid;
	if (colocated_shards != NULL)
	{
		HASH_SEQ_STATUS status;
		IdemColocatedShard *entry;

		hash_seq_init(&status, colocated_shards);
		while ((entry = hash_seq_search(&status)) != NULL)
			if (catalog || relid == entry->key.dist_rel ||
				relid == entry->src_dist_rel)
				(void) hash_search(colocated_shards, &entry->key, HASH_REMOVE,
								   NULL);
	}
	if (shard_tables != NULL)
	{
		HASH_SEQ_STATUS status;
		IdemShardTable *entry;

		hash_seq_init(&status, shard_tables);
		while ((entry = hash_seq_search(&status)) != NULL)
		{
			if (catalog || relid == entry->relid)
			{
				entry->relid = InvalidOid;
				entry->here = false;
			}
			else if (relid == entry->dist_rel)
				entry->here = false;
		}
	}
}

/* the extension's schema renamed or dropped: the tables are looked up again */
static void
IdemCitusNamespaceCallback(Datum arg, int cacheid, uint32 hashvalue)
{
	int			i;

	for (i = 0; i < IDEM_CITUS_NUM_TABLES; i++)
		table_lookups[i].rel = InvalidOid;
}

/*
 * IdemCitusLookupApi finds Citus' functions and catalog by name and
 * signature.  Citus is never linked: a node without it gets an error that
 * says what is missing.
 */
static void
IdemCitusLookupApi(void)
{
	Oid			shard_args[2] = {REGCLASSOID, ANYOID};
	Oid			lock_args[2] = {INT4OID, INT8ARRAYOID};
	Oid			shard_fn;
	Oid			lock_fn;
	MemoryContext old;
	List	   *args;

	shard_fn = IdemCitusFunction("get_shard_id_for_distribution_column",
								 2, shard_args, INT8OID);
	lock_fn = IdemCitusFunction("lock_shard_metadata", 2, lock_args, VOIDOID);
	citus_api.placement_rel = get_relname_relid("pg_dist_placement",
												PG_CATALOG_NAMESPACE);
	citus_api.placement_idx = get_relname_relid("pg_dist_placement_shardid_index",
												PG_CATALOG_NAMESPACE);
	citus_api.local_group_rel = get_relname_relid("pg_dist_local_group",
												  PG_CATALOG_NAMESPACE);
	citus_api.shard_rel = get_relname_relid("pg_dist_shard",
											PG_CATALOG_NAMESPACE);
	citus_api.partition_rel = get_relname_relid("pg_dist_partition",
												PG_CATALOG_NAMESPACE);
	citus_api.placement_shardid = get_attnum(citus_api.placement_rel, "shardid");
	citus_api.placement_groupid = get_attnum(citus_api.placement_rel, "groupid");
	if (!OidIsValid(citus_api.placement_idx) ||
		!OidIsValid(citus_api.local_group_rel) ||
		citus_api.placement_shardid == InvalidAttrNumber ||
		citus_api.placement_groupid == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("a ledger is distributed by Citus, but Citus' catalogs pg_dist_placement and pg_dist_local_group are not as expected"),
				 errhint("Install Citus in this database, or make the ledgers anew on a node without it (doc/scale-out.md).")));

	if (citus_api.cxt == NULL)
		citus_api.cxt = AllocSetContextCreate(CacheMemoryContext,
											  "idempotency Citus routing",
											  ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(citus_api.cxt);
	fmgr_info_cxt(shard_fn, &citus_api.shard_fn, citus_api.cxt);
	fmgr_info_cxt(lock_fn, &citus_api.lock_fn, citus_api.cxt);

	/*
	 * get_shard_id_for_distribution_column() takes "any": it reads the type
	 * of its second argument from the call's expression, text here.
	 */
	old = MemoryContextSwitchTo(citus_api.cxt);
	args = list_make2(makeConst(REGCLASSOID, -1, InvalidOid, sizeof(Oid),
								(Datum) 0, true, true),
					  makeConst(TEXTOID, -1, DEFAULT_COLLATION_OID, -1,
								(Datum) 0, true, false));
	citus_api.shard_fn.fn_expr = (Node *) makeFuncExpr(shard_fn, INT8OID, args,
													   InvalidOid, InvalidOid,
													   COERCE_EXPLICIT_CALL);
	MemoryContextSwitchTo(old);
	citus_api.local_group = -1;
	citus_api.valid = true;
}

static Oid
IdemCitusFunction(const char *name, int nargs, const Oid *argtypes, Oid rettype)
{
	Oid			fn;

	fn = LookupFuncName(list_make2(makeString("pg_catalog"), makeString(pstrdup(name))),
						nargs, argtypes, true);
	if (!OidIsValid(fn) || get_func_rettype(fn) != rettype)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("a ledger is distributed by Citus, but Citus' function pg_catalog.%s() is not found", name),
				 errdetail("The routing of calls to the local shard of a distributed ledger calls it."),
				 errhint("Install Citus in this database, or make the ledgers anew on a node without it (doc/scale-out.md).")));
	return fn;
}

/*
 * 1: the shard of table "rel" holding the tenant; for a ledger (rel
 * InvalidOid), of the ledger's own table.  Sets *dist_rel to the table.
 */
static int64
IdemCitusShard(Oid rel, int ledger, const char *relname, text *tenant,
			   Oid *dist_rel)
{
	LOCAL_FCINFO(fcinfo, 2);
	Oid			ledger_rel = rel;
	Datum		result;

	if (!OidIsValid(ledger_rel))
		ledger_rel = IdemLedgerParent((IdemLedger) ledger, false);
	if (!OidIsValid(ledger_rel))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("ledger \"%s.%s\" does not exist",
						IDEM_SCHEMA_NAME, relname)));
	InitFunctionCallInfoData(*fcinfo, &citus_api.shard_fn, 2, InvalidOid,
							 NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(ledger_rel);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = PointerGetDatum(tenant);
	fcinfo->args[1].isnull = false;
	result = FunctionCallInvoke(fcinfo);
	if (fcinfo->isnull || DatumGetInt64(result) == 0)
		elog(ERROR, "could not find the ledger shard of a tenant");
	*dist_rel = ledger_rel;
	return DatumGetInt64(result);
}

/* 2: the shard's metadata lock, SHARE as Citus' own writes take it */
static void
IdemCitusLockShard(int64 shard)
{
	Datum		elem = Int64GetDatum(shard);
	ArrayType  *shards;

	shards = construct_array(&elem, 1, INT8OID, sizeof(int64),
							 FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
	(void) FunctionCall2(&citus_api.lock_fn, Int32GetDatum(ShareLock),
						 PointerGetDatum(shards));
	pfree(shards);
}

/*
 * The entry of "shard" in this backend's shard cache; if there is none,
 * made (knowing nothing) when "create", else NULL.
 */
static IdemShardTable *
IdemCitusShardEntry(int64 shard, bool create)
{
	IdemShardTable *entry;
	bool		found;

	if (shard_tables == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(IdemShardTable);
		ctl.hcxt = CacheMemoryContext;
		shard_tables = hash_create("idempotency ledger shard tables", 64,
								   &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	entry = hash_search(shard_tables, &shard, create ? HASH_ENTER : HASH_FIND,
						&found);
	if (create && !found)
	{
		entry->relid = InvalidOid;
		entry->dist_rel = InvalidOid;
		entry->here = false;
	}
	return entry;
}

/*
 * 3: whether a placement of the shard, one of distributed table
 * "dist_rel", is in this node's group.  Called with the shard's metadata
 * lock held and the invalidations read after it was had.
 *
 * Read under the latest snapshot (Citus' catalogs are tables, not system
 * catalogs: the catalog snapshot would not show a move that committed
 * meanwhile), and then kept per backend, until invalidated, when it was
 * "here": a call of a later transaction on the same shard reads no
 * catalog.  That is safe because every change of a shard's placements,
 * the final step of a move or a split, is made in a transaction that
 * holds the shard's metadata lock (EXCLUSIVE, which this call's SHARE
 * waits for), and invalidates the relcache entry of the distributed table
 * the shard is of, on every node that has the metadata: Citus' functions
 * that write pg_dist_placement (the workers' metadata is written by
 * them) and its trigger on the catalog for SQL writes
 * (CitusInvalidateRelcacheByShardId), and Citus' own metadata cache, which
 * get_shard_id_for_distribution_column() reads, is kept by the same
 * invalidation.  (Changes of rows of pg_dist_placement invalidate nothing
 * of the catalog itself: it is not a system catalog.)  A transaction sends
 * its invalidations before it releases its locks, so once this call has
 * the lock, the invalidation of a move that committed is queued, and the
 * AcceptInvalidationMessages() after the lock (IdemCitusRouteShard) has
 * run IdemCitusRelcacheCallback, which forgot the shard's "here": the
 * catalog is read again, and a shard the tenant left refused (40001).  A
 * move cannot commit while the lock is held, so "here" stays true to the
 * end of the transaction.  The other ways a placement can go (the
 * shard's table dropped, Citus' catalogs truncated, Citus updated or
 * dropped, an invalidation queue overflow) invalidate the shard's table,
 * Citus' catalogs or everything, which forget it too.  Only "here" is
 * kept: a shard that moves to this node is found by the next call.
 */
static bool
IdemCitusShardIsLocal(int64 shard, Oid dist_rel)
{
	IdemShardTable *entry;
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	Snapshot	snapshot;
	int32		groups[8];
	int			ngroups = 0;
	bool		here = false;
	int			i;

	entry = IdemCitusShardEntry(shard, false);
	if (entry != NULL && entry->here && entry->dist_rel == dist_rel)
		return true;

	if (citus_api.local_group < 0)
		citus_api.local_group = IdemCitusReadLocalGroup(citus_api.local_group_rel);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rel = table_open(citus_api.placement_rel, AccessShareLock);
	ScanKeyInit(&key, citus_api.placement_shardid, BTEqualStrategyNumber,
				F_INT8EQ, Int64GetDatum(shard));
	scan = systable_beginscan(rel, citus_api.placement_idx, true, snapshot,
							  1, &key);
	while ((tup = systable_getnext(scan)) != NULL)
	{
		bool		isnull;
		Datum		group = heap_getattr(tup, citus_api.placement_groupid,
										 RelationGetDescr(rel), &isnull);

		if (!isnull && ngroups < lengthof(groups))
			groups[ngroups++] = DatumGetInt32(group);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snapshot);

	for (i = 0; i < ngroups && !here; i++)
		here = (groups[i] == citus_api.local_group);

	/* this node's group is set once, when it is added: read it again */
	if (!here && ngroups > 0)
	{
		citus_api.local_group = IdemCitusReadLocalGroup(citus_api.local_group_rel);
		for (i = 0; i < ngroups && !here; i++)
			here = (groups[i] == citus_api.local_group);
	}

	/* invalidations read while the catalog was opened leave it true */
	if (here)
	{
		entry = IdemCitusShardEntry(shard, true);
		entry->dist_rel = dist_rel;
		entry->here = true;
	}
	return here;
}

static int32
IdemCitusReadLocalGroup(Oid local_group_rel)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	Snapshot	snapshot;
	int32		group = -1;

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rel = table_open(local_group_rel, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, snapshot, 0, NULL);
	if ((tup = systable_getnext(scan)) != NULL)
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, 1, RelationGetDescr(rel), &isnull);

		if (!isnull)
			group = DatumGetInt32(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snapshot);
	return group;
}

/* 4: the local table of the shard, idempotency.<relname>_<shard> */
static Oid
IdemCitusShardTable(const char *relname, int64 shard)
{
	IdemShardTable *entry;
	char		shardname[NAMEDATALEN];
	Oid			relid;

	entry = IdemCitusShardEntry(shard, true);
	if (OidIsValid(entry->relid))
		return entry->relid;

	snprintf(shardname, sizeof(shardname), "%s_" INT64_FORMAT, relname, shard);
	relid = get_relname_relid(shardname, get_namespace_oid(IDEM_SCHEMA_NAME, false));
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("the ledger shard " INT64_FORMAT " has no table on this node", shard),
				 errhint("Retry: the tenant has moved, and the retry goes to its new node.")));
	/* the lookup may have read invalidations: the entry is where it was */
	entry = IdemCitusShardEntry(shard, true);
	entry->relid = relid;
	return relid;
}

/*
 * IdemCitusDistributed tells whether Citus distributes table "relid" on
 * this node (it is listed in pg_dist_partition), and sets *coordinator to
 * whether this node is the coordinator (group 0), the one node where the
 * partitions of a distributed table can be made and dropped.  Without
 * Citus: false.  For maintenance (a catalog read per round, whatever the
 * setting: a worker cannot do that DDL in any case).
 */
bool
IdemCitusDistributed(Oid relid, bool *coordinator)
{
	Oid			dist_rel;
	Oid			dist_idx;
	AttrNumber	att;
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	Snapshot	snapshot;
	bool		found;
	Oid			local_group_rel;

	*coordinator = true;
	dist_rel = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	dist_idx = get_relname_relid("pg_dist_partition_logical_relid_index",
								 PG_CATALOG_NAMESPACE);
	if (!OidIsValid(relid) || !OidIsValid(dist_rel) || !OidIsValid(dist_idx))
		return false;
	att = get_attnum(dist_rel, "logicalrelid");
	if (att == InvalidAttrNumber)
		return false;

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rel = table_open(dist_rel, AccessShareLock);
	ScanKeyInit(&key, att, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, dist_idx, true, snapshot, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snapshot);
	if (!found)
		return false;

	local_group_rel = get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE);
	if (OidIsValid(local_group_rel))
		*coordinator = (IdemCitusReadLocalGroup(local_group_rel) == 0);
	return true;
}

/*
 * IdemCitusPinRemoteSettings sends the settings pinned for privileged SQL
 * (privilege.c, IdemPinOwnerSettings, which the caller has pinned here)
 * to the Citus workers of the running transaction, as SET LOCAL commands
 * in the caller's SPI connection, run by the storage owner;
 * IdemCitusUnpinRemoteSettings sets them back to the workers' defaults
 * once that SQL is done.  For the SQL functions of the tenant outbox
 * (outbox_tenant.c), whose statements on idempotency.tenant_events Citus
 * runs on the workers.
 *
 * Citus sends a worker the text of a statement it deparsed here, with
 * this node's (pinned) settings, but the worker reads that text with the
 * transaction's settings there: those of the caller's SET LOCAL commands,
 * which Citus sends to the workers when citus.propagate_set_commands is
 * 'local', a setting every role may make.  The caller's search_path there
 * found the caller's own function or type for a name the text leaves
 * unqualified (array_position(), the casts to text): the storage owner
 * ran it on the worker.  The caller's standard_conforming_strings = off
 * read the text's literals otherwise there (a backslash in a topic ended
 * its literal: the rest of the topic was read as SQL).  Our own SET LOCAL
 * commands, sent the same way, replace them for the statements that
 * follow.  A caller's SET LOCAL of one of them is not on the workers after
 * the call: they have their defaults until it sets it again.  Outside a
 * transaction block Citus sends no SET LOCAL, ours nor the caller's.
 */
static void
IdemCitusAppendSetLocal(StringInfo sql, const char *name, const char *value)
{
	appendStringInfo(sql, "SET LOCAL %s TO ", name);
	if (value == NULL)
		appendStringInfoString(sql, "DEFAULT");
	else if ((GetConfigOptionFlags(name, false) & GUC_LIST_QUOTE) && value[0] != '\0')
	{
		/* a list of names (search_path): each quoted, not the whole */
		List	   *elems;
		char	   *copy = pstrdup(value);
		ListCell   *lc;

		if (!SplitIdentifierString(copy, ',', &elems))
			elog(ERROR, "invalid list of names for \"%s\": \"%s\"", name, value);
		foreach(lc, elems)
			appendStringInfo(sql, "%s%s", foreach_current_index(lc) > 0 ? ", " : "",
							 quote_identifier((char *) lfirst(lc)));
	}
	else
		appendStringInfoString(sql, quote_literal_cstr(value));
}

/*
 * IdemCitusAppendPinnedSets appends to sql a SET LOCAL command (each ended
 * by ";") for every pinned setting this server has: its pinned value, or
 * its default (reset).
 */
static void
IdemCitusAppendPinnedSets(StringInfo sql, bool reset)
{
	const char *name;
	const char *value;
	int			i;

	for (i = 0; IdemPinnedSettingAt(i, &name, &value); i++)
	{
		if (GetConfigOption(name, true, false) == NULL)
			continue;
		appendStringInfoChar(sql, ' ');
		IdemCitusAppendSetLocal(sql, name, reset ? NULL : value);
		appendStringInfoChar(sql, ';');
	}
}

static void
IdemCitusSetLocal(const char *name, const char *value)
{
	StringInfoData sql;
	int			rc;

	initStringInfo(&sql);
	IdemCitusAppendSetLocal(&sql, name, value);
	rc = SPI_execute(sql.data, false, 0);
	if (rc != SPI_OK_UTILITY)
		elog(ERROR, "SPI_execute failed for \"%s\": %s", sql.data,
			 SPI_result_code_string(rc));
	pfree(sql.data);
}

static void
IdemCitusExecPinnedSets(bool reset)
{
	StringInfoData sql;
	int			rc;

	initStringInfo(&sql);
	IdemCitusAppendPinnedSets(&sql, reset);
	if (sql.len > 0)
	{
		rc = SPI_execute(sql.data, false, 0);
		if (rc != SPI_OK_UTILITY)
			elog(ERROR, "SPI_execute failed for \"%s\": %s", sql.data,
				 SPI_result_code_string(rc));
	}
	pfree(sql.data);
}

void
IdemCitusPinRemoteSettings(void)
{
	IdemCitusSetLocal("citus.propagate_set_commands", "local");
	IdemCitusExecPinnedSets(false);
}

void
IdemCitusUnpinRemoteSettings(void)
{
	IdemCitusExecPinnedSets(true);
}

/*
 * IdemCitusExecDdl runs one DDL statement on a distributed ledger (its
 * partitions, made or dropped by the coordinator's maintenance) as the
 * storage owner, waiting at most lock_timeout_ms for its locks on every
 * node.  Citus sends the statement to the workers, where the tenants'
 * calls hold locks on the ledger shards to the end of their transactions;
 * the coordinator's lock_timeout is its own setting, which Citus does not
 * send, so a transaction left open on a worker held the DDL, and every
 * call queued behind it, for as long as it stayed open.  Citus sends the
 * SET LOCAL commands of a statement it propagates from
 * (citus.propagate_set_commands = 'local'), and a DO block is one: the
 * block sets lock_timeout there, runs the statement, and sets it back to
 * the workers' default, so that the rest of the transaction's work on the
 * workers is not cut short by it.  On the coordinator, the SET LOCALs end
 * with IdemExecAsOwner's settings.  A lock not had in time fails the
 * statement with 55P03 on whichever node waited; the caller's
 * subtransaction rolls it back on every node.  The block also sends the
 * pinned settings first and the workers' defaults last, as
 * IdemCitusPinRemoteSettings does: Citus runs the DDL on the workers
 * through worker_apply_shard_ddl_command(), named without its schema, and
 * a caller of idem_maintain() who had sent its own search_path there (SET
 * LOCAL with citus.propagate_set_commands = 'local') would otherwise have
 * had its own function of that name run by the storage owner.
 */
void
IdemCitusExecDdl(const char *sql, int lock_timeout_ms)
{
	StringInfoData block;

	int			len = strlen(sql);

	Assert(strstr(sql, "$idem_ddl$") == NULL);
	/* its own ";" (one or more statements) is the block's */
	while (len > 0 && (sql[len - 1] == ';' || sql[len - 1] == ' '))
		len--;
	initStringInfo(&block);
	appendStringInfoString(&block,
						   "DO $idem_ddl$ BEGIN"
						   " SET LOCAL citus.propagate_set_commands = 'local';");
	IdemCitusAppendPinnedSets(&block, false);
	appendStringInfo(&block,
					 " SET LOCAL lock_timeout = %d;"
					 " %.*s;"
					 " SET LOCAL lock_timeout TO DEFAULT;",
					 lock_timeout_ms, len, sql);
	IdemCitusAppendPinnedSets(&block, true);
	appendStringInfoString(&block, " END $idem_ddl$");
	IdemExecAsOwner(block.data, lock_timeout_ms);
	pfree(block.data);
}

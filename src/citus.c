/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Ledgers distributed by Citus: a key's row lives in the ledger shard
 *	  co-located with its tenant's rows, so Citus moves, splits and
 *	  isolates it with them.  This file routes a call to that shard.
 *
 * PROTOTYPE for issue 37 (doc/scale-out.md, "Citus' own shard operations
 * (0.5.0 design)"), behind idempotency.citus_ledgers (off by default: the
 * extension then never looks at Citus).  With it on, on a node where
 * idempotency.keys is distributed by its kept_scope column (the prototype
 * stands in kept_scope for the design's "tenant" column, so the handler
 * claims with keep_request => true), a call on key (scope, key):
 *
 *	1. finds the ledger shard of the tenant (= scope) with Citus'
 *	   get_shard_id_for_distribution_column();
 *	2. takes that shard's metadata lock in SHARE mode with Citus'
 *	   lock_shard_metadata(), to the end of the transaction, the mode of
 *	   Citus' own writes: a move's final write block (EXCLUSIVE) waits for
 *	   the call, and a call that starts during the block waits for the move;
 *	3. checks, after the lock and with a new snapshot, that the shard's
 *	   placement is on this node: 40001 if not (the tenant moved; the
 *	   client's retry is delegated to its new node);
 *	4. makes the local shard's partitioned table, idempotency.keys_<shard>,
 *	   the parent the storage cache reads (IdemSetLedgerParentOverride),
 *	   for this call only: IdemCitusEndCall() when it returns, or the
 *	   abort of its (sub)transaction when it fails, makes the ledger's own
 *	   table the one read again, so that maintenance or an export run next
 *	   in the backend reads the local ledgers, not the last call's shard.
 *
 * The prototype does 1-3 with two SPI plans prepared once per backend,
 * and once per transaction and tenant: the lock, held to the end of the
 * transaction, keeps the placement where step 3 found it, so a second
 * call of the transaction on the same tenant (idem_complete() after
 * idem_claim()) reuses the answer.  The design does 1-3 through fmgr with
 * a per-shard cache.
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

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "storage/proc.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"

bool		idem_citus_ledgers = false;

/* the plans of steps 1-2 and 3, prepared once per backend */
static SPIPlanPtr shard_plan = NULL;
static SPIPlanPtr placement_plan = NULL;

/*
 * The routing of the running call: the ledgers whose table it overrides.
 * Cleared when the call returns (IdemCitusEndCall) and, for a call that
 * fails, when its (sub)transaction aborts: whatever the backend runs next
 * (maintenance, an export) reads the ledgers' own tables.
 */
static bool call_routed[IDEM_NUM_LEDGERS];
static bool xact_callbacks_registered = false;

/* the last routing of this backend: valid within its transaction only */
static LocalTransactionId routed_lxid = InvalidLocalTransactionId;
static SubTransactionId routed_subxid = InvalidSubTransactionId;
static char routed_tenant[NAMEDATALEN * 4];
static int	routed_tenant_len = -1;
static Oid	routed_relid = InvalidOid;

static void IdemCitusXactCallback(XactEvent event, void *arg);
static void IdemCitusSubXactCallback(SubXactEvent event,
									 SubTransactionId mySubid,
									 SubTransactionId parentSubid, void *arg);
static void IdemCitusClearCall(void);

void
IdemCitusInit(void)
{
	DefineCustomBoolVariable("idempotency.citus_ledgers",
							 "Routes key ledger rows to the local shard of a ledger distributed by Citus (prototype).",
							 "Only for a key ledger distributed with Citus, co-located with the tenant's tables.",
							 &idem_citus_ledgers,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
}

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
		}
	}
}

/*
 * At the end of the transaction, whatever its outcome, no call runs: the
 * routing of one that failed goes, and so does the routing kept for the
 * transaction (its shard lock is released).
 */
static void
IdemCitusXactCallback(XactEvent event, void *arg)
{
	IdemCitusClearCall();
	routed_lxid = InvalidLocalTransactionId;
	routed_subxid = InvalidSubTransactionId;
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
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	IdemCitusClearCall();
	if (routed_subxid == mySubid)
		routed_subxid = InvalidSubTransactionId;
}

/*
 * IdemCitusRoute makes the local shard of "ledger" that holds "tenant" the
 * ledger's table for the rest of this call, or refuses the call if that
 * shard is not on this node.
 */
void
IdemCitusRoute(IdemLedger ledger, text *tenant)
{
	IdemSavedUser save;
	Oid			argtypes[1] = {TEXTOID};
	Datum		args[1];
	bool		isnull;
	int64		shard;
	bool		here;
	char		relname[NAMEDATALEN];
	Oid			relid;

	if (!idem_citus_ledgers || ledger != IDEM_LEDGER_KEYS)
		return;

	/* registered on the first routing: nothing changes for anyone else */
	if (!xact_callbacks_registered)
	{
		RegisterXactCallback(IdemCitusXactCallback, NULL);
		RegisterSubXactCallback(IdemCitusSubXactCallback, NULL);
		xact_callbacks_registered = true;
	}

	/*
	 * Routed already in this (sub)transaction: the lock keeps the placement.
	 * (Not across subtransactions: one that rolls back releases the lock.)
	 */
	if (routed_lxid == MyProc->lxid &&
		routed_subxid == GetCurrentSubTransactionId() &&
		routed_tenant_len == VARSIZE_ANY_EXHDR(tenant) &&
		memcmp(routed_tenant, VARDATA_ANY(tenant), routed_tenant_len) == 0)
	{
		IdemSetLedgerParentOverride(ledger, routed_relid);
		call_routed[ledger] = true;
		return;
	}

	args[0] = PointerGetDatum(tenant);
	IdemBecomeStorageOwner(&save);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (shard_plan == NULL)
	{
		SPIPlanPtr	plan;
		Oid			int8type[1] = {INT8OID};

		plan = SPI_prepare("SELECT s, pg_catalog.lock_shard_metadata(5, ARRAY[s]) "
						   "FROM pg_catalog.get_shard_id_for_distribution_column("
						   "'idempotency.keys'::pg_catalog.regclass, $1) AS s",
						   1, argtypes);
		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "could not prepare the ledger shard lookup");
		shard_plan = plan;
		plan = SPI_prepare("SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_placement p "
						   "JOIN pg_catalog.pg_dist_local_group l USING (groupid) "
						   "WHERE p.shardid OPERATOR(pg_catalog.=) $1)",
						   1, int8type);
		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "could not prepare the ledger placement lookup");
		placement_plan = plan;
	}

	/* 1 and 2: the shard, locked as Citus' own writes lock it */
	if (SPI_execute_plan(shard_plan, args, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not find the ledger shard of a tenant");
	shard = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 1, &isnull));

	/* 3: a new snapshot, after the lock: a move that committed is seen */
	args[0] = Int64GetDatum(shard);
	if (SPI_execute_plan(placement_plan, args, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not read the placement of a ledger shard");
	here = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	IdemRestoreUser(&save);

	if (!here)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("the idempotency key's tenant is not on this node"),
				 errdetail("Its ledger shard " INT64_FORMAT " is on another node.", shard),
				 errhint("Retry: the tenant has moved, and the retry goes to its new node.")));

	/* 4: the local shard's table */
	snprintf(relname, sizeof(relname), "%s_" INT64_FORMAT,
			 IdemLedgerName(ledger), shard);
	relid = get_relname_relid(relname, get_namespace_oid(IDEM_SCHEMA_NAME, false));
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("the ledger shard " INT64_FORMAT " has no table on this node", shard)));
	if (VARSIZE_ANY_EXHDR(tenant) <= (int) sizeof(routed_tenant))
	{
		routed_lxid = MyProc->lxid;
		routed_subxid = GetCurrentSubTransactionId();
		routed_tenant_len = VARSIZE_ANY_EXHDR(tenant);
		memcpy(routed_tenant, VARDATA_ANY(tenant), routed_tenant_len);
		routed_relid = relid;
	}
	IdemSetLedgerParentOverride(ledger, relid);
	call_routed[ledger] = true;
}

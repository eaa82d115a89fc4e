/*-------------------------------------------------------------------------
 *
 * filter_hooks.c
 *	  The hooks that notice rows written into the ledgers by anything but
 *	  this library, and then switch the digest filters of the database off
 *	  (filter.h, "How that holds"): an ExecutorStart, an ExecutorCheckPerms
 *	  and a ProcessUtility hook, installed only with
 *	  shared_preload_libraries, and a transaction callback.
 *
 * An external write makes every filter of its database UNUSABLE, and keeps
 * filters of that database from being made READY until the transaction
 * that wrote has ended (external_busy, per database) and from being made
 * READY by a build or creation it overlapped (external_seq, which
 * IdemFilterExternalBusy reads and IdemFilterFinish checks).  The
 * library's own DDL is let through by its query text (IdemFilterOwnSql).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/filter_hooks.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "filter.h"
#include "filter_internal.h"
#include "memory.h"
#include "storage.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parsetree.h"
#include "port/atomics.h"
#include "tcop/utility.h"
#include "utils/inval.h"
#include "utils/syscache.h"

/* This backend: external writes in the current transaction, own SQL */
static int	my_external_busy = 0;
static const char *own_sql_text = NULL;
static Oid	idem_nsp_cache = InvalidOid;
static bool idem_nsp_cache_valid = false;

/* This backend: inside a COPY FROM (see IdemFilterCheckPerms) */
static bool in_copy_from = false;

static ExecutorStart_hook_type prev_ExecutorStart = NULL;
static ExecutorCheckPerms_hook_type prev_ExecutorCheckPerms = NULL;
static ProcessUtility_hook_type prev_ProcessUtility = NULL;

static void IdemFilterExecutorStart(QueryDesc *queryDesc, int eflags);
static bool IdemFilterCheckPerms(IDEM_CHECK_PERMS_PARAMS);
static void IdemFilterNextProcessUtility(PlannedStmt *pstmt,
										 const char *queryString,
										 bool readOnlyTree,
										 ProcessUtilityContext context,
										 ParamListInfo params,
										 QueryEnvironment *queryEnv,
										 DestReceiver *dest,
										 QueryCompletion *qc);
static void IdemFilterProcessUtility(PlannedStmt *pstmt, const char *queryString,
									 bool readOnlyTree,
									 ProcessUtilityContext context,
									 ParamListInfo params,
									 QueryEnvironment *queryEnv,
									 DestReceiver *dest, QueryCompletion *qc);
static void IdemFilterXactCallback(XactEvent event, void *arg);
static void IdemFilterNamespaceCallback(Datum arg, int cacheid, uint32 hashvalue);
static void IdemFilterNoteExternalWrite(void);
static bool IdemFilterIsLedger(Oid relid);

/*
 * IdemFilterPreloadInit installs the hooks that notice rows written into
 * the ledgers by anything but this library.  Called from _PG_init while
 * shared_preload_libraries is processed, after the settings are defined.
 */
void
IdemFilterPreloadInit(void)
{
	if (idem_filter_memory == 0)
		return;

	prev_ExecutorStart = ExecutorStart_hook;
	ExecutorStart_hook = IdemFilterExecutorStart;
	prev_ExecutorCheckPerms = ExecutorCheckPerms_hook;
	ExecutorCheckPerms_hook = IdemFilterCheckPerms;
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = IdemFilterProcessUtility;
	RegisterXactCallback(IdemFilterXactCallback, NULL);
	CacheRegisterSyscacheCallback(NAMESPACEOID, IdemFilterNamespaceCallback,
								  (Datum) 0);
}

/* The OID of schema idempotency, or InvalidOid; cached until it changes */
static Oid
IdemFilterNamespace(void)
{
	if (!idem_nsp_cache_valid)
	{
		idem_nsp_cache = get_namespace_oid(IDEM_SCHEMA_NAME, true);
		idem_nsp_cache_valid = true;
	}
	return idem_nsp_cache;
}

static void
IdemFilterNamespaceCallback(Datum arg, int cacheid, uint32 hashvalue)
{
	idem_nsp_cache_valid = false;
}

/*
 * IdemFilterIsLedger: is relid a ledger's table or one of its partitions
 * (in whatever schema), or a ledger's memory table or one of its pieces
 * (memory.c: the memory's filter holds the pairs maintenance and imports
 * wrote into its pieces, with heap_insert, and no other)?  Nothing to look up in a database without the extension's
 * schema; a relation only named like a ledger in a database without the
 * extension is none.
 */
static bool
IdemFilterIsLedger(Oid relid)
{
	return OidIsValid(IdemFilterNamespace()) &&
		(IdemIsLedgerRelation(relid) || IdemIsMemoryRelation(relid)) &&
		OidIsValid(get_extension_oid("idempotency", true));
}

/*
 * IdemFilterExecutorStart: a statement that may add rows to a ledger (an
 * INSERT, UPDATE or MERGE, or any statement with one in a WITH clause) is
 * an external write: the library's own SQL never does that.  (A DELETE
 * only removes rows: a filter holding more digests than its partition is
 * still exact.)  Noted once the executor has started, so only for a role
 * allowed to write (no row is written before ExecutorRun).
 */
static void
IdemFilterExecutorStart(QueryDesc *queryDesc, int eflags)
{
	PlannedStmt *stmt = queryDesc->plannedstmt;

	if (prev_ExecutorStart)
		prev_ExecutorStart(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);

	if (idem_filter_shared != NULL && stmt != NULL &&
		(eflags & EXEC_FLAG_EXPLAIN_ONLY) == 0 &&
		(queryDesc->operation == CMD_INSERT ||
		 queryDesc->operation == CMD_UPDATE ||
		 queryDesc->operation == CMD_MERGE || stmt->hasModifyingCTE))
	{
		ListCell   *lc;

		foreach(lc, stmt->resultRelations)
		{
			RangeTblEntry *rte = rt_fetch(lfirst_int(lc), stmt->rtable);

			if (rte->rtekind == RTE_RELATION && IdemFilterIsLedger(rte->relid))
			{
				IdemFilterNoteExternalWrite();
				break;
			}
		}
	}
}

/*
 * IdemFilterCheckPerms, PostgreSQL's hook once the privileges a statement
 * or a COPY needs on its relations have passed: inside a COPY FROM, a
 * ledger relation that is to get rows (INSERT) is an external write, noted
 * before COPY reads its first row.  Whatever let the role write (a table
 * or a column privilege, a role it is a member of, superuser), the check
 * has passed; a role that may not write is refused before this is called,
 * and cannot switch the filters off.
 */
static bool
IdemFilterCheckPerms(IDEM_CHECK_PERMS_PARAMS)
{
	bool		allowed = true;

	if (prev_ExecutorCheckPerms)
		allowed = IdemCallCheckPerms(prev_ExecutorCheckPerms);
	if (allowed && in_copy_from && idem_filter_shared != NULL)
	{
		ListCell   *lc;

		foreach(lc, IDEM_CHECK_PERMS_LIST)
		{
			Oid			relid;
			AclMode		required;

			IdemCheckPermsEntry(lc, &relid, &required);
			if ((required & ACL_INSERT) != 0 && OidIsValid(relid) &&
				IdemFilterIsLedger(relid))
			{
				IdemFilterNoteExternalWrite();
				break;
			}
		}
	}
	return allowed;
}

/* the ProcessUtility this library's hook wraps */
static void
IdemFilterNextProcessUtility(PlannedStmt *pstmt, const char *queryString,
							 bool readOnlyTree, ProcessUtilityContext context,
							 ParamListInfo params, QueryEnvironment *queryEnv,
							 DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * IdemFilterProcessUtility: COPY FROM into a ledger relation is an
 * external write, noted by IdemFilterCheckPerms once COPY's own privilege
 * check has passed, before a row is written; so are, once they have run
 * (and so were allowed), ATTACH PARTITION to a ledger's table, ALTER
 * COLUMN TYPE of a ledger relation, and CREATE or ALTER SUBSCRIPTION.  The
 * library's own DDL (its ATTACH of the partitions it makes) is recognised
 * by its query text.
 */
static void
IdemFilterProcessUtility(PlannedStmt *pstmt, const char *queryString,
						 bool readOnlyTree, ProcessUtilityContext context,
						 ParamListInfo params, QueryEnvironment *queryEnv,
						 DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;
	bool		note_after = false;
	bool		copy_from = false;
	RangeVar   *alter = NULL;

	if (idem_filter_shared != NULL &&
		!(own_sql_text != NULL && queryString == own_sql_text))
	{
		if (IsA(parsetree, CopyStmt) && ((CopyStmt *) parsetree)->is_from &&
			((CopyStmt *) parsetree)->relation != NULL)
			copy_from = true;
		else if (IsA(parsetree, AlterTableStmt))
		{
			ListCell   *lc;

			foreach(lc, ((AlterTableStmt *) parsetree)->cmds)
			{
				AlterTableCmd *cmd = (AlterTableCmd *) lfirst(lc);

				if (IsA(cmd, AlterTableCmd) &&
					(cmd->subtype == AT_AttachPartition ||
					 cmd->subtype == AT_AlterColumnType))
					alter = ((AlterTableStmt *) parsetree)->relation;
			}
		}
		else if (IsA(parsetree, CreateSubscriptionStmt) ||
				 IsA(parsetree, AlterSubscriptionStmt))
			note_after = true;
	}

	/*
	 * COPY FROM: the privilege check COPY makes before it reads a row calls
	 * IdemFilterCheckPerms, which notes the write if the table is a ledger
	 */
	if (copy_from)
	{
		bool		save = in_copy_from;

		in_copy_from = true;
		PG_TRY();
		{
			IdemFilterNextProcessUtility(pstmt, queryString, readOnlyTree,
										 context, params, queryEnv, dest, qc);
		}
		PG_FINALLY();
		{
			in_copy_from = save;
		}
		PG_END_TRY();
	}
	else
		IdemFilterNextProcessUtility(pstmt, queryString, readOnlyTree,
									 context, params, queryEnv, dest, qc);

	/*
	 * Before the transaction commits and its effect can be seen; the table
	 * altered is found by its name now, which the command holds a lock on.
	 */
	if (alter != NULL)
	{
		Oid			relid = RangeVarGetRelid(alter, NoLock, true);

		note_after = OidIsValid(relid) && IdemFilterIsLedger(relid);
	}
	if (note_after)
		IdemFilterNoteExternalWrite();
}

/*
 * IdemFilterNoteExternalWrite makes every filter of this database
 * UNUSABLE, and keeps filters of this database from being made READY until
 * the current transaction ends: its rows may go anywhere in the ledgers,
 * and no filter holds them.
 */
static void
IdemFilterNoteExternalWrite(void)
{
	int			b = IdemFilterBucket(MyDatabaseId);

	if (my_external_busy == 0)
		pg_atomic_fetch_add_u32(&idem_filter_shared->external_busy[b], 1);
	my_external_busy = 1;
	pg_atomic_fetch_add_u64(&idem_filter_shared->external_seq[b], 1);
	pg_memory_barrier();
	IdemFilterSweepUnusable();
}

/*
 * IdemFilterExternalBusy: may an external write be under way?  Sets *seq
 * to the count of external writes started, read first: a filter made READY
 * later must find it unchanged (IdemFilterFinish), so that no external
 * write overlapped its making.
 */
bool
IdemFilterExternalBusy(uint64 *seq)
{
	int			b = IdemFilterBucket(MyDatabaseId);

	*seq = pg_atomic_read_u64(&idem_filter_shared->external_seq[b]);
	pg_memory_barrier();
	return pg_atomic_read_u32(&idem_filter_shared->external_busy[b]) > 0;
}

static void
IdemFilterXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* (a prepared transaction's rows are in the heap by now) */
			if (my_external_busy > 0 && idem_filter_shared != NULL)
				pg_atomic_fetch_sub_u32(&idem_filter_shared->external_busy[IdemFilterBucket(MyDatabaseId)], 1);
			my_external_busy = 0;
			own_sql_text = NULL;
			/* the filters of the partitions it dropped (filter_pool.c) */
			IdemFilterAtXactEnd(event == XACT_EVENT_COMMIT ||
								event == XACT_EVENT_PARALLEL_COMMIT);
			/* the local cache of slots, pruned now and then */
			IdemFilterPruneLocal();
			break;
		default:
			break;
	}
}

/*
 * IdemFilterOwnSql names the query text of the DDL this library is about
 * to run itself (the ATTACH of a partition it makes), which the utility
 * hook lets through; NULL when it is done (also on error: see the caller's
 * PG_FINALLY).  Only statements of that very text: anything they fire
 * (an event trigger's SQL) is looked at as usual.
 */
void
IdemFilterOwnSql(const char *sql)
{
	own_sql_text = sql;
}

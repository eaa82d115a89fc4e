/*-------------------------------------------------------------------------
 *
 * maintain.c
 *	  idem_maintain(): make partitions ahead, drop expired ones.
 *
 * One run, in the caller's transaction:
 *	- give a ledger made by an earlier version the digest index of this one
 *	  (IdemUpgradeLedgerIndex), once;
 *	- for every lane of the current layout, make partitions so that
 *	  [now, now + default ttl + premake partition widths) is covered;
 *	- drop every partition whose range has ended (upper bound <= now).  All
 *	  its rows have expired, and calls on the ledgers never lock the parent
 *	  nor expired partitions, so the drop waits for nobody and blocks nobody;
 *	  if its locks cannot be had within a moment (a pg_dump, a long query on
 *	  the parent), or this very session reads it (the statement that called
 *	  idem_maintain(), a cursor: relation_checks.c), it is left for the
 *	  next run.  With idempotency.key_memory,
 *	  the drop first writes the piece of the ledger's memory that remembers
 *	  its keys (memory.c), in the same subtransaction; a call that finds no
 *	  live row of its key then looks into the ended partition, and so waits
 *	  for this run's transaction, unless the partition's digest filter
 *	  (kept until the drop commits: filter_pool.c) rules its key out.  A
 *	  ledger distributed by Citus (citus.c) gets no piece: a piece is the
 *	  node's, mixing tenants, and Citus would not move it with them.  Its
 *	  ended partitions are kept instead until key_memory has passed since
 *	  their range ended, and then dropped: their rows stay in the tenants'
 *	  shards, which Citus moves, splits and isolates with the tenants, and
 *	  a call finds them there as it finds any ended partition (memory.c);
 *	- drop the pieces of the memory that key_memory has passed (memory.c);
 *	- the outbox's segments: a new one, and old ones dropped
 *	  (outbox_maintain.c);
 *	- with shared_preload_libraries, build the digest filters that live
 *	  partitions lack (after a restart, or writes by other means: filter.h).
 *
 * Runs are serialized per database by a lock taken without waiting: a run
 * that finds another one in progress returns at once.  The background
 * worker (worker.c) runs the same code as idem_maintain().
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/maintain.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "filter.h"
#include "lock_secret.h"
#include "keyhash.h"
#include "memory.h"
#include "outbox.h"
#include "relation_checks.h"
#include "stats.h"
#include "storage.h"
#include "streams.h"
#include "worker.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/inval.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idem_maintain);

/* How long a drop may wait for its locks before it is left for next time */
#define IDEM_DROP_LOCK_TIMEOUT_MS	100

static int	IdemMakePartitionsAhead(IdemLedger ledger, TimestampTz now,
									bool distributed);
static int	IdemDropExpiredPartitions(IdemLedger ledger, TimestampTz now,
									  bool distributed);

/*
 * IdemMaintainDatabase runs maintenance once in the current database, in
 * the current transaction: the work of idem_maintain(), shared with the
 * background worker.  Returns false, having done nothing, if another run is
 * in progress in this database; otherwise sets how many partitions were
 * made and dropped.  The outcome goes to the statistics (if preloaded),
 * also when the run fails.
 */
bool
IdemMaintainDatabase(int *created, int *dropped)
{
	LOCKTAG		tag;
	MemoryContext oldcxt = CurrentMemoryContext;

	*created = 0;
	*dropped = 0;

	IdemSetLedgerLockTag(&tag, 0, IDEM_LOCK_MAINTAIN);
	if (LockAcquire(&tag, ExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;

	PG_TRY();
	{
		TimestampTz now = GetCurrentTimestamp();
		int			ledger;

		for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
		{
			bool		coordinator;
			bool		distributed;

			if (!IdemLedgerDefined(ledger))
				continue;

			/*
			 * A ledger distributed by Citus (citus.c): its partitions are
			 * made and dropped on the coordinator, which Citus lets do it
			 * on every worker in the same transaction; a worker leaves
			 * them alone.
			 */
			distributed = IdemCitusDistributed(IdemLedgerParent(ledger, false),
											   &coordinator);
			if (distributed && !coordinator)
				continue;
			(void) IdemLedgerParent(ledger, true);
			(void) IdemUpgradeLedgerIndex(ledger);
			IdemEnsureExtensionDependency(ledger);
			IdemRestrictLedgerPrivileges(ledger);
			*created += IdemMakePartitionsAhead(ledger, now, distributed);
			*dropped += IdemDropExpiredPartitions(ledger, now, distributed);
		}
		*dropped += IdemMemoryForget(now, IDEM_DROP_LOCK_TIMEOUT_MS);
		IdemMemoryUpkeep();
		(void) IdemStreamsMaintain(now - (int64) idem_position_ttl * USECS_PER_SEC);
		{
			int			segs_created;
			int			segs_dropped;

			IdemOutboxMaintain(now, &segs_created, &segs_dropped);
			IdemTenantOutboxMaintain(&segs_created, &segs_dropped);
			*created += segs_created;
			*dropped += segs_dropped;
		}
		IdemRestrictLockSecretAcl();
		(void) IdemFilterBuildDatabase();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		IdemStatsMaintenanceRun(edata->message ? edata->message : "unknown error");
		FreeErrorData(edata);
		PG_RE_THROW();
	}
	PG_END_TRY();

	IdemStatsMaintenanceRun(NULL);
	return true;
}

/*
 * idem_maintain(OUT partitions_created int, OUT partitions_dropped int)
 */
Datum
idem_maintain(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	int			created;
	int			dropped;

	IdemCheckLibraryVersion();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	IdemCheckWritable("idem_maintain()");

	if (!IdemMaintainDatabase(&created, &dropped))
		ereport(NOTICE,
				(errmsg("idem_maintain() is already running in this database, skipping")));

	values[0] = Int32GetDatum(created);
	values[1] = Int32GetDatum(dropped);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * IdemCreateDistributedPartition makes one partition of a ledger
 * distributed by Citus, in a subtransaction: its DDL waits at most
 * IDEM_CITUS_DDL_LOCK_TIMEOUT_MS for its locks on every node (citus.c,
 * IdemCitusExecDdl), and one not had in time (a tenant's transaction
 * left open on a worker) leaves it, and the rest of the run's partitions
 * of the ledger, for the next run.  Returns false then.
 */
typedef struct IdemPartitionToMake
{
	IdemLedger	ledger;
	const IdemLayout *layout;
	int			lane_number;
	TimestampTz t;
} IdemPartitionToMake;

static void
IdemMakePartitionWork(void *arg)
{
	IdemPartitionToMake *p = (IdemPartitionToMake *) arg;

	(void) IdemCreatePartition(p->ledger, p->layout, p->lane_number, false,
							   p->t);
}

static bool
IdemCreateDistributedPartition(IdemLedger ledger, const IdemLayout *layout,
							   int lane_number, TimestampTz t)
{
	IdemPartitionToMake p = {ledger, layout, lane_number, t};
	char	   *why;

	if (IdemUnlessLockTimeout(IdemMakePartitionWork, &p, &why))
		return true;
	ereport(LOG,
			(errmsg("could not make a partition of distributed ledger \"%s.%s\" now, will retry",
					IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
			 errdetail_internal("%s", why)));
	pfree(why);
	return false;
}

/*
 * IdemMakePartitionsAhead makes the missing partitions of every lane of the
 * current layout up to the horizon.  Returns how many it made.
 */
static int
IdemMakePartitionsAhead(IdemLedger ledger, TimestampTz now, bool distributed)
{
	IdemLayout	layout;
	TimestampTz horizon;
	int			created = 0;
	int			lane_number;

	/*
	 * A ledger this session reads (the statement that runs maintenance, a
	 * cursor): ATTACH PARTITION would refuse its table (55006), failing the
	 * run.  Its partitions are made by the next run (or by a call that
	 * needs one).
	 */
	if (IdemRelationInUseHere(IdemLedgerParent(ledger, false)))
		return 0;

	IdemCurrentLayout(ledger, &layout);
	horizon = now + (int64) IdemLedgerDefaultTtl(ledger) * USECS_PER_SEC +
		idem_premake * layout.width_us;

	for (lane_number = 0; lane_number < layout.lanes; lane_number++)
	{
		int16		lane = IdemLaneValueOf(layout.lanes, lane_number, false);
		TimestampTz t = now;

		while (t < horizon)
		{
			IdemPartition p;

			CHECK_FOR_INTERRUPTS();
			if (!IdemLanePartitionAt(ledger, lane, t, &p))
			{
				if (distributed)
				{
					if (!IdemCreateDistributedPartition(ledger, &layout,
														lane_number, t))
						return created;
				}
				else
					(void) IdemCreatePartition(ledger, &layout, lane_number,
											   false, t);
				created++;
				AcceptInvalidationMessages();
				if (!IdemLanePartitionAt(ledger, lane, t, &p))
					elog(ERROR, "partition made for lane %d is not in the partition cache",
						 (int) lane);
			}
			t = p.upper;
		}
	}
	return created;
}

/*
 * IdemDropExpiredPartitions drops the partitions of a ledger whose range has
 * ended; of a ledger distributed by Citus ("distributed"), with
 * key_memory, only those whose range ended key_memory ago or longer.
 * Returns how many it dropped.
 */
static int
IdemDropExpiredPartitions(IdemLedger ledger, TimestampTz now,
						  bool distributed)
{
	List	   *partitions = IdemAllPartitions(ledger);
	ListCell   *lc;
	int			dropped = 0;
	TimestampTz since = now - (int64) idem_key_memory * USECS_PER_SEC;
	Oid			memory = IdemMemoryParent(ledger);
	bool		memory_in_use;

	/*
	 * A memory this session reads (the statement that runs maintenance, a
	 * cursor) takes no piece now: ATTACH PARTITION would refuse its table
	 * (55006).  The partitions whose keys it would take are left for the
	 * next run.
	 */
	memory_in_use = OidIsValid(memory) && IdemRelationInUseHere(memory);

	foreach(lc, partitions)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);
		bool		remember;

		CHECK_FOR_INTERRUPTS();

		/*
		 * With key_memory, the keys of a partition whose range ended less
		 * than key_memory ago go to the memory first; one that ended
		 * longer ago (left by earlier runs) has none left to remember.
		 */
		remember = idem_key_memory > 0 && p->upper > since;

		/*
		 * Distributed by Citus: the partition itself remembers its keys,
		 * in the tenants' shards, until key_memory has passed.
		 */
		if (distributed && remember)
			continue;
		if (p->upper <= now && !(remember && memory_in_use) &&
			IdemDropPartition(p->relid, IDEM_DROP_LOCK_TIMEOUT_MS, distributed,
							  remember ? IdemMemoryRemember : NULL,
							  &ledger))
			dropped++;
	}
	list_free_deep(partitions);
	return dropped;
}

/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory statistics: what the extension did, per database, since
 *	  the server started (or since idempotency.stats_reset()).
 *
 * Only when the library is in shared_preload_libraries.  Each database has
 * one entry in a small shared hash table: counters bumped with atomic adds
 * on the hot paths (a backend finds its database's entry once and keeps the
 * pointer; a database cannot be dropped while the backend is connected to
 * it), and the outcome of the last maintenance run under a spinlock.
 * Without preloading every counting call is a no-op and the view refuses.
 *
 * Counters count answers given, including those of transactions that
 * later rolled back, like pg_stat_statements does.
 *
 * The table has room for 256 databases; the rest share one overflow row.
 * The launcher forgets a dropped database's entry only if the entry was
 * made before the pg_database listing it compares with (see
 * IdemStatsForgetDatabases), so a database created meanwhile keeps its
 * counts.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "stats.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_stats_info);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/* Databases with an entry of their own; the rest share the overflow entry */
#define IDEM_STATS_MAX_DATABASES	256

/* Longest maintenance error message kept, in bytes */
#define IDEM_STATS_ERROR_LEN		256

/* The statistics of one database */
typedef struct IdemDbStats
{
	Oid			dboid;			/* hash key; InvalidOid for the overflow */
	pg_atomic_uint64 counters[IDEM_NUM_STATS];
	slock_t		mutex;			/* protects the fields below */
	int64		maintenance_runs;
	TimestampTz last_maintenance;	/* end of the last run, or 0 */
	TimestampTz last_error_at;	/* end of the last failed run, or 0 */
	bool		last_run_failed;
	char		last_error[IDEM_STATS_ERROR_LEN];
	bool		held_off;		/* the worker's last round did not maintain */
	char		held_off_reason[IDEM_STATS_ERROR_LEN];
	TimestampTz stats_reset;
	TimestampTz created_at;		/* when the entry was made */
} IdemDbStats;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* protects the hash table's structure */
	IdemDbStats overflow;		/* databases beyond the hash table's size */
} IdemStatsShared;

static IdemStatsShared *idem_stats = NULL;
static HTAB *idem_stats_hash = NULL;

/* This backend's entry, found on first use */
static IdemDbStats *my_db_stats = NULL;

static void IdemDbStatsInit(IdemDbStats *entry, TimestampTz now);
static IdemDbStats *IdemDbStatsFor(Oid dboid, bool create);
static void IdemDbStatsReset(IdemDbStats *entry, TimestampTz now);

/*
 * IdemStatsShmemSize returns the shared memory the statistics need.
 */
Size
IdemStatsShmemSize(void)
{
	return add_size(MAXALIGN(sizeof(IdemStatsShared)),
					hash_estimate_size(IDEM_STATS_MAX_DATABASES,
									   sizeof(IdemDbStats)));
}

/*
 * IdemStatsShmemInit attaches to (or, in the postmaster, creates) the
 * statistics in shared memory.  Called from the shmem_startup hook with
 * AddinShmemInitLock held.
 */
void
IdemStatsShmemInit(void)
{
	bool		found;
	HASHCTL		info;

	idem_stats = ShmemInitStruct("idempotency statistics",
								 sizeof(IdemStatsShared), &found);
	if (!found)
	{
		idem_stats->lock = &(GetNamedLWLockTranche(IDEM_LWLOCK_TRANCHE))[0].lock;
		idem_stats->overflow.dboid = InvalidOid;
		IdemDbStatsInit(&idem_stats->overflow, GetCurrentTimestamp());
	}

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(IdemDbStats);
	idem_stats_hash = ShmemInitHash("idempotency statistics by database",
									IDEM_STATS_MAX_DATABASES,
									IDEM_STATS_MAX_DATABASES,
									&info, HASH_ELEM | HASH_BLOBS);
}

static void
IdemDbStatsInit(IdemDbStats *entry, TimestampTz now)
{
	int			i;

	for (i = 0; i < IDEM_NUM_STATS; i++)
		pg_atomic_init_u64(&entry->counters[i], 0);
	SpinLockInit(&entry->mutex);
	IdemDbStatsReset(entry, now);
	entry->created_at = now;
}

/*
 * IdemDbStatsFor returns the entry of database "dboid", making it if
 * "create" (the overflow entry if the table is full), or NULL if there is
 * none and "create" is false.
 */
static IdemDbStats *
IdemDbStatsFor(Oid dboid, bool create)
{
	IdemDbStats *entry;
	bool		found;

	LWLockAcquire(idem_stats->lock, LW_SHARED);
	entry = hash_search(idem_stats_hash, &dboid, HASH_FIND, NULL);
	LWLockRelease(idem_stats->lock);
	if (entry != NULL || !create)
		return entry;

	LWLockAcquire(idem_stats->lock, LW_EXCLUSIVE);
	entry = hash_search(idem_stats_hash, &dboid, HASH_ENTER_NULL, &found);
	if (entry == NULL)
		entry = &idem_stats->overflow;
	else if (!found)
		IdemDbStatsInit(entry, GetCurrentTimestamp());
	LWLockRelease(idem_stats->lock);
	return entry;
}

/*
 * IdemStatsAdd adds "n" to counter "which" of the current database.
 */
void
IdemStatsAdd(IdemStat which, uint64 n)
{
	if (idem_stats == NULL || n == 0)
		return;
	if (my_db_stats == NULL)
	{
		if (!OidIsValid(MyDatabaseId))
			return;
		my_db_stats = IdemDbStatsFor(MyDatabaseId, true);
	}
	pg_atomic_fetch_add_u64(&my_db_stats->counters[which], n);
}

/*
 * IdemStatsMaintenanceRun records the end of a maintenance run in the
 * current database, with the error it failed with, if any.
 */
void
IdemStatsMaintenanceRun(const char *error)
{
	IdemDbStats *entry;
	TimestampTz now;

	if (idem_stats == NULL || !OidIsValid(MyDatabaseId))
		return;
	entry = IdemDbStatsFor(MyDatabaseId, true);
	now = GetCurrentTimestamp();

	SpinLockAcquire(&entry->mutex);
	entry->maintenance_runs++;
	entry->last_maintenance = now;
	entry->last_run_failed = (error != NULL);
	entry->held_off = false;
	if (error != NULL)
	{
		entry->last_error_at = now;
		strlcpy(entry->last_error, error, sizeof(entry->last_error));
	}
	SpinLockRelease(&entry->mutex);
}

/*
 * IdemStatsMaintenanceHeldOff records that the background worker's round
 * left the current database alone, and why (shown until a maintenance
 * run, the worker's or idem_maintain(), ends).
 */
void
IdemStatsMaintenanceHeldOff(const char *reason)
{
	IdemDbStats *entry;

	if (idem_stats == NULL || !OidIsValid(MyDatabaseId))
		return;
	entry = IdemDbStatsFor(MyDatabaseId, true);
	SpinLockAcquire(&entry->mutex);
	entry->held_off = true;
	strlcpy(entry->held_off_reason, reason, sizeof(entry->held_off_reason));
	SpinLockRelease(&entry->mutex);
}

/*
 * IdemStatsForgetDatabases removes the entries of databases that no longer
 * exist: every entry whose database is not among the "ndbs" oids of "dbs",
 * a list of pg_database read with a snapshot taken at "listed_at".  Called
 * by the launcher, which lists pg_database anyway.
 *
 * An entry made after "listed_at" is kept: its database may have been
 * created after the snapshot.  One made before it belongs to a database a
 * backend was connected to, committed before the snapshot, so absence from
 * the list means the database is gone, and so are its backends.
 */
void
IdemStatsForgetDatabases(const Oid *dbs, int ndbs, TimestampTz listed_at)
{
	HASH_SEQ_STATUS scan;
	IdemDbStats *entry;

	if (idem_stats == NULL)
		return;
	LWLockAcquire(idem_stats->lock, LW_EXCLUSIVE);
	hash_seq_init(&scan, idem_stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
	{
		bool		live = (entry->created_at >= listed_at);
		int			i;

		for (i = 0; i < ndbs && !live; i++)
			live = (dbs[i] == entry->dboid);
		if (!live)
			(void) hash_search(idem_stats_hash, &entry->dboid, HASH_REMOVE,
							   NULL);
	}
	LWLockRelease(idem_stats->lock);
}

/*
 * IdemStatsRequirePreload raises the error for a feature that needs the
 * library in shared_preload_libraries when it is not there.
 */
void
IdemStatsRequirePreload(const char *what)
{
	if (idem_stats == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s requires idempotency to be loaded via \"shared_preload_libraries\"",
						what),
				 errhint("Add idempotency to \"shared_preload_libraries\" in postgresql.conf and restart the server.")));
}

static void
IdemDbStatsReset(IdemDbStats *entry, TimestampTz now)
{
	int			i;

	for (i = 0; i < IDEM_NUM_STATS; i++)
		pg_atomic_write_u64(&entry->counters[i], 0);
	SpinLockAcquire(&entry->mutex);
	entry->maintenance_runs = 0;
	entry->last_maintenance = 0;
	entry->last_error_at = 0;
	entry->last_run_failed = false;
	entry->last_error[0] = '\0';
	entry->held_off = false;
	entry->held_off_reason[0] = '\0';
	entry->stats_reset = now;
	SpinLockRelease(&entry->mutex);
}

/*
 * idempotency.stats_info(OUT dboid oid, OUT claims bigint, ...)
 *
 * One row per database that has statistics, plus one with a NULL dboid for
 * the databases that did not fit in the table, if any were counted there.
 */
Datum
idem_stats_info(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	IdemDbStats *entry;
	bool		scan_done = false;

	IdemCheckLibraryVersion();
	IdemStatsRequirePreload("idempotency.stats");
	InitMaterializedSRF(fcinfo, 0);

	LWLockAcquire(idem_stats->lock, LW_SHARED);
	hash_seq_init(&scan, idem_stats_hash);
	for (;;)
	{
		Datum		values[IDEM_NUM_STATS + 8];
		bool		nulls[IDEM_NUM_STATS + 8] = {false};
		uint64		total = 0;
		int			i;
		int			col = 0;
		int64		maintenance_runs;
		TimestampTz last_maintenance;
		bool		last_run_failed;
		char		last_error[IDEM_STATS_ERROR_LEN];
		TimestampTz last_error_at;
		bool		held_off;
		char		held_off_reason[IDEM_STATS_ERROR_LEN];
		TimestampTz stats_reset;

		/* the databases, then the overflow entry */
		if (scan_done)
			break;
		entry = hash_seq_search(&scan);
		if (entry == NULL)
		{
			scan_done = true;
			entry = &idem_stats->overflow;
		}

		if (OidIsValid(entry->dboid))
			values[col++] = ObjectIdGetDatum(entry->dboid);
		else
			nulls[col++] = true;
		for (i = 0; i < IDEM_NUM_STATS_V2; i++)
		{
			uint64		v = pg_atomic_read_u64(&entry->counters[i]);

			total += v;
			/* the view of an extension not updated to 0.4.0 has fewer */
			if (i < IDEM_NUM_STATS_V1 || rsinfo->setDesc->natts > IDEM_NUM_STATS_V1 + 6)
				values[col++] = Int64GetDatum((int64) v);
		}

		/* copy under the spinlock, build the datums (which allocate) after */
		SpinLockAcquire(&entry->mutex);
		maintenance_runs = entry->maintenance_runs;
		last_maintenance = entry->last_maintenance;
		last_run_failed = entry->last_run_failed;
		memcpy(last_error, entry->last_error, sizeof(last_error));
		last_error_at = entry->last_error_at;
		held_off = entry->held_off;
		memcpy(held_off_reason, entry->held_off_reason, sizeof(held_off_reason));
		stats_reset = entry->stats_reset;
		SpinLockRelease(&entry->mutex);

		values[col++] = Int64GetDatum(maintenance_runs);
		total += maintenance_runs;
		values[col] = TimestampTzGetDatum(last_maintenance);
		nulls[col++] = (last_maintenance == 0);
		if (last_run_failed)
			values[col++] = CStringGetTextDatum(last_error);
		else
			nulls[col++] = true;
		values[col] = TimestampTzGetDatum(last_error_at);
		nulls[col++] = (last_error_at == 0);
		values[col++] = TimestampTzGetDatum(stats_reset);
		/* since 0.4.0: why the worker's last round held off, if it did */
		if (rsinfo->setDesc->natts > col)
		{
			if (held_off)
				values[col++] = CStringGetTextDatum(held_off_reason);
			else
				nulls[col++] = true;
		}

		/* the overflow row only when something landed there */
		if (!OidIsValid(entry->dboid) && total == 0)
			continue;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
							 values, nulls);
	}
	LWLockRelease(idem_stats->lock);

	return (Datum) 0;
}

/*
 * IdemStatsRead copies n counters from "first" on of database dboid into
 * out; false if the statistics are not in shared memory or the database
 * has none.  (Counters of other subsystems' views, such as the outbox's.)
 */
bool
IdemStatsRead(Oid dboid, IdemStat first, int n, uint64 *out)
{
	IdemDbStats *entry;
	int			i;

	Assert(first + n <= IDEM_NUM_STATS);
	if (idem_stats == NULL)
		return false;
	LWLockAcquire(idem_stats->lock, LW_SHARED);
	entry = hash_search(idem_stats_hash, &dboid, HASH_FIND, NULL);
	if (entry != NULL)
		for (i = 0; i < n; i++)
			out[i] = pg_atomic_read_u64(&entry->counters[first + i]);
	LWLockRelease(idem_stats->lock);
	return entry != NULL;
}

/*
 * idempotency.stats_reset() RETURNS void
 *
 * Zeroes the statistics of every database.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS scan;
	IdemDbStats *entry;
	TimestampTz now = GetCurrentTimestamp();

	IdemCheckLibraryVersion();
	IdemStatsRequirePreload("idempotency.stats_reset()");

	LWLockAcquire(idem_stats->lock, LW_SHARED);
	hash_seq_init(&scan, idem_stats_hash);
	while ((entry = hash_seq_search(&scan)) != NULL)
		IdemDbStatsReset(entry, now);
	IdemDbStatsReset(&idem_stats->overflow, now);
	LWLockRelease(idem_stats->lock);

	PG_RETURN_VOID();
}

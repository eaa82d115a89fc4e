/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  Hands-off maintenance: a launcher that, every idempotency.naptime,
 *	  runs idem_maintain()'s work in every database where the extension is
 *	  installed, through one short-lived worker per database.
 *
 * Only with shared_preload_libraries = 'idempotency'.
 *
 * The launcher is connected to the shared catalogs only.  Each round it
 * lists pg_database and, one database at a time, starts a worker connected
 * to that database and waits for it to finish.  The worker looks for the
 * extension and, if it is there, runs one maintenance round and exits.
 * Workers do not stay connected: a backend that lingers in a database
 * makes DROP DATABASE, ALTER DATABASE ... RENAME and CREATE DATABASE ...
 * TEMPLATE fail, and costs a process per database.
 *
 * Which databases:
 *	- every database that allows connections and is not a template is
 *	  probed when the launcher first sees it, so a new database is noticed
 *	  within one naptime;
 *	- one found without the extension is skipped from then on, until a
 *	  CREATE EXTENSION idempotency commits in any database: a utility hook
 *	  in every backend then wakes the launcher, which probes them again at
 *	  once;
 *	- one where a worker finds the extension gone (DROP EXTENSION) is
 *	  marked as without it on that round.
 *
 * Partitions a call needs that maintenance has not made yet (a ttl beyond
 * the horizon, or maintenance lagging) are made by a short-lived "partition
 * maker" worker in its own transaction, while the call waits: the call's
 * transaction then holds no DDL lock and keeps no key lock, so a long
 * transaction that needed a new partition does not hold up every other
 * call that needs one, nor maintenance.  A partition maker is a dynamic
 * background worker, which needs a free worker slot but not preloading.
 * When no slot is free, or the caller already holds DDL locks on the
 * ledger, the call makes the partition itself.
 *
 * The workers connect as the bootstrap superuser; PostgreSQL applies the
 * database's settings (ALTER DATABASE ... SET) to their connections, and
 * the database's owner need not be trusted, so every worker pins its own
 * settings first (privilege.c) and runs no SQL but the storage DDL.
 *
 * A database is left alone on a round while a superuser's pg_restore is
 * connected to it (see IdemRestoreInProgress; idempotency.stats says so),
 * and no launcher is registered in the binary-upgrade mode pg_upgrade runs
 * the new cluster in.
 *
 * The launcher and its workers start only once recovery has finished
 * (BgWorkerStart_RecoveryFinished): never on a standby, at once on a
 * promoted one.  The postmaster restarts the launcher 5 s after a crash;
 * the per-database workers are never restarted, the next round starts them
 * again.  SIGHUP makes the launcher reload the configuration; SIGTERM ends
 * the launcher and the workers at once.
 *
 * Bookkeeping: the launcher keeps a local hash of databases, each unknown,
 * with the extension or without; invalid databases (an interrupted DROP
 * DATABASE, DATCONNLIMIT_INVALID_DB) are skipped.  CREATE EXTENSION is
 * noticed by the utility hook, and at its commit a transaction callback
 * sets a flag in shared memory and the launcher's latch.  A worker reports
 * back through one shared-memory slot (one worker runs at a time).  A
 * worker's lock_timeout is pinned at 5 s, so that one database whose
 * ledger is locked does not hold up the others; the failed round goes to
 * the statistics.  A partition maker gets its request in bgw_extra; none is
 * used in parallel mode, outside regular backends, or when the caller
 * holds the ledger's creation lock or more than ACCESS SHARE on the
 * parent (the maker would wait for the caller, which waits for the maker:
 * a deadlock the lock manager cannot see).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/worker.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "filter.h"
#include "keyhash.h"
#include "outbox.h"
#include "privilege.h"
#include "stats.h"
#include "storage.h"
#include "worker.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "libpq/libpq-be.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* How long the postmaster waits before restarting a launcher that died */
#define IDEM_LAUNCHER_RESTART_SECS	5

/* What the launcher knows about the extension in one database */
typedef enum IdemDbState
{
	IDEM_DB_UNKNOWN = 0,		/* to be probed */
	IDEM_DB_PRESENT,			/* installed: maintained every round */
	IDEM_DB_ABSENT				/* not installed: skipped until a recheck */
} IdemDbState;

/* State shared by the launcher, its workers and every backend */
typedef struct IdemWorkerShared
{
	slock_t		mutex;			/* protects everything below */
	Latch	   *launcher_latch; /* NULL while no launcher runs */
	bool		recheck_requested;	/* probe databases known as ABSENT */
	Oid			worker_db;		/* database of the running worker */
	IdemDbState worker_found;	/* what that worker found */
} IdemWorkerShared;

/* One database in the launcher's list */
typedef struct IdemDbEntry
{
	Oid			dboid;			/* hash key */
	IdemDbState state;
	bool		listed;			/* seen in this round's pg_database scan */
	NameData	datname;
} IdemDbEntry;

static IdemWorkerShared *idem_worker_shared = NULL;
static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/* This backend ran CREATE EXTENSION idempotency in the current transaction */
static bool recheck_at_commit = false;

/* What a partition maker is to make (bgw_extra) */
typedef struct IdemPartitionRequest
{
	Oid			dboid;
	int			ledger;
	IdemLayout	layout;
	int			lane_number;
	bool		far;
	TimestampTz at;
} IdemPartitionRequest;

StaticAssertDecl(sizeof(IdemPartitionRequest) <= BGW_EXTRALEN,
				 "IdemPartitionRequest does not fit in bgw_extra");

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_worker_main(Datum main_arg);
PGDLLEXPORT void idem_partition_maker_main(Datum main_arg);
PGDLLEXPORT void idem_outbox_storage_maker_main(Datum main_arg);

static void IdemProcessUtility(PlannedStmt *pstmt, const char *queryString,
							   bool readOnlyTree,
							   ProcessUtilityContext context,
							   ParamListInfo params,
							   QueryEnvironment *queryEnv,
							   DestReceiver *dest, QueryCompletion *qc);
static void IdemWorkerXactCallback(XactEvent event, void *arg);
static void IdemLauncherDetach(int code, Datum arg);
static void IdemLauncherListDatabases(HTAB *dbs);
static void IdemLauncherRunWorker(IdemDbEntry *db);
static void IdemWorkerConnect(Oid dboid);
static void IdemNoteRestore(Node *parsetree, ProcessUtilityContext context);
static void IdemRestoreLockTag(LOCKTAG *tag);
static bool IdemRestoreInProgress(char *reason, Size reason_len);
static void IdemWorkerDefine(BackgroundWorker *worker, const char *function,
							 const char *type, int restart_time);

/*
 * IdemWorkerShmemSize returns the shared memory the workers need.
 */
Size
IdemWorkerShmemSize(void)
{
	return MAXALIGN(sizeof(IdemWorkerShared));
}

/*
 * IdemWorkerShmemInit attaches to (or creates) the workers' shared state.
 * Called from the shmem_startup hook with AddinShmemInitLock held.
 */
void
IdemWorkerShmemInit(void)
{
	bool		found;

	idem_worker_shared = ShmemInitStruct("idempotency workers",
										 sizeof(IdemWorkerShared), &found);
	if (!found)
	{
		SpinLockInit(&idem_worker_shared->mutex);
		idem_worker_shared->launcher_latch = NULL;
		idem_worker_shared->recheck_requested = false;
		idem_worker_shared->worker_db = InvalidOid;
		idem_worker_shared->worker_found = IDEM_DB_UNKNOWN;
	}
}

/*
 * IdemWorkerPreloadInit registers the launcher and the utility hook that
 * notices CREATE EXTENSION.  Called from _PG_init in the postmaster, while
 * shared_preload_libraries is processed.
 */
void
IdemWorkerPreloadInit(void)
{
	BackgroundWorker worker;

	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = IdemProcessUtility;

	/*
	 * pg_upgrade runs the new cluster in binary-upgrade mode while it
	 * restores the schema and before it copies the data files: maintenance
	 * then would drop partitions whose files are still to come.
	 */
	if (IsBinaryUpgrade)
		return;

	IdemWorkerDefine(&worker, "idem_launcher_main", "idempotency launcher",
					 IDEM_LAUNCHER_RESTART_SECS);
	RegisterBackgroundWorker(&worker);
}

/*
 * IdemProcessUtility notes a CREATE EXTENSION idempotency, so that the
 * launcher can be woken when it commits, and, once each statement has run,
 * whether this session is a restore (IdemNoteRestore).
 */
static void
IdemProcessUtility(PlannedStmt *pstmt, const char *queryString,
				   bool readOnlyTree, ProcessUtilityContext context,
				   ParamListInfo params, QueryEnvironment *queryEnv,
				   DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;

	if (IsA(parsetree, CreateExtensionStmt) &&
		strcmp(((CreateExtensionStmt *) parsetree)->extname, "idempotency") == 0)
	{
		static bool callback_registered = false;

		if (!callback_registered)
		{
			RegisterXactCallback(IdemWorkerXactCallback, NULL);
			callback_registered = true;
		}
		recheck_at_commit = true;
	}

	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);

	IdemNoteRestore(parsetree, context);
}

/*
 * IdemNoteRestore keeps this session's share of its database's restore
 * lock (IdemRestoreLockTag) while the session is a restore, which holds
 * the worker off the database (IdemRestoreInProgress): a session of a
 * superuser (its session user, whatever role it has set), named
 * "pg_restore" now, by a name it gave itself: sent as application_name
 * when it connected (pg_restore does, as does psql with
 * PGAPPNAME=pg_restore), or set by a top-level SET application_name of its
 * own.  Not a name the database's settings gave it (ALTER DATABASE ... SET
 * application_name, which the database's owner may set, applies to every
 * connection that sends no name of its own), nor one code it ran set (a
 * function's SET clause or set_config()).  Looked at after each utility
 * statement the session runs: pg_restore's first statements are SETs, run
 * before it makes anything.  A session lock, taken without waiting (if the
 * worker is looking at that moment, the next statement takes it); released
 * when the session stops being a restore, or ends.
 */
static void
IdemNoteRestore(Node *parsetree, ProcessUtilityContext context)
{
	static bool named_by_session = false;
	static bool restore_lock_held = false;
	bool		restoring;
	LOCKTAG		tag;

	if (!IsUnderPostmaster || MyBackendType != B_BACKEND ||
		!OidIsValid(MyDatabaseId) || RecoveryInProgress())
		return;

	/* SET or RESET application_name (or RESET ALL) by the session itself */
	if (context == PROCESS_UTILITY_TOPLEVEL && IsA(parsetree, VariableSetStmt))
	{
		VariableSetStmt *stmt = (VariableSetStmt *) parsetree;

		if (stmt->kind == VAR_RESET_ALL ||
			(stmt->name != NULL &&
			 pg_strcasecmp(stmt->name, "application_name") == 0))
			named_by_session = stmt->kind != VAR_RESET_ALL &&
				stmt->kind != VAR_RESET && stmt->kind != VAR_SET_DEFAULT &&
				application_name != NULL &&
				strcmp(application_name, "pg_restore") == 0;
	}

	restoring = application_name != NULL &&
		strcmp(application_name, "pg_restore") == 0 &&
		(named_by_session ||
		 (MyProcPort != NULL && MyProcPort->application_name != NULL &&
		  strcmp(MyProcPort->application_name, "pg_restore") == 0)) &&
		superuser_arg(GetSessionUserId());
	if (restoring == restore_lock_held)
		return;
	IdemRestoreLockTag(&tag);
	if (restoring)
		restore_lock_held =
			LockAcquire(&tag, ShareLock, true, true) != LOCKACQUIRE_NOT_AVAIL;
	else
	{
		LockRelease(&tag, ShareLock, true);
		restore_lock_held = false;
	}
}

/* the lock a restore of this database holds (IdemNoteRestore) */
static void
IdemRestoreLockTag(LOCKTAG *tag)
{
	IdemSetLedgerLockTag(tag, 0, IDEM_LOCK_RESTORE);
}

/*
 * IdemWorkerXactCallback wakes the launcher once a transaction that ran
 * CREATE EXTENSION idempotency has committed.  (One that is prepared is
 * noticed when the launcher next probes the database: at its restart, or
 * at the next CREATE EXTENSION anywhere.)
 */
static void
IdemWorkerXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			if (recheck_at_commit && idem_worker_shared != NULL)
			{
				Latch	   *latch;

				SpinLockAcquire(&idem_worker_shared->mutex);
				idem_worker_shared->recheck_requested = true;
				latch = idem_worker_shared->launcher_latch;
				SpinLockRelease(&idem_worker_shared->mutex);
				if (latch != NULL)
					SetLatch(latch);
			}
			recheck_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			recheck_at_commit = false;
			break;
		default:
			break;
	}
}

/*
 * idem_launcher_main is the launcher's entry point.
 */
void
idem_launcher_main(Datum main_arg)
{
	HTAB	   *dbs;
	HASHCTL		info;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* shared catalogs only */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	SpinLockAcquire(&idem_worker_shared->mutex);
	idem_worker_shared->launcher_latch = MyLatch;
	SpinLockRelease(&idem_worker_shared->mutex);
	before_shmem_exit(IdemLauncherDetach, (Datum) 0);

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(IdemDbEntry);
	info.hcxt = TopMemoryContext;
	dbs = hash_create("idempotency launcher databases", 64, &info,
					  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	ereport(LOG,
			(errmsg("idempotency launcher started")));

	for (;;)
	{
		HASH_SEQ_STATUS scan;
		IdemDbEntry *db;
		bool		recheck;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		SpinLockAcquire(&idem_worker_shared->mutex);
		recheck = idem_worker_shared->recheck_requested;
		idem_worker_shared->recheck_requested = false;
		SpinLockRelease(&idem_worker_shared->mutex);

		IdemLauncherListDatabases(dbs);

		hash_seq_init(&scan, dbs);
		while ((db = hash_seq_search(&scan)) != NULL)
		{
			if (recheck && db->state == IDEM_DB_ABSENT)
				db->state = IDEM_DB_UNKNOWN;
			if (db->state != IDEM_DB_ABSENT)
				IdemLauncherRunWorker(db);
		}

		/* a CREATE EXTENSION during the round needs no nap */
		SpinLockAcquire(&idem_worker_shared->mutex);
		recheck = idem_worker_shared->recheck_requested;
		SpinLockRelease(&idem_worker_shared->mutex);
		if (recheck)
			continue;

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) idem_naptime * 1000L,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* before_shmem_exit callback: nobody is to wake this launcher any more */
static void
IdemLauncherDetach(int code, Datum arg)
{
	SpinLockAcquire(&idem_worker_shared->mutex);
	idem_worker_shared->launcher_latch = NULL;
	SpinLockRelease(&idem_worker_shared->mutex);
}

/*
 * IdemLauncherListDatabases brings the launcher's list of databases up to
 * date with pg_database: adds new ones as to be probed, forgets dropped
 * ones (also in the statistics).
 */
static void
IdemLauncherListDatabases(HTAB *dbs)
{
	HASH_SEQ_STATUS scan;
	IdemDbEntry *db;
	TimestampTz listed_at;
	Relation	rel;
	TableScanDesc tscan;
	HeapTuple	tup;
	Oid		   *all;
	int			nall = 0;
	int			maxall = 64;

	hash_seq_init(&scan, dbs);
	while ((db = hash_seq_search(&scan)) != NULL)
		db->listed = false;

	/* before the snapshot: see IdemStatsForgetDatabases */
	listed_at = GetCurrentTimestamp();

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	all = palloc(maxall * sizeof(Oid));
	rel = table_open(DatabaseRelationId, AccessShareLock);
	tscan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(tscan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tup);
		bool		found;

		if (nall == maxall)
		{
			maxall *= 2;
			all = repalloc(all, maxall * sizeof(Oid));
		}
		all[nall++] = form->oid;

		if (!form->datallowconn || form->datistemplate)
			continue;
#ifdef DATCONNLIMIT_INVALID_DB
		if (form->datconnlimit == DATCONNLIMIT_INVALID_DB)
			continue;			/* partly dropped */
#endif
		db = hash_search(dbs, &form->oid, HASH_ENTER, &found);
		if (!found)
			db->state = IDEM_DB_UNKNOWN;
		db->listed = true;
		db->datname = form->datname;
	}
	table_endscan(tscan);
	table_close(rel, AccessShareLock);

	IdemStatsForgetDatabases(all, nall, listed_at);
	IdemFilterForgetDatabases(all, nall, listed_at);
	CommitTransactionCommand();

	hash_seq_init(&scan, dbs);
	while ((db = hash_seq_search(&scan)) != NULL)
	{
		if (!db->listed)
			(void) hash_search(dbs, &db->dboid, HASH_REMOVE, NULL);
	}
}

/*
 * IdemLauncherRunWorker runs one worker in database "db" and waits for it
 * to exit; records whether it found the extension there.
 */
static void
IdemLauncherRunWorker(IdemDbEntry *db)
{
	static bool warned = false;
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	IdemDbState found;

	IdemWorkerDefine(&worker, "idem_worker_main", "idempotency worker",
					 BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN,
			 "idempotency worker for database %u", db->dboid);
	worker.bgw_main_arg = ObjectIdGetDatum(db->dboid);
	worker.bgw_notify_pid = MyProcPid;

	SpinLockAcquire(&idem_worker_shared->mutex);
	idem_worker_shared->worker_db = db->dboid;
	idem_worker_shared->worker_found = IDEM_DB_UNKNOWN;
	SpinLockRelease(&idem_worker_shared->mutex);

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		/* retried next round; say so once, not every naptime */
		if (!warned)
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("idempotency launcher could not start a worker"),
					 errdetail("All background worker slots are in use."),
					 errhint("Raise \"max_worker_processes\".")));
		warned = true;
		return;
	}
	warned = false;

	if (WaitForBackgroundWorkerShutdown(handle) == BGWH_POSTMASTER_DIED)
		proc_exit(1);
	pfree(handle);

	SpinLockAcquire(&idem_worker_shared->mutex);
	found = idem_worker_shared->worker_found;
	idem_worker_shared->worker_db = InvalidOid;
	SpinLockRelease(&idem_worker_shared->mutex);

	/* a worker that failed before looking leaves the state as it was */
	if (found == IDEM_DB_UNKNOWN || found == db->state)
		return;
	if (found == IDEM_DB_PRESENT)
		ereport(LOG,
				(errmsg("idempotency launcher: maintaining database \"%s\"",
						NameStr(db->datname))));
	else if (db->state == IDEM_DB_PRESENT)
		ereport(LOG,
				(errmsg("idempotency launcher: database \"%s\" no longer has the extension, not maintaining it",
						NameStr(db->datname))));
	db->state = found;
}

/*
 * idem_worker_main is a per-database worker's entry point: one maintenance
 * round in database main_arg, if the extension is installed there.
 */
void
idem_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	bool		present;
	char		reason[128];

	IdemWorkerConnect(dboid);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idempotency maintenance");

	present = OidIsValid(get_extension_oid("idempotency", true));

	SpinLockAcquire(&idem_worker_shared->mutex);
	if (idem_worker_shared->worker_db == dboid)
		idem_worker_shared->worker_found =
			present ? IDEM_DB_PRESENT : IDEM_DB_ABSENT;
	SpinLockRelease(&idem_worker_shared->mutex);

	/* DROP EXTENSION: its filters go with it */
	if (!present)
		IdemFilterForgetDatabase();

	if (present && !RecoveryInProgress() &&
		IdemRestoreInProgress(reason, sizeof(reason)))
	{
		ereport(LOG,
				(errmsg("idempotency worker: pg_restore is connected to database \"%s\", not maintaining it this round",
						get_database_name(dboid)),
				 errdetail("%s", reason)));
		IdemStatsMaintenanceHeldOff(reason);
	}
	else if (present && !RecoveryInProgress())
	{
		int			created;
		int			dropped;

		if (IdemMaintainDatabase(&created, &dropped))
			ereport(DEBUG1,
					(errmsg_internal("idempotency worker: %d partitions made, %d dropped",
									 created, dropped)));
	}

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}

/*
 * IdemRestoreInProgress: is pg_restore restoring this database?  While it
 * restores the ledgers, maintenance must not touch them: it would make the
 * tables pg_restore is about to create, or partitions that overlap those
 * it is about to attach, or drop ended partitions before their rows are
 * loaded.  A restore is a superuser's session that named itself
 * "pg_restore" and holds the database's restore lock (IdemNoteRestore):
 * the worker cannot take it.  Only a superuser can restore the ledgers
 * (the extension is superuser = true, and its tables are granted to
 * nobody), so no other role may hold maintenance off, and a name the
 * database's owner gave every session (ALTER DATABASE ... SET
 * application_name) is no restore.  If there is one, sets "reason" to
 * what the statistics show: the session, from the activity table.  No SQL
 * runs here with the database's settings.
 */
static bool
IdemRestoreInProgress(char *reason, Size reason_len)
{
	LOCKTAG		tag;
	int			nbackends;
	int			i;

	IdemRestoreLockTag(&tag);
	if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
	{
		LockRelease(&tag, ExclusiveLock, false);
		return false;
	}

	/* which session: a superuser's named pg_restore, as the lock's holders are */
	strlcpy(reason, "pg_restore is connected", reason_len);
	nbackends = pgstat_fetch_stat_numbackends();
	for (i = 1; i <= nbackends; i++)
	{
		LocalPgBackendStatus *local = IdemLocalBackendStatus(i);
		PgBackendStatus *be;
		const char *role;

		if (local == NULL)
			continue;
		be = &local->backendStatus;
		if (be->st_backendType != B_BACKEND ||
			be->st_databaseid != MyDatabaseId ||
			be->st_appname == NULL ||
			strcmp(be->st_appname, "pg_restore") != 0 ||
			!superuser_arg(be->st_userid))
			continue;
		role = GetUserNameFromId(be->st_userid, true);
		snprintf(reason, reason_len,
				 "pg_restore is connected (process %d, role %s)",
				 be->st_procpid, role ? role : "?");
		break;
	}
	return true;
}

/*
 * IdemWorkerDefine fills in what every worker of this library has in
 * common: shared memory and a database connection, started once recovery
 * has finished, entry point "function" in this library, type (and, until
 * the caller sets another, name) "type".
 */
static void
IdemWorkerDefine(BackgroundWorker *worker, const char *function,
				 const char *type, int restart_time)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS |
		BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = restart_time;
	strlcpy(worker->bgw_library_name, "idempotency", BGW_MAXLEN);
	strlcpy(worker->bgw_function_name, function, BGW_MAXLEN);
	strlcpy(worker->bgw_name, type, BGW_MAXLEN);
	strlcpy(worker->bgw_type, type, BGW_MAXLEN);
}

/*
 * IdemWorkerConnect sets up a per-database worker: signals, a connection to
 * database "dboid" as the bootstrap superuser, and settings of its own in
 * place of the database's (which its owner chose, and which PostgreSQL
 * applies to every connection): see IdemPinWorkerSettings.
 */
static void
IdemWorkerConnect(Oid dboid)
{
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	IdemPinWorkerSettings();
}

/*
 * IdemWorkerMakePartition has a partition maker make the partition of lane
 * "lane_number" of "layout" (a far one if "far") containing "at" in its own
 * transaction, and
 * waits for it.  Returns true if that partition now exists (committed);
 * false if a worker cannot be used here or did not make it, in which case
 * the caller makes it itself.
 *
 * Not used when this backend already holds the ledger's creation lock or a
 * lock on its parent table stronger than ACCESS SHARE (it made a partition
 * itself earlier in the transaction, or ran idem_maintain()): the worker
 * would wait for this transaction, which waits for the worker.
 */
bool
IdemWorkerMakePartition(IdemLedger ledger, const IdemLayout *layout,
						int lane_number, bool far, TimestampTz at)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	IdemPartitionRequest req;
	Oid			parent;
	IdemPartition p;
	int16		lane = IdemLaneValueOf(layout->lanes, lane_number, false);

	if (far)
		lane = IdemFarLane(lane);
	if (MyBackendType != B_BACKEND || IsInParallelMode() || IsBinaryUpgrade)
		return false;

	if (IdemPartitionDDLHeld(ledger))
		return false;
	parent = IdemLedgerParent(ledger, false);
	if (!OidIsValid(parent) ||
		IdemRelationOidLockedByMe(parent, RowShareLock, true))
		return false;

	memset(&req, 0, sizeof(req));
	req.dboid = MyDatabaseId;
	req.ledger = (int) ledger;
	req.layout = *layout;
	req.lane_number = lane_number;
	req.far = far;
	req.at = at;

	IdemWorkerDefine(&worker, "idem_partition_maker_main",
					 "idempotency partition maker", BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN,
			 "idempotency partition maker for database %u", MyDatabaseId);
	memcpy(worker.bgw_extra, &req, sizeof(req));
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return false;
	if (WaitForBackgroundWorkerShutdown(handle) != BGWH_STOPPED)
		return false;
	pfree(handle);

	AcceptInvalidationMessages();
	return IdemLanePartitionAt(ledger, lane, at, &p);
}

/*
 * idem_partition_maker_main is a partition maker's entry point: make the
 * partition described in bgw_extra, commit, exit.
 */
void
idem_partition_maker_main(Datum main_arg)
{
	IdemPartitionRequest req;

	memcpy(&req, MyBgworkerEntry->bgw_extra, sizeof(req));
	if (req.ledger < 0 || req.ledger >= IDEM_NUM_LEDGERS ||
		req.layout.lanes < 1 || req.layout.lanes > IDEM_MAX_LANES ||
		req.lane_number < 0 || req.lane_number >= req.layout.lanes ||
		req.layout.interval_us <= 0 ||
		req.layout.width_us != req.layout.lanes * req.layout.interval_us ||
		TIMESTAMP_NOT_FINITE(req.at))
		elog(ERROR, "invalid partition request");
	IdemWorkerConnect(req.dboid);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idempotency: making a partition");

	if (OidIsValid(get_extension_oid("idempotency", true)))
		(void) IdemCreatePartition((IdemLedger) req.ledger, &req.layout,
								   req.lane_number, req.far, req.at);

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}

/*
 * IdemWorkerMakeOutboxStorage has a storage maker make the outbox's events
 * table and its first segment in its own transaction, and waits for it, so
 * that the first publisher of a database holds nothing (the storage lock,
 * the new tables' catalog entries) that other roles' publishers would wait
 * for until its transaction ends.  Returns false if a worker cannot be used
 * here or could not be started; the caller then looks again, and makes the
 * storage itself if it is still not there.  The caller makes sure that the
 * worker would not wait for its transaction (outbox_storage.c).
 */
bool
IdemWorkerMakeOutboxStorage(void)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	if (MyBackendType != B_BACKEND || IsInParallelMode() || IsBinaryUpgrade)
		return false;

	IdemWorkerDefine(&worker, "idem_outbox_storage_maker_main",
					 "idempotency outbox storage maker", BGW_NEVER_RESTART);
	snprintf(worker.bgw_name, BGW_MAXLEN,
			 "idempotency outbox storage maker for database %u", MyDatabaseId);
	worker.bgw_main_arg = ObjectIdGetDatum(MyDatabaseId);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return false;
	if (WaitForBackgroundWorkerShutdown(handle) != BGWH_STOPPED)
		return false;
	pfree(handle);

	AcceptInvalidationMessages();
	return true;
}

/*
 * idem_outbox_storage_maker_main is a storage maker's entry point: make the
 * outbox's events table and first segment if they are missing, commit,
 * exit.
 */
void
idem_outbox_storage_maker_main(Datum main_arg)
{
	IdemWorkerConnect(DatumGetObjectId(main_arg));

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idempotency: making the outbox's storage");

	if (OidIsValid(get_extension_oid("idempotency", true)) &&
		OidIsValid(IdemOutboxMemberRelid("outbox_event_seq")))
		(void) IdemOutboxParent(true);

	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	proc_exit(0);
}

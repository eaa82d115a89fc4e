/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module initialization and the extension's settings.
 *
 * _PG_init defines the settings and delegates to the subsystems.  The
 * extension works without shared_preload_libraries; preloaded, it also
 * reserves shared memory for the statistics (stats.c) and the background
 * workers (worker.c) and the digest filters (filter_pool.c), and registers
 * the launcher.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/idempotency.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "filter.h"
#include "keyed_rows.h"
#include "keys.h"
#include "lock_secret.h"
#include "memory.h"
#include "outbox.h"
#include "stats.h"
#include "storage.h"
#include "wait.h"
#include "worker.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

IDEM_MODULE_MAGIC;

/* Settings; durations in seconds */
int			idem_message_ttl = 7 * SECS_PER_DAY;
int			idem_key_ttl = SECS_PER_DAY;
int			idem_max_ttl = 30 * SECS_PER_DAY;
int			idem_partition_interval = SECS_PER_DAY;
int			idem_premake = 1;
int			idem_max_key_length = 255;
int			idem_naptime = 60;
int			idem_wait_timeout = 0;
int			idem_max_response_bytes = 1024 * 1024;
int			idem_position_ttl = 30 * SECS_PER_DAY;
int			idem_outbox_retention = SECS_PER_DAY;
int			idem_outbox_max_age = 7 * SECS_PER_DAY;
bool		idem_outbox_logical = false;

void		_PG_init(void);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void IdemShmemRequest(void);
static void IdemShmemStartup(void);

/*
 * _PG_init defines the settings and initializes the subsystems.
 */
void
_PG_init(void)
{
	DefineCustomIntVariable("idempotency.message_ttl",
							gettext_noop("Sets how long a consumed message id is remembered when idem_consume_message() gets no ttl."),
							gettext_noop("It also sizes the partitions of the message ledger."),
							&idem_message_ttl,
							7 * SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.key_ttl",
							gettext_noop("Sets how long an idempotency key lives when idem_claim() gets no ttl."),
							gettext_noop("It also sizes the partitions of the key ledger."),
							&idem_key_ttl,
							SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_ttl",
							gettext_noop("Sets the longest ttl a key or message may be given."),
							NULL,
							&idem_max_ttl,
							30 * SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.partition_interval",
							gettext_noop("Sets how often a partition of each ledger becomes droppable."),
							gettext_noop("Applies to partitions made from now on; existing partitions keep their ranges."),
							&idem_partition_interval,
							SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.premake",
							gettext_noop("Sets how many partitions per lane are made ahead beyond the default ttl."),
							NULL,
							&idem_premake,
							1, 0, 64,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_key_length",
							gettext_noop("Sets the longest key, message id, consumer or scope accepted, in bytes."),
							NULL,
							&idem_max_key_length,
							255, 1, 1024 * 1024,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.naptime",
							gettext_noop("Sets how long the background worker sleeps between maintenance rounds."),
							gettext_noop("Only used when idempotency is in shared_preload_libraries."),
							&idem_naptime,
							60, 1, SECS_PER_DAY,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.wait_timeout",
							gettext_noop("Sets how long idem_claim(..., wait => true) waits for the holder of a two-phase claim."),
							gettext_noop("The wait ends when the holder completes or releases the key or its lease lapses; 0 answers in_progress at once."),
							&idem_wait_timeout,
							0, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_response_bytes",
							gettext_noop("Sets the most one idempotency key may store: response body, headers and kept request."),
							NULL,
							&idem_max_response_bytes,
							1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.position_ttl",
							gettext_noop("Sets how long a stream position or producer sequence is kept once unused."),
							gettext_noop("Maintenance deletes those not read or moved for this long."),
							&idem_position_ttl,
							30 * SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.outbox_retention",
							gettext_noop("Sets how long the outbox keeps events after every relay of their topic acknowledged them."),
							gettext_noop("Maintenance drops a segment of the outbox once this has passed since it stopped taking events and every relay acknowledged its events."),
							&idem_outbox_retention,
							SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.outbox_max_age",
							gettext_noop("Sets how long the outbox keeps events that a relay has not acknowledged."),
							gettext_noop("Older events are dropped whatever the relays; each relay that lost some is told so by its next call."),
							&idem_outbox_max_age,
							7 * SECS_PER_DAY, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.outbox_logical",
							 gettext_noop("Also writes each published event as a transactional logical decoding message."),
							 gettext_noop("Prefix \"idempotency.outbox\"; decoding plugins see it when the publishing transaction commits."),
							 &idem_outbox_logical,
							 false,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	IdemMemoryDefineSettings();

	/* a server-start setting: defined only while preloading */
	if (process_shared_preload_libraries_in_progress)
		IdemFilterDefineSettings();

	MarkGUCPrefixReserved("idempotency");

	IdemStorageInit();
	IdemMemoryInit();
	IdemOwnClaimsInit();
	IdemKeyedRowsInit();
	IdemLibraryVersionInit();
	IdemLockSecretInit();
	IdemWaitInit();
	IdemOutboxStorageInit();
	IdemOutboxTransferInit();

	if (process_shared_preload_libraries_in_progress)
	{
		prev_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = IdemShmemRequest;
		prev_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = IdemShmemStartup;
		IdemWorkerPreloadInit();
		IdemFilterPreloadInit();
	}
}

/*
 * IdemShmemRequest reserves the shared memory and the lock of the
 * statistics and the workers.
 */
static void
IdemShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(add_size(add_size(IdemStatsShmemSize(),
													  IdemWorkerShmemSize()),
											 IdemWaitShmemSize()),
									IdemFilterShmemSize()));
	/* [0] statistics, [1] filters */
	RequestNamedLWLockTranche(IDEM_LWLOCK_TRANCHE, 2);
}

/*
 * IdemShmemStartup creates or attaches to the shared state.
 */
static void
IdemShmemStartup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	IdemStatsShmemInit();
	IdemWorkerShmemInit();
	IdemWaitShmemInit();
	IdemFilterShmemInit();
	LWLockRelease(AddinShmemInitLock);
}

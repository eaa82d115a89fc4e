/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The background workers (worker.c) and the maintenance runs they and
 *	  idem_maintain() make (maintain.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/worker.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_WORKER_H
#define IDEMPOTENCY_WORKER_H

#include "idempotency.h"
#include "storage.h"

/* The background workers (worker.c); only with shared_preload_libraries */
extern void IdemWorkerPreloadInit(void);
extern bool IdemWorkerMakePartition(IdemLedger ledger, const IdemLayout *layout,
									int lane_number, bool far, TimestampTz at);
extern bool IdemWorkerMakeOutboxStorage(void);
extern Size IdemWorkerShmemSize(void);
extern void IdemWorkerShmemInit(void);

/* One maintenance run in this database (maintain.c) */
extern bool IdemMaintainDatabase(int *created, int *dropped);

#endif							/* IDEMPOTENCY_WORKER_H */

/*-------------------------------------------------------------------------
 *
 * filter.h
 *	  Digest filters of the partitions (filter.c); only with
 *	  shared_preload_libraries.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/filter.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_FILTER_H
#define IDEMPOTENCY_FILTER_H

#include "idempotency.h"

/* idempotency.filter_memory, and what _PG_init and the shmem hooks call */
extern int	idem_filter_memory;
extern void IdemFilterDefineSettings(void);
extern void IdemFilterPreloadInit(void);
extern Size IdemFilterShmemSize(void);
extern void IdemFilterShmemInit(void);

/* What the protocol (probe.c) and the storage (storage.c) call */
extern bool IdemFilterRulesOut(Oid relid, int16 lane, Oid role,
							   const pg_uuid_t *digest);
extern void IdemFilterAdd(Oid relid, int16 lane, Oid role,
						  const pg_uuid_t *digest);
extern void IdemFilterCreated(IdemLedger ledger, Oid relid, int16 lane);
extern void IdemFilterForget(Oid relid);

/* The library's own DDL, which the hooks let through (privilege.c) */
extern void IdemFilterOwnSql(const char *sql);

/* Building and freeing them (maintain.c, worker.c) */
extern int	IdemFilterBuildDatabase(void);
extern void IdemFilterForgetDatabase(void);
extern void IdemFilterForgetDatabases(const Oid *dbs, int ndbs,
									  TimestampTz listed_at);

#endif							/* IDEMPOTENCY_FILTER_H */

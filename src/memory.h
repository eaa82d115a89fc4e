/*-------------------------------------------------------------------------
 *
 * memory.h
 *	  Expired keys and message ids remembered (memory.c): when maintenance
 *	  drops an expired ledger partition, the (role, digest) pairs of its
 *	  rows are kept for idempotency.key_memory more, packed in sorted chunks
 *	  in a piece of the ledger's memory table; idem_claim() on a remembered
 *	  key answers "expired", idem_consume_message() false.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/memory.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_MEMORY_H
#define IDEMPOTENCY_MEMORY_H

#include "idempotency.h"
#include "protocol.h"
#include "storage.h"
#include "transfer.h"

#include "executor/tuptable.h"

/* idempotency.key_memory, in seconds (0: nothing is remembered) */
extern int	idem_key_memory;
extern void IdemMemoryDefineSettings(void);
extern void IdemMemoryInit(void);

/* What the protocol (probe.c) calls */
extern bool IdemMemoryRowRemembered(TupleTableSlot *slot,
									const IdemPartition *part,
									TimestampTz now);
extern void IdemMemoryProbe(IdemOp *op);

/* What the digest filters' hooks (filter_hooks.c) watch besides the ledgers */
extern bool IdemIsMemoryRelation(Oid relid);

/* Maintenance (maintain.c): remembering a partition, forgetting pieces */
extern void IdemMemoryRemember(Oid relid, int lock_timeout_ms, void *arg);
extern int	IdemMemoryForget(TimestampTz now, int lock_timeout_ms);
extern void IdemMemoryUpkeep(void);
extern int	IdemMemoryBuildFilters(void);

/*
 * Moving a tenant's memory (memory_transfer.c): the pairs the pieces
 * remember, and a pair imported from another node, kept in a piece of
 * imported keys, lane IDEM_MEMORY_IMPORT_LANE (a value no ledger lane
 * takes: no layout has 127 lanes).
 */
#define IDEM_MEMORY_IMPORT_LANE		((int16) 0xFF7E)
typedef void (*IdemMemoryPairFn) (Oid role, const pg_uuid_t *digest,
								  TimestampTz expired_by, void *arg);
extern bool IdemMemoryRecalls(IdemLedger ledger, Oid role,
							  const IdemDigest *digest, TimestampTz now);
extern Oid	IdemMemoryParent(IdemLedger ledger);
extern List *IdemMemoryPieces(IdemLedger ledger);
extern void IdemMemoryForEach(IdemLedger ledger, TimestampTz since,
							  IdemMemoryPairFn fn, void *arg);
extern IdemImportOutcome IdemMemoryImport(IdemLedger ledger, Oid role,
										  const pg_uuid_t *digest,
										  TimestampTz expired_by);

#endif							/* IDEMPOTENCY_MEMORY_H */

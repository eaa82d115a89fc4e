/*-------------------------------------------------------------------------
 *
 * transfer.h
 *	  Moving ledger rows between nodes (transfer.c): reading the records
 *	  that idempotency.import_*() take, and the writers of each ledger
 *	  that import them.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/transfer.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_TRANSFER_H
#define IDEMPOTENCY_TRANSFER_H

#include "idempotency.h"

/* What importing a row did (idempotency.import_key() and the others) */
typedef enum IdemImportOutcome
{
	IDEM_IMPORT_INSERTED,		/* no live local row: the row was added */
	IDEM_IMPORT_REPLACED,		/* it replaced an older local version */
	IDEM_IMPORT_KEPT,			/* the local row is as new: left as it was */
	IDEM_IMPORT_EXPIRED			/* it has expired: nothing to do */
} IdemImportOutcome;

/* Reading imported records (transfer.c), for streams.c too */
extern void IdemDeformRecord(FunctionCallInfo fcinfo, int natts, int min_natts,
							 const Oid *types, const char *typname,
							 Datum *values, bool *nulls);
extern Oid	IdemImportRole(Datum name, bool isnull);
extern void IdemRequireField(bool isnull, const char *field);
extern text *IdemImportOutcomeText(IdemImportOutcome outcome);

/* Writing an imported row: into the key ledger (keys.c) */
extern IdemImportOutcome IdemImportKey(Oid role, const pg_uuid_t *digest,
									   Datum *values, bool *nulls);

/*
 * ... and into the processed-message ledger (consume.c), which records a
 * consumed message id the same way (the cache: protocol.h)
 */
struct IdemOpenCache;
extern bool IdemRecordMessage(Oid role, const IdemDigest *digest,
							  const Interval *ttl, TimestampTz expires_at,
							  struct IdemOpenCache *cache);

#endif							/* IDEMPOTENCY_TRANSFER_H */

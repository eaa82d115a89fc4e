/*-------------------------------------------------------------------------
 *
 * citus.h
 *	  Ledgers distributed by Citus (citus.c): routing a key to the local
 *	  shard of the ledger that holds its tenant, for a ledger distributed
 *	  by idempotency.citus_distribute() (doc/scale-out.md, "Citus' own
 *	  shard operations"), and a stream position or a producer sequence to
 *	  the local shard of idempotency.tenant_positions or tenant_sequences
 *	  (streams.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/citus.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CITUS_H
#define IDEM_CITUS_H

#include "storage.h"

extern void IdemCitusRoute(IdemLedger ledger, text *tenant, const char *what);
/* the keyed tables citus_distribute() distributes by tenant (streams.c) */
typedef enum IdemCitusTable
{
	IDEM_CITUS_TENANT_POSITIONS,	/* idempotency.tenant_positions */
	IDEM_CITUS_TENANT_SEQUENCES,	/* idempotency.tenant_sequences */
	IDEM_CITUS_TENANT_OUTBOX_HEADS, /* idempotency.tenant_outbox_heads */
	IDEM_CITUS_TENANT_EVENTS,	/* idempotency.tenant_events */
	IDEM_CITUS_NUM_TABLES
} IdemCitusTable;

extern const char *const IdemCitusTableNames[IDEM_CITUS_NUM_TABLES];
extern Oid	IdemCitusRouteTable(IdemCitusTable table, text *tenant,
								const char *what, Oid *tenant_type,
								Datum *tenant_value);
extern bool IdemCitusCallTenant(IdemLedger ledger, Datum *value);
extern void IdemCitusEndCall(void);
extern bool IdemCitusDistributed(Oid relid, bool *coordinator);
extern void IdemCitusExecDdl(const char *sql, int lock_timeout_ms);
extern void IdemCitusPinRemoteSettings(void);
extern void IdemCitusUnpinRemoteSettings(void);

/* how long maintenance's DDL on a distributed ledger waits, on every node */
#define IDEM_CITUS_DDL_LOCK_TIMEOUT_MS	1000

#endif							/* IDEM_CITUS_H */

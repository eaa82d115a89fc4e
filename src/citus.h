/*-------------------------------------------------------------------------
 *
 * citus.h
 *	  Ledgers distributed by Citus (citus.c): routing a key to the local
 *	  shard of the ledger that holds its tenant.  PROTOTYPE for issue 37
 *	  (doc/scale-out.md, "Citus' own shard operations (0.5.0 design)"),
 *	  off unless idempotency.citus_ledgers is on.
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

extern bool idem_citus_ledgers;

extern void IdemCitusInit(void);
extern void IdemCitusRoute(IdemLedger ledger, text *tenant);
extern void IdemCitusEndCall(void);
extern bool IdemCitusDistributed(Oid relid, bool *coordinator);

#endif							/* IDEM_CITUS_H */

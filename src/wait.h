/*-------------------------------------------------------------------------
 *
 * wait.h
 *	  Waiting for the holder of a two-phase claim (wait.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/wait.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_WAIT_H
#define IDEMPOTENCY_WAIT_H

#include "idempotency.h"

extern void IdemWaitInit(void);
extern Size IdemWaitShmemSize(void);
extern void IdemWaitShmemInit(void);
extern uint64 IdemWaitSeen(Oid role, const pg_uuid_t *digest);
extern void IdemWaitNoteChange(Oid role, const pg_uuid_t *digest);
extern void IdemWaitForHolder(Oid role, const pg_uuid_t *digest, uint64 seen,
							  TimestampTz until, int *poll_ms);

#endif							/* IDEMPOTENCY_WAIT_H */

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

#include "storage/lock.h"

extern void IdemWaitInit(void);
extern Size IdemWaitShmemSize(void);
extern void IdemWaitShmemInit(void);
extern uint64 IdemWaitSeen(const LOCKTAG *keytag);
extern void IdemWaitNoteChange(const LOCKTAG *keytag);
extern void IdemWaitForHolder(const LOCKTAG *keytag, uint64 seen,
							  TimestampTz until, int *poll_ms);

#endif							/* IDEMPOTENCY_WAIT_H */

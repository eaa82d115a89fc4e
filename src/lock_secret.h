/*-------------------------------------------------------------------------
 *
 * lock_secret.h
 *	  The per-database secret lock tags are keyed with (lock_secret.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/lock_secret.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_LOCK_SECRET_H
#define IDEMPOTENCY_LOCK_SECRET_H

#include "idempotency.h"

#define IDEM_LOCK_SECRET_LEN	16	/* a SipHash-2-4 key */

extern void IdemLockSecretInit(void);
extern bool IdemKeyedLockTags(void);
extern const uint8 *IdemLockSecret(void);
extern uint64 IdemLockSecretId(void);
extern void IdemRestrictLockSecretAcl(void);

#endif							/* IDEMPOTENCY_LOCK_SECRET_H */

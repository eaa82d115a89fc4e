/*-------------------------------------------------------------------------
 *
 * privilege.h
 *	  Work done with more privilege than the caller (privilege.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/privilege.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_PRIVILEGE_H
#define IDEMPOTENCY_PRIVILEGE_H

#include "idempotency.h"

/* Who the caller was, while it runs as the storage owner */
typedef struct IdemSavedUser
{
	Oid			userid;
	int			sec_context;
} IdemSavedUser;

extern void IdemPinWorkerSettings(void);
extern uint64 IdemExecAsOwner(const char *sql, int lock_timeout_ms);
extern Oid	IdemStorageOwner(void);
extern void IdemBecomeStorageOwner(IdemSavedUser *save);
extern void IdemRestoreUser(const IdemSavedUser *save);
extern void IdemRestrictTableAcl(Oid relid);

#endif							/* IDEMPOTENCY_PRIVILEGE_H */

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

#include "executor/spi.h"

/* Who the caller was, while it runs as the storage owner */
typedef struct IdemSavedUser
{
	Oid			userid;
	int			sec_context;
} IdemSavedUser;

extern void IdemPinWorkerSettings(void);
extern uint64 IdemExecAsOwner(const char *sql, int lock_timeout_ms);
extern int	IdemPinOwnerSettings(void);
extern bool IdemPinnedSettingAt(int i, const char **name, const char **value);
extern Oid	IdemStorageOwner(void);
extern void IdemBecomeStorageOwner(IdemSavedUser *save);
extern void IdemRestoreUser(const IdemSavedUser *save);
extern void IdemRestrictTableAcl(Oid relid);

/* prepared statements run as the storage owner */
#define IDEM_KEPT_PLAN_MAX_ARGS 16
extern void IdemOwnerSPIBegin(IdemSavedUser *save);
extern void IdemOwnerSPIEnd(const IdemSavedUser *save);
extern int	IdemExecKeptPlan(SPIPlanPtr *plan, const char *sql, int nargs,
							 const Oid *argtypes, Datum *values,
							 const bool *isnull, bool read_only);

#endif							/* IDEMPOTENCY_PRIVILEGE_H */

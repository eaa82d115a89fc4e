/*-------------------------------------------------------------------------
 *
 * role_ref.h
 *	  The type idempotency.role_ref (role_ref.c): a role stored as this
 *	  node's OID, copied between nodes by its name.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/role_ref.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_ROLE_REF_H
#define IDEMPOTENCY_ROLE_REF_H

#include "idempotency.h"

/* is typid idempotency.role_ref (the role column of a distributed table)? */
extern bool IdemIsRoleRefType(Oid typid);

#endif							/* IDEMPOTENCY_ROLE_REF_H */

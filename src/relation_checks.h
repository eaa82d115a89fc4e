/*-------------------------------------------------------------------------
 *
 * relation_checks.h
 *	  Checks PostgreSQL's own commands make on a relation, made ahead by
 *	  the code that drops the extension's tables (relation_checks.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/relation_checks.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_RELATION_CHECKS_H
#define IDEMPOTENCY_RELATION_CHECKS_H

#include "idempotency.h"

extern bool IdemRelationInUseHere(Oid relid);

#endif							/* IDEMPOTENCY_RELATION_CHECKS_H */

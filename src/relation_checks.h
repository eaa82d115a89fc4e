/*-------------------------------------------------------------------------
 *
 * relation_checks.h
 *	  Checks PostgreSQL's own commands make on a relation, made by the code
 *	  that does their work without them (relation_checks.c).
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

#include "nodes/nodes.h"
#include "utils/relcache.h"

extern bool IdemRelationInUseHere(Oid relid);
extern void IdemCheckDirectWrite(Relation rel, CmdType cmd);

#endif							/* IDEMPOTENCY_RELATION_CHECKS_H */

/*-------------------------------------------------------------------------
 *
 * streams.h
 *	  Ordered streams: positions and producer sequences (streams.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/streams.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_STREAMS_H
#define IDEMPOTENCY_STREAMS_H

#include "idempotency.h"

extern uint64 IdemStreamsMaintain(TimestampTz before);

#endif							/* IDEMPOTENCY_STREAMS_H */

/*-------------------------------------------------------------------------
 *
 * responses.h
 *	  What one key may store: its response and kept request (responses.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/responses.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_RESPONSES_H
#define IDEMPOTENCY_RESPONSES_H

#include "idempotency.h"

extern int64 IdemJsonbTextSize(Datum jsonb);
extern void IdemCheckStoredSize(int64 size, const char *what);
extern void IdemCheckResponseHeaders(Datum headers);

#endif							/* IDEMPOTENCY_RESPONSES_H */

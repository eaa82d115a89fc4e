/*-------------------------------------------------------------------------
 *
 * keys.h
 *	  The key ledger's own parts: a lapsed claim taken over by idem_recover()
 *	  (keys.c, for recover.c), and the claims of the current transaction
 *	  (own_claims.c).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keys.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_KEYS_H
#define IDEMPOTENCY_KEYS_H

#include "idempotency.h"
#include "storage.h"

#include "storage/itemptr.h"

/* A lapsed claim taken over by idem_recover() (keys.c, recover.c) */
typedef struct IdemRecovered
{
	TimestampTz lapsed_at;		/* the end of the lease that lapsed */
	int64		token;			/* the new one */
	Datum		recovery_point; /* text, or (Datum) 0 */
	Datum		request;		/* jsonb, or (Datum) 0 */
} IdemRecovered;

extern bool IdemRecoverKey(Oid role, const IdemDigest *digest, Datum lease,
						   IdemRecovered *out);

/*
 * A claim made by the current transaction (own_claims.c).  Same-transaction
 * claims must be resolved (completed or released) before COMMIT.  Where the
 * row's current version is, is remembered so that the usual claim-then-
 * complete needs no second probe.
 */
typedef struct IdemOwnClaim
{
	Oid			role;
	pg_uuid_t	digest;
	char	   *key;			/* for messages; only if must_resolve */
	bool		must_resolve;	/* same-transaction mode */
	SubTransactionId made_in;	/* subtransaction that made the claim */
	SubTransactionId resolved_in;	/* that completed or released it */
	SubTransactionId moved_in;	/* that last changed the row */
	SubTransactionId touched_in;	/* whose list of changes it is in */
	IdemPartition part;			/* where the row is; relid invalid if unknown */
	ItemPointerData tid;
	struct IdemOwnClaim *older; /* the key's claim before this one, if any */
} IdemOwnClaim;

extern void IdemOwnClaimsInit(void);
extern IdemOwnClaim *IdemOwnClaimFind(Oid role, const pg_uuid_t *digest);
extern IdemOwnClaim *IdemOwnClaimAdd(Oid role, const pg_uuid_t *digest,
									 const char *key, bool must_resolve,
									 const IdemPartition *part, ItemPointer tid);
extern void IdemOwnClaimResolved(IdemOwnClaim *claim);
extern void IdemOwnClaimMoved(IdemOwnClaim *claim, const IdemPartition *part,
							  ItemPointer tid);
extern void IdemOwnClaimsCheckPending(void);

#endif							/* IDEMPOTENCY_KEYS_H */

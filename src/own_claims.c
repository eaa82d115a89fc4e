/*-------------------------------------------------------------------------
 *
 * own_claims.c
 *	  The idempotency keys the current transaction has claimed: where each
 *	  one's row is, whether it must be resolved before COMMIT, and keeping
 *	  that true across savepoints.
 *
 * A transaction may claim any number of keys (a backfill claims hundreds
 * of thousands), so every operation here costs the same however many there
 * are:
 *	- claims are found by (role, digest) in a hash table;
 *	- a key claimed again in the same transaction (after a release) keeps
 *	  its earlier claim underneath the new one, so that a rolled back
 *	  savepoint can bring it back;
 *	- each subtransaction that changes claims keeps a list of the claims it
 *	  changed, so that its rollback undoes exactly those and its commit
 *	  hands exactly those to its parent: a savepoint that touched no claim
 *	  costs nothing, one that touched k claims costs O(k);
 *	- COMMIT looks at every claim once, for same-transaction claims that
 *	  were neither completed nor released.
 *
 * Everything lives in TopTransactionContext and is forgotten at the end of
 * the transaction.  An error in the middle of a change leaves the state as
 * it was before the change (allocation happens before anything is linked).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/own_claims.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "keys.h"
#include "storage.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "utils/memutils.h"

/* The hash key of a claim: the role and the key's digest */
typedef struct IdemOwnTag
{
	Oid			role;
	pg_uuid_t	digest;
} IdemOwnTag;

/* One key of this transaction: its newest claim, the older ones below */
typedef struct IdemOwnEntry
{
	IdemOwnTag	tag;
	char		status;			/* used by simplehash */
	IdemOwnClaim *claim;		/* NULL once every claim was undone */
} IdemOwnEntry;

static inline uint32
IdemOwnTagHash(const IdemOwnTag *tag)
{
	uint32		h;

	/* bytes 4-7 of the digest are a cryptographic hash of the key */
	memcpy(&h, tag->digest.data + IDEM_DIGEST_PREFIX_LEN, sizeof(h));
	return h ^ murmurhash32((uint32) tag->role);
}

#define SH_PREFIX		ownclaims
#define SH_ELEMENT_TYPE IdemOwnEntry
#define SH_KEY_TYPE		IdemOwnTag
#define SH_KEY			tag
#define SH_HASH_KEY(tb, key) IdemOwnTagHash(&(key))
#define SH_EQUAL(tb, a, b) \
	((a).role == (b).role && memcmp(&(a).digest, &(b).digest, IDEM_DIGEST_LEN) == 0)
#define SH_SCOPE		static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

/* The claims one subtransaction changed (made, resolved or moved) */
typedef struct IdemOwnFrame
{
	SubTransactionId subid;
	int			n;
	int			allocated;
	IdemOwnClaim **claims;		/* in the order they were changed */
} IdemOwnFrame;

/* State of the current transaction; all NULL/0 outside one */
static ownclaims_hash *own_claims = NULL;
static IdemOwnFrame *frames = NULL;	/* one per subtransaction level in use */
static int	nframes = 0;
static int	allocated_frames = 0;

static void IdemOwnClaimsXactCallback(XactEvent event, void *arg);
static void IdemOwnClaimsSubXactCallback(SubXactEvent event,
										 SubTransactionId mySubid,
										 SubTransactionId parentSubid,
										 void *arg);
static void IdemOwnClaimTouched(IdemOwnClaim *claim);
static void IdemOwnClaimUndo(IdemOwnClaim *claim, SubTransactionId subid);
static void IdemOwnClaimsForget(void);

/*
 * IdemOwnClaimsInit registers the transaction callbacks.  Called once from
 * _PG_init.
 */
void
IdemOwnClaimsInit(void)
{
	RegisterXactCallback(IdemOwnClaimsXactCallback, NULL);
	RegisterSubXactCallback(IdemOwnClaimsSubXactCallback, NULL);
}

/*
 * IdemOwnClaimFind returns the newest claim of (role, digest) made by the
 * current transaction, or NULL.
 */
IdemOwnClaim *
IdemOwnClaimFind(Oid role, const pg_uuid_t *digest)
{
	IdemOwnTag	tag;
	IdemOwnEntry *entry;

	if (own_claims == NULL)
		return NULL;
	memset(&tag, 0, sizeof(tag));
	tag.role = role;
	tag.digest = *digest;
	entry = ownclaims_lookup(own_claims, tag);
	return entry != NULL ? entry->claim : NULL;
}

/*
 * IdemOwnClaimAdd records a claim the current transaction made of (role,
 * digest), whose row is now at "tid" in partition "part".  "key" is the
 * key as given (kept, shortened, for the error at COMMIT).
 */
IdemOwnClaim *
IdemOwnClaimAdd(Oid role, const pg_uuid_t *digest, const char *key,
				bool must_resolve, const IdemPartition *part, ItemPointer tid)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	IdemOwnTag	tag;
	IdemOwnClaim *claim;
	IdemOwnEntry *entry;
	bool		found;

	if (own_claims == NULL)
		own_claims = ownclaims_create(TopTransactionContext, 8, NULL);

	claim = palloc(sizeof(IdemOwnClaim));
	claim->role = role;
	claim->digest = *digest;
	claim->key = must_resolve ? IdemKeyForMessage(key) : NULL;
	claim->must_resolve = must_resolve;
	claim->made_in = GetCurrentSubTransactionId();
	claim->resolved_in = InvalidSubTransactionId;
	claim->moved_in = claim->made_in;
	claim->touched_in = InvalidSubTransactionId;
	claim->part = *part;
	claim->part.ended = false;
	claim->tid = *tid;

	/* nothing is linked until everything that can fail has been done */
	IdemOwnClaimTouched(claim);
	memset(&tag, 0, sizeof(tag));
	tag.role = role;
	tag.digest = *digest;
	entry = ownclaims_insert(own_claims, tag, &found);
	claim->older = found ? entry->claim : NULL;
	entry->claim = claim;
	MemoryContextSwitchTo(oldcxt);
	return claim;
}

/* records that the current subtransaction completed or released a claim */
void
IdemOwnClaimResolved(IdemOwnClaim *claim)
{
	IdemOwnClaimTouched(claim);
	claim->resolved_in = GetCurrentSubTransactionId();
}

/* records that the current subtransaction moved a claim's row */
void
IdemOwnClaimMoved(IdemOwnClaim *claim, const IdemPartition *part,
				  ItemPointer tid)
{
	IdemOwnClaimTouched(claim);
	claim->part = *part;
	claim->part.ended = false;
	claim->tid = *tid;
	claim->moved_in = GetCurrentSubTransactionId();
}

/*
 * IdemOwnClaimsCheckPending raises an error for a same-transaction claim of
 * this transaction that was neither completed nor released.
 */
void
IdemOwnClaimsCheckPending(void)
{
	ownclaims_iterator it;
	IdemOwnEntry *entry;

	if (own_claims == NULL)
		return;
	ownclaims_start_iterate(own_claims, &it);
	while ((entry = ownclaims_iterate(own_claims, &it)) != NULL)
	{
		IdemOwnClaim *claim = entry->claim;

		if (claim != NULL && claim->must_resolve &&
			claim->resolved_in == InvalidSubTransactionId)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
					 errmsg("idempotency key \"%s\" was claimed but neither completed nor released",
							claim->key),
					 errdetail("A claim without a lease belongs to the transaction that made it."),
					 errhint("Call idem_complete() or idem_release() before COMMIT, or claim with a lease to finish in a later transaction.")));
	}
}

/*
 * IdemOwnClaimTouched adds a claim to the list of the current
 * subtransaction's changes, once.  Called before the claim is changed, so
 * that an error here changes nothing.
 */
static void
IdemOwnClaimTouched(IdemOwnClaim *claim)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	IdemOwnFrame *frame;

	if (claim->touched_in == subid)
		return;

	if (nframes == 0 || frames[nframes - 1].subid != subid)
	{
		if (nframes == allocated_frames)
		{
			int			n = Max(8, allocated_frames * 2);

			frames = frames == NULL ?
				MemoryContextAlloc(TopTransactionContext, n * sizeof(IdemOwnFrame)) :
				repalloc(frames, n * sizeof(IdemOwnFrame));
			allocated_frames = n;
		}
		frame = &frames[nframes];
		frame->claims = MemoryContextAlloc(TopTransactionContext,
										   16 * sizeof(IdemOwnClaim *));
		frame->allocated = 16;
		frame->n = 0;
		frame->subid = subid;
		nframes++;
	}
	frame = &frames[nframes - 1];
	if (frame->n == frame->allocated)
	{
		frame->claims = repalloc_huge(frame->claims,
									  frame->allocated * 2 * sizeof(IdemOwnClaim *));
		frame->allocated *= 2;
	}
	frame->claims[frame->n++] = claim;
	claim->touched_in = subid;
}

/*
 * IdemOwnClaimUndo undoes what subtransaction "subid", which is rolling
 * back, did to a claim: a claim it made goes (the key's earlier claim, if
 * any, is back on top), a completion or release it made is forgotten, and
 * a row it moved is looked up again when next needed.
 */
static void
IdemOwnClaimUndo(IdemOwnClaim *claim, SubTransactionId subid)
{
	if (claim->made_in == subid)
	{
		IdemOwnTag	tag;
		IdemOwnEntry *entry;

		memset(&tag, 0, sizeof(tag));
		tag.role = claim->role;
		tag.digest = claim->digest;
		entry = ownclaims_lookup(own_claims, tag);
		if (entry != NULL && entry->claim == claim)
			entry->claim = claim->older;
		claim->made_in = InvalidSubTransactionId;
		return;
	}
	if (claim->resolved_in == subid)
		claim->resolved_in = InvalidSubTransactionId;
	if (claim->moved_in == subid)
		claim->part.relid = InvalidOid;
}

/*
 * IdemOwnClaimsSubXactCallback: a rolled back subtransaction takes its
 * claims, completions and releases with it; a committed one hands them to
 * its parent.  Only the claims the subtransaction changed are visited.
 */
static void
IdemOwnClaimsSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg)
{
	IdemOwnFrame *frame;
	int			i;

	if (nframes == 0 || frames[nframes - 1].subid != mySubid)
		return;					/* it changed no claim */
	frame = &frames[nframes - 1];

	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		/* newest first, so that stacked claims of one key come off in order */
		for (i = frame->n - 1; i >= 0; i--)
		{
			IdemOwnClaimUndo(frame->claims[i], mySubid);
			frame->claims[i]->touched_in = InvalidSubTransactionId;
		}
		pfree(frame->claims);
		nframes--;
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		IdemOwnFrame *parent = NULL;

		/*
		 * The parent's list takes them over (a claim may then be in twice).
		 * It grows first: were that to fail (out of memory), no claim has
		 * been handed to the parent yet, and the subtransaction's own list
		 * still undoes them all.
		 */
		if (nframes >= 2 && frames[nframes - 2].subid == parentSubid)
			parent = &frames[nframes - 2];
		if (parent != NULL && parent->n + frame->n > parent->allocated)
		{
			int			n = parent->allocated;

			while (n < parent->n + frame->n)
				n *= 2;
			parent->claims = repalloc_huge(parent->claims,
										   n * sizeof(IdemOwnClaim *));
			parent->allocated = n;
		}

		/* nothing below can fail */
		for (i = 0; i < frame->n; i++)
		{
			IdemOwnClaim *claim = frame->claims[i];

			if (claim->made_in == mySubid)
				claim->made_in = parentSubid;
			if (claim->resolved_in == mySubid)
				claim->resolved_in = parentSubid;
			if (claim->moved_in == mySubid)
				claim->moved_in = parentSubid;
			claim->touched_in = parentSubid;
		}
		if (parent == NULL)
			frame->subid = parentSubid;
		else
		{
			memcpy(parent->claims + parent->n, frame->claims,
				   frame->n * sizeof(IdemOwnClaim *));
			parent->n += frame->n;
			pfree(frame->claims);
			nframes--;
		}
	}
}

/*
 * IdemOwnClaimsXactCallback refuses to commit (or prepare) a transaction
 * that still holds a same-transaction claim in progress, and forgets the
 * claims when the transaction ends.
 */
static void
IdemOwnClaimsXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			IdemOwnClaimsCheckPending();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			IdemOwnClaimsForget();
			break;
		default:
			break;
	}
}

/* forgets every claim; the memory goes with TopTransactionContext */
static void
IdemOwnClaimsForget(void)
{
	own_claims = NULL;
	frames = NULL;
	nframes = 0;
	allocated_frames = 0;
}

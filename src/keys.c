/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  The idempotency-key ledger: idem_claim(), idem_complete(),
 *	  idem_checkpoint(), idem_release() and idem_lookup().
 *
 * A key is identified by (calling role, scope, key).  Its row records a
 * state (in progress, completed, released), a fencing token, the request's
 * fingerprint, a recovery point and the stored response.
 *
 * Two modes:
 *	- same transaction (no lease): the claim is part of the caller's
 *	  transaction; committing it while still in progress is an error raised
 *	  at COMMIT, so no key is ever left in progress without a lease;
 *	- two-phase (lease): the in-progress claim may be committed, the caller
 *	  finishes it in a later transaction with the token it got.  Once the
 *	  lease has lapsed, another caller may claim the key again, with a new,
 *	  larger token; the old holder's token is then refused.
 *
 * Every operation that writes a key's row runs under the key lock of
 * probe.c's protocol, so operations on one key are serialized, and waits
 * for transactions that are writing its row.  That includes completing or
 * releasing a claim of the caller's own transaction: no other transaction
 * can change that row, but an update that moves the row to another page
 * must not overlap another caller's probe (see IdemKeyAct).  Rows are
 * updated in place (same partition: expires_at never changes); a claim
 * made afresh over an earlier row (released, or its lease lapsed) replaces
 * it with a new row in the partition of its own expiry.
 *
 * A claim and an import are steps run by IdemOpRun (probe.c), which waits
 * for writers and has missing partitions made between them; a step looks
 * at what the probe found and answers, or writes one row built by
 * IdemClaimRow.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keys.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "keyhash.h"
#include "keys.h"
#include "protocol.h"
#include "responses.h"
#include "stats.h"
#include "storage.h"
#include "transfer.h"
#include "wait.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_lookup);

/* Columns of idem_claim()'s result (6 before 0.4.0) */
#define Natts_claim_result			8

/* Columns of idem_lookup()'s result (8 before 0.4.0) */
#define Natts_lookup_result			11

/* What idem_complete(), idem_checkpoint() and idem_release() do */
typedef enum IdemKeyAction
{
	IDEM_ACTION_COMPLETE,
	IDEM_ACTION_CHECKPOINT,
	IDEM_ACTION_RELEASE
} IdemKeyAction;

/* One idem_claim() call: its arguments, and the answer its step gave */
typedef struct IdemClaim
{
	FunctionCallInfo fcinfo;
	text	   *key;
	bytea	   *fingerprint;	/* of the request, or NULL */
	bytea	   *legacy_fingerprint; /* see IdemFingerprint, or NULL */
	bool		has_lease;
	bool		wait;
	bool		keep_request;	/* keep key, scope and request (0.4.0) */
	text	   *scope;
	Datum		request;		/* (Datum) 0 if NULL */
	TimestampTz wait_deadline;	/* for a holder's end; 0: no such wait */
	bool		waited;			/* waited for a holder already */
	TimestampTz clock_at;		/* the op->now they were computed from */
	TimestampTz lease_until;	/* from op->now, as op->expires_at */
	/* the answer */
	const char *status;
	bool		with_token;		/* the caller now holds the key */
	bool		with_response;	/* a completed key's stored response */
	TimestampTz answer_expires_at;	/* 0 for none */
} IdemClaim;

/* One import: the row to store, and the outcome */
typedef struct IdemImport
{
	Datum	   *values;
	bool	   *nulls;
	IdemImportOutcome outcome;
} IdemImport;

static void IdemKeyDigest(text *scope, text *key, IdemDigest *digest);
static char IdemRowState(IdemOp *op);
static TimestampTz IdemRowExpiry(IdemOp *op);
static bool IdemSameFingerprint(bytea *a, bytea *b);
static int64 IdemNextToken(TimestampTz now, int64 previous);
static void IdemClaimClock(IdemClaim *claim, IdemOp *op);
static IdemStep IdemClaimStep(IdemOp *op, void *arg);
static IdemStep IdemClaimAnswer(IdemClaim *claim, const char *status,
								bool with_token, bool with_response,
								TimestampTz expires_at);
static IdemStep IdemClaimWrite(IdemClaim *claim, IdemOp *op);
static void IdemClaimArgs(IdemClaim *claim, IdemOp *op);
static IdemStep IdemClaimHeld(IdemClaim *claim, IdemOp *op);
static void IdemClaimRow(IdemClaim *claim, IdemOp *op);
static void IdemClaimKeep(IdemClaim *claim, IdemOp *op, bool afresh);
static Datum IdemClaimResult(IdemClaim *claim, IdemOp *op);
static void IdemKeyAct(FunctionCallInfo fcinfo, IdemKeyAction action,
					   int scope_argno, int token_argno);
static void IdemKeyActCheck(IdemOp *op, const char *keystr, bool has_token,
							int64 token);
static int64 IdemResponseArgs(FunctionCallInfo fcinfo);
static void IdemKeySetResponse(FunctionCallInfo fcinfo, IdemOp *op,
							   int64 size);
static const char *IdemActionName(IdemKeyAction action);
static IdemStep IdemImportStep(IdemOp *op, void *arg);
static bool IdemImportIsNewer(IdemOp *op, IdemImport *imp);

/* the digest of (scope, key) */
static void
IdemKeyDigest(text *scope, text *key, IdemDigest *digest)
{
	IdemCitusRoute(IDEM_LEDGER_KEYS, scope, "scope");
	IdemComputeDigest(VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope),
					  VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), digest);
}

/* state of the row found */
static char
IdemRowState(IdemOp *op)
{
	return DatumGetChar(op->values[Anum_keys_state - 1]);
}

/* expiry of the row found, or 0 if none was read */
static TimestampTz
IdemRowExpiry(IdemOp *op)
{
	return op->probe.tuple != NULL ?
		DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]) : 0;
}

/* are two fingerprints the same? */
static bool
IdemSameFingerprint(bytea *a, bytea *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/*
 * IdemNextToken returns a fencing token larger than "previous" (0 for none):
 * the current time in microseconds, or previous + 1 if that is not larger.
 * Time-based tokens keep increasing across the key's expiry and re-creation.
 */
static int64
IdemNextToken(TimestampTz now, int64 previous)
{
	int64		token = (int64) now;

	if (token > previous)
		return token;
	if (previous >= IDEM_MAX_TOKEN)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("no larger fencing token can be issued for this idempotency key"),
				 errdetail("Its current token is " INT64_FORMAT ".", previous)));
	return previous + 1;
}

/*
 * IdemClaimClock computes, from the operation's clock, the expiry of a
 * claim made now (op->expires_at) and, with a lease, the lease's end,
 * checking the ttl and lease arguments of idem_claim().  A claim made after
 * a wait counts its ttl and lease from then: its row is never written
 * already expired.
 */
static void
IdemClaimClock(IdemClaim *claim, IdemOp *op)
{
	FunctionCallInfo fcinfo = claim->fcinfo;

	claim->clock_at = op->now;
	op->expires_at = IdemExpiresAt(fcinfo, 3, op->now, idem_key_ttl,
								   "idempotency.key_ttl");
	claim->lease_until = 0;
	if (!claim->has_lease)
		return;
	claim->lease_until = IdemTimestampPlus(op->now, PG_GETARG_INTERVAL_P(4));
	if (claim->lease_until <= op->now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be a positive interval")));
	if (claim->lease_until > op->expires_at)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must not be longer than the key's ttl"),
				 errhint("Pass a longer ttl or a shorter lease.")));
}

/*
 * idem_claim(key text, request jsonb, scope text, ttl interval,
 *			  lease interval, wait boolean, keep_request boolean)
 *		RETURNS (status text, token bigint, recovery_point text,
 *				 response_code int, response_body jsonb,
 *				 expires_at timestamptz, response_headers jsonb,
 *				 response_raw bytea)
 *
 * Before the extension is updated to 0.4.0 it has the first six arguments
 * and result columns only.
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	IdemClaim	claim;
	IdemDigest	digest;
	IdemOp		op;

	IdemCheckLibraryVersion();
	memset(&claim, 0, sizeof(claim));
	claim.fcinfo = fcinfo;
	claim.key = IdemCheckKeyArg(fcinfo, 0, "key");
	claim.scope = IdemCheckScopeArg(fcinfo, 2, "scope");
	claim.has_lease = !PG_ARGISNULL(4);
	IdemKeyDigest(claim.scope, claim.key, &digest);
	IdemOpInit(&op, IDEM_LEDGER_KEYS, GetUserId(), &digest);
	IdemClaimClock(&claim, &op);
	IdemClaimArgs(&claim, &op);
	IdemCheckWritable("idem_claim()");
	if (!PG_ARGISNULL(1))
		claim.fingerprint = IdemFingerprint(PG_GETARG_DATUM(1),
											&claim.legacy_fingerprint);
	(void) IdemLedgerParent(IDEM_LEDGER_KEYS, true);

	IdemOpRun(&op, !claim.wait, IdemClaimStep, &claim);
	IdemCitusEndCall();
	return IdemClaimResult(&claim, &op);
}

/*
 * IdemClaimArgs checks the arguments wait and keep_request of idem_claim(),
 * and the size of a request to keep; the wait for a holder ends
 * idempotency.wait_timeout after the call began.
 */
static void
IdemClaimArgs(IdemClaim *claim, IdemOp *op)
{
	FunctionCallInfo fcinfo = claim->fcinfo;

	if (PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("wait must not be null")));
	claim->wait = PG_GETARG_BOOL(5);
	if (claim->wait && idem_wait_timeout > 0)
		claim->wait_deadline = TimestampTzPlusMilliseconds(op->now,
														   idem_wait_timeout);
	if (!PG_ARGISNULL(1))
		claim->request = PG_GETARG_DATUM(1);
	if (PG_NARGS() <= 6)
		return;
	if (PG_ARGISNULL(6))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("keep_request must not be null")));
	claim->keep_request = PG_GETARG_BOOL(6);
	if (claim->keep_request && !claim->has_lease)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("keep_request requires a lease"),
				 errdetail("Only a two-phase claim can be recovered by another caller once its lease lapses."),
				 errhint("Pass a lease, or leave keep_request false.")));
	if (claim->keep_request && claim->request != (Datum) 0)
		IdemCheckStoredSize(IdemJsonbTextSize(claim->request), "idem_claim()");
}

/*
 * IdemClaimStep decides idem_claim()'s answer from what the probe found,
 * writing the claim's row when the answer is "claimed" and it is new.
 */
static IdemStep
IdemClaimStep(IdemOp *op, void *arg)
{
	IdemClaim  *claim = (IdemClaim *) arg;
	bool		found_row = op->probe.found == IDEM_FOUND_MINE ||
		op->probe.found == IDEM_FOUND_DONE;
	char		state = found_row ? IdemRowState(op) : '\0';

	if (op->now != claim->clock_at)
		IdemClaimClock(claim, op);

	/*
	 * Another transaction holds the key lock (wait => false): it is writing
	 * this key right now, or holds it in a partition it made itself, which
	 * we cannot see yet.  Only answers that write nothing can be given
	 * without the key lock: our own claim, or a committed completed key.
	 * Claiming afresh a key we released ourselves writes, and every write
	 * holds the key lock; anything else is in progress.
	 */
	if (!op->key_locked &&
		!(op->probe.found == IDEM_FOUND_MINE && state != KEY_RELEASED) &&
		!(op->probe.found == IDEM_FOUND_DONE && state == KEY_COMPLETED))
		return IdemClaimAnswer(claim, "in_progress", false, false,
							   IdemRowExpiry(op));

	if (op->probe.found == IDEM_FOUND_BUSY)
	{
		/* being written: wait for the writer and answer for its outcome */
		if (claim->wait)
			return IDEM_STEP_WAIT;
		return IdemClaimAnswer(claim, "in_progress", false, false,
							   IdemRowExpiry(op));
	}
	if (!found_row)
	{
		/* expired, and remembered: its response is gone, it must not run */
		if (op->probe.remembered)
			return IdemClaimAnswer(claim, "expired", false, false, 0);
		return IdemClaimWrite(claim, op);
	}

	/* a live row, committed or our own: a released key has no request */
	if (state != KEY_RELEASED && claim->fingerprint != NULL &&
		!op->nulls[Anum_keys_fingerprint - 1])
	{
		bytea	   *stored = DatumGetByteaPP(op->values[Anum_keys_fingerprint - 1]);

		if (!IdemSameFingerprint(stored, claim->fingerprint) &&
			(claim->legacy_fingerprint == NULL ||
			 !IdemSameFingerprint(stored, claim->legacy_fingerprint)))
			return IdemClaimAnswer(claim, "mismatch", false, false,
								   IdemRowExpiry(op));
	}
	if (state == KEY_COMPLETED)
		return IdemClaimAnswer(claim, "completed", false, true,
							   IdemRowExpiry(op));
	if (state == KEY_IN_PROGRESS)
	{
		bool		lapsed = !op->nulls[Anum_keys_lease_until - 1] &&
			DatumGetTimestampTz(op->values[Anum_keys_lease_until - 1]) <= op->now;

		/* claimed earlier in this transaction: the same claim */
		if (op->probe.found == IDEM_FOUND_MINE)
			return IdemClaimAnswer(claim, "claimed", true, false,
								   IdemRowExpiry(op));
		if (!lapsed)
			return IdemClaimHeld(claim, op);
	}
	/* released, or its lease lapsed: claimed afresh */
	return IdemClaimWrite(claim, op);
}

/*
 * IdemClaimHeld answers for a key that another caller holds with a live
 * lease, its claim committed: in_progress, or (wait => true, and
 * idempotency.wait_timeout > 0) wait for the holder to complete or release
 * it, or its lease to lapse, for as long as the wait's bound allows.  A
 * transaction that made a ledger partition keeps its key locks to its end
 * (see IdemOpInsert), which the holder would need: it does not wait.
 */
static IdemStep
IdemClaimHeld(IdemClaim *claim, IdemOp *op)
{
	if (claim->wait_deadline > op->now && !op->keep_key_lock &&
		!op->nulls[Anum_keys_lease_until - 1])
	{
		op->wait_until = Min(claim->wait_deadline,
							 DatumGetTimestampTz(op->values[Anum_keys_lease_until - 1]));
		if (!claim->waited)
			IdemStatsAdd(IDEM_STAT_HOLDER_WAITS, 1);
		claim->waited = true;
		return IDEM_STEP_WAIT_HOLDER;
	}
	return IdemClaimAnswer(claim, "in_progress", false, false,
						   IdemRowExpiry(op));
}

/* records idem_claim()'s answer; the operation is done */
static IdemStep
IdemClaimAnswer(IdemClaim *claim, const char *status, bool with_token,
				bool with_response, TimestampTz expires_at)
{
	claim->status = status;
	claim->with_token = with_token;
	claim->with_response = with_response;
	claim->answer_expires_at = expires_at;
	return IDEM_STEP_DONE;
}

/*
 * IdemClaimWrite writes a fresh claim of the key, with its own ttl: a new
 * row if none was found, or one that replaces the row found (released, or
 * its lease lapsed) and goes to the partition of its new expiry.  The claim
 * is remembered as this transaction's.
 */
static IdemStep
IdemClaimWrite(IdemClaim *claim, IdemOp *op)
{
	ItemPointerData newtid;

	if (!IdemOpFindTarget(op))
		return IDEM_STEP_MAKE_TARGET;
	IdemClaimRow(claim, op);
	if (op->probe.found == IDEM_FOUND_NONE)
		IdemOpInsert(op, &newtid);
	else
		IdemOpReplace(op, &newtid);
	(void) IdemOwnClaimAdd(op->role, &op->digest.uuid,
						   text_to_cstring(claim->key), !claim->has_lease,
						   &op->open[op->target].part, &newtid);
	return IdemClaimAnswer(claim, "claimed", true, false, op->expires_at);
}

/*
 * IdemClaimRow builds, in op->values, the row of a fresh claim: in
 * progress, with a new token larger than the row found (if any), claimed
 * now, with its lease, and no response.  A lapsed claim taken over keeps
 * its fingerprint and recovery point; a new or released key takes this
 * request's fingerprint (a released one keeps its recovery point).  The
 * expiry, digest, role and lane are IdemOpInsert's.
 */
static void
IdemClaimRow(IdemClaim *claim, IdemOp *op)
{
	bool		fresh = op->probe.found == IDEM_FOUND_NONE;
	bool		afresh = fresh || IdemRowState(op) == KEY_RELEASED;
	int64		previous_token = fresh ? 0 :
		DatumGetInt64(op->values[Anum_keys_token - 1]);

	if (fresh)
		memset(op->nulls, true, sizeof(op->nulls));
	if (afresh)
	{
		op->values[Anum_keys_fingerprint - 1] = PointerGetDatum(claim->fingerprint);
		op->nulls[Anum_keys_fingerprint - 1] = (claim->fingerprint == NULL);
	}
	op->values[Anum_keys_state - 1] = CharGetDatum(KEY_IN_PROGRESS);
	op->values[Anum_keys_token - 1] = Int64GetDatum(IdemNextToken(op->now, previous_token));
	op->values[Anum_keys_claimed_at - 1] = TimestampTzGetDatum(op->now);
	op->values[Anum_keys_lease_until - 1] = TimestampTzGetDatum(claim->lease_until);
	op->nulls[Anum_keys_state - 1] = false;
	op->nulls[Anum_keys_token - 1] = false;
	op->nulls[Anum_keys_claimed_at - 1] = false;
	op->nulls[Anum_keys_lease_until - 1] = !claim->has_lease;
	op->nulls[Anum_keys_response_code - 1] = true;
	op->nulls[Anum_keys_response_body - 1] = true;
	op->nulls[Anum_keys_response_headers - 1] = true;
	op->nulls[Anum_keys_response_raw - 1] = true;
	IdemClaimKeep(claim, op, afresh);
}

/*
 * IdemClaimKeep sets the kept key, scope and request of a fresh claim's
 * row: a lapsed claim taken over keeps those it had (the request stays
 * with the key until it expires); otherwise this call's, with
 * keep_request; a new or released key claimed without it keeps none.  A claim with a kept request and a lease can
 * be recovered once the lease lapses (recover_at).
 */
static void
IdemClaimKeep(IdemClaim *claim, IdemOp *op, bool afresh)
{
	bool		kept = !afresh && !op->nulls[Anum_keys_kept_key - 1];

	if (claim->keep_request && !kept)
	{
		op->values[Anum_keys_kept_key - 1] = PointerGetDatum(claim->key);
		op->values[Anum_keys_kept_scope - 1] = PointerGetDatum(claim->scope);
		op->values[Anum_keys_kept_request - 1] = claim->request;
		op->nulls[Anum_keys_kept_key - 1] = false;
		op->nulls[Anum_keys_kept_scope - 1] = false;
		op->nulls[Anum_keys_kept_request - 1] = (claim->request == (Datum) 0);
	}
	else if (afresh && !claim->keep_request)
	{
		op->nulls[Anum_keys_kept_key - 1] = true;
		op->nulls[Anum_keys_kept_scope - 1] = true;
		op->nulls[Anum_keys_kept_request - 1] = true;
	}
	op->values[Anum_keys_recover_at - 1] = TimestampTzGetDatum(claim->lease_until);
	op->nulls[Anum_keys_recover_at - 1] =
		op->nulls[Anum_keys_kept_key - 1] || !claim->has_lease;
}

/*
 * IdemClaimResult builds idem_claim()'s result from its answer and the row
 * in op (found or written): the token and recovery point only for the
 * caller that now holds the key, the response only for a completed key.
 */
static Datum
IdemClaimResult(IdemClaim *claim, IdemOp *op)
{
	FunctionCallInfo fcinfo = claim->fcinfo;
	Oid			rettype = get_fn_expr_rettype(fcinfo->flinfo);
	TupleDesc	tupdesc;
	Datum		values[Natts_claim_result];
	bool		nulls[Natts_claim_result];
	const char *status = claim->status;
	HeapTuple	tuple;

	/*
	 * The result's row type (idempotency.claim_result: 6 or 8 columns, as
	 * installed) from the type cache, by the type the call's expression
	 * names: a prepared statement makes its function call anew at each
	 * execution, so a per-call-site cache would not last, and a type made
	 * again by DROP and CREATE EXTENSION has another OID.
	 */
	if (OidIsValid(rettype) && rettype != RECORDOID)	/* a record before 0.2.0 */
		tupdesc = lookup_rowtype_tupdesc(rettype, -1);
	else if (get_call_result_type(fcinfo, NULL, &tupdesc) == TYPEFUNC_COMPOSITE)
		PinTupleDesc(tupdesc = BlessTupleDesc(tupdesc));
	else
		tupdesc = NULL;
	if (tupdesc == NULL ||
		(tupdesc->natts != Natts_claim_result && tupdesc->natts != 6))
		elog(ERROR, "return type must be a row type of 6 or %d columns",
			 Natts_claim_result);

	if (strcmp(status, "claimed") == 0)
		IdemStatsAdd(IDEM_STAT_CLAIMS, 1);
	else if (strcmp(status, "completed") == 0)
		IdemStatsAdd(IDEM_STAT_REPLAYS, 1);
	else if (strcmp(status, "in_progress") == 0)
		IdemStatsAdd(IDEM_STAT_CONFLICTS, 1);
	else if (strcmp(status, "mismatch") == 0)
		IdemStatsAdd(IDEM_STAT_MISMATCHES, 1);
	/* "expired" has no counter of its own (idempotency.stats) */

	memset(nulls, true, sizeof(nulls));
	values[0] = CStringGetTextDatum(status);
	nulls[0] = false;
	if (claim->with_token)
	{
		values[1] = op->values[Anum_keys_token - 1];
		nulls[1] = false;
		values[2] = op->values[Anum_keys_recovery_point - 1];
		nulls[2] = op->nulls[Anum_keys_recovery_point - 1];
	}
	if (claim->with_response)
	{
		values[3] = op->values[Anum_keys_response_code - 1];
		nulls[3] = op->nulls[Anum_keys_response_code - 1];
		values[4] = op->values[Anum_keys_response_body - 1];
		nulls[4] = op->nulls[Anum_keys_response_body - 1];
		values[6] = op->values[Anum_keys_response_headers - 1];
		nulls[6] = op->nulls[Anum_keys_response_headers - 1];
		values[7] = op->values[Anum_keys_response_raw - 1];
		nulls[7] = op->nulls[Anum_keys_response_raw - 1];
	}
	values[5] = TimestampTzGetDatum(claim->answer_expires_at);
	nulls[5] = (claim->answer_expires_at == 0);

	/* the result type of the installed version: 6 or 8 columns */
	tuple = heap_form_tuple(tupdesc, values, nulls);
	ReleaseTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/*
 * idem_complete(key text, response_code int, response_body jsonb,
 *				 scope text, token bigint, response_headers jsonb,
 *				 response_raw bytea) RETURNS void
 *
 * (the last two since 0.4.0)
 */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	IdemKeyAct(fcinfo, IDEM_ACTION_COMPLETE, 3, 4);
	PG_RETURN_VOID();
}

/*
 * idem_checkpoint(key text, recovery_point text, scope text, token bigint)
 *		RETURNS void
 */
Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	IdemKeyAct(fcinfo, IDEM_ACTION_CHECKPOINT, 2, 3);
	PG_RETURN_VOID();
}

/*
 * idem_release(key text, scope text, token bigint) RETURNS void
 */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	IdemKeyAct(fcinfo, IDEM_ACTION_RELEASE, 1, 2);
	PG_RETURN_VOID();
}

static const char *
IdemActionName(IdemKeyAction action)
{
	switch (action)
	{
		case IDEM_ACTION_COMPLETE:
			return "idem_complete()";
		case IDEM_ACTION_CHECKPOINT:
			return "idem_checkpoint()";
		case IDEM_ACTION_RELEASE:
			return "idem_release()";
	}
	return NULL;				/* keep compiler quiet */
}

/*
 * IdemKeyAct completes, checkpoints or releases a key that the caller holds:
 * an in-progress claim made by this transaction, or one whose token the
 * caller passes.  Everything is checked before the row is changed.
 */
static void
IdemKeyAct(FunctionCallInfo fcinfo, IdemKeyAction action, int scope_argno,
		   int token_argno)
{
	text	   *key;
	bool		has_token = !PG_ARGISNULL(token_argno);
	int64		token = has_token ? PG_GETARG_INT64(token_argno) : 0;
	const char *keystr;
	IdemDigest	digest;
	IdemOp		op;
	int64		response_size = 0;
	text	   *recovery_point = NULL;
	ItemPointerData newtid;
	IdemOwnClaim *claim;

	IdemCheckLibraryVersion();
	key = IdemCheckKeyArg(fcinfo, 0, "key");
	IdemKeyDigest(IdemCheckScopeArg(fcinfo, scope_argno, "scope"), key, &digest);
	keystr = IdemKeyForMessage(text_to_cstring(key));
	if (action == IDEM_ACTION_COMPLETE)
		response_size = IdemResponseArgs(fcinfo);
	else if (action == IDEM_ACTION_CHECKPOINT)
		recovery_point = IdemCheckKeyArg(fcinfo, 1, "recovery_point");
	IdemCheckWritable(IdemActionName(action));

	IdemOpInit(&op, IDEM_LEDGER_KEYS, GetUserId(), &digest);
	claim = IdemOwnClaimFind(op.role, &op.digest.uuid);
	if (claim == NULL && !OidIsValid(IdemLedgerParent(op.ledger, false)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency key \"%s\" is not claimed", keystr),
				 errhint("Call idem_claim() first.")));

	/*
	 * Take the key lock even for our own claim (a claim of this
	 * transaction, whose row is where we left it).  No other transaction
	 * can change that row, but our update may move it to another page (no
	 * room for a HOT update), and a probe's index scan is not atomic: it
	 * reads the index entries first and the rows after.  A probe that read
	 * the entries before the new version's entry was added, and reaches the
	 * old version after we have committed, would find neither and claim the
	 * key a second time.  Under the key lock, moves and probes take turns.
	 */
	CHECK_FOR_INTERRUPTS();
	(void) IdemOpLock(&op, false);
	if (claim == NULL || !IdemOpFetchOwn(&op, &claim->part, &claim->tid))
		IdemOpProbe(&op, RowExclusiveLock, NULL);
	IdemKeyActCheck(&op, keystr, has_token, token);

	switch (action)
	{
		case IDEM_ACTION_COMPLETE:
			IdemKeySetResponse(fcinfo, &op, response_size);
			op.values[Anum_keys_state - 1] = CharGetDatum(KEY_COMPLETED);
			break;
		case IDEM_ACTION_CHECKPOINT:
			op.values[Anum_keys_recovery_point - 1] = PointerGetDatum(recovery_point);
			op.nulls[Anum_keys_recovery_point - 1] = false;
			break;
		case IDEM_ACTION_RELEASE:
			op.values[Anum_keys_state - 1] = CharGetDatum(KEY_RELEASED);
			break;
	}
	if (action != IDEM_ACTION_CHECKPOINT)
	{
		/* resolved: nobody can recover it, its waiters get their answer */
		op.nulls[Anum_keys_lease_until - 1] = true;
		op.nulls[Anum_keys_recover_at - 1] = true;
		IdemWaitNoteChange(&op.keytag);
	}
	IdemOpUpdate(&op, &newtid);

	/* keep the own claims in step: where the row is, and if resolved */
	if (op.probe.found == IDEM_FOUND_MINE && claim != NULL)
	{
		IdemOwnClaimMoved(claim, &op.open[op.probe.which].part, &newtid);
		if (action != IDEM_ACTION_CHECKPOINT)
			IdemOwnClaimResolved(claim);
	}
	IdemOpEnd(&op);
	IdemCitusEndCall();
}

/*
 * IdemResponseArgs checks the response arguments of idem_complete() and
 * returns the size they take (see responses.c), before the key is locked.
 */
static int64
IdemResponseArgs(FunctionCallInfo fcinfo)
{
	int32		response_code;
	int64		size = 0;
	bool		has_raw = PG_NARGS() > 6 && !PG_ARGISNULL(6);

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("response_code must not be null")));
	response_code = PG_GETARG_INT32(1);
	if (response_code < 100 || response_code > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response_code %d is out of range", response_code),
				 errdetail("An HTTP status code is between 100 and 599.")));
	if (has_raw && !PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response_body and response_raw cannot both be given"),
				 errhint("Pass a JSON body as response_body, or the exact bytes of any body as response_raw.")));
	if (!PG_ARGISNULL(2))
		size += IdemJsonbTextSize(PG_GETARG_DATUM(2));
	if (has_raw)
		size += VARSIZE_ANY_EXHDR(PG_GETARG_BYTEA_PP(6));
	if (PG_NARGS() > 5 && !PG_ARGISNULL(5))
	{
		IdemCheckResponseHeaders(PG_GETARG_DATUM(5));
		size += IdemJsonbTextSize(PG_GETARG_DATUM(5));
	}
	IdemCheckStoredSize(size, "idem_complete()");
	return size;
}

/*
 * IdemKeySetResponse puts idem_complete()'s response into the key's row,
 * "size" bytes together with the request the row keeps, if any.
 */
static void
IdemKeySetResponse(FunctionCallInfo fcinfo, IdemOp *op, int64 size)
{
	if (!op->nulls[Anum_keys_kept_request - 1])
		IdemCheckStoredSize(size + IdemJsonbTextSize(op->values[Anum_keys_kept_request - 1]),
							"idem_complete()");
	op->values[Anum_keys_response_code - 1] = PG_GETARG_DATUM(1);
	op->nulls[Anum_keys_response_code - 1] = false;
	op->values[Anum_keys_response_body - 1] = PG_GETARG_DATUM(2);
	op->nulls[Anum_keys_response_body - 1] = PG_ARGISNULL(2);
	op->nulls[Anum_keys_response_headers - 1] = PG_NARGS() <= 5 || PG_ARGISNULL(5);
	if (!op->nulls[Anum_keys_response_headers - 1])
		op->values[Anum_keys_response_headers - 1] = PG_GETARG_DATUM(5);
	op->nulls[Anum_keys_response_raw - 1] = PG_NARGS() <= 6 || PG_ARGISNULL(6);
	if (!op->nulls[Anum_keys_response_raw - 1])
		op->values[Anum_keys_response_raw - 1] = PG_GETARG_DATUM(6);
}

/*
 * IdemKeyActCheck raises the error for a complete, checkpoint or release of
 * a key the caller does not hold, given what was found.
 */
static void
IdemKeyActCheck(IdemOp *op, const char *keystr, bool has_token, int64 token)
{
	if (op->probe.found == IDEM_FOUND_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency key \"%s\" is not claimed", keystr),
				 errdetail("There is no live claim of this key: it was never claimed, was released, or has expired."),
				 errhint("Call idem_claim() first.")));
	if (op->probe.found == IDEM_FOUND_BUSY)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("idempotency key \"%s\" is held by another transaction", keystr)));

	/*
	 * A token that is not the key's current one is stale whatever the new
	 * holder has done since (completed, released): its holder must learn
	 * that someone else took over, not that "its" key is completed.
	 */
	if (has_token && token != DatumGetInt64(op->values[Anum_keys_token - 1]))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("token " INT64_FORMAT " of idempotency key \"%s\" is stale",
						token, keystr),
				 errdetail("The key's current claim has another token: it was claimed again since that token was issued, or the token is wrong."),
				 errhint("Stop working on this request; its new holder will finish it.")));
	if (IdemRowState(op) == KEY_RELEASED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency key \"%s\" is not claimed", keystr),
				 errdetail("There is no live claim of this key: it was never claimed, was released, or has expired."),
				 errhint("Call idem_claim() first.")));
	if (IdemRowState(op) == KEY_COMPLETED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency key \"%s\" is already completed", keystr)));
	if (!has_token && op->probe.found != IDEM_FOUND_MINE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency key \"%s\" was not claimed by this transaction", keystr),
				 errhint("Pass the token idem_claim() returned.")));
}

/*
 * IdemRecoverKey takes over, for idem_recover(), a claim kept with
 * keep_request whose lease has lapsed: if no other transaction holds the
 * key lock (another recoverer, or a caller claiming the key: such a key is
 * skipped, not waited for) and the key's committed row is still such a
 * claim, it gets a new token and a lease of "lease" (clipped to the key's
 * expiry), stays where it is (same expiry), and becomes this transaction's
 * claim.  Returns whether it was taken, and then the row in *out.
 */
bool
IdemRecoverKey(Oid role, const IdemDigest *digest, Datum lease,
			   IdemRecovered *out)
{
	IdemOp		op;
	ItemPointerData newtid;
	TimestampTz lease_until;
	bool		taken;

	IdemOpInit(&op, IDEM_LEDGER_KEYS, role, digest);
	if (!IdemOpLock(&op, true))
		return false;
	IdemOpProbe(&op, RowExclusiveLock, NULL);
	taken = op.probe.found == IDEM_FOUND_DONE &&
		IdemRowState(&op) == KEY_IN_PROGRESS &&
		!op.nulls[Anum_keys_recover_at - 1] &&
		DatumGetTimestampTz(op.values[Anum_keys_lease_until - 1]) <= op.now;
	if (taken)
	{
		out->lapsed_at = DatumGetTimestampTz(op.values[Anum_keys_lease_until - 1]);
		lease_until = IdemTimestampPlus(op.now, DatumGetIntervalP(lease));
		lease_until = Min(lease_until, IdemRowExpiry(&op));
		op.values[Anum_keys_token - 1] =
			Int64GetDatum(IdemNextToken(op.now,
										DatumGetInt64(op.values[Anum_keys_token - 1])));
		op.values[Anum_keys_claimed_at - 1] = TimestampTzGetDatum(op.now);
		op.values[Anum_keys_lease_until - 1] = TimestampTzGetDatum(lease_until);
		op.values[Anum_keys_recover_at - 1] = TimestampTzGetDatum(lease_until);
		IdemOpUpdate(&op, &newtid);
		(void) IdemOwnClaimAdd(role, &digest->uuid,
							   TextDatumGetCString(op.values[Anum_keys_kept_key - 1]),
							   false, &op.open[op.probe.which].part, &newtid);
		out->token = DatumGetInt64(op.values[Anum_keys_token - 1]);
		out->recovery_point = op.nulls[Anum_keys_recovery_point - 1] ? (Datum) 0 :
			op.values[Anum_keys_recovery_point - 1];
		out->request = op.nulls[Anum_keys_kept_request - 1] ? (Datum) 0 :
			op.values[Anum_keys_kept_request - 1];
	}
	IdemOpEnd(&op);
	return taken;
}

/*
 * IdemImportKey stores a key's row brought from another node
 * (idempotency.import_key()): "values"/"nulls" hold every column of the key
 * ledger but the digest, role and lane, for role "role" and digest "digest"
 * (current form).  A live local row of the key is replaced only by a newer
 * one (see IdemImportIsNewer).  Waits for transactions writing the key, as
 * a claim does.
 */
IdemImportOutcome
IdemImportKey(Oid role, const pg_uuid_t *digest, Datum *values, bool *nulls)
{
	IdemImport	imp;
	IdemDigest	d;
	IdemOp		op;

	d.uuid = *digest;
	memcpy(d.legacy_head, digest->data, IDEM_DIGEST_PREFIX_LEN);
	IdemOpInit(&op, IDEM_LEDGER_KEYS, role, &d);
	if (DatumGetTimestampTz(values[Anum_ledger_expires_at - 1]) <= op.now)
		return IDEM_IMPORT_EXPIRED;
	(void) IdemLedgerParent(IDEM_LEDGER_KEYS, true);

	imp.values = values;
	imp.nulls = nulls;
	IdemOpRun(&op, false, IdemImportStep, &imp);
	return imp.outcome;
}

/* the step of IdemImportKey: keep the local row, or write the imported one */
static IdemStep
IdemImportStep(IdemOp *op, void *arg)
{
	IdemImport *imp = (IdemImport *) arg;

	op->expires_at = DatumGetTimestampTz(imp->values[Anum_ledger_expires_at - 1]);
	if (op->expires_at <= op->now)
	{
		imp->outcome = IDEM_IMPORT_EXPIRED; /* while we waited */
		return IDEM_STEP_DONE;
	}
	if (op->probe.found == IDEM_FOUND_BUSY)
		return IDEM_STEP_WAIT;
	if (op->probe.found == IDEM_FOUND_MINE)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot import an idempotency key this transaction has written")));
	if (op->probe.found == IDEM_FOUND_DONE && !IdemImportIsNewer(op, imp))
	{
		imp->outcome = IDEM_IMPORT_KEPT;
		return IDEM_STEP_DONE;
	}
	if (!IdemOpFindTarget(op))
		return IDEM_STEP_MAKE_TARGET;

	/* the imported row, written in place of the local one if any */
	memcpy(op->values, imp->values, sizeof(op->values));
	memcpy(op->nulls, imp->nulls, sizeof(op->nulls));
	if (op->probe.found == IDEM_FOUND_DONE)
	{
		imp->outcome = IDEM_IMPORT_REPLACED;
		IdemOpReplace(op, NULL);
		/* a waiter for the key's holder answers for the imported state */
		IdemWaitNoteChange(&op->keytag);
	}
	else
	{
		imp->outcome = IDEM_IMPORT_INSERTED;
		IdemOpInsert(op, NULL);
	}
	return IDEM_STEP_DONE;
}

/*
 * IdemImportIsNewer: is the imported version of the key newer than the
 * local row found?  A larger token is, or the same token in a state that
 * follows the local one (completed or released after in progress, or in
 * progress again, with another recovery point, for the node being moved
 * from owns the key); but a completed key is final: it is never claimed
 * again while it lives, so nothing but a later completion replaces it.
 */
static bool
IdemImportIsNewer(IdemOp *op, IdemImport *imp)
{
	int64		token = DatumGetInt64(imp->values[Anum_keys_token - 1]);
	char		state = DatumGetChar(imp->values[Anum_keys_state - 1]);
	int64		local_token = DatumGetInt64(op->values[Anum_keys_token - 1]);
	char		local_state = IdemRowState(op);
	bool		same_point;

	if (token < local_token ||
		(token == local_token && local_state != KEY_IN_PROGRESS) ||
		(local_state == KEY_COMPLETED && state != KEY_COMPLETED))
		return false;
	if (token > local_token || state != KEY_IN_PROGRESS)
		return true;

	/* the same claim in progress: newer only if a checkpoint moved on */
	if (imp->nulls[Anum_keys_recovery_point - 1] ||
		op->nulls[Anum_keys_recovery_point - 1])
		same_point = imp->nulls[Anum_keys_recovery_point - 1] ==
			op->nulls[Anum_keys_recovery_point - 1];
	else
	{
		text	   *a = DatumGetTextPP(imp->values[Anum_keys_recovery_point - 1]);
		text	   *b = DatumGetTextPP(op->values[Anum_keys_recovery_point - 1]);

		same_point = VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
			memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
	}
	return !same_point;
}

/*
 * idem_lookup(key text, scope text)
 *		RETURNS TABLE (status text, token bigint, recovery_point text,
 *					   response_code int, response_body jsonb,
 *					   claimed_at timestamptz, expires_at timestamptz,
 *					   lease_expires_at timestamptz, response_headers jsonb,
 *					   response_raw bytea, request jsonb)
 *
 * (the last three since 0.4.0: request is the one kept with keep_request).
 * The caller's own live record of one key, for support work.  Reads only:
 * takes no key lock and works on a standby.
 */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemDigest	digest;
	IdemOp		op;
	Datum		values[Natts_lookup_result];
	bool		nulls[Natts_lookup_result];
	const char *status;
	Snapshot	snapshot;

	IdemCheckLibraryVersion();
	IdemKeyDigest(IdemCheckScopeArg(fcinfo, 1, "scope"),
				  IdemCheckKeyArg(fcinfo, 0, "key"), &digest);
	InitMaterializedSRF(fcinfo, 0);
	if (!OidIsValid(IdemLedgerParent(IDEM_LEDGER_KEYS, false)))
	{
		IdemCitusEndCall();
		return (Datum) 0;
	}
	IdemOpInit(&op, IDEM_LEDGER_KEYS, GetUserId(), &digest);

	/*
	 * Probe under a fresh MVCC snapshot: it shows the last committed state
	 * of the key, or this transaction's own, and never misses a row that a
	 * writer moves while we look (see IdemProbe()).  Calls earlier in this
	 * statement are seen too.  The partitions are listed after the snapshot
	 * is taken, so that those made by transactions it sees are known.
	 */
	IdemSeeOwnWrites();
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IdemOpProbe(&op, AccessShareLock, snapshot);
	UnregisterSnapshot(snapshot);
	IdemOpEnd(&op);
	IdemCitusEndCall();
	if (op.probe.tuple == NULL && op.probe.remembered)
	{
		/* expired and remembered (memory.c): nothing but the status */
		memset(nulls, true, sizeof(nulls));
		values[0] = CStringGetTextDatum("expired");
		nulls[0] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		return (Datum) 0;
	}
	if (op.probe.tuple == NULL)
		return (Datum) 0;

	switch (IdemRowState(&op))
	{
		case KEY_COMPLETED:
			status = "completed";
			break;
		case KEY_RELEASED:
			status = "released";
			break;
		default:
			status = "in_progress";
			break;
	}
	values[0] = CStringGetTextDatum(status);
	nulls[0] = false;
	values[1] = op.values[Anum_keys_token - 1];
	nulls[1] = false;
	values[2] = op.values[Anum_keys_recovery_point - 1];
	nulls[2] = op.nulls[Anum_keys_recovery_point - 1];
	values[3] = op.values[Anum_keys_response_code - 1];
	nulls[3] = op.nulls[Anum_keys_response_code - 1];
	values[4] = op.values[Anum_keys_response_body - 1];
	nulls[4] = op.nulls[Anum_keys_response_body - 1];
	values[5] = op.values[Anum_keys_claimed_at - 1];
	nulls[5] = false;
	values[6] = op.values[Anum_ledger_expires_at - 1];
	nulls[6] = false;
	values[7] = op.values[Anum_keys_lease_until - 1];
	nulls[7] = op.nulls[Anum_keys_lease_until - 1];
	values[8] = op.values[Anum_keys_response_headers - 1];
	nulls[8] = op.nulls[Anum_keys_response_headers - 1];
	values[9] = op.values[Anum_keys_response_raw - 1];
	nulls[9] = op.nulls[Anum_keys_response_raw - 1];
	values[10] = op.values[Anum_keys_kept_request - 1];
	nulls[10] = op.nulls[Anum_keys_kept_request - 1];
	/* the result type of the installed version: 8 or 11 columns */
	if (rsinfo->setDesc->natts != 8 && rsinfo->setDesc->natts != Natts_lookup_result)
		elog(ERROR, "return type must have 8 or %d columns", Natts_lookup_result);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

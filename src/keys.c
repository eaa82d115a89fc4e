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
 * probe.c, so operations on one key are serialized, and waits for
 * transactions that are writing its row.  That includes completing or
 * releasing a claim of the caller's own transaction: no other transaction
 * can change that row, but an update that moves the row to another page
 * must not overlap another caller's probe (see IdemKeyAct).  Rows are
 * updated in place (same partition: expires_at never changes).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keys.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"

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

PG_FUNCTION_INFO_V1(idem_claim);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_lookup);

/* Columns of idem_claim()'s result */
#define Natts_claim_result			6

/* What idem_complete(), idem_checkpoint() and idem_release() do */
typedef enum IdemKeyAction
{
	IDEM_ACTION_COMPLETE,
	IDEM_ACTION_CHECKPOINT,
	IDEM_ACTION_RELEASE
} IdemKeyAction;

/* One key operation in progress: the key lock and the partitions it opened */
typedef struct IdemKeyOp
{
	IdemLedger	ledger;
	Oid			role;
	IdemDigest	digest;
	TimestampTz now;
	LOCKTAG		keytag;
	bool		key_locked;		/* holds the key lock */
	int			nopen;
	IdemOpenPartition *open;	/* palloc'd by the probe */
	IdemProbeResult probe;
	Datum		values[Natts_keys];
	bool		nulls[Natts_keys];
} IdemKeyOp;

static bool IdemFetchOwnRow(IdemOwnClaim *claim, IdemKeyOp *op);
static bool IdemKeyOpBegin(IdemKeyOp *op, bool nowait);
static bool IdemKeyOpLock(IdemKeyOp *op, bool nowait);
static void IdemKeyOpProbe(IdemKeyOp *op, LOCKMODE lockmode, Snapshot snapshot);
static void IdemKeyOpEnd(IdemKeyOp *op, bool keep_key_lock);
static void IdemKeyOpMakeTarget(IdemKeyOp *op, TimestampTz expires_at);
static void IdemKeyOpDigest(IdemKeyOp *op, text *scope, text *key);
static void IdemClaimClock(FunctionCallInfo fcinfo, IdemKeyOp *op,
						   TimestampTz *expires_at, TimestampTz *lease_until);
static char IdemRowState(IdemKeyOp *op);
static Datum IdemClaimResult(FunctionCallInfo fcinfo, const char *status,
							 IdemKeyOp *op, bool with_token,
							 bool with_response, TimestampTz expires_at);
static void IdemKeyAct(FunctionCallInfo fcinfo, IdemKeyAction action,
					   int scope_argno, int token_argno);
static const char *IdemActionName(IdemKeyAction action);

/*
 * IdemFetchOwnRow reads the current version of a row this transaction
 * wrote, where the own-claim list says it is, into op as if a probe had
 * found it (MINE), without a probe: no other transaction changes a row
 * whose writer is still in progress.  Returns false if the row is not there
 * any more (its version was undone), and the caller probes instead.
 */
static bool
IdemFetchOwnRow(IdemOwnClaim *claim, IdemKeyOp *op)
{
	HeapTupleData tuple;
	Buffer		buffer;
	Relation	heap;
	bool		isnull;

	if (!OidIsValid(claim->part.relid))
		return false;

	LockRelationOid(claim->part.relid, RowExclusiveLock);
	op->open = palloc(sizeof(IdemOpenPartition));
	IdemOpenPartitionRels(&op->open[0], op->ledger, &claim->part,
						  RowExclusiveLock);
	op->nopen = 1;
	heap = op->open[0].heap;
	tuple.t_self = claim->tid;
	if (!heap_fetch(heap, SnapshotSelf, &tuple, &buffer, false))
	{
		IdemClosePartitions(op->open, op->nopen);
		op->nopen = 0;
		return false;
	}
	op->probe.tuple = heap_copytuple(&tuple);
	ReleaseBuffer(buffer);

	if (!TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(op->probe.tuple->t_data)) ||
		DatumGetObjectId(heap_getattr(op->probe.tuple, Anum_ledger_role,
									  RelationGetDescr(heap), &isnull)) != claim->role)
	{
		IdemClosePartitions(op->open, op->nopen);
		op->nopen = 0;
		return false;
	}

	op->probe.found = IDEM_FOUND_MINE;
	op->probe.xwait = InvalidTransactionId;
	op->probe.which = 0;
	op->probe.tid = claim->tid;
	heap_deform_tuple(op->probe.tuple, RelationGetDescr(heap),
					  op->values, op->nulls);
	return true;
}

/*
 * IdemKeyOpDigest sets the digest of (scope, key).
 */
static void
IdemKeyOpDigest(IdemKeyOp *op, text *scope, text *key)
{
	IdemComputeDigest(VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope),
					  VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), &op->digest);
}

/*
 * IdemKeyOpBegin takes the key lock, opens the live partitions of the key's
 * lane and probes them.  The row found, if any, is deformed into
 * op->values/op->nulls.  With nowait, it does not wait for the key lock:
 * it returns false if another transaction holds it, after probing anyway
 * (without the lock the probe may miss a row that is being written).
 */
static bool
IdemKeyOpBegin(IdemKeyOp *op, bool nowait)
{
	bool		locked = IdemKeyOpLock(op, nowait);

	/* see every partition committed before we got the key lock */
	AcceptInvalidationMessages();
	IdemKeyOpProbe(op, RowExclusiveLock, NULL);
	return locked;
}

/*
 * IdemKeyOpLock takes the key lock; with nowait, returns false instead of
 * waiting if another transaction holds it.
 */
static bool
IdemKeyOpLock(IdemKeyOp *op, bool nowait)
{
	op->key_locked = LockAcquire(&op->keytag, ExclusiveLock, false, nowait) !=
		LOCKACQUIRE_NOT_AVAIL;
	return op->key_locked;
}

/*
 * IdemKeyOpProbe opens the live partitions of the key's lane in the given
 * lock mode and probes them, with the given MVCC snapshot or, if none, a
 * dirty one (see IdemProbe()); the row found, if any, is deformed into
 * op->values/op->nulls.
 */
static void
IdemKeyOpProbe(IdemKeyOp *op, LOCKMODE lockmode, Snapshot snapshot)
{
	op->nopen = IdemOpenLivePartitions(op->ledger, &op->digest.uuid, op->now,
									   lockmode, &op->open);
	IdemProbe(op->open, op->nopen, op->role, &op->digest, op->now, true,
			  snapshot, &op->probe);
	if (op->probe.tuple != NULL)
		heap_deform_tuple(op->probe.tuple,
						  RelationGetDescr(op->open[op->probe.which].heap),
						  op->values, op->nulls);
}

/* closes the partitions and, unless told to keep it, releases the key lock */
static void
IdemKeyOpEnd(IdemKeyOp *op, bool keep_key_lock)
{
	IdemClosePartitions(op->open, op->nopen);
	op->nopen = 0;
	if (op->key_locked && !keep_key_lock)
		LockRelease(&op->keytag, ExclusiveLock, false);
	op->key_locked = false;
}

/*
 * IdemKeyOpMakeTarget ends the operation and has the partition a new row
 * expiring at expires_at goes to made; the caller starts over.  The key
 * lock goes first, unless we hold DDL locks on the ledger already (see
 * IdemMakeTarget), in which case it is kept.
 */
static void
IdemKeyOpMakeTarget(IdemKeyOp *op, TimestampTz expires_at)
{
	IdemKeyOpEnd(op, IdemPartitionDDLHeld(op->ledger));
	IdemMakeTarget(op->ledger, &op->digest.uuid, op->now, expires_at);
}

/* state of the row found */
static char
IdemRowState(IdemKeyOp *op)
{
	return DatumGetChar(op->values[Anum_keys_state - 1]);
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
 * IdemClaimClock reads the clock into op->now and computes from it the
 * expiry and, with a lease, the lease's end of a claim made now, checking
 * the ttl and lease arguments of idem_claim().
 */
static void
IdemClaimClock(FunctionCallInfo fcinfo, IdemKeyOp *op, TimestampTz *expires_at,
			   TimestampTz *lease_until)
{
	op->now = GetCurrentTimestamp();
	*expires_at = IdemExpiresAt(fcinfo, 3, op->now, idem_key_ttl,
								"idempotency.key_ttl");
	*lease_until = 0;
	if (PG_ARGISNULL(4))
		return;
	*lease_until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														   TimestampTzGetDatum(op->now),
														   PG_GETARG_DATUM(4)));
	if (*lease_until <= op->now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be a positive interval")));
	if (*lease_until > *expires_at)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must not be longer than the key's ttl"),
				 errhint("Pass a longer ttl or a shorter lease.")));
}

/*
 * idem_claim(key text, request jsonb, scope text, ttl interval,
 *			  lease interval, wait boolean)
 *		RETURNS (status text, token bigint, recovery_point text,
 *				 response_code int, response_body jsonb,
 *				 expires_at timestamptz)
 */
Datum
idem_claim(PG_FUNCTION_ARGS)
{
	text	   *key = IdemCheckKeyArg(fcinfo, 0, "key");
	text	   *scope = IdemCheckScopeArg(fcinfo, 2, "scope");
	bytea	   *fingerprint = NULL;
	bytea	   *legacy_fingerprint = NULL;
	bool		has_lease = !PG_ARGISNULL(4);
	TimestampTz lease_until = 0;
	TimestampTz expires_at;
	bool		wait;
	IdemKeyOp	opdata;
	IdemKeyOp  *op = &opdata;

	IdemCheckLibraryVersion();
	op->ledger = IDEM_LEDGER_KEYS;
	op->role = GetUserId();
	IdemClaimClock(fcinfo, op, &expires_at, &lease_until);
	if (PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("wait must not be null")));
	wait = PG_GETARG_BOOL(5);
	IdemCheckWritable("idem_claim()");

	if (!PG_ARGISNULL(1))
		fingerprint = IdemFingerprint(PG_GETARG_DATUM(1), &legacy_fingerprint);
	IdemKeyOpDigest(op, scope, key);
	(void) IdemLedgerParent(op->ledger, true);
	IdemSetKeyLockTag(&op->keytag, op->ledger, op->role, &op->digest.uuid);

	for (;;)
	{
		char		state;
		int			i;
		int			target;
		int64		previous_token = 0;
		bool		keep_key_lock;
		ItemPointerData newtid;

		CHECK_FOR_INTERRUPTS();
		if (!IdemKeyOpBegin(op, !wait) &&
			!(op->probe.found == IDEM_FOUND_MINE &&
			  IdemRowState(op) != KEY_RELEASED) &&
			!(op->probe.found == IDEM_FOUND_DONE &&
			  IdemRowState(op) == KEY_COMPLETED))
		{
			/*
			 * Another transaction holds the key lock: it is writing this key
			 * right now, or holds it in a partition it made itself, which we
			 * cannot see yet.  Only answers that write nothing can be given
			 * without the key lock: our own claim, or a committed completed
			 * key.  Claiming afresh a key we released ourselves writes, and
			 * every write holds the key lock; anything else is in progress.
			 */
			IdemKeyOpEnd(op, false);
			return IdemClaimResult(fcinfo, "in_progress", op, false, false,
								   op->probe.tuple != NULL ?
								   DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]) : 0);
		}

		if (op->probe.found == IDEM_FOUND_BUSY)
		{
			IdemKeyOpEnd(op, false);
			if (!wait)
				return IdemClaimResult(fcinfo, "in_progress", op, false, false,
									   DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]));
			/*
			 * Wait for the holder, then answer for its outcome.  A claim
			 * made after the wait counts its ttl and lease from then: its
			 * row must never be written already expired (see IdemProbe).
			 */
			XactLockTableWait(op->probe.xwait, NULL, NULL, XLTW_None);
			IdemClaimClock(fcinfo, op, &expires_at, &lease_until);
			continue;
		}

		if (op->probe.found == IDEM_FOUND_NONE)
		{
			target = IdemOpenTarget(op->ledger, &op->digest.uuid, op->now, expires_at,
									op->open, op->nopen);
			if (target < 0)
			{
				IdemKeyOpMakeTarget(op, expires_at);
				continue;
			}
			memset(op->nulls, true, sizeof(op->nulls));
			op->values[Anum_ledger_expires_at - 1] = TimestampTzGetDatum(expires_at);
			op->values[Anum_ledger_digest - 1] = UUIDPGetDatum(&op->digest.uuid);
			op->values[Anum_ledger_role - 1] = ObjectIdGetDatum(op->role);
			op->values[Anum_ledger_lane - 1] = Int16GetDatum(op->open[target].part.lane);
			op->values[Anum_keys_state - 1] = CharGetDatum(KEY_IN_PROGRESS);
			op->values[Anum_keys_token - 1] = Int64GetDatum(IdemNextToken(op->now, 0));
			op->values[Anum_keys_claimed_at - 1] = TimestampTzGetDatum(op->now);
			op->values[Anum_keys_lease_until - 1] = TimestampTzGetDatum(lease_until);
			op->values[Anum_keys_fingerprint - 1] = PointerGetDatum(fingerprint);
			for (i = 0; i < Anum_keys_claimed_at; i++)
				op->nulls[i] = false;
			op->nulls[Anum_keys_lease_until - 1] = !has_lease;
			op->nulls[Anum_keys_fingerprint - 1] = (fingerprint == NULL);
			keep_key_lock = IdemInsertRow(&op->open[target], op->values, op->nulls,
										  &newtid);
			IdemKeyOpEnd(op, keep_key_lock);
			(void) IdemOwnClaimAdd(op->role, &op->digest.uuid, text_to_cstring(key),
								   !has_lease, &op->open[target].part, &newtid);
			return IdemClaimResult(fcinfo, "claimed", op, true, false, expires_at);
		}

		/* a live row, committed or our own */
		state = IdemRowState(op);
		if (state != KEY_RELEASED && fingerprint != NULL &&
			!op->nulls[Anum_keys_fingerprint - 1])
		{
			bytea	   *stored = DatumGetByteaPP(op->values[Anum_keys_fingerprint - 1]);

			if (!IdemSameFingerprint(stored, fingerprint) &&
				(legacy_fingerprint == NULL ||
				 !IdemSameFingerprint(stored, legacy_fingerprint)))
			{
				IdemKeyOpEnd(op, false);
				return IdemClaimResult(fcinfo, "mismatch", op, false, false,
									   DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]));
			}
		}

		if (state == KEY_COMPLETED)
		{
			IdemKeyOpEnd(op, false);
			return IdemClaimResult(fcinfo, "completed", op, false, true,
								   DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]));
		}

		if (state == KEY_IN_PROGRESS)
		{
			bool		lapsed = !op->nulls[Anum_keys_lease_until - 1] &&
				DatumGetTimestampTz(op->values[Anum_keys_lease_until - 1]) <= op->now;

			if (op->probe.found == IDEM_FOUND_MINE)
			{
				/* claimed earlier in this transaction: same claim */
				IdemKeyOpEnd(op, false);
				return IdemClaimResult(fcinfo, "claimed", op, true, false,
									   DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]));
			}
			if (!lapsed)
			{
				IdemKeyOpEnd(op, false);
				return IdemClaimResult(fcinfo, "in_progress", op, false, false,
									   DatumGetTimestampTz(op->values[Anum_ledger_expires_at - 1]));
			}
			/* the lease lapsed: take the key over, keeping its fingerprint */
		}
		else
		{
			/* released: start fresh, with this request's fingerprint */
			op->values[Anum_keys_fingerprint - 1] = PointerGetDatum(fingerprint);
			op->nulls[Anum_keys_fingerprint - 1] = (fingerprint == NULL);
		}

		/*
		 * A fresh claim of the key, with its own ttl: the old row goes, and
		 * the new one goes to the partition of its new expiry.  Concurrent
		 * probes see both as being written by us until we end.
		 */
		target = IdemOpenTarget(op->ledger, &op->digest.uuid, op->now, expires_at,
								op->open, op->nopen);
		if (target < 0)
		{
			IdemKeyOpMakeTarget(op, expires_at);
			continue;
		}
		previous_token = DatumGetInt64(op->values[Anum_keys_token - 1]);
		/* the new row has the current digest form, whatever the old one had */
		op->values[Anum_ledger_digest - 1] = UUIDPGetDatum(&op->digest.uuid);
		op->values[Anum_ledger_expires_at - 1] = TimestampTzGetDatum(expires_at);
		op->values[Anum_ledger_lane - 1] = Int16GetDatum(op->open[target].part.lane);
		op->values[Anum_keys_state - 1] = CharGetDatum(KEY_IN_PROGRESS);
		op->values[Anum_keys_token - 1] = Int64GetDatum(IdemNextToken(op->now, previous_token));
		op->values[Anum_keys_claimed_at - 1] = TimestampTzGetDatum(op->now);
		op->values[Anum_keys_lease_until - 1] = TimestampTzGetDatum(lease_until);
		op->nulls[Anum_keys_lease_until - 1] = !has_lease;
		op->nulls[Anum_keys_response_code - 1] = true;
		op->nulls[Anum_keys_response_body - 1] = true;
		IdemSeeOwnWrites();
		simple_heap_delete(op->open[op->probe.which].heap, &op->probe.tid);
		keep_key_lock =
			op->open[op->probe.which].heap->rd_createSubid != InvalidSubTransactionId;
		if (IdemInsertRow(&op->open[target], op->values, op->nulls, &newtid))
			keep_key_lock = true;
		IdemKeyOpEnd(op, keep_key_lock);
		(void) IdemOwnClaimAdd(op->role, &op->digest.uuid, text_to_cstring(key),
							   !has_lease, &op->open[target].part, &newtid);
		return IdemClaimResult(fcinfo, "claimed", op, true, false, expires_at);
	}
}

/*
 * IdemClaimResult builds idem_claim()'s result from the row in op: the token
 * and recovery point only for the caller that now holds the key, the
 * response only for a completed key.
 */
static Datum
IdemClaimResult(FunctionCallInfo fcinfo, const char *status, IdemKeyOp *op,
				bool with_token, bool with_response, TimestampTz expires_at)
{
	TupleDesc	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;
	Datum		values[Natts_claim_result];
	bool		nulls[Natts_claim_result];

	/*
	 * The result's row type, once per call site: not for the backend's
	 * life, as the type is made again by DROP and CREATE EXTENSION.
	 */
	if (tupdesc == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		TupleDesc	desc;

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(desc));
		fcinfo->flinfo->fn_extra = tupdesc;
		MemoryContextSwitchTo(oldcxt);
	}

	if (strcmp(status, "claimed") == 0)
		IdemStatsAdd(IDEM_STAT_CLAIMS, 1);
	else if (strcmp(status, "completed") == 0)
		IdemStatsAdd(IDEM_STAT_REPLAYS, 1);
	else if (strcmp(status, "in_progress") == 0)
		IdemStatsAdd(IDEM_STAT_CONFLICTS, 1);
	else
		IdemStatsAdd(IDEM_STAT_MISMATCHES, 1);

	memset(nulls, true, sizeof(nulls));
	values[0] = CStringGetTextDatum(status);
	nulls[0] = false;
	if (with_token)
	{
		values[1] = op->values[Anum_keys_token - 1];
		nulls[1] = false;
		values[2] = op->values[Anum_keys_recovery_point - 1];
		nulls[2] = op->nulls[Anum_keys_recovery_point - 1];
	}
	if (with_response)
	{
		values[3] = op->values[Anum_keys_response_code - 1];
		nulls[3] = op->nulls[Anum_keys_response_code - 1];
		values[4] = op->values[Anum_keys_response_body - 1];
		nulls[4] = op->nulls[Anum_keys_response_body - 1];
	}
	values[5] = TimestampTzGetDatum(expires_at);
	nulls[5] = (expires_at == 0);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * idem_complete(key text, response_code int, response_body jsonb,
 *				 scope text, token bigint) RETURNS void
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
	text	   *key = IdemCheckKeyArg(fcinfo, 0, "key");
	text	   *scope = IdemCheckScopeArg(fcinfo, scope_argno, "scope");
	bool		has_token = !PG_ARGISNULL(token_argno);
	int64		token = has_token ? PG_GETARG_INT64(token_argno) : 0;
	const char *keystr = IdemKeyForMessage(text_to_cstring(key));
	IdemKeyOp	opdata;
	IdemKeyOp  *op = &opdata;
	int32		response_code = 0;
	text	   *recovery_point = NULL;
	HeapTuple	newtuple;
	bool		keep_key_lock;
	IdemOwnClaim *claim;

	IdemCheckLibraryVersion();
	if (action == IDEM_ACTION_COMPLETE)
	{
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
	}
	else if (action == IDEM_ACTION_CHECKPOINT)
		recovery_point = IdemCheckKeyArg(fcinfo, 1, "recovery_point");
	IdemCheckWritable(IdemActionName(action));

	op->ledger = IDEM_LEDGER_KEYS;
	op->role = GetUserId();
	op->now = GetCurrentTimestamp();
	op->key_locked = false;
	op->nopen = 0;
	op->probe.tuple = NULL;

	/* a claim of this transaction: its row is where we left it */
	IdemKeyOpDigest(op, scope, key);
	claim = IdemOwnClaimFind(op->role, &op->digest.uuid);
	if (claim == NULL)
	{
		if (!OidIsValid(IdemLedgerParent(op->ledger, false)))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("idempotency key \"%s\" is not claimed", keystr),
					 errhint("Call idem_claim() first.")));
	}

	/*
	 * Take the key lock even for our own claim.  No other transaction can
	 * change that row, but our update may move it to another page (no room
	 * for a HOT update), and a probe's index scan is not atomic: it reads
	 * the index entries first and the rows after.  A probe that read the
	 * entries before the new version's entry was added, and reaches the
	 * old version after we have committed, would find neither and claim
	 * the key a second time.  Under the key lock, moves and probes take
	 * turns.
	 */
	IdemSetKeyLockTag(&op->keytag, op->ledger, op->role, &op->digest.uuid);
	CHECK_FOR_INTERRUPTS();
	(void) IdemKeyOpLock(op, false);
	if (claim == NULL || !IdemFetchOwnRow(claim, op))
	{
		/* see every partition committed before we got the key lock */
		AcceptInvalidationMessages();
		IdemKeyOpProbe(op, RowExclusiveLock, NULL);
	}

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

	switch (action)
	{
		case IDEM_ACTION_COMPLETE:
			op->values[Anum_keys_state - 1] = CharGetDatum(KEY_COMPLETED);
			op->values[Anum_keys_response_code - 1] = Int32GetDatum(response_code);
			op->nulls[Anum_keys_response_code - 1] = false;
			op->values[Anum_keys_response_body - 1] = PG_GETARG_DATUM(2);
			op->nulls[Anum_keys_response_body - 1] = PG_ARGISNULL(2);
			op->nulls[Anum_keys_lease_until - 1] = true;
			break;
		case IDEM_ACTION_CHECKPOINT:
			op->values[Anum_keys_recovery_point - 1] = PointerGetDatum(recovery_point);
			op->nulls[Anum_keys_recovery_point - 1] = false;
			break;
		case IDEM_ACTION_RELEASE:
			op->values[Anum_keys_state - 1] = CharGetDatum(KEY_RELEASED);
			op->nulls[Anum_keys_lease_until - 1] = true;
			break;
	}

	newtuple = heap_form_tuple(RelationGetDescr(op->open[op->probe.which].heap),
							   op->values, op->nulls);
	keep_key_lock = IdemUpdateRow(&op->open[op->probe.which], &op->probe.tid,
								  newtuple);

	/* keep the own claims in step: where the row is, and if resolved */
	if (op->probe.found == IDEM_FOUND_MINE && claim != NULL)
	{
		IdemOwnClaimMoved(claim, &op->open[op->probe.which].part,
						  &newtuple->t_self);
		if (action != IDEM_ACTION_CHECKPOINT)
			IdemOwnClaimResolved(claim);
	}
	IdemKeyOpEnd(op, keep_key_lock);
	heap_freetuple(newtuple);
}

/*
 * IdemImportKey stores a key's row brought from another node
 * (idempotency.import_key()): "values"/"nulls" hold every column of the key
 * ledger but the lane, for role "role" and digest "digest" (current form).
 * A live local row of the key is replaced only by a newer one: a larger
 * token, or the same token in a state that follows the local one (completed
 * or released after in progress, or in progress again, with its latest
 * recovery point, for the node being moved from owns the key).  A local
 * completed key is replaced only by a completed one.  Waits for
 * transactions writing the key, as a claim does.
 */
IdemImportOutcome
IdemImportKey(Oid role, const pg_uuid_t *digest, Datum *values, bool *nulls)
{
	IdemKeyOp	opdata;
	IdemKeyOp  *op = &opdata;
	TimestampTz expires_at = DatumGetTimestampTz(values[Anum_ledger_expires_at - 1]);
	int64		token = DatumGetInt64(values[Anum_keys_token - 1]);
	char		state = DatumGetChar(values[Anum_keys_state - 1]);
	IdemImportOutcome outcome;

	op->ledger = IDEM_LEDGER_KEYS;
	op->role = role;
	op->now = GetCurrentTimestamp();
	op->key_locked = false;
	op->nopen = 0;
	op->probe.tuple = NULL;
	op->digest.uuid = *digest;
	memcpy(op->digest.legacy_head, digest->data, IDEM_DIGEST_PREFIX_LEN);

	if (expires_at <= op->now)
		return IDEM_IMPORT_EXPIRED;
	(void) IdemLedgerParent(op->ledger, true);
	IdemSetKeyLockTag(&op->keytag, op->ledger, op->role, &op->digest.uuid);

	for (;;)
	{
		int			target;
		bool		keep_key_lock;

		CHECK_FOR_INTERRUPTS();
		(void) IdemKeyOpBegin(op, false);
		if (op->probe.found == IDEM_FOUND_BUSY)
		{
			IdemKeyOpEnd(op, false);
			XactLockTableWait(op->probe.xwait, NULL, NULL, XLTW_None);
			op->now = GetCurrentTimestamp();
			if (expires_at <= op->now)
				return IDEM_IMPORT_EXPIRED;
			continue;
		}
		if (op->probe.found == IDEM_FOUND_MINE)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot import an idempotency key this transaction has written")));

		outcome = IDEM_IMPORT_INSERTED;
		if (op->probe.found == IDEM_FOUND_DONE)
		{
			int64		local_token = DatumGetInt64(op->values[Anum_keys_token - 1]);
			char		local_state = IdemRowState(op);

			/*
			 * An older version, or the same claim no further on; and a
			 * completed key is final: it is never claimed again while it
			 * lives, so nothing but a later completion replaces it.
			 */
			if (token < local_token ||
				(token == local_token && local_state != KEY_IN_PROGRESS) ||
				(local_state == KEY_COMPLETED && state != KEY_COMPLETED))
			{
				IdemKeyOpEnd(op, false);
				return IDEM_IMPORT_KEPT;
			}
			if (token == local_token && state == KEY_IN_PROGRESS)
			{
				/* the same claim in progress: same unless a checkpoint moved on */
				bool		same_point;

				if (nulls[Anum_keys_recovery_point - 1] ||
					op->nulls[Anum_keys_recovery_point - 1])
					same_point = nulls[Anum_keys_recovery_point - 1] ==
						op->nulls[Anum_keys_recovery_point - 1];
				else
				{
					text	   *a = DatumGetTextPP(values[Anum_keys_recovery_point - 1]);
					text	   *b = DatumGetTextPP(op->values[Anum_keys_recovery_point - 1]);

					same_point = VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
						memcmp(VARDATA_ANY(a), VARDATA_ANY(b),
							   VARSIZE_ANY_EXHDR(a)) == 0;
				}
				if (same_point)
				{
					IdemKeyOpEnd(op, false);
					return IDEM_IMPORT_KEPT;
				}
			}
			outcome = IDEM_IMPORT_REPLACED;
		}

		target = IdemOpenTarget(op->ledger, &op->digest.uuid, op->now, expires_at,
								op->open, op->nopen);
		if (target < 0)
		{
			IdemKeyOpMakeTarget(op, expires_at);
			continue;
		}
		keep_key_lock = false;
		if (outcome == IDEM_IMPORT_REPLACED)
		{
			IdemSeeOwnWrites();
			simple_heap_delete(op->open[op->probe.which].heap, &op->probe.tid);
			keep_key_lock =
				op->open[op->probe.which].heap->rd_createSubid != InvalidSubTransactionId;
		}
		values[Anum_ledger_digest - 1] = UUIDPGetDatum(&op->digest.uuid);
		values[Anum_ledger_role - 1] = ObjectIdGetDatum(op->role);
		values[Anum_ledger_lane - 1] = Int16GetDatum(op->open[target].part.lane);
		nulls[Anum_ledger_digest - 1] = false;
		nulls[Anum_ledger_role - 1] = false;
		nulls[Anum_ledger_lane - 1] = false;
		if (IdemInsertRow(&op->open[target], values, nulls, NULL))
			keep_key_lock = true;
		IdemKeyOpEnd(op, keep_key_lock);
		return outcome;
	}
}

/*
 * idem_lookup(key text, scope text)
 *		RETURNS TABLE (status text, token bigint, recovery_point text,
 *					   response_code int, response_body jsonb,
 *					   claimed_at timestamptz, expires_at timestamptz,
 *					   lease_expires_at timestamptz)
 *
 * The caller's own live record of one key, for support work.  Reads only:
 * takes no key lock and works on a standby.
 */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *key = IdemCheckKeyArg(fcinfo, 0, "key");
	text	   *scope = IdemCheckScopeArg(fcinfo, 1, "scope");
	IdemKeyOp	opdata;
	IdemKeyOp  *op = &opdata;
	Datum		values[8];
	bool		nulls[8];
	const char *status;
	Snapshot	snapshot;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);

	op->ledger = IDEM_LEDGER_KEYS;
	op->role = GetUserId();
	op->now = GetCurrentTimestamp();
	IdemKeyOpDigest(op, scope, key);
	if (!OidIsValid(IdemLedgerParent(op->ledger, false)))
		return (Datum) 0;

	/*
	 * Probe under a fresh MVCC snapshot: it shows the last committed state
	 * of the key, or this transaction's own, and never misses a row that a
	 * writer moves while we look (see IdemProbe()).  Calls earlier in this
	 * statement are seen too.  The partitions are listed after the snapshot
	 * is taken, so that those made by transactions it sees are known.
	 */
	IdemSeeOwnWrites();
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	AcceptInvalidationMessages();
	IdemKeyOpProbe(op, AccessShareLock, snapshot);
	UnregisterSnapshot(snapshot);
	IdemClosePartitions(op->open, op->nopen);
	if (op->probe.tuple == NULL)
		return (Datum) 0;

	switch (IdemRowState(op))
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
	values[1] = op->values[Anum_keys_token - 1];
	nulls[1] = false;
	values[2] = op->values[Anum_keys_recovery_point - 1];
	nulls[2] = op->nulls[Anum_keys_recovery_point - 1];
	values[3] = op->values[Anum_keys_response_code - 1];
	nulls[3] = op->nulls[Anum_keys_response_code - 1];
	values[4] = op->values[Anum_keys_response_body - 1];
	nulls[4] = op->nulls[Anum_keys_response_body - 1];
	values[5] = op->values[Anum_keys_claimed_at - 1];
	nulls[5] = false;
	values[6] = op->values[Anum_ledger_expires_at - 1];
	nulls[6] = false;
	values[7] = op->values[Anum_keys_lease_until - 1];
	nulls[7] = op->nulls[Anum_keys_lease_until - 1];
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*-------------------------------------------------------------------------
 *
 * consume.c
 *	  The processed-message ledger: idem_consume_message() and
 *	  idem_consume_messages().
 *
 * A message is identified by (calling role, consumer, message id).  The
 * first transaction to consume it records it and gets true; any later one
 * gets false once the first has committed, and waits for it while it is
 * still open, so false is never answered for work that may yet roll back.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/consume.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"

#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_consume_message);
PG_FUNCTION_INFO_V1(idem_consume_messages);

/* One element of a batch, in the order it is recorded */
typedef struct IdemBatchItem
{
	IdemDigest	digest;
	int			position;		/* index in the input array */
} IdemBatchItem;

static int	IdemBatchItemCmp(const void *a, const void *b);
static void IdemMessageTtl(FunctionCallInfo fcinfo, int argno, Interval *ttl);

/*
 * IdemMessageTtl sets *ttl to the ttl argument "argno" of a consume
 * function, or to idempotency.message_ttl if it is NULL, after the checks
 * of IdemExpiresAt.
 */
static void
IdemMessageTtl(FunctionCallInfo fcinfo, int argno, Interval *ttl)
{
	(void) IdemExpiresAt(fcinfo, argno, GetCurrentTimestamp(), idem_message_ttl,
						 "idempotency.message_ttl");
	if (PG_ARGISNULL(argno))
	{
		memset(ttl, 0, sizeof(*ttl));
		ttl->time = (int64) idem_message_ttl * USECS_PER_SEC;
	}
	else
		*ttl = *PG_GETARG_INTERVAL_P(argno);
}

/*
 * IdemRecordMessage records message "digest" of role "role" in the message
 * ledger unless a live record exists, waiting for transactions in progress
 * that are writing one.  Returns true if it recorded the message.
 *
 * The record expires "ttl" after it is written, or, with ttl NULL (an
 * import), at expires_at: after a wait, the clock is read again, so that a
 * record is never written already expired.  An imported record that has
 * expired while we waited is not written (false).
 */
bool
IdemRecordMessage(Oid role, const IdemDigest *digest, const Interval *ttl,
				  TimestampTz expires_at)
{
	LOCKTAG		keytag;
	IdemOpenPartition *open;

	(void) IdemLedgerParent(IDEM_LEDGER_MESSAGES, true);
	IdemSetKeyLockTag(&keytag, IDEM_LEDGER_MESSAGES, role, &digest->uuid);

	for (;;)
	{
		IdemProbeResult probe;
		int			nopen;
		int			target;
		Datum		values[Natts_messages];
		bool		nulls[Natts_messages] = {false};
		bool		keep_key_lock;
		TimestampTz now = GetCurrentTimestamp();

		CHECK_FOR_INTERRUPTS();
		if (ttl != NULL)
			expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
																 TimestampTzGetDatum(now),
																 IntervalPGetDatum(ttl)));
		else if (expires_at <= now)
			return false;
		(void) LockAcquire(&keytag, ExclusiveLock, false, false);

		/* see every partition committed before we got the key lock */
		AcceptInvalidationMessages();
		nopen = IdemOpenLivePartitions(IDEM_LEDGER_MESSAGES, &digest->uuid, now,
									   RowExclusiveLock, &open);
		IdemProbe(open, nopen, role, digest, now, false, NULL, &probe);

		if (probe.found == IDEM_FOUND_BUSY)
		{
			/* wait for the writer to finish, then look again */
			IdemClosePartitions(open, nopen);
			pfree(open);
			LockRelease(&keytag, ExclusiveLock, false);
			XactLockTableWait(probe.xwait, NULL, NULL, XLTW_None);
			continue;
		}
		if (probe.found != IDEM_FOUND_NONE)
		{
			IdemClosePartitions(open, nopen);
			pfree(open);
			LockRelease(&keytag, ExclusiveLock, false);
			return false;
		}

		target = IdemOpenTarget(IDEM_LEDGER_MESSAGES, &digest->uuid, now, expires_at,
								open, nopen);
		if (target < 0)
		{
			/*
			 * Have the partition made, and start over.  The key lock goes
			 * first, unless we hold DDL locks on the ledger already (see
			 * IdemMakeTarget).
			 */
			IdemClosePartitions(open, nopen);
			pfree(open);
			if (!IdemPartitionDDLHeld(IDEM_LEDGER_MESSAGES))
				LockRelease(&keytag, ExclusiveLock, false);
			IdemMakeTarget(IDEM_LEDGER_MESSAGES, &digest->uuid, now, expires_at);
			continue;
		}

		values[Anum_ledger_expires_at - 1] = TimestampTzGetDatum(expires_at);
		values[Anum_ledger_digest - 1] = UUIDPGetDatum(&digest->uuid);
		values[Anum_ledger_role - 1] = ObjectIdGetDatum(role);
		values[Anum_ledger_lane - 1] = Int16GetDatum(open[target].part.lane);
		keep_key_lock = IdemInsertRow(&open[target], values, nulls, NULL);

		IdemClosePartitions(open, nopen);
		pfree(open);
		if (!keep_key_lock)
			LockRelease(&keytag, ExclusiveLock, false);
		return true;
	}
}

/*
 * idem_consume_message(consumer text, message_id text, ttl interval)
 *		RETURNS boolean
 *
 * True: first delivery, recorded in this transaction.  False: already
 * consumed (by a committed transaction, or earlier in this one).
 */
Datum
idem_consume_message(PG_FUNCTION_ARGS)
{
	text	   *consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	text	   *message_id = IdemCheckKeyArg(fcinfo, 1, "message_id");
	Interval	ttl;
	IdemDigest	digest;

	IdemCheckLibraryVersion();
	IdemMessageTtl(fcinfo, 2, &ttl);
	IdemCheckWritable("idem_consume_message()");

	IdemComputeDigest(VARDATA_ANY(consumer), VARSIZE_ANY_EXHDR(consumer),
					  VARDATA_ANY(message_id), VARSIZE_ANY_EXHDR(message_id),
					  &digest);

	if (IdemRecordMessage(GetUserId(), &digest, &ttl, 0))
	{
		IdemStatsAdd(IDEM_STAT_CONSUMED, 1);
		PG_RETURN_BOOL(true);
	}
	IdemStatsAdd(IDEM_STAT_DUPLICATES, 1);
	PG_RETURN_BOOL(false);
}

/*
 * idem_consume_messages(consumer text, message_ids text[], ttl interval)
 *		RETURNS SETOF text
 *
 * Records every id of the batch and returns those that were new, each once,
 * in input order.  Every element is checked before anything is recorded.
 * The ids are recorded in digest order, so that concurrent batches sharing
 * ids wait for each other instead of deadlocking.
 */
Datum
idem_consume_messages(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	Interval	ttl;
	ArrayType  *ids;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	IdemBatchItem *items;
	bool	   *is_new;
	TupleDesc	tupdesc;
	Tuplestorestate *tupstore;
	MemoryContext oldcontext;
	Oid			role = GetUserId();
	int			i;
	int			nnew = 0;

	IdemCheckLibraryVersion();

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("message_ids must not be null")));
	ids = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("message_ids must be a one-dimensional array")));
	IdemMessageTtl(fcinfo, 2, &ttl);

	deconstruct_array(ids, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);

	/* check everything before recording anything */
	items = palloc(Max(nelems, 1) * sizeof(IdemBatchItem));
	for (i = 0; i < nelems; i++)
	{
		text	   *id;
		int			len;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("message_ids must not contain nulls"),
					 errdetail("Element %d is null.", i + 1)));
		id = DatumGetTextPP(elems[i]);
		len = VARSIZE_ANY_EXHDR(id);
		if (len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("message_id must not be empty"),
					 errdetail("Element %d is empty.", i + 1)));
		IdemCheckKeyLength(len, "message_id");
		IdemComputeDigest(VARDATA_ANY(consumer), VARSIZE_ANY_EXHDR(consumer),
						  VARDATA_ANY(id), len, &items[i].digest);
		items[i].position = i;
	}
	IdemCheckWritable("idem_consume_messages()");

	/* record in digest order; of equal ids, the first one in the input wins */
	qsort(items, nelems, sizeof(IdemBatchItem), IdemBatchItemCmp);
	is_new = palloc0(Max(nelems, 1) * sizeof(bool));
	for (i = 0; i < nelems; i++)
	{
		if (i > 0 && memcmp(&items[i].digest.uuid, &items[i - 1].digest.uuid,
							IDEM_DIGEST_LEN) == 0)
			continue;
		is_new[items[i].position] =
			IdemRecordMessage(role, &items[i].digest, &ttl, 0);
	}

	/* return the new ones in input order */
	oldcontext = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTemplateTupleDesc(1);
	TupleDescInitEntry(tupdesc, (AttrNumber) 1, "message_id", TEXTOID, -1, 0);
	tupstore = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(oldcontext);

	for (i = 0; i < nelems; i++)
	{
		bool		isnull = false;

		if (is_new[i])
		{
			tuplestore_putvalues(tupstore, tupdesc, &elems[i], &isnull);
			nnew++;
		}
	}
	IdemStatsAdd(IDEM_STAT_CONSUMED, nnew);
	IdemStatsAdd(IDEM_STAT_DUPLICATES, nelems - nnew);

	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tupstore;
	rsinfo->setDesc = tupdesc;

	pfree(items);
	pfree(is_new);
	return (Datum) 0;
}

/* orders batch items by digest, then by input position */
static int
IdemBatchItemCmp(const void *a, const void *b)
{
	const IdemBatchItem *x = (const IdemBatchItem *) a;
	const IdemBatchItem *y = (const IdemBatchItem *) b;
	int			c = memcmp(&x->digest.uuid, &y->digest.uuid, IDEM_DIGEST_LEN);

	if (c != 0)
		return c;
	return (x->position > y->position) - (x->position < y->position);
}

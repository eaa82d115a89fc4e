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
#include "citus.h"
#include "keyhash.h"
#include "protocol.h"
#include "stats.h"
#include "storage.h"
#include "transfer.h"

#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
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
static IdemStep IdemRecordStep(IdemOp *op, void *arg);
static IdemBatchItem *IdemBatchItems(text *consumer, Datum *elems, bool *nulls,
									 int nelems);
static void IdemMessageTtl(FunctionCallInfo fcinfo, int argno, Interval *ttl);
static text *IdemTenantArg(FunctionCallInfo fcinfo, int argno);

/*
 * IdemTenantArg returns the tenant argument "argno" of a consume function,
 * or NULL if it is NULL or the function has none (before 0.5.0).  Only a
 * message ledger distributed by Citus uses it (citus.c).
 */
static text *
IdemTenantArg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	return PG_GETARG_TEXT_PP(argno);
}

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

/* One recording of a message id: its expiry, and whether it was recorded */
typedef struct IdemRecord
{
	const Interval *ttl;		/* from the time of writing, or NULL */
	TimestampTz expires_at;		/* with ttl NULL */
	bool		recorded;
} IdemRecord;

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
				  TimestampTz expires_at, IdemOpenCache *cache)
{
	IdemRecord	rec;
	IdemOp		op;

	rec.ttl = ttl;
	rec.expires_at = expires_at;
	rec.recorded = false;
	(void) IdemLedgerParent(IDEM_LEDGER_MESSAGES, true);
	IdemOpInit(&op, IDEM_LEDGER_MESSAGES, role, digest);
	op.cache = cache;
	IdemOpRun(&op, false, IdemRecordStep, &rec);
	return rec.recorded;
}

/*
 * IdemRecordStep, the step of IdemRecordMessage: a live record means the id
 * was consumed; none, and a record is written.
 */
static IdemStep
IdemRecordStep(IdemOp *op, void *arg)
{
	IdemRecord *rec = (IdemRecord *) arg;

	if (rec->ttl != NULL)
		op->expires_at = IdemTimestampPlus(op->now, rec->ttl);
	else if ((op->expires_at = rec->expires_at) <= op->now)
		return IDEM_STEP_DONE;	/* an import that expired while it waited */

	if (op->probe.found == IDEM_FOUND_BUSY)
		return IDEM_STEP_WAIT;	/* answer for the writer's outcome */
	if (op->probe.found != IDEM_FOUND_NONE)
		return IDEM_STEP_DONE;	/* consumed already */
	if (op->probe.remembered && rec->ttl != NULL)
		return IDEM_STEP_DONE;	/* consumed, expired and remembered */
	if (!IdemOpFindTarget(op))
		return IDEM_STEP_MAKE_TARGET;
	IdemOpInsert(op, NULL);
	rec->recorded = true;
	return IDEM_STEP_DONE;
}

/*
 * idem_consume_message(consumer text, message_id text, ttl interval,
 *						tenant text)
 *		RETURNS boolean
 *
 * True: first delivery, recorded in this transaction.  False: already
 * consumed (by a committed transaction, or earlier in this one).  The
 * tenant (since 0.5.0) routes the record to the tenant's shard of a
 * message ledger distributed by Citus; otherwise it is not used.
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

	IdemCitusRoute(IDEM_LEDGER_MESSAGES, IdemTenantArg(fcinfo, 3), "tenant");
	if (IdemRecordMessage(GetUserId(), &digest, &ttl, 0, NULL))
	{
		IdemCitusEndCall();
		IdemStatsAdd(IDEM_STAT_CONSUMED, 1);
		PG_RETURN_BOOL(true);
	}
	IdemCitusEndCall();
	IdemStatsAdd(IDEM_STAT_DUPLICATES, 1);
	PG_RETURN_BOOL(false);
}

/*
 * idem_consume_messages(consumer text, message_ids text[], ttl interval,
 *						 tenant text)
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
	MemoryContext element_cxt;
	MemoryContext oldcontext;
	IdemOpenCache cache;
	Oid			role = GetUserId();
	int			i;
	int			nnew = 0;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

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
	items = IdemBatchItems(consumer, elems, nulls, nelems);
	IdemCheckWritable("idem_consume_messages()");

	/*
	 * Record in digest order; of equal ids, the first one in the input wins.
	 * What recording one id allocates is freed before the next.
	 */
	qsort(items, nelems, sizeof(IdemBatchItem), IdemBatchItemCmp);
	is_new = palloc0(Max(nelems, 1) * sizeof(bool));
	IdemCitusRoute(IDEM_LEDGER_MESSAGES, IdemTenantArg(fcinfo, 3), "tenant");
	IdemOpenCacheInit(&cache);
	element_cxt = AllocSetContextCreate(CurrentMemoryContext,
										"idem_consume_messages element",
										ALLOCSET_DEFAULT_SIZES);
	for (i = 0; i < nelems; i++)
	{
		if (i > 0 && memcmp(&items[i].digest.uuid, &items[i - 1].digest.uuid,
							IDEM_DIGEST_LEN) == 0)
			continue;
		oldcontext = MemoryContextSwitchTo(element_cxt);
		is_new[items[i].position] =
			IdemRecordMessage(role, &items[i].digest, &ttl, 0, &cache);
		MemoryContextSwitchTo(oldcontext);
		MemoryContextReset(element_cxt);
	}
	MemoryContextDelete(element_cxt);
	IdemOpenCacheEnd(&cache);
	IdemCitusEndCall();

	/* return the new ones in input order */
	for (i = 0; i < nelems; i++)
	{
		bool		isnull = false;

		if (is_new[i])
		{
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
								 &elems[i], &isnull);
			nnew++;
		}
	}
	IdemStatsAdd(IDEM_STAT_CONSUMED, nnew);
	IdemStatsAdd(IDEM_STAT_DUPLICATES, nelems - nnew);

	pfree(items);
	pfree(is_new);
	return (Datum) 0;
}

/*
 * IdemBatchItems checks every message id of a batch (not NULL, not empty,
 * not too long) and returns the batch's items: each id's digest and
 * position, in input order.
 */
static IdemBatchItem *
IdemBatchItems(text *consumer, Datum *elems, bool *nulls, int nelems)
{
	IdemBatchItem *items = palloc(Max(nelems, 1) * sizeof(IdemBatchItem));
	int			i;

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
	return items;
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

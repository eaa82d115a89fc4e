/*-------------------------------------------------------------------------
 *
 * recover.c
 *	  idem_recover(): finding the caller's two-phase claims kept with
 *	  keep_request whose lease has lapsed, and handing each to exactly one
 *	  caller.
 *
 * A claim made with keep_request => true and a lease stores its key, scope
 * and request, and recover_at, the end of its lease, which the key
 * ledger's partial index keys_recover_idx on (role, recover_at) covers:
 * only such claims are in it, and only while they are in progress
 * (completing or releasing one sets recover_at to NULL).  Finding lapsed
 * claims is an index range scan per live partition, role = caller and
 * recover_at <= now: its cost grows with the claims that have lapsed, not
 * with the ledger: each partition gives at most about twice max_keys of
 * its oldest.  (A partition whose index was dropped is scanned whole.)
 *
 * The candidates are taken oldest lapse first.  Each is taken over by
 * IdemRecoverKey (keys.c) under its key lock, tried without waiting: a key
 * another recoverer (or a claimer) holds is skipped, as SELECT ... FOR
 * UPDATE SKIP LOCKED skips a locked row, so concurrent recoverers split the
 * lapsed set without waiting for each other; under the key lock the row is
 * probed again, so a key completed, released or taken over since the scan
 * is not handed out twice.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/recover.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "keyhash.h"
#include "keys.h"
#include "protocol.h"
#include "stats.h"
#include "storage.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idem_recover);

/* Columns of idem_recover()'s result */
#define Natts_recover_result		6

/* A lapsed claim found by the scan */
typedef struct IdemLapsed
{
	TimestampTz recover_at;
	text	   *key;
	text	   *scope;
} IdemLapsed;

typedef struct IdemLapsedList
{
	IdemLapsed *items;
	int			n;
	int			size;
} IdemLapsedList;

static void IdemFindLapsed(Oid role, text *scope, TimestampTz now, int limit,
						   IdemLapsedList *list);
static void IdemFindLapsedIn(const IdemPartition *part, Oid role,
							 text *scope, TimestampTz now, Snapshot snapshot,
							 int limit, IdemLapsedList *list);
static bool IdemAddLapsed(TupleTableSlot *slot, Oid role, text *scope,
						  TimestampTz now, IdemLapsedList *list);
static int	IdemCompareLapsed(const void *a, const void *b);

/*
 * idem_recover(lease interval, scope text DEFAULT NULL, max_keys int
 *				DEFAULT 10)
 *		RETURNS TABLE (key text, scope text, token bigint,
 *					   recovery_point text, request jsonb,
 *					   lapsed_at timestamptz)
 */
Datum
idem_recover(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			role = GetUserId();
	text	   *scope = NULL;
	int32		max_keys;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_until;
	IdemLapsedList list = {NULL, 0, 0};
	int			taken = 0;
	int			i;

	IdemCheckLibraryVersion();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease must not be null"),
				 errhint("Pass the lease the recovered claims get.")));
	lease_until = IdemTimestampPlus(now, PG_GETARG_INTERVAL_P(0));
	if (lease_until <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be a positive interval")));
	/* as idem_claim() bounds a lease, by the ttl it may have */
	if (lease_until > now + (int64) idem_max_ttl * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease exceeds \"%s\"", "idempotency.max_ttl"),
				 errdetail("The limit is %d seconds.", idem_max_ttl),
				 errhint("Pass a shorter lease, or raise \"%s\".", "idempotency.max_ttl")));
	if (!PG_ARGISNULL(1))
		scope = IdemCheckScopeArg(fcinfo, 1, "scope");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_keys must not be null")));
	if (PG_GETARG_INT32(2) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_keys must be a positive number")));
	max_keys = PG_GETARG_INT32(2);
	IdemCheckWritable("idem_recover()");
	InitMaterializedSRF(fcinfo, 0);
	if (!OidIsValid(IdemLedgerParent(IDEM_LEDGER_KEYS, false)))
		return (Datum) 0;

	/*
	 * Candidates: per partition, the oldest lapses, twice as many as asked
	 * for and a few more, so that keys other recoverers hold meanwhile can
	 * be skipped; a caller gets fewer than max_keys only when more were
	 * taken by others, and the next call finds the rest.
	 */
	IdemFindLapsed(role, scope, now,
				   max_keys > (INT_MAX - 16) / 2 ? INT_MAX : max_keys * 2 + 16,
				   &list);
	for (i = 0; i < list.n && taken < max_keys; i++)
	{
		IdemLapsed *c = &list.items[i];
		IdemDigest	digest;
		IdemRecovered rec;
		Datum		values[Natts_recover_result];
		bool		nulls[Natts_recover_result];

		CHECK_FOR_INTERRUPTS();
		IdemComputeDigest(VARDATA_ANY(c->scope), VARSIZE_ANY_EXHDR(c->scope),
						  VARDATA_ANY(c->key), VARSIZE_ANY_EXHDR(c->key),
						  &digest);
		if (!IdemRecoverKey(role, &digest, PG_GETARG_DATUM(0), &rec))
			continue;
		taken++;
		IdemStatsAdd(IDEM_STAT_RECOVERIES, 1);
		memset(nulls, false, sizeof(nulls));
		values[0] = PointerGetDatum(c->key);
		values[1] = PointerGetDatum(c->scope);
		values[2] = Int64GetDatum(rec.token);
		values[3] = rec.recovery_point;
		nulls[3] = rec.recovery_point == (Datum) 0;
		values[4] = rec.request;
		nulls[4] = rec.request == (Datum) 0;
		values[5] = TimestampTzGetDatum(rec.lapsed_at);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * IdemFindLapsed lists the role's claims kept with keep_request whose
 * lease had lapsed at "now" (of one scope, if given), as committed, oldest
 * lapse first.
 */
static void
IdemFindLapsed(Oid role, text *scope, TimestampTz now, int limit,
			   IdemLapsedList *list)
{
	Snapshot	snapshot;
	List	   *parts;
	ListCell   *lc;

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	AcceptInvalidationMessages();
	parts = IdemAllPartitions(IDEM_LEDGER_KEYS);
	foreach(lc, parts)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);

		if (p->upper > now)
			IdemFindLapsedIn(p, role, scope, now, snapshot, limit, list);
	}
	list_free_deep(parts);
	UnregisterSnapshot(snapshot);
	if (list->n > 1)
		qsort(list->items, list->n, sizeof(IdemLapsed), IdemCompareLapsed);
}

/*
 * IdemFindLapsedIn adds the lapsed claims of one partition, at most
 * "limit" of them, oldest lapse first: a range scan of its recovery index,
 * or, without one, of the whole partition.  A partition dropped meanwhile
 * is skipped.
 */
static void
IdemFindLapsedIn(const IdemPartition *part, Oid role, text *scope,
				 TimestampTz now, Snapshot snapshot, int limit,
				 IdemLapsedList *list)
{
	int			added = 0;

	IdemOpenPartition op;
	TupleTableSlot *slot;
	Relation	index;

	LockRelationOid(part->relid, AccessShareLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(part->relid)))
	{
		UnlockRelationOid(part->relid, AccessShareLock);
		return;
	}
	IdemOpenPartitionRels(&op, IDEM_LEDGER_KEYS, part, AccessShareLock, true);
	if (RelationGetDescr(op.heap)->natts >= Natts_keys)
	{
		slot = table_slot_create(op.heap, NULL);
		index = IdemRecoverIndex(&op);
		if (index != NULL)
		{
			ScanKeyData skeys[2];
			IndexScanDesc scan;

			ScanKeyInit(&skeys[0], 1, BTEqualStrategyNumber, F_OIDEQ,
						ObjectIdGetDatum(role));
			ScanKeyInit(&skeys[1], 2, BTLessEqualStrategyNumber,
						F_TIMESTAMP_LE, TimestampTzGetDatum(now));
			scan = IdemIndexBeginScan(op.heap, index, snapshot, 2);
			index_rescan(scan, skeys, 2, NULL, 0);
			while (added < limit &&
				   index_getnext_slot(scan, ForwardScanDirection, slot))
				added += IdemAddLapsed(slot, role, scope, now, list);
			index_endscan(scan);
		}
		else
		{
			TableScanDesc scan = table_beginscan(op.heap, snapshot, 0, NULL);

			while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
				(void) IdemAddLapsed(slot, role, scope, now, list);
			table_endscan(scan);
		}
		ExecDropSingleTupleTableSlot(slot);
	}
	IdemClosePartitionIndexes(&op);
	table_close(op.heap, NoLock);
}

/* adds the row in slot to the list if it is a lapsed claim of ours */
static bool
IdemAddLapsed(TupleTableSlot *slot, Oid role, text *scope, TimestampTz now,
			  IdemLapsedList *list)
{
	IdemLapsed *c;
	text	   *kept_scope;

	slot_getallattrs(slot);
	if (slot->tts_isnull[Anum_keys_recover_at - 1] ||
		DatumGetTimestampTz(slot->tts_values[Anum_keys_recover_at - 1]) > now ||
		DatumGetTimestampTz(slot->tts_values[Anum_ledger_expires_at - 1]) <= now ||
		DatumGetObjectId(slot->tts_values[Anum_ledger_role - 1]) != role ||
		DatumGetChar(slot->tts_values[Anum_keys_state - 1]) != KEY_IN_PROGRESS ||
		slot->tts_isnull[Anum_keys_kept_key - 1])
		return false;
	kept_scope = DatumGetTextPP(slot->tts_values[Anum_keys_kept_scope - 1]);
	if (scope != NULL &&
		(VARSIZE_ANY_EXHDR(scope) != VARSIZE_ANY_EXHDR(kept_scope) ||
		 memcmp(VARDATA_ANY(scope), VARDATA_ANY(kept_scope),
				VARSIZE_ANY_EXHDR(scope)) != 0))
		return false;

	if (list->n == list->size)
	{
		list->size = list->size == 0 ? 16 : list->size * 2;
		list->items = list->items == NULL ?
			palloc(list->size * sizeof(IdemLapsed)) :
			repalloc(list->items, list->size * sizeof(IdemLapsed));
	}
	c = &list->items[list->n++];
	c->recover_at = DatumGetTimestampTz(slot->tts_values[Anum_keys_recover_at - 1]);
	c->key = DatumGetTextPCopy(slot->tts_values[Anum_keys_kept_key - 1]);
	c->scope = DatumGetTextPCopy(PointerGetDatum(kept_scope));
	return true;
}

/* oldest lapse first */
static int
IdemCompareLapsed(const void *a, const void *b)
{
	const IdemLapsed *x = (const IdemLapsed *) a;
	const IdemLapsed *y = (const IdemLapsed *) b;

	if (x->recover_at != y->recover_at)
		return x->recover_at < y->recover_at ? -1 : 1;
	return 0;
}

/*-------------------------------------------------------------------------
 *
 * transfer.c
 *	  Moving ledger rows between nodes: idempotency.export_keys(),
 *	  idempotency.import_key(), idempotency.export_messages() and
 *	  idempotency.import_message().
 *
 * When a tenant moves to another database (a Citus shard move, a PL/Proxy
 * partition split), its live keys and consumed message ids must go with its
 * rows, or a retry after the move would do the work again.  Export reads
 * the live rows of a set of namespaces (scopes, consumers) with index range
 * scans: every digest of a namespace starts with the same four bytes
 * (keyhash.c), so each partition's digest index, on (role, digest), holds
 * a namespace's rows of one role together, and the export scans those of
 * each role there is in it (one scan per partition and namespace in a
 * partition made before 0.4.0, whose index is on digest alone).  Those
 * four bytes are a hash,
 * so an export may also carry rows of another namespace that shares them;
 * that is harmless, because an import never makes a key older than it is:
 *
 *	- a key is imported unless the local node holds a version at least as
 *	  new (a larger token, or the same token completed or released);
 *	- a message id is imported unless the local node has it already.
 *
 * Rows keep their role (by name), digest, expiry, token, fingerprint,
 * recovery point and response, so an old holder's token stays valid and a
 * replay answers byte for byte.  Export reads under the statement's
 * snapshot: what is being written meanwhile is not exported, so the mover
 * stops writes to the tenants first (see doc/scale-out.md).
 *
 * Rows written before 0.3.0 (in "legacy" partitions) have digests without
 * the namespace prefix: they cannot be found by namespace, and a node that
 * still has them cannot tell an imported key from its legacy twin.  Both
 * export and import refuse while such partitions are live.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/transfer.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "keyhash.h"
#include "protocol.h"
#include "responses.h"
#include "storage.h"
#include "transfer.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

PG_FUNCTION_INFO_V1(idem_export_keys);
PG_FUNCTION_INFO_V1(idem_export_messages);
PG_FUNCTION_INFO_V1(idem_import_key);
PG_FUNCTION_INFO_V1(idem_import_message);

/* Columns of idempotency.key_record (the first 11 before 0.4.0) */
#define Natts_key_record			16
#define Natts_key_record_v1			11
#define Anum_key_record_role		1
#define Anum_key_record_digest		2
#define Anum_key_record_expires_at	3
#define Anum_key_record_status		4
#define Anum_key_record_token		5
#define Anum_key_record_claimed_at	6
#define Anum_key_record_lease_expires_at 7
#define Anum_key_record_fingerprint	8
#define Anum_key_record_recovery_point 9
#define Anum_key_record_response_code 10
#define Anum_key_record_response_body 11
#define Anum_key_record_kept_key	12
#define Anum_key_record_kept_scope	13
#define Anum_key_record_request		14
#define Anum_key_record_response_headers 15
#define Anum_key_record_response_raw 16

/* Columns of idempotency.message_record */
#define Natts_message_record		3

/* The fingerprint idem_claim() stores: SHA-256 */
#define IDEM_FINGERPRINT_LEN		32

static void IdemRefuseLegacy(IdemLedger ledger, const char *funcname);
static int	IdemNamespacePrefixes(ArrayType *namespaces, const char *argname,
								  const char *elemname,
								  uint8 (**prefixes)[IDEM_DIGEST_PREFIX_LEN]);
static void IdemExportPartition(IdemLedger ledger, const IdemPartition *part,
								uint8 (*prefixes)[IDEM_DIGEST_PREFIX_LEN],
								int nprefixes, TimestampTz now,
								ReturnSetInfo *rsinfo);
static bool IdemNextRole(IdemOpenPartition *op, Snapshot snapshot,
						 TupleTableSlot *slot, Oid *role);
static void IdemExportRange(IdemLedger ledger, IdemOpenPartition *op,
							Oid role, const uint8 *prefix, Snapshot snapshot,
							TupleTableSlot *slot, TimestampTz now,
							ReturnSetInfo *rsinfo);
static void IdemExportRow(IdemLedger ledger, TupleTableSlot *slot,
						  TimestampTz now, ReturnSetInfo *rsinfo);
static Datum IdemExport(FunctionCallInfo fcinfo, IdemLedger ledger,
						const char *argname, const char *elemname);

static void IdemCheckImportedExpiry(TimestampTz expires_at);
static char IdemCheckImportedKey(Datum *rec, bool *recnulls, Oid *role);
static void IdemCheckImportedKept(Datum *rec, bool *recnulls, char state);


/*
 * IdemRefuseLegacy raises an error if the ledger has a live partition made
 * before 0.3.0 (see the top of this file).
 */
static void
IdemRefuseLegacy(IdemLedger ledger, const char *funcname)
{
	TimestampTz now = GetCurrentTimestamp();
	List	   *parts;
	ListCell   *lc;

	if (!OidIsValid(IdemLedgerParent(ledger, false)))
		return;
	AcceptInvalidationMessages();
	parts = IdemAllPartitions(ledger);
	foreach(lc, parts)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);

		if (IdemLaneIsLegacy(p->lane) && p->upper > now)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot call %s while \"%s.%s\" has partitions made before version 0.3.0",
							funcname, IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
					 errdetail("Partition \"%s\" holds rows written before 0.3.0 until %s.",
							   get_rel_name(p->relid),
							   timestamptz_to_str(p->upper)),
					 errhint("Wait until it has expired, and run idem_maintain() to drop it.")));
	}
	list_free_deep(parts);
}

/*
 * IdemNamespacePrefixes sets *prefixes to the distinct digest prefixes of
 * the namespaces of an array, in order, and returns how many.
 */
static int
IdemNamespacePrefixes(ArrayType *namespaces, const char *argname,
					  const char *elemname,
					  uint8 (**prefixes)[IDEM_DIGEST_PREFIX_LEN])
{
	Datum	   *elems;
	bool	   *elemnulls;
	int			nelems;
	int			i;
	int			n = 0;
	uint8		(*out)[IDEM_DIGEST_PREFIX_LEN];

	if (ARR_NDIM(namespaces) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", argname)));
	deconstruct_array(namespaces, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &elemnulls, &nelems);
	out = palloc(Max(nelems, 1) * IDEM_DIGEST_PREFIX_LEN);
	for (i = 0; i < nelems; i++)
	{
		text	   *ns;
		int			j;

		if (elemnulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain nulls", argname),
					 errdetail("Element %d is null.", i + 1)));
		ns = DatumGetTextPP(elems[i]);
		IdemCheckKeyLength(VARSIZE_ANY_EXHDR(ns), elemname);
		IdemNamespacePrefix(VARDATA_ANY(ns), VARSIZE_ANY_EXHDR(ns), out[n]);
		for (j = 0; j < n; j++)
		{
			if (memcmp(out[j], out[n], IDEM_DIGEST_PREFIX_LEN) == 0)
				break;
		}
		if (j == n)
			n++;
	}
	*prefixes = out;
	return n;
}

/*
 * IdemExport is the body of the export functions: the live rows of the
 * given namespaces (all rows if the array is NULL) of one ledger.
 */
static Datum
IdemExport(FunctionCallInfo fcinfo, IdemLedger ledger, const char *argname,
		   const char *elemname)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz now = GetCurrentTimestamp();
	uint8		(*prefixes)[IDEM_DIGEST_PREFIX_LEN] = NULL;
	int			nprefixes = -1;
	List	   *parts;
	ListCell   *lc;
	char		funcname[NAMEDATALEN + 32];

	IdemCheckLibraryVersion();
	snprintf(funcname, sizeof(funcname), "%s.export_%s()", IDEM_SCHEMA_NAME,
			 IdemLedgerName(ledger));
	InitMaterializedSRF(fcinfo, 0);
	if (!PG_ARGISNULL(0))
		nprefixes = IdemNamespacePrefixes(PG_GETARG_ARRAYTYPE_P(0), argname,
										  elemname, &prefixes);
	if (nprefixes == 0 || !OidIsValid(IdemLedgerParent(ledger, false)))
		return (Datum) 0;
	IdemRefuseLegacy(ledger, funcname);

	parts = IdemAllPartitions(ledger);
	foreach(lc, parts)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);

		if (p->upper > now)
			IdemExportPartition(ledger, p, prefixes, nprefixes, now, rsinfo);
	}
	list_free_deep(parts);
	return (Datum) 0;
}

/*
 * IdemExportPartition adds the live rows of one partition to the result:
 * those whose digest starts with one of the prefixes, by index range scans,
 * or every row if nprefixes < 0.  A partition dropped meanwhile is skipped.
 */
static void
IdemExportPartition(IdemLedger ledger, const IdemPartition *part,
					uint8 (*prefixes)[IDEM_DIGEST_PREFIX_LEN], int nprefixes,
					TimestampTz now, ReturnSetInfo *rsinfo)
{
	IdemOpenPartition op;
	Snapshot	snapshot = GetActiveSnapshot();
	TupleTableSlot *slot;
	int			i;

	LockRelationOid(part->relid, AccessShareLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(part->relid)))
	{
		UnlockRelationOid(part->relid, AccessShareLock);
		return;
	}
	IdemOpenPartitionRels(&op, ledger, part, AccessShareLock, true);
	slot = table_slot_create(op.heap, NULL);

	if (nprefixes < 0 || op.index == NULL)
	{
		/* every row (or, without a usable digest index, filter them here) */
		TableScanDesc scan = table_beginscan(op.heap, snapshot, 0, NULL);

		while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			pg_uuid_t  *digest;

			digest = DatumGetUUIDP(slot_getattr(slot, Anum_ledger_digest, &isnull));
			for (i = 0; i < nprefixes; i++)
			{
				if (memcmp(digest->data, prefixes[i], IDEM_DIGEST_PREFIX_LEN) == 0)
					break;
			}
			if (nprefixes < 0 || i < nprefixes)
				IdemExportRow(ledger, slot, now, rsinfo);
		}
		table_endscan(scan);
	}
	else if (!op.index_by_role)
	{
		for (i = 0; i < nprefixes; i++)
			IdemExportRange(ledger, &op, InvalidOid, prefixes[i], snapshot,
							slot, now, rsinfo);
	}
	else
	{
		Oid			role = InvalidOid;

		/* each role with a row there, in order, then its namespaces' rows */
		while (IdemNextRole(&op, snapshot, slot, &role))
		{
			for (i = 0; i < nprefixes; i++)
				IdemExportRange(ledger, &op, role, prefixes[i], snapshot,
								slot, now, rsinfo);
		}
	}

	ExecDropSingleTupleTableSlot(slot);
	IdemClosePartitionIndexes(&op);
	table_close(op.heap, NoLock);
}

/*
 * IdemNextRole sets *role to the smallest role OID above *role that has a
 * row in the open partition visible to the snapshot, by a scan of its
 * (role, digest) index, and returns true; or returns false if there is
 * none.
 */
static bool
IdemNextRole(IdemOpenPartition *op, Snapshot snapshot, TupleTableSlot *slot,
			 Oid *role)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	bool		found;
	bool		isnull;

	ScanKeyInit(&skey, 1, BTGreaterStrategyNumber, F_OIDGT,
				ObjectIdGetDatum(*role));
	scan = IdemIndexBeginScan(op->heap, op->index, snapshot, 1);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
		*role = DatumGetObjectId(slot_getattr(slot, Anum_ledger_role, &isnull));
	index_endscan(scan);
	ExecClearTuple(slot);
	return found;
}

/*
 * IdemExportRange adds the live rows of the open partition whose digest
 * starts with "prefix" to the result, by a range scan of its digest
 * index: of role "role" in a (role, digest) index, of every role in a
 * (digest) one (role invalid).
 */
static void
IdemExportRange(IdemLedger ledger, IdemOpenPartition *op, Oid role,
				const uint8 *prefix, Snapshot snapshot, TupleTableSlot *slot,
				TimestampTz now, ReturnSetInfo *rsinfo)
{
	pg_uuid_t	low;
	pg_uuid_t	high;
	ScanKeyData skeys[3];
	int			nkeys = 0;
	AttrNumber	digest_col = op->index_by_role ? 2 : 1;
	IndexScanDesc scan;

	memset(low.data, 0x00, UUID_LEN);
	memset(high.data, 0xFF, UUID_LEN);
	memcpy(low.data, prefix, IDEM_DIGEST_PREFIX_LEN);
	memcpy(high.data, prefix, IDEM_DIGEST_PREFIX_LEN);
	if (op->index_by_role)
		ScanKeyInit(&skeys[nkeys++], 1, BTEqualStrategyNumber, F_OIDEQ,
					ObjectIdGetDatum(role));
	ScanKeyInit(&skeys[nkeys++], digest_col, BTGreaterEqualStrategyNumber,
				F_UUID_GE, UUIDPGetDatum(&low));
	ScanKeyInit(&skeys[nkeys++], digest_col, BTLessEqualStrategyNumber,
				F_UUID_LE, UUIDPGetDatum(&high));
	scan = IdemIndexBeginScan(op->heap, op->index, snapshot, nkeys);
	index_rescan(scan, skeys, nkeys, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
		IdemExportRow(ledger, slot, now, rsinfo);
	index_endscan(scan);
}

/*
 * IdemExportRow adds the row in slot to the result, as a key_record or a
 * message_record, unless it has expired or its role has been dropped.
 */
static void
IdemExportRow(IdemLedger ledger, TupleTableSlot *slot, TimestampTz now,
			  ReturnSetInfo *rsinfo)
{
	Datum		values[Natts_key_record];
	bool		nulls[Natts_key_record];
	char	   *rolename;
	char		state;

	slot_getallattrs(slot);
	if (DatumGetTimestampTz(slot->tts_values[Anum_ledger_expires_at - 1]) <= now)
		return;
	rolename = GetUserNameFromId(DatumGetObjectId(slot->tts_values[Anum_ledger_role - 1]),
								 true);
	if (rolename == NULL)
		return;

	memset(nulls, false, sizeof(nulls));
	values[Anum_key_record_role - 1] = DirectFunctionCall1(namein,
														   CStringGetDatum(rolename));
	values[Anum_key_record_digest - 1] = slot->tts_values[Anum_ledger_digest - 1];
	values[Anum_key_record_expires_at - 1] = slot->tts_values[Anum_ledger_expires_at - 1];
	if (ledger == IDEM_LEDGER_MESSAGES)
	{
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		return;
	}

	state = DatumGetChar(slot->tts_values[Anum_keys_state - 1]);
	values[Anum_key_record_status - 1] =
		CStringGetTextDatum(state == KEY_COMPLETED ? "completed" :
							state == KEY_RELEASED ? "released" : "in_progress");
	values[Anum_key_record_token - 1] = slot->tts_values[Anum_keys_token - 1];
	values[Anum_key_record_claimed_at - 1] = slot->tts_values[Anum_keys_claimed_at - 1];
	values[Anum_key_record_lease_expires_at - 1] = slot->tts_values[Anum_keys_lease_until - 1];
	nulls[Anum_key_record_lease_expires_at - 1] = slot->tts_isnull[Anum_keys_lease_until - 1];
	values[Anum_key_record_fingerprint - 1] = slot->tts_values[Anum_keys_fingerprint - 1];
	nulls[Anum_key_record_fingerprint - 1] = slot->tts_isnull[Anum_keys_fingerprint - 1];
	values[Anum_key_record_recovery_point - 1] = slot->tts_values[Anum_keys_recovery_point - 1];
	nulls[Anum_key_record_recovery_point - 1] = slot->tts_isnull[Anum_keys_recovery_point - 1];
	values[Anum_key_record_response_code - 1] = slot->tts_values[Anum_keys_response_code - 1];
	nulls[Anum_key_record_response_code - 1] = slot->tts_isnull[Anum_keys_response_code - 1];
	values[Anum_key_record_response_body - 1] = slot->tts_values[Anum_keys_response_body - 1];
	nulls[Anum_key_record_response_body - 1] = slot->tts_isnull[Anum_keys_response_body - 1];

	/* since 0.4.0; a ledger made before has no such columns: NULL */
	memset(nulls + Natts_key_record_v1, true,
		   (Natts_key_record - Natts_key_record_v1) * sizeof(bool));
	if (slot->tts_tupleDescriptor->natts >= Natts_keys)
	{
		values[Anum_key_record_kept_key - 1] = slot->tts_values[Anum_keys_kept_key - 1];
		nulls[Anum_key_record_kept_key - 1] = slot->tts_isnull[Anum_keys_kept_key - 1];
		values[Anum_key_record_kept_scope - 1] = slot->tts_values[Anum_keys_kept_scope - 1];
		nulls[Anum_key_record_kept_scope - 1] = slot->tts_isnull[Anum_keys_kept_scope - 1];
		values[Anum_key_record_request - 1] = slot->tts_values[Anum_keys_kept_request - 1];
		nulls[Anum_key_record_request - 1] = slot->tts_isnull[Anum_keys_kept_request - 1];
		values[Anum_key_record_response_headers - 1] = slot->tts_values[Anum_keys_response_headers - 1];
		nulls[Anum_key_record_response_headers - 1] = slot->tts_isnull[Anum_keys_response_headers - 1];
		values[Anum_key_record_response_raw - 1] = slot->tts_values[Anum_keys_response_raw - 1];
		nulls[Anum_key_record_response_raw - 1] = slot->tts_isnull[Anum_keys_response_raw - 1];
	}
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * idempotency.export_keys(scopes text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.key_record
 *
 * The live idempotency keys of the given scopes, of every role (NULL: every
 * live key of the ledger).
 */
Datum
idem_export_keys(PG_FUNCTION_ARGS)
{
	return IdemExport(fcinfo, IDEM_LEDGER_KEYS, "scopes", "scope");
}

/*
 * idempotency.export_messages(consumers text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.message_record
 *
 * The live consumed message ids of the given consumers, of every role.
 */
Datum
idem_export_messages(PG_FUNCTION_ARGS)
{
	return IdemExport(fcinfo, IDEM_LEDGER_MESSAGES, "consumers", "consumer");
}

/* Column types of the records import_key() and import_message() take */
static const Oid key_record_types[Natts_key_record] = {
	NAMEOID, UUIDOID, TIMESTAMPTZOID, TEXTOID, INT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, BYTEAOID, TEXTOID, INT4OID, JSONBOID,
	TEXTOID, TEXTOID, JSONBOID, JSONBOID, BYTEAOID
};
static const Oid message_record_types[Natts_message_record] = {
	NAMEOID, UUIDOID, TIMESTAMPTZOID
};

/*
 * IdemDeformRecord reads argument 0, a record with the columns of the named
 * composite type (that type, a table made from it, any row of the same
 * column types), into values/nulls.  A record of an earlier version of the
 * type, with only its first min_natts columns, is taken too: the columns
 * it lacks are NULL.
 */
void
IdemDeformRecord(FunctionCallInfo fcinfo, int natts, int min_natts,
				 const Oid *types, const char *typname, Datum *values,
				 bool *nulls)
{
	HeapTupleHeader rec = PG_GETARG_HEAPTUPLEHEADER(0);
	TupleDesc	tupdesc;
	HeapTupleData tuple;
	Datum	   *all_values;
	bool	   *all_nulls;
	int			i;
	int			n = 0;

	tupdesc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(rec),
									 HeapTupleHeaderGetTypMod(rec));
	for (i = 0; i < tupdesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);

		if (att->attisdropped)
			continue;
		if (n >= natts || att->atttypid != types[n])
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("record does not have the columns of type %s.%s",
							IDEM_SCHEMA_NAME, typname),
					 n < natts ?
					 errdetail("Column %d has type %s, but %s is expected.",
							   n + 1, format_type_be(att->atttypid),
							   format_type_be(types[n])) :
					 errdetail("It has more than %d columns.", natts)));
		n++;
	}
	if (n != natts && n != min_natts)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("record does not have the columns of type %s.%s",
						IDEM_SCHEMA_NAME, typname),
				 errdetail("It has %d columns, but %d are expected.", n, natts)));
	for (i = n; i < natts; i++)
		nulls[i] = true;
	tuple.t_len = HeapTupleHeaderGetDatumLength(rec);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = rec;
	all_values = palloc(tupdesc->natts * sizeof(Datum));
	all_nulls = palloc(tupdesc->natts * sizeof(bool));
	heap_deform_tuple(&tuple, tupdesc, all_values, all_nulls);
	n = 0;
	for (i = 0; i < tupdesc->natts; i++)
	{
		if (TupleDescAttr(tupdesc, i)->attisdropped)
			continue;
		values[n] = all_values[i];
		nulls[n] = all_nulls[i];
		n++;
	}
	ReleaseTupleDesc(tupdesc);
}

/* the local role of an imported row, which must exist */
Oid
IdemImportRole(Datum name, bool isnull)
{
	IdemRequireField(isnull, "role");
	return get_role_oid(NameStr(*DatumGetName(name)), false);
}

/*
 * IdemCheckImportedExpiry raises an error if an imported row would live
 * longer than any call on this node may ask for (idempotency.max_ttl from
 * now): it would be kept beyond the maintained horizon for longer than
 * the node's own settings allow.
 */
static void
IdemCheckImportedExpiry(TimestampTz expires_at)
{
	TimestampTz limit = GetCurrentTimestamp() + (int64) idem_max_ttl * USECS_PER_SEC;

	if (expires_at > limit)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expires_at of an imported record is beyond \"%s\"",
						"idempotency.max_ttl"),
				 errdetail("This node keeps rows for at most %d seconds.", idem_max_ttl),
				 errhint("Raise \"%s\" on this node to at least the other node's.",
						 "idempotency.max_ttl")));
}

/* raises the error for a missing field of an imported record */
void
IdemRequireField(bool isnull, const char *field)
{
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("field \"%s\" of the imported record must not be null",
						field)));
}

/* import_key()'s and import_message()'s answer */
text *
IdemImportOutcomeText(IdemImportOutcome outcome)
{
	switch (outcome)
	{
		case IDEM_IMPORT_INSERTED:
			return cstring_to_text("inserted");
		case IDEM_IMPORT_REPLACED:
			return cstring_to_text("replaced");
		case IDEM_IMPORT_KEPT:
			return cstring_to_text("kept");
		case IDEM_IMPORT_EXPIRED:
			break;
	}
	return cstring_to_text("expired");
}

/*
 * IdemCheckImportedKey raises the error for the first field of an imported
 * key_record that is missing or cannot be (the role must exist here, the
 * status be known, the token, expiry, response, lease and fingerprint be
 * possible for that status); returns the key ledger's state value of its
 * status, and sets *role to the local role it names.
 */
static char
IdemCheckImportedKey(Datum *rec, bool *recnulls, Oid *role)
{
	char	   *status;
	char		state;

	*role = IdemImportRole(rec[Anum_key_record_role - 1],
						   recnulls[Anum_key_record_role - 1]);
	IdemRequireField(recnulls[Anum_key_record_digest - 1], "digest");
	IdemRequireField(recnulls[Anum_key_record_expires_at - 1], "expires_at");
	IdemRequireField(recnulls[Anum_key_record_status - 1], "status");
	IdemRequireField(recnulls[Anum_key_record_token - 1], "token");
	IdemRequireField(recnulls[Anum_key_record_claimed_at - 1], "claimed_at");

	status = TextDatumGetCString(rec[Anum_key_record_status - 1]);
	if (strcmp(status, "in_progress") == 0)
		state = KEY_IN_PROGRESS;
	else if (strcmp(status, "completed") == 0)
		state = KEY_COMPLETED;
	else if (strcmp(status, "released") == 0)
		state = KEY_RELEASED;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid status \"%s\" of an imported idempotency key", status),
				 errhint("Valid statuses are \"in_progress\", \"completed\" and \"released\".")));
	if (DatumGetInt64(rec[Anum_key_record_token - 1]) <= 0 ||
		DatumGetInt64(rec[Anum_key_record_token - 1]) > IDEM_MAX_TOKEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("token of an imported idempotency key must be between 1 and " INT64_FORMAT,
						IDEM_MAX_TOKEN),
				 errdetail("Tokens are issued from the clock, in microseconds; a larger one would leave no room for the tokens of later claims.")));
	IdemCheckImportedExpiry(DatumGetTimestampTz(rec[Anum_key_record_expires_at - 1]));
	if (state == KEY_COMPLETED)
	{
		int32		code;

		IdemRequireField(recnulls[Anum_key_record_response_code - 1], "response_code");
		code = DatumGetInt32(rec[Anum_key_record_response_code - 1]);
		if (code < 100 || code > 599)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("response_code %d is out of range", code),
					 errdetail("An HTTP status code is between 100 and 599.")));
	}
	else if (!recnulls[Anum_key_record_response_code - 1] ||
			 !recnulls[Anum_key_record_response_body - 1] ||
			 !recnulls[Anum_key_record_response_headers - 1] ||
			 !recnulls[Anum_key_record_response_raw - 1])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an idempotency key that is not completed has no response")));
	if (state != KEY_IN_PROGRESS && !recnulls[Anum_key_record_lease_expires_at - 1])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an idempotency key that is not in progress has no lease")));
	if (!recnulls[Anum_key_record_fingerprint - 1] &&
		VARSIZE_ANY_EXHDR(DatumGetByteaPP(rec[Anum_key_record_fingerprint - 1])) !=
		IDEM_FINGERPRINT_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fingerprint of an imported idempotency key must be %d bytes",
						IDEM_FINGERPRINT_LEN)));
	if (!recnulls[Anum_key_record_recovery_point - 1])
		IdemCheckKeyLength(VARSIZE_ANY_EXHDR(DatumGetTextPP(rec[Anum_key_record_recovery_point - 1])),
						   "recovery_point");
	if (state == KEY_IN_PROGRESS && recnulls[Anum_key_record_lease_expires_at - 1])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an idempotency key in progress must have a lease"),
				 errdetail("Only a two-phase claim, which has a lease, is in progress once committed; without one the key could never be taken over.")));
	if (state == KEY_IN_PROGRESS &&
		DatumGetTimestampTz(rec[Anum_key_record_lease_expires_at - 1]) >
		DatumGetTimestampTz(rec[Anum_key_record_expires_at - 1]))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease of an imported idempotency key must not end after the key expires")));
	IdemCheckImportedKept(rec, recnulls, state);
	return state;
}

/*
 * IdemCheckImportedKept checks the fields of an imported key_record that
 * came with 0.4.0: a kept key and scope, which must be the key's (they
 * hash to its digest), a kept request only with them, and a response as
 * idem_complete() would have stored it.
 */
static void
IdemCheckImportedKept(Datum *rec, bool *recnulls, char state)
{
	int64		size = 0;

	if (recnulls[Anum_key_record_kept_key - 1] !=
		recnulls[Anum_key_record_kept_scope - 1] ||
		(recnulls[Anum_key_record_kept_key - 1] &&
		 !recnulls[Anum_key_record_request - 1]))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an imported idempotency key keeps its request with its key and scope, or none of them")));
	if (!recnulls[Anum_key_record_kept_key - 1])
	{
		text	   *key = DatumGetTextPP(rec[Anum_key_record_kept_key - 1]);
		text	   *scope = DatumGetTextPP(rec[Anum_key_record_kept_scope - 1]);
		IdemDigest	digest;

		IdemCheckKeyLength(VARSIZE_ANY_EXHDR(key), "kept_key");
		IdemCheckKeyLength(VARSIZE_ANY_EXHDR(scope), "kept_scope");
		IdemComputeDigest(VARDATA_ANY(scope), VARSIZE_ANY_EXHDR(scope),
						  VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), &digest);
		if (memcmp(digest.uuid.data,
				   DatumGetUUIDP(rec[Anum_key_record_digest - 1])->data,
				   UUID_LEN) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("kept_key and kept_scope of an imported idempotency key are not those of its digest")));
		if (!recnulls[Anum_key_record_request - 1])
			size += IdemJsonbTextSize(rec[Anum_key_record_request - 1]);
	}
	if (state != KEY_COMPLETED)
	{
		IdemCheckStoredSize(size, "idempotency.import_key()");
		return;
	}
	if (!recnulls[Anum_key_record_response_body - 1] &&
		!recnulls[Anum_key_record_response_raw - 1])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response_body and response_raw cannot both be given")));
	if (!recnulls[Anum_key_record_response_body - 1])
		size += IdemJsonbTextSize(rec[Anum_key_record_response_body - 1]);
	if (!recnulls[Anum_key_record_response_raw - 1])
		size += VARSIZE_ANY_EXHDR(DatumGetByteaPP(rec[Anum_key_record_response_raw - 1]));
	if (!recnulls[Anum_key_record_response_headers - 1])
	{
		IdemCheckResponseHeaders(rec[Anum_key_record_response_headers - 1]);
		size += IdemJsonbTextSize(rec[Anum_key_record_response_headers - 1]);
	}
	IdemCheckStoredSize(size, "idempotency.import_key()");
}

/*
 * idempotency.import_key(k record) RETURNS text
 *
 * Stores an exported key in this node's ledger unless this node has a
 * version at least as new.  Answers inserted, replaced, kept or expired.
 * Every field is checked before anything is written.
 */
Datum
idem_import_key(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_key_record];
	bool		recnulls[Natts_key_record];
	Datum		values[Natts_keys];
	bool		nulls[Natts_keys];
	Oid			role;
	pg_uuid_t	digest;
	char		state;

	IdemCheckLibraryVersion();
	/* a ledger not updated to 0.4.0 yet takes only what it can hold */
	memset(recnulls, true, sizeof(recnulls));
	IdemDeformRecord(fcinfo,
					 IdemInstalledVersionAtLeast("0.4.0") ?
					 Natts_key_record : Natts_key_record_v1,
					 Natts_key_record_v1, key_record_types, "key_record",
					 rec, recnulls);
	state = IdemCheckImportedKey(rec, recnulls, &role);
	digest = *DatumGetUUIDP(rec[Anum_key_record_digest - 1]);
	IdemCheckWritable("idempotency.import_key()");
	IdemRefuseLegacy(IDEM_LEDGER_KEYS, "idempotency.import_key()");

	memset(nulls, false, sizeof(nulls));
	values[Anum_ledger_expires_at - 1] = rec[Anum_key_record_expires_at - 1];
	values[Anum_keys_state - 1] = CharGetDatum(state);
	values[Anum_keys_token - 1] = rec[Anum_key_record_token - 1];
	values[Anum_keys_claimed_at - 1] = rec[Anum_key_record_claimed_at - 1];
	values[Anum_keys_lease_until - 1] = rec[Anum_key_record_lease_expires_at - 1];
	nulls[Anum_keys_lease_until - 1] = recnulls[Anum_key_record_lease_expires_at - 1];
	values[Anum_keys_fingerprint - 1] = rec[Anum_key_record_fingerprint - 1];
	nulls[Anum_keys_fingerprint - 1] = recnulls[Anum_key_record_fingerprint - 1];
	values[Anum_keys_recovery_point - 1] = rec[Anum_key_record_recovery_point - 1];
	nulls[Anum_keys_recovery_point - 1] = recnulls[Anum_key_record_recovery_point - 1];
	values[Anum_keys_response_code - 1] = rec[Anum_key_record_response_code - 1];
	nulls[Anum_keys_response_code - 1] = recnulls[Anum_key_record_response_code - 1];
	values[Anum_keys_response_body - 1] = rec[Anum_key_record_response_body - 1];
	nulls[Anum_keys_response_body - 1] = recnulls[Anum_key_record_response_body - 1];
	values[Anum_keys_kept_key - 1] = rec[Anum_key_record_kept_key - 1];
	nulls[Anum_keys_kept_key - 1] = recnulls[Anum_key_record_kept_key - 1];
	values[Anum_keys_kept_scope - 1] = rec[Anum_key_record_kept_scope - 1];
	nulls[Anum_keys_kept_scope - 1] = recnulls[Anum_key_record_kept_scope - 1];
	values[Anum_keys_kept_request - 1] = rec[Anum_key_record_request - 1];
	nulls[Anum_keys_kept_request - 1] = recnulls[Anum_key_record_request - 1];
	/* recoverable once its lease lapses, as idem_claim() would have it */
	values[Anum_keys_recover_at - 1] = values[Anum_keys_lease_until - 1];
	nulls[Anum_keys_recover_at - 1] = state != KEY_IN_PROGRESS ||
		nulls[Anum_keys_kept_key - 1];
	values[Anum_keys_response_headers - 1] = rec[Anum_key_record_response_headers - 1];
	nulls[Anum_keys_response_headers - 1] = recnulls[Anum_key_record_response_headers - 1];
	values[Anum_keys_response_raw - 1] = rec[Anum_key_record_response_raw - 1];
	nulls[Anum_keys_response_raw - 1] = recnulls[Anum_key_record_response_raw - 1];

	PG_RETURN_TEXT_P(IdemImportOutcomeText(IdemImportKey(role, &digest,
														 values, nulls)));
}

/*
 * idempotency.import_message(m record) RETURNS text
 *
 * Records an exported message id as consumed in this node's ledger unless
 * this node has it already.  Answers inserted, kept or expired.
 */
Datum
idem_import_message(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_message_record];
	bool		recnulls[Natts_message_record];
	Oid			role;
	IdemDigest	digest;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz expires_at;

	IdemCheckLibraryVersion();
	IdemDeformRecord(fcinfo, Natts_message_record, Natts_message_record,
					 message_record_types, "message_record", rec, recnulls);
	role = IdemImportRole(rec[Anum_key_record_role - 1],
						  recnulls[Anum_key_record_role - 1]);
	IdemRequireField(recnulls[Anum_key_record_digest - 1], "digest");
	IdemRequireField(recnulls[Anum_key_record_expires_at - 1], "expires_at");
	digest.uuid = *DatumGetUUIDP(rec[Anum_key_record_digest - 1]);
	memcpy(digest.legacy_head, digest.uuid.data, IDEM_DIGEST_PREFIX_LEN);
	expires_at = DatumGetTimestampTz(rec[Anum_key_record_expires_at - 1]);
	IdemCheckImportedExpiry(expires_at);
	IdemCheckWritable("idempotency.import_message()");
	IdemRefuseLegacy(IDEM_LEDGER_MESSAGES, "idempotency.import_message()");

	if (expires_at <= now)
		PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_EXPIRED));
	PG_RETURN_TEXT_P(IdemImportOutcomeText(IdemRecordMessage(role, &digest, NULL,
															  expires_at, NULL) ?
										   IDEM_IMPORT_INSERTED :
										   IDEM_IMPORT_KEPT));
}

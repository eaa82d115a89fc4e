/*-------------------------------------------------------------------------
 *
 * memory_transfer.c
 *	  Moving the key memory with a tenant (idempotency.key_memory, 0.5.0):
 *	  idempotency.export_key_memory(), idempotency.import_key_memory(),
 *	  idempotency.export_message_memory() and
 *	  idempotency.import_message_memory().
 *
 * A tenant that moves to another node (doc/scale-out.md, "Moving a
 * tenant") takes its live keys and consumed message ids along with
 * export_keys() and import_key() (transfer.c); the keys it no longer has
 * live but still remembers go with these.  Export gives, for the given
 * namespaces (scopes, consumers; all if NULL), every (role, digest) pair
 * remembered now: expired rows still in the ledger's partitions (released
 * keys left out, as maintenance leaves them out of the memory) and the
 * pairs of the memory's pieces, each with the instant by which its key had
 * expired ("expired_by": the end of its partition's range, from which the
 * memory counts).  Only digests travel, as in the memory.
 *
 * Import remembers a pair on this node for this node's key_memory after
 * expired_by (memory.c, IdemMemoryImport): "inserted", "kept" if this node
 * remembers it already, "expired" if that time has passed (or the memory
 * is off here).  A remembered key is answered "expired" and never runs
 * again, so importing one is writing into its role's scope: the caller
 * must have the privileges of the record's role (a superuser has every
 * role's), whatever was granted to it, so that a role allowed to move
 * tenants cannot make another role's keys answer "expired".
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/memory_transfer.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "keyhash.h"
#include "memory.h"
#include "protocol.h"
#include "storage.h"
#include "transfer.h"

#include "access/heapam.h"
#include "access/htup_details.h"
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
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_export_key_memory);
PG_FUNCTION_INFO_V1(idem_export_message_memory);
PG_FUNCTION_INFO_V1(idem_import_key_memory);
PG_FUNCTION_INFO_V1(idem_import_message_memory);

/* Columns of idempotency.memory_record */
#define Anum_memory_record_role			1
#define Anum_memory_record_digest		2
#define Anum_memory_record_expired_by	3
#define Natts_memory_record				3

static const Oid memory_record_types[Natts_memory_record] = {
	NAMEOID, UUIDOID, TIMESTAMPTZOID
};

/* What an export collects */
typedef struct IdemMemoryExport
{
	ReturnSetInfo *rsinfo;
	uint8		(*prefixes)[IDEM_DIGEST_PREFIX_LEN];
	int			nprefixes;		/* -1: every namespace */
} IdemMemoryExport;

static int	IdemMemoryPrefixes(ArrayType *namespaces, const char *argname,
							   const char *elemname,
							   uint8 (**prefixes)[IDEM_DIGEST_PREFIX_LEN]);
static void IdemMemoryEmit(Oid role, const pg_uuid_t *digest,
						   TimestampTz expired_by, void *arg);
static void IdemMemoryExportLedger(IdemLedger ledger, TimestampTz now,
								   TimestampTz since, IdemMemoryExport *ex);
static Datum IdemExportMemory(FunctionCallInfo fcinfo, IdemLedger ledger,
							  const char *argname, const char *elemname);
static Datum IdemImportMemory(FunctionCallInfo fcinfo, IdemLedger ledger,
							  const char *funcname);

/*
 * IdemMemoryPrefixes sets *prefixes to the digest prefixes of the
 * namespaces of an array and returns how many (as export_keys() reads its
 * argument).
 */
static int
IdemMemoryPrefixes(ArrayType *namespaces, const char *argname,
				   const char *elemname,
				   uint8 (**prefixes)[IDEM_DIGEST_PREFIX_LEN])
{
	Datum	   *elems;
	bool	   *elemnulls;
	int			nelems;
	int			i;
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

		if (elemnulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain nulls", argname),
					 errdetail("Element %d is null.", i + 1)));
		ns = DatumGetTextPP(elems[i]);
		IdemCheckKeyLength(VARSIZE_ANY_EXHDR(ns), elemname);
		IdemNamespacePrefix(VARDATA_ANY(ns), VARSIZE_ANY_EXHDR(ns), out[i]);
	}
	*prefixes = out;
	return nelems;
}

/*
 * IdemMemoryEmit adds one remembered pair to the export's result if its
 * digest is of one of the namespaces and its role still exists.
 */
static void
IdemMemoryEmit(Oid role, const pg_uuid_t *digest, TimestampTz expired_by,
			   void *arg)
{
	IdemMemoryExport *ex = (IdemMemoryExport *) arg;
	Datum		values[Natts_memory_record];
	bool		nulls[Natts_memory_record] = {false, false, false};
	char	   *rolename;
	int			i;

	for (i = 0; i < ex->nprefixes; i++)
	{
		if (memcmp(digest->data, ex->prefixes[i], IDEM_DIGEST_PREFIX_LEN) == 0)
			break;
	}
	if (ex->nprefixes >= 0 && i == ex->nprefixes)
		return;
	rolename = GetUserNameFromId(role, true);
	if (rolename == NULL)
		return;
	values[Anum_memory_record_role - 1] = DirectFunctionCall1(namein,
															  CStringGetDatum(rolename));
	values[Anum_memory_record_digest - 1] = UUIDPGetDatum(digest);
	values[Anum_memory_record_expired_by - 1] = TimestampTzGetDatum(expired_by);
	tuplestore_putvalues(ex->rsinfo->setResult, ex->rsinfo->setDesc,
						 values, nulls);
}

/*
 * IdemMemoryExportLedger adds the expired rows still in the ledger's
 * partitions that are remembered now (see IdemMemoryRowRemembered): of a
 * partition whose range ended after "since", expired, not released.  Each
 * partition that can hold one is read whole (an export is rare; the live
 * rows' export reads by index range).  A partition dropped meanwhile has
 * put its rows into a piece, which the caller reads next.
 */
static void
IdemMemoryExportLedger(IdemLedger ledger, TimestampTz now, TimestampTz since,
					   IdemMemoryExport *ex)
{
	List	   *parts;
	ListCell   *lc;

	if (!OidIsValid(IdemLedgerParent(ledger, false)))
		return;
	AcceptInvalidationMessages();
	parts = IdemAllPartitions(ledger);
	foreach(lc, parts)
	{
		IdemPartition *p = (IdemPartition *) lfirst(lc);
		Relation	rel;
		TableScanDesc scan;
		TupleTableSlot *slot;
		bool		with_state;

		/* no row of it has expired yet, or none is remembered any more */
		if (p->lower > now || p->upper <= since)
			continue;
		if (IdemLaneIsLegacy(p->lane))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot export the memory of \"%s.%s\" while it holds keys written before version 0.3.0",
							IDEM_SCHEMA_NAME, IdemLedgerName(ledger)),
					 errdetail("Partition \"%s\" is remembered until idempotency.key_memory after %s.",
							   get_rel_name(p->relid), timestamptz_to_str(p->upper))));
		LockRelationOid(p->relid, AccessShareLock);
		if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(p->relid)))
		{
			UnlockRelationOid(p->relid, AccessShareLock);
			continue;
		}
		rel = table_open(p->relid, NoLock);
		with_state = RelationGetDescr(rel)->natts >= Anum_keys_state;
		slot = table_slot_create(rel, NULL);
		scan = table_beginscan(rel, GetActiveSnapshot(), 0, NULL);
		while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;

			CHECK_FOR_INTERRUPTS();
			if (DatumGetTimestampTz(slot_getattr(slot, Anum_ledger_expires_at, &isnull)) > now)
				continue;
			if (with_state &&
				DatumGetChar(slot_getattr(slot, Anum_keys_state, &isnull)) == KEY_RELEASED)
				continue;
			IdemMemoryEmit(DatumGetObjectId(slot_getattr(slot, Anum_ledger_role, &isnull)),
						   DatumGetUUIDP(slot_getattr(slot, Anum_ledger_digest, &isnull)),
						   p->upper, ex);
		}
		table_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		table_close(rel, AccessShareLock);
	}
	list_free_deep(parts);
}

/*
 * IdemExportMemory is the body of the export functions: the pairs of one
 * ledger remembered now under this session's idempotency.key_memory, of
 * the given namespaces (all if the array is NULL).
 */
static Datum
IdemExportMemory(FunctionCallInfo fcinfo, IdemLedger ledger,
				 const char *argname, const char *elemname)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz since = now - (int64) idem_key_memory * USECS_PER_SEC;
	IdemMemoryExport ex;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	ex.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ex.prefixes = NULL;
	ex.nprefixes = -1;
	if (!PG_ARGISNULL(0))
		ex.nprefixes = IdemMemoryPrefixes(PG_GETARG_ARRAYTYPE_P(0), argname,
										  elemname, &ex.prefixes);
	if (ex.nprefixes == 0 || idem_key_memory <= 0)
		return (Datum) 0;
	IdemMemoryExportLedger(ledger, now, since, &ex);
	IdemMemoryForEach(ledger, since, IdemMemoryEmit, &ex);
	return (Datum) 0;
}

/*
 * idempotency.export_key_memory(scopes text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.memory_record
 */
Datum
idem_export_key_memory(PG_FUNCTION_ARGS)
{
	return IdemExportMemory(fcinfo, IDEM_LEDGER_KEYS, "scopes", "scope");
}

/*
 * idempotency.export_message_memory(consumers text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.memory_record
 */
Datum
idem_export_message_memory(PG_FUNCTION_ARGS)
{
	return IdemExportMemory(fcinfo, IDEM_LEDGER_MESSAGES, "consumers",
							"consumer");
}

/*
 * IdemImportMemory is the body of the import functions: checks every field
 * of the record and the caller's right to write into the record's role's
 * scope, then remembers the pair (IdemMemoryImport).
 */
static Datum
IdemImportMemory(FunctionCallInfo fcinfo, IdemLedger ledger,
				 const char *funcname)
{
	Datum		rec[Natts_memory_record];
	bool		recnulls[Natts_memory_record];
	Oid			role;
	pg_uuid_t	digest;
	TimestampTz expired_by;
	TimestampTz limit;

	IdemCheckLibraryVersion();
	IdemDeformRecord(fcinfo, Natts_memory_record, Natts_memory_record,
					 memory_record_types, "memory_record", rec, recnulls);
	role = IdemImportRole(rec[Anum_memory_record_role - 1],
						  recnulls[Anum_memory_record_role - 1]);
	IdemRequireField(recnulls[Anum_memory_record_digest - 1], "digest");
	IdemRequireField(recnulls[Anum_memory_record_expired_by - 1], "expired_by");
	digest = *DatumGetUUIDP(rec[Anum_memory_record_digest - 1]);
	expired_by = DatumGetTimestampTz(rec[Anum_memory_record_expired_by - 1]);

	if (!has_privs_of_role(GetUserId(), role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to import the key memory of role \"%s\"",
						NameStr(*DatumGetName(rec[Anum_memory_record_role - 1]))),
				 errdetail("Only roles with the privileges of role \"%s\" may import what it remembers.",
						   NameStr(*DatumGetName(rec[Anum_memory_record_role - 1])))));

	/* a key that had expired, at most as far ahead as this node keeps rows */
	limit = GetCurrentTimestamp() + (int64) idem_max_ttl * USECS_PER_SEC;
	if (TIMESTAMP_NOT_FINITE(expired_by) || expired_by > limit)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expired_by of an imported record is beyond \"%s\"",
						"idempotency.max_ttl"),
				 errdetail("This node keeps rows for at most %d seconds.", idem_max_ttl),
				 errhint("Raise \"%s\" on this node to at least the other node's.",
						 "idempotency.max_ttl")));
	IdemCheckWritable(funcname);

	PG_RETURN_TEXT_P(IdemImportOutcomeText(IdemMemoryImport(ledger, role,
															&digest,
															expired_by)));
}

/*
 * idempotency.import_key_memory(r record) RETURNS text
 *
 * Remembers an exported expired key: inserted, kept or expired.
 */
Datum
idem_import_key_memory(PG_FUNCTION_ARGS)
{
	return IdemImportMemory(fcinfo, IDEM_LEDGER_KEYS,
							"idempotency.import_key_memory()");
}

/*
 * idempotency.import_message_memory(r record) RETURNS text
 *
 * Remembers an exported expired message id: inserted, kept or expired.
 */
Datum
idem_import_message_memory(PG_FUNCTION_ARGS)
{
	return IdemImportMemory(fcinfo, IDEM_LEDGER_MESSAGES,
							"idempotency.import_message_memory()");
}

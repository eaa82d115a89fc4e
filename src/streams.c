/*-------------------------------------------------------------------------
 *
 * streams.c
 *	  Ordered streams: positions (idem_assign, idem_advance,
 *	  idem_positions) and producer sequences (idem_sequence).
 *
 * For a partitioned log whose offsets only grow within a partition (Kafka,
 * Kinesis, Redis Streams), one row per partition replaces one row per
 * message: idempotency.positions holds, per (role, consumer, stream,
 * partition), the next offset to process and the partition's assignment
 * generation.  idempotency.sequences holds, per (role, consumer, producer),
 * the last sequence number seen and its epoch.  Both are small tables,
 * members of the extension whose rows pg_dump carries; rows unused for
 * idempotency.position_ttl, and those of a role that was dropped, are
 * deleted by maintenance (IdemStreamsMaintain).
 *
 * Every call takes a heavyweight lock on its row's identity (the role, and
 * a digest of consumer, stream and partition, or of consumer and producer)
 * and keeps it until its transaction ends: concurrent calls on one
 * partition wait for each other, a waiter then sees the committed outcome,
 * and a rolled-back batch left the position where it was, so its records
 * are delivered and processed again.  An assignment takes its locks in the
 * order of their tags, so two assignments of overlapping partitions cannot
 * deadlock.  The role's OID is a field of the tag of its own, so that no
 * role can take a lock another role's calls need (IdemStreamLockTag).
 * Under the lock, the row is read FOR UPDATE under a fresh snapshot (as
 * committed, plus this transaction's changes), and inserted or updated,
 * directly (keyed_rows.h: one probe of the primary key, the row lock, a HOT
 * update; no SQL).  The row lock keeps maintenance's DELETE of unused rows
 * off a row a call has read (IdemStreamsMaintain).
 *
 * The tables belong to the storage owner and are granted to nobody: a call
 * reaches only its own role's rows.  The statements that list or export
 * rows run as that owner (privilege.c), are prepared once per backend, and
 * name every table and operator with its schema.
 *
 * A position of a call that names its tenant (idem_assign(..., tenant) and
 * the others, since 0.5.0) is in idempotency.tenant_positions when
 * idempotency.citus_distribute() made that table: distributed by Citus by
 * its fifth column "tenant", co-located with the tenant's tables, so that
 * Citus' own shard operations carry it with the tenant's rows.  The call
 * is routed to the local shard of its tenant (citus.c: the shard's
 * metadata lock, the placement check), whose table it opens by OID with
 * the same direct reads and writes; a position's identity then has the
 * tenant too.  Without that table the tenant is not used.  The calls
 * without a tenant always use the node's own idempotency.positions, at
 * the same cost as before.
 *
 * A lower generation than the stored one (a consumer still working on a
 * partition that was assigned to another since: a zombie) is refused with
 * SQLSTATE ID001 and changes nothing, and so is an advance without a
 * generation of a partition that has one; a strict sequence gap is refused
 * with ID002.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/streams.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "compat.h"
#include "keyed_rows.h"
#include "keyhash.h"
#include "privilege.h"
#include "stats.h"
#include "storage.h"
#include "streams.h"
#include "transfer.h"

#include "access/stratnum.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idem_assign);
PG_FUNCTION_INFO_V1(idem_advance);
PG_FUNCTION_INFO_V1(idem_positions);
PG_FUNCTION_INFO_V1(idem_sequence);
PG_FUNCTION_INFO_V1(idem_export_positions);
PG_FUNCTION_INFO_V1(idem_export_sequences);
PG_FUNCTION_INFO_V1(idem_import_position);
PG_FUNCTION_INFO_V1(idem_import_sequence);

/* SQLSTATEs of this file */
#define ERRCODE_IDEM_STALE_GENERATION	MAKE_SQLSTATE('I','D','0','0','1')
#define ERRCODE_IDEM_SEQUENCE_GAP		MAKE_SQLSTATE('I','D','0','0','2')

/* The statements on the stream tables */
typedef enum IdemStreamStmt
{
	STMT_LIST_POSITIONS,
	STMT_TOUCH_POSITIONS,
	STMT_EXPORT_POSITIONS,
	STMT_EXPORT_SEQUENCES,
	IDEM_NUM_STREAM_STMTS
} IdemStreamStmt;

typedef struct IdemStreamStmtDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[7];
} IdemStreamStmtDef;

#define POSITION_WHERE \
	" WHERE role OPERATOR(pg_catalog.=) $1 AND consumer OPERATOR(pg_catalog.=) $2" \
	" AND stream OPERATOR(pg_catalog.=) $3"

static const IdemStreamStmtDef stmt_defs[IDEM_NUM_STREAM_STMTS] = {
	[STMT_LIST_POSITIONS] = {
		"SELECT part, next_offset, generation, updated_at FROM idempotency.positions"
		POSITION_WHERE " ORDER BY part",
		3, {OIDOID, TEXTOID, TEXTOID}
	},
	[STMT_TOUCH_POSITIONS] = {
		"UPDATE idempotency.positions SET updated_at = $4" POSITION_WHERE
		" AND updated_at OPERATOR(pg_catalog.<) $5",
		5, {OIDOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
	},
	/* of roles that exist; consumers NULL: all */
	[STMT_EXPORT_POSITIONS] = {
		"SELECT r.rolname, p.consumer, p.stream, p.part, p.next_offset,"
		" p.generation, p.updated_at"
		" FROM idempotency.positions AS p JOIN pg_catalog.pg_roles AS r"
		" ON r.oid OPERATOR(pg_catalog.=) p.role"
		" WHERE $1 IS NULL OR p.consumer OPERATOR(pg_catalog.=) ANY ($1)"
		" ORDER BY 1, 2, 3, 4",
		1, {TEXTARRAYOID}
	},
	[STMT_EXPORT_SEQUENCES] = {
		"SELECT r.rolname, s.consumer, s.producer, s.epoch, s.seq, s.updated_at"
		" FROM idempotency.sequences AS s JOIN pg_catalog.pg_roles AS r"
		" ON r.oid OPERATOR(pg_catalog.=) s.role"
		" WHERE $1 IS NULL OR s.consumer OPERATOR(pg_catalog.=) ANY ($1)"
		" ORDER BY 1, 2, 3",
		1, {TEXTARRAYOID}
	},
};

/* prepared once per backend (SPI_keepplan) */
static SPIPlanPtr stmt_plans[IDEM_NUM_STREAM_STMTS];

/* The stream tables, read and written directly (keyed_rows.h) */
static IdemKeyedTable positions_table = {
	"positions", 7, 4, {OIDOID, TEXTOID, TEXTOID, INT4OID},
	{REGROLEOID, TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, TIMESTAMPTZOID},
	InvalidOid
};
static IdemKeyedTable sequences_table = {
	"sequences", 6, 3, {OIDOID, TEXTOID, TEXTOID},
	{REGROLEOID, TEXTOID, TEXTOID, INT8OID, INT8OID, TIMESTAMPTZOID},
	InvalidOid
};

/*
 * idempotency.tenant_positions, made by idempotency.citus_distribute() and
 * distributed by Citus by its column "tenant", the fifth, of the type of
 * the tenant tables' distribution column (set at the routing: keytypes[4]
 * is the input type of its default btree opclass, atttypes[4] the type):
 * the positions of the tenant calls, idem_assign(..., tenant) and the
 * others, each written in the local shard of its tenant (citus.c), so that
 * Citus' shard operations carry them with the tenant's rows.  Opened by
 * the shard's OID (IdemKeyedOpenRelid).  Its role column is an
 * idempotency.role_ref (role_ref.c: copied between nodes by the role's
 * name), which the keyed tables take where a regrole is expected.
 */
static IdemKeyedTable tenant_positions_table = {
	"tenant_positions", 8, 5, {OIDOID, TEXTOID, TEXTOID, INT4OID, InvalidOid},
	{REGROLEOID, TEXTOID, TEXTOID, INT4OID, InvalidOid, INT8OID, INT8OID,
	TIMESTAMPTZOID},
	InvalidOid
};

/* idempotency.tenant_sequences, likewise: "tenant" fourth, after the key */
static IdemKeyedTable tenant_sequences_table = {
	"tenant_sequences", 7, 4, {OIDOID, TEXTOID, TEXTOID, InvalidOid},
	{REGROLEOID, TEXTOID, TEXTOID, InvalidOid, INT8OID, INT8OID, TIMESTAMPTZOID},
	InvalidOid
};

/*
 * Where a call's positions or sequence are: the node's own
 * idempotency.positions (sequences), or the local shard of
 * idempotency.tenant_positions (tenant_sequences) that holds the call's
 * tenant (off = 1: its columns after the key are one further).
 */
typedef struct IdemStreamAt
{
	IdemKeyedTable *table;
	Oid			shard;			/* the shard's table, or InvalidOid */
	Oid			tenant_type;
	Datum		tenant;			/* a value of tenant_type */
	int			off;
} IdemStreamAt;

/* columns of idempotency.positions and idempotency.sequences, from 0 */
#define POSITION_NEXT_OFFSET	4
#define POSITION_GENERATION		5
#define POSITION_UPDATED_AT		6
#define SEQUENCE_EPOCH			3
#define SEQUENCE_SEQ			4
#define SEQUENCE_UPDATED_AT		5

/* One position as read */
typedef struct IdemPosition
{
	IdemKeyedRow row;			/* found, and the version locked */
	bool		has_next;
	int64		next_offset;
	bool		has_generation;
	int64		generation;
} IdemPosition;

static void IdemStreamLock(uint32 kind, Oid role, text *a, text *b, int32 part);
static int	IdemStreamExec(IdemStreamStmt which, Datum *values, const bool *isnull);
static void IdemStreamBegin(IdemSavedUser *save);
static void IdemStreamEnd(const IdemSavedUser *save);
static inline void IdemStreamOwn(IdemStreamAt *at, IdemCitusTable which);
static inline void IdemStreamRoute(FunctionCallInfo fcinfo, int argno,
								   IdemCitusTable which, bool write,
								   IdemStreamAt *at);
static void IdemStreamOpen(IdemKeyedRows *rows, const IdemStreamAt *at);
static void IdemListShardPositions(const IdemStreamAt *at, Datum *args,
								   bool touch);
static char *IdemTenantEqualityName(Oid tenant_type);
static uint64 IdemTenantStreamsMaintain(Oid nsp, const char *relname,
										const char *cutoff);
static void IdemGetPosition(IdemKeyedRows *rows, const IdemStreamAt *at,
							Oid role, text *consumer, text *stream, int32 part,
							IdemPosition *pos);
static void IdemPutPosition(IdemKeyedRows *rows, const IdemStreamAt *at,
							Oid role, text *consumer, text *stream, int32 part,
							IdemPosition *old, bool has_next,
							int64 next_offset, bool has_generation,
							int64 generation, TimestampTz now);
static bool IdemGetSequence(IdemKeyedRows *rows, const IdemStreamAt *at,
							Oid role, text *consumer, text *producer,
							IdemKeyedRow *row);
static void IdemPutSequence(IdemKeyedRows *rows, const IdemStreamAt *at,
							Oid role, text *consumer, text *producer,
							IdemKeyedRow *row, int64 epoch, int64 seq,
							TimestampTz now);
static void IdemCheckGeneration(const IdemPosition *pos, int64 generation,
								text *stream, int32 part);
static void IdemRefuseUnfenced(const IdemPosition *pos, text *stream,
							   int32 part);
static int64 IdemNonNegativeArg(FunctionCallInfo fcinfo, int argno,
								const char *argname);
static int32 *IdemPartsArg(FunctionCallInfo fcinfo, int argno, int *nparts);
static int	IdemCompareInt32(const void *a, const void *b);

/*
 * IdemStreamLockTag sets the tag of the lock on one position (kind
 * IDEM_LOCK_POSITION: consumer a, stream b, partition) or one producer's
 * sequence (IDEM_LOCK_SEQUENCE: consumer a, producer b) of role "role":
 * the role's OID and a hash of the rest keyed with the database's secret
 * (IdemSetStreamLockTag), so that no role can make its lock the same as
 * another role's, nor tell from pg_locks which names it is on.  Distinct
 * identities of one role may share a lock: they then only wait for each
 * other.
 */
static void
IdemStreamLockTag(LOCKTAG *tag, uint32 kind, Oid role, text *a, text *b,
				  int32 part)
{
	IdemSetStreamLockTag(tag, kind, role,
						 VARDATA_ANY(a), VARSIZE_ANY_EXHDR(a),
						 VARDATA_ANY(b), VARSIZE_ANY_EXHDR(b), part);
}

/* takes the lock on one position or sequence, until the transaction ends */
static void
IdemStreamLock(uint32 kind, Oid role, text *a, text *b, int32 part)
{
	LOCKTAG		tag;

	IdemStreamLockTag(&tag, kind, role, a, b, part);
	IdemKeyedLockAcquire(&tag);
}

/*
 * IdemCompareLockTags orders the stream lock tags of one call (which
 * differ in field3 only), so that every call takes its locks in one order.
 */
static int
IdemCompareLockTags(const void *a, const void *b)
{
	uint32		x = ((const LOCKTAG *) a)->locktag_field3;
	uint32		y = ((const LOCKTAG *) b)->locktag_field3;

	return (x > y) - (x < y);
}

/* connects to SPI as the storage owner */
static void
IdemStreamBegin(IdemSavedUser *save)
{
	IdemOwnerSPIBegin(save);
}

static void
IdemStreamEnd(const IdemSavedUser *save)
{
	IdemOwnerSPIEnd(save);
}

/*
 * IdemStreamExec runs one of the statements under a fresh snapshot (what
 * is committed now, and this transaction's own changes), between
 * IdemStreamBegin and IdemStreamEnd.  Returns SPI_processed.
 */
static int
IdemStreamExec(IdemStreamStmt which, Datum *values, const bool *isnull)
{
	const IdemStreamStmtDef *def = &stmt_defs[which];

	return IdemExecKeptPlan(&stmt_plans[which], def->sql, def->nargs,
							def->argtypes, values, isnull, false);
}

/*
 * IdemStreamRoute sets *at to where the positions (which:
 * IDEM_CITUS_TENANT_POSITIONS) or the producer sequence
 * (IDEM_CITUS_TENANT_SEQUENCES) of the call are.  The forms without a
 * tenant (argno past the call's arguments) use the node's own
 * idempotency.positions or sequences, with no lookup.  A call that names a
 * tenant uses the local shard of idempotency.tenant_positions or
 * tenant_sequences that holds it, if citus_distribute() made that table
 * (citus.c: the shard lock, and 40001 or 0A000 if the shard is not on this
 * node; a NULL tenant is refused there), and the node's own table
 * otherwise (the tenant is then not used, as idem_consume_message()'s is
 * not while the message ledger is not distributed).
 *
 * A call that writes (write) and finds no tenant table locks the node's
 * own table ROW EXCLUSIVE, as its write would, and looks again:
 * citus_distribute() holds that table in SHARE mode from its check that
 * the table is empty to its commit, so a call that waited for it sees the
 * tenant table it made, instead of writing a row into the node's own
 * table that no tenant call would read again (its batch processed twice).
 */
static inline void
IdemStreamRoute(FunctionCallInfo fcinfo, int argno, IdemCitusTable which,
				bool write, IdemStreamAt *at)
{
	IdemKeyedTable *table;
	int			col;
	text	   *tenant;

	IdemStreamOwn(at, which);
	if (PG_NARGS() <= argno)
		return;
	tenant = PG_ARGISNULL(argno) ? NULL : PG_GETARG_TEXT_PP(argno);
	at->shard = IdemCitusRouteTable(which, tenant, "tenant",
									&at->tenant_type, &at->tenant);
	if (!OidIsValid(at->shard) && write)
	{
		Oid			nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);
		Oid			own = OidIsValid(nsp) ?
			get_relname_relid(at->table->relname, nsp) : InvalidOid;

		if (OidIsValid(own))
		{
			/* accepts the invalidations of a distribution that committed */
			LockRelationOid(own, RowExclusiveLock);
			at->shard = IdemCitusRouteTable(which, tenant, "tenant",
											&at->tenant_type, &at->tenant);
		}
	}
	if (!OidIsValid(at->shard))
		return;
	table = which == IDEM_CITUS_TENANT_POSITIONS ?
		&tenant_positions_table : &tenant_sequences_table;
	col = table->nkeys - 1;		/* the tenant: the key's last column */
	if (table->atttypes[col] != at->tenant_type)
	{
		Oid			opclass = GetDefaultOpClass(at->tenant_type, BTREE_AM_OID);

		if (!OidIsValid(opclass))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the tenant column of \"%s.%s\" has no btree operator class",
							IDEM_SCHEMA_NAME, IdemCitusTableNames[which])));
		table->atttypes[col] = at->tenant_type;
		table->keytypes[col] = get_opclass_input_type(opclass);
		table->checked = false;
	}
	at->table = table;
	at->off = 1;
}

/* sets *at to the node's own idempotency.positions or sequences */
static inline void
IdemStreamOwn(IdemStreamAt *at, IdemCitusTable which)
{
	at->table = which == IDEM_CITUS_TENANT_POSITIONS ?
		&positions_table : &sequences_table;
	at->shard = InvalidOid;
	at->tenant_type = InvalidOid;
	at->tenant = (Datum) 0;
	at->off = 0;
}

/* opens the table of the call's positions or sequence (IdemStreamRoute) */
static void
IdemStreamOpen(IdemKeyedRows *rows, const IdemStreamAt *at)
{
	if (OidIsValid(at->shard))
		IdemKeyedOpenRelid(rows, at->table, at->shard);
	else
		IdemKeyedOpen(rows, at->table);
}

/* reads one position (locked by the caller) FOR UPDATE */
static void
IdemGetPosition(IdemKeyedRows *rows, const IdemStreamAt *at, Oid role,
				text *consumer, text *stream, int32 part, IdemPosition *pos)
{
	Datum		key[5];

	key[0] = ObjectIdGetDatum(role);
	key[1] = PointerGetDatum(consumer);
	key[2] = PointerGetDatum(stream);
	key[3] = Int32GetDatum(part);
	key[4] = at->tenant;
	memset(pos, 0, sizeof(*pos));
	if (!IdemKeyedFetch(rows, key, &pos->row))
		return;
	pos->has_next = !pos->row.nulls[POSITION_NEXT_OFFSET + at->off];
	if (pos->has_next)
		pos->next_offset = DatumGetInt64(pos->row.values[POSITION_NEXT_OFFSET + at->off]);
	pos->has_generation = !pos->row.nulls[POSITION_GENERATION + at->off];
	if (pos->has_generation)
		pos->generation = DatumGetInt64(pos->row.values[POSITION_GENERATION + at->off]);
}

/* writes one position (read by IdemGetPosition): insert or update */
static void
IdemPutPosition(IdemKeyedRows *rows, const IdemStreamAt *at, Oid role,
				text *consumer, text *stream, int32 part, IdemPosition *old,
				bool has_next, int64 next_offset, bool has_generation,
				int64 generation, TimestampTz now)
{
	Datum		values[8];
	bool		isnull[8] = {false};
	int			off = at->off;

	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(consumer);
	values[2] = PointerGetDatum(stream);
	values[3] = Int32GetDatum(part);
	values[4] = at->tenant;		/* (next_offset, when not routed) */
	values[POSITION_NEXT_OFFSET + off] = Int64GetDatum(next_offset);
	isnull[POSITION_NEXT_OFFSET + off] = !has_next;
	values[POSITION_GENERATION + off] = Int64GetDatum(generation);
	isnull[POSITION_GENERATION + off] = !has_generation;
	values[POSITION_UPDATED_AT + off] = TimestampTzGetDatum(now);
	IdemKeyedWrite(rows, &old->row, values, isnull);
}

/* reads one producer's sequence (locked by the caller) FOR UPDATE */
static bool
IdemGetSequence(IdemKeyedRows *rows, const IdemStreamAt *at, Oid role,
				text *consumer, text *producer, IdemKeyedRow *row)
{
	Datum		key[4];

	key[0] = ObjectIdGetDatum(role);
	key[1] = PointerGetDatum(consumer);
	key[2] = PointerGetDatum(producer);
	key[3] = at->tenant;
	return IdemKeyedFetch(rows, key, row);
}

/* writes one producer's sequence (read by IdemGetSequence) */
static void
IdemPutSequence(IdemKeyedRows *rows, const IdemStreamAt *at, Oid role,
				text *consumer, text *producer, IdemKeyedRow *row, int64 epoch,
				int64 seq, TimestampTz now)
{
	Datum		values[7];
	bool		isnull[7] = {false};
	int			off = at->off;

	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(consumer);
	values[2] = PointerGetDatum(producer);
	values[3] = at->tenant;		/* (epoch, when not routed) */
	values[SEQUENCE_EPOCH + off] = Int64GetDatum(epoch);
	values[SEQUENCE_SEQ + off] = Int64GetDatum(seq);
	values[SEQUENCE_UPDATED_AT + off] = TimestampTzGetDatum(now);
	IdemKeyedWrite(rows, row, values, isnull);
}

/*
 * IdemCheckGeneration refuses a generation lower than the stored one: the
 * caller lost the partition to another assignment.
 */
static void
IdemCheckGeneration(const IdemPosition *pos, int64 generation, text *stream,
					int32 part)
{
	if (!pos->has_generation || generation >= pos->generation)
		return;
	IdemStatsAdd(IDEM_STAT_STALE_GENERATIONS, 1);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STALE_GENERATION),
			 errmsg("generation " INT64_FORMAT " of partition %d of stream \"%s\" is stale",
					generation, part,
					IdemKeyForMessage(text_to_cstring(stream))),
			 errdetail("The partition was assigned with generation " INT64_FORMAT " since.",
					   pos->generation),
			 errhint("Stop consuming this partition: another consumer owns it now.  Nothing was changed.")));
}

/*
 * IdemRefuseUnfenced refuses an advance without a generation (NULL) of a
 * partition that has one stored: only a caller that names the generation
 * it was assigned can show it still owns the partition, and a zombie that
 * left the argument out would otherwise go unfenced.  NULL counts as lower
 * than every generation, so it is refused as stale (ID001).  A partition
 * never fenced (no generation stored) takes unfenced advances.
 */
static void
IdemRefuseUnfenced(const IdemPosition *pos, text *stream, int32 part)
{
	IdemStatsAdd(IDEM_STAT_STALE_GENERATIONS, 1);
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STALE_GENERATION),
			 errmsg("partition %d of stream \"%s\" is fenced, and no generation was given",
					part, IdemKeyForMessage(text_to_cstring(stream))),
			 errdetail("The partition was assigned with generation " INT64_FORMAT ".",
					   pos->generation),
			 errhint("Pass the generation of the assignment.  Nothing was changed.")));
}

/* a bigint argument that must not be NULL nor negative */
static int64
IdemNonNegativeArg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	int64		v;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	v = PG_GETARG_INT64(argno);
	if (v < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", argname)));
	return v;
}

static int
IdemCompareInt32(const void *a, const void *b)
{
	int32		x = *(const int32 *) a;
	int32		y = *(const int32 *) b;

	return (x > y) - (x < y);
}

/*
 * IdemPartsArg returns the partitions of an int[] argument, sorted and
 * without duplicates: not NULL, one dimension, no NULL or negative element.
 */
static int32 *
IdemPartsArg(FunctionCallInfo fcinfo, int argno, int *nparts)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;
	int			out = 0;
	int32	   *parts;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("parts must not be null")));
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("parts must be a one-dimensional array")));
	deconstruct_array(arr, INT4OID, sizeof(int32), true, TYPALIGN_INT,
					  &elems, &nulls, &n);
	parts = palloc(Max(n, 1) * sizeof(int32));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("parts must not contain null"),
					 errdetail("Element %d is null.", i + 1)));
		parts[i] = DatumGetInt32(elems[i]);
		if (parts[i] < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("partition %d is negative", parts[i])));
	}
	qsort(parts, n, sizeof(int32), IdemCompareInt32);
	for (i = 0; i < n; i++)
		if (out == 0 || parts[out - 1] != parts[i])
			parts[out++] = parts[i];
	*nparts = out;
	return parts;
}

/* a partition argument: not NULL, not negative */
static int32
IdemPartArg(FunctionCallInfo fcinfo, int argno)
{
	int32		part;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("part must not be null")));
	part = PG_GETARG_INT32(argno);
	if (part < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("partition %d is negative", part)));
	return part;
}

/*
 * idem_assign(consumer text, stream text, parts int[], generation bigint)
 *		RETURNS TABLE (part int, next_offset bigint)
 *
 * Records that the caller was assigned the partitions with this
 * generation, and returns where to seek each (NULL: never seen).  Refused,
 * with nothing changed, if any of them has a higher generation stored.
 */
Datum
idem_assign(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			role = GetUserId();
	text	   *consumer;
	text	   *stream;
	int32	   *parts;
	int			nparts;
	int64		generation;
	IdemPosition *pos;
	LOCKTAG    *tags;
	TimestampTz now = GetCurrentTimestamp();
	IdemKeyedRows rows;
	IdemStreamAt at;
	int			i;

	IdemCheckLibraryVersion();
	consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	stream = IdemCheckKeyArg(fcinfo, 1, "stream");
	parts = IdemPartsArg(fcinfo, 2, &nparts);
	generation = IdemNonNegativeArg(fcinfo, 3, "generation");
	IdemCheckWritable("idem_assign()");
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	IdemStreamRoute(fcinfo, 4, IDEM_CITUS_TENANT_POSITIONS, true, &at);

	/*
	 * The partitions' locks, in the order of their tags: two assignments of
	 * overlapping partitions take their common locks in the same order, so
	 * they cannot deadlock, even where two partitions share a lock.
	 */
	pos = palloc(Max(nparts, 1) * sizeof(IdemPosition));
	tags = palloc(Max(nparts, 1) * sizeof(LOCKTAG));
	for (i = 0; i < nparts; i++)
		IdemStreamLockTag(&tags[i], IDEM_LOCK_POSITION, role, consumer, stream,
						  parts[i]);
	qsort(tags, nparts, sizeof(LOCKTAG), IdemCompareLockTags);
	for (i = 0; i < nparts; i++)
		IdemKeyedLockAcquire(&tags[i]);
	IdemStreamOpen(&rows, &at);
	for (i = 0; i < nparts; i++)
	{
		IdemGetPosition(&rows, &at, role, consumer, stream, parts[i], &pos[i]);
		IdemCheckGeneration(&pos[i], generation, stream, parts[i]);
	}
	for (i = 0; i < nparts; i++)
		IdemPutPosition(&rows, &at, role, consumer, stream, parts[i], &pos[i],
						pos[i].has_next, pos[i].next_offset, true, generation,
						now);
	IdemKeyedClose(&rows);

	for (i = 0; i < nparts; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int32GetDatum(parts[i]);
		values[1] = Int64GetDatum(pos[i].next_offset);
		nulls[1] = !pos[i].has_next;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * idem_advance(consumer text, stream text, part int, first_offset bigint,
 *				last_offset bigint, generation bigint DEFAULT NULL)
 *		RETURNS TABLE (first_offset bigint, last_offset bigint)
 *
 * Moves the partition's position past last_offset, in the caller's
 * transaction, and returns the part of [first_offset, last_offset] at or
 * past the position, which the caller processes (no row: all of it was
 * processed already).  Offsets may skip; a gap is never an error.  With a
 * generation, refused if a higher one is stored; without (NULL), refused if
 * any is stored.
 */
Datum
idem_advance(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			role = GetUserId();
	text	   *consumer;
	text	   *stream;
	int32		part;
	int64		first;
	int64		last;
	bool		fenced = !PG_ARGISNULL(5);
	int64		generation = 0;
	IdemPosition pos;
	bool		fresh;
	bool		has_generation;
	TimestampTz now = GetCurrentTimestamp();
	IdemKeyedRows rows;
	IdemStreamAt at;

	IdemCheckLibraryVersion();
	consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	stream = IdemCheckKeyArg(fcinfo, 1, "stream");
	part = IdemPartArg(fcinfo, 2);
	first = IdemNonNegativeArg(fcinfo, 3, "first_offset");
	last = IdemNonNegativeArg(fcinfo, 4, "last_offset");
	if (first > last)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("first_offset " INT64_FORMAT " is past last_offset " INT64_FORMAT,
						first, last)));
	if (last == PG_INT64_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("last_offset must be less than " INT64_FORMAT, PG_INT64_MAX),
				 errdetail("The position after it would not fit in a bigint.")));
	if (fenced)
		generation = IdemNonNegativeArg(fcinfo, 5, "generation");
	IdemCheckWritable("idem_advance()");
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	IdemStreamRoute(fcinfo, 6, IDEM_CITUS_TENANT_POSITIONS, true, &at);

	IdemStreamLock(IDEM_LOCK_POSITION, role, consumer, stream, part);
	IdemStreamOpen(&rows, &at);
	IdemGetPosition(&rows, &at, role, consumer, stream, part, &pos);
	if (fenced)
		IdemCheckGeneration(&pos, generation, stream, part);
	else if (pos.has_generation)
		IdemRefuseUnfenced(&pos, stream, part);
	fresh = !pos.has_next || last >= pos.next_offset;
	has_generation = fenced || pos.has_generation;
	if (fenced && pos.has_generation)
		generation = Max(generation, pos.generation);
	IdemPutPosition(&rows, &at, role, consumer, stream, part, &pos, true,
					fresh ? last + 1 : pos.next_offset,
					has_generation, generation, now);
	IdemKeyedClose(&rows);

	if (fresh)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int64GetDatum(pos.has_next ? Max(first, pos.next_offset) : first);
		values[1] = Int64GetDatum(last);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		IdemStatsAdd(IDEM_STAT_POSITIONS_ADVANCED, 1);
	}
	return (Datum) 0;
}

/*
 * idem_positions(consumer text, stream text[, tenant text])
 *		RETURNS TABLE (part int, next_offset bigint, generation bigint,
 *					   updated_at timestamptz)
 *
 * The caller's positions of one consumer on one stream, as committed (and
 * as this transaction changed them).  Reading them counts as using them:
 * outside a read-only transaction, rows not used for a tenth of
 * idempotency.position_ttl get the current time as updated_at, so that
 * maintenance keeps positions a consumer reads but has not moved.  With a
 * tenant, those of the tenant's shard of idempotency.tenant_positions when
 * citus_distribute() made it (IdemStreamRoute).
 */
Datum
idem_positions(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			role = GetUserId();
	text	   *consumer;
	text	   *stream;
	TimestampTz now = GetCurrentTimestamp();
	IdemSavedUser save;
	Datum		args[6];
	bool		touch;
	IdemStreamAt at;
	uint64		i;

	IdemCheckLibraryVersion();
	consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	stream = IdemCheckKeyArg(fcinfo, 1, "stream");
	InitMaterializedSRF(fcinfo, 0);
	IdemStreamRoute(fcinfo, 2, IDEM_CITUS_TENANT_POSITIONS, false, &at);

	args[0] = ObjectIdGetDatum(role);
	args[1] = PointerGetDatum(consumer);
	args[2] = PointerGetDatum(stream);
	touch = !RecoveryInProgress() && !XactReadOnly;
	args[3] = TimestampTzGetDatum(now);
	args[4] = TimestampTzGetDatum(now - (int64) idem_position_ttl * (USECS_PER_SEC / 10));
	args[5] = at.tenant;
	IdemStreamBegin(&save);
	if (!OidIsValid(at.shard))
	{
		if (touch)
			(void) IdemStreamExec(STMT_TOUCH_POSITIONS, args, NULL);
		(void) IdemStreamExec(STMT_LIST_POSITIONS, args, NULL);
	}
	else
		IdemListShardPositions(&at, args, touch);
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[4];
		bool		nulls[4];
		int			c;

		for (c = 0; c < 4; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  c + 1, &nulls[c]);
		/* by-value columns: nothing to copy out of SPI's memory */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	IdemStreamEnd(&save);
	return (Datum) 0;
}

/*
 * IdemTenantEqualityName is the qualified name of the function of the
 * equality of the tenant column's default btree operator class (that of
 * the shard's primary key, by which the calls find their rows: keyed_rows.c),
 * for the statements of IdemListShardPositions.  Named as a function of
 * its own schema rather than as OPERATOR(pg_catalog.=): a type whose = is
 * not pg_catalog's (citext) would otherwise be compared as text through an
 * implicit cast, and a type with an implicit cast its owner added to text
 * (an enum) make the operator ambiguous; the function's name in its
 * schema has no other candidate of its argument types.
 */
static char *
IdemTenantEqualityName(Oid tenant_type)
{
	Oid			opclass = GetDefaultOpClass(tenant_type, BTREE_AM_OID);
	Oid			intype;
	Oid			opno;
	Oid			fn;

	if (!OidIsValid(opclass))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the tenant column of \"%s.%s\" has no btree operator class",
						IDEM_SCHEMA_NAME,
						IdemCitusTableNames[IDEM_CITUS_TENANT_POSITIONS])));
	intype = get_opclass_input_type(opclass);
	opno = get_opfamily_member(get_opclass_family(opclass), intype, intype,
							   BTEqualStrategyNumber);
	if (!OidIsValid(opno))
		elog(ERROR, "no equality operator for type %u", tenant_type);
	fn = get_opcode(opno);
	return quote_qualified_identifier(get_namespace_name(get_func_namespace(fn)),
									  get_func_name(fn));
}

/*
 * IdemListShardPositions runs idem_positions()'s statements on the local
 * shard of idempotency.tenant_positions of the call (its table, which the
 * routing found and whose shard lock it holds), with the tenant as a sixth
 * parameter, under a fresh snapshot; the list is left in SPI_tuptable.
 * Planned for this call only: the table differs from shard to shard.
 */
static void
IdemListShardPositions(const IdemStreamAt *at, Datum *args, bool touch)
{
	Oid			types[6] = {OIDOID, TEXTOID, TEXTOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, at->tenant_type};
	char	   *table;
	char	   *eq;
	StringInfoData sql;
	int			pass;

	table = quote_qualified_identifier(IDEM_SCHEMA_NAME, get_rel_name(at->shard));
	eq = IdemTenantEqualityName(at->tenant_type);
	initStringInfo(&sql);
	for (pass = touch ? 0 : 1; pass < 2; pass++)
	{
		SPIPlanPtr	plan;
		int			rc;

		resetStringInfo(&sql);
		if (pass == 0)
			appendStringInfo(&sql,
							 "UPDATE %s SET updated_at = $4" POSITION_WHERE
							 " AND %s(tenant, $6)"
							 " AND updated_at OPERATOR(pg_catalog.<) $5", table, eq);
		else
			appendStringInfo(&sql,
							 "SELECT part, next_offset, generation, updated_at FROM %s"
							 POSITION_WHERE " AND %s(tenant, $6)"
							 " ORDER BY part",
							 table, eq);
		plan = SPI_prepare(sql.data, 6, types);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql.data,
				 SPI_result_code_string(SPI_result));
		rc = SPI_execute_snapshot(plan, args, NULL, GetLatestSnapshot(),
								  InvalidSnapshot, false, false, 0);
		if (rc < 0)
			elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
	}
	pfree(sql.data);
}

/*
 * idem_sequence(consumer text, producer text, epoch bigint, seq bigint,
 *				 strict boolean DEFAULT false[, tenant text]) RETURNS text
 *
 * new, duplicate, gap or fenced: see the SPEC's "Ordered streams".  With a
 * tenant, in the tenant's shard of idempotency.tenant_sequences when
 * citus_distribute() made it (IdemStreamRoute).
 */
Datum
idem_sequence(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();
	text	   *consumer;
	text	   *producer;
	int64		epoch;
	int64		seq;
	bool		strict;
	TimestampTz now = GetCurrentTimestamp();
	IdemKeyedRows rows;
	IdemKeyedRow row;
	const char *answer;
	bool		write = true;
	IdemStreamAt at;

	IdemCheckLibraryVersion();
	consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	producer = IdemCheckKeyArg(fcinfo, 1, "producer");
	epoch = IdemNonNegativeArg(fcinfo, 2, "epoch");
	seq = IdemNonNegativeArg(fcinfo, 3, "seq");
	if (PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("strict must not be null")));
	strict = PG_GETARG_BOOL(4);
	IdemCheckWritable("idem_sequence()");
	IdemStreamRoute(fcinfo, 5, IDEM_CITUS_TENANT_SEQUENCES, true, &at);

	IdemStreamLock(IDEM_LOCK_SEQUENCE, role, consumer, producer, 0);
	IdemStreamOpen(&rows, &at);
	if (!IdemGetSequence(&rows, &at, role, consumer, producer, &row))
		answer = "new";
	else
	{
		int64		stored_epoch = DatumGetInt64(row.values[SEQUENCE_EPOCH + at.off]);
		int64		stored_seq = DatumGetInt64(row.values[SEQUENCE_SEQ + at.off]);

		if (epoch < stored_epoch)
		{
			answer = "fenced";
			write = false;
			IdemStatsAdd(IDEM_STAT_SEQUENCES_FENCED, 1);
		}
		else if (epoch > stored_epoch || seq == stored_seq + 1)
			answer = "new";
		else if (seq <= stored_seq)
		{
			answer = "duplicate";
			seq = stored_seq;	/* only used now */
			IdemStatsAdd(IDEM_STAT_SEQUENCE_DUPLICATES, 1);
		}
		else
		{
			IdemStatsAdd(IDEM_STAT_SEQUENCE_GAPS, 1);
			if (strict)
				ereport(ERROR,
						(errcode(ERRCODE_IDEM_SEQUENCE_GAP),
						 errmsg("sequence " INT64_FORMAT " of producer \"%s\" skips " INT64_FORMAT " to " INT64_FORMAT,
								seq, IdemKeyForMessage(text_to_cstring(producer)),
								stored_seq + 1, seq - 1),
						 errdetail("The last sequence seen in epoch " INT64_FORMAT " is " INT64_FORMAT "; nothing was changed.",
								   stored_epoch, stored_seq),
						 errhint("Pass strict => false to process it and count the gap.")));
			answer = "gap";
		}
	}
	if (write)
		IdemPutSequence(&rows, &at, role, consumer, producer, &row, epoch, seq, now);
	IdemKeyedClose(&rows);
	PG_RETURN_TEXT_P(cstring_to_text(answer));
}

/*
 * IdemStreamsMaintain is maintenance's work on the stream tables, if this
 * database's extension has them (0.4.0 on): it takes back any privilege on
 * them granted since (they hold every role's consumers, streams and
 * producers, like the ledgers), and deletes the positions and sequences
 * not used since "before" (idempotency.position_ttl ago), and those of
 * roles that no longer exist (keyed_rows.h, IDEM_KEYED_ROLE_GONE: a role
 * made later could get the same OID).  Returns how many rows went.
 *
 * A call reads its row FOR UPDATE (under its stream lock) and keeps that
 * row lock until its transaction ends; the DELETE locks each row it
 * deletes FOR UPDATE SKIP LOCKED.  So maintenance never deletes a row a
 * call has read and is about to write (which then wrote nothing, and the
 * call answered as if it had), and never waits for a busy stream: a row
 * some transaction holds is skipped, and it is deleted by a later round if
 * it is still unused then.  A call that comes to a row maintenance has
 * deleted but not yet committed waits for maintenance's transaction, then
 * finds no row (it was unused for the ttl) and starts the position or
 * sequence anew.  Row locks take no room in the shared lock table,
 * however many rows go.
 */
uint64
IdemStreamsMaintain(TimestampTz before)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);
	Oid			positions = OidIsValid(nsp) ? get_relname_relid("positions", nsp) : InvalidOid;
	Oid			sequences = OidIsValid(nsp) ? get_relname_relid("sequences", nsp) : InvalidOid;
	const char *tables[] = {"positions", "sequences"};
	char	   *cutoff;
	StringInfoData sql;
	uint64		removed = 0;
	int			i;

	if (!OidIsValid(positions) || !OidIsValid(sequences))
		return 0;
	IdemRestrictTableAcl(positions);
	IdemRestrictTableAcl(sequences);
	cutoff = quote_literal_cstr(timestamptz_to_str(before));
	initStringInfo(&sql);
	for (i = 0; i < lengthof(tables); i++)
	{
		resetStringInfo(&sql);
		appendStringInfo(&sql,
						 "DELETE FROM idempotency.%s"
						 " WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
						 "SELECT ctid FROM idempotency.%s"
						 " WHERE updated_at OPERATOR(pg_catalog.<) %s::pg_catalog.timestamptz"
						 " OR " IDEM_KEYED_ROLE_GONE
						 " FOR UPDATE SKIP LOCKED))",
						 tables[i], tables[i], cutoff);
		removed += IdemExecAsOwner(sql.data, 0);
	}
	pfree(sql.data);
	removed += IdemTenantStreamsMaintain(nsp,
										 IdemCitusTableNames[IDEM_CITUS_TENANT_POSITIONS],
										 cutoff);
	removed += IdemTenantStreamsMaintain(nsp,
										 IdemCitusTableNames[IDEM_CITUS_TENANT_SEQUENCES],
										 cutoff);
	pfree(cutoff);
	IdemStatsAdd(IDEM_STAT_STREAMS_REMOVED, removed);
	return removed;
}

/*
 * IdemTenantStreamsMaintain is IdemStreamsMaintain's work on the shards
 * of idempotency.tenant_positions or tenant_sequences (relname) that this
 * node holds, if citus_distribute() made it: the same DELETE (unused since the cutoff, or
 * of a role that is gone, FOR UPDATE SKIP LOCKED), run on each local
 * shard's table, whose row locks are the ones the calls take.  Each node's
 * maintenance deletes the rows of its own shards (the coordinator's, none
 * unless it holds shards): Citus would refuse the statement on the
 * distributed table (a ctid is a shard's own).  A shard whose table is
 * gone meanwhile (moved away, dropped by Citus' cleanup) is skipped.  On
 * the coordinator, the table (made by citus_distribute(), not a member of
 * the extension) gets its AUTO dependency on the extension, as the ledgers
 * do (storage.c), so that DROP EXTENSION drops it; a worker leaves its
 * shell table to Citus, and its privileges to the coordinator.
 */
static uint64
IdemTenantStreamsMaintain(Oid nsp, const char *relname, const char *cutoff)
{
	Oid			rel = get_relname_relid(relname, nsp);
	bool		coordinator;
	IdemSavedUser save;
	Datum		arg;
	Oid			argtype = REGCLASSOID;
	int64	   *shards;
	uint64		nshards;
	uint64		removed = 0;
	uint64		i;
	StringInfoData sql;

	if (!OidIsValid(rel) ||
		!OidIsValid(get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE)) ||
		!OidIsValid(get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE)))
		return 0;
	if (IdemCitusDistributed(rel, &coordinator) && coordinator)
	{
		IdemEnsureRelationDependency(rel);
		IdemRestrictTableAcl(rel);
	}
	arg = ObjectIdGetDatum(rel);
	IdemStreamBegin(&save);
	if (SPI_execute_with_args("SELECT s.shardid FROM pg_catalog.pg_dist_shard AS s"
							  " JOIN pg_catalog.pg_dist_placement AS p"
							  " ON p.shardid OPERATOR(pg_catalog.=) s.shardid"
							  " WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1"
							  " AND p.groupid OPERATOR(pg_catalog.=)"
							  " (SELECT g.groupid FROM pg_catalog.pg_dist_local_group AS g)"
							  " ORDER BY 1",
							  1, &argtype, &arg, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not list the local shards of \"%s.%s\"",
			 IDEM_SCHEMA_NAME, relname);
	nshards = SPI_processed;
	shards = palloc(Max(nshards, 1) * sizeof(int64));
	for (i = 0; i < nshards; i++)
	{
		bool		isnull;

		shards[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
												SPI_tuptable->tupdesc, 1, &isnull));
	}
	initStringInfo(&sql);
	for (i = 0; i < nshards; i++)
	{
		char		name[NAMEDATALEN];
		const char *table;

		snprintf(name, sizeof(name), "%s_" INT64_FORMAT, relname, shards[i]);
		if (!OidIsValid(get_relname_relid(name, nsp)))
			continue;
		table = quote_qualified_identifier(IDEM_SCHEMA_NAME, name);
		resetStringInfo(&sql);
		appendStringInfo(&sql,
						 "DELETE FROM %s"
						 " WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
						 "SELECT ctid FROM %s"
						 " WHERE updated_at OPERATOR(pg_catalog.<) %s::pg_catalog.timestamptz"
						 " OR " IDEM_KEYED_ROLE_GONE
						 " FOR UPDATE SKIP LOCKED))",
						 table, table, cutoff);
		if (SPI_execute(sql.data, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "could not delete the unused rows of shard " INT64_FORMAT,
				 shards[i]);
		removed += SPI_processed;
	}
	/* in SPI's memory, which IdemStreamEnd frees */
	pfree(sql.data);
	pfree(shards);
	IdemStreamEnd(&save);
	return removed;
}

/* ----------------------------------------------------------------
 * Moving tenants: export and import (see transfer.c for keys and
 * message ids)
 * ----------------------------------------------------------------
 */

/* Columns of idempotency.position_record and sequence_record */
#define Natts_position_record	7
#define Natts_sequence_record	6

static const Oid position_record_types[Natts_position_record] = {
	NAMEOID, TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, TIMESTAMPTZOID
};
static const Oid sequence_record_types[Natts_sequence_record] = {
	NAMEOID, TEXTOID, TEXTOID, INT8OID, INT8OID, TIMESTAMPTZOID
};

static Datum IdemExportStream(FunctionCallInfo fcinfo, IdemStreamStmt which);
static text *IdemImportedText(Datum *rec, bool *nulls, int i,
							  const char *field);
static int64 IdemImportedNonNegative(Datum *rec, bool *nulls, int i,
									 const char *field, bool nullable);

/*
 * IdemExportStream is the body of the export functions: every row of the
 * positions or sequences of the given consumers (all if NULL), of every
 * role that exists, as the record type of the function.
 */
static Datum
IdemExportStream(FunctionCallInfo fcinfo, IdemStreamStmt which)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemSavedUser save;
	Datum		arg;
	bool		argnull = PG_ARGISNULL(0);
	uint64		i;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	arg = argnull ? (Datum) 0 : PG_GETARG_DATUM(0);
	IdemStreamBegin(&save);
	(void) IdemStreamExec(which, &arg, &argnull);
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		values[Natts_position_record];
		bool		nulls[Natts_position_record];
		int			c;

		for (c = 0; c < rsinfo->setDesc->natts; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  c + 1, &nulls[c]);
		/* the tuplestore copies the values out of SPI's memory */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	IdemStreamEnd(&save);
	return (Datum) 0;
}

/*
 * idempotency.export_positions(consumers text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.position_record
 */
Datum
idem_export_positions(PG_FUNCTION_ARGS)
{
	return IdemExportStream(fcinfo, STMT_EXPORT_POSITIONS);
}

/*
 * idempotency.export_sequences(consumers text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.sequence_record
 */
Datum
idem_export_sequences(PG_FUNCTION_ARGS)
{
	return IdemExportStream(fcinfo, STMT_EXPORT_SEQUENCES);
}

/* a text field of an imported record: not NULL, not empty, not too long */
static text *
IdemImportedText(Datum *rec, bool *nulls, int i, const char *field)
{
	text	   *t;

	IdemRequireField(nulls[i], field);
	t = DatumGetTextPP(rec[i]);
	if (VARSIZE_ANY_EXHDR(t) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("field \"%s\" of the imported record must not be empty", field)));
	IdemCheckKeyLength(VARSIZE_ANY_EXHDR(t), field);
	return t;
}

/* a bigint field of an imported record: not negative (NULL if nullable) */
static int64
IdemImportedNonNegative(Datum *rec, bool *nulls, int i, const char *field,
						bool nullable)
{
	if (nulls[i])
	{
		if (!nullable)
			IdemRequireField(true, field);
		return -1;
	}
	if (DatumGetInt64(rec[i]) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("field \"%s\" of the imported record must not be negative", field)));
	return DatumGetInt64(rec[i]);
}

/*
 * idempotency.import_position(p record) RETURNS text
 *
 * Stores an exported position unless this node's is at least as far: a
 * higher generation wins, and within one generation the further position
 * (NULL, never advanced, is behind every offset).  Answers inserted,
 * replaced or kept.  Every field is checked before anything is written.
 */
Datum
idem_import_position(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_position_record];
	bool		nulls[Natts_position_record];
	Oid			role;
	text	   *consumer;
	text	   *stream;
	int32		part;
	int64		next_offset;
	int64		generation;
	IdemPosition pos;
	IdemKeyedRows rows;
	IdemImportOutcome outcome;
	IdemStreamAt at;

	IdemCheckLibraryVersion();
	IdemStreamOwn(&at, IDEM_CITUS_TENANT_POSITIONS);
	IdemDeformRecord(fcinfo, Natts_position_record, Natts_position_record,
					 position_record_types, "position_record", rec, nulls);
	role = IdemImportRole(rec[0], nulls[0]);
	consumer = IdemImportedText(rec, nulls, 1, "consumer");
	stream = IdemImportedText(rec, nulls, 2, "stream");
	IdemRequireField(nulls[3], "part");
	part = DatumGetInt32(rec[3]);
	if (part < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("partition %d is negative", part)));
	next_offset = IdemImportedNonNegative(rec, nulls, 4, "next_offset", true);
	generation = IdemImportedNonNegative(rec, nulls, 5, "generation", true);
	IdemRequireField(nulls[6], "updated_at");
	IdemCheckWritable("idempotency.import_position()");

	IdemStreamLock(IDEM_LOCK_POSITION, role, consumer, stream, part);
	IdemStreamOpen(&rows, &at);
	IdemGetPosition(&rows, &at, role, consumer, stream, part, &pos);
	if (!pos.row.found)
		outcome = IDEM_IMPORT_INSERTED;
	else if (generation > (pos.has_generation ? pos.generation : -1) ||
			 (generation == (pos.has_generation ? pos.generation : -1) &&
			  next_offset > (pos.has_next ? pos.next_offset : -1)))
		outcome = IDEM_IMPORT_REPLACED;
	else
		outcome = IDEM_IMPORT_KEPT;
	if (outcome != IDEM_IMPORT_KEPT)
		IdemPutPosition(&rows, &at, role, consumer, stream, part, &pos,
						!nulls[4], next_offset, !nulls[5], generation,
						DatumGetTimestampTz(rec[6]));
	IdemKeyedClose(&rows);
	PG_RETURN_TEXT_P(IdemImportOutcomeText(outcome));
}

/*
 * idempotency.import_sequence(s record) RETURNS text
 *
 * Stores an exported producer sequence unless this node's is at least as
 * far (a higher epoch, or the same epoch and a higher seq, wins).
 */
Datum
idem_import_sequence(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_sequence_record];
	bool		nulls[Natts_sequence_record];
	Oid			role;
	text	   *consumer;
	text	   *producer;
	int64		epoch;
	int64		seq;
	IdemKeyedRows rows;
	IdemKeyedRow row;
	IdemImportOutcome outcome;
	IdemStreamAt at;

	IdemCheckLibraryVersion();
	IdemStreamOwn(&at, IDEM_CITUS_TENANT_SEQUENCES);
	IdemDeformRecord(fcinfo, Natts_sequence_record, Natts_sequence_record,
					 sequence_record_types, "sequence_record", rec, nulls);
	role = IdemImportRole(rec[0], nulls[0]);
	consumer = IdemImportedText(rec, nulls, 1, "consumer");
	producer = IdemImportedText(rec, nulls, 2, "producer");
	epoch = IdemImportedNonNegative(rec, nulls, 3, "epoch", false);
	seq = IdemImportedNonNegative(rec, nulls, 4, "seq", false);
	IdemRequireField(nulls[5], "updated_at");
	IdemCheckWritable("idempotency.import_sequence()");

	IdemStreamLock(IDEM_LOCK_SEQUENCE, role, consumer, producer, 0);
	IdemStreamOpen(&rows, &at);
	if (!IdemGetSequence(&rows, &at, role, consumer, producer, &row))
		outcome = IDEM_IMPORT_INSERTED;
	else
	{
		int64		stored_epoch = DatumGetInt64(row.values[SEQUENCE_EPOCH]);
		int64		stored_seq = DatumGetInt64(row.values[SEQUENCE_SEQ]);

		outcome = (epoch > stored_epoch ||
				   (epoch == stored_epoch && seq > stored_seq)) ?
			IDEM_IMPORT_REPLACED : IDEM_IMPORT_KEPT;
	}
	if (outcome != IDEM_IMPORT_KEPT)
		IdemPutSequence(&rows, &at, role, consumer, producer, &row, epoch, seq,
						DatumGetTimestampTz(rec[5]));
	IdemKeyedClose(&rows);
	PG_RETURN_TEXT_P(IdemImportOutcomeText(outcome));
}

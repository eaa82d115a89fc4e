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
#include "compat.h"
#include "keyed_rows.h"
#include "keyhash.h"
#include "privilege.h"
#include "stats.h"
#include "streams.h"
#include "transfer.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
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
static void IdemGetPosition(IdemKeyedRows *rows, Oid role, text *consumer,
							text *stream, int32 part, IdemPosition *pos);
static void IdemPutPosition(IdemKeyedRows *rows, Oid role, text *consumer,
							text *stream, int32 part, IdemPosition *old,
							bool has_next, int64 next_offset,
							bool has_generation, int64 generation,
							TimestampTz now);
static bool IdemGetSequence(IdemKeyedRows *rows, Oid role, text *consumer,
							text *producer, IdemKeyedRow *row);
static void IdemPutSequence(IdemKeyedRows *rows, Oid role, text *consumer,
							text *producer, IdemKeyedRow *row, int64 epoch,
							int64 seq, TimestampTz now);
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

/* reads one position (locked by the caller) FOR UPDATE */
static void
IdemGetPosition(IdemKeyedRows *rows, Oid role, text *consumer, text *stream,
				int32 part, IdemPosition *pos)
{
	Datum		key[4];

	key[0] = ObjectIdGetDatum(role);
	key[1] = PointerGetDatum(consumer);
	key[2] = PointerGetDatum(stream);
	key[3] = Int32GetDatum(part);
	memset(pos, 0, sizeof(*pos));
	if (!IdemKeyedFetch(rows, key, &pos->row))
		return;
	pos->has_next = !pos->row.nulls[POSITION_NEXT_OFFSET];
	if (pos->has_next)
		pos->next_offset = DatumGetInt64(pos->row.values[POSITION_NEXT_OFFSET]);
	pos->has_generation = !pos->row.nulls[POSITION_GENERATION];
	if (pos->has_generation)
		pos->generation = DatumGetInt64(pos->row.values[POSITION_GENERATION]);
}

/* writes one position (read by IdemGetPosition): insert or update */
static void
IdemPutPosition(IdemKeyedRows *rows, Oid role, text *consumer, text *stream,
				int32 part, IdemPosition *old, bool has_next,
				int64 next_offset, bool has_generation, int64 generation,
				TimestampTz now)
{
	Datum		values[7];
	bool		isnull[7] = {false};

	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(consumer);
	values[2] = PointerGetDatum(stream);
	values[3] = Int32GetDatum(part);
	values[POSITION_NEXT_OFFSET] = Int64GetDatum(next_offset);
	isnull[POSITION_NEXT_OFFSET] = !has_next;
	values[POSITION_GENERATION] = Int64GetDatum(generation);
	isnull[POSITION_GENERATION] = !has_generation;
	values[POSITION_UPDATED_AT] = TimestampTzGetDatum(now);
	IdemKeyedWrite(rows, &old->row, values, isnull);
}

/* reads one producer's sequence (locked by the caller) FOR UPDATE */
static bool
IdemGetSequence(IdemKeyedRows *rows, Oid role, text *consumer, text *producer,
				IdemKeyedRow *row)
{
	Datum		key[3];

	key[0] = ObjectIdGetDatum(role);
	key[1] = PointerGetDatum(consumer);
	key[2] = PointerGetDatum(producer);
	return IdemKeyedFetch(rows, key, row);
}

/* writes one producer's sequence (read by IdemGetSequence) */
static void
IdemPutSequence(IdemKeyedRows *rows, Oid role, text *consumer, text *producer,
				IdemKeyedRow *row, int64 epoch, int64 seq, TimestampTz now)
{
	Datum		values[6];
	bool		isnull[6] = {false};

	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(consumer);
	values[2] = PointerGetDatum(producer);
	values[SEQUENCE_EPOCH] = Int64GetDatum(epoch);
	values[SEQUENCE_SEQ] = Int64GetDatum(seq);
	values[SEQUENCE_UPDATED_AT] = TimestampTzGetDatum(now);
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
	int			i;

	IdemCheckLibraryVersion();
	consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	stream = IdemCheckKeyArg(fcinfo, 1, "stream");
	parts = IdemPartsArg(fcinfo, 2, &nparts);
	generation = IdemNonNegativeArg(fcinfo, 3, "generation");
	IdemCheckWritable("idem_assign()");
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

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
	IdemKeyedOpen(&rows, &positions_table);
	for (i = 0; i < nparts; i++)
	{
		IdemGetPosition(&rows, role, consumer, stream, parts[i], &pos[i]);
		IdemCheckGeneration(&pos[i], generation, stream, parts[i]);
	}
	for (i = 0; i < nparts; i++)
		IdemPutPosition(&rows, role, consumer, stream, parts[i], &pos[i],
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

	IdemStreamLock(IDEM_LOCK_POSITION, role, consumer, stream, part);
	IdemKeyedOpen(&rows, &positions_table);
	IdemGetPosition(&rows, role, consumer, stream, part, &pos);
	if (fenced)
		IdemCheckGeneration(&pos, generation, stream, part);
	else if (pos.has_generation)
		IdemRefuseUnfenced(&pos, stream, part);
	fresh = !pos.has_next || last >= pos.next_offset;
	has_generation = fenced || pos.has_generation;
	if (fenced && pos.has_generation)
		generation = Max(generation, pos.generation);
	IdemPutPosition(&rows, role, consumer, stream, part, &pos, true,
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
 * idem_positions(consumer text, stream text)
 *		RETURNS TABLE (part int, next_offset bigint, generation bigint,
 *					   updated_at timestamptz)
 *
 * The caller's positions of one consumer on one stream, as committed (and
 * as this transaction changed them).  Reading them counts as using them:
 * outside a read-only transaction, rows not used for a tenth of
 * idempotency.position_ttl get the current time as updated_at, so that
 * maintenance keeps positions a consumer reads but has not moved.
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
	Datum		args[5];
	uint64		i;

	IdemCheckLibraryVersion();
	consumer = IdemCheckKeyArg(fcinfo, 0, "consumer");
	stream = IdemCheckKeyArg(fcinfo, 1, "stream");
	InitMaterializedSRF(fcinfo, 0);

	args[0] = ObjectIdGetDatum(role);
	args[1] = PointerGetDatum(consumer);
	args[2] = PointerGetDatum(stream);
	IdemStreamBegin(&save);
	if (!RecoveryInProgress() && !XactReadOnly)
	{
		args[3] = TimestampTzGetDatum(now);
		args[4] = TimestampTzGetDatum(now - (int64) idem_position_ttl * (USECS_PER_SEC / 10));
		(void) IdemStreamExec(STMT_TOUCH_POSITIONS, args, NULL);
	}
	(void) IdemStreamExec(STMT_LIST_POSITIONS, args, NULL);
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
 * idem_sequence(consumer text, producer text, epoch bigint, seq bigint,
 *				 strict boolean DEFAULT false) RETURNS text
 *
 * new, duplicate, gap or fenced: see the SPEC's "Ordered streams".
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

	IdemStreamLock(IDEM_LOCK_SEQUENCE, role, consumer, producer, 0);
	IdemKeyedOpen(&rows, &sequences_table);
	if (!IdemGetSequence(&rows, role, consumer, producer, &row))
		answer = "new";
	else
	{
		int64		stored_epoch = DatumGetInt64(row.values[SEQUENCE_EPOCH]);
		int64		stored_seq = DatumGetInt64(row.values[SEQUENCE_SEQ]);

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
		IdemPutSequence(&rows, role, consumer, producer, &row, epoch, seq, now);
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
	pfree(cutoff);
	IdemStatsAdd(IDEM_STAT_STREAMS_REMOVED, removed);
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

	IdemCheckLibraryVersion();
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
	IdemKeyedOpen(&rows, &positions_table);
	IdemGetPosition(&rows, role, consumer, stream, part, &pos);
	if (!pos.row.found)
		outcome = IDEM_IMPORT_INSERTED;
	else if (generation > (pos.has_generation ? pos.generation : -1) ||
			 (generation == (pos.has_generation ? pos.generation : -1) &&
			  next_offset > (pos.has_next ? pos.next_offset : -1)))
		outcome = IDEM_IMPORT_REPLACED;
	else
		outcome = IDEM_IMPORT_KEPT;
	if (outcome != IDEM_IMPORT_KEPT)
		IdemPutPosition(&rows, role, consumer, stream, part, &pos,
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

	IdemCheckLibraryVersion();
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
	IdemKeyedOpen(&rows, &sequences_table);
	if (!IdemGetSequence(&rows, role, consumer, producer, &row))
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
		IdemPutSequence(&rows, role, consumer, producer, &row, epoch, seq,
						DatumGetTimestampTz(rec[5]));
	IdemKeyedClose(&rows);
	PG_RETURN_TEXT_P(IdemImportOutcomeText(outcome));
}

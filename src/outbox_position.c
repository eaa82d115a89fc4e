/*-------------------------------------------------------------------------
 *
 * outbox_position.c
 *	  The relays' rows: reading and writing a relay's position
 *	  (idempotency.outbox_relays) and its dead letters
 *	  (idempotency.outbox_dead_letters).
 *
 * Everything that reads or writes those tables is here.  A relay's own
 * position is read and written directly (keyed_rows.h, as the stream
 * positions: one probe of the primary key or the version this backend
 * used last, the row locked FOR UPDATE, an insert or a HOT update; no
 * SQL).  The lists and the dead letters go through SPI, prepared once per
 * backend, as the storage owner in a restricted security context, naming
 * every table, function and operator with its schema (as streams.c's),
 * under a fresh snapshot: what is committed now, and this transaction's
 * own changes.
 *
 * A relay's row is read FOR UPDATE under its relay lock (IdemRelayLock:
 * the role's OID in a field of its own and a SipHash of the relay and
 * topic names keyed with the database's secret, as the stream locks), held
 * to the end of the transaction: next() and ack() calls of one relay wait
 * for each other, a waiter reads what the other committed, and two relays
 * of a topic, or relays of different roles, never wait for each other
 * (unless their tags collide, one chance in 2^32, which only makes them
 * wait).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_position.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "keyed_rows.h"
#include "keyhash.h"
#include "outbox.h"
#include "privilege.h"
#include "stats.h"
#include "transfer.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/tuplestore.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* The columns of idempotency.outbox_relays, in order */
enum
{
	COL_ROLE = 0,
	COL_RELAY,
	COL_TOPIC,
	COL_GENERATION,
	COL_BATCH,
	COL_BATCH_END,
	COL_BATCH_EVENTS,
	COL_ACKED_EV,
	COL_WINDOW_DONE,
	COL_LO_XMIN,
	COL_LO_XMAX,
	COL_LO_XIP,
	COL_LO_FLOOR,
	COL_LO_SEQ,
	COL_UP_XMIN,
	COL_UP_XMAX,
	COL_UP_XIP,
	COL_UP_SEQ_BEFORE,
	COL_UP_SEQ_AFTER,
	COL_UP_AT,
	COL_LOST_EVENTS,
	COL_LOST_FIRST_EV,
	COL_LOST_LAST_EV,
	COL_LOST_FROM,
	COL_LOST_TO,
	COL_CREATED_AT,
	COL_ACKED_AT,
	COL_UPDATED_AT,
	NUM_COLS
};

#define RELAY_COLUMNS \
	"role, relay, topic, generation, batch, batch_end, batch_events," \
	" acked_ev, window_done, lo_xmin, lo_xmax, lo_xip, lo_floor, lo_seq," \
	" up_xmin, up_xmax, up_xip, up_seq_before, up_seq_after, up_at," \
	" lost_events, lost_first_ev, lost_last_ev, lost_from, lost_to," \
	" created_at, acked_at, updated_at"

#define RELAY_WHERE \
	" WHERE role OPERATOR(pg_catalog.=) $1 AND relay OPERATOR(pg_catalog.=) $2" \
	" AND topic OPERATOR(pg_catalog.=) $3"

/* idempotency.outbox_relays, read and written directly (keyed_rows.h) */
static IdemKeyedTable relays_table = {
	"outbox_relays", NUM_COLS, 3, {OIDOID, TEXTOID, TEXTOID},
	{REGROLEOID, TEXTOID, TEXTOID, INT8OID, INT8OID, INT8OID, INT4OID,
	 INT8OID, BOOLOID, INT8OID, INT8OID, INT8ARRAYOID, INT8ARRAYOID, INT8OID,
	 INT8OID, INT8OID, INT8ARRAYOID, INT8OID, INT8OID, TIMESTAMPTZOID,
	 INT8OID, INT8OID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	 TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID},
	InvalidOid
};

StaticAssertDecl(NUM_COLS <= IDEM_KEYED_MAX_ATTS,
				 "outbox_relays has more columns than a keyed table may");

typedef enum IdemPositionStmt
{
	STMT_RELAY_LIST,
	STMT_RELAY_LIST_ALL,
	STMT_DEAD_PUT,
	STMT_DEAD_COUNT,
	STMT_DEAD_EXPIRE,
	STMT_DEAD_LIST,
	STMT_DEAD_LIST_ALL,
	STMT_DEAD_IMPORT,
	STMT_RELAY_FORGET_GONE,
	NUM_POSITION_STMTS
} IdemPositionStmt;

typedef struct IdemPositionStmtDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[12];
} IdemPositionStmtDef;

static const IdemPositionStmtDef stmt_defs[NUM_POSITION_STMTS] = {
	[STMT_RELAY_LIST] = {
		"SELECT " RELAY_COLUMNS " FROM idempotency.outbox_relays"
		" WHERE role OPERATOR(pg_catalog.=) $1 ORDER BY relay, topic",
		1, {OIDOID}
	},
	[STMT_RELAY_LIST_ALL] = {
		"SELECT " RELAY_COLUMNS " FROM idempotency.outbox_relays"
		" ORDER BY role, relay, topic",
		0, {InvalidOid}
	},
	[STMT_DEAD_PUT] = {
		"INSERT INTO idempotency.outbox_dead_letters AS d (role, relay, topic,"
		" event_id, key, headers, payload, payload_raw, published_at, reason,"
		" attempts, failed_at)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
		" ON CONFLICT (role, relay, topic, event_id) DO UPDATE SET"
		" reason = excluded.reason, attempts = excluded.attempts,"
		" failed_at = excluded.failed_at"
		" RETURNING (d.xmax OPERATOR(pg_catalog.=) '0'::pg_catalog.xid)",
		12, {OIDOID, TEXTOID, TEXTOID, UUIDOID, TEXTOID, JSONBOID, JSONBOID,
		BYTEAOID, TIMESTAMPTZOID, TEXTOID, INT4OID, TIMESTAMPTZOID}
	},
	[STMT_DEAD_COUNT] = {
		"SELECT pg_catalog.count(*) FROM idempotency.outbox_dead_letters" RELAY_WHERE,
		3, {OIDOID, TEXTOID, TEXTOID}
	},
	[STMT_DEAD_EXPIRE] = {
		"DELETE FROM idempotency.outbox_dead_letters"
		" WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM idempotency.outbox_dead_letters"
		" WHERE failed_at OPERATOR(pg_catalog.<) $1 OR " IDEM_KEYED_ROLE_GONE
		" FOR UPDATE SKIP LOCKED))",
		1, {TIMESTAMPTZOID}
	},
	[STMT_RELAY_FORGET_GONE] = {
		"DELETE FROM idempotency.outbox_relays"
		" WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT ctid FROM idempotency.outbox_relays"
		" WHERE " IDEM_KEYED_ROLE_GONE
		" FOR UPDATE SKIP LOCKED))",
		0, {InvalidOid}
	},
	[STMT_DEAD_LIST] = {
		"SELECT relay, topic, event_id, key, payload, payload_raw, headers,"
		" published_at, reason, attempts, failed_at"
		" FROM idempotency.outbox_dead_letters"
		" WHERE role OPERATOR(pg_catalog.=) $1"
		" AND ($2 IS NULL OR relay OPERATOR(pg_catalog.=) $2)"
		" AND ($3 IS NULL OR topic OPERATOR(pg_catalog.=) $3)"
		" ORDER BY relay, topic, failed_at, event_id",
		3, {OIDOID, TEXTOID, TEXTOID}
	},
	[STMT_DEAD_LIST_ALL] = {
		"SELECT role, relay, topic, event_id, key, headers, payload, payload_raw,"
		" published_at, reason, attempts, failed_at"
		" FROM idempotency.outbox_dead_letters"
		" ORDER BY role, relay, topic, failed_at, event_id",
		0, {InvalidOid}
	},
	[STMT_DEAD_IMPORT] = {
		"INSERT INTO idempotency.outbox_dead_letters AS d (role, relay, topic,"
		" event_id, key, headers, payload, payload_raw, published_at, reason,"
		" attempts, failed_at)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
		" ON CONFLICT (role, relay, topic, event_id) DO UPDATE SET"
		" reason = excluded.reason, attempts = excluded.attempts,"
		" failed_at = excluded.failed_at"
		" WHERE d.failed_at OPERATOR(pg_catalog.<) excluded.failed_at"
		" RETURNING (d.xmax OPERATOR(pg_catalog.=) '0'::pg_catalog.xid)",
		12, {OIDOID, TEXTOID, TEXTOID, UUIDOID, TEXTOID, JSONBOID, JSONBOID,
		BYTEAOID, TIMESTAMPTZOID, TEXTOID, INT4OID, TIMESTAMPTZOID}
	},
};

static SPIPlanPtr stmt_plans[NUM_POSITION_STMTS];

static int	IdemPositionExec(IdemPositionStmt which, Datum *values,
							 const bool *isnull);
static void IdemPositionBegin(IdemSavedUser *save);
static void IdemPositionEnd(const IdemSavedUser *save);
static void IdemRelayCheckTable(void);
static void IdemRelayKey(const IdemRelayState *st, Datum *key);
static void IdemRelayFromRow(const Datum *v, const bool *n, IdemRelayState *st);
static Datum IdemInt8Array(const int64 *values, int n);
static int	IdemInt8ArrayRead(Datum array, int64 **out);

/*
 * IdemRelayLock takes the lock of one relay of one topic of "role" until
 * the transaction ends (see the file header); with "nowait", only if it is
 * free at once, and says in *acquired whether it was.  The relay locks
 * count with the stream locks (IdemKeyedLockAcquire): a transaction holds
 * at most max_locks_per_transaction of them, and the next is refused with
 * 53000 (with "nowait", not taken), so that one role's transaction cannot
 * fill the lock table every session shares.
 */
void
IdemRelayLock(Oid role, text *relay, text *topic, bool nowait, bool *acquired)
{
	LOCKTAG		tag;
	bool		got = true;

	IdemSetStreamLockTag(&tag, IDEM_LOCK_OUTBOX_RELAY, role,
						 VARDATA_ANY(relay), VARSIZE_ANY_EXHDR(relay),
						 VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic), 0);
	if (nowait)
		got = IdemKeyedLockConditional(&tag);
	else
		IdemKeyedLockAcquire(&tag);
	if (acquired != NULL)
		*acquired = got;
}

/* refuses a database whose extension has no outbox_relays yet */
static void
IdemRelayCheckTable(void)
{
	if (!OidIsValid(IdemOutboxMemberRelid("outbox_relays")))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the outbox's table \"%s.%s\" does not exist",
						IDEM_SCHEMA_NAME, "outbox_relays"),
				 errhint("Run ALTER EXTENSION idempotency UPDATE.")));
}

static void
IdemPositionBegin(IdemSavedUser *save)
{
	IdemRelayCheckTable();
	IdemOwnerSPIBegin(save);
}

static void
IdemPositionEnd(const IdemSavedUser *save)
{
	IdemOwnerSPIEnd(save);
}

/* runs one statement under a fresh snapshot; returns SPI_processed */
static int
IdemPositionExec(IdemPositionStmt which, Datum *values, const bool *isnull)
{
	const IdemPositionStmtDef *def = &stmt_defs[which];

	return IdemExecKeptPlan(&stmt_plans[which], def->sql, def->nargs,
							def->argtypes, values, isnull, false);
}

/* an int8[] datum of n values */
static Datum
IdemInt8Array(const int64 *values, int n)
{
	Datum	   *elems = palloc(Max(n, 1) * sizeof(Datum));
	ArrayType  *arr;
	int			i;

	for (i = 0; i < n; i++)
		elems[i] = Int64GetDatum(values[i]);
	arr = construct_array(elems, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
						  TYPALIGN_DOUBLE);
	pfree(elems);
	return PointerGetDatum(arr);
}

/* the values of an int8[] datum, palloc'd in *out; returns how many */
static int
IdemInt8ArrayRead(Datum array, int64 **out)
{
	ArrayType  *arr = DatumGetArrayTypeP(array);
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;

	deconstruct_array(arr, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
					  TYPALIGN_DOUBLE, &elems, &nulls, &n);
	*out = palloc(Max(n, 1) * sizeof(int64));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			elog(ERROR, "a relay's snapshot holds a null transaction id");
		(*out)[i] = DatumGetInt64(elems[i]);
	}
	return n;
}

/*
 * IdemRelayInit sets *st to the position of a relay never seen: before
 * every event (its first window starts at the empty snapshot, so it reads
 * every event the topic keeps), at batch 1.
 */
void
IdemRelayInit(IdemRelayState *st, Oid role, text *relay, text *topic)
{
	memset(st, 0, sizeof(*st));
	st->role = role;
	st->relay = relay;
	st->topic = topic;
	st->batch = 1;
	st->window_done = true;		/* the (empty) window before the first */
	st->lo.xip = palloc(sizeof(int64));
	st->lo_floor = palloc(sizeof(int64));
	st->up.xip = palloc(sizeof(int64));
	st->created_at = GetCurrentTimestamp();
}

/*
 * fills *st from the columns of one row of idempotency.outbox_relays (in
 * SPI's memory, or in a buffer): everything is copied into the current
 * memory context
 */
static void
IdemRelayFromRow(const Datum *v, const bool *n, IdemRelayState *st)
{
	int			nfloor;

	memset(st, 0, sizeof(*st));
	st->found = true;
	st->role = DatumGetObjectId(v[COL_ROLE]);
	/* copied out of SPI's memory or the buffer: the caller's context is current here */
	st->relay = DatumGetTextPCopy(v[COL_RELAY]);
	st->topic = DatumGetTextPCopy(v[COL_TOPIC]);
	st->has_generation = !n[COL_GENERATION];
	st->generation = n[COL_GENERATION] ? 0 : DatumGetInt64(v[COL_GENERATION]);
	st->batch = DatumGetInt64(v[COL_BATCH]);
	st->handed_out = !n[COL_BATCH_END];
	st->batch_end = n[COL_BATCH_END] ? 0 : DatumGetInt64(v[COL_BATCH_END]);
	st->batch_events = DatumGetInt32(v[COL_BATCH_EVENTS]);
	st->acked_ev = DatumGetInt64(v[COL_ACKED_EV]);
	st->window_done = DatumGetBool(v[COL_WINDOW_DONE]);
	st->lo.xmin = DatumGetInt64(v[COL_LO_XMIN]);
	st->lo.xmax = DatumGetInt64(v[COL_LO_XMAX]);
	st->lo.nxip = IdemInt8ArrayRead(v[COL_LO_XIP], &st->lo.xip);
	nfloor = IdemInt8ArrayRead(v[COL_LO_FLOOR], &st->lo_floor);
	if (nfloor != st->lo.nxip)
		elog(ERROR, "relay position of \"%s\" has %d floors for %d transactions",
			 text_to_cstring(st->relay), nfloor, st->lo.nxip);
	st->lo_seq = DatumGetInt64(v[COL_LO_SEQ]);
	st->up.xmin = DatumGetInt64(v[COL_UP_XMIN]);
	st->up.xmax = DatumGetInt64(v[COL_UP_XMAX]);
	st->up.nxip = IdemInt8ArrayRead(v[COL_UP_XIP], &st->up.xip);
	st->up_seq_before = DatumGetInt64(v[COL_UP_SEQ_BEFORE]);
	st->up_seq_after = DatumGetInt64(v[COL_UP_SEQ_AFTER]);
	st->up_at = n[COL_UP_AT] ? 0 : DatumGetTimestampTz(v[COL_UP_AT]);
	st->lost_events = DatumGetInt64(v[COL_LOST_EVENTS]);
	st->lost_first_ev = n[COL_LOST_FIRST_EV] ? 0 : DatumGetInt64(v[COL_LOST_FIRST_EV]);
	st->lost_last_ev = n[COL_LOST_LAST_EV] ? 0 : DatumGetInt64(v[COL_LOST_LAST_EV]);
	st->lost_from = n[COL_LOST_FROM] ? 0 : DatumGetTimestampTz(v[COL_LOST_FROM]);
	st->lost_to = n[COL_LOST_TO] ? 0 : DatumGetTimestampTz(v[COL_LOST_TO]);
	st->created_at = DatumGetTimestampTz(v[COL_CREATED_AT]);
	st->acked_at = n[COL_ACKED_AT] ? 0 : DatumGetTimestampTz(v[COL_ACKED_AT]);
}

/*
 * IdemRelayLoad reads the position of one relay of one topic of "role"
 * FOR UPDATE (the caller holds its relay lock); st->found is false if it
 * has none.
 */
void
IdemRelayLoad(Oid role, text *relay, text *topic, IdemRelayState *st)
{
	IdemKeyedRows rows;
	IdemKeyedRow row;
	Datum		key[3];

	key[0] = ObjectIdGetDatum(role);
	key[1] = PointerGetDatum(relay);
	key[2] = PointerGetDatum(topic);
	IdemRelayCheckTable();
	IdemKeyedOpen(&rows, &relays_table);
	if (IdemKeyedFetch(&rows, key, &row))
		IdemRelayFromRow(row.values, row.nulls, st);
	else
		IdemRelayInit(st, role, relay, topic);
	IdemKeyedClose(&rows);
}

/* the primary key of a relay's row */
static void
IdemRelayKey(const IdemRelayState *st, Datum *key)
{
	key[0] = ObjectIdGetDatum(st->role);
	key[1] = PointerGetDatum(st->relay);
	key[2] = PointerGetDatum(st->topic);
}

/*
 * IdemRelayStore writes a relay's position: a new row if it had none (and
 * then st->found is set), else an update of its row, as the statements
 * did: an insert whose primary key is checked (23505 if the row exists
 * after all), or the newest version of the row read again and locked FOR
 * UPDATE (the version IdemRelayLoad locked, unless this transaction wrote
 * it since), 40001 if it is gone.
 */
void
IdemRelayStore(IdemRelayState *st)
{
	IdemKeyedRows rows;
	IdemKeyedRow row;
	Datum		key[3];
	Datum		v[NUM_COLS];
	bool		n[NUM_COLS];

	memset(n, 0, sizeof(n));
	v[COL_ROLE] = ObjectIdGetDatum(st->role);
	v[COL_RELAY] = PointerGetDatum(st->relay);
	v[COL_TOPIC] = PointerGetDatum(st->topic);
	v[COL_GENERATION] = Int64GetDatum(st->generation);
	n[COL_GENERATION] = !st->has_generation;
	v[COL_BATCH] = Int64GetDatum(st->batch);
	v[COL_BATCH_END] = Int64GetDatum(st->batch_end);
	n[COL_BATCH_END] = !st->handed_out;
	v[COL_BATCH_EVENTS] = Int32GetDatum(st->handed_out ? st->batch_events : 0);
	v[COL_ACKED_EV] = Int64GetDatum(st->acked_ev);
	v[COL_WINDOW_DONE] = BoolGetDatum(st->window_done);
	v[COL_LO_XMIN] = Int64GetDatum(st->lo.xmin);
	v[COL_LO_XMAX] = Int64GetDatum(st->lo.xmax);
	v[COL_LO_XIP] = IdemInt8Array(st->lo.xip, st->lo.nxip);
	v[COL_LO_FLOOR] = IdemInt8Array(st->lo_floor, st->lo.nxip);
	v[COL_LO_SEQ] = Int64GetDatum(st->lo_seq);
	v[COL_UP_XMIN] = Int64GetDatum(st->up.xmin);
	v[COL_UP_XMAX] = Int64GetDatum(st->up.xmax);
	v[COL_UP_XIP] = IdemInt8Array(st->up.xip, st->up.nxip);
	v[COL_UP_SEQ_BEFORE] = Int64GetDatum(st->up_seq_before);
	v[COL_UP_SEQ_AFTER] = Int64GetDatum(st->up_seq_after);
	v[COL_UP_AT] = TimestampTzGetDatum(st->up_at);
	n[COL_UP_AT] = (st->up_at == 0);
	v[COL_LOST_EVENTS] = Int64GetDatum(st->lost_events);
	v[COL_LOST_FIRST_EV] = Int64GetDatum(st->lost_first_ev);
	v[COL_LOST_LAST_EV] = Int64GetDatum(st->lost_last_ev);
	v[COL_LOST_FROM] = TimestampTzGetDatum(st->lost_from);
	v[COL_LOST_TO] = TimestampTzGetDatum(st->lost_to);
	n[COL_LOST_FIRST_EV] = n[COL_LOST_LAST_EV] = n[COL_LOST_FROM] =
		n[COL_LOST_TO] = (st->lost_events == 0);
	v[COL_CREATED_AT] = TimestampTzGetDatum(st->created_at);
	v[COL_ACKED_AT] = TimestampTzGetDatum(st->acked_at);
	n[COL_ACKED_AT] = (st->acked_at == 0);
	v[COL_UPDATED_AT] = TimestampTzGetDatum(GetCurrentTimestamp());

	IdemRelayKey(st, key);
	IdemRelayCheckTable();
	IdemKeyedOpen(&rows, &relays_table);
	if (!st->found)
		row.found = false;
	else if (!IdemKeyedFetch(&rows, key, &row))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not record the position of relay \"%s\" of topic \"%s\": its row was removed concurrently",
						IdemKeyForMessage(text_to_cstring(st->relay)),
						IdemKeyForMessage(text_to_cstring(st->topic))),
				 errdetail("Nothing was recorded."),
				 errhint("Retry the transaction.")));
	IdemKeyedWrite(&rows, &row, v, n);
	IdemKeyedClose(&rows);
	st->found = true;
}

/*
 * IdemRelayList returns the positions of every relay of "role" (or of
 * every role, with all_roles), as a list of palloc'd IdemRelayState, in
 * the order of role, relay and topic; read without locks, as committed.
 */
List *
IdemRelayList(Oid role, bool all_roles)
{
	IdemSavedUser save;
	Datum		arg = ObjectIdGetDatum(role);
	MemoryContext caller = CurrentMemoryContext;
	List	   *result = NIL;
	uint64		i;

	IdemPositionBegin(&save);
	(void) IdemPositionExec(all_roles ? STMT_RELAY_LIST_ALL : STMT_RELAY_LIST,
							&arg, NULL);
	for (i = 0; i < SPI_processed; i++)
	{
		MemoryContext spi = MemoryContextSwitchTo(caller);
		IdemRelayState *st = palloc(sizeof(IdemRelayState));
		Datum		v[NUM_COLS];
		bool		n[NUM_COLS];
		int			c;

		for (c = 0; c < NUM_COLS; c++)
			v[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								 c + 1, &n[c]);
		IdemRelayFromRow(v, n, st);
		result = lappend(result, st);
		MemoryContextSwitchTo(spi);
	}
	IdemPositionEnd(&save);
	return result;
}

/*
 * IdemRelayDeadLetterPut records that the relay gave up on one event of
 * its batch (the event's row, with the events table's columns, is copied),
 * or updates the record if it has one already.
 */
void
IdemRelayDeadLetterPut(IdemRelayState *st, HeapTuple event, TupleDesc desc,
					   text *reason, bool has_attempts, int32 attempts)
{
	IdemSavedUser save;
	Datum		v[12];
	bool		n[12];
	bool		isnull;
	bool		inserted = false;

	memset(n, 0, sizeof(n));
	v[0] = ObjectIdGetDatum(st->role);
	v[1] = PointerGetDatum(st->relay);
	v[2] = PointerGetDatum(st->topic);
	v[3] = heap_getattr(event, Anum_outbox_event_id, desc, &n[3]);
	v[4] = heap_getattr(event, Anum_outbox_key, desc, &n[4]);
	v[5] = heap_getattr(event, Anum_outbox_headers, desc, &n[5]);
	v[6] = heap_getattr(event, Anum_outbox_payload, desc, &n[6]);
	v[7] = heap_getattr(event, Anum_outbox_payload_raw, desc, &n[7]);
	v[8] = heap_getattr(event, Anum_outbox_published_at, desc, &n[8]);
	v[9] = PointerGetDatum(reason);
	n[9] = (reason == NULL);
	v[10] = Int32GetDatum(attempts);
	n[10] = !has_attempts;
	v[11] = TimestampTzGetDatum(GetCurrentTimestamp());

	IdemPositionBegin(&save);
	if (IdemPositionExec(STMT_DEAD_PUT, v, n) == 1)
		inserted = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1,
											  &isnull));
	IdemPositionEnd(&save);
	if (inserted)
		IdemStatsAdd(IDEM_STAT_OUTBOX_DEAD_LETTERS, 1);
}

/* how many dead letters one relay of one topic has */
int64
IdemRelayDeadLetterCount(Oid role, text *relay, text *topic)
{
	IdemSavedUser save;
	Datum		args[3];
	bool		isnull;
	int64		count = 0;

	args[0] = ObjectIdGetDatum(role);
	args[1] = PointerGetDatum(relay);
	args[2] = PointerGetDatum(topic);
	IdemPositionBegin(&save);
	if (IdemPositionExec(STMT_DEAD_COUNT, args, NULL) == 1)
		count = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	IdemPositionEnd(&save);
	return count;
}

/*
 * deletes the dead letters recorded before "before", and those of roles
 * that no longer exist (keyed_rows.h, IDEM_KEYED_ROLE_GONE); returns how
 * many.  Each is locked FOR UPDATE SKIP LOCKED, as the relays are: one a
 * relay's open transaction holds (idem_outbox_dead_letter() of the same
 * event again, which updates it) is left for a later run, instead of
 * holding maintenance up until that transaction ends, whichever role's it
 * is (specs/outbox_dead_letters_maintain.spec).
 */
uint64
IdemRelayDeadLettersExpire(TimestampTz before)
{
	IdemSavedUser save;
	Datum		arg = TimestampTzGetDatum(before);
	uint64		removed;

	IdemPositionBegin(&save);
	removed = IdemPositionExec(STMT_DEAD_EXPIRE, &arg, NULL);
	IdemPositionEnd(&save);
	return removed;
}

/*
 * IdemRelaysOfGoneRolesForget deletes the relays of roles that no longer
 * exist (keyed_rows.h, IDEM_KEYED_ROLE_GONE: a role made later could get
 * the same OID, and with it their positions), each locked FOR UPDATE SKIP
 * LOCKED as the keyed rows require (a relay still held by a transaction is
 * left for a later run).  Their events then hold no segment back.  Returns
 * how many went.
 */
uint64
IdemRelaysOfGoneRolesForget(void)
{
	IdemSavedUser save;
	uint64		removed;

	IdemPositionBegin(&save);
	removed = IdemPositionExec(STMT_RELAY_FORGET_GONE, NULL, NULL);
	IdemPositionEnd(&save);
	return removed;
}

/*
 * IdemRelayDeadLetterRows adds the dead letters of "role" (of one relay
 * and one topic, where not NULL) to a materialized result whose columns
 * are those of STMT_DEAD_LIST.
 */
void
IdemRelayDeadLetterRows(Oid role, text *relay, text *topic,
						ReturnSetInfo *rsinfo)
{
	IdemSavedUser save;
	Datum		args[3];
	bool		isnull[3];
	uint64		i;

	args[0] = ObjectIdGetDatum(role);
	args[1] = PointerGetDatum(relay);
	args[2] = PointerGetDatum(topic);
	isnull[0] = false;
	isnull[1] = (relay == NULL);
	isnull[2] = (topic == NULL);
	IdemPositionBegin(&save);
	(void) IdemPositionExec(STMT_DEAD_LIST, args, isnull);
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		v[11];
		bool		n[11];
		int			c;

		for (c = 0; c < 11; c++)
			v[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								 c + 1, &n[c]);
		/* the tuplestore copies the values into its own memory */
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
	}
	IdemPositionEnd(&save);
}

/*
 * IdemRelayDeadLettersAll calls "emit" with the columns of every dead
 * letter of every role (those of idempotency.dead_letter_record, the role
 * as its OID), in the order of role, relay, topic and failure (export).
 */
void
IdemRelayDeadLettersAll(void (*emit) (Datum *values, bool *nulls, void *arg),
						void *arg)
{
	IdemSavedUser save;
	uint64		i;

	IdemPositionBegin(&save);
	(void) IdemPositionExec(STMT_DEAD_LIST_ALL, NULL, NULL);
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		v[12];
		bool		n[12];
		int			c;

		for (c = 0; c < 12; c++)
			v[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								 c + 1, &n[c]);
		emit(v, n, arg);
	}
	IdemPositionEnd(&save);
}

/*
 * IdemRelayDeadLetterImport stores an imported dead letter (the columns of
 * STMT_DEAD_IMPORT, the role as its OID) unless one of the same relay and
 * event failed as late or later here: returns whether it inserted it,
 * replaced the local one, or kept that.
 */
IdemImportOutcome
IdemRelayDeadLetterImport(Datum *values, bool *nulls)
{
	IdemSavedUser save;
	IdemImportOutcome outcome = IDEM_IMPORT_KEPT;
	bool		isnull;

	IdemPositionBegin(&save);
	if (IdemPositionExec(STMT_DEAD_IMPORT, values, nulls) == 1)
		outcome = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1,
											 &isnull)) ?
			IDEM_IMPORT_INSERTED : IDEM_IMPORT_REPLACED;
	IdemPositionEnd(&save);
	return outcome;
}

/*-------------------------------------------------------------------------
 *
 * keyed_rows.h
 *	  Tables of one row per (role, names...) read and written directly
 *	  under a keyed lock (keyed_rows.c): the stream positions and producer
 *	  sequences (streams.c), the outbox's relay positions
 *	  (outbox_position.c), and any table of that shape.
 *
 * How a caller uses it (streams.c's idem_advance is the model):
 *
 *	static IdemKeyedTable my_table = {
 *		"relay_positions", 4, 2, {OIDOID, TEXTOID},
 *		{REGROLEOID, TEXTOID, INT8OID, TIMESTAMPTZOID}, InvalidOid
 *	};
 *	IdemKeyedRows rows;
 *	IdemKeyedRow row;
 *	Datum		key[2] = {ObjectIdGetDatum(role), PointerGetDatum(name)};
 *
 *	IdemSetStreamLockTag(&tag, MY_LOCK_KIND, role, ...);	(keyhash.h)
 *	IdemKeyedLockAcquire(&tag);			the row's identity, until commit
 *	IdemKeyedOpen(&rows, &my_table);	the table, ROW EXCLUSIVE
 *	if (IdemKeyedFetch(&rows, key, &row))	the row, locked FOR UPDATE
 *		... row.values[i], row.nulls[i] ...
 *	... decide; values[] = the key's columns, then the others ...
 *	IdemKeyedWrite(&rows, &row, values, nulls);	insert, or (HOT) update
 *	IdemKeyedClose(&rows);
 *
 * The contract:
 *	- the table: idempotency.<relname>, owned by the extension, its primary
 *	  key a valid btree on exactly its first nkeys columns, of keytypes
 *	  (OIDOID, TEXTOID, INT4OID or INT8OID; any other type is compared
 *	  with its btree opclass's equality, and its bytes), and no
 *	  deferrable unique or
 *	  exclusion constraint; natts columns in all, at most
 *	  IDEM_KEYED_MAX_ATTS, of the types atttypes, none dropped (the values
 *	  are formed as those types: a column whose type a DBA changed would
 *	  have them read as another type's), and after them dropped columns
 *	  only (a column a DBA added is refused until it is dropped).  IdemKeyedOpen checks all this and fails with
 *	  55000 otherwise (a DBA's change).  At most 8 such tables per backend.
 *	  The IdemKeyedTable is static: relid caches the table's OID, forgotten
 *	  on any relcache invalidation of it.  IdemKeyedOpenRelid opens a table
 *	  of that shape by OID instead of by name (a Citus shard of it,
 *	  citus.c: relid then caches the shard opened last, and shards[] the
 *	  last IDEM_KEYED_CHECKED_SHARDS shards checked, each forgotten on a
 *	  relcache invalidation of it).
 *	- the lock: every writer of a row takes the same keyed lock on the
 *	  row's identity first, and keeps it until its transaction ends
 *	  (IdemKeyedLockAcquire counts a transaction's keyed locks and refuses
 *	  the one past max_locks_per_transaction with 53000, so that one
 *	  transaction cannot fill the shared lock table;
 *	  IdemKeyedLockConditional takes it only if it is free and within the
 *	  bound, for maintenance, which must not wait).  Use a tag of
 *	  keyhash.c's keyed form (IdemSetStreamLockTag), with a lock kind of your own
 *	  (idempotency.h, IDEM_LOCK_*), so that no role can take or read
 *	  another role's.  The lock, not the row, is what serializes writers:
 *	  the row may not exist yet.
 *	- the read (IdemKeyedFetch) sees what is committed now and what this
 *	  transaction wrote, in any isolation level (a fresh snapshot, not the
 *	  transaction's), and locks the row FOR UPDATE: whoever deletes rows
 *	  of the table (maintenance) must do so with FOR UPDATE SKIP LOCKED or
 *	  an equivalent row lock, and then never deletes a row a caller read.
 *	  A row deleted while the fetch waited for its lock is looked for again
 *	  (READ COMMITTED; not found, then) or fails with 40001 (REPEATABLE
 *	  READ, SERIALIZABLE).  row->values point into rows->slot: valid until
 *	  the next fetch or the close; copy what must live longer.
 *	- the write (IdemKeyedWrite) writes every column: the key's as fetched,
 *	  the others as given.  After a fetch that found the row, it updates
 *	  the version locked (HOT when the page has room: no index entry);
 *	  after one that did not, it inserts (every index's entry, the primary
 *	  key's uniqueness checked as an INSERT's is).  It cannot write
 *	  nothing: the lock and the row lock leave no one else to change the
 *	  row.  A second fetch of the same key in the same statement sees the
 *	  write (the command counter is advanced as SPI would).
 *	- no privilege is checked, no SQL runs, no user-settable setting
 *	  changes what is done: the caller decides which rows a role may reach
 *	  (streams.c: only the calling role's, by the key's first column).
 *	- IdemKeyedRowsInit, from _PG_init, registers the callbacks (the lock
 *	  count, the OID cache); nothing else needs preloading.

 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keyed_rows.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_KEYED_ROWS_H
#define IDEMPOTENCY_KEYED_ROWS_H

#include "idempotency.h"

#include "access/htup.h"
#include "executor/tuptable.h"
#include "storage/itemptr.h"
#include "storage/lock.h"
#include "utils/relcache.h"

/* at most this many columns in a keyed table, and in its primary key */
#define IDEM_KEYED_MAX_ATTS		32

/* how many shards of a keyed table opened by OID a backend keeps checked */
#define IDEM_KEYED_CHECKED_SHARDS	8

/*
 * A condition on a keyed table's row (its first column "role", the role's
 * OID as regrole): the role no longer exists.  Maintenance deletes such
 * rows (streams.c, outbox_position.c), FOR UPDATE SKIP LOCKED like the
 * rows it deletes for their age.  A role's rows are keyed by its OID, and
 * a role made later may get the same OID (PostgreSQL hands a dropped
 * role's OID out again once its pg_authid row is vacuumed away and the
 * cluster's OID counter comes round to it): with the rows left, that role
 * would start its streams and relays from the dropped role's positions.
 * pg_roles is readable by every role, the storage owner included.
 */
#define IDEM_KEYED_ROLE_GONE \
	"NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r" \
	" WHERE r.oid OPERATOR(pg_catalog.=) role::pg_catalog.oid)"

/*
 * A keyed table: idempotency.<relname>, whose primary key is its first
 * nkeys columns, of the types keytypes (OIDOID for the role, TEXTOID,
 * INT4OID or INT8OID for the names); natts columns in all, of the types
 * atttypes (REGROLEOID for the role, say: the column's own type; a role
 * column of type idempotency.role_ref is taken for a REGROLEOID one, the
 * same four bytes, role_ref.h).  Defined once,
 * static, by the file that owns the table; relid is this backend's cache
 * of the table's OID (kept true by a relcache callback).
 */
typedef struct IdemKeyedTable
{
	const char *relname;
	int			natts;
	int			nkeys;
	Oid			keytypes[IDEM_KEYED_MAX_ATTS];	/* of the primary key's opclasses */
	Oid			atttypes[IDEM_KEYED_MAX_ATTS];	/* of the columns */
	Oid			relid;			/* cached; InvalidOid until looked up */
	bool		checked;		/* relid's columns and primary key checked */
	int			relnatts;		/* ... when it had this many (dropped ones too) */
	/* the last shards checked (IdemKeyedOpenRelid), and their relnatts */
	Oid			shards[IDEM_KEYED_CHECKED_SHARDS];
	int			shard_natts[IDEM_KEYED_CHECKED_SHARDS];
	int			next_shard;
} IdemKeyedTable;

/* A keyed table opened for one call */
typedef struct IdemKeyedRows
{
	IdemKeyedTable *table;
	Relation	heap;			/* locked ROW EXCLUSIVE */
	Relation	pkey;			/* its primary key, once opened (or NULL) */
	TupleTableSlot *slot;		/* the row fetched last */
	uint32		hash;			/* of its key */
} IdemKeyedRows;

/* One row, as fetched FOR UPDATE */
typedef struct IdemKeyedRow
{
	bool		found;
	ItemPointerData tid;		/* of the version locked */
	Datum		values[IDEM_KEYED_MAX_ATTS];	/* valid until the next fetch */
	bool		nulls[IDEM_KEYED_MAX_ATTS];
} IdemKeyedRow;

extern void IdemKeyedRowsInit(void);
extern void IdemKeyedLockAcquire(const LOCKTAG *tag);
extern bool IdemKeyedLockConditional(const LOCKTAG *tag);
extern void IdemKeyedOpen(IdemKeyedRows *rows, IdemKeyedTable *table);
extern void IdemKeyedOpenRelid(IdemKeyedRows *rows, IdemKeyedTable *table,
							   Oid relid);
extern void IdemKeyedClose(IdemKeyedRows *rows);
extern bool IdemKeyedFetch(IdemKeyedRows *rows, const Datum *key,
						   IdemKeyedRow *row);
extern void IdemKeyedWrite(IdemKeyedRows *rows, IdemKeyedRow *row,
						   Datum *values, const bool *nulls);

#endif							/* IDEMPOTENCY_KEYED_ROWS_H */

/*-------------------------------------------------------------------------
 *
 * keyed_rows.h
 *	  Tables of one row per (role, names...) read and written directly
 *	  under a keyed lock (keyed_rows.c): the stream positions and producer
 *	  sequences (streams.c), and any table of that shape.
 *
 * A caller takes the lock on the row's identity (IdemKeyedLockAcquire,
 * with a tag of lock_secret.c's keyed form), opens the table
 * (IdemKeyedOpen), reads the row FOR UPDATE (IdemKeyedFetch: one probe of
 * the primary key under a fresh snapshot, and the row lock), writes it
 * (IdemKeyedWrite: an insert, or an update that is HOT when it can be)
 * and closes the table (IdemKeyedClose).  No SQL is run: nothing is
 * parsed, planned or executed, and no privilege is checked (the tables
 * belong to the storage owner, and the caller decides who may do what).
 *
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
#define IDEM_KEYED_MAX_ATTS		8

/*
 * A keyed table: idempotency.<relname>, whose primary key is its first
 * nkeys columns, of the types keytypes (OIDOID for the role, TEXTOID,
 * INT4OID or INT8OID for the names); natts columns in all.  Defined once,
 * static, by the file that owns the table; relid is this backend's cache
 * of the table's OID (kept true by a relcache callback).
 */
typedef struct IdemKeyedTable
{
	const char *relname;
	int			natts;
	int			nkeys;
	Oid			keytypes[IDEM_KEYED_MAX_ATTS];
	Oid			relid;			/* cached; InvalidOid until looked up */
} IdemKeyedTable;

/* A keyed table opened for one call */
typedef struct IdemKeyedRows
{
	IdemKeyedTable *table;
	Relation	heap;			/* locked ROW EXCLUSIVE */
	Relation	pkey;			/* its primary key */
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
extern void IdemKeyedOpen(IdemKeyedRows *rows, IdemKeyedTable *table);
extern void IdemKeyedClose(IdemKeyedRows *rows);
extern bool IdemKeyedFetch(IdemKeyedRows *rows, const Datum *key,
						   IdemKeyedRow *row);
extern void IdemKeyedWrite(IdemKeyedRows *rows, IdemKeyedRow *row,
						   Datum *values, const bool *nulls);

#endif							/* IDEMPOTENCY_KEYED_ROWS_H */

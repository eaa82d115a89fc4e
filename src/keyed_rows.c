/*-------------------------------------------------------------------------
 *
 * keyed_rows.c
 *	  Tables of one row per (role, names...), read and written directly
 *	  under a keyed lock: the locks (bounded per transaction), and the
 *	  rows (one probe of the primary key, the row lock, an insert or a HOT
 *	  update), without SQL.
 *
 * The stream positions and producer sequences (streams.c) and the outbox's
 * relay positions (outbox_position.c) are such tables: a call locks its
 * row's identity until its transaction ends, reads the
 * row, decides, and writes it.  Through SPI, each of those steps was a
 * statement: parse analysis once, but the executor started, run and shut
 * down for every read and every write, more than half of a call's cost.
 * Here the same steps are the access methods' own calls:
 *
 *	- the read probes the primary key with every key column under a fresh
 *	  snapshot (GetLatestSnapshot: what is committed now, and this
 *	  transaction's own changes, as the SPI statement saw), and locks the
 *	  version found FOR UPDATE (table_tuple_lock, LockTupleExclusive,
 *	  waiting).  In READ COMMITTED, a version updated meanwhile is
 *	  followed to its newest one (and the row looked for again if that one
 *	  has another key: a DBA's UPDATE of the key's columns), and a row
 *	  deleted meanwhile (maintenance's DELETE, committed while the lock
 *	  waited) is looked for again, and is then found missing; under REPEATABLE READ or SERIALIZABLE either
 *	  fails with SQLSTATE 40001, as the executor's SELECT ... FOR UPDATE
 *	  does.  The row lock is what keeps maintenance's DELETE (FOR UPDATE
 *	  SKIP LOCKED) off a row a call has read and is about to write;
 *	- the write is simple_heap_insert, or simple_heap_update of the version
 *	  locked (refused, as an UPDATE is, if the table publishes updates and
 *	  has no replica identity): heap-only (HOT) when the primary key's columns are unchanged
 *	  (they always are) and the page has room, so no index entry is added;
 *	  otherwise the executor's ExecInsertIndexTuples adds the entries of
 *	  every index, the primary key's uniqueness checked as an INSERT would.
 *	  The row lock leaves no other writer, so the write cannot find the row
 *	  gone (a write that wrote nothing, which the SQL form had to check);
 *	- a read after this transaction wrote in the same command advances the
 *	  command counter first (as SPI did before each statement), so that the
 *	  read sees the write;
 *	- the primary key is not always probed: a backend remembers where the
 *	  newest version of the rows it used last is (the TID of the version it
 *	  wrote or locked), and reads that version first.  If it is still there,
 *	  visible to the fresh snapshot and of the same key, it is the row (a
 *	  primary key has one visible version per key), and the probe, which
 *	  walks the row's whole HOT chain from the version the index entry
 *	  points to (up to a page of dead versions between two prunings, on a
 *	  row updated in every call), is saved; the page is pruned first, as an
 *	  index scan does, so that the updates stay HOT.  Otherwise (another backend
 *	  updated the row since, VACUUM removed the version, the table was
 *	  truncated or made anew) the primary key is probed.
 *
 * The table's OID is cached per backend and forgotten on any relcache
 * invalidation of it (a DROP EXTENSION, a DBA's ALTER, an index added or
 * dropped), and its columns (their types) and its primary key (a btree on
 * the first columns of the table) are checked at the first open after one.  The primary key is
 * opened only when a fetch probes it or the check needs it: a call that
 * reads the remembered version and updates it in place (HOT) never uses
 * it.  Nothing here checks privileges: the tables belong to the storage
 * owner and are granted to nobody, and the calling file decides who may
 * reach which rows (streams.c: only the caller's role's).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keyed_rows.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "keyed_rows.h"
#include "relation_checks.h"
#include "role_ref.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "utils/lsyscache.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/* ----------------------------------------------------------------
 * The keyed locks of the current transaction, counted
 * ----------------------------------------------------------------
 */

/*
 * The keyed locks the current transaction holds, counted by the
 * subtransaction nesting level that took each first: a subtransaction that
 * rolls back releases the locks it took, and gives them back to the count;
 * one that commits hands them to its parent.  Outside a transaction, all
 * zero.  Two budgets, each of max_locks_per_transaction: the locks of
 * keyed rows (stream positions, producer sequences, outbox relays), and
 * the outbox's event keys (outbox_publish.c), as before they were counted
 * apart.
 */
typedef struct IdemKeyedLockCount
{
	int		   *at;				/* [level], in TopMemoryContext */
	int			levels;			/* allocated length */
	int			held;			/* the sum */
} IdemKeyedLockCount;

#define IDEM_KEYED_BUDGET_ROWS			0
#define IDEM_KEYED_BUDGET_EVENT_KEYS	1
#define IDEM_KEYED_BUDGETS				2
static IdemKeyedLockCount keyed_locks[IDEM_KEYED_BUDGETS];

/* the tables whose OIDs this backend caches (the relcache callback's) */
#define IDEM_KEYED_MAX_TABLES	8
static IdemKeyedTable *keyed_tables[IDEM_KEYED_MAX_TABLES];
static int	nkeyed_tables = 0;

/*
 * Where the newest version of a row this backend used was, by a hash of
 * its key (IdemKeyedFetch): a hint, checked before it is used.
 */
#define IDEM_KEYED_TIDS			64
typedef struct IdemKeyedTid
{
	IdemKeyedTable *table;
	Oid			relid;
	uint32		hash;
	ItemPointerData tid;
} IdemKeyedTid;
static IdemKeyedTid keyed_tids[IDEM_KEYED_TIDS];

/* the transaction and command of this backend's last keyed write */
static TransactionId last_write_xid = InvalidTransactionId;
static CommandId last_write_cid = InvalidCommandId;

static void IdemKeyedLocksXactCallback(XactEvent event, void *arg);
static void IdemKeyedLocksSubXactCallback(SubXactEvent event,
										  SubTransactionId mySubid,
										  SubTransactionId parentSubid,
										  void *arg);
static bool IdemKeyedLockTake(const LOCKTAG *tag, bool nowait);
static void IdemKeyedRelcacheCallback(Datum arg, Oid relid);
static void IdemKeyedRegister(IdemKeyedTable *table);
static Oid	IdemKeyedLockTable(IdemKeyedTable *table);
static inline void IdemKeyedOpened(IdemKeyedRows *rows, IdemKeyedTable *table);
static bool IdemKeyedColumnsMatch(IdemKeyedRows *rows);
static void IdemKeyedOpenPrimaryKey(IdemKeyedRows *rows);
static bool IdemKeyedProbe(IdemKeyedRows *rows, const Datum *key,
						   Snapshot snapshot);
static void IdemKeyedIndexEntries(IdemKeyedRows *rows, HeapTuple tuple,
								  IdemIndexUpdate which);
static uint32 IdemKeyedHash(const IdemKeyedTable *table, const Datum *key);
static bool IdemKeyedSlotHasKey(IdemKeyedRows *rows, const Datum *key,
								bool detoast);
static inline bool IdemKeyedSameBytes(Datum d, Datum key, bool detoast);
static bool IdemKeyedFetchRemembered(IdemKeyedRows *rows, const Datum *key,
									 uint32 hash, Snapshot snapshot);
static void IdemKeyedRemember(IdemKeyedRows *rows, uint32 hash,
							  ItemPointer tid);

/* registers the callbacks; called once from _PG_init */
void
IdemKeyedRowsInit(void)
{
	RegisterXactCallback(IdemKeyedLocksXactCallback, NULL);
	RegisterSubXactCallback(IdemKeyedLocksSubXactCallback, NULL);
	IdemRegisterRelcacheCallback(IdemKeyedRelcacheCallback);
}

static void
IdemKeyedLocksXactCallback(XactEvent event, void *arg)
{
	int			b;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			for (b = 0; b < IDEM_KEYED_BUDGETS; b++)
			{
				IdemKeyedLockCount *c = &keyed_locks[b];

				if (c->levels > 0)
					memset(c->at, 0, c->levels * sizeof(int));
				c->held = 0;
			}
			break;
		default:
			break;
	}
}

static void
IdemKeyedLocksSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
							  SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	int			b;

	for (b = 0; b < IDEM_KEYED_BUDGETS; b++)
	{
		IdemKeyedLockCount *c = &keyed_locks[b];

		if (level >= c->levels || c->at[level] == 0)
			continue;
		switch (event)
		{
			case SUBXACT_EVENT_ABORT_SUB:
				c->held -= c->at[level];
				c->at[level] = 0;
				break;
			case SUBXACT_EVENT_COMMIT_SUB:
				c->at[level - 1] += c->at[level];
				c->at[level] = 0;
				break;
			default:
				break;
		}
	}
}

/*
 * IdemKeyedLockAcquire takes a keyed lock (a stream lock of keyhash.c's
 * form) in ExclusiveLock mode until the transaction ends.
 *
 * Each lock takes an entry of the lock table every backend shares, for as
 * long as the transaction lasts.  Unbounded, one transaction of one role
 * (an idem_assign of 15,000 partitions, say, or idem_outbox_next() of as
 * many relays) filled the table, and every other session's next lock
 * failed (53200, out of shared memory), new connections included.  So a
 * transaction may hold at most max_locks_per_transaction of them
 * (PostgreSQL sizes the table for that many per backend): the next new one
 * is refused with 53000, and only this transaction fails.  A lock it holds
 * already is taken again freely.  The locks of the outbox's event keys
 * (IDEM_LOCK_OUTBOX_KEY) have a budget of their own; the others share one.
 */
void
IdemKeyedLockAcquire(const LOCKTAG *tag)
{
	(void) IdemKeyedLockTake(tag, false);
}

/*
 * IdemKeyedLockConditional takes a keyed lock as IdemKeyedLockAcquire
 * does, but only if it is free at once and within the transaction's
 * bound: returns whether it did (never an error for either).
 */
bool
IdemKeyedLockConditional(const LOCKTAG *tag)
{
	return IdemKeyedLockTake(tag, true);
}

static bool
IdemKeyedLockTake(const LOCKTAG *tag, bool nowait)
{
	int			level = GetCurrentTransactionNestLevel();
	IdemKeyedLockCount *c;
	LockAcquireResult res;

	c = &keyed_locks[tag->locktag_field4 == IDEM_LOCK_OUTBOX_KEY ?
					 IDEM_KEYED_BUDGET_EVENT_KEYS : IDEM_KEYED_BUDGET_ROWS];
	if (c->held >= max_locks_per_xact &&
		!IdemLockHeldByMe(tag, ExclusiveLock))
	{
		if (nowait)
			return false;
		if (tag->locktag_field4 == IDEM_LOCK_OUTBOX_KEY)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("too many event keys locked by this transaction"),
					 errdetail("Each key an event is published with holds a lock until the transaction ends, and this transaction holds %d, the limit set by \"%s\".",
							   c->held, "max_locks_per_transaction"),
					 errhint("Publish events of fewer keys in one transaction (events without a key take no lock), or raise \"%s\".",
							 "max_locks_per_transaction")));
		if (tag->locktag_field4 == IDEM_LOCK_OUTBOX_RELAY)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("too many outbox relays locked by this transaction"),
					 errdetail("Each relay of a topic holds a lock until the transaction ends, as each stream partition and producer does, and this transaction holds %d, the limit set by \"%s\".",
							   c->held, "max_locks_per_transaction"),
					 errhint("Serve fewer relays and topics in one transaction, or raise \"%s\".",
							 "max_locks_per_transaction")));
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("too many stream partitions and producers locked by this transaction"),
				 errdetail("Each holds a lock until the transaction ends, and this transaction holds %d, the limit set by \"%s\".",
						   c->held, "max_locks_per_transaction"),
				 errhint("Assign, advance, check or import fewer partitions and producers in one transaction, or raise \"%s\".",
						 "max_locks_per_transaction")));
	}
	/* room to count it, before it is taken */
	if (level >= c->levels)
	{
		int			n = Max(level + 1, 8);

		if (c->at == NULL)
			c->at = MemoryContextAllocZero(TopMemoryContext, n * sizeof(int));
		else
		{
			c->at = repalloc(c->at, n * sizeof(int));
			memset(c->at + c->levels, 0, (n - c->levels) * sizeof(int));
		}
		c->levels = n;
	}
	res = LockAcquire(tag, ExclusiveLock, false, nowait);
	if (res == LOCKACQUIRE_NOT_AVAIL)
		return false;
	if (res == LOCKACQUIRE_OK)
	{
		c->at[level]++;
		c->held++;
	}
	return true;
}

/* ----------------------------------------------------------------
 * The rows
 * ----------------------------------------------------------------
 */

/* forgets the cached OID of a keyed table that may have changed */
static void
IdemKeyedRelcacheCallback(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < nkeyed_tables; i++)
	{
		IdemKeyedTable *table = keyed_tables[i];
		int			j;

		if (!OidIsValid(relid) || table->relid == relid)
		{
			table->relid = InvalidOid;
			table->checked = false;
		}
		for (j = 0; j < IDEM_KEYED_CHECKED_SHARDS; j++)
			if (!OidIsValid(relid) || table->shards[j] == relid)
				table->shards[j] = InvalidOid;
	}
}

/* makes the relcache callback forget the table's cached OID */
static void
IdemKeyedRegister(IdemKeyedTable *table)
{
	int			i;

	for (i = 0; i < nkeyed_tables; i++)
		if (keyed_tables[i] == table)
			return;
	if (nkeyed_tables == IDEM_KEYED_MAX_TABLES)
		elog(ERROR, "too many keyed tables");
	keyed_tables[nkeyed_tables++] = table;
}

/*
 * IdemKeyedLockTable locks the table ROW EXCLUSIVE and returns its OID: the
 * cached one, or else the one its name has now, if no invalidation has come
 * for it once locked (locking accepts invalidations: a table dropped or
 * renamed meanwhile is looked up again).  The name is looked up as the
 * extension's, whatever the caller's privileges on its schema.
 */
static Oid
IdemKeyedLockTable(IdemKeyedTable *table)
{
	IdemKeyedRegister(table);
	for (;;)
	{
		Oid			relid = table->relid;

		if (!OidIsValid(relid))
		{
			relid = get_relname_relid(table->relname,
									  get_namespace_oid(IDEM_SCHEMA_NAME, false));
			if (!OidIsValid(relid))
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("table \"%s.%s\" does not exist",
								IDEM_SCHEMA_NAME, table->relname),
						 errhint("Recreate the extension, or restore the table.")));
			table->relid = relid;
		}
		LockRelationOid(relid, RowExclusiveLock);
		if (table->relid == relid)
			return relid;
		UnlockRelationOid(relid, RowExclusiveLock);
	}
}

/*
 * IdemKeyedOpen opens a keyed table, ROW EXCLUSIVE (kept until the
 * transaction ends, as a statement's), for one call.  Its primary key is
 * opened when a fetch needs to probe it (IdemKeyedOpenPrimaryKey), and
 * checked at the first open after any relcache invalidation of the table
 * (adding, dropping or changing an index or a column sends one).
 */
void
IdemKeyedOpen(IdemKeyedRows *rows, IdemKeyedTable *table)
{
	rows->heap = table_open(IdemKeyedLockTable(table), NoLock);
	IdemKeyedOpened(rows, table);
}

/*
 * IdemKeyedOpenRelid opens table "relid", of the shape "table" describes,
 * as IdemKeyedOpen does: a Citus shard of a distributed keyed table, whose
 * OID the caller found (citus.c) and whose shard lock it holds.  The
 * checks of the columns and the primary key are made at its first open
 * after a relcache invalidation of it: the last IDEM_KEYED_CHECKED_SHARDS
 * shards checked are kept (a node holds several shards of a table, and
 * the calls of its tenants alternate between them), each until an
 * invalidation of it (the callback above; the lock below reads them).
 */
void
IdemKeyedOpenRelid(IdemKeyedRows *rows, IdemKeyedTable *table, Oid relid)
{
	int			i;

	IdemKeyedRegister(table);
	LockRelationOid(relid, RowExclusiveLock);
	if (table->relid != relid)
	{
		table->relid = relid;
		table->checked = false;
		for (i = 0; i < IDEM_KEYED_CHECKED_SHARDS; i++)
			if (table->shards[i] == relid)
			{
				table->checked = true;
				table->relnatts = table->shard_natts[i];
				break;
			}
	}
	rows->heap = table_open(relid, NoLock);
	IdemKeyedOpened(rows, table);	/* checked now, if it was not */
	for (i = 0; i < IDEM_KEYED_CHECKED_SHARDS; i++)
		if (table->shards[i] == relid)
			return;
	table->shards[table->next_shard] = relid;
	table->shard_natts[table->next_shard] = table->relnatts;
	table->next_shard = (table->next_shard + 1) % IDEM_KEYED_CHECKED_SHARDS;
}

/* the rest of an open: the checks once, and the slot */
static inline void
IdemKeyedOpened(IdemKeyedRows *rows, IdemKeyedTable *table)
{
	rows->table = table;
	rows->hash = 0;
	rows->pkey = NULL;
	if (!table->checked ||
		RelationGetDescr(rows->heap)->natts != table->relnatts)
	{
		IdemKeyedOpenPrimaryKey(rows);
		table->checked = true;
		table->relnatts = RelationGetDescr(rows->heap)->natts;
	}
	rows->slot = table_slot_create(rows->heap, NULL);
}

/*
 * IdemKeyedColumnsMatch: has the open keyed table the columns the
 * extension made, of their types, none dropped, and after them only
 * dropped ones (a column a DBA added and dropped again)?  The values are
 * formed and read as those types: a column whose type a DBA changed (ALTER
 * TABLE ... ALTER COLUMN ... TYPE numeric) would have a bigint's Datum
 * taken for a pointer to a numeric.  A column added (and not dropped) is
 * refused too: the SQL statements gave it its default, which no write here
 * knows.  A role column (regrole) may be of type idempotency.role_ref
 * instead, as citus_distribute() makes the distributed tables' (role_ref.c):
 * the same four bytes, an oid.
 */
static bool
IdemKeyedColumnsMatch(IdemKeyedRows *rows)
{
	TupleDesc	desc = RelationGetDescr(rows->heap);
	int			i;

	if (desc->natts < rows->table->natts)
		return false;
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (i >= rows->table->natts)
		{
			if (!att->attisdropped)
				return false;
		}
		else if (att->attisdropped ||
				 (att->atttypid != rows->table->atttypes[i] &&
				  !(rows->table->atttypes[i] == REGROLEOID &&
					IdemIsRoleRefType(att->atttypid))))
			return false;
	}
	return true;
}

/*
 * IdemKeyedOpenPrimaryKey opens the primary key of an open keyed table,
 * ROW EXCLUSIVE, checking that the table has the columns and the primary
 * key the extension made.
 */
static void
IdemKeyedOpenPrimaryKey(IdemKeyedRows *rows)
{
	IdemKeyedTable *table = rows->table;
	Oid			pkoid;
	Form_pg_index form;
	int			i;
	bool		ok;

	if (rows->pkey != NULL)
		return;
	pkoid = IdemRelationGetPrimaryKeyIndex(rows->heap);
	if (!OidIsValid(pkoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" has no primary key",
						IDEM_SCHEMA_NAME, table->relname)));
	rows->pkey = index_open(pkoid, RowExclusiveLock);
	form = rows->pkey->rd_index;
	ok = IdemKeyedColumnsMatch(rows) &&
		rows->pkey->rd_rel->relam == BTREE_AM_OID &&
		form->indisvalid && form->indnkeyatts == table->nkeys;
	for (i = 0; ok && i < table->nkeys; i++)
		ok = form->indkey.values[i] == i + 1 &&
			rows->pkey->rd_opcintype[i] == table->keytypes[i];
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" does not have the columns and primary key the extension made",
						IDEM_SCHEMA_NAME, table->relname),
				 errhint("Recreate the extension, or restore the table's definition.")));
}

/* IdemKeyedClose closes what IdemKeyedOpen opened, keeping the locks */
void
IdemKeyedClose(IdemKeyedRows *rows)
{
	ExecDropSingleTupleTableSlot(rows->slot);
	if (rows->pkey != NULL)
		index_close(rows->pkey, NoLock);
	table_close(rows->heap, NoLock);
}

/*
 * IdemKeyedProbe looks the row of this key up in the primary key under the
 * snapshot, into rows->slot; returns whether it found it.
 */
static bool
IdemKeyedProbe(IdemKeyedRows *rows, const Datum *key, Snapshot snapshot)
{
	IdemKeyedTable *table = rows->table;
	ScanKeyData skeys[IDEM_KEYED_MAX_ATTS];
	IndexScanDesc scan;
	bool		found;
	int			i;

	IdemKeyedOpenPrimaryKey(rows);
	for (i = 0; i < table->nkeys; i++)
	{
		RegProcedure eq;

		switch (table->keytypes[i])
		{
			case OIDOID:
				eq = F_OIDEQ;
				break;
			case TEXTOID:
				eq = F_TEXTEQ;
				break;
			case INT4OID:
				eq = F_INT4EQ;
				break;
			case INT8OID:
				eq = F_INT8EQ;
				break;
			default:
				{
					/* another type (a Citus tenant's): its opclass's = */
					Oid			opno;

					opno = get_opfamily_member(rows->pkey->rd_opfamily[i],
											   rows->pkey->rd_opcintype[i],
											   rows->pkey->rd_opcintype[i],
											   BTEqualStrategyNumber);
					if (!OidIsValid(opno))
						elog(ERROR, "no equality operator for key column %d of \"%s.%s\"",
							 i + 1, IDEM_SCHEMA_NAME, table->relname);
					eq = get_opcode(opno);
				}
		}
		ScanKeyEntryInitialize(&skeys[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, rows->pkey->rd_indcollation[i],
							   eq, key[i]);
	}
	scan = IdemIndexBeginScan(rows->heap, rows->pkey, snapshot, table->nkeys);
	index_rescan(scan, skeys, table->nkeys, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, rows->slot);
	index_endscan(scan);
	return found;
}

/*
 * IdemKeyedFetch reads the row whose primary key is key[0 .. nkeys), and
 * locks it FOR UPDATE: row->found, and its values.  The caller holds the
 * keyed lock on the row's identity.  See the top of the file for what a
 * concurrent change of the row does.
 */
bool
IdemKeyedFetch(IdemKeyedRows *rows, const Datum *key, IdemKeyedRow *row)
{
	IdemKeyedTable *table = rows->table;
	int			i;

	/* see this transaction's writes of the same command */
	if (TransactionIdIsValid(last_write_xid) &&
		last_write_cid == GetCurrentCommandId(false) &&
		TransactionIdEquals(last_write_xid, GetTopTransactionIdIfAny()))
		CommandCounterIncrement();

	rows->hash = IdemKeyedHash(table, key);
	for (;;)
	{
		Snapshot	snapshot = GetLatestSnapshot();
		bool		found;
		ItemPointerData tid;
		TM_FailureData tmfd;
		TM_Result	result;

		found = IdemKeyedFetchRemembered(rows, key, rows->hash, snapshot);
		if (!found)
			found = IdemKeyedProbe(rows, key, snapshot);
		if (found)
			tid = rows->slot->tts_tid;
		if (!found)
		{
			ExecClearTuple(rows->slot);
			row->found = false;
			return false;
		}

		result = table_tuple_lock(rows->heap, &tid, snapshot, rows->slot,
								  GetCurrentCommandId(false),
								  LockTupleExclusive, LockWaitBlock,
								  IsolationUsesXactSnapshot() ? 0 :
								  TUPLE_LOCK_FLAG_FIND_LAST_VERSION,
								  &tmfd);
		switch (result)
		{
			case TM_Ok:

				/*
				 * READ COMMITTED followed the row's updates to its newest
				 * version: the key may be another's now (a DBA's UPDATE of
				 * the key's columns, committed while the lock waited).  The
				 * executor rechecks its WHERE clause there (EvalPlanQual)
				 * and skips the row; look again, as for a delete.
				 */
				if (tmfd.traversed && !IdemKeyedSlotHasKey(rows, key, true))
					continue;
				break;
			case TM_Deleted:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent delete")));
				/* gone while the lock waited: look again (no row, or a new one) */
				continue;
			case TM_Updated:
				/* only under a transaction snapshot: READ COMMITTED follows */
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent update")));
				break;
			default:
				/* not after the command counter moved past our writes */
				elog(ERROR, "unexpected result %d locking a row of \"%s.%s\"",
					 (int) result, IDEM_SCHEMA_NAME, table->relname);
		}
		row->found = true;
		row->tid = rows->slot->tts_tid;
		IdemKeyedRemember(rows, rows->hash, &row->tid);
		slot_getallattrs(rows->slot);
		for (i = 0; i < table->natts; i++)
		{
			row->values[i] = rows->slot->tts_values[i];
			row->nulls[i] = rows->slot->tts_isnull[i];
		}
		return true;
	}
}

/*
 * IdemKeyedWrite writes values/nulls (every column, the key's the same as
 * the fetch's) as the row IdemKeyedFetch read: inserted if it found none,
 * else as the new version of the one it locked.  row then names the new
 * version.
 */
void
IdemKeyedWrite(IdemKeyedRows *rows, IdemKeyedRow *row, Datum *values,
			   const bool *nulls)
{
	TupleDesc	desc = RelationGetDescr(rows->heap);
	HeapTuple	tuple;
	IdemIndexUpdate which;

	if (desc->natts == rows->table->natts)
		tuple = heap_form_tuple(desc, values, (bool *) nulls);
	else
	{
		/* dropped columns after the table's own (IdemKeyedColumnsMatch) */
		Datum	   *v = palloc(desc->natts * sizeof(Datum));
		bool	   *n = palloc(desc->natts * sizeof(bool));
		int			i;

		for (i = 0; i < desc->natts; i++)
		{
			v[i] = i < rows->table->natts ? values[i] : (Datum) 0;
			n[i] = i < rows->table->natts ? nulls[i] : true;
		}
		tuple = heap_form_tuple(desc, v, n);
		pfree(v);
		pfree(n);
	}

	if (row->found)
	{
		/*
		 * As an UPDATE's: refused (55000) if the table publishes updates
		 * without a replica identity, which no subscriber could apply (a
		 * DBA's ALTER TABLE ... REPLICA IDENTITY NOTHING and publication).
		 */
		IdemCheckDirectWrite(rows->heap, CMD_UPDATE);
		which = IdemSimpleHeapUpdate(rows->heap, &row->tid, tuple);
	}
	else
	{
		simple_heap_insert(rows->heap, tuple);
		which = IDEM_INDEX_UPDATE_ALL;
	}
	IdemKeyedIndexEntries(rows, tuple, which);
	last_write_xid = GetTopTransactionIdIfAny();
	last_write_cid = GetCurrentCommandId(true);
	row->found = true;
	row->tid = tuple->t_self;
	IdemKeyedRemember(rows, rows->hash, &row->tid);
	heap_freetuple(tuple);
}

/*
 * IdemKeyedIndexEntries adds the index entries a row version just written
 * needs (none after a HOT update), through the executor's own
 * ExecInsertIndexTuples: the primary key's uniqueness is checked there, as
 * for an INSERT, and an index a DBA added is kept complete.
 */
static void
IdemKeyedIndexEntries(IdemKeyedRows *rows, HeapTuple tuple,
					  IdemIndexUpdate which)
{
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	List	   *recheck;

	if (which == IDEM_INDEX_UPDATE_NONE)
		return;
	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rows->heap, 0, NULL, 0);
	ExecOpenIndices(rri, false);
	slot = MakeSingleTupleTableSlot(RelationGetDescr(rows->heap),
									&TTSOpsHeapTuple);
	ExecStoreHeapTuple(tuple, slot, false);
	recheck = IdemExecInsertIndexTuples(rri, slot, estate,
										which == IDEM_INDEX_UPDATE_SUMMARIZING);
	if (recheck != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("table \"%s.%s\" has a deferrable unique or exclusion constraint",
						IDEM_SCHEMA_NAME, rows->table->relname),
				 errhint("Drop the constraint.")));
	ExecDropSingleTupleTableSlot(slot);
	ExecCloseIndices(rri);
	FreeExecutorState(estate);
}

/* a hash of a key of the table, for keyed_tids */
static uint32
IdemKeyedHash(const IdemKeyedTable *table, const Datum *key)
{
	uint32		h = hash_bytes_uint32((uint32) table->nkeys);
	int			i;

	for (i = 0; i < table->nkeys; i++)
	{
		uint32		k;

		if (table->keytypes[i] == TEXTOID)
		{
			text	   *t = DatumGetTextPP(key[i]);

			k = hash_bytes((const unsigned char *) VARDATA_ANY(t),
						   VARSIZE_ANY_EXHDR(t));
		}
		else if (table->keytypes[i] == INT8OID)
			k = hash_bytes_uint32((uint32) DatumGetInt64(key[i])) ^
				hash_bytes_uint32((uint32) (DatumGetInt64(key[i]) >> 32));
		else if (table->keytypes[i] == OIDOID || table->keytypes[i] == INT4OID)
			k = hash_bytes_uint32(DatumGetUInt32(key[i]));
		else
			k = 0;				/* another type: a hint without it */
		h = hash_combine(h, k);
	}
	return h;
}

/*
 * IdemKeyedFetchRemembered reads, into rows->slot, the version of the row
 * of this key that this backend wrote or locked last, if it is remembered,
 * and is still there, visible to the snapshot and of this key (its text
 * columns the same bytes, stored inline); returns false otherwise.
 */
static bool
IdemKeyedFetchRemembered(IdemKeyedRows *rows, const Datum *key, uint32 hash,
						 Snapshot snapshot)
{
	IdemKeyedTable *table = rows->table;
	IdemKeyedTid *e = &keyed_tids[hash % IDEM_KEYED_TIDS];
	Buffer		buffer;

	if (e->table != table || e->hash != hash ||
		e->relid != RelationGetRelid(rows->heap))
		return false;
	/* (a block VACUUM truncated away cannot be read) */
	if (ItemPointerGetBlockNumber(&e->tid) >=
		RelationGetNumberOfBlocks(rows->heap))
		return false;

	/*
	 * Prune the page first, as an index scan does before it reads a row
	 * there (heapam_index_fetch_tuple): a row updated in every call leaves
	 * a dead version each time, and only pruning frees their room for the
	 * next HOT update.  Never after the row is read: pruning moves the
	 * live versions' data within the page.
	 */
	buffer = ReadBuffer(rows->heap, ItemPointerGetBlockNumber(&e->tid));
	heap_page_prune_opt(rows->heap, buffer);
	ReleaseBuffer(buffer);
	if (!table_tuple_fetch_row_version(rows->heap, &e->tid, snapshot,
									   rows->slot))
		return false;
	return IdemKeyedSlotHasKey(rows, key, false);
}

/*
 * IdemKeyedSlotHasKey: is the row in rows->slot of this key (its text
 * columns the same bytes)?  A text column compressed or stored out of line
 * is detoasted if "detoast", else taken as another key.
 */
static bool
IdemKeyedSlotHasKey(IdemKeyedRows *rows, const Datum *key, bool detoast)
{
	IdemKeyedTable *table = rows->table;
	int			i;

	slot_getsomeattrs(rows->slot, table->nkeys);
	for (i = 0; i < table->nkeys; i++)
	{
		Datum		d = rows->slot->tts_values[i];
		Oid			keytype = table->keytypes[i];

		if (rows->slot->tts_isnull[i])
			return false;
		if (keytype == TEXTOID)
		{
			if (!IdemKeyedSameBytes(d, key[i], detoast))
				return false;
		}
		else if (keytype == INT8OID)
		{
			if (DatumGetInt64(d) != DatumGetInt64(key[i]))
				return false;
		}
		else if (keytype == OIDOID || keytype == INT4OID)
		{
			if (DatumGetUInt32(d) != DatumGetUInt32(key[i]))
				return false;
		}
		else
		{
			/* another type (a Citus tenant's): the same bytes */
			Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rows->heap), i);

			if (att->attlen == -1 ?
				!IdemKeyedSameBytes(d, key[i], detoast) :
				!datumIsEqual(d, key[i], att->attbyval, att->attlen))
				return false;
		}
	}
	return true;
}

/*
 * IdemKeyedSameBytes: has varlena column value d (of a row in a slot) the
 * bytes of key?  One compressed or stored out of line is detoasted if
 * "detoast", else taken as another key.
 */
static inline bool
IdemKeyedSameBytes(Datum d, Datum key, bool detoast)
{
	text	   *want = DatumGetTextPP(key);
	text	   *have = (text *) DatumGetPointer(d);
	bool		same;

	if (VARATT_IS_EXTENDED(have) && !VARATT_IS_SHORT(have))
	{
		/* compressed or out of line */
		if (!detoast)
			return false;
		have = DatumGetTextPP(d);
	}
	same = VARSIZE_ANY_EXHDR(have) == VARSIZE_ANY_EXHDR(want) &&
		memcmp(VARDATA_ANY(have), VARDATA_ANY(want),
			   VARSIZE_ANY_EXHDR(want)) == 0;
	if (have != (text *) DatumGetPointer(d))
		pfree(have);
	return same;
}

/* remembers where the newest version of the row of this key is */
static void
IdemKeyedRemember(IdemKeyedRows *rows, uint32 hash, ItemPointer tid)
{
	IdemKeyedTid *e = &keyed_tids[hash % IDEM_KEYED_TIDS];

	e->table = rows->table;
	e->relid = RelationGetRelid(rows->heap);
	e->hash = hash;
	e->tid = *tid;
}

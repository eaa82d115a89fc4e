/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The differences between the PostgreSQL majors this extension builds
 *	  against (15 to 18), in one place.
 *
 * Every other file calls the Idem* names below and never tests
 * PG_VERSION_NUM itself.  Each guard says what changed upstream, and in
 * which major, so that a guard can be dropped when its older majors are.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/compat.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_COMPAT_H
#define IDEMPOTENCY_COMPAT_H

#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/lockdefs.h"

#if PG_VERSION_NUM < 150000
#error "idempotency requires PostgreSQL 15 or later"
#endif

/*
 * The varlena macros (VARSIZE_ANY_EXHDR, VARDATA_ANY, ...): PostgreSQL 16
 * moved them out of postgres.h into varatt.h.
 */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * Which index entries a heap update needs.  PostgreSQL 16
 * made simple_heap_update() report it (TU_UpdateIndexes), because a HOT
 * update may now still need entries in summarizing (BRIN) indexes; before,
 * a heap-only tuple needed none and any other needed all.
 */
typedef enum IdemIndexUpdate
{
	IDEM_INDEX_UPDATE_NONE,		/* HOT: no index changes */
	IDEM_INDEX_UPDATE_ALL,		/* new TID: an entry in every index */
	IDEM_INDEX_UPDATE_SUMMARIZING	/* HOT, but summarizing indexes need it */
} IdemIndexUpdate;

static inline IdemIndexUpdate
IdemSimpleHeapUpdate(Relation rel, ItemPointer otid, HeapTuple tup)
{
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes;

	simple_heap_update(rel, otid, tup, &update_indexes);
	switch (update_indexes)
	{
		case TU_None:
			return IDEM_INDEX_UPDATE_NONE;
		case TU_Summarizing:
			return IDEM_INDEX_UPDATE_SUMMARIZING;
		case TU_All:
			break;
	}
	return IDEM_INDEX_UPDATE_ALL;
#else
	simple_heap_update(rel, otid, tup);
	return HeapTupleIsHeapOnly(tup) ? IDEM_INDEX_UPDATE_NONE :
		IDEM_INDEX_UPDATE_ALL;
#endif
}

/*
 * Whether an index access method is summarizing (BRIN): PostgreSQL 16 added
 * IndexAmRoutine.amsummarizing; before, no index was maintained that way.
 */
#if PG_VERSION_NUM >= 160000
#define IdemIndexIsSummarizing(indexrel) ((indexrel)->rd_indam->amsummarizing)
#else
#define IdemIndexIsSummarizing(indexrel) ((void) (indexrel), false)
#endif

/*
 * ExecInsertIndexTuples(): PostgreSQL 16 added the trailing
 * "onlySummarizing" argument (with TU_UpdateIndexes).  Called as for an
 * insert: "update" only feeds a hint to btree's bottom-up deletion.
 */
#if PG_VERSION_NUM >= 160000
#define IdemExecInsertIndexTuples(rri, slot, estate, only_summarizing) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, \
						  (only_summarizing))
#else
#define IdemExecInsertIndexTuples(rri, slot, estate, only_summarizing) \
	((void) (only_summarizing), \
	 ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL))
#endif

/*
 * LockHeldByMe(): PostgreSQL 17 added "orstronger".
 * Callers here ask about exactly the mode given.
 */
#if PG_VERSION_NUM >= 170000
#define IdemLockHeldByMe(tag, mode) LockHeldByMe((tag), (mode), false)
#else
#define IdemLockHeldByMe(tag, mode) LockHeldByMe((tag), (mode))
#endif

/*
 * Does this backend hold a lock on relation "relid" in "mode" (or, with
 * "orstronger", in a stronger mode)?  PostgreSQL's own
 * CheckRelationOidLockedByMe() appeared only in later 15.x minor releases
 * (and 16); this asks LockHeldByMe(), which every release has.
 */
static inline bool
IdemRelationOidLockedByMe(Oid relid, LOCKMODE mode, bool orstronger)
{
	LOCKTAG		tag;
	LOCKMODE	m;

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	for (m = mode; m <= (orstronger ? MaxLockMode : mode); m++)
	{
		if (IdemLockHeldByMe(&tag, m))
			return true;
	}
	return false;
}

/*
 * index_insert_cleanup(): PostgreSQL 17 let an index access method keep
 * state across the inserts of one statement in IndexInfo.ii_AmCache (BRIN
 * keeps a pinned revmap buffer there) and release it in aminsertcleanup,
 * which whoever inserts must call once done.  Before 17 there was nothing
 * to release.
 */
#if PG_VERSION_NUM >= 170000
#define IdemIndexInsertCleanup(index, info) index_insert_cleanup((index), (info))
#else
#define IdemIndexInsertCleanup(index, info) ((void) (index), (void) (info))
#endif

/*
 * index_beginscan(): PostgreSQL 18 added an
 * IndexScanInstrumentation argument, for EXPLAIN ANALYZE; none here.
 */
#if PG_VERSION_NUM >= 180000
#define IdemIndexBeginScan(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), 0)
#else
#define IdemIndexBeginScan(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), 0)
#endif

/*
 * RelationGetPrimaryKeyIndex(): PostgreSQL 18 added "deferrable_ok"; false
 * keeps the earlier answer (no index for a deferrable primary key).
 */
#if PG_VERSION_NUM >= 180000
#define IdemRelationGetPrimaryKeyIndex(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define IdemRelationGetPrimaryKeyIndex(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * One backend's entry of this transaction's copy of the activity table,
 * by position (1 to pgstat_fetch_stat_numbackends()): PostgreSQL 16
 * renamed pgstat_fetch_stat_local_beentry() to
 * pgstat_get_local_beentry_by_index().  Callers include
 * utils/backend_status.h.
 */
#if PG_VERSION_NUM >= 160000
#define IdemLocalBackendStatus(i) pgstat_get_local_beentry_by_index(i)
#else
#define IdemLocalBackendStatus(i) pgstat_fetch_stat_local_beentry(i)
#endif

/*
 * ExecutorCheckPerms_hook, which PostgreSQL calls once a statement's (or a
 * COPY's) privileges on its relations have passed: PostgreSQL 16 moved
 * what each relation needs out of the range table entries into a list of
 * RTEPermissionInfo, which the hook gets beside the range table.  A hook
 * here is declared with IDEM_CHECK_PERMS_PARAMS, calls the previous one
 * with IdemCallCheckPerms(), and reads each relation asked about with
 * IdemCheckPermsEntry() over IDEM_CHECK_PERMS_LIST: its OID (InvalidOid
 * for an entry that is no relation) and the privileges it needs.
 */
#if PG_VERSION_NUM >= 160000
#define IDEM_CHECK_PERMS_PARAMS \
	List *rangeTable, List *permInfos, bool ereport_on_violation
#define IdemCallCheckPerms(hook) \
	((hook) (rangeTable, permInfos, ereport_on_violation))
#define IDEM_CHECK_PERMS_LIST permInfos

static inline void
IdemCheckPermsEntry(const ListCell *lc, Oid *relid, AclMode *required)
{
	const RTEPermissionInfo *p = lfirst_node(RTEPermissionInfo, lc);

	*relid = p->relid;
	*required = p->requiredPerms;
}
#else
#define IDEM_CHECK_PERMS_PARAMS List *rangeTable, bool ereport_on_violation
#define IdemCallCheckPerms(hook) ((hook) (rangeTable, ereport_on_violation))
#define IDEM_CHECK_PERMS_LIST rangeTable

static inline void
IdemCheckPermsEntry(const ListCell *lc, Oid *relid, AclMode *required)
{
	const RangeTblEntry *rte = lfirst_node(RangeTblEntry, lc);

	*relid = rte->rtekind == RTE_RELATION ? rte->relid : InvalidOid;
	*required = rte->requiredPerms;
}
#endif

/*
 * LogLogicalMessage(): PostgreSQL 17 added "flush", to flush a
 * non-transactional message at once; the outbox's messages are
 * transactional, flushed with their commit.
 */
#if PG_VERSION_NUM >= 170000
#define IdemLogLogicalMessage(prefix, message, size, transactional) \
	LogLogicalMessage((prefix), (message), (size), (transactional), false)
#else
#define IdemLogLogicalMessage(prefix, message, size, transactional) \
	LogLogicalMessage((prefix), (message), (size), (transactional))
#endif

/*
 * pg_b64_encode(): PostgreSQL 18 takes the bytes as uint8, earlier
 * releases as char.
 */
#if PG_VERSION_NUM >= 180000
#define IdemB64Encode(src, len, dst, dstlen) \
	pg_b64_encode((const uint8 *) (src), (len), (dst), (dstlen))
#else
#define IdemB64Encode(src, len, dst, dstlen) \
	pg_b64_encode((const char *) (src), (len), (dst), (dstlen))
#endif

/*
 * Updating the one row of a table in place (outbox_storage.c, the xid
 * base).  The minor releases of November 2024 (15.9, 16.5, 17.1; 18 has
 * it from the start) added systable_inplace_update_begin(), _finish() and
 * _cancel(), which find the row and hold its buffer lock from the read to
 * the write, so that a concurrent heap_update() of the row cannot lose
 * the write; the same releases kept heap_inplace_update() for extensions,
 * deprecated.  On older minors of 15 to 17 the row is found by a scan and
 * written with heap_inplace_update(), as everything did before: the row
 * is only ever written in place (never by an UPDATE), by a caller holding
 * its lock, so nothing races with the write there.  IDEM_FORCE_HEAP_INPLACE_UPDATE (a -D of
 * PG_CPPFLAGS) builds the older path on a newer minor, to check that it
 * compiles.
 */
#if PG_VERSION_NUM >= 180000 || \
	(PG_VERSION_NUM >= 170001 && PG_VERSION_NUM < 180000) || \
	(PG_VERSION_NUM >= 160005 && PG_VERSION_NUM < 170000) || \
	(PG_VERSION_NUM >= 150009 && PG_VERSION_NUM < 160000)
#ifndef IDEM_FORCE_HEAP_INPLACE_UPDATE
#define IDEM_HAVE_SYSTABLE_INPLACE_UPDATE 1
#endif
#endif

#ifdef IDEM_HAVE_SYSTABLE_INPLACE_UPDATE
/* *oldtup: a copy of the table's first row (NULL if none) */
static inline void
IdemInplaceUpdateBegin(Relation rel, HeapTuple *oldtup, void **state)
{
	systable_inplace_update_begin(rel, InvalidOid, false, NULL, 0, NULL,
								  oldtup, state);
}
#define IdemInplaceUpdateFinish(state, newtup) \
	systable_inplace_update_finish((state), (newtup))
#define IdemInplaceUpdateCancel(state) systable_inplace_update_cancel(state)
#else
static inline void
IdemInplaceUpdateBegin(Relation rel, HeapTuple *oldtup, void **state)
{
	SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, NULL, 0,
										  NULL);
	HeapTuple	tup = systable_getnext(scan);

	*oldtup = HeapTupleIsValid(tup) ? heap_copytuple(tup) : NULL;
	systable_endscan(scan);
	*state = rel;
}
/* newtup carries the row's t_self (heap_modify_tuple() copies it) */
#define IdemInplaceUpdateFinish(state, newtup) \
	heap_inplace_update((Relation) (state), (newtup))
#define IdemInplaceUpdateCancel(state) ((void) (state))
#endif

/*
 * The module's magic block: PostgreSQL 18 lets it carry
 * the module's name and version, shown by pg_get_loaded_modules().
 */
#ifdef PG_MODULE_MAGIC_EXT
#define IDEM_MODULE_MAGIC \
	PG_MODULE_MAGIC_EXT(.name = "idempotency", .version = IDEM_VERSION)
#else
#define IDEM_MODULE_MAGIC PG_MODULE_MAGIC
#endif

#endif							/* IDEMPOTENCY_COMPAT_H */

/*-------------------------------------------------------------------------
 *
 * filter.h
 *	  Digest filters (filter_pool.c, filter_build.c, filter_hooks.c): for
 *	  each ledger partition, a Bloom filter in shared memory of the (role,
 *	  digest) pairs its rows hold, so that a call for a new key or message
 *	  id skips the index probe of every partition that cannot hold it
 *	  (probe.c).  Only with shared_preload_libraries; sized by
 *	  idempotency.filter_memory (0 turns them off).
 *
 * What a filter promises: once READY, every row of the partition, whatever
 * its state or its writer's fate, has its role and digest in the filter.  A
 * probe that finds its pair absent skips the partition; a false positive
 * (about 1 % at the designed load) costs the probe it would have made
 * anyway.
 *
 * How that holds:
 *	- Rows get into a partition through IdemInsertRow (probe.c) only, which
 *	  adds the pair (IdemFilterAdd) right after the heap and index inserts,
 *	  while the writer still holds the key lock.  A prober of the same key
 *	  holds that lock when it reads the filter, so it sees the bits of every
 *	  row of its key that could be there.  Updates keep the digest (and the
 *	  partition).
 *	- A partition the extension makes gets an empty READY filter when it is
 *	  made (IdemFilterCreated), before anyone else can write into it, if
 *	  it is empty (its heap has no page: whatever the library's DDL fired
 *	  may have written rows into it before it was attached, unseen by the
 *	  hooks below), unless an external write (below) is under way or
 *	  overlaps its making.
 *	- A partition that existed before the server started (or before its
 *	  filter was lost) gets one from the background worker
 *	  (IdemFilterBuildDatabase): the slot is published first, as FILLING,
 *	  so that writers add to it from then on; then the heap is read in full
 *	  (every tuple version, dead or alive: a superset does no harm) and the
 *	  slot becomes READY.  A writer adds its digest after its insert, and
 *	  looks for the slot after the insert too: a writer that found no slot
 *	  had inserted before the slot existed, so the heap scan, which starts
 *	  after, sees its row.
 *	- Rows written by anything else are noticed by an ExecutorStart and a
 *	  ProcessUtility hook, for a ledger's table or any partition the ledger
 *	  caches list, in whatever schema, in a database with the extension:
 *	  INSERT, UPDATE or MERGE (also in a WITH clause) once the executor has
 *	  checked their privileges, and COPY FROM (pg_restore --data-only) once
 *	  COPY has checked its privileges (ExecutorCheckPerms_hook: whatever
 *	  granted them, a table's or a column's privilege, a role's membership
 *	  or superuser), before they write; ATTACH PARTITION to a
 *	  ledger and ALTER COLUMN TYPE of one once they ran, before they
 *	  commit.  Every filter of the database then becomes UNUSABLE, and no
 *	  filter of that database is made READY until the transaction that ran
 *	  the statement has ended (external_busy, per database) nor by a build
 *	  or creation that such a statement overlapped (external_seq); the
 *	  next maintenance round builds them again.  The library's own DDL
 *	  (its ATTACH of a partition it made) is recognised by its query text;
 *	  what it fires (a user's trigger) is looked at like any statement.
 *	  Logical replication applies rows without either hook: a database
 *	  with a subscription gets no filters at all (each build and creation
 *	  looks for one; CREATE and ALTER SUBSCRIPTION count as external
 *	  writes, so that no filter is made before the new subscription is
 *	  visible in pg_subscription).  Tools that write rows from C without
 *	  the executor or COPY (pglogical, pg_bulkload) are not seen: they
 *	  need idempotency.filter_memory = 0 (doc/operations.md).
 *	- Standbys never use or build filters (WAL replay writes rows without
 *	  any of the above); a promoted standby builds them on its first
 *	  rounds.  A crash or restart loses them all; the worker builds them
 *	  again, and partitions without a filter are probed meanwhile.
 *	- Legacy partitions (rows written before 0.3.0, another digest form)
 *	  have no filter.
 *
 * The files: filter_pool.c keeps the pool of pages and slots in shared
 * memory and answers the protocol; filter_build.c makes filters, empty or
 * from a partition's heap; filter_hooks.c notices external writes.
 * filter_internal.h is what they share.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/filter.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_FILTER_H
#define IDEMPOTENCY_FILTER_H

#include "idempotency.h"

/* idempotency.filter_memory, and what _PG_init and the shmem hooks call */
extern int	idem_filter_memory;
extern void IdemFilterDefineSettings(void);
extern void IdemFilterPreloadInit(void);
extern Size IdemFilterShmemSize(void);
extern void IdemFilterShmemInit(void);

/* What the protocol (probe.c) and the storage (storage.c) call */
extern bool IdemFilterRulesOut(Oid relid, int16 lane, Oid role,
							   const pg_uuid_t *digest);
extern void IdemFilterAdd(Oid relid, int16 lane, Oid role,
						  const pg_uuid_t *digest);
extern void IdemFilterCreated(IdemLedger ledger, Oid relid, int16 lane);
extern void IdemFilterForget(Oid relid);
extern void IdemFilterForgetAtCommit(Oid relid);

/*
 * The filter of a ledger's memory (memory.c): one for all the pieces of
 * all lanes of the memory, keyed by the memory table's OID with lane value
 * IDEM_FILTER_MEMORY_LANE (no layout has that many lanes, so that it is
 * never taken for a partition's size), so that a key the memory does not
 * hold costs one test whatever the number of pieces.  It is filled from
 * every piece, then made READY; a piece written later (by maintenance or
 * an import, both under the maintenance lock, as the filling is) adds its
 * pairs with IdemFilterAdd before it commits; a piece dropped leaves its
 * bits, and maintenance fills the filter again.  Those writes go through
 * no executor; a piece written by anything else (a restore of its data, an
 * INSERT) is an external write: the hooks watch the memory tables and
 * their pieces as they watch the ledgers.
 */
#define IDEM_FILTER_MEMORY_LANE		((int16) 0xFF7F)

/*
 * Without shared filters (the library not preloaded, or filter_memory 0),
 * a backend keeps its own filter of the memory (memory.c), keyed like the
 * shared ones: IdemFilterKeyedItem gives what it holds of a pair, false
 * when there is no secret to key it with.
 */
extern bool IdemFiltersShared(void);
extern int64 IdemFilterPairs(Oid relid);
extern bool IdemFilterKeyedItem(Oid role, const pg_uuid_t *digest,
								uint64 *secret_id, uint64 *item);
typedef struct IdemFilterFill
{
	int			slot;			/* -1: no filter */
	uint64		incarnation;
	uint64		seq;
	uint64		secret_id;
} IdemFilterFill;
extern bool IdemFilterFillBegin(IdemLedger ledger, Oid relid, int16 lane,
								uint64 n, IdemFilterFill *fill);
extern void IdemFilterFillAdd(IdemFilterFill *fill, Oid role,
							  const pg_uuid_t *digest);
extern bool IdemFilterFillEnd(IdemFilterFill *fill);
extern bool IdemFilterIsReady(Oid relid);

/* The library's own DDL, which the hooks let through (privilege.c) */
extern void IdemFilterOwnSql(const char *sql);

/* Building and freeing them (maintain.c, worker.c) */
extern int	IdemFilterBuildDatabase(void);
extern void IdemFilterForgetDatabase(void);
extern void IdemFilterForgetDatabases(const Oid *dbs, int ndbs,
									  TimestampTz listed_at);

#endif							/* IDEMPOTENCY_FILTER_H */

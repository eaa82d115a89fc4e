/*-------------------------------------------------------------------------
 *
 * relation_checks.c
 *	  Checks PostgreSQL's own commands make on a relation, made by the code
 *	  that does their work without them: the extension's direct writes of
 *	  rows (the executor's replica identity check), and maintenance's drops
 *	  (whether DROP TABLE would find the table in use by this session).
 *
 * Rows of the ledgers (probe.c, relocate.c) and of the keyed tables
 * (keyed_rows.c: stream positions and sequences, the outbox's relay
 * positions) are updated and deleted with simple_heap_update and
 * simple_heap_delete, not by the executor, which would first refuse an
 * UPDATE or a DELETE of a table that publishes that kind of change
 * without a replica identity (CheckCmdReplicaIdentity, SQLSTATE 55000):
 * no subscriber could apply it, and its subscription would stop.
 * IdemCheckDirectWrite makes that check before each such write, so that
 * a direct write is refused exactly where the SQL statement would be.
 *
 * Maintenance drops the ledgers' ended partitions (storage.c), the pieces
 * of the key memory it no longer needs (memory.c) and the outbox's old
 * segments (outbox_maintain.c).  DROP TABLE refuses a table that this very
 * session still uses (CheckTableNotInUse, SQLSTATE 55006): one read by the
 * statement that called idem_maintain() (SELECT idem_maintain(), count(*)
 * FROM idempotency.outbox), by a cursor of the transaction still open, or
 * with after-trigger events pending.  Locks do not show it: the session's
 * own locks never conflict with the ACCESS EXCLUSIVE lock the drop takes.
 * IdemRelationInUseHere asks the question CheckTableNotInUse asks, without
 * raising, and maintenance leaves such a table for its next run.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/relation_checks.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "relation_checks.h"

#include "access/relation.h"
#include "catalog/pg_class.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "nodes/pg_list.h"
#include "utils/rel.h"
#include "utils/relcache.h"

static bool IdemRelationOpenElsewhereHere(Oid relid, bool *locked);

/*
 * IdemRelationOpenElsewhereHere: is relation "relid" open in this session
 * by anything but this call (a scan of a running statement, a cursor), or
 * has it after-trigger events pending?  CheckTableNotInUse's two tests.
 * Sets *locked to whether this session holds a lock on it: a relation the
 * session has open is one it has locked (every open takes a lock, kept to
 * the end of the transaction), and one it has not locked is not looked at
 * (opened without a lock, its entry could be read while another session
 * changes it).
 */
static bool
IdemRelationOpenElsewhereHere(Oid relid, bool *locked)
{
	Relation	rel;
	bool		in_use;

	*locked = IdemRelationOidLockedByMe(relid, AccessShareLock, true);
	if (!*locked)
		return false;
	rel = try_relation_open(relid, NoLock);
	if (rel == NULL)
		return false;
	/* this open is one reference; a nailed entry has one more of its own */
	in_use = rel->rd_refcnt != (rel->rd_isnailed ? 2 : 1);
	if (!in_use &&
		rel->rd_rel->relkind != RELKIND_INDEX &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_INDEX)
		in_use = AfterTriggerPendingOnRel(relid);
	relation_close(rel, NoLock);
	return in_use;
}

/*
 * IdemRelationInUseHere: would DROP TABLE refuse table "relid" because this
 * session uses it (CheckTableNotInUse, 55006)?  The table, its indexes and
 * its TOAST table (with its index) are asked about, as the DROP checks each
 * of them when it drops it.  False for a table that is gone.
 */
bool
IdemRelationInUseHere(Oid relid)
{
	Relation	rel;
	bool		locked;
	List	   *indexes;
	ListCell   *lc;
	Oid			toast;
	bool		in_use;

	if (IdemRelationOpenElsewhereHere(relid, &locked))
		return true;
	if (!locked)
		return false;

	rel = try_relation_open(relid, NoLock);
	if (rel == NULL)
		return false;
	indexes = RelationGetIndexList(rel);
	toast = rel->rd_rel->reltoastrelid;
	relation_close(rel, NoLock);

	in_use = false;
	foreach(lc, indexes)
	{
		if (IdemRelationOpenElsewhereHere(lfirst_oid(lc), &locked))
		{
			in_use = true;
			break;
		}
	}
	list_free(indexes);
	if (!in_use && OidIsValid(toast))
		in_use = IdemRelationInUseHere(toast);
	return in_use;
}

/*
 * IdemCheckDirectWrite: the executor's check before an UPDATE or a DELETE
 * of rows of "rel" (CMD_UPDATE, CMD_DELETE; an insert needs none), for a
 * write made with the heap functions: refused with 55000, as the statement
 * would be, if a publication of the table (or of a table it is a partition
 * of; FOR ALL TABLES included) publishes that kind of change and the table
 * has no replica identity (or the publication's row filter or column list
 * needs columns the identity lacks).  The publications are read once per
 * relcache entry, and kept with it until an invalidation.
 */
void
IdemCheckDirectWrite(Relation rel, CmdType cmd)
{
	CheckCmdReplicaIdentity(rel, cmd);
}

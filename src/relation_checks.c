/*-------------------------------------------------------------------------
 *
 * relation_checks.c
 *	  Checks PostgreSQL's own commands make on a relation, made ahead by
 *	  the code that drops the extension's tables, so that a table those
 *	  commands would refuse is left alone instead of failing the whole run.
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

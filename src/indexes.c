/*-------------------------------------------------------------------------
 *
 * indexes.c
 *	  The indexes of a ledger partition: which one probes may use, and
 *	  keeping every one of them complete when a row is written.
 *
 * The extension makes one index per partition, a btree on (role, digest),
 * and probes it with both: a probe never reads another role's entry of the
 * same digest (doc/security.md, "Who holds what").  Partitions made before
 * 0.4.0 had a btree on (digest) alone, which probes still use (filtering
 * the role on the row) wherever maintenance has not yet rebuilt them (see
 * IdemUpgradeLedgerIndex).  But a partition's indexes are the DBA's too:
 * REINDEX CONCURRENTLY builds a copy beside it and swaps it in, and a DBA
 * may add an index of their own.  So nothing about indexes is cached across
 * calls:
 * every call takes the partition's index list from the relcache (which
 * PostgreSQL keeps true under its locks), and
 *	- probes use an index only if it is provably a complete digest btree:
 *	  valid, live, key columns (role, digest) or (digest) and nothing else,
 *	  no expression, no predicate, the oid and uuid btree operator
 *	  families; a (role, digest) one if the partition has one;
 *	- writes add entries to every index that is ready for inserts, as
 *	  PostgreSQL's own executor does, so that an index under construction
 *	  (CREATE INDEX CONCURRENTLY, REINDEX CONCURRENTLY) or one a DBA added
 *	  stays complete.
 *
 * Indexes that take their entries straight from columns are written here
 * directly, and so are partial ones whose predicate is "column IS NOT
 * NULL" (the key ledger's recovery index, keys_recover_idx, is one: most
 * rows have no entry in it), and unique btrees checked at once (not
 * deferrable: btree checks the entry's uniqueness as it inserts it, as for
 * the executor); when a partition has one with an expression, another
 * predicate, a deferrable uniqueness or an exclusion constraint, the
 * executor's own ExecInsertIndexTuples() does the work for all of them.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/indexes.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "protocol.h"
#include "storage.h"

#include "access/htup_details.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"

/* What IdemDigestIndexKindOf says of an index */
typedef enum IdemDigestIndexKind
{
	IDEM_DIGEST_INDEX_NONE = 0, /* not one probes can use */
	IDEM_DIGEST_INDEX_PLAIN,	/* on (digest): partitions made before 0.4.0 */
	IDEM_DIGEST_INDEX_ROLE,		/* on (role, digest) */
	IDEM_DIGEST_INDEX_IDENTITY	/* on (role, digest, lane, expires_at,
								 * tenant): a distributed ledger's replica
								 * identity, which has no other (citus.c) */
} IdemDigestIndexKind;

static IdemDigestIndexKind IdemDigestIndexKindOf(Relation index);
static bool IdemIsSimpleIndex(Relation index, int heap_natts);
static bool IdemIsLedgerIdentityIndex(Relation index, int heap_natts);
static AttrNumber IdemNotNullPredicateAttr(Relation index);
static IndexInfo *IdemIndexInfo(IdemOpenPartition *op, int i);
static void IdemInsertIndexEntriesDirect(IdemOpenPartition *op,
										 HeapTuple tuple, bool only_summarizing);
static void IdemInsertIndexEntriesExecutor(IdemOpenPartition *op,
										   HeapTuple tuple,
										   bool only_summarizing);

/*
 * IdemOpenPartitionIndexes lists the indexes of the open partition and
 * opens, in the given lock mode (the partition itself must be locked
 * already, so that no index can be dropped meanwhile), those it needs to
 * find the digest index probes use: the first, in OID order, that is
 * provably a (role, digest) one, else the first (digest) one.  That is
 * usually the first index (the extension makes it with the partition); the
 * others (the key ledger's recovery index, a DBA's) are opened by
 * IdemOpenAllIndexes when a write needs their entries, so that a probe of
 * a partition it does not write to pays for one index only (a partition
 * of the older layout has all of them opened here, to look for a
 * (role, digest) one).  Without find_digest (a partition only written: a row
 * fetched by its TID and updated, often with no index entry to add, or
 * a new row's target), none is opened here.
 */
void
IdemOpenPartitionIndexes(IdemOpenPartition *op, LOCKMODE lockmode,
						 bool find_digest)
{
	List	   *indexoids = RelationGetIndexList(op->heap);
	ListCell   *lc;
	int			n = list_length(indexoids);

	op->index = NULL;
	op->index_by_role = false;
	op->nindexes = n;
	op->nopened = 0;
	op->all_open = false;
	op->index_lockmode = lockmode;
	op->cxt = CurrentMemoryContext;
	op->simple = true;
	if (n <= IDEM_INLINE_INDEXES)
	{
		op->index_oids = op->inline_oids;
		op->indexes = op->inline_indexes;
		op->infos = op->inline_infos;
	}
	else
	{
		op->index_oids = palloc(n * sizeof(Oid));
		op->indexes = palloc(n * sizeof(Relation));
		op->infos = palloc(n * sizeof(IndexInfo *));
	}
	memset(op->infos, 0, Max(n, IDEM_INLINE_INDEXES) * sizeof(IndexInfo *));
	n = 0;
	foreach(lc, indexoids)
		op->index_oids[n++] = lfirst_oid(lc);
	list_free(indexoids);

	/* a partition only written (not probed) opens its indexes when it must */
	if (!find_digest)
		return;

	while (!op->index_by_role && op->nopened < op->nindexes)
	{
		Relation	index = index_open(op->index_oids[op->nopened], lockmode);
		IdemDigestIndexKind kind = IdemDigestIndexKindOf(index);

		op->indexes[op->nopened++] = index;
		if (kind == IDEM_DIGEST_INDEX_ROLE || kind == IDEM_DIGEST_INDEX_IDENTITY)
		{
			/* probed by its first two columns, as a (role, digest) one */
			op->index = index;
			op->index_by_role = true;
		}
		else if (kind == IDEM_DIGEST_INDEX_PLAIN && op->index == NULL)
			op->index = index;
	}

	if (op->index == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("partition \"%s.%s\" has no usable digest index",
						IDEM_SCHEMA_NAME, RelationGetRelationName(op->heap)),
				 errdetail("The extension needs a valid btree index on columns \"role\" and \"digest\", in that order, without predicate or expression."),
				 errhint("Recreate it with CREATE INDEX ON %s.%s (role, digest), or REINDEX TABLE %s.%s.",
						 IDEM_SCHEMA_NAME,
						 quote_identifier(RelationGetRelationName(op->heap)),
						 IDEM_SCHEMA_NAME,
						 quote_identifier(RelationGetRelationName(op->heap)))));
}

/*
 * IdemOpenAllIndexes opens the indexes of the open partition that
 * IdemOpenPartitionIndexes left closed, in the same lock mode, and notes
 * whether every index takes plain column values.  The list is the one
 * read under the partition's lock: no index of it can have been dropped.
 */
void
IdemOpenAllIndexes(IdemOpenPartition *op)
{
	int			i;

	if (op->all_open)
		return;
	while (op->nopened < op->nindexes)
	{
		op->indexes[op->nopened] = index_open(op->index_oids[op->nopened],
											  op->index_lockmode);
		op->nopened++;
	}
	op->simple = true;
	for (i = 0; i < op->nindexes; i++)
		if (!IdemIsSimpleIndex(op->indexes[i],
							   RelationGetDescr(op->heap)->natts))
			op->simple = false;
	op->all_open = true;
}

/*
 * IdemClosePartitionIndexes closes the indexes IdemOpenPartitionIndexes
 * opened, keeping the locks, after letting each access method release what
 * it kept across this partition's inserts.
 */
void
IdemClosePartitionIndexes(IdemOpenPartition *op)
{
	int			i;

	for (i = 0; i < op->nopened; i++)
	{
		if (op->infos[i] != NULL)
		{
			IdemIndexInsertCleanup(op->indexes[i], op->infos[i]);
			pfree(op->infos[i]);
		}
		index_close(op->indexes[i], NoLock);
	}
	if (op->indexes != op->inline_indexes)
	{
		pfree(op->index_oids);
		pfree(op->indexes);
		pfree(op->infos);
	}
	op->index_oids = NULL;
	op->indexes = NULL;
	op->infos = NULL;
	op->nindexes = 0;
	op->nopened = 0;
	op->all_open = false;
	op->index = NULL;
	op->index_by_role = false;
}

/*
 * IdemInsertIndexEntries adds the index entries a row version just written
 * to the partition (at tuple->t_self) needs: in every index ready for
 * inserts, only in summarizing ones, or none (see IdemIndexUpdate).
 */
void
IdemInsertIndexEntries(IdemOpenPartition *op, HeapTuple tuple,
					   IdemIndexUpdate which)
{
	if (which == IDEM_INDEX_UPDATE_NONE)
		return;
	IdemOpenAllIndexes(op);
	if (op->simple)
		IdemInsertIndexEntriesDirect(op, tuple,
									 which == IDEM_INDEX_UPDATE_SUMMARIZING);
	else
		IdemInsertIndexEntriesExecutor(op, tuple,
									   which == IDEM_INDEX_UPDATE_SUMMARIZING);
}

/*
 * IdemDigestIndexKindOf: is this index one that finds every row of a
 * digest with a btree probe, by the oid equality of its role and the uuid
 * equality of its digest (ROLE, or IDENTITY: the same first two columns,
 * then lane, expires_at and tenant) or by the latter alone (PLAIN)?
 */
static IdemDigestIndexKind
IdemDigestIndexKindOf(Relation index)
{
	static Oid	uuid_btree_family = InvalidOid;
	Form_pg_index form = index->rd_index;

	if (!form->indisvalid || !form->indisready || !form->indislive ||
		form->indnatts != form->indnkeyatts ||
		index->rd_rel->relam != BTREE_AM_OID ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) ||
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		return IDEM_DIGEST_INDEX_NONE;

	if (!OidIsValid(uuid_btree_family))
		uuid_btree_family = get_opclass_family(GetDefaultOpClass(UUIDOID,
																 BTREE_AM_OID));
	if (form->indnatts == 2 &&
		form->indkey.values[0] == Anum_ledger_role &&
		form->indkey.values[1] == Anum_ledger_digest &&
		index->rd_opfamily[0] == OID_BTREE_FAM_OID &&
		index->rd_opfamily[1] == uuid_btree_family)
		return IDEM_DIGEST_INDEX_ROLE;
	if (form->indnatts == 5 && form->indisunique &&
		form->indkey.values[0] == Anum_ledger_role &&
		form->indkey.values[1] == Anum_ledger_digest &&
		form->indkey.values[2] == Anum_ledger_lane &&
		form->indkey.values[3] == Anum_ledger_expires_at &&
		(form->indkey.values[4] == IdemTenantAttnum(IDEM_LEDGER_KEYS) ||
		 form->indkey.values[4] == IdemTenantAttnum(IDEM_LEDGER_MESSAGES)) &&
		index->rd_opfamily[0] == OID_BTREE_FAM_OID &&
		index->rd_opfamily[1] == uuid_btree_family)
		return IDEM_DIGEST_INDEX_IDENTITY;
	if (form->indnatts == 1 &&
		form->indkey.values[0] == Anum_ledger_digest &&
		index->rd_opfamily[0] == uuid_btree_family)
		return IDEM_DIGEST_INDEX_PLAIN;
	return IDEM_DIGEST_INDEX_NONE;
}

/*
 * IdemIsSimpleIndex: can this index's entries be made from the row's
 * columns alone, with no exclusion check, no uniqueness check but
 * btree's own at insertion (UNIQUE_CHECK_YES: it waits for a transaction
 * that wrote the same key, and raises 23505 if that one commits, as the
 * executor's insert of a non-deferrable unique index does), and no
 * predicate but a column's being not null?  The replica identity index of a
 * partition of a ledger distributed by Citus is unique, but needs no check:
 * it is on (role, digest, lane, expires_at, tenant), and the protocol keeps
 * one live row per key under the key lock (doc/scale-out.md, "Replica
 * identity"), as it does for the (role, digest) index.
 */
static bool
IdemIsSimpleIndex(Relation index, int heap_natts)
{
	Form_pg_index form = index->rd_index;

	return (!form->indisunique || IdemIsLedgerIdentityIndex(index, heap_natts) ||
			(form->indimmediate && index->rd_rel->relam == BTREE_AM_OID)) &&
		!form->indisexclusion &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
		(heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) ||
		 IdemNotNullPredicateAttr(index) != InvalidAttrNumber);
}

/*
 * IdemIsLedgerIdentityIndex: is this the replica identity index that
 * idempotency.citus_distribute() gives each partition of a distributed
 * ledger, a btree on (role, digest, lane, expires_at, tenant), tenant being
 * the last of the table's "natts" columns?
 */
static bool
IdemIsLedgerIdentityIndex(Relation index, int natts)
{
	Form_pg_index form = index->rd_index;

	return form->indisreplident && !form->indisexclusion &&
		form->indnatts == 5 && form->indnkeyatts == 5 &&
		index->rd_rel->relam == BTREE_AM_OID &&
		form->indkey.values[0] == Anum_ledger_role &&
		form->indkey.values[1] == Anum_ledger_digest &&
		form->indkey.values[2] == Anum_ledger_lane &&
		form->indkey.values[3] == Anum_ledger_expires_at &&
		(natts == IdemTenantAttnum(IDEM_LEDGER_KEYS) ||
		 natts == IdemTenantAttnum(IDEM_LEDGER_MESSAGES)) &&
		form->indkey.values[4] == natts;
}

/*
 * IdemNotNullPredicateAttr returns the column of a partial index whose
 * predicate is "column IS NOT NULL", or InvalidAttrNumber if the index has
 * another predicate or none.
 */
static AttrNumber
IdemNotNullPredicateAttr(Relation index)
{
	List	   *pred;
	NullTest   *test;
	AttrNumber	attno = InvalidAttrNumber;

	if (heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		return InvalidAttrNumber;

	/*
	 * The relcache's own copy, read once and kept with the index (implicit
	 * AND); RelationGetIndexPredicate() fills it, and returns a copy.
	 */
	if (index->rd_indpred == NIL)
		(void) RelationGetIndexPredicate(index);
	pred = index->rd_indpred;
	if (list_length(pred) == 1 && IsA(linitial(pred), NullTest))
	{
		test = (NullTest *) linitial(pred);
		if (test->nulltesttype == IS_NOT_NULL && !test->argisrow &&
			IsA(test->arg, Var) && ((Var *) test->arg)->varattno > 0)
			attno = ((Var *) test->arg)->varattno;
	}
	return attno;
}

/*
 * IdemRecoverIndex returns the open partition's index of lapsable claims
 * with a kept request (keys_recover_idx on the key ledger: a btree on
 * (role, recover_at) WHERE recover_at IS NOT NULL), or NULL if it has no
 * valid one.
 */
Relation
IdemRecoverIndex(IdemOpenPartition *op)
{
	static Oid	timestamptz_btree_family = InvalidOid;
	int			i;

	if (!OidIsValid(timestamptz_btree_family))
		timestamptz_btree_family =
			get_opclass_family(GetDefaultOpClass(TIMESTAMPTZOID, BTREE_AM_OID));
	IdemOpenAllIndexes(op);
	for (i = 0; i < op->nindexes; i++)
	{
		Relation	index = op->indexes[i];
		Form_pg_index form = index->rd_index;

		if (form->indisvalid && form->indisready && form->indislive &&
			form->indnatts == 2 &&
			form->indkey.values[0] == Anum_ledger_role &&
			form->indkey.values[1] == Anum_keys_recover_at &&
			index->rd_rel->relam == BTREE_AM_OID &&
			index->rd_opfamily[0] == OID_BTREE_FAM_OID &&
			index->rd_opfamily[1] == timestamptz_btree_family &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
			IdemNotNullPredicateAttr(index) == Anum_keys_recover_at)
			return index;
	}
	return NULL;
}

/*
 * IdemIndexInfo returns the IndexInfo of index "i" of the open partition.
 * A digest btree's is the same for every partition (of each kind of digest
 * index) and btree keeps no state in it, so it is built once per backend
 * for each kind; any other is built on the
 * partition's first insert and kept with it until IdemClosePartitionIndexes,
 * which lets the access method release the state it keeps there.
 */
static IndexInfo *
IdemIndexInfo(IdemOpenPartition *op, int i)
{
	/* one per kind of digest index, PLAIN and ROLE */
	static IndexInfo *digest_info[2] = {NULL, NULL};
	Relation	index = op->indexes[i];
	IdemDigestIndexKind kind = IdemDigestIndexKindOf(index);

	if (kind == IDEM_DIGEST_INDEX_NONE || kind == IDEM_DIGEST_INDEX_IDENTITY)
	{
		/*
		 * Built where the partition was opened, not in the caller's memory:
		 * a partition a batch keeps open (IdemOpenCache) outlives the memory
		 * of the id whose insert built it, and whether an index counts as a
		 * digest index can change while it is open (a concurrent DROP INDEX
		 * marks it invalid first).
		 */
		if (op->infos[i] == NULL)
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(op->cxt);

			op->infos[i] = BuildIndexInfo(index);
			MemoryContextSwitchTo(oldcxt);
		}
		return op->infos[i];
	}
	if (digest_info[kind - 1] == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

		digest_info[kind - 1] = BuildIndexInfo(index);
		MemoryContextSwitchTo(oldcxt);
	}
	return digest_info[kind - 1];
}

/*
 * IdemInsertIndexEntriesDirect inserts the entries of a row version into
 * indexes whose entries are plain columns of the row.
 */
static void
IdemInsertIndexEntriesDirect(IdemOpenPartition *op, HeapTuple tuple,
							 bool only_summarizing)
{
	TupleDesc	tupdesc = RelationGetDescr(op->heap);
	int			i;

	for (i = 0; i < op->nindexes; i++)
	{
		Relation	index = op->indexes[i];
		Form_pg_index form = index->rd_index;
		Datum		values[INDEX_MAX_KEYS];
		bool		isnull[INDEX_MAX_KEYS];
		AttrNumber	notnull;
		int			k;

		if (!form->indisready)
			continue;			/* not built yet: its build will see the row */
		if (only_summarizing && !IdemIndexIsSummarizing(index))
			continue;
		notnull = IdemNotNullPredicateAttr(index);
		if (notnull != InvalidAttrNumber &&
			heap_attisnull(tuple, notnull, tupdesc))
			continue;			/* not in this partial index */
		for (k = 0; k < form->indnatts; k++)
			values[k] = heap_getattr(tuple, form->indkey.values[k], tupdesc,
									 &isnull[k]);
		(void) index_insert(index, values, isnull, &tuple->t_self, op->heap,
							form->indisunique &&
							!IdemIsLedgerIdentityIndex(index, tupdesc->natts) ?
							UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
							false, IdemIndexInfo(op, i));
	}
}

/*
 * IdemInsertIndexEntriesExecutor has the executor insert the entries of a
 * row version into every index of the partition: expressions, predicates
 * and unique or exclusion checks are its business.
 */
static void
IdemInsertIndexEntriesExecutor(IdemOpenPartition *op, HeapTuple tuple,
							   bool only_summarizing)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri = makeNode(ResultRelInfo);
	TupleTableSlot *slot;
	List	   *recheck;

	InitResultRelInfo(rri, op->heap, 0, NULL, 0);
	ExecOpenIndices(rri, false);
	slot = MakeSingleTupleTableSlot(RelationGetDescr(op->heap),
									&TTSOpsHeapTuple);
	ExecStoreHeapTuple(tuple, slot, false);

	recheck = IdemExecInsertIndexTuples(rri, slot, estate, only_summarizing);
	if (recheck != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("partition \"%s.%s\" has a deferrable unique or exclusion constraint",
						IDEM_SCHEMA_NAME, RelationGetRelationName(op->heap)),
				 errdetail("Ledger partitions do not support deferred constraint checks."),
				 errhint("Drop the constraint.")));

	ExecDropSingleTupleTableSlot(slot);
	ExecCloseIndices(rri);
	FreeExecutorState(estate);
}

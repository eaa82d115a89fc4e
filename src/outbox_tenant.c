/*-------------------------------------------------------------------------
 *
 * outbox_tenant.c
 *	  The outbox of a tenant, distributed by Citus: idem_publish(...,
 *	  tenant) on the node holding the tenant's shard, and
 *	  idem_outbox_next(), idem_outbox_ack() and idem_outbox_dead_letter()
 *	  with a tenant argument on the coordinator, so that Citus' own shard
 *	  operations (rebalance, logical move, split, tenant isolation) carry
 *	  a tenant's unrelayed events with its rows (issue 37; doc/scale-out.md,
 *	  "The outbox of a tenant").
 *
 * idempotency.citus_distribute() makes, distributed by the tenant and
 * co-located with the application's tables:
 *
 *	- idempotency.tenant_outbox_heads (role, topic, tenant, last_seq): a
 *	  publish increments its (role, topic, tenant)'s row (or makes it with
 *	  1) and keeps the row locked to the end of its transaction.  So the
 *	  events of one (role, topic, tenant) are numbered 1, 2, 3... in the
 *	  order their transactions commit: a second publisher waits for the
 *	  first's commit or rollback, and a rollback gives its number back.  A
 *	  reader that sees number N therefore sees every number below N (or
 *	  their loss, below): no snapshot windows, unlike the node's own
 *	  outbox (outbox_relay.c), whose event numbers are not in commit
 *	  order.  The cost: the publishers of one (role, topic, tenant)
 *	  serialize from their publish to their commit.
 *	- idempotency.tenant_events, one row per event with its number,
 *	  partitioned by the time of publication (the coordinator's maintenance
 *	  makes the partitions ahead and drops them: never a DELETE).
 *
 * and, on the coordinator only, the relays' positions
 * (idempotency.tenant_relays: batch, generation; tenant_relay_positions:
 * per relay and tenant, the acknowledged number, the current batch's end,
 * a loss not yet reported and the end of one acknowledged) with the SQL functions that read and
 * write them (idempotency.tenant_outbox_next, _ack, _dead_letter,
 * _maintain); a dead letter goes with the node's own relays' dead letters
 * (idempotency.outbox_dead_letters of the coordinator).  The
 * numbers travel with the events and heads, so a move changes nothing
 * for a relay.
 *
 * A publish routes like the other tenant calls (citus.c: the shard's
 * metadata lock, 40001 on a worker the tenant left, 0A000 on a
 * coordinator that does not hold it) and writes the local shards of both
 * tables directly, as the stream positions and the node's own outbox are
 * written (no executor, no SPI):
 *
 *	- the head row is read by its primary key and locked FOR UPDATE
 *	  (keyed_rows.c: a row another publisher holds is waited for, and its
 *	  newest version read once that one commits; under a transaction
 *	  snapshot, a head committed since the snapshot is a serialization
 *	  failure, as for the statement's ON CONFLICT DO UPDATE), and updated
 *	  (HOT).  A (role, topic, tenant)'s first publish, which finds no row,
 *	  inserts it with a statement (INSERT ... ON CONFLICT DO UPDATE): it
 *	  waits for another first publisher, where a direct insert would fail
 *	  on the primary key;
 *	- the event goes into the partition of the events' shard whose range
 *	  holds its time of publication, found in the bounds the relcache keeps
 *	  with the shard (invalidated by any partition made or dropped), with
 *	  its primary key's entry (uniqueness checked).  Where the shard or
 *	  the partition is not as citus_distribute() and maintenance make them
 *	  (no partition for the time, a DBA's trigger, row security, CHECK
 *	  constraint or column), the event is inserted with a statement, which
 *	  does whatever SQL does there (the error of a missing partition
 *	  included).
 *
 * The statements are run by the storage owner (SPI, names of the shards
 * qualified, prepared once per shard and backend).  The relay functions run the SQL
 * functions as the storage owner with the calling role's OID: a role
 * reads and moves only its own relays and events.  A relay call on a
 * worker, which has the distributed tables but not the relays', is
 * refused (0A000).  With idempotency.outbox_logical, a publish also writes
 * the event as a logical decoding message (outbox_publish.c), with its
 * tenant and number.  Without the tenant tables, the tenant is not used
 * and the calls are the ones without it.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_tenant.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "citus.h"
#include "compat.h"
#include "keyed_rows.h"
#include "outbox.h"
#include "privilege.h"
#include "role_ref.h"
#include "protocol.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "common/int.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "partitioning/partbounds.h"
#include "partitioning/partdesc.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/partcache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

/* the columns of idem_outbox_next(..., tenant)'s result */
#define Natts_tenant_next	9

/*
 * idempotency.tenant_outbox_heads (role, topic, tenant, last_seq,
 * updated_at), its primary key the first three: the local shard of a
 * tenant's head is read and written directly (keyed_rows.h), opened by its
 * OID.  The tenant column's type is the tenant tables' distribution
 * column's, set at the routing (IdemTenantHeadsTable).
 */
#define Natts_tenant_heads	5
#define HEADS_TENANT		2
#define HEADS_LAST_SEQ		3
#define HEADS_UPDATED_AT	4

static IdemKeyedTable heads_table = {
	"tenant_outbox_heads", Natts_tenant_heads, 3,
	{OIDOID, TEXTOID, InvalidOid},
	{REGROLEOID, TEXTOID, InvalidOid, INT8OID, TIMESTAMPTZOID},
	InvalidOid
};

/*
 * The columns of idempotency.tenant_events (role, topic, tenant, seq,
 * event_id, key, payload, payload_raw, headers, published_at), whose
 * partitions an event is inserted into directly (IdemTenantEventWrite);
 * the tenant's type is set at the routing.
 */
#define Natts_tenant_events	10
#define EVENTS_TENANT		2
#define EVENTS_PUBLISHED_AT	9

static Oid	events_atttypes[Natts_tenant_events] = {
	REGROLEOID, TEXTOID, InvalidOid, INT8OID, UUIDOID, TEXTOID, JSONBOID,
	BYTEAOID, JSONBOID, TIMESTAMPTZOID
};

/*
 * A publish's statement on one local shard, prepared once per backend
 * (SPI_keepplan): the shard's table by OID, with the name the statement
 * names it by (a new table that got the OID of a dropped one is prepared
 * again).  The plan cache replans it when the table changes.
 */
typedef struct IdemShardPlan
{
	Oid			relid;			/* hash key */
	char		relname[NAMEDATALEN];
	SPIPlanPtr	plan;
} IdemShardPlan;

static HTAB *shard_plans = NULL;

static Oid	IdemTenantRelation(const char *relname);
static SPIPlanPtr IdemShardPlanFor(Oid relid, const char *format, int nargs,
								   Oid *argtypes);
static IdemKeyedTable *IdemTenantHeadsTable(Oid tenant_type);
static bool IdemTenantHeadNext(Oid heads, Oid role, text *topic,
							   Oid tenant_type, Datum tenant,
							   TimestampTz now, int64 *seq);
static Oid	IdemTenantEventPartition(Oid events, Datum published_at);
static bool IdemTenantEventWrite(Oid events, Datum *values, bool *nulls);

/* the OID of idempotency.<relname>, or InvalidOid */
static Oid
IdemTenantRelation(const char *relname)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);

	return OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;
}

/*
 * IdemShardPlanFor returns the kept plan of "format" (one %s: the shard's
 * qualified name) on shard table relid, preparing it on first use, in the
 * caller's SPI connection.
 */
static SPIPlanPtr
IdemShardPlanFor(Oid relid, const char *format, int nargs, Oid *argtypes)
{
	IdemShardPlan *entry;
	bool		found;
	char	   *relname = get_rel_name(relid);
	StringInfoData sql;
	SPIPlanPtr	plan;

	if (shard_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(IdemShardPlan);
		ctl.hcxt = TopMemoryContext;
		shard_plans = hash_create("idempotency tenant outbox plans", 32, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	if (relname == NULL)
		elog(ERROR, "cache lookup failed for relation %u", relid);
	entry = hash_search(shard_plans, &relid, HASH_ENTER, &found);
	if (found && entry->plan != NULL && strcmp(entry->relname, relname) == 0)
		return entry->plan;
	if (found && entry->plan != NULL)
		SPI_freeplan(entry->plan);
	entry->plan = NULL;
	strlcpy(entry->relname, relname, NAMEDATALEN);

	initStringInfo(&sql);
	appendStringInfo(&sql, format,
					 quote_qualified_identifier(IDEM_SCHEMA_NAME, relname));
	plan = SPI_prepare(sql.data, nargs, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql.data,
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	pfree(sql.data);
	entry->plan = plan;
	return plan;
}

/*
 * IdemTenantHeadsTable returns the keyed table of the heads' shards with
 * the tenant column of type tenant_type (the routing's): its key column
 * compared with the type's default btree opclass, as the primary key was
 * made with.
 */
static IdemKeyedTable *
IdemTenantHeadsTable(Oid tenant_type)
{
	if (heads_table.atttypes[HEADS_TENANT] != tenant_type)
	{
		Oid			opclass = GetDefaultOpClass(tenant_type, BTREE_AM_OID);

		if (!OidIsValid(opclass))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the tenant column of \"%s.%s\" has no btree operator class",
							IDEM_SCHEMA_NAME, "tenant_outbox_heads")));
		heads_table.atttypes[HEADS_TENANT] = tenant_type;
		heads_table.keytypes[HEADS_TENANT] = get_opclass_input_type(opclass);
		heads_table.checked = false;
	}
	return &heads_table;
}

/*
 * IdemTenantHeadNext takes the next number of (role, topic, tenant) from
 * its head row in shard "heads", read and updated directly
 * (keyed_rows.h): the row, locked FOR UPDATE to the end of the
 * transaction, gets last_seq + 1 and updated_at "now".  Another
 * publisher's lock is waited for, and its committed row followed to its
 * newest version (READ COMMITTED; 40001 under a transaction snapshot, as
 * the statement's ON CONFLICT DO UPDATE fails, also for a row committed
 * since the snapshot).  False, with nothing written, if there is no row
 * yet: the caller inserts it with the statement, whose ON CONFLICT waits
 * for another first publisher, which a direct insert would not.  False too
 * if the shard has a DBA's trigger, row security or CHECK constraint: the
 * statement fires, applies and checks them at every publish, as it does
 * for the event (IdemTenantEventWrite), not only at a head's first one.
 */
static bool
IdemTenantHeadNext(Oid heads, Oid role, text *topic, Oid tenant_type,
				   Datum tenant, TimestampTz now, int64 *seq)
{
	IdemKeyedRows rows;
	IdemKeyedRow row;
	Datum		key[3];
	Datum		values[Natts_tenant_heads];
	bool		nulls[Natts_tenant_heads] = {false};
	int64		last;

	key[0] = ObjectIdGetDatum(role);
	key[1] = PointerGetDatum(topic);
	key[2] = tenant;
	IdemKeyedOpenRelid(&rows, IdemTenantHeadsTable(tenant_type), heads);
	if (rows.heap->trigdesc != NULL || rows.heap->rd_rel->relrowsecurity ||
		(RelationGetDescr(rows.heap)->constr != NULL &&
		 RelationGetDescr(rows.heap)->constr->num_check > 0) ||
		!IdemKeyedFetch(&rows, key, &row))
	{
		IdemKeyedClose(&rows);
		return false;
	}

	/*
	 * ON CONFLICT DO UPDATE's check (ExecCheckTupleVisible): under a
	 * transaction snapshot, a head another transaction committed after it
	 * was taken is a serialization failure, not a number to go on from.
	 */
	if (IsolationUsesXactSnapshot() &&
		!table_tuple_satisfies_snapshot(rows.heap, rows.slot,
										GetTransactionSnapshot()))
	{
		bool		isnull;
		TransactionId xmin;

		xmin = DatumGetTransactionId(slot_getsysattr(rows.slot,
													 MinTransactionIdAttributeNumber,
													 &isnull));
		if (!TransactionIdIsCurrentTransactionId(xmin))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update")));
	}
	if (row.nulls[HEADS_LAST_SEQ])
		elog(ERROR, "null last_seq in \"%s.%s\"",
			 IDEM_SCHEMA_NAME, RelationGetRelationName(rows.heap));
	last = DatumGetInt64(row.values[HEADS_LAST_SEQ]);
	if (pg_add_s64_overflow(last, 1, seq))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	values[0] = key[0];
	values[1] = key[1];
	values[HEADS_TENANT] = tenant;
	values[HEADS_LAST_SEQ] = Int64GetDatum(*seq);
	values[HEADS_UPDATED_AT] = TimestampTzGetDatum(now);
	IdemKeyedWrite(&rows, &row, values, nulls);
	IdemKeyedClose(&rows);
	return true;
}

/*
 * IdemTenantEventPartition returns the partition of the events' shard
 * "events" (a partitioned table, locked here ROW EXCLUSIVE as an INSERT
 * locks it) whose range holds published_at, found in the bounds the
 * relcache keeps with the shard (kept true under the lock: a partition
 * made or dropped since sends an invalidation), as the executor's tuple
 * routing finds it; InvalidOid if there is none, or if the shard is not
 * one of the shape citus_distribute() made (the caller then leaves the
 * event to the statement: its error, or the executor's own routing).
 */
static Oid
IdemTenantEventPartition(Oid events, Datum published_at)
{
	Relation	parent;
	PartitionKey key;
	PartitionDesc desc;
	Oid			part = InvalidOid;

	LockRelationOid(events, RowExclusiveLock);
	parent = table_open(events, NoLock);
	if (parent->rd_rel->relkind == RELKIND_PARTITIONED_TABLE &&
		parent->trigdesc == NULL && !parent->rd_rel->relrowsecurity &&
		(key = RelationGetPartitionKey(parent)) != NULL &&
		key->strategy == PARTITION_STRATEGY_RANGE && key->partnatts == 1 &&
		key->partattrs[0] == EVENTS_PUBLISHED_AT + 1 &&
		key->parttypid[0] == TIMESTAMPTZOID)
	{
		desc = RelationGetPartitionDesc(parent, true);
		if (desc->boundinfo != NULL)
		{
			bool		equal;
			int			bound;
			int			index;

			bound = partition_range_datum_bsearch(key->partsupfunc,
												  key->partcollation,
												  desc->boundinfo, 1,
												  &published_at, &equal);
			index = desc->boundinfo->indexes[bound + 1];
			if (index < 0)
				index = desc->boundinfo->default_index;
			if (index >= 0 && desc->is_leaf[index])
				part = desc->oids[index];
		}
	}
	table_close(parent, NoLock);
	return part;
}

/*
 * IdemTenantEventWrite inserts the event (values, nulls: the columns of
 * idempotency.tenant_events) directly into the partition of shard
 * "events" its time of publication falls into: the row, then its index
 * entries through the executor's ExecInsertIndexTuples (the primary key's
 * uniqueness checked, as an INSERT checks it).  False, with nothing
 * written, if the shard or the partition is not as citus_distribute() and
 * maintenance make them (no partition for the time; a partition of other
 * columns, with triggers, row security, or a CHECK or NOT NULL constraint
 * of a DBA's): the caller then runs the INSERT, which does what SQL does.
 */
static bool
IdemTenantEventWrite(Oid events, Datum *values, bool *nulls)
{
	Oid			part;
	IdemOpenPartition op;
	TupleDesc	desc;
	HeapTuple	tuple;
	int			i;
	bool		plain;

	part = IdemTenantEventPartition(events,
									values[EVENTS_PUBLISHED_AT]);
	if (!OidIsValid(part))
		return false;
	LockRelationOid(part, RowExclusiveLock);
	memset(&op, 0, sizeof(op));
	op.heap = table_open(part, NoLock);
	desc = RelationGetDescr(op.heap);
	plain = op.heap->rd_rel->relkind == RELKIND_RELATION &&
		op.heap->trigdesc == NULL && !op.heap->rd_rel->relrowsecurity &&
		desc->natts == Natts_tenant_events &&
		(desc->constr == NULL || desc->constr->num_check == 0);
	for (i = 0; plain && i < Natts_tenant_events; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		/* the role column is an idempotency.role_ref (role_ref.c) */
		plain = !att->attisdropped &&
			(att->atttypid == events_atttypes[i] ||
			 (i == 0 && IdemIsRoleRefType(att->atttypid))) &&
			!(att->attnotnull && nulls[i]);
	}
	if (!plain)
	{
		table_close(op.heap, NoLock);
		return false;
	}
	IdemOpenPartitionIndexes(&op, RowExclusiveLock, false);
	tuple = heap_form_tuple(desc, values, nulls);
	simple_heap_insert(op.heap, tuple);
	IdemInsertIndexEntries(&op, tuple, IDEM_INDEX_UPDATE_ALL);
	heap_freetuple(tuple);
	IdemClosePartitionIndexes(&op);
	table_close(op.heap, NoLock);
	return true;
}

/*
 * IdemTenantPublish writes one checked event of "role"'s "topic" into the
 * tenant's outbox, if citus_distribute() made it, and sets *id to its
 * event id; false if not (the caller writes into the node's own outbox).
 */
bool
IdemTenantPublish(Oid role, text *topic, text *key, Datum headers,
				  bool headers_null, Datum payload, bool payload_null,
				  Datum payload_raw, bool raw_null, text *tenant,
				  pg_uuid_t **id)
{
	Oid			heads;
	Oid			events;
	Oid			tenant_type;
	Datum		tenant_value;
	Oid			events_type;
	Datum		events_value;
	IdemSavedUser save;
	Oid			argtypes[10];
	Datum		values[10];
	char		nulls[10];
	Datum		row[Natts_tenant_events];
	bool		rownulls[Natts_tenant_events];
	bool		isnull;
	int64		seq;
	TimestampTz now;
	int			rc;

	heads = IdemCitusRouteTable(IDEM_CITUS_TENANT_OUTBOX_HEADS, tenant,
								"tenant", &tenant_type, &tenant_value);
	if (!OidIsValid(heads))
		return false;
	events = IdemCitusRouteTable(IDEM_CITUS_TENANT_EVENTS, tenant, "tenant",
								 &events_type, &events_value);
	if (!OidIsValid(events) || events_type != tenant_type)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"%s.%s\" is missing or does not match \"%s.%s\"",
						IDEM_SCHEMA_NAME, "tenant_events", IDEM_SCHEMA_NAME,
						"tenant_outbox_heads"),
				 errhint("Both are made by idempotency.citus_distribute().")));
	events_atttypes[EVENTS_TENANT] = tenant_type;

	/*
	 * The next number of (role, topic, tenant), its row locked to the end
	 * (waiting here for another publisher's commit or rollback): directly
	 * when the head row is there, with the statement when it is the
	 * first.
	 */
	now = GetCurrentTimestamp();
	if (!IdemTenantHeadNext(heads, role, topic, tenant_type, tenant_value,
							now, &seq))
	{
		/*
		 * As the storage owner; no setting is pinned (as for streams.c's
		 * kept statements): the statements name every table and operator
		 * with its schema and take every value as a typed parameter, so no
		 * setting changes what they do.
		 */
		IdemOwnerSPIBegin(&save);
		argtypes[0] = REGROLEOID;
		argtypes[1] = TEXTOID;
		argtypes[2] = tenant_type;
		argtypes[3] = TIMESTAMPTZOID;
		values[0] = ObjectIdGetDatum(role);
		values[1] = PointerGetDatum(topic);
		values[2] = tenant_value;
		values[3] = TimestampTzGetDatum(now);
		memset(nulls, ' ', sizeof(nulls));
		rc = SPI_execute_plan(IdemShardPlanFor(heads,
											   "INSERT INTO %s AS h (role, topic, tenant, last_seq, updated_at)"
											   " VALUES ($1, $2, $3, 1, $4)"
											   " ON CONFLICT (role, topic, tenant) DO UPDATE"
											   " SET last_seq = h.last_seq OPERATOR(pg_catalog.+) 1,"
											   " updated_at = EXCLUDED.updated_at"
											   " RETURNING h.last_seq",
											   4, argtypes),
							  values, nulls, false, 0);
		if (rc != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
			elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
		seq = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull));
		IdemOwnerSPIEnd(&save);
	}

	/*
	 * The time of publication, and the partition the event goes to, once
	 * the number is had: a publisher that waited for another's commit
	 * does not write into a partition that ended meanwhile (maintenance
	 * may drop it once it has ended and its events are acknowledged).
	 */
	now = GetCurrentTimestamp();
	*id = palloc(sizeof(pg_uuid_t));
	IdemNewEventId(*id, now);

	/* the event, directly into its partition, or with the statement */
	row[0] = ObjectIdGetDatum(role);
	row[1] = PointerGetDatum(topic);
	row[EVENTS_TENANT] = tenant_value;
	row[3] = Int64GetDatum(seq);
	row[4] = UUIDPGetDatum(*id);
	row[5] = PointerGetDatum(key);
	row[6] = payload;
	row[7] = payload_raw;
	row[8] = headers;
	row[EVENTS_PUBLISHED_AT] = TimestampTzGetDatum(now);
	memset(rownulls, 0, sizeof(rownulls));
	rownulls[5] = key == NULL;
	rownulls[6] = payload_null;
	rownulls[7] = raw_null;
	rownulls[8] = headers_null;
	if (!IdemTenantEventWrite(events, row, rownulls))
	{
		int			i;

		IdemOwnerSPIBegin(&save);
		argtypes[0] = REGROLEOID;
		argtypes[1] = TEXTOID;
		argtypes[2] = tenant_type;
		argtypes[3] = INT8OID;
		argtypes[4] = UUIDOID;
		argtypes[5] = TEXTOID;
		argtypes[6] = JSONBOID;
		argtypes[7] = BYTEAOID;
		argtypes[8] = JSONBOID;
		argtypes[9] = TIMESTAMPTZOID;
		for (i = 0; i < Natts_tenant_events; i++)
			nulls[i] = rownulls[i] ? 'n' : ' ';
		rc = SPI_execute_plan(IdemShardPlanFor(events,
											   "INSERT INTO %s (role, topic, tenant, seq, event_id, key,"
											   " payload, payload_raw, headers, published_at)"
											   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
											   10, argtypes),
							  row, nulls, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
		IdemOwnerSPIEnd(&save);
	}

	/* with idempotency.outbox_logical: in this node's WAL too */
	IdemOutboxTenantMessage(role, topic, *id, now, key, headers, headers_null,
							payload, payload_null, payload_raw, raw_null,
							tenant, seq);
	return true;
}

/*
 * IdemTenantRelayDistributed: is there a tenant outbox, relayed here?
 * false without idempotency.tenant_events (the relay with a tenant is the
 * one without it); true on the coordinator, where citus_distribute() made
 * the relays' tables; 0A000 on a worker, which has the distributed tables
 * but not the relays' (a relay there would read the worker's own outbox).
 */
bool
IdemTenantRelayDistributed(void)
{
	if (!OidIsValid(IdemTenantRelation("tenant_events")))
		return false;
	if (!OidIsValid(IdemTenantRelation("tenant_relays")))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the outbox of the tenants is relayed on the Citus coordinator"),
				 errdetail("This node has table \"%s.%s\" but not the relays' positions.",
						   IDEM_SCHEMA_NAME, "tenant_events"),
				 errhint("Connect the relay to the coordinator.")));
	return true;
}

/*
 * IdemTenantRelayNext returns the relay's current batch of the tenant
 * outbox (idempotency.tenant_outbox_next(), run by the storage owner for
 * "role") into fcinfo's materialized result.
 */
void
IdemTenantRelayNext(FunctionCallInfo fcinfo, Oid role, text *relay,
					text *topic, int32 max_events, bool fenced,
					int64 generation, text *tenant)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemSavedUser save;
	int			level;
	Oid			argtypes[6] = {REGROLEOID, TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	int			rc;
	uint64		i;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != Natts_tenant_next)
		elog(ERROR, "idem_outbox_next() with a tenant must return %d columns",
			 Natts_tenant_next);
	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(relay);
	values[2] = PointerGetDatum(topic);
	values[3] = Int32GetDatum(max_events);
	values[4] = Int64GetDatum(generation);
	nulls[4] = fenced ? ' ' : 'n';
	values[5] = PointerGetDatum(tenant);
	nulls[5] = tenant == NULL ? 'n' : ' ';

	IdemOwnerSPIBegin(&save);
	level = IdemPinOwnerSettings();
	IdemCitusPinRemoteSettings();
	rc = SPI_execute_with_args("SELECT * FROM idempotency.tenant_outbox_next($1, $2, $3, $4, $5, $6)",
							   6, argtypes, values, nulls, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	if (SPI_tuptable->tupdesc->natts != Natts_tenant_next)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("function \"%s.%s\" does not return the columns of idem_outbox_next()",
						IDEM_SCHEMA_NAME, "tenant_outbox_next")));
	for (i = 0; i < SPI_processed; i++)
	{
		Datum		row[Natts_tenant_next];
		bool		rownulls[Natts_tenant_next];

		heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
						  row, rownulls);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, rownulls);
	}
	IdemCitusUnpinRemoteSettings();
	AtEOXact_GUC(true, level);
	IdemOwnerSPIEnd(&save);
}

/*
 * IdemTenantRelayAck acknowledges the relay's current batch of the tenant
 * outbox (idempotency.tenant_outbox_ack(), run by the storage owner for
 * "role"): true if it moved the relay past it.
 */
bool
IdemTenantRelayAck(Oid role, text *relay, text *topic, int64 batch,
				   bool fenced, int64 generation, text *tenant)
{
	IdemSavedUser save;
	int			level;
	Oid			argtypes[6] = {REGROLEOID, TEXTOID, TEXTOID, INT8OID, INT8OID, TEXTOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	bool		moved;
	int			rc;

	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(relay);
	values[2] = PointerGetDatum(topic);
	values[3] = Int64GetDatum(batch);
	values[4] = Int64GetDatum(generation);
	nulls[4] = fenced ? ' ' : 'n';
	values[5] = PointerGetDatum(tenant);
	nulls[5] = tenant == NULL ? 'n' : ' ';

	IdemOwnerSPIBegin(&save);
	level = IdemPinOwnerSettings();
	rc = SPI_execute_with_args("SELECT idempotency.tenant_outbox_ack($1, $2, $3, $4, $5, $6)",
							   6, argtypes, values, nulls, false, 0);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	moved = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
	AtEOXact_GUC(true, level);
	IdemOwnerSPIEnd(&save);
	return !isnull && moved;
}

/*
 * IdemTenantRelayDeadLetter records that the relay gave up on an event of
 * its current batch of the tenant outbox, with a copy of the event, among
 * this node's dead letters (idempotency.tenant_outbox_dead_letter(), run
 * by the storage owner for "role"): idem_outbox_dead_letters() lists it.
 */
void
IdemTenantRelayDeadLetter(Oid role, text *relay, text *topic,
						  pg_uuid_t *event_id, text *reason, bool has_attempts,
						  int32 attempts, text *tenant)
{
	IdemSavedUser save;
	int			level;
	Oid			argtypes[7] = {REGROLEOID, TEXTOID, TEXTOID, UUIDOID, TEXTOID,
	INT4OID, TEXTOID};
	Datum		values[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			rc;

	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(relay);
	values[2] = PointerGetDatum(topic);
	values[3] = UUIDPGetDatum(event_id);
	values[4] = PointerGetDatum(reason);
	nulls[4] = reason == NULL ? 'n' : ' ';
	values[5] = Int32GetDatum(attempts);
	nulls[5] = has_attempts ? ' ' : 'n';
	values[6] = PointerGetDatum(tenant);
	nulls[6] = tenant == NULL ? 'n' : ' ';

	IdemOwnerSPIBegin(&save);
	level = IdemPinOwnerSettings();
	IdemCitusPinRemoteSettings();
	rc = SPI_execute_with_args("SELECT idempotency.tenant_outbox_dead_letter($1, $2, $3, $4, $5, $6, $7)",
							   7, argtypes, values, nulls, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	IdemCitusUnpinRemoteSettings();
	AtEOXact_GUC(true, level);
	IdemOwnerSPIEnd(&save);
}

/*
 * IdemTenantOutboxMaintain makes the partitions of the tenant outbox ahead
 * and drops the old ones (idempotency.tenant_outbox_maintain(), run by the
 * storage owner), on the coordinator only: Citus makes and drops their
 * shards on the workers in the same transaction.  Its DDL waits at most
 * IDEM_CITUS_DDL_LOCK_TIMEOUT_MS on every node, and a partition not made
 * or dropped in time is left for the next run (as for the distributed
 * ledgers, maintain.c).  Adds to *created and *dropped.
 */
void
IdemTenantOutboxMaintain(int *created, int *dropped)
{
	Oid			events = IdemTenantRelation("tenant_events");
	bool		coordinator;
	IdemSavedUser save;
	int			level;
	Oid			argtypes[5] = {INT4OID, INT4OID, INT4OID, INT4OID, INT4OID};
	Datum		values[5];
	bool		isnull;
	int			rc;
	int			i;
	static const char *const tables[] = {"tenant_outbox_heads", "tenant_events",
	"tenant_relays", "tenant_relay_positions", "tenant_event_partitions"};

	if (!OidIsValid(events) || !OidIsValid(IdemTenantRelation("tenant_relays")) ||
		!IdemCitusDistributed(events, &coordinator) || !coordinator)
		return;

	/*
	 * Granted to nobody, as the tenant positions (streams.c): a grant made
	 * since (a GRANT, a restore) is taken back on the tables; the
	 * partitions' are taken back as maintenance makes them.
	 */
	for (i = 0; i < lengthof(tables); i++)
	{
		Oid			rel = IdemTenantRelation(tables[i]);

		if (OidIsValid(rel))
			IdemRestrictTableAcl(rel);
	}
	values[0] = Int32GetDatum(idem_partition_interval);
	values[1] = Int32GetDatum(idem_premake);
	values[2] = Int32GetDatum(idem_outbox_retention);
	values[3] = Int32GetDatum(idem_outbox_max_age);
	values[4] = Int32GetDatum(IDEM_CITUS_DDL_LOCK_TIMEOUT_MS);

	IdemOwnerSPIBegin(&save);
	level = IdemPinOwnerSettings();
	IdemCitusPinRemoteSettings();
	rc = SPI_execute_with_args("SELECT * FROM idempotency.tenant_outbox_maintain($1, $2, $3, $4, $5)",
							   5, argtypes, values, NULL, false, 0);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	*created += DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	*dropped += DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 2, &isnull));
	IdemCitusUnpinRemoteSettings();
	AtEOXact_GUC(true, level);
	IdemOwnerSPIEnd(&save);
}

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
 * per relay and tenant, the acknowledged number, the current batch's end
 * and a loss not yet reported) with the SQL functions that read and
 * write them (idempotency.tenant_outbox_next, _ack, _dead_letter,
 * _maintain); a dead letter goes with the node's own relays' dead letters
 * (idempotency.outbox_dead_letters of the coordinator).  The
 * numbers travel with the events and heads, so a move changes nothing
 * for a relay.
 *
 * A publish routes like the other tenant calls (citus.c: the shard's
 * metadata lock, 40001 on a worker the tenant left, 0A000 on a
 * coordinator that does not hold it) and writes the local shards of both
 * tables with two statements run by the storage owner (SPI, names of the
 * shards qualified, prepared once per shard and backend).  The relay functions run the SQL
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
#include "outbox.h"
#include "privilege.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

/* the columns of idem_outbox_next(..., tenant)'s result */
#define Natts_tenant_next	9

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

	/*
	 * As the storage owner; no setting is pinned (as for streams.c's kept
	 * statements): the two statements name every table and operator with
	 * its schema and take every value as a typed parameter, so no setting
	 * changes what they do.
	 */
	IdemOwnerSPIBegin(&save);

	/*
	 * The next number of (role, topic, tenant), its row locked to the end
	 * (waiting here for another publisher's commit or rollback)
	 */
	argtypes[0] = REGROLEOID;
	argtypes[1] = TEXTOID;
	argtypes[2] = tenant_type;
	argtypes[3] = TIMESTAMPTZOID;
	argtypes[4] = INT8OID;
	argtypes[5] = UUIDOID;
	argtypes[6] = TEXTOID;
	argtypes[7] = JSONBOID;
	argtypes[8] = BYTEAOID;
	argtypes[9] = JSONBOID;
	values[0] = ObjectIdGetDatum(role);
	values[1] = PointerGetDatum(topic);
	values[2] = tenant_value;
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
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

	/*
	 * The time of publication, and the partition the event goes to, once
	 * the number is had: a publisher that waited for another's commit
	 * does not write into a partition that ended meanwhile (maintenance
	 * may drop it once it has ended and its events are acknowledged).
	 */
	now = GetCurrentTimestamp();
	*id = SPI_palloc(sizeof(pg_uuid_t));	/* outlives SPI_finish */
	IdemNewEventId(*id, now);
	values[3] = TimestampTzGetDatum(now);

	/* the event */
	values[4] = Int64GetDatum(seq);
	values[5] = UUIDPGetDatum(*id);
	values[6] = PointerGetDatum(key);
	nulls[6] = key == NULL ? 'n' : ' ';
	values[7] = payload;
	nulls[7] = payload_null ? 'n' : ' ';
	values[8] = payload_raw;
	nulls[8] = raw_null ? 'n' : ' ';
	values[9] = headers;
	nulls[9] = headers_null ? 'n' : ' ';
	rc = SPI_execute_plan(IdemShardPlanFor(events,
										   "INSERT INTO %s (role, topic, tenant, seq, event_id, key,"
										   " payload, payload_raw, headers, published_at)"
										   " VALUES ($1, $2, $3, $5, $6, $7, $8, $9, $10, $4)",
										   10, argtypes),
						  values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));

	IdemOwnerSPIEnd(&save);

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

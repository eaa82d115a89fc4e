/*-------------------------------------------------------------------------
 *
 * outbox_observe.c
 *	  Watching the outbox: the calling role's relays and dead letters
 *	  (idem_outbox_relays, idem_outbox_dead_letters), every role's relays
 *	  for pg_monitor (idempotency.outbox_relay_info) and the counters
 *	  (idempotency.outbox_stats_info).
 *
 * A relay's lag is counted, not estimated: the committed events of its
 * topic it has not acknowledged, and the age of the oldest of them
 * (IdemRelayLag reads their index entries, so it costs in proportion to
 * the lag).  A role sees its own relays only; pg_monitor sees every
 * role's, names and numbers, never events.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_observe.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "outbox.h"
#include "stats.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idem_outbox_relays);
PG_FUNCTION_INFO_V1(idem_outbox_relay_info);
PG_FUNCTION_INFO_V1(idem_outbox_stats_info);
PG_FUNCTION_INFO_V1(idem_outbox_dead_letters);

/*
 * IdemRelayRows adds one row per relay of "role" (or of every role, then
 * with the role first) to the result.
 */
static void
IdemRelayRows(FunctionCallInfo fcinfo, Oid role, bool all_roles)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *relays;
	ListCell   *lc;

	InitMaterializedSRF(fcinfo, 0);
	if (!OidIsValid(IdemOutboxMemberRelid("outbox_relays")))
		return;
	relays = IdemRelayList(role, all_roles);
	foreach(lc, relays)
	{
		IdemRelayState *st = (IdemRelayState *) lfirst(lc);
		Datum		v[12];
		bool		n[12] = {false};
		int			c = 0;
		int64		lag_events;
		double		lag_seconds;

		IdemRelayLag(st, &lag_events, &lag_seconds);
		if (all_roles)
			v[c++] = ObjectIdGetDatum(st->role);
		v[c++] = PointerGetDatum(st->relay);
		v[c++] = PointerGetDatum(st->topic);
		v[c] = Int64GetDatum(st->generation);
		n[c++] = !st->has_generation;
		v[c++] = Int64GetDatum(st->batch);
		v[c++] = Int32GetDatum(st->handed_out ? st->batch_events : 0);
		v[c++] = Int64GetDatum(lag_events);
		v[c++] = Float8GetDatum(lag_seconds);
		v[c++] = Int64GetDatum(IdemRelayDeadLetterCount(st->role, st->relay,
														st->topic));
		v[c++] = Int64GetDatum(st->lost_events);
		v[c] = TimestampTzGetDatum(st->acked_at);
		n[c++] = (st->acked_at == 0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
	}
}

/*
 * idem_outbox_relays() RETURNS TABLE (relay text, topic text,
 *		generation bigint, batch bigint, in_flight integer,
 *		lag_events bigint, lag_seconds double precision,
 *		dead_letters bigint, lost_events bigint, acked_at timestamptz)
 *
 * The calling role's relays.
 */
Datum
idem_outbox_relays(PG_FUNCTION_ARGS)
{
	IdemCheckLibraryVersion();
	IdemRelayRows(fcinfo, GetUserId(), false);
	return (Datum) 0;
}

/*
 * idempotency.outbox_relay_info() RETURNS TABLE (role regrole, ...)
 *
 * Every role's relays (granted to pg_monitor).
 */
Datum
idem_outbox_relay_info(PG_FUNCTION_ARGS)
{
	IdemCheckLibraryVersion();
	IdemRelayRows(fcinfo, InvalidOid, true);
	return (Datum) 0;
}

/*
 * idempotency.outbox_stats_info(OUT events_published bigint, ...)
 *
 * The outbox's counters of the current database since server start or
 * idempotency.stats_reset(); needs shared_preload_libraries.
 */
Datum
idem_outbox_stats_info(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	uint64		counters[6] = {0};
	Datum		v[6];
	bool		n[6] = {false};
	int			i;

	IdemCheckLibraryVersion();
	IdemStatsRequirePreload("idempotency.outbox_stats");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	(void) IdemStatsRead(MyDatabaseId, IDEM_STAT_OUTBOX_PUBLISHED, 6, counters);
	for (i = 0; i < 6; i++)
		v[i] = Int64GetDatum((int64) counters[i]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, v, n)));
}

/*
 * idem_outbox_dead_letters(relay text DEFAULT NULL, topic text DEFAULT NULL)
 *		RETURNS TABLE (relay text, topic text, event_id uuid, key text,
 *					   payload jsonb, payload_raw bytea, headers jsonb,
 *					   published_at timestamptz, reason text,
 *					   attempts integer, failed_at timestamptz)
 *
 * The calling role's dead letters, of one relay and topic or all.
 */
Datum
idem_outbox_dead_letters(PG_FUNCTION_ARGS)
{
	text	   *relay = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	text	   *topic = PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1);

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	if (!OidIsValid(IdemOutboxMemberRelid("outbox_dead_letters")))
		return (Datum) 0;
	IdemRelayDeadLetterRows(GetUserId(), relay, topic,
							(ReturnSetInfo *) fcinfo->resultinfo);
	return (Datum) 0;
}

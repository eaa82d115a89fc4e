/*-------------------------------------------------------------------------
 *
 * outbox_publish.c
 *	  idem_publish(): one event written into the outbox in the caller's
 *	  transaction.
 *
 * A call checks its arguments, takes the lock of the event's key (if it
 * has one) until the transaction ends, assigns the transaction's xid if it
 * has none, locks the newest segment, takes the next ev_id and inserts the
 * row and its index entry directly (no executor, no SPI).  Order matters:
 *
 *	- the xid before the ev_id: relays rely on a transaction's events
 *	  having ev_ids taken after its xid was assigned (outbox_relay.c);
 *	- the key lock before the ev_id, held to the end of the transaction:
 *	  a second publisher of the key waits for the first to commit or roll
 *	  back and then takes a higher ev_id, so a key's events have ev_ids in
 *	  the order their transactions committed.  A transaction releases its
 *	  locks after it became visible to snapshots, so the second's commit
 *	  is never seen before the first's.
 *
 * Key locks: the role's OID in a field of its own and a SipHash of the
 * topic and the key keyed with the database's secret (keyhash.c), so that
 * no role can make its lock another role's, nor tell from pg_locks which
 * key another role publishes.  Each takes an entry of the shared lock
 * table until the transaction ends, so a transaction may hold at most
 * max_locks_per_transaction of them (53000 beyond, before anything is
 * written), as the stream locks; events without a key take none.
 *
 * The event id is a UUID of version 7 (RFC 9562): 48 bits of the clock in
 * milliseconds, then 74 bits that are a random number drawn once per
 * backend plus a counter, so that ids of one backend never repeat and ids
 * of different backends differ but with negligible probability.  It is the
 * event's identity for every delivery (webhook-id, Idempotency-Key).
 *
 * With idempotency.outbox_logical on, the event is also written to WAL as
 * a transactional logical decoding message (prefix "idempotency.outbox",
 * content a JSON object), which a decoding plugin sees exactly when the
 * transaction commits, and never if it rolls back.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_publish.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "keyed_rows.h"
#include "keyhash.h"
#include "outbox.h"
#include "protocol.h"
#include "stats.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "common/base64.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "replication/message.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_publish);

/* The prefix of the logical decoding messages */
#define IDEM_OUTBOX_MESSAGE_PREFIX	"idempotency.outbox"

/* This backend's part of the event ids (see the file header) */
static bool event_id_seeded = false;
static uint64 event_id_rand_a;	/* 12 bits */
static uint64 event_id_rand_b;	/* 62 bits */
static uint64 event_id_counter = 0;

static void IdemLockEventKey(Oid role, text *topic, text *key);
static void IdemCheckEventHeaders(Datum headers);
static void IdemEmitLogicalMessage(Oid role, text *topic, Datum *values,
								   bool *nulls, const char *tenant, int64 seq);

/*
 * IdemLockEventKey takes the lock of one key of one topic of "role" until
 * the transaction ends: at most max_locks_per_transaction of them per
 * transaction (see the file header; counted by keyed_rows.c, apart from
 * the stream and relay locks); one held already is taken again freely.
 */
static void
IdemLockEventKey(Oid role, text *topic, text *key)
{
	LOCKTAG		tag;

	IdemSetStreamLockTag(&tag, IDEM_LOCK_OUTBOX_KEY, role,
						 VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic),
						 VARDATA_ANY(key), VARSIZE_ANY_EXHDR(key), 0);
	IdemKeyedLockAcquire(&tag);
}

/*
 * IdemCheckEventHeaders checks an event's headers: a JSON object whose
 * values are strings or non-empty arrays of strings, without control
 * characters (relays may send them as HTTP fields or Kafka headers).
 */
static void
IdemCheckEventHeaders(Datum headers)
{
	Jsonb	   *jb = DatumGetJsonbP(headers);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;
	char	   *name = NULL;

	if (!JB_ROOT_IS_OBJECT(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object")));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
			case WJB_BEGIN_ARRAY:
				if (depth == 1 && tok == WJB_BEGIN_ARRAY && v.val.array.nElems == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("header \"%s\" must not be an empty array", name)));
				if (++depth > 2 || (depth == 2 && tok == WJB_BEGIN_OBJECT))
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("header \"%s\" must be a string or an array of strings",
									name)));
				break;
			case WJB_END_OBJECT:
			case WJB_END_ARRAY:
				depth--;
				break;
			case WJB_KEY:
				name = pnstrdup(v.val.string.val, v.val.string.len);
				if (v.val.string.len == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("header names must not be empty")));
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				{
					int			i;

					if (v.type != jbvString)
						ereport(ERROR,
								(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
								 errmsg("header \"%s\" must be a string or an array of strings",
										name)));
					for (i = 0; i < v.val.string.len; i++)
					{
						unsigned char c = (unsigned char) v.val.string.val[i];

						if ((c < 0x20 && c != '\t') || c == 0x7f)
							ereport(ERROR,
									(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
									 errmsg("header \"%s\" must not contain control characters",
											name)));
					}
				}
				break;
			default:
				break;
		}
	}
}

/* a new event id, UUID version 7 (see the file header) */
void
IdemNewEventId(pg_uuid_t *id, TimestampTz now)
{
	uint64		ms;
	uint64		b;
	uint16		a;
	int			i;

	if (!event_id_seeded)
	{
		uint8		seed[10];

		if (!pg_strong_random(seed, sizeof(seed)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random values")));
		event_id_rand_a = ((uint64) seed[0] << 4 | seed[1] >> 4) & 0xFFF;
		event_id_rand_b = 0;
		for (i = 2; i < 10; i++)
			event_id_rand_b = (event_id_rand_b << 8) | seed[i];
		event_id_seeded = true;
	}
	/* milliseconds since the Unix epoch */
	ms = (uint64) ((now + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY) / 1000);
	a = (uint16) event_id_rand_a;
	b = event_id_rand_b + event_id_counter++;
	if (((event_id_rand_b + event_id_counter) & UINT64CONST(0x3FFFFFFFFFFFFFFF)) == 0)
		event_id_rand_a = (event_id_rand_a + 1) & 0xFFF;	/* carry */

	id->data[0] = (uint8) (ms >> 40);
	id->data[1] = (uint8) (ms >> 32);
	id->data[2] = (uint8) (ms >> 24);
	id->data[3] = (uint8) (ms >> 16);
	id->data[4] = (uint8) (ms >> 8);
	id->data[5] = (uint8) ms;
	id->data[6] = (uint8) (0x70 | (a >> 8));	/* version 7 */
	id->data[7] = (uint8) a;
	id->data[8] = (uint8) (0x80 | ((b >> 56) & 0x3F));	/* variant 10 */
	for (i = 9; i < 16; i++)
		id->data[i] = (uint8) (b >> (8 * (15 - i)));
}

/*
 * IdemEmitLogicalMessage writes the event as a transactional logical
 * decoding message: a JSON object with the event id, the role, the
 * topic, the key, the headers, the payload (or the raw payload in
 * base64) and the time it was published.
 */
static void
IdemEmitLogicalMessage(Oid role, text *topic, Datum *values, bool *nulls,
					   const char *tenant, int64 seq)
{
	StringInfoData buf;
	char	   *role_name = GetUserNameFromId(role, false);

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"event_id\": \"");
	appendStringInfoString(&buf,
						   DatumGetCString(DirectFunctionCall1(uuid_out,
															   values[Anum_outbox_event_id - 1])));
	appendStringInfoString(&buf, "\", \"role\": ");
	escape_json(&buf, role_name);
	appendStringInfoString(&buf, ", \"topic\": ");
	escape_json(&buf, text_to_cstring(topic));
	appendStringInfoString(&buf, ", \"key\": ");
	if (nulls[Anum_outbox_key - 1])
		appendStringInfoString(&buf, "null");
	else
		escape_json(&buf, TextDatumGetCString(values[Anum_outbox_key - 1]));
	appendStringInfoString(&buf, ", \"headers\": ");
	if (nulls[Anum_outbox_headers - 1])
		appendStringInfoString(&buf, "null");
	else
		(void) JsonbToCString(&buf, &DatumGetJsonbP(values[Anum_outbox_headers - 1])->root, -1);
	appendStringInfoString(&buf, ", \"payload\": ");
	if (nulls[Anum_outbox_payload - 1])
		appendStringInfoString(&buf, "null");
	else
		(void) JsonbToCString(&buf, &DatumGetJsonbP(values[Anum_outbox_payload - 1])->root, -1);
	appendStringInfoString(&buf, ", \"payload_raw\": ");
	if (nulls[Anum_outbox_payload_raw - 1])
		appendStringInfoString(&buf, "null");
	else
	{
		bytea	   *raw = DatumGetByteaPP(values[Anum_outbox_payload_raw - 1]);
		int			len = VARSIZE_ANY_EXHDR(raw);
		char	   *enc = palloc(pg_b64_enc_len(len) + 1);
		int			enclen = IdemB64Encode(VARDATA_ANY(raw), len, enc,
										   pg_b64_enc_len(len));

		if (enclen < 0)
			elog(ERROR, "could not encode a raw payload in base64");
		appendStringInfoChar(&buf, '"');
		appendBinaryStringInfo(&buf, enc, enclen);
		appendStringInfoChar(&buf, '"');
		pfree(enc);
	}
	appendStringInfoString(&buf, ", \"published_at\": ");
	escape_json(&buf, timestamptz_to_str(DatumGetTimestampTz(values[Anum_outbox_published_at - 1])));
	if (tenant != NULL)
	{
		/* an event of the tenant outbox (outbox_tenant.c) */
		appendStringInfoString(&buf, ", \"tenant\": ");
		escape_json(&buf, tenant);
		appendStringInfo(&buf, ", \"seq\": " INT64_FORMAT, seq);
	}
	appendStringInfoChar(&buf, '}');

	(void) IdemLogLogicalMessage(IDEM_OUTBOX_MESSAGE_PREFIX, buf.data, buf.len,
								 true);
	pfree(buf.data);
}

/*
 * IdemOutboxCheckEvent checks what an event would store, as idem_publish()
 * takes it and as an import brings it (outbox_transfer.c): payload or raw
 * payload, not both; headers as IdemCheckEventHeaders() wants them; key,
 * payload, raw payload and headers within idempotency.max_response_bytes.
 * "what" names the caller in the size error.
 */
void
IdemOutboxCheckEvent(const char *what, text *key, Datum headers,
					 bool headers_null, Datum payload, bool payload_null,
					 Datum payload_raw, bool raw_null)
{
	int64		size = 0;

	if (!payload_null && !raw_null)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an event has payload or payload_raw, not both")));
	if (!headers_null)
		IdemCheckEventHeaders(headers);

	/* what the event stores, as stored (see doc/reference.md) */
	if (key != NULL)
		size += VARSIZE_ANY_EXHDR(key);
	if (!payload_null)
		size += VARSIZE_ANY(DatumGetPointer(payload));
	if (!headers_null)
		size += VARSIZE_ANY(DatumGetPointer(headers));
	if (!raw_null)
		size += VARSIZE_ANY_EXHDR(DatumGetPointer(payload_raw));
	if (size > idem_max_response_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s would store " INT64_FORMAT " bytes for one event, more than \"idempotency.max_response_bytes\" (%d)",
						what, size, idem_max_response_bytes),
				 errdetail("An event stores its key, payload, raw payload and headers; nothing was stored."),
				 errhint("Publish a smaller event (a reference to the data, say), or have a superuser raise \"idempotency.max_response_bytes\".")));
}

/*
 * IdemOutboxWriteEvent writes one checked event of "role"'s "topic" in the
 * current transaction: with the transaction's xid and then an ev_id (see
 * the file header).  event_id NULL: a new event id, published now
 * (idem_publish), under its key's lock; else the event keeps the id and
 * time it was published with on another node (an import, which emits no
 * logical decoding message, its node of origin did, and takes no key lock:
 * a move imports any number of keys in one transaction, in their order,
 * while the tenant's publishers wait for the move, see
 * outbox_transfer.c).  Returns the event id and sets *ev to its ev_id.
 */
pg_uuid_t *
IdemOutboxWriteEvent(Oid role, text *topic, text *key, Datum headers,
					 bool headers_null, Datum payload, bool payload_null,
					 Datum payload_raw, bool raw_null,
					 const pg_uuid_t *event_id, TimestampTz published_at,
					 int64 *ev)
{
	Datum		values[Natts_outbox];
	bool		nulls[Natts_outbox];
	pg_uuid_t  *id;
	int32		seg;
	Oid			relid;
	IdemOpenPartition op;
	HeapTuple	tuple;

	if (key != NULL && event_id == NULL)
		IdemLockEventKey(role, topic, key);

	memset(nulls, 0, sizeof(nulls));
	/* the xid first, then (under the key's lock) the ev_id: see above */
	values[Anum_outbox_txid - 1] = Int64GetDatum(IdemOutboxCurrentTxid());
	relid = IdemOutboxNewestSegment(RowExclusiveLock, &seg);
	*ev = IdemOutboxNextEvId();
	values[Anum_outbox_ev_id - 1] = Int64GetDatum(*ev);
	values[Anum_outbox_seg - 1] = Int32GetDatum(seg);
	values[Anum_outbox_role - 1] = ObjectIdGetDatum(role);
	values[Anum_outbox_topic - 1] = PointerGetDatum(topic);
	id = palloc(sizeof(pg_uuid_t));
	if (event_id == NULL)
	{
		published_at = GetCurrentTimestamp();
		IdemNewEventId(id, published_at);
	}
	else
		memcpy(id, event_id, sizeof(pg_uuid_t));
	values[Anum_outbox_event_id - 1] = UUIDPGetDatum(id);
	values[Anum_outbox_published_at - 1] = TimestampTzGetDatum(published_at);
	values[Anum_outbox_key - 1] = PointerGetDatum(key);
	nulls[Anum_outbox_key - 1] = (key == NULL);
	values[Anum_outbox_headers - 1] = headers;
	nulls[Anum_outbox_headers - 1] = headers_null;
	values[Anum_outbox_payload - 1] = payload;
	nulls[Anum_outbox_payload - 1] = payload_null;
	values[Anum_outbox_payload_raw - 1] = payload_raw;
	nulls[Anum_outbox_payload_raw - 1] = raw_null;

	/* the row and its index entries, as the ledgers write theirs */
	memset(&op, 0, sizeof(op));
	op.heap = table_open(relid, NoLock);
	if (RelationGetDescr(op.heap)->natts != Natts_outbox)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox segment \"%s.%s\" does not have the columns of the events table",
						IDEM_SCHEMA_NAME, RelationGetRelationName(op.heap))));
	IdemOpenPartitionIndexes(&op, RowExclusiveLock, false);
	tuple = heap_form_tuple(RelationGetDescr(op.heap), values, nulls);
	simple_heap_insert(op.heap, tuple);
	IdemInsertIndexEntries(&op, tuple, IDEM_INDEX_UPDATE_ALL);
	heap_freetuple(tuple);
	IdemClosePartitionIndexes(&op);
	table_close(op.heap, NoLock);

	if (idem_outbox_logical && event_id == NULL)
		IdemEmitLogicalMessage(role, topic, values, nulls, NULL, 0);
	return id;
}

/*
 * IdemOutboxTenantMessage writes an event of the tenant outbox
 * (outbox_tenant.c) as a logical decoding message, when
 * idempotency.outbox_logical is on: the object of the node's own events,
 * with the tenant (as text) and the event's number added.
 */
void
IdemOutboxTenantMessage(Oid role, text *topic, const pg_uuid_t *id,
						TimestampTz published_at, text *key, Datum headers,
						bool headers_null, Datum payload, bool payload_null,
						Datum payload_raw, bool raw_null, text *tenant,
						int64 seq)
{
	Datum		values[Natts_outbox];
	bool		nulls[Natts_outbox];

	if (!idem_outbox_logical)
		return;
	memset(values, 0, sizeof(values));
	memset(nulls, true, sizeof(nulls));
	values[Anum_outbox_event_id - 1] = UUIDPGetDatum(id);
	nulls[Anum_outbox_event_id - 1] = false;
	values[Anum_outbox_published_at - 1] = TimestampTzGetDatum(published_at);
	nulls[Anum_outbox_published_at - 1] = false;
	values[Anum_outbox_key - 1] = PointerGetDatum(key);
	nulls[Anum_outbox_key - 1] = (key == NULL);
	values[Anum_outbox_headers - 1] = headers;
	nulls[Anum_outbox_headers - 1] = headers_null;
	values[Anum_outbox_payload - 1] = payload;
	nulls[Anum_outbox_payload - 1] = payload_null;
	values[Anum_outbox_payload_raw - 1] = payload_raw;
	nulls[Anum_outbox_payload_raw - 1] = raw_null;
	IdemEmitLogicalMessage(role, topic, values, nulls, text_to_cstring(tenant),
						   seq);
}

/*
 * idem_publish(topic text, payload jsonb DEFAULT NULL, key text DEFAULT NULL,
 *				headers jsonb DEFAULT NULL, payload_raw bytea DEFAULT NULL)
 *		RETURNS uuid
 * idem_publish(topic text, payload jsonb, key text, headers jsonb,
 *				payload_raw bytea, tenant text) RETURNS uuid
 *
 * Writes one event into the outbox in the caller's transaction, and
 * returns its event id.
 */
Datum
idem_publish(PG_FUNCTION_ARGS)
{
	text	   *topic;
	text	   *key = NULL;
	pg_uuid_t  *event_id;
	int64		ev;

	IdemCheckLibraryVersion();
	topic = IdemCheckKeyArg(fcinfo, 0, "topic");
	if (!PG_ARGISNULL(2))
		key = IdemCheckKeyArg(fcinfo, 2, "key");
	IdemOutboxCheckEvent("idem_publish()", key,
						 PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3),
						 PG_ARGISNULL(3),
						 PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1),
						 PG_ARGISNULL(1),
						 PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4),
						 PG_ARGISNULL(4));
	IdemCheckWritable("idem_publish()");

	/*
	 * The overload with a tenant (the sixth argument): into the tenant's
	 * outbox if citus_distribute() made it (outbox_tenant.c), else the
	 * tenant is not used.
	 */
	if (PG_NARGS() > 5 &&
		IdemTenantPublish(GetUserId(), topic, key,
						  PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3),
						  PG_ARGISNULL(3),
						  PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1),
						  PG_ARGISNULL(1),
						  PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4),
						  PG_ARGISNULL(4),
						  PG_ARGISNULL(5) ? NULL : PG_GETARG_TEXT_PP(5),
						  &event_id))
	{
		IdemStatsAdd(IDEM_STAT_OUTBOX_PUBLISHED, 1);
		PG_RETURN_UUID_P(event_id);
	}

	event_id = IdemOutboxWriteEvent(GetUserId(), topic, key,
									PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3),
									PG_ARGISNULL(3),
									PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1),
									PG_ARGISNULL(1),
									PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4),
									PG_ARGISNULL(4), NULL, 0, &ev);
	IdemStatsAdd(IDEM_STAT_OUTBOX_PUBLISHED, 1);
	PG_RETURN_UUID_P(event_id);
}

/*-------------------------------------------------------------------------
 *
 * outbox_transfer.c
 *	  Moving topics between nodes: idempotency.export_events(),
 *	  export_relays(), import_event() and import_relay(), so that a tenant
 *	  move takes along the events its relays have not delivered yet, and
 *	  the relays' state; export_dead_letters() and import_dead_letter()
 *	  for their dead letters.
 *
 * What moves.  An event moves if some relay of its topic has not
 * acknowledged it (every event a topic keeps, if it has no relay), with
 * its event id, key, headers, payload and publication time, and the names
 * of the relays that did acknowledge it (delivered_by).  A relay moves
 * with its generation, batch number, a loss not acknowledged yet and its
 * creation time, which names it across nodes.  Event numbers, transaction
 * ids and snapshots are the node's own and do not move.
 *
 * In which order.  Events are exported topic by topic, those acknowledged
 * by more relays first, those acknowledged by the same relays together (in
 * the order of the relays' names), then in ev_id order (ord numbers them),
 * and imported in that order in one transaction: each takes a new ev_id
 * there, in that order.  A relay's acknowledged events are then the first
 * ones of the topic's import whenever the relays' acknowledged sets are
 * nested (always with one relay); a key's events stay in the order their
 * transactions committed (a relay that acknowledged one acknowledged the
 * key's earlier ones, so they are not behind it).
 *
 * Exactly once.  Relays are imported before their topic's events, in the
 * same transaction (import_relay() refuses once the transaction imported
 * events of the topic).  It decides, under the relay's lock, what the
 * import does to the local relay:
 *
 *	- none here: "inserted", and it will read every event the topic keeps
 *	  here, as a relay never seen does, the imported ones, then what
 *	  commits later;
 *	- one of the same creation time, as far as the import or further (a
 *	  retried import, or the relay went on here): "kept", left as it is;
 *	- one of the same creation time, behind the import (the tenant comes
 *	  back): "replaced", and it reads the imported events, then what
 *	  commits later, not the older events here;
 *	- another relay of that name, that has delivered everything here: the
 *	  same, merged (the higher generation and batch); one with events not
 *	  delivered here is refused (55000), since its position cannot be both.
 *
 * An event already here (same role, topic and event id) is not written
 * again, unless a replaced relay that has not acknowledged it would not
 * read the copy here (it is older than the imported position); nor is one
 * no longer here when every relay imported for its topic was kept (a
 * retried import after they delivered it and its segment was dropped): a
 * retried import writes nothing twice.  Events are imported under a lock of their
 * topic held to the end of the transaction, so two imports of one topic
 * take turns.
 *
 * Where the relays are placed: at the end of the importing transaction
 * (XACT_EVENT_PRE_COMMIT, or PRE_PREPARE), once its events are all
 * written, each inserted or replaced relay gets a window holding the
 * transaction's events (IdemRelayPlaceImported) between snapshots taken
 * when import_relay() decided (under the relay's lock: what the relay had
 * delivered up to then is what it checked), acknowledged up to the last of
 * the relay's acknowledged events that lead the window (delivered_by):
 * those are not relayed again, the others are.  What commits after that
 * snapshot, also before the import does, lands in a later window, as with
 * any relay.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox_transfer.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"
#include "keyhash.h"
#include "outbox.h"
#include "transfer.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(idem_export_events);
PG_FUNCTION_INFO_V1(idem_export_relays);
PG_FUNCTION_INFO_V1(idem_import_event);
PG_FUNCTION_INFO_V1(idem_import_relay);
PG_FUNCTION_INFO_V1(idem_export_dead_letters);
PG_FUNCTION_INFO_V1(idem_import_dead_letter);

/* Columns of idempotency.event_record */
#define Natts_event_record		10
#define EV_ROLE					0
#define EV_TOPIC				1
#define EV_ORD					2
#define EV_EVENT_ID				3
#define EV_KEY					4
#define EV_HEADERS				5
#define EV_PAYLOAD				6
#define EV_PAYLOAD_RAW			7
#define EV_PUBLISHED_AT			8
#define EV_DELIVERED_BY			9

/* Columns of idempotency.relay_record */
#define Natts_relay_record		12
#define RL_ROLE					0
#define RL_RELAY				1
#define RL_TOPIC				2
#define RL_GENERATION			3
#define RL_BATCH				4
#define RL_LOST_EVENTS			5
#define RL_LOST_FIRST_EV		6
#define RL_LOST_LAST_EV			7
#define RL_LOST_FROM			8
#define RL_LOST_TO				9
#define RL_CREATED_AT			10
#define RL_ACKED_AT				11

/* Columns of idempotency.dead_letter_record */
#define Natts_dead_letter_record	12
#define DL_ROLE					0
#define DL_RELAY				1
#define DL_TOPIC				2
#define DL_EVENT_ID				3
#define DL_KEY					4
#define DL_HEADERS				5
#define DL_PAYLOAD				6
#define DL_PAYLOAD_RAW			7
#define DL_PUBLISHED_AT			8
#define DL_REASON				9
#define DL_ATTEMPTS				10
#define DL_FAILED_AT			11

static const Oid dead_letter_record_types[Natts_dead_letter_record] = {
	NAMEOID, TEXTOID, TEXTOID, UUIDOID, TEXTOID, JSONBOID, JSONBOID,
	BYTEAOID, TIMESTAMPTZOID, TEXTOID, INT4OID, TIMESTAMPTZOID
};

static const Oid event_record_types[Natts_event_record] = {
	NAMEOID, TEXTOID, INT8OID, UUIDOID, TEXTOID, JSONBOID, JSONBOID,
	BYTEAOID, TIMESTAMPTZOID, TEXTARRAYOID
};

static const Oid relay_record_types[Natts_relay_record] = {
	NAMEOID, TEXTOID, TEXTOID, INT8OID, INT8OID, INT8OID, INT8OID, INT8OID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID
};

/* What import_relay() decided for a relay */
typedef enum IdemRelayImportMode
{
	RELAY_INSERTED,				/* none here: reads all the topic keeps */
	RELAY_REPLACED,				/* placed at the imported events */
	RELAY_KEPT					/* left as it is */
} IdemRelayImportMode;

/* A relay imported in this transaction, placed before it commits */
typedef struct IdemImportedRelay
{
	text	   *relay;
	IdemRelayImportMode mode;
	bool		has_generation;
	int64		generation;
	int64		batch;
	int64		lost_events;
	int64		lost_first_ev;
	int64		lost_last_ev;
	TimestampTz lost_from;
	TimestampTz lost_to;
	TimestampTz created_at;
	TimestampTz acked_at;
	IdemOutboxSnap snap;		/* taken on deciding, with this xid running */
	int64		seq_before;		/* an ev_id taken just before it */
	SubTransactionId subid;
} IdemImportedRelay;

/* An event this transaction imported (written), in ev_id order */
typedef struct IdemImportedEvent
{
	int64		ev;
	int			ndelivered;
	char	  **delivered_by;	/* relay names */
	SubTransactionId subid;
} IdemImportedEvent;

/* An event of the topic stored here, by event id */
typedef struct IdemPresentEvent
{
	pg_uuid_t	event_id;		/* hash key */
	int64		ev;
	int64		txid;
} IdemPresentEvent;

/* What this transaction imported of one topic of one role */
typedef struct IdemTopicImport
{
	Oid			role;
	text	   *topic;
	HTAB	   *present;		/* NULL: to be read */
	List	   *events;			/* IdemImportedEvent, in ev_id order */
	List	   *relays;			/* IdemImportedRelay */
	SubTransactionId events_from;	/* the first import_event() call's */
} IdemTopicImport;

/* In TopTransactionContext; NIL outside a transaction that imports */
static List *topic_imports = NIL;

static void IdemTransferXactCallback(XactEvent event, void *arg);
static void IdemTransferSubXactCallback(SubXactEvent event,
										SubTransactionId mySubid,
										SubTransactionId parentSubid,
										void *arg);
static IdemTopicImport *IdemTopicImportFor(Oid role, text *topic);
static void IdemPlaceImportedRelays(void);
static int64 IdemImportedPrefix(IdemTopicImport *ti, IdemRelayState *st,
								const char *relay);
static text *IdemImportedName(Datum *rec, bool *nulls, int i,
							  const char *field);
static List *IdemTopicsArg(FunctionCallInfo fcinfo);
static bool IdemTopicWanted(List *topics, text *topic);

/* registers the transaction callbacks; called once from _PG_init */
void
IdemOutboxTransferInit(void)
{
	RegisterXactCallback(IdemTransferXactCallback, NULL);
	RegisterSubXactCallback(IdemTransferSubXactCallback, NULL);
}

static void
IdemTransferXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (topic_imports != NIL)
				IdemPlaceImportedRelays();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* the memory goes with TopTransactionContext */
			topic_imports = NIL;
			break;
		default:
			break;
	}
}

/*
 * A subtransaction that rolls back takes its imports with it: the relays
 * and events it (or a subtransaction of its, whose ids are larger)
 * imported are forgotten, and the events stored here are read again.
 */
static void
IdemTransferSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
							SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	if (event != SUBXACT_EVENT_ABORT_SUB || topic_imports == NIL)
		return;
	foreach(lc, topic_imports)
	{
		IdemTopicImport *ti = (IdemTopicImport *) lfirst(lc);
		ListCell   *lc2;

		foreach(lc2, ti->relays)
		{
			IdemImportedRelay *r = (IdemImportedRelay *) lfirst(lc2);

			if (r->subid >= mySubid)
				ti->relays = foreach_delete_current(ti->relays, lc2);
		}
		foreach(lc2, ti->events)
		{
			IdemImportedEvent *e = (IdemImportedEvent *) lfirst(lc2);

			if (e->subid >= mySubid)
				ti->events = foreach_delete_current(ti->events, lc2);
		}
		if (ti->events_from >= mySubid)
			ti->events_from = InvalidSubTransactionId;
		if (ti->present != NULL)
			hash_destroy(ti->present);
		ti->present = NULL;
	}
}

/* this transaction's import of one topic, made if it has none */
static IdemTopicImport *
IdemTopicImportFor(Oid role, text *topic)
{
	ListCell   *lc;
	MemoryContext old;
	IdemTopicImport *ti;

	foreach(lc, topic_imports)
	{
		ti = (IdemTopicImport *) lfirst(lc);
		if (ti->role == role &&
			VARSIZE_ANY_EXHDR(ti->topic) == VARSIZE_ANY_EXHDR(topic) &&
			memcmp(VARDATA_ANY(ti->topic), VARDATA_ANY(topic),
				   VARSIZE_ANY_EXHDR(topic)) == 0)
			return ti;
	}
	old = MemoryContextSwitchTo(TopTransactionContext);
	ti = palloc0(sizeof(IdemTopicImport));
	ti->role = role;
	ti->topic = DatumGetTextPCopy(PointerGetDatum(topic));
	topic_imports = lappend(topic_imports, ti);
	MemoryContextSwitchTo(old);
	return ti;
}

/* is "relay" among the names? */
static bool
IdemNameIn(const char *relay, char **names, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (strcmp(names[i], relay) == 0)
			return true;
	return false;
}

/* ----------------------------------------------------------------
 * Arguments and records
 * ----------------------------------------------------------------
 */

/* the topics argument: NIL with no element, NULL (every topic) as -1 */
static List *
IdemTopicsArg(FunctionCallInfo fcinfo)
{
	ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(0);
	Datum	   *elems;
	bool	   *elemnulls;
	int			nelems;
	int			i;
	List	   *topics = NIL;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("topics must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &elemnulls, &nelems);
	for (i = 0; i < nelems; i++)
	{
		text	   *t;

		if (elemnulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("topics must not contain nulls"),
					 errdetail("Element %d is null.", i + 1)));
		t = DatumGetTextPP(elems[i]);
		IdemCheckKeyLength(VARSIZE_ANY_EXHDR(t), "topic");
		if (!IdemTopicWanted(topics, t))
			topics = lappend(topics, t);
	}
	return topics;
}

static bool
IdemTopicWanted(List *topics, text *topic)
{
	ListCell   *lc;

	foreach(lc, topics)
	{
		text	   *t = (text *) lfirst(lc);

		if (VARSIZE_ANY_EXHDR(t) == VARSIZE_ANY_EXHDR(topic) &&
			memcmp(VARDATA_ANY(t), VARDATA_ANY(topic),
				   VARSIZE_ANY_EXHDR(t)) == 0)
			return true;
	}
	return false;
}

/* a name field of an imported record: not NULL, not empty, not too long */
static text *
IdemImportedName(Datum *rec, bool *nulls, int i, const char *field)
{
	text	   *t;

	IdemRequireField(nulls[i], field);
	t = DatumGetTextPP(rec[i]);
	if (VARSIZE_ANY_EXHDR(t) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("field \"%s\" of the imported record must not be empty",
						field)));
	IdemCheckKeyLength(VARSIZE_ANY_EXHDR(t), field);
	return t;
}

/* a bigint field of an imported record that must be at least "min" */
static int64
IdemImportedAtLeast(Datum *rec, bool *nulls, int i, const char *field,
					int64 min)
{
	int64		v;

	IdemRequireField(nulls[i], field);
	v = DatumGetInt64(rec[i]);
	if (v < min)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("field \"%s\" of the imported record must be at least " INT64_FORMAT,
						field, min)));
	return v;
}

/* ----------------------------------------------------------------
 * Export
 * ----------------------------------------------------------------
 */

/* one event to export, with what its relays did */
typedef struct IdemExportEvent
{
	int64		ev;
	int			ndelivered;
	int		   *delivered;		/* indexes of the relays, ascending */
	Datum		values[Natts_event_record];
	bool		nulls[Natts_event_record];
} IdemExportEvent;

static int
IdemExportEventCmp(const void *a, const void *b)
{
	const IdemExportEvent *x = *(const IdemExportEvent *const *) a;
	const IdemExportEvent *y = *(const IdemExportEvent *const *) b;

	int			i;

	if (x->ndelivered != y->ndelivered)
		return x->ndelivered > y->ndelivered ? -1 : 1;
	/* the same relays together, so that one of them leads at least */
	for (i = 0; i < x->ndelivered; i++)
		if (x->delivered[i] != y->delivered[i])
			return x->delivered[i] < y->delivered[i] ? -1 : 1;
	return (x->ev > y->ev) - (x->ev < y->ev);
}

/* a value of the event's row, copied out of the slot */
static Datum
IdemExportValue(TupleTableSlot *slot, int attnum, bool *isnull)
{
	Datum		d = IdemEventValue(slot, attnum, isnull);
	Form_pg_attribute att = TupleDescAttr(slot->tts_tupleDescriptor,
										  attnum - 1);

	if (*isnull)
		return (Datum) 0;
	return datumCopy(d, att->attbyval, att->attlen);
}

/*
 * IdemExportTopic adds to the result the events of one topic of one role
 * that some of its relays (given) have not acknowledged, or all if it has
 * none, in the order described in the file header; *ord numbers them.
 */
static void
IdemExportTopic(Oid role, const char *role_name, text *topic, List *relays,
				Snapshot snapshot, ReturnSetInfo *rsinfo, int64 *ord)
{
	int			nrelays = list_length(relays);
	IdemRelayState **rs = palloc(Max(nrelays, 1) * sizeof(IdemRelayState *));
	int64		after = PG_INT64_MAX;
	IdemEventScan es;
	int64		ev;
	int64		txid;
	IdemExportEvent **events = NULL;
	int			nevents = 0;
	int			maxevents = 0;
	Datum	   *names = palloc(Max(nrelays, 1) * sizeof(Datum));
	int		   *which = palloc(Max(nrelays, 1) * sizeof(int));
	ListCell   *lc;
	int			i;

	i = 0;
	foreach(lc, relays)
	{
		rs[i] = (IdemRelayState *) lfirst(lc);
		after = Min(after, IdemRelayLowWater(rs[i]));
		i++;
	}
	if (nrelays == 0)
		after = 0;

	IdemEventScanBegin(&es, role, topic, after, PG_INT64_MAX, snapshot);
	while (IdemEventScanNext(&es, &ev, &txid))
	{
		TupleTableSlot *slot;
		IdemExportEvent *e;
		int			n = 0;

		for (i = 0; i < nrelays; i++)
			if (IdemRelayDelivered(rs[i], ev, txid))
			{
				which[n] = i;
				names[n++] = PointerGetDatum(rs[i]->relay);
			}
		if (nrelays > 0 && n == nrelays)
			continue;			/* delivered by every relay */
		slot = IdemEventScanFetch(&es);
		if (slot == NULL)
			continue;			/* not committed in the snapshot */
		slot_getallattrs(slot);
		e = palloc0(sizeof(IdemExportEvent));
		e->ev = ev;
		e->ndelivered = n;
		e->delivered = palloc(Max(n, 1) * sizeof(int));
		memcpy(e->delivered, which, n * sizeof(int));
		e->values[EV_ROLE] = CStringGetDatum(role_name);
		e->values[EV_TOPIC] = PointerGetDatum(topic);
		e->values[EV_EVENT_ID] = IdemExportValue(slot, Anum_outbox_event_id, &e->nulls[EV_EVENT_ID]);
		e->values[EV_KEY] = IdemExportValue(slot, Anum_outbox_key, &e->nulls[EV_KEY]);
		e->values[EV_HEADERS] = IdemExportValue(slot, Anum_outbox_headers, &e->nulls[EV_HEADERS]);
		e->values[EV_PAYLOAD] = IdemExportValue(slot, Anum_outbox_payload, &e->nulls[EV_PAYLOAD]);
		e->values[EV_PAYLOAD_RAW] = IdemExportValue(slot, Anum_outbox_payload_raw, &e->nulls[EV_PAYLOAD_RAW]);
		e->values[EV_PUBLISHED_AT] = IdemExportValue(slot, Anum_outbox_published_at, &e->nulls[EV_PUBLISHED_AT]);
		e->values[EV_DELIVERED_BY] =
			PointerGetDatum(construct_array(names, n, TEXTOID, -1, false,
											TYPALIGN_INT));
		if (nevents == maxevents)
		{
			maxevents = Max(maxevents * 2, 64);
			events = events == NULL ?
				palloc(maxevents * sizeof(IdemExportEvent *)) :
				repalloc(events, maxevents * sizeof(IdemExportEvent *));
		}
		events[nevents++] = e;
	}
	IdemEventScanEnd(&es);

	if (nevents > 0)
		qsort(events, nevents, sizeof(IdemExportEvent *), IdemExportEventCmp);
	for (i = 0; i < nevents; i++)
	{
		IdemExportEvent *e = events[i];
		NameData	name;

		namestrcpy(&name, role_name);
		e->values[EV_ROLE] = NameGetDatum(&name);
		e->values[EV_ORD] = Int64GetDatum(++(*ord));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, e->values,
							 e->nulls);
	}
	pfree(rs);
	pfree(names);
	pfree(which);
}

/* a (role, topic) pair that has events */
typedef struct IdemRoleTopic
{
	Oid			role;
	text	   *topic;
} IdemRoleTopic;

static int
IdemRoleTopicCmp(const void *a, const void *b)
{
	const IdemRoleTopic *x = (const IdemRoleTopic *) a;
	const IdemRoleTopic *y = (const IdemRoleTopic *) b;
	int			lx = VARSIZE_ANY_EXHDR(x->topic);
	int			ly = VARSIZE_ANY_EXHDR(y->topic);
	int			c;

	if (x->role != y->role)
		return x->role < y->role ? -1 : 1;
	c = memcmp(VARDATA_ANY(x->topic), VARDATA_ANY(y->topic), Min(lx, ly));
	if (c != 0)
		return c;
	return (lx > ly) - (lx < ly);
}

/*
 * IdemTopicsWithEvents returns the (role, topic) pairs of every event
 * stored (a scan of every segment), sorted, without duplicates.
 */
static IdemRoleTopic *
IdemTopicsWithEvents(Snapshot snapshot, int *count)
{
	IdemOutboxSegment *segs;
	int			nsegs = IdemOutboxSegments(&segs);
	IdemRoleTopic *pairs = NULL;
	int			n = 0;
	int			max = 0;
	int			i;
	int			u = 0;

	for (i = 0; i < nsegs; i++)
	{
		Relation	heap;
		TableScanDesc scan;
		TupleTableSlot *slot;

		LockRelationOid(segs[i].relid, AccessShareLock);
		if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(segs[i].relid)))
		{
			UnlockRelationOid(segs[i].relid, AccessShareLock);
			continue;
		}
		heap = table_open(segs[i].relid, NoLock);
		slot = table_slot_create(heap, NULL);
		scan = table_beginscan(heap, snapshot, 0, NULL);
		while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Oid			role = DatumGetObjectId(slot_getattr(slot, Anum_outbox_role, &isnull));
			text	   *topic = DatumGetTextPP(slot_getattr(slot, Anum_outbox_topic, &isnull));

			if (n > 0 && pairs[n - 1].role == role &&
				VARSIZE_ANY_EXHDR(pairs[n - 1].topic) == VARSIZE_ANY_EXHDR(topic) &&
				memcmp(VARDATA_ANY(pairs[n - 1].topic), VARDATA_ANY(topic),
					   VARSIZE_ANY_EXHDR(topic)) == 0)
				continue;
			if (n == max)
			{
				max = Max(max * 2, 64);
				pairs = pairs == NULL ? palloc(max * sizeof(IdemRoleTopic)) :
					repalloc(pairs, max * sizeof(IdemRoleTopic));
			}
			pairs[n].role = role;
			pairs[n].topic = DatumGetTextPCopy(PointerGetDatum(topic));
			n++;
		}
		table_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		table_close(heap, NoLock);
	}
	pfree(segs);
	if (n > 1)
		qsort(pairs, n, sizeof(IdemRoleTopic), IdemRoleTopicCmp);
	for (i = 0; i < n; i++)
		if (u == 0 || IdemRoleTopicCmp(&pairs[u - 1], &pairs[i]) != 0)
			pairs[u++] = pairs[i];
	*count = u;
	return pairs;
}

/* the relays of one topic of one role, from the list of all */
static List *
IdemRelaysOf(List *all, Oid role, text *topic)
{
	List	   *result = NIL;
	ListCell   *lc;

	foreach(lc, all)
	{
		IdemRelayState *st = (IdemRelayState *) lfirst(lc);

		if (st->role == role &&
			VARSIZE_ANY_EXHDR(st->topic) == VARSIZE_ANY_EXHDR(topic) &&
			memcmp(VARDATA_ANY(st->topic), VARDATA_ANY(topic),
				   VARSIZE_ANY_EXHDR(topic)) == 0)
			result = lappend(result, st);
	}
	return result;
}

/*
 * idempotency.export_events(topics text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.event_record
 *
 * The events of the given topics (NULL: every topic), of every role, that
 * some relay of their topic has not acknowledged (all of a topic without
 * relays), committed in the statement's snapshot.
 */
Datum
idem_export_events(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *topics = NIL;
	List	   *relays;
	Snapshot	snapshot;
	IdemRoleTopic *pairs = NULL;
	int			npairs = 0;
	int64		ord = 0;
	int			i;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	if (!PG_ARGISNULL(0))
	{
		topics = IdemTopicsArg(fcinfo);
		if (topics == NIL)
			return (Datum) 0;
	}
	if (!OidIsValid(IdemOutboxParent(false)))
		return (Datum) 0;
	relays = IdemRelayList(InvalidOid, true);
	snapshot = RegisterSnapshot(GetTransactionSnapshot());

	if (topics == NIL)
		pairs = IdemTopicsWithEvents(snapshot, &npairs);
	else
	{
		/* every role, each of the topics: an index probe per segment */
		Relation	authid = table_open(AuthIdRelationId, AccessShareLock);
		TableScanDesc scan = table_beginscan_catalog(authid, 0, NULL);
		HeapTuple	tup;
		int			max = 0;

		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			Oid			role = ((Form_pg_authid) GETSTRUCT(tup))->oid;
			ListCell   *lc;

			foreach(lc, topics)
			{
				if (npairs == max)
				{
					max = Max(max * 2, 64);
					pairs = pairs == NULL ? palloc(max * sizeof(IdemRoleTopic)) :
						repalloc(pairs, max * sizeof(IdemRoleTopic));
				}
				pairs[npairs].role = role;
				pairs[npairs].topic = (text *) lfirst(lc);
				npairs++;
			}
		}
		table_endscan(scan);
		table_close(authid, AccessShareLock);
		if (npairs > 1)
			qsort(pairs, npairs, sizeof(IdemRoleTopic), IdemRoleTopicCmp);
	}

	for (i = 0; i < npairs; i++)
	{
		char	   *role_name = GetUserNameFromId(pairs[i].role, true);

		if (role_name == NULL)
			continue;			/* the role was dropped */
		IdemExportTopic(pairs[i].role, role_name, pairs[i].topic,
						IdemRelaysOf(relays, pairs[i].role, pairs[i].topic),
						snapshot, rsinfo, &ord);
	}
	UnregisterSnapshot(snapshot);
	return (Datum) 0;
}

/*
 * idempotency.export_relays(topics text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.relay_record
 *
 * The relays of the given topics (NULL: every topic), of every role, with
 * what of their state can move.
 */
Datum
idem_export_relays(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *topics = NIL;
	List	   *relays;
	ListCell   *lc;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	if (!PG_ARGISNULL(0))
	{
		topics = IdemTopicsArg(fcinfo);
		if (topics == NIL)
			return (Datum) 0;
	}
	relays = IdemRelayList(InvalidOid, true);
	foreach(lc, relays)
	{
		IdemRelayState *st = (IdemRelayState *) lfirst(lc);
		Datum		v[Natts_relay_record];
		bool		n[Natts_relay_record];
		char	   *role_name;
		NameData	name;

		if (topics != NIL && !IdemTopicWanted(topics, st->topic))
			continue;
		role_name = GetUserNameFromId(st->role, true);
		if (role_name == NULL)
			continue;
		memset(n, 0, sizeof(n));
		namestrcpy(&name, role_name);
		v[RL_ROLE] = NameGetDatum(&name);
		v[RL_RELAY] = PointerGetDatum(st->relay);
		v[RL_TOPIC] = PointerGetDatum(st->topic);
		v[RL_GENERATION] = Int64GetDatum(st->generation);
		n[RL_GENERATION] = !st->has_generation;
		v[RL_BATCH] = Int64GetDatum(st->batch);
		v[RL_LOST_EVENTS] = Int64GetDatum(st->lost_events);
		v[RL_LOST_FIRST_EV] = Int64GetDatum(st->lost_first_ev);
		v[RL_LOST_LAST_EV] = Int64GetDatum(st->lost_last_ev);
		v[RL_LOST_FROM] = TimestampTzGetDatum(st->lost_from);
		v[RL_LOST_TO] = TimestampTzGetDatum(st->lost_to);
		n[RL_LOST_FIRST_EV] = n[RL_LOST_LAST_EV] = n[RL_LOST_FROM] =
			n[RL_LOST_TO] = (st->lost_events == 0);
		v[RL_CREATED_AT] = TimestampTzGetDatum(st->created_at);
		v[RL_ACKED_AT] = TimestampTzGetDatum(st->acked_at);
		n[RL_ACKED_AT] = (st->acked_at == 0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, n);
	}
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * Import
 * ----------------------------------------------------------------
 */

/* is the relay (gen, batch) further than the local one? */
static bool
IdemRelayFurther(bool has_gen, int64 gen, int64 batch,
				 const IdemRelayState *local)
{
	if (has_gen != local->has_generation)
		return has_gen;
	if (has_gen && gen != local->generation)
		return gen > local->generation;
	return batch > local->batch;
}

/*
 * idempotency.import_relay(r record) RETURNS text
 *
 * Takes one exported relay: inserted, replaced or kept (see the file
 * header); placed when the transaction commits.
 */
Datum
idem_import_relay(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_relay_record];
	bool		nulls[Natts_relay_record];
	Oid			role;
	text	   *relay;
	text	   *topic;
	IdemImportedRelay in;
	IdemTopicImport *ti;
	IdemRelayState st;
	IdemImportOutcome outcome;
	ListCell   *lc;
	char	   *relay_name;

	IdemCheckLibraryVersion();
	IdemDeformRecord(fcinfo, Natts_relay_record, Natts_relay_record,
					 relay_record_types, "relay_record", rec, nulls);
	role = IdemImportRole(rec[RL_ROLE], nulls[RL_ROLE]);
	relay = IdemImportedName(rec, nulls, RL_RELAY, "relay");
	topic = IdemImportedName(rec, nulls, RL_TOPIC, "topic");
	memset(&in, 0, sizeof(in));
	in.has_generation = !nulls[RL_GENERATION];
	if (in.has_generation)
		in.generation = IdemImportedAtLeast(rec, nulls, RL_GENERATION,
											"generation", 0);
	in.batch = IdemImportedAtLeast(rec, nulls, RL_BATCH, "batch", 1);
	in.lost_events = IdemImportedAtLeast(rec, nulls, RL_LOST_EVENTS,
										 "lost_events", 0);
	if (in.lost_events > 0)
	{
		in.lost_first_ev = IdemImportedAtLeast(rec, nulls, RL_LOST_FIRST_EV,
											   "lost_first_ev", 1);
		in.lost_last_ev = IdemImportedAtLeast(rec, nulls, RL_LOST_LAST_EV,
											  "lost_last_ev", in.lost_first_ev);
		IdemRequireField(nulls[RL_LOST_FROM], "lost_from");
		IdemRequireField(nulls[RL_LOST_TO], "lost_to");
		in.lost_from = DatumGetTimestampTz(rec[RL_LOST_FROM]);
		in.lost_to = DatumGetTimestampTz(rec[RL_LOST_TO]);
	}
	IdemRequireField(nulls[RL_CREATED_AT], "created_at");
	in.created_at = DatumGetTimestampTz(rec[RL_CREATED_AT]);
	in.acked_at = nulls[RL_ACKED_AT] ? 0 : DatumGetTimestampTz(rec[RL_ACKED_AT]);
	IdemCheckWritable("idempotency.import_relay()");

	relay_name = text_to_cstring(relay);
	ti = IdemTopicImportFor(role, topic);
	if (ti->events_from != InvalidSubTransactionId)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relay \"%s\" of topic \"%s\" is imported after events of its topic",
						IdemKeyForMessage(relay_name),
						IdemKeyForMessage(text_to_cstring(topic))),
				 errdetail("Where its acknowledged events end among the imported ones is decided by the events imported after it."),
				 errhint("Import a topic's relays first, then its events, in one transaction.")));

	/* imported twice in this transaction: the further one stays */
	foreach(lc, ti->relays)
	{
		IdemImportedRelay *r = (IdemImportedRelay *) lfirst(lc);
		IdemRelayState prev;

		if (strcmp(text_to_cstring(r->relay), relay_name) != 0)
			continue;
		memset(&prev, 0, sizeof(prev));
		prev.has_generation = r->has_generation;
		prev.generation = r->generation;
		prev.batch = r->batch;
		if (r->mode == RELAY_KEPT ||
			!IdemRelayFurther(in.has_generation, in.generation, in.batch, &prev))
			PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_KEPT));
		in.relay = r->relay;
		in.mode = r->mode;
		in.snap = r->snap;
		in.seq_before = r->seq_before;
		in.subid = r->subid;
		*r = in;
		PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_REPLACED));
	}

	IdemRelayLock(role, relay, topic, false, NULL);
	IdemRelayLoad(role, relay, topic, &st);

	/*
	 * Where its window will end (IdemRelayPlaceImported): taken before the
	 * relay's lag is read below, so that no event visible in the snapshot
	 * escapes that check.
	 */
	(void) IdemOutboxCurrentTxid();
	in.seq_before = IdemOutboxNextEvId();
	IdemOutboxTakeSnap(&in.snap);

	if (!st.found)
	{
		in.mode = RELAY_INSERTED;
		outcome = IDEM_IMPORT_INSERTED;
	}
	else if (st.created_at == in.created_at)
	{
		if (IdemRelayFurther(in.has_generation, in.generation, in.batch, &st))
		{
			in.mode = RELAY_REPLACED;
			outcome = IDEM_IMPORT_REPLACED;
		}
		else
		{
			in.mode = RELAY_KEPT;
			outcome = IDEM_IMPORT_KEPT;
		}
	}
	else
	{
		int64		lag = 0;
		double		seconds;

		IdemRelayLag(&st, &lag, &seconds);
		if (lag > 0 || st.handed_out || st.lost_events > 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("relay \"%s\" of topic \"%s\" has events on this node that it has not acknowledged",
							IdemKeyForMessage(relay_name),
							IdemKeyForMessage(text_to_cstring(topic))),
					 errdetail("It is another relay than the imported one (created at another time), " INT64_FORMAT " events behind here.",
							   lag),
					 errhint("Let it relay them first, or import the relay under another name.")));
		/* merged: the higher generation and batch */
		if (st.has_generation &&
			(!in.has_generation || st.generation > in.generation))
		{
			in.has_generation = true;
			in.generation = st.generation;
		}
		in.batch = Max(in.batch, st.batch);
		in.mode = RELAY_REPLACED;
		outcome = IDEM_IMPORT_REPLACED;
	}

	{
		MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
		IdemImportedRelay *r = palloc(sizeof(IdemImportedRelay));

		*r = in;
		r->relay = DatumGetTextPCopy(PointerGetDatum(relay));
		r->snap.xip = palloc(Max(in.snap.nxip, 1) * sizeof(int64));
		memcpy(r->snap.xip, in.snap.xip, in.snap.nxip * sizeof(int64));
		r->subid = GetCurrentSubTransactionId();
		ti->relays = lappend(ti->relays, r);
		MemoryContextSwitchTo(old);
	}
	PG_RETURN_TEXT_P(IdemImportOutcomeText(outcome));
}

/* reads the events of the topic stored here into ti->present */
static void
IdemReadPresent(IdemTopicImport *ti)
{
	HASHCTL		ctl;
	Snapshot	snapshot;
	IdemEventScan es;
	int64		ev;
	int64		txid;

	ctl.keysize = sizeof(pg_uuid_t);
	ctl.entrysize = sizeof(IdemPresentEvent);
	ctl.hcxt = TopTransactionContext;
	ti->present = hash_create("idempotency imported events", 256, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	if (!OidIsValid(IdemOutboxParent(false)))
		return;
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IdemEventScanBegin(&es, ti->role, ti->topic, 0, PG_INT64_MAX, snapshot);
	while (IdemEventScanNext(&es, &ev, &txid))
	{
		TupleTableSlot *slot = IdemEventScanFetch(&es);
		bool		isnull;
		bool		found;
		IdemPresentEvent *p;

		if (slot == NULL)
			continue;
		p = hash_search(ti->present,
						DatumGetUUIDP(slot_getattr(slot, Anum_outbox_event_id, &isnull)),
						HASH_ENTER, &found);
		p->ev = ev;
		p->txid = txid;
	}
	IdemEventScanEnd(&es);
	UnregisterSnapshot(snapshot);
}

/*
 * idempotency.import_event(e record) RETURNS text
 *
 * Writes one exported event into this node's outbox, with its event id
 * and publication time, unless it is here already: inserted or kept.
 */
Datum
idem_import_event(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_event_record];
	bool		nulls[Natts_event_record];
	Oid			role;
	text	   *topic;
	text	   *key = NULL;
	pg_uuid_t  *event_id;
	TimestampTz published_at;
	char	  **delivered = NULL;
	int			ndelivered = 0;
	IdemTopicImport *ti;
	IdemPresentEvent *p;
	LOCKTAG		tag;
	int64		ev;
	int64		mine;
	bool		found;
	int			i;

	IdemCheckLibraryVersion();
	IdemDeformRecord(fcinfo, Natts_event_record, Natts_event_record,
					 event_record_types, "event_record", rec, nulls);
	role = IdemImportRole(rec[EV_ROLE], nulls[EV_ROLE]);
	topic = IdemImportedName(rec, nulls, EV_TOPIC, "topic");
	IdemRequireField(nulls[EV_EVENT_ID], "event_id");
	event_id = DatumGetUUIDP(rec[EV_EVENT_ID]);
	if (!nulls[EV_KEY])
		key = IdemImportedName(rec, nulls, EV_KEY, "key");
	IdemRequireField(nulls[EV_PUBLISHED_AT], "published_at");
	published_at = DatumGetTimestampTz(rec[EV_PUBLISHED_AT]);
	if (!nulls[EV_DELIVERED_BY])
	{
		ArrayType  *arr = DatumGetArrayTypeP(rec[EV_DELIVERED_BY]);
		Datum	   *elems;
		bool	   *elemnulls;

		if (ARR_NDIM(arr) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("field \"%s\" of the imported record must be a one-dimensional array",
							"delivered_by")));
		deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, &elemnulls, &ndelivered);
		delivered = palloc(Max(ndelivered, 1) * sizeof(char *));
		for (i = 0; i < ndelivered; i++)
		{
			text	   *t;

			if (elemnulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("field \"%s\" of the imported record must not contain nulls",
								"delivered_by")));
			t = DatumGetTextPP(elems[i]);
			if (VARSIZE_ANY_EXHDR(t) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("field \"%s\" of the imported record must not contain empty names",
								"delivered_by")));
			IdemCheckKeyLength(VARSIZE_ANY_EXHDR(t), "relay");
			delivered[i] = text_to_cstring(t);
		}
	}
	IdemOutboxCheckEvent("idempotency.import_event()", key,
						 rec[EV_HEADERS], nulls[EV_HEADERS],
						 rec[EV_PAYLOAD], nulls[EV_PAYLOAD],
						 rec[EV_PAYLOAD_RAW], nulls[EV_PAYLOAD_RAW]);
	IdemCheckWritable("idempotency.import_event()");

	/* imports of one topic take turns (see the file header) */
	IdemSetStreamLockTag(&tag, IDEM_LOCK_OUTBOX_IMPORT, role,
						 VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic),
						 "", 0, 0);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	ti = IdemTopicImportFor(role, topic);
	if (ti->events_from == InvalidSubTransactionId)
		ti->events_from = GetCurrentSubTransactionId();
	if (ti->present == NULL)
		IdemReadPresent(ti);
	mine = IdemOutboxCurrentTxid();
	p = hash_search(ti->present, event_id, HASH_FIND, &found);
	if (p != NULL)
	{
		bool		again = false;
		ListCell   *lc;

		/*
		 * Here already.  Written by this transaction: nothing to do.  Else
		 * the copy here serves unless a replaced relay that has not
		 * acknowledged the event would not read it (it is before the
		 * imported position).
		 */
		if (p->txid != mine)
		{
			foreach(lc, ti->relays)
			{
				IdemImportedRelay *r = (IdemImportedRelay *) lfirst(lc);

				if (r->mode == RELAY_REPLACED &&
					!IdemNameIn(text_to_cstring(r->relay), delivered, ndelivered))
					again = true;
			}
		}
		if (!again)
			PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_KEPT));
	}
	else if (ti->relays != NIL)
	{
		bool		all_kept = true;
		ListCell   *lc;

		/*
		 * Not here, and every relay this transaction imported for the
		 * topic is kept (as far here as the export, or further): a retried
		 * import, after the copy was delivered by them and dropped with its
		 * segment.  Writing it again would relay it again.
		 */
		foreach(lc, ti->relays)
			if (((IdemImportedRelay *) lfirst(lc))->mode != RELAY_KEPT)
				all_kept = false;
		if (all_kept)
			PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_KEPT));
	}

	(void) IdemOutboxWriteEvent(role, topic, key,
								rec[EV_HEADERS], nulls[EV_HEADERS],
								rec[EV_PAYLOAD], nulls[EV_PAYLOAD],
								rec[EV_PAYLOAD_RAW], nulls[EV_PAYLOAD_RAW],
								event_id, published_at, &ev);

	{
		MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
		IdemImportedEvent *e = palloc(sizeof(IdemImportedEvent));

		p = hash_search(ti->present, event_id, HASH_ENTER, &found);
		p->ev = ev;
		p->txid = mine;
		e->ev = ev;
		e->ndelivered = ndelivered;
		e->delivered_by = palloc(Max(ndelivered, 1) * sizeof(char *));
		for (i = 0; i < ndelivered; i++)
			e->delivered_by[i] = pstrdup(delivered[i]);
		e->subid = GetCurrentSubTransactionId();
		ti->events = lappend(ti->events, e);
		MemoryContextSwitchTo(old);
	}
	PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_INSERTED));
}

/* ----------------------------------------------------------------
 * Dead letters
 * ----------------------------------------------------------------
 */

typedef struct IdemDeadLetterExport
{
	List	   *topics;			/* NIL: every topic */
	ReturnSetInfo *rsinfo;
} IdemDeadLetterExport;

/* adds one dead letter (the role as an OID) to export_dead_letters() */
static void
IdemEmitDeadLetter(Datum *values, bool *nulls, void *arg)
{
	IdemDeadLetterExport *x = (IdemDeadLetterExport *) arg;
	Oid			role = DatumGetObjectId(values[DL_ROLE]);
	char	   *role_name;
	NameData	name;

	if (x->topics != NIL &&
		!IdemTopicWanted(x->topics, DatumGetTextPP(values[DL_TOPIC])))
		return;
	role_name = GetUserNameFromId(role, true);
	if (role_name == NULL)
		return;					/* the role was dropped */
	namestrcpy(&name, role_name);
	values[DL_ROLE] = NameGetDatum(&name);
	tuplestore_putvalues(x->rsinfo->setResult, x->rsinfo->setDesc, values,
						 nulls);
}

/*
 * idempotency.export_dead_letters(topics text[] DEFAULT NULL)
 *		RETURNS SETOF idempotency.dead_letter_record
 *
 * The dead letters of the relays of the given topics (NULL: every topic),
 * of every role.
 */
Datum
idem_export_dead_letters(PG_FUNCTION_ARGS)
{
	IdemDeadLetterExport x;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);
	x.topics = NIL;
	x.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	if (!PG_ARGISNULL(0))
	{
		x.topics = IdemTopicsArg(fcinfo);
		if (x.topics == NIL)
			return (Datum) 0;
	}
	IdemRelayDeadLettersAll(IdemEmitDeadLetter, &x);
	return (Datum) 0;
}

/*
 * idempotency.import_dead_letter(d record) RETURNS text
 *
 * Stores one exported dead letter unless this node has one of the same
 * relay and event that failed as late: inserted, replaced or kept; one
 * recorded before idempotency.outbox_max_age ago is expired (maintenance
 * would remove it).
 */
Datum
idem_import_dead_letter(PG_FUNCTION_ARGS)
{
	Datum		rec[Natts_dead_letter_record];
	bool		nulls[Natts_dead_letter_record];
	text	   *key = NULL;
	TimestampTz failed_at;

	IdemCheckLibraryVersion();
	IdemDeformRecord(fcinfo, Natts_dead_letter_record,
					 Natts_dead_letter_record, dead_letter_record_types,
					 "dead_letter_record", rec, nulls);
	rec[DL_ROLE] = ObjectIdGetDatum(IdemImportRole(rec[DL_ROLE], nulls[DL_ROLE]));
	rec[DL_RELAY] = PointerGetDatum(IdemImportedName(rec, nulls, DL_RELAY, "relay"));
	rec[DL_TOPIC] = PointerGetDatum(IdemImportedName(rec, nulls, DL_TOPIC, "topic"));
	IdemRequireField(nulls[DL_EVENT_ID], "event_id");
	if (!nulls[DL_KEY])
	{
		key = IdemImportedName(rec, nulls, DL_KEY, "key");
		rec[DL_KEY] = PointerGetDatum(key);
	}
	IdemRequireField(nulls[DL_PUBLISHED_AT], "published_at");
	IdemRequireField(nulls[DL_FAILED_AT], "failed_at");
	failed_at = DatumGetTimestampTz(rec[DL_FAILED_AT]);
	if (!nulls[DL_REASON] &&
		VARSIZE_ANY_EXHDR(DatumGetTextPP(rec[DL_REASON])) > idem_max_response_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("reason is longer than \"idempotency.max_response_bytes\" (%d)",
						idem_max_response_bytes)));
	if (!nulls[DL_ATTEMPTS] && DatumGetInt32(rec[DL_ATTEMPTS]) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("field \"%s\" of the imported record must not be negative",
						"attempts")));
	IdemOutboxCheckEvent("idempotency.import_dead_letter()", key,
						 rec[DL_HEADERS], nulls[DL_HEADERS],
						 rec[DL_PAYLOAD], nulls[DL_PAYLOAD],
						 rec[DL_PAYLOAD_RAW], nulls[DL_PAYLOAD_RAW]);
	IdemCheckWritable("idempotency.import_dead_letter()");

	if (failed_at < GetCurrentTimestamp() -
		(int64) idem_outbox_max_age * USECS_PER_SEC)
		PG_RETURN_TEXT_P(IdemImportOutcomeText(IDEM_IMPORT_EXPIRED));
	PG_RETURN_TEXT_P(IdemImportOutcomeText(IdemRelayDeadLetterImport(rec, nulls)));
}

/* ----------------------------------------------------------------
 * Placing the imported relays, as the transaction commits
 * ----------------------------------------------------------------
 */

/*
 * IdemImportedPrefix returns the ev_id up to which the relay's window
 * (just placed) is acknowledged: the window's entries are read in ev_id
 * order, and as long as each is an event this transaction imported that
 * the relay had acknowledged, it is acknowledged here too.  Anything else
 * (another transaction's event in the window, one the relay had not
 * acknowledged, one this transaction published itself) ends the prefix.
 */
static int64
IdemImportedPrefix(IdemTopicImport *ti, IdemRelayState *st, const char *relay)
{
	int64		acked = 0;
	int64		mine;
	Snapshot	snapshot;
	IdemEventScan es;
	int64		ev;
	int64		txid;
	ListCell   *next;

	if (ti->events == NIL)
		return 0;
	mine = IdemOutboxCurrentTxid();
	next = list_head(ti->events);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IdemEventScanBegin(&es, ti->role, ti->topic, 0, st->up_seq_after,
					   snapshot);
	while (IdemEventScanNext(&es, &ev, &txid))
	{
		IdemImportedEvent *e = NULL;

		if (!IdemRelayInWindow(st, txid))
			continue;
		if (txid != mine)
			break;
		while (next != NULL &&
			   ((IdemImportedEvent *) lfirst(next))->ev < ev)
			next = lnext(ti->events, next);
		if (next != NULL && ((IdemImportedEvent *) lfirst(next))->ev == ev)
			e = (IdemImportedEvent *) lfirst(next);
		if (e == NULL || !IdemNameIn(relay, e->delivered_by, e->ndelivered))
			break;
		acked = ev;
	}
	IdemEventScanEnd(&es);
	UnregisterSnapshot(snapshot);
	return acked;
}

/*
 * IdemPlaceImportedRelays writes the position of every relay this
 * transaction imported and did not keep (see the file header).  Runs just
 * before the transaction commits or prepares, when its events are all
 * written; under the relays' locks, which the imports took.
 */
static void
IdemPlaceImportedRelays(void)
{
	ListCell   *lc;
	bool		pushed = false;

	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		pushed = true;
	}
	foreach(lc, topic_imports)
	{
		IdemTopicImport *ti = (IdemTopicImport *) lfirst(lc);
		ListCell   *lc2;

		foreach(lc2, ti->relays)
		{
			IdemImportedRelay *r = (IdemImportedRelay *) lfirst(lc2);
			IdemRelayState st;
			char	   *relay = text_to_cstring(r->relay);

			if (r->mode == RELAY_KEPT)
				continue;
			IdemRelayLoad(ti->role, r->relay, ti->topic, &st);
			st.has_generation = r->has_generation;
			st.generation = r->generation;
			st.batch = r->batch;
			st.lost_events = r->lost_events;
			st.lost_first_ev = r->lost_first_ev;
			st.lost_last_ev = r->lost_last_ev;
			st.lost_from = r->lost_from;
			st.lost_to = r->lost_to;
			st.created_at = r->created_at;
			st.acked_at = r->acked_at;
			IdemRelayPlaceImported(&st, &r->snap, r->seq_before,
								   r->mode == RELAY_INSERTED);
			st.acked_ev = IdemImportedPrefix(ti, &st, relay);
			IdemRelayStore(&st);
			pfree(relay);
		}
	}
	if (pushed)
		PopActiveSnapshot();
}

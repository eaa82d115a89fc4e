/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  The transactional outbox: events written in the caller's transaction
 *	  (idem_publish), read by relays in commit order and acknowledged in
 *	  theirs (idem_outbox_next, idem_outbox_ack), stored in segments that
 *	  maintenance drops.
 *
 * How it holds together (doc/design.md, "The outbox", gives the reasons):
 *
 *	- Every event row carries its event number (ev_id, from one sequence,
 *	  taken after the transaction's top-level xid is assigned) and that
 *	  xid, widened to 64 bits and offset by the database's xid base (so
 *	  that rows restored into another cluster still compare right; see
 *	  IdemOutboxXidBase).  Each segment (a partition of idempotency.outbox)
 *	  has a btree on (role, topic, ev_id) INCLUDE (txid): events carry
 *	  their role's OID and topic name (collation "C"), so that publishing
 *	  to a new topic makes nothing another transaction would wait for.
 *
 *	- A relay's position is a window between two snapshots it took
 *	  itself, as PgQ's ticks: the window's events are those whose
 *	  transaction is visible in the upper snapshot and not in the lower
 *	  one, read in ev_id order.  A transaction that commits late lands in
 *	  the window in which it became visible, whatever its ev_ids.  Since
 *	  ev_ids are taken after the xid, the events of a transaction that
 *	  was running when the lower snapshot was taken all have ev_ids above
 *	  a floor recorded when that transaction was first seen running; the
 *	  window is read from the lowest floor of the transactions that
 *	  committed in it (outbox_relay.c).
 *
 *	- Publishers of one key hold a lock on it to the end of their
 *	  transaction and take their ev_id under it: a key's events have
 *	  ev_ids in the order their transactions committed.
 *
 * Files: outbox_storage.c (the tables, the segments and the xid base),
 * outbox_publish.c (idem_publish), outbox_relay.c (windows,
 * idem_outbox_next and _ack, dead letters, lag), outbox_position.c (the
 * relays' rows: one place, so that they can move off SPI), outbox_maintain.c
 * (what maintenance does) and outbox_observe.c (monitoring).
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/outbox.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_OUTBOX_H
#define IDEMPOTENCY_OUTBOX_H

#include "idempotency.h"
#include "transfer.h"

#include "access/htup.h"
#include "nodes/execnodes.h"
#include "nodes/pg_list.h"
#include "storage/lock.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"

/* SQLSTATEs of the outbox (ID001 is streams.c's, for the same fencing) */
#define ERRCODE_IDEM_STALE_GENERATION	MAKE_SQLSTATE('I','D','0','0','1')
#define ERRCODE_IDEM_OUTBOX_LOST		MAKE_SQLSTATE('I','D','0','0','3')

/* Columns of the events table, idempotency.outbox */
#define Anum_outbox_seg				1
#define Anum_outbox_role			2
#define Anum_outbox_topic			3
#define Anum_outbox_ev_id			4
#define Anum_outbox_txid			5
#define Anum_outbox_event_id		6
#define Anum_outbox_published_at	7
#define Anum_outbox_key				8
#define Anum_outbox_headers			9
#define Anum_outbox_payload			10
#define Anum_outbox_payload_raw		11
#define Natts_outbox				11

/* Columns of a segment's index: (role, topic, ev_id) INCLUDE (txid) */
#define OUTBOX_INDEX_ROLE			1
#define OUTBOX_INDEX_TOPIC			2
#define OUTBOX_INDEX_EV_ID			3
#define OUTBOX_INDEX_TXID			4

/* ----------------------------------------------------------------
 * Storage (outbox_storage.c)
 * ----------------------------------------------------------------
 */

/* One segment: an attached partition of idempotency.outbox */
typedef struct IdemOutboxSegment
{
	int32		seg;			/* its value of the partition key */
	Oid			relid;
} IdemOutboxSegment;

extern void IdemOutboxStorageInit(void);
extern Oid	IdemOutboxParent(bool create);
extern int	IdemOutboxSegments(IdemOutboxSegment **out);
extern uint64 IdemOutboxSegmentsGeneration(void);
extern Oid	IdemOutboxNewestSegment(LOCKMODE lockmode, int32 *seg);
extern Oid	IdemOutboxCreateSegment(int32 seg);
extern Relation IdemOutboxSegmentIndex(Relation heap, LOCKMODE lockmode);
extern Oid	IdemOutboxMemberRelid(const char *name);
extern int64 IdemOutboxNextEvId(void);
extern int64 IdemOutboxXidBase(void);
extern int64 IdemOutboxCurrentTxid(void);
extern void IdemOutboxRestrictAcls(void);
extern void IdemOutboxEnsureDependency(void);
extern int64 IdemOutboxIntervalUs(void);

/* ----------------------------------------------------------------
 * Snapshots as relays store them: 64-bit xids offset by the xid base
 * ----------------------------------------------------------------
 */
typedef struct IdemOutboxSnap
{
	int64		xmin;
	int64		xmax;
	int			nxip;
	int64	   *xip;			/* sorted, no duplicates */
} IdemOutboxSnap;

extern bool IdemOutboxSnapVisible(const IdemOutboxSnap *snap, int64 txid);
extern bool IdemOutboxSnapRunning(const IdemOutboxSnap *snap, int64 txid);
extern void IdemOutboxTakeSnap(IdemOutboxSnap *snap);

/* ----------------------------------------------------------------
 * A relay's position (outbox_position.c reads and writes it)
 * ----------------------------------------------------------------
 */
typedef struct IdemRelayState
{
	bool		found;			/* read from its row */
	Oid			role;
	text	   *relay;
	text	   *topic;
	bool		has_generation;
	int64		generation;
	int64		batch;			/* the current batch's number */
	bool		handed_out;		/* the current batch's end is fixed */
	int64		batch_end;		/* ... its last event's ev_id */
	int32		batch_events;	/* ... and how many events it has */
	int64		acked_ev;		/* window events up to this ev_id are acked */
	bool		window_done;	/* every event of the window is acked */
	IdemOutboxSnap lo;			/* the window's lower snapshot */
	int64	   *lo_floor;		/* per lo.xip[i]: its events' ev_ids exceed it */
	int64		lo_seq;			/* ev_ids taken after lo was taken exceed it */
	IdemOutboxSnap up;			/* the window's upper snapshot */
	int64		up_seq_before;	/* ev_ids taken after up was taken exceed it */
	int64		up_seq_after;	/* ev_ids visible in up are below it */
	TimestampTz up_at;			/* when up was taken (0: never) */
	int64		lost_events;	/* a loss to report (0: none) */
	int64		lost_first_ev;
	int64		lost_last_ev;
	TimestampTz lost_from;		/* published_at of the first lost event */
	TimestampTz lost_to;		/* ... and of the last */
	TimestampTz created_at;
	TimestampTz acked_at;		/* of the last ack (0: never) */
} IdemRelayState;

extern void IdemRelayLock(Oid role, text *relay, text *topic, bool nowait,
						  bool *acquired);
extern void IdemRelayLoad(Oid role, text *relay, text *topic,
						  IdemRelayState *st);
extern void IdemRelayInit(IdemRelayState *st, Oid role, text *relay,
						  text *topic);
extern void IdemRelayStore(IdemRelayState *st);
extern List *IdemRelayList(Oid role, bool all_roles);
extern void IdemRelayDeadLetterPut(IdemRelayState *st, HeapTuple event,
								   TupleDesc desc, text *reason,
								   bool has_attempts, int32 attempts);
extern int64 IdemRelayDeadLetterCount(Oid role, text *relay, text *topic);
extern uint64 IdemRelayDeadLettersExpire(TimestampTz before);
extern uint64 IdemRelaysOfGoneRolesForget(void);
extern void IdemRelayDeadLetterRows(Oid role, text *relay, text *topic,
									ReturnSetInfo *rsinfo);
extern void IdemRelayDeadLettersAll(void (*emit) (Datum *values, bool *nulls,
												  void *arg),
									void *arg);
extern IdemImportOutcome IdemRelayDeadLetterImport(Datum *values,
												   bool *nulls);

/* ----------------------------------------------------------------
 * Reading a topic's events (outbox_relay.c)
 * ----------------------------------------------------------------
 */
/* One topic's index entries in ev_id order, across segments */
typedef struct IdemSegScan IdemSegScan;
typedef struct IdemEventScan
{
	int			nsegs;
	IdemSegScan *segs;
	int			current;		/* the segment of the entry returned last */
} IdemEventScan;

extern void IdemEventScanBegin(IdemEventScan *es, Oid role, text *topic,
							   int64 after, int64 before, Snapshot snapshot);
extern bool IdemEventScanNext(IdemEventScan *es, int64 *ev, int64 *txid);
extern TupleTableSlot *IdemEventScanFetch(IdemEventScan *es);
extern void IdemEventScanEnd(IdemEventScan *es);
extern Datum IdemEventValue(TupleTableSlot *slot, int attnum, bool *isnull);

extern int64 IdemRelayLowWater(const IdemRelayState *st);
extern bool IdemRelayDelivered(const IdemRelayState *st, int64 ev, int64 txid);
extern void IdemRelayLag(const IdemRelayState *st, int64 *events,
						 double *seconds);
extern void IdemRelayPlaceImported(IdemRelayState *st,
								   const IdemOutboxSnap *snap,
								   int64 seq_before, bool from_start);
extern bool IdemRelayInWindow(const IdemRelayState *st, int64 txid);

/* ----------------------------------------------------------------
 * Moving topics between nodes (outbox_transfer.c)
 * ----------------------------------------------------------------
 */
extern void IdemOutboxTransferInit(void);

/* ----------------------------------------------------------------
 * Maintenance (outbox_maintain.c)
 * ----------------------------------------------------------------
 */
extern void IdemOutboxMaintain(TimestampTz now, int *created, int *dropped);

/* ----------------------------------------------------------------
 * Publishing (outbox_publish.c)
 * ----------------------------------------------------------------
 */
extern void IdemOutboxCheckEvent(const char *what, text *key, Datum headers,
								 bool headers_null, Datum payload,
								 bool payload_null, Datum payload_raw,
								 bool raw_null);
extern pg_uuid_t *IdemOutboxWriteEvent(Oid role, text *topic, text *key,
									   Datum headers, bool headers_null,
									   Datum payload, bool payload_null,
									   Datum payload_raw, bool raw_null,
									   const pg_uuid_t *event_id,
									   TimestampTz published_at, int64 *ev);
extern void IdemNewEventId(pg_uuid_t *id, TimestampTz now);
extern void IdemOutboxTenantMessage(Oid role, text *topic, const pg_uuid_t *id,
									TimestampTz published_at, text *key,
									Datum headers, bool headers_null,
									Datum payload, bool payload_null,
									Datum payload_raw, bool raw_null,
									text *tenant, int64 seq);

/* ----------------------------------------------------------------
 * The outbox of a tenant, distributed by Citus (outbox_tenant.c)
 * ----------------------------------------------------------------
 */
extern bool IdemTenantPublish(Oid role, text *topic, text *key, Datum headers,
							  bool headers_null, Datum payload,
							  bool payload_null, Datum payload_raw,
							  bool raw_null, text *tenant, pg_uuid_t **id);
extern bool IdemTenantRelayDistributed(void);
extern void IdemTenantRelayNext(FunctionCallInfo fcinfo, Oid role,
								text *relay, text *topic, int32 max_events,
								bool fenced, int64 generation, text *tenant);
extern bool IdemTenantRelayAck(Oid role, text *relay, text *topic,
							   int64 batch, bool fenced, int64 generation,
							   text *tenant);
extern void IdemTenantRelayDeadLetter(Oid role, text *relay, text *topic,
									  pg_uuid_t *event_id, text *reason,
									  bool has_attempts, int32 attempts,
									  text *tenant);
extern void IdemTenantOutboxMaintain(int *created, int *dropped);

#endif							/* IDEMPOTENCY_OUTBOX_H */

/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Shared-memory statistics (stats.c); only with shared_preload_libraries.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/stats.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_STATS_H
#define IDEMPOTENCY_STATS_H

#include "idempotency.h"

/* Counters, in the order of the columns of idempotency.stats */
typedef enum IdemStat
{
	IDEM_STAT_CLAIMS = 0,		/* idem_claim answered claimed */
	IDEM_STAT_REPLAYS,			/* ... completed */
	IDEM_STAT_CONFLICTS,		/* ... in_progress */
	IDEM_STAT_MISMATCHES,		/* ... mismatch */
	IDEM_STAT_CONSUMED,			/* message ids consumed for the first time */
	IDEM_STAT_DUPLICATES,		/* message ids already consumed */
	IDEM_STAT_PARTITIONS_CREATED,
	IDEM_STAT_PARTITIONS_DROPPED,
	/* since 0.4.0 */
	IDEM_STAT_HOLDER_WAITS,		/* claims that waited for a two-phase holder */
	IDEM_STAT_RECOVERIES,		/* keys taken over by idem_recover() */
	IDEM_STAT_POSITIONS_ADVANCED,	/* idem_advance() calls that moved one */
	IDEM_STAT_STALE_GENERATIONS,	/* calls refused for a stale generation */
	IDEM_STAT_SEQUENCE_DUPLICATES,
	IDEM_STAT_SEQUENCE_GAPS,
	IDEM_STAT_SEQUENCES_FENCED,
	IDEM_STAT_STREAMS_REMOVED,	/* unused positions and sequences deleted */
	/* since 0.5.0, shown by idempotency.outbox_stats */
	IDEM_STAT_OUTBOX_PUBLISHED,	/* events written by idem_publish() */
	IDEM_STAT_OUTBOX_RELAYED,	/* events of batches idem_outbox_ack() acked */
	IDEM_STAT_OUTBOX_DEAD_LETTERS,	/* dead letters recorded */
	IDEM_STAT_OUTBOX_LOST,		/* unacknowledged events dropped past max age */
	IDEM_STAT_OUTBOX_SEGMENTS_CREATED,
	IDEM_STAT_OUTBOX_SEGMENTS_DROPPED,
	IDEM_NUM_STATS
} IdemStat;

/* the counters of idempotency.stats before 0.4.0 */
#define IDEM_NUM_STATS_V1	(IDEM_STAT_PARTITIONS_DROPPED + 1)
/* ... and the counters of idempotency.stats since 0.4.0 */
#define IDEM_NUM_STATS_V2	(IDEM_STAT_STREAMS_REMOVED + 1)

extern Size IdemStatsShmemSize(void);
extern void IdemStatsShmemInit(void);
extern void IdemStatsAdd(IdemStat which, uint64 n);
extern void IdemStatsMaintenanceRun(const char *error);
extern void IdemStatsMaintenanceHeldOff(const char *reason);
extern void IdemStatsForgetDatabases(const Oid *dbs, int ndbs,
									 TimestampTz listed_at);
extern void IdemStatsRequirePreload(const char *what);
extern bool IdemStatsRead(Oid dboid, IdemStat first, int n, uint64 *out);

#endif							/* IDEMPOTENCY_STATS_H */

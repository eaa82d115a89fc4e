/*-------------------------------------------------------------------------
 *
 * storage.h
 *	  Partitioned storage of the ledgers (storage.c), and the columns of
 *	  their tables.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/storage.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_STORAGE_H
#define IDEMPOTENCY_STORAGE_H

#include "idempotency.h"

#include "lib/stringinfo.h"
#include "nodes/pg_list.h"

/* Partitions beyond the maintained horizon that cover max_ttl */
#define IDEM_FAR_PARTITIONS	16

/* One attached partition of a ledger: one lane, one range of expires_at */
typedef struct IdemPartition
{
	Oid			relid;
	int16		lane;			/* see IdemLaneValueOf */
	TimestampTz lower;			/* inclusive */
	TimestampTz upper;			/* exclusive; droppable once upper <= now */
	bool		ended;			/* in a lookup's result: range has ended */
} IdemPartition;

/* The layout new partitions get under the current settings */
typedef struct IdemLayout
{
	int			lanes;			/* hash lanes */
	int64		interval_us;	/* stagger between lanes */
	int64		width_us;		/* range of one partition = lanes * interval */
} IdemLayout;

extern void IdemStorageInit(void);
extern Oid	IdemLedgerParent(IdemLedger ledger, bool create);
extern const char *IdemLedgerName(IdemLedger ledger);
extern void IdemSetLedgerParentOverride(IdemLedger ledger, Oid relid);
extern void IdemCheckPartitionMadeHere(IdemLedger ledger);
extern bool IdemLedgerHasColumns(IdemLedger ledger, int natts);
extern Oid	IdemLedgerTenantType(IdemLedger ledger);
extern int	IdemLedgerDefaultTtl(IdemLedger ledger);
extern void IdemCurrentLayout(IdemLedger ledger, IdemLayout *layout);
extern uint64 IdemPartitionsGeneration(void);
extern int	IdemLivePartitionsForKey(IdemLedger ledger, const pg_uuid_t *digest,
									 TimestampTz now, IdemPartition **out);
extern bool IdemTargetIsFar(IdemLedger ledger, const IdemLayout *layout,
							TimestampTz now, TimestampTz expires_at);
extern bool IdemPartitionFor(IdemLedger ledger, const pg_uuid_t *digest,
							 int16 lane, bool far, TimestampTz expires_at,
							 IdemPartition *out);
extern bool IdemLanePartitionAt(IdemLedger ledger, int16 lane, TimestampTz t,
								IdemPartition *out);
extern bool IdemLedgerDefined(IdemLedger ledger);
extern bool IdemIsLedgerRelation(Oid relid);
extern List *IdemAllPartitions(IdemLedger ledger);
extern Oid	IdemCreatePartition(IdemLedger ledger, const IdemLayout *layout,
								int lane_number, bool far, TimestampTz at);
extern Oid	IdemCreateLanePartition(IdemLedger ledger, const IdemLayout *layout,
									int16 lane, TimestampTz at);
extern void IdemPartitionBounds(const IdemLayout *layout, int lane_number,
								TimestampTz t, TimestampTz *lower,
								TimestampTz *upper);
extern void IdemNewPartitionBounds(const IdemLayout *layout, int lane_number,
								   bool far, TimestampTz at,
								   TimestampTz *lower, TimestampTz *upper);
extern bool IdemUnlessLockTimeout(void (*work) (void *arg), void *arg,
								  char **why);
typedef void (*IdemDropPrepare) (Oid relid, int lock_timeout_ms, void *arg);
extern bool IdemDropPartition(Oid relid, int lock_timeout_ms,
							  bool distributed, IdemDropPrepare prepare,
							  void *arg);
extern int	IdemReadPartitions(Oid parent, int16 also_lane,
							   IdemPartition **out);
extern void IdemAppendTimestamp(StringInfo buf, TimestampTz t);
extern void IdemEnsureRelationDependency(Oid relid);
extern bool IdemPartitionDDLHeld(IdemLedger ledger);
extern void IdemEnsureExtensionDependency(IdemLedger ledger);
extern bool IdemUpgradeLedgerIndex(IdemLedger ledger);
extern void IdemRestrictLedgerPrivileges(IdemLedger ledger);

/* ----------------------------------------------------------------
 * The columns of the ledger tables
 * ----------------------------------------------------------------
 */

/* Columns every ledger table starts with */
#define Anum_ledger_expires_at		1
#define Anum_ledger_digest			2
#define Anum_ledger_role			3
#define Anum_ledger_lane			4

/* Number of columns of each ledger's table */
#define Natts_messages				4
#define Natts_keys					18
#define Natts_keys_v1				12	/* key ledgers made before 0.4.0 */

/*
 * A ledger distributed by Citus (idempotency.citus_distribute(), citus.c)
 * has one more column, last: "tenant", its distribution column, of the
 * type of the distribution column of the tables it is co-located with.
 */
#define IDEM_TENANT_COLUMN			"tenant"
#define IdemTenantAttnum(ledger) \
	((ledger) == IDEM_LEDGER_MESSAGES ? Natts_messages + 1 : Natts_keys + 1)
#define IDEM_LEDGER_MAX_NATTS		(Natts_keys + 1)

/* Columns of the key ledger after the four every ledger has */
#define Anum_keys_state				5
#define Anum_keys_token				6
#define Anum_keys_claimed_at		7
#define Anum_keys_lease_until		8
#define Anum_keys_fingerprint		9
#define Anum_keys_recovery_point	10
#define Anum_keys_response_code		11
#define Anum_keys_response_body		12
/*
 * Since 0.4.0: a claim's key, scope and request, kept for idem_recover();
 * recover_at is the lease's end while such a claim is in progress with a
 * lease (NULL otherwise): only it, not lease_until, is indexed, so that
 * completing a claim without a kept request stays a HOT update.
 */
#define Anum_keys_kept_key			13
#define Anum_keys_kept_scope		14
#define Anum_keys_kept_request		15
#define Anum_keys_recover_at		16
/* since 0.4.0: response headers, and a response's raw bytes */
#define Anum_keys_response_headers	17
#define Anum_keys_response_raw		18

/*
 * The largest fencing token a key may carry: tokens are the clock in
 * microseconds (about 1.8e15 in 2026), and each new claim of a key takes a
 * larger one; this leaves room for 2^62 more.
 */
#define IDEM_MAX_TOKEN		(PG_INT64_MAX / 2)

/* Values of the key ledger's state column */
#define KEY_IN_PROGRESS		'p'
#define KEY_COMPLETED		'c'
#define KEY_RELEASED		'r'

#endif							/* IDEMPOTENCY_STORAGE_H */

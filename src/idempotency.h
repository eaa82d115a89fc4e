/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by the files of the idempotency extension.
 *
 * The extension keeps two ledgers (processed messages and idempotency keys)
 * in range-partitioned tables of schema "idempotency".  Every file below
 * owns one concern; this header is the only place their interfaces meet.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/idempotency.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "compat.h"

#include "access/htup.h"
#include "datatype/timestamp.h"
#include "storage/itemptr.h"
#include "storage/lock.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"
#include "utils/uuid.h"

#define IDEM_SCHEMA_NAME	"idempotency"

/* ----------------------------------------------------------------
 * Settings (idempotency.c).  Durations are in seconds, but
 * idem_wait_timeout is in milliseconds and idem_max_response_bytes in
 * bytes.
 * ----------------------------------------------------------------
 */
extern int	idem_naptime;
extern int	idem_message_ttl;
extern int	idem_key_ttl;
extern int	idem_max_ttl;
extern int	idem_partition_interval;
extern int	idem_premake;
extern int	idem_max_key_length;
extern int	idem_wait_timeout;
extern int	idem_max_response_bytes;
extern int	idem_position_ttl;

/*
 * The extension's named LWLock tranche, requested in idempotency.c: [0]
 * the statistics (stats.c), [1] the digest filters (filter.c)
 */
#define IDEM_LWLOCK_TRANCHE		"idempotency"

/* ----------------------------------------------------------------
 * Ledger identity and hashing (keyhash.c)
 * ----------------------------------------------------------------
 */

/* The ledgers.  Each has its own partitioned table. */
typedef enum IdemLedger
{
	IDEM_LEDGER_MESSAGES = 0,
	IDEM_LEDGER_KEYS,
	IDEM_NUM_LEDGERS
} IdemLedger;

/* Digest of (namespace, key), stored as uuid (see keyhash.c) */
#define IDEM_DIGEST_LEN		UUID_LEN
#define IDEM_DIGEST_PREFIX_LEN	4	/* bytes that depend on the namespace only */

typedef struct IdemDigest
{
	pg_uuid_t	uuid;			/* as stored since 0.3.0 */
	uint8		legacy_head[IDEM_DIGEST_PREFIX_LEN];	/* before: bytes 0-3 */
} IdemDigest;

/* Upper bound on hash lanes per ledger (see storage.c) */
#define IDEM_MAX_LANES		64

/* Partitions beyond the maintained horizon that cover max_ttl (storage.c) */
#define IDEM_FAR_PARTITIONS	16

/* Kinds of lock tags the extension uses (LOCKTAG_ADVISORY, field4) */
#define IDEM_LOCK_KEY		0x4944	/* one key of one role: probe + insert */
#define IDEM_LOCK_CREATE	0x4945	/* creating storage of one ledger */
#define IDEM_LOCK_MAINTAIN	0x4946	/* one idem_maintain() run per database */
#define IDEM_LOCK_POSITION	0x4947	/* one stream partition's position */
#define IDEM_LOCK_SEQUENCE	0x4948	/* one producer's sequence */
#define IDEM_LOCK_RESTORE	0x4952	/* a restore of the database (worker.c) */

/*
 * The value of a row's "lane" column, and of its partition's bounds: the
 * layout's lane count (1 to 64) in bits 8-14, the lane number in bits 0-5,
 * bit 7 set for the lane's "far" partitions (since 0.3.1: rows written with
 * an expiry beyond the horizon maintenance keeps made, in wider partitions;
 * see IdemNewPartitionBounds), and bit 15 (the sign) set in partitions made
 * since 0.3.0, whose rows store the current digest form.  Partitions made
 * before ("legacy") hold rows with the legacy form and non-negative lane
 * values; they are probed with that form until they have all expired and
 * been dropped.
 */
#define IDEM_LANE_CURRENT	0x8000
#define IDEM_LANE_FAR		0x0080
static inline int16
IdemLaneValueOf(int lanes, int number, bool legacy)
{
	return (int16) ((legacy ? 0 : IDEM_LANE_CURRENT) | (lanes << 8) | number);
}
#define IdemLaneLanes(v)	((int) ((((uint16) (v)) >> 8) & 0x7F))
#define IdemLaneNumber(v)	((int) (((uint16) (v)) & 0x7F))
#define IdemLaneIsLegacy(v) ((v) >= 0)
#define IdemLaneIsFar(v)	((((uint16) (v)) & IDEM_LANE_FAR) != 0)
#define IdemFarLane(v)		((int16) ((v) | IDEM_LANE_FAR))

/* ----------------------------------------------------------------
 * Argument checks shared by the SQL functions (args.c)
 * ----------------------------------------------------------------
 */
extern text *IdemCheckKeyArg(FunctionCallInfo fcinfo, int argno,
							 const char *argname);
extern text *IdemCheckScopeArg(FunctionCallInfo fcinfo, int argno,
							   const char *argname);
extern void IdemCheckKeyLength(int len, const char *argname);
extern TimestampTz IdemTimestampPlus(TimestampTz t, const Interval *span);
extern TimestampTz IdemExpiresAt(FunctionCallInfo fcinfo, int argno,
								 TimestampTz now, int default_ttl,
								 const char *default_ttl_name);
extern void IdemCheckWritable(const char *funcname);

/* Longest part of a key shown in an error message, in bytes */
#define IDEM_KEY_IN_MESSAGE_LEN	64
extern char *IdemKeyForMessage(const char *key);

/* ----------------------------------------------------------------
 * Partitioned storage (storage.c)
 * ----------------------------------------------------------------
 */

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
extern bool IdemLedgerHasColumns(IdemLedger ledger, int natts);
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
extern bool IdemDropPartition(Oid relid, int lock_timeout_ms);
extern bool IdemPartitionDDLHeld(IdemLedger ledger);
extern void IdemEnsureExtensionDependency(IdemLedger ledger);
extern bool IdemUpgradeLedgerIndex(IdemLedger ledger);
extern void IdemRestrictLedgerPrivileges(IdemLedger ledger);

/* ----------------------------------------------------------------
 * This library against the installed extension (library_version.c)
 * ----------------------------------------------------------------
 */
extern void IdemLibraryVersionInit(void);
extern void IdemCheckLibraryVersion(void);
extern int	IdemCompareVersions(const char *a, const char *b);
extern bool IdemInstalledVersionAtLeast(const char *version);

/* Columns every ledger table starts with */
#define Anum_ledger_expires_at		1
#define Anum_ledger_digest			2
#define Anum_ledger_role			3
#define Anum_ledger_lane			4

/* Number of columns of each ledger's table */
#define Natts_messages				4
#define Natts_keys					18
#define Natts_keys_v1				12	/* key ledgers made before 0.4.0 */

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

#endif							/* IDEMPOTENCY_H */

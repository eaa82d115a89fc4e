/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  What every file of the idempotency extension shares: the schema's
 *	  name, the settings, the ledgers, digests and lanes, the kinds of lock
 *	  tags, the argument checks of the SQL functions (args.c) and the check
 *	  of this library against the installed extension (library_version.c).
 *
 * The extension keeps two ledgers (processed messages and idempotency keys)
 * in range-partitioned tables of schema "idempotency".  Every file below
 * owns one concern, and each subsystem declares its interface in a header
 * of its own, which includes this one: storage.h (storage.c, and the
 * columns of the ledger tables), keyhash.h (keyhash.c), protocol.h (probe.c,
 * indexes.c), keys.h (keys.c, own_claims.c), transfer.h (transfer.c, and
 * the writers that import rows), filter.h (the digest filters), streams.h,
 * worker.h (worker.c, maintain.c), stats.h, wait.h, privilege.h and
 * responses.h.  A file includes this header first, then the headers whose
 * declarations it uses; compat.h holds the differences between PostgreSQL
 * majors.
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

#include "datatype/timestamp.h"
#include "fmgr.h"
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
extern int	idem_outbox_retention;
extern int	idem_outbox_max_age;
extern bool idem_outbox_logical;

/*
 * The extension's named LWLock tranche, requested in idempotency.c: [0]
 * the statistics (stats.c), [1] the digest filters (filter_pool.c)
 */
#define IDEM_LWLOCK_TRANCHE		"idempotency"

/* ----------------------------------------------------------------
 * Ledgers, digests and lanes
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

/* Kinds of lock tags the extension uses (LOCKTAG_ADVISORY, field4) */
#define IDEM_LOCK_KEY		0x4944	/* one key of one role: probe + insert */
#define IDEM_LOCK_CREATE	0x4945	/* creating storage of one ledger */
#define IDEM_LOCK_MAINTAIN	0x4946	/* one idem_maintain() run per database */
#define IDEM_LOCK_POSITION	0x4947	/* one stream partition's position */
#define IDEM_LOCK_SEQUENCE	0x4948	/* one producer's sequence */
#define IDEM_LOCK_RESTORE	0x4952	/* a restore of the database (worker.c) */
#define IDEM_LOCK_OUTBOX_STORAGE 0x4953	/* making the outbox's storage */
#define IDEM_LOCK_OUTBOX_KEY	0x4954	/* one event key of one topic and role */
#define IDEM_LOCK_OUTBOX_RELAY	0x4955	/* one relay of one topic and role */
#define IDEM_LOCK_OUTBOX_IMPORT	0x4956	/* importing events of one topic and role */

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
 * This library against the installed extension (library_version.c)
 * ----------------------------------------------------------------
 */
extern void IdemLibraryVersionInit(void);
extern void IdemCheckLibraryVersion(void);
extern int	IdemCompareVersions(const char *a, const char *b);
extern bool IdemInstalledVersionAtLeast(const char *version);
extern uint64 IdemInstalledVersionGeneration(void);

/*
 * The extension's relcache callbacks: one registered with PostgreSQL
 * (storage.c), which calls each of these.  PostgreSQL has room for ten per
 * backend, and a preloaded Citus takes five of them.
 */
typedef void (*IdemRelcacheHandler) (Datum arg, Oid relid);
extern void IdemRegisterRelcacheCallback(IdemRelcacheHandler handler);

#endif							/* IDEMPOTENCY_H */

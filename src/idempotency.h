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

extern void IdemComputeDigest(const char *ns, int nslen,
							  const char *key, int keylen,
							  IdemDigest *digest);
extern void IdemNamespacePrefix(const char *ns, int nslen, uint8 *prefix);
extern void IdemLegacyDigest(const IdemDigest *digest, pg_uuid_t *out);
extern int16 IdemLaneValue(const pg_uuid_t *digest, int lanes, bool legacy);

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
extern bool IdemSetKeyLockTag(LOCKTAG *tag, IdemLedger ledger, Oid role,
							  const pg_uuid_t *digest);
extern void IdemSetLedgerLockTag(LOCKTAG *tag, IdemLedger ledger, int kind);
extern uint64 IdemFilterDigestHash(Oid role, const pg_uuid_t *digest);
extern uint64 IdemSecretId(const uint8 *secret);
extern void IdemSetStreamLockTag(LOCKTAG *tag, int kind, Oid role,
								 const char *a, int alen,
								 const char *b, int blen, int32 part);
extern bytea *IdemFingerprint(Datum request, bytea **legacy);

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
extern uint64 IdemInstalledVersionGeneration(void);

/* ----------------------------------------------------------------
 * The per-database secret lock tags are keyed with (lock_secret.c)
 * ----------------------------------------------------------------
 */
#define IDEM_LOCK_SECRET_LEN	16	/* a SipHash-2-4 key */

extern void IdemLockSecretInit(void);
extern bool IdemKeyedLockTags(void);
extern const uint8 *IdemLockSecret(void);
extern uint64 IdemLockSecretId(void);
extern void IdemRestrictLockSecretAcl(void);

/* ----------------------------------------------------------------
 * Work done with more privilege than the caller (privilege.c)
 * ----------------------------------------------------------------
 */
typedef struct IdemSavedUser
{
	Oid			userid;
	int			sec_context;
} IdemSavedUser;

extern void IdemPinWorkerSettings(void);
extern uint64 IdemExecAsOwner(const char *sql, int lock_timeout_ms);
extern Oid	IdemStorageOwner(void);
extern void IdemBecomeStorageOwner(IdemSavedUser *save);
extern void IdemRestoreUser(const IdemSavedUser *save);
extern void IdemRestrictTableAcl(Oid relid);

/* ----------------------------------------------------------------
 * The dedup protocol: key lock, dirty probe of live partitions, insert
 * (probe.c)
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

/* Indexes of an open partition kept in IdemOpenPartition itself */
#define IDEM_INLINE_INDEXES			2

/*
 * An open partition: its heap and its indexes (indexes.c).  The digest
 * index is opened with the partition; the others only when a write needs
 * their entries (IdemOpenAllIndexes), in the order of index_oids.
 */
typedef struct IdemOpenPartition
{
	IdemPartition part;			/* part.ended: locked only while open */
	Relation	heap;
	Relation	index;			/* the digest index probes use */
	bool		index_by_role;	/* ... on (role, digest), not (digest) */
	int			nindexes;		/* every index, the digest one among them */
	int			nopened;		/* indexes[0 .. nopened) are open */
	bool		all_open;		/* ... all of them, and simple is known */
	LOCKMODE	index_lockmode;
	Oid		   *index_oids;		/* of every index, in OID order */
	Relation   *indexes;
	struct IndexInfo **infos;	/* of each index, built on first insert */
	MemoryContext cxt;			/* where the partition was opened: infos and
								 * index arrays live there, as long as it */
	bool		simple;			/* every index takes plain column values
								 * (known once all are open) */
	Oid			inline_oids[IDEM_INLINE_INDEXES];
	Relation	inline_indexes[IDEM_INLINE_INDEXES];
	struct IndexInfo *inline_infos[IDEM_INLINE_INDEXES];
} IdemOpenPartition;

/* What a probe found */
typedef enum IdemFound
{
	IDEM_FOUND_NONE,			/* no live row */
	IDEM_FOUND_MINE,			/* live row written by this transaction */
	IDEM_FOUND_DONE,			/* live row committed by another transaction */
	IDEM_FOUND_BUSY				/* live row another transaction is writing */
} IdemFound;

typedef struct IdemProbeResult
{
	IdemFound	found;
	TransactionId xwait;		/* for BUSY: the transaction to wait for */
	int			which;			/* index of the partition among those open */
	ItemPointerData tid;		/* the row */
	HeapTuple	tuple;			/* copy of the row, if asked for */
} IdemProbeResult;

/*
 * One operation on one key (or message id) of one ledger, through the
 * protocol of probe.c: the key lock, the partitions the key's live row can
 * be in, what the probe found there, and the row to write.
 */
/*
 * The partitions one call that writes many rows (a batch) keeps open across
 * its ids: entries of the same partition set are reused while the ledger
 * caches' generation is unchanged and none of the partitions has ended
 * (see IdemOpenCacheLookup).  Memory and relations stay until
 * IdemOpenCacheEnd.
 */
#define IDEM_OPEN_CACHE_ENTRIES 16

typedef struct IdemOpenCacheEntry
{
	int			nopen;
	IdemOpenPartition *open;
} IdemOpenCacheEntry;

typedef struct IdemOpenCache
{
	MemoryContext cxt;			/* holds the entries and their index state */
	uint64		generation;		/* IdemPartitionsGeneration() they match */
	int			nentries;
	IdemOpenCacheEntry entries[IDEM_OPEN_CACHE_ENTRIES];
} IdemOpenCache;

typedef struct IdemOp
{
	IdemLedger	ledger;
	Oid			role;
	IdemDigest	digest;
	LOCKTAG		keytag;			/* the key lock (IdemSetKeyLockTag) */
	bool		keyed_tag;		/* ... in the keyed form (lock_secret.c) */
	IdemLayout	layout;			/* of new partitions (IdemOpFindTarget) */
	int16		lane;			/* the digest's lane under that layout */
	bool		far;			/* a new row goes to a far partition */
	TimestampTz now;			/* the clock; read again after every wait */
	TimestampTz expires_at;		/* of the row to write: set by the step */
	bool		key_locked;		/* holds the key lock now */
	bool		keep_key_lock;	/* ... until the transaction ends */
	int			nopen;
	int			capacity;		/* open has room for this many */
	LOCKMODE	lockmode;		/* in which the partitions are open */
	IdemOpenPartition *open;	/* palloc'd by the probe, or the cache's */
	IdemOpenCache *cache;		/* of a batch, or NULL */
	bool		cached;			/* open is the cache's: not closed at the end */
	int			target;			/* the open partition a new row goes to */
	IdemProbeResult probe;		/* what the probe found */
	TimestampTz wait_until;		/* for IDEM_STEP_WAIT_HOLDER: set by the step */
	int			poll_ms;		/* ... its polling interval without preload */
	Datum		values[Natts_keys]; /* the row found, then the row written */
	bool		nulls[Natts_keys];
} IdemOp;

/* What a step of an operation decided (see IdemOpRun) */
typedef enum IdemStep
{
	IDEM_STEP_DONE,				/* answered (and written, if it writes) */
	IDEM_STEP_WAIT,				/* wait for the row's writer, start over */
	IDEM_STEP_MAKE_TARGET,		/* have the new row's partition made, start
								 * over */
	IDEM_STEP_WAIT_HOLDER		/* wait for the holder of a committed
								 * two-phase claim to finish, up to
								 * op->wait_until, start over */
} IdemStep;

typedef IdemStep (*IdemStepFunc) (IdemOp *op, void *arg);

extern void IdemOpInit(IdemOp *op, IdemLedger ledger, Oid role,
					   const IdemDigest *digest);
extern void IdemOpRun(IdemOp *op, bool nowait, IdemStepFunc step, void *arg);
extern bool IdemOpLock(IdemOp *op, bool nowait);
extern void IdemOpProbe(IdemOp *op, LOCKMODE lockmode, Snapshot snapshot);
extern bool IdemOpFetchOwn(IdemOp *op, const IdemPartition *part,
						   ItemPointer tid);
extern bool IdemOpFindTarget(IdemOp *op);
extern void IdemOpInsert(IdemOp *op, ItemPointer newtid);
extern void IdemOpReplace(IdemOp *op, ItemPointer newtid);
extern void IdemOpUpdate(IdemOp *op, ItemPointer newtid);
extern void IdemOpEnd(IdemOp *op);

extern int	IdemOpenLivePartitions(IdemLedger ledger, Oid role,
								   const pg_uuid_t *digest, TimestampTz now,
								   LOCKMODE lockmode, IdemOpenPartition **open,
								   int *capacity);
extern void IdemOpenPartitionRels(IdemOpenPartition *op, IdemLedger ledger,
								  const IdemPartition *part, LOCKMODE lockmode,
								  bool probe);
extern void IdemClosePartitions(IdemOpenPartition *open, int nopen);
extern void IdemOpenCacheInit(IdemOpenCache *cache);
extern void IdemOpenCacheEnd(IdemOpenCache *cache);
extern void IdemProbe(IdemOpenPartition *open, int nopen, Oid role,
					  const IdemDigest *digest, TimestampTz now,
					  bool want_tuple, Snapshot snapshot,
					  IdemProbeResult *result);
extern bool IdemInsertRow(IdemOpenPartition *op, Datum *values, bool *nulls,
						  ItemPointer newtid);
extern void IdemCountKeptKeyLock(void);
extern bool IdemUpdateRow(IdemOpenPartition *op, ItemPointer tid,
						  HeapTuple newtuple);
extern void IdemSeeOwnWrites(void);

/* Indexes of the partitions (indexes.c) */
extern void IdemOpenPartitionIndexes(IdemOpenPartition *op, LOCKMODE lockmode,
									 bool find_digest);
extern void IdemClosePartitionIndexes(IdemOpenPartition *op);
extern void IdemInsertIndexEntries(IdemOpenPartition *op, HeapTuple tuple,
								   IdemIndexUpdate which);
extern Relation IdemRecoverIndex(IdemOpenPartition *op);
extern void IdemOpenAllIndexes(IdemOpenPartition *op);

/* What importing a ledger row did (keys.c, consume.c; see transfer.c) */
typedef enum IdemImportOutcome
{
	IDEM_IMPORT_INSERTED,		/* no live local row: the row was added */
	IDEM_IMPORT_REPLACED,		/* it replaced an older local version */
	IDEM_IMPORT_KEPT,			/* the local row is as new: left as it was */
	IDEM_IMPORT_EXPIRED			/* it has expired: nothing to do */
} IdemImportOutcome;

extern IdemImportOutcome IdemImportKey(Oid role, const pg_uuid_t *digest,
									   Datum *values, bool *nulls);

/* Reading imported records (transfer.c), for streams.c too */
extern void IdemDeformRecord(FunctionCallInfo fcinfo, int natts, int min_natts,
							 const Oid *types, const char *typname,
							 Datum *values, bool *nulls);
extern Oid	IdemImportRole(Datum name, bool isnull);
extern void IdemRequireField(bool isnull, const char *field);
extern text *IdemImportOutcomeText(IdemImportOutcome outcome);

/* A lapsed claim taken over by idem_recover() (keys.c, recover.c) */
typedef struct IdemRecovered
{
	TimestampTz lapsed_at;		/* the end of the lease that lapsed */
	int64		token;			/* the new one */
	Datum		recovery_point; /* text, or (Datum) 0 */
	Datum		request;		/* jsonb, or (Datum) 0 */
} IdemRecovered;

extern bool IdemRecoverKey(Oid role, const IdemDigest *digest, Datum lease,
						   IdemRecovered *out);

/* The processed-message ledger (consume.c) */
extern bool IdemRecordMessage(Oid role, const IdemDigest *digest,
							  const Interval *ttl, TimestampTz expires_at,
							  IdemOpenCache *cache);

/*
 * A claim made by the current transaction (own_claims.c).  Same-transaction
 * claims must be resolved (completed or released) before COMMIT.  Where the
 * row's current version is, is remembered so that the usual claim-then-
 * complete needs no second probe.
 */
typedef struct IdemOwnClaim
{
	Oid			role;
	pg_uuid_t	digest;
	char	   *key;			/* for messages; only if must_resolve */
	bool		must_resolve;	/* same-transaction mode */
	SubTransactionId made_in;	/* subtransaction that made the claim */
	SubTransactionId resolved_in;	/* that completed or released it */
	SubTransactionId moved_in;	/* that last changed the row */
	SubTransactionId touched_in;	/* whose list of changes it is in */
	IdemPartition part;			/* where the row is; relid invalid if unknown */
	ItemPointerData tid;
	struct IdemOwnClaim *older; /* the key's claim before this one, if any */
} IdemOwnClaim;

extern void IdemOwnClaimsInit(void);
extern IdemOwnClaim *IdemOwnClaimFind(Oid role, const pg_uuid_t *digest);
extern IdemOwnClaim *IdemOwnClaimAdd(Oid role, const pg_uuid_t *digest,
									 const char *key, bool must_resolve,
									 const IdemPartition *part, ItemPointer tid);
extern void IdemOwnClaimResolved(IdemOwnClaim *claim);
extern void IdemOwnClaimMoved(IdemOwnClaim *claim, const IdemPartition *part,
							  ItemPointer tid);
extern void IdemOwnClaimsCheckPending(void);

/* ----------------------------------------------------------------
 * Maintenance runs (maintain.c)
 * ----------------------------------------------------------------
 */
extern bool IdemMaintainDatabase(int *created, int *dropped);

/* ----------------------------------------------------------------
 * Shared-memory statistics (stats.c); only with shared_preload_libraries
 * ----------------------------------------------------------------
 */
#define IDEM_LWLOCK_TRANCHE		"idempotency"

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
	IDEM_NUM_STATS
} IdemStat;

/* the counters of idempotency.stats before 0.4.0 */
#define IDEM_NUM_STATS_V1	(IDEM_STAT_PARTITIONS_DROPPED + 1)

extern Size IdemStatsShmemSize(void);
extern void IdemStatsShmemInit(void);
extern void IdemStatsAdd(IdemStat which, uint64 n);
extern void IdemStatsMaintenanceRun(const char *error);
extern void IdemStatsMaintenanceHeldOff(const char *reason);
extern void IdemStatsForgetDatabases(const Oid *dbs, int ndbs,
									 TimestampTz listed_at);
extern void IdemStatsRequirePreload(const char *what);

/* ----------------------------------------------------------------
 * Digest filters of the partitions (filter.c); only with
 * shared_preload_libraries
 * ----------------------------------------------------------------
 */
extern int	idem_filter_memory;
extern void IdemFilterDefineSettings(void);
extern void IdemFilterPreloadInit(void);
extern Size IdemFilterShmemSize(void);
extern void IdemFilterShmemInit(void);
extern bool IdemFilterRulesOut(Oid relid, int16 lane, Oid role,
							   const pg_uuid_t *digest);
extern void IdemFilterAdd(Oid relid, int16 lane, Oid role,
						  const pg_uuid_t *digest);
extern void IdemFilterCreated(IdemLedger ledger, Oid relid, int16 lane);
extern void IdemFilterForget(Oid relid);
extern void IdemFilterOwnSql(const char *sql);
extern int	IdemFilterBuildDatabase(void);
extern void IdemFilterForgetDatabase(void);
extern void IdemFilterForgetDatabases(const Oid *dbs, int ndbs,
									  TimestampTz listed_at);

/* ----------------------------------------------------------------
 * Background workers (worker.c); only with shared_preload_libraries
 * ----------------------------------------------------------------
 */
extern void IdemWorkerPreloadInit(void);
extern bool IdemWorkerMakePartition(IdemLedger ledger, const IdemLayout *layout,
									int lane_number, bool far, TimestampTz at);
extern Size IdemWorkerShmemSize(void);
extern void IdemWorkerShmemInit(void);

/* ----------------------------------------------------------------
 * What one key may store (responses.c)
 * ----------------------------------------------------------------
 */
extern int64 IdemJsonbTextSize(Datum jsonb);
extern void IdemCheckStoredSize(int64 size, const char *what);
extern void IdemCheckResponseHeaders(Datum headers);

/* ----------------------------------------------------------------
 * Ordered streams: positions and producer sequences (streams.c)
 * ----------------------------------------------------------------
 */
extern void IdemStreamsInit(void);
extern uint64 IdemStreamsMaintain(TimestampTz before);

/* ----------------------------------------------------------------
 * Waiting for the holder of a two-phase claim (wait.c)
 * ----------------------------------------------------------------
 */
extern void IdemWaitInit(void);
extern Size IdemWaitShmemSize(void);
extern void IdemWaitShmemInit(void);
extern uint64 IdemWaitSeen(const LOCKTAG *keytag);
extern void IdemWaitNoteChange(const LOCKTAG *keytag);
extern void IdemWaitForHolder(const LOCKTAG *keytag, uint64 seen,
							  TimestampTz until, int *poll_ms);

#endif							/* IDEMPOTENCY_H */

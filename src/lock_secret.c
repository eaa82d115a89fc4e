/*-------------------------------------------------------------------------
 *
 * lock_secret.c
 *	  The per-database secret that keys the lock tags derived from what a
 *	  caller chose (keyhash.c): where it is kept, who can read it, and how
 *	  a backend reads it.
 *
 * Every role can read pg_locks, with the process (and so the role) of each
 * holder.  A call holds a lock whose tag is derived from its key or
 * message id (for the length of its probe, or to the end of its
 * transaction when it wrote into a partition that transaction made), and a
 * stream call one derived from its consumer, stream or producer name (to
 * the end of its transaction).  Were those tags public functions of the
 * role and the names, any role could compute, for a guessed name, the tag
 * another role's lock would have, and see in pg_locks when that role
 * writes it.  So the part of a tag derived from the names is a keyed hash
 * (SipHash-2-4, keyhash.c) under 16 random bytes per database that no
 * ordinary role can read: the one row of idempotency.lock_secret, a table
 * of the extension owned by its owner (the storage owner), granted to
 * nobody (maintenance takes back any grant), made by the install script
 * of 0.4.0 and by the update script from 0.3.1 from pg_strong_random()
 * (through gen_random_uuid()).
 *
 * The row is read by direct heap access, without privilege checks, as the
 * functions read the ledgers, once per backend; the copy is forgotten when
 * the table's relcache entry is invalidated (DROP EXTENSION drops the
 * table, and CREATE EXTENSION makes a new one with a new secret).  Every
 * backend of a database must use the same bytes, or two calls on one key
 * would take different locks; so nothing of the extension writes the row
 * after it is made, it is not dumped (the CREATE EXTENSION of a restore
 * makes a new one: a lock tag outlives no session), and pg_upgrade and
 * standbys keep it with the table's files.
 *
 * The digest filters (filter_pool.c) choose a row's bits with the same secret,
 * for the same reason: which bits a key sets, and so whether another
 * role's probe of a key of its own is ruled out by a partition's filter
 * (pg_stat_all_indexes shows it), must not be computable.
 *
 * Keyed tags are used where the installed extension is 0.4.0 or later
 * (IdemKeyedLockTags).  Before ALTER EXTENSION UPDATE a session still
 * running an older library may claim the same keys as one running this
 * one, and both must take the same lock: 0.3.1's public form, then.  Once
 * the update has committed, older libraries are refused
 * (library_version.c); a call of this library that took a key's lock in
 * the public form and was then held up by the update's locks takes the
 * keyed one before it probes (probe.c, IdemOpProbe), and the update waits
 * for every transaction that has a ledger partition locked, so that no
 * probe under the public form overlaps one under the keyed form.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/lock_secret.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "keyhash.h"
#include "lock_secret.h"
#include "privilege.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

/* The table and its column (keep in step with the SQL scripts) */
#define IDEM_LOCK_SECRET_TABLE	"lock_secret"
#define Anum_lock_secret_secret	2

/* The first version whose SQL makes the secret */
#define IDEM_KEYED_LOCKS_SINCE	"0.4.0"

/* Whether lock tags are keyed, for the installed version last read */
static bool keyed_tags = false;
static uint64 keyed_tags_generation = 0;	/* IdemInstalledVersionGeneration() */

/* The secret, read from the table, and what invalidates it */
static uint8 lock_secret[IDEM_LOCK_SECRET_LEN];
static uint64 lock_secret_id = 0;	/* IdemSecretId(lock_secret) */
static bool lock_secret_valid = false;
static Oid	lock_secret_relid = InvalidOid;
static uint64 lock_secret_invalidations = 0;

static void IdemLockSecretRelcacheCallback(Datum arg, Oid relid);
static Oid	IdemLockSecretRelid(void);
static void IdemReadLockSecret(void);

/*
 * IdemLockSecretInit registers the callback that forgets the secret when
 * its table changes.  Called once from _PG_init.
 */
void
IdemLockSecretInit(void)
{
	IdemRegisterRelcacheCallback(IdemLockSecretRelcacheCallback);
}

/* No catalog access here */
static void
IdemLockSecretRelcacheCallback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == lock_secret_relid)
	{
		lock_secret_valid = false;
		lock_secret_invalidations++;
	}
}

/*
 * IdemKeyedLockTags: are the key locks of this database keyed with its
 * secret (the installed extension is 0.4.0 or later), or of 0.3.1's public
 * form?  Stream locks exist only from 0.4.0 on, and are always keyed.
 * Costs a test of two counters, unless the installed version was read
 * again since the last call.
 */
bool
IdemKeyedLockTags(void)
{
	uint64		generation = IdemInstalledVersionGeneration();

	if (unlikely(generation != keyed_tags_generation))
	{
		keyed_tags = IdemInstalledVersionAtLeast(IDEM_KEYED_LOCKS_SINCE);
		keyed_tags_generation = generation;
	}
	return keyed_tags;
}

/*
 * IdemLockSecret returns the database's secret, IDEM_LOCK_SECRET_LEN bytes
 * valid until the next call, read from idempotency.lock_secret on first
 * use.  Raises an error if the table does not hold exactly one secret.
 */
const uint8 *
IdemLockSecret(void)
{
	if (unlikely(!lock_secret_valid))
		IdemReadLockSecret();
	return lock_secret;
}

/*
 * IdemLockSecretId returns 64 bits that tell the database's secret from any
 * other (IdemSecretId), read as IdemLockSecret reads it.
 */
uint64
IdemLockSecretId(void)
{
	if (unlikely(!lock_secret_valid))
		IdemReadLockSecret();
	return lock_secret_id;
}

/* the OID of idempotency.lock_secret, or InvalidOid */
static Oid
IdemLockSecretRelid(void)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);

	return OidIsValid(nsp) ? get_relname_relid(IDEM_LOCK_SECRET_TABLE, nsp) :
		InvalidOid;
}

/*
 * IdemReadLockSecret reads the secret into lock_secret and keeps it,
 * unless the table was invalidated meanwhile.  The row was committed with
 * the extension's version, which the caller has read in the catalogs: it
 * is read under the catalog snapshot too (not the transaction's, which may
 * be older than the update, nor a new one, which a parallel worker may not
 * take).
 */
static void
IdemReadLockSecret(void)
{
	Oid			relid = IdemLockSecretRelid();
	uint64		invalidations;
	Relation	rel;
	Snapshot	snapshot;
	TableScanDesc scan;
	HeapTuple	tuple;
	int			nrows = 0;
	int			nvalid = 0;

	if (OidIsValid(relid))
	{
		/* from here on, an invalidation of the table counts */
		lock_secret_relid = relid;
		invalidations = lock_secret_invalidations;

		rel = table_open(relid, AccessShareLock);
		if (RelationGetDescr(rel)->natts >= Anum_lock_secret_secret &&
			TupleDescAttr(RelationGetDescr(rel),
						  Anum_lock_secret_secret - 1)->atttypid == BYTEAOID)
		{
			snapshot = RegisterSnapshot(GetCatalogSnapshot(relid));
			scan = table_beginscan(rel, snapshot, 0, NULL);
			while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
			{
				bool		isnull;
				Datum		datum = heap_getattr(tuple, Anum_lock_secret_secret,
												 RelationGetDescr(rel), &isnull);
				bytea	   *secret;

				nrows++;
				if (isnull)
					continue;
				secret = DatumGetByteaPP(datum);
				if (VARSIZE_ANY_EXHDR(secret) == IDEM_LOCK_SECRET_LEN)
				{
					memcpy(lock_secret, VARDATA_ANY(secret), IDEM_LOCK_SECRET_LEN);
					nvalid++;
				}
			}
			table_endscan(scan);
			UnregisterSnapshot(snapshot);
		}
		table_close(rel, AccessShareLock);

		if (nrows == 1 && nvalid == 1)
		{
			lock_secret_id = IdemSecretId(lock_secret);
			lock_secret_valid = (lock_secret_invalidations == invalidations);
			return;
		}
	}

	memset(lock_secret, 0, sizeof(lock_secret));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("the lock secret of extension \"idempotency\" is missing"),
			 errdetail("Table %s.%s must hold one row whose secret has %d bytes.",
					   IDEM_SCHEMA_NAME, IDEM_LOCK_SECRET_TABLE,
					   IDEM_LOCK_SECRET_LEN),
			 errhint("See \"The lock secret\" in doc/operations.md.")));
}

/*
 * IdemRestrictLockSecretAcl takes back every privilege on the secret's
 * table that anyone but its owner holds (a GRANT, or the owner's default
 * privileges); run by maintenance, as for the ledgers.
 */
void
IdemRestrictLockSecretAcl(void)
{
	Oid			relid = IdemLockSecretRelid();

	if (OidIsValid(relid))
		IdemRestrictTableAcl(relid);
}

/*-------------------------------------------------------------------------
 *
 * library_version.c
 *	  The guard between this library and the extension's SQL objects: a
 *	  session never runs this library against a newer version of the
 *	  extension.
 *
 * A session keeps the library it loaded until it ends.  Install a newer
 * release's files and run ALTER EXTENSION idempotency UPDATE in one
 * session, and every other session (a pooled connection, say) still runs
 * the old code, against SQL objects, ledger tables and function result
 * types of the new version.  0.2.0 and 0.3.0 then both answered "claimed"
 * for one key, the old library in one session and the new in another.
 *
 * From 0.3.1 on, every SQL-callable function of the library first checks
 * that the extension installed in the database (pg_extension.extversion)
 * is not newer than the library itself (IDEM_VERSION), and refuses with
 * an error if it is: a session that loaded an older library stops writing
 * the moment the update commits, until it reconnects.  A newer library
 * runs against an older extension (the library is shared by all versions,
 * and must keep working before each database is updated), which is why
 * newer releases write only what the installed version's objects hold.
 *
 * The check reads pg_extension only after it has changed: a syscache
 * invalidation callback on it (ALTER EXTENSION UPDATE, DROP and CREATE
 * EXTENSION all send one) marks the answer stale; in between, a call pays
 * one test of a static flag.  Built against a server without a syscache on
 * pg_extension (PostgreSQL 15 before it was back-patched), the answer is
 * kept for one transaction.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/library_version.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/syscache.h"

/* the extension's version is known not to be newer than this library's */
static bool version_checked = false;

/* that version ("" if not installed), valid while version_checked */
static char installed_version[NAMEDATALEN];

/* how many times it was read (IdemInstalledVersionGeneration) */
static uint64 version_generation = 0;

static void IdemVersionInvalidate(void);
#ifdef IDEM_HAVE_EXTENSION_SYSCACHE
static void IdemVersionSyscacheCallback(Datum arg, int cacheid,
										uint32 hashvalue);
#else
static void IdemVersionXactCallback(XactEvent event, void *arg);
#endif
static char *IdemInstalledVersion(void);

/*
 * IdemLibraryVersionInit registers what marks the checked version stale.
 * Called once from _PG_init.
 */
void
IdemLibraryVersionInit(void)
{
#ifdef IDEM_HAVE_EXTENSION_SYSCACHE
	CacheRegisterSyscacheCallback(EXTENSIONOID, IdemVersionSyscacheCallback,
								  (Datum) 0);
#else
	RegisterXactCallback(IdemVersionXactCallback, NULL);
#endif
}

static void
IdemVersionInvalidate(void)
{
	version_checked = false;
}

#ifdef IDEM_HAVE_EXTENSION_SYSCACHE
static void
IdemVersionSyscacheCallback(Datum arg, int cacheid, uint32 hashvalue)
{
	IdemVersionInvalidate();
}
#else
static void
IdemVersionXactCallback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
		IdemVersionInvalidate();
}
#endif

/*
 * IdemCompareVersions compares two version names of the form 1.2.3 part
 * by part, numerically; a part that is not a number (or more parts) is
 * compared as text.  Returns <0, 0 or >0.
 */
int
IdemCompareVersions(const char *a, const char *b)
{
	while (*a != '\0' || *b != '\0')
	{
		char	   *enda;
		char	   *endb;
		long		na = strtol(a, &enda, 10);
		long		nb = strtol(b, &endb, 10);
		size_t		la;
		size_t		lb;
		int			c;

		if (enda != a && endb != b)
		{
			if (na != nb)
				return na < nb ? -1 : 1;
			a = enda;
			b = endb;
		}
		la = strcspn(a, ".");
		lb = strcspn(b, ".");
		c = strncmp(a, b, Min(la, lb));
		if (c != 0)
			return c;
		if (la != lb)
			return la < lb ? -1 : 1;
		a += la;
		b += lb;
		if (*a == '.')
			a++;
		if (*b == '.')
			b++;
	}
	return 0;
}

/*
 * IdemInstalledVersion returns the version of the extension installed in
 * this database, or NULL if it is not installed (a call made during DROP
 * EXTENSION, say).
 */
static char *
IdemInstalledVersion(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum("idempotency"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		datum = heap_getattr(tup, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(datum);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * IdemCheckLibraryVersion raises an error if the extension installed in
 * this database is newer than this library.  Every SQL-callable function
 * of the library calls it first.
 */
void
IdemCheckLibraryVersion(void)
{
	char	   *installed;

	if (likely(version_checked))
		return;

	installed = IdemInstalledVersion();
	if (installed != NULL && IdemCompareVersions(installed, IDEM_VERSION) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the idempotency library loaded by this session is older than the extension"),
				 errdetail("This session runs library version %s; the extension in this database is version %s.",
						   IDEM_VERSION, installed),
				 errhint("End this session and connect again (restart the server if idempotency is in shared_preload_libraries), so that it loads the installed library.")));
	strlcpy(installed_version, installed != NULL ? installed : "",
			sizeof(installed_version));
	version_generation++;
	version_checked = true;
	if (installed != NULL)
		pfree(installed);
}

/*
 * IdemInstalledVersionGeneration returns a number that changes whenever
 * the installed version is read again (after ALTER EXTENSION UPDATE, say):
 * answers derived from IdemInstalledVersionAtLeast() are kept as long as
 * it stays the same.  (Checks the library's version first.)
 */
uint64
IdemInstalledVersionGeneration(void)
{
	IdemCheckLibraryVersion();
	return version_generation;
}

/*
 * IdemInstalledVersionAtLeast: is the extension installed in this database
 * of version "version" or later?  (Checks the library's version first, as
 * every function of the library does.)  The library serves every version
 * up to its own, and writes only what the installed version's objects hold.
 */
bool
IdemInstalledVersionAtLeast(const char *version)
{
	IdemCheckLibraryVersion();
	return installed_version[0] != '\0' &&
		IdemCompareVersions(installed_version, version) >= 0;
}

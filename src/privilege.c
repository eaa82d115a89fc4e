/*-------------------------------------------------------------------------
 *
 * privilege.c
 *	  What the extension does with more privilege than its caller: the DDL
 *	  it runs as the owner of its storage, the settings its background
 *	  workers run with, and the privileges of the ledger tables.
 *
 * Four things run with more privilege than whoever caused them:
 *
 *	- partition and table DDL, which any role's call may need, runs as the
 *	  owner of schema idempotency (IdemExecAsOwner);
 *	- the per-database maintenance workers and partition makers connect as
 *	  the bootstrap superuser, and PostgreSQL applies the database's own
 *	  settings (ALTER DATABASE ... SET, chosen by the database's owner, who
 *	  need not be trusted) to every connection (IdemPinWorkerSettings);
 *	- the ledger tables are made by the storage owner, so that owner's
 *	  default privileges (ALTER DEFAULT PRIVILEGES) would be applied to them
 *	  (IdemRestrictTableAcl);
 *	- the stream tables (idempotency.positions and .sequences, streams.c)
 *	  are read and written by prepared statements run as the storage owner
 *	  (IdemBecomeStorageOwner), as any role's call needs.
 *
 * The rule for all four: nothing the caller, the database's owner or a
 * default privilege can set changes what they do.  SQL runs with the
 * settings of pinned_settings below, whatever the session had, under a
 * restricted security context; the workers' own settings are pinned at
 * PGC_S_OVERRIDE, above anything a database or role setting gives; and a
 * ledger table is granted to nobody but its owner.  No SQL run here names
 * an operator or a function: there is nothing for a look-alike to
 * intercept even if the path were not pinned.  The stream statements name
 * every table and operator with its schema (OPERATOR(pg_catalog.=)), take
 * only typed parameters, and are planned once with those names, so no
 * search_path, setting or object a caller makes changes what they do; they
 * run in a restricted security context like the DDL.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/privilege.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "filter.h"
#include "privilege.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_attribute.h"
#include "catalog/pg_class.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_namespace.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

/*
 * Longest a worker waits for a lock (an ANALYZE or a DDL on a ledger's
 * parent can block ATTACH PARTITION): the round fails with the error in
 * idempotency.stats and is retried next round, and the other databases
 * are not held up.
 */
#define IDEM_WORKER_LOCK_TIMEOUT	"5s"

/* A setting and the value privileged work runs with */
typedef struct IdemPinnedSetting
{
	const char *name;
	const char *value;
} IdemPinnedSetting;

/*
 * Settings that could change what privileged SQL does, or where what it
 * makes goes: how names, literals and comparisons are read, and the place
 * and kind of new storage.  Applied to DDL run as the storage owner (for
 * that DDL only) and to the workers (for their whole life).
 */
static const IdemPinnedSetting pinned_settings[] = {
	{"search_path", "pg_catalog, pg_temp"},
	{"DateStyle", "ISO, MDY"},
	{"IntervalStyle", "postgres"},
	{"TimeZone", "UTC"},
	{"standard_conforming_strings", "on"},
	{"backslash_quote", "safe_encoding"},
	{"quote_all_identifiers", "off"},
	{"transform_null_equals", "off"},
	{"check_function_bodies", "on"},
	{"default_tablespace", ""},
	{"temp_tablespaces", ""},
	{"default_table_access_method", "heap"},
	{"default_toast_compression", "pglz"},
};

/*
 * What a worker's transactions themselves must not take from the database:
 * read-only or serializable transactions, timeouts that cut maintenance
 * short (or a missing one that lets it wait forever), another role.
 * transaction_timeout exists from PostgreSQL 17 on; a setting this server
 * does not have is skipped.
 */
static const IdemPinnedSetting worker_settings[] = {
	{"default_transaction_read_only", "off"},
	{"default_transaction_isolation", "read committed"},
	{"default_transaction_deferrable", "off"},
	{"statement_timeout", "0"},
	{"lock_timeout", IDEM_WORKER_LOCK_TIMEOUT},
	{"idle_in_transaction_session_timeout", "0"},
	{"transaction_timeout", "0"},
	{"role", "none"},
};

static void IdemPinSettings(const IdemPinnedSetting *settings, int n,
							GucSource source, GucAction action);

/*
 * IdemPinSettings sets each of "settings" that this server has, with the
 * given source and action.  A value a setting refuses is a bug here: the
 * error is raised.
 */
static void
IdemPinSettings(const IdemPinnedSetting *settings, int n, GucSource source,
				GucAction action)
{
	int			i;

	for (i = 0; i < n; i++)
	{
		if (GetConfigOption(settings[i].name, true, false) == NULL)
			continue;
		(void) set_config_option(settings[i].name, settings[i].value,
								 PGC_SUSET, source, action, true, ERROR,
								 false);
	}
}

/*
 * IdemPinWorkerSettings fixes the settings of a background worker that has
 * just connected to a database: those of pinned_settings and
 * worker_settings, at PGC_S_OVERRIDE, so that neither the database's nor
 * any role's settings apply to anything the worker does.  Call it before
 * the worker starts its first transaction: it runs one of its own.
 */
void
IdemPinWorkerSettings(void)
{
	IdemPinnedSetting self;

	/* some settings look names up in the catalogs */
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();

	/*
	 * First who the worker is: a database setting of session_authorization
	 * would otherwise make it another role (an owner may set it to any).
	 */
	self.name = "session_authorization";
	self.value = GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false);
	IdemPinSettings(&self, 1, PGC_S_OVERRIDE, GUC_ACTION_SET);
	IdemPinSettings(pinned_settings, lengthof(pinned_settings),
					PGC_S_OVERRIDE, GUC_ACTION_SET);
	IdemPinSettings(worker_settings, lengthof(worker_settings),
					PGC_S_OVERRIDE, GUC_ACTION_SET);

	CommitTransactionCommand();
}

/*
 * IdemExecAsOwner runs utility SQL as the owner of schema idempotency, in a
 * restricted security context, with the settings of pinned_settings and, if
 * lock_timeout_ms > 0, that lock timeout: none of the caller's settings can
 * redirect the DDL.  The previous user, security context and settings are
 * restored on return; on error, transaction abort restores them.  Returns
 * the number of rows the last statement processed.
 */
uint64
IdemExecAsOwner(const char *sql, int lock_timeout_ms)
{
	Oid			owner = IdemStorageOwner();
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	int			rc;
	uint64		processed;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	IdemPinSettings(pinned_settings, lengthof(pinned_settings),
					PGC_S_SESSION, GUC_ACTION_SAVE);
	if (lock_timeout_ms > 0)
	{
		char		buf[32];

		snprintf(buf, sizeof(buf), "%d", lock_timeout_ms);
		(void) set_config_option("lock_timeout", buf,
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
								 true, 0, false);
	}

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemFilterOwnSql(sql);
	PG_TRY();
	{
		rc = SPI_execute(sql, false, 0);
	}
	PG_FINALLY();
	{
		IdemFilterOwnSql(NULL);
	}
	PG_END_TRY();
	if (rc < 0)
		elog(ERROR, "SPI_execute failed: %s", SPI_result_code_string(rc));
	processed = SPI_processed;
	SPI_finish();

	AtEOXact_GUC(true, save_nestlevel);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	return processed;
}

/*
 * IdemPinOwnerSettings sets the settings of pinned_settings, as
 * IdemExecAsOwner does, at a new GUC nest level that it returns: the
 * caller gives it to AtEOXact_GUC(true, level) when done (transaction or
 * subtransaction abort restores them on error).  For SQL that the storage
 * owner runs for a caller and whose rows the caller reads (SPI, as
 * outbox_tenant.c does).
 */
int
IdemPinOwnerSettings(void)
{
	int			level = NewGUCNestLevel();

	IdemPinSettings(pinned_settings, lengthof(pinned_settings),
					PGC_S_SESSION, GUC_ACTION_SAVE);
	return level;
}

/*
 * IdemPinnedSettingAt gives the i-th setting pinned for privileged SQL
 * (IdemPinOwnerSettings) and its value; false past the last.  For a node
 * that runs such SQL elsewhere too (citus.c sends them to the Citus
 * workers a statement runs on).
 */
bool
IdemPinnedSettingAt(int i, const char **name, const char **value)
{
	if (i < 0 || i >= lengthof(pinned_settings))
		return false;
	*name = pinned_settings[i].name;
	*value = pinned_settings[i].value;
	return true;
}

/*
 * IdemStorageOwner returns the owner of schema idempotency, who owns the
 * extension's tables.
 */
Oid
IdemStorageOwner(void)
{
	HeapTuple	tup;
	Oid			owner;

	tup = SearchSysCache1(NAMESPACENAME, CStringGetDatum(IDEM_SCHEMA_NAME));
	if (!HeapTupleIsValid(tup))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_SCHEMA),
				 errmsg("schema \"%s\" does not exist", IDEM_SCHEMA_NAME),
				 errhint("Run CREATE EXTENSION idempotency.")));
	owner = ((Form_pg_namespace) GETSTRUCT(tup))->nspowner;
	ReleaseSysCache(tup);
	return owner;
}

/*
 * IdemBecomeStorageOwner makes the storage owner the current user, in a
 * restricted security context, saving the caller's into *save;
 * IdemRestoreUser gives them back (transaction or subtransaction abort
 * does it on error).
 */
void
IdemBecomeStorageOwner(IdemSavedUser *save)
{
	Oid			owner = IdemStorageOwner();

	GetUserIdAndSecContext(&save->userid, &save->sec_context);
	SetUserIdAndSecContext(owner, save->sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
}

void
IdemRestoreUser(const IdemSavedUser *save)
{
	SetUserIdAndSecContext(save->userid, save->sec_context);
}

/*
 * IdemOwnerSPIBegin connects to SPI and makes the storage owner the current
 * user, for the prepared statements of streams.c and the outbox
 * (IdemExecKeptPlan); IdemOwnerSPIEnd undoes both.
 */
void
IdemOwnerSPIBegin(IdemSavedUser *save)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	IdemBecomeStorageOwner(save);
}

void
IdemOwnerSPIEnd(const IdemSavedUser *save)
{
	IdemRestoreUser(save);
	SPI_finish();
}

/*
 * IdemExecKeptPlan runs "sql" under a fresh snapshot (what is committed
 * now, and this transaction's own changes), between SPI_connect and
 * SPI_finish, as whoever the caller made current.  The plan is made on the
 * first call and kept in *plan for the backend's life (SPI_keepplan), so
 * it is planned with the names the statement had then: the statements
 * name every table and operator with its schema.  isnull may be NULL (no
 * argument is null).  Returns SPI_processed.
 */
int
IdemExecKeptPlan(SPIPlanPtr *plan, const char *sql, int nargs,
				 const Oid *argtypes, Datum *values, const bool *isnull,
				 bool read_only)
{
	char		nulls[IDEM_KEPT_PLAN_MAX_ARGS];
	int			rc;
	int			i;

	Assert(nargs <= IDEM_KEPT_PLAN_MAX_ARGS);
	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(sql, nargs, (Oid *) argtypes);

		if (p == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql,
				 SPI_result_code_string(SPI_result));
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*plan = p;
	}
	for (i = 0; i < nargs; i++)
		nulls[i] = (isnull != NULL && isnull[i]) ? 'n' : ' ';
	rc = SPI_execute_snapshot(*plan, values, nulls,
							  GetLatestSnapshot(), InvalidSnapshot,
							  read_only, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_snapshot failed: %s",
			 SPI_result_code_string(rc));
	return (int) SPI_processed;
}

/*
 * IdemAddGrantees appends to *grantees (of *n, room for *size) every
 * grantee of "acl" but "owner" that is not there yet.
 */
static void
IdemAddGrantees(Acl *acl, Oid owner, Oid **grantees, int *n, int *size)
{
	AclItem    *items = ACL_DAT(acl);
	int			i;

	for (i = 0; i < ACL_NUM(acl); i++)
	{
		Oid			grantee = items[i].ai_grantee;
		int			j;

		if (grantee == owner)
			continue;
		for (j = 0; j < *n; j++)
			if ((*grantees)[j] == grantee)
				break;
		if (j < *n)
			continue;
		if (*n == *size)
		{
			*size *= 2;
			*grantees = repalloc(*grantees, *size * sizeof(Oid));
		}
		(*grantees)[(*n)++] = grantee;
	}
}

/*
 * IdemRestrictTableAcl takes back every privilege on table "relid" that is
 * held by anyone but its owner, on the table or on any of its columns: the
 * ledger tables are reached through the extension's functions only, and
 * hold every role's fingerprints, stored responses and digests.  Whatever
 * granted them (the storage owner's default privileges when the table was
 * made, a restore, a GRANT, on the table or on some columns), they go: a
 * REVOKE on the table takes its grantees' column privileges too.  Does
 * nothing, and runs no SQL, when there is nothing to take back, as for a
 * table made without default privileges.
 */
void
IdemRestrictTableAcl(Oid relid)
{
	HeapTuple	tup;
	Form_pg_class form;
	Datum		datum;
	bool		isnull;
	Oid			owner;
	int16		natts;
	AttrNumber	attnum;
	Oid		   *grantees;
	int			ngrantees = 0;
	int			size = 8;
	StringInfoData sql;
	int			i;

	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tup))
		return;					/* dropped meanwhile */
	form = (Form_pg_class) GETSTRUCT(tup);
	owner = form->relowner;
	natts = form->relnatts;
	grantees = palloc(size * sizeof(Oid));

	/* the table's grantees (NULL: the default, the owner only) */
	datum = SysCacheGetAttr(RELOID, tup, Anum_pg_class_relacl, &isnull);
	if (!isnull)
		IdemAddGrantees(DatumGetAclP(datum), owner, &grantees, &ngrantees,
						&size);

	/* and its columns' */
	for (attnum = 1; attnum <= natts; attnum++)
	{
		HeapTuple	atttup = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relid),
											 Int16GetDatum(attnum));

		if (!HeapTupleIsValid(atttup))
			continue;
		datum = SysCacheGetAttr(ATTNUM, atttup, Anum_pg_attribute_attacl,
								&isnull);
		if (!isnull)
			IdemAddGrantees(DatumGetAclP(datum), owner, &grantees,
							&ngrantees, &size);
		ReleaseSysCache(atttup);
	}

	if (ngrantees == 0)
	{
		ReleaseSysCache(tup);
		pfree(grantees);
		return;
	}

	initStringInfo(&sql);
	appendStringInfo(&sql, "REVOKE ALL ON TABLE %s.%s FROM ",
					 quote_identifier(get_namespace_name(form->relnamespace)),
					 quote_identifier(NameStr(form->relname)));
	ReleaseSysCache(tup);
	for (i = 0; i < ngrantees; i++)
	{
		if (i > 0)
			appendStringInfoString(&sql, ", ");
		if (grantees[i] == ACL_ID_PUBLIC)
			appendStringInfoString(&sql, "PUBLIC");
		else
			appendStringInfoString(&sql,
								   quote_identifier(GetUserNameFromId(grantees[i], false)));
	}
	appendStringInfoString(&sql, " CASCADE");

	IdemExecAsOwner(sql.data, 0);
	pfree(sql.data);
	pfree(grantees);
}

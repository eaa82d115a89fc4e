/*-------------------------------------------------------------------------
 *
 * role_ref.c
 *	  The type idempotency.role_ref: a role stored as this node's OID of it,
 *	  written and read everywhere else as the role's name.
 *
 * The role column of the tables that Citus distributes by tenant
 * (idempotency.citus_distribute(): the ledgers keys and messages, and
 * tenant_positions and tenant_sequences) is of this type.  Citus makes a
 * role on every node by name, and each node gives it an OID of its own;
 * its shard moves and splits copy rows with COPY and logical replication,
 * which carry a regrole as its bare OID in binary form.  A moved row of
 * an ordinary role would then carry the source node's OID: the role would
 * not find it on the new node, and another role that has that OID there
 * would.  A role_ref is stored exactly as an oid (4 bytes, by value, so
 * the C path writes and probes it as one, and its indexes are oid's
 * btree: the casts to oid and regrole are binary coercible), but its text
 * and binary forms are the role's name, so every copy between nodes
 * (binary or text COPY, logical replication in either mode, pg_dump)
 * finds the role again by its name on the node that reads it.
 *
 * The forms:
 *	- text: the name as regrole writes it (a quoted identifier when it
 *	  needs quotes); "-" for a role that no longer exists (or OID 0),
 *	  never its number.  Input takes a name as regrolein does, "-" as 0,
 *	  and refuses a bare number: an OID names another role, or none, on
 *	  another node (cast an oid to role_ref for this node's role).
 *	- binary: the name, unquoted, as text; empty for a role that no
 *	  longer exists.
 * A name no role of this node has reads as 0 in both forms, which no role
 * matches: a row of a role dropped before its copy arrives ownerless, and
 * a restore or a move does not fail on it.
 *
 * These functions are the type's I/O, which PostgreSQL calls from COPY,
 * the logical replication apply worker, pg_dump and casts, in any session:
 * they read nothing of the extension, and do not check the library's
 * version (library_version.c) as the SQL-callable functions of the API do.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/role_ref.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "role_ref.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "libpq/pqformat.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/varlena.h"

/* the text form of a role that no longer exists (regrole's for OID 0) */
#define ROLE_REF_GONE	"-"

PG_FUNCTION_INFO_V1(idem_role_ref_in);
PG_FUNCTION_INFO_V1(idem_role_ref_out);
PG_FUNCTION_INFO_V1(idem_role_ref_recv);
PG_FUNCTION_INFO_V1(idem_role_ref_send);

/*
 * idem_role_ref_in reads a role's name, as regrolein does (unquoted it is
 * folded to lower case; a double-quoted one is taken as written), "-" as
 * a role that no longer exists.  A name no role has reads as 0.
 */
Datum
idem_role_ref_in(PG_FUNCTION_ARGS)
{
	char	   *str = PG_GETARG_CSTRING(0);
	char	   *raw;
	List	   *names;

	if (strcmp(str, ROLE_REF_GONE) == 0)
		PG_RETURN_OID(InvalidOid);
	if (str[0] >= '0' && str[0] <= '9' && strspn(str, "0123456789") == strlen(str))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
				 errmsg("invalid input syntax for type %s: \"%s\"",
						"idempotency.role_ref", str),
				 errdetail("A role_ref is a role's name: an OID names another role, or none, on another node."),
				 errhint("Cast an oid to idempotency.role_ref for this node's role of that OID, or double-quote the name of a role made of digits.")));
	raw = pstrdup(str);
	if (!SplitIdentifierString(raw, '.', &names) || list_length(names) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_NAME),
				 errmsg("invalid name syntax"),
				 errdetail("A role_ref is one role name, or \"%s\" for a role that no longer exists.",
						   ROLE_REF_GONE)));
	PG_RETURN_OID(get_role_oid((const char *) linitial(names), true));
}

/*
 * idem_role_ref_out writes the role's name as regroleout does, or "-" if
 * no role has the OID.
 */
Datum
idem_role_ref_out(PG_FUNCTION_ARGS)
{
	Oid			role = PG_GETARG_OID(0);
	char	   *name = OidIsValid(role) ? GetUserNameFromId(role, true) : NULL;

	if (name == NULL)
		PG_RETURN_CSTRING(pstrdup(ROLE_REF_GONE));
	PG_RETURN_CSTRING(pstrdup(quote_identifier(name)));
}

/*
 * idem_role_ref_recv reads the binary form: the role's name as text, empty
 * for a role that no longer exists.  A name no role has reads as 0.
 */
Datum
idem_role_ref_recv(PG_FUNCTION_ARGS)
{
	StringInfo	buf = (StringInfo) PG_GETARG_POINTER(0);
	int			len = buf->len - buf->cursor;
	char	   *name;
	int			nbytes;

	if (len == 0)
		PG_RETURN_OID(InvalidOid);
	if (memchr(&buf->data[buf->cursor], '\0', len) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("invalid binary data for type %s: a role name has no zero byte",
						"idempotency.role_ref")));
	name = pq_getmsgtext(buf, len, &nbytes);
	if (nbytes >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("invalid binary data for type %s: a role name of %d bytes",
						"idempotency.role_ref", nbytes),
				 errdetail("A role name has at most %d bytes.", NAMEDATALEN - 1)));
	PG_RETURN_OID(get_role_oid(name, true));
}

/*
 * idem_role_ref_send writes the binary form: the role's name, unquoted, or
 * nothing if no role has the OID.
 */
Datum
idem_role_ref_send(PG_FUNCTION_ARGS)
{
	Oid			role = PG_GETARG_OID(0);
	char	   *name = OidIsValid(role) ? GetUserNameFromId(role, true) : NULL;
	StringInfoData buf;

	pq_begintypsend(&buf);
	if (name != NULL)
		pq_sendtext(&buf, name, strlen(name));
	PG_RETURN_BYTEA_P(pq_endtypsend(&buf));
}

/*
 * IdemIsRoleRefType: is typid idempotency.role_ref?  A keyed table's role
 * column (keyed_rows.c) may be of either regrole or role_ref: the same
 * representation.  Looked up each time (a keyed table's columns are
 * checked once per relcache invalidation of it), so that a type made
 * again by a new CREATE EXTENSION is found.
 */
bool
IdemIsRoleRefType(Oid typid)
{
	Oid			nsp = get_namespace_oid(IDEM_SCHEMA_NAME, true);

	return OidIsValid(nsp) && OidIsValid(typid) &&
		typid == GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
								 CStringGetDatum("role_ref"),
								 ObjectIdGetDatum(nsp));
}

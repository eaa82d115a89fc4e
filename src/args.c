/*-------------------------------------------------------------------------
 *
 * args.c
 *	  The argument checks every SQL function of the extension shares: keys,
 *	  scopes, consumers and message ids; ttls; where a write may happen; how
 *	  a key appears in an error message.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/args.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "compat.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * IdemKeyForMessage returns a key as error messages show it: at most
 * IDEM_KEY_IN_MESSAGE_LEN bytes (cut at a character boundary), with "..."
 * appended if it was cut.  Keys can be up to idempotency.max_key_length
 * (up to 1 MB) long; messages should not be.
 */
char *
IdemKeyForMessage(const char *key)
{
	int			len = strlen(key);
	int			cut;

	if (len <= IDEM_KEY_IN_MESSAGE_LEN)
		return pstrdup(key);
	cut = pg_mbcliplen(key, len, IDEM_KEY_IN_MESSAGE_LEN);
	return psprintf("%.*s...", cut, key);
}

/*
 * IdemCheckKeyLength raises the error for a key, message id, consumer or
 * scope of "len" bytes if that is over idempotency.max_key_length.
 */
void
IdemCheckKeyLength(int len, const char *argname)
{
	if (len > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", argname),
				 errdetail("The %s is %d bytes long; the limit is %d bytes.",
						   argname, len, idem_max_key_length),
				 errhint("Raise \"%s\", or send a shorter value such as a hash.",
						 "idempotency.max_key_length")));
}

/*
 * IdemCheckScopeArg returns text argument "argno", named "argname" in error
 * messages, after checking that it is not NULL and not longer than
 * idempotency.max_key_length.  It may be empty.
 */
text *
IdemCheckScopeArg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	text	   *t;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	t = PG_GETARG_TEXT_PP(argno);
	IdemCheckKeyLength(VARSIZE_ANY_EXHDR(t), argname);
	return t;
}

/*
 * IdemCheckKeyArg returns text argument "argno" after the checks of
 * IdemCheckScopeArg, and that it is not empty.
 */
text *
IdemCheckKeyArg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	text	   *t = IdemCheckScopeArg(fcinfo, argno, argname);

	if (VARSIZE_ANY_EXHDR(t) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", argname)));
	return t;
}

/*
 * Adding an interval none of whose three parts (months, days, time) is
 * longer than this many years to a time of this era cannot leave the
 * timestamp range (4713 BC to 294276 AD).
 */
#define IDEM_INTERVAL_SANE_YEARS	2000

/*
 * IdemTimestampPlus returns "t" plus "span" as a duration: days of 24 hours,
 * and months and years of the calendar in UTC, whatever the session's
 * TimeZone (timestamptz + interval counts days in the session's zone, so
 * that on the day a daylight-saving change happens '1 day' is 23 or 25
 * hours: a ttl or a lease must not depend on the client's zone).  A sum
 * outside the timestamp range (for which PostgreSQL raises 22008) is
 * -infinity or +infinity instead: callers
 * compare it with their bounds and refuse it with 22023, like any ttl or
 * lease out of range.  An interval with a part of more than
 * IDEM_INTERVAL_SANE_YEARS is not added at all: it is +infinity or
 * -infinity by the sign of its length in days (a month a twelfth of 365.25)
 * (an infinite interval of PostgreSQL 17 included).
 */
TimestampTz
IdemTimestampPlus(TimestampTz t, const Interval *span)
{
	const int64 years = IDEM_INTERVAL_SANE_YEARS;

	/* a part beyond the bound: out of every range a ttl or lease has */
	if (span->month > years * MONTHS_PER_YEAR ||
		span->month < -years * MONTHS_PER_YEAR ||
		span->day > years * 366 || span->day < -years * 366 ||
		span->time > years * 366 * USECS_PER_DAY ||
		span->time < -years * 366 * USECS_PER_DAY)
	{
		/* months of 365.25 / 12 days: right unless the parts cancel to a day */
		double		approx = (double) span->month * (DAYS_PER_YEAR / MONTHS_PER_YEAR) * USECS_PER_DAY +
			(double) span->day * USECS_PER_DAY + (double) span->time;

		return approx > 0 ? DT_NOEND : DT_NOBEGIN;
	}
	/* as a timestamp without time zone: the calendar of UTC */
	return (TimestampTz) DatumGetTimestamp(DirectFunctionCall2(timestamp_pl_interval,
															   TimestampGetDatum((Timestamp) t),
															   IntervalPGetDatum(span)));
}

/*
 * IdemExpiresAt computes the expiry of a row written at "now" from the ttl
 * argument "argno" (an interval, or NULL for the default ttl setting named
 * "default_ttl_name"), checking that it is positive and within
 * idempotency.max_ttl.
 */
TimestampTz
IdemExpiresAt(FunctionCallInfo fcinfo, int argno, TimestampTz now,
			  int default_ttl, const char *default_ttl_name)
{
	TimestampTz expires_at;
	TimestampTz limit = now + (int64) idem_max_ttl * USECS_PER_SEC;

	if (PG_ARGISNULL(argno))
	{
		if (default_ttl > idem_max_ttl)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("\"%s\" exceeds \"%s\"", default_ttl_name, "idempotency.max_ttl"),
					 errdetail("\"%s\" is %d seconds; \"%s\" is %d seconds.",
							   default_ttl_name, default_ttl,
							   "idempotency.max_ttl", idem_max_ttl)));
		return now + (int64) default_ttl * USECS_PER_SEC;
	}

	expires_at = IdemTimestampPlus(now, PG_GETARG_INTERVAL_P(argno));
	if (expires_at <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be a positive interval")));
	if (expires_at > limit)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl exceeds \"%s\"", "idempotency.max_ttl"),
				 errdetail("The limit is %d seconds.", idem_max_ttl),
				 errhint("Pass a shorter ttl, or raise \"%s\".", "idempotency.max_ttl")));
	return expires_at;
}

/*
 * IdemCheckWritable raises the usual errors for a write attempted on a
 * standby, in a read-only transaction or in parallel mode.
 */
void
IdemCheckWritable(const char *funcname)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s during recovery", funcname),
				 errhint("Call it on the primary server.")));
	PreventCommandIfReadOnly(funcname);
	PreventCommandIfParallelMode(funcname);
}

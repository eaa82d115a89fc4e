/*-------------------------------------------------------------------------
 *
 * responses.c
 *	  What one idempotency key may store: the checks of response headers,
 *	  and the bound idempotency.max_response_bytes puts on a response body
 *	  (jsonb or raw bytes), its headers and a kept request together.
 *
 * Headers are replayed by applications into HTTP responses, so what is
 * stored must be replayable as is: a JSON object whose names are HTTP
 * field names (RFC 9110 tokens), given once whatever their case, and whose
 * values are a string or a non-empty array of strings (a field sent more
 * than once), none holding a control character (a line break would split
 * the replayed response).  jsonb keeps one value of a name given twice
 * with the same spelling (the last); names that differ only in case are
 * an error here.  Which headers to keep is the application's choice (Location,
 * Content-Type, ETag; not Set-Cookie, which belongs to one client).
 *
 * Sizes are those the SPEC names: a jsonb value counts as its text form,
 * raw bytes as themselves.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/responses.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "responses.h"

#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

static bool IdemIsFieldName(const char *name, int len);
static void IdemCheckFieldValue(const char *name, const JsonbValue *v);
static int	IdemCompareNames(const void *a, const void *b);

/*
 * IdemJsonbTextSize returns the length of a jsonb value's text form.
 */
int64
IdemJsonbTextSize(Datum jsonb)
{
	Jsonb	   *jb = DatumGetJsonbP(jsonb);
	StringInfoData buf;
	int64		len;

	initStringInfo(&buf);
	(void) JsonbToCString(&buf, &jb->root, VARSIZE(jb));
	len = buf.len;
	pfree(buf.data);
	if ((Pointer) jb != DatumGetPointer(jsonb))
		pfree(jb);
	return len;
}

/*
 * IdemCheckStoredSize raises an error if "size" bytes (what one key would
 * store: see the file header) exceed idempotency.max_response_bytes.
 * "what" names the call, for the message.
 */
void
IdemCheckStoredSize(int64 size, const char *what)
{
	if (size > idem_max_response_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s would store " INT64_FORMAT " bytes for one idempotency key, more than \"idempotency.max_response_bytes\" (%d)",
						what, size, idem_max_response_bytes),
				 errdetail("A key stores its response body, its headers and a kept request; nothing was stored."),
				 errhint("Store a smaller response, or have a superuser raise \"idempotency.max_response_bytes\".")));
}

/* is name[0..len) an HTTP field name, an RFC 9110 token? */
static bool
IdemIsFieldName(const char *name, int len)
{
	int			i;

	if (len == 0)
		return false;
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') ||
			  (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL)))
			return false;
	}
	return true;
}

/* checks one value (a string) of the field "name" */
static void
IdemCheckFieldValue(const char *name, const JsonbValue *v)
{
	int			i;

	if (v->type != jbvString)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response header \"%s\" must be a string or an array of strings", name)));
	for (i = 0; i < v->val.string.len; i++)
	{
		unsigned char c = (unsigned char) v->val.string.val[i];

		/* RFC 9110: field values are visible characters, spaces and tabs */
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("response header \"%s\" must not contain control characters", name),
					 errdetail("Character 0x%02x at byte %d; a field value holds visible characters, spaces and tabs (RFC 9110), and a line break would split the replayed response.",
							   c, i + 1)));
	}
}

static int
IdemCompareNames(const void *a, const void *b)
{
	return pg_strcasecmp(*(char *const *) a, *(char *const *) b);
}

/*
 * IdemCheckResponseHeaders raises an error unless "headers" is a JSON
 * object of HTTP field names, each given once whatever its case, to a
 * string or a non-empty array of strings without line breaks.
 */
void
IdemCheckResponseHeaders(Datum headers)
{
	Jsonb	   *jb = DatumGetJsonbP(headers);
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue	v;
	char	  **names;
	int			nnames = 0;
	char	   *name = NULL;
	int			depth = 0;
	int			nelems = 0;
	int			i;

	if (!JB_ROOT_IS_OBJECT(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("response_headers must be a JSON object"),
				 errhint("Pass an object of header names to a string or an array of strings, such as {\"Location\": \"/charges/42\"}.")));

	names = palloc(Max(JB_ROOT_COUNT(jb), 1) * sizeof(char *));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
				if (++depth > 1)
					IdemCheckFieldValue(name, &v);	/* not a string: error */
				break;
			case WJB_KEY:
				name = pnstrdup(v.val.string.val, v.val.string.len);
				if (!IdemIsFieldName(v.val.string.val, v.val.string.len))
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("\"%s\" is not a valid HTTP header name", name),
							 errdetail("A header name is a token of RFC 9110: letters, digits and !#$%%&'*+-.^_`|~.")));
				names[nnames++] = name;
				break;
			case WJB_VALUE:
				IdemCheckFieldValue(name, &v);
				break;
			case WJB_BEGIN_ARRAY:
				if (++depth > 2)
					IdemCheckFieldValue(name, &v);	/* not a string: error */
				nelems = 0;
				break;
			case WJB_ELEM:
				IdemCheckFieldValue(name, &v);
				nelems++;
				break;
			case WJB_END_ARRAY:
				if (nelems == 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("response header \"%s\" has an empty array of values", name)));
				depth--;
				break;
			case WJB_END_OBJECT:
				depth--;
				break;
			case WJB_DONE:
				break;
		}
	}

	qsort(names, nnames, sizeof(char *), IdemCompareNames);
	for (i = 1; i < nnames; i++)
		if (pg_strcasecmp(names[i - 1], names[i]) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("response header \"%s\" is given more than once", names[i]),
					 errdetail("Header names compare case-insensitively: \"%s\" and \"%s\" are one header.",
							   names[i - 1], names[i]),
					 errhint("Give a header sent more than once as one name with an array of values.")));
	for (i = 0; i < nnames; i++)
		pfree(names[i]);
	pfree(names);
}

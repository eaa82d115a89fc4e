/*-------------------------------------------------------------------------
 *
 * keyhash.c
 *	  Digests of keys, hash lanes and the lock tags derived from them
 *	  (and from stream names, for streams.c).
 *
 * A ledger row does not store the caller's key text: it stores a 16-byte
 * digest of the key's namespace (the consumer of a message, the scope of an
 * idempotency key) and the key itself.  That keeps rows and index entries
 * small and fixed-width whatever the keys look like.  SHA-256 is used
 * rather than a fast non-cryptographic hash so that a tenant who chooses its
 * own message ids cannot construct a collision with another tenant's id.
 *
 * Since 0.3.0 the digest is
 *
 *		bytes 0-3:	the first 4 bytes of SHA-256(len(ns) || ns)
 *		bytes 4-15: bytes 4-15 of SHA-256(len(ns) || ns || key)
 *
 * so that every row of one namespace shares a prefix, and the rows of a
 * scope or consumer can be found with one range scan of the digest index
 * (idempotency.export_keys(), for moving a tenant to another node).  The
 * 96 bits of key hash keep keys of different namespaces from colliding
 * however they are chosen.  Before 0.3.0 the digest was bytes 0-15 of the
 * second hash: partitions made before (the "legacy" ones, see
 * IdemLaneValueOf) are probed with that form, which shares bytes 4-15.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keyhash.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "keyhash.h"
#include "lock_secret.h"

#include "common/cryptohash.h"
#include "common/hashfn.h"
#include "common/sha2.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/resowner.h"

#ifdef USE_OPENSSL
#include <openssl/evp.h>
#endif

static bytea *IdemFingerprintOf(Jsonb *jb);
static Jsonb *IdemJsonbShortestNumbers(Jsonb *jb);
static Numeric IdemShortestNumeric(Numeric num);

/*
 * SHA-256 for the life of the backend.  Every call hashes a key (twice when
 * it claims and completes), and most hash a request too, so the setup of a
 * hash must cost next to nothing.  With OpenSSL (as PostgreSQL is built on
 * every platform that matters), the digest implementation is fetched once
 * and one EVP context is reset for each hash: pg_cryptohash_init() fetches
 * the implementation again for every hash, which costs more than hashing a
 * key.  Without OpenSSL, PostgreSQL's own cryptohash API is used, with one
 * context registered with a resource owner of its own that is never
 * released, so that transaction ends leave it alone.
 */
#ifdef USE_OPENSSL
static EVP_MD_CTX *sha_ctx = NULL;
static const EVP_MD *sha_md = NULL;
#else
static pg_cryptohash_ctx *digest_ctx = NULL;
#endif

/*
 * The digest computed last, and what it was computed from: a key is
 * usually claimed and then completed by the same backend, one call after
 * the other.
 */
#define IDEM_LAST_DIGEST_INPUT	256
static struct
{
	bool		valid;
	int			nslen;
	int			keylen;
	char		input[IDEM_LAST_DIGEST_INPUT];	/* ns, then key */
	IdemDigest	digest;
}			last_digest;

/*
 * The namespace prefixes of recently used namespaces: consumers and scopes
 * repeat, and their hash need not be computed again.  Direct-mapped; a
 * namespace longer than IDEM_PREFIX_CACHE_NS is not kept.
 */
#define IDEM_PREFIX_CACHE_SIZE	64
#define IDEM_PREFIX_CACHE_NS	64
typedef struct IdemPrefixEntry
{
	int			nslen;			/* -1: empty */
	char		ns[IDEM_PREFIX_CACHE_NS];
	uint8		prefix[IDEM_DIGEST_PREFIX_LEN];
} IdemPrefixEntry;
static IdemPrefixEntry prefix_cache[IDEM_PREFIX_CACHE_SIZE];
static bool prefix_cache_ready = false;

static void IdemSha256(const uint8 *a, int alen, const uint8 *b, int blen,
					   const uint8 *c, int clen,
					   uint8 out[PG_SHA256_DIGEST_LENGTH]);

#ifdef USE_OPENSSL

/* sets up the backend's SHA-256 context on first use */
static void
IdemSha256Setup(void)
{
	if (sha_md == NULL)
	{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
		sha_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
		sha_md = EVP_sha256();
#endif
		if (sha_md == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not load the SHA-256 implementation of OpenSSL")));
	}
	if (sha_ctx == NULL)
	{
		sha_ctx = EVP_MD_CTX_new();
		if (sha_ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
	}
}

/* SHA-256 of the concatenation of up to three pieces */
static void
IdemSha256(const uint8 *a, int alen, const uint8 *b, int blen,
		   const uint8 *c, int clen, uint8 out[PG_SHA256_DIGEST_LENGTH])
{
	unsigned int outlen;

	IdemSha256Setup();
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
	if (EVP_DigestInit_ex2(sha_ctx, sha_md, NULL) != 1)
#else
	if (EVP_DigestInit_ex(sha_ctx, sha_md, NULL) != 1)
#endif
		goto fail;
	if (EVP_DigestUpdate(sha_ctx, a, alen) != 1 ||
		(blen > 0 && EVP_DigestUpdate(sha_ctx, b, blen) != 1) ||
		(clen > 0 && EVP_DigestUpdate(sha_ctx, c, clen) != 1) ||
		EVP_DigestFinal_ex(sha_ctx, out, &outlen) != 1 ||
		outlen != PG_SHA256_DIGEST_LENGTH)
		goto fail;
	return;

fail:
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("could not compute a SHA-256 digest with OpenSSL")));
}

#else							/* !USE_OPENSSL */

/* returns the backend's SHA-256 context, making it on first use */
static pg_cryptohash_ctx *
IdemDigestContext(void)
{
	static ResourceOwner owner = NULL;

	if (digest_ctx == NULL)
	{
		ResourceOwner save = CurrentResourceOwner;

		if (owner == NULL)
			owner = ResourceOwnerCreate(NULL, "idempotency digest");
		CurrentResourceOwner = owner;
		PG_TRY();
		{
			digest_ctx = pg_cryptohash_create(PG_SHA256);
		}
		PG_FINALLY();
		{
			CurrentResourceOwner = save;
		}
		PG_END_TRY();
		if (digest_ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
	}
	return digest_ctx;
}

/* SHA-256 of the concatenation of up to three pieces */
static void
IdemSha256(const uint8 *a, int alen, const uint8 *b, int blen,
		   const uint8 *c, int clen, uint8 out[PG_SHA256_DIGEST_LENGTH])
{
	pg_cryptohash_ctx *ctx = IdemDigestContext();

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, a, alen) < 0 ||
		(blen > 0 && pg_cryptohash_update(ctx, b, blen) < 0) ||
		(clen > 0 && pg_cryptohash_update(ctx, c, clen) < 0) ||
		pg_cryptohash_final(ctx, out, PG_SHA256_DIGEST_LENGTH) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute a SHA-256 digest: %s",
						pg_cryptohash_error(ctx))));
}

#endif							/* USE_OPENSSL */

/*
 * IdemNamespacePrefix sets the digest prefix every key of namespace "ns"
 * has: the first bytes of SHA-256 over its length and itself.
 */
void
IdemNamespacePrefix(const char *ns, int nslen, uint8 *prefix)
{
	uint32		nslen_be = pg_hton32((uint32) nslen);
	IdemPrefixEntry *e;
	uint8		full[PG_SHA256_DIGEST_LENGTH];

	if (!prefix_cache_ready)
	{
		int			i;

		for (i = 0; i < IDEM_PREFIX_CACHE_SIZE; i++)
			prefix_cache[i].nslen = -1;
		prefix_cache_ready = true;
	}
	e = &prefix_cache[hash_bytes((const unsigned char *) ns, nslen) % IDEM_PREFIX_CACHE_SIZE];
	if (e->nslen == nslen && memcmp(e->ns, ns, nslen) == 0)
	{
		memcpy(prefix, e->prefix, IDEM_DIGEST_PREFIX_LEN);
		return;
	}

	IdemSha256((const uint8 *) &nslen_be, sizeof(nslen_be),
			   (const uint8 *) ns, nslen, NULL, 0, full);
	memcpy(prefix, full, IDEM_DIGEST_PREFIX_LEN);
	if (nslen <= IDEM_PREFIX_CACHE_NS)
	{
		e->nslen = -1;			/* not valid while it is being written */
		memcpy(e->ns, ns, nslen);
		memcpy(e->prefix, full, IDEM_DIGEST_PREFIX_LEN);
		e->nslen = nslen;
	}
}

/*
 * IdemComputeDigest computes the digest of key "key" in namespace "ns" (see
 * the top of this file), and the first bytes of its legacy form.
 *
 * The namespace length is hashed first, so that ("ab", "c") and ("a", "bc")
 * never share a digest.
 */
void
IdemComputeDigest(const char *ns, int nslen, const char *key, int keylen,
				  IdemDigest *digest)
{
	uint8		full[PG_SHA256_DIGEST_LENGTH];
	uint32		nslen_be = pg_hton32((uint32) nslen);
	bool		keep = (nslen + keylen <= IDEM_LAST_DIGEST_INPUT);

	if (keep && last_digest.valid && last_digest.nslen == nslen &&
		last_digest.keylen == keylen &&
		memcmp(last_digest.input, ns, nslen) == 0 &&
		memcmp(last_digest.input + nslen, key, keylen) == 0)
	{
		*digest = last_digest.digest;
		return;
	}

	IdemSha256((const uint8 *) &nslen_be, sizeof(nslen_be),
			   (const uint8 *) ns, nslen, (const uint8 *) key, keylen, full);
	memcpy(digest->legacy_head, full, IDEM_DIGEST_PREFIX_LEN);
	memcpy(digest->uuid.data + IDEM_DIGEST_PREFIX_LEN,
		   full + IDEM_DIGEST_PREFIX_LEN,
		   IDEM_DIGEST_LEN - IDEM_DIGEST_PREFIX_LEN);
	IdemNamespacePrefix(ns, nslen, digest->uuid.data);

	/* remembered only once complete: an error above leaves it invalid */
	last_digest.valid = false;
	if (keep)
	{
		memcpy(last_digest.input, ns, nslen);
		memcpy(last_digest.input + nslen, key, keylen);
		last_digest.nslen = nslen;
		last_digest.keylen = keylen;
		last_digest.digest = *digest;
		last_digest.valid = true;
	}
}

/*
 * IdemLegacyDigest sets *out to the form a key's digest had before 0.3.0,
 * as rows in legacy partitions store it.
 */
void
IdemLegacyDigest(const IdemDigest *digest, pg_uuid_t *out)
{
	*out = digest->uuid;
	memcpy(out->data, digest->legacy_head, IDEM_DIGEST_PREFIX_LEN);
}

/*
 * IdemFingerprint returns the fingerprint of a request: SHA-256 of the
 * text form of the jsonb with every number in its shortest form, as a
 * 32-byte bytea.  Two requests have the same fingerprint exactly when they
 * are equal jsonb values: jsonb already orders keys and drops whitespace
 * and duplicate keys, and 1, 1.0 and 1.00 are the same number (as jsonb's
 * "=" has it) whatever scale the client wrote.
 *
 * Before 0.3.1 the text kept each number's scale.  When that makes a
 * difference for this request, *legacy is set to the fingerprint an older
 * version computed, so that a key claimed then still matches its retry;
 * otherwise (and for almost every request) it is set to NULL.
 */
bytea *
IdemFingerprint(Datum request, bytea **legacy)
{
	Jsonb	   *jb = DatumGetJsonbP(request);
	Jsonb	   *canonical = IdemJsonbShortestNumbers(jb);

	*legacy = NULL;
	if (canonical != jb)
		*legacy = IdemFingerprintOf(jb);
	return IdemFingerprintOf(canonical);
}

/* SHA-256 of a jsonb's text form, as a bytea */
static bytea *
IdemFingerprintOf(Jsonb *jb)
{
	char	   *text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	bytea	   *result = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);

	SET_VARSIZE(result, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	IdemSha256((const uint8 *) text, strlen(text), NULL, 0, NULL, 0,
			   (uint8 *) VARDATA(result));
	pfree(text);
	return result;
}

/*
 * IdemJsonbShortestNumbers returns "jb" itself if every number in it is
 * written in its shortest form (no trailing zeros after the decimal
 * point), and otherwise a copy in which every number is.
 */
static Jsonb *
IdemJsonbShortestNumbers(Jsonb *jb)
{
	JsonbIterator *it;
	JsonbParseState *state = NULL;
	JsonbValue	v;
	JsonbValue *result = NULL;
	JsonbIteratorToken tok;
	bool		changed = false;

	/* a first pass, without copying: most requests need nothing */
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if ((tok == WJB_VALUE || tok == WJB_ELEM) && v.type == jbvNumeric &&
			IdemShortestNumeric(v.val.numeric) != NULL)
		{
			changed = true;
			break;
		}
	}
	if (!changed)
		return jb;

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_VALUE:
			case WJB_ELEM:
				if (v.type == jbvNumeric)
				{
					Numeric		shortest = IdemShortestNumeric(v.val.numeric);

					if (shortest != NULL)
						v.val.numeric = shortest;
				}
				result = pushJsonbValue(&state, tok, &v);
				break;
			case WJB_KEY:
				result = pushJsonbValue(&state, tok, &v);
				break;
			case WJB_BEGIN_ARRAY:
				/* a top-level scalar's pseudo array stays a scalar */
				result = pushJsonbValue(&state, tok,
										v.val.array.rawScalar ? &v : NULL);
				break;
			default:
				result = pushJsonbValue(&state, tok, NULL);
				break;
		}
	}
	return JsonbValueToJsonb(result);
}

/*
 * IdemShortestNumeric returns the number "num" without the trailing zeros
 * of its fraction, or NULL if it has none.
 */
static Numeric
IdemShortestNumeric(Numeric num)
{
	char	   *shortest = numeric_normalize(num);
	char	   *written = DatumGetCString(DirectFunctionCall1(numeric_out,
															  NumericGetDatum(num)));
	Numeric		result = NULL;

	if (strcmp(shortest, written) != 0)
		result = DatumGetNumeric(DirectFunctionCall3(numeric_in,
													 CStringGetDatum(shortest),
													 ObjectIdGetDatum(InvalidOid),
													 Int32GetDatum(-1)));
	pfree(shortest);
	pfree(written);
	return result;
}

/*
 * IdemLaneValue returns the value of the "lane" partition column for a digest
 * under a layout with "lanes" hash lanes, in current or legacy partitions.
 *
 * The lane number is the digest's bytes 12 to 15 read as a little-endian
 * unsigned integer, modulo the lane count: a function of the stored bytes
 * alone, so a ledger moved to a machine of the other byte order (pg_dump,
 * pg_basebackup) finds every row where it is.  (Before 0.3.0 the bytes
 * were read in the machine's own order, which is the same thing on
 * little-endian machines.)  Those bytes are the same in a digest's current
 * and legacy forms.
 */
int16
IdemLaneValue(const pg_uuid_t *digest, int lanes, bool legacy)
{
	const unsigned char *b = digest->data + 12;
	uint32		h;

	Assert(lanes >= 1 && lanes <= IDEM_MAX_LANES);
	h = (uint32) b[0] | ((uint32) b[1] << 8) | ((uint32) b[2] << 16) |
		((uint32) b[3] << 24);
	return IdemLaneValueOf(lanes, (int) (h % (uint32) lanes), legacy);
}

/* ----------------------------------------------------------------
 * Lock tags
 *
 * A lock tag derived from a key, a message id or a stream name is visible
 * to every role in pg_locks while it is held, with its holder's process.
 * So its holder's role is a field of its own (no role's tag can equal
 * another role's, however its names are chosen), and the part derived
 * from the names is 32 bits of SipHash-2-4 keyed with the database's
 * secret (lock_secret.c), over the role and the names: no role that
 * cannot read the secret can compute, for a guessed name, the tag another
 * role's lock has, nor tell from its own lock of the same name.
 *
 * SipHash-2-4 (Aumasson and Bernstein, 2012) is a pseudorandom function
 * keyed with 128 bits, made for short inputs and for this use: outputs
 * nobody can predict without the key, even after seeing the outputs for
 * inputs of one's choice (the keyed hash tables of Python, Rust and Linux,
 * Linux's TCP sequence numbers).  It costs about 300 instructions for a
 * key's tag; one block of SHA-256 costs 2,000 to 3,000, and HMAC-SHA-256
 * needs two at least.
 * ----------------------------------------------------------------
 */

/*
 * What a secret's id hashes (IdemSecretId): 4 bytes, shorter than any
 * lock tag's input or a filter's (IdemFilterDigestHash)
 */
#define IDEM_HASH_SECRET_ID		0x53454352	/* "SECR" */

typedef struct IdemSipHash
{
	uint64		v0,
				v1,
				v2,
				v3;
	uint64		tail;			/* bytes not yet in a word, little-endian */
	int			ntail;
	uint32		length;			/* bytes hashed (mod 256 is what counts) */
} IdemSipHash;

#define IDEM_ROTL64(x, b)	(((x) << (b)) | ((x) >> (64 - (b))))
#define IDEM_SIPROUND(s) \
	do { \
		(s)->v0 += (s)->v1; (s)->v1 = IDEM_ROTL64((s)->v1, 13); \
		(s)->v1 ^= (s)->v0; (s)->v0 = IDEM_ROTL64((s)->v0, 32); \
		(s)->v2 += (s)->v3; (s)->v3 = IDEM_ROTL64((s)->v3, 16); \
		(s)->v3 ^= (s)->v2; \
		(s)->v0 += (s)->v3; (s)->v3 = IDEM_ROTL64((s)->v3, 21); \
		(s)->v3 ^= (s)->v0; \
		(s)->v2 += (s)->v1; (s)->v1 = IDEM_ROTL64((s)->v1, 17); \
		(s)->v1 ^= (s)->v2; (s)->v2 = IDEM_ROTL64((s)->v2, 32); \
	} while (0)

/* 8 bytes as a little-endian 64-bit integer */
static inline uint64
IdemLoad64LE(const uint8 *p)
{
	return (uint64) p[0] | ((uint64) p[1] << 8) | ((uint64) p[2] << 16) |
		((uint64) p[3] << 24) | ((uint64) p[4] << 32) |
		((uint64) p[5] << 40) | ((uint64) p[6] << 48) | ((uint64) p[7] << 56);
}

static void
IdemSipInit(IdemSipHash *s, const uint8 key[IDEM_LOCK_SECRET_LEN])
{
	uint64		k0 = IdemLoad64LE(key);
	uint64		k1 = IdemLoad64LE(key + 8);

	s->v0 = k0 ^ UINT64CONST(0x736f6d6570736575);
	s->v1 = k1 ^ UINT64CONST(0x646f72616e646f6d);
	s->v2 = k0 ^ UINT64CONST(0x6c7967656e657261);
	s->v3 = k1 ^ UINT64CONST(0x7465646279746573);
	s->tail = 0;
	s->ntail = 0;
	s->length = 0;
}

/* absorbs one 64-bit word of the message */
static inline void
IdemSipWord(IdemSipHash *s, uint64 m)
{
	s->v3 ^= m;
	IDEM_SIPROUND(s);
	IDEM_SIPROUND(s);
	s->v0 ^= m;
}

static void
IdemSipUpdate(IdemSipHash *s, const uint8 *p, int len)
{
	s->length += (uint32) len;
	while (len > 0 && s->ntail > 0)
	{
		s->tail |= (uint64) *p++ << (8 * s->ntail);
		len--;
		if (++s->ntail == 8)
		{
			IdemSipWord(s, s->tail);
			s->tail = 0;
			s->ntail = 0;
		}
	}
	for (; len >= 8; p += 8, len -= 8)
		IdemSipWord(s, IdemLoad64LE(p));
	for (; len > 0; len--)
		s->tail |= (uint64) *p++ << (8 * s->ntail++);
}

static uint64
IdemSipFinal(IdemSipHash *s)
{
	IdemSipWord(s, s->tail | ((uint64) (s->length & 0xff) << 56));
	s->v2 ^= 0xff;
	IDEM_SIPROUND(s);
	IDEM_SIPROUND(s);
	IDEM_SIPROUND(s);
	IDEM_SIPROUND(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/*
 * IdemSetKeyLockTag fills in the lock tag that serializes the probe and
 * insert of one key of one role in one ledger, and returns whether it is
 * of the keyed form.
 *
 * Keyed (the installed extension is 0.4.0 or later): the role's OID, and
 * the low 32 bits of SipHash-2-4, under the database's secret, of the
 * ledger, the role and the digest's bytes 4 to 15 (the same in its current
 * and legacy forms, and not depending on the namespace alone).  Keys of
 * one role may share a tag (one chance in 2^32 per pair); that only makes
 * two callers wait for each other for the length of a probe.
 *
 * Public (0.3.1's form, before the update): the digest's bytes 4 to 11,
 * XOR a mix of the role and the ledger, which any role can compute for a
 * guessed key.  Kept only while a session running a 0.3.1 library may
 * claim the same key: it must take the same lock (see lock_secret.c).
 */
bool
IdemSetKeyLockTag(LOCKTAG *tag, IdemLedger ledger, Oid role,
				  const pg_uuid_t *digest)
{
	uint64		h;

	if (likely(IdemKeyedLockTags()))
	{
		IdemSipHash s;
		uint32		head[2];

		head[0] = pg_hton32((uint32) ledger);
		head[1] = pg_hton32((uint32) role);
		IdemSipInit(&s, IdemLockSecret());
		IdemSipUpdate(&s, (const uint8 *) head, sizeof(head));
		IdemSipUpdate(&s, digest->data + IDEM_DIGEST_PREFIX_LEN,
					  IDEM_DIGEST_LEN - IDEM_DIGEST_PREFIX_LEN);
		SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) role,
							 (uint32) IdemSipFinal(&s), IDEM_LOCK_KEY);
		return true;
	}

	memcpy(&h, digest->data + IDEM_DIGEST_PREFIX_LEN, sizeof(h));
	h ^= ((uint64) role * UINT64CONST(0x9E3779B97F4A7C15)) + (uint64) ledger;
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_KEY);
	return false;
}

/*
 * IdemSetStreamLockTag fills in the lock tag of one stream position (kind
 * IDEM_LOCK_POSITION: consumer a, stream b, partition part) or one
 * producer's sequence (IDEM_LOCK_SEQUENCE: consumer a, producer b, part
 * 0) of role "role": the role's OID, and the low 32 bits of SipHash-2-4,
 * under the database's secret, of the kind, the role, the partition and
 * both names (a's length first, so that ("ab", "c") and ("a", "bc")
 * differ).  Until 0.4.0 was released the names went through a Jenkins
 * hash, which is easily inverted (another role computed names whose locks
 * equalled this role's, and stalled its calls), and then, until its
 * review, an unkeyed SHA-256 (another role computed the tag of a guessed
 * stream name and saw in pg_locks when this role advanced it).  Stream
 * locks exist only from 0.4.0 on, so there is no older form to keep.
 *
 * Two identities of one role may share a tag (one chance in 2^32 per
 * pair); their calls then only wait for each other.  A role that makes
 * its own names share a tag stalls only itself.
 */
void
IdemSetStreamLockTag(LOCKTAG *tag, int kind, Oid role, const char *a,
					 int alen, const char *b, int blen, int32 part)
{
	IdemSipHash s;
	uint32		head[4];

	head[0] = pg_hton32((uint32) kind);
	head[1] = pg_hton32((uint32) role);
	head[2] = pg_hton32((uint32) part);
	head[3] = pg_hton32((uint32) alen);
	IdemSipInit(&s, IdemLockSecret());
	IdemSipUpdate(&s, (const uint8 *) head, sizeof(head));
	IdemSipUpdate(&s, (const uint8 *) a, alen);
	IdemSipUpdate(&s, (const uint8 *) b, blen);
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) role,
						 (uint32) IdemSipFinal(&s), kind);
}

/*
 * IdemFilterDigestHash returns what the digest filters hold of a row of
 * role "role" with this digest (filter_pool.c): SipHash-2-4, under the
 * database's secret, of 16 bytes, the role's OID and the digest's bytes 4
 * to 15 (little-endian words).  No lock tag's input is 16 bytes long (a
 * key's is 20, a stream's at least 18), and SipHash hashes the length in.
 * The bits a row sets in its partition's filter are chosen from these:
 * until 0.4.0's review they were a public function of the role and the
 * digest, so another role could compute a key of its own whose bits were
 * those of a key it guessed, and see in pg_stat_all_indexes whether its
 * probe of that key went to the partition's index, that is whether the
 * guessed key was there (test/t/055_who_has_what.pl).  Two words and no
 * tail: this is computed for each probe of a new key.
 */
uint64
IdemFilterDigestHash(Oid role, const pg_uuid_t *digest)
{
	IdemSipHash s;
	const uint8 *d = digest->data + IDEM_DIGEST_PREFIX_LEN;

	IdemSipInit(&s, IdemLockSecret());
	IdemSipWord(&s, (uint64) (uint32) role |
				((uint64) d[0] << 32) | ((uint64) d[1] << 40) |
				((uint64) d[2] << 48) | ((uint64) d[3] << 56));
	IdemSipWord(&s, IdemLoad64LE(d + 4));
	s.length = 16;
	return IdemSipFinal(&s);
}

/*
 * IdemSecretId returns 64 bits that tell one secret from another (a
 * filter made under one secret is no answer under another): SipHash-2-4,
 * under the secret, of a word of its own.  Not 0.
 */
uint64
IdemSecretId(const uint8 *secret)
{
	IdemSipHash s;
	uint32		head = pg_hton32(IDEM_HASH_SECRET_ID);
	uint64		id;

	IdemSipInit(&s, secret);
	IdemSipUpdate(&s, (const uint8 *) &head, sizeof(head));
	id = IdemSipFinal(&s);
	return id != 0 ? id : 1;
}

/*
 * IdemSetLedgerLockTag fills in a per-ledger (or, for IDEM_LOCK_MAINTAIN,
 * per-database) lock tag of the given kind.
 */
void
IdemSetLedgerLockTag(LOCKTAG *tag, IdemLedger ledger, int kind)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) ledger, 0, kind);
}

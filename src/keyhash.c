/*-------------------------------------------------------------------------
 *
 * keyhash.c
 *	  Digests of keys, hash lanes and the lock tags derived from them.
 *
 * A ledger row does not store the caller's key text: it stores a 16-byte
 * digest, the first half of SHA-256 over the key's namespace (the consumer
 * of a message, the scope of an idempotency key) and the key itself.  That
 * keeps rows and index entries small and fixed-width whatever the keys look
 * like.  SHA-256 is used rather than a fast non-cryptographic hash so that a
 * tenant who chooses its own message ids cannot construct a collision with
 * another tenant's id in the same namespace.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keyhash.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "miscadmin.h"
#include "port/pg_bswap.h"
#include "utils/jsonb.h"
#include "utils/resowner.h"

/*
 * One SHA-256 context for the life of the backend: creating one costs more
 * than hashing a key.  It is registered with a resource owner of its own that
 * is never released, so transaction ends leave it alone.
 */
static pg_cryptohash_ctx *digest_ctx = NULL;

static pg_cryptohash_ctx *IdemDigestContext(void);

/*
 * IdemComputeDigest computes the digest of key "key" in namespace "ns".
 *
 * The namespace length is hashed first, so that ("ab", "c") and ("a", "bc")
 * never share a digest.
 */
void
IdemComputeDigest(const char *ns, int nslen, const char *key, int keylen,
				  pg_uuid_t *digest)
{
	pg_cryptohash_ctx *ctx;
	uint8		full[PG_SHA256_DIGEST_LENGTH];
	uint32		nslen_be = pg_hton32((uint32) nslen);

	ctx = IdemDigestContext();
	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) &nslen_be, sizeof(nslen_be)) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) ns, nslen) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) key, keylen) < 0 ||
		pg_cryptohash_final(ctx, full, sizeof(full)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute SHA-256 digest of idempotency key: %s",
						pg_cryptohash_error(ctx))));

	memcpy(digest->data, full, IDEM_DIGEST_LEN);
}

/*
 * IdemFingerprint returns the fingerprint of a request: SHA-256 of the
 * jsonb's canonical text form (jsonb already orders keys and drops
 * whitespace and duplicate keys), as a 32-byte bytea.
 */
bytea *
IdemFingerprint(Datum request)
{
	Jsonb	   *jb = DatumGetJsonbP(request);
	char	   *text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	pg_cryptohash_ctx *ctx = IdemDigestContext();
	bytea	   *result = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);

	SET_VARSIZE(result, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) text, strlen(text)) < 0 ||
		pg_cryptohash_final(ctx, (uint8 *) VARDATA(result),
							PG_SHA256_DIGEST_LENGTH) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute SHA-256 fingerprint of request: %s",
						pg_cryptohash_error(ctx))));
	pfree(text);
	return result;
}

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

/*
 * IdemLaneValue returns the value of the "lane" partition column for a digest
 * under a layout with "lanes" hash lanes.
 *
 * The lane number is the digest's bytes 12 to 15 read as a little-endian
 * unsigned integer, modulo the lane count: a function of the stored bytes
 * alone, so a ledger moved to a machine of the other byte order (pg_dump,
 * pg_basebackup) finds every row where it is.  (Before 0.3.0 the bytes
 * were read in the machine's own order, which is the same thing on
 * little-endian machines.)
 *
 * The lane count is encoded in the value ((lanes << 8) | lane number), so
 * partitions made under different settings never share a lane value and a
 * key can be looked up under every layout that still has live partitions.
 */
int16
IdemLaneValue(const pg_uuid_t *digest, int lanes)
{
	const unsigned char *b = digest->data + 12;
	uint32		h;

	Assert(lanes >= 1 && lanes <= IDEM_MAX_LANES);
	h = (uint32) b[0] | ((uint32) b[1] << 8) | ((uint32) b[2] << 16) |
		((uint32) b[3] << 24);
	return (int16) ((lanes << 8) | (int) (h % (uint32) lanes));
}

/*
 * IdemSetKeyLockTag fills in the lock tag that serializes the probe and
 * insert of one key of one role in one ledger.
 *
 * Distinct keys may share a tag (64 bits of hash); that only makes two
 * callers wait for each other for the length of a probe.
 */
void
IdemSetKeyLockTag(LOCKTAG *tag, IdemLedger ledger, Oid role,
				  const pg_uuid_t *digest)
{
	uint64		h;

	memcpy(&h, digest->data, sizeof(h));
	h ^= ((uint64) role * UINT64CONST(0x9E3779B97F4A7C15)) + (uint64) ledger;
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCK_KEY);
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

/*-------------------------------------------------------------------------
 *
 * keyhash.h
 *	  Hashing (keyhash.c): the digests of keys and message ids, their lanes,
 *	  the lock tags of keys, ledgers and streams, and the fingerprints of
 *	  requests.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/keyhash.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_KEYHASH_H
#define IDEMPOTENCY_KEYHASH_H

#include "idempotency.h"

#include "storage/lock.h"

/* The digest of (namespace, key) (IdemDigest), and the lane it falls in */
extern void IdemComputeDigest(const char *ns, int nslen,
							  const char *key, int keylen,
							  IdemDigest *digest);
extern void IdemNamespacePrefix(const char *ns, int nslen, uint8 *prefix);
extern void IdemLegacyDigest(const IdemDigest *digest, pg_uuid_t *out);
extern int16 IdemLaneValue(const pg_uuid_t *digest, int lanes, bool legacy);

/* Lock tags: one key's, one ledger's (of a kind IDEM_LOCK_*), a stream's */
extern bool IdemSetKeyLockTag(LOCKTAG *tag, IdemLedger ledger, Oid role,
							  const pg_uuid_t *digest);
extern void IdemSetLedgerLockTag(LOCKTAG *tag, IdemLedger ledger, int kind);
extern uint64 IdemFilterDigestHash(Oid role, const pg_uuid_t *digest);
extern uint64 IdemSecretId(const uint8 *secret);
extern void IdemSetStreamLockTag(LOCKTAG *tag, int kind, Oid role,
								 const char *a, int alen,
								 const char *b, int blen, int32 part);

/* A request's fingerprint (and, where it differs, the one before 0.3.1) */
extern bytea *IdemFingerprint(Datum request, bytea **legacy);

#endif							/* IDEMPOTENCY_KEYHASH_H */

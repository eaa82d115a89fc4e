-- bench/drop.sh baseline: a plain table with the ledger's columns and a btree
-- on the digest, holding a copy of the rows of the filled partition (psql
-- variable "part"), index built row by row as in the ledger.  Autovacuum is
-- off for it: the VACUUM the DELETE needs is run and measured by drop.sh.
CREATE TABLE plain_expiry (LIKE idempotency.messages) WITH (autovacuum_enabled = off);
CREATE INDEX plain_expiry_digest ON plain_expiry (digest);
INSERT INTO plain_expiry SELECT * FROM :part;

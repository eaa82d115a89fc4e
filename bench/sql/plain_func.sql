-- (b) plain baseline wrapped in a PL/pgSQL function returning boolean (like the extension's API)
SELECT plain_consume('bench', gen_random_uuid()::text);

--
-- Responses beyond JSON (0.4.0): response headers, raw bytes, and the bound
-- idempotency.max_response_bytes puts on what one key stores
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;

CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- headers and raw bytes are stored and replayed byte for byte
BEGIN;
SELECT status FROM idem_claim('r-csv', scope => 'resp');
SELECT idem_complete('r-csv', 201, scope => 'resp',
                     response_headers => '{"Location": "/exports/7", "Content-Type": "text/csv; charset=utf-8", "Link": ["<a>; rel=next", "<b>; rel=last"]}',
                     response_raw => '\x612c620d0a00ff'::bytea);
COMMIT;
SELECT status, response_code, response_body, response_headers, response_raw,
       response_raw = '\x612c620d0a00ff'::bytea AS bytes_verbatim
  FROM idem_claim('r-csv', scope => 'resp');
SELECT status, response_headers -> 'Location' AS location, response_raw
  FROM idem_lookup('r-csv', 'resp');

-- a JSON body with headers; an existing call (no headers, no raw bytes)
-- stores and answers as before, the new columns NULL
BEGIN;
SELECT status FROM idem_claim('r-json', scope => 'resp');
SELECT idem_complete('r-json', 200, '{"id": 1}', 'resp',
                     response_headers => '{"ETag": "\"v1\""}');
SELECT status FROM idem_claim('r-plain', scope => 'resp');
SELECT idem_complete('r-plain', 200, '{"id": 2}', 'resp');
COMMIT;
SELECT key, status, response_body, response_headers, response_raw
  FROM unnest(ARRAY['r-json', 'r-plain']) AS key, LATERAL idem_claim(key, scope => 'resp');

-- bad headers: 22023, and nothing is stored (the claim stays in progress)
BEGIN;
SELECT status FROM idem_claim('r-bad', scope => 'resp');
SELECT label, pg_temp.try(format('SELECT idem_complete(%L, 200, NULL, %L, response_headers => %L)',
                                 'r-bad', 'resp', h))
  FROM (VALUES
    ('not an object',        '["Location", "/x"]'),
    ('a scalar',             '"Location: /x"'),
    ('a number value',       '{"Retry-After": 5}'),
    ('a null value',         '{"ETag": null}'),
    ('an object value',      '{"Link": {"a": "b"}}'),
    ('a nested array',       '{"Link": [["a"]]}'),
    ('an empty array',       '{"Link": []}'),
    ('a number in an array', '{"Link": ["a", 1]}'),
    ('an empty name',        '{"": "x"}'),
    ('a name with a space',  '{"Content Type": "x"}'),
    ('a name with a colon',  '{"Location:": "x"}'),
    ('a line break',         '{"Location": "/x\r\nSet-Cookie: a=b"}'),
    ('a line feed in array', '{"Link": ["a", "b\nc"]}'),
    ('an escape character',  '{"X-Note": "a\u001bb"}'),
    ('a DEL character',      '{"X-Note": "a\u007fb"}'),
    ('same name, two cases', '{"ETag": "a", "etag": "b"}')
  ) AS t(label, h);
SELECT label, pg_temp.try(stmt) FROM (VALUES
  ('body and raw',   $$SELECT idem_complete('r-bad', 200, '{}', 'resp', response_raw => '\x00')$$),
  ('empty object',   $$SELECT idem_complete('r-bad', 200, NULL, 'resp', response_headers => '{}')$$)
) AS t(label, stmt);
SELECT status, response_headers FROM idem_lookup('r-bad', 'resp');
ROLLBACK;

-- idempotency.max_response_bytes: a superuser setting with memory units
SHOW idempotency.max_response_bytes;
SELECT setting, unit, context FROM pg_settings WHERE name = 'idempotency.max_response_bytes';
SET idempotency.max_response_bytes = '1kB';
-- the body's text form, the raw bytes and the headers' text form count
BEGIN;
SELECT status FROM idem_claim('r-size', scope => 'resp');
SELECT label, pg_temp.try(stmt) FROM (VALUES
  ('body 1025 bytes', format('SELECT idem_complete(%L, 200, to_jsonb(repeat(%L, 1023)), %L)', 'r-size', 'x', 'resp')),
  ('raw 1025 bytes',  format('SELECT idem_complete(%L, 200, NULL, %L, response_raw => convert_to(repeat(%L, 1025), %L))', 'r-size', 'resp', 'x', 'UTF8')),
  ('headers push it over', format('SELECT idem_complete(%L, 200, NULL, %L, response_headers => %L, response_raw => convert_to(repeat(%L, 1000), %L))',
                                  'r-size', 'resp', '{"Content-Type": "text/plain"}', 'x', 'UTF8'))
) AS t(label, stmt);
-- exactly at the bound: stored
SELECT idem_complete('r-size', 200, NULL, 'resp', response_raw => convert_to(repeat('x', 1024), 'UTF8'));
SELECT octet_length(response_raw) FROM idem_lookup('r-size', 'resp');
COMMIT;
-- the numbers of a jsonb body count as their text form
BEGIN;
SELECT status FROM idem_claim('r-num', scope => 'resp');
SELECT pg_temp.try($$SELECT idem_complete('r-num', 200, '[1e1100]', 'resp')$$);
ROLLBACK;
-- a kept request counts too, at the claim and at the completion
SELECT pg_temp.try($$SELECT idem_claim('r-kept-big', to_jsonb(repeat('x', 1100)), 'resp', lease => '1 hour', keep_request => true)$$);
SELECT token AS kept_token FROM idem_claim('r-kept', to_jsonb(repeat('x', 600)), 'resp',
                                           lease => '1 hour', keep_request => true) \gset
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, to_jsonb(repeat(%L, 500)), %L, %s)',
                          'r-kept', 'y', 'resp', :kept_token));
SELECT pg_temp.try(format('SELECT idem_complete(%L, 200, to_jsonb(repeat(%L, 300)), %L, %s)',
                          'r-kept', 'y', 'resp', :kept_token));
RESET idempotency.max_response_bytes;
-- ordinary roles cannot raise it
CREATE ROLE regress_idem_resp_app;
SET ROLE regress_idem_resp_app;
SELECT pg_temp.try($$SET idempotency.max_response_bytes = '1GB'$$);
RESET ROLE;
DROP ROLE regress_idem_resp_app;

DROP EXTENSION idempotency;

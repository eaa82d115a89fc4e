-- Baselines for the idempotency-key benchmark.
-- (a) raw SQL: INSERT ... ON CONFLICT DO NOTHING, then UPDATE
CREATE TABLE raw_keys (
    key           text PRIMARY KEY,
    status        text NOT NULL,
    response_code int,
    response_body jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- (b) the usual PL/pgSQL idempotency_keys design: insert-on-conflict, select,
-- compare a sha256 fingerprint of the request, update on complete
CREATE TABLE plpgsql_keys (
    key           text PRIMARY KEY,
    status        text NOT NULL,
    fingerprint   bytea,
    response_code int,
    response_body jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL DEFAULT now() + interval '1 day'
);

CREATE FUNCTION pl_claim(k text, req jsonb,
                         OUT status text, OUT response_code int, OUT response_body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
  fp bytea := sha256(convert_to(req::text, 'UTF8'));
  r  plpgsql_keys;
BEGIN
  INSERT INTO plpgsql_keys (key, status, fingerprint) VALUES (k, 'in_progress', fp)
  ON CONFLICT DO NOTHING;
  IF FOUND THEN
    status := 'claimed';
    RETURN;
  END IF;
  SELECT * INTO r FROM plpgsql_keys WHERE key = k;
  IF r.fingerprint IS DISTINCT FROM fp THEN
    status := 'mismatch';
  ELSIF r.status = 'completed' THEN
    status := 'completed';
    response_code := r.response_code;
    response_body := r.response_body;
  ELSE
    status := 'in_progress';
  END IF;
END $$;

CREATE FUNCTION pl_complete(k text, code int, body jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE plpgsql_keys SET status = 'completed', response_code = code, response_body = body
   WHERE key = k AND status = 'in_progress';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'key % is not claimed', k;
  END IF;
END $$;

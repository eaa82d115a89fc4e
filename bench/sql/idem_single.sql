-- extension, single id per transaction
SELECT idem_consume_message('bench', gen_random_uuid()::text);

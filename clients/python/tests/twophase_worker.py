"""A two-phase holder that the test kills: claims KEY with a 1 s lease and
keep_request, does the first external step, checkpoints, prints its token
and waits to be killed (it never completes)."""

import sys
import time

import psycopg

import pg_idempotency as pi

key = sys.argv[1]
with psycopg.connect("user=%s" % sys.argv[2]) as conn:
    with pi.two_phase(conn, key, {"amount": 42}, lease="1 second",
                      keep_request=True, scope="pay") as op:
        with psycopg.connect("user=%s" % sys.argv[2], autocommit=True) as ext:
            # the external system: an effect outside the claim's transaction
            ext.execute("INSERT INTO effects (key, step) VALUES (%s, 'charged')",
                        (key,))
        op.checkpoint("charged")
        print("READY %d" % op.token, flush=True)
        while True:
            time.sleep(3600)

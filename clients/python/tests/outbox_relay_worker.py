"""
A relay process for test_outbox.py's SIGKILL case: delivers the topic's
batch with WebhookSink and, after RELAY_PAUSE_AFTER events, prints
"paused" and waits (mid-batch, nothing acknowledged) to be killed.
"""

import os
import sys
import threading

import psycopg

from pg_idempotency.outbox import OutboxRelay, WebhookSink

pause_after = int(os.environ.get("RELAY_PAUSE_AFTER", "0"))
webhook = WebhookSink(os.environ["RELAY_URL"], os.environ["RELAY_SECRET"])
delivered = [0]


def sink(event, ctx=None):
    if pause_after and delivered[0] == pause_after:
        sys.stdout.write("paused\n")
        sys.stdout.flush()
        threading.Event().wait()
    webhook(event)
    delivered[0] += 1


conn = psycopg.connect("user=%s" % os.environ.get("IDEM_TEST_APP_USER", "app"),
                       options=os.environ.get("RELAY_OPTIONS", ""),
                       autocommit=True)
OutboxRelay(conn, relay="killed", topic=os.environ["RELAY_TOPIC"], sink=sink,
            max_events=int(os.environ.get("RELAY_MAX_EVENTS", "100"))).run_once()

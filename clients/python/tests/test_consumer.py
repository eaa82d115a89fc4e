"""The consumer helper: a batch in the caller's transaction."""

import psycopg
import psycopg2
import pytest

import pg_idempotency as pi
from conftest import APP_USER, new_key, scalar


@pytest.fixture(params=["psycopg", "psycopg2"])
def anyconn(request):
    c = (psycopg.connect if request.param == "psycopg" else psycopg2.connect)(
        "user=%s" % APP_USER)
    yield c
    c.close()


def handled(consumer):
    return scalar("SELECT count(*) FROM app.handled WHERE consumer = %s",
                  (consumer,))


def test_batch_exactly_once(anyconn):
    consumer = new_key("c")
    batch = [{"id": "m1"}, {"id": "m2"}, {"id": "m1"}, {"id": "m3"}]

    def handle(conn, m):
        pi.runner_for(conn).execute(
            "INSERT INTO handled VALUES (%s, %s, 1)", (consumer, m["id"]))
    done = pi.consume_batch(anyconn, consumer, batch, handle,
                            message_id=lambda m: m["id"])
    assert [m["id"] for m in done] == ["m1", "m2", "m3"]
    assert handled(consumer) == 3
    # a redelivery with one new message handles only that one
    done = pi.consume_batch(anyconn, consumer, batch + [{"id": "m4"}], handle,
                            message_id=lambda m: m["id"])
    assert [m["id"] for m in done] == ["m4"]
    assert handled(consumer) == 4


def test_failed_batch_records_nothing(anyconn):
    consumer = new_key("c")

    def handle(conn, m):
        pi.runner_for(conn).execute(
            "INSERT INTO handled VALUES (%s, %s, 1)", (consumer, m))
        if m == "bad":
            raise ValueError("poison")
    with pytest.raises(ValueError):
        pi.consume_batch(anyconn, consumer, ["a", "bad"], handle)
    assert handled(consumer) == 0
    done = pi.consume_batch(anyconn, consumer, ["a", "b"], handle)
    assert done == ["a", "b"]

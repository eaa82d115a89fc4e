"""The asyncio core on psycopg.AsyncConnection."""

import asyncio

import psycopg

import pg_idempotency.aio as aio
import pg_idempotency as pi
from conftest import APP_USER, charges_for, new_key


def test_async_claim_key_and_decorator():
    async def main():
        key = new_key()
        async with await psycopg.AsyncConnection.connect("user=%s" % APP_USER) as conn:
            async with aio.claim_key(conn, key, {"x": 1}) as c:
                await conn.execute("INSERT INTO charges (key, amount) VALUES (%s, 1)", (key,))
                await c.complete(201, {"made": True})
            async with aio.claim_key(conn, key, {"x": 1}) as c:
                assert c.replayed and c.response.body == {"made": True}
            try:
                async with aio.claim_key(conn, key, {"x": 2}):
                    raise AssertionError("ran")
            except pi.KeyMismatch:
                pass

            calls = []

            @aio.idempotent(scope="s")
            async def work(c, n):
                calls.append(n)
                return {"n": n}
            k2 = new_key()
            assert await work(conn, 3, idempotency_key=k2) == {"n": 3}
            assert await work(conn, 3, idempotency_key=k2) == {"n": 3}
            assert calls == [3]

            consumer = new_key("c")
            got = []

            async def handle(c, m):
                got.append(m)
            await aio.consume_batch(conn, consumer, ["a", "b", "a"], handle)
            await aio.consume_batch(conn, consumer, ["a", "b", "c"], handle)
            assert got == ["a", "b", "c"]
        return key
    key = asyncio.run(main())
    assert charges_for(key) == 1

"""FastAPI (IDEM_FRAMEWORK=fastapi) or Starlette (starlette) test server."""

import asyncio
import contextlib
import os

import uvicorn
from starlette.authentication import (AuthCredentials, AuthenticationBackend,
                                      SimpleUser)
from starlette.middleware.authentication import AuthenticationMiddleware
from psycopg_pool import AsyncConnectionPool

import common
from pg_idempotency.asgi import IdempotencyMiddleware, connection, context

FRAMEWORK = os.environ.get("IDEM_FRAMEWORK", "fastapi")


class LazyPool:
    """psycopg_pool's AsyncConnectionPool, opened on first use (no startup
    hook: their spelling differs between the Starlette and FastAPI
    versions of Debian 12 and later)."""

    def __init__(self):
        self.pool = AsyncConnectionPool(common.conninfo(), min_size=1,
                                        max_size=22, open=False)
        self.opened = False
        self.lock = None

    @contextlib.asynccontextmanager
    async def connection(self):
        if not self.opened:
            if self.lock is None:
                self.lock = asyncio.Lock()
            async with self.lock:
                if not self.opened:
                    await self.pool.open()
                    self.opened = True
        async with self.pool.connection() as conn:
            yield conn


pool = LazyPool()


async def charge_logic(headers, body):
    conn = connection(headers["__request"])
    key = context(headers["__request"]).key
    sql, params = common.before(headers, key, body, FRAMEWORK)
    cur = await conn.execute(sql, params)
    charge_id = (await cur.fetchone())[0]
    # the hooks may sleep in the transaction: run them in a thread
    # against a loop-safe executor
    delay = int(headers.get("test-delay-ms", "0") or 0)
    if delay:
        await conn.execute("SELECT pg_sleep(%s)", (delay / 1000.0,))
    hooks = {k: v for k, v in headers.items() if k != "test-delay-ms"}
    return common.after(hooks, charge_id, None)


if FRAMEWORK == "fastapi":
    from fastapi import FastAPI, Request
    from fastapi.responses import Response as FResponse

    app = FastAPI()

    @app.post("/charges")
    async def charges(request: Request):
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers["__request"] = request
        status, hdrs, out = await charge_logic(headers, body)
        resp = FResponse(out, status_code=status)
        for k, v in hdrs:
            if k.lower() == "content-type":
                resp.headers["content-type"] = v
            else:
                resp.headers.append(k, v)
        return resp

    @app.post("/blobs")
    async def blobs(request: Request):
        status, hdrs, out = common.blob(await request.body())
        return FResponse(out, status_code=status, media_type=hdrs[0][1])
else:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response as SResponse
    from starlette.routing import Route

    async def charges(request: Request):
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers["__request"] = request
        status, hdrs, out = await charge_logic(headers, body)
        resp = SResponse(out, status_code=status)
        for k, v in hdrs:
            if k.lower() == "content-type":
                resp.headers["content-type"] = v
            else:
                resp.headers.append(k, v)
        return resp

    async def blobs(request: Request):
        status, hdrs, out = common.blob(await request.body())
        return SResponse(out, status_code=status, media_type=hdrs[0][1])

    app = Starlette(routes=[Route("/charges", charges, methods=["POST"]),
                            Route("/blobs", blobs, methods=["POST"])])

app.add_middleware(IdempotencyMiddleware, pool=pool, **common.options())


class BasicAuth(AuthenticationBackend):
    """The test's authentication: the user name of HTTP Basic."""

    async def authenticate(self, conn):
        user = common.basic_user(conn.headers.get("authorization"))
        if user:
            return AuthCredentials(["authenticated"]), SimpleUser(user)
        return None


# added last: runs first, so scope["user"] is set for the idempotency one
app.add_middleware(AuthenticationMiddleware, backend=BasicAuth())


def main():
    sock = common.listen()
    common.announce(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()

"""The conformance app on FastAPI (IDEM_FRAMEWORK=fastapi) or Starlette
(starlette): IdempotencyMiddleware with its defaults, and Starlette's
AuthenticationMiddleware added after it (so it runs first)."""

import asyncio
import contextlib
import os

import uvicorn
from psycopg_pool import AsyncConnectionPool
from starlette.authentication import (AuthCredentials, AuthenticationBackend,
                                      SimpleUser)
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.responses import Response

import common
import conformance_common as cc
from pg_idempotency.asgi import IdempotencyMiddleware, connection

FRAMEWORK = os.environ.get("IDEM_FRAMEWORK", "fastapi")


class LazyPool:
    """An AsyncConnectionPool opened on first use (no startup hook: their
    spelling differs between Starlette versions)."""

    def __init__(self):
        self.pool = AsyncConnectionPool(cc.conninfo(), min_size=1,
                                        max_size=24, open=False)
        self.lock = None
        self.opened = False

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


async def handle(request, route, params):
    body = await request.body()
    caller = request.user.display_name if request.user.is_authenticated \
        else None
    what, arg = cc.plan(route, body)
    if what == "answer":
        status, headers, out = arg
    else:
        cur = await connection(request).execute(
            cc.INSERT, (caller, route, arg[0], arg[1]))
        charge_id = (await cur.fetchone())[0]
        headers_in = {k.lower(): v for k, v in request.headers.items()}
        status, headers, out = cc.answer(route, charge_id, caller, body,
                                         params, headers_in)
    resp = Response(out, status_code=status)
    for k, v in headers:
        if k.lower() == "content-type":
            resp.headers["content-type"] = v
        else:
            resp.headers.append(k, v)
    return resp


if FRAMEWORK == "fastapi":
    from fastapi import FastAPI, Request

    app = FastAPI()

    @app.post("/charges")
    async def charges(request: Request):
        return await handle(request, "/charges", {})

    @app.post("/orders/{id}/refund")
    async def refund(request: Request, id: str):
        return await handle(request, "refund", {"id": id})

    @app.post("/text")
    async def text(request: Request):
        return await handle(request, "/text", {})

    @app.post("/big")
    async def big(request: Request):
        return await handle(request, "/big", {})
else:
    from starlette.applications import Starlette
    from starlette.routing import Route

    def route(name):
        async def endpoint(request):
            return await handle(request, name, dict(request.path_params))
        return endpoint

    app = Starlette(routes=[
        Route("/charges", route("/charges"), methods=["POST"]),
        Route("/orders/{id}/refund", route("refund"), methods=["POST"]),
        Route("/text", route("/text"), methods=["POST"]),
        Route("/big", route("/big"), methods=["POST"])])


class Bearer(AuthenticationBackend):
    async def authenticate(self, conn):
        name = cc.bearer(conn.headers.get("authorization"))
        if name:
            return AuthCredentials(["authenticated"]), SimpleUser(name)
        return None


app.add_middleware(IdempotencyMiddleware, pool=LazyPool(),
                   policy_path="/idempotency")
# added last: runs first, so the caller is known when the key is claimed
app.add_middleware(AuthenticationMiddleware, backend=Bearer())


def main():
    sock = common.listen()
    common.announce(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="critical", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()

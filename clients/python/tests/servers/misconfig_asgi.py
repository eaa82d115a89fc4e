"""FastAPI apps set up as apps write them by mistake (IDEM_MISCONFIG):

  auth-order   AuthenticationMiddleware added before IdempotencyMiddleware
               (Starlette runs the last added first: it runs after it)
  sync-handler a `def` handler (run in a thread) using connection(request)
  no-await     an `async def` handler that does not await its INSERT

Each POST /charges inserts a charge for the caller (HTTP Basic user) and
answers 201 {"caller": ...}."""

import os

import uvicorn
from fastapi import FastAPI, Request
from starlette.authentication import (AuthCredentials, AuthenticationBackend,
                                      SimpleUser)
from starlette.middleware.authentication import AuthenticationMiddleware

import common
from pg_idempotency.asgi import IdempotencyMiddleware, connection

MODE = os.environ["IDEM_MISCONFIG"]
SQL = "INSERT INTO charges (key, amount, framework) VALUES (%s, 1, %s)"

app = FastAPI()


class BasicAuth(AuthenticationBackend):
    async def authenticate(self, conn):
        user = common.basic_user(conn.headers.get("authorization"))
        if user:
            return AuthCredentials(["authenticated"]), SimpleUser(user)
        return None


def caller(request):
    return request.user.display_name if request.user.is_authenticated else None


if MODE == "sync-handler":
    @app.post("/charges", status_code=201)
    def charges(request: Request):
        key = request.headers["idempotency-key"].strip('"')
        connection(request).execute(SQL, (key, MODE))
        return {"caller": caller(request)}
elif MODE == "no-await":
    @app.post("/charges", status_code=201)
    async def charges(request: Request):
        key = request.headers["idempotency-key"].strip('"')
        connection(request).execute(SQL, (key, MODE))     # no await
        return {"caller": caller(request)}
else:
    @app.post("/charges", status_code=201)
    async def charges(request: Request):
        key = request.headers["idempotency-key"].strip('"')
        await connection(request).execute(SQL, (key, MODE))
        return {"caller": caller(request)}

if MODE == "auth-order":
    # the natural order, and the wrong one: this runs after the next
    app.add_middleware(AuthenticationMiddleware, backend=BasicAuth())
    app.add_middleware(IdempotencyMiddleware, conninfo=common.conninfo())
else:
    app.add_middleware(IdempotencyMiddleware, conninfo=common.conninfo())
    app.add_middleware(AuthenticationMiddleware, backend=BasicAuth())


def main():
    sock = common.listen()
    common.announce(sock.getsockname()[1])
    config = uvicorn.Config(app, log_level="critical", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()

"""
The package as users get it: the wheel built offline with Debian's tools,
installed into a "python3 -m venv --system-site-packages", and the
README's quickstarts run as written from it, against the extension.
"""

import json
import os
import re
import shutil
import subprocess
import uuid

import pytest

from conftest import (CLIENT_DIR, DEADLINE, PYTHON, request, scalar,
                      su_connect, wait_until)

SERVE = r'''
import importlib, os, socket, sys
kind, module = sys.argv[1], sys.argv[2]
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(64)
port = sock.getsockname()[1]
if kind == "django":
    import django
    from django.conf import settings
    from django.urls import path
    settings.configure(
        SECRET_KEY="quickstart", ALLOWED_HOSTS=["*"], ROOT_URLCONF="__main__",
        # as a new project has it: a POST view without @csrf_exempt is 403
        MIDDLEWARE=["django.middleware.csrf.CsrfViewMiddleware"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql",
                               "NAME": os.environ["PGDATABASE"],
                               "USER": os.environ["PGUSER"],
                               "HOST": os.environ["PGHOST"],
                               "PORT": os.environ["PGPORT"]}})
    django.setup()
    view = importlib.import_module(module).create_order
    sys.modules["__main__"].urlpatterns = [path("orders", view)]
    from django.core.wsgi import get_wsgi_application
    from wsgiref.simple_server import make_server, WSGIServer, WSGIRequestHandler
    import socketserver
    class S(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
    server = S(("127.0.0.1", port), WSGIRequestHandler, bind_and_activate=False)
    server.socket.close(); server.socket = sock
    server.server_name, server.server_port = "127.0.0.1", port
    server.setup_environ(); server.set_app(get_wsgi_application())
    print("PORT %d" % port, flush=True)
    server.serve_forever()
elif kind == "flask":
    from werkzeug.serving import make_server
    app = importlib.import_module(module).app
    server = make_server("127.0.0.1", port, app, threaded=True, fd=sock.fileno())
    print("PORT %d" % port, flush=True)
    server.serve_forever()
else:
    import uvicorn
    app = importlib.import_module(module).app
    print("PORT %d" % port, flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
'''


def quickstarts():
    text = open(os.path.join(CLIENT_DIR, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"<!-- quickstart: ([a-z-]+) -->\s*```python\n(.*?)```",
                        text, re.S)
    return dict(blocks)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """Build the wheel, install it into a venv; yield (python, env, dir)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(CLIENT_DIR, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "dist", "*.egg-info", ".pytest_cache"))
    dist = tmp / "dist"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INDEX"] = "1"
    has_build = subprocess.run([PYTHON, "-m", "build", "--version"],
                               capture_output=True).returncode == 0
    if has_build:
        cmd = [PYTHON, "-m", "build", "--no-isolation", "--wheel",
               "--outdir", str(dist), str(src)]
    else:
        cmd = [PYTHON, "-m", "pip", "wheel", "--no-build-isolation",
               "--no-deps", "-w", str(dist), str(src)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list(dist.glob("pg_idempotency-*-py3-none-any.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    r = subprocess.run([PYTHON, "-m", "venv", "--system-site-packages",
                        str(tmp / "venv")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    py = str(tmp / "venv" / "bin" / "python")
    # the dependency (psycopg) must be found among Debian's packages
    r = subprocess.run([py, "-m", "pip", "install", "--no-index",
                        str(wheels[0])], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # a role of its own: its keys and message ids are new on every run
    role = "qs_" + uuid.uuid4().hex[:12]
    with su_connect() as c:
        c.execute("CREATE ROLE %s LOGIN" % role)
        c.execute("CREATE SCHEMA AUTHORIZATION %s" % role)
        c.execute("CREATE TABLE %s.orders (id serial PRIMARY KEY, item text)" % role)
        c.execute("ALTER TABLE %s.orders OWNER TO %s" % (role, role))
    env["PGUSER"] = role
    qs = tmp / "app"
    qs.mkdir()
    (qs / "serve.py").write_text(SERVE)
    yield py, env, qs, wheels[0], role


def orders(role, item=None):
    if item is None:
        return scalar("SELECT count(*) FROM %s.orders" % role)
    return scalar("SELECT count(*) FROM %s.orders WHERE item = %%s" % role,
                  (item,))


def test_readme_installs_the_wheel_it_builds(venv):
    """The README's commands are the ones this module runs (build, venv,
    pip install of the wheel by its file name), and it never sends readers
    to PyPI, where the name is not the project's."""
    py, env, qs, wheel, role = venv
    text = open(os.path.join(CLIENT_DIR, "README.md"), encoding="utf-8").read()
    assert "python3 -m build --no-isolation --wheel" in text
    assert "python3 -m venv --system-site-packages venv" in text
    assert ("venv/bin/pip install --no-index /path/to/%s" % wheel.name) in text
    assert not re.search(r"^pip install pg-idempotency", text, re.M)


def test_installed_from_the_wheel(venv):
    py, env, qs, wheel, role = venv
    r = subprocess.run([py, "-c", "import pg_idempotency, os; "
                        "print(pg_idempotency.__file__); "
                        "print(pg_idempotency.__version__); "
                        "print(os.path.exists(os.path.join(os.path.dirname("
                        "pg_idempotency.__file__), 'py.typed')))"],
                       env=env, cwd=qs, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    path, version, typed = r.stdout.split()
    assert path.startswith(str(qs.parent / "venv")), path
    control = open(os.path.join(CLIENT_DIR, "..", "..", "idempotency.control")).read()
    assert "default_version = '%s'" % version in control
    assert typed == "True"
    # the outbox's modules are in the wheel, and sign as the vector says
    r = subprocess.run([py, "-c", "import pg_idempotency.outbox, "
                        "pg_idempotency.webhooks as w; print(w.sign("
                        "'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', "
                        "'msg_p5jXN8AQM9LWM0D4loKWxJek', 1614265330, "
                        "'{\"test\": 2432232314}'))"],
                       env=env, cwd=qs, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize("name,check", [
    ("core", lambda role: orders(role, "book")),
    ("consumer", lambda role: (orders(role, "pen"), orders(role, "ink"))),
    ("two-phase", None),
    ("stream", lambda role: (orders(role, "nib"), orders(role, "cap"))),
])
def test_script_quickstart(venv, name, check):
    py, env, qs, wheel, role = venv
    code = quickstarts()[name]
    path = qs / ("%s.py" % name.replace("-", "_"))
    path.write_text(code)
    results = []
    for _ in range(2):              # the second run is a redelivery/replay
        r = subprocess.run([py, str(path)], env=env, cwd=qs,
                           capture_output=True, text=True, timeout=DEADLINE)
        assert r.returncode == 0, r.stderr
        results.append(check(role) if check else None)
    if name == "core":
        assert results == [1, 1]
    elif name in ("consumer", "stream"):
        assert results == [(1, 1), (1, 1)]
    else:
        with su_connect() as c:
            c.execute("SET ROLE %s" % role)
            row = c.execute("SELECT status, response_code FROM idem_lookup('pay-7')").fetchone()
        assert row == ("completed", 201)


@pytest.mark.parametrize("name,kind", [("fastapi", "asgi"),
                                       ("starlette", "asgi"),
                                       ("django", "django"),
                                       ("flask", "flask")])
def test_app_quickstart(venv, name, kind):
    py, env, qs, wheel, role = venv
    module = "qs_" + name
    (qs / (module + ".py")).write_text(quickstarts()[name])
    proc = subprocess.Popen([py, "serve.py", kind, module], env=env, cwd=qs,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split()[1])

        def up():
            try:
                request(port, "/", method="GET", timeout=5)
                return True
            except OSError:
                return False
        wait_until(up, "the %s quickstart answers" % name)
        item = "item-" + uuid.uuid4().hex
        body = json.dumps({"item": item}).encode()
        # the FastAPI quickstart authenticates (its token); the others are
        # anonymous
        auth = [("Authorization", "Bearer alice-token")]
        key = [("Idempotency-Key", '"%s"' % uuid.uuid4())]
        first = request(port, "/orders", body, key + auth)
        assert first.status == 201 and not first.replayed, first
        again = request(port, "/orders", body, key + auth)
        assert again.status == 201 and again.replayed and again.body == first.body
        nokey = request(port, "/orders", body, auth)
        assert nokey.status == 400
        assert nokey.json()["type"] == "tag:pg-idempotency,2026:missing-key"
        if name == "fastapi":
            stranger = request(port, "/orders", body, key)
            assert stranger.status == 500 and not stranger.replayed
            assert stranger.json()["type"] == "tag:pg-idempotency,2026:no-caller"
        assert orders(role, item) == 1
    finally:
        proc.terminate()
        proc.wait(30)

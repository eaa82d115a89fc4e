"""
Fixtures: connections to the throwaway cluster that test.sh started (PG*
environment), the charges table, test servers in subprocesses, and an
HTTP client that can send any header lines.
"""

import http.client
import os
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_DIR = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"
#: a bound for a hung test, not a time the machine must meet
DEADLINE = float(os.environ.get("IDEM_TEST_DEADLINE", "120"))
APP_USER = os.environ.get("IDEM_TEST_APP_USER", "app")
SUPERUSER = os.environ.get("IDEM_TEST_SUPERUSER", "postgres")


def su_connect():
    return psycopg.connect("user=%s" % SUPERUSER, autocommit=True)


def app_connect(**kw):
    return psycopg.connect("user=%s" % APP_USER, **kw)


@pytest.fixture(scope="session")
def su():
    with su_connect() as conn:
        yield conn


@pytest.fixture
def conn():
    """A connection as the application role (not autocommit)."""
    with app_connect() as c:
        yield c


@pytest.fixture(scope="session", autouse=True)
def schema():
    with app_connect(autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS charges ("
                  " id bigserial PRIMARY KEY, key text, amount int,"
                  " framework text, created_at timestamptz DEFAULT now())")
        c.execute("CREATE TABLE IF NOT EXISTS effects ("
                  " id bigserial PRIMARY KEY, key text, step text)")
        c.execute("CREATE TABLE IF NOT EXISTS handled ("
                  " consumer text, message_id text, batch int)")


def new_key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4())


def wait_until(cond, what, deadline=DEADLINE, step=0.02):
    """Poll COND until it is true; fail after DEADLINE seconds."""
    end = time.monotonic() + deadline
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            pytest.fail("timed out waiting for: %s" % what)
        time.sleep(step)


def scalar(sql, params=()):
    with su_connect() as c:
        return c.execute(sql, params).fetchone()[0]


def charges_for(key):
    return scalar("SELECT count(*) FROM app.charges WHERE key = %s", (key,))


class Server:
    """A test server (tests/servers/NAME.py) in a subprocess."""

    def __init__(self, name, env=None):
        self.name = name
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(HERE, "servers"), os.path.join(CLIENT_DIR, "src")])
        e.update(env or {})
        self.env = e
        self.proc = None
        self.port = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [PYTHON, os.path.join(HERE, "servers", self.name + ".py")],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            err = self.proc.stderr.read()
            pytest.fail("server %s did not start: %r %s" % (self.name, line, err))
        self.port = int(line.split()[1])
        # drain stderr so that a chatty server never blocks
        threading.Thread(target=self._drain, daemon=True).start()
        wait_until(self._answers, "server %s answers" % self.name)

    def _drain(self):
        for _ in self.proc.stderr:
            pass

    def _answers(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("GET", "/idempotency")
            c.getresponse().read()
            c.close()
            return True
        except OSError:
            return False

    def alive(self):
        return self.proc.poll() is None

    def restart_if_dead(self):
        if not self.alive():
            self.start()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers          # list of (name, value)
        self.body = body

    def header(self, name):
        vals = self.all(name)
        return vals[-1] if vals else None

    def all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    @property
    def replayed(self):
        return self.header("Idempotent-Replayed") == "true"

    def json(self):
        import json
        return json.loads(self.body)

    def __repr__(self):
        return "<%d %r %r>" % (self.status, self.headers, self.body[:200])


def request(port, path, body=b"", headers=(), method="POST", timeout=None):
    """Send one request with exactly HEADERS (a list of pairs: a name may
    repeat); returns an Answer."""
    c = http.client.HTTPConnection("127.0.0.1", port,
                                   timeout=timeout or DEADLINE)
    try:
        c.putrequest(method, path, skip_accept_encoding=True)
        names = {k.lower() for k, _ in headers}
        for k, v in headers:
            c.putheader(k, v)
        if "content-type" not in names and body:
            c.putheader("Content-Type", "application/json")
        c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        return Answer(r.status, r.getheaders(), r.read())
    finally:
        c.close()


@pytest.fixture
def servers():
    """Start servers on demand; stop them all after the test."""
    started = []

    def start(name, **env):
        s = Server(name, {k: str(v) for k, v in env.items()})
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


sys.path.insert(0, HERE)

#!/usr/bin/python3
"""
test/model/idem_model.py -- a seeded, model-based random test of the
idempotency extension's SQL API (issue 21, section 2).

Several sessions (3 by default) drive the API with random sequences of
statements: idem_claim (same-transaction and two-phase, with and without
request fingerprints, wait true and false), idem_complete, idem_checkpoint,
idem_release, idem_lookup, idem_consume_message, idem_consume_messages
(batches with duplicates), idempotency.export_keys / import_key /
export_messages / import_message (as superuser, with bad records, and as an
ordinary role), in READ COMMITTED, REPEATABLE READ, SERIALIZABLE and
read-only transactions, with savepoints, ROLLBACK TO SAVEPOINT, RELEASE
SAVEPOINT, rollbacks, every documented bad argument, statement_timeout,
lock_timeout and pg_cancel_backend(), and ttls of 1 to 3 seconds (with a
1 s partition_interval the keys and ids really expire, and their partitions
are dropped, during the run).  About one round in eight sends a statement
to 2 or 3 sessions at once; sessions take turns being slow, so that some
transactions stay open for seconds.

After every round the answers of the server are checked against a reference
model of the contract of doc/reference.md, written here:

  - the model holds the committed state of every key and message id of the
    run, and for every session its open transaction: one level per
    savepoint, each with the row versions the level wrote;
  - a round sends one statement to one session, or one statement to each of
    2 or 3 sessions at once (a race); the test then waits, without the
    model, until the server is quiescent: every statement has answered, or
    waits for a transaction lock held by another session (pg_locks), with
    no cycle among those waits;
  - then the model explains what it sees: it tries every order in which the
    running statements may have taken effect (and the statements they woke
    up, by ending, rolling back or failing; a failing statement aborts its
    subtransaction as it ends, after what it read, so a statement racing it
    may read before that), every way the clock may have
    fallen near an expiry or a lease's end (a statement's clock is
    somewhere between just before it was sent and just after its answer
    arrived, give or take MODEL_CLOCK_TOL_MS), every victim of a deadlock,
    every effect of a cancel or timeout that raced the statement; one
    explanation must give exactly the answers and the waits seen.  If none
    does, that is a difference: the seed, the round, every explanation
    tried and where it fails, and the earlier steps on the same keys or
    message ids are printed.

What the model allows is what the contract allows, and nothing else:
  - an expiry or a lease's end within a statement's clock window may go
    either way; a new claim's token and expires_at come from one instant of
    the window (expires_at - ttl), and the token is that instant or the
    previous token + 1;
  - a claim with wait => false racing another statement on the same key
    may answer in_progress (the key lock was busy);
  - a statement waiting for a transaction whose row was rolled back to a
    savepoint may go on, or wait until that transaction ends (the contract:
    "waits for it to end"; PostgreSQL waits for the topmost transaction
    once the subtransaction it waited for has been released);
  - any member of a cycle of waits may be the deadlock victim (40P01); a
    statement that a cancel or timeout raced may end with 57014 or 55P03,
    one that waits under a timeout must; any statement of a SERIALIZABLE
    transaction may fail with 40001; the contract does not say which of
    several errors of one bad import record is reported, so any of them;
  - pg_cancel_backend() sends a signal, which the backend acts on when it
    next runs: on a busy machine that can be after the test has seen the
    statement wait in pg_locks, so a statement a cancel raced may still
    end with 57014 in a later round, where it waits or once woken, until
    it answers (unless the cancel came before the statement was read,
    which ignores it).  MODEL_LATE_CANCELS (a share, 0 to 1; 0 by default)
    makes that happen: once a statement that such a round sends waits, its
    backend is stopped (SIGSTOP) until the round has been observed, so the
    script must run on the server's machine as the server's user;
    --scenario late-cancel runs that interleaving alone (see late_cancel),
    --scenario concurrent-errors the race of two errors that each read the
    other's row (see concurrent_errors), --scenario batch-expiry-wait a
    batch that finds an id expired and then waits (see batch_expiry_wait),
    --scenario import-over-memory (with idempotency.key_memory) a key that
    ran and expired, imported and released, remembered all the same (see
    import_over_memory).
Never two holders of one key, a completed key answering claimed, a consumed
id answering true twice within its ttl, a stale token accepted, a wrong
response replayed, a token that does not increase, a wrong SQLSTATE.

Where the contract (reference.md) and the code knowingly part, the model
follows the later word: a completed key is replaced by an import only if
the import is completed too (CHANGELOG 0.3.1; reference.md's table of
import outcomes says a larger token replaces it).  What is known to differ
from the contract is, unless MODEL_STRICT=1, not generated, or, where it
cannot be avoided, accepted and counted in the statistics:
  1. export_keys() in a REPEATABLE READ or SERIALIZABLE transaction that has
     written keys: a key another transaction changed since the snapshot and
     this one changed again is exported as of the snapshot, or twice (not
     generated);
  2. import_message() answers "kept" when its record expired during the
     call (while it waited for another transaction writing the id, which
     then rolled back), though nothing was kept: the contract says
     "expired" (accepted);
  3. a call waits for the maintenance worker (a drop queued for, or
     holding, an ended partition the call's lane probes, while it waits
     for a partition the call's own transaction wrote into): the contract
     says calls neither wait for a run nor block it (counted as "waited
     for idempotency worker"; with deadlock_timeout under the drop's
     100 ms lock timeout, the call can even be the victim of a deadlock
     with the run, which the model does not allow: run with the default
     deadlock_timeout).

Usage:
  idem_model.py --dsn DSN [--seed N | --seeds 1,2,3] [--steps N]
                [--sessions N] [--trace FILE] [--verbose]
                [--scenario late-cancel|late-cancel-cycle|concurrent-errors|
                             batch-expiry-wait|import-over-memory]
Environment: SEED, MODEL_SEEDS, MODEL_STEPS, MODEL_SESSIONS, MODEL_STRICT,
  MODEL_CLOCK_TOL_MS (default 2), MODEL_SETTLE_SECONDS (default 60),
  MODEL_LATE_CANCELS (default 0).
Exit status: 0 no difference, 1 a difference (or the server got stuck),
  2 bad usage or setup, 77 psycopg is not importable.

The database must have the extension installed and be served with
idempotency.partition_interval = 1s, key_ttl and message_ttl of a few
seconds (the script reads the settings) and the default deadlock_timeout
(1 s); the script connects as a superuser and creates the role
idem_model_alt if needed.  See test/t/060_model.pl and doc/testing.md.
"""

import argparse
import re
import hashlib
import json
import os
import random
import select
import signal
import struct
import sys
import time
import uuid

try:
    import psycopg
    from psycopg import pq
except ImportError as e:        # pragma: no cover
    print(f"SKIP: psycopg is not importable: {e}")
    sys.exit(77)

PG_EPOCH_US = 946684800 * 1000000      # 2000-01-01 in Unix microseconds
ALT_ROLE = 'idem_model_alt'


# ------------------------------------------------------------------ helpers

def now_us():
    return time.time_ns() // 1000


def us_to_ts(us):
    """Unix microseconds -> timestamptz literal in UTC, exact."""
    secs, micro = divmod(us, 1000000)
    t = time.gmtime(secs)
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d+00" % (
        t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, micro)


def digest(ns, key):
    """The ledger's digest of (scope or consumer, key or id), as text."""
    ns = ns.encode()
    key = key.encode()
    p = struct.pack('>I', len(ns))
    a = hashlib.sha256(p + ns).digest()
    b = hashlib.sha256(p + ns + key).digest()
    return str(uuid.UUID(bytes=a[:4] + b[4:16]))


def jsonb_text(v):
    """jsonb's canonical text of a JSON value made of dicts, lists, ASCII
    strings, ints, booleans and None: object keys by length, then bytes."""
    if v is None:
        return 'null'
    if v is True:
        return 'true'
    if v is False:
        return 'false'
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return '[' + ', '.join(jsonb_text(x) for x in v) + ']'
    if isinstance(v, dict):
        ks = sorted(v, key=lambda k: (len(k.encode()), k.encode()))
        return '{' + ', '.join(json.dumps(k) + ': ' + jsonb_text(v[k]) for k in ks) + '}'
    raise TypeError(v)


def fingerprint(req):
    return hashlib.sha256(jsonb_text(req).encode()).hexdigest()


def json_variant(rng, v, decoy=False, scale=False):
    """Some JSON text of value v: any key order, any whitespace, (decoy) an
    earlier duplicate key that jsonb drops, and (scale) numbers written with
    trailing zeros (the same jsonb value, so the same fingerprint)."""
    ws = lambda: rng.choice(['', ' ', '  ', '\n', '\t '])
    if isinstance(v, dict):
        ks = list(v)
        rng.shuffle(ks)
        parts = []
        if decoy and ks:
            parts.append(json.dumps(ks[0]) + ws() + ':' + ws() + '"decoy"')
        for k in ks:
            parts.append(json.dumps(k) + ws() + ':' + ws() + json_variant(rng, v[k], scale=scale))
        return '{' + ws() + (',' + ws()).join(parts) + ws() + '}'
    if isinstance(v, list):
        return '[' + ws() + (',' + ws()).join(json_variant(rng, x, scale=scale) for x in v) + ws() + ']'
    if scale and isinstance(v, int) and not isinstance(v, bool) and rng.random() < 0.3:
        return str(v) + rng.choice(['.0', '.00', '.000'])
    return jsonb_text(v)


def short(x, n=70):
    s = repr(x) if not isinstance(x, str) else x
    return s if len(s) <= n else s[:n - 3] + '...'


class Difference(Exception):
    pass


class Prune(Exception):
    """An explanation (a path of the model's choices) that does not fit."""
    pass


# ------------------------------------------------------------------ model state

class KV:
    """One version of a key's row."""
    __slots__ = ('st', 'tok', 'cat', 'exp', 'lease', 'fp', 'rp', 'code', 'body', 'mr', 'iss', 'rem')

    def __init__(self, st, tok, cat, exp, lease, fp, rp, code, body, mr, iss=False, rem=False):
        self.st = st          # 'p' in progress, 'c' completed, 'r' released
        self.tok = tok        # fencing token (us since 2000)
        self.cat = cat        # claimed_at (Unix us)
        self.exp = exp        # expires_at (Unix us)
        self.lease = lease    # lease end (Unix us) or None
        self.fp = fp          # fingerprint (hex) or None
        self.rp = rp          # recovery point or None
        self.code = code      # response code or None
        self.body = body      # response body (jsonb text) or None
        self.mr = mr          # a same-transaction claim not yet resolved
        self.iss = iss        # the token is the claim's clock (not imported, not bumped)
        self.rem = rem        # written over an expired version that was not released
                              # (key_memory): the key stays remembered (World.rem)

    def but(self, **kw):
        n = KV(self.st, self.tok, self.cat, self.exp, self.lease, self.fp,
               self.rp, self.code, self.body, self.mr, self.iss, self.rem)
        for k, v in kw.items():
            setattr(n, k, v)
        return n

    def __repr__(self):
        st = {'p': 'in_progress', 'c': 'completed', 'r': 'released'}[self.st]
        s = f"{st} tok={self.tok} exp={self.exp}"
        if self.lease is not None:
            s += f" lease={self.lease}"
        if self.fp:
            s += f" fp={self.fp[:8]}"
        if self.rp is not None:
            s += f" rp={self.rp!r}"
        if self.code is not None:
            s += f" resp={self.code} {self.body}"
        if self.mr:
            s += " unresolved"
        return s


class Level:
    __slots__ = ('name', 'keys', 'msgs')

    def __init__(self, name):
        self.name = name
        self.keys = {}        # kid -> tuple of versions written at this level
        self.msgs = {}        # mid -> (lo, hi) expiry interval

    def clone(self):
        n = Level(self.name)
        n.keys = dict(self.keys)
        n.msgs = dict(self.msgs)
        return n


class Txn:
    __slots__ = ('role', 'iso', 'ro', 'levels', 'snap', 'state', 'sp')

    def __init__(self, role, iso, ro):
        self.role = role
        self.iso = iso
        self.ro = ro
        self.levels = [Level(None)]
        self.snap = None      # (keys, msgs) committed when an RR snapshot was taken
        self.state = 'ok'     # 'ok', 'sub' (innermost level aborted), 'abort'
        self.sp = 0           # savepoints made (for names)

    def clone(self):
        n = Txn(self.role, self.iso, self.ro)
        n.levels = [lv.clone() for lv in self.levels]
        n.snap = self.snap
        n.state = self.state
        n.sp = self.sp
        return n


class World:
    __slots__ = ('keys', 'msgs', 'txns', 'blocked', 'conts', 'maxtok', 'rem')

    def __init__(self, sessions):
        self.keys = {}        # kid -> committed KV
        self.msgs = {}        # mid -> committed (lo, hi)
        self.txns = {s: None for s in sessions}
        self.blocked = {}     # sess -> (call, blocker sess, what)
        self.conts = {}       # sess -> continuation of a blocked batch
        self.maxtok = {}      # kid -> largest token the key ever had
        # keys with key_memory on whose committed version expired unreleased
        # and was then written over (an import): every version that ran is
        # remembered, so the key stays remembered whatever its newer versions
        # become (a later version released does not make it forgotten)
        self.rem = set()

    def clone(self):
        n = World.__new__(World)
        n.keys = dict(self.keys)
        n.msgs = dict(self.msgs)
        n.txns = {s: (t.clone() if t is not None else None) for s, t in self.txns.items()}
        n.blocked = dict(self.blocked)
        n.conts = dict(self.conts)
        n.maxtok = dict(self.maxtok)
        n.rem = set(self.rem)
        return n

    # --- overlays
    def own_key(self, s, kid):
        t = self.txns.get(s)
        if t is None:
            return None
        for lv in reversed(t.levels):
            vs = lv.keys.get(kid)
            if vs:
                return vs[-1]
        return None

    def own_msg(self, s, mid):
        t = self.txns.get(s)
        if t is None:
            return None
        for lv in reversed(t.levels):
            if mid in lv.msgs:
                return lv.msgs[mid]
        return None

    def busy_key(self, s, kid):
        for u, t in self.txns.items():
            if u != s and t is not None:
                for lv in t.levels:
                    if lv.keys.get(kid):
                        return u
        return None

    def busy_msg(self, s, mid):
        for u, t in self.txns.items():
            if u != s and t is not None:
                for lv in t.levels:
                    if mid in lv.msgs:
                        return u
        return None

    def busy_versions(self, u, kid):
        out = []
        for lv in self.txns[u].levels:
            out.extend(lv.keys.get(kid, ()))
        return out

    def holds(self, u, what):
        """Does session u's open transaction have a row of key/msg 'what'?"""
        kind, ident = what
        t = self.txns.get(u)
        if t is None:
            return False
        for lv in t.levels:
            if kind == 'k' and lv.keys.get(ident):
                return True
            if kind == 'm' and ident in lv.msgs:
                return True
        return False

    def write_key(self, s, kid, v):
        lv = self.txns[s].levels[-1]
        lv.keys[kid] = lv.keys.get(kid, ()) + (v,)

    def max_token(self, s, kid):
        """The largest token taken from the clock by a claim of kid that
        session s sees (committed ones, and its own transaction's).  A token
        imported from a node whose clock is ahead, or one more than such a
        token, may be larger than the clock: after its key expires, a new
        claim's token is the clock again (fencing still holds: a stale token
        is any other than the current one)."""
        m = self.maxtok.get(kid, 0)
        t = self.txns.get(s)
        if t is not None:
            for lv in t.levels:
                for v in lv.keys.get(kid, ()):
                    if v.iss and v.tok > m:
                        m = v.tok
        return m

    def write_msg(self, s, mid, iv):
        self.txns[s].levels[-1].msgs[mid] = iv

    # --- transaction ends
    def abort(self, s):
        """An error in session s: its innermost subtransaction (or, without
        savepoints, the whole transaction) is aborted at once."""
        t = self.txns[s]
        if len(t.levels) > 1:
            t.levels[-1] = Level(t.levels[-1].name)
            t.state = 'sub'
        else:
            t.levels = [Level(None)]
            t.state = 'abort'

    def commit(self, s):
        t = self.txns[s]
        for lv in t.levels:
            for kid, vs in lv.keys.items():
                if vs:
                    self.keys[kid] = vs[-1]
                for v in vs:
                    if v.iss and v.tok > self.maxtok.get(kid, 0):
                        self.maxtok[kid] = v.tok
                    if v.rem:
                        self.rem.add(kid)
            for mid, iv in lv.msgs.items():
                self.msgs[mid] = iv
        self.txns[s] = None

    def unresolved(self, s):
        t = self.txns[s]
        seen = set()
        for lv in reversed(t.levels):
            for kid, vs in lv.keys.items():
                if vs and kid not in seen:
                    seen.add(kid)
                    if vs[-1].st == 'p' and vs[-1].mr:
                        return kid
        return None

    def rollback_to(self, s, name):
        t = self.txns[s]
        j = [lv.name for lv in t.levels].index(name)
        t.levels = t.levels[:j] + [Level(name)]
        t.state = 'ok'

    def release_sp(self, s, name):
        t = self.txns[s]
        j = [lv.name for lv in t.levels].index(name)
        below = t.levels[j - 1]
        for lv in t.levels[j:]:
            for kid, vs in lv.keys.items():
                below.keys[kid] = below.keys.get(kid, ()) + vs
            below.msgs.update(lv.msgs)
        t.levels = t.levels[:j]


# ------------------------------------------------------------------ choices

class Chooser:
    """Replays a forced prefix of choices and records new ones (default 0),
    so that every path of choices can be enumerated."""

    def __init__(self, forced, win_of):
        self.forced = forced
        self.made = []        # (value, arity)
        self.win_of = win_of
        self.notes = []       # what the path relied on, for the statistics

    def pick(self, n):
        if n <= 1:
            return 0
        i = len(self.made)
        v = self.forced[i] if i < len(self.forced) else 0
        self.made.append((v, n))
        return v

    def passed(self, call, lo, hi):
        """Has the clock of 'call' reached an instant known to lie in [lo, hi]
        (expiry or lease end: ts <= now means passed)?"""
        wlo, whi = self.win_of(call)
        if hi <= wlo:
            return True
        if lo > whi:
            return False
        return self.pick(2) == 1


# ------------------------------------------------------------------ outcomes

class Out:
    """What the model says a statement does: 'ok' (answers; check() tells
    whether an answer fits, fill() applies its effects), 'err' (fails with
    sqlstate; ends=True when the transaction ends with it), 'block' (waits
    for session 'on', for key or message 'what')."""
    __slots__ = ('kind', 'desc', 'check', 'fill', 'sqlstate', 'ends', 'on', 'what')

    def __init__(self, kind, desc='', check=None, fill=None, sqlstate=None,
                 ends=False, on=None, what=None):
        self.kind = kind
        self.desc = desc
        self.check = check
        self.fill = fill
        self.sqlstate = sqlstate
        self.ends = ends
        self.on = on
        self.what = what


def Err(sqlstate, why, ends=False):
    """sqlstate: one SQLSTATE, or a set of them when the contract does not
    say which of several violated conditions is reported first."""
    states = {sqlstate} if isinstance(sqlstate, str) else set(sqlstate)
    return Out('err', desc=f"error {'/'.join(sorted(states))} ({why})", sqlstate=states, ends=ends)


def Block(u, what):
    return Out('block', desc=f"waits for S{u}", on=u, what=what)


def Ok(desc, check=None, fill=None):
    return Out('ok', desc=desc, check=check or (lambda r: None), fill=fill)


def expect_rows(expected):
    """check: the answer's rows are exactly 'expected' (list of lists)."""
    def check(res):
        if res.rows != expected:
            return f"rows {res.rows}"
        return None
    return check


# ------------------------------------------------------------------ calls

class Call:
    """One statement sent to one session, with what the model needs."""
    __slots__ = ('sess', 'kind', 'sql', 'params', 'a', 'armed', 'racy',
                 'step', 'sent_us', 'locks', 'label')

    def __init__(self, sess, kind, sql, params=(), **a):
        self.sess = sess
        self.kind = kind
        self.sql = sql
        self.params = list(params)
        self.a = a
        self.armed = None     # sqlstate it must end with if it waits (timeout, cancel)
        self.racy = set()     # SQLSTATEs that may interrupt it wherever it is
                              # (a cancel or timeout racing it: 57014, 55P03)
        self.step = None
        self.locks = set()    # key ids whose key lock it may take
        self.label = kind

    def show(self):
        ps = ', '.join(short(p, 40) if p is not None else 'NULL' for p in self.params)
        extra = ''
        if self.armed:
            extra += f' [must fail {self.armed} if it waits]'
        if self.racy:
            extra += f" [{'/'.join(sorted(self.racy))} may interrupt it]"
        return f"S{self.sess}: {self.sql}" + (f"  -- ({ps})" if ps else '') + extra


API_KINDS = {'claim', 'complete', 'checkpoint', 'release', 'lookup', 'consume', 'batch',
             'export_keys', 'export_messages', 'import_key', 'import_message'}

US = "(extract(epoch FROM {0}) * 1000000)::bigint"


# ------------------------------------------------------------------ the model's rules

class Model:
    def __init__(self, settings, superuser, universe):
        self.key_ttl = settings['key_ttl']
        self.msg_ttl = settings['message_ttl']
        self.max_ttl = settings['max_ttl']
        self.max_len = settings['max_key_length']
        # idempotency.key_memory (0, or longer than the run): an expired key
        # or id that was not released stays remembered, and so does a key
        # one of whose earlier versions was (World.rem)
        self.memory = settings.get('key_memory', 0) > 0
        self.superuser = superuser
        self.u = universe     # digest -> ('k', scope, key) / ('m', consumer, id)
        # a completed key is replaced by an import only if it is completed
        # (CHANGELOG 0.3.1; reference.md's table does not say so)
        self.completed_final = True
        self.strict = os.environ.get('MODEL_STRICT', '') not in ('', '0')

    # -- the statement kinds; each predict(w, c, ch, contended) -> Out

    def predict(self, w, c, ch, contended):
        return getattr(self, 'p_' + c.kind)(w, c, ch, contended)

    # transaction control
    def p_begin(self, w, c, ch, contended):
        a = c.a

        def fill(w, res):
            w.txns[c.sess] = Txn(self.superuser, a['iso'], a['ro'])
        return Ok('BEGIN', fill=fill)

    def p_setrole(self, w, c, ch, contended):
        def fill(w, res):
            w.txns[c.sess].role = c.a['role']
        return Ok('SET ROLE', fill=fill)

    def p_snap(self, w, c, ch, contended):
        def fill(w, res):
            t = w.txns[c.sess]
            if t.snap is None:
                t.snap = (dict(w.keys), dict(w.msgs))
        return Ok('snapshot', fill=fill)

    def p_set(self, w, c, ch, contended):
        return Ok('SET')

    def p_savepoint(self, w, c, ch, contended):
        def fill(w, res):
            t = w.txns[c.sess]
            t.levels.append(Level(c.a['name']))
            t.sp += 1
        return Ok('SAVEPOINT', fill=fill)

    def p_rollback_to(self, w, c, ch, contended):
        def fill(w, res):
            w.rollback_to(c.sess, c.a['name'])
        return Ok('ROLLBACK TO SAVEPOINT', fill=fill)

    def p_release_sp(self, w, c, ch, contended):
        def fill(w, res):
            w.release_sp(c.sess, c.a['name'])
        return Ok('RELEASE SAVEPOINT', fill=fill)

    def p_commit(self, w, c, ch, contended):
        kid = w.unresolved(c.sess)
        if kid is not None:
            return Err('2D000', f"same-transaction claim of {kid} neither completed nor released", ends=True)

        def fill(w, res):
            w.commit(c.sess)
        return Ok('COMMIT', fill=fill)

    def p_rollback(self, w, c, ch, contended):
        def fill(w, res):
            w.txns[c.sess] = None
        return Ok('ROLLBACK', fill=fill)

    # -- keys

    def key_live(self, w, c, ch, kid, view=None):
        """The committed version of kid if it is live at c's clock."""
        v = (view if view is not None else w.keys).get(kid)
        if v is None:
            return None
        if ch.passed(c, v.exp, v.exp):
            ch.notes.append('a committed key had expired')
            return None
        return v

    def p_claim(self, w, c, ch, contended):
        a = c.a
        s = c.sess
        t = w.txns[s]
        if a.get('bad'):
            return Err(a['bad'][0], a['bad'][1])
        if t.ro:
            return Err('25006', 'read-only transaction')
        kid = (t.role, a['scope'], a['key'])
        ttl = a['ttl'] if a['ttl'] is not None else self.key_ttl
        u = w.busy_key(s, kid)
        if u is not None:
            if all(v.exp <= self.win_of(c)[0] for v in w.busy_versions(u, kid)):
                ch.notes.append("another transaction's row was past its expiry")
            if not a['wait']:
                return self.out_inprogress(self.inprog_candidates(w, kid, u), f'S{u} is writing it')
            return Block(u, ('k', kid))
        mine = w.own_key(s, kid)
        if mine is not None and mine.exp <= self.win_of(c)[0]:
            ch.notes.append("the caller's own row was past its expiry")
        v = mine if mine is not None else self.key_live(w, c, ch, kid)
        # the committed row this path takes as expired, if any
        gone = w.keys.get(kid) if mine is None and v is None else None
        # with wait => false and the key lock busy (another statement of the
        # round on the same key holds it), only the caller's own claim or a
        # committed completed key is answered as usual; anything else is
        # in_progress
        if (not a['wait'] and contended(kid, s)
                and not (mine is not None and mine.st != 'r')
                and not (mine is None and v is not None and v.st == 'c')
                and ch.pick(2) == 1):
            cands = self.inprog_candidates(w, kid, None) | {None}
            return self.out_inprogress(cands, 'key lock busy')
        if v is None and self.memory and gone is not None and (gone.st != 'r' or kid in w.rem):
            # expired and remembered (key_memory): answered, nothing written;
            # a released version is not remembered, but an earlier one of
            # the same key that ran is (doc/reference.md, key_memory)
            return self.out_fixed(['expired', None, None, None, None, None],
                                  'expired, remembered')
        if v is None:
            # a claim decides expiry and writes its token with one clock:
            # the path that took the row as expired must match that clock
            # (an expired row and a lapsed lease give the same answer, but
            # not the same fingerprint or recovery point afterwards)
            cond = None
            if gone is not None:
                e = gone.exp
                cond = lambda n: None if e <= n else \
                    f"taken as expired, but the row expires at {e}, after the claim's clock {n}"
            return self.out_fresh(w, c, kid, ttl, a['lease'], a['fp'], None, 0,
                                  'new or expired key', clock_ok=cond)
        if v.st != 'r' and a['fp'] is not None and v.fp is not None and v.fp != a['fp']:
            return self.out_fixed(['mismatch', None, None, None, None, v.exp], 'fingerprint differs')
        if v.st == 'c':
            return self.out_fixed(['completed', None, None, v.code, v.body, v.exp], 'completed')
        if v.st == 'p':
            if mine is not None:
                return self.out_fixed(['claimed', v.tok, v.rp, None, None, v.exp], 'own claim')
            if v.lease is None or not ch.passed(c, v.lease, v.lease):
                return self.out_fixed(['in_progress', None, None, None, None, v.exp],
                                      'held, lease running' if v.lease else 'held')
            ch.notes.append('a lease had lapsed')
            e, l = v.exp, v.lease
            return self.out_fresh(w, c, kid, ttl, a['lease'], v.fp, v.rp, v.tok, 'lease lapsed: takeover',
                                  clock_ok=lambda n: None if l <= n < e else
                                  f"taken over, but the claim's clock {n} is not in [lease end {l}, expiry {e})")
        cond = None
        if mine is None:
            e = v.exp
            cond = lambda n: None if n < e else \
                f"a live released key, but the claim's clock {n} is at or past its expiry {e}"
        return self.out_fresh(w, c, kid, ttl, a['lease'], a['fp'], v.rp, v.tok, 'released: fresh claim',
                              clock_ok=cond)

    def inprog_candidates(self, w, kid, u):
        cands = set()
        if kid in w.keys:
            cands.add(w.keys[kid].exp)
        us = [u] if u is not None else [x for x in w.txns if w.txns[x] is not None]
        for x in us:
            for v in w.busy_versions(x, kid):
                cands.add(v.exp)
        return cands

    def out_inprogress(self, cands, why):
        def check(res):
            r = res.rows
            if len(r) != 1 or r[0][0] != 'in_progress' or any(x is not None for x in r[0][1:5]):
                return f"answer {r}"
            e = int(r[0][5]) if r[0][5] is not None else None
            if e not in cands:
                return f"expires_at {e} not among {sorted(cands, key=str)}"
            return None
        return Ok(f"in_progress ({why}), expires_at in {sorted(cands, key=str)}", check=check)

    def out_fixed(self, row, why):
        exp = [None if x is None else str(x) for x in row]
        return Ok(f"{row[0]} ({why}) {row[1:]}", check=expect_rows([exp]))

    def out_fresh(self, w, c, kid, ttl, lease, fp, rp, prev, why, clock_ok=None):
        """A claim that writes a new row: its token and expiry come from its
        clock, which must lie in the statement's window, and satisfy
        clock_ok (the path's assumptions about that clock), if given."""
        if prev >= self.MAX_TOKEN:
            return Err('22003', 'no larger fencing token can be issued')

        def check(res):
            r = res.rows
            if len(r) != 1 or r[0][0] != 'claimed' or r[0][1] is None or r[0][5] is None:
                return f"answer {r}"
            if r[0][2] != rp:
                return f"recovery_point {r[0][2]!r}, model {rp!r}"
            if r[0][3] is not None or r[0][4] is not None:
                return f"response {r[0][3:5]} on a claim"
            tok = int(r[0][1])
            exp = int(r[0][5])
            n = exp - ttl
            lo, hi = self.win_of(c)
            if not (lo <= n <= hi):
                return f"claim time {n} (expires_at - ttl) outside the statement's clock [{lo}, {hi}]"
            if clock_ok is not None:
                why_not = clock_ok(n)
                if why_not is not None:
                    return why_not
            want = max(n - PG_EPOCH_US, prev + 1)
            if tok != want:
                return f"token {tok}, model {want} (clock {n - PG_EPOCH_US}, previous {prev})"
            if tok <= w_maxtok:
                return f"token {tok} not above the key's earlier token {w_maxtok}"
            return None
        w_maxtok = w.max_token(c.sess, kid)

        def fill(w, res):
            r = res.rows[0]
            tok = int(r[1])
            exp = int(r[5])
            n = exp - ttl
            w.write_key(c.sess, kid, KV('p', tok, n, exp, n + lease if lease is not None else None,
                                        fp, rp, None, None, lease is None, tok == n - PG_EPOCH_US))
        return Ok(f"claimed ({why}), token above {max(prev, w_maxtok)}, recovery_point {rp!r}",
                  check=check, fill=fill)

    def p_act(self, w, c, ch, contended):
        """idem_complete / idem_checkpoint / idem_release."""
        a = c.a
        s = c.sess
        t = w.txns[s]
        if a.get('bad'):
            return Err(a['bad'][0], a['bad'][1])
        if t.ro:
            return Err('25006', 'read-only transaction')
        kid = (t.role, a['scope'], a['key'])
        u = w.busy_key(s, kid)
        if u is not None:
            return Err('55006', f'S{u} is writing it')
        mine = w.own_key(s, kid)
        if mine is not None and mine.exp <= self.win_of(c)[0]:
            ch.notes.append("the caller's own row was past its expiry")
        v = mine if mine is not None else self.key_live(w, c, ch, kid)
        if v is None:
            return Err('55000', 'no live claim')
        if a['token'] is not None and a['token'] != v.tok:
            return Err('55006', f"stale token (current {v.tok})")
        if v.st == 'r':
            return Err('55000', 'released')
        if v.st == 'c':
            return Err('55000', 'already completed')
        if a['token'] is None and mine is None:
            return Err('55000', 'not claimed by this transaction')
        op = a['op']
        if op == 'complete':
            nv = v.but(st='c', code=a['code'], body=a['body'], lease=None, mr=False)
        elif op == 'checkpoint':
            nv = v.but(rp=a['rp'])
        else:
            nv = v.but(st='r', lease=None, mr=False)

        def fill(w, res):
            w.write_key(s, kid, nv)
        return Ok(op, check=expect_rows([[""]]), fill=fill)

    p_complete = p_checkpoint = p_release = p_act

    def p_lookup(self, w, c, ch, contended):
        a = c.a
        t = w.txns[c.sess]
        if a.get('bad'):
            return Err(a['bad'][0], a['bad'][1])
        kid = (t.role, a['scope'], a['key'])
        v = w.own_key(c.sess, kid)
        if v is None:
            v = self.key_live(w, c, ch, kid)
            gone = w.keys.get(kid) if v is None else None
            if self.memory and gone is not None and (gone.st != 'r' or kid in w.rem):
                return Ok('expired, remembered',
                          check=expect_rows([['expired'] + [None] * 7]))
        if v is None:
            return Ok('no row', check=expect_rows([]))
        st = {'p': 'in_progress', 'c': 'completed', 'r': 'released'}[v.st]
        row = [st, v.tok, v.rp, v.code, v.body, v.cat, v.exp, v.lease]
        return Ok(f"row {st} ({row})", check=expect_rows([[None if x is None else str(x) for x in row]]))

    # -- messages

    def msg_live(self, w, c, ch, mid, view=None):
        """Is the committed record of mid live at c's clock?  Narrows its
        expiry interval by the answer chosen."""
        d = w.msgs if view is None else view
        iv = d.get(mid)
        if iv is None:
            return False
        lo, hi = iv
        wlo, whi = self.win_of(c)
        if ch.passed(c, lo, hi):
            ch.notes.append('a committed message id had expired')
            if view is None and hi > whi:
                w.msgs[mid] = (lo, whi)
            return False
        if view is None and lo <= wlo:
            w.msgs[mid] = (wlo + 1, hi)
        return True

    def p_consume(self, w, c, ch, contended):
        a = c.a
        t = w.txns[c.sess]
        if a.get('bad'):
            return Err(a['bad'][0], a['bad'][1])
        if t.ro:
            return Err('25006', 'read-only transaction')
        mid = (t.role, a['consumer'], a['id'])
        u = w.busy_msg(c.sess, mid)
        if u is not None:
            return Block(u, ('m', mid))
        if w.own_msg(c.sess, mid) is not None:
            return Ok('false (consumed by this transaction)', check=expect_rows([['f']]))
        if self.msg_live(w, c, ch, mid):
            return Ok('false (consumed)', check=expect_rows([['f']]))
        if self.memory and mid in w.msgs:
            return Ok('false (expired, remembered)', check=expect_rows([['f']]))
        ttl = a['ttl'] if a['ttl'] is not None else self.msg_ttl
        lo, hi = self.win_of(c)

        def fill(w, res):
            w.write_msg(c.sess, mid, (lo + ttl, hi + ttl))
        return Ok('true (new or expired)', check=expect_rows([['t']]), fill=fill)

    def p_batch(self, w, c, ch, contended):
        a = c.a
        s = c.sess
        t = w.txns[s]
        cont = w.conts.get(s)
        if cont is None:
            if a.get('bad'):
                return Err(a['bad'][0], a['bad'][1])
            if t.ro:
                return Err('25006', 'read-only transaction')
            seen = {}
            for i in a['ids']:
                d = digest(a['consumer'], i)
                seen.setdefault(d, i)
            order = tuple(seen[d] for d in sorted(seen, key=lambda d: uuid.UUID(d).bytes))
            cont = (order, frozenset(), frozenset(), None)
        order, new, maybe, first_lo = cont
        ttl = a['ttl'] if a['ttl'] is not None else self.msg_ttl
        lo, hi = self.win_of(c)
        if first_lo is None:
            first_lo = lo
        judged = []
        for k, i in enumerate(order):
            mid = (t.role, a['consumer'], i)
            u = w.busy_msg(s, mid)
            if u is not None:
                # The ids before this one were checked in this round, before
                # the wait; the answer comes in a later round.  One judged
                # live whose expiry may lie in this round's window may as
                # well have been found expired (and recorded): which, only
                # the answer tells (see the check below).
                for j in judged:
                    iv = w.msgs.get((t.role, a['consumer'], j))
                    if iv is not None and iv[0] <= hi:
                        maybe = maybe | {j}
                        ch.notes.append('a batch waited: an id judged live before may have expired')
                w.conts[s] = (order[k:], new, maybe, first_lo)
                return Block(u, ('m', mid))
            if w.own_msg(s, mid) is not None:
                continue
            if self.msg_live(w, c, ch, mid):
                judged.append(i)
                continue
            if self.memory and mid in w.msgs:
                continue        # expired, remembered
            w.write_msg(s, mid, (lo + ttl, hi + ttl))
            new = new | {i}
        w.conts.pop(s, None)
        out = [i for i in dict.fromkeys(a['ids']) if i in new]
        if not maybe:
            return Ok(f"{'some' if out else 'no'} new ids ({out})", check=expect_rows([[i] for i in out]))
        wide = [i for i in dict.fromkeys(a['ids']) if i in new or i in maybe]

        def check(res):
            got = [r[0] for r in res.rows] if res.rows is not None else None
            if got is None or [i for i in got if i not in maybe] != out or \
                    got != [i for i in wide if i in got]:
                return f"rows {res.rows}"
            return None

        def fill(w, res):
            for r in res.rows:
                if r[0] in maybe:
                    w.write_msg(s, (t.role, a['consumer'], r[0]), (first_lo + ttl, hi + ttl))
        return Ok(f"{'some' if out else 'no'} new ids ({out}), and maybe {sorted(maybe)} "
                  "(found expired before the wait)", check=check, fill=fill)

    # -- export and import

    def p_export_keys(self, w, c, ch, contended):
        a = c.a
        t = w.txns[c.sess]
        if t.role != self.superuser:
            return Err('42501', 'not a superuser')
        if a.get('bad'):
            return Err(a['bad'][0], a['bad'][1])
        scopes = a['scopes']
        if scopes is not None and len(scopes) == 0:
            return Ok('no rows', check=expect_rows([]))
        base = t.snap[0] if t.iso != 'rc' and t.snap is not None else w.keys
        kids = set(base)
        for lv in t.levels:
            kids.update(k for k, vs in lv.keys.items() if vs)
        req, opt = {}, {}
        lo, hi = self.win_of(c)
        for kid in kids:
            if scopes is not None and kid[1] not in scopes:
                continue
            v = w.own_key(c.sess, kid)
            if v is None:
                v = base.get(kid)
            if v is None or v.exp <= lo:
                continue
            st = {'p': 'in_progress', 'c': 'completed', 'r': 'released'}[v.st]
            row = (kid[0], digest(kid[1], kid[2]), str(v.exp), st, str(v.tok), str(v.cat),
                   None if v.lease is None else str(v.lease), v.fp, v.rp,
                   None if v.code is None else str(v.code), v.body) + (('0',) if self.extra_export else ())
            (req if v.exp > hi else opt)[row[1] + '/' + row[0]] = row

        def check(res):
            return self.check_export(res, req, opt)
        return Ok(f"{len(req)} rows (+{len(opt)} near expiry)", check=check)

    def check_export(self, res, req, opt, pin=None):
        got = {}
        for r in res.rows:
            k = r[1] + '/' + r[0]
            if k in got:
                return f"row exported twice: {r}"
            got[k] = tuple(r)
        for k, row in req.items():
            if k not in got:
                return f"missing row {row} ({self.u.get(row[1])})"
        for k, r in got.items():
            want = req.get(k) or opt.get(k)
            if want is None:
                if r[1] in self.u:
                    return f"unexpected row {r} ({self.u.get(r[1])})"
                continue
            if pin is not None:
                err = pin(r, want)
                if err:
                    return err
            elif r != want:
                return f"row {r} ({self.u.get(r[1])}), model {want}"
        return None

    def p_export_messages(self, w, c, ch, contended):
        a = c.a
        t = w.txns[c.sess]
        if t.role != self.superuser:
            return Err('42501', 'not a superuser')
        if a.get('bad'):
            return Err(a['bad'][0], a['bad'][1])
        cons = a['scopes']
        if cons is not None and len(cons) == 0:
            return Ok('no rows', check=expect_rows([]))
        base = t.snap[1] if t.iso != 'rc' and t.snap is not None else w.msgs
        mids = set(base)
        for lv in t.levels:
            mids.update(lv.msgs)
        req, opt, where = {}, {}, {}
        lo, hi = self.win_of(c)
        for mid in mids:
            if cons is not None and mid[1] not in cons:
                continue
            iv = w.own_msg(c.sess, mid)
            own = iv is not None
            if iv is None:
                iv = base.get(mid)
            if iv is None or iv[1] <= lo:
                continue
            row = (mid[0], digest(mid[1], mid[2]), iv)
            key = row[1] + '/' + row[0]
            (req if iv[0] > hi else opt)[key] = row
            where[key] = (mid, own)

        def pin(r, want):
            e = int(r[2])
            if r[0] != want[0] or not (want[2][0] <= e <= want[2][1]):
                return f"row {r} ({self.u.get(r[1])}), model expiry in {want[2]}"
            return None

        def check(res):
            return self.check_export(res, req, opt, pin)

        def fill(w, res):
            # the exact expiries the server has: pin them
            for r in res.rows:
                key = r[1] + '/' + r[0]
                if key in where:
                    mid, own = where[key]
                    e = int(r[2])
                    if own:
                        t2 = w.txns[c.sess]
                        for lv in reversed(t2.levels):
                            if mid in lv.msgs:
                                lv.msgs[mid] = (e, e)
                                break
                    elif t.iso == 'rc' and mid in w.msgs:
                        w.msgs[mid] = (e, e)
        return Ok(f"{len(req)} rows (+{len(opt)} near expiry)", check=check, fill=fill)

    MAX_TOKEN = (1 << 62) - 1

    def key_record_errors(self, f, c):
        """The documented errors a key record's fields give (one record may
        break several rules; the contract does not order them)."""
        errs = []
        if f.get('types'):
            return [('42804', 'columns of another type')]
        if f['role'] is None:
            errs.append(('22004', 'NULL role'))
        elif f['role'] not in (self.superuser, ALT_ROLE):
            errs.append(('42704', 'no such role'))
        for k in ('digest', 'exp', 'status', 'token', 'cat'):
            if f[k] is None:
                errs.append(('22004', f'NULL {k}'))
        st = f['status']
        if st is not None and st not in ('in_progress', 'completed', 'released'):
            errs.append(('22023', 'unknown status'))
        if f['token'] is not None and not (1 <= f['token'] <= self.MAX_TOKEN):
            errs.append(('22023', 'token out of range'))
        lo, hi = self.win_of(c)
        if f['exp'] is not None and f['exp'] > lo + self.max_ttl:
            errs.append(('22023', 'expires_at beyond max_ttl'))
        if st == 'completed':
            if f['code'] is None:
                errs.append(('22004', 'NULL response_code of a completed key'))
            elif not (100 <= f['code'] <= 599):
                errs.append(('22023', 'response_code out of range'))
        elif f['code'] is not None or f['body'] is not None:
            errs.append(('22023', 'a response on a key that is not completed'))
        if st != 'in_progress' and f['lease'] is not None:
            errs.append(('22023', 'a lease on a key that is not in progress'))
        if f['fp'] is not None and len(f['fp']) != 64:
            errs.append(('22023', 'fingerprint not 32 bytes'))
        if f['rp'] is not None and len(f['rp'].encode()) > self.max_len:
            errs.append(('22001', 'recovery_point too long'))
        if st == 'in_progress' and f['lease'] is None:
            errs.append(('22023', 'in progress without a lease'))
        if st == 'in_progress' and f['lease'] is not None and f['exp'] is not None and f['lease'] > f['exp']:
            errs.append(('22023', 'lease ends after the key expires'))
        return errs

    def p_import_key(self, w, c, ch, contended):
        a = c.a
        s = c.sess
        t = w.txns[s]
        if t.role != self.superuser:
            return Err('42501', 'not a superuser')
        f = a['fields']
        errs = self.key_record_errors(f, c)
        if errs:
            return Err({e[0] for e in errs}, '; '.join(e[1] for e in errs))
        if t.ro:
            return Err('25006', 'read-only transaction')
        rec = KV({'in_progress': 'p', 'completed': 'c', 'released': 'r'}[f['status']], f['token'],
                 f['cat'], f['exp'], f['lease'], f['fp'], f['rp'], f['code'], f['body'], False)
        kid = a['kid']
        if ch.passed(c, rec.exp, rec.exp):
            return Ok('expired', check=expect_rows([['expired']]))
        u = w.busy_key(s, kid)
        if u is not None:
            return Block(u, ('k', kid))
        if w.own_key(s, kid) is not None:
            return Err('55000', 'this transaction wrote the key')
        v = self.key_live(w, c, ch, kid)
        if v is None:
            outcome = 'inserted'
            # written over an expired version that ran: that version stays
            # remembered (in its partition, then in the memory's piece)
            gone = w.keys.get(kid)
            if self.memory and gone is not None and gone.st != 'r':
                rec = rec.but(rem=True)
        elif rec.tok < v.tok or (rec.tok == v.tok and v.st != 'p'):
            outcome = 'kept'
        elif rec.tok == v.tok and rec.st == 'p' and rec.rp == v.rp:
            outcome = 'kept'
        elif v.st == 'c' and rec.st != 'c' and self.completed_final:
            outcome = 'kept'
        else:
            outcome = 'replaced'
        if outcome == 'kept':
            return Ok('kept', check=expect_rows([['kept']]))

        def fill(w, res):
            w.write_key(s, kid, rec)
        return Ok(outcome, check=expect_rows([[outcome]]), fill=fill)

    def p_import_message(self, w, c, ch, contended):
        a = c.a
        s = c.sess
        t = w.txns[s]
        if t.role != self.superuser:
            return Err('42501', 'not a superuser')
        f = a['fields']
        errs = []
        if f.get('types'):
            errs = [('42804', 'columns of another type')]
        else:
            if f['role'] is None:
                errs.append(('22004', 'NULL role'))
            elif f['role'] not in (self.superuser, ALT_ROLE):
                errs.append(('42704', 'no such role'))
            for k in ('digest', 'exp'):
                if f[k] is None:
                    errs.append(('22004', f'NULL {k}'))
            lo, hi = self.win_of(c)
            if f['exp'] is not None and f['exp'] > lo + self.max_ttl:
                errs.append(('22023', 'expires_at beyond max_ttl'))
        if errs:
            return Err({e[0] for e in errs}, '; '.join(e[1] for e in errs))
        if t.ro:
            return Err('25006', 'read-only transaction')
        e = f['exp']
        mid = a['mid']
        waited = w.conts.pop(s, None) == 'waited'
        if ch.passed(c, e, e):
            if waited and not self.strict and ch.pick(2) == 1:
                # known difference 2: after a wait, a record that expired
                # meanwhile is answered "kept" though nothing was kept
                ch.notes.append('known difference 2 (import_message: kept after its record expired)')
                return Ok('kept (the record expired while it waited)', check=expect_rows([['kept']]))
            return Ok('expired', check=expect_rows([['expired']]))
        u = w.busy_msg(s, mid)
        if u is not None:
            w.conts[s] = 'waited'
            return Block(u, ('m', mid))
        if w.own_msg(s, mid) is not None or self.msg_live(w, c, ch, mid):
            return Ok('kept', check=expect_rows([['kept']]))
        if not self.strict and e <= self.win_of(c)[1] and ch.pick(2) == 1:
            # known difference 2, within the call: the record expires between
            # the check for "expired" and the write
            ch.notes.append('known difference 2 (import_message: kept after its record expired)')
            return Ok('kept (the record expired during the call)', check=expect_rows([['kept']]))

        def fill(w, res):
            w.write_msg(s, mid, (e, e))
        return Ok('inserted', check=expect_rows([['inserted']]), fill=fill)


# ------------------------------------------------------------------ server sessions

class Res:
    __slots__ = ('ok', 'rows', 'sqlstate', 'msg')

    def __init__(self, ok, rows=None, sqlstate=None, msg=None):
        self.ok = ok
        self.rows = rows
        self.sqlstate = sqlstate
        self.msg = msg

    def __repr__(self):
        if self.ok:
            return f"rows {self.rows}"
        return f"ERROR {self.sqlstate}: {self.msg}"


class Conn:
    """One session, driven through libpq's asynchronous interface."""

    def __init__(self, dsn, name):
        self.name = name
        self.pg = pq.PGconn.connect(dsn.encode())
        if self.pg.status != pq.ConnStatus.OK:
            raise RuntimeError(f"cannot connect: {self.pg.error_message.decode()}")
        self.pid = self.pg.backend_pid
        self.pg.notice_handler = lambda r: None
        self.busy = False

    def send(self, sql, params):
        ps = [None if p is None else str(p).encode() for p in params]
        self.pg.send_query_params(sql.encode(), ps)
        self.busy = True

    def poll(self):
        """The answer, or None while the statement runs."""
        if not self.busy:
            raise RuntimeError('poll without a statement')
        self.pg.consume_input()
        if self.pg.is_busy():
            return None
        last = None
        while True:
            r = self.pg.get_result()
            if r is None:
                break
            last = r
        self.busy = False
        if last is None:
            raise RuntimeError('no result')
        if last.status == pq.ExecStatus.FATAL_ERROR:
            st = last.error_field(pq.DiagnosticField.SQLSTATE)
            msg = last.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
            return Res(False, sqlstate=st.decode() if st else None,
                       msg=msg.decode() if msg else last.error_message.decode())
        rows = []
        for i in range(last.ntuples):
            rows.append([None if last.get_value(i, j) is None else last.get_value(i, j).decode()
                         for j in range(last.nfields)])
        return Res(True, rows=rows)

    def run(self, sql, params=(), timeout=60):
        self.send(sql, params)
        deadline = time.monotonic() + timeout
        while True:
            r = self.poll()
            if r is not None:
                return r
            if time.monotonic() > deadline:
                raise Difference(f"S{self.name}: no answer within {timeout} s to {sql}")
            select.select([self.pg.socket], [], [], 0.05)


# ------------------------------------------------------------------ the driver

class Driver:
    def __init__(self, dsn, seed, steps, nsess, tol_ms, settle, verbose, trace):
        self.dsn = dsn
        self.seed = seed
        self.steps = steps
        self.rng = random.Random(seed)
        self.tol = tol_ms * 1000
        self.settle = settle
        self.verbose = verbose
        self.trace_file = trace
        self.log = []           # (step, text, touched ids)
        self.mon = psycopg.connect(dsn, autocommit=True)
        self.setup()
        self.sess = list(range(1, nsess + 1))
        self.conns = {s: Conn(dsn, s) for s in self.sess}
        for s in self.sess:
            r = self.conns[s].run("SET TimeZone = 'UTC'")
            if not r.ok:
                raise RuntimeError(r)
        self.pid2s = {self.conns[s].pid: s for s in self.sess}
        self.w = World(self.sess)
        self.inflight = {}      # sess -> Call
        self.armed = {s: False for s in self.sess}   # a timeout is set in the session
        self.windows = {}       # id(call) -> (lo, hi) during a resolution
        self.model.win_of = self.win_of
        self.exported_keys = []     # records the last exports gave, for imports
        self.exported_msgs = []
        self.stats = {}
        self.step = 0
        self.strict = os.environ.get('MODEL_STRICT', '') not in ('', '0')
        # the share of raced cancels acted on late (see hold_when_waiting),
        # drawn apart from the seed's choices, which stay the same
        self.late = float(os.environ.get('MODEL_LATE_CANCELS', 0) or 0)
        self.late_rng = random.Random(f"late cancels {seed}")

    # -- setup
    def setup(self):
        m = self.mon
        m.execute("SET TimeZone = 'UTC'")
        have = m.execute("SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'").fetchone()[0]
        if not have:
            m.execute("CREATE EXTENSION idempotency")
        if not m.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (ALT_ROLE,)).fetchone()[0]:
            try:
                m.execute(f"CREATE ROLE {ALT_ROLE}")
            except psycopg.errors.UniqueViolation:
                pass
        st = dict(m.execute(
            "SELECT name, setting FROM pg_settings WHERE name LIKE 'idempotency.%'").fetchall())
        settings = {
            'key_ttl': int(st['idempotency.key_ttl']) * 1000000,
            'message_ttl': int(st['idempotency.message_ttl']) * 1000000,
            'max_ttl': int(st['idempotency.max_ttl']) * 1000000,
            'max_key_length': int(st['idempotency.max_key_length']),
            'key_memory': int(st.get('idempotency.key_memory', '0')) * 1000000,
        }
        if 0 < settings['key_memory'] < 3600 * 1000000:
            raise RuntimeError("idempotency.key_memory must be 0 or at least an hour "
                               "(the model remembers every expired key and id for the whole run)")
        if settings['key_ttl'] > 10 * 1000000 or settings['message_ttl'] > 10 * 1000000:
            raise RuntimeError("idempotency.key_ttl and message_ttl must be a few seconds "
                               "(the model's keys must expire during the run)")
        # columns of the record types beyond those of the v1 contract
        # (0.4.0 added some to key_record): NULL on import, NULL on export
        # for what this test writes
        cols = lambda t: m.execute(
            """SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
                WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
                ORDER BY attnum""", (t,)).fetchall()
        self.key_extra = cols('idempotency.key_record')[11:]
        self.msg_extra = cols('idempotency.message_record')[3:]
        self.superuser = m.execute("SELECT current_user").fetchone()[0]
        if not m.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
            raise RuntimeError("the script must connect as a superuser")
        self.settings = settings
        # the universe of this run: names unique to it, so that runs in one
        # database do not meet
        tag = f"{self.seed}.{os.urandom(3).hex()}"
        self.roles = [self.superuser, ALT_ROLE]
        self.scopes = ['', f'{tag}/s']
        self.tag = tag
        self.consumers = [f'{tag}/c{i}' for i in range(2)]
        self.universe = {}
        self.t0 = time.monotonic()
        self.model = Model(settings, self.superuser, self.universe)
        self.model.extra_export = bool(self.key_extra)
        self.reqs = [
            {"amount": 100, "currency": "EUR"},
            {"amount": 100, "currency": "USD"},
            {"items": [1, 2, 3], "note": "a b", "x": {"y": None, "zz": True}},
        ]
        self.bodies = [None, {"ok": True}, {"charge": 42, "items": [1, 2]}, [], "text", 0]

    def win_of(self, c):
        return self.windows[id(c)]

    # -- names: 6 keys and 6 message ids at a time, a new one every half
    # second, so that fresh keys keep coming while the old ones expire
    def window(self):
        return int((time.monotonic() - self.t0) * 2)

    def key_name(self):
        n = self.window() + self.rng.randrange(6)
        key = f'{self.tag}/k{n}'
        for sc in self.scopes:
            self.universe.setdefault(digest(sc, key), ('k', sc, key))
        return key

    def msg_id(self):
        i = f'm{self.window() + self.rng.randrange(6)}'
        for co in self.consumers:
            self.universe.setdefault(digest(co, i), ('m', co, i))
        return i

    # -- logging
    def note(self, text, touched=()):
        self.log.append((self.step, text, frozenset(touched)))
        if self.verbose:
            print(f"[{self.step}] {text}")
        if self.trace_file:
            self.trace_file.write(f"[{self.step}] {text}\n")

    def touched(self, c):
        a = c.a
        out = set()
        if 'key' in a and a.get('key') is not None:
            out.add(('k', a.get('scope'), a['key']))
        if a.get('kid'):
            out.add(('k', a['kid'][1], a['kid'][2]))
        if 'consumer' in a and a.get('consumer') is not None:
            for i in (a.get('ids') or [a.get('id')]):
                out.add(('m', a['consumer'], i))
        if 'mid' in a:
            out.add(('m', a['mid'][1], a['mid'][2]))
        return out

    # -- observation: wait until the server is quiescent (model-free)
    def monitor_waits(self, pids):
        rows = self.mon.execute(
            """SELECT w.pid, h.pid FROM pg_locks w
                 JOIN pg_locks h ON h.locktype = 'transactionid'
                                AND h.transactionid = w.transactionid AND h.granted
                WHERE w.locktype = 'transactionid' AND NOT w.granted AND w.pid = ANY(%s)""",
            (pids,)).fetchall()
        return {a: b for a, b in rows}

    def note_other_waits(self, rem):
        """Counts the statements seen waiting for a process that is not a
        session of the test (maintenance, a partition maker): not part of
        the model, but worth knowing."""
        rows = self.mon.execute(
            """SELECT a.pid, b.backend_type
                 FROM unnest(%s::int[]) AS a(pid), unnest(pg_blocking_pids(a.pid)) AS h(pid)
                 JOIN pg_stat_activity b ON b.pid = h.pid
                WHERE NOT h.pid = ANY(%s::int[])""",
            ([self.conns[s].pid for s in rem], list(self.pid2s))).fetchall()
        for pid, bt in rows:
            key = ('run', f'waited for {bt}')
            self.stats[key] = self.stats.get(key, 0) + 1
            self.note(f"  S{self.pid2s[pid]} waits for a {bt}")
            if self.strict and bt == 'idempotency worker':
                # known difference 3
                raise Difference(
                    f"DIFFERENCE at seed {self.seed}, step {self.step}: S{self.pid2s[pid]} "
                    f"({self.inflight[self.pid2s[pid]].show()}) waits for the maintenance worker; "
                    "reference.md: calls on the ledgers neither wait for a run nor block it")

    def observe(self):
        obs = {}
        deadline = time.monotonic() + self.settle
        delay = 0.0002
        while True:
            for s, c in self.inflight.items():
                if s not in obs:
                    r = self.conns[s].poll()
                    if r is not None:
                        obs[s] = ('res', r, now_us())
            rem = [s for s in self.inflight if s not in obs]
            if not rem:
                return obs
            if not any(self.inflight[s].armed for s in rem) and delay >= 0.0016:
                if delay >= 0.02:
                    self.note_other_waits(rem)
                waits = self.monitor_waits([self.conns[s].pid for s in rem])
                holders = {}
                for s in rem:
                    h = self.pid2s.get(waits.get(self.conns[s].pid))
                    if h is None:
                        break
                    holders[s] = h
                else:
                    if not self.has_cycle(holders):
                        t = now_us()
                        for s in rem:
                            obs[s] = ('blk', holders[s], t)
                        return obs
            if time.monotonic() > deadline:
                raise Difference(
                    "the server did not settle within %d s: still running: %s" %
                    (self.settle, '; '.join(self.inflight[s].show() for s in rem)))
            select.select([self.conns[s].pg.socket for s in rem], [], [], delay)
            delay = min(delay * 2, 0.02)

    @staticmethod
    def has_cycle(holders):
        for s in holders:
            seen = set()
            x = s
            while x in holders:
                if x in seen:
                    return True
                seen.add(x)
                x = holders[x]
        return False

    # -- a round: send statements, observe, explain
    def round(self, calls, cancel_after=None, hold=False):
        """Sends calls (one per session) at once, then waits until the
        server is quiescent and has the model explain what it sees.  With
        cancel_after, cancels that session's statement once sent; with hold
        (the model says it waits), see hold_when_waiting."""
        t0 = now_us()
        for c in calls:
            c.step = self.step
            # its clock window starts here, however many rounds it waits
            c.sent_us = t0
            self.note(c.show(), self.touched(c))
            self.conns[c.sess].send(c.sql, c.params)
            self.inflight[c.sess] = c
        held = None
        if cancel_after is not None:
            if hold and self.late > 0 and self.late_rng.random() < self.late:
                held = self.hold_when_waiting(cancel_after)
            self.mon.execute("SELECT pg_cancel_backend(%s)", (self.conns[cancel_after].pid,))
        try:
            self.resolve(calls, t0)
        finally:
            if held is not None:
                os.kill(held, signal.SIGCONT)

    def hold_when_waiting(self, s):
        """MODEL_LATE_CANCELS: once S<s>'s statement waits for another
        session's transaction (pg_locks), stop its backend (SIGSTOP) until
        the round has been observed, as a busy machine leaves a process
        unscheduled for a while: the cancel sent next reaches a backend that
        cannot act on it yet, and the test sees the statement wait.  Returns
        the pid stopped, or None if the statement answered, or waits for
        something else than a session, instead."""
        pid = self.conns[s].pid
        pg = self.conns[s].pg
        deadline = time.monotonic() + self.settle
        delay = 0.0002
        while time.monotonic() < deadline:
            pg.consume_input()
            if not pg.is_busy():
                return None
            h = self.monitor_waits([pid]).get(pid)
            if h in self.pid2s:
                # A wait that closes a cycle is found by this backend's own
                # deadlock check only (the others in the cycle may have run
                # theirs before it began waiting): a stopped backend never
                # runs it, and the round would never settle.  Not held.
                waits = self.monitor_waits(list(self.pid2s))
                if self.has_cycle({self.pid2s[a]: self.pid2s[b]
                                   for a, b in waits.items()
                                   if a in self.pid2s and b in self.pid2s}):
                    key = ('run', 'holds left out: the wait closes a cycle')
                    self.stats[key] = self.stats.get(key, 0) + 1
                    return None
                os.kill(pid, signal.SIGSTOP)
                if self.monitor_waits([pid]).get(pid) == h:
                    self.note(f"S{s}'s backend stopped until the round is observed")
                    key = ('run', 'backends held for a cancel')
                    self.stats[key] = self.stats.get(key, 0) + 1
                    return pid
                os.kill(pid, signal.SIGCONT)
                return None
            others = self.mon.execute(
                "SELECT count(*) FROM unnest(pg_blocking_pids(%s)) AS h(pid) WHERE NOT h.pid = ANY(%s)",
                (pid, list(self.pid2s))).fetchone()[0]
            if others:
                key = ('run', 'holds left out: waits for another process')
                self.stats[key] = self.stats.get(key, 0) + 1
                return None
            select.select([pg.socket], [], [], delay)
            delay = min(delay * 2, 0.02)
        return None

    def resolve(self, newcalls, t0):
        obs = self.observe()
        for s, o in obs.items():
            t = self.touched(self.inflight[s])
            if o[0] == 'res':
                self.note(f"  S{s} -> {o[1]!r}", t)
            else:
                self.note(f"  S{s} waits for S{o[1]}", t)
        # clock windows: from just before the statement was sent (in this
        # round, or in an earlier one it has waited since) to the answer.
        # A statement that waited may have read the clock before its wait:
        # a claim takes its instant when it starts, then waits for the
        # partition it writes into if another session's open transaction
        # made it (the cassert run's seed 2, step 568: S1's claim, sent at
        # step 564, claimed at an instant 2.6 ms before the round its wait
        # ended in).
        self.windows = {}
        tnow = now_us()
        for s, c in self.inflight.items():
            o = obs[s]
            hi = o[2] if o[0] == 'res' else tnow
            lo = min(getattr(c, 'sent_us', t0), t0)
            self.windows[id(c)] = (lo - self.tol, hi + self.tol)
        # which key locks the running statements may take (for claims with
        # wait => false racing them)
        lockers = [(c.sess, k) for c in self.inflight.values() for k in c.locks]

        def contended(kid, s):
            return any(k == kid and x != s for x, k in lockers)

        failures = []
        paths = 0
        stack = [[]]
        while stack:
            forced = stack.pop()
            ch = Chooser(forced, self.win_of)
            w = self.w.clone()
            trail = []
            tags = []
            try:
                self.sim(w, ch, newcalls, obs, contended, trail, tags)
                ok = True
            except Prune as p:
                ok = False
                failures.append((len(trail), str(p), list(trail)))
            paths += 1
            if ok:
                self.w = w
                for s, o in obs.items():
                    if o[0] == 'res':
                        c = self.inflight.pop(s)
                        if o[1].ok and c.kind == 'export_keys':
                            self.exported_keys = o[1].rows
                        elif o[1].ok and c.kind == 'export_messages':
                            self.exported_msgs = o[1].rows
                # a statement that still waits keeps what may interrupt it:
                # pg_cancel_backend() only sends a signal, which the backend
                # acts on when it next runs; on a busy machine that can be
                # after the test has seen it wait in pg_locks (or the cancel
                # came before the statement was read, and was ignored)
                for tag in tags + [('clock', n) for n in ch.notes]:
                    self.stats[tag] = self.stats.get(tag, 0) + 1
                self.after_round(obs)
                return
            for i in range(len(forced), len(ch.made)):
                v, n = ch.made[i]
                for alt in range(1, n):
                    stack.append([x for x, _ in ch.made[:i]] + [alt])
            if paths > 20000:
                break
        self.report(newcalls, obs, failures)

    def sim(self, w, ch, newcalls, obs, contended, trail, tags):
        """One explanation of the round: raises Prune if it does not fit."""
        model = self.model
        runnable = list(newcalls)
        for s, b in list(w.blocked.items()):
            if b[0].armed:
                # cancelled where it waits (what it waits for has not changed)
                del w.blocked[s]
                w.conts.pop(s, None)
                runnable.append(('err', b[0], Err(b[0].armed, f"waits for S{b[1]}; cancelled")))
            elif b[0].racy and ch.pick(2) == 1:
                # a cancel sent in an earlier round, acted on only now
                del w.blocked[s]
                w.conts.pop(s, None)
                tags.append(('run', 'cancels acted on late'))
                runnable.append(('err', b[0], Err(b[0].racy, f"waits for S{b[1]}; cancelled late")))
        runnable += self.woken(w, ch)
        done = set()
        while runnable:
            i = ch.pick(len(runnable))
            c = runnable.pop(i)
            if isinstance(c, tuple) and c[0] == 'abort':
                _, s, ends = c
                trail.append(f"S{s}: its error ends {'the transaction' if ends else 'its level'}")
                if ends:
                    w.txns[s] = None
                else:
                    w.abort(s)
                runnable += self.woken(w, ch)
                continue
            if isinstance(c, tuple):
                _, c, out = c
            else:
                out = model.predict(w, c, ch, contended)
            s = c.sess
            o = obs[s]
            if out.kind == 'block':
                cyc = self.cycle(w, s, out.on)
                if cyc:
                    # a deadlock: the detector ends one of its waits (or a
                    # timeout ends this one first)
                    v = cyc[ch.pick(len(cyc))]
                    if v == s:
                        out = Err({'40P01'} | ({c.armed} if c.armed else set()),
                                  f"{out.desc}: deadlock, chosen as victim")
                    else:
                        vc = w.blocked.pop(v)[0]
                        w.conts.pop(v, None)
                        ov = obs[v]
                        trail.append(f"S{v}: deadlock victim -> error 40P01")
                        if ov[0] != 'res' or ov[1].ok or ov[1].sqlstate != '40P01':
                            raise Prune(f"S{v} ({vc.label}): model: deadlock victim (40P01); "
                                        f"server: {self.show_obs(ov)}")
                        done.add(v)
                        w.abort(v)
                        if c.armed and ch.pick(2) == 1:
                            # its own timeout fired as the deadlock was broken
                            c_err = Err({c.armed} | c.racy, f"{out.desc}; the deadlock and its timeout")
                            runnable.insert(0, ('err', c, c_err))
                        else:
                            runnable.insert(0, c)
                        runnable += self.woken(w, ch)
                        continue
                elif c.armed:
                    out = Err(c.armed, f"{out.desc}; cancelled by its timeout or a cancel")
                elif c.racy and ch.pick(2) == 1:
                    out = Err(c.racy, f"{out.desc}; cancelled")
            if out.kind in ('ok', 'err') and not out.ends and c.racy and ch.pick(2) == 1:
                out = Err(c.racy, f"{out.desc}; cancelled instead")
            t = w.txns.get(s)
            if (out.kind == 'ok' and t is not None and t.iso == 'ser'
                    and (c.kind in API_KINDS or c.kind == 'commit') and ch.pick(2) == 1):
                out = Err('40001', f"{out.desc}; a serialization failure instead",
                          ends=c.kind == 'commit')
            trail.append(f"S{s} ({c.label}): {out.desc}")
            if c.kind in API_KINDS or c.kind == 'commit':
                if out.kind == 'err':
                    tags.append((c.kind, 'error ' + (o[1].sqlstate if o[0] == 'res' and not o[1].ok else '?')))
                elif out.kind == 'block':
                    tags.append((c.kind, 'waits'))
                else:
                    tags.append((c.kind, re.sub(r'-?\d+', '#', out.desc.split(' (')[0].split(',')[0])))
            if out.kind == 'block':
                w.blocked[s] = (c, out.on, out.what, 'row')
                continue
            if o[0] != 'res':
                raise Prune(f"S{s} ({c.label}): model: {out.desc}; server: waits for S{o[1]}")
            res = o[1]
            if out.kind == 'err':
                if res.ok or res.sqlstate not in out.sqlstate:
                    raise Prune(f"S{s} ({c.label}): model: {out.desc}; server: {res!r}")
                w.conts.pop(s, None)
                # the error aborts what it must as the statement ends, after
                # what it read: another statement of the round may read its
                # transaction's rows before that (at once by default)
                runnable.insert(0, ('abort', s, out.ends))
            else:
                if not res.ok:
                    raise Prune(f"S{s} ({c.label}): model: {out.desc}; server: {res!r}")
                why = out.check(res)
                if why is not None:
                    raise Prune(f"S{s} ({c.label}): model: {out.desc}; server: {why}")
                if out.fill is not None:
                    out.fill(w, res)
            done.add(s)
            runnable += self.woken(w, ch)
        for s, o in obs.items():
            if o[0] == 'res' and s not in done:
                b = w.blocked.get(s)
                raise Prune(f"S{s} ({self.inflight[s].label}): model: still waits for S{b[1] if b else '?'}; "
                            f"server: {o[1]!r}")
        for s, b in w.blocked.items():
            o = obs[s]
            if o[0] != 'blk' or o[1] != b[1]:
                raise Prune(f"S{s} ({b[0].label}): model: waits for S{b[1]}; server: {self.show_obs(o)}")

    @staticmethod
    def show_obs(o):
        return repr(o[1]) if o[0] == 'res' else f"waits for S{o[1]}"

    def woken(self, w, ch):
        """The waiting statements that the last event lets go.  A statement
        waits for the transaction writing the row it found: it goes on when
        that transaction ends, or when the row's writer no longer has it
        (rolled back to a savepoint, or an error aborted the subtransaction
        that wrote it) -- or, as PostgreSQL waits for the topmost
        transaction once a subtransaction it waited for has committed into
        its parent (RELEASE SAVEPOINT), only when the transaction ends.  The
        contract allows both ("waits for it to end")."""
        out = []
        for s, (c, u, what, mode) in list(w.blocked.items()):
            t = w.txns.get(u)
            if t is None or t.state == 'abort':
                del w.blocked[s]
                out.append(c)
            elif mode == 'row' and not w.holds(u, what):
                if ch.pick(2) == 0:
                    del w.blocked[s]
                    out.append(c)
                else:
                    w.blocked[s] = (c, u, what, 'txn')
        return out

    @staticmethod
    def cycle(w, s, u):
        path = [s]
        x = u
        while x in w.blocked:
            if x == s:
                return path
            path.append(x)
            x = w.blocked[x][1]
        return path if x == s else None

    def after_round(self, obs):
        for s, o in obs.items():
            if o[0] == 'res' and not o[1].ok:
                self.armed[s] = False   # an error reverts the timeouts set in its level

    def report(self, newcalls, obs, failures):
        failures.sort(key=lambda f: -f[0])
        lines = [f"DIFFERENCE at seed {self.seed}, step {self.step}:"]
        for c in newcalls:
            lines.append("  sent:   " + c.show())
        for s, c in self.inflight.items():
            if c not in newcalls:
                lines.append("  before: " + c.show() + f"  (waiting since step {c.step})")
        for s, o in sorted(obs.items()):
            lines.append(f"  server: S{s} -> " + self.show_obs(o))
        seen = set()
        lines.append("  the model's explanations, and where each fails:")
        for n, why, trail in failures:
            if why in seen:
                continue
            seen.add(why)
            if trail:
                lines.append("    after " + "; ".join(trail))
            lines.append("      " + why)
            if len(seen) >= 12:
                break
        raise Difference("\n".join(lines))

    # -- statements
    def ttl_text(self, us):
        return f"{us // 1000} milliseconds"

    def pick_ttl(self, key=True):
        r = self.rng.random()
        if r < 0.3:
            return None
        return self.rng.choice([1000000, 1500000, 2000000, 3000000])

    def claim_call(self, s, kid_key=None, bad=None):
        rng = self.rng
        t = self.w.txns[s]
        scope = rng.choice(self.scopes)
        key = kid_key if kid_key is not None else self.pick_key(s)
        if isinstance(key, tuple):
            scope, key = key
        # mostly the key's own request, sometimes another (a mismatch)
        r = rng.random()
        if r < 0.25:
            req = None
        elif r < 0.85:
            req = self.reqs[int(key.rsplit('k', 1)[-1]) % len(self.reqs) if key.rsplit('k', 1)[-1].isdigit() else 0]
        else:
            req = rng.choice(self.reqs)
        ttl = self.pick_ttl()
        eff_ttl = ttl if ttl is not None else self.settings['key_ttl']
        lease = None
        if rng.random() < 0.5:
            lease = min(eff_ttl, rng.choice([100000, 250000, 500000, 1000000, 1500000]))
        wait = rng.random() < 0.5
        a = dict(key=key, scope=scope, fp=fingerprint(req) if req is not None else None,
                 ttl=ttl, lease=lease, wait=wait)
        p = {'key': key, 'request': None if req is None else json_variant(rng, req, rng.random() < 0.2, scale=True),
             'scope': scope, 'ttl': None if ttl is None else self.ttl_text(ttl),
             'lease': None if lease is None else self.ttl_text(lease), 'wait': 'true' if wait else 'false'}
        omit = set()
        if bad is None and rng.random() < 0.1:
            bad = rng.choice(['key_null', 'key_empty', 'key_long', 'scope_null', 'scope_long',
                              'ttl_zero', 'ttl_neg', 'ttl_max', 'lease_zero', 'lease_neg',
                              'lease_long', 'wait_null'])
        if bad:
            a['bad'] = {
                'key_null': ('22004', 'NULL key'), 'key_empty': ('22023', 'empty key'),
                'key_long': ('22001', 'key too long'), 'scope_null': ('22004', 'NULL scope'),
                'scope_long': ('22001', 'scope too long'), 'ttl_zero': ('22023', 'ttl 0'),
                'ttl_neg': ('22023', 'negative ttl'), 'ttl_max': ('22023', 'ttl over max_ttl'),
                'lease_zero': ('22023', 'lease 0'), 'lease_neg': ('22023', 'negative lease'),
                'lease_long': ('22023', 'lease longer than the ttl'), 'wait_null': ('22004', 'NULL wait'),
            }[bad]
            if bad == 'key_null':
                p['key'] = None
            elif bad == 'key_empty':
                p['key'] = ''
            elif bad == 'key_long':
                p['key'] = 'x' * (self.settings['max_key_length'] + 1)
            elif bad == 'scope_null':
                p['scope'] = None
            elif bad == 'scope_long':
                p['scope'] = 'é' * (self.settings['max_key_length'] // 2 + 1)
            elif bad == 'ttl_zero':
                p['ttl'] = '0 seconds'
            elif bad == 'ttl_neg':
                p['ttl'] = '-1 second'
            elif bad == 'ttl_max':
                p['ttl'] = f"{self.settings['max_ttl'] // 1000000 + 1} seconds"
            elif bad == 'lease_zero':
                p['lease'] = '0 seconds'
            elif bad == 'lease_neg':
                p['lease'] = '-2 seconds'
            elif bad == 'lease_long':
                p['lease'] = self.ttl_text(eff_ttl + 1000)
            elif bad == 'wait_null':
                p['wait'] = None
        else:
            # arguments at their defaults may be left out
            if p['request'] is None and rng.random() < 0.7:
                omit.add('request')
            if scope == '' and rng.random() < 0.7:
                omit.add('scope')
            for k in ('ttl', 'lease'):
                if p[k] is None and rng.random() < 0.7:
                    omit.add(k)
            if not wait and rng.random() < 0.7:
                omit.add('wait')
        args = ['$1::text']
        params = [p['key']]
        casts = {'request': 'jsonb', 'scope': 'text', 'ttl': 'interval', 'lease': 'interval', 'wait': 'boolean'}
        for k in ('request', 'scope', 'ttl', 'lease', 'wait'):
            if k in omit:
                continue
            params.append(p[k])
            args.append(f"{k} => ${len(params)}::{casts[k]}")
        sql = ("SELECT status, token, recovery_point, response_code, response_body::text, "
               + US.format('expires_at') + f" FROM idem_claim({', '.join(args)})")
        c = Call(s, 'claim', sql, params, **a)
        if not bad:
            c.locks = {(t.role, scope, key)}
        c.label = f"claim {scope}/{key}"
        return c

    def pick_key(self, s):
        """A (scope, key) of the session's role, often one with a history,
        now and then a committed two-phase claim (to take over)."""
        rng = self.rng
        t = self.w.txns[s]
        if rng.random() < (0.7 if self.tempo.get(s, 1) < 1 else 0.3):
            # its own keys: a slow transaction comes back to them after they expired
            own = sorted({(k[1], k[2]) for lv in t.levels for k, vs in lv.keys.items() if vs and k[0] == t.role})
            if own:
                return rng.choice(own)
        if rng.random() < 0.15:
            held = sorted((k[1], k[2]) for k, v in self.w.keys.items() if k[0] == t.role and v.st == 'p')
            if held:
                return rng.choice(held)
        if rng.random() < 0.5:
            cands = set()
            for kid in self.w.keys:
                if kid[0] == t.role:
                    cands.add((kid[1], kid[2]))
            for u, tx in self.w.txns.items():
                if tx is not None:
                    for lv in tx.levels:
                        for kid in lv.keys:
                            if kid[0] == t.role:
                                cands.add((kid[1], kid[2]))
            if cands:
                return rng.choice(sorted(cands))
        return (rng.choice(self.scopes), self.key_name())

    def act_call(self, s, op):
        rng = self.rng
        t = self.w.txns[s]
        # a key this transaction holds, or a committed two-phase claim, or any
        own = []
        held = []
        for lv in t.levels:
            for kid, vs in lv.keys.items():
                if vs and kid[0] == t.role:
                    own.append(kid)
        for kid, v in self.w.keys.items():
            if kid[0] == t.role and v.st == 'p':
                held.append(kid)
        r = rng.random()
        if own and r < 0.6:
            kid = rng.choice(sorted(set(own)))
        elif held and r < 0.85:
            kid = rng.choice(sorted(held))
        else:
            kid = (t.role,) + self.pick_key(s)
        scope, key = kid[1], kid[2]
        mine = self.w.own_key(s, kid)
        cur = mine or self.w.keys.get(kid)
        hist = sorted(self.tokens.get(kid, ()))
        token = None
        r = rng.random()
        if mine is not None and r < 0.7:
            token = None
        elif cur is not None and r < 0.85:
            token = cur.tok
        elif hist and r < 0.95:
            token = rng.choice(hist)          # often stale
        elif r < 0.97:
            token = rng.randrange(1, 1 << 62)
        a = dict(key=key, scope=scope, token=token, op=op)
        p = {'key': key, 'scope': scope, 'token': token}
        bad = None
        if rng.random() < 0.08:
            bad = rng.choice(['key_null', 'key_empty', 'key_long', 'scope_null'] +
                             (['code_null', 'code_low', 'code_high'] if op == 'complete' else []) +
                             (['rp_null', 'rp_empty', 'rp_long'] if op == 'checkpoint' else []))
            a['bad'] = {'key_null': ('22004', 'NULL key'), 'key_empty': ('22023', 'empty key'),
                        'key_long': ('22001', 'key too long'), 'scope_null': ('22004', 'NULL scope'),
                        'code_null': ('22004', 'NULL response_code'),
                        'code_low': ('22023', 'response_code 99'), 'code_high': ('22023', 'response_code 600'),
                        'rp_null': ('22004', 'NULL recovery_point'), 'rp_empty': ('22023', 'empty recovery_point'),
                        'rp_long': ('22001', 'recovery_point too long')}[bad]
            if bad.startswith('key_'):
                p['key'] = {'key_null': None, 'key_empty': '',
                            'key_long': 'k' * (self.settings['max_key_length'] + 1)}[bad]
            if bad == 'scope_null':
                p['scope'] = None
        params = [p['key']]
        args = ['$1::text']
        if op == 'complete':
            code = rng.choice([200, 201, 202, 204, 400, 402, 409, 500, 503, 100, 599])
            body = rng.choice(self.bodies)
            if bad == 'code_null':
                code = None
            elif bad == 'code_low':
                code = 99
            elif bad == 'code_high':
                code = 600
            a['code'] = code
            a['body'] = None if body is None else jsonb_text(body)
            params.append(code)
            args.append(f'${len(params)}::int')
            if body is not None or rng.random() < 0.5:
                params.append(None if body is None else json_variant(rng, body))
                args.append(f'response_body => ${len(params)}::jsonb')
        elif op == 'checkpoint':
            rp = rng.choice(['charged', 'shipped', 'step-3', 'p' + str(rng.randrange(100))])
            if bad == 'rp_null':
                rp = None
            elif bad == 'rp_empty':
                rp = ''
            elif bad == 'rp_long':
                rp = 'r' * (self.settings['max_key_length'] + 1)
            a['rp'] = rp
            params.append(rp)
            args.append(f'${len(params)}::text')
        if p['scope'] != '' or rng.random() < 0.4:
            params.append(p['scope'])
            args.append(f'scope => ${len(params)}::text')
        if token is not None or rng.random() < 0.3:
            params.append(token)
            args.append(f'token => ${len(params)}::bigint')
        sql = f"SELECT idem_{op}({', '.join(args)})"
        c = Call(s, op, sql, params, **a)
        if not bad:
            c.locks = {kid}
        c.label = f"{op} {scope}/{key}"
        return c

    def lookup_call(self, s):
        rng = self.rng
        scope, key = self.pick_key(s)
        a = dict(key=key, scope=scope)
        p = [key, scope]
        if rng.random() < 0.05:
            bad = rng.choice(['key_null', 'key_empty', 'scope_null', 'scope_long'])
            a['bad'] = {'key_null': ('22004', 'NULL key'), 'key_empty': ('22023', 'empty key'),
                        'scope_null': ('22004', 'NULL scope'), 'scope_long': ('22001', 'scope too long')}[bad]
            p = {'key_null': [None, scope], 'key_empty': ['', scope], 'scope_null': [key, None],
                 'scope_long': [key, 's' * (self.settings['max_key_length'] + 1)]}[bad]
        cols = ("status, token, recovery_point, response_code, response_body::text, "
                + US.format('claimed_at') + ', ' + US.format('expires_at') + ', '
                + US.format('lease_expires_at'))
        if p[1] == '' and rng.random() < 0.5:
            sql = f"SELECT {cols} FROM idem_lookup($1::text)"
            p = p[:1]
        else:
            sql = f"SELECT {cols} FROM idem_lookup($1::text, $2::text)"
        c = Call(s, 'lookup', sql, p, **a)
        c.label = f"lookup {scope}/{key}"
        return c

    def consume_call(self, s):
        rng = self.rng
        co = rng.choice(self.consumers)
        i = self.msg_id()
        ttl = self.pick_ttl()
        a = dict(consumer=co, id=i, ttl=ttl)
        p = [co, i, None if ttl is None else self.ttl_text(ttl)]
        if rng.random() < 0.07:
            bad = rng.choice(['co_null', 'co_empty', 'co_long', 'id_null', 'id_empty', 'id_long',
                              'ttl_zero', 'ttl_max'])
            a['bad'] = {'co_null': ('22004', 'NULL consumer'), 'co_empty': ('22023', 'empty consumer'),
                        'co_long': ('22001', 'consumer too long'), 'id_null': ('22004', 'NULL id'),
                        'id_empty': ('22023', 'empty id'), 'id_long': ('22001', 'id too long'),
                        'ttl_zero': ('22023', 'ttl 0'), 'ttl_max': ('22023', 'ttl over max_ttl')}[bad]
            L = self.settings['max_key_length'] + 1
            p = {'co_null': [None, i, p[2]], 'co_empty': ['', i, p[2]], 'co_long': ['c' * L, i, p[2]],
                 'id_null': [co, None, p[2]], 'id_empty': [co, '', p[2]], 'id_long': [co, 'i' * L, p[2]],
                 'ttl_zero': [co, i, '0 ms'],
                 'ttl_max': [co, i, f"{self.settings['max_ttl'] // 1000000 + 1} seconds"]}[bad]
        if p[2] is None and rng.random() < 0.6:
            p = p[:2]
        return self.consume_of(s, p, **a)

    def consume_of(self, s, p, **a):
        """A call of idem_consume_message() with parameters p: [consumer,
        id] (two arguments), or [consumer, id, ttl text] (ttl => NULL when
        the text is None); a: what the model is told (consumer, id, ttl,
        bad)."""
        if len(p) == 2:
            sql = "SELECT idem_consume_message($1::text, $2::text)"
        else:
            sql = "SELECT idem_consume_message($1::text, $2::text, ttl => $3::interval)"
        c = Call(s, 'consume', sql, p, **a)
        c.label = f"consume {a['consumer']}/{a['id']}"
        return c

    def batch_call(self, s):
        rng = self.rng
        co = rng.choice(self.consumers)
        n = rng.choice([0, 1, 2, 3, 3, 4, 5])
        ids = [self.msg_id() for _ in range(n)]
        ttl = self.pick_ttl()
        a = dict(consumer=co, ids=ids, ttl=ttl)
        arr = '{' + ','.join(json.dumps(i) for i in ids) + '}'
        p = [co, arr, None if ttl is None else self.ttl_text(ttl)]
        if rng.random() < 0.07:
            bad = rng.choice(['co_null', 'arr_null', 'elem_null', 'elem_empty', 'elem_long', '2d', 'ttl_neg'])
            a['bad'] = {'co_null': ('22004', 'NULL consumer'), 'arr_null': ('22004', 'NULL array'),
                        'elem_null': ('22004', 'NULL element'), 'elem_empty': ('22023', 'empty element'),
                        'elem_long': ('22001', 'element too long'), '2d': ('2202E', 'two dimensions'),
                        'ttl_neg': ('22023', 'negative ttl')}[bad]
            L = self.settings['max_key_length'] + 1
            if bad == 'co_null':
                p[0] = None
            elif bad == 'arr_null':
                p[1] = None
            elif bad == 'elem_null':
                p[1] = '{' + ','.join([json.dumps(i) for i in ids] + ['NULL']) + '}'
            elif bad == 'elem_empty':
                p[1] = '{' + ','.join(['""'] + [json.dumps(i) for i in ids]) + '}'
            elif bad == 'elem_long':
                p[1] = '{' + ','.join([json.dumps(i) for i in ids] + ['x' * L]) + '}'
            elif bad == '2d':
                p[1] = '{{m0,m1},{m2,m3}}'
            elif bad == 'ttl_neg':
                p[2] = '-1 s'
        if p[2] is None and rng.random() < 0.6:
            sql = "SELECT m FROM idem_consume_messages($1::text, $2::text[]) AS t(m)"
            p = p[:2]
        else:
            sql = "SELECT m FROM idem_consume_messages($1::text, $2::text[], ttl => $3::interval) AS t(m)"
        c = Call(s, 'batch', sql, p, **a)
        c.label = f"batch {co}/{ids}"
        return c

    def export_call(self, s, messages):
        rng = self.rng
        pool = self.consumers if messages else self.scopes
        r = rng.random()
        if r < 0.3:
            names = None
        elif r < 0.4:
            names = []
        else:
            names = rng.sample(pool, rng.choice([1, len(pool)]))
            if rng.random() < 0.2:
                names = names + names[:1]
        a = dict(scopes=None if names is None else set(names))
        p = [None if names is None else '{' + ','.join(json.dumps(x) for x in names) + '}']
        if rng.random() < 0.06:
            bad = rng.choice(['elem_null', '2d', 'elem_long'])
            a['bad'] = {'elem_null': ('22004', 'NULL element'), '2d': ('2202E', 'two dimensions'),
                        'elem_long': ('22001', 'name too long')}[bad]
            p = [{'elem_null': '{a,NULL}', '2d': '{{a},{b}}',
                  'elem_long': '{' + 'n' * (self.settings['max_key_length'] + 1) + '}'}[bad]]
        if messages:
            sql = ("SELECT role, digest::text, " + US.format('expires_at')
                   + " FROM idempotency.export_messages($1::text[])")
            c = Call(s, 'export_messages', sql, p, **a)
        else:
            sql = ("SELECT role, digest::text, " + US.format('expires_at') + ", status, token, "
                   + US.format('claimed_at') + ", " + US.format('lease_expires_at')
                   + ", encode(fingerprint, 'hex'), recovery_point, response_code, response_body::text"
                   + self.extra_nulls() + " FROM idempotency.export_keys($1::text[])")
            c = Call(s, 'export_keys', sql, p, **a)
        c.label = c.kind + (f" {sorted(names)}" if names is not None else ' all')
        if p[0] is None and rng.random() < 0.5 and 'bad' not in a:
            c.sql = c.sql.replace('($1::text[])', '()')
            c.params = []
        return c

    def extra_nulls(self):
        """A last column counting the non-NULL columns of key_record beyond
        the v1 ones, which stay NULL for what this test writes."""
        if not self.key_extra:
            return ''
        return ", num_nonnulls(" + ', '.join(n for n, _ in self.key_extra) + ")"

    KEY_IMPORT = ("SELECT idempotency.import_key(ROW($1::name, $2::uuid, $3::timestamptz, $4::text, "
                  "$5::bigint, $6::timestamptz, $7::timestamptz, decode($8, 'hex'), $9::text, $10::int, "
                  "$11::jsonb{extra}){cast})")

    def import_key_call(self, s):
        """import_key() of a record the last export gave (as it was, or
        changed), or of one made up for a key of the run; now and then a
        record with one bad field."""
        rng = self.rng
        now = now_us()
        cur_tok = now - PG_EPOCH_US
        recs = [r for r in self.exported_keys if r[1] in self.model.u]
        num = lambda x: None if x is None else int(x)
        if recs and rng.random() < 0.5:
            e = rng.choice(recs)
            f = dict(role=e[0], digest=e[1], exp=num(e[2]), status=e[3], token=num(e[4]),
                     cat=num(e[5]), lease=num(e[6]), fp=e[7], rp=e[8], code=num(e[9]), body=e[10])
            m = rng.random()
            if m < 0.35:
                pass                                    # as exported
            elif m < 0.55:
                f['token'] += rng.choice([1, 1000, 250000])
            elif m < 0.65 and f['status'] == 'in_progress':
                f.update(status='completed', lease=None, code=200, body=jsonb_text({"imported": True}))
            elif m < 0.75 and f['status'] == 'in_progress':
                f.update(status='released', lease=None)
            elif m < 0.85 and f['status'] == 'in_progress':
                f['rp'] = 'moved'
            else:
                f['exp'] = now - rng.choice([1, 500000])
                if f['lease'] is not None:
                    f['lease'] = min(f['lease'], f['exp'])
        else:
            scope = rng.choice(self.scopes)
            key = self.key_name()
            exp = now + rng.choice([800000, 1500000, 2500000])
            st = rng.choice(['in_progress', 'completed', 'released'])
            req = rng.choice([None] + self.reqs)
            f = dict(role=rng.choice(self.roles), digest=digest(scope, key), exp=exp, status=st,
                     token=cur_tok - rng.randrange(0, 300000) if rng.random() < 0.95
                     else cur_tok + rng.randrange(1000000, 5000000),   # a clock ahead of ours
                     cat=now - rng.randrange(0, 500000),
                     lease=(now + rng.choice([200000, 700000])) if st == 'in_progress' else None,
                     fp=None if req is None else fingerprint(req),
                     rp=rng.choice([None, 'imported-rp']),
                     code=rng.choice([201, 409]) if st == 'completed' else None,
                     body=jsonb_text(rng.choice(self.bodies[1:])) if st == 'completed' else None)
            if rng.random() < 0.1:
                f['exp'] = now - 1000
                if f['lease'] is not None:
                    f['lease'] = f['exp'] - 1000
            if rng.random() < 0.03:
                # the largest token there is: no claim can take the key over
                f['token'] = self.model.MAX_TOKEN
        cast = rng.choice(['::idempotency.key_record', ''])
        extra = ''.join(f", NULL::{t}" for _, t in self.key_extra) if cast or rng.random() < 0.5 else ''
        sql = self.KEY_IMPORT.format(cast=cast, extra=extra)
        bad = None
        if rng.random() < 0.15:
            bad = rng.choice(['role_null', 'role_unknown', 'digest_null', 'exp_null', 'status_null',
                              'token_null', 'cat_null', 'status_bad', 'token_zero', 'token_max',
                              'exp_far', 'code_null', 'code_bad', 'resp_not_completed',
                              'lease_not_in_progress', 'fp_len', 'rp_long', 'no_lease',
                              'lease_late', 'types'])
            if bad == 'role_null':
                f['role'] = None
            elif bad == 'role_unknown':
                f['role'] = 'no_such_role_here'
            elif bad in ('digest_null', 'exp_null', 'status_null', 'token_null', 'cat_null'):
                f[{'digest_null': 'digest', 'exp_null': 'exp', 'status_null': 'status',
                   'token_null': 'token', 'cat_null': 'cat'}[bad]] = None
            elif bad == 'status_bad':
                f['status'] = 'done'
            elif bad == 'token_zero':
                f['token'] = rng.choice([0, -7])
            elif bad == 'token_max':
                f['token'] = self.model.MAX_TOKEN + 1
            elif bad == 'exp_far':
                f['exp'] = now + self.settings['max_ttl'] + 86400 * 1000000
            elif bad in ('code_null', 'code_bad'):
                f.update(status='completed', lease=None, body=None,
                         code=None if bad == 'code_null' else rng.choice([99, 600]))
            elif bad == 'resp_not_completed':
                f.update(status='released', lease=None, code=200)
            elif bad == 'lease_not_in_progress':
                f.update(status='released', code=None, body=None, lease=now + 100000)
            elif bad == 'fp_len':
                f['fp'] = 'abcdef'
            elif bad == 'rp_long':
                f['rp'] = 'r' * (self.settings['max_key_length'] + 1)
            elif bad == 'no_lease':
                f.update(status='in_progress', code=None, body=None, lease=None)
            elif bad == 'lease_late':
                if f['exp'] is not None and f['exp'] > now:
                    f.update(status='in_progress', code=None, body=None, lease=f['exp'] + 1000)
            elif bad == 'types':
                sql = sql.replace('$2::uuid', '$2::text').replace('::idempotency.key_record', '')
                f['types'] = True
        dg = f['digest'] if f['digest'] is not None else digest(rng.choice(self.scopes), self.key_name())
        kid = ((f['role'],) + self.model.u[dg][1:]) if dg in self.model.u else None
        ts = lambda us: None if us is None else us_to_ts(us)
        p = [f['role'], f['digest'], ts(f['exp']), f['status'], f['token'], ts(f['cat']),
             ts(f['lease']), f['fp'], f['rp'], f['code'], f['body']]
        c = Call(s, 'import_key', sql, p, kid=kid, fields=f)
        if kid is not None and not bad:
            c.locks = {kid}
        c.label = f"import_key {kid}" + (f" [{bad}]" if bad else '')
        return c

    def import_msg_call(self, s):
        rng = self.rng
        now = now_us()
        recs = [r for r in self.exported_msgs if r[1] in self.model.u]
        if recs and rng.random() < 0.5:
            e = rng.choice(recs)
            f = dict(role=e[0], digest=e[1], exp=int(e[2]))
            if rng.random() < 0.2:
                f['exp'] = now - 1000
        else:
            co = rng.choice(self.consumers)
            i = self.msg_id()
            f = dict(role=rng.choice(self.roles), digest=digest(co, i),
                     exp=now + rng.choice([300000, 1000000, 2500000, -5000]))
        dg = f['digest']
        mid = (f['role'],) + self.model.u[dg][1:]
        sql = ("SELECT idempotency.import_message(ROW($1::name, $2::uuid, $3::timestamptz"
               + ''.join(f", NULL::{t}" for _, t in self.msg_extra) + ")"
               + rng.choice(['::idempotency.message_record', '']) + ")")
        bad = None
        if rng.random() < 0.12:
            bad = rng.choice(['role_null', 'role_unknown', 'digest_null', 'exp_null', 'exp_far', 'types'])
            if bad == 'role_null':
                f['role'] = None
            elif bad == 'role_unknown':
                f['role'] = 'nobody_at_all'
            elif bad == 'digest_null':
                f['digest'] = None
            elif bad == 'exp_null':
                f['exp'] = None
            elif bad == 'exp_far':
                f['exp'] = now + self.settings['max_ttl'] + 86400 * 1000000
            else:
                sql = "SELECT idempotency.import_message(ROW($1::name, $2::uuid, $3::timestamptz, 1))"
                f['types'] = True
        p = [f['role'], f['digest'], None if f['exp'] is None else us_to_ts(f['exp'])]
        c = Call(s, 'import_message', sql, p, mid=mid, fields=f)
        c.label = f"import_message {mid}" + (f" [{bad}]" if bad else '')
        return c

    # -- choosing what to do
    def api_call(self, s):
        """A random call of the API (or a transaction control statement)
        for active session s."""
        rng = self.rng
        t = self.w.txns[s]
        su = t.role == self.superuser
        choices = [('claim', 30), ('complete', 12), ('checkpoint', 4), ('release', 6),
                   ('lookup', 7), ('consume', 12), ('batch', 6),
                   ('export_keys', 3 if su else 0.3), ('export_messages', 2 if su else 0.3),
                   ('import_key', 5 if su else 0.3), ('import_message', 3 if su else 0.2)]
        kind = rng.choices([k for k, _ in choices], [w for _, w in choices])[0]
        if kind == 'claim':
            return self.claim_call(s)
        if kind in ('complete', 'checkpoint', 'release'):
            return self.act_call(s, kind)
        if kind == 'lookup':
            return self.lookup_call(s)
        if kind == 'consume':
            return self.consume_call(s)
        if kind == 'batch':
            return self.batch_call(s)
        if kind == 'export_keys':
            if t.iso != 'rc' and not self.strict and any(lv.keys for lv in t.levels):
                # known difference 1 (see the header): not unless MODEL_STRICT
                return self.lookup_call(s)
            return self.export_call(s, False)
        if kind == 'export_messages':
            return self.export_call(s, True)
        if kind == 'import_key':
            return self.import_key_call(s)
        return self.import_msg_call(s)

    def would_block(self, c):
        """Does the model say c waits (taking the first of every choice)?"""
        w = self.w.clone()
        self.windows = {id(c): (now_us() - self.tol, now_us() + self.tol)}
        try:
            out = self.model.predict(w, c, Chooser([], self.win_of), lambda kid, s: False)
        except Exception:
            return None
        return out.on if out.kind == 'block' else None

    def ctl(self, s, kind, sql, **a):
        c = Call(s, kind, sql, **a)
        c.label = sql
        return c

    def begin_calls(self, s):
        rng = self.rng
        r = rng.random()
        iso = 'rr' if r < 0.2 else ('ser' if r < 0.3 else 'rc')
        ro = rng.random() < 0.05
        sql = "BEGIN ISOLATION LEVEL " + {'rr': "REPEATABLE READ", 'ser': "SERIALIZABLE",
                                          'rc': "READ COMMITTED"}[iso]
        if ro:
            sql += " READ ONLY"
        out = [self.ctl(s, 'begin', sql, iso=iso, ro=ro)]
        if rng.random() < 0.3:
            out.append(self.ctl(s, 'setrole', f"SET LOCAL ROLE {ALT_ROLE}", role=ALT_ROLE))
        if iso != 'rc':
            out.append(self.ctl(s, 'snap', "SELECT 1"))
        return out

    def session_step(self, s):
        """The next statement(s) for session s, each sent in a round of its own."""
        rng = self.rng
        t = self.w.txns[s]
        if s in self.inflight:
            # waiting: sometimes cancel it
            c = self.inflight[s]
            if rng.random() < 0.3:
                self.note(f"pg_cancel_backend(S{s})")
                c.armed = '57014'
                self.mon.execute("SELECT pg_cancel_backend(%s)", (self.conns[s].pid,))
                self.resolve([], now_us())
            return
        if t is None:
            for c in self.begin_calls(s):
                if self.w.txns.get(s) is None and c.kind != 'begin':
                    break
                self.round([c])
            return
        if t.state != 'ok':
            # recover from an error: roll back to a savepoint or all of it
            names = [lv.name for lv in t.levels if lv.name is not None]
            if names and rng.random() < 0.8:
                name = names[-1] if rng.random() < 0.7 else rng.choice(names)
                self.round([self.ctl(s, 'rollback_to', f"ROLLBACK TO SAVEPOINT {name}", name=name)])
            else:
                self.round([self.ctl(s, 'rollback', "ROLLBACK")])
            return
        nops = sum(len(lv.keys) + len(lv.msgs) for lv in t.levels)
        r = rng.random()
        unresolved = self.w.unresolved(s)
        slow = self.tempo.get(s, 1) < 1      # a slow session keeps its transaction open
        if r < (0.04 + 0.03 * nops) * (0.2 if slow else 1):
            # end the transaction (resolve same-transaction claims first, mostly)
            if unresolved is not None and rng.random() < 0.85:
                c = self.act_call(s, rng.choice(['complete', 'complete', 'release']))
                self.round([c])
                return
            if rng.random() < 0.8:
                self.round([self.ctl(s, 'commit', "COMMIT")])
            else:
                self.round([self.ctl(s, 'rollback', "ROLLBACK")])
            return
        if r < 0.10 + 0.03 * nops:
            names = [lv.name for lv in t.levels if lv.name is not None]
            q = rng.random()
            if q < 0.5 or not names:
                name = f"sp{t.sp + 1}"
                self.round([self.ctl(s, 'savepoint', f"SAVEPOINT {name}", name=name)])
            elif q < 0.8:
                name = rng.choice(names)
                self.round([self.ctl(s, 'rollback_to', f"ROLLBACK TO SAVEPOINT {name}", name=name)])
            else:
                name = rng.choice(names)
                self.round([self.ctl(s, 'release_sp', f"RELEASE SAVEPOINT {name}", name=name)])
            return
        c = self.api_call(s)
        blocker = self.would_block(c)
        if blocker is not None:
            # avoid piling every session up behind one, mostly
            if len(self.inflight) >= len(self.sess) - 1 and rng.random() < 0.7:
                return
            q = rng.random()
            if q < 0.15:
                self.timeout_round(c, 'statement_timeout', '57014')
                return
            if q < 0.25:
                self.timeout_round(c, 'lock_timeout', '55P03')
                return
        q = rng.random()
        if q < 0.03:
            c.racy = {'57014'}
            self.round([c], cancel_after=s, hold=blocker is not None)
            return
        if q < 0.05:
            self.timeout_round(c, 'statement_timeout', None, ms=rng.choice([1, 2, 3]))
            return
        self.round([c])

    def timeout_round(self, c, guc, sqlstate, ms=None):
        """c under a short statement_timeout or lock_timeout: if it waits it
        must fail with sqlstate; a timeout of a few ms may interrupt it
        anyway (and the SET statements around it)."""
        s = c.sess
        ms = ms or self.rng.choice([30, 60, 120])
        self.round([self.ctl(s, 'set', f"SET {guc} = '{ms}ms'")])
        if self.w.txns[s] is None or self.w.txns[s].state != 'ok':
            return
        self.armed[s] = True
        c.armed = sqlstate or '57014'
        c.racy = {sqlstate or '57014'}
        self.round([c])
        if s in self.inflight or self.w.txns[s] is None or self.w.txns[s].state != 'ok':
            return
        r = self.ctl(s, 'set', f"SET {guc} = 0")
        r.racy = {'57014'} if guc == 'statement_timeout' else set()
        self.round([r])
        self.armed[s] = False

    def race_round(self):
        """One statement for each of 2 or 3 active sessions, sent at once,
        mostly on the same key or message id."""
        rng = self.rng
        act = [s for s in self.sess if s not in self.inflight and self.w.txns[s] is not None
               and self.w.txns[s].state == 'ok']
        if len(act) < 2:
            return False
        group = rng.sample(act, rng.choice([2, 3]) if len(act) >= 3 else 2)
        calls = []
        focus = None
        for s in group:
            q = rng.random()
            if q < 0.1:
                calls.append(self.ctl(s, 'commit', "COMMIT") if self.w.unresolved(s) is None
                             else self.act_call(s, 'release'))
                continue
            if q < 0.65:
                t = self.w.txns[s]
                if focus is None or focus[0] != t.role:
                    focus = (t.role,) + self.pick_key(s)
                if rng.random() < 0.6:
                    c = self.claim_call(s, kid_key=(focus[1], focus[2]))
                else:
                    c = self.act_call(s, rng.choice(['complete', 'release', 'checkpoint']))
                if rng.random() < 0.5 and c.kind == 'claim' and 'bad' not in c.a:
                    pass
                calls.append(c)
                continue
            calls.append(self.api_call(s))
        self.note("race: " + ", ".join(f"S{c.sess}" for c in calls))
        self.stats[('run', 'races')] = self.stats.get(('run', 'races'), 0) + 1
        self.round(calls)
        return True

    def audit(self):
        """The monitor exports every live key and id: the committed state."""
        t0 = now_us()
        krows = self.mon.execute(
            "SELECT role::text, digest::text, " + US.format('expires_at') + ", status, token, "
            + US.format('claimed_at') + ", " + US.format('lease_expires_at')
            + ", encode(fingerprint, 'hex'), recovery_point, response_code, response_body::text"
            + self.extra_nulls() + " FROM idempotency.export_keys()").fetchall()
        mrows = self.mon.execute(
            "SELECT role::text, digest::text, " + US.format('expires_at')
            + " FROM idempotency.export_messages()").fetchall()
        t1 = now_us()
        lo, hi = t0 - self.tol, t1 + self.tol
        sk = lambda v: None if v is None else str(v)
        req, opt = {}, {}
        for kid, v in self.w.keys.items():
            if v.exp <= lo:
                continue
            st = {'p': 'in_progress', 'c': 'completed', 'r': 'released'}[v.st]
            row = (kid[0], digest(kid[1], kid[2]), str(v.exp), st, str(v.tok), str(v.cat),
                   sk(v.lease), v.fp, v.rp, sk(v.code), v.body) + (('0',) if self.key_extra else ())
            (req if v.exp > hi else opt)[row[1] + '/' + row[0]] = row
        got = Res(True, rows=[tuple(sk(x) for x in r) for r in krows])
        why = self.model.check_export(got, req, opt)
        if why:
            raise Difference(f"DIFFERENCE at seed {self.seed}, step {self.step}: audit of the "
                             f"committed keys (export_keys() by the monitor): {why}")
        reqm, optm, where = {}, {}, {}
        for mid, iv in self.w.msgs.items():
            if iv[1] <= lo:
                continue
            k = digest(mid[1], mid[2]) + '/' + mid[0]
            (reqm if iv[0] > hi else optm)[k] = (mid[0], digest(mid[1], mid[2]), iv)
            where[k] = mid

        def pin(r, want):
            e = int(r[2])
            if not (want[2][0] <= e <= want[2][1]):
                return f"row {r} ({self.model.u.get(r[1])}), model expiry in {want[2]}"
            return None
        got = Res(True, rows=[tuple(sk(x) for x in r) for r in mrows])
        why = self.model.check_export(got, reqm, optm, pin)
        if why:
            raise Difference(f"DIFFERENCE at seed {self.seed}, step {self.step}: audit of the "
                             f"committed message ids (export_messages() by the monitor): {why}")
        for r in got.rows:
            k = r[1] + '/' + r[0]
            if k in where:
                e = int(r[2])
                self.w.msgs[where[k]] = (e, e)
        self.note(f"audit: {len(krows)} keys, {len(mrows)} message ids as the model has them")
        self.stats[('run', 'audits')] = self.stats.get(('run', 'audits'), 0) + 1

    # -- the run
    def run(self):
        rng = self.rng
        t_start = time.monotonic()
        self.tokens = {}
        self.tempo_until = 0
        while self.step < self.steps:
            self.step += 1
            self.learn()
            q = rng.random()
            if q < 0.12:
                if self.race_round():
                    continue
            if q > 0.985:
                self.audit()
                continue
            if q > 0.98:
                self.mon.execute("SELECT * FROM idem_maintain()")
                self.note("idem_maintain() by the monitor")
                continue
            # favour what ends waits: the sessions others wait for; a slow
            # session keeps its transaction open for seconds
            if time.monotonic() >= self.tempo_until:
                self.tempo = {s: rng.choice([1, 1, 1, 0.005]) for s in self.sess}
                self.tempo_until = time.monotonic() + 2.5
            blockers = {b[1] for b in self.w.blocked.values()}
            cands = [s for s in self.sess]
            weights = [(3 if s in blockers else 1) * self.tempo[s] if s not in self.inflight else 0.5
                       for s in cands]
            s = rng.choices(cands, weights)[0]
            self.session_step(s)
        self.finish()
        return time.monotonic() - t_start

    def late_cancel(self):
        """--scenario late-cancel: a cancel that the waiting statement's
        backend acts on only after the test has seen it wait, every time
        (seed 1's step 7211 in a CI run on a busy machine).  S3 claims a key
        in its transaction; S2 claims it with wait => true and is cancelled
        once it waits for S3, its backend held (see hold_when_waiting) until
        the round has been observed; S3 then rolls back.  S2 must answer
        57014, which the model must explain."""
        t_start = time.monotonic()
        self.late = 1.0
        key = self.fixed_key('late')
        holder, waiter = self.sess[-1], self.sess[-2]
        for s in (holder, waiter):
            self.fixed_step([self.fixed_begin(s)])
        self.fixed_step([self.fixed_claim(holder, key, False)])
        c = self.fixed_claim(waiter, key, True)
        c.racy = {'57014'}
        self.fixed_step([c], cancel_after=waiter, hold=True)
        if waiter not in self.inflight or not self.stats.get(('run', 'backends held for a cancel')):
            raise Difference(f"late-cancel scenario: S{waiter}'s claim did not wait for S{holder} "
                             "with its backend held")
        self.fixed_step([self.ctl(holder, 'rollback', "ROLLBACK")])
        if waiter in self.inflight or self.answered(waiter) != '57014':
            raise Difference(f"late-cancel scenario: S{waiter} did not answer 57014 once S{holder} "
                             "rolled back")
        self.finish()
        return time.monotonic() - t_start

    def late_cancel_cycle(self, tries=5):
        """--scenario late-cancel-cycle: the wait of the statement to be held
        (see hold_when_waiting) closes a cycle of waits (seed 1's step 5481
        in a newcomer's run on PostgreSQL 17).  S3 claims key a and S2 key b
        in their transactions; S3 claims b with wait => true and waits for
        S2, and its deadlock check runs (once, deadlock_timeout after its
        wait began: there is nothing to observe, so the scenario lets that
        time pass); then S2 claims a with wait => true and is cancelled.
        Its wait closes the cycle, which only S2's own deadlock check can
        find: held, S2 never runs it and the round never settles.  It must
        not be held, and the round must settle.  Whether the test sees S2's
        wait before the cancel acts depends on the machine (on a busy one
        the cancel can come first, or S2 can wait a moment for a process
        of the server's own, a partition maker): repeated with new keys
        until it has, every answer checked against the model all the same."""
        t_start = time.monotonic()
        self.late = 1.0
        first, second = self.sess[-1], self.sess[-2]
        cycle = ('run', 'holds left out: the wait closes a cycle')
        timeout = self.mon.execute(
            "SELECT setting::float8 / 1000 FROM pg_settings WHERE name = 'deadlock_timeout'").fetchone()[0]
        for n in range(tries):
            suffix = '' if n == 0 else f'-{n}'
            ka = self.fixed_key('cycle-a' + suffix)
            kb = self.fixed_key('cycle-b' + suffix)
            for s in (first, second):
                self.fixed_step([self.fixed_begin(s)])
            self.fixed_step([self.fixed_claim(first, ka, False)])
            self.fixed_step([self.fixed_claim(second, kb, False)])
            self.fixed_step([self.fixed_claim(first, kb, True)])
            if first not in self.inflight:
                raise Difference(f"late-cancel-cycle scenario: S{first}'s claim did not wait for S{second}")
            time.sleep(2 * timeout + 0.5)
            c = self.fixed_claim(second, ka, True)
            c.racy = {'57014'}
            before = self.stats.get(cycle, 0)
            self.fixed_step([c], cancel_after=second, hold=True)
            seen = self.stats.get(cycle, 0) > before
            self.finish()
            if seen:
                self.stats[('run', 'tries until the wait was seen closing a cycle')] = n + 1
                return time.monotonic() - t_start
        raise Difference(f"late-cancel-cycle scenario: in {tries} tries, S{second}'s claim was never "
                         "seen closing a cycle of waits (or was held)")

    def concurrent_errors(self, tries=1000):
        """--scenario concurrent-errors: two transactions each claim a key,
        then each releases the other's key, both at once: 55006 (held by
        another transaction), an error that aborts the transaction.  When
        the two statements overlap, each reads the other's row before either
        aborts, and both answer 55006 (seed 2 met it at step 5467 in a run on
        PostgreSQL 15 with MODEL_LATE_CANCELS=1; the model then took the first
        error's abort as immediate).
        Repeated, with new keys, until that has happened."""
        t_start = time.monotonic()
        a, b = self.sess[0], self.sess[1]
        for n in range(tries):
            keys = {a: self.fixed_key(f'ce{n}a'), b: self.fixed_key(f'ce{n}b')}
            for s in (a, b):
                self.fixed_step([self.fixed_begin(s)])
            for s in (a, b):
                self.fixed_step([self.fixed_claim(s, keys[s], False)])
            self.fixed_step([self.fixed_act(a, 'release', keys[b], 1),
                             self.fixed_act(b, 'release', keys[a], 1)])
            both = self.answered(a) == '55006' and self.answered(b) == '55006'
            for s in (a, b):
                self.fixed_step([self.ctl(s, 'rollback', "ROLLBACK")])
            if both:
                self.stats[('run', 'tries until both answered 55006')] = n + 1
                self.finish()
                return time.monotonic() - t_start
        # Whether the two statements overlap depends on the machine's
        # timing, not on the server: every answer of the tries was checked
        # against the model all the same.  Said, not failed.
        self.stats[('run', f'the two releases never both answered 55006 in {tries} tries')] = 1
        self.finish()
        return time.monotonic() - t_start

    def batch_expiry_wait(self):
        """--scenario batch-expiry-wait: a batch that waits may have found an
        id expired before its wait (seed 3's step 6328 in a newcomer's run on
        PostgreSQL 18).  S3 consumes x with a ttl of 1 s and commits; S2
        consumes y in its transaction; once x's expiry has surely passed on
        the server's clock, S3's batch [x, y] (x's digest sorts first) finds
        x expired, records it, and waits for S2, which rolls back: S3 answers
        x and y.  With the clock tolerance widened to 400 ms for this
        scenario, x's expiry lies in the window of the round the batch waited
        in, as it did in that run: the model must accept x as new."""
        t_start = time.monotonic()
        self.tol = 400_000
        co = self.consumers[0]
        names = {}
        for n in range(64):
            i = f'{self.tag}/bx{n}'
            self.universe.setdefault(digest(co, i), ('m', co, i))
            names[i] = uuid.UUID(digest(co, i)).bytes
        ranked = sorted(names, key=names.get)
        x, y = ranked[0], ranked[-1]
        s3, s2 = self.sess[-1], self.sess[-2]
        ttl = 1_000_000
        self.fixed_step([self.fixed_begin(s3)])
        self.fixed_step([self.fixed_consume(s3, co, x, ttl)])
        self.fixed_step([self.ctl(s3, 'commit', "COMMIT")])
        # the server's expiry of x lies before this instant: the consume ran
        # before its answer was observed, and the commit after it
        passed = now_us() + ttl + 100_000
        for s in (s2, s3):
            self.fixed_step([self.fixed_begin(s)])
        self.fixed_step([self.fixed_consume(s2, co, y, None)])
        wait = (passed - now_us()) / 1e6
        if wait > 0:
            time.sleep(wait)
        self.fixed_step([self.fixed_batch(s3, co, [x, y])])
        if s3 not in self.inflight:
            raise Difference(f"batch-expiry-wait scenario: S{s3}'s batch did not wait for S{s2}")
        self.fixed_step([self.ctl(s2, 'rollback', "ROLLBACK")])
        got = self.answer_text(s3)
        if got is None or repr(x) not in got or repr(y) not in got:
            raise Difference(f"batch-expiry-wait scenario: S{s3}'s batch answered {got}, "
                             f"not both {x} and {y}")
        self.fixed_step([self.ctl(s3, 'commit', "COMMIT")])
        self.finish()
        return time.monotonic() - t_start

    def import_over_memory(self):
        """--scenario import-over-memory (idempotency.key_memory on): a key
        that ran, expired and is remembered, then imported in progress and
        released, stays remembered once the import has expired too (seed 1
        with key_memory, step 7834 of a CI run on PostgreSQL 17: the model
        took the released import for the key's only version and expected
        "claimed").  S1 claims and completes the key; once it has expired,
        S1's claim answers "expired"; S2 imports it in progress and releases
        it; once that has expired, S1's claim and lookup answer "expired",
        and again after a maintenance run (the ended partitions dropped into
        the memory)."""
        t_start = time.monotonic()
        if not self.model.memory:
            raise RuntimeError("--scenario import-over-memory needs idempotency.key_memory")
        s1, s2 = self.sess[0], self.sess[1]
        key = self.fixed_key('iom')
        kid = (self.superuser, '', key)

        def past(us):
            wait = (us + 100_000 - now_us()) / 1e6
            if wait > 0:
                time.sleep(wait)

        def remembered():
            self.fixed_step([self.fixed_begin(s1)])
            self.fixed_step([self.fixed_claim(s1, key, False)])
            got = self.answer_text(s1)
            if got is None or 'expired' not in got:
                raise Difference(f"import-over-memory scenario: S{s1}'s claim answered {got}, not expired")
            self.fixed_step([self.fixed_lookup(s1, key)])
            self.fixed_step([self.ctl(s1, 'rollback', "ROLLBACK")])

        self.fixed_step([self.fixed_begin(s1)])
        self.fixed_step([self.fixed_claim(s1, key, False)])
        self.fixed_step([self.fixed_complete(s1, key)])
        self.fixed_step([self.ctl(s1, 'commit', "COMMIT")])
        past(self.w.keys[kid].exp)
        remembered()
        now = now_us()
        f = dict(role=self.superuser, digest=digest('', key), exp=now + 1_000_000,
                 status='in_progress', token=now - PG_EPOCH_US, cat=now,
                 lease=now + 500_000, fp=None, rp=None, code=None, body=None)
        self.fixed_step([self.fixed_begin(s2)])
        self.fixed_step([self.fixed_import_key(s2, kid, f)])
        self.fixed_step([self.ctl(s2, 'commit', "COMMIT")])
        self.fixed_step([self.fixed_begin(s2)])
        self.fixed_step([self.fixed_act(s2, 'release', key, f['token'])])
        self.fixed_step([self.ctl(s2, 'commit', "COMMIT")])
        past(f['exp'])
        remembered()
        self.mon.execute("SELECT * FROM idem_maintain()")
        self.note("idem_maintain() by the monitor")
        remembered()
        self.finish()
        return time.monotonic() - t_start

    # -- the scenarios' statements: fixed, no random choices
    def fixed_key(self, name):
        key = f'{self.tag}/{name}'
        for sc in self.scopes:
            self.universe.setdefault(digest(sc, key), ('k', sc, key))
        return key

    def fixed_step(self, calls, **kw):
        self.step += 1
        self.round(calls, **kw)

    def fixed_begin(self, s):
        return self.ctl(s, 'begin', "BEGIN ISOLATION LEVEL READ COMMITTED", iso='rc', ro=False)

    def fixed_claim(self, s, key, wait):
        sql = ("SELECT status, token, recovery_point, response_code, response_body::text, "
               + US.format('expires_at') + " FROM idem_claim($1::text, wait => $2::boolean)")
        c = Call(s, 'claim', sql, [key, 'true' if wait else 'false'],
                 key=key, scope='', fp=None, ttl=None, lease=None, wait=wait)
        c.locks = {(self.w.txns[s].role, '', key)}
        c.label = f"claim /{key}"
        return c

    def fixed_act(self, s, op, key, token):
        c = Call(s, op, f"SELECT idem_{op}($1::text, token => $2::bigint)", [key, token],
                 key=key, scope='', token=token, op=op)
        c.locks = {(self.w.txns[s].role, '', key)}
        c.label = f"{op} /{key}"
        return c

    def fixed_complete(self, s, key):
        c = Call(s, 'complete', "SELECT idem_complete($1::text, 200)", [key],
                 key=key, scope='', token=None, op='complete', code=200, body=None)
        c.locks = {(self.w.txns[s].role, '', key)}
        c.label = f"complete /{key}"
        return c

    def fixed_lookup(self, s, key):
        cols = ("status, token, recovery_point, response_code, response_body::text, "
                + US.format('claimed_at') + ', ' + US.format('expires_at') + ', '
                + US.format('lease_expires_at'))
        c = Call(s, 'lookup', f"SELECT {cols} FROM idem_lookup($1::text)", [key],
                 key=key, scope='')
        c.label = f"lookup /{key}"
        return c

    def fixed_import_key(self, s, kid, f):
        ts = lambda us: None if us is None else us_to_ts(us)
        p = [f['role'], f['digest'], ts(f['exp']), f['status'], f['token'], ts(f['cat']),
             ts(f['lease']), f['fp'], f['rp'], f['code'], f['body']]
        c = Call(s, 'import_key', self.KEY_IMPORT.format(cast='', extra=''), p, kid=kid, fields=f)
        c.locks = {kid}
        c.label = f"import_key {kid}"
        return c

    def fixed_consume(self, s, co, i, ttl):
        p = [co, i] if ttl is None else [co, i, self.ttl_text(ttl)]
        return self.consume_of(s, p, consumer=co, id=i, ttl=ttl)

    def fixed_batch(self, s, co, ids):
        arr = '{' + ','.join(json.dumps(i) for i in ids) + '}'
        c = Call(s, 'batch', "SELECT m FROM idem_consume_messages($1::text, $2::text[]) AS t(m)",
                 [co, arr], consumer=co, ids=list(ids), ttl=None)
        c.label = f"batch {co}/{ids}"
        return c

    def answer_text(self, s):
        """What S<s> answered in this step, as logged (None if nothing)."""
        for st, t, _ in reversed(self.log):
            if st != self.step:
                break
            if t.startswith(f"  S{s} -> "):
                return t[len(f"  S{s} -> "):]
        return None

    def answered(self, s):
        """The SQLSTATE S<s> answered in this step ('' for rows, None if none)."""
        t = self.answer_text(s)
        if t is None:
            return None
        m = re.match(r"ERROR (\w+):", t)
        return m.group(1) if m else ''

    def summary(self):
        """What the run exercised, per statement: the answers the model
        explained (errors by SQLSTATE), and what the clock decided."""
        groups = {}
        for (kind, what), n in self.stats.items():
            groups.setdefault(kind, []).append((what, n))
        order = ['run', 'clock', 'claim', 'complete', 'checkpoint', 'release', 'lookup', 'consume',
                 'batch', 'export_keys', 'export_messages', 'import_key', 'import_message', 'commit']
        lines = []
        for kind in order + sorted(set(groups) - set(order)):
            if kind in groups:
                items = sorted(groups[kind], key=lambda x: (x[0].startswith('error'), x[0]))
                lines.append(f"  {kind}: " + ', '.join(f"{w} {n}" for w, n in items))
        return '\n'.join(lines)

    def learn(self):
        """Tokens seen (for stale-token calls) and exported records (for imports)."""
        for kid, v in self.w.keys.items():
            self.tokens.setdefault(kid, set()).add(v.tok)
        for t in self.w.txns.values():
            if t is not None:
                for lv in t.levels:
                    for kid, vs in lv.keys.items():
                        for v in vs:
                            self.tokens.setdefault(kid, set()).add(v.tok)

    def finish(self):
        """Cancel what waits, end every transaction, audit once more."""
        for _ in range(4 * len(self.sess)):
            if not self.inflight and all(t is None for t in self.w.txns.values()):
                break
            for s in self.sess:
                if s in self.inflight:
                    c = self.inflight[s]
                    c.armed = '57014'
                    self.note(f"pg_cancel_backend(S{s})")
                    self.mon.execute("SELECT pg_cancel_backend(%s)", (self.conns[s].pid,))
                    self.resolve([], now_us())
                elif self.w.txns[s] is not None:
                    self.round([self.ctl(s, 'rollback', "ROLLBACK")])
        self.audit()


# --scenario NAME: the fixed interleavings, each a Driver method
SCENARIOS = {
    'late-cancel': Driver.late_cancel,
    'late-cancel-cycle': Driver.late_cancel_cycle,
    'concurrent-errors': Driver.concurrent_errors,
    'batch-expiry-wait': Driver.batch_expiry_wait,
    'import-over-memory': Driver.import_over_memory,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--dsn', required=True)
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--seeds', default=None)
    ap.add_argument('--steps', type=int, default=int(os.environ.get('MODEL_STEPS', 1000)))
    ap.add_argument('--sessions', type=int, default=int(os.environ.get('MODEL_SESSIONS', 3)))
    ap.add_argument('--trace', default=None)
    ap.add_argument('--verbose', action='store_true')
    ap.add_argument('--scenario', choices=list(SCENARIOS), default=None,
                    help='one fixed interleaving instead of random rounds')
    args = ap.parse_args()
    if args.seed is not None:
        seeds = [args.seed]
    elif os.environ.get('SEED'):
        seeds = [int(os.environ['SEED'])]
    else:
        seeds = [int(x) for x in (args.seeds or os.environ.get('MODEL_SEEDS', '1')).split(',')]
    if args.sessions < 3:
        print("at least 3 sessions", file=sys.stderr)
        return 2
    tol = float(os.environ.get('MODEL_CLOCK_TOL_MS', 2))
    settle = float(os.environ.get('MODEL_SETTLE_SECONDS', 60))
    trace = open(args.trace, 'w') if args.trace else None
    status = 0
    for seed in seeds:
        d = None
        try:
            d = Driver(args.dsn, seed, args.steps, args.sessions, tol, settle, args.verbose, trace)
            if args.scenario:
                secs = SCENARIOS[args.scenario](d)
                print(f"scenario {args.scenario}: {d.step} steps in {secs:.1f} s, no difference")
            else:
                secs = d.run()
                print(f"seed {seed}: {args.steps} steps in {secs:.1f} s, no difference")
            print(d.summary())
        except Difference as e:
            status = 1
            print(str(e))
            if d is not None:
                involved = set()
                sessions = set()
                for step, text, touched in d.log:
                    if step == d.step:
                        involved |= touched
                for c in d.inflight.values():
                    sessions.add(c.sess)
                # the digests an export's difference names
                for dg in re.findall(r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', str(e)):
                    if dg in d.universe:
                        involved.add(d.universe[dg])
                rel = [(step, text) for step, text, touched in d.log
                       if step != d.step and (touched & involved)]
                print(f"the last 40 earlier steps that touched the same keys or ids "
                      f"({', '.join(sorted(map(str, involved)))}):")
                for step, text in rel[-40:]:
                    print(f"  [{step}] {text}")
                print("the last 40 steps:")
                for step, text, touched in d.log[-40:]:
                    print(f"  [{step}] {text}")
            print(f"replay: SEED={seed} MODEL_STEPS={args.steps}")
        finally:
            if d is not None:
                for c in d.conns.values():
                    c.pg.finish()
                d.mon.close()
        if status:
            break
    if trace:
        trace.close()
    return status


if __name__ == '__main__':
    sys.exit(main())

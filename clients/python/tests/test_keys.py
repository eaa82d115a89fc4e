"""Parsing the Idempotency-Key field, and the policy's pure parts (no
database)."""

import pytest

from pg_idempotency.http import (BadKey, Options, Policy, RequestInfo,
                                 default_fingerprint, default_scope,
                                 parse_key)


@pytest.mark.parametrize("values,key", [
    (['"8e03978e-40d5"'], "8e03978e-40d5"),
    (["k-bare.1~:x"], "k-bare.1~:x"),
    (['"a b"'], "a b"),
    (['"with \\" quote"'], 'with " quote'),
    (['"a,b"'], "a,b"),
    ([' "padded" '], "padded"),
    (['"' + "k" * 255 + '"'], "k" * 255),
    ([], None),
])
def test_valid_keys(values, key):
    assert parse_key(values) == key


@pytest.mark.parametrize("values,problem", [
    (['""'], "empty-key"),
    ([""], "malformed-key"),
    (['"unterminated'], "malformed-key"),
    (['"bad \\n escape"'], "malformed-key"),
    (['"tab\tinside"'], "malformed-key"),
    (["bare with space"], "malformed-key"),
    (["ünïcode"], "malformed-key"),
    (['"x" trailing'], "malformed-key"),
    (['"' + "k" * 256 + '"'], "key-too-long"),
    (["k" * 256], "key-too-long"),
    (['"a"', '"b"'], "multiple-keys"),
    (['"a", "b"'], "multiple-keys"),
    (["a,b"], "multiple-keys"),
])
def test_bad_keys(values, problem):
    with pytest.raises(BadKey) as e:
        parse_key(values)
    assert e.value.problem == problem
    assert e.value.http_status == 400


def info(**kw):
    d = dict(method="POST", path="/charges", route="/charges", query="",
             caller="", content_type="application/json", body=b"{}")
    d.update(kw)
    return RequestInfo(**d)


def test_fingerprint_json_and_bytes():
    a = default_fingerprint(info(body=b'{"a": 1, "b": [1, 2]}'))
    assert a["body"] == {"a": 1, "b": [1, 2]}
    raw = default_fingerprint(info(body=b"\xff\x00", content_type="application/octet-stream"))
    assert set(raw["body"]) == {"sha256"}
    bad = default_fingerprint(info(body=b'{"a": NaN}'))
    assert set(bad["body"]) == {"sha256"}
    nul = default_fingerprint(info(body=b'{"a": "\\u0000"}'))
    assert set(nul["body"]) == {"sha256"}


def test_scope():
    assert default_scope(info()) == "POST /charges"
    assert default_scope(info(caller="u 1")) == '["u 1","POST","/charges"]'
    long = default_scope(info(caller="u" * 300))
    assert long.startswith("sha256:") and len(long) < 255


def test_options_refuse_set_cookie_and_bad_statuses():
    with pytest.raises(ValueError):
        Options(replay_headers=("Set-Cookie",))
    with pytest.raises(ValueError):
        Options(busy_status=500)
    with pytest.raises(ValueError):
        Options(too_large_status=400)


def test_stored_headers_allowlist():
    p = Policy(Options())
    got = p.stored_headers([("Content-Type", "text/csv"), ("Set-Cookie", "a=1"),
                            ("Link", "<a>"), ("link", "<b>"), ("X-Other", "1"),
                            ("Location", "/x\r\nInjected: 1")])
    assert got == {"Content-Type": "text/csv", "Link": ["<a>", "<b>"]}


def test_problem_document():
    p = Policy(Options(ttl="2 hours", docs_url="https://d/idem"))
    r = p.problem(409, "in-progress", "T", "D", [("Retry-After", "1")])
    import json
    doc = json.loads(r.body)
    assert doc == {"type": "https://d/idem#in-progress", "title": "T",
                   "status": 409, "detail": "D", "key_retention_seconds": 7200}
    assert ("Content-Type", "application/problem+json") in r.headers
    assert ("Link", '<https://d/idem>; rel="describedby"') in r.headers


def test_optional_key_and_applies():
    p = Policy(Options(required=False, methods={"post"},
                       applies=lambda m, path: path.startswith("/api/")))
    assert p.key_of([]) is None
    assert p.applies("POST", "/api/x") and not p.applies("POST", "/other")
    assert not p.applies("GET", "/api/x")
    with pytest.raises(BadKey) as e:
        Policy(Options()).key_of([])
    assert e.value.problem == "missing-key"

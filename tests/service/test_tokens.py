"""Token verification: keys in Pulsar's forms, the cache, and expiry respected from the cache."""

from __future__ import annotations

import base64
import time

import jwt
import pytest

from service.errors import Unauthenticated
from service.tokens import TokenVerifier, create_token, parse_expiry, read_key


def test_key_forms(tmp_path) -> None:
    (tmp_path / "k").write_bytes(b"\x00\x01key")
    assert read_key(f"file://{tmp_path / 'k'}") == b"\x00\x01key"
    assert read_key("data:;base64," + base64.b64encode(b"abc").decode()) == b"abc"
    assert read_key(base64.b64encode(b"abc").decode()) == b"abc"
    for bad in ("data:,abc", "data:;base64,@@", f"file://{tmp_path / 'missing'}"):
        with pytest.raises(ValueError):
            read_key(bad)


def test_expiry_times() -> None:
    assert parse_expiry("30s") == 30 and parse_expiry("2h") == 7200 and parse_expiry("1y") == 365 * 86400
    for bad in ("", "0h", "1x", "-1d"):
        with pytest.raises(ValueError):
            parse_expiry(bad)


def test_the_cache_keeps_roles_not_expired_tokens() -> None:
    key = b"k" * 32
    v = TokenVerifier(secret_key=key, cache_size=2)
    short = create_token(subject="a", secret_key=key, expiry_seconds=1)
    assert v.role(short) == "a"
    assert short in v._cache
    time.sleep(1.1)
    with pytest.raises(Unauthenticated, match="expired"):
        v.role(short)
    # Bounded: the oldest token leaves first.
    tokens = [create_token(subject=f"r{i}", secret_key=key) for i in range(3)]
    assert [v.role(t) for t in tokens] == ["r0", "r1", "r2"]
    assert len(v._cache) == 2 and tokens[0] not in v._cache


def test_claim_and_algorithms() -> None:
    key = b"k" * 32
    v = TokenVerifier(secret_key=key, claim="role")
    assert v.role(create_token(subject="ops", secret_key=key, claim="role")) == "ops"
    with pytest.raises(Unauthenticated, match="no 'role' claim"):
        v.role(create_token(subject="ops", secret_key=key))
    with pytest.raises(Unauthenticated, match="'none' are not accepted"):
        v.role(jwt.encode({"role": "ops"}, None, algorithm="none"))

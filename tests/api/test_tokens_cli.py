"""``compactor tokens ...`` as ``pulsar tokens``: keys, tokens, show, validate."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.main import app
from service.tokens import TokenVerifier, read_key


def tokens(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, ["tokens", *args])
    return r.exit_code, r.stdout, r.stderr


def test_secret_key_token_show_and_validate(tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    assert tokens("create-secret-key", "--output", str(key))[0] == 0
    assert len(key.read_bytes()) == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600
    code, out, _ = tokens(
        "create", "--secret-key", f"file://{key}", "--subject", "app1", "--expiry-time", "1h"
    )
    assert code == 0
    token = out.strip()
    assert out == token + "\n"  # the token alone, for TOKEN=$(...)
    assert TokenVerifier(secret_key=key.read_bytes()).role(token) == "app1"

    code, out, _ = tokens("show", token)
    header, claims = (json.loads(line) for line in out.splitlines())
    assert header["alg"] == "HS256" and claims["sub"] == "app1" and claims["exp"] > 0
    code, out, err = tokens("validate", token, "--secret-key", f"file://{key}")
    assert code == 0 and json.loads(out)["sub"] == "app1" and "role 'app1'" in err

    other = tmp_path / "other.key"
    tokens("create-secret-key", "-o", str(other), "--base64")
    assert len(base64.b64decode(other.read_text())) == 32
    code, _, err = tokens("validate", token, "--secret-key", "data:;base64," + other.read_text())
    assert code == 1 and "signature does not verify" in err
    assert tokens("show", "not-a-token")[0] == 1


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_key_pair_tokens(tmp_path: Path, alg: str) -> None:
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    code, _, _ = tokens(
        "create-key-pair", "--output-private-key", str(private), "--output-public-key", str(public), "-a", alg
    )
    assert code == 0
    code, out, _ = tokens("create", "--private-key", f"file://{private}", "--subject", "svc")
    token = out.strip()
    assert json.loads(tokens("show", token)[1].splitlines()[0])["alg"] == alg
    assert tokens("validate", token, "--public-key", f"file://{public}")[0] == 0
    assert TokenVerifier(public_key=read_key(f"file://{public}")).role(token) == "svc"


def test_usage_errors(tmp_path: Path) -> None:
    assert tokens("create", "--subject", "x")[0] == 2  # no key
    assert (
        tokens("create", "--secret-key", "data:;base64,AAAA", "--subject", "x", "--expiry-time", "soon")[0]
        == 2
    )
    assert (
        tokens("create-key-pair", "--output-private-key", "a", "--output-public-key", "b", "-a", "HS256")[0]
        == 2
    )

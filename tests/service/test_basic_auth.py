"""The basic provider's htpasswd file: the two hash formats Pulsar's AuthenticationProviderBasic
checks (crypt and $apr1$), the file's forms, and the credentials' forms."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
from passlib.hash import apr_md5_crypt, des_crypt, ldap_sha1

from service.basic_auth import REFUSED, BasicAuthenticator, decode_header, load, parse, read_conf
from service.errors import Unauthenticated

# Known vectors computed elsewhere: `openssl passwd -apr1 -salt abcdefgh secret`, and the C
# library's crypt("secret", "ab"); Pulsar's own test configuration (pulsar-client-python's
# tests/test-conf/.htpasswd) holds the third, for admin / 123456.
APR1_SECRET = "$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/"
DES_SECRET = "abNANd1rDfiNc"
PULSAR_ADMIN = "admin:$apr1$FG4AO6aX$KGYPuMoLUou3i6vUkPUUf."


def _auth(text: str) -> BasicAuthenticator:
    return BasicAuthenticator(parse(text))


@pytest.mark.parametrize(
    "line",
    [
        f"alice:{APR1_SECRET}",
        f"alice:{DES_SECRET}",
        f"alice:{apr_md5_crypt.hash('secret')}",  # a fresh salt, as htpasswd -m makes one
        f"alice:{des_crypt.hash('secret')}",  # as htpasswd -d
    ],
)
def test_each_accepted_hash_format(line: str) -> None:
    auth = _auth(line + "\n")
    assert auth.role("alice:secret") == "alice"
    with pytest.raises(Unauthenticated, match=REFUSED):
        auth.role("alice:Secret")
    with pytest.raises(Unauthenticated, match=REFUSED):
        auth.role("bob:secret")  # an unknown user: the same answer as a wrong password


def test_pulsars_own_test_file_and_its_user() -> None:
    assert _auth(PULSAR_ADMIN).role("admin:123456") == "admin"


def test_des_crypt_counts_eight_characters_as_crypt_does() -> None:
    auth = _auth(f"u:{des_crypt.hash('password')}")
    assert auth.role("u:password") == "u"
    assert auth.role("u:password-and-more") == "u"  # crypt(3) and Java's UnixCrypt alike
    with pytest.raises(Unauthenticated):
        auth.role("u:passwor")


def test_hashes_pulsar_does_not_check_match_no_password(caplog: pytest.LogCaptureFixture) -> None:
    text = "\n".join(
        [
            "bcrypt:$2y$05$0123456789012345678901uDuHnR6C9ZkEoEL3xT3z0Q8KjWcC8Uy",  # htpasswd -B
            f"sha:{ldap_sha1.hash('pw')}",
            "plain:pw",
            "short:abc",
            "badapr:$apr1$x",
            f"ok:{APR1_SECRET}",
        ]
    )
    with caplog.at_level(logging.WARNING, logger="service.basic_auth"):
        auth = _auth(text)  # the file is taken, as Pulsar takes it
    for user in ("bcrypt", "sha", "plain", "short", "badapr"):
        with pytest.raises(Unauthenticated, match=REFUSED):
            auth.role(f"{user}:pw")
        assert any(repr(user) in r.getMessage() for r in caplog.records), user
    assert auth.role("ok:secret") == "ok"


@pytest.mark.parametrize("text", ["alice", "alice:x:y", ":abc", "alice:"])
def test_a_line_that_is_not_user_hash_refuses_the_file(text: str) -> None:
    with pytest.raises(ValueError, match="line 2 of the basic auth conf is not user:hash"):
        parse(f"ok:{DES_SECRET}\n{text}\n")


def test_blank_lines_and_crlf_are_taken() -> None:
    auth = _auth(f"\r\na:{DES_SECRET}\r\n\r\nb:{APR1_SECRET}\r\n")
    assert auth.role("a:secret") == "a" and auth.role("b:secret") == "b"


@pytest.mark.parametrize("data", ["nocolon", "a:b:c", "a:", ""])
def test_credentials_must_be_user_colon_password(data: str) -> None:
    with pytest.raises(Unauthenticated, match="user:password"):
        _auth(f"a:{DES_SECRET}").role(data)


def test_the_authorization_header_is_base64_of_user_password() -> None:
    assert decode_header(base64.b64encode(b"alice:secret").decode()) == "alice:secret"
    for bad in ("***", base64.b64encode(b"\xff\xfe").decode()):
        with pytest.raises(Unauthenticated, match="Base64 decoding"):
            decode_header(bad)


def test_the_file_in_each_of_pulsars_forms(tmp_path: Path) -> None:
    text = f"alice:{APR1_SECRET}\n"
    f = tmp_path / "htpasswd"
    f.write_text(text)
    b64 = base64.b64encode(text.encode()).decode()
    for form in (str(f), f"file://{f}", f"data:;base64,{b64}", f"data:text/plain;base64,{b64}", b64):
        assert read_conf(form) == text.encode(), form
        assert BasicAuthenticator(load(form)).role("alice:secret") == "alice", form
    assert read_conf("data:,alice:%24apr1%24x") == b"alice:$apr1$x"  # URL-encoded text
    for bad in (str(tmp_path / "missing"), f"file://{tmp_path / 'missing'}", "data:;base64,@@", "data:abc"):
        with pytest.raises(ValueError):
            read_conf(bad)


def test_remembered_credentials_let_in_only_the_same_password() -> None:
    auth = BasicAuthenticator(parse(f"a:{DES_SECRET}\nb:{APR1_SECRET}"), cache_size=1)
    for _ in range(2):
        assert auth.role("a:secret") == "a"
        with pytest.raises(Unauthenticated):
            auth.role("a:secrets!")  # another password, after the right one was remembered
        with pytest.raises(Unauthenticated):
            auth.role("b:other")
    assert auth.role("b:secret") == "b"
    assert len(auth._verified) == 1  # bounded
    assert all(b"secret" not in k for k in auth._verified)  # a keyed digest, not the password

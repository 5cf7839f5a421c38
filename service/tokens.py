"""JSON Web Tokens as Pulsar uses them: keys, making tokens, and verifying them.

Pulsar's ``AuthenticationProviderToken`` and ``pulsar tokens`` are the model: a token is a JWT
signed with a secret key (HS256) or a private key (RS256, ES256), its role in the ``sub`` claim
(or ``tokenAuthClaim``). Keys are given as ``file:///path`` or ``data:;base64,...``; a secret
key is raw bytes, a key pair is DER (PKCS#8 private, X.509 public) as ``pulsar tokens
create-key-pair`` writes it; PEM is read too.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from service.errors import Unauthenticated

SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
_CURVES: dict[str, ec.EllipticCurve] = {
    "ES256": ec.SECP256R1(),
    "ES384": ec.SECP384R1(),
    "ES512": ec.SECP521R1(),
}
_EC_ALGORITHM = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
_RELATIVE = re.compile(r"^(\d+)([smhdwy]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


# ------------------------------------------------------------------------------- keys


def read_key(url: str) -> bytes:
    """The bytes a key setting names: ``file:///path``, ``data:;base64,...``, or (as Pulsar
    also accepts) the base64 text itself. ``ValueError`` with a reason otherwise."""
    if url.startswith("data:"):
        _, sep, data = url.partition(",")
        if not sep or ";base64" not in url.split(",", 1)[0]:
            raise ValueError("a data: key must be data:;base64,<base64>")
        return _b64(data)
    if url.startswith("file:"):
        path = Path(unquote(urlparse(url).path))
        try:
            return path.read_bytes()
        except OSError as e:
            raise ValueError(f"cannot read key file {path}: {e.strerror}") from None
    return _b64(url)


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the key is not valid base64 (give file:///path or data:;base64,...)") from None


def create_secret_key() -> bytes:
    """A new HS256 secret key: 32 random bytes, as ``pulsar tokens create-secret-key``."""
    return os.urandom(32)


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new (private, public) key pair in DER, as ``pulsar tokens create-key-pair``."""
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm in RSA_ALGORITHMS:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm in _CURVES:
        key = ec.generate_private_key(_CURVES[algorithm])
    else:
        raise ValueError(f"unsupported signature algorithm {algorithm!r}: use RS256 or ES256")
    private = key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def load_private_key(data: bytes) -> Any:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(data, password=None)
        return serialization.load_der_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"not a private key (DER or PEM): {e}") from None


def load_public_key(data: bytes) -> Any:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_public_key(data)
        return serialization.load_der_public_key(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"not a public key (DER or PEM): {e}") from None


def algorithms_of(key: Any) -> tuple[str, ...]:
    """The signature algorithms a public or private key can check or make."""
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        return RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        alg = _EC_ALGORITHM.get(key.curve.name)
        if alg is None:
            raise ValueError(f"unsupported elliptic curve {key.curve.name}")
        return (alg,)
    raise ValueError("unsupported key type: use RSA or EC (P-256, P-384, P-521)")


# ----------------------------------------------------------------------------- tokens


def parse_expiry(text: str) -> int:
    """Seconds in ``30s``, ``10m``, ``1h``, ``7d``, ``2w``, ``1y`` (Pulsar's relative times)."""
    m = _RELATIVE.match(text.strip())
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"invalid expiry time {text!r}: use a positive number with s, m, h, d, w or y")
    return int(m.group(1)) * _UNIT_SECONDS[m.group(2)]


def create_token(
    *,
    subject: str,
    secret_key: bytes | None = None,
    private_key: bytes | None = None,
    algorithm: str | None = None,
    expiry_seconds: int | None = None,
    claim: str = "sub",
) -> str:
    """A signed token for the role ``subject``: with the secret key (HS256) or the private key
    (RS256 or ES256, from the key unless ``algorithm`` says)."""
    if (secret_key is None) == (private_key is None):
        raise ValueError("give exactly one of a secret key and a private key")
    claims: dict[str, Any] = {claim: subject}
    if expiry_seconds is not None:
        claims["exp"] = int(time.time()) + expiry_seconds
    if secret_key is not None:
        alg = algorithm or "HS256"
        if alg not in SECRET_ALGORITHMS:
            raise ValueError(f"a secret key signs with {', '.join(SECRET_ALGORITHMS)}, not {alg}")
        return jwt.encode(claims, secret_key, algorithm=alg)
    assert private_key is not None
    key = load_private_key(private_key)
    allowed = algorithms_of(key)
    alg = algorithm or allowed[0]
    if alg not in allowed:
        raise ValueError(f"this private key signs with {', '.join(allowed)}, not {alg}")
    return jwt.encode(claims, key, algorithm=alg)


def show_token(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a token, unverified (``pulsar tokens show``)."""
    try:
        return jwt.get_unverified_header(token), jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as e:
        raise ValueError(f"not a token: {e}") from None


class TokenVerifier:
    """Checks tokens and gives their role, as Pulsar's ``AuthenticationProviderToken``.

    Verified tokens are cached by their text (an LRU of ``cache_size``): a client sends the same
    token with every request, and a signature check (an RSA verify especially) would otherwise
    cost more than a small produce. A cached token is still refused once it expires.
    """

    def __init__(
        self,
        *,
        secret_key: bytes | None = None,
        public_key: bytes | None = None,
        claim: str = "sub",
        cache_size: int = 10_000,
    ) -> None:
        if secret_key is None and public_key is None:
            raise ValueError("a token verifier needs a secret key or a public key")
        self._keys: dict[str, Any] = {}
        if secret_key is not None:
            for alg in SECRET_ALGORITHMS:
                self._keys[alg] = secret_key
        if public_key is not None:
            key = load_public_key(public_key)
            for alg in algorithms_of(key):
                self._keys[alg] = key
        self.claim = claim
        self.cache_size = cache_size
        # token -> (role, not before, expires); a dict keeps insertion order: the oldest goes first.
        self._cache: dict[str, tuple[str, float, float]] = {}

    def role(self, token: str) -> str:
        """The role of a valid token; ``Unauthenticated`` with the reason otherwise."""
        hit = self._cache.get(token)
        if hit is not None:
            role, nbf, exp = hit
            now = time.time()
            if nbf <= now < exp:
                return role
            self._cache.pop(token, None)
        role, nbf, exp = self._verify(token)
        if self.cache_size:
            while len(self._cache) >= self.cache_size:
                try:
                    del self._cache[next(iter(self._cache))]
                except (StopIteration, KeyError, RuntimeError):  # emptied or changed by another thread
                    break
            self._cache[token] = (role, nbf, exp)
        return role

    def _verify(self, token: str) -> tuple[str, float, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the token is not a valid JWT") from None
        alg = header.get("alg")
        key = self._keys.get(alg) if isinstance(alg, str) else None
        if key is None:
            raise Unauthenticated(f"tokens signed with {alg!r} are not accepted here")
        try:
            claims = jwt.decode(
                token, key, algorithms=[str(alg)], options={"require": [self.claim], "verify_aud": False}
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the token is not valid yet (nbf or iat in the future)") from None
        except jwt.MissingRequiredClaimError:
            raise Unauthenticated(f"the token has no {self.claim!r} claim (the role)") from None
        except jwt.InvalidSignatureError:
            raise Unauthenticated("the token's signature does not verify") from None
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"invalid token: {e}") from None
        role = claims.get(self.claim)
        if not isinstance(role, str) or not role:
            raise Unauthenticated(f"the token's {self.claim!r} claim is not a role name")
        nbf = claims.get("nbf", float("-inf"))
        exp = claims.get("exp", float("inf"))
        return role, float(nbf), float(exp)

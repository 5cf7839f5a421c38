"""How a REST request names its authentication method: the X-Pulsar-Auth-Method-Name header,
else the Authorization scheme, else the TLS client certificate the HTTPS listener records in the
ASGI scope (``extensions.tls.peer_certificate``), else none. The requests are ASGI scopes as
the server hands them to the app; the chain is the real one."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from api.auth import authenticate
from service.authentication import Authentication
from service.basic_auth import BasicAuthenticator, parse
from service.errors import Unauthenticated
from service.tokens import TokenVerifier, create_token
from tests.service.test_authentication import HTTPS_CLIENT, peer_certificate_of

KEY = b"k" * 32
HTPASSWD = "alice:$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/\n"  # alice / secret


def _request(chain: Authentication, headers: dict[str, str], cert: dict[str, Any] | None = None) -> Request:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/admin/v2/tenants",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "app": SimpleNamespace(state=SimpleNamespace(authentication=chain)),
    }
    if cert is not None:
        scope["extensions"] = {"tls": {"peer_certificate": cert}}
    return Request(scope)


def _chain(*, anonymous: str | None = None, basic: bool = True, tls: bool = True) -> Authentication:
    return Authentication(
        token=TokenVerifier(secret_key=KEY),
        basic=BasicAuthenticator(parse(HTPASSWD)) if basic else None,
        tls=tls,
        anonymous_role=anonymous,
    )


def _basic(pair: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


@pytest.fixture(scope="module")
def client_cert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return peer_certificate_of(tmp_path_factory.mktemp("tls"), HTTPS_CLIENT)


def test_each_scheme_goes_to_its_provider(client_cert: dict[str, Any]) -> None:
    chain = _chain()
    token = create_token(subject="app2", secret_key=KEY)
    assert authenticate(_request(chain, {"Authorization": f"Bearer {token}"})) == "app2"
    assert authenticate(_request(chain, _basic("alice:secret"))) == "alice"
    assert authenticate(_request(chain, {}, client_cert)) == "https-client"
    # Credentials in a header win over the connection's certificate (a token over TLS).
    assert authenticate(_request(chain, _basic("alice:secret"), client_cert)) == "alice"
    # The Java client's header names the method beside its credentials.
    named = {**_basic("alice:secret"), "X-Pulsar-Auth-Method-Name": "basic"}
    assert authenticate(_request(chain, named)) == "alice"
    with pytest.raises(Unauthenticated, match="must be 'Basic"):
        authenticate(
            _request(chain, {"Authorization": f"Bearer {token}", "X-Pulsar-Auth-Method-Name": "basic"})
        )


def test_a_certificate_is_the_tls_method_only_where_tls_is_served(client_cert: dict[str, Any]) -> None:
    assert authenticate(_request(_chain(tls=False, anonymous="anon"), {}, client_cert)) == "anon"
    with pytest.raises(Unauthenticated, match="authentication required: send Authorization: Bearer"):
        authenticate(_request(_chain(tls=False), {}, client_cert))
    with pytest.raises(Unauthenticated, match="Failed to get TLS certificates"):
        authenticate(_request(_chain(), {"X-Pulsar-Auth-Method-Name": "tls"}))  # plain HTTP


def test_no_credentials_say_which_are_taken() -> None:
    with pytest.raises(Unauthenticated) as refused:
        authenticate(_request(_chain(), {}))
    assert str(refused.value) == (
        "authentication required: send Authorization: Bearer <token> or "
        "Authorization: Basic <base64 of user:password> or a client certificate"
    )
    with pytest.raises(
        Unauthenticated, match=r"^authentication required: send Authorization: Bearer <token>$"
    ):
        authenticate(_request(_chain(basic=False, tls=False), {}))
    assert authenticate(_request(_chain(anonymous="anon"), {})) == "anon"


def test_a_scheme_no_provider_serves_is_not_parsed() -> None:
    """With basic not configured, a Basic header is a method the service lacks: the anonymous
    role, or refused as such, whatever its content."""
    chain = _chain(basic=False, anonymous="anon")
    assert authenticate(_request(chain, {"Authorization": "Basic ***"})) == "anon"
    # Without an anonymous role: the header's forms this service takes (REST's words, as before
    # there were several providers); a method named in Pulsar's header gets Pulsar's reason.
    with pytest.raises(Unauthenticated, match=r"^the Authorization header must be 'Bearer <token>'$"):
        authenticate(_request(_chain(basic=False, tls=False), {"Authorization": "Basic ***"}))
    with pytest.raises(Unauthenticated, match="No anonymous role.* auth method 'basic'"):
        authenticate(
            _request(_chain(basic=False), {"Authorization": "Basic x", "X-Pulsar-Auth-Method-Name": "basic"})
        )
    with pytest.raises(Unauthenticated, match="Base64 decoding"):
        authenticate(_request(_chain(anonymous="anon"), {"Authorization": "Basic ***"}))

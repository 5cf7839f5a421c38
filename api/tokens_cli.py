"""``compactor tokens ...``: keys and tokens, as ``pulsar tokens`` (part of the server extra, as
``pulsar tokens`` ships with the broker, not with pulsar-client).

::

    compactor tokens create-secret-key --output my-secret.key
    compactor tokens create --secret-key file:///path/my-secret.key --subject admin --expiry-time 1y
    compactor tokens create-key-pair --output-private-key my-private.key --output-public-key my-public.key
    compactor tokens create --private-key file:///path/my-private.key --subject app1
    compactor tokens show eyJhbGciOi...
    compactor tokens validate eyJhbGciOi... --secret-key file:///path/my-secret.key

``create`` prints the token alone on stdout, so that ``TOKEN=$(compactor tokens create ...)`` works.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from service import tokens
from service.errors import Unauthenticated

tokens_app = typer.Typer(help="Keys and tokens for authentication (as pulsar tokens).", no_args_is_help=True)

KeyOpt = Annotated[
    str | None, typer.Option(help="file:///path or data:;base64,... (as the service's settings take it).")
]
TokenArg = Annotated[str | None, typer.Argument(help="The token (or give --token-file, or - for stdin).")]
TokenFileOpt = Annotated[Path | None, typer.Option("--token-file", "-f", help="Read the token from a file.")]


def _write_private(path: Path, data: bytes) -> None:
    """Key files are readable by their owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key(value: str, what: str) -> bytes:
    try:
        return tokens.read_key(value)
    except ValueError as e:
        raise typer.BadParameter(f"{what}: {e}") from None


def _token(token: str | None, token_file: Path | None) -> str:
    if token_file is not None:
        return token_file.read_text().strip()
    if token is None or token == "-":
        return sys.stdin.read().strip()
    return token.strip()


@tokens_app.command("create-secret-key")
def create_secret_key(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the key here.")] = None,
    base64_: Annotated[bool, typer.Option("--base64", "-b", help="Write it base64-encoded.")] = False,
) -> None:
    """A new HS256 secret key (32 random bytes). Without --output, printed as base64."""
    key = tokens.create_secret_key()
    if output is None:
        typer.echo(base64.b64encode(key).decode())
        return
    _write_private(output, base64.b64encode(key) if base64_ else key)
    typer.echo(f"secret key written to {output}", err=True)


@tokens_app.command("create-key-pair")
def create_key_pair(
    output_private_key: Annotated[Path, typer.Option(help="Where the private key (DER, PKCS#8) goes.")],
    output_public_key: Annotated[Path, typer.Option(help="Where the public key (DER, X.509) goes.")],
    signature_algorithm: Annotated[str, typer.Option("--signature-algorithm", "-a")] = "RS256",
) -> None:
    """A new key pair for RS256 or ES256 tokens: the private key makes tokens, the service
    checks them with the public key (COMPACTOR_TOKEN_PUBLIC_KEY)."""
    try:
        private, public = tokens.create_key_pair(signature_algorithm)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    _write_private(output_private_key, private)
    output_public_key.write_bytes(public)
    typer.echo(f"key pair written to {output_private_key} and {output_public_key}", err=True)


@tokens_app.command("create")
def create(
    subject: Annotated[str, typer.Option("--subject", "-s", help="The role the token proves.")],
    secret_key: KeyOpt = None,
    private_key: KeyOpt = None,
    expiry_time: Annotated[
        str | None, typer.Option("--expiry-time", "-e", help="e.g. 30m, 12h, 7d, 1y; none: never expires.")
    ] = None,
    signature_algorithm: Annotated[
        str | None, typer.Option("--signature-algorithm", "-a", help="Default: HS256, or the key's.")
    ] = None,
    claim: Annotated[str, typer.Option(help="The claim that holds the role.")] = "sub",
) -> None:
    """Make a token for a role; prints the token alone."""
    if (secret_key is None) == (private_key is None):
        raise typer.BadParameter("give exactly one of --secret-key and --private-key")
    try:
        expiry = tokens.parse_expiry(expiry_time) if expiry_time is not None else None
        token = tokens.create_token(
            subject=subject,
            secret_key=_key(secret_key, "--secret-key") if secret_key else None,
            private_key=_key(private_key, "--private-key") if private_key else None,
            algorithm=signature_algorithm,
            expiry_seconds=expiry,
            claim=claim,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    typer.echo(token)


@tokens_app.command("show")
def show(token: TokenArg = None, token_file: TokenFileOpt = None) -> None:
    """The header and claims of a token, without checking its signature."""
    try:
        header, claims = tokens.show_token(_token(token, token_file))
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(header))
    typer.echo(json.dumps(claims))


@tokens_app.command("validate")
def validate(
    token: TokenArg = None,
    token_file: TokenFileOpt = None,
    secret_key: KeyOpt = None,
    public_key: KeyOpt = None,
    claim: Annotated[str, typer.Option(help="The claim that holds the role.")] = "sub",
) -> None:
    """Check a token as the service would; prints its claims, or the reason and exit code 1."""
    if secret_key is None and public_key is None:
        raise typer.BadParameter("give --secret-key or --public-key")
    try:
        verifier = tokens.TokenVerifier(
            secret_key=_key(secret_key, "--secret-key") if secret_key else None,
            public_key=_key(public_key, "--public-key") if public_key else None,
            claim=claim,
            cache_size=0,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    text = _token(token, token_file)
    try:
        role = verifier.role(text)
    except Unauthenticated as e:
        typer.echo(f"error: {e.reason}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps(tokens.show_token(text)[1]))
    typer.echo(f"valid: role {role!r}", err=True)

"""Channel security of the remote drafters: TLS (optionally mutual) and bearer tokens.

A token is sent as ``authorization: Bearer TOKEN`` call credentials. gRPC sends call
credentials only over a protected channel: TLS, or a local one (a Unix socket or loopback TCP,
through ``grpc.local_channel_credentials``). A token over plaintext TCP to another host is
refused by gRPC itself, on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from lookahead_client.errors import InvalidArgumentError

__all__ = ["TlsSettings", "channel_credentials", "tls_channel_options"]


def _read(value: bytes | str | Path | None, field: str) -> bytes | None:
    """PEM bytes as given, or read from a path."""
    if value is None or isinstance(value, bytes):
        return value
    try:
        return Path(value).read_bytes()
    except OSError as e:
        raise InvalidArgumentError(f"tls.{field}: cannot read {value!s}: {e}", field=field) from e


@dataclass(frozen=True)
class TlsSettings:
    """TLS settings of a client (PEM bytes, or paths to PEM files).

    Attributes:
        root_certificates: the CA that signed the server's certificate (None: the system roots).
        certificate_chain: the client certificate, for mutual TLS.
        private_key: the client certificate's key, for mutual TLS.
        server_name: the name expected in the server certificate when it differs from the
            target's host (e.g. ``localhost`` when connecting to 127.0.0.1).
    """

    root_certificates: bytes | str | Path | None = None
    certificate_chain: bytes | str | Path | None = None
    private_key: bytes | str | Path | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The gRPC channel credentials of these settings."""
        chain = _read(self.certificate_chain, "certificate_chain")
        key = _read(self.private_key, "private_key")
        if (chain is None) != (key is None):
            field = "private_key" if key is None else "certificate_chain"
            raise InvalidArgumentError(
                "mutual TLS needs both certificate_chain and private_key", field=field
            )
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.root_certificates, "root_certificates"),
            private_key=key,
            certificate_chain=chain,
        )


def channel_credentials(
    target: str, token: str | None, tls: TlsSettings | None
) -> grpc.ChannelCredentials | None:
    """The credentials of a channel to ``target``: None for a plain insecure channel."""
    if tls is None and token is None:
        return None
    if tls is not None:
        creds = tls.credentials()
    else:
        kind = (
            grpc.LocalConnectionType.UDS
            if target.startswith("unix:")
            else grpc.LocalConnectionType.LOCAL_TCP
        )
        creds = grpc.local_channel_credentials(kind)
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


def tls_channel_options(tls: TlsSettings | None) -> list[tuple[str, int | str]]:
    """Extra channel options of the TLS settings (the expected server name)."""
    if tls is None or tls.server_name is None:
        return []
    return [("grpc.ssl_target_name_override", tls.server_name)]

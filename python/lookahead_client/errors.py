"""Typed exceptions raised by every lookahead drafter (embedded and remote alike)."""

from __future__ import annotations

__all__ = [
    "LookaheadError",
    "InvalidArgumentError",
    "UnknownRequestError",
    "RequestAlreadyActiveError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "UnavailableError",
]


class LookaheadError(Exception):
    """Base class of every error raised by lookahead_client.

    Attributes:
        field: the name of the offending field or argument, when one is to blame.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidArgumentError(LookaheadError, ValueError):
    """A field has a value the drafter refuses (token id out of range, budget too large...)."""


class UnknownRequestError(LookaheadError, KeyError):
    """The request id is not active (never started, already ended, or expired)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RequestAlreadyActiveError(LookaheadError):
    """A prompt was given for a request id that is already active."""


class ResourceExhaustedError(LookaheadError):
    """A limit was reached (memory, message size, requests per step, active requests)."""


class UnauthenticatedError(LookaheadError):
    """The server needs a bearer token and none (or an unknown one) was given."""


class PermissionDeniedError(LookaheadError):
    """The bearer token does not grant access to the namespace."""


class UnavailableError(LookaheadError):
    """The drafter could not be reached (remote drafters normally fall back instead)."""

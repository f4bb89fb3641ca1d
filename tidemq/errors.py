"""The one exception tree of TideMQ.

Every error a user can meet derives from :class:`TideMQError`. Errors that correspond to a
RocketMQ response code carry it in ``code`` so that servers can answer with it and clients can
branch on it. Messages are sentences that say what to do.

This module imports nothing of ours: every layer may use it.
"""

from __future__ import annotations


class TideMQError(Exception):
    """Base of every TideMQ error. ``code`` is the RocketMQ response code, when there is one."""

    code: int | None = None

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class RemotingError(TideMQError):
    """Wire-level failure: broken frame, closed connection, timeout."""


class FrameError(RemotingError):
    """A frame or header that cannot be decoded. The connection it came from is closed."""


class ConnectError(RemotingError):
    """A peer could not be reached."""


class RemotingTimeoutError(RemotingError):
    """No response arrived within the timeout."""


class CodecError(TideMQError):
    """Bytes that are not a valid stored message, batch or property string."""


class BrokerError(TideMQError):
    """A server (broker or name server) answered a request with an error code."""

    def __init__(self, message: str, code: int | None = None, remark: str = "") -> None:
        super().__init__(message, code)
        self.remark = remark


class ClientError(TideMQError):
    """Misuse of the client library (invalid topic, body too large, not started ...)."""


class RequestTimeoutError(ClientError):
    """A request (request-reply) got no reply message within its timeout."""


class AdminError(TideMQError):
    """An admin operation that could not be carried out."""


class StoreError(TideMQError):
    """The message store cannot serve the request."""


class StoreCorruptError(StoreError):
    """The store on disk is damaged in a way recovery must not paper over."""


class ConfigError(TideMQError):
    """A configuration value is missing or invalid."""

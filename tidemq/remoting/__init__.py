"""RocketMQ remoting: codes, RemotingCommand, frame codec and asyncio connections.

Imports nothing of ours but ``tidemq.errors``.
"""

from tidemq.remoting.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.transport import Connection, RemotingClient, RemotingServer, parse_addr

__all__ = [
    "Connection",
    "LanguageCode",
    "RemotingClient",
    "RemotingCommand",
    "RemotingServer",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "parse_addr",
]

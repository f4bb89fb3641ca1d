"""The broker's store host: its advertised address as the IP literal stored records carry.

Every stored record holds the store host's address bytes (STOREHOST), and every offset message id
is made of them, so they must be a real address of this broker. A name given as the advertised
host (``--advertise`` / brokerIP1) is resolved here, once, when the broker is built, before it
serves anything: never per record (a lookup would block the event loop) and never to a made-up
address when it does not resolve (the broker refuses to start instead).
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from tidemq.errors import ConfigError

log = logging.getLogger(__name__)


def store_host_of(host: str, port: int) -> tuple[str, int]:
    """``(ip literal, port)`` for the advertised ``host``: an IP literal as it is, a name resolved
    to its IPv4 address (as RocketMQ's brokerIP1 is). Blocking (a DNS lookup) for a name; raises
    ConfigError naming the option when the name does not resolve."""
    try:
        ipaddress.ip_address(host)
        return host, port
    except ValueError:
        pass
    try:
        ip = socket.gethostbyname(host)
    except (OSError, UnicodeError) as exc:
        raise ConfigError(
            f"the advertised broker host {host!r} does not resolve ({exc}); stored messages carry "
            f"the broker's address, so set --advertise (brokerIP1 in a config file) to this "
            f"broker's IP address or to a name this machine resolves"
        ) from None
    log.info("advertised host %s resolves to %s: stored messages carry %s:%d", host, ip, ip, port)
    return ip, port

"""Field readers shared by the header codecs: Java int bounds and RocketMQ's boolean fields.

Numbers go through :func:`tidemq.remoting.command.field_int` (range-checked, ``ValueError``
naming the field); a boolean is true when it reads ``true`` (any case) or ``1``, and absent or
empty means the default, as :meth:`RemotingCommand.get_bool` reads it.
"""

from __future__ import annotations

INT = 1 << 31  # a Java int field lies in [-INT, INT); a long in [-2**63, 2**63)


def field_bool(v: str | None, default: bool = False) -> bool:
    if v is None or v == "":
        return default
    return v.lower() in ("true", "1")

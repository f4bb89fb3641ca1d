"""Typed request headers, decoded once: one module per request family.

Each module turns a request's ``extFields`` into a frozen typed object (and back, where a client
or a response needs it). RocketMQ's wire names (and SEND_MESSAGE_V2's one-letter names) live here
and nowhere else; numbers are range-checked with :func:`tidemq.remoting.command.field_int` and a
bad field raises ``ValueError`` naming it. Pure: no sockets, files or clocks.
"""

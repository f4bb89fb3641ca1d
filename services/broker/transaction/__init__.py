"""Transactional messages (RocketMQ 4.x two-phase commit, PROTOCOL-REFERENCE 6.9).

``half``: pure conversions (half message, committed message, op record, check-back request);
``book``: which transactions are resolved and when a half message is due for a check (pure, with
the time passed in); ``service``: storing halves, END_TRANSACTION, progress persistence;
``checker``: the periodic check-back round. END_TRANSACTION itself is served by
:mod:`tidemq.broker.messaging.transaction` (its remoting adapter: ``tidemq.broker.processors.transaction``).
"""

"""ClientBase: the lifecycle every asyncio client (producer, consumers, admin) shares.

A client holds one reference to the shared :class:`~tidemq.client.instance.ClientInstance` of
its config between ``start()`` and ``close()``: ``_instance`` is that instance while started and
None otherwise. ``start()`` and ``close()`` are idempotent; ``async with`` does both. Subclasses
register themselves with the instance in ``_attach`` and unregister in ``_detach``; the instance
is released even when ``_attach`` or ``_detach`` fails. Consumers with their own state machine
(push, lite pull) override ``start``/``close`` and keep only the rest.
"""

from __future__ import annotations

from typing import Self

from tidemq.client.config import ClientConfig
from tidemq.client.instance import ClientInstance
from tidemq.errors import ClientError


class ClientBase:
    config: ClientConfig
    _instance: ClientInstance | None = None
    # What the application sees when it uses a client that is not started.
    _not_started = "client is not started: call `await client.start()` or use `async with`"

    async def start(self) -> None:
        if self._instance is not None:
            return
        inst = await ClientInstance.acquire(self.config)
        try:
            self._attach(inst)
        except BaseException:
            await inst.release()
            raise
        self._instance = inst

    async def close(self) -> None:
        inst, self._instance = self._instance, None
        if inst is None:
            return
        try:
            await self._detach(inst)
        finally:
            await inst.release()

    def _attach(self, inst: ClientInstance) -> None:
        """Register with a freshly acquired instance (before ``_instance`` is set)."""

    async def _detach(self, inst: ClientInstance) -> None:
        """Unregister from the instance (``_instance`` is already None; released after)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _require(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError(self._not_started)
        return self._instance

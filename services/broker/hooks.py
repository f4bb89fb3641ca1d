"""Dispatch of remoting requests to their handlers, with hooks around it (RocketMQ's RPCHook idea:
something runs before a request and after its response), composed by the broker.

- :class:`AclHook` (only when ACL is on): refuses a request whose signature or permissions fail,
  before any handler reads it.
- :class:`FlowControlHook`: SYSTEM_BUSY for a new send while sends pile up behind SYNC_FLUSH.
- :class:`MetricsHook`: responses by code, latency of sends and pulls.

Invariants: every request that reaches :meth:`Dispatcher.handle` gets exactly one ``after`` call
per hook, with its final outcome, also when the handler answered later (a future or a coroutine:
long polls, SYNC_FLUSH waits) or failed; a request answered later also gets one ``deferred`` call
when it is deferred and one ``settled`` call before its ``after``; a request refused by a hook's
``before`` runs no handler and no later ``before``. A handler's BrokerError (a service's refusal)
is answered with its code and remark, so adapters need not catch it; a ValueError/TypeError is a
bad request (SYSTEM_ERROR naming it); any other exception is the transport's SYSTEM_ERROR.

Hot path (guarded by bench/hot_path.py): a request answered at once allocates nothing here; the
hooks are sorted once into plain lists of bound methods.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from tidemq.broker.metrics import NOT_ERRORS, TIMED_REQUESTS
from tidemq.broker.processors.common import Answer, Handler
from tidemq.errors import BrokerError
from tidemq.remoting import Connection, RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.reply import Reply

if TYPE_CHECKING:
    from tidemq.broker.acl import AclService
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.metrics import BrokerMetrics

log = logging.getLogger(__name__)

SEND_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})
_UNKNOWN_LOGGED = 20  # unsupported request codes logged (then counted only)
_now = time.perf_counter


class Outcome(enum.Enum):
    REFUSED = "refused"  # by a hook, or no handler: no handler ran
    ANSWERED = "answered"  # the handler's response (None: none to send)
    FAILED = "failed"  # the handler raised: the transport answers SYSTEM_ERROR
    CANCELLED = "cancelled"  # the connection went away before a deferred answer


_REFUSED, _ANSWERED, _FAILED, _CANCELLED = Outcome.REFUSED, Outcome.ANSWERED, Outcome.FAILED, Outcome.CANCELLED


class DispatchHook(Protocol):
    """Any method may be missing: a hook implements what it needs."""

    def before(self, conn: Connection, cmd: RemotingCommand, started: float) -> RemotingCommand | None:
        """None to go on, else the response that refuses ``cmd``."""

    def deferred(self, cmd: RemotingCommand, started: float) -> None:
        """The handler will answer ``cmd`` later: ``settled`` and ``after`` follow then."""

    def settled(self, cmd: RemotingCommand, outcome: Outcome) -> None:
        """A deferred ``cmd`` is done (called for deferred requests only: cheaper than ``after``)."""

    def after(self, cmd: RemotingCommand, response: RemotingCommand | None, outcome: Outcome,
              started: float) -> None:
        """``cmd`` is done; ``started`` is its ``time.perf_counter()`` at arrival."""


class Dispatcher:
    """Runs the hooks' ``before`` in order, the handler of the request code, then every ``after``."""

    def __init__(self, handlers: Mapping[int, Handler], hooks: Sequence[object]) -> None:
        self.handlers = handlers
        self.hooks = tuple(hooks)
        self._befores = [h.before for h in hooks if hasattr(h, "before")]
        self._deferreds = [h.deferred for h in hooks if hasattr(h, "deferred")]
        self._settleds = [h.settled for h in hooks if hasattr(h, "settled")]
        self._afters = [h.after for h in hooks if hasattr(h, "after")]
        self.unknown_codes = 0

    def handle(self, conn: Connection, cmd: RemotingCommand) -> Answer:
        started = _now()
        for before in self._befores:
            refusal = before(conn, cmd, started)
            if refusal is not None:
                self._after(cmd, refusal, _REFUSED, started)
                return refusal
        handler = self.handlers.get(cmd.code)
        if handler is None:
            self.unknown_codes += 1
            if self.unknown_codes <= _UNKNOWN_LOGGED:
                log.info("request code %d from %s is not supported", cmd.code, conn.peer)
            resp = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
            self._after(cmd, resp, _REFUSED, started)
            return resp
        try:
            result = handler(conn, cmd)
        except BrokerError as exc:  # a service's refusal: its code and remark are the answer
            result = cmd.response(exc.code or ResponseCode.SYSTEM_ERROR, exc.remark)
        except (ValueError, TypeError) as exc:
            result = cmd.response(ResponseCode.SYSTEM_ERROR, f"bad request (code {cmd.code}): {exc}")
        except Exception:
            self._after(cmd, None, _FAILED, started)
            raise
        if result is None or isinstance(result, RemotingCommand):  # hot path: answered now
            for after in self._afters:
                after(cmd, result, _ANSWERED, started)
            return result
        for deferred in self._deferreds:
            deferred(cmd, started)
        if isinstance(result, (Reply, asyncio.Future)):  # hot path (waiting sends): no task per request
            result.add_done_callback(lambda f: self._done(cmd, f, started))
            return result
        return self._deferred(cmd, result, started)

    def _after(self, cmd: RemotingCommand, response: RemotingCommand | None, outcome: Outcome,
               started: float) -> None:
        for after in self._afters:
            after(cmd, response, outcome, started)

    def _settle(self, cmd: RemotingCommand, response: RemotingCommand | None, outcome: Outcome,
                started: float) -> None:
        for settled in self._settleds:
            settled(cmd, outcome)
        self._after(cmd, response, outcome, started)

    def _done(self, cmd: RemotingCommand, fut: asyncio.Future | Reply, started: float) -> None:
        if fut.cancelled():
            self._settle(cmd, None, _CANCELLED, started)
        elif fut.exception() is not None:
            self._settle(cmd, None, _FAILED, started)
        else:
            self._settle(cmd, fut.result(), _ANSWERED, started)

    async def _deferred(self, cmd: RemotingCommand, pending: Awaitable[RemotingCommand | None],
                        started: float) -> RemotingCommand | None:
        """Await a handler's deferred response (long poll, big batch) and run the hooks then."""
        try:
            result = await pending
        except asyncio.CancelledError:
            self._settle(cmd, None, _CANCELLED, started)
            raise
        except Exception:
            self._settle(cmd, None, _FAILED, started)
            raise
        self._settle(cmd, result, _ANSWERED, started)
        return result


class AclHook:
    """RocketMQ plain ACL: every request's signature and the permissions its header asks for."""

    def __init__(self, acl: "AclService") -> None:
        self.acl = acl

    def before(self, conn: Connection, cmd: RemotingCommand, started: float) -> RemotingCommand | None:
        return self.acl.check(conn, cmd)


class FlowControlHook:
    """SYSTEM_BUSY for a new send while sends pile up behind SYNC_FLUSH (RocketMQ's fast failure:
    its send queue is our set of sends answered later, waiting for the flush or, for a big batch,
    for their turn). The refused send is not stored, so the client's retry cannot duplicate it."""

    def __init__(self, settings: Callable[[], "BrokerConfig"]) -> None:
        self._settings = settings
        # Sends answered later: id(cmd) -> perf_counter at arrival, oldest first. A request is
        # alive (and its id unique) until its after() removes it.
        self.waits: dict[int, float] = {}
        self.rejections = 0

    def before(self, conn: Connection, cmd: RemotingCommand, started: float) -> RemotingCommand | None:
        if self.waits and cmd.code in SEND_CODES:
            return self.busy(cmd, started)
        return None

    def deferred(self, cmd: RemotingCommand, started: float) -> None:
        if cmd.code in SEND_CODES:
            self.waits[id(cmd)] = started

    def settled(self, cmd: RemotingCommand, outcome: Outcome) -> None:
        self.waits.pop(id(cmd), None)

    def busy(self, cmd: RemotingCommand, now: float) -> RemotingCommand | None:
        """The SYSTEM_BUSY answer to a send arriving at ``now``, or None to serve it."""
        waits = self.waits
        cfg = self._settings()
        if len(waits) >= cfg.max_pending_sends:
            remark = "[OVERLOAD]system busy, start flow control for a while"
        else:
            behind_ms = int((now - next(iter(waits.values()))) * 1000)
            if behind_ms < cfg.busy_wait_ms:
                return None
            remark = (f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
                      f"period in queue: {behind_ms}ms, size of queue: {len(waits)}")
        self.rejections += 1
        if self.rejections % 1000 == 1:
            log.warning("flow control: %s (%d sends refused so far)", remark, self.rejections)
        return cmd.response(ResponseCode.SYSTEM_BUSY, remark)


class MetricsHook:
    """Responses by code (a handler failure counts as SYSTEM_ERROR) and the latency of the timed
    requests (sends, pulls) the handlers served, long polls and SYNC_FLUSH waits included."""

    def __init__(self, metrics: "BrokerMetrics") -> None:
        self._on_response = metrics.on_response
        self._on_latency = metrics.on_latency

    def after(self, cmd: RemotingCommand, response: RemotingCommand | None, outcome: Outcome,
              started: float) -> None:
        # Hot path (bench/hot_path.py): a success is not counted; only its latency is.
        if response is not None:
            if response.code not in NOT_ERRORS:
                self._on_response(response.code)
        elif outcome is _FAILED:
            self._on_response(ResponseCode.SYSTEM_ERROR)
        if outcome is _ANSWERED:
            request = TIMED_REQUESTS.get(cmd.code)
            if request is not None:
                self._on_latency(request, _now() - started)

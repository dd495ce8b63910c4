"""The client's instrumentation hooks: what RcqClient and Transaction call around their verbs.

Four calls wrap the verbs that move items: :meth:`Hooks.send` (an enqueue: it may add headers to
the items), :meth:`Hooks.receive` (a dequeue or a receive: it learns the items that came),
:meth:`Hooks.execute` (a one-request transaction, which may do both) and :meth:`Hooks.settle` (a
commit). Each is given the request as a coroutine function and returns what it returns; the base
class here only runs it, and the one-request verbs of RcqClient do not even call it while it is
the one in force (:func:`instrumented`).

The hooks in force are process-wide: :func:`install` replaces them (``rcq.client.tracing.instrument()``
installs OpenTelemetry's), :func:`active` is what the client asks for on every call, so
instrumenting after clients were made still reaches them.

Must not import: opentelemetry (the extra ``rcq[otel]`` may be absent: this module is imported by
every client), the other client modules but :mod:`rcq.client.wire`, rcq.server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from rcq.client.wire import Dequeue, Enqueue, Item

T = TypeVar("T")
Operation = Enqueue | Dequeue | Mapping[str, Any]


class Target(Protocol):
    """Where a call went: the client's transport (its leader, as last learnt, names the server)."""

    @property
    def leader_url(self) -> str | None: ...


class Hooks:
    """No instrumentation: each hook runs the call as it is."""

    async def send(self, target: Target, queue: str, count: int, headers: Mapping[str, str] | None,
                   call: Callable[[Mapping[str, str] | None], Awaitable[T]], *,
                   transaction_id: str | None = None) -> T:
        """``count`` items enqueued into ``queue`` with ``headers`` by ``call(headers)``."""
        return await call(headers)

    async def receive(self, target: Target, queue: str, call: Callable[[], Awaitable[T]],
                      items_of: Callable[[T], Sequence[Item]], *, transaction_id: str | None = None) -> T:
        """Items of ``queue`` taken by ``call()``; ``items_of`` finds them in its answer."""
        return await call()

    async def execute(self, target: Target, operations: Sequence[Operation],
                      call: Callable[[Sequence[Operation]], Awaitable[T]],
                      items_of: Callable[[T], Sequence[Item]]) -> T:
        """A one-request transaction: ``call(operations)``; ``items_of``: the items it dequeued."""
        return await call(operations)

    async def settle(self, target: Target, items: Sequence[Item], call: Callable[[], Awaitable[T]], *,
                     transaction_ids: Sequence[str] = ()) -> T:
        """A commit by ``call()`` of transactions holding ``items`` (what they received, if known)."""
        return await call()


_NONE = Hooks()
_active: Hooks = _NONE


def active() -> Hooks:
    """The hooks in force (the no-op ones unless something was installed)."""
    return _active


def instrumented() -> bool:
    """Whether the hooks in force do anything: if not, a verb may call its request directly (one
    coroutine and one closure less on the hot path)."""
    return type(_active) is not Hooks


def install(hooks: Hooks | None) -> Hooks:
    """Put ``hooks`` in force for every client of the process (None: none); returns the previous ones."""
    global _active
    previous, _active = _active, hooks if hooks is not None else _NONE
    return previous

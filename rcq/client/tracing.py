"""OpenTelemetry tracing for the rcq client (the extra ``rcq[otel]``), after the messaging semantic conventions.

Explicit opt-in, for the whole process (every RcqClient and SyncClient, made before or after)::

    from rcq.client import tracing
    tracing.instrument()            # or instrument(tracer_provider=...); uninstrument() undoes it

Then, on every call that moves items (docs/tracing.md has the table):

* an enqueue (``RcqClient.enqueue``, ``Transaction.enqueue``/``enqueue_batch``, the Enqueue
  operations of ``execute``) is a span ``send <queue>`` of kind PRODUCER, and the context of that
  span is written into each item's headers by the global propagator (W3C ``traceparent`` and
  ``tracestate`` by default): it is the items' creation context. Headers the caller gave win over
  injected ones of the same name;
* a dequeue or a receive (``dequeue``, ``dequeue_items``, ``receive``, ``Transaction.dequeue*``,
  ``commit_and_receive``, ``peek``) is a span ``receive <queue>`` of kind CLIENT linked to the
  creation context of each item that came;
* a commit (``Transaction.commit``, a transaction's ``async with``, ``commit_many``) is a span
  ``commit`` of kind CLIENT (operation type ``settle``) linked to the items it settles;
* :func:`process` is the CONSUMER span the program opens around its own work on items: it links to
  each one's creation context and, for one item with no span around it, is its producer's child, so
  that a job's trace runs from the service that enqueued it to the worker that processed it.

Receive and commit spans are CLIENT, and only the process span CONSUMER, as the conventions have it
since 1.27 (a pull is a client call; processing is what consumes).

Injection never makes an enqueue fail: a cluster below feature level 2 cannot store headers, so when
it refuses an enqueue that carried only injected ones (``feature_level_required``), the enqueue is
sent again without them (refused before anything is buffered, so nothing is doubled; the same
idempotency key) and nothing more is injected towards that client's cluster for
``HEADERS_RETRY_S``; an injected header that would take an item past the header limits of
:mod:`rcq.limits` (a large baggage) is left out, the others still go.

Without the extra this module cannot be imported (ImportError naming the extra); the client itself
never imports it, and imports nothing of OpenTelemetry (:mod:`rcq.client.hooks` is its only link).

Must not import: rcq.client.client, rcq.client.transaction, rcq.client.transport (the client calls
in through :mod:`rcq.client.hooks`), rcq.server.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Tracer, TracerProvider
except ImportError as exc:  # the extra is not installed
    raise ImportError("rcq.client.tracing needs OpenTelemetry: pip install 'rcq[otel]'") from exc

from rcq.client import hooks
from rcq.client.hooks import Hooks, Operation, Target
from rcq.client.wire import Enqueue, Item
from rcq.errors import FeatureLevelRequired
from rcq.limits import HEADER_KEY_BYTES_MAX, HEADER_VALUE_BYTES_MAX, HEADERS_BYTES_MAX, HEADERS_PER_ITEM_MAX
from rcq.version import rcq_version

log = logging.getLogger(__name__)

T = TypeVar("T")
SYSTEM = "rcq"  # messaging.system
INSTRUMENTATION = "rcq.client"  # the tracer's (instrumentation scope's) name
# After a cluster refused injected headers (below feature level 2), how long nothing is injected
# towards it: long enough not to pay a refusal per enqueue, short enough to notice a raised level.
HEADERS_RETRY_S = 60.0
# Links of items dequeued into a transaction, kept until its commit: bounded, as a transaction
# that is aborted or expires is never committed and its entry would stay.
REMEMBERED_TRANSACTIONS_MAX = 10_000

# The messaging conventions' attribute names (written out: the semantic-conventions package moves
# its incubating names between releases).
SYSTEM_ATTRIBUTE = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
BATCH_COUNT = "messaging.batch.message_count"
MESSAGE_ID = "messaging.message.id"
TRANSACTION_ID = "messaging.rcq.transaction.id"  # system-specific: messaging.<system>.*
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"


# ------------------------------------------------------------------------ switching on
def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Trace every rcq client of the process with ``tracer_provider``'s tracer (None: the global
    provider, as set now or later). Calling it again replaces the provider."""
    tracer = trace.get_tracer(INSTRUMENTATION, rcq_version(), tracer_provider=tracer_provider)
    hooks.install(TracingHooks(tracer))


def uninstrument() -> None:
    """Stop tracing rcq clients (spans already open end as usual)."""
    if is_instrumented():
        hooks.install(None)


def is_instrumented() -> bool:
    return isinstance(hooks.active(), TracingHooks)


# ------------------------------------------------------------------ the items' contexts
def creation_context(item: Item) -> SpanContext | None:
    """The span context its producer wrote into ``item``'s headers (None: none, or not valid)."""
    if not item.headers:
        return None
    span_context = trace.get_current_span(propagate.extract(item.headers)).get_span_context()
    return span_context if span_context.is_valid else None


def links_to(items: Sequence[Item]) -> list[Link]:
    """A link to each item's creation context (items without one are skipped), naming the item."""
    links = []
    for item in items:
        span_context = creation_context(item)
        if span_context is not None:
            links.append(Link(span_context, {MESSAGE_ID: str(item.item_id), DESTINATION: item.queue}))
    return links


@contextmanager
def process(items: Item | Sequence[Item], *, tracer_provider: TracerProvider | None = None) -> Iterator[Span]:
    """``with process(tx.items):`` (or one item) around the program's work on received items: a span
    ``process <queue>`` of kind CONSUMER, linked to each item's creation context; when it is one
    item and no span is current, its producer's span is the parent (one trace from the enqueue to
    the work). Works whether or not :func:`instrument` was called (the tracer of
    ``tracer_provider``, else of the instrumentation, else the global one). An exception is
    recorded on the span and raised."""
    batch = [items] if isinstance(items, Item) else list(items)
    queue = _one_queue(item.queue for item in batch)
    attributes = _attributes(queue, "process", "process", len(batch))
    if len(batch) == 1:
        attributes[MESSAGE_ID] = str(batch[0].item_id)
    parent = None
    if len(batch) == 1 and not trace.get_current_span().get_span_context().is_valid and batch[0].headers:
        parent = propagate.extract(batch[0].headers)
    tracer = _tracer_for(tracer_provider)
    with tracer.start_as_current_span(_name("process", queue), context=parent, kind=SpanKind.CONSUMER,
                                      attributes=attributes, links=links_to(batch), record_exception=False,
                                      set_status_on_exception=False) as span, _recording_errors(span):
        yield span


def _tracer_for(tracer_provider: TracerProvider | None) -> Tracer:
    active = hooks.active()
    if tracer_provider is None and isinstance(active, TracingHooks):
        return active.tracer
    return trace.get_tracer(INSTRUMENTATION, rcq_version(), tracer_provider=tracer_provider)


# ---------------------------------------------------------------------- the hooks
class TracingHooks(Hooks):
    """The client's hooks as OpenTelemetry spans (see the module)."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        # per client (its transport): until when nothing is injected (its cluster refused headers)
        self._no_headers_until: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._dequeued: OrderedDict[str, list[Link]] = OrderedDict()  # transaction id -> links of its dequeues

    async def send(self, target: Target, queue: str, count: int, headers: Mapping[str, str] | None,
                   call: Callable[[Mapping[str, str] | None], Awaitable[T]], *,
                   transaction_id: str | None = None) -> T:
        attributes = _attributes(queue, "send", "send", count)
        if transaction_id is not None:
            attributes[TRANSACTION_ID] = transaction_id
        with self._span(_name("send", queue), SpanKind.PRODUCER, attributes, target):
            carrier = self._carrier(target, headers)
            if carrier is None:
                return await call(headers)
            try:
                return await call(carrier)
            except FeatureLevelRequired:
                if headers:
                    raise  # the caller's own headers are refused: theirs to know
                self._refused(target)
                return await call(headers)

    async def receive(self, target: Target, queue: str, call: Callable[[], Awaitable[T]],
                      items_of: Callable[[T], Sequence[Item]], *, transaction_id: str | None = None) -> T:
        attributes = _attributes(queue, "receive", "receive", None)
        if transaction_id is not None:
            attributes[TRANSACTION_ID] = transaction_id
        with self._span(_name("receive", queue), SpanKind.CLIENT, attributes, target) as span:
            answer = await call()
            items = items_of(answer)
            links = self._took(span, items)
            if transaction_id is not None and links:
                self._remember(transaction_id, links)
            return answer

    async def execute(self, target: Target, operations: Sequence[Operation],
                      call: Callable[[Sequence[Operation]], Awaitable[T]],
                      items_of: Callable[[T], Sequence[Item]]) -> T:
        enqueues = [operation for operation in operations if _op(operation) == "enqueue"]
        queue = _one_queue(_queue_of(operation) for operation in operations)
        if enqueues:  # it produces: the items' creation context is this span
            count = sum(len(_items_of(operation)) for operation in enqueues)
            name, kind, attributes = _name("send", queue), SpanKind.PRODUCER, _attributes(queue, "send", "send", count)
        else:
            name, kind, attributes = _name("receive", queue), SpanKind.CLIENT, _attributes(queue, "receive", "receive", None)
        with self._span(name, kind, attributes, target) as span:
            sent = self._inject_operations(target, operations) if enqueues else None
            if sent is None:
                answer = await call(operations)
            else:
                try:
                    answer = await call(sent)
                except FeatureLevelRequired:
                    if any(isinstance(operation, Enqueue) and operation.headers for operation in operations):
                        raise
                    self._refused(target)
                    answer = await call(operations)
            self._took(span, items_of(answer), count=not enqueues)
            return answer

    async def settle(self, target: Target, items: Sequence[Item], call: Callable[[], Awaitable[T]], *,
                     transaction_ids: Sequence[str] = ()) -> T:
        links = links_to(items)
        for transaction_id in transaction_ids:
            links.extend(self._dequeued.pop(transaction_id, ()))
        queue = _one_queue(item.queue for item in items)
        attributes = _attributes(queue, "settle", "commit", len(items) if items else None)
        if len(transaction_ids) == 1:
            attributes[TRANSACTION_ID] = transaction_ids[0]
        # named for the transaction, not a queue: a commit settles and publishes across queues
        with self._span("commit", SpanKind.CLIENT, attributes, target, links):
            return await call()

    # ------------------------------------------------------------------ parts
    @contextmanager
    def _span(self, name: str, kind: SpanKind, attributes: dict[str, Any], target: Target,
              links: Sequence[Link] = ()) -> Iterator[Span]:
        with self.tracer.start_as_current_span(name, kind=kind, attributes=attributes, links=links,
                                               record_exception=False, set_status_on_exception=False) as span:
            try:
                with _recording_errors(span):
                    yield span
            finally:
                _set_server(span, target.leader_url)  # the leader the call ended on

    def _carrier(self, target: Target, headers: Mapping[str, str] | None) -> dict[str, str] | None:
        """The headers to send: the caller's plus the current context's (None: inject nothing)."""
        if self._no_headers_until.get(target, 0.0) > time.monotonic():
            return None
        injected: dict[str, str] = {}
        propagate.inject(injected)
        carrier = dict(headers or {})
        added = False
        # in the propagators' order (traceparent first): an entry that would take the headers past
        # the limits (a large baggage) is left out, and the others still go
        for key, value in injected.items():
            if key not in carrier and _fits({**carrier, key: value}):
                carrier[key], added = value, True
            elif key not in carrier:
                log.debug("header %r of the trace context not injected: the item header limits", key)
        return carrier if added else None

    def _inject_operations(self, target: Target, operations: Sequence[Operation]) -> list[Operation] | None:
        """The operations with the context injected into each Enqueue's headers (None: nothing injected).
        Operations given as dicts are sent as they are: they are the wire's own form."""
        sent: list[Operation] = []
        injected = False
        for operation in operations:
            if isinstance(operation, Enqueue):
                carrier = self._carrier(target, operation.headers)
                if carrier is not None:
                    operation, injected = dataclasses.replace(operation, headers=carrier), True
            sent.append(operation)
        return sent if injected else None

    def _refused(self, target: Target) -> None:
        log.info("the cluster refused item headers (below feature level 2): enqueued without the trace context; "
                 "none is injected for %s s", HEADERS_RETRY_S)
        self._no_headers_until[target] = time.monotonic() + HEADERS_RETRY_S
        trace.get_current_span().add_event("rcq.trace_context_dropped", {"reason": "feature_level_required"})

    def _took(self, span: Span, items: Sequence[Item], *, count: bool = True) -> list[Link]:
        """Record on ``span`` the items a call took: links to their producers, how many, which one."""
        links = links_to(items)
        for link in links:
            span.add_link(link.context, link.attributes)
        if len(items) == 1:
            span.set_attribute(MESSAGE_ID, str(items[0].item_id))
        elif count:
            span.set_attribute(BATCH_COUNT, len(items))
        return links

    def _remember(self, transaction_id: str, links: list[Link]) -> None:
        self._dequeued.setdefault(transaction_id, []).extend(links)
        self._dequeued.move_to_end(transaction_id)
        while len(self._dequeued) > REMEMBERED_TRANSACTIONS_MAX:
            self._dequeued.popitem(last=False)


@contextmanager
def _recording_errors(span: Span) -> Iterator[None]:
    """An exception ends ``span`` as an error: its status, ``error.type`` (rcq's error code when it has
    one) and an exception event; a cancellation is not an error of the call."""
    try:
        yield
    except Exception as exc:
        span.set_attribute(ERROR_TYPE, str(getattr(exc, "code", "") or type(exc).__qualname__))
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:256]))
        raise


def _attributes(queue: str | None, operation_type: str, operation_name: str, count: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {SYSTEM_ATTRIBUTE: SYSTEM, OPERATION_TYPE: operation_type, OPERATION_NAME: operation_name}
    if queue is not None:
        attributes[DESTINATION] = queue
    if count is not None and count != 1:  # the conventions: a batch's size only on batches
        attributes[BATCH_COUNT] = count
    return attributes


def _name(operation: str, queue: str | None) -> str:
    """``{operation} {queue}``, the conventions' span name; the operation alone when queues differ."""
    return operation if queue is None else f"{operation} {queue}"


def _one_queue(queues: Iterator[str | None] | Any) -> str | None:
    found = set(queues)
    return found.pop() if len(found) == 1 else None


def _op(operation: Operation) -> str | None:
    if isinstance(operation, Enqueue):
        return "enqueue"
    if isinstance(operation, Mapping):
        return str(operation.get("op"))
    return "dequeue"


def _queue_of(operation: Operation) -> str | None:
    queue = operation.get("queue") if isinstance(operation, Mapping) else operation.queue
    return queue if isinstance(queue, str) else None


def _items_of(operation: Operation) -> Sequence[Any]:
    items = operation.get("items") if isinstance(operation, Mapping) else getattr(operation, "items", ())
    return items if isinstance(items, Sequence) else ()


def _fits(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` pass the item header limits (docs/limits.md), which a server would check."""
    if len(headers) > HEADERS_PER_ITEM_MAX:
        return False
    total = 0
    for key, value in headers.items():
        key_bytes, value_bytes = len(key.encode("utf-8")), len(value.encode("utf-8"))
        if key_bytes > HEADER_KEY_BYTES_MAX or value_bytes > HEADER_VALUE_BYTES_MAX:
            return False
        total += key_bytes + value_bytes
    return total <= HEADERS_BYTES_MAX


def _set_server(span: Span, url: str | None) -> None:
    if not url:
        return
    parts = urlsplit(url)
    if parts.hostname:
        span.set_attribute(SERVER_ADDRESS, parts.hostname)
    if parts.port is not None:
        span.set_attribute(SERVER_PORT, parts.port)


__all__ = ["HEADERS_RETRY_S", "TracingHooks", "creation_context", "instrument", "is_instrumented", "links_to",
           "process", "uninstrument"]

"""OpenTelemetry tracing of the client (rcq.client.tracing) against a node with in-memory replication,
with the SDK's in-memory exporter: span names, kinds, attributes and links; the trace context in
the items' headers; a cluster below feature level 2; the sync client; off until instrumented."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rcq.client import Dequeue, Enqueue, FeatureLevelRequired, RcqClient, SyncClient, tracing
from rcq.client.wire import Item
from rcq.server.core.commands import SetLevel, encode
from rcq.testing import InMemoryReplicator
from tests.helpers.nodes import running_node, url_of


class Spans(InMemorySpanExporter):
    """The spans finished under ``provider``, and ``tracer``: the test's own spans, of the same provider."""

    def __init__(self) -> None:
        super().__init__()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self))
        self.tracer = self.provider.get_tracer("test")


@pytest.fixture
def spans() -> Iterator[Spans]:
    """The client instrumented with a provider of its own (not the global one), its spans kept here."""
    exporter = Spans()
    tracing.instrument(tracer_provider=exporter.provider)
    try:
        yield exporter
    finally:
        tracing.uninstrument()
        exporter.provider.shutdown()


def at_level_2() -> InMemoryReplicator:
    replicator = InMemoryReplicator()
    replicator.apply_raw(encode(SetLevel(replicator.term, 1, 2, "0.2.0")))
    return replicator


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = named(exporter, name)
    return span


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def linked(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def ids(span: ReadableSpan) -> tuple[int, int]:
    return span.get_span_context().trace_id, span.get_span_context().span_id


async def test_send_injects_its_context_receive_and_commit_link_to_it_process_is_its_child(
        tmp_path: Path, spans: Spans):
    async with running_node(tmp_path, at_level_2()) as node, RcqClient(url_of(node)) as client:
        with spans.tracer.start_as_current_span("request"):
            await client.enqueue("jobs", "a", "b", headers={"tenant": "t1"})
        send = one(spans, "send jobs")
        assert send.kind is SpanKind.PRODUCER
        assert send.parent is not None and send.parent.span_id == one(spans, "request").context.span_id
        assert dict(send.attributes or {}) == {
            "messaging.system": "rcq", "messaging.destination.name": "jobs", "messaging.operation.type": "send",
            "messaging.operation.name": "send", "messaging.batch.message_count": 2,
            "server.address": "127.0.0.1", "server.port": node.port}

        tx = await client.receive("jobs", 10)
        assert tx is not None
        assert [item.headers for item in tx.items] == [{"tenant": "t1", "traceparent": traceparent_of(send)}] * 2
        receive = one(spans, "receive jobs")
        assert receive.kind is SpanKind.CLIENT and receive.parent is None
        assert receive.attributes is not None and receive.attributes["messaging.operation.type"] == "receive"
        assert receive.attributes["messaging.batch.message_count"] == 2
        assert linked(receive) == [ids(send)] * 2
        assert [dict(link.attributes or {}) for link in receive.links] == [
            {"messaging.message.id": str(item.item_id), "messaging.destination.name": "jobs"} for item in tx.items]

        with tracing.process(tx.items[0]):
            pass  # the work
        process = one(spans, "process jobs")
        assert process.kind is SpanKind.CONSUMER
        assert process.parent is not None and process.parent.span_id == send.context.span_id  # one trace
        assert process.context.trace_id == send.context.trace_id and linked(process) == [ids(send)]
        assert process.attributes is not None and process.attributes["messaging.message.id"] == str(tx.items[0].item_id)

        await tx.commit()
        commit = one(spans, "commit")
        assert commit.kind is SpanKind.CLIENT and linked(commit) == [ids(send)] * 2
        assert commit.attributes is not None and commit.attributes["messaging.operation.type"] == "settle"
        assert commit.attributes["messaging.operation.name"] == "commit"
        assert commit.attributes["messaging.rcq.transaction.id"] == tx.transaction_id


async def test_transactions_execute_and_commit_and_receive_are_traced(tmp_path: Path, spans: Spans):
    async with running_node(tmp_path, at_level_2()) as node, RcqClient(url_of(node)) as client:
        async with client.transaction() as tx:
            await tx.enqueue_batch("q", ["a", "b"])
        send = one(spans, "send q")
        assert send.attributes is not None and send.attributes["messaging.rcq.transaction.id"] == tx.transaction_id
        assert linked(one(spans, "commit")) == []  # it settled nothing it received

        spans.clear()
        async with client.transaction() as taker:
            taken = await taker.dequeue_items("q", 1)
        assert linked(one(spans, "receive q")) == [ids(send)]
        assert linked(one(spans, "commit")) == [ids(send)]  # what the transaction dequeued, remembered
        assert taken[0].headers == {"traceparent": traceparent_of(send)}

        spans.clear()
        result = await client.execute([Enqueue("other", ["x"]), Dequeue("q", 5)])
        execute = one(spans, "send")  # two queues: the operation alone
        assert execute.kind is SpanKind.PRODUCER and linked(execute) == [ids(send)]
        assert result.results[1].items[0].headers == {"traceparent": traceparent_of(send)}
        assert (await client.dequeue_items("other"))[0].headers == {"traceparent": traceparent_of(execute)}

        spans.clear()
        await client.enqueue("r", "1")
        await client.enqueue("r", "2")
        first_send, second_send = named(spans, "send r")
        received = await client.receive("r")
        assert received is not None
        following = await received.commit_and_receive()
        assert following is not None and following.items[0].value == b"2"
        receives = named(spans, "receive r")
        assert [linked(span) for span in receives] == [[ids(first_send)], [ids(second_send)]]
        commit = one(spans, "commit")  # the request of commit_and_receive: its commit inside its receive
        assert commit.parent is not None and commit.parent.span_id == receives[1].context.span_id
        assert linked(commit) == [ids(first_send)]
        await following.abort()


async def test_the_callers_headers_win_and_oversized_contexts_are_left_out(tmp_path: Path,
                                                                              spans: Spans):
    theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with running_node(tmp_path, at_level_2()) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("q", "a", headers={"traceparent": theirs})
        # a baggage header of about 6 KB, past the 4 KiB a header value may have
        big = otel_context.get_current()
        for n in range(3):
            big = baggage.set_baggage(f"b{n}", "x" * 2000, big)
        token = otel_context.attach(big)
        try:
            await client.enqueue("q", "b", headers={"k": "v"})
        finally:
            otel_context.detach(token)
        a, b = await client.dequeue_items("q", 2)
        assert a.headers == {"traceparent": theirs}
        second = named(spans, "send q")[1]
        assert b.headers == {"k": "v", "traceparent": traceparent_of(second)}  # no baggage: it would not fit


async def test_below_level_2_plain_enqueues_still_work_without_the_context(tmp_path: Path,
                                                                          spans: Spans):
    async with running_node(tmp_path, feature_level_auto=False) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("q", "a")  # refused with the context, sent again without
        first = one(spans, "send q")
        assert [event.name for event in first.events] == ["rcq.trace_context_dropped"]
        assert first.status.status_code is StatusCode.UNSET
        spans.clear()
        async with client.transaction() as tx:
            await tx.enqueue("q", "b")  # nothing injected now: no refusal
        assert one(spans, "send q").events == ()
        await client.execute([Enqueue("q", ["c"])])
        assert [item.headers for item in await client.dequeue_items("q", 3)] == [{}, {}, {}]

        spans.clear()
        with pytest.raises(FeatureLevelRequired):  # the caller's own headers: refused, as without tracing
            await client.enqueue("q", "d", headers={"k": "v"})
        failed = one(spans, "send q")
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.attributes is not None and failed.attributes["error.type"] == "feature_level_required"


def test_the_sync_client_is_traced_under_the_calling_threads_span(tmp_path: Path, spans: Spans):
    async def main() -> None:
        async with running_node(tmp_path, at_level_2()) as node:
            url = url_of(node)

            def produce_and_consume() -> list[Item]:
                with SyncClient(url) as sync, spans.tracer.start_as_current_span("view"):
                    sync.enqueue("q", "a")
                    with sync.transaction() as tx:
                        tx.enqueue("q", "b")
                    received = sync.receive("q", 10)
                    assert received is not None
                    with tracing.process(received.items):
                        received.commit()
                    return received.items

            items = await asyncio.to_thread(produce_and_consume)
            view = one(spans, "view")
            sends = named(spans, "send q")
            assert len(sends) == 2 and all(span.parent is not None and span.parent.span_id == view.context.span_id
                                           for span in sends)
            assert [item.headers["traceparent"] for item in items] == [traceparent_of(span) for span in sends]
            process = one(spans, "process q")  # two items: under the current span, linked to both
            assert process.parent is not None and process.parent.span_id == view.context.span_id
            assert linked(process) == [ids(span) for span in sends]
            commit = named(spans, "commit")[1]  # the first: the transaction that enqueued b
            assert commit.parent is not None and commit.parent.span_id == process.context.span_id
            assert linked(commit) == [ids(span) for span in sends]

    asyncio.run(main())


async def test_nothing_is_traced_or_injected_unless_instrumented(tmp_path: Path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not tracing.is_instrumented()
    async with running_node(tmp_path, at_level_2()) as node, RcqClient(url_of(node)) as client:
        with provider.get_tracer("test").start_as_current_span("request"):
            await client.enqueue("q", "a")
        tracing.instrument(tracer_provider=provider)
        try:
            assert tracing.is_instrumented()
            await client.enqueue("q", "b")  # a client made before instrument() is traced too
        finally:
            tracing.uninstrument()
        (a, b) = await client.dequeue_items("q", 2)
    assert a.headers == {} and set(b.headers) == {"traceparent"}
    assert [span.name for span in exporter.get_finished_spans()] == ["request", "send q"]
    provider.shutdown()

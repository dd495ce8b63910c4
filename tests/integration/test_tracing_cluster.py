"""OpenTelemetry tracing across a real 3-node cluster: a producer's span and the consumer's spans for
its item share the trace and are linked; at feature level 1 plain enqueues still work, untraced."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from rcq.client import RcqClient, SyncClient, tracing
from tests.helpers import CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue, running_cluster

pytestmark = pytest.mark.cluster

OVERRIDES = {"feature_level_auto": False}  # held at level 1 until the test raises it


def show(spans: list[ReadableSpan]) -> str:
    """The spans as the closing note shows them: name, kind, trace, parent and links (short ids)."""
    short = {span.context.span_id: f"{span.context.span_id:016x}"[:6] for span in spans}

    def ref(span_id: int) -> str:
        return short.get(span_id, f"{span_id:016x}"[:6])

    lines = []
    for span in spans:
        parent = ref(span.parent.span_id) if span.parent is not None else "-"
        links = ", ".join(ref(link.context.span_id) for link in span.links) or "-"
        trace_id = f"{span.context.trace_id:032x}"[:8]
        lines.append(f"{short[span.context.span_id]} {span.name:<28} {span.kind.name:<8} trace {trace_id} "
                     f"parent {parent:<6} links {links}")
    return "\n".join(lines)


def one(spans: list[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    (span,) = [span for span in spans if span.name == name and span.kind is kind]
    return span


async def test_a_job_is_one_trace_from_its_enqueue_to_its_processing_and_commit() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(tracer_provider=provider)
    try:
        with running_cluster(overrides=OVERRIDES) as cluster:
            queue = fresh_queue("jobs")
            async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                                 **cluster.client_options()) as old_client:
                await old_client.enqueue(queue, "at-level-1")  # injected headers refused: sent again without
                assert (await old_client.raise_feature_level(2))["level"] == 2
                old = await old_client.dequeue_items(queue)
                assert [(item.value, item.headers) for item in old] == [(b"at-level-1", {})]
                # (this client now injects nothing for tracing.HEADERS_RETRY_S: a new one does)
            exporter.clear()

            async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                                 **cluster.client_options()) as producer:
                with provider.get_tracer("test").start_as_current_span("handle request"):
                    await producer.enqueue(queue, "job-1", headers={"tenant": "t1"})

                def consume() -> None:  # another program: a worker, with the sync client
                    with SyncClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                                    **cluster.client_options()) as worker:
                        tx = worker.receive(queue, max_items=1, wait_ms=5000)
                        assert tx is not None and tx.items[0].value == b"job-1"
                        with tracing.process(tx.items[0]):
                            tx.commit()

                await asyncio.to_thread(consume)
    finally:
        tracing.uninstrument()
        provider.shutdown()

    spans = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
    print("\n" + show(spans))
    request = one(spans, "handle request", SpanKind.INTERNAL)
    send = one(spans, f"send {queue}", SpanKind.PRODUCER)
    receive = one(spans, f"receive {queue}", SpanKind.CLIENT)
    process = one(spans, f"process {queue}", SpanKind.CONSUMER)
    commit = one(spans, "commit", SpanKind.CLIENT)

    send_id = (send.context.trace_id, send.context.span_id)
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert [(link.context.trace_id, link.context.span_id) for link in receive.links] == [send_id]
    assert receive.context.trace_id != send.context.trace_id  # the worker's own trace: linked, not joined
    # the processing continues the producer's trace: its child, and linked to it
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context.trace_id == send.context.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [send_id]
    assert commit.parent is not None and commit.parent.span_id == process.context.span_id
    assert [(link.context.trace_id, link.context.span_id) for link in commit.links] == [send_id]

    for span in (send, receive, process, commit):
        attributes = dict(span.attributes or {})
        assert attributes["messaging.system"] == "rcq" and attributes["messaging.destination.name"] == queue
    assert dict(send.attributes or {})["messaging.operation.type"] == "send"
    assert dict(receive.attributes or {})["messaging.operation.type"] == "receive"
    assert dict(process.attributes or {})["messaging.operation.type"] == "process"
    assert dict(commit.attributes or {})["messaging.operation.type"] == "settle"
    assert dict(send.attributes or {})["server.address"] == "127.0.0.1"
    item_id = dict(receive.attributes or {})["messaging.message.id"]
    assert dict(process.attributes or {})["messaging.message.id"] == item_id

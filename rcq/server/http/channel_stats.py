"""What a node counts of its session channels, for ``/metrics``: kept by the channel, read by the collector.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass
class ChannelStats:
    in_flight: int = 0
    frames_in: int = 0
    frames_out: int = 0
    opened_total: int = 0
    closed_total: Counter[int] = field(default_factory=Counter)  # by close code
    per_client: Counter[str] = field(default_factory=Counter)  # open channels, for the per-client cap

    @property
    def open(self) -> int:
        return sum(self.per_client.values())

    def metrics(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("rcq_session_channels", "Session channels open on this node", value=self.open)
        yield CounterMetricFamily("rcq_session_channels_opened", "Session channels opened", value=self.opened_total)
        closed = CounterMetricFamily("rcq_session_channels_closed", "Session channels closed, by WebSocket close code",
                                     labels=["code"])
        for code, count in sorted(self.closed_total.items()):
            closed.add_metric([str(code)], count)
        yield closed
        yield CounterMetricFamily("rcq_session_frames_in", "Request frames read from session channels",
                                  value=self.frames_in)
        yield CounterMetricFamily("rcq_session_frames_out", "Answer frames written to session channels",
                                  value=self.frames_out)
        yield GaugeMetricFamily("rcq_session_requests_in_flight", "Requests of session channels being served",
                                value=self.in_flight)

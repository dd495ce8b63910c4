"""What a node counts of its session channels, for ``/metrics``: kept by the channel, read by the collector.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
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
    reads_paused_total: int = 0  # times a channel was not read because its client left answers unread
    unsent_bytes: Callable[[], int] = lambda: 0  # answer bytes written but not yet taken, over open channels

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
        yield GaugeMetricFamily("rcq_session_unsent_bytes", "Answer bytes of session channels written but not yet "
                                "taken by their clients", value=self.unsent_bytes())
        yield CounterMetricFamily("rcq_session_reads_paused", "Times a session channel was not read because its "
                                  "unsent answers were past session_unsent_bytes_max", value=self.reads_paused_total)

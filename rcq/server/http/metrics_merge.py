"""A node's ``/metrics`` with its partition processes' series (docs/partitions.md).

At a node's own port (p0's process) ``GET /metrics`` answers this process's series as before and,
after them in each family, the series of every partition process this node runs, read from its
``/metrics`` and given a ``partition`` label with its name: one scrape of a node sees all of it.
A series without ``partition`` is the process asked (p0, at a node's own port). A partition
process that does not answer is left out, and counted in ``rcq_partition_metrics_unanswered``.

Families are merged by name: one ``# HELP`` and ``# TYPE`` each, as the text format requires, the
partition processes' samples after this process's.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

PARTITION_LABEL = "partition"


class _Merged(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merged(own: Iterable[Metric], others: Mapping[str, str], unanswered: int) -> bytes:
    """The text format of ``own`` families, each followed by the same family's samples of every
    partition's text in ``others`` (partition -> its ``/metrics``), labelled with the partition."""
    families: dict[str, Metric] = {}
    for family in own:
        families[family.name] = family
    for partition, text in sorted(others.items()):
        for family in text_string_to_metric_families(text):
            target = families.get(family.name)
            if target is None:
                target = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            target.samples.extend(
                Sample(s.name, {**s.labels, PARTITION_LABEL: partition}, s.value, s.timestamp, s.exemplar)
                for s in family.samples)
    counted = GaugeMetricFamily("rcq_partition_metrics_unanswered",
                                "Partition processes of this node whose /metrics did not answer this scrape",
                                value=unanswered)
    families[counted.name] = counted
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families.values()))
    return generate_latest(registry)

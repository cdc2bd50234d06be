"""Gauges in Prometheus's text exposition format (node_exporter's textfile collector), written by
``prometheus_client``: its metric families, a registry of them, and its ``generate_latest`` for the text (the
escaping of help texts and label values, the ``# HELP``/``# TYPE`` lines, the numbers in Go's float form, labels
in name order).

A file of a run's or a job's outcome holds values known when it is written, not live instruments: each family is
a :class:`~prometheus_client.core.GaugeMetricFamily` (what the library offers custom collectors), never a
``Gauge``, whose values would go to files of their own under ``PROMETHEUS_MULTIPROC_DIR`` where that is set.

Import this module where the text is made, not at the top of a module a node's own check (``check --local``)
imports: ``prometheus_client`` brings an HTTP server's modules along.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

__all__ = ["Sample", "gauge", "gauges_text", "registry_of", "registry_text"]

# One series: its label values, in the order of the family's label names, and its value.
Sample = tuple[Sequence[object], float]


def gauge(name: str, help_text: str, labels: Sequence[str], samples: Iterable[Sample]) -> GaugeMetricFamily:
    """A gauge family; ValueError for a name Prometheus does not take. A label value is its text (None: empty).
    Label values given twice make one series, of the last value (a file with a series twice is refused whole)."""
    series: dict[tuple[str, ...], float] = {}
    for values, value in samples:
        if len(values) != len(labels):
            raise ValueError(f"{name}: {len(values)} label values for the labels {', '.join(labels)}")
        series[tuple("" if v is None else str(v) for v in values)] = float(value)
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in series.items():
        family.add_metric(values, value)
    return family


class _Fixed:
    """A collector of one family made beforehand; it describes itself, so a name registered twice is refused."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        yield self._family

    describe = collect


def registry_of(families: Iterable[Metric]) -> CollectorRegistry:
    """A registry of its own (never the process's default one) holding ``families``, in their order."""
    registry = CollectorRegistry()
    for family in families:
        registry.register(_Fixed(family))
    return registry


def registry_text(registry: CollectorRegistry) -> str:
    """The registry's families in the text exposition format, as ``prometheus_client`` writes it."""
    return generate_latest(registry).decode("utf-8")


def gauges_text(families: Iterable[Metric]) -> str:
    """``families`` in the text exposition format: :func:`registry_text` of :func:`registry_of`."""
    return registry_text(registry_of(families))

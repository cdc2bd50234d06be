"""The Prometheus text file as a scraper reads it: parsed back with prometheus_client's own parser, every series
with its exact value, and label values holding quotes, backslashes and newlines read back as they were."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.ops.after_run import Operations, after_run
from cluster_accept.probes.gemm import METRICS as RULES
from cluster_accept.reports.gauges import gauge, gauges_text
from cluster_accept.reports.summary import VERDICTS, prometheus_text
from cluster_accept.vocabulary.figures import Figure
from cluster_accept.vocabulary.rows import Measurement

ODD = 'rack "7"\\gpu\nnode01'  # a quote, a backslash and a newline
CLUSTER = 'c\\"x"\n'
RUN = {"run_id": "r1", "cluster": CLUSTER, "started": "2026-11-21T10:00:00+00:00", "ended": "2026-11-21T10:05:00+00:00"}


def _series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(name, labels) -> value of every sample; a series given twice fails the test."""
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, key
            found[key] = sample.value
    return found


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_the_run_file_parses_back_to_its_values_and_odd_labels(tmp_path: Path) -> None:
    verdicts = [
        VerdictRow("r1", CLUSTER, ODD, "p", Verdict.REJECTED),
        VerdictRow("r1", CLUSTER, "n2", "p", Verdict.ACCEPTED),
    ]
    figure = Measurement.of(
        Figure("gemm_bf16_tflops", 741.2534, gpu=0, unit="TFLOP/s"), "r1", CLUSTER, "single-node", ODD, "p"
    )
    path = tmp_path / "textfile" / "ca.prom"
    after_run(tmp_path / "run", RUN, verdicts, [], [figure], Operations(prometheus=str(path)), RULES)
    got = _series(path.read_text(encoding="utf-8"))
    for node, outcome in ((ODD, Verdict.REJECTED), ("n2", Verdict.ACCEPTED)):
        for each in VERDICTS:
            key = _key("cluster_accept_node_verdict", cluster=CLUSTER, node=node, verdict=each.value)
            assert got.pop(key) == (1.0 if each == outcome else 0.0)
    assert got.pop(_key("cluster_accept_gemm_bf16_tflops", cluster=CLUSTER, node=ODD)) == 741.253  # 6 digits
    for each in VERDICTS:
        count = 1.0 if each in (Verdict.REJECTED, Verdict.ACCEPTED) else 0.0
        assert got.pop(_key("cluster_accept_nodes", cluster=CLUSTER, verdict=each.value)) == count
    assert got.pop(_key("cluster_accept_last_run_timestamp_seconds", cluster=CLUSTER)) == 1795255500.0
    assert got == {}


def test_help_texts_and_families_read_back() -> None:
    text = prometheus_text({"run_id": "r1", "cluster": "c"}, [], {("n1", "hbm_copy_gbps"): 3012.5})
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert list(families) == ["cluster_accept_node_verdict", "cluster_accept_hbm_copy_gbps", "cluster_accept_nodes"]
    assert families["cluster_accept_node_verdict"].samples == []  # no node: the family's header alone
    assert families["cluster_accept_hbm_copy_gbps"].documentation == (
        "Median HBM copy bandwidth over the node's GPUs, GB/s."
    )


def test_gauges_keep_one_series_per_label_set_and_refuse_what_prometheus_would() -> None:
    family = gauge("ca_x", 'help with \\ and\nnewline "q"', ("a", "b"), [(("1", None), 1), (("1", None), 2.5)])
    text = gauges_text([family])
    assert text.splitlines()[-1] == 'ca_x{a="1",b=""} 2.5'  # the last value; None as an empty label value
    (read,) = text_string_to_metric_families(text)
    assert read.documentation == 'help with \\ and\nnewline "q"'
    with pytest.raises(ValueError, match="1 label values for the labels a, b"):
        gauge("ca_x", "h", ("a", "b"), [(("1",), 1.0)])
    with pytest.raises(ValueError, match="invalid metric name|Duplicated timeseries"):
        gauges_text([family, gauge("ca_x", "h", (), [])])

"""The arrival lag is read once, by the judgement (:mod:`watch.judge.lag`): the page's lag chart and summary and the
``cluster_accept_watch_arrival_lag_ms`` gauge draw the lags it named or cleared a compute straggler by, whether
they are the judgement's own (:class:`Judgement`) or read from the same rows again. On jobs that timed their
collectives on the device and on jobs known by their enqueue times only (on the nodes' clocks), real and synthetic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster_accept.watch import report
from cluster_accept.watch.files import WatchFiles
from cluster_accept.watch.judge import Judgement, WatchRules, judge
from cluster_accept.watch.report import watch_context, watch_prometheus
from cluster_accept.watch.rounds import WatchState
from cluster_accept.watch.words import CollectiveSeen, RankSeen
from tests.test_live_job_localize import MS, Job, S, _captured

pytestmark = pytest.mark.unit

KEY = ["rank", "communicator", "seq"]
Rows = tuple[str, list[RankSeen], list[CollectiveSeen], WatchRules, int]


def _real(name: str, window_s: float) -> Callable[[], Rows]:
    def rows() -> Rows:
        ranks, collectives, now = _captured(name)
        return ranks[0].job, ranks, collectives, WatchRules(window_s=window_s), now

    return rows


def _synthetic(timed: bool) -> Rows:
    """Three nodes, rank 5 60 ms late from step 20, node01's clock 40 ms ahead (its reads measured it, an older
    read of it less so), one collective a rank's record of is missing, and a window shorter than the run."""
    job = Job(nodes=3, slow={5: (20, 60.0)}, offsets_ms={"node01": 40.0}, seed=2)
    collectives = job.collectives()
    if not timed:
        collectives = [replace(c, exec_ms=None, backend="gloo") for c in collectives]
    collectives = [c for c in collectives if (c.rank, c.seq) != (0, 100)]
    now = job.end_ns + S
    older = [replace(r, clock_offset_ns=r.clock_offset_ns // 2) for r in job.reads(now - 12 * S)]
    rules = WatchRules(window_s=8.0, persist_min_s=1.0)  # a window of seconds: persistence under it
    return "job1", older + job.reads(now - 5 * S, now - S // 2), collectives, rules, now


JOBS = {
    "h200x4_cotenant": _real("h200x4_cotenant", 30.0),  # NCCL with timing: on the device
    "testbed_gloo_healthy": _real("testbed_gloo_healthy", 60.0),  # gloo: enqueue times
    "synthetic_timed": lambda: _synthetic(True),
    "synthetic_enqueue": lambda: _synthetic(False),
}
ON_DEVICE = {
    "h200x4_cotenant": True,
    "testbed_gloo_healthy": False,
    "synthetic_timed": True,
    "synthetic_enqueue": False,
}


def _gauge(text: str) -> dict[tuple[str, int], float]:
    """The arrival lag gauge read back by Prometheus's parser: (node, rank) -> ms."""
    return {
        (s.labels["node"], int(s.labels["rank"])): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "cluster_accept_watch_arrival_lag_ms"
        for s in family.samples
    }


def _medians(lags: pd.DataFrame, by: list[str]) -> dict[object, float]:
    return {k: float(v) for k, v in lags.groupby(by)["lag_ms"].median().items()}


def _assert_drawn_as_judged(
    job: str, ranks: list[RankSeen], collectives: list[CollectiveSeen], judged: Judgement
) -> None:
    lags = judged.lags_of(job)
    for given in (lags, None):  # the judgement's own lags, or read from the rows again
        drawn = report._arrival_lags(job, ranks, collectives, judged.window_ns, given)
        assert len(drawn) == len(lags)
        pd.testing.assert_series_equal(
            drawn.set_index(KEY)["lag_ms"].sort_index(), lags.set_index(KEY)["lag_ms"].sort_index()
        )
        context = watch_context(job, judged.findings, ranks, collectives, [], judged.window_ns, given)
        assert {r["rank"]: r["median_lag_ms"] for r in context["lag_summary"]} == _medians(lags, ["rank"])
        assert context["collectives_seen"] == lags.groupby(["communicator", "seq"]).ngroups
        text = watch_prometheus(job, "c", judged.findings, ranks, collectives, judged.window_ns, given)
        assert _gauge(text) == {(n, int(r)): v for (n, r), v in _medians(lags, ["node", "rank"]).items()}


@pytest.mark.parametrize("name", JOBS)
def test_the_page_and_the_gauge_draw_the_lags_the_judgement_read(name: str) -> None:
    job, ranks, collectives, rules, now = JOBS[name]()
    judged = judge(ranks, collectives, rules, now)
    lags = judged.lags_of(job)
    assert lags.groupby(["communicator", "seq"]).ngroups > 10  # a window of collectives, not an empty one
    assert bool(lags["on_device"].mean() > 0.9) is ON_DEVICE[name]  # the rule the case holds: device or enqueue
    assert judged.window_ns == (now - int(rules.window_s * 1e9), now)
    _assert_drawn_as_judged(job, ranks, collectives, judged)


def test_the_old_rules_would_have_drawn_other_lags() -> None:
    """What the page drew before it took the judgement's lags: the enqueue lag of every collective two ranks or more
    recorded, over the whole run. On the timed job it differs from the judgement's (on the device, in the window,
    only collectives every rank recorded)."""
    job, ranks, collectives, rules, now = _synthetic(True)
    judged = judge(ranks, collectives, rules, now).lags_of(job)
    enqueue = report._arrival_lags(job, ranks, [replace(c, exec_ms=None) for c in collectives])
    assert len(enqueue) > len(judged)
    assert enqueue.groupby("rank")["lag_ms"].median()[5] != pytest.approx(judged.groupby("rank")["lag_ms"].median()[5])


def test_the_watch_files_draw_the_last_judgement(tmp_path: Path) -> None:
    """``watch.prom`` and the page of a finished watch: the judgement's lags, even where reads were added to the
    state after it (a re-test waiting for the job to leave reads the nodes again, their clocks measured anew)."""
    job, ranks, collectives, rules, now = _synthetic(False)
    judged = judge(ranks, collectives, rules, now)
    state = WatchState(keep_s=2 * rules.window_s)
    state.ranks = [*ranks, *(replace(r, clock_offset_ns=r.clock_offset_ns + 3 * MS, read_ns=now) for r in ranks)]
    state.collectives = {(c.rank, c.communicator, c.seq): c for c in collectives}
    files = WatchFiles.start(tmp_path, job, ["node00", "node01", "node02"], "clu", None)
    files.finish(state, judged.findings, str(tmp_path / "textfile.prom"), judged)
    lags = judged.lags_of(job)
    expected = {(n, int(r)): v for (n, r), v in _medians(lags, ["node", "rank"]).items()}
    for path in (files.run_dir / "watch.prom", tmp_path / "textfile.prom"):
        assert _gauge(path.read_text()) == expected
    assert 'data-chart="arrival-lag"' in (files.run_dir / "watch.html").read_text()

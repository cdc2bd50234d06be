"""A watch's directory: ``OUT/<watch_id>/`` with ``watch.json`` and one Parquet file per watch table, written
whole after every round (what was seen is on disk whatever stops the watch), then the page, the Prometheus
gauges and the history's copies when the watch ends."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_accept.analysis.history import append_run
from cluster_accept.analysis.schemas import WATCH_TABLES, write_table
from cluster_accept.rundir.outputs import RunDir, now_iso, start_run
from cluster_accept.rundir.run import history_dir
from cluster_accept.vocabulary.own_files import replace_whole
from cluster_accept.watch.judge import Judgement
from cluster_accept.watch.report import watch_page, watch_prometheus
from cluster_accept.watch.rounds import WatchState
from cluster_accept.watch.words import WatchFinding


@dataclass
class WatchFiles:
    run_dir: Path
    run: RunDir
    job: str
    cluster: str
    history: Path | None

    @classmethod
    def start(cls, out_dir: Path, job: str, nodes: Sequence[str], cluster: str, history: str | None) -> WatchFiles:
        run, _ = start_run(out_dir, None, {"kind": "watch", "job": job, "nodes": list(nodes), "cluster": cluster})
        return cls(run.path, run, job, cluster, history_dir(out_dir, history))

    def write(self, state: WatchState, findings: Sequence[WatchFinding]) -> None:
        tables: dict[str, Sequence[Any]] = {
            "watch_ranks": state.ranks,
            "watch_collectives": sorted(state.collectives.values(), key=lambda c: (c.enqueue_ns, c.rank)),
            "watch_coverage": list(state.coverage.values()),
            "watch_findings": findings,
            "watch_nccl_diagnostics": state.diagnostics,
        }
        for name, rows in tables.items():
            write_table(self.run_dir / f"{name}.parquet", rows, WATCH_TABLES[name])

    def finish(
        self,
        state: WatchState,
        findings: Sequence[WatchFinding],
        prometheus: str | None,
        judged: Judgement | None = None,
    ) -> None:
        """The tables, the page and the gauges; ``judged``: the last judgement, whose window and arrival lags the
        page and the gauges draw (without it, the lags are read from the rows by the judgement's rule)."""
        self.write(state, findings)
        collectives = list(state.collectives.values())
        window = judged.window_ns if judged is not None else None
        lags = judged.lags_of(self.job) if judged is not None else None
        coverage = list(state.coverage.values())
        html, markdown = watch_page(self.job, findings, state.ranks, collectives, coverage, window, lags)
        replace_whole(self.run_dir / "watch.html", html)
        replace_whole(self.run_dir / "watch.md", markdown)
        gauges = watch_prometheus(self.job, self.cluster, findings, state.ranks, collectives, window, lags)
        replace_whole(self.run_dir / "watch.prom", gauges)
        if prometheus:
            replace_whole(Path(prometheus), gauges)
        if self.history is not None:
            append_run(self.history, self.run_dir, self.run.run_id, time.strftime("%Y-%m-%d", time.gmtime()),
                       tuple(WATCH_TABLES))  # fmt: skip
        info = {"kind": "watch", "job": self.job, "cluster": self.cluster, "ended": now_iso(), "rounds": state.rounds,
                "problems": state.problems}  # fmt: skip
        self.run.write_json("watch.json", info)
        self.run.release()

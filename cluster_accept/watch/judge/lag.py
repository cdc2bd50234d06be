"""A rank's arrival lag at the job's collectives: the one rule the compute straggler is judged by, and the one the
page's lag chart and the ``cluster_accept_watch_arrival_lag_ms`` gauge draw (:mod:`watch.report`).

Per collective (a communicator's sequence number) that every rank of its communicator recorded, two ranks or
more, each rank's lag is how much later than the median rank it arrived. Where every rank's execution time is known
(NCCL timing), the lag is read from those: the rank that arrives last waits least, so its lag is the median
execution time less its own (a GPU collective's CPU enqueue says when its launch was queued, not when the GPU got
to it, and the difference of two execution times needs no clock across nodes). Otherwise it is its earliest
enqueue on the watcher's clock less the median one. A node's lag at a collective is its latest rank's."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cluster_accept.watch.judge.window import NS_PER_MS, Window, entered_since, on_watcher_clock
from cluster_accept.watch.words import CollectiveSeen, RankSeen

KEY = ["communicator", "seq"]


def arrival_lags(frame: pd.DataFrame) -> pd.DataFrame:
    """The records of ``frame`` (one per rank, communicator and sequence number, on the watcher's clock) of
    collectives every rank of the communicator recorded (two ranks or more), with each rank's lag behind the
    median arrival (``lag_ms``), whether it was read on the device (``on_device``), the median enqueue
    (``median_ns``) and the arrival the lag says (``arrived_ns``: enqueue or on the device)."""
    members = frame.groupby("communicator")["rank"].nunique()
    size = frame["communicator"].map(members)
    full = frame[(frame.groupby(KEY)["rank"].transform("nunique") == size) & (size >= 2)].copy()
    base_ns = int(full["arrival_ns"].min()) if len(full) else 0
    full["since_ns"] = full["arrival_ns"].astype("int64") - base_ns  # small integers: a float median keeps ns
    median = full.groupby(KEY)["since_ns"].transform("median")
    full["lag_ms"] = (full["since_ns"] - median) / NS_PER_MS
    timed = full.groupby(KEY)["exec_ms"].transform("count") == full.groupby(KEY)["exec_ms"].transform("size")
    waited = full.groupby(KEY)["exec_ms"].transform("median") - full["exec_ms"]
    full["on_device"] = timed
    full.loc[timed, "lag_ms"] = waited[timed]
    full["median_ns"] = median + base_ns
    full["arrived_ns"] = full["median_ns"] + full["lag_ms"] * NS_PER_MS
    return full.drop(columns="since_ns")


def arrivals(window: Window) -> pd.DataFrame:
    """The lags of the window's collectives (:func:`arrival_lags`): those entered within ``window_s`` before
    now."""
    return arrival_lags(window.in_window())


def job_lags(
    job: str, ranks: Sequence[RankSeen], collectives: Sequence[CollectiveSeen], since_ns: int | None = None
) -> pd.DataFrame:
    """The lags the judgement reads from these rows (:func:`arrivals`), for whoever draws them: the same rows on
    the same clocks (:func:`window.on_watcher_clock`), the collectives entered at ``since_ns`` or later (the
    window's start, :func:`window.span_ns`; None: every one)."""
    frame = on_watcher_clock(job, ranks, collectives).collectives
    return arrival_lags(frame if since_ns is None else entered_since(frame, since_ns))

"""The Parquet schemas of a run directory, explicit and versioned; every file is written with its schema.

These files, not Prefect's database, are the record of a run: Prefect's ephemeral API loses task records.
Bump ``SCHEMA_VERSION`` when a column changes meaning; adding a column is compatible.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = "1"

RUNS = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("started", pa.timestamp("s", tz="UTC")),
        ("ended", pa.timestamp("s", tz="UTC")),
        ("stages", pa.list_(pa.string())),
        ("inventory", pa.string()),
        ("inventory_digest", pa.string()),
        ("nodes_tested", pa.int32()),
        ("accepted", pa.int32()),
        ("rejected", pa.int32()),
        ("unreachable", pa.int32()),
        ("skipped", pa.int32()),
        ("tool_version", pa.string()),
        ("schema_version", pa.string()),
    ],
    metadata={"cluster_accept_schema": "runs", "version": SCHEMA_VERSION},
)

CHECKS = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("stage", pa.string()),
        ("node", pa.string()),
        ("gpu", pa.int32()),
        ("check", pa.string()),
        ("item", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("observed", pa.string()),
        ("expected", pa.string()),
        ("detail", pa.string()),
        ("raw_output", pa.string()),
        ("command", pa.string()),  # the node-side command whose output is the evidence (empty: none)
    ],
    metadata={"cluster_accept_schema": "checks", "version": SCHEMA_VERSION},
)

NODE_VALUES = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("node", pa.string()),
        ("check", pa.string()),
        ("key", pa.string()),
        ("value", pa.string()),
    ],
    metadata={"cluster_accept_schema": "node_values", "version": SCHEMA_VERSION},
)

MEASUREMENTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("stage", pa.string()),
        ("probe", pa.string()),
        ("node", pa.string()),
        ("profile", pa.string()),
        ("gpu", pa.int32()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("unit", pa.string()),
        ("dtype", pa.string()),
        ("size", pa.int64()),  # GEMM: n of an n x n x n product; copies and all-reduce: bytes
        ("iterations", pa.int64()),
        ("label", pa.string()),  # all-reduce: intra_node / inter_node
        ("world_size", pa.int32()),
        ("algbw_gbps", pa.float64()),
        ("sm_clock_mhz", pa.float64()),
        ("mem_clock_mhz", pa.float64()),
        ("power_w", pa.float64()),
        ("temp_c", pa.float64()),
        ("clock_event_reasons", pa.string()),
        ("transport", pa.string()),  # all-reduce: what NCCL used, e.g. P2P/CUMEM, NET/Socket
        ("group", pa.string()),  # multi-node all-reduce: the nodes of the run, folded (node[01-04])
        ("model", pa.string()),  # training: the model trained (probes.training.judge.model_text)
        ("repeat_cv", pa.float64()),  # the repeats' coefficient of variation: the figure's own noise
    ],
    metadata={"cluster_accept_schema": "measurements", "version": SCHEMA_VERSION},
)

BURN = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("node", pa.string()),
        ("gpu", pa.int32()),
        ("kind", pa.string()),  # throughput (one window of the GPU's load) or sample (nvidia-smi)
        ("t_s", pa.float64()),  # seconds since the burn started
        ("value", pa.float64()),  # throughput: GEMM rate over the window
        ("unit", pa.string()),
        ("sm_clock_mhz", pa.float64()),
        ("mem_clock_mhz", pa.float64()),
        ("power_w", pa.float64()),
        ("temp_c", pa.float64()),
        ("reasons", pa.string()),  # active clock event reasons, NVML's bitmask in hex
        ("ecc_corrected", pa.float64()),  # volatile totals
        ("ecc_uncorrected", pa.float64()),
        ("pcie_gen", pa.float64()),  # the GPU's PCIe link under load: generation and width, current and maximum
        ("pcie_gen_max", pa.float64()),
        ("pcie_width", pa.float64()),
        ("pcie_width_max", pa.float64()),
    ],
    metadata={"cluster_accept_schema": "burn", "version": SCHEMA_VERSION},
)

ISOLATION = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("round", pa.int32()),
        ("phase", pa.string()),  # screen / bisect / confirm
        ("group_index", pa.int32()),
        ("kind", pa.string()),  # what the group tests (screen group, half, pair with a known-good node...)
        ("nodes", pa.string()),  # folded node set of the group
        ("size", pa.int32()),
        ("busbw_gbps", pa.float64()),  # null: the run failed or timed out
        ("threshold_gbps", pa.float64()),
        ("bad", pa.bool_()),
        ("signal", pa.string()),  # what the groups ran: allreduce (busbw_gbps) or training (tokens/s per GPU)
    ],
    metadata={"cluster_accept_schema": "isolation", "version": SCHEMA_VERSION},
)

SCALING = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("nodes", pa.int32()),
        ("gpus", pa.int32()),
        ("busbw_gbps", pa.float64()),  # all-reduce bus bandwidth at the largest message size (per rank)
        ("algbw_gbps", pa.float64()),
        ("node_algbw_gbps", pa.float64()),  # algorithm bandwidth times GPUs per node: per-node throughput
        ("vs_one_node", pa.float64()),
        ("efficiency", pa.float64()),  # busbw relative to the 2-node run
        ("below_min", pa.bool_()),  # under the profile's scaling_efficiency_min
    ],
    metadata={"cluster_accept_schema": "scaling", "version": SCHEMA_VERSION},
)

TRAINING_SCALING = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("nodes", pa.int32()),
        ("gpus", pa.int32()),
        ("group", pa.string()),  # the nodes of the run, folded
        ("tokens_per_s", pa.float64()),
        ("tokens_per_s_per_gpu", pa.float64()),
        ("step_ms", pa.float64()),
        ("tflops_per_gpu", pa.float64()),
        ("mfu", pa.float64()),  # null: the GPU's peak is unknown (or CPU)
        ("efficiency", pa.float64()),  # tokens/s per GPU relative to the one-node run
        ("below_min", pa.bool_()),  # under the profile's training_scaling_efficiency_min
        ("transport", pa.string()),  # what NCCL used between nodes (NET/IB, NET/Socket ...)
        ("model", pa.string()),
    ],
    metadata={"cluster_accept_schema": "training_scaling", "version": SCHEMA_VERSION},
)

VERDICTS = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("node", pa.string()),
        ("profile", pa.string()),
        ("verdict", pa.string()),
        ("reasons", pa.list_(pa.string())),
        ("cause", pa.string()),  # the likeliest cause of the worst finding, in words; "" when none
    ],
    metadata={"cluster_accept_schema": "verdicts", "version": SCHEMA_VERSION},
)


NCCL = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("stage", pa.string()),
        ("node", pa.string()),
        ("probe", pa.string()),  # which run: allreduce, training; multi-node: allreduce, collectives, rail0 …
        ("group", pa.string()),  # multi-node runs: the nodes of the run, folded
        ("rank", pa.int32()),  # the rank NCCL gave the process
        ("communicator", pa.string()),  # NCCL's commId; null for what holds per process
        ("kind", pa.string()),  # channels, communicator, algorithm, protocol, setting, version, plugin
        ("name", pa.string()),
        ("value", pa.string()),  # a secret-looking setting's value masked
    ],
    metadata={"cluster_accept_schema": "nccl", "version": SCHEMA_VERSION},
)


SETTINGS = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("stage", pa.string()),
        ("node", pa.string()),
        ("probe", pa.string()),  # the node-side script that ran with it
        ("name", pa.string()),
        ("value", pa.string()),  # a secret-looking setting's value masked
        ("source", pa.string()),  # env, or the NCCL config file that set it
        ("also", pa.string()),  # a config file that sets it too (the environment won)
    ],
    metadata={"cluster_accept_schema": "settings", "version": SCHEMA_VERSION},
)


THRESHOLDS = pa.schema(
    [
        ("run_id", pa.string()),
        ("cluster", pa.string()),
        ("stage", pa.string()),
        ("metric", pa.string()),
        ("profile", pa.string()),
        ("gpu_model", pa.string()),
        ("size_tier", pa.string()),
        ("straggler_pct", pa.float64()),
        ("noise_k", pa.float64()),
        ("noise_pct", pa.float64()),  # the noise the margin rests on; null: none known
        ("noise_source", pa.string()),
        ("margin_pct", pa.float64()),
        ("comparisons", pa.int32()),
        ("expected_false_rejections", pa.float64()),
    ],
    metadata={"cluster_accept_schema": "thresholds", "version": SCHEMA_VERSION},
)

WATCH_RANKS = pa.schema(
    [
        ("job", pa.string()),
        ("node", pa.string()),
        ("rank", pa.int32()),
        ("local_rank", pa.int32()),
        ("pid", pa.int64()),
        ("state", pa.string()),
        ("read_ns", pa.int64()),
        ("clock_offset_ns", pa.int64()),
        ("clock_error_ns", pa.int64()),
        ("gpu", pa.int32()),
        ("hostname", pa.string()),
        ("started_ns", pa.int64()),
        ("answered", pa.bool_()),
        ("last_enqueued_seq", pa.int64()),
        ("last_completed_seq", pa.int64()),
        ("detail", pa.string()),
        ("cpu_run_ns", pa.int64()),
        ("cpu_wait_ns", pa.int64()),
    ],
    metadata={"cluster_accept_schema": "watch_ranks", "version": SCHEMA_VERSION},
)

WATCH_COLLECTIVES = pa.schema(
    [
        ("job", pa.string()),
        ("node", pa.string()),
        ("rank", pa.int32()),
        ("communicator", pa.string()),
        ("op", pa.string()),
        ("seq", pa.int64()),
        ("enqueue_ns", pa.int64()),
        ("source", pa.string()),
        ("completed", pa.bool_()),
        ("start_ns", pa.int64()),
        ("complete_ns", pa.int64()),
        ("exec_ms", pa.float64()),
        ("size_bytes", pa.int64()),
        ("busbw_gbps", pa.float64()),
        ("gpu", pa.int32()),
        ("comm_ranks", pa.string()),
        ("backend", pa.string()),
    ],
    metadata={"cluster_accept_schema": "watch_collectives", "version": SCHEMA_VERSION},
)

WATCH_COVERAGE = pa.schema(
    [("job", pa.string()), ("node", pa.string()), ("signal", pa.string()), ("available", pa.bool_()),
     ("detail", pa.string())],
    metadata={"cluster_accept_schema": "watch_coverage", "version": SCHEMA_VERSION},
)  # fmt: skip

WATCH_NCCL_DIAGNOSTICS = pa.schema(
    [("job", pa.string()), ("asked_on", pa.string()), ("check", pa.string()), ("ok", pa.bool_()),
     ("detail", pa.string()), ("comm", pa.string()), ("comm_ranks", pa.int64()), ("ranks", pa.string()),
     ("ranks_cut", pa.bool_()), ("ranks_total", pa.int64()), ("reference_rank", pa.int64()),
     ("variable", pa.string()), ("value", pa.string()), ("nodes", pa.string())],
    metadata={"cluster_accept_schema": "watch_nccl_diagnostics", "version": SCHEMA_VERSION},
)  # fmt: skip

WATCH_FINDINGS = pa.schema(
    [
        ("job", pa.string()),
        ("kind", pa.string()),
        ("node", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("observed", pa.string()),
        ("expected", pa.string()),
        ("evidence", pa.string()),
        ("persistence", pa.string()),
        ("rank", pa.int32()),
        ("gpu", pa.int32()),
        ("named_ns", pa.int64()),
        ("confirmed", pa.bool_()),
        ("retest", pa.string()),
        ("action", pa.string()),
        ("owner_line", pa.string()),
        ("involves", pa.string()),
    ],
    metadata={"cluster_accept_schema": "watch_findings", "version": SCHEMA_VERSION},
)

# The tables of a watch's directory (``cluster-accept watch``), by name: ``<name>.parquet`` in the watch's
# directory and ``history/<name>/``. Apart from :data:`TABLES`: a watch is not an acceptance run (no ``runs``
# row, no verdicts), and the history's readers of runs never meet its files.
WATCH_TABLES: dict[str, pa.Schema] = {
    "watch_ranks": WATCH_RANKS,
    "watch_collectives": WATCH_COLLECTIVES,
    "watch_coverage": WATCH_COVERAGE,
    "watch_findings": WATCH_FINDINGS,
    "watch_nccl_diagnostics": WATCH_NCCL_DIAGNOSTICS,
}

# Every table of a run directory, by name: ``<name>.parquet`` in the run directory and ``history/<name>/``.
TABLES: dict[str, pa.Schema] = {
    "runs": RUNS,
    "checks": CHECKS,
    "node_values": NODE_VALUES,
    "measurements": MEASUREMENTS,
    "isolation": ISOLATION,
    "scaling": SCALING,
    "training_scaling": TRAINING_SCALING,
    "verdicts": VERDICTS,
    "burn": BURN,
    "nccl": NCCL,
    "settings": SETTINGS,
    "thresholds": THRESHOLDS,
}


def write_table(path: Path, rows: Sequence[Any], schema: pa.Schema) -> Path:
    """Write rows with exactly ``schema`` (missing keys become nulls), atomically (tmp file + rename).

    ``rows``: records (mappings), or typed rows with a ``record()`` method: the one place they become records."""
    records = [row.record() if hasattr(row, "record") else row for row in rows]
    columns = {name: [row.get(name) for row in records] for name in schema.names}
    table = pa.Table.from_pydict(columns, schema=schema)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path

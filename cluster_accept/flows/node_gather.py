"""A node's own check, first half: this machine's preflight commands started, before the judgement is imported.

The check's time is the job's start (a Slurm Prolog waits on it). Its commands (``nvidia-smi`` and the probe
interpreter among them) take about a third of a second on a GPU node; so they start first, on a thread of their
own, from a module that imports only the checks and the batch, and :func:`flows.node_check.finish_check`'s
module (the analysis, the probes' causes) is imported while they run. Measured on a one-GPU H200 the wall time
did not move beyond the machine's noise (bench/results/h200x1-check-local/README.md): the imports hold the
interpreter while the batch's threads wait for it, and the thirteen ``nvidia-smi`` runs contend for the driver.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_accept.checks.base import Check, discover
from cluster_accept.checks.probe_python import IMPORT_CACHE_ENV
from cluster_accept.inventory.load import as_local, select_nodes
from cluster_accept.inventory.model import Inventory
from cluster_accept.tasks.preflight.check_batch import NodePreflight, run_preflight_on_node


@dataclass(frozen=True)
class StartedCheck:
    """A node's check whose commands are running: this node's part of the inventory (run here, no SSH), the
    checks whose commands run and the answer to come."""

    inventory: Inventory
    node: str
    checks: list[Check[Any]]
    outcome: Future[NodePreflight]
    started: float  # time.monotonic() when the check began


def start_check(inventory: Inventory, node_name: str, fresh: bool = False) -> StartedCheck:
    """Start ``node_name``'s preflight on this machine. Unless ``fresh``, the probe interpreter's CUDA start is
    taken from the last good one while nothing it rests on changed (:func:`import_cache`)."""
    started = time.monotonic()
    local = as_local(select_nodes(inventory, node_name))
    checks = discover()
    env = {} if fresh else {IMPORT_CACHE_ENV: str(import_cache())}
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-check")
    outcome = pool.submit(run_preflight_on_node, local.node(node_name), checks, env)
    pool.shutdown(wait=False)  # the thread ends with the batch; the check waits on ``outcome``
    return StartedCheck(local, node_name, checks, outcome, started)


def this_node(inventory: Inventory, named: str | None, environ: Mapping[str, str]) -> str:
    """The inventory node this machine is (:func:`_which_node`); ValueError when it is excluded in the inventory:
    a node taken out of testing is not checked, and its check is no verdict."""
    name = _which_node(inventory, named, environ)
    if inventory.node(name).excluded:
        raise ValueError(f"{name} is excluded in the inventory: it is not checked")
    return name


def _which_node(inventory: Inventory, named: str | None, environ: Mapping[str, str]) -> str:
    """``named``, else Slurm's name for this machine, else the host's short name; the one node of a one-node
    inventory. Raises ValueError naming what was looked for."""
    if named:
        return inventory.node(named).name if _known(inventory, named) else _unknown(named, "--node")
    slurm_name = environ.get("SLURMD_NODENAME")
    if slurm_name:
        by_slurm = {n.slurm_node: n.name for n in inventory.nodes}
        return by_slurm.get(slurm_name) or _unknown(slurm_name, "SLURMD_NODENAME (slurm.node_names)")
    if len(inventory.nodes) == 1:
        return inventory.nodes[0].name
    host = socket.gethostname().split(".")[0]
    return host if _known(inventory, host) else _unknown(host, "this host's short name (give --node)")


def _known(inventory: Inventory, name: str) -> bool:
    return any(n.name == name for n in inventory.nodes)


def _unknown(name: str, source: str) -> str:
    raise ValueError(f"{name!r}, from {source}, is no node of the inventory")


def import_cache() -> Path:
    """Where this node keeps the last good answer of torch's import (:data:`checks.probe_python.IMPORT_CACHE_ENV`):
    the user's runtime directory, else ``/run`` (root, a Slurm prolog), else the temporary directory; cleared at
    boot where it is a tmpfs, and keyed by the boot where it is not."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    return base / f"cluster-accept-{os.getuid()}" / "probe-import.json"

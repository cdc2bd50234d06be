"""A run's life in its directory: begun (every refusal of what it was asked first), or resumed to finish it (every
refusal of the resume first); the options a resume must keep.

The run directory, not Prefect's database, is the record: ``run.json`` holds what a run was asked to do (its
inventory and its digest, nodes, stages, suite, short probes, the local transport, the history, the operations and
the concurrency), so that ``--resume`` does as the run did, whoever starts it and from wherever. Below the flows and
the stages: nothing here imports Prefect or a stage; the stages a run may name, and how an inventory is loaded (with
the probes' settings checked), are given by the caller. The command line refuses before Prefect starts by the same
calls (:meth:`RunChoices.selection`, :meth:`BisectChoices.selection`, :func:`refuse_resume`) that begin a run.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cluster_accept.inventory.builtin import is_auto
from cluster_accept.inventory.hostlist import fold
from cluster_accept.inventory.load import as_local, select_nodes
from cluster_accept.inventory.model import Inventory, Node
from cluster_accept.ops.after_run import Operations
from cluster_accept.rundir.outputs import ResumeError, RunDir, check_not_held, now_iso, resumable_info, start_run
from cluster_accept.rundir.run_record import RecordedOptions, RunRecord, check_run_record

# What a recording answers (simulator.nodes, simulator.launch): bisect runs the multi-node launcher.
SIMULATED_STAGES = ("preflight", "single-node", "multi-node", "bisect")

# How the caller loads an inventory file: with the probes' settings checked (``probes.base.load_checked_inventory``).
Load = Callable[[str | Path], Inventory]


class NothingToTest(ValueError):
    """The selection leaves no node to test: a usage error (exit 2), like any other refusal before a run."""


@dataclass(frozen=True)
class RunChoices:
    """A new acceptance run as asked (``stages`` and ``quick`` resolved from the suite by the caller), as its
    ``run.json`` keeps it: a resume does as the run did."""

    inventory: str | Path
    stages: list[str]
    quick: bool
    history: Path | None
    operations: Operations
    concurrency: int
    nodes: str | None = None
    suite: str | None = None
    local: bool = False

    def selection(self, load: Load) -> Inventory:
        """The nodes the run tests, once every refusal of them passed (:func:`refuse_unresolved_auto`); writes
        nothing. :meth:`Run.begin` starts by it; the command line calls it before Prefect starts."""
        inventory = select_nodes(load(self.inventory), self.nodes)
        inventory = as_local(inventory) if self.local else inventory
        refuse_unresolved_auto(inventory, self.stages)
        return inventory


@dataclass(frozen=True)
class BisectChoices:
    """An isolation run as asked: the suspect nodes (a hostlist) and those known to be good, as partners."""

    inventory: str | Path
    suspects: str
    good: str | None = None

    def selection(self, load: Load) -> tuple[Inventory, list[Node], list[Node]]:
        """(the nodes it tests, the suspects, the good ones) once every refusal passed: of the inventory as a whole
        (:func:`refuse_unresolved_auto`, bisect runs the multi-node launcher) and of suspects that leave no node to
        test; writes nothing. :meth:`Run.begin_bisect` starts by it; the command line calls it before Prefect."""
        inventory = load(self.inventory)
        refuse_unresolved_auto(inventory, [])
        suspects = select_nodes(inventory, self.suspects)
        refuse_nothing_to_test(suspects)
        good = select_nodes(inventory, self.good).tested if self.good else []
        scope = replace(inventory, nodes=suspects.tested + [n for n in good if n not in suspects.tested])
        return scope, suspects.tested, good


@dataclass
class Run:
    """One run: its directory (its lock held by this process while it runs), ``run.json`` as the run goes
    (``record``, typed: the flow adds its stages' timings, the end its verdicts' time), and the nodes it tests."""

    directory: RunDir
    record: RunRecord
    inventory: Inventory

    @classmethod
    def _start(
        cls,
        inventory: Inventory,
        out_dir: Path,
        stages: list[str],
        run_id: str | None = None,
        suite: str | None = None,
        more: Mapping[str, Any] | None = None,
    ) -> Run:
        """A new run directory, its lock held, whose ``run.json`` names what it tests (and ``more``)."""
        directory, info = start_run(
            out_dir,
            run_id,
            {
                "cluster": inventory.cluster,
                "inventory": inventory.source,
                "inventory_digest": inventory.digest,
                "stages": stages,
                "suite": suite,
                "nodes_tested": [n.name for n in inventory.tested],
                "nodes_excluded": [n.name for n in inventory.excluded],
                "controller": socket.gethostname(),  # the host that ran it: shards of one run may run on several
                **(more or {}),
            },
        )
        return cls(directory, RunRecord.model_validate(info), inventory)

    @classmethod
    def begin(
        cls,
        choices: RunChoices,
        load: Load,
        out_dir: Path,
        run_id: str | None = None,
        more: Callable[[Inventory], Mapping[str, Any]] | None = None,
    ) -> Run:
        """A new acceptance run, once every refusal of its selection passed (:meth:`RunChoices.selection`), whose
        ``run.json`` holds the choices and ``more``: what the caller makes of the refused selection before the
        directory exists (a sharded run's shards; it may refuse too)."""
        inventory = choices.selection(load)
        recorded = {
            "quick_probes": choices.quick,
            "local": choices.local,
            "simulated": any(n.simulated is not None for n in inventory.tested),  # scale work, not a cluster
            "options": recorded_options(choices.history, choices.operations, choices.concurrency),
            **(more(inventory) if more else {}),
        }
        return cls._start(inventory, out_dir, choices.stages, run_id, choices.suite, recorded)

    @classmethod
    def begin_bisect(
        cls, choices: BisectChoices, load: Load, out_dir: Path, run_id: str | None = None
    ) -> tuple[Run, list[Node], list[Node]]:
        """A new isolation run, once every refusal of it passed (:meth:`BisectChoices.selection`); with its
        suspects and good nodes."""
        scope, suspects, good = choices.selection(load)
        return cls._start(scope, out_dir, ["bisect"], run_id), suspects, good

    @classmethod
    def resume(cls, out_dir: Path, run_id: str, stages: Sequence[str], load: Load) -> Run:
        """The interrupted run ``run_id`` reopened to finish it: its directory (its lock held: a second resume, or
        the run itself still going, is refused), ``run.json`` (with the resume noted), its nodes (this machine's
        own where it ran locally), once every refusal of the resume passed (:func:`resumable`, read under the
        lock). ``stages``: every stage a run may name."""
        directory = RunDir(out_dir / run_id, run_id)
        resumable_info(out_dir, run_id)  # an unknown or finished run is named as such before any lock is taken
        directory.hold()
        try:
            record, inventory = resumable(out_dir, run_id, stages, load)
            record.resumed = [*record.resumed, now_iso()]
            directory.write_json("run.json", record.saved())
        except BaseException:
            directory.release()
            raise
        return cls(directory, record, as_local(inventory) if record.local else inventory)

    @property
    def quick(self) -> bool:
        """Whether it runs the short probes (a light suite)."""
        return self.record.quick_probes

    def options(
        self, history: Path | None, operations: Operations, concurrency: int
    ) -> tuple[Path | None, Operations, int]:
        """The run's own options, in place of those given (:func:`restored_options`)."""
        return restored_options(self.record.options, history, operations, concurrency)


def refuse_resume(
    out_dir: Path, run_id: str, stages: Sequence[str], load: Load, selection: bool = False, options: bool = False
) -> None:
    """Every refusal of resuming ``run_id`` before anything runs (the command line's, before Prefect starts): a
    resume given a selection (``selection``: an inventory, nodes, stages, a suite, a local or sharded run) or
    options (``options``: it restores the run's own), a run that cannot be resumed (:func:`resumable`, as
    :meth:`Run.resume` reads it), one another process holds; writes nothing."""
    if selection:
        raise ValueError("--resume takes the interrupted run's inventory, nodes and stages: give only --out")
    if options:
        raise ValueError(
            "--resume restores the interrupted run's own options (--history, --drain, --resume-passing, "
            "--apply, --prometheus, --concurrency): give only --out"
        )
    resumable(out_dir, run_id, stages, load)
    check_not_held(out_dir / run_id)


def resumable(out_dir: Path, run_id: str, stages: Sequence[str], load: Load) -> tuple[RunRecord, Inventory]:
    """``run.json`` of the interrupted run ``run_id`` under ``out_dir``, as its record, and its nodes, once every
    refusal passed:
    unknown, finished, sharded, a key a resume reads edited into a wrong value
    (:func:`rundir.run_record.check_run_record`), its inventory changed; writes nothing."""
    run_info = resumable_info(out_dir, run_id)
    if run_info.get("sharded"):
        raise ResumeError(
            f"cannot resume {run_id}: it was sharded over Prefect workers (run --shard-by); start a new run "
            "(the finished shards' results stay under its shards/)"
        )
    record = check_run_record(run_id, out_dir / run_id / "run.json", run_info, stages)
    inventory = load(record.inventory)
    if inventory.digest != record.inventory_digest:
        raise ResumeError(
            f"cannot resume {run_id}: {record.inventory} changed since the run started "
            f"(sha256 {inventory.digest[:12]}, the run used {str(record.inventory_digest)[:12]})"
        )
    names = set(record.nodes_tested) | set(record.nodes_excluded)
    return record, replace(inventory, nodes=[n for n in inventory.nodes if n.name in names])


def recorded_options(history: Path | None, operations: Operations, concurrency: int) -> dict[str, Any]:
    """What a resume must do as the run did: ``run.json``'s ``options`` (paths made absolute: a resume may
    start elsewhere)."""
    ops = operations.model_dump()
    if ops.get("prometheus"):
        ops["prometheus"] = str(Path(ops["prometheus"]).resolve())
    return {"history": str(history.resolve()) if history else None, "operations": ops, "concurrency": concurrency}


def restored_options(
    recorded: RecordedOptions | None, history: Path | None, operations: Operations, concurrency: int
) -> tuple[Path | None, Operations, int]:
    """The interrupted run's own options (history, Slurm and Prometheus operations, concurrency); a run
    recorded before options were kept (``recorded`` None) goes on with the ones given."""
    if recorded is None:
        return history, operations, concurrency
    return Path(recorded.history) if recorded.history else None, recorded.operations, recorded.concurrency


def history_dir(out_dir: str | Path, history: str | None) -> Path | None:
    """Where the history lives: ``--history`` when given, ``OUT/history`` by default, none for ``-``."""
    if history == "-":
        return None
    return Path(history) if history else Path(out_dir) / "history"


def refuse_nothing_to_test(inventory: Inventory) -> None:
    """A run over no node accepts nothing, yet would end without a rejection: a scheduled check whose
    ``exclude`` (or ``--nodes``) leaves nothing to test would look healthy for ever, so it is refused."""
    if inventory.tested:
        return
    excluded = [n.name for n in inventory.excluded]
    said = f"every selected node is excluded in the inventory ({fold(excluded)})" if excluded else "none is selected"
    raise NothingToTest(f"no node to test: {said}")


def refuse_unresolved_auto(inventory: Inventory, stages: list[str]) -> None:
    """The refusals of a selection before anything runs. No node to test (:func:`refuse_nothing_to_test`).
    ``profile: auto`` is resolved from the GPU model preflight reads: without preflight there is no profile
    to judge by, and the nodes would be probed against nothing. A simulated inventory runs only the stages its
    recording answers (no burn), and multi-node runs only as the recording's all-reduce (no training, rails or
    other collectives between nodes)."""
    refuse_nothing_to_test(inventory)
    simulated = [n for n in inventory.tested if n.simulated is not None]
    wanted = stages or ["bisect"]
    beyond = [s for s in wanted if s not in SIMULATED_STAGES]
    if simulated and beyond:
        raise ValueError(
            f"nodes {fold([n.name for n in simulated])} are simulated (the inventory's simulation block): their "
            f"recording answers {', '.join(SIMULATED_STAGES)} only, not {', '.join(beyond)}"
        )
    unrecorded = [n.name for n in simulated if _beyond_allreduce(n)]
    if unrecorded and {"multi-node", "bisect"} & set(wanted):
        raise ValueError(
            f"nodes {fold(unrecorded)} are simulated and their profile asks the multi-node stage for training, rails "
            "or collectives beside the all-reduce, which the recording does not answer: turn those off in the profile"
        )
    auto = [n.name for n in inventory.tested if is_auto(n.profile)]
    if auto and "preflight" not in stages:
        raise ValueError(
            f"nodes {fold(auto)} use profile auto, which the preflight stage resolves from each node's GPU model: "
            "add preflight to --stages, or name their built-in profile (e.g. profile: h100-sxm)"
        )


def _beyond_allreduce(node: Node) -> bool:
    probes = node.profile.probes
    return node.profile.training.enabled or bool(probes.rails) or bool(probes.collectives)

"""The inventory's ``simulation`` block: scale work on simulated nodes instead of real ones.

An inventory with this block is answered by :mod:`simulator.nodes` (in-process nodes replaying outputs
recorded from real nodes), never over SSH. Nothing else selects it, so a real inventory cannot end up
simulated by accident, and every run of a simulated inventory says so in ``run.json``. The recording is
checked when the inventory loads: it must exist, and every planted fault must be one of its variants (or
``slow``: a healthy node whose figures are halved).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from cluster_accept.inventory.quoting import cut, quoted

SLOW = "slow"


class SimulationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .inf and NaN are no setting

    recording: StrictStr = Field(description="recorded node outputs (JSON), relative to the inventory file")
    faults: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="hostlist -> variant of the recording (or 'slow') for those nodes"
    )
    spread_pct: Annotated[float, Field(ge=0, le=50)] = Field(
        default=2.0, description="each node's figures within this many percent of the recorded ones"
    )
    latency_ms: Annotated[float, Field(ge=0, le=60000)] = Field(
        default=20.0, description="median time a node takes to answer a batch (log-normal spread)"
    )
    seed: int = 0


@dataclass(frozen=True)
class SimulatedAs:
    """How one node of a simulated inventory answers (read by :mod:`simulator.nodes`)."""

    recording: str  # absolute path
    variant: str
    spread_pct: float
    latency_ms: float
    seed: int


def recording_variants(path: Path) -> set[str]:
    """The variants a recording holds; ValueError when it cannot be read as one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return set(data["variants"]) | set(data.get("launches", {}))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"simulation.recording {cut(str(path))}: not a readable recording ({cut(str(exc))})") from None


# Loaded by name where an inventory asks for it (:func:`remote.session.simulated_session`): not in the wheel.
SIMULATOR = "cluster_accept.simulator.nodes"


def simulated_as(
    settings: SimulationSettings, base_dir: Path, names: list[str]
) -> tuple[dict[str, SimulatedAs], list[str]]:
    """Every node's :class:`SimulatedAs`, and the problems found: an unreadable recording, a fault naming a
    node the inventory does not list or a variant the recording does not hold."""
    from cluster_accept.inventory.hostlist import HostlistError, expand

    if not (Path(__file__).resolve().parent.parent / "simulator" / "__init__.py").is_file():
        return {}, [
            f"simulation: the scale simulator ({SIMULATOR}) is not installed: it comes with the source checkout"
        ]
    path = Path(settings.recording).expanduser()
    path = path if path.is_absolute() else (base_dir / path).resolve()
    try:
        variants = recording_variants(path) | {SLOW}
    except ValueError as exc:
        return {}, [str(exc)]
    problems: list[str] = []
    variant_of: dict[str, str] = {}
    known = set(names)
    for written, variant in settings.faults.items():
        expression = cut(written)  # the key, as its problems name it
        try:
            planted = expand(written)
        except HostlistError as exc:
            problems.append(f"simulation.faults.{expression}: {exc}")
            continue
        if variant not in variants:
            problems.append(
                f"simulation.faults.{expression}: {quoted(variant)} is not a variant of the recording "
                f"({', '.join(sorted(variants))})"
            )
        strangers = [n for n in planted if n not in known]
        if strangers:
            problems.append(f"simulation.faults.{expression}: not in the inventory: {', '.join(strangers[:5])}")
        variant_of.update(dict.fromkeys(planted, variant))
    spec = {
        name: SimulatedAs(str(path), variant_of.get(name, "healthy"), settings.spread_pct, settings.latency_ms,
                          settings.seed)
        for name in names
    }  # fmt: skip
    return spec, problems

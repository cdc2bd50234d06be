"""PCIe link per GPU: a link trained narrower than it can run (x8 in an x16 slot), or below the profile.

Field choice (from ``nvidia-smi --help-query-gpu``, driver 580):

- ``pcie.link.gen.max`` is "the maximum PCI-E link generation possible with this GPU and system
  configuration", i.e. the lower of what the GPU and the root port support. That is what a profile's ``gen``
  is about: a Gen5 GPU behind a Gen4 root port can only run Gen4, and that must fail. ``pcie.link.gen.gpumax``
  (the GPU alone) would pass that node; ``pcie.link.gen.hostmax`` is ``[N/A]`` on the captured machines.
- ``pcie.link.gen.current`` is marked deprecated in favour of ``pcie.link.gen.gpucurrent`` (same value), but
  it is the name every driver accepts; ``gpucurrent``/``gpumax`` are newer, and one unknown field makes
  nvidia-smi reject the whole query (``Field "…" is not a valid field to query.``, exit 2).
- ``pcie.link.width.current`` / ``.max``: the trained width and the widest possible in this system.

Judged per GPU: current width below max fails (``width_degraded``: a reseat, riser or slot problem); current
width below the profile's fails (``width_below_profile``); max generation below the profile's fails
(``gen_below_profile``); current generation below max only warns (``gen_downshifted``), because GPUs drop
the link generation to save power when idle, which is the normal state at preflight.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cluster_accept.checks.contract import (
    Action,
    Check,
    CheckRow,
    ClusterView,
    Expectation,
    NodeModels,
    Profile,
    Reason,
    Status,
    SuggestedValues,
    declare,
    driver_unreachable,
    error_row,
    fault,
    healthy,
    is_set,
    one_value,
)
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, not_available, query_gpu_command, read_gpu_query

NAME = "pcie"
FIELDS = [
    "index",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
]
COMMAND = query_gpu_command(FIELDS)
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    Reason(
        "width_degraded",
        Status.FAIL,
        "the PCIe link trained narrower than the slot allows: reseat the GPU/riser",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "gen_downshifted",
        Status.WARN,
        "the PCIe link runs below its generation (normal when idle): a problem only under load",
        Action.RESEAT_CABLE,
    ),
    Reason("width_below_profile", Status.FAIL, "the PCIe link is narrower than the profile's", Action.RESEAT_CABLE),
    Reason(
        "gen_below_profile",
        Status.FAIL,
        "the PCIe link cannot reach the profile's generation (GPU or root port): check the slot and BIOS",
        Action.RESEAT_CABLE,
    ),
)


@dataclass(frozen=True)
class GpuLink:
    index: int
    gen_current: int | None  # None: nvidia-smi said [N/A] / [Not Supported]
    gen_max: int | None
    width_current: int | None
    width_max: int | None


@dataclass(frozen=True)
class PcieLinks:
    gpus: list[GpuLink] = field(default_factory=list)
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""


def _number(value: str) -> int | None | str:
    """An int, None for nvidia-smi's not-available texts, or the text itself when it is neither."""
    if not_available(value):
        return None
    return int(value) if re.fullmatch(r"\d{1,2}", value) else value


def _read(stdout: str, exit_code: int | None) -> PcieLinks:
    rows, failure, error = read_gpu_query(stdout, exit_code, FIELDS)
    if failure:
        return PcieLinks(failure=failure, raw=stdout)
    if error:
        return PcieLinks(error=error, raw=stdout)
    gpus = []
    for row in rows:
        values: list[int | None] = []
        for name in FIELDS[1:]:
            value = _number(row[name])
            if isinstance(value, str):
                return PcieLinks(error=f"GPU {row['index']}: unexpected {name} {value!r}", raw=stdout)
            values.append(value)
        gpus.append(GpuLink(int(row["index"]), *values))
    return PcieLinks(gpus=gpus, raw=stdout)


def parse(stdout: str, exit_code: int | None = 0) -> PcieLinks:
    try:
        return _read(stdout, exit_code)
    except Exception as exc:  # noqa: BLE001 - csv can raise on garbage (huge fields, stray CR); never propagate
        return PcieLinks(error=f"unreadable output ({type(exc).__name__}: {exc})", raw=stdout)


def cluster_values(model: PcieLinks) -> dict[str, str]:
    """``gen5 x16``: the link's possible generation (the current one drops when idle) and its trained width."""
    links = {(g.gen_max, g.width_current) for g in model.gpus}
    if model.failure or model.error or len(links) != 1:
        return {}
    gen, width = links.pop()
    if gen is None or width is None:
        return {}
    return {"pcie_link": f"gen{gen} x{width}"}


def _text(prefix: str, value: int | None) -> str:
    return f"{prefix}{value}" if value is not None else "[N/A]"


def _gpu_rows(gpu: GpuLink, profile: Profile) -> list[CheckRow]:
    rows: list[CheckRow] = []
    width, width_max = _text("x", gpu.width_current), _text("x", gpu.width_max)
    gen, gen_max = _text("gen", gpu.gen_current), _text("gen", gpu.gen_max)
    if gpu.width_current is None or gpu.width_max is None:
        rows.append(CheckRow(NAME, "width", Status.SKIP, "not_available", width, width_max, gpu=gpu.index))
    elif gpu.width_current < gpu.width_max:
        detail = "the link trained narrower than the slot allows: reseat the GPU or check the riser/slot"
        rows.append(CheckRow(NAME, "width", Status.FAIL, "width_degraded", width, width_max, detail, gpu.index))
    else:
        rows.append(CheckRow(NAME, "width", Status.PASS, "ok", width, width_max, gpu=gpu.index))
    if gpu.gen_current is None or gpu.gen_max is None:
        rows.append(CheckRow(NAME, "gen", Status.SKIP, "not_available", gen, gen_max, gpu=gpu.index))
    elif gpu.gen_current < gpu.gen_max:
        detail = "GPUs lower the link generation when idle; a downshift under load is a problem"
        rows.append(CheckRow(NAME, "gen", Status.WARN, "gen_downshifted", gen, gen_max, detail, gpu.index))
    else:
        rows.append(CheckRow(NAME, "gen", Status.PASS, "ok", gen, gen_max, gpu=gpu.index))
    if profile.pcie is None:
        return rows
    want_width, want_gen = f"x{profile.pcie.width}", f"gen{profile.pcie.gen}"
    if gpu.width_current is None:
        rows.append(CheckRow(NAME, "width_profile", Status.SKIP, "not_available", width, want_width, gpu=gpu.index))
    elif gpu.width_current < profile.pcie.width:
        rows.append(
            CheckRow(NAME, "width_profile", Status.FAIL, "width_below_profile", width, want_width, gpu=gpu.index)
        )
    else:
        rows.append(CheckRow(NAME, "width_profile", Status.PASS, "ok", width, want_width, gpu=gpu.index))
    if gpu.gen_max is None:
        rows.append(CheckRow(NAME, "gen_profile", Status.SKIP, "not_available", gen_max, want_gen, gpu=gpu.index))
    elif gpu.gen_max < profile.pcie.gen:
        detail = "pcie.link.gen.max is the lower of the GPU's and the root port's generation"
        rows.append(
            CheckRow(NAME, "gen_profile", Status.FAIL, "gen_below_profile", gen_max, want_gen, detail, gpu.index)
        )
    else:
        rows.append(CheckRow(NAME, "gen_profile", Status.PASS, "ok", gen_max, want_gen, gpu=gpu.index))
    return rows


def evaluate(model: PcieLinks, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        detail = "nvidia-smi failed; gpu_count and driver judge the node"
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure, None, detail)]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    return [row for gpu in model.gpus for row in _gpu_rows(gpu, profile)]


def suggest_values(model: PcieLinks, others: NodeModels) -> SuggestedValues:
    """The PCIe generation and width a profile starts from (``profile suggest``)."""
    return {
        "pcie.gen": one_value(g.gen_max for g in model.gpus),
        "pcie.width": one_value(g.width_max for g in model.gpus),
    }


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    expectations=(Expectation("pcie", "preflight", NAME, is_set(lambda p: p.pcie)),),
    samples=(
        healthy("h200x4", {"ok"}, fixture="pcie/h200x4.txt"),
        healthy("h100x1", {"ok"}, fixture="pcie/h100x1.txt"),
        fault("link_downtrained", {"width_degraded"}, fixture="pcie/link_downtrained.txt"),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)

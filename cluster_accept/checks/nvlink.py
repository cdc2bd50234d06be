"""NVLink state per GPU, from ``nvidia-smi nvlink -s`` (links and speeds) and ``nvlink -e`` (error counters).

A GPU with a dead or down-trained NVLink still computes, so nothing else notices: collectives on that node
silently fall back to fewer links (or to PCIe) and the whole job runs at the pace of the slowest node. A
link shown ``<inactive>``, fewer links than the platform has, a link below its nominal speed, and non-zero
replay/recovery/CRC counters (a marginal link, cable or switch port) are what this check looks for.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
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
    readable,
)
from cluster_accept.checks.declarations import Link as Cause
from cluster_accept.checks.gpu_count import NAME as GPU_COUNT
from cluster_accept.checks.gpu_count import GpuList
from cluster_accept.checks.nvswitch import FABRIC_DOWN
from cluster_accept.checks.nvswitch import NAME as NVSWITCH
from cluster_accept.checks.sections import NVIDIA_SMI_SKIPPED, driver_failure, small_int
from cluster_accept.inventory.gpus import GpuModel, model_for_name
from cluster_accept.inventory.model import NvlinkSpec
from cluster_accept.vocabulary.text import quote

NAME = "nvlink"
_ERRORS_MARK = "### nvidia-smi nvlink -s rc="
COMMAND = f'nvidia-smi nvlink -s 2>&1; echo "{_ERRORS_MARK}$?"; nvidia-smi nvlink -e 2>&1'
SPEED_TOLERANCE = 0.005  # a link may read up to 0.5% under the profile's speed

_GPU_LINE = re.compile(r"^GPU (\d{1,9}): (.*?)\s*$")
_SPEED_LINE = re.compile(r"^\s*Link (\d{1,9}): (?:(\d+(?:\.\d+)?) GB/s|(<inactive>))\s*$")
_COUNTER_LINE = re.compile(r"^\s*Link (\d{1,9}): ([A-Za-z][A-Za-z ]*?) Errors: (\d{1,20}|N/A)\s*$")
_ALL_INACTIVE = "all links are inactive"  # "NVML: Unable to retrieve NVLink information as all links are inActive"
REASONS = declare(
    NVIDIA_SMI_SKIPPED,
    Reason("not_in_profile", Status.SKIP, "the profile describes no NVLink, so the links are not judged"),
    Reason("link_inactive", Status.FAIL, "an NVLink is down: reseat the GPU/baseboard", Action.RESEAT_CABLE),
    Reason("links_missing", Status.FAIL, "fewer NVLinks than the profile: reseat the GPU", Action.RESEAT_CABLE),
    Reason(
        "links_extra", Status.WARN, "more NVLinks than the profile expects: is the profile right?", Action.FIX_CONFIG
    ),
    Reason("link_slow", Status.FAIL, "an NVLink runs below its rated speed", Action.RESEAT_CABLE),
    Reason(
        "link_errors",
        Status.WARN,
        "NVLink error counters are not zero: a marginal link; reseat if they keep growing",
        Action.RESEAT_CABLE,
    ),
    Reason(
        "no_nvlink",
        Status.FAIL,
        "the profile expects NVLinks but nvidia-smi lists none: check the GPUs, baseboard and fabric manager",
        Action.CHECK_NODE,
    ),
)


@dataclass(frozen=True)
class Link:
    index: int
    speed_gbps: float | None  # None: the link is shown <inactive>
    speed_text: str = ""  # the speed as printed, e.g. "26.562"

    @property
    def active(self) -> bool:
        return self.speed_gbps is not None


@dataclass(frozen=True)
class GpuLinks:
    index: int
    name: str
    links: list[Link] = field(default_factory=list)
    all_inactive: bool = False  # nvidia-smi printed "all links are inActive" instead of a list
    counters: dict[int, dict[str, int]] = field(default_factory=dict)  # link -> {"Replay": 0, "CRC": 12, ...}

    @property
    def active(self) -> list[Link]:
        return [link for link in self.links if link.active]


@dataclass(frozen=True)
class NvlinkState:
    gpus: list[GpuLinks] = field(default_factory=list)
    failure: str | None = None  # nvidia-smi could not talk to the driver
    error: str | None = None  # output we could not read
    raw: str = ""


@dataclass(frozen=True)
class ExpectedLinks:
    """What a node's GPUs should show for NVLink (the profile's ``nvlink`` block), and ``why`` in a sentence where
    that is not simply the datasheet's links judged on the links the node lists (None then)."""

    spec: NvlinkSpec
    why: str | None = None


def _lists_active_links(listed: NvlinkState | None) -> bool:
    return listed is not None and any(gpu.active for gpu in listed.gpus)


def _lists_none(listed: NvlinkState | None) -> bool:
    """Whether nvidia-smi was read and listed no GPU with NVLinks (not: it failed, or printed what we cannot read)."""
    return listed is not None and listed.failure is None and listed.error is None and not listed.gpus


def expected_nvlink(model: GpuModel | None, gpu_count: int | None, listed: NvlinkState | None) -> ExpectedLinks | None:
    """The NVLink a node of ``gpu_count`` GPUs of ``model`` should show, given what ``nvidia-smi nvlink -s`` listed
    there (``listed``, None when not read); None where the model has no NVLink or no built-in model is known (the
    profile's own keys say, if anything).

    One rule for ``profile: auto`` (the node is judged by it) and ``profile suggest`` (it writes it), so that the
    suggested profile is the one auto judges by. NVLink joins a GPU to its peers on the node, directly or through
    NVSwitches: a GPU alone on its node (a one-GPU slice of an HGX board) has none to join and lists no link, so
    none is expected of it. GPUs with peers that list no link have their links down (a fabric not set up, a
    baseboard fault): the datasheet's links stay expected and the check fails them ``no_nvlink``. A lone GPU
    that does list active links is judged on them, at the datasheet's count and speed."""
    if model is None or not model.nvlink_links:
        return None
    datasheet = NvlinkSpec(links_per_gpu=model.nvlink_links, link_speed_gbps=model.nvlink_link_gbps)
    if gpu_count == 1 and not _lists_active_links(listed):
        alone = NvlinkSpec(links_per_gpu=0, link_speed_gbps=model.nvlink_link_gbps)
        return ExpectedLinks(alone, f"one {model.smi_name} on the node: no peer to join by NVLink, no link expected")
    if gpu_count is not None and gpu_count > 1 and _lists_none(listed):
        links = f"{model.nvlink_links} x {_speed(model.nvlink_link_gbps)} GB/s"
        return ExpectedLinks(
            datasheet,
            f"{gpu_count} GPUs of {model.key} list no NVLink: their links are down, the datasheet's {links} per GPU "
            f"stay expected ({NAME}:no_nvlink)",
        )
    return ExpectedLinks(datasheet)


def node_expected_nvlink(gpus: GpuList | None, listed: NvlinkState | None) -> ExpectedLinks | None:
    """:func:`expected_nvlink` from a node's parsed ``gpu_count`` and ``nvlink`` outputs, read the same way for
    ``profile: auto`` and ``profile suggest``: the one GPU model nvidia-smi names (none where it names several),
    and how many GPUs it lists (none where it listed none or failed)."""
    listing = gpus.gpus if gpus is not None else []
    names = {gpu.name for gpu in listing}
    model = model_for_name(names.pop()) if len(names) == 1 else None
    return expected_nvlink(model, len(listing) or None, listed)


@dataclass
class _Block:
    index: int
    name: str
    links: list[Link] = field(default_factory=list)
    all_inactive: bool = False
    counters: dict[int, dict[str, int]] = field(default_factory=dict)


class _Unreadable(Exception):
    pass


def _blocks(text: str, what: str, read_line: Callable[[_Block, str], bool]) -> dict[int, _Block]:
    """Cut one nvlink output into per-GPU blocks, feeding every other non-blank line to ``read_line``."""
    if text and not text.endswith("\n"):
        raise _Unreadable(f"{what} output cut mid-line")
    blocks: dict[int, _Block] = {}
    current: _Block | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        gpu = _GPU_LINE.match(line)
        if gpu:
            index = int(gpu.group(1))
            if index in blocks:
                raise _Unreadable(f"GPU {index} listed twice in {what}")
            current = blocks[index] = _Block(index, gpu.group(2))
        elif current is None:
            raise _Unreadable(f"unexpected line before the first GPU in {what}: {quote(line.strip(), 80)}")
        elif _ALL_INACTIVE in line.lower():
            current.all_inactive = True
        elif not read_line(current, line):
            raise _Unreadable(f"unexpected line in {what} for GPU {current.index}: {quote(line.strip(), 80)}")
    return blocks


def _read_speed(block: _Block, line: str) -> bool:
    match = _SPEED_LINE.match(line)
    if not match:
        return False
    index = int(match.group(1))
    if any(link.index == index for link in block.links):
        raise _Unreadable(f"GPU {block.index} link {index} listed twice in nvlink -s")
    speed = match.group(2)
    block.links.append(Link(index, float(speed) if speed else None, speed or ""))
    return True


def _read_counter(block: _Block, line: str) -> bool:
    match = _COUNTER_LINE.match(line)
    if not match:
        return False
    link, label, value = int(match.group(1)), match.group(2), match.group(3)
    counters = block.counters.setdefault(link, {})
    if value.isdigit():
        counters[label] = int(value)
    return True


def parse(stdout: str, exit_code: int | None = 0) -> NvlinkState:
    status_part, sep, rest = stdout.partition(_ERRORS_MARK)
    status_rc_text, _, errors_part = rest.partition("\n")
    status_rc = small_int(status_rc_text)
    failure = driver_failure(status_part, status_rc) or driver_failure(errors_part, exit_code if sep else None)
    if failure:
        return NvlinkState(failure=failure, raw=stdout)
    if not sep:
        return NvlinkState(error="output truncated before the nvlink -e section", raw=stdout)
    if status_rc != 0:
        return NvlinkState(error=f"nvidia-smi nvlink -s exited {status_rc_text.strip()!r}", raw=stdout)
    if exit_code not in (0, None):
        return NvlinkState(error=f"nvidia-smi nvlink -e exited {exit_code}", raw=stdout)
    try:
        status = _blocks(status_part, "nvlink -s", _read_speed)
        errors = _blocks(errors_part, "nvlink -e", _read_counter)
    except _Unreadable as exc:
        return NvlinkState(error=str(exc), raw=stdout)
    if errors and sorted(errors) != sorted(status):
        return NvlinkState(
            error=f"nvlink -s lists GPUs {sorted(status)} but nvlink -e lists GPUs {sorted(errors)}", raw=stdout
        )
    gpus = [
        GpuLinks(
            index=block.index,
            name=block.name,
            links=sorted(block.links, key=lambda link: link.index),
            all_inactive=block.all_inactive,
            counters=errors[index].counters if index in errors else {},
        )
        for index, block in sorted(status.items())
    ]
    return NvlinkState(gpus=gpus, raw=stdout)


def _speed(value: float) -> str:
    return f"{value:g}"


def _links_text(links: list[Link]) -> str:
    """``18 x 26.562 GB/s``; mixed speeds as ``17 x 26.562 GB/s + 1 x 26.55 GB/s``; none as ``0 links``."""
    if not links:
        return "0 links"
    counts = Counter(link.speed_text for link in links)
    return " + ".join(f"{n} x {speed} GB/s" for speed, n in sorted(counts.items(), key=lambda kv: -float(kv[0])))


def _signature(gpu: GpuLinks) -> str:
    if gpu.all_inactive:
        return "all-inactive"
    speeds = sorted({link.speed_text for link in gpu.active})
    text = f"{len(gpu.active)}x{speeds[0] if len(speeds) == 1 else 'mixed'}" if gpu.active else "0"
    inactive = len(gpu.links) - len(gpu.active)
    return text + (f"+{inactive}inactive" if inactive else "")


def cluster_values(model: NvlinkState) -> dict[str, str]:
    if model.failure or model.error:
        return {}
    if not model.gpus:
        return {"nvlink_links": "none"}
    signatures = [_signature(gpu) for gpu in model.gpus]
    if len(set(signatures)) == 1:
        return {"nvlink_links": signatures[0]}
    return {"nvlink_links": "/".join(f"{gpu.index}:{sig}" for gpu, sig in zip(model.gpus, signatures, strict=True))}


def counters(model: NvlinkState) -> dict[str, int]:
    """Every link's error counters (``gpu0.link3.crc``): growth since the node's last run is a link going bad."""
    if model.failure or model.error:
        return {}
    return {
        f"gpu{gpu.index}.link{link}.{label.lower()}": value
        for gpu in model.gpus
        for link, values in sorted(gpu.counters.items())
        for label, value in values.items()
    }


def _counter_text(counters: dict[str, int]) -> str:
    return " ".join(f"{label.lower()}={value}" for label, value in counters.items())


def _gpu_rows(gpu: GpuLinks, spec: NvlinkSpec) -> list[CheckRow]:
    wanted = spec.links_per_gpu
    speed = f"{_speed(spec.link_speed_gbps)} GB/s"
    expected = f"{wanted} x {speed}" if wanted else "0 links"
    error_rows = [
        CheckRow(NAME, f"link{link}", Status.WARN, "link_errors", _counter_text(counters), "0", gpu=gpu.index)
        for link, counters in sorted(gpu.counters.items())
        if any(counters.values())
    ]
    if not wanted and not gpu.active:
        # No link expected (a GPU without a peer on its node): links shown inactive join nothing, none is down.
        observed = "all links inactive" if gpu.all_inactive else f"{len(gpu.links)} inactive"
        return [CheckRow(NAME, "links", Status.PASS, "ok", observed, expected, gpu=gpu.index), *error_rows]
    link_rows: list[CheckRow] = []
    if gpu.all_inactive:
        link_rows.append(
            CheckRow(NAME, "links", Status.FAIL, "link_inactive", "all links inactive", expected, gpu=gpu.index)
        )
    elif len(gpu.links) < wanted:
        detail = f"links shown: {', '.join(str(link.index) for link in gpu.links) or 'none'}"
        link_rows.append(
            CheckRow(NAME, "links", Status.FAIL, "links_missing", str(len(gpu.links)), str(wanted), detail, gpu.index)
        )
    elif len(gpu.links) > wanted:
        link_rows.append(
            CheckRow(NAME, "links", Status.WARN, "links_extra", str(len(gpu.links)), str(wanted), gpu=gpu.index)
        )
    minimum = spec.link_speed_gbps * (1 - SPEED_TOLERANCE)
    for link in gpu.links:
        if link.speed_gbps is None:
            link_rows.append(
                CheckRow(NAME, f"link{link.index}", Status.FAIL, "link_inactive", "<inactive>", speed, gpu=gpu.index)
            )
        elif link.speed_gbps < minimum:
            observed = f"{link.speed_text} GB/s"
            link_rows.append(
                CheckRow(NAME, f"link{link.index}", Status.FAIL, "link_slow", observed, speed, gpu=gpu.index)
            )
    if not link_rows:
        link_rows.append(CheckRow(NAME, "links", Status.PASS, "ok", _links_text(gpu.links), expected, gpu=gpu.index))
    return link_rows + error_rows


def evaluate(model: NvlinkState, profile: Profile, cluster: ClusterView) -> list[CheckRow]:
    if model.failure:
        # gpu_count and driver already fail the node for this; one row here says why nothing was judged.
        return [CheckRow(NAME, "nvidia-smi", Status.SKIP, "nvidia_smi_failed", model.failure)]
    spec = profile.nvlink
    if spec is None:
        observed = None if model.error else cluster_values(model).get("nvlink_links")
        return [CheckRow(NAME, "links", Status.SKIP, "not_in_profile", observed, None, model.error or "")]
    if model.error:
        return [error_row(NAME, "unparsable_output", model.error, model.raw)]
    if not model.gpus:
        if spec.links_per_gpu == 0:
            return [CheckRow(NAME, "links", Status.PASS, "ok", "no NVLink", "no NVLink")]
        expected = f"{spec.links_per_gpu} x {_speed(spec.link_speed_gbps)} GB/s per GPU"
        detail = "nvidia-smi nvlink -s listed no GPU with NVLinks"
        return [CheckRow(NAME, "links", Status.FAIL, "no_nvlink", "no NVLink", expected, detail)]
    rows: list[CheckRow] = []
    for gpu in model.gpus:
        rows.extend(_gpu_rows(gpu, spec))
    return rows


def _expected_values(others: NodeModels, listed: NvlinkState) -> SuggestedValues:
    """Where the node lists no NVLink, what ``profile: auto`` expects of it instead (none of a GPU alone on its
    node; the datasheet's links of GPUs with peers, whose links are down), from the same rule
    (:func:`node_expected_nvlink`) so that the profile suggested is the one auto judges by; with why, under
    ``nvlink.expected``. Nothing where the rule cannot tell (no built-in model, no GPU count read)."""
    gpus = others.get(GPU_COUNT)
    expected = node_expected_nvlink(gpus if readable(gpus) else None, listed)
    if expected is None or expected.why is None:
        return {}
    spec = expected.spec
    return {
        "nvlink.links_per_gpu": str(spec.links_per_gpu),
        "nvlink.link_speed_gbps": f"{spec.link_speed_gbps:g}",
        "nvlink.expected": expected.why,
    }


def suggest_values(model: NvlinkState, others: NodeModels) -> SuggestedValues:
    """The links per GPU and their speed a profile starts from (``profile suggest``); a node listing none, what
    ``profile: auto`` expects of it (:func:`_expected_values`)."""
    if not model.gpus:
        return {"nvlink.links_per_gpu": "0", **_expected_values(others, model)}
    return {
        "nvlink.links_per_gpu": one_value(len(g.active) for g in model.gpus),
        "nvlink.link_speed_gbps": one_value(link.speed_text for g in model.gpus for link in g.active),
    }


CHECK = Check(
    name=NAME,
    command=COMMAND,
    parse=parse,
    evaluate=evaluate,
    reasons=REASONS,
    cluster_values=cluster_values,
    suggest=suggest_values,
    counters=counters,
    expectations=(Expectation("nvlink", "preflight", NAME, is_set(lambda p: p.nvlink)),),
    causes=(Cause(NVSWITCH, frozenset({NAME}), "preflight", FABRIC_DOWN),),  # a fabric down: no peers
    samples=(
        healthy(
            "h200x4",
            {"ok"},
            fixture="nvlink/h200x4.txt",
            profile={"nvlink": {"links_per_gpu": 18, "link_speed_gbps": 26.562}},
        ),
        healthy(
            "h100x1",
            {"ok"},
            fixture="nvlink/h100x1.txt",
            profile={"nvlink": {"links_per_gpu": 0, "link_speed_gbps": 1.0}},
        ),
        fault(
            "link_inactive",
            {"link_inactive"},
            fixture="nvlink/h200x4_link_inactive.txt",
            profile={"nvlink": {"links_per_gpu": 18, "link_speed_gbps": 26.562}},
        ),
        # A node without NVLink (the h100x1 capture) on a profile that expects 18 links a GPU.
        fault(
            "no_nvlink",
            {"no_nvlink"},
            fixture="nvlink/h100x1.txt",
            profile={"nvlink": {"links_per_gpu": 18, "link_speed_gbps": 26.5}},
        ),
        driver_unreachable({"nvidia_smi_failed"}),
    ),
)

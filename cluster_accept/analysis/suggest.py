"""A profile to start from, read off the nodes: the majority of each value, and where nodes disagree.

Writing a profile by hand means knowing the cluster's driver, CUDA version, GPU count, NVLink and PCIe links and
NCCL environment before the first run. ``cluster-accept profile suggest`` reads them with the preflight
checks' own commands and parsers; this module turns the parsed models into profile YAML. Each value is the
plurality of the nodes that answered (a tie leaves the key out and says why), and each carries a comment saying
how many nodes had it and which nodes had something else, because a node that differs fails against the
suggested profile: the operator decides whether the value or the node is wrong before using it.

The text is written line by line rather than dumped, so that every value keeps its comment; values are JSON
strings (valid YAML, escaped), so node text can never break out of its line.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from cluster_accept.analysis.calibration_said import SuggestedLimits
from cluster_accept.analysis.suggest_calibration import Calibrated, ClusterShape, write_calibration, write_limits
from cluster_accept.analysis.suggest_fabric import write_floor, write_infiniband, write_transport
from cluster_accept.checks.base import Check, discover, plurality, readable
from cluster_accept.inventory.gpus import GpuModel, model_for_name, profile_data, unknown_model_help
from cluster_accept.inventory.hostlist import describe_folded, fold
from cluster_accept.vocabulary.text import visible

UNSET = "<unset>"
_MASK = "****"
# What CPU probes on nodes sharing one machine's cores need (the test-bed): their figures vary with the load of
# the machine, so a node far below the others is a warning, not a rejection.
CPU_THRESHOLDS = {"relative_verdict": "warn"}
_Limits = tuple[SuggestedLimits, str] | None  # the limits a calibration suggests, and its id


def suggesting_checks(checks: Sequence[Check[Any]] | None = None) -> list[Check[Any]]:
    """The checks ``profile suggest`` reads: those that declare a ``suggest`` hook (all discovered, by default)."""
    return [check for check in (discover() if checks is None else checks) if check.suggest is not None]


def node_values(models: Mapping[str, Any], checks: Sequence[Check[Any]] | None = None) -> dict[str, str]:
    """One node's values under their profile keys (``gpu.count``, ``nccl_env.NCCL_IB_HCA``…) from its parsed
    models, each check reading its own (``Check.suggest``, the node's other models beside it); a check that
    failed or was unreadable on the node gives none."""
    values: dict[str, str] = {}
    for check in suggesting_checks(checks):
        model = models.get(check.name)
        if readable(model) and check.suggest is not None:
            values.update({k: v for k, v in check.suggest(model, models).items() if v})
    return values


@dataclass(frozen=True)
class Agreement:
    """One key across the nodes that answered: each node's value, and those that gave none."""

    values: Mapping[str, str]
    silent: tuple[str, ...] = ()

    @property
    def value(self) -> str | None:
        """The value of the largest group; None when the largest groups tie (or no node gave one)."""
        return plurality(Counter(self.values.values()))

    def comment(self) -> str:
        """``3 of 4 nodes; DISAGREE: 580.95.05 on node[01-02,04]; 570.86.15 on node03``."""
        total = len(self.values) + len(self.silent)
        value = self.value
        if value is None:
            said = f"nodes tie: {describe_folded(self.values)}" if self.values else "no node gave a value"
        else:
            having = [node for node, v in self.values.items() if v == value]
            said = f"{len(having)} of {total} nodes"
            disagree = len(set(self.values.values())) > 1
            said += f"; DISAGREE: {describe_folded(self.values)}" if disagree else f": {fold(having)}"
        if self.silent:
            said += f"; no value from {fold(self.silent)}"
        return _comment_text(said)


def _comment_text(text: str) -> str:
    return " ".join(visible(text).split())


def agreements(per_node: Mapping[str, Mapping[str, str]]) -> dict[str, Agreement]:
    """Every key any node gave, across the nodes; an NCCL variable a node lacks is ``<unset>`` there (when its
    environment was read), so a variable set on a few nodes only shows as a disagreement, not a majority."""
    keys = sorted({key for values in per_node.values() for key in values})
    env_read = [node for node, values in per_node.items() if "nccl_env" in values]
    found: dict[str, Agreement] = {}
    for key in keys:
        values = {node: v[key] for node, v in per_node.items() if key in v}
        if key.startswith("nccl_env."):
            values = {node: values.get(node, UNSET) for node in env_read}
        silent = tuple(node for node in per_node if node not in values)
        found[key] = Agreement(values, silent)
    return found


def cluster_values(models: Mapping[str, Mapping[str, Any]]) -> dict[str, Agreement]:
    """node -> {check: parsed model} into the agreement on each profile key (the checks discovered once)."""
    checks = suggesting_checks()
    per_node = {}
    for node, node_models in models.items():
        values = node_values(node_models, checks)
        if readable(node_models.get("nccl_env")):
            values["nccl_env"] = "read"  # a marker: this node's environment was read (see agreements)
        per_node[node] = values
    found = agreements(per_node)
    found.pop("nccl_env", None)
    return found


def _scalar_text(value: str, kind: type) -> str:
    """The value as YAML: a number as it is, ``true``/``false`` as they are, text as a JSON string (``"13.0"``
    stays text)."""
    if kind is bool:
        return value
    return str(kind(value)) if kind is not str else json.dumps(value)


def _writable(value: str | None, kind: type) -> bool:
    if value is None or value.startswith(("<", "mixed ")):
        return False
    if kind is bool:
        return value in ("true", "false")
    try:
        kind(value)
    except ValueError:
        return False
    return True


class _Writer:
    """Lines of the profile: ``key: value  # comment``, and keys left out as comments saying why."""

    def __init__(self, found: Mapping[str, Agreement], base: Mapping[str, str]):
        self.lines: list[str] = []
        self.found = found
        self.base = base

    def note(self, text: str, indent: int = 0) -> None:
        """A comment on one line: what the nodes said about one key, which a wrap would cut mid-list."""
        self.lines.append(f"{'  ' * indent}# {_comment_text(text)}")

    def prose(self, text: str, indent: int = 0) -> None:
        """A comment of explanation, wrapped."""
        for line in textwrap.wrap(_comment_text(text), 110 - 2 * indent):
            self.lines.append(f"{'  ' * indent}# {line}")

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def ready(self, key: str, kind: type = str) -> bool:
        agreement = self.found.get(key)
        return agreement is not None and _writable(agreement.value, kind)

    def value(self, key: str, kind: type = str, indent: int = 0) -> None:
        """``key: value  # comment`` when the nodes' value can be written, else a comment saying why not."""
        name = key.rsplit(".", 1)[-1]
        agreement = self.found.get(key)
        if agreement is None:
            return
        value, comment = agreement.value, agreement.comment()
        if key in self.base and value is not None and self.base[key] != value:
            comment += f"; the base has {self.base[key]}"
        if value is None or not _writable(value, kind):
            self.note(f"{name}: left out, {value or 'no value most nodes share'}: {comment}", indent)
            return
        self.raw(f"{'  ' * indent}{name}: {_scalar_text(value, kind)}  # {comment}")


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = f"{value:g}" if isinstance(value, float) else str(value)
    return flat


def _gpu_model(found: Mapping[str, Agreement]) -> GpuModel | None:
    agreement = found.get("gpu.model")
    return model_for_name(agreement.value) if agreement and agreement.value else None


def pick_device(found: Mapping[str, Agreement]) -> str:
    """``cuda`` when most nodes list GPUs, else ``cpu``."""
    count = found.get("gpu.count")
    return "cuda" if count is not None and count.value not in (None, "0") else "cpu"


def _write_base(out: _Writer, model: GpuModel) -> None:
    out.raw(f"base: {model.key}  # the built-in profile of {model.smi_name}; the keys below win over its own")
    out.prose(f"{model.key} brings these ({model.source}; thresholds are fractions of the datasheet's peaks):")
    text = yaml.safe_dump(profile_data(model), sort_keys=False, default_flow_style=False)
    out.lines.extend(f"#   {line}" for line in text.splitlines())


def _write_block(out: _Writer, name: str, keys: Mapping[str, type], required: tuple[str, ...]) -> None:
    """A nested key (``gpu:``, ``nvlink:``): written when its required keys can be, else left out with why."""
    missing = [key for key in required if not out.ready(f"{name}.{key}", keys[key])]
    if not missing:
        out.raw(f"{name}:")
        for key, kind in keys.items():
            out.value(f"{name}.{key}", kind, indent=1)
        return
    read = [f"{key}: {out.found[f'{name}.{key}'].comment()}" for key in keys if f"{name}.{key}" in out.found]
    if read:
        out.note(f"{name}: left out: no value most nodes share for {', '.join(missing)}. {'; '.join(read)}")


def _write_nvlink(out: _Writer) -> None:
    """``nvlink:`` as ``profile: auto`` expects it: the links most nodes list, or for nodes that list none what
    auto expects of them, each group of those nodes said with why (:func:`_expected_nvlink`)."""
    expected = out.found.get("nvlink.expected")
    said: dict[str, list[str]] = {}
    for node, why in expected.values.items() if expected is not None else ():
        said.setdefault(why, []).append(node)
    for why, nodes in sorted(said.items()):
        out.prose(f"nvlink where the nodes list none ({fold(nodes)}): {why}")
    links = out.found.get("nvlink.links_per_gpu")
    if links is not None and links.value == "0" and not out.ready("nvlink.link_speed_gbps", float):
        out.note(f"nvlink: left out: the nodes list no NVLink ({links.comment()})")
        return
    _write_block(out, "nvlink", {"links_per_gpu": int, "link_speed_gbps": float}, ("links_per_gpu", "link_speed_gbps"))


def _write_nccl_env(out: _Writer) -> None:
    keys = sorted(key for key in out.found if key.startswith("nccl_env.NCCL_"))
    pinned = [key for key in keys if out.ready(key) and out.found[key].value != _MASK]
    out.raw("nccl_env:" + ("" if pinned else " {}  # no NCCL_* variable most nodes set the same way"))
    out.prose(
        "the NCCL_* variables a job sees (environment, ~/.nccl.conf, /etc/nccl.conf); nccl_harmful judges settings "
        "known to cripple a job whatever is pinned here",
        1,
    )
    for key in keys:
        agreement, name = out.found[key], key.removeprefix("nccl_env.")
        if key in pinned:
            out.value(key, indent=1)
        elif agreement.value == _MASK:
            out.note(f"{name}: not pinned: a secret, masked on the node ({agreement.comment()})", 1)
        elif agreement.value == UNSET:
            out.note(f"{name}: not pinned, most nodes leave it unset: {agreement.comment()}", 1)
        else:
            out.note(f"{name}: not pinned: {agreement.comment()}", 1)


def _write_probes(out: _Writer, device: str) -> None:
    out.raw("probes:")
    said = "on the GPUs" if device == "cuda" else "on the CPU (nodes without GPUs, or a test-bed)"
    out.raw(f"  device: {device}  # probes run {said}")
    out.value("probes.python", indent=1)
    write_transport(out)
    torch = out.found.get("probes.torch")
    if torch is not None:
        out.note(f"the interpreter has {torch.value or 'no torch most nodes share'}: {torch.comment()}", 1)
        if device == "cuda" and torch.value and "CPU build" in torch.value:
            out.note("a CPU build of torch cannot probe GPUs (probe:torch_no_cuda): install a CUDA build", 1)


def _write_thresholds(out: _Writer, device: str, model: GpuModel | None, limits: _Limits = None) -> None:
    """``thresholds:``: CPU's, the base's, or placeholders for a GPU no base describes; with ``limits`` (from a
    calibration), ``straggler_pct`` and ``noise_k`` too."""
    if device == "cpu":
        out.raw("thresholds:")
        out.prose(
            "CPU probes (--device cpu): no GPU thresholds (they are TFLOP/s and GB/s of a GPU); nodes sharing one "
            "machine's cores vary with its load, so a node below the others is a warning",
            1,
        )
        out.raw(f"  relative_verdict: {CPU_THRESHOLDS['relative_verdict']}")
        _write_limits(out, limits, opened=True)
        return write_floor(out, opened=True)
    if model is not None:
        out.note(f"thresholds: those of base {model.key} (above); write any to override it")
        return write_floor(out, opened=_write_limits(out, limits, opened=False))
    name = out.found["gpu.model"].value if "gpu.model" in out.found else None
    out.prose(unknown_model_help(name) if name else "no GPU model most nodes share, so no built-in profile applies")
    out.prose("Fill in what a healthy node reaches (e.g. a run's measurements.parquet on known-good nodes):")
    out.raw("# thresholds:")
    out.raw("#   gemm_bf16_tflops_min: <fill in>            # bf16 GEMM per GPU, TFLOP/s")
    out.raw("#   hbm_copy_gbps_min: <fill in>               # HBM copy per GPU, GB/s")
    out.raw("#   allreduce_intra_busbw_gbps_min: <fill in>  # all-reduce bus bandwidth in a node, GB/s")
    write_floor(out, opened=_write_limits(out, limits, opened=False))


def _write_limits(out: _Writer, limits: _Limits, opened: bool) -> bool:
    """The calibration's ``straggler_pct`` and ``noise_k`` (``thresholds:`` opened here unless ``opened``);
    whether ``thresholds:`` is open after."""
    if limits is None:
        return opened
    if not opened:
        out.raw("thresholds:")
    write_limits(out, *limits)
    return True


def _shape(found: Mapping[str, Agreement], base: Mapping[str, str], device: str, nodes: int) -> ClusterShape:
    """The profile's nodes as a calibration counts them: the GPU model its ``gpu.model`` will hold (the nodes',
    else the base's), as :func:`analysis.calibration.model_key` keys it, and GPUs a node."""
    if device != "cuda":
        return ClusterShape("cpu", 1, nodes, device)
    model = found["gpu.model"].value if "gpu.model" in found else None
    count = found["gpu.count"].value if "gpu.count" in found else None
    gpus = int(count) if count is not None and _writable(count, int) else 1
    named = model if model is not None and _writable(model, str) else base.get("gpu.model")
    return ClusterShape(named or "unknown GPU", gpus, nodes, device)


def _write_header(out: _Writer, cluster: str, answered: list[str], unreachable: Mapping[str, str], device: str) -> None:
    total = len(answered) + len(unreachable)
    out.prose(
        f"Profile suggested by cluster-accept profile suggest for cluster {cluster}, read from {len(answered)} of "
        f"{total} nodes ({fold(answered)}), probes on {device}. Each value is what most nodes have; its comment says "
        "on how many, and DISAGREE marks a value the nodes differ on: those nodes fail against this profile, so "
        "decide whether the value or the node is wrong before using it."
    )
    for node, cause in sorted(unreachable.items()):
        out.note(f"not read: {node} ({cause})")


def _kind_of(value: str | None) -> type:
    """How a plug-in's suggested value is written: ``true``/``false`` a boolean, a number a number, else text."""
    if value in ("true", "false"):
        return bool
    for kind in (int, float):
        try:
            kind(value or "")
        except ValueError:
            continue
        return kind
    return str


def _write_plugins(out: _Writer) -> None:
    """``plugins:``: the keys checks and probes added beside the built-in ones suggest under their own names
    (``plugins.<name>.<key>``, what their settings read), each plug-in written where one of its keys can be."""
    names = sorted({key.split(".")[1] for key in out.found if key.startswith("plugins.") and key.count(".") >= 2})
    ready = [n for n in names if any(out.ready(k, _kind_of(a.value)) for k, a in _keys_of(out, n))]
    if ready:
        out.raw("plugins:")
    for name in names:
        if name in ready:
            out.raw(f"  {name}:")
        for key, agreement in _keys_of(out, name):
            if name in ready:
                out.value(key, _kind_of(agreement.value), indent=2)
            else:
                out.note(f"plugins.{name}: left out, {key}: {agreement.comment()}")


def _keys_of(out: _Writer, name: str) -> list[tuple[str, Agreement]]:
    return sorted((k, a) for k, a in out.found.items() if k.startswith(f"plugins.{name}."))


def suggest_profile(
    models: Mapping[str, Mapping[str, Any]],
    unreachable: Mapping[str, str] | None = None,
    device: str | None = None,
    cluster: str = "cluster",
    calibrated: Calibrated | None = None,
) -> str:
    """The profile YAML, with comments, from node -> {check: parsed model} of the nodes that answered.
    ``unreachable``: node -> why it was not read (listed in a comment); ``device``: ``cuda`` or ``cpu`` (default:
    cuda when most nodes list GPUs). On cuda, a built-in GPU model becomes ``base:`` with its thresholds shown;
    an unknown one gets commented placeholders. ``calibrated``: the cluster's calibration, shown before the
    thresholds (each key figure's noise and margin) with the ``straggler_pct``/``noise_k`` it suggests, if any.
    Loads with ``Profile.model_validate(yaml.safe_load(text))``."""
    found = cluster_values(models)
    device = device or pick_device(found)
    gpu_model = _gpu_model(found) if device == "cuda" else None
    base = _flat(profile_data(gpu_model)) if gpu_model else {}
    out = _Writer(found, base)
    _write_header(out, cluster, list(models), unreachable or {}, device)
    if gpu_model is not None:
        _write_base(out, gpu_model)
    _write_block(out, "gpu", {"model": str, "count": int}, ("model",))
    for key in ("driver_version", "cuda_version", "persistence_mode"):
        out.value(key)
    _write_nvlink(out)
    _write_block(out, "pcie", {"gen": int, "width": int}, ("gen", "width"))
    write_infiniband(out)
    _write_nccl_env(out)
    _write_probes(out, device)
    _write_plugins(out)
    limits = None
    if calibrated is not None:
        shape = _shape(found, base, device, len(models) + len(unreachable or {}))
        suggested = write_calibration(out, calibrated, shape)
        limits = (suggested, calibrated.table.calibrated_at) if suggested is not None else None
    _write_thresholds(out, device, gpu_model, limits)
    return "\n".join(out.lines) + "\n"

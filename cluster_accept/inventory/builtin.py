"""Profiles built on the built-in GPU profiles: by name, on top of a ``base``, or picked per node (``auto``).

A profile's own keys win over its base's, key by key (``thresholds: {gemm_bf16_tflops_min: 650}`` changes that
one minimum and keeps the others). ``auto`` cannot be resolved when the inventory loads: the GPU model is what
preflight reads on each node, so :func:`resolve_auto` runs there, over the model nvidia-smi printed.

Between nodes the same holds for the fabric (:mod:`inventory.fabric`): a built-in fabric named by ``fabric`` is
laid under the profile's own keys when the inventory loads; ``fabric: auto``, the default on a built-in base, is
read from the nodes in preflight and laid under them there (:func:`fabric_under`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cluster_accept.inventory.fabric import AUTO_FABRIC, BUILTIN_FABRICS, fabric_data, fabric_names
from cluster_accept.inventory.gpus import AUTO, BY_KEY, MODELS, model_for_name, profile_data, unknown_model_help
from cluster_accept.inventory.model import NvlinkSpec, Profile
from cluster_accept.inventory.quoting import quoted
from cluster_accept.inventory.threshold_needs import BASE, INHERITED

NVLINK_THRESHOLD = "allreduce_intra_busbw_gbps_min"
AUTO_PICKS = "the built-in profile auto picks"  # how a problem names the base of an auto profile


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _without_nvlink_figures(base_data: dict[str, Any]) -> dict[str, Any]:
    """``base_data`` less what follows from NVLink: the all-reduce minimum and the expected P2P transport."""
    trimmed = dict(base_data)
    trimmed["thresholds"] = {k: v for k, v in base_data.get("thresholds", {}).items() if k != NVLINK_THRESHOLD}
    # Only the transport inside the node: the one between nodes, where a fabric laid it under the base, stays.
    probes = dict(trimmed.pop("probes", {}))
    transport = {k: v for k, v in probes.pop("expected_transport", {}).items() if k != "intra_node"}
    if transport:
        probes["expected_transport"] = transport
    if probes:
        trimmed["probes"] = probes
    return trimmed


def with_nvlink(base_data: dict[str, Any], nvlink: NvlinkSpec) -> dict[str, Any]:
    """``base_data`` expecting ``nvlink`` of the node's GPUs, as a profile's own ``nvlink`` would over it: none
    expected (a GPU without a peer) drops what the base derived from NVLink too, as :func:`merged_profile` does."""
    data = _without_nvlink_figures(base_data) if nvlink.links_per_gpu == 0 else dict(base_data)
    data["nvlink"] = nvlink.model_dump()
    return data


def merged_profile(base_data: dict[str, Any], own: Profile, base: str = "the base") -> Profile:
    """``own``'s keys (only those it sets) over ``base_data``; raises ValueError when the result is not a
    valid profile (naming the problem). A profile that says its nodes have no NVLink (``nvlink: null`` or
    ``links_per_gpu: 0``) drops what the base derived from NVLink unless it sets those keys itself. Blocks
    with required keys (``nvlink``, ``pcie``) are written whole. ``base`` names the base in a problem with a
    threshold taken from it, so that the operator knows where a key they never wrote comes from."""
    over = own.model_dump(exclude_unset=True, exclude={"base"})
    if "nvlink" in over and (own.nvlink is None or own.nvlink.links_per_gpu == 0):
        base_data = _without_nvlink_figures(base_data)
    inherited = frozenset(base_data.get("thresholds", {})) - frozenset(over.get("thresholds", {}))
    try:
        return Profile.model_validate(_deep_merge(base_data, over), context={BASE: base, INHERITED: inherited})
    except ValidationError as exc:
        raise ValueError("; ".join(_problem(e["loc"], e["msg"]) for e in exc.errors())) from exc


def _problem(loc: tuple[int | str, ...], message: str) -> str:
    """``key.path: message``; a problem of the whole profile (its thresholds against its probes) has no key.
    The ``Value error, `` pydantic puts before a validator's own message says nothing here."""
    message = message.removeprefix("Value error, ")
    return f"{'.'.join(map(str, loc))}: {message}" if loc else message


def is_auto(profile: Profile) -> bool:
    return profile.base == AUTO


def builtin_names() -> list[str]:
    return [*BY_KEY, AUTO]


def derives_fabric(profile: Profile) -> bool:
    """Whether what is expected between nodes is read from the nodes at run time: ``fabric: auto``, or no
    ``fabric`` on a built-in base (a profile written without a base states its own expectations)."""
    return profile.fabric == AUTO_FABRIC or (profile.fabric is None and profile.base is not None)


def named_fabric_data(profile: Profile) -> dict[str, Any] | None:
    """Profile data for the built-in fabric ``profile`` names; None for auto, none or no fabric."""
    named = BUILTIN_FABRICS.get(profile.fabric or "")
    return fabric_data(named.fabric, profile.training.enabled) if named else None


def fabric_under(profile: Profile, between: dict[str, Any]) -> Profile:
    """``profile`` with what the fabric implies (``between``) under the keys it has (its own and its base's: a
    built-in GPU profile sets nothing between nodes). Raises ValueError when the result is not valid."""
    try:
        return Profile.model_validate(_deep_merge(between, profile.model_dump(exclude_unset=True)))
    except ValidationError as exc:
        raise ValueError("; ".join(_problem(e["loc"], e["msg"]) for e in exc.errors())) from exc


def with_base(profile: Profile) -> Profile:
    """``profile`` over its named built-in base and fabric; an ``auto`` profile stays as it is (resolved in
    preflight), once it is known to be valid over every built-in profile it may pick. Raises ValueError for a
    base or fabric that is not built in, or a profile not valid over them."""
    if profile.fabric is not None and profile.fabric not in fabric_names():
        raise ValueError(
            f"fabric {quoted(profile.fabric)} is not a built-in fabric (built-in: {', '.join(fabric_names())})"
        )
    if is_auto(profile):
        _valid_over_every_model(profile)
        return profile
    base_data, named = named_fabric_data(profile) or {}, f"fabric {profile.fabric}"
    if profile.base is not None:
        model = BY_KEY.get(profile.base)
        if model is None:
            known = ", ".join(builtin_names())
            raise ValueError(f"base {quoted(profile.base)} is not a built-in profile (built-in: {known})")
        base_data, named = _deep_merge(profile_data(model), base_data), f"base {model.key}"
    if not base_data:
        return profile
    merged = merged_profile(base_data, profile, named)
    return merged.model_copy(update={"base": profile.base}) if profile.base is not None else merged


def _valid_over_every_model(own: Profile) -> None:
    """Raises ValueError when ``own`` is not a valid profile over some built-in one ``auto`` may pick: every
    node of that model would fail preflight for it, after the inventory was accepted (a CPU-probed profile under
    GPU thresholds, one GPU under an all-reduce minimum). Whether a threshold can be measured depends on the
    profile's own probes and GPU count (a built-in profile sets no probe device, and a GPU count of 4 or more
    where it sets one), not on which model brings the threshold: the thresholds of every model together stand
    for each of them, and a problem names each key once. A named fabric's keys come with them."""
    brought: dict[str, Any] = {}
    for model in MODELS:
        brought.update(profile_data(model)["thresholds"])
    merged_profile(_deep_merge({"thresholds": brought}, named_fabric_data(own) or {}), own, AUTO_PICKS)


def builtin_profile(name: str) -> Profile | None:
    """The built-in profile called ``name`` (``auto``: the profile every node's GPU model picks)."""
    if name == AUTO:
        return Profile(base=AUTO)
    model = BY_KEY.get(name)
    return Profile.model_validate({**profile_data(model), "base": model.key}) if model else None


@dataclass(frozen=True)
class AutoChoice:
    """What ``profile: auto`` made of one node: the profile it is judged by, or why there is none."""

    profile: Profile
    name: str | None  # the built-in profile picked; None when none was
    gpu_names: tuple[str, ...]
    problem: str | None = None


def resolve_auto(
    own: Profile, gpu_names: list[str], between: dict[str, Any] | None = None, nvlink: NvlinkSpec | None = None
) -> AutoChoice:
    """The built-in profile of the one GPU model in ``gpu_names`` with ``own``'s keys over it; the node keeps
    ``own`` (and says why) when its GPUs are unknown, of several models, or unreadable (empty list). ``between``:
    what the cluster's fabric implies between nodes (:func:`inventory.fabric.fabric_data`), under ``own`` too;
    ``nvlink``: what the node's GPUs should show for NVLink (:func:`checks.nvlink.expected_nvlink`, which knows
    a GPU alone on its node has no link), in place of the model's datasheet links and under ``own``'s keys."""
    names = tuple(sorted(set(gpu_names)))
    if not names:
        return AutoChoice(own, None, names, "no GPU model read (nvidia-smi failed or listed no GPU)")
    if len(names) > 1:
        return AutoChoice(own, None, names, f"GPUs of several models on one node: {', '.join(names)}")
    model = model_for_name(names[0])
    if model is None:
        return AutoChoice(own, None, names, unknown_model_help(names[0]))
    try:
        data = profile_data(model) if nvlink is None else with_nvlink(profile_data(model), nvlink)
        base = _deep_merge(data, between or {})
        return AutoChoice(merged_profile(base, own, f"base {model.key}"), model.key, names)
    except ValueError as exc:
        return AutoChoice(own, model.key, names, f"the profile's keys over {model.key} are not valid: {exc}")

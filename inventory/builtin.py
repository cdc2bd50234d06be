"""Profiles built on the built-in GPU profiles: by name, on top of a ``base``, or picked per node (``auto``).

A profile's own keys win over its base's, key by key (``thresholds: {gemm_bf16_tflops_min: 650}`` changes that
one minimum and keeps the others). ``auto`` cannot be resolved when the inventory loads: the GPU model is what
preflight reads on each node, so :func:`resolve_auto` runs there, over the model nvidia-smi printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cluster_accept.inventory.gpus import AUTO, BY_KEY, model_for_name, profile_data, unknown_model_help
from cluster_accept.inventory.model import Profile

NVLINK_THRESHOLD = "allreduce_intra_busbw_gbps_min"


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
    trimmed.pop("probes", None)  # built-in profiles set only the NVLink transport under probes
    return trimmed


def merged_profile(base_data: dict[str, Any], own: Profile) -> Profile:
    """``own``'s keys (only those it sets) over ``base_data``; raises ValueError when the result is not a
    valid profile (naming the problem). A profile that says its nodes have no NVLink (``nvlink: null`` or
    ``links_per_gpu: 0``) drops what the base derived from NVLink unless it sets those keys itself. Blocks
    with required keys (``nvlink``, ``pcie``) are written whole."""
    over = own.model_dump(exclude_unset=True, exclude={"base"})
    if "nvlink" in over and (own.nvlink is None or own.nvlink.links_per_gpu == 0):
        base_data = _without_nvlink_figures(base_data)
    try:
        return Profile.model_validate(_deep_merge(base_data, over))
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from exc


def is_auto(profile: Profile) -> bool:
    return profile.base == AUTO


def builtin_names() -> list[str]:
    return [*BY_KEY, AUTO]


def with_base(profile: Profile) -> Profile:
    """``profile`` over its named built-in base; an ``auto`` profile stays as it is (resolved in preflight).
    Raises ValueError for a base that is not built in."""
    if profile.base is None or is_auto(profile):
        return profile
    model = BY_KEY.get(profile.base)
    if model is None:
        raise ValueError(f"base {profile.base!r} is not a built-in profile (built-in: {', '.join(builtin_names())})")
    return merged_profile(profile_data(model), profile)


def builtin_profile(name: str) -> Profile | None:
    """The built-in profile called ``name`` (``auto``: the profile every node's GPU model picks)."""
    if name == AUTO:
        return Profile(base=AUTO)
    model = BY_KEY.get(name)
    return Profile.model_validate(profile_data(model)) if model else None


@dataclass(frozen=True)
class AutoChoice:
    """What ``profile: auto`` made of one node: the profile it is judged by, or why there is none."""

    profile: Profile
    name: str | None  # the built-in profile picked; None when none was
    gpu_names: tuple[str, ...]
    problem: str | None = None


def resolve_auto(own: Profile, gpu_names: list[str]) -> AutoChoice:
    """The built-in profile of the one GPU model in ``gpu_names`` with ``own``'s keys over it; the node keeps
    ``own`` (and says why) when its GPUs are unknown, of several models, or unreadable (empty list)."""
    names = tuple(sorted(set(gpu_names)))
    if not names:
        return AutoChoice(own, None, names, "no GPU model read (nvidia-smi failed or listed no GPU)")
    if len(names) > 1:
        return AutoChoice(own, None, names, f"GPUs of several models on one node: {', '.join(names)}")
    model = model_for_name(names[0])
    if model is None:
        return AutoChoice(own, None, names, unknown_model_help(names[0]))
    try:
        return AutoChoice(merged_profile(profile_data(model), own), model.key, names)
    except ValueError as exc:
        return AutoChoice(own, model.key, names, f"the profile's keys over {model.key} are not valid: {exc}")

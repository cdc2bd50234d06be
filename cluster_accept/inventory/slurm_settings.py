"""Slurm settings: how inventory names map to Slurm's node names, and how ``launcher: slurm`` allocates and
starts multi-node runs.

``slurm.node_names`` (inventory level) is one rule for every node: a label that holds the node's Slurm name,
or a regular expression with its replacement (``match``/``replace``, Python's ``re`` syntax). Without it, a
node's Slurm name is its inventory name. The rule is applied when the inventory is loaded; a node the rule
cannot name, or two nodes that would share one Slurm name, are refused then, not when a drain goes wrong.

``probes.slurm`` (profile level) holds what ``salloc`` and ``srun`` are told: partition, account, QOS,
reservation, a time limit, how long to wait for the allocation, and extra ``srun`` arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from cluster_accept.inventory.quoting import quoted

# What Slurm accepts in a NodeName (no spaces, commas or brackets: those are hostlist syntax).
SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_OPTION_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+@-]{0,127}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .inf and NaN are no setting


class NodeNameRule(_Strict):
    """``label: NAME`` (the node's label NAME holds its Slurm name; nodes without it keep their own) or
    ``match: REGEX`` + ``replace: TEMPLATE`` (``\\1`` for groups); the regex must match the whole name."""

    label: StrictStr | None = None
    match: StrictStr | None = None
    replace: StrictStr | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> NodeNameRule:
        if (self.label is None) == (self.match is None):
            raise ValueError("give either label, or match with replace")
        if (self.match is None) != (self.replace is None):
            raise ValueError("match and replace go together")
        if self.match is not None:
            try:
                pattern = re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"match {quoted(self.match)} is not a regular expression: {exc}") from None
            try:
                pattern.sub(str(self.replace), "")
            except (re.error, IndexError) as exc:
                raise ValueError(f"replace {quoted(self.replace)}: {exc}") from None
        return self

    def name_for(self, node: str, labels: Mapping[str, str]) -> str:
        """The Slurm name of ``node``; ValueError when the rule cannot name it."""
        if self.label is not None:
            return labels.get(self.label, node)
        found = re.fullmatch(str(self.match), node)
        if found is None:
            raise ValueError(f"does not match {quoted(self.match)}")
        return found.expand(str(self.replace))


class SlurmSettings(_Strict):
    """The inventory's ``slurm`` block."""

    node_names: NodeNameRule | None = Field(
        default=None, description="map inventory names to Slurm node names (default: the same)"
    )


def slurm_names(
    rule: NodeNameRule | None, nodes: Sequence[tuple[str, Mapping[str, str]]]
) -> tuple[dict[str, str], list[str]]:
    """Inventory name -> Slurm name for ``nodes`` ((name, labels) pairs), and the problems found: a node the rule
    cannot name, a name Slurm would not take, two nodes with one Slurm name."""
    names: dict[str, str] = {}
    problems: list[str] = []
    for node, labels in nodes:
        try:
            name = rule.name_for(node, labels) if rule else node
        except ValueError as exc:
            problems.append(f"slurm.node_names: node {node} {exc}")
            continue
        if not SLURM_NAME.fullmatch(name):
            problems.append(f"slurm.node_names: node {node} maps to {quoted(name)}, not a Slurm node name")
            continue
        names[node] = name
    owners: dict[str, list[str]] = {}
    for node, name in names.items():
        owners.setdefault(name, []).append(node)
    problems += [
        f"slurm.node_names: nodes {', '.join(nodes)} all map to Slurm node {name}"
        for name, nodes in owners.items()
        if len(nodes) > 1
    ]
    return names, problems


class SrunSettings(_Strict):
    """A profile's ``probes.slurm``: what the multi-node runs ask of Slurm under ``launcher: slurm``."""

    partition: StrictStr | None = None
    account: StrictStr | None = None
    qos: StrictStr | None = None
    reservation: StrictStr | None = Field(default=None, description="e.g. the maintenance reservation of the nodes")
    time_limit_min: Annotated[int, Field(ge=1, le=10080)] = Field(
        default=60, description="the allocation's time limit (salloc --time) when cluster-accept makes one"
    )
    allocation_wait_s: Annotated[int, Field(ge=1, le=86400)] = Field(
        default=120, description="how long to wait for the allocation (salloc --immediate) before failing"
    )
    gpus_per_node: bool = Field(
        default=True, description="ask for every GPU of each node (--gpus-per-node) on CUDA profiles"
    )
    exclusive: bool = Field(default=True, description="allocate the nodes whole (--exclusive)")
    srun_args: list[StrictStr] = Field(default_factory=list, description="more srun arguments, e.g. --mpi=none")

    @field_validator("partition", "account", "qos", "reservation")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and not _OPTION_VALUE.fullmatch(value):
            raise ValueError(f"{quoted(value)}: one word of letters, digits, '.', '_', ':', '+', '@', '-'")
        return value

    @field_validator("srun_args")
    @classmethod
    def _options_only(cls, args: list[str]) -> list[str]:
        bad = [a for a in args if not a.startswith("-") or "\n" in a]
        if bad:
            raise ValueError(f"{', '.join(map(quoted, bad))}: srun_args holds options only (each starting with '-')")
        return args

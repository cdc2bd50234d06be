"""Load an inventory file into resolved :class:`~inventory.model.Node` objects, or fail with a clear error.

Every problem is reported as ``FILE: key.path: what was expected``, all of them at once, so an operator
fixes a broken inventory in one pass. Profiles are taken inline (``profiles:``) or by name from a
``profiles/NAME.yaml`` beside the inventory file, then from the built-in GPU profiles (:mod:`inventory.gpus`;
``auto`` picks one per node from the GPU model preflight reads). A profile with ``base:`` is its base with its
own keys over it.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import Event
from yaml.resolver import Resolver

from cluster_accept.inventory.builtin import builtin_names, builtin_profile, with_base
from cluster_accept.inventory.files import ssh_file_problems
from cluster_accept.inventory.gpus import AUTO
from cluster_accept.inventory.hostlist import MAX_NODES, HostlistError, expand, fold
from cluster_accept.inventory.model import (
    DEFAULT_SSH,
    LOCAL_ADDRESS,
    Inventory,
    InventoryFile,
    Node,
    NodeEntryFile,
    Profile,
    SshSettings,
)
from cluster_accept.inventory.node_part import WantedNode, part_events
from cluster_accept.inventory.plugins import SettingsModels, plugin_problems
from cluster_accept.inventory.quoting import cut, cut_quotes, quoted
from cluster_accept.inventory.simulation_settings import SimulatedAs, simulated_as
from cluster_accept.inventory.slurm_settings import slurm_names

# A profile looked up as profiles/NAME.yaml: a plain file name, so that '../x' or an over-long name is not a path.
_PROFILE_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class InventoryError(Exception):
    """An inventory that cannot be used; ``problems`` holds one line per problem, each naming its key."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that rejects a key given twice in one mapping (YAML would keep the last silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    if not isinstance(node, yaml.MappingNode):  # '!!map [1]': construct_mapping says what is wrong, and where
        return loader.construct_mapping(node, deep=deep)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *base' merges a mapping in; the keys given here override the merged ones
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # a list or mapping as a key: construct_mapping reports it with its position
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"key {quoted(key)} given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _key_path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            # pydantic names the union branch it tried (e.g. 'str', 'MinVersion'); that is not a key.
            if part in {"str", "MinVersion", "function-after", "constrained-float", "constrained-int"}:
                continue
            if part == "[key]":  # the mapping key itself is refused, not its value
                text += part
                continue
            if not _PLAIN_KEY.fullmatch(part):  # '', 'a: b', 'a\nb': quoted, so the line still names the key
                part = quoted(part)
            text += f".{part}" if text else part
    return text or "(top level)"


def _describe(errors: list[Any], prefix: str = "") -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    for err in errors:
        path = _key_path(tuple(err["loc"]))
        if prefix:
            path = f"{prefix}.{path}" if path != "(top level)" else prefix
        if err["type"] == "extra_forbidden":
            line = f"{path}: unknown key (typo? see inventory/examples/contract.yaml for the keys)"
        elif err["type"] == "missing":
            line = f"{path}: required key is missing"
        elif err["type"] == "value_error" and isinstance(err.get("input"), dict):
            line = f"{path}: {err['msg']}"  # a block's own rule (its keys together): the message names them
        else:
            line = f"{path}: {err['msg']} (got {quoted(err.get('input'))})"
        if line not in seen:
            seen.add(line)
            problems.append(line)
    return problems


def _read_yaml(path: Path, source: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(source, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(source, [f"not UTF-8 text: byte {exc.start} is {exc.object[exc.start]:#04x}"]) from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InventoryError(source, [f"not valid YAML: {cut_quotes(str(exc))}"]) from exc
    except RecursionError as exc:
        raise InventoryError(source, ["not valid YAML: nested too deeply"]) from exc
    except (ValueError, TypeError, LookupError, AttributeError) as exc:
        # how PyYAML's constructors fail on a value they cannot build: a date like 2001-02-30, an int of over 4300
        # digits, '!!bool x', '!!int ""', '!!timestamp x'
        said = f"{type(exc).__name__}: {cut(str(exc))}"
        raise InventoryError(source, [f"not valid YAML: a value cannot be read ({said})"]) from exc


def _load_profile_file(path: Path) -> Profile:
    data = _read_yaml(path, str(path))
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(str(path), _describe(exc.errors())) from exc


def load_inventory(
    path: str | Path, check_files: bool = True, plugins: SettingsModels | None = None, node: WantedNode | None = None
) -> Inventory:
    """Read, validate and resolve an inventory file. Raises :class:`InventoryError`.

    ``check_files``: also check the controller's files the nodes' SSH settings name (keys, known_hosts:
    :mod:`inventory.files`); off only where an inventory is read, not used to connect. ``plugins``: the settings
    models of the probes the caller runs, each profile's ``plugins:`` checked against them (left unchecked
    without). ``node``: a node's own check, which reads only that node's entries of the file besides its other
    blocks (:mod:`inventory.node_part`); where that part is refused, the whole file is loaded, so that the
    problems named are those of a whole load."""
    path = Path(path)
    if node is not None and (part := _node_part(path, node)) is not None:
        try:
            return _resolved(path, part, check_files, plugins, scoped=True)
        except InventoryError:
            pass  # named below, every problem of the file at once, as any load names them
    return _resolved(path, _read_yaml(path, str(path)), check_files, plugins)


class _Replayed(_UniqueKeyLoader):
    """The inventory's own composer and constructors (keys given twice refused) over events already parsed."""

    def __init__(self, events: list[Event]) -> None:  # no reader, scanner or parser: the events are parsed
        self._events = deque(events)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)

    def check_event(self, *choices: Any) -> bool:
        return bool(self._events) and (not choices or isinstance(self._events[0], choices))

    def peek_event(self) -> Event:
        return self._events[0]

    def get_event(self) -> Event:
        return self._events.popleft()

    def dispose(self) -> None:
        self._events.clear()


def _built(events: list[Event]) -> Any:
    return _Replayed(events).get_single_data()


def _node_part(path: Path, node: WantedNode) -> Any:
    """The file with only ``node``'s entries under ``nodes``, built; None where that part cannot be told apart
    (:func:`inventory.node_part.part_events`) or read: the whole file is then read as any load reads it."""
    try:
        text = path.read_text(encoding="utf-8")
        events = part_events(text, node, _built)
        return None if events is None else _built(events)
    except (OSError, ValueError, yaml.YAMLError, TypeError, LookupError, AttributeError, RecursionError):
        return None  # UnicodeDecodeError is a ValueError: the whole load says what is wrong, where


def _resolved(
    path: Path, data: Any, check_files: bool, plugins: SettingsModels | None, scoped: bool = False
) -> Inventory:
    """``data`` (the file as read) validated and resolved. ``scoped``: ``data`` holds only one node's entries
    (:func:`_node_part`), so the file's other nodes are neither missing nor listed for ``exclude``."""
    source = str(path)
    if not isinstance(data, dict):
        raise InventoryError(source, ["(top level): expected a mapping with keys cluster, nodes, profiles, ..."])
    try:
        parsed = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(source, _describe(exc.errors())) from exc
    loading = _Loading(path, parsed, scoped)
    for name, own in parsed.profiles.items():
        loading.based(name, own, _key_path(("profiles", name)))
    if not parsed.nodes and not scoped:
        loading.problems.append("nodes: empty list; at least one node entry is required")
    nodes, listed = loading.nodes()
    if plugins is not None:
        loading.problems += plugin_problems(loading.profiles, plugins)
    excluded = loading.excluded(listed)
    in_slurm, naming_problems = slurm_names(parsed.slurm.node_names, [(n.name, n.labels) for n in nodes])
    loading.problems += naming_problems
    simulated: dict[str, SimulatedAs] = {}
    if parsed.simulation is not None:
        simulated, simulation_problems = simulated_as(parsed.simulation, path.parent, [n.name for n in nodes])
        loading.problems += simulation_problems
    if loading.problems:
        raise InventoryError(source, loading.problems)
    nodes = [
        replace(
            n,
            excluded=n.name in excluded,
            slurm_name=in_slurm[n.name] if in_slurm[n.name] != n.name else "",
            simulated=simulated.get(n.name),
        )
        for n in nodes
    ]
    if check_files and (problems := ssh_file_problems(n for n in nodes if not n.excluded and n.simulated is None)):
        raise InventoryError(source, problems)
    return Inventory(parsed.cluster, nodes, loading.profiles, source, loading.digest.hexdigest())


class _Loading:
    """One inventory being resolved: its profiles as they are resolved (named, from files, built in), every
    problem found so far (all are reported at once), and the digest of every file read."""

    def __init__(self, path: Path, parsed: InventoryFile, scoped: bool = False) -> None:
        self.path = path
        self.parsed = parsed
        self.scoped = scoped  # one node's entries only (a node's own check): the others are not listed
        self.problems: list[str] = []
        self.digest = hashlib.sha256(path.read_bytes())
        self.profiles: dict[str, Profile] = {}

    def based(self, name: str, profile: Profile, key: str) -> Profile | None:
        if name == AUTO and profile.base is None:
            profile = profile.model_copy(update={"base": AUTO})  # the inline 'auto' profile overrides the pick
        try:
            self.profiles[name] = with_base(profile)
        except ValueError as exc:
            self.problems.append(f"{key}: profile {quoted(name)}: {exc}")
            return None
        return self.profiles[name]

    def resolve_profile(self, name: str, key: str) -> Profile | None:
        """The profile called ``name``: under ``profiles``, in ``profiles/<name>.yaml`` beside the inventory, or
        built in; None (with the problem noted) when none is, or it was refused."""
        if name in self.profiles:
            return self.profiles[name]
        if name in self.parsed.profiles:
            return None  # its base was refused: reported under profiles.NAME
        if not _PROFILE_FILE_NAME.fullmatch(name):
            self.problems.append(
                f"{key}: profile {quoted(name)} is not defined under 'profiles' (and is not a file name)"
            )
            return None
        candidate = self.path.parent / "profiles" / f"{name}.yaml"
        if candidate.is_file():
            try:
                profile = _load_profile_file(candidate)
            except InventoryError as exc:
                self.problems.extend(f"{key} -> {line}" for line in str(exc).splitlines())
                return None
            self.digest.update(candidate.read_bytes())
            return self.based(name, profile, key)
        builtin = builtin_profile(name)
        if builtin is not None:
            self.profiles[name] = builtin
            return builtin
        self.problems.append(
            f"{key}: profile {quoted(name)} is not defined under 'profiles' nor in profiles/{name}.yaml, and is not "
            f"built in ({', '.join(builtin_names())})"
        )
        return None

    def nodes(self) -> tuple[list[Node], dict[str, int]]:
        """Every node the entries name, on its profile; and node -> the entry that first listed it."""
        nodes: list[Node] = []
        first_entry: dict[str, int] = {}
        named = 0
        base_ssh = self.parsed.defaults.ssh.merged_over(DEFAULT_SSH)
        for i, entry in enumerate(self.parsed.nodes):
            names = self._entry_names(i, entry, named)
            if names is None:
                continue
            named += len(names)
            if named > MAX_NODES:
                self.problems.append(f"nodes[{i}].hosts: the entries up to this one name more than {MAX_NODES} nodes")
                break
            for name, node in self._entry_nodes(i, entry, names, base_ssh):
                if name in first_entry:
                    also = f"also in nodes[{first_entry[name]}].hosts"
                    self.problems.append(f"nodes[{i}].hosts: node {name} is listed twice ({also})")
                    continue
                first_entry[name] = i
                nodes.append(node)
        return nodes, first_entry

    def _entry_names(self, i: int, entry: NodeEntryFile, named: int) -> list[str] | None:
        """The node names of entry ``i`` (its address checked against them); None when they do not expand."""
        key = f"nodes[{i}]"
        try:
            names = expand(entry.hosts)
        except HostlistError as exc:
            self.problems.append(f"{key}.hosts: {exc}")
            return None
        if entry.address is not None and len(names) > 1:
            self.problems.append(
                f"{key}.address: one address given for {len(names)} nodes ({cut(entry.hosts)}); give each node its "
                "own entry"
            )
        if entry.address is not None and not entry.address.strip():
            self.problems.append(f"{key}.address: empty address")
        return names

    def _entry_nodes(
        self, i: int, entry: NodeEntryFile, names: list[str], base_ssh: SshSettings
    ) -> list[tuple[str, Node]]:
        """The nodes of entry ``i`` on its profile (none when it has no profile that resolves)."""
        profile_name = entry.profile or self.parsed.defaults.profile
        if profile_name is None:
            self.problems.append(f"nodes[{i}].profile: no profile for this entry and no defaults.profile")
            return []
        profile = self.resolve_profile(profile_name, f"nodes[{i}].profile" if entry.profile else "defaults.profile")
        if profile is None:
            return []
        ssh = entry.ssh.merged_over(base_ssh)
        labels = {**self.parsed.defaults.labels, **entry.labels}
        return [(name, Node(name, ssh, profile_name, profile, entry.address, labels)) for name in names]

    def excluded(self, listed: Mapping[str, int]) -> set[str]:
        """The nodes ``exclude`` names (each must be listed under nodes)."""
        excluded: set[str] = set()
        named = 0
        for j, expression in enumerate(self.parsed.exclude):
            try:
                names = expand(expression)
            except HostlistError as exc:
                self.problems.append(f"exclude[{j}]: {exc}")
                continue
            named += len(names)
            if named > MAX_NODES:
                self.problems.append(f"exclude[{j}]: the entries up to this one name more than {MAX_NODES} nodes")
                break
            for name in names:
                if name not in listed and not self.scoped:
                    self.problems.append(f"exclude[{j}]: node {name} is not listed under nodes")
                excluded.add(name)
        return excluded


def select_nodes(inventory: Inventory, expression: str | None) -> Inventory:
    """Restrict the tested nodes to ``expression`` (a hostlist); naming a node not in the inventory is an error."""
    if not expression:
        return inventory
    wanted = set(expand(expression))
    known = {n.name for n in inventory.nodes}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"--nodes names nodes not in the inventory: {fold(unknown)}")
    nodes = [n for n in inventory.nodes if n.name in wanted]
    return replace(inventory, nodes=nodes)


def from_slurm_names(inventory: Inventory, expression: str) -> str:
    """The inventory nodes (a folded hostlist) that Slurm calls ``expression`` (a Slurm hostlist, e.g. a job's
    ``SLURM_JOB_NODELIST``); a Slurm name no inventory node maps to is an error."""
    by_slurm = {n.slurm_node: n.name for n in inventory.nodes}
    wanted = expand(expression)
    unknown = [name for name in wanted if name not in by_slurm]
    if unknown:
        raise ValueError(
            f"--slurm-nodes names Slurm nodes no inventory node maps to: {fold(unknown)} (see slurm.node_names)"
        )
    return fold([by_slurm[name] for name in wanted])


def as_local(inventory: Inventory) -> Inventory:
    """The one tested node reached without SSH: a node checking itself (Slurm's health check, a prolog)."""
    tested = inventory.tested
    if len(tested) != 1:
        raise ValueError(
            f"--local checks this machine: select exactly one node (--nodes or --slurm-nodes), not {len(tested)}"
        )
    local = replace(tested[0], address=LOCAL_ADDRESS)
    return replace(inventory, nodes=[local if n is tested[0] else n for n in inventory.nodes])

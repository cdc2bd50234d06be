"""A node's own check reads only its part of a large site inventory: its entry (by ``--node``, Slurm's name
through ``slurm.node_names``, or the host's name) besides the file's other blocks, resolved exactly as a whole
load resolves it; where the events cannot tell an entry's names (an alias, a merge key), or the part has a
problem, the whole file is loaded and its problems named. The time is the bench's
(``bench/check_local_inventory.py``); here, what is resolved is counted."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows import node_check, node_gather
from cluster_accept.flows.cli import app
from cluster_accept.inventory import load
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Inventory

pytestmark = pytest.mark.unit

ENTRIES = 2000
PROFILES = "profiles:\n  p: {}\n  q: {persistence_mode: disabled}\n"


def _site(tmp_path: Path, extra: str = "", entries: int = ENTRIES) -> Path:
    """``entries`` nodes, one entry each (address, labels), a range entry, an exclude list naming others, and the
    Slurm name rule after the nodes (where a reader meets it last)."""
    lines = ["cluster: site", "defaults: {profile: p, labels: {site: s1}}", "nodes:"]
    lines += [
        f"  - {{hosts: node{i:05d}, address: 10.0.{i // 250}.{i % 250 + 1}, labels: {{rack: r{i // 40:03d}}}}}"
        for i in range(1, entries + 1)
    ]
    lines += ["  - hosts: 'spare[001-100]'", "    profile: q", "    ssh: {port: 2222}"]
    lines += [
        "exclude: [node00002, 'spare[001-004]']",
        "slurm: {node_names: {match: '(?:node|spare)(\\d+)', replace: 'gpu-\\1'}}",
    ]
    path = tmp_path / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n" + PROFILES + extra)
    return path


def WantedNode(**which: str) -> Any:  # noqa: N802 - the loader's own type, imported where it is used
    """:class:`inventory.node_part.WantedNode`, imported here so that the module (and its first test, through
    the CLI alone) also runs against a loader without it."""
    from cluster_accept.inventory.node_part import WantedNode as Wanted

    return Wanted(**which)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The entries of ``nodes`` the loader resolves into nodes, counted."""
    resolved: list[int] = []
    entry_nodes = load._Loading._entry_nodes

    def counted(self: Any, i: int, *args: Any) -> Any:
        resolved.append(i)
        return entry_nodes(self, i, *args)

    monkeypatch.setattr(load._Loading, "_entry_nodes", counted)
    return resolved


@pytest.mark.parametrize(
    ("args", "env", "host"),
    [
        (["--node", "node01234"], {}, "elsewhere"),
        ([], {"SLURMD_NODENAME": "gpu-01234"}, "elsewhere"),  # through the rule written after the nodes
        ([], {}, "node01234.example.net"),
    ],
    ids=["--node", "SLURMD_NODENAME", "hostname"],
)
def test_check_local_resolves_only_its_own_entry_of_a_site_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], host: str
) -> None:
    path = _site(tmp_path)
    resolved = _counting(monkeypatch)
    checked: list[tuple[Inventory, str]] = []

    def start_check(inventory: Inventory, name: str, *_: Any) -> tuple[Inventory, str]:
        checked.append((inventory, name))
        return inventory, name

    def finish_check(started: tuple[Inventory, str], run_id: str, *_: Any) -> node_check.NodeCheck:
        name = started[1]
        return node_check.NodeCheck(name, [], VerdictRow(run_id, "site", name, "p", Verdict.ACCEPTED))

    monkeypatch.setattr(node_gather, "start_check", start_check)
    monkeypatch.setattr(node_check, "finish_check", finish_check)
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    result = CliRunner().invoke(app, ["check", "--local", "--inventory", str(path), *args], env=env)
    assert (result.exit_code, result.stdout) == (0, "cluster-accept: ok\n"), result.output
    ((inventory, name),) = checked
    assert name == "node01234" and [n.name for n in inventory.nodes] == ["node01234"]
    assert len(resolved) == 1  # the one entry naming it; none of the 2,000 others
    node = inventory.node("node01234")
    assert (node.address, node.labels, node.slurm_node) == ("10.0.4.235", {"site": "s1", "rack": "r030"}, "gpu-01234")


def test_the_part_resolves_the_node_as_the_whole_file_does(tmp_path: Path) -> None:
    path = _site(tmp_path, entries=300)
    whole = load_inventory(path)
    for wanted, name in [
        (WantedNode(name="node00123"), "node00123"),
        (WantedNode(name="spare003"), "spare003"),  # in a range entry, excluded
        (WantedNode(slurm_name="gpu-00002"), "node00002"),
        (WantedNode(host="node00300"), "node00300"),
    ]:
        part = load_inventory(path, node=wanted)
        assert part.node(name) == whole.node(name)
        assert (part.cluster, part.profiles, part.digest) == (whole.cluster, whole.profiles, whole.digest)
    spare = load_inventory(path, node=WantedNode(name="spare003"))  # a range entry: its one node
    assert [(n.name, n.excluded, n.ssh.port) for n in spare.nodes] == [("spare003", True, 2222)]
    assert load_inventory(path, node=WantedNode(name="node00002")).node("node00002").excluded  # named by exclude


def test_a_node_the_inventory_does_not_list_is_named_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _site(tmp_path, entries=300)
    resolved = _counting(monkeypatch)
    assert load_inventory(path, node=WantedNode(name="ghost")).nodes == [] and resolved == []
    result = CliRunner().invoke(app, ["check", "--local", "--inventory", str(path), "--node", "ghost"])
    assert result.exit_code == 2 and "'ghost', from --node, is no node of the inventory" in result.output


@pytest.mark.parametrize(
    "entries",
    [
        "  - &rack {hosts: other01, labels: {rack: r9}}\n  - {<<: *rack, hosts: node00007}\n",  # a merge key
        "  - {hosts: *name}\n",  # an alias for hosts
        "  - {hosts: 12345}\n",  # no string
        "  - {hosts: 'node[7-x]'}\n",  # no hostlist
    ],
    ids=["merge key", "alias", "not a string", "bad hostlist"],
)
def test_an_entry_the_events_cannot_read_loads_the_whole_file(tmp_path: Path, entries: str) -> None:
    """Never a guess: an entry whose names rest on more than its own text, or that does not read at all, makes
    the node's check load (and refuse, where the file is wrong) the whole file, as a run would."""
    path = tmp_path / "inventory.yaml"
    head = "cluster: c\nx-name: &name node00009\n" if "*name" in entries else "cluster: c\n"
    path.write_text(
        f"{head}defaults: {{profile: p}}\nnodes:\n  - {{hosts: node00001}}\n{entries}profiles: {{p: {{}}}}\n"
    )
    outcomes: list[Inventory | str] = []
    for wanted in (None, WantedNode(name="node00001")):
        try:
            outcomes.append(load_inventory(path, node=wanted))
        except InventoryError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    if "*name" not in entries:  # the whole file is refused (an unknown key, a bad value): so is the node's check
        assert isinstance(outcomes[0], str) == ("&rack" not in entries), outcomes[0]


def test_a_problem_in_the_nodes_part_is_named_as_the_whole_load_names_it(tmp_path: Path) -> None:
    path = _site(tmp_path, entries=50)
    path.write_text(path.read_text().replace("address: 10.0.0.8,", "address: 10.0.0.8, ssh: {port: x},"))
    with pytest.raises(InventoryError) as whole:
        load_inventory(path)
    with pytest.raises(InventoryError) as part:
        load_inventory(path, node=WantedNode(name="node00007"))
    assert part.value.problems == whole.value.problems
    assert part.value.problems[0].startswith("nodes[6].ssh.port: ")  # the entry's place in the file
    # another node's check reads its own entry, not node00007's: the whole file's problems are a run's to name
    assert load_inventory(path, node=WantedNode(name="node00008")).node("node00008").address == "10.0.0.9"


def test_what_concerns_the_node_in_a_shared_entry_stays_refused(tmp_path: Path) -> None:
    """A range entry is cut to the node, except where that would hide its problem: one address given for the
    entry's three nodes, or (by Slurm's name) every node of the entry taking the one label the rule reads."""
    path = tmp_path / "inventory.yaml"
    rule = "slurm: {node_names: {label: slurm}}\n"
    for entries, wanted in [
        ("  - {hosts: 'node[1-3]', address: 10.0.0.1}\n", WantedNode(name="node2")),
        ("  - {hosts: 'node[1-3]', labels: {slurm: gpu-a}}\n", WantedNode(slurm_name="gpu-a")),
    ]:
        head = "cluster: c\ndefaults: {profile: p}\nnodes:\n  - {hosts: other}\n"
        path.write_text(f"{head}{entries}{rule}profiles: {{p: {{}}}}\n")
        with pytest.raises(InventoryError) as whole:
            load_inventory(path)
        with pytest.raises(InventoryError) as part:
            load_inventory(path, node=wanted)
        assert part.value.problems == whole.value.problems and len(part.value.problems) >= 1
    one = tmp_path / "one.yaml"  # an inventory of one node is that node, whatever this host is called
    one.write_text("cluster: c\ndefaults: {profile: p}\nnodes: [{hosts: here}]\nprofiles: {p: {}}\n")
    assert [n.name for n in load_inventory(one, node=WantedNode(host="elsewhere")).nodes] == ["here"]


@pytest.mark.parametrize(
    "rule",
    [
        {"match": "(a|ab)(\\d*)", "replace": "x\\1-\\2"},  # the first match from the start is not the whole name
        {"match": "node(\\d+)", "replace": "gpu-\\1"},
        {"label": "slurm"},
    ],
)
def test_slurms_name_of_each_node_is_the_rules_own(rule: dict[str, str]) -> None:
    from cluster_accept.inventory.node_part import slurm_namer
    from cluster_accept.inventory.slurm_settings import NodeNameRule

    parsed = NodeNameRule.model_validate(rule)
    defaults = {"slurm": "from-defaults"}
    named = slurm_namer(parsed, defaults)
    for name, labels in [("ab1", {}), ("a1", {}), ("ab", {}), ("node007", {"slurm": "s7"}), ("zz", {})]:
        try:
            expected: str | None = parsed.name_for(name, {**defaults, **labels})
        except ValueError:
            expected = None
        assert named(name, labels) == expected, name
    assert slurm_namer(None, defaults)("n1", {"slurm": "x"}) == "n1"

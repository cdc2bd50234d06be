"""The lemons a scheduler is handed (:func:`analysis.lemons.scheduler_line`): only host names (RFC 1123), and with
an inventory only its nodes, are folded into the line; every other name is listed apart with why, never folded
into a range and never costing the other lemons the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.analysis.lemons import host_name_problem, scheduler_line
from tests.test_lemon_scheduler_line import REAL, _forged


def test_only_host_names_are_folded_and_every_other_name_is_named_apart(tmp_path: Path) -> None:
    forged = _forged(tmp_path)
    found = scheduler_line([*forged, *REAL], None)
    assert found.line == "gpu[001-002]" and found.kept == tuple(REAL)
    assert [name for name, _ in found.apart] == forged
    assert all(why.startswith("it is no host name") for _, why in found.apart)
    assert scheduler_line(forged, None).line == ""  # nothing left to exclude: an empty line, still a line


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("gpu001", None),
        ("gpu-a3.rack1.example", None),
        ("7", None),
        ("", "it is empty"),
        ("-gpu", "no host name"),
        ("gpu-", "no host name"),
        ("gpu..a", "no host name"),
        ("gpu_01", "no host name"),
        ("gpu01,gpu02", "no host name"),
        ("gpu!gpu01", "no host name"),
        ("a" * 64, "no host name"),
        (".".join(["a" * 63] * 4), "longer than a host name can be"),
    ],
)
def test_a_host_name_is_one_of_rfc_1123(name: str, problem: str | None) -> None:
    said = host_name_problem(name)
    assert said == problem if problem is None else problem in str(said)


def test_with_an_inventory_only_its_nodes_are_folded() -> None:
    found = scheduler_line(["gpu001", "gpu002", "gpu_07", "gpu[1-2]"], {"gpu001", "gpu_07", "gpu[1-2]"})
    assert found.line == "gpu001,gpu_07"  # a node of the inventory may hold a '_'; it still names itself alone
    assert [(name, why) for name, why in found.apart] == [
        ("gpu002", "it is no node of the inventory"),
        ("gpu[1-2]", "it is no host name (letters, digits and '-' in labels of at most 63 joined by '.')"),
    ]

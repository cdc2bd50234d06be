"""The test-beds the tests bring up keep to subnets of their own: a test-bed stays up for the whole session (the
``testbed_factory`` fixture shares it by name), so two names on one subnet collide in any session that runs both
(one refused: "subnet … is already in use here")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent
SUBNET = re.compile(r"10\.254\.\d{1,3}\.0/24")
NAME = re.compile(r"[\"'](ca[a-z0-9]{1,6})[\"']")


def names_by_subnet(text: str) -> dict[str, set[str]]:
    """Each subnet literal with the test-bed names written on its line."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        for subnet in SUBNET.findall(line):
            found.setdefault(subnet, set()).update(NAME.findall(line))
    return found


def test_the_reading_sees_a_name_and_its_subnet_written_either_way() -> None:
    text = 'PREFIX, SUBNET = "cano", "10.254.180.0/24"\nbed = factory(prefix="canh", subnet="10.254.184.0/24")\n'
    assert names_by_subnet(text) == {"10.254.180.0/24": {"cano"}, "10.254.184.0/24": {"canh"}}


def test_no_two_test_bed_names_share_a_subnet() -> None:
    seen: dict[str, set[str]] = {}
    for module in sorted(TESTS.glob("test_*.py")):
        if module.name == Path(__file__).name:  # its own examples above
            continue
        for subnet, names in names_by_subnet(module.read_text()).items():
            seen.setdefault(subnet, set()).update(f"{n} ({module.name})" for n in names)
    shared = {subnet: sorted(names) for subnet, names in seen.items() if len({n.split()[0] for n in names}) > 1}
    assert not shared, shared

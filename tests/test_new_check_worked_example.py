"""docs/layout.md's worked example, a new check, dropped as it stands into a copy of the checkout: nothing else
is edited, and discovery, its samples, its own profile keys and ``profile suggest`` all take it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_packaging import copy_checkout

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
INTRO = "A worked example, a check that the node's swap is off"
# Run inside the copy: what discovery, the samples, the inventory and profile suggest make of the new check.
PROBE_THE_COPY = r"""
import json, sys
import yaml
from cluster_accept.analysis.suggest import suggest_profile
from cluster_accept.checks.base import discover, majority_values
from cluster_accept.inventory.load import InventoryError
from cluster_accept.inventory.model import Profile
from cluster_accept.probes.base import load_checked_inventory

swap = next(check for check in discover() if check.name == "swap")
judged = {}
for sample in swap.samples:
    model = swap.parse(sample.output(), sample.exit_code)
    rows = swap.evaluate(model, Profile(), majority_values({}))
    judged[sample.name] = [[row.status.value, row.reason] for row in rows]
on = swap.parse(swap.samples[1].output(), 0)
off = swap.parse(swap.samples[0].output(), 0)
text = suggest_profile({"n1": {"swap": on}, "n2": {"swap": on}, "n3": {"swap": off}}, device="cpu")
refused = ""
try:
    load_checked_inventory(sys.argv[2])
except InventoryError as exc:
    refused = str(exc)
inventory = load_checked_inventory(sys.argv[1])
allowed = swap.evaluate(on, inventory.profiles["cpu"], majority_values({}))
print(json.dumps({
    "module": swap.module.__file__, "judged": judged, "suggested": text,
    "loads": Profile.model_validate(yaml.safe_load(text)).plugins, "refused": refused,
    "allowed": [[row.status.value, row.reason] for row in allowed],
}))
"""
INVENTORY = """\
cluster: c
profiles:
  cpu: {{probes: {{device: cpu}}, plugins: {{swap: {{{key}: true}}}}}}
nodes: [{{hosts: n1, profile: cpu}}]
"""


def worked_example() -> str:
    """The python block that follows the example's introduction in docs/layout.md."""
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)```", text[text.index(INTRO) :], re.S)
    assert found is not None, "docs/layout.md has no worked example"
    return found.group(1)


def test_the_worked_example_needs_no_other_edit(tmp_path: Path) -> None:
    copy = copy_checkout(tmp_path)
    (copy / "cluster_accept" / "checks" / "swap.py").write_text(worked_example(), encoding="utf-8")
    allowed, wrong = tmp_path / "allowed.yaml", tmp_path / "wrong.yaml"
    allowed.write_text(INVENTORY.format(key="allowed"))
    wrong.write_text(INVENTORY.format(key="alowed"))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE_THE_COPY, str(allowed), str(wrong)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert Path(said["module"]).resolve() == (copy / "cluster_accept" / "checks" / "swap.py").resolve()
    assert said["judged"] == {
        "off": [["pass", "ok"]],
        "on": [["fail", "swap_on"]],
        "no_proc": [["error", "unparsable_output"]],
    }
    assert said["allowed"] == [["pass", "ok"]]  # the cluster's own key, read by the check
    assert "plugins.swap.alowed" in said["refused"] and "Extra inputs are not permitted" in said["refused"]
    assert said["loads"] == {"swap": {"allowed": True}}  # two of three nodes had swap on
    assert "  swap:\n    allowed: true  # 2 of 3 nodes; DISAGREE" in said["suggested"]

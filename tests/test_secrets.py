"""Secret-looking values are masked where node output enters stored rows (``analysis.secrets``)."""

from __future__ import annotations

import pytest

from cluster_accept.analysis.secrets import mask_secrets, mask_value
from cluster_accept.checks import nccl_env
from cluster_accept.checks.base import CheckRow, Status, discover
from cluster_accept.inventory.model import DEFAULT_SSH, Inventory, Node, Profile
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
from cluster_accept.tasks.preflight import NodePreflight, evaluate_preflight, node_values
from cluster_accept.tasks.rows import node_row

pytestmark = pytest.mark.pure


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NCCL_IB_SECRET_TOKEN=hunter2", "NCCL_IB_SECRET_TOKEN=***"),
        ("NCCL_PASSWORD = hunter2 pw", "NCCL_PASSWORD = ***"),
        ("export HF_TOKEN=hf_abc", "export HF_TOKEN=***"),
        ("api_key: abc123", "api_key: ***"),
        ("aws_secret_access_key:abc", "aws_secret_access_key:***"),
        ("db_Password='p w'", "db_Password=***"),
        ("--api-key=abc", "--api-key=***"),
        ('{"api_key": "abc", "n": 1}', '{"api_key": ***'),
        ("NCCL_DEBUG=INFO NCCL_TOKEN=abc", "NCCL_DEBUG=INFO NCCL_TOKEN=***"),
        (
            "#NCCL_API_TOKEN=old\r\nUCX_PASSWORD=pw-456\nNCCL_IB_PKEY=0x8001\nNCCL_IB_HCA=mlx5_0\n",
            "#NCCL_API_TOKEN=***\r\nUCX_PASSWORD=***\nNCCL_IB_PKEY=0x8001\nNCCL_IB_HCA=mlx5_0\n",
        ),
        ("[stderr]\nexport GH_TOKEN=ghp_1 && run", "[stderr]\nexport GH_TOKEN=***"),
    ],
)
def test_secret_values_are_masked_and_names_kept(text: str, expected: str) -> None:
    assert mask_secrets(text) == expected
    assert mask_secrets(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "NCCL_IB_PKEY=0",  # a partition key index, not a secret
        "NCCL_SOCKET_IFNAME=eth0",
        "NCCL_DEBUG_SUBSYS=KEY,TOKEN",  # KEY in the value, not in the name
        "note: the KEY is here",
        "ssh: unknown host key under 'strict' policy: Server '10.0.0.1' not found in known_hosts",
        "NCCL_IB_TOKEN=****",  # already masked by the check: left as it is
        "NCCL_IB_TOKEN=",  # nothing to hide
        "NCCL_PASSWORD=<value>",  # a placeholder, not a value
        "Persistence Mode                      : Enabled",
        "",
    ],
)
def test_what_is_not_a_secret_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_mask_value_judges_by_the_name_beside_it() -> None:
    assert mask_value("NCCL_IB_SECRET_TOKEN", "hunter2") == "***"
    assert mask_value("NCCL_IB_PKEY", "0x8001") == "0x8001"
    assert mask_value("NCCL_SOCKET_IFNAME", "eth0") == "eth0"
    assert mask_value("NCCL_PASSWORD", "****") == "****"
    assert mask_value("nccl_keys", "NCCL_DEBUG,NCCL_PASSWORD") == "NCCL_DEBUG,NCCL_PASSWORD"
    assert mask_value("detail", "NCCL_PASSWORD=pw") == "NCCL_PASSWORD=***"
    assert mask_value("NCCL_PASSWORD", "user:pw==") == "***"  # a bare value, whatever it looks like
    assert mask_value("NCCL_PASSWORD", "NCCL_PASSWORD =pw") == "NCCL_PASSWORD =***"  # its own line keeps the name
    assert mask_value("NCCL_PASSWORD", "<unset> (majority)") == "<unset> (majority)"


def test_long_hostile_output_is_masked_in_linear_time() -> None:
    text = "a: " * 30_000 + "\n" + "B_KEY=x " * 10_000
    assert mask_secrets(text) == "a: " * 30_000 + "\nB_KEY=***"


def test_node_row_masks_the_values_of_a_secret_item() -> None:
    detail = "from env; overrides /etc/nccl.conf: 'hunter2-etc', ~/.nccl.conf: '****'"
    row = CheckRow("nccl_env", "NCCL_PASSWORD", Status.WARN, "drift", "hunter2-env", "<unset> (majority)", detail)
    stored = node_row("r", "c", "preflight", "node01", row, "")
    assert (stored.observed, stored.expected) == ("***", "<unset> (majority)")
    assert stored.detail == "from env; overrides /etc/nccl.conf: '***', ~/.nccl.conf: '****'"
    plain = CheckRow("nccl_env", "NCCL_SOCKET_IFNAME", Status.FAIL, "value_mismatch", "eth9", "eth0", "from 'env'")
    stored = node_row("r", "c", "preflight", "node01", plain, "")
    assert (stored.observed, stored.expected, stored.detail) == ("eth9", "eth0", "from 'env'")


def test_node_row_masks_node_text_but_not_the_command() -> None:
    row = CheckRow("nccl_env", "NCCL_PASSWORD", Status.WARN, "drift", "NCCL_PASSWORD=pw1", None, "api_key: pw2")
    stored = node_row("r", "c", "preflight", "node01", row, "NCCL_PASSWORD=pw3\nNCCL_IB_PKEY=0\n", "env | grep KEY=")
    assert (stored.observed, stored.expected, stored.detail) == ("NCCL_PASSWORD=***", None, "api_key: ***")
    assert stored.raw_output == "NCCL_PASSWORD=***\nNCCL_IB_PKEY=0\n"
    assert stored.command == "env | grep KEY="
    assert (stored.item, stored.reason) == ("NCCL_PASSWORD", "drift")


def test_stored_rows_hold_no_secret_even_when_the_check_does_not_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second line of defence alone: nccl_env's own masking switched off, a node whose output is not masked."""
    monkeypatch.setattr(nccl_env, "is_secret", lambda key: False)
    check = next(c for c in discover() if c.name == "nccl_env")
    secret = (
        "### env\nNCCL_PASSWORD=hunter2-env\nNCCL_IB_SECRET_TOKEN=hunter2-token\nNCCL_IB_PKEY=0\n"
        "### /etc/nccl.conf\nNCCL_PASSWORD=hunter2-etc\nNCCL_API_KEY =hunter2-spaced\n### ~/.nccl.conf\n### end\n"
    )
    plain = "### env\nNCCL_IB_PKEY=0\n### /etc/nccl.conf\n### ~/.nccl.conf\n### end\n"
    profile = Profile(nccl_env={"NCCL_PASSWORD": "hunter2-pinned"})
    nodes = [Node(f"node0{i}", DEFAULT_SSH, "p", profile) for i in (1, 2, 3)]
    outcomes = []
    for node, stdout in zip(nodes, (secret, plain, plain), strict=True):
        result = NodeResult(node.name, NodeStatus.OK, commands=[CommandResult("nccl_env", 0, stdout, "")])
        outcomes.append(NodePreflight(node.name, result, {"nccl_env": check.parse(stdout, 0)}))
    inventory = Inventory("c", nodes, {"p": profile}, "inventory.yaml", "digest")

    rows = evaluate_preflight("r", inventory, outcomes, [check])
    values = node_values("r", "c", outcomes, [check])

    assert "hunter2" not in repr(rows) + repr(values)
    mine = {(r.item, r.reason): (r.observed, r.expected) for r in rows if r.node == "node01"}
    assert mine[("NCCL_PASSWORD", "value_mismatch")] == ("***", "***")
    assert mine[("NCCL_IB_SECRET_TOKEN", "drift")] == ("***", "<unset> (majority)")
    assert mine[("NCCL_API_KEY", "conf_line_ignored")] == ("NCCL_API_KEY =***", "NCCL_API_KEY=<value>")
    assert "NCCL_IB_SECRET_TOKEN=***\nNCCL_IB_PKEY=0\n" in rows[0].raw_output
    assert {(v["key"], v["value"]) for v in values if v["node"] == "node01"} >= {
        ("NCCL_PASSWORD", "***"),
        ("NCCL_IB_SECRET_TOKEN", "***"),
        ("NCCL_IB_PKEY", "0"),
    }

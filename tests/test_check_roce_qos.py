"""RoCE lossless settings compared across nodes (MTU, traffic class, PFC, ECN) and the RoCE counters kept for
growth, on the check's output over two ConnectX ports (the fixture: the command's format over sysfs as the ABI
documents it, PFC as mlnx_qos prints it) and variants derived from it."""

from __future__ import annotations

import pytest

from cluster_accept.analysis.regressions import counter_growth
from cluster_accept.checks import roce_qos
from cluster_accept.checks.base import Status, majority_values
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.model import Profile

HEALTHY = (SAMPLES_DIR / "roce_qos" / "two_ports.txt").read_text()


def test_the_fixture_parses_to_its_ports_settings_and_counters() -> None:
    model = roce_qos.parse(HEALTHY, 0)
    assert model.error is None and model.nccl_ib_tc == "106"
    assert [(p.name, p.netdev, p.mtu, p.roce_mtu, p.tclass, p.pfc) for p in model.ports] == [
        ("mlx5_0/1", "ens1f0np0", 9000, 4096, "106", "00010000"),
        ("mlx5_1/1", "ens2f0np0", 9000, 4096, "106", "00010000"),
    ]
    assert model.counters["mlx5_0/1.local_ack_timeout_err"] == 3
    assert model.counters["mlx5_1/1.np_cnp_sent"] == 51007 and len(model.counters) == 16
    assert roce_qos.cluster_values(model) == {
        "NCCL_IB_TC": "106",
        "roce_mtu": "4096",
        "traffic_class": "106",
        "pfc": "00010000",
        "ecn": "np 00010000 rp 00010000",
    }


def _judge(outputs: dict[str, str]) -> dict[str, dict[str, tuple[str, str, str | None, str | None]]]:
    models = {n: roce_qos.parse(out, 0) for n, out in outputs.items()}
    view = majority_values({n: roce_qos.cluster_values(m) for n, m in models.items()})
    return {
        n: {r.item: (r.status.value, r.reason, r.observed, r.expected) for r in roce_qos.evaluate(m, Profile(), view)}
        for n, m in models.items()
    }


def test_a_node_off_the_clusters_mtu_traffic_class_pfc_or_ecn_is_named_by_port() -> None:
    outputs = {
        "n1": HEALTHY,
        "n2": HEALTHY,
        "n3": HEALTHY.replace("ens2f0np0|9000", "ens2f0np0|1500"),  # one netdev left at 1500 bytes
        "n4": HEALTHY.replace("NCCL_IB_TC=106", "NCCL_IB_TC=<unset>").replace("|106|00010000", "|106|00001000"),
        "n5": HEALTHY.replace("|106|", "|-|").replace("0|00010000|00010000\n", "0|00010000|00000000\n"),
    }
    judged = _judge(outputs)
    assert all(row[0] == "pass" for row in judged["n1"].values()), judged["n1"]
    assert judged["n3"]["mlx5_1/1 mtu"] == ("fail", "differs", "1024", "4096")
    assert judged["n3"]["mlx5_0/1 mtu"][0] == "pass"
    assert judged["n4"]["NCCL_IB_TC"] == ("fail", "differs", "<unset>", "106")
    assert judged["n4"]["mlx5_0/1 pfc"] == ("fail", "differs", "00001000", "00010000")
    assert judged["n5"]["mlx5_0/1 traffic_class"] == ("fail", "differs", "-", "106")  # sysfs shows no class
    assert judged["n5"]["mlx5_1/1 ecn"] == ("fail", "differs", "np 00010000 rp 00000000", "np 00010000 rp 00010000")


def test_pfc_a_node_cannot_show_is_skipped_and_no_majority_is_recorded() -> None:
    no_tool = HEALTHY.replace("|106|00010000|", "|106|-|")
    judged = _judge({"n1": HEALTHY, "n2": no_tool, "n3": HEALTHY})
    assert judged["n2"]["mlx5_0/1 pfc"][:2] == ("skip", "not_shown")
    tied = _judge({"n1": HEALTHY, "n2": HEALTHY.replace("NCCL_IB_TC=106", "NCCL_IB_TC=3")})
    assert tied["n1"]["NCCL_IB_TC"] == ("pass", "no_majority", "106", None)
    assert tied["n2"]["NCCL_IB_TC"] == ("pass", "no_majority", "3", None)


def test_roce_counters_that_grew_since_the_previous_run_are_flagged() -> None:
    before = {f"roce_qos.counter:{k}": str(v) for k, v in roce_qos.counters(roce_qos.parse(HEALTHY, 0)).items()}
    grown = HEALTHY.replace("C|mlx5_1/1|packet_seq_err|0", "C|mlx5_1/1|packet_seq_err|41")
    now = {f"roce_qos.counter:{k}": str(v) for k, v in roce_qos.counters(roce_qos.parse(grown, 0)).items()}
    found = counter_growth({"n1": now}, {"n1": before})
    assert [(node, row.check, row.item, row.reason, row.observed) for node, row in found] == [
        ("n1", "roce_qos", "counter:mlx5_1/1.packet_seq_err", "counter_grew", "41")
    ]


@pytest.mark.parametrize(
    "stdout",
    [
        "NCCL_IB_TC=106\n",  # truncated
        "NCCL_IB_TC=abc\n### end\n",
        "NCCL_IB_TC=106\nP|mlx5_0/1|eth0|9000|106|0001x000|-|-\n### end\n",
        "P|mlx5_0/1|eth0|9000|106|-|-|-\n### end\n",  # no NCCL_IB_TC line
    ],
)
def test_unreadable_output_is_an_error_row_naming_what(stdout: str) -> None:
    model = roce_qos.parse(stdout, 0)
    rows = roce_qos.evaluate(model, Profile(), majority_values({}))
    assert model.error and [(r.status, r.reason) for r in rows] == [(Status.ERROR, "unparsable_output")]


def test_a_node_without_roce_ports_gets_one_skip_row() -> None:
    rows = roce_qos.evaluate(roce_qos.parse("NCCL_IB_TC=<unset>\n### end\n", 0), Profile(), majority_values({}))
    assert [(r.status, r.reason) for r in rows] == [(Status.SKIP, "no_roce_ports")]

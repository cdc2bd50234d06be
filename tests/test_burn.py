"""The burn judged on synthetic series: a GPU that throttles with a thermal reason, one whose throughput falls
half-way (a co-tenant), one whose clock falls with no reason, ECC counters that grow, XIDs logged meanwhile; the
probe's rows on a captured run; its command and the profile's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from cluster_accept.checks.base import Status
from cluster_accept.checks.samples import SAMPLES_DIR
from cluster_accept.inventory.burn_settings import BurnSettings
from cluster_accept.inventory.model import Node, Profile, SshSettings
from cluster_accept.probes import burn
from cluster_accept.probes.burn import judge as judgement
from cluster_accept.probes.scripts import burn_command, burn_timeout_s
from cluster_accept.probes.series import SeriesPlace

DATA = SAMPLES_DIR / "burn"
SETTINGS = BurnSettings(minutes=2)


def windows(
    gpus: int, seconds: int, rate: float = 600.0, slow: dict[int, tuple[int, float]] | None = None
) -> pd.DataFrame:
    """Throughput per second per GPU; ``slow[gpu] = (from_s, rate)``."""
    slow = slow or {}
    rows = []
    for g in range(gpus):
        for t in range(1, seconds + 1):
            start, low = slow.get(g, (seconds + 1, rate))
            rows.append({"gpu": g, "t_s": float(t), "value": (low if t >= start else rate) + (g % 3) * 0.5})
    return pd.DataFrame(rows)


def samples(gpus: int, seconds: int, throttle: dict[int, tuple[int, float, str]] | None = None,
            ecc: dict[int, tuple[float, float]] | None = None) -> pd.DataFrame:  # fmt: skip
    """nvidia-smi samples per second; ``throttle[gpu] = (from_s, clock, reasons)``, ``ecc[gpu] = (corr, uncorr)``
    grown by the end."""
    throttle, ecc = throttle or {}, ecc or {}
    rows = []
    for g in range(gpus):
        for t in range(1, seconds + 1):
            start, clock, reasons = throttle.get(g, (seconds + 1, 1980.0, "0x0000000000000000"))
            late = t >= start
            corr, uncorr = ecc.get(g, (0.0, 0.0)) if t == seconds else (0.0, 0.0)
            rows.append({"gpu": g, "t_s": float(t), "sm_clock_mhz": clock if late else 1980.0,
                         "mem_clock_mhz": 2619.0, "power_w": 690.0, "temp_c": 88.0 if late else 61.0,
                         "reasons": reasons if late else "0x0000000000000004", "ecc_corrected": corr,
                         "ecc_uncorrected": uncorr})  # fmt: skip
    return pd.DataFrame(rows)


def judged(w: pd.DataFrame, s: pd.DataFrame, seconds: int = 120) -> dict[tuple[int, str], judgement.BurnFinding]:
    burns = judgement.summarise(w, s, seconds, "TFLOP/s")
    return {(f.gpu, f.reason): f for f in judgement.judge(burns, SETTINGS)}


def test_healthy_gpus_are_each_sustained_with_their_figures():
    found = judged(windows(4, 120), samples(4, 120))
    assert sorted(found) == [(g, "sustained") for g in range(4)]
    assert found[(1, "sustained")].observed == "600.5 → 600.5 TFLOP/s"
    assert "SM clock 1,980 MHz first, 1,980 MHz later" in found[(1, "sustained")].detail


def test_a_gpu_throttled_for_heat_is_named_with_its_reason_and_clock():
    found = judged(windows(4, 120, slow={2: (40, 420.0)}), samples(4, 120, throttle={2: (40, 1005.0, "0x40")}))
    throttled = found[(2, "throttled")]
    assert throttled.observed.startswith("1,005 MHz under load (HW thermal slowdown active in 81 of 90 samples")
    assert throttled.expected.endswith("; ≥ 1782 MHz")
    assert found[(2, "throughput_dropped")].observed == "601 → 421 TFLOP/s (-30.0 %)"
    assert {(g, r) for g, r in found if g != 2} == {(0, "sustained"), (1, "sustained"), (3, "sustained")}


def test_a_gpu_throttled_from_the_start_is_named_against_its_node():
    found = judged(windows(4, 120), samples(4, 120, throttle={1: (0, 900.0, "0x0000000000000020")}))
    assert "SW thermal slowdown" in found[(1, "throttled")].observed
    assert (1, "throughput_dropped") not in found  # it was slow from the start: its clock names it


def test_a_co_tenant_half_way_drops_throughput_without_a_thermal_reason():
    found = judged(windows(2, 120, slow={1: (60, 290.0)}), samples(2, 120))
    assert found[(1, "throughput_dropped")].observed == "600.5 → 290.5 TFLOP/s (-51.6 %)"
    assert (1, "throttled") not in found and (0, "sustained") in found


def test_a_clock_fall_without_thermal_or_power_reason_is_a_warning():
    found = judged(windows(2, 120), samples(2, 120, throttle={0: (30, 1400.0, "0x0000000000000002")}))
    assert "no thermal or power reason" in found[(0, "clocks_fell")].observed
    assert burn.REASONS["clocks_fell"].severity is Status.WARN


def test_a_node_whose_gpus_all_throttle_is_named_against_their_first_part():
    throttle = {g: (50, 1200.0, "0x0000000000000040") for g in range(4)}
    found = judged(windows(4, 120), samples(4, 120, throttle=throttle))
    assert sorted(g for g, r in found if r == "throttled") == [0, 1, 2, 3]


def test_every_gpu_of_a_node_hot_from_the_start_is_named():
    """Bad cooling throttles a node before the burn: no good first part and no good peers to compare with."""
    throttle = {g: (0, 1100.0, "0x0000000000000040") for g in range(4)}
    found = judged(windows(4, 120), samples(4, 120, throttle=throttle))
    assert sorted(g for g, r in found if r == "throttled") == [0, 1, 2, 3]
    assert found[(0, "throttled")].observed == "1,100 MHz under load (HW thermal slowdown active in 90 of 90 samples)"
    one = judged(windows(1, 120), samples(1, 120, throttle={0: (0, 900.0, "0x0000000000000008")}))
    assert "HW slowdown" in one[(0, "throttled")].observed


def test_the_power_cap_alone_under_full_load_is_normal():
    found = judged(windows(2, 120), samples(2, 120, throttle={g: (0, 1410.0, "0x0000000000000004") for g in (0, 1)}))
    assert sorted(found) == [(0, "sustained"), (1, "sustained")]


def test_a_gpu_without_throughput_still_has_its_ecc_judged():
    w = windows(2, 120)
    found = judged(w[w.gpu == 0], samples(2, 120, ecc={1: (0.0, 2.0)}))
    assert sorted(r for g, r in found if g == 1) == ["ecc_uncorrected_grew", "no_windows"]


def test_ecc_counters_that_grow_during_the_burn():
    found = judged(windows(2, 120), samples(2, 120, ecc={1: (3.0, 1.0)}))
    assert found[(1, "ecc_uncorrected_grew")].observed == "+1 uncorrected ECC errors during the burn"
    assert found[(1, "ecc_corrected_grew")].observed == "+3 corrected ECC errors during the burn"
    assert (1, "sustained") not in found


def test_xid_lines_are_read_for_code_and_address():
    line = "[ 1234.5] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."
    assert judgement.xid_codes([line, "unrelated"]) == [(79, "0000:18:00", line)]


def run_text(records: list[dict]) -> str:
    return "\n".join(json.dumps(r) for r in records) + "\n"


def captured_run(**changes: object) -> list[dict]:
    probe = {"info": "probe", "probe": "burn", "gpus": 2, "device": "cuda", "seconds": 120.0, "sample_s": 1.0}
    records: list[dict] = [{**probe, **changes}]
    for frame, kind in ((windows(2, 120, slow={1: (60, 290.0)}), "window"), (samples(2, 120), "sample")):
        records += [{"info": kind, **r} for r in frame.to_dict("records")]
    return records


def test_probe_rows_and_figures_from_a_run():
    extra = [{"info": "xid", "line": "NVRM: Xid (PCI:0000:2a:00): 48, pid=77, DBE"},
             {"info": "foreign_process", "gpu": 1, "pid": 4242, "name": "python", "used_memory_mib": 30000.0,
              "seen_samples": 60, "samples": 120}]  # fmt: skip
    output = burn.parse(run_text(captured_run() + extra))
    figures = {m.gpu: m.value for m in output.measurements}
    assert [m.metric for m in output.measurements] == ["burn_tflops", "burn_tflops"]
    assert figures == {0: 600.0, 1: 290.5}  # the median window: it ran at half speed for most of the burn
    rows = {(r.check, r.item, r.reason): r for r in burn.inspect(output, Profile(burn=SETTINGS))}
    assert rows[("burn", "gpu1", "throughput_dropped")].status is Status.FAIL
    assert rows[("burn", "gpu0", "sustained")].status is Status.PASS
    assert rows[("burn", "xid 48 0000:2a:00", "xid")].observed == "Xid 48: double-bit ECC error"
    assert rows[("gpu", "compute_apps", "busy")].gpu == 1
    assert rows[("gpu", "compute_apps", "busy")].detail == "seen in 60 of 120 samples while the burn ran"
    series = burn.time_series(SeriesPlace("r1", "c", "node01"), output)
    assert len(series) == 2 * 120 * 2 and {r.kind for r in series} == {"sample", "throughput"}
    assert {(r.run_id, r.cluster, r.node) for r in series} == {("r1", "c", "node01")}


def test_a_gpu_without_windows_and_a_suite_without_burn():
    records = [r for r in captured_run() if not (r.get("info") == "window" and r.get("gpu") == 1)]
    rows = burn.inspect(burn.parse(run_text(records)), Profile(burn=SETTINGS))
    assert [(r.item, r.reason, r.status) for r in rows if r.gpu == 1] == [("gpu1", "no_windows", Status.ERROR)]
    skipped = burn.inspect(burn.parse(run_text(captured_run(seconds=0.0)[:1])), Profile())
    assert [(r.reason, r.status) for r in skipped] == [("not_in_suite", Status.SKIP)]


def test_the_sampler_failing_is_an_error_on_gpus_only():
    failed = {"info": "sampler_failed", "reason": "nvidia-smi: not found"}
    cuda = burn.inspect(burn.parse(run_text(captured_run() + [failed])), Profile(burn=SETTINGS))
    assert [r.reason for r in cuda if r.item == "samples"] == ["sampler_failed"]
    cpu = burn.inspect(burn.parse(run_text(captured_run(device="cpu") + [failed])), Profile(burn=SETTINGS))
    assert not [r for r in cpu if r.item == "samples"]


def test_a_captured_cpu_run_parses_to_one_sustained_gpu():
    output = burn.parse((DATA / "cpu_2s.txt").read_text())
    assert [(m.metric, m.gpu, m.iterations) for m in output.measurements] == [("burn_gflops", 0, 7)]
    assert output.measurements[0].value == 23.182
    rows = burn.inspect(output, Profile(burn=BurnSettings(minutes=0.05, sample_interval_s=0.25)))
    assert [(r.item, r.reason) for r in rows] == [("gpu0", "sustained")]


def node(**burn_settings: object) -> Node:
    profile = Profile(burn=BurnSettings(**burn_settings))  # type: ignore[arg-type]
    return Node("node01", SshSettings(), "p", profile)


def test_command_and_timeout_follow_the_suite():
    full, light = burn_command(node(), False), burn_command(node(), True)
    assert full is not None and "--seconds 600 --sample-s 1 --sdc-repeats 3" in full
    assert light is not None and "--seconds 120 " in light
    assert burn_timeout_s(node(), False) == 600 + 900
    assert burn_command(node(minutes=0, light_minutes=0, sdc=False), False) is None
    assert "--seconds 0 " in (burn_command(node(minutes=0), False) or "")


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"minutes": 0.05}, "burn.minutes 0.05 gives fewer than 8 samples"),
        ({"light_minutes": 0.1, "sample_interval_s": 2}, "burn.light_minutes 0.1 gives fewer than 8 samples"),
        ({"dcgm_level": 5}, "dcgm_level"),
        ({"throughput_drop_pct": 5}, "throughput_drop_pct"),
    ],
)
def test_settings_that_cannot_be_judged_are_refused(settings: dict, words: str):
    with pytest.raises(ValidationError, match=words.replace(".", r"\.")):
        BurnSettings(**settings)


H100_20S = (DATA / "h100_20s.txt").read_text()


def test_a_captured_h100_burn_holds_its_throughput_and_clocks():
    output = burn.parse(H100_20S)
    [figure] = output.measurements
    assert (figure.metric, figure.value, figure.iterations) == ("burn_tflops", 623.774, 19)
    assert (figure.sm_clock_mhz, figure.power_w, figure.temp_c) == (1410.0, 698.96, 63.0)
    [row] = burn.inspect(output, Profile(burn=BurnSettings(minutes=20 / 60)))
    assert (row.reason, row.observed) == ("sustained", "622 → 623.9 TFLOP/s (+0.3 %)")
    assert row.detail == "SM clock 1,380 MHz first, 1,418 MHz later; temperature max 63 C; power median 699 W"


def test_the_h100_burn_throttled_half_way_is_named():
    """The captured run with its second half rewritten as a hot GPU's: 900 MHz, HW thermal slowdown, 60 % speed."""
    lines = []
    for line in H100_20S.splitlines():
        record = json.loads(line)
        if record.get("info") == "sample" and record["t_s"] > 10:
            record.update(sm_clock_mhz=900.0, reasons="0x0000000000000040", temp_c=91.0)
        if record.get("info") == "window" and record["t_s"] > 10:
            record["value"] = round(record["value"] * 0.6, 3)
        lines.append(json.dumps(record))
    rows = burn.inspect(burn.parse("\n".join(lines)), Profile(burn=BurnSettings(minutes=20 / 60)))
    found = {r.reason: r for r in rows}
    assert sorted(found) == ["throttled", "throughput_dropped"]
    assert found["throttled"].observed == "900 MHz under load (HW thermal slowdown active in 11 of 16 samples)"
    assert found["throttled"].expected.endswith("; ≥ 1242 MHz")
    assert found["throughput_dropped"].observed == "622 → 374.3 TFLOP/s (-39.8 %)"


def hot(gpus: int, seconds: int, temps: dict[int, float]) -> pd.DataFrame:
    """``samples`` with each GPU's temperature after its first part set (``temps[gpu]``; 70 °C otherwise)."""
    frame = samples(gpus, seconds)
    late = frame.t_s > judgement.part_s(seconds)
    frame.loc[late, "temp_c"] = frame.loc[late, "gpu"].map(lambda g: temps.get(g, 70.0))
    return frame


def thermal_of(s: pd.DataFrame, seconds: int = 120, **settings: float) -> list[tuple[int | None, str, str, str]]:
    burns = judgement.summarise(windows(int(s.gpu.max()) + 1, seconds), s, seconds, "TFLOP/s")
    found = judgement.thermal(burns, BurnSettings(minutes=2, **settings))
    return [(f.gpu, f.reason, f.observed, f.expected) for f in found]


def test_gpus_within_the_spread_are_one_uniform_row_for_the_node():
    assert thermal_of(hot(8, 120, {0: 66.0, 7: 73.0})) == [
        (None, "thermal_uniform", "spread 7.0 °C (gpu0 66 °C, gpu1 70 °C, gpu2 70 °C, gpu3 70 °C, gpu4 70 °C, "
         "gpu5 70 °C, gpu6 70 °C, gpu7 73 °C)", "≤ 10 °C between the node's GPUs")]  # fmt: skip


def test_one_gpu_hotter_than_its_neighbours_is_named_and_the_spread_fails():
    found = thermal_of(hot(8, 120, {5: 84.0}))
    assert found[0] == (5, "runs_hot", "84 °C under load, +14.0 °C from the node's median 70 °C",
                        "≤ 6 °C above the node's median")  # fmt: skip
    assert found[1][:2] == (None, "thermal_spread") and found[1][2].startswith("spread 14.0 °C")
    assert burn.REASONS["runs_hot"].severity is Status.FAIL
    # the profile sets both limits
    assert [f[1] for f in thermal_of(hot(8, 120, {5: 84.0}), temp_above_median_max_c=20, temp_spread_max_c=20)] == [
        "thermal_uniform"]  # fmt: skip


def test_one_gpu_has_no_spread_and_the_rows_reach_the_probe():
    assert thermal_of(hot(1, 120, {0: 90.0})) == []
    records = [{"info": "probe", "seconds": 120, "gpus": 4, "device": "cuda"}]
    for frame, kind in ((windows(4, 120), "window"), (hot(4, 120, {2: 83.0}), "sample")):
        records += [{"info": kind, **r} for r in frame.to_dict("records")]
    rows = {(r.item, r.reason): r for r in burn.inspect(burn.parse(run_text(records)), Profile(burn=SETTINGS))}
    assert rows[("gpu2", "runs_hot")].gpu == 2 and rows[("gpu2", "runs_hot")].status is Status.FAIL
    assert rows[("thermal", "thermal_spread")].gpu is None


def test_a_gpu_whose_pcie_link_ran_below_its_maximum_under_load_is_named():
    s = samples(4, 120)
    s["pcie_gen"], s["pcie_gen_max"], s["pcie_width"], s["pcie_width_max"] = 5.0, 5.0, 16.0, 16.0
    s.loc[(s.gpu == 3) & (s.t_s > 30), "pcie_gen"] = 3.0  # trained down to Gen3 under load
    found = judged(windows(4, 120), s)
    assert sorted(k for k in found if k[1] != "sustained") == [(3, "pcie_downtrained")]
    row = found[(3, "pcie_downtrained")]
    assert (row.observed, row.expected) == ("PCIe Gen3 x16 under load", "Gen5 x16 (its maximum)")
    assert burn.REASONS["pcie_downtrained"].action.value == "reseat cable"
    unknown = samples(4, 120)  # an older burn output without the link: nothing judged, nothing invented
    assert not [k for k in judged(windows(4, 120), unknown) if k[1] == "pcie_downtrained"]


def test_the_stage_writes_each_nodes_whole_series_and_keeps_a_thinned_copy_for_the_report(tmp_path: Path) -> None:
    """The burn's series, declared on its probe (``Probe.series``), go whole to ``burn/<node>.parquet`` as each node
    is read, and at most the declared points per GPU to the report's table; read without a run directory (as
    stragglers measured again are), none is kept and the figures are the same."""
    from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Inventory
    from cluster_accept.probes.base import discover
    from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus
    from cluster_accept.tasks.probe_runs import judge_nodes

    profile = Profile(burn=SETTINGS)
    names = ("n1", "n2")
    nodes = [Node(name=n, ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS) for n in names]
    inventory = Inventory("c", nodes, {"p": profile}, "inventory.yaml", "digest")
    text = run_text(captured_run())
    outcomes = [NodeResult(n, NodeStatus.OK, commands=[CommandResult("burn", 0, text, "")]) for n in names]
    probes = discover(stage="burn")
    assert burn.PROBE.series is not None and burn.PROBE in probes
    points = burn.PROBE.series.points

    kept = judge_nodes("r1", inventory, outcomes, probes=probes, stage="burn", series_to=tmp_path)

    for name in names:
        whole = pd.read_parquet(tmp_path / "burn" / f"{name}.parquet")
        assert len(whole) == 2 * 120 * 2 and set(whole["node"]) == {name}
        assert set(whole["run_id"]) == {"r1"} and set(whole["cluster"]) == {"c"}
    assert {type(r) for r in kept.charted["burn"]} == {burn.BurnPoint}
    charted = pd.DataFrame([r.record() for r in kept.charted["burn"]])
    assert set(charted["node"]) == set(names) and set(charted["run_id"]) == {"r1"}
    per_gpu = charted.groupby(["node", "kind", "gpu"]).size()
    assert len(per_gpu) == 2 * 2 * 2 and per_gpu.max() <= points < 120
    assert len(charted) < 2 * 2 * 120 * 2

    assert sorted(p.name for p in (tmp_path / "burn").iterdir()) == ["n1.parquet", "n2.parquet"]
    again = judge_nodes("r1", inventory, outcomes, probes=probes, stage="burn")
    assert again.charted == {}
    assert [m.record() for m in again.measurements] == [m.record() for m in kept.measurements]

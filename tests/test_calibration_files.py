"""A calibration in the history is data to check, not to trust: a noise that is not finite, negative or past the
ceiling, a number written as text, a copy under a name of its own, a cluster name that is a path: each is named
with its file and key and not used, and a figure far below its peers is still called below."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from cluster_accept.analysis.calibration import NOISE_COLUMNS, NoiseTable, annotate, latest_table, write_table
from cluster_accept.analysis.history import RunHistory
from cluster_accept.analysis.history_files import SET_ASIDE
from cluster_accept.analysis.probe_verdicts import judge
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.flows.calibrate import CalibrationRequest, calibrate
from cluster_accept.flows.run_request import RunRequest, check_request
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.inventory.model import Profile
from cluster_accept.probes import gemm
from tests.test_calibrate import INVENTORY, StandIn

METRIC = "gemm_bf16_gflops"
CPU = Profile.model_validate({"probes": {"device": "cpu"}})
EARLIER, LATER = "20260101T000000Z-aaaaaa", "20260301T000000Z-bbbbbb"
PEERS = {"n1": 100.0, "n2": 101.0, "n3": 99.0, "n4": 10.0}  # n4 at a tenth of its peers


class _Said(logging.Handler):
    """What the calibration's reader warned of, whoever else (Prefect's logging) handles its logger too."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def said() -> Iterator[_Said]:
    handler, logger = _Said(), logging.getLogger("cluster_accept.analysis.calibration")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _table(cv_p95: float = 0.02) -> pd.DataFrame:
    return pd.DataFrame([["cpu", METRIC, "", 5, 20, 0.01, cv_p95]], columns=NOISE_COLUMNS)


def _forged(history: Path, column: pa.Array, calibration_id: str = LATER) -> Path:
    """A table calibrate wrote, its ``cv_p95`` then replaced by hand (its footer kept as written)."""
    path = write_table(history, "c", calibration_id, _table())
    written = pq.read_table(path)
    forged = written.set_column(written.schema.get_field_index("cv_p95"), "cv_p95", column)
    pq.write_table(forged.replace_schema_metadata(written.schema.metadata), path)
    return path


def _verdict_of_n4(noise: NoiseTable | None) -> tuple[Status, str]:
    """How n4, at a tenth of its peers, is judged with the calibration the history gave (None: none)."""
    figures = pd.DataFrame(
        [{"node": n, "profile": "cpu", "metric": METRIC, "value": v, "gpu": None, "unit": "GFLOP/s"}
         for n, v in PEERS.items()]
    )  # fmt: skip
    annotated = annotate(figures, noise, dict.fromkeys(PEERS, CPU))
    rows: list[tuple[str, CheckRow]] = judge(annotated, gemm.METRICS, {})
    return next((r.status, r.reason) for node, r in rows if node == "n4" and r.item.endswith("_vs_cluster"))


@pytest.mark.parametrize(
    ("value", "problem"),
    [(float("inf"), "cv_p95 is inf"), (1e6, "cv_p95 is 1e+06, above the ceiling"), (float("nan"), "cv_p95 is nan"),
     (-0.02, "cv_p95 is -0.02")],
)  # fmt: skip
def test_a_noise_not_finite_negative_or_past_the_ceiling_is_named_and_a_gpu_at_a_tenth_still_fails(
    tmp_path: Path, said: _Said, value: float, problem: str
) -> None:
    path = _forged(tmp_path, pa.array([value], pa.float64()))
    table = latest_table(tmp_path, "c")
    assert table is None
    assert f"calibration file {path} not used: row 0 ('cpu', '{METRIC}'): {problem}" in said.text
    assert _verdict_of_n4(table) == (Status.FAIL, "straggler")


def test_a_bad_table_gives_way_to_the_latest_good_one_and_a_run_sets_it_aside_naming_it(tmp_path: Path) -> None:
    write_table(tmp_path, "c", EARLIER, _table(0.05))
    bad = _forged(tmp_path, pa.array([float("inf")], pa.float64()))
    run = RunHistory(tmp_path, "c", "20260401T000000Z-cccccc", {})
    table = run.noise
    assert table is not None and table.calibrated_at == EARLIER and list(table.frame["cv_p95"]) == [0.05]
    [aside] = run.files.set_aside
    assert (aside.file, aside.moved_to) == (bad, tmp_path / SET_ASIDE / "calibration" / "c" / bad.name)
    assert "cv_p95 is inf" in aside.problem and not bad.exists()
    assert "cv_p95 is inf" in (tmp_path / SET_ASIDE / "calibration" / "c" / f"{bad.name}.why").read_text()
    again = latest_table(tmp_path, "c")  # the next run: the bad file no longer there
    assert again is not None and again.calibrated_at == EARLIER


def test_text_in_cv_p95_is_named_before_any_stage_and_the_run_judges_without_it(tmp_path: Path, said: _Said) -> None:
    out = tmp_path / "runs"
    path = _forged(out / "history", pa.array(["0.02"], pa.string()))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY.replace("cluster: cal", "cluster: c"))
    check_request(RunRequest(inventory, out, None, ["single-node"]))  # what run does before Prefect starts
    assert f"calibration file {path} not used: another schema: cv_p95 holds text, not a number" in said.text
    noise = RunHistory(out / "history", "c", "20260401T000000Z-cccccc", {}).noise
    assert noise is None and _verdict_of_n4(noise) == (Status.FAIL, "straggler")


def test_the_latest_is_chosen_by_the_id_inside_never_by_the_file_name(tmp_path: Path, said: _Said) -> None:
    earlier = write_table(tmp_path, "c", EARLIER, _table(0.05))
    earlier.rename(earlier.with_name("backup-old.parquet"))  # sorts after every calibration id
    write_table(tmp_path, "c", LATER, _table(0.02))
    folder = tmp_path / "calibration" / "c"
    _table(0.3).to_parquet(folder / "zz-by-hand.parquet", index=False)  # no id inside: when it was made is unknown
    table = latest_table(tmp_path, "c")
    assert table is not None and (table.calibrated_at, list(table.frame["cv_p95"])) == (LATER, [0.02])
    assert f"calibration file {folder / 'zz-by-hand.parquet'} not used: no calibration id in its footer" in said.text


def test_a_calibration_of_another_cluster_copied_in_is_not_used(tmp_path: Path) -> None:
    other = write_table(tmp_path, "d", LATER, _table(0.3))
    (tmp_path / "calibration" / "c").mkdir()
    other.rename(tmp_path / "calibration" / "c" / other.name)
    found = latest_table(tmp_path, "c")
    assert found is None


def test_a_cluster_name_that_is_a_path_is_refused_at_load_and_calibrate_writes_nothing_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "inventory.yaml"
    bad.write_text(INVENTORY.replace("cluster: cal", "cluster: ../../x"))
    with pytest.raises(InventoryError) as refused:
        load_inventory(bad)
    [problem] = refused.value.problems
    assert problem.startswith("cluster: ") and "'../../x' is no name for a folder of the history" in problem
    runs = StandIn([({"local1": 100.0, "local2": 200.0}, 0), ({"local1": 101.0, "local2": 202.0}, 0)])
    out = tmp_path / "a" / "b" / "runs"
    assert calibrate(CalibrationRequest(bad, 2, out_dir=out), runs, Console(file=io.StringIO())) == 2
    assert not runs.asked and not list(tmp_path.rglob("*.parquet"))
    with pytest.raises(ValueError, match="no name for a folder of the history"):
        write_table(tmp_path / "history", "../../x", LATER, _table())
    assert not list(tmp_path.rglob("*.parquet"))


def test_calibrate_never_writes_through_a_link_out_of_the_history(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "history" / "calibration").mkdir(parents=True)
    (tmp_path / "history" / "calibration" / "c").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="would be written outside"):
        write_table(tmp_path / "history", "c", LATER, _table())
    assert not list(elsewhere.iterdir())


def test_a_row_too_noisy_to_judge_by_is_left_out_by_calibrate_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    runs = StandIn([({"local1": 100.0, "local2": 200.0}, 0), ({"local1": 30.0, "local2": 60.0}, 0)])
    request = CalibrationRequest(inventory, 2, out_dir=tmp_path / "runs")
    assert calibrate(request, runs, Console(file=io.StringIO())) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "row 0 ('cpu', 'gemm_fp32_gflops') left out of the calibration: cv_median is 0.76" in err
    assert "every row of the noise was left out" in err
    assert not (tmp_path / "runs" / "history" / "calibration").exists()

"""What ``arm`` prints is safe to paste and to source in every format: one rule for a job's name (letters,
digits, ``_ . -``; not ``.`` or ``..``), refused with exit 2 in every format, so that no ``$(…)``, backtick,
``;``, quote or line break reaches a shell; and the output of a plain name, used as its reader uses it (sourced
with ``set -a``, pasted on srun's command line, read as a pod's YAML, run as a TaskProlog whose lines are
then set), sets the variables armed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cluster_accept.flows.cli import app
from cluster_accept.watch.rounds import SHIM_DIR

pytestmark = pytest.mark.integration

FORMATS = ("env", "srun", "pod", "taskprolog")
MARKER = "planted"
HOSTILE = (
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"x;touch {MARKER}",
    "x\nLD_PRELOAD=/tmp/evil.so",
    f"x'$(touch {MARKER})'",
    f'x"$(touch {MARKER})"',
    f"x&touch {MARKER}",
    "a b",
    "..",
    "",
)
SHELL_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": "/site/lib"}


def arm(form: str, job: str, watch_dir: str = "/w") -> tuple[int, str, str]:
    args = ["arm", "--torch", "2.9.0", "--nccl", "2.27.5", "--format", form, "--job", job, "--watch-dir", watch_dir]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.output


def sourced(lines: str, cwd: Path) -> dict[str, str]:
    """The environment after ``set -a; . FILE`` of ``lines`` in bash, run in ``cwd``."""
    (cwd / "armed.env").write_text(lines)
    done = subprocess.run(["bash", "-c", "set -a; . ./armed.env; env -0"], cwd=cwd, env=SHELL_ENV,
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)


def used(form: str, text: str, cwd: Path, slurm_job_id: str = "4242") -> dict[str, str]:
    """The variables ``text`` sets, used as its reader uses it, in ``cwd``."""
    if form == "env":
        return sourced(text, cwd)
    if form == "srun":  # pasted on srun's command line: one argument, after the shell expands it
        script = f"printf '%s\\0' {text}"
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env=SHELL_ENV, capture_output=True, text=True,
                              timeout=30, check=True)  # fmt: skip
        args = [a for a in done.stdout.split("\0") if a]
        assert len(args) == 1 and args[0].startswith("--export=ALL,"), args
        return dict(part.split("=", 1) for part in args[0][len("--export=ALL,") :].split(","))
    if form == "pod":
        return {item["name"]: item["value"] for item in yaml.safe_load(text)}
    (cwd / "prolog.sh").write_text(text)
    env = {**SHELL_ENV, "SLURM_JOB_ID": slurm_job_id}
    done = subprocess.run(["sh", "./prolog.sh"], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return sourced("".join(f"{line}\n" for line in done.stdout.splitlines() if line.startswith("export ")), cwd)


@pytest.mark.parametrize("job", HOSTILE)
@pytest.mark.parametrize("form", FORMATS)
def test_a_hostile_job_name_is_refused_in_every_format_and_plants_nothing(form: str, job: str, tmp_path: Path) -> None:
    code, stdout, output = arm(form, job)
    if stdout:  # whatever was printed, used as its reader would: nothing planted runs, no variable is added
        variables = used(form, stdout, tmp_path)
        assert not (tmp_path / MARKER).exists(), f"--format {form} ran the job name {job!r}"
        assert "LD_PRELOAD" not in variables, f"--format {form} let {job!r} set LD_PRELOAD"
    assert code == 2, f"--format {form} printed for the job name {job!r}:\n{stdout}"
    assert stdout == "" and f"job id {job!r} is refused" in output
    assert "only letters, digits and _ . - are accepted" in output and "Traceback" not in output


@pytest.mark.parametrize("form", FORMATS)
def test_a_plain_job_name_sets_the_variables_armed(form: str, tmp_path: Path) -> None:
    watch_dir = tmp_path / "w"
    watch_dir.mkdir()
    code, stdout, output = arm(form, "train-7.b_2", str(watch_dir))
    assert code == 0, output
    variables = used(form, stdout, tmp_path)
    job = "4242" if form == "taskprolog" else "train-7.b_2"  # a TaskProlog names the job by Slurm's id
    assert variables["CA_WATCH_JOB"] == job and variables["CA_WATCH_DIR"] == str(watch_dir)
    assert variables["TORCH_NCCL_ENABLE_TIMING"] == "1" and variables["NCCL_RAS_ENABLE"] == "1"
    assert variables["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(f"{watch_dir}/")
    assert variables["PYTHONPATH"].split(":")[0] == str(SHIM_DIR) and "LD_PRELOAD" not in variables
    if form in ("srun", "taskprolog"):  # these keep the caller's PYTHONPATH after the shim's directory
        assert variables["PYTHONPATH"].endswith(":/site/lib")
    assert not (tmp_path / MARKER).exists()

"""Read what bench/training_fidelity.sh wrote: the probe's tokens/s per GPU over the reference loop's (target
>= 0.97), the probe's MFU, and the rows the probe writes for the run with a planted slow GPU.

python3 bench/training_fidelity.py OUT_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from cluster_accept.inventory.model import Profile
from cluster_accept.probes import training

TARGET = 0.97


def _probe(path: Path) -> tuple[float, float | None, str]:
    output = training.parse(path.read_text())
    figures = {m.metric: float(m.value) for m in output.measurements if m.gpu is None}
    info = training.model_info(output) or {}
    return figures[training.PER_GPU], figures.get("training_mfu"), str(info.get("device_name"))


def _reference(path: Path) -> float:
    line = [x for x in path.read_text().splitlines() if x.startswith("{")][-1]
    return float(json.loads(line)["tokens_per_s_per_gpu"])


def main(out: Path) -> int:
    ok = True
    gpu_counts = sorted({int(p.name.split("_")[1][1:]) for p in out.glob("probe_g*_r*.jsonl")})
    for gpus in gpu_counts:
        ratios = []
        for probe_file in sorted(out.glob(f"probe_g{gpus}_r*.jsonl")):
            reference = _reference(out / probe_file.name.replace("probe_", "ref_"))
            per_gpu, mfu, device = _probe(probe_file)
            ratios.append(per_gpu / reference)
            print(
                f"{gpus} GPU(s) {probe_file.stem}: probe {per_gpu:,.0f} tokens/s per GPU (MFU {mfu}, {device}), "
                f"reference {reference:,.0f}, ratio {per_gpu / reference:.3f}"
            )
        ratio = statistics.median(ratios)
        ok &= ratio >= TARGET
        print(f"fidelity {gpus} GPU(s): median ratio {ratio:.3f} (target >= {TARGET})")
    slow = out / "probe_slow_gpu.jsonl"
    if slow.exists():
        output = training.parse(slow.read_text())
        profile = Profile.model_validate({"probes": {"device": "cuda"}, "thresholds": {"training_mfu_min": 0.3}})
        for row in training.inspect(output, profile):
            said = f"{row.item} {row.status.value} {row.reason} {row.observed} ({row.expected}) {row.detail}"
            print(f"slow-GPU run: {said}")
        named = [r for r in training.inspect(output, profile) if r.reason == "slow_rank"]
        planted = max(int(m.gpu) for m in output.measurements if m.gpu is not None)
        ok &= bool(named) and named[0].gpu == planted
        print(f"planted slow GPU {planted}: named {named[0].gpu if named else None}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

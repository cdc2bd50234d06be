"""``cluster-accept check --local`` as a Slurm Prolog before every job, after a user's job logged an XID 13.

The node's own check keeps its marks on the node, so a kernel-log event is judged once; an XID NVIDIA puts down
to the application (13: an out-of-range access by the job) warns and never drains on its own. On a lent GPU
machine, as root, in one go:

1. the boot's first check (the probe interpreter starts CUDA and keeps the answer), then ``--runs`` clean checks;
2. an XID 13 line written to the kernel log through ``/dev/kmsg`` with a real GPU's bus id: the next check must
   end as the clean ones did and name ``xid:xid_13`` as a warning; the ``--runs`` after it must end as the clean
   ones did and name no XID;
3. the kept CUDA start replaced by ``null`` (a corrupted cache): the next check must still end as the clean
   ones did (the file is replaced, never trusted);
4. an XID 79 (fallen off the bus) written the same way: the next check must fail and name ``xid:xid_79``.

Prints each figure, the p95 of the checks after the XID 13 beside the clean machine's (a ratio), and a line per
expectation (``ok``/``FAILED``); writes ``check_local_xid.json`` to --out. Exit 0 when every expectation held.

    python3 bench/check_local_xid.py [--runs 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_local import AUTO_INVENTORY, ENV, one_check, p95  # noqa: E402

XID_13 = (
    "NVRM: Xid (PCI:{bus}): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
    "Out Of Range Address"
)
XID_79 = "NVRM: Xid (PCI:{bus}): 79, pid=0, name=swapper/0, GPU has fallen off the bus."


def first_gpu_bus() -> str:
    """The first GPU's bus id as the driver writes it in an Xid line (``0000:18:00``)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    domain, bus, device = out.split(":")
    return f"{domain[-4:]}:{bus}:{device.split('.')[0]}".lower()


def plant(line: str) -> bool:
    """Writes ``line`` to the kernel log; True when ``dmesg`` shows it back."""
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(line + "\n")
    shown = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return line in shown


def series(inventory: Path, runs: int) -> list[dict[str, Any]]:
    return [one_check(inventory) for _ in range(runs)]


def walls(results: list[dict[str, Any]]) -> dict[str, float]:
    values = [float(r["wall_s"]) for r in results]
    return {"p50_s": round(statistics.median(values), 4), "p95_s": round(p95(values), 4)}


def expectations(data: dict[str, Any], clean_exit: int) -> dict[str, bool]:
    """Each expectation of the docstring, by name: True when it held."""
    after = data["after_xid13"]
    first, healed, xid79 = data["first_after_xid13"], data["after_null_cache"], data["after_xid79"]
    return {
        "clean checks end alike": len({r["exit"] for r in data["clean"]}) == 1,
        "xid 13 planted and read back": bool(data["planted_xid13"]),
        "first check after xid 13 warns and ends as clean": first["exit"] == clean_exit
        and "xid_13" in str(first["line"]),
        "every later check ends as clean and names no xid": all(
            r["exit"] == clean_exit and "xid" not in str(r["line"]) for r in after
        ),
        "a null cache is replaced, the check ends as clean": healed["exit"] == clean_exit,
        "xid 79 fails": xid79["exit"] == 1 and "xid:xid_79" in str(xid79["line"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-check-local-xid"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ca-check-xid-"))
    inventory = workdir / "inventory.yaml"
    inventory.write_text(AUTO_INVENTORY)
    (workdir / "state").mkdir(mode=0o700)
    ENV["CLUSTER_ACCEPT_STATE_DIR"] = str(workdir / "state")
    bus = first_gpu_bus()
    data: dict[str, Any] = {"gpu_bus": bus, "cold": one_check(inventory), "clean": series(inventory, args.runs)}
    data["planted_xid13"] = plant(XID_13.format(bus=bus))
    data["first_after_xid13"] = one_check(inventory)
    data["after_xid13"] = series(inventory, args.runs)
    cache = Path(ENV["XDG_RUNTIME_DIR"]) / f"cluster-accept-{os.getuid()}" / "probe-import.json"
    data["cache_found"] = cache.is_file()
    cache.write_text("null")
    data["after_null_cache"] = one_check(inventory)
    data["cache_rewritten"] = cache.is_file() and cache.read_text() != "null"
    data["planted_xid79"] = plant(XID_79.format(bus=bus))
    data["after_xid79"] = one_check(inventory)
    clean_exit = int(data["clean"][0]["exit"])
    held = expectations(data, clean_exit)
    clean, after = walls(data["clean"]), walls(data["after_xid13"])
    summary = {
        "clean": clean,
        "after_xid13": after,
        "p95_ratio_after_to_clean": round(after["p95_s"] / clean["p95_s"], 3),
        "clean_lines": sorted({str(r["line"]) for r in data["clean"]}),
        "first_after_xid13_line": data["first_after_xid13"]["line"],
        "after_xid79_line": data["after_xid79"]["line"],
        "expectations": held,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "check_local_xid.json").write_text(json.dumps({"summary": summary, **data}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    for name, ok in held.items():
        print(f"{'ok' if ok else 'FAILED'}: {name}")
    return 0 if all(held.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

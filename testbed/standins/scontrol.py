"""Controller-side ``scontrol`` stand-in: a Slurm that knows the test-bed's nodes and records every request.

State lives in ``DATA_DIR/slurm-nodes.json`` (node -> {"state", "reason"}); every call is appended to
``DATA_DIR/scontrol.log`` as one JSON list of its arguments, so a test can see exactly what was asked.
Supports what cluster-accept uses: ``show node -o`` and ``update nodename=N state=drain|resume [reason=R]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(state: Path) -> dict[str, dict[str, str]]:
    return json.loads(state.read_text()) if state.exists() else {}


def main(argv: list[str] | None = None, data_dir: str | Path | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(data_dir) if data_dir else Path.cwd()
    state_path = root / "slurm-nodes.json"
    with (root / "scontrol.log").open("a") as log:
        log.write(json.dumps(argv) + "\n")
    nodes = _load(state_path)
    if argv[:2] == ["show", "node"]:
        for name, node in sorted(nodes.items()):
            reason = f" Reason={node['reason']} [slurm@2026-11-21T00:00:00]" if node.get("reason") else ""
            sys.stdout.write(f"NodeName={name} Arch=x86_64 CPUTot=2 State={node['state']} Partitions=gpu{reason}\n")
        return 0
    if argv[:1] == ["update"]:
        fields = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
        name = fields.get("nodename", "")
        if name not in nodes:
            sys.stderr.write(f"scontrol: error: Invalid node name specified: {name}\n")
            return 1
        node = nodes[name]
        wanted = fields.get("state", "").lower()
        if wanted == "drain":
            if not fields.get("reason"):
                sys.stderr.write("scontrol: error: You must specify a reason when DRAINING a node\n")
                return 1
            node["state"] = node["state"].split("+")[0] + "+DRAIN"
            node["reason"] = fields["reason"]
        elif wanted == "resume":
            node["state"] = node["state"].split("+")[0]
            node["reason"] = ""
        else:
            sys.stderr.write(f"scontrol: error: unsupported state {wanted!r}\n")
            return 1
        state_path.write_text(json.dumps(nodes, indent=1))
        return 0
    sys.stderr.write(f"scontrol: error: unsupported request {' '.join(argv)!r}\n")
    return 1

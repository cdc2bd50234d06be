"""What simulated nodes answer from: a :class:`Recording` of real (test-bed) nodes' outputs per variant and
command, a check's own healthy sample where the recording lacks its command (:func:`sample_answer`), and how one
simulated node answers (:class:`SimulatedNode`). Shared by the batch sessions (:mod:`simulator.nodes`) and the
multi-node ranks (:mod:`simulator.launch`)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_accept.checks.base import discover
from cluster_accept.checks.samples import Sample, first_healthy
from cluster_accept.probes.base import discover as discover_probes

UNKNOWN_EXIT = 127
# The figures a probe prints that a slower (or faster) node changes; everything else is kept as recorded.
_SCALED = re.compile(r"^(value|.*_gbps|.*_tflops|.*tokens_per_s.*)$")


@dataclass(frozen=True)
class Answer:
    exit_code: int
    stdout: str
    stderr: str = ""


NODE_TOKEN = "@@NODE@@"  # a recorded node's name in its outputs; the answering node's name replaces it


@dataclass
class Recording:
    """variant -> command text -> answer. A faulty variant keeps only the answers that differ from ``healthy``:
    the rest it answers as a healthy node does."""

    variants: dict[str, dict[str, Answer]] = field(default_factory=dict)
    python: str = ""  # the profile's probe interpreter when recorded: it is part of the commands' text
    # variant -> "<nodes>:<role> <rank command with its run's values as tokens>" -> a recorded multi-node rank's
    # answer (:mod:`simulator.launch`); a recording made before multi-node runs has none
    launches: dict[str, dict[str, Answer]] = field(default_factory=dict)

    def add(self, variant: str, node: str, script: str, answer: Answer) -> None:
        """What ``node`` (of ``variant``) answered to ``script``, its own name replaced by :data:`NODE_TOKEN`."""
        own = Answer(answer.exit_code, answer.stdout.replace(node, NODE_TOKEN), answer.stderr.replace(node, NODE_TOKEN))
        if variant != "healthy" and self.variants.get("healthy", {}).get(script) == own:
            return
        self.variants.setdefault(variant, {})[script] = own

    def answer(self, variant: str, script: str) -> Answer | None:
        own = self.variants.get(variant, {}).get(script)
        return own if own is not None else self.variants.get("healthy", {}).get(script)

    def save(self, path: Path) -> None:
        data = {
            "python": self.python,
            "variants": {
                v: {s: [a.exit_code, a.stdout, a.stderr] for s, a in answers.items()}
                for v, answers in sorted(self.variants.items())
            },
            "launches": {
                v: {k: [a.exit_code, a.stdout, a.stderr] for k, a in answers.items()}
                for v, answers in sorted(self.launches.items())
            },
        }
        path.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Recording:
        data = json.loads(path.read_text(encoding="utf-8"))
        variants, launches = (
            {
                v: {s: Answer(int(a[0]), str(a[1]), str(a[2])) for s, a in answers.items()}
                for v, answers in data.get(part, {}).items()
            }
            for part in ("variants", "launches")
        )
        return cls(variants, str(data.get("python", "")), launches)


@functools.cache
def _healthy_samples() -> dict[str, Sample]:
    """The healthy sample of each command a node is asked, by the name its command arrives under: a check's
    first healthy sample by the check's name; a node-side run's (``probe.script.name``) that of the probe
    owning the run, else of the first probe sharing it that declares one."""
    samples: dict[str, Sample] = {}
    for probe in sorted(discover_probes(), key=lambda probe: probe.name != probe.script.owner):
        sample = first_healthy(probe.samples)
        if sample is not None:
            samples.setdefault(probe.script.name, sample)
    for check in discover():
        if (sample := first_healthy(check.samples)) is not None:
            samples[check.name] = sample
    return samples


def sample_answer(command: str) -> Answer | None:
    """What a healthy node answers to the command named ``command`` (a check, or a probe's node-side run) when
    the recording holds none (a plug-in added, or its command changed, since the recording was taken): the
    plug-in's own healthy sample. None for a command that is no plug-in's: that stays unanswered. A recording
    is retaken for fidelity, not for a plug-in to run."""
    sample = _healthy_samples().get(command)
    if sample is None:
        return None
    return Answer(sample.exit_code if sample.exit_code is not None else 0, sample.output())


def scale_figures(stdout: str, factor: float) -> str:
    """Every JSON line's measured figures multiplied by ``factor``; other lines as they are."""
    if factor == 1.0:
        return stdout
    lines = []
    for line in stdout.split("\n"):
        if line.startswith("{"):
            try:
                record: Any = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                for key, value in record.items():
                    if _SCALED.match(key) and isinstance(value, int | float) and not isinstance(value, bool):
                        record[key] = round(value * factor, 6)
                line = json.dumps(record)
        lines.append(line)
    return "\n".join(lines)


@dataclass(frozen=True)
class SimulatedNode:
    """How one simulated node answers: its recorded variant, its figures' factor, its latency per batch (and
    the median latency it was drawn around, which a multi-node run's length is drawn around too)."""

    name: str
    variant: str = "healthy"
    factor: float = 1.0
    latency_s: float = 0.0
    median_latency_s: float = 0.0

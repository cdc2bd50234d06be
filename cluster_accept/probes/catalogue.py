"""Every check and probe a run can use, as one Markdown table read from discovery itself: its stage, what it
judges (its module's first line), its reason codes, the figures a probe judges (each with the key holding its
minimum) and its samples. The documentation points here instead of
listing the plug-ins by hand, so a plug-in added is listed without a line of documentation to edit:
``python -m cluster_accept.probes.catalogue``."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType

from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.checks.base import discover as discover_checks
from cluster_accept.checks.reasons import Reason
from cluster_accept.checks.samples import Sample, SampleKind
from cluster_accept.probes.base import discover as discover_probes

HEADER = (
    "| plug-in | kind | stage | what it judges | reasons | metrics (the key holding each minimum) | samples |\n"
    "|---|---|---|---|---|---|---|\n"
)


@dataclass(frozen=True)
class PluginLine:
    """One plug-in as the table shows it."""

    name: str
    kind: str  # check or probe
    stage: str
    module: ModuleType
    reasons: Mapping[str, Reason]
    samples: tuple[Sample, ...]
    metrics: Mapping[str, MetricRule]

    def row(self) -> str:
        summary = (self.module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
        reasons = ", ".join(f"`{code}`" for code in sorted(self.reasons))
        samples = "; ".join(
            f"{kind.value}: " + ", ".join(s.name for s in self.samples if s.kind is kind) for kind in SampleKind
        )
        metrics = (
            ", ".join(
                f"`{metric}` (min `{rule.threshold}`)" if rule.threshold else f"`{metric}` (no minimum key)"
                for metric, rule in self.metrics.items()
            )
            or "—"
        )
        return f"| `{self.name}` | {self.kind} | {self.stage} | {summary} | {reasons} | {metrics} | {samples} |\n"


def _module_of(declared: object, attribute: str) -> ModuleType:
    """The module that declares ``declared`` as its ``CHECK`` or ``PROBE``."""
    return next(m for m in list(sys.modules.values()) if getattr(m, attribute, None) is declared)


def plugin_lines() -> list[PluginLine]:
    """Every discovered check (preflight), then every discovered probe in report order."""
    checks = [
        PluginLine(c.name, "check", "preflight", _module_of(c, "CHECK"), c.reasons, c.samples, {})
        for c in discover_checks()
    ]
    probes = [
        PluginLine(p.name, "probe", p.stage, _module_of(p, "PROBE"), p.reasons, p.samples, p.metrics)
        for p in discover_probes()
    ]
    return checks + probes


def plugin_table(lines: Iterable[PluginLine] | None = None) -> str:
    """The Markdown table of ``lines`` (every discovered plug-in by default)."""
    return HEADER + "".join(line.row() for line in (plugin_lines() if lines is None else lines))


if __name__ == "__main__":
    sys.stdout.write(plugin_table())

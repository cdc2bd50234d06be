"""What a probe's (or a check's) author imports, in one place: everything :mod:`checks.contract` holds, and the
``Probe`` itself, the node-side script it ships (``NodeScript``), its figures and their rules (``MetricRule``,
``Default``, ``ProbeOutput``), the causes it links, the series it keeps, and the report section it draws
(``ReportSection`` over a ``ReportView``, the charts).

A probe module imports its contract from here (``from cluster_accept.probes.contract import Probe, …``);
nothing here is defined anew, so a probe written against it sees the same types the stages use.
"""

from __future__ import annotations

from cluster_accept.analysis.causes import gpu_state_causes as gpu_state_causes
from cluster_accept.analysis.causes import intra_node_causes as intra_node_causes
from cluster_accept.analysis.coverage import RUN_FAILED as RUN_FAILED
from cluster_accept.analysis.probe_output import ProbeOutput as ProbeOutput
from cluster_accept.analysis.probe_output import parse_json_lines as parse_json_lines
from cluster_accept.analysis.probe_verdicts import Default as Default
from cluster_accept.analysis.probe_verdicts import MetricRule as MetricRule
from cluster_accept.checks.contract import BAD_STATUSES as BAD_STATUSES
from cluster_accept.checks.contract import FIRST_READING as FIRST_READING
from cluster_accept.checks.contract import KEPT_ANSWER as KEPT_ANSWER
from cluster_accept.checks.contract import NOT_FOUND as NOT_FOUND
from cluster_accept.checks.contract import SEEN_BEFORE as SEEN_BEFORE
from cluster_accept.checks.contract import TOOL_CHECK as TOOL_CHECK
from cluster_accept.checks.contract import Action as Action
from cluster_accept.checks.contract import Check as Check
from cluster_accept.checks.contract import CheckRow as CheckRow
from cluster_accept.checks.contract import ClusterView as ClusterView
from cluster_accept.checks.contract import Expectation as Expectation
from cluster_accept.checks.contract import FindingKind as FindingKind
from cluster_accept.checks.contract import Link as Link
from cluster_accept.checks.contract import MarkRead as MarkRead
from cluster_accept.checks.contract import NodeModels as NodeModels
from cluster_accept.checks.contract import NodeRow as NodeRow
from cluster_accept.checks.contract import Profile as Profile
from cluster_accept.checks.contract import Reason as Reason
from cluster_accept.checks.contract import Sample as Sample
from cluster_accept.checks.contract import Status as Status
from cluster_accept.checks.contract import SuggestedValues as SuggestedValues
from cluster_accept.checks.contract import always as always
from cluster_accept.checks.contract import dead as dead
from cluster_accept.checks.contract import declare as declare
from cluster_accept.checks.contract import driver_unreachable as driver_unreachable
from cluster_accept.checks.contract import error_row as error_row
from cluster_accept.checks.contract import fault as fault
from cluster_accept.checks.contract import healthy as healthy
from cluster_accept.checks.contract import is_set as is_set
from cluster_accept.checks.contract import majority_values as majority_values
from cluster_accept.checks.contract import one_value as one_value
from cluster_accept.checks.contract import own_settings as own_settings
from cluster_accept.checks.contract import plurality as plurality
from cluster_accept.checks.contract import read_mark as read_mark
from cluster_accept.checks.contract import readable as readable
from cluster_accept.checks.contract import threshold_set as threshold_set
from cluster_accept.inventory.gpus import HBM_FRACTION as HBM_FRACTION
from cluster_accept.inventory.gpus import Rating as Rating
from cluster_accept.inventory.gpus import host_rating as host_rating
from cluster_accept.inventory.gpus import nvlink_rating as nvlink_rating
from cluster_accept.inventory.model import Node as Node
from cluster_accept.inventory.model import Thresholds as Thresholds
from cluster_accept.probes.base import SINGLE_NODE as SINGLE_NODE
from cluster_accept.probes.base import NodeScript as NodeScript
from cluster_accept.probes.base import Probe as Probe
from cluster_accept.probes.base import cluster_judgement as cluster_judgement
from cluster_accept.probes.base import json_figures as json_figures
from cluster_accept.probes.base import own_figures as own_figures
from cluster_accept.probes.series import NodeSeries as NodeSeries
from cluster_accept.probes.series import SeriesPlace as SeriesPlace
from cluster_accept.reports.charts import Bar as Bar
from cluster_accept.reports.charts import Ref as Ref
from cluster_accept.reports.charts import Series as Series
from cluster_accept.reports.charts import bar_chart as bar_chart
from cluster_accept.reports.charts import line_chart as line_chart
from cluster_accept.reports.figures import GOOD as GOOD
from cluster_accept.reports.figures import ReportSection as ReportSection
from cluster_accept.reports.figures import ReportView as ReportView
from cluster_accept.reports.figures import Table as Table
from cluster_accept.reports.figures import gpu_table as gpu_table
from cluster_accept.reports.figures import per_gpu_chart as per_gpu_chart
from cluster_accept.reports.figures import size_sweep_chart as size_sweep_chart
from cluster_accept.vocabulary.figures import NOTHING_UNKEPT as NOTHING_UNKEPT
from cluster_accept.vocabulary.figures import Figure as Figure
from cluster_accept.vocabulary.rows import Measurement as Measurement
from cluster_accept.vocabulary.rows import Record as Record

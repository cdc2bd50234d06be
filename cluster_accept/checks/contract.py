"""What a check's author imports, in one place: the ``Check`` it declares, the rows and statuses it returns, its
typed reasons, its samples, the profile keys it answers and the causes that explain its findings.

A check module imports its contract from here (``from cluster_accept.checks.contract import Check, …``); the
same names are in :mod:`cluster_accept.probes.contract`, a probe author's one import. Nothing here is defined
anew: each name is the one its home module defines, so a check written against either sees the same types.
"""

from __future__ import annotations

from cluster_accept.checks.base import BAD_STATUSES as BAD_STATUSES
from cluster_accept.checks.base import FIRST_READING as FIRST_READING
from cluster_accept.checks.base import KEPT_ANSWER as KEPT_ANSWER
from cluster_accept.checks.base import NOT_FOUND as NOT_FOUND
from cluster_accept.checks.base import SEEN_BEFORE as SEEN_BEFORE
from cluster_accept.checks.base import Check as Check
from cluster_accept.checks.base import CheckRow as CheckRow
from cluster_accept.checks.base import ClusterView as ClusterView
from cluster_accept.checks.base import MarkRead as MarkRead
from cluster_accept.checks.base import NodeModels as NodeModels
from cluster_accept.checks.base import NodeRow as NodeRow
from cluster_accept.checks.base import Status as Status
from cluster_accept.checks.base import SuggestedValues as SuggestedValues
from cluster_accept.checks.base import error_row as error_row
from cluster_accept.checks.base import majority_values as majority_values
from cluster_accept.checks.base import one_value as one_value
from cluster_accept.checks.base import own_settings as own_settings
from cluster_accept.checks.base import plurality as plurality
from cluster_accept.checks.base import read_mark as read_mark
from cluster_accept.checks.base import readable as readable
from cluster_accept.checks.declarations import Expectation as Expectation
from cluster_accept.checks.declarations import Link as Link
from cluster_accept.checks.declarations import always as always
from cluster_accept.checks.declarations import is_set as is_set
from cluster_accept.checks.declarations import threshold_set as threshold_set
from cluster_accept.checks.reasons import TOOL_CHECK as TOOL_CHECK
from cluster_accept.checks.reasons import Action as Action
from cluster_accept.checks.reasons import FindingKind as FindingKind
from cluster_accept.checks.reasons import Reason as Reason
from cluster_accept.checks.reasons import declare as declare
from cluster_accept.checks.samples import Sample as Sample
from cluster_accept.checks.samples import dead as dead
from cluster_accept.checks.samples import driver_unreachable as driver_unreachable
from cluster_accept.checks.samples import fault as fault
from cluster_accept.checks.samples import healthy as healthy
from cluster_accept.inventory.model import Profile as Profile

"""cluster-accept: accept GPU clusters and keep checking them.

The repository keeps its top-level folders (``flows/``, ``tasks/``, ``checks/``, ``probes/`` …); this package
maps each of them in as a sub-package (``cluster_accept.checks``, ``cluster_accept.tasks`` …), so an install
adds one top-level name and never clashes with other software's ``tasks`` or ``analysis``.
"""

__version__ = "0.1.0"

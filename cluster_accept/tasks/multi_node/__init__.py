"""The multi-node stage: nodes together. Its stage (`stage.py`) drives the group runs: the jobs a group runs and the
run started by the profile's launcher (`ranks.py`), the sweep and isolation, the collectives and the per-rail runs
(`rails.py`), training across nodes (`training_sweep.py`), and the rows read off a group run (`group_rows.py`)."""

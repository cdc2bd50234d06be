"""The preflight stage: every node's configuration read in one batch and judged (`stage.py`); the batch and its
parsing without Prefect (`check_batch.py`), which ``profile suggest`` reads nodes with (`suggest.py`); and
``profile: auto`` resolved from what the batch read (`auto_profile.py`)."""

"""Silent data corruption: every GPU multiplies the same inputs; the products must be bitwise equal. Pure.

GPUs of one model running the same torch and CUDA compute the same bytes for the same product (fixed seed, TF32
off): a GPU whose digest differs from its peers' produced wrong numbers without any error, the failure that
surfaces weeks later as a diverging loss. Digests are compared within a platform (GPU model, torch, CUDA) across
the whole cluster, so a node whose GPUs all agree with each other but not with the other nodes is caught too; a
GPU whose own repeats disagree is unstable whatever its peers say.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cluster_accept.vocabulary.lazy import pandas as pd

COLUMNS = ("node", "gpu", "platform", "size", "product", "sum", "stable")


@dataclass(frozen=True)
class SdcFinding:
    node: str
    gpu: int
    reason: str  # "same", "mismatch", "unstable", "no_majority"
    observed: str
    expected: str
    detail: str


def _answer(row: pd.Series) -> str:
    return f"{row['product']}/{row['sum']}"


def judge(digests: pd.DataFrame) -> list[SdcFinding]:
    """One finding per (node, GPU) of ``digests`` (:data:`COLUMNS`: ``product`` and ``sum`` of the first repeat,
    ``stable`` whether every repeat agreed), each GPU against the majority answer of its platform and size."""
    out = []
    for (platform, size), group in digests.groupby(["platform", "size"], sort=True):
        counts = Counter(_answer(row) for _, row in group.iterrows())
        ranked = counts.most_common()
        majority = ranked[0][0] if len(ranked) == 1 or ranked[0][1] > ranked[1][1] else None
        where = f"{platform}, {size}x{size} fp32 product"
        for _, row in group.sort_values(["node", "gpu"]).iterrows():
            answer = _answer(row)
            node, gpu = str(row["node"]), int(row["gpu"])
            if not row["stable"]:
                out.append(SdcFinding(node, gpu, "unstable", "its repeats disagree", "the same bits every time", where))
            elif majority is None:
                said = f"{answer} ({counts[answer]} of {len(group)} GPUs)"
                out.append(SdcFinding(node, gpu, "no_majority", said, "one answer held by most GPUs", where))
            elif answer != majority:
                said = f"digest {answer}"
                expected = f"{majority} (as {counts[majority]} of {len(group)} GPUs)"
                out.append(SdcFinding(node, gpu, "mismatch", said, expected, where))
            else:
                out.append(
                    SdcFinding(
                        node, gpu, "same", f"digest {answer}", f"as {counts[answer]} of {len(group)} GPUs", where
                    )
                )
    return out

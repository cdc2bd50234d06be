"""Progress of a run's stages, for whoever is watching: the CLI shows a rich bar per stage; a served
deployment or a test shows nothing. The flow reports into whatever :func:`use` installed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from rich.console import Console


class Progress(Protocol):
    def start(self, stage: str, total: int) -> None: ...

    def advance(self, stage: str, done: int = 1) -> None: ...

    def finish(self, stage: str) -> None: ...


class Silent:
    def start(self, stage: str, total: int) -> None:
        pass

    def advance(self, stage: str, done: int = 1) -> None:
        pass

    def finish(self, stage: str) -> None:
        pass


_current: list[Progress] = [Silent()]


def current() -> Progress:
    return _current[-1]


@contextmanager
def use(progress: Progress) -> Iterator[Progress]:
    """Report into ``progress`` for the duration of the block (the flow runs in the caller's process)."""
    _current.append(progress)
    try:
        yield progress
    finally:
        _current.remove(progress)


class StageBars:
    """A rich progress bar per stage while the flow runs (nodes done / nodes in the stage)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self.tasks: dict[str, Any] = {}

    def start(self, stage: str, total: int) -> None:
        if not self.tasks:
            self.bars.start()
        self.tasks[stage] = self.bars.add_task(stage, total=total)

    def advance(self, stage: str, done: int = 1) -> None:
        self.bars.advance(self.tasks[stage], done)

    def finish(self, stage: str) -> None:
        self.bars.update(self.tasks[stage], completed=self.bars.tasks[self.tasks[stage]].total)

    def close(self) -> None:
        if self.tasks:
            self.bars.stop()

"""What a training run counts as it trains: its steps and their times, RPKA's guards, and
its wall and CPU time (``rpka.training.train`` reports them in a run's result)."""

import dataclasses
import time


@dataclasses.dataclass
class Tally:
    """What a run counts as it trains: its steps, their times after the warm-up steps, and
    how often RPKA's guards fired."""

    steps: int = 0
    step_ms: list[float] = dataclasses.field(default_factory=list)
    guards: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Clock:
    """A run's wall and CPU time since it started."""

    wall_start: float = dataclasses.field(default_factory=time.perf_counter)
    cpu_start: float = dataclasses.field(default_factory=time.process_time)

    def wall_s(self) -> float:
        return time.perf_counter() - self.wall_start

    def cpu_s(self) -> float:
        return time.process_time() - self.cpu_start

"""What a quarantine replay waits for between messages (issue 45): it delivers as a pass does, so
it is steered as one: the job's pause, its max_rate, and back-pressure from the destination
queues' max_target_depth (bridge.pipeline.steer)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bridge.errors import BridgeError
from bridge.pipeline.loop import JobRunner

GATE_LOOK = 1.0  # seconds a replay goes on between looks at the job's pause and queue depths
GATE_POLL = 0.5  # seconds between looks while a replay waits


class JobPaused(BridgeError):
    """A replay of a paused job's messages, refused: say --even-if-paused to deliver them."""


class Gate:
    """What a replay waits for between messages, as a pass does (pipeline/steer.py): the job's
    pause, its max_rate, and back-pressure from the destination queues' max_target_depth. The
    books are read at most every GATE_LOOK seconds, and before every message while a queue is
    within a batch of its limit (its room, counted down as messages go)."""

    def __init__(self, runner: JobRunner, even_if_paused: bool, on_wait: Callable[[str | None], None],
                 should_stop: Callable[[], bool]) -> None:
        self.runner, self.even_if_paused, self.on_wait, self.should_stop = runner, even_if_paused, on_wait, should_stop
        self.looked = 0.0
        self.room: int | None = None

    def refuse_if_paused(self) -> None:
        steering = self.runner.steering()
        if steering.paused and not self.even_if_paused:
            raise JobPaused(steering.replay_refused())

    def wait(self) -> None:
        r = self.runner
        r.pace.wait(self.should_stop)
        if time.monotonic() - self.looked < GATE_LOOK and (self.room is None or self.room > 0):
            return
        held = f"job {r.job.name!r} held: "
        waited: str | None = None
        while not self.should_stop():
            why = r.may_go()
            self.looked = time.monotonic()
            if why is not None and not why.startswith(held):  # paused since the replay began
                if self.even_if_paused:
                    break
                raise JobPaused(f"{why}; the replay stopped there (what it replayed stays replayed): resume the job "
                                "and run it again, or replay with --even-if-paused")
            if why is None:
                break
            if why != waited:
                self.on_wait(why)
                waited = why
            time.sleep(GATE_POLL)
        if waited:
            self.on_wait(None)
        self.room = r.pressure.room()

    def spent(self, o: Any) -> None:
        if o.action == "replayed" and o.outcome == "delivered":
            self.runner.pace.spent(1)
            if self.room is not None:
                self.room -= 1

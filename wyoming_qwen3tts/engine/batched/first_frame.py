"""Where a timed request's first frame is: its admission, prefill, first step and first PCM.

A request's first segment carries its ``Timeline`` (``Work.timeline``); the batched engine
marks on it the points only the engine sees. This adds no synchronization: on the CPU every
step runs in line, so the host's clock after each part is its end; on CUDA the engine records
two timing events for such a request (after its prefill and after its first step, on the
talker's stream), makes that step's delivery event a timing one, and, once its existing wait
for that delivery returns, places the prefill's and the step's ends before it by the GPU's own
clock (``torch.cuda.Event.elapsed_time``). Steps without a newly admitted timed request do
nothing but test one empty list.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ...common.timeline import Timeline
from ..base import Work


@dataclass
class Probe:
    """The timed requests of one admission, until their first frame is delivered.

    Attributes:
        timelines: their timelines.
        prefilled: CUDA: timing event recorded after their prefill (None on the CPU).
        generated: CUDA: timing event recorded after their first step (None on the CPU).
    """

    timelines: list[Timeline]
    prefilled: torch.cuda.Event | None = None
    generated: torch.cuda.Event | None = None


class FirstFrames:
    """Marks the engine's points on timed requests (see the module docstring).

    Args:
        device: the engine's device; events are recorded on its current stream.
    """

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._admitted: list[Probe] = []  # prefilled, first step not launched yet

    def admitting(self, works: Iterable[Work]) -> list[Timeline]:
        """Before a prefill is launched: marks ``admitted`` on the timed ones; returns their
        timelines (usually [])."""
        timelines = [work.timeline for work in works if work.timeline is not None]
        if timelines:
            now = time.perf_counter()
            for timeline in timelines:
                timeline.mark("admitted", now)
        return timelines

    def prefilled(self, timelines: list[Timeline]) -> None:
        """After the prefill of ``timelines`` was launched (CUDA) or has run (CPU)."""
        if not timelines:
            return
        probe = Probe(timelines)
        if self._cuda:
            probe.prefilled = _timing_event()
        else:
            now = time.perf_counter()
            for timeline in timelines:
                timeline.mark("prefilled", now)
        self._admitted.append(probe)

    def launching(self) -> list[Probe] | None:
        """At a step's launch: the probes whose first frame it makes (None: no timed request
        was admitted since the last step)."""
        if not self._admitted:
            return None
        probes, self._admitted = self._admitted, []
        return probes

    def stepped(self, probes: list[Probe]) -> None:
        """After the step (talker and code predictor) was launched (CUDA) or has run (CPU)."""
        if self._cuda:
            event = _timing_event()
            for probe in probes:
                probe.generated = event
            return
        now = time.perf_counter()
        for probe in probes:
            for timeline in probe.timelines:
                timeline.mark("generated", now)

    def decoded(self, probes: list[Probe]) -> None:
        """After the step's decode ran in line on the CPU (on CUDA: ``delivered``)."""
        if self._cuda:
            return
        now = time.perf_counter()
        for probe in probes:
            for timeline in probe.timelines:
                timeline.mark("decoded", now)

    @staticmethod
    def delivered(probes: list[Probe], done: torch.cuda.Event | None) -> None:
        """Just after the engine's wait for the step's delivery event ``done`` returned (a
        timing event when the step has probes): ``decoded`` is now; on CUDA ``generated`` and
        ``prefilled`` are placed before it by the GPU's clock. Without ``done`` (CPU, eager
        CUDA) only ``decoded`` is marked, if not yet."""
        now = time.perf_counter()
        for probe in probes:
            for timeline in probe.timelines:
                timeline.mark("decoded", now)
                if done is None:
                    continue
                for point, event in (("generated", probe.generated), ("prefilled", probe.prefilled)):
                    if event is not None:
                        timeline.mark(point, now - event.elapsed_time(done) / 1000.0)

    def clear(self) -> None:
        """Forget admissions not yet stepped (their rows failed)."""
        self._admitted.clear()


def _timing_event() -> torch.cuda.Event:
    """A timing event recorded now on the current CUDA stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event

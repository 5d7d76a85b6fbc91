"""vLLM's engine loop with async scheduling on two clocks: the host's launches and the GPU's
steps, and when each step's tokens leave the engine.

With async scheduling vLLM keeps two steps in flight (EngineCore.step_with_batch_queue) and
the engine's own process launches the kernels of one GPU. So it launches step k+1 as soon as
it has launched step k and handed out step k-1's tokens, and it hands out step k's tokens
only once step k+1 is launched. A step replayed as a CUDA graph launches in a few ms, under
its GPU time: nothing to count. A step too large for a graph is launched kernel by kernel
(the cost model's `eager_floor_s`, `eager_mixed_floor_s` with decoders) while the GPU runs
its kernels as they come: that launch overlaps the step before on the GPU, and the tokens of
the step before wait for it. Without async scheduling the tokens leave at the step's end
and the next launch starts then.

The replica's step takes `lead_s` (`SchedulerCore.step`): how long before its start the
launch began. The fleet simulator keeps one a replica (`FleetSim._step_end`), and so does
the simulated replica server (engine/simserver/realtime.py).
"""

from __future__ import annotations

from collections.abc import Callable

from servepilot.plan.costmodel import CostModel
from servepilot.sim.engine.records import StepResult
from servepilot.sim.engine.request import SimRequest


class HostClock:
    """One engine's host: when its launches end and when its last tokens left."""

    __slots__ = ("_async", "_cost", "emitted_s", "launch_end_s")

    def __init__(self, cost: CostModel, async_scheduling: bool) -> None:
        self._cost = cost
        self._async = async_scheduling
        self.launch_end_s = 0.0
        """When the host is done launching the latest step."""
        self.emitted_s = 0.0
        """When the latest step's tokens left the engine."""

    def lead_s(self, now_s: float) -> float:
        """How long before `now_s` (the end of the last step) the launch of the step planned
        now began; negative while the host is still busy after `now_s`."""
        if not self._async:
            return 0.0
        ready_s = self.launch_end_s if self.launch_end_s > self.emitted_s else self.emitted_s
        return now_s - ready_s

    def launched(self, step: StepResult, launch_s: float) -> None:
        """`step` was planned and its launch began at `launch_s`."""
        tokens = step.prefill_tokens + step.decode_seqs
        launch = self._cost.eager_launch_s(tokens, step.decode_seqs, step.prefill_seqs)
        self.launch_end_s = launch_s + launch

    def emitted(self, end_s: float, launching: bool) -> tuple[float, float]:
        """The step that ended at `end_s` hands out its tokens: (when, the gap since the last
        step's). With async scheduling, once the next step (`launching`) is launched."""
        out_s = end_s
        if launching and self._async and self.launch_end_s > end_s:
            out_s = self.launch_end_s
        gap_s = out_s - self.emitted_s
        self.emitted_s = out_s
        return out_s, gap_s


def hold_back(
    step: StepResult, request: Callable[[int], SimRequest | None], delay_s: float
) -> None:
    """The step's tokens left the engine `delay_s` after its end (`HostClock.emitted`): its
    first tokens and its last ones came that much later. `request`: a live request by id
    (None for one aborted meanwhile)."""
    for request_id in step.first_tokens:
        started = request(request_id)
        if started is not None and started.first_token_s is not None:
            started.first_token_s += delay_s
    for done in step.finished:
        assert done.finish_s is not None
        done.finish_s += delay_s

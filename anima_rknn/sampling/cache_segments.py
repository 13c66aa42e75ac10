"""A step cache restarted wherever the conditioning changes (prompt editing, text/prompt_edit.py): nothing is
forecast across such a call. The run is cut into parts at those calls and each part gets a fresh policy of its
own, made for that part's calls alone: its first call is computed (a fresh policy has nothing to forecast from)
and its history starts there. Built on the seam as it is (sampling/cache_seam.py): the parts are ordinary
policies, and this wrapper is one more.

An alternation ("[a|b]") changes the conditioning every step: every part is one step long and nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..checks import is_int_in, require
from .auto_cache import AUTO_DEFAULTS
from .cache_seam import CachePolicy, CacheReport, Probe

_DONE = "parts_done"  # the state's key for the finished parts' reports (the running part's own keys beside it)


class SegmentedCache:
    """`make(calls)` -> a fresh policy for a part of that many model calls; `starts`: the 1-based calls where
    the conditioning changes (each begins a part)."""

    def __init__(self, make: Callable[[int], CachePolicy], num_steps: int, starts: list[int]) -> None:
        cuts = sorted({1, *(call for call in starts if 1 < call <= num_steps)})
        self.bounds = [*cuts, num_steps + 1]
        self.parts = [make(end - begin) for begin, end in zip(self.bounds, self.bounds[1:])]
        self.name, self.num_steps = self.parts[0].name, num_steps
        self.check = bool(getattr(self.parts[0], "check", False))
        self.part = 0
        self.done: list[CacheReport] = []  # the finished parts', in the run's call numbers

    def attach_probe(self, probe: Probe) -> None:
        for part in self.parts:
            part.attach_probe(probe)

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None:
        """Each part plans over its own calls, ending at the sigma of the next part's first call."""
        for part, begin, end in zip(self.parts, self.bounds, self.bounds[1:]):
            part.set_sigmas(np.asarray(sigmas[begin - 1:end]), fresh_noise)

    def should_skip(self, x: np.ndarray | None = None) -> bool:
        while self.part + 1 < len(self.parts) and self._calls() + 1 >= self.bounds[self.part + 1]:
            self.done.append(self._shifted(self.part))
            self.part += 1
        return self.parts[self.part].should_skip(x)

    def forecast(self, x: np.ndarray) -> np.ndarray:
        return self.parts[self.part].forecast(x)

    def record(self, x: np.ndarray, x0: np.ndarray) -> None:
        self.parts[self.part].record(x, x0)

    def withdraw_forecast(self) -> None:
        self.parts[self.part].withdraw_forecast()

    def state(self) -> dict[str, Any]:
        return {**self.parts[self.part].state(),
                _DONE: [[r.computed_steps, r.skipped_steps, r.error_estimate, r.may_differ] for r in self.done]}

    def restore(self, state: dict[str, Any]) -> None:
        state = dict(state)
        done = state.pop(_DONE, None)
        require(isinstance(done, list) and len(done) < len(self.parts) and all(
            isinstance(entry, list) and len(entry) == 4 and all(isinstance(s, list) for s in entry[:2])
            for entry in done), "the cache state does not fit this run's prompt editing")
        self.done = [CacheReport(list(c), list(s), e, f) for c, s, e, f in done]
        self.part = len(self.done)
        before = self.bounds[self.part] - 1
        require(all(is_int_in(s, 1, before) for r in self.done for s in r.computed_steps + r.skipped_steps)
                and sum(r.calls for r in self.done) == before, "the cache state does not fit this run's prompt editing")
        self.parts[self.part].restore(state)
        require(self.parts[self.part].report().calls <= self.bounds[self.part + 1] - self.bounds[self.part],
                "the cache state does not fit this run's prompt editing")

    def report(self) -> CacheReport:
        reports = [*self.done, self._shifted(self.part)]
        errors = [r.error_estimate for r in reports if r.error_estimate is not None]
        flags = [r.may_differ for r in reports if r.may_differ is not None]
        return CacheReport([s for r in reports for s in r.computed_steps], [s for r in reports for s in r.skipped_steps],
                           sum(errors) if errors else None, any(flags) if flags else None)

    def _calls(self) -> int:
        return self.bounds[self.part] - 1 + self.parts[self.part].report().calls

    def _shifted(self, index: int) -> CacheReport:
        """Part `index`'s report in the run's call numbers."""
        report, offset = self.parts[index].report(), self.bounds[index] - 1
        return CacheReport([s + offset for s in report.computed_steps], [s + offset for s in report.skipped_steps],
                           report.error_estimate, report.may_differ)


def part_options(options: dict[str, Any], calls: int, total: int) -> dict[str, Any]:
    """A part's cache options: auto's budget (computed calls for the whole run) shared out by the parts' calls,
    each part at least its warm-up's and at most its calls."""
    if "budget" not in options:
        return options
    warm = min(int(options.get("warmup", AUTO_DEFAULTS["warmup"])), calls)
    return {**options, "budget": min(calls, max(warm, round(options["budget"] * calls / total)))}

"""The seam between the sampler loop (sampling/sample.py) and a step cache: the protocol every policy implements,
the report every policy returns, and the one optional capability (a look at the model before a forecast)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class CacheReport:
    """What a policy says of its run so far: every policy returns one (report())."""

    computed_steps: list[int]  # model calls that ran the network, 1-based
    skipped_steps: list[int]  # ... and those a forecast stood in for
    error_estimate: float | None = None  # its estimate of the final latent's relative distance from the uncached
    may_differ: bool | None = None  # its flag: the image may differ visibly from the uncached one (None: no flag)

    @property
    def calls(self) -> int:
        return len(self.computed_steps) + len(self.skipped_steps)


class CachePolicy(Protocol):
    """The seam between the sampler loop and a step cache, and nothing more. Before the first call the loop hands
    over the sigma of every model call the run makes and the run's final sigma, and whether the sampler adds fresh
    noise on its steps (set_sigmas); then per call it calls should_skip(x), then forecast(x) or record(x, x0), x
    being the latent the model is asked about.

    A non-finite forecast is taken back with withdraw_forecast(); the loop then record()s the model's x0 for
    that same call. state() / restore() carry a run across a stop and resume: NumPy arrays (or lists of them)
    plus JSON-able values. report() says what the run did and what the policy thinks of it.
    """

    name: str
    num_steps: int

    def set_sigmas(self, sigmas: np.ndarray, fresh_noise: bool = False) -> None: ...

    def should_skip(self, x: np.ndarray | None = None) -> bool: ...

    def forecast(self, x: np.ndarray) -> np.ndarray: ...

    def record(self, x: np.ndarray, x0: np.ndarray) -> None: ...

    def withdraw_forecast(self) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def report(self) -> CacheReport: ...


@runtime_checkable
class ChecksForecasts(Protocol):
    """An optional capability: the policy looks at the model through a partial pass before it trusts a forecast
    (auto's check). Where `check` is on, the pipeline attaches the probe before the first call."""

    check: bool

    def attach_probe(self, probe: Probe) -> None: ...


class Probe(Protocol):
    """A cheap look at the model for `check`: its features at latent x and sigma from a partial pass, and the same
    features of the last full model call (which kept them for free)."""

    def __call__(self, x: np.ndarray, sigma: float) -> np.ndarray: ...

    def last(self) -> np.ndarray: ...

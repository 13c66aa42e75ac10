"""One job, start to end: continue from its resume state if it has one, generate, check and publish, report
the step events, write checkpoints, and stop at a step boundary when asked.

The drivers only say where things go: `generate` (a path given by the user, its own --resume state), `serve`'s
queue (the data folder, cancel = stop), `batch`'s local worker (bytes for the driver, Ctrl-C = stop) and its Ray
actors (bytes, states in the node's cache folder). What happens to a stopped job is theirs to decide: the
runner raises resume.Interrupted with the state kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import AnimaError
from ..generation.params import GenerationParams, size_warning
from ..generation.pipeline import AnimaPipeline
from ..generation.result import NotFinite, Published, publish
from ..generation.resume import Checkpoints, ResumeState, read_state
from ..generation.run_plan import RunPlan
from ..model.io import trained_image_size
from ..sampling.sample import StepCallback


class JobRunner:
    """Runs jobs one after another on one pipeline (a kept DiT stays loaded between them).

    `checkpoint_every`: write the running job's state every N steps (None: after every computed step once a
    run is long, resume.LONG_RUN_S); `warn` gets a periodic checkpoint that could not be written (the job goes
    on; None: such a failure ends the job)."""

    def __init__(self, pipeline: AnimaPipeline, *, checkpoint_every: int | None = None,
                 warn: Callable[[AnimaError], None] | None = None) -> None:
        self.pipeline, self.checkpoint_every, self.warn = pipeline, checkpoint_every, warn

    def run(self, run: RunPlan | GenerationParams, *, state: Path | None, to: Path | None = None,
            image: str | None = None, overwrite: bool = False, resume: ResumeState | None = None,
            on_step: StepCallback | None = None, stop: Callable[[], bool] = lambda: False,
            interrupt: Callable[[], bool] | None = None) -> Published:
        """Generate `run` (pipeline.prepare()'s plan, made when the driver checked the job; settings are prepared
        here) and publish the result (result.publish: to the path `to`, or as bytes; `image` is where the record
        says the picture is). Checkpoints go to `state`; `resume` continues a stopped run. When
        `stop()` turns true the run ends at the next step boundary with resume.Interrupted, its state kept
        (without a `state` there is nothing to resume, so such a run is not stopped). When `interrupt()` turns
        true the run ends after that step (one step at least) and its picture as far as it got is published, the
        record saying where it was interrupted (WebUI's interrupt). A job that fails raises its AnimaError.

        The state is removed once the result is published, and when the run itself went wrong (NotFinite:
        resuming would only repeat it). Any other failure keeps it: a refused resume (other settings or model
        files) must not cost the user the run it refused, and a run whose image could not be written (a full
        disk) can continue from it; a driver that will not run the job again removes it."""
        checkpoints = (Checkpoints(state, self.checkpoint_every, stop=stop, warn=self.warn)
                       if state is not None else None)
        try:
            result = self.pipeline.generate(run, on_step, checkpoints=checkpoints, resume=resume,
                                            interrupt=interrupt)
            published = publish(result, to, image=image, overwrite=overwrite)
        except NotFinite:
            if checkpoints is not None:
                checkpoints.remove()
            raise
        if checkpoints is not None:
            checkpoints.remove()  # published: nothing left to resume
        warning = size_warning(result.params, trained_image_size(self.pipeline.files.dit))
        if warning:  # every front end's record says so (a 64-px model asked for 512 px draws a flat field)
            published.record["warnings"] = [warning]
        return published


def saved_state(path: Path | None) -> ResumeState | None:
    """The resume state a stopped job left at `path`, if there is a sound one: a damaged or foreign state of
    this job is worth nothing, so the job starts over (and its next checkpoint replaces the file)."""
    if path is None or not path.is_file():
        return None
    try:
        return read_state(path)
    except AnimaError:
        return None

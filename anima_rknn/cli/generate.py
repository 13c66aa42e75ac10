from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import click
from click.core import ParameterSource
from tqdm import tqdm

from ..checks import shown
from ..core.files import check_output_file, json_text
from ..errors import AnimaError
from ..generation.params import (
    IMAGE_SETTINGS,
    MAX_SEED,
    MAX_STEPS,
    SETTINGS,
    GenerationParams,
    options,
    settings_of,
    size_warning,
)
from ..generation.pipeline import AnimaPipeline
from ..generation.result import NotFinite, call_noun, stage_text
from ..generation.resume import (
    STATE_SUFFIX,
    Interrupted,
    ResumeState,
    default_state_path,
    output_of_state,
    read_state,
)
from ..generation.run_plan import RunPlan
from ..jobs.runner import JobRunner
from ..model.io import trained_image_size
from ..sampling.sample import StepCallback, StepEvent
from ..vae.preview import PreviewWriter
from .group import cli
from .options import (
    cli_flags,
    cli_names,
    generation_options,
    params_from_cli,
    resolve_model,
)
from .sdcpp import SdCppCommand, no_effect_options
from .signals import stop_on_signals

MAX_BATCH_COUNT = 10_000  # images of one --batch-count


@cli.command("generate", cls=SdCppCommand)
@generation_options
@click.option("--out", "-o", "--output", default="out.png", show_default=True, type=click.Path(dir_okay=False),
              help="The PNG to write. With --batch-count N: OUT_0.png .. OUT_N-1.png, or a printf pattern such as "
                   "out_%03d.png (as stable-diffusion.cpp). Resuming X.png.state, the default is X.png.")
@click.option("--batch-count", "-b", type=click.IntRange(1, MAX_BATCH_COUNT), default=1, show_default=True,
              help="Make N images, seeds SEED .. SEED+N-1 (a random seed is drawn once), one after another.")
@click.option("--output-begin-idx", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --batch-count: the number of the first image's file.")
@click.option("--overwrite", is_flag=True, help="Replace --out (and a stopped run's state file) if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the results on stdout (one line "
                                                       "per image with --batch-count).")
@click.option("--verbose", "-v", is_flag=True, help="Print the model files and every setting before the run.")
@click.option("--state", "state", type=click.Path(dir_okay=False), default=None,
              help="Where Ctrl-C / SIGTERM and checkpoints write the resume state. Default: OUT.state.")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None,
              help="Also write the resume state every N steps. Default: after every computed step once the run "
                   "takes over a minute.")
@click.option("--resume", "resume_path", type=click.Path(dir_okay=False), default=None,
              help="Continue a stopped run from its state file: same settings and model files, same image "
                   "(an image-to-image run: pass its --init-img / --mask files again).")
@click.option("--preview", type=click.Path(dir_okay=False), default=None,
              help="Write the step's denoised estimate to this PNG as the run goes (replaced atomically). "
                   "stable-diffusion.cpp's methods are taken too: proj (this), vae (--preview-vae), none.")
@click.option("--preview-path", type=click.Path(dir_okay=False), default=None,
              help="stable-diffusion.cpp's name of the preview file (with --preview proj|vae; alone: --preview).")
@click.option("--preview-every", "--preview-interval", type=click.IntRange(1, MAX_STEPS), default=1,
              show_default=True, help="Preview every N steps (and at the last).")
@click.option("--preview-vae", is_flag=True,
              help="Preview with a real (tiled) VAE decode instead of the cheap latent projection.")
@no_effect_options
@click.pass_context
def generate(ctx: click.Context, model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, out, batch_count,
             output_begin_idx, overwrite, as_json, verbose, state, checkpoint_every, resume_path, preview,
             preview_path, preview_every, preview_vae, **settings) -> None:
    """Generate one image (or --batch-count of them). Ctrl-C (or SIGTERM) stops after the current step and writes
    a resume state; a second Ctrl-C aborts at once."""
    files = resolve_model(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                          t5_tokenizer=t5_tokenizer)
    resumed = read_state(resume_path) if resume_path else None
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    if batch_count > 1 and (resumed is not None or state is not None):
        raise AnimaError("--batch-count makes each image with its own resume state (OUT_N.png.state): drop "
                         f"{'--resume' if resumed is not None else '--state'}, and resume a stopped image alone")
    if resumed is not None:
        out = out if "out" in given else output_of_state(Path(resume_path))
        if out is None:
            raise AnimaError(f"pass --out: {resume_path} does not say which image it was for")
    elif settings["prompt"] is None:
        raise AnimaError("pass --prompt (or --resume STATE to continue a stopped run)")
    preview, preview_vae = preview_choice(preview, preview_path, preview_vae)
    params = params_from_cli(files, settings)
    if resumed is not None:  # the state's settings, except where the command line says otherwise (then refused)
        check_state_images(params, resumed, given, resume_path)
        params = settings_from_state(params, resumed, given)
    params.validate()
    images = []  # (PNG, settings, state) of each image, all checked before minutes of work
    for index, path in enumerate(batch_outputs(Path(out), batch_count, output_begin_idx, params.seed)):
        out_path = check_output_file(path, overwrite=overwrite, suffixes=(".png",))
        # A resumed run goes on in the state it was given (its checkpoints, and removed once the image is
        # published), whatever --out says.
        state_path = (Path(state) if state else Path(resume_path) if resumed is not None
                      else default_state_path(out_path))
        if resumed is None or state_path.resolve() != Path(resume_path).resolve():
            check_state_file(state_path, overwrite, resume_command(ctx, given, state_path, out_path))
        images.append((out_path, params.seed + index, state_path))
    warning = size_warning(params, trained_image_size(files.dit))
    if warning:
        click.echo(f"warning: {warning}", err=True)
    if preview is not None and Path(preview).resolve() in {path.resolve() for path, _, _ in images}:
        raise AnimaError("--preview must be another file than --out")
    runner = JobRunner(AnimaPipeline(files), checkpoint_every=checkpoint_every, warn=_warn_once())
    plan = runner.pipeline.prepare(params, validated=True)  # once: each image is this run at its own seed
    if verbose:
        click.echo(f"model files: {json_text({k: str(v) for k, v in dataclasses.asdict(files).items()})}", err=True)
        click.echo(f"settings: {json_text(settings_of(params))}", err=True)
    # One preview file for all the images; a resumed run takes over its own earlier preview.
    previews = preview_listener(preview, images[0][0], files.vae, preview_every, preview_vae, params.vae_tile,
                                overwrite or resumed is not None)
    for number, (out_path, seed, state_path) in enumerate(images):
        if len(images) > 1:
            click.echo(f"image {number + 1}/{len(images)}: seed {seed}", err=True)
        image = plan.for_settings(dataclasses.replace(params, seed=seed))
        report = run_one(ctx, runner, image, out_path, state_path, given, resumed, resume_path, overwrite, previews)
        print_report(image.params, report, out_path, as_json)
        if report["finite"] is False:
            raise NotFinite(report)


def _warn_once() -> Callable[[AnimaError], None]:
    warned: set[str] = set()

    def warn_once(e: AnimaError) -> None:
        if str(e) not in warned:
            warned.add(str(e))
            click.echo(f"\nwarning: checkpoint not written (the run goes on): {e}", err=True)

    return warn_once


def run_one(ctx: click.Context, runner: JobRunner, plan: RunPlan, out_path: Path, state_path: Path,
            given: set[str], resumed: ResumeState | None, resume_path: str | None, overwrite: bool,
            previews: StepCallback | None) -> dict:
    """One image: its run with the step bar and the previews; the record. Ctrl-C ends the command here, saying
    how to resume."""
    bars: list[tqdm] = []  # opened at the first step, so that an error before it prints no empty bar

    def on_step(event: StepEvent) -> None:
        if not bars:
            bars.append(tqdm(total=event.total, initial=event.step - 1, desc="denoise", unit="step",
                             file=sys.stderr, dynamic_ncols=True))
        bars[0].set_postfix_str("model" if event.computed else "forecast")
        bars[0].update(event.step - bars[0].n)  # back, when verify runs steps again
        if previews is not None:
            previews(event)

    stopped: Interrupted | None = None
    try:
        with stop_on_signals() as stops:
            report = runner.run(plan, state=state_path, to=out_path, overwrite=overwrite, resume=resumed,
                                on_step=on_step, stop=lambda: bool(stops)).record
    except Interrupted as e:
        stopped = e
    except NotFinite as e:  # reported like a finished run, then refused
        report = e.record
    finally:
        for bar in bars:
            bar.close()
    if stopped is not None:
        click.echo("stopped before the first step; nothing to resume" if stopped.path is None else
                   f"stopped after step {stopped.step}/{stopped.total}; resume with: "
                   f"{resume_command(ctx, given, stopped.path, out_path)}", err=True)
        sys.exit(128 + stops[0])
    if resumed is not None and report["finite"] and state_path.resolve() != Path(resume_path).resolve():
        Path(resume_path).unlink(missing_ok=True)  # published: the state it went on from has nothing left to resume
    return report


def print_report(params: GenerationParams, report: dict, out_path: Path, as_json: bool) -> None:
    if as_json:
        click.echo(json_text(report))
    echo = (lambda s: click.echo(s, err=True)) if as_json else click.echo
    t = report["timings"]
    encode_image = f"VAE encode {t['vae_encode_s']:.2f}s, " if t.get("vae_encode_s") else ""
    echo(f"{'wrote ' + str(out_path) if report['finite'] else 'NO IMAGE WRITTEN'}: {size_text(params, report)}, "
         f"{steps_text(params)}, {cache_text(params)}: computed {computed_text(params, report)}, "
         f"{report['transformer_passes']} transformer passes{partial_text(report)} "
         f"({report['passes_per_model_call']} per model call), "
         f"{report['subgraph_runs']} subgraph runs; "
         f"encode {t['encode_s']:.2f}s, {encode_image}denoise {t['denoise_s']:.2f}s, decode {t['decode_s']:.2f}s, "
         f"total {t['total_s']:.2f}s (excl. encode)")
    if params.backend == "rknn" and t["stages"] is not None:
        echo(stage_text(t["stages"]))
    for warning in report.get("warnings", []):
        echo(f"warning: {warning}")
    if report["cache_error_estimate"] is not None:
        echo(f"cache error estimate: {report['cache_error_estimate']:.4f} (relative L2 distance of the latent from "
             "the uncached run's, estimated from the forecasts' measured errors)")
    if report["cache_rerun_from"] is not None:
        echo(f"cache check: the image may have differed visibly from the uncached one; verify re-ran every step "
             f"after step {report['cache_rerun_from']} uncached")
    elif report["cache_may_differ"]:
        echo("cache check: this image may differ visibly from the uncached one (--cache-option verify=1 re-runs "
             "such an image uncached; --cache none is the baseline)")
    if report["recomputed_steps"]:
        echo(f"numerical guard: non-finite forecast, recomputed steps {report['recomputed_steps']}")


# A printf pattern for the image number, as stable-diffusion.cpp's -o takes it (out_%03d.png).
_NUMBER_PATTERN = re.compile(r"%0?\d*d")


def batch_outputs(out: Path, count: int, begin: int, seed: int) -> list[Path]:
    """The files of --batch-count images, as stable-diffusion.cpp names them: OUT with a printf pattern filled
    in with each image's number (from --output-begin-idx), else OUT_NUMBER.png when there are several; and the
    seeds they take (SEED + i) must all be seeds."""
    if seed + count - 1 > MAX_SEED:
        raise AnimaError(f"--batch-count {count} from seed {seed} runs past the largest seed, {MAX_SEED}")
    patterns = _NUMBER_PATTERN.findall(out.name)
    if len(patterns) > 1 or "%" in _NUMBER_PATTERN.sub("", out.name):
        raise AnimaError(f"--out takes at most one printf number pattern such as %03d, got {out.name!r}")
    if patterns:
        return [out.with_name(out.name % (begin + index)) for index in range(count)]
    if count == 1:
        return [out]
    return [out.with_name(f"{out.stem}_{begin + index}{out.suffix}") for index in range(count)]


# stable-diffusion.cpp's --preview takes a method; its file is --preview-path (default preview.png).
PREVIEW_METHODS = ("none", "proj", "vae", "tae")
SDCPP_PREVIEW = "preview.png"


def preview_choice(preview: str | None, preview_path: str | None, vae_decode: bool) -> tuple[str | None, bool]:
    """--preview FILE (ours), or stable-diffusion.cpp's --preview METHOD --preview-path FILE: the file to preview
    to (None: none) and whether previews decode with the VAE."""
    if preview not in PREVIEW_METHODS:
        if preview is not None and preview_path is not None:
            raise AnimaError("--preview FILE and --preview-path FILE name the preview file twice: give one")
        return preview or preview_path, vae_decode
    if preview == "tae":
        raise AnimaError("--preview tae: no tiny autoencoder here; use --preview proj (the latent projection) or "
                         "--preview vae (a VAE decode)")
    if preview == "none":
        return None, vae_decode
    return preview_path or SDCPP_PREVIEW, vae_decode or preview == "vae"


def size_text(params: GenerationParams, report: dict) -> str:
    """The picture's size, and how it was made where that is not the size itself: the hires fix's first pass,
    an only-masked inpainting's working size."""
    passes = params.passes()
    worked = f"{passes[-1].width}x{passes[-1].height}"
    image = report.get("image_size")
    made = worked if image is None else f"{image[0]}x{image[1]}"
    if len(passes) > 1:
        made += f" (hires fix of {passes[0].width}x{passes[0].height})"
    if made.split(" ")[0] != worked:
        made += f" (worked at {worked})"
    return made


def steps_text(params: GenerationParams) -> str:
    """The steps each pass ran, honestly: an image-to-image pass runs the last steps x strength (rounded up) of its
    schedule ("10 of 20 steps (strength 0.5)"); the hires fix's passes are added ("20 steps + 15 of 20 hires
    steps (strength 0.75)")."""
    parts = []
    for denoise_pass in params.passes():
        noun = "hires steps" if denoise_pass.stream else "steps"
        parts.append(f"{denoise_pass.steps} {noun}" if denoise_pass.start == 0 else
                     f"{denoise_pass.steps_run} of {denoise_pass.steps} {noun} (strength {params.strength:g})")
    return " + ".join(parts)


def cache_text(params: GenerationParams) -> str:
    caches = [denoise_pass.cache for denoise_pass in params.passes()]
    return f"cache {caches[0]}" if len(set(caches)) == 1 else f"cache {caches[0]}, hires cache {caches[1]}"


def partial_text(report: dict) -> str:
    """The partial passes auto's check ran, where it ran any (" + 9 partial passes of the first block")."""
    partial = report["partial_passes"]
    return f" + {partial} partial pass{'es' if partial != 1 else ''} of the first block" if partial else ""


def computed_text(params: GenerationParams, report: dict) -> str:
    """What each pass the record holds computed, of its model calls ("10/10 steps"; "20/20 + 15/15 steps")."""
    passes = params.passes()[-len(report["passes"]):]  # a run resumed in the hires pass made only that one
    parts = []
    for denoise_pass, done in zip(passes, report["passes"]):
        calls = params.model_calls(denoise_pass.sigmas)
        parts.append((len(done["computed_steps"]), calls, call_noun(calls, denoise_pass.steps_run)))
    nouns = {noun for _, _, noun in parts}
    if len(nouns) == 1:
        return " + ".join(f"{computed}/{calls}" for computed, calls, _ in parts) + f" {nouns.pop()}"
    return " + ".join(f"{computed}/{calls} {noun}" for computed, calls, noun in parts)


IMAGE_WORDS = {"init_image": ("an", "init image"), "mask": ("a", "mask")}


def _named(name: str) -> str:
    """An image's name as a command line would take it, kept to one line (a state's name is only text)."""
    return shlex.quote(name) if name.isprintable() else shown(name, 200)


def check_state_images(params: GenerationParams, resumed: ResumeState, given: set[str], state: str) -> None:
    """A state keeps its images by sha256 alone: a resumed image-to-image run is given the same files again. One
    line naming the image it was made from when one is missing, different, or not the state's at all."""
    for name in IMAGE_SETTINGS:
        theirs, ours, flag = getattr(resumed.params, name), getattr(params, name), cli_flags(name)[0]
        article, word = IMAGE_WORDS[name]
        if theirs is None:
            if ours is not None:
                raise AnimaError(f"{state} was made without {article} {word}: drop {flag}")
            continue
        made = f"{_named(theirs.name)} (sha256 {theirs.sha256[:12]})"
        if not cli_names(name) & given:
            raise AnimaError(f"{state} was made from the {word} {made}: a state keeps only its fingerprint, so pass "
                             f"it again with {flag} {_named(theirs.name)}")
        if ours != theirs:
            raise AnimaError(f"{flag} {_named(ours.name)} (sha256 {ours.sha256[:12]}) differs from the {word} "
                             f"{state} was made from, {made}: pass that file")


def settings_from_state(params: GenerationParams, resumed: ResumeState, given: set[str]) -> GenerationParams:
    """The state's settings; a setting also given on the command line must agree (check() names a difference)."""
    taken = {name: getattr(resumed.params, name) for name in SETTINGS
             if not cli_names(name) & given and name not in IMAGE_SETTINGS}  # the files given, checked before
    merged = dataclasses.replace(params, **taken)
    resumed.check_settings(merged)
    return merged


# What a resumed run must be told again: a state holds the settings that make the picture and the fingerprints of
# the files, not where the files are or where the run runs (so that it resumes on another machine, with that
# machine's paths); and --overwrite, when the output was there before the stopped run.
RUN_FLAGS = frozenset({"model", "dit", "text_encoder", "vae", "qwen_tokenizer", "t5_tokenizer", "overwrite",
                       *(flag for name, _ in options() if name not in SETTINGS or name in IMAGE_SETTINGS
                         for flag in cli_names(name))})


def resume_command(ctx: click.Context, given: set[str], state: Path, out: Path) -> str:
    """The command line that continues this run from `state`: --resume with the flags of RUN_FLAGS this command
    was given, and --out where the state's name does not say it."""
    words = ["anima-rknn", "generate"]
    for param in ctx.command.params:
        if param.name in given and param.name in RUN_FLAGS and isinstance(param, click.Option):
            value = ctx.params[param.name]
            words += [param.opts[0]] if param.is_flag else [param.opts[0], str(value)]
    implied = output_of_state(state)
    if implied is None or implied.resolve() != out.resolve():
        words += ["--out", str(out)]
    return shlex.join([*words, "--resume", str(state)])


def preview_listener(preview: str | None, out: Path, vae: Path, every: int, vae_decode: bool, tile: int,
                     overwrite: bool) -> StepCallback | None:
    """The --preview writer, checked now; a preview that fails later is given up with one warning line, since
    a picture to watch is not worth the run it watches."""
    if preview is None:
        return None
    path = check_output_file(Path(preview), overwrite=overwrite, suffixes=(".png",))
    if path.resolve() == out.resolve():
        raise AnimaError("--preview must be another file than --out")
    writer = PreviewWriter(path, vae, every, vae_decode=vae_decode, tile=tile)
    failed: list[str] = []
    # The preview is this run's to replace: the file it last wrote (or, with --overwrite / resuming, the one there
    # at the start); a file that appears at its name meanwhile is someone else's, and stays.
    ours: list[tuple[int, int] | None] = [_identity(path) if overwrite else None]

    def write(event: StepEvent) -> None:
        if failed:
            return
        try:
            if _identity(path) not in (None, ours[0]):
                raise AnimaError(f"{path} appeared while this run was working; it was not replaced")
            writer(event)
            ours[0] = _identity(path)
        except Exception as e:  # noqa: BLE001 -- anything, a VAE decode out of memory too: the run matters more
            failed.append(str(e))
            click.echo(f"\nwarning: previews stopped: {e}", err=True)

    return write


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` (device and inode), None when there is none."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


def check_state_file(path: Path, overwrite: bool, resume: str) -> None:
    """Where the resume state goes must be writable now, not after minutes of work; and a new run must not
    replace a stopped run's state unasked: that would throw its work away (`resume`: the command that continues
    it)."""
    check_output_file(path, overwrite=True, suffixes=(STATE_SUFFIX,))  # first: a name too long cannot be looked at
    if path.exists() and not overwrite:
        raise AnimaError(f"{path} holds a stopped run: continue it with {resume}, or pass --overwrite to start over")

"""`anima-rknn serve`: the HTTP server (AUTOMATIC1111 and OpenAI APIs, native jobs) for one model set."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click

from ..core.cpu_speed import AUTO, resolve_dtype
from ..engine.vae_auto import choose_vae_backend
from ..errors import AnimaError
from ..generation.params import MAX_SIDE, MAX_STEPS, SERVER_SETTINGS, build, default
from ..generation.pipeline import AnimaPipeline
from ..model.io import trained_image_size
from ..model.model_set import resolve
from ..sampling.caches import CACHE_NAMES
from .group import cli
from .options import lora_dir_option, model_options, setting_options, setting_values


@cli.command("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=7860, show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False), default="anima-server", show_default=True,
              help="Jobs, results and resume states; a restarted server picks its jobs up from here.")
@click.option("--max-queue", type=click.IntRange(1, 1000), default=16, show_default=True,
              help="Waiting jobs at most; beyond it requests get HTTP 429.")
@click.option("--cache", type=click.Choice(CACHE_NAMES), default=default("cache"), show_default=True,
              help="Step cache for requests that do not choose one.")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None,
              help="Write a running job's resume state every N steps. Default: after every computed step once "
                   "a job takes over a minute.")
@click.option("--max-side", type=click.IntRange(16, MAX_SIDE), default=1024, show_default=True,
              help="Largest width or height a request may ask for.")
@click.option("--max-steps", type=click.IntRange(1, MAX_STEPS), default=150, show_default=True,
              help="Most steps a request may ask for.")
@setting_options(*SERVER_SETTINGS)
@click.option("--keep-models/--no-keep-models", default=None,
              help="Keep the DiT loaded between jobs (faster), or load each stage per job as the CLI does (least "
                   "memory). Default: keep, except on the rknn backend (the board's 8 GB).")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' (OpenAI clients send it).")
@click.option("--api-auth", default=None, help="Require HTTP basic auth USER:PASS (as WebUI's --api-auth).")
@lora_dir_option
def serve(model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, host, port, data_dir, max_queue, cache,
          checkpoint_every, max_side, max_steps, keep_models, api_key, api_auth, lora_dir, **settings) -> None:
    """Serve the model over HTTP until Ctrl-C; a job running then resumes at the next start."""
    import uvicorn

    from ..server.app import Server
    from ..server.jobs import JobQueue

    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise AnimaError(f"--host must be an IP address, got {host!r}") from None
    if api_auth is not None and ":" not in api_auth:
        raise AnimaError("--api-auth must be USER:PASS")
    files = resolve(model, dit=dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                    t5_tokenizer=t5_tokenizer)
    engine = setting_values(settings)  # the server's own settings (SERVER_SETTINGS), the same for every request
    engine["dtype"] = resolve_dtype(engine["dtype"])  # probed once here, not per request
    build(engine).validate()  # a bad server setting is refused now, not in every request
    keep = engine["backend"] != "rknn" if keep_models is None else keep_models
    if engine["vae_backend"] == AUTO:
        # Requests decode with --vae-backend auto, by default at the default tile: probe (and export its ONNX set)
        # now, not while the first request's HTTP call waits.
        tile = default("vae_tile")
        choose_vae_backend(files.vae, tile, tile, tile, default("vae_overlap"), tiling=True, torch_tile=None)
    queue = JobQueue(AnimaPipeline(files, keep_dit=keep), Path(data_dir), max_queue=max_queue,
                     checkpoint_every=checkpoint_every, engine=engine)
    app = Server(queue, default_cache=cache, max_side=max_side, max_steps=max_steps, model_name=files.dit.stem,
                 engine=engine, api_key=api_key, api_auth=api_auth, lora_dir=lora_dir,
                 native_size=trained_image_size(files.dit)).app()
    if not loopback and not (api_key or api_auth):
        click.echo(f"warning: listening on {host} without authentication: anyone who reaches it can use it",
                   err=True)
    click.echo(f"anima-rknn serving {files.dit.name} on http://{host}:{port}/ (data in {data_dir})", err=True)
    queue.start()
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        queue.close()

"""`anima-rknn serve`: the HTTP server (AUTOMATIC1111 and OpenAI APIs, native jobs) for one model set."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import click

from ..core.cpu_speed import resolve_dtype
from ..engine.vae_auto import choose_vae_backend
from ..errors import AnimaError
from ..generation.pipeline import MAX_SIDE, MAX_STEPS, AnimaPipeline, GenerationParams
from ..model.model_set import resolve
from ..sampling.caches import CACHE_NAMES
from . import cli
from .options import dtype_option, lora_dir_option, model_options, rknn_options, rknn_settings


@cli.command("serve")
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=7860, show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False), default="anima-server", show_default=True,
              help="Jobs, results and resume states; a restarted server picks its jobs up from here.")
@click.option("--max-queue", type=click.IntRange(1, 1000), default=16, show_default=True,
              help="Waiting jobs at most; beyond it requests get HTTP 429.")
@click.option("--cache", type=click.Choice(CACHE_NAMES), default="none", show_default=True,
              help="Step cache for requests that do not choose one.")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None,
              help="Write a running job's resume state every N steps. Default: after every computed step once "
                   "a job takes over a minute.")
@click.option("--max-side", type=click.IntRange(16, MAX_SIDE), default=1024, show_default=True,
              help="Largest width or height a request may ask for.")
@click.option("--max-steps", type=click.IntRange(1, MAX_STEPS), default=150, show_default=True,
              help="Most steps a request may ask for.")
@dtype_option()
@click.option("--backend", default="torch", show_default=True, help="torch | onnx | rknn.")
@click.option("--subgraphs", type=click.Path(file_okay=False), default=None)
@click.option("--keep-models/--no-keep-models", default=None,
              help="Keep the DiT loaded between jobs (faster), or load each stage per job as the CLI does (least "
                   "memory). Default: keep, except on the rknn backend (the board's 8 GB).")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' (OpenAI clients send it).")
@click.option("--api-auth", default=None, help="Require HTTP basic auth USER:PASS (as WebUI's --api-auth).")
@rknn_options
@lora_dir_option
def serve(model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, host, port, data_dir, max_queue, cache,
          checkpoint_every, max_side, max_steps, dtype, backend, subgraphs, keep_models, api_key, api_auth,
          rknn_runtime, rknn_budget, rknn_core_mask, lora_dir) -> None:
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
    keep = backend != "rknn" if keep_models is None else keep_models
    engine = {"dtype": resolve_dtype(dtype), "backend": backend,  # dtype probed once here, not per request
              "subgraphs": Path(subgraphs) if subgraphs else None,
              "rknn": rknn_settings(rknn_runtime, rknn_budget, rknn_core_mask)}
    # Requests decode with --vae-backend auto at the default tile: probe (and export its ONNX set) now, not while
    # the first request's HTTP call waits.
    choose_vae_backend(files.vae, GenerationParams.vae_tile, GenerationParams.vae_tile, GenerationParams.vae_tile,
                       GenerationParams.vae_overlap, tiling=True, torch_tile=None)
    queue = JobQueue(AnimaPipeline(files, keep_dit=keep), Path(data_dir), max_queue=max_queue,
                     checkpoint_every=checkpoint_every, engine=engine)
    app = Server(queue, default_cache=cache, max_side=max_side, max_steps=max_steps, model_name=files.dit.stem,
                 engine=engine, api_key=api_key, api_auth=api_auth, lora_dir=lora_dir).app()
    if not loopback and not (api_key or api_auth):
        click.echo(f"warning: listening on {host} without authentication: anyone who reaches it can use it",
                   err=True)
    click.echo(f"anima-rknn serving {files.dit.name} on http://{host}:{port}/ (data in {data_dir})", err=True)
    queue.start()
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        queue.close()

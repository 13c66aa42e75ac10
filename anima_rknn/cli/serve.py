"""`anima-rknn serve`: the HTTP server (AUTOMATIC1111 and OpenAI APIs, native jobs) for one model set.

Before any model is loaded it takes its port (the bound socket is handed to uvicorn: no other process can take
the port between the check and the serving) and locks its data dir for its whole life (a second server there
would queue the first one's running job again and run it twice); either taken is one line, exit 1.
Credentials can come from the command line, from ANIMA_API_KEY / ANIMA_API_AUTH, or from a file only its owner
can read: every local user sees a process's command line (ps), not its environment or a private file.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import stat
from pathlib import Path

import click
from click.core import ParameterSource

from ..core.cpu_speed import AUTO, resolve_dtype
from ..core.files import Unreadable, held_folder, read_small_file
from ..engine.vae_auto import choose_vae_backend
from ..engine.vae_tiles import DEFAULT_VAE_OVERLAP, DEFAULT_VAE_TILE
from ..errors import AnimaError
from ..generation.params import MAX_SIDE, MAX_STEPS, SERVER_SETTINGS, build, default
from ..generation.pipeline import AnimaPipeline
from ..model.model_set import ModelFiles, resolve
from ..sampling.caches import CACHE_NAMES
from .group import cli
from .options import F, lora_dir_option, model_options, setting_options, setting_values

BACKLOG = 2048  # uvicorn's own default
MAX_SECRET_BYTES = 4096
DATA_DIR_BUSY = ("another anima-rknn serve is using the data dir {folder}: stop it, or give this one its own "
                 "--data-dir")
_HOST_NAME = re.compile(r"[a-z0-9_.-]+|\[?[0-9a-f:.]+\]?", re.IGNORECASE)  # a name or an address, no port


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening (connections wait in its backlog until uvicorn serves)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # As uvicorn binds: a restarted server need not wait out the last one's TIME_WAIT connections. Listening at
    # once matters: two sockets with SO_REUSEADDR may share a port until one of them listens.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        busy = " (another server is using it: stop it, or choose another --port)" if e.errno == errno.EADDRINUSE else ""
        raise AnimaError(f"cannot listen on {host}:{port}: {e.strerror or e}{busy}") from None
    return sock


def _data_dir(data_dir: Path) -> Path:
    """The data dir, made if needed (held_folder's opener: the job store fills it once the lock is held)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AnimaError(f"cannot use {data_dir} as the data dir: {e.strerror or e}") from None
    return data_dir


def _secret_file(path: str, option: str) -> str:
    """The one line of a file only its owner may read (a group- or world-readable secret is no secret)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise AnimaError(f"{option} {path}: {e.strerror}") from None
    if stat.S_ISREG(mode) and mode & 0o077:
        raise AnimaError(f"{option} {path} is open to other users (mode {stat.S_IMODE(mode):o}): chmod 600 it")
    try:
        lines = read_small_file(path, MAX_SECRET_BYTES).decode("utf-8").splitlines()
    except Unreadable as e:
        raise AnimaError(f"{option} {path}: {e}") from None
    except UnicodeDecodeError:
        raise AnimaError(f"{option} {path} is not UTF-8 text") from None
    if len(lines) != 1 or not lines[0]:
        raise AnimaError(f"{option} {path} must hold one line, the secret")
    return lines[0]


def _secret(ctx: click.Context, name: str, value: str | None, path: str | None) -> str | None:
    """--NAME (or its environment variable) or --NAME-file: the command line over the environment."""
    option = f"--{name.replace('_', '-')}"
    if path is not None:
        if value is not None and ctx.get_parameter_source(name) is not ParameterSource.ENVIRONMENT:
            raise AnimaError(f"give {option} or {option}-file, not both")
        return _secret_file(path, f"{option}-file")
    if value is not None and not value:
        raise AnimaError(f"{option} must not be empty")
    return value


def several_models(f: F) -> F:
    """model_options with --model repeatable: serve runs every model given (folders, hub ids or DiT files)."""
    f = model_options(f)
    for param in f.__click_params__:
        if param.name == "model":
            param.multiple = True
            param.help += " Give it more than once to serve several models (folders or DiT .safetensors files)."
    return f


def _served_models(models: tuple[str, ...], dit: str | None, **parts: str | None) -> dict[str, ModelFiles]:
    """The model sets to serve, by name (the DiT's stem). One --model (or none) is resolved as every command
    resolves it; several are each a model folder (or hub id), or a DiT file whose other parts are the flags'
    (--text-encoder, --vae, the tokenizers) or else the first folder's."""
    if len(models) <= 1 and not (models and Path(models[0]).is_file()):
        files = resolve(models[0] if models else None, dit=dit, **parts)
        return {files.dit.stem: files}
    if dit is not None:
        raise AnimaError("with several models give each DiT as its own --model, not --dit")
    base = next((model for model in models if not Path(model).is_file()), None)
    served: dict[str, ModelFiles] = {}
    for model in models:
        files = resolve(base, dit=model, **parts) if Path(model).is_file() else resolve(model, **parts)
        if files.dit.stem in served:
            raise AnimaError(f"two --model DiTs are both named {files.dit.stem} ({served[files.dit.stem].dit} and "
                             f"{files.dit}): give each its own file name, which is the name clients choose it by")
        served[files.dit.stem] = files
    return served


def _allowed_hosts(text: str | None) -> tuple[str, ...]:
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    for name in names:
        if name != "*" and not _HOST_NAME.fullmatch(name):
            raise AnimaError(f"--allowed-hosts takes host names or addresses without a port (any port is taken), "
                             f"or *; got {name[:60]!r}")
    return names


@cli.command("serve")
@several_models
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
@click.option("--keep-jobs", type=click.IntRange(1, 1_000_000), default=1000, show_default=True,  # jobs.KEEP_JOBS
              help="Jobs the store keeps: past it the oldest finished ones go, with their images and states.")
@setting_options(*SERVER_SETTINGS)
@click.option("--keep-models/--no-keep-models", default=None,
              help="Keep the DiT loaded between jobs (faster), or load each stage per job as the CLI does (least "
                   "memory). Default: keep, except on the rknn backend (the board's 8 GB).")
@click.option("--allowed-hosts", default=None, metavar="NAME,...",
              help="Host names (or addresses) requests may name besides localhost, 127.0.0.1, [::1] and --host "
                   "(bound to 0.0.0.0 or ::, any address too): the machine's name on the network, a reverse "
                   "proxy's. Other Host headers get a 400 (DNS rebinding). * takes any Host.")
@click.option("--api-key", envvar="ANIMA_API_KEY", show_envvar=True, default=None,
              help="Require 'Authorization: Bearer KEY' (OpenAI clients send it). On the command line every local "
                   "user sees it in ps: prefer the environment variable or --api-key-file.")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="Read --api-key from this file (one line; only its owner may read it).")
@click.option("--api-auth", envvar="ANIMA_API_AUTH", show_envvar=True, default=None,
              help="Require HTTP basic auth USER:PASS (as WebUI's --api-auth). As --api-key, prefer the "
                   "environment variable or --api-auth-file.")
@click.option("--api-auth-file", type=click.Path(dir_okay=False), default=None,
              help="Read --api-auth from this file (one line; only its owner may read it).")
@lora_dir_option
@click.pass_context
def serve(ctx, model, dit, text_encoder, vae, qwen_tokenizer, t5_tokenizer, host, port, data_dir, max_queue, cache,
          checkpoint_every, max_side, max_steps, keep_jobs, keep_models, allowed_hosts, api_key, api_key_file, api_auth,
          api_auth_file, lora_dir, **settings) -> None:
    """Serve the model over HTTP until Ctrl-C; a job running then resumes at the next start."""
    import uvicorn

    from ..server.app import build_app
    from ..server.job_queue import JobQueue
    from ..server.runtime import Server

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise AnimaError(f"--host must be an IP address, got {host!r}") from None
    api_key = _secret(ctx, "api_key", api_key, api_key_file)
    api_auth = _secret(ctx, "api_auth", api_auth, api_auth_file)
    if api_auth is not None and ":" not in api_auth:
        raise AnimaError("--api-auth must be USER:PASS")
    hosts = _allowed_hosts(allowed_hosts)
    # Before any model loads: a busy port, or a data dir another server holds, is one line now. The lock is taken
    # before the job store opens it (and queues its jobs again).
    with _listen(host, port) as sock, held_folder(lambda: _data_dir(Path(data_dir)), busy=DATA_DIR_BUSY,
                                                  unguarded=lambda warning: click.echo(warning, err=True)):
        served = _served_models(model, dit, text_encoder=text_encoder, vae=vae, qwen_tokenizer=qwen_tokenizer,
                                t5_tokenizer=t5_tokenizer)
        files = next(iter(served.values()))  # the first model: loaded first, the default of every request
        engine = setting_values(settings)  # the server's own settings (SERVER_SETTINGS), the same for every request
        engine["dtype"] = resolve_dtype(engine["dtype"])  # probed once here, not per request
        build(engine).validate()  # a bad server setting is refused now, not in every request
        keep = engine["backend"] != "rknn" if keep_models is None else keep_models
        if engine["vae_backend"] == AUTO:
            # Requests decode with --vae-backend auto, by default at the default tile: probe (and export its ONNX set)
            # now, not while the first request's HTTP call waits.
            tile = DEFAULT_VAE_TILE
            for vae_file in dict.fromkeys(served_files.vae for served_files in served.values()):
                choose_vae_backend(vae_file, tile, tile, tile, DEFAULT_VAE_OVERLAP, tiling=True, torch_tile=None)
        queue = JobQueue(AnimaPipeline(files, keep_dit=keep), Path(data_dir), max_queue=max_queue,
                         checkpoint_every=checkpoint_every, engine=engine, max_side=max_side, max_steps=max_steps,
                         keep_jobs=keep_jobs, models=served)
        # Each model's requests default to the size it records it was trained at (the demo model's 64), else 512.
        app = build_app(Server(queue, default_cache=cache, max_side=max_side, max_steps=max_steps,
                               model_name=files.dit.stem, engine=engine, api_key=api_key, api_auth=api_auth,
                               lora_dir=lora_dir, bind_host=host, allowed_hosts=hosts))
        if not address.is_loopback and not (api_key or api_auth):
            click.echo(f"warning: listening on {host} without authentication: anyone who reaches it can use it",
                       err=True)
        if address.is_unspecified and not hosts:
            click.echo("note: requests that name this machine by a host name, not an address, are refused (DNS "
                       "rebinding): allow its names with --allowed-hosts", err=True)
        shown_host = f"[{host}]" if address.version == 6 else host
        names = ", ".join(served_files.dit.name for served_files in served.values())
        click.echo(f"anima-rknn serving {names} on http://{shown_host}:{port}/ (data in {data_dir})", err=True)
        queue.start()
        try:
            uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
        finally:
            queue.close()

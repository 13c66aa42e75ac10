"""Golden outputs of the user-facing CLI and server: prove that a refactor changed no behaviour.

`record` runs a fixed list of small cases through the real command line (`python -m anima_rknn ...`, with this
interpreter) and a real `anima_rknn serve` process spoken to over HTTP, and stores what a user gets: every PNG
(compared byte for byte) and every JSON record (stdout of `--json`, report.json, results.jsonl, HTTP bodies, exit
codes, one-line errors), with the fields that change from run to run masked (VOLATILE_KEYS, TIMING_OBJECTS) and
the run's own temporary folder, the package's folder and the server's random job ids replaced by placeholders.
`check` runs the same cases into a temporary folder and compares them with a recorded set: one line per case,
OK or exactly what differs (the JSON path of each field, or whether a PNG differs in its pixels or only in its
text chunks), and exit code 1 on any difference.

It imports nothing from anima_rknn: the code under test is whichever `python -m anima_rknn` finds, so the same
script works before and after the package's modules move. Record on the commit before the refactor, check after:

    git worktree add /tmp/golden-old <commit before>        # the original code, left untouched
    cd /tmp   # outside the repository: Python puts the current folder first on its path (its anima_rknn would win)
    PYTHONPATH=/tmp/golden-old $REPO/.venv/bin/python $REPO/benchmarks/golden_outputs.py record /tmp/golden
    PYTHONPATH=/tmp/golden-old $REPO/.venv/bin/python $REPO/benchmarks/golden_outputs.py check /tmp/golden  # stable?
    $REPO/.venv/bin/python $REPO/benchmarks/golden_outputs.py check /tmp/golden        # the refactored tree

Everything runs on the shipped demo model (64x64) or a `make-tiny` set at 64x64, a few steps each, with
OMP_NUM_THREADS=1 and a private XDG_CACHE_HOME (set for every child process, so runs do not depend on this
machine's probe caches): about 3 minutes of CPU time (some 20 child processes, each importing torch),
5-7 minutes of wall time on a busy 2-core machine. The inputs a case takes from the package (the demo
LoRA) are copied into OUTDIR/inputs by `record`, and `check` uses those copies.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

JSON = Any

# ---- what is volatile ----------------------------------------------------------------------------------------

# Keys whose values are masked wherever they appear in a record: wall times, memory, host names and pids.
VOLATILE_KEYS = frozenset({
    "job_s",                      # batch: a job's wall time on its worker (also inside "timings")
    "eta_s",                      # server job status: estimated time left
    "eta_relative",               # A1111 /progress: the same
    "created",                    # server job status and OpenAI answer: creation time (epoch seconds)
    "peak_rss_mb",                # bench report: peak resident memory
    "encode_s",                   # bench report's "encode" block (generate's is inside "timings")
    "timings_s",                  # bench report: denoise / decode / total times, min, median, all
    "step_times_s",               # bench report: every step's time
    "speedup",                    # bench report's vs_baseline (denoise, end_to_end) and the server's compare
    "measured_over_ideal",        # bench report: measured speedup / ideal speedup
    "denoise_speedup_median",     # bench report aggregate
    "end_to_end_speedup_median",  # bench report aggregate
    "denoise_s",                  # server compare: {"cached": s, "baseline": s} (also inside "timings")
    "baseline_denoise_s_median",  # bench report: the uncached side's median denoise time per sampler
    "worker",                     # batch and bench: host:pid of the worker
    "stages",                     # generate's "timings" and bench's sides: seconds per stage of a pass
})
# Objects all of whose keys ending in "_s" are masked: generate --json's, a batch record's, a server job's
# "timings" (encode_s, denoise_s, decode_s, total_s, job_s). The keys themselves are kept and compared.
TIMING_OBJECTS = frozenset({"timings"})
# A job's status right after POST /api/jobs or /compare: whether the one worker thread has taken it yet is a race.
RACY_SUBMIT_KEYS = frozenset({"state", "queue_position", "step"})
MASK = "<volatile>"

PROMPT = "a red circle on a blue background, top left"
BASE = ("--dtype", "fp32", "--backend", "torch")  # an explicit dtype: --dtype auto measures this CPU
TORCH_VAE = ("--vae-backend", "torch")           # auto's probe is a measurement too (unused at 64x64; case vae-auto)
STEPS = "10"                                     # spectrum computes 7 of 10 (warm-up 4), auto 8, reuse 7
SERVER_START_S = 180.0
CLI_TIMEOUT_S = 300.0


class CaseError(Exception):
    """A case could not run as planned (a command failed, a server did not start): reported as FAIL."""


# ---- one case's work folder ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Workspace:
    """Where a case runs (`work`, the child processes' working directory, so output paths are relative) and
    where what it keeps goes (`store`: record.json and the PNGs)."""

    work: Path
    store: Path
    inputs: Path      # the run's copies of the recorded inputs (the demo LoRA)
    env: dict[str, str]
    package: str      # the folder of the anima_rknn package under test, masked as <package>

    def cli(self, *args: str | Path, expect: int = 0,
            timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """`python -m anima_rknn ARGS` in the work folder; a different exit code is a CaseError."""
        command = [sys.executable, "-m", "anima_rknn", *map(str, args)]
        done = subprocess.run(command, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != expect:
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            raise CaseError(f"{' '.join(map(str, args[:2]))}: exit {done.returncode}, expected {expect}: {tail}")
        return done

    def cli_json(self, *args: str | Path) -> JSON:
        return json.loads(self.cli(*args).stdout)

    def keep_png(self, path: Path | str, name: str | None = None) -> str:
        """Store a PNG of the work folder for a byte comparison; the record holds "png:NAME"."""
        source = self.work / path
        name = name or Path(path).name
        if source.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
            raise CaseError(f"{path} is not a PNG")
        shutil.copyfile(source, self.store / name)
        return f"png:{name}"

    def keep_png_bytes(self, data: bytes, name: str) -> str:
        if data[:8] != b"\x89PNG\r\n\x1a\n":
            raise CaseError(f"{name}: not a PNG ({data[:40]!r})")
        (self.store / name).write_bytes(data)
        return f"png:{name}"

    def normalized(self, value: JSON, ids: dict[str, str] | None = None, extra: frozenset[str] = frozenset()) -> JSON:
        """`value` with VOLATILE_KEYS (and `extra`) masked and paths / job ids replaced by placeholders."""
        replacements = [(str(self.work.parent.resolve()), "<run>"), (str(self.work.parent), "<run>"),
                        (self.package, "<package>"), *((ids or {}).items())]
        return mask(value, replacements, extra)


def mask(value: JSON, replacements: list[tuple[str, str]], extra: frozenset[str] = frozenset(),
         in_timings: bool = False) -> JSON:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in VOLATILE_KEYS or key in extra or (in_timings and key.endswith("_s")):
                out[key] = MASK
            else:
                out[key] = mask(item, replacements, extra, key in TIMING_OBJECTS)
        return out
    if isinstance(value, list):
        return [mask(item, replacements, extra) for item in value]
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
        return value
    return value


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_pixels(a: Path, b: Path) -> bool:
    from PIL import Image

    with Image.open(a) as first, Image.open(b) as second:
        return first.size == second.size and first.mode == second.mode and first.tobytes() == second.tobytes()


# ---- the cases -----------------------------------------------------------------------------------------------

def generate_case(ws: Workspace, *options: str, out: str = "out.png") -> JSON:
    """generate --json with `options`: the JSON record and the PNG."""
    report = ws.cli_json("generate", *options, "-o", out, "--json")
    return {"stdout": ws.normalized(report), "png": ws.keep_png(out)}


def cache_case(policy: str, preview: bool = False) -> Callable[[Workspace], JSON]:
    """generate --cache POLICY; with `preview`, also --preview (a step listener: the image is the same), whose
    last projection preview PNG is kept too."""
    def run(ws: Workspace) -> JSON:
        watch = ("--preview", "live.png", "--preview-every", "3") if preview else ()
        record = generate_case(ws, "-p", PROMPT, "--steps", STEPS, "--cache", policy, *BASE, *TORCH_VAE, *watch)
        computed, steps = record["stdout"]["computed_steps"], record["stdout"]["steps"]
        if policy != "none" and not len(computed) < steps:
            raise CaseError(f"cache {policy} computed every step ({computed}): the case does not exercise it")
        if preview:
            record["preview_png"] = ws.keep_png("live.png")
        return record
    run.__name__ = f"case_generate_{policy}"
    return run


def case_auto_check_verify(ws: Workspace) -> JSON:
    """--cache auto with a budget, check=1 (the partial pass moves the plan) and verify=1 (a flagged run is re-run
    uncached from its first forecast): the two optional parts of auto, at two seeds."""
    records = {}
    for seed in ("2", "4"):  # seed 2: flagged, re-run from call 3; seed 4: not flagged
        records[seed] = generate_case(ws, "-p", PROMPT, "--steps", STEPS, "--seed", seed, "--cache", "auto",
                                      "--cache-option", "budget=5,check=1,verify=1", *BASE, *TORCH_VAE,
                                      out=f"auto_{seed}.png")
    return records


def case_vae_backend_auto(ws: Workspace) -> JSON:
    """The default --vae-backend auto: a 64x64 image is smaller than the 512-px tile, so torch without probing."""
    record = generate_case(ws, "-p", PROMPT, "--steps", STEPS, "--cache", "spectrum", *BASE)
    record["probe_cache_written"] = (ws.work.parent / "cache" / "anima-rknn" / "vae-backend-probe.json").exists()
    return record


def case_onnx_backend(ws: Workspace) -> JSON:
    """export-onnx of the demo model at 64x64, then generate on ONNX Runtime with that set."""
    ws.cli("export-onnx", "--out", "set")
    manifest = json.loads((ws.work / "set" / "manifest.json").read_text())
    record = generate_case(ws, "-p", PROMPT, "--steps", STEPS, "--cache", "spectrum", "--dtype", "fp32",
                           "--backend", "onnx", "--subgraphs", "set", *TORCH_VAE)
    return {"manifest": ws.normalized(manifest), "set_files": sorted(p.name for p in (ws.work / "set").iterdir()),
            **record}


def case_tiny_model(ws: Workspace) -> JSON:
    """make-tiny (deterministic: every file's sha256 is recorded) and generate from that set at 64x64."""
    ws.cli("make-tiny", "--out", "tiny")
    files = {str(p.relative_to(ws.work / "tiny")): sha256(p)
             for p in sorted((ws.work / "tiny").rglob("*")) if p.is_file()}
    record = generate_case(ws, "--model", "tiny", "-p", PROMPT, "-W", "64", "-H", "64", "--steps", "8",
                           "--cache", "spectrum", *BASE, *TORCH_VAE)
    return {"make_tiny_files": files, **record}


def case_lora(ws: Workspace) -> JSON:
    """The shipped demo LoRA at scale 0.8 (its copy in OUTDIR/inputs)."""
    lora = ws.inputs / "large-shapes.safetensors"
    local = ws.work / "loras"
    local.mkdir()
    shutil.copyfile(lora, local / lora.name)
    return generate_case(ws, "-p", "a large red circle on a blue background, center", "--steps", STEPS,
                         "--cache", "spectrum", "--lora", f"loras/{lora.name}:0.8", *BASE, *TORCH_VAE)


def state_step(path: Path) -> int:
    """The step a resume state was written after (its JSON record in the safetensors metadata)."""
    with path.open("rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return json.loads(header["__metadata__"]["anima_rknn.resume"])["step"]


def case_resume(ws: Workspace) -> JSON:
    """A run that checkpoints once (--checkpoint-every 6 of 10 steps); its state is hard-linked the moment it
    appears (the run removes its own when it finishes), so the resume point is exactly step 6, not wherever a
    signal landed. The uninterrupted image and the one resumed from that state must be the same picture."""
    full = ("-p", PROMPT, "--steps", STEPS, "--cache", "spectrum", *BASE, *TORCH_VAE)
    state, kept = ws.work / "full.png.state", ws.work / "resumed.png.state"
    for _attempt in range(3):
        for leftover in (ws.work / "full.png", state, kept):
            leftover.unlink(missing_ok=True)
        command = [sys.executable, "-m", "anima_rknn", "generate", *full, "--checkpoint-every", "6",
                   "--state", state.name, "-o", "full.png", "--json"]
        with (ws.work / "full.log").open("w") as log:
            process = subprocess.Popen(command, cwd=ws.work, env=ws.env, stdout=subprocess.PIPE, stderr=log,
                                       text=True)
            while process.poll() is None and not kept.exists():
                try:
                    os.link(state, kept)
                except FileNotFoundError:
                    time.sleep(0.001)
            stdout, _ = process.communicate(timeout=CLI_TIMEOUT_S)
        if process.returncode != 0:
            raise CaseError(f"generate --checkpoint-every: exit {process.returncode}: "
                            f"{(ws.work / 'full.log').read_text()[-400:]}")
        if kept.exists():
            break
    else:
        raise CaseError("the checkpoint of step 6 was never seen: the run finished before it could be linked")
    step = state_step(kept)
    uninterrupted = json.loads(stdout)
    resumed = ws.cli_json("generate", "--resume", kept.name, "--json")
    return {"state_step": step, "uninterrupted": ws.normalized(uninterrupted), "uninterrupted_png":
            ws.keep_png("full.png"), "resumed": ws.normalized(resumed), "resumed_png": ws.keep_png("resumed.png"),
            "state_removed": not kept.exists(),
            "resumed_equals_uninterrupted": same_pixels(ws.work / "full.png", ws.work / "resumed.png")}


def case_batch(ws: Workspace) -> JSON:
    """batch: a text file of 2 prompts x --seeds 1-2 into a folder; every PNG and results.jsonl record."""
    (ws.work / "prompts.txt").write_text(f"{PROMPT}\na green square on a white background, center\n")
    ws.cli("batch", "prompts.txt", "--seeds", "1-2", "--steps", "8", "--cache", "spectrum", *BASE, *TORCH_VAE,
           "--out", "sweep")
    folder = ws.work / "sweep"
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    return {"files": sorted(p.name for p in folder.iterdir()),
            "results": [ws.normalized(r) for r in records],
            "pngs": [ws.keep_png(f"sweep/{r['image']}", f"batch_{r['image']}") for r in records]}


def case_bench(ws: Workspace) -> JSON:
    """bench --cache spectrum --seeds 1,2: report.json (times masked) and the generated images; not the plots
    (matplotlib PNGs) nor report.md (times in its text)."""
    done = ws.cli("bench", "--prompt", PROMPT, "--steps", STEPS, "--cache", "spectrum", "--seeds", "1,2", *BASE,
                  *TORCH_VAE, "--out", "report", "--json")
    folder = ws.work / "report"
    report = json.loads((folder / "report.json").read_text())
    images = [entry["image"] for seed in report["seeds"]
              for entry in [seed["baseline"], *seed["cached"].values()]]
    return {"stdout_is_report": json.loads(done.stdout) == report,
            "files": sorted(p.name for p in folder.iterdir()),
            "report": ws.normalized(report),
            "pngs": [ws.keep_png(f"report/{name}", f"bench_{name}") for name in images]}


def case_server_vae_set(ws: Workspace) -> JSON:
    """serve with a VAE set (export-vae of the demo model, its default tile) on ONNX Runtime: a txt2img that leaves
    the tile alone decodes in the set's tiles (issue 41: the tile default reached through the run plan)."""
    ws.cli("export-vae", "--out", "vae-set")
    server = Server(ws, "--data-dir", "data", "--dtype", "fp32", "--vae-backend", "onnx", "--vae-subgraphs",
                    "vae-set")
    try:
        status, _, data = server.request("POST", "/sdapi/v1/txt2img", {
            "prompt": PROMPT, "steps": 8, "width": 64, "height": 64, "seed": 5, "cfg_scale": 4.0,
            "sampler_name": "Euler", "cache": "spectrum"})
    finally:
        server.stop()
    answer = json.loads(data)
    answer["images"] = [ws.keep_png_bytes(base64.b64decode(image), f"server_vae_set_{i}.png")
                        for i, image in enumerate(answer.get("images", []))]
    answer["info"] = json.loads(answer["info"]) if isinstance(answer.get("info"), str) else answer.get("info")
    return {"status": status, "answer": ws.normalized(answer)}


def case_cli_errors(ws: Workspace) -> JSON:
    """Refusals: exit code and the one error line."""
    def refused(*args: str) -> JSON:
        done = ws.cli(*args, expect=1)
        return {"args": list(args), "stdout": done.stdout, "stderr": ws.normalized(done.stderr.strip().splitlines())}

    (ws.work / "bad.jsonl").write_text(json.dumps({"prompt": "x", "steps": 0}) + "\n")
    return {"bad_width": refused("generate", "-p", "x", "-W", "7", *BASE, "-o", "x.png"),
            "bad_job_line": refused("batch", "bad.jsonl", *BASE, "--out", "sweep"),
            "left_behind": sorted(p.name for p in ws.work.iterdir())}


def case_help(ws: Workspace) -> JSON:
    """The command list and generate's options (click wraps to COLUMNS, fixed in the environment)."""
    return {"main": ws.cli("--help").stdout.splitlines(), "generate": ws.cli("generate", "--help").stdout.splitlines()}


def case_package_data(ws: Workspace) -> JSON:
    """sha256 of the files the package ships besides code (demo model, LoRA, tokenizers, page), named by their
    folder and file name only, so moved folders do not count as a difference."""
    root = Path(ws.package)
    shipped = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts:
            shipped[f"{path.parent.name}/{path.name}"] = sha256(path)
    return shipped


class Server:
    """A real `python -m anima_rknn serve` on a free port of 127.0.0.1, spoken to with urllib."""

    def __init__(self, ws: Workspace, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = (ws.work / "serve.log").open("w")
        command = [sys.executable, "-m", "anima_rknn", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                   *args]
        self.process = subprocess.Popen(command, cwd=ws.work, env=ws.env, stdout=self.log, stderr=subprocess.STDOUT)
        self.ws = ws
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if self.process.poll() is not None:
                raise CaseError(f"serve exited {self.process.returncode}: {self.log_tail()}")
            try:
                if self.request("GET", "/sdapi/v1/options")[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise CaseError(f"serve did not answer within {SERVER_START_S:.0f} s: {self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self) -> str:
        self.log.flush()
        return (self.ws.work / "serve.log").read_text(errors="replace")[-600:]

    def request(self, method: str, path: str, body: JSON = None, raw: bytes | None = None,
                timeout: float = 120.0) -> tuple[int, str, bytes]:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.headers.get("content-type", ""), answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("content-type", ""), e.read()

    def json(self, method: str, path: str, body: JSON = None, raw: bytes | None = None) -> tuple[int, JSON]:
        status, kind, data = self.request(method, path, body, raw)
        if "json" not in kind:
            raise CaseError(f"{method} {path}: {status} {kind}, not JSON: {data[:200]!r}")
        return status, json.loads(data)

    def until(self, path: str, done: Callable[[JSON], bool], timeout: float = 240.0) -> JSON:
        """GET `path` until done(body); only the final answer is recorded (the ones before it are timing)."""
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.json("GET", path)
            if status == 200 and done(body):
                return body
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise CaseError(f"GET {path}: still {status} {str(body)[:200]} ({self.log_tail()})")
            time.sleep(0.1)

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; SIGKILL if it does not end."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def case_server(ws: Workspace) -> JSON:
    """serve on the demo model: the A1111, OpenAI and native APIs, compare-with-baseline, bad requests."""
    server = Server(ws, "--data-dir", "data", "--dtype", "fp32")
    calls: list[JSON] = []   # every request with its answer, in order
    ids: list[str] = []      # job ids in the order they are learned; placeholders <job1>, <job2>, ...

    def learn(job_id: str) -> None:
        if job_id not in ids:
            ids.append(job_id)

    def call(name: str, method: str, path: str, body: JSON = None, raw: bytes | None = None,
             racy: frozenset[str] = frozenset()) -> JSON:
        status, kind, data = server.request(method, path, body, raw)
        entry: JSON = {"name": name, "request": f"{method} {path}", "status": status, "type": kind}
        if "json" in kind:
            entry["body"] = json.loads(data)
        elif kind.startswith("image/png"):
            entry["body"] = ws.keep_png_bytes(data, f"server_{name}.png")
        elif kind.startswith("text/event-stream"):
            entry["body"] = [json.loads(line[len("data: "):]) for line in data.decode().splitlines()
                             if line.startswith("data: ")]
        else:
            entry["body"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        entry["racy"] = sorted(racy)
        calls.append(entry)
        return entry["body"]

    try:
        page = call("page", "GET", "/")
        _, _, html = server.request("GET", "/")
        page["has_form"] = b"<form" in html
        for name, path in [("samplers", "/sdapi/v1/samplers"), ("sd_models", "/sdapi/v1/sd-models"),
                           ("schedulers", "/sdapi/v1/schedulers"), ("options", "/sdapi/v1/options"),
                           ("progress_idle", "/sdapi/v1/progress"), ("openai_models", "/v1/models")]:
            call(name, "GET", path)

        # A1111 txt2img: 2 images (seeds 5, 6), spectrum; the base64 PNGs are stored as files.
        answer = call("txt2img", "POST", "/sdapi/v1/txt2img",
                      {"prompt": PROMPT, "steps": 8, "width": 64, "height": 64, "seed": 5, "cfg_scale": 4.0,
                       "sampler_name": "Euler", "batch_size": 2, "cache": "spectrum"})
        answer["images"] = [ws.keep_png_bytes(base64.b64decode(image), f"server_txt2img_{i}.png")
                            for i, image in enumerate(answer.get("images", []))]
        answer["info"] = json.loads(answer["info"]) if isinstance(answer.get("info"), str) else answer.get("info")

        # OpenAI images.
        answer = call("openai_generation", "POST", "/v1/images/generations",
                      {"prompt": "a blue square", "size": "64x64", "seed": 7, "steps": 8,
                       "response_format": "b64_json"})
        for i, item in enumerate(answer.get("data", [])):
            item["b64_json"] = ws.keep_png_bytes(base64.b64decode(item["b64_json"]), f"server_openai_{i}.png")

        # Native jobs: submit, poll, image, preview (gone once finished), events of a finished job.
        job = call("job_submit", "POST", "/api/jobs",
                   {"prompt": "a green square on a white background, center", "steps": 8, "width": 64,
                    "height": 64, "seed": 3, "cache": "spectrum"}, racy=RACY_SUBMIT_KEYS)
        learn(job["id"])
        final = server.until(f"/api/jobs/{job['id']}", lambda body: body["state"] in ("completed", "failed"))
        calls.append({"name": "job_done", "request": "GET /api/jobs/ID (polled until finished)", "status": 200,
                      "type": "application/json", "body": final, "racy": []})
        call("job_image", "GET", f"/api/jobs/{job['id']}/image")
        call("job_preview_after", "GET", f"/api/jobs/{job['id']}/preview")
        call("job_events_after", "GET", f"/api/jobs/{job['id']}/events")

        # Compare with baseline: the uncached twin, the measures, the difference map.
        twin = call("compare_submit", "POST", f"/api/jobs/{job['id']}/compare", racy=RACY_SUBMIT_KEYS)
        learn(twin["id"])
        measured = server.until(f"/api/jobs/{job['id']}/compare/{twin['id']}", lambda body: body["ready"])
        calls.append({"name": "compare_ready", "request": "GET /api/jobs/ID/compare/TWIN (polled until ready)",
                      "status": 200, "type": "application/json", "body": measured, "racy": []})
        call("compare_difference", "GET", f"/api/jobs/{job['id']}/compare/{twin['id']}/difference")

        listing = call("jobs_list", "GET", "/api/jobs")
        for entry in reversed(listing):  # oldest first: the txt2img and OpenAI jobs
            learn(entry["id"])
        uncached = next(entry["id"] for entry in listing if entry["params"]["cache"] == "none"
                        and entry["id"] != twin["id"])
        call("progress_after", "GET", "/sdapi/v1/progress")
        call("interrupt_idle", "POST", "/sdapi/v1/interrupt")

        # Bad requests: a 4xx and a one-line message each.
        good = {"prompt": "x", "steps": 4, "width": 64, "height": 64, "seed": 1}
        for name, method, path, body, raw in [
            ("bad_json", "POST", "/sdapi/v1/txt2img", None, b"{not json"),
            ("not_an_object", "POST", "/api/jobs", [1, 2], None),
            ("unknown_sampler", "POST", "/sdapi/v1/txt2img", {**good, "sampler_name": "DPM++ 2M"}, None),
            ("width_7", "POST", "/sdapi/v1/txt2img", {**good, "width": 7}, None),
            ("steps_0", "POST", "/api/jobs", {**good, "steps": 0}, None),
            ("unknown_cache", "POST", "/api/jobs", {**good, "cache": "bogus"}, None),
            ("seed_text", "POST", "/api/jobs", {**good, "seed": "abc"}, None),
            ("bad_size", "POST", "/v1/images/generations", {"prompt": "x", "size": "64"}, None),
            ("url_format", "POST", "/v1/images/generations", {"prompt": "x", "size": "64x64",
                                                             "response_format": "url"}, None),
            ("too_many_images", "POST", "/sdapi/v1/txt2img", {**good, "batch_size": 9}, None),
        ]:
            call(name, method, path, body, raw)
        call("unknown_job", "GET", "/api/jobs/0123456789abcdef")
        call("compare_uncached", "POST", f"/api/jobs/{uncached}/compare")
    finally:
        server.stop()
    placeholders = {job_id: f"<job{i + 1}>" for i, job_id in enumerate(ids)}
    return [ws.normalized(entry, placeholders, frozenset(entry["racy"])) for entry in calls]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Workspace], JSON]


CASES = [
    *(Case(f"generate-{policy}", cache_case(policy, preview=policy == "spectrum"))
      for policy in ("none", "spectrum", "spectrum-plus", "reuse", "auto")),
    Case("generate-auto-check-verify", case_auto_check_verify),
    Case("generate-vae-auto", case_vae_backend_auto),
    Case("onnx-backend", case_onnx_backend),
    Case("tiny-model", case_tiny_model),
    Case("lora", case_lora),
    Case("resume", case_resume),
    Case("batch", case_batch),
    Case("bench", case_bench),
    Case("server", case_server),
    Case("server-vae-set", case_server_vae_set),
    Case("cli-errors", case_cli_errors),
    Case("help", case_help),
    Case("package-data", case_package_data),
]

# ---- running and comparing -----------------------------------------------------------------------------------

def child_env(run: Path) -> dict[str, str]:
    """The same environment for every run: one thread, a private cache folder, offline, fixed help width."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "COLUMNS": "100",
                "XDG_CACHE_HOME": str(run / "cache"), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "LC_ALL": "C.UTF-8"})
    return env


def package_dir(env: dict[str, str]) -> str:
    code = "import anima_rknn, os; print(os.path.dirname(os.path.abspath(anima_rknn.__file__)))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def find_demo_lora(package: str) -> Path:
    found = sorted(Path(package).rglob("large-shapes.safetensors"))
    if not found:
        raise SystemExit(f"error: no demo LoRA (large-shapes.safetensors) under {package}")
    return found[0]


def run_cases(store: Path, inputs: Path, cases: list[Case], run: Path) -> dict[str, str | None]:
    """Every case into store/<case>/; returns each case's error (None: it ran)."""
    env = child_env(run)
    package = package_dir(env)
    print(f"anima_rknn under test: {package}", file=sys.stderr)
    errors: dict[str, str | None] = {}
    for case in cases:
        work, case_store = run / case.name, store / case.name
        work.mkdir(parents=True)
        case_store.mkdir(parents=True)
        ws = Workspace(work=work, store=case_store, inputs=inputs, env=env, package=package)
        started = time.monotonic()
        try:
            record = case.run(ws)
            (case_store / "record.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            errors[case.name] = None
        except Exception as e:  # any failure of one case is that case's FAIL line, the others still run
            errors[case.name] = f"{type(e).__name__}: {e}"
        print(f"  ran {case.name} in {time.monotonic() - started:.1f} s"
              + ("" if errors[case.name] is None else f": {errors[case.name]}"), file=sys.stderr)
    return errors


def json_differences(old: JSON, new: JSON, path: str = "") -> Iterator[str]:
    """Where two records differ, as JSON paths."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            where = f"{path}.{key}" if path else key
            if key not in new:
                yield f"{where}: missing (was {short(old[key])})"
            elif key not in old:
                yield f"{where}: new field ({short(new[key])})"
            else:
                yield from json_differences(old[key], new[key], where)
    elif isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            yield f"{path}: {len(old)} items, now {len(new)}"
        for i, (a, b) in enumerate(zip(old, new)):
            yield from json_differences(a, b, f"{path}[{i}]")
    elif old != new or type(old) is not type(new):
        yield f"{path}: {short(old)} -> {short(new)}"


def short(value: JSON, limit: int = 100) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def png_difference(old: Path, new: Path) -> str | None:
    if old.read_bytes() == new.read_bytes():
        return None
    from PIL import Image

    with Image.open(old) as a, Image.open(new) as b:
        if a.size != b.size or a.mode != b.mode:
            return f"{old.name}: {a.size} {a.mode} -> {b.size} {b.mode}"
        if a.tobytes() != b.tobytes():
            changed = sum(x != y for x, y in zip(a.tobytes(), b.tobytes()))
            largest = max(abs(x - y) for x, y in zip(a.tobytes(), b.tobytes()))
            return f"{old.name}: pixels differ ({changed} channel values, by up to {largest})"
        texts = sorted(key for key in set(a.info) | set(b.info) if a.info.get(key) != b.info.get(key))
        if not texts:
            return f"{old.name}: same pixels and text chunks, PNG encoding differs"
        return f"{old.name}: same pixels, text chunk {texts[0]!r} differs: " \
               + text_difference(str(a.info.get(texts[0], "")), str(b.info.get(texts[0], "")))


def text_difference(old: str, new: str, context: int = 30) -> str:
    """Both texts around their first difference."""
    at = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y), min(len(old), len(new)))
    start = max(0, at - context)
    return f"{old[start:at + context]!r} -> {new[start:at + context]!r} (at character {at})"


def compare_case(golden: Path, fresh: Path) -> list[str]:
    if not (golden / "record.json").is_file():
        return ["not in the recorded set"]
    if not (fresh / "record.json").is_file():
        return ["no record (the case did not run)"]
    problems = list(json_differences(json.loads((golden / "record.json").read_text()),
                                     json.loads((fresh / "record.json").read_text())))
    old_pngs = {p.name for p in golden.glob("*.png")}
    new_pngs = {p.name for p in fresh.glob("*.png")}
    problems += [f"{name}: PNG missing" for name in sorted(old_pngs - new_pngs)]
    problems += [f"{name}: new PNG" for name in sorted(new_pngs - old_pngs)]
    problems += [d for name in sorted(old_pngs & new_pngs) if (d := png_difference(golden / name, fresh / name))]
    return problems


def record(out: Path) -> int:
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="golden-run-") as tmp:
        run = Path(tmp) / "run"
        inputs = out / "inputs"
        inputs.mkdir()
        shutil.copyfile(find_demo_lora(package_dir(child_env(run))), inputs / "large-shapes.safetensors")
        errors = run_cases(out, inputs, CASES, run)
    failed = {name: error for name, error in errors.items() if error is not None}
    (out / "manifest.json").write_text(json.dumps({
        "cases": [case.name for case in CASES], "python": sys.executable, "pythonpath": os.environ.get("PYTHONPATH"),
        "seconds": round(time.monotonic() - started, 1)}, indent=1) + "\n")
    for name, error in failed.items():
        print(f"FAIL {name}: {error}")
    print(f"recorded {len(CASES) - len(failed)} of {len(CASES)} cases into {out} "
          f"in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


def check(golden: Path, only: list[str], keep: bool) -> int:
    if not (golden / "manifest.json").is_file():
        raise SystemExit(f"error: {golden} holds no recorded set (no manifest.json)")
    recorded = json.loads((golden / "manifest.json").read_text())["cases"]
    unknown = sorted(set(only) - {case.name for case in CASES})
    if unknown:
        raise SystemExit(f"error: no case {', '.join(unknown)}; the cases are {', '.join(c.name for c in CASES)}")
    cases = [case for case in CASES if not only or case.name in only]
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="golden-check-"))
    try:
        errors = run_cases(tmp / "store", golden / "inputs", cases, tmp / "run")
        bad = 0
        for case in cases:
            if errors[case.name] is not None:
                problems = [f"did not run: {errors[case.name]}"]
            else:
                problems = compare_case(golden / case.name, tmp / "store" / case.name)
            bad += bool(problems)
            print(f"OK   {case.name}" if not problems else f"DIFF {case.name}: " + "; ".join(problems[:12])
                  + (f"; ... {len(problems) - 12} more" if len(problems) > 12 else ""))
        if not only:
            for name in sorted(set(recorded) - {case.name for case in CASES}):
                bad += 1
                print(f"DIFF {name}: recorded, but this script has no such case")
        print(f"{len(cases) - bad} of {len(cases)} cases as recorded ({time.monotonic() - started:.0f} s)")
        return 1 if bad else 0
    finally:
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("record", help="run every case and store the results in OUTDIR").add_argument(
        "outdir", type=Path)
    checker = commands.add_parser("check", help="run the cases again and compare with OUTDIR")
    checker.add_argument("outdir", type=Path)
    checker.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    checker.add_argument("--keep", action="store_true", help="keep the temporary run folder")
    args = parser.parse_args()
    if args.command == "record":
        return record(args.outdir)
    return check(args.outdir, args.case, args.keep)


if __name__ == "__main__":
    sys.exit(main())

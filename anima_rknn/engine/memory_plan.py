"""How many RKNN runtime contexts fit in memory at once, and what that costs in reloads.

Each context holds its subgraph's weights and its own activation ("internal") buffer on the NPU side, and
RKNNLite keeps a second copy of the .rknn file in Python memory. All NPU allocations share one ~4 GiB IOMMU
domain, and the board has 8 GB in all, so the full model (84 contexts) never fits. With room for k < 84
contexts, the first k-1 stay open for the whole run (pinned) and the others take turns in the last slot:
a pass then loads 84-k+1 contexts. Plain LRU would be worse: over a repeating cycle longer than the bound
it evicts every context just before it is needed again, so it reloads all 84 on every pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import AnimaError
from ..export.manifest import SUBGRAPH_KINDS, VAE_DECODER_KIND, VAE_ENCODER_KIND

# Activation buffers measured on the RK3588 at full Anima width (spec: rknn.md), scaled linearly from here.
MEASURED_TOKENS = 4096
MEASURED_HIDDEN = 2048
MEASURED_MLP = 8192
MEASURED_ACTIVATION_BYTES = {"self_attn": 227_000_000, "cross_attn": 119_000_000, "mlp": 272_000_000}
NPU_DOMAIN_BYTES = 4 << 30
# Python, torch, NumPy and librknnrt themselves, resident whatever the model: an estimate, not a measurement.
HOST_RUNTIME_BYTES = 768 << 20
# Fixed Anima dimensions of the host-side (CPU, fp32) parts of the DiT.
PATCH_FEATURES = 68
ADALN_LORA = 256
FINAL_FEATURES = 64
CONTEXT_DIM = 1024
CONTEXT_TOKENS = 512
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]I?B?|B)?", re.IGNORECASE)
_SIZE_UNITS = {
    "B": 1,
    **{prefix + "B": 1000 ** (power + 1) for power, prefix in enumerate("KMGT")},
    **{prefix + suffix: 1024 ** (power + 1) for power, prefix in enumerate("KMGT") for suffix in ("", "I", "IB")},
}


@dataclass(frozen=True)
class ContextCost:
    index: int
    kind: str
    weight_bytes: int  # NPU side
    activation_bytes: int  # NPU side, the context's own internal buffer
    file_bytes: int  # host side: RKNNLite keeps the loaded .rknn file in Python memory

    @property
    def npu_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def total_bytes(self) -> int:
        return self.npu_bytes + self.file_bytes


@dataclass(frozen=True)
class MemoryPlan:
    contexts: tuple[ContextCost, ...]
    tokens: int
    host_bytes: int
    budget_bytes: int | None
    activation_source: str  # "compiler" (from the conversion) or "spec-scaled"
    max_resident: int
    peak_bytes: int  # host side + the pinned contexts + the costliest one that takes turns
    npu_peak_bytes: int
    loads_per_pass: int  # steady state, one transformer pass
    releases_per_pass: int

    def describe(self) -> str:
        lines = [
            f"RKNN memory plan: {len(self.contexts)} contexts, {self.tokens} tokens, "
            f"activations {self.activation_source}",
            f"{'kind':<11}{'contexts':>9}{'weights':>12}{'activations':>13}{'file copy':>12}",
        ]
        for kind in SUBGRAPH_KINDS:
            of_kind = [c for c in self.contexts if c.kind == kind]
            if of_kind:
                lines.append(
                    f"{kind:<11}{len(of_kind):>9}{size(max(c.weight_bytes for c in of_kind)):>12}"
                    f"{size(max(c.activation_bytes for c in of_kind)):>13}"
                    f"{size(max(c.file_bytes for c in of_kind)):>12}"
                )
        budget = "none" if self.budget_bytes is None else size(self.budget_bytes)
        lines += [
            f"host side {size(self.host_bytes)}, budget {budget}, NPU domain {size(NPU_DOMAIN_BYTES)}",
            f"resident contexts {self.max_resident} of {len(self.contexts)} "
            f"({pinned_contexts(len(self.contexts), self.max_resident)} pinned): predicted peak "
            f"{size(self.peak_bytes)} (NPU {size(self.npu_peak_bytes)})",
            f"per transformer pass: {self.loads_per_pass} loads, {self.releases_per_pass} releases",
        ]
        return "\n".join(lines)


def size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def parse_size(text: str) -> int:
    """'8GB' (decimal units) or '6GiB' / '6G' (binary) -> bytes."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise AnimaError(f"cannot read {text!r} as a memory size: write e.g. 8GB, 6GiB or 512MB")
    number, unit = match.groups()
    return round(float(number) * _SIZE_UNITS[(unit or "B").upper()])


def weight_bytes(kind: str, hidden: int, mlp: int, context_dim: int = CONTEXT_DIM) -> int:
    """fp16 bytes of a body's Linear weights (q/k norm vectors are negligible)."""
    params = {
        "self_attn": 4 * hidden * hidden,
        "cross_attn": 2 * hidden * hidden + 2 * context_dim * hidden,
        "mlp": 2 * hidden * mlp,
    }[kind]
    return 2 * params


def scaled_activation_bytes(kind: str, hidden: int, mlp: int, tokens: int) -> int:
    width = mlp / MEASURED_MLP if kind == "mlp" else hidden / MEASURED_HIDDEN
    return round(MEASURED_ACTIVATION_BYTES[kind] * tokens / MEASURED_TOKENS * width)


def host_bytes(hidden: int, blocks: int, tokens: int) -> int:
    """fp32 AdaLN/embedding/final weights the CPU keeps, its working arrays, and the runtime itself."""
    params = (
        PATCH_FEATURES * hidden
        + hidden * hidden + hidden * 3 * hidden  # t_embedder
        + blocks * 3 * (hidden * ADALN_LORA + ADALN_LORA * 3 * hidden)  # per-block AdaLN modulation
        + hidden * ADALN_LORA + ADALN_LORA * 2 * hidden + hidden * FINAL_FEATURES  # final layer
    )
    # residual streams and modulated inputs of the cond and uncond passes, plus both contexts
    working = 8 * tokens * hidden + 2 * CONTEXT_TOKENS * CONTEXT_DIM
    return 4 * (params + working) + HOST_RUNTIME_BYTES


def pinned_contexts(count: int, max_resident: int | None) -> int:
    """How many of `count` contexts stay open all run (indices 0 .. n-1) when at most `max_resident` may be.

    All of them when they fit; otherwise all but one slot, through which the rest take turns. This is the
    one place the rule lives: the backend evicts by it and the plan counts loads by it.
    """
    if max_resident is None or max_resident >= count:
        return count
    return max_resident - 1


def loads_per_pass(count: int, max_resident: int | None) -> int:
    """Context loads (and as many releases) of one pass in steady state: every context that is not pinned."""
    return count - pinned_contexts(count, max_resident)


def resident_peak(values: list[int], max_resident: int) -> int:
    """Largest total of the contexts open at one time: the pinned ones plus the costliest of the others."""
    pinned = pinned_contexts(len(values), max_resident)
    return sum(values[:pinned]) + max(values[pinned:], default=0)


def choose(
    contexts: list[ContextCost], tokens: int, host: int, budget_bytes: int | None, activation_source: str
) -> MemoryPlan:
    totals = [c.total_bytes for c in contexts]
    npu = [c.npu_bytes for c in contexts]
    smallest_need = host + max(totals)
    if budget_bytes is not None and budget_bytes < smallest_need:
        raise AnimaError(f"a memory budget of {size(budget_bytes)} cannot hold the host side plus one RKNN "
                         f"context: at least {size(smallest_need)} is needed")
    if max(npu) > NPU_DOMAIN_BYTES:
        raise AnimaError(f"one RKNN context needs {size(max(npu))}, more than the NPU's "
                         f"{size(NPU_DOMAIN_BYTES)} address space: use fewer tokens")
    resident = 1
    for bound in range(2, len(contexts) + 1):
        fits_budget = budget_bytes is None or host + resident_peak(totals, bound) <= budget_bytes
        if not (fits_budget and resident_peak(npu, bound) <= NPU_DOMAIN_BYTES):
            break
        resident = bound
    reloads = loads_per_pass(len(contexts), resident)
    return MemoryPlan(
        contexts=tuple(contexts), tokens=tokens, host_bytes=host, budget_bytes=budget_bytes,
        activation_source=activation_source, max_resident=resident,
        peak_bytes=host + resident_peak(totals, resident), npu_peak_bytes=resident_peak(npu, resident),
        loads_per_pass=reloads, releases_per_pass=reloads,
    )


def predict_memory(
    hidden: int, blocks: int, tokens: int, mlp: int, budget_bytes: int | None = None,
    context_dim: int = CONTEXT_DIM,
) -> MemoryPlan:
    """Plan from dimensions alone (no files): weights from the Linear shapes, activations spec-scaled."""
    contexts = []
    for index in range(3 * blocks):
        kind = SUBGRAPH_KINDS[index % 3]
        weights = weight_bytes(kind, hidden, mlp, context_dim)
        contexts.append(ContextCost(index, kind, weights, scaled_activation_bytes(kind, hidden, mlp, tokens),
                                    weights))
    return choose(contexts, tokens, host_bytes(hidden, blocks, tokens), budget_bytes, "spec-scaled")


def plan_memory(manifest: dict[str, Any], budget_bytes: int | None) -> MemoryPlan:
    """Plan for a subgraph set's manifest, using the converter's own sizes where it recorded them."""
    model, tokens = manifest["model"], manifest["tokens"]
    hidden, mlp = model["hidden"], 4 * model["hidden"]  # the manifest has no MLP width; Anima's ratio is 4
    converted = {r["index"]: r for r in manifest.get("rknn", {}).get("subgraphs", [])}
    from_compiler = bool(converted) and all("internal_bytes" in r for r in converted.values())
    contexts = []
    for entry in manifest["subgraphs"]:
        kind, record = entry["kind"], converted.get(entry["index"], {})
        weights = record.get("weight_bytes", weight_bytes(kind, hidden, mlp, model["context_dim"]))
        activation = (record["internal_bytes"] if from_compiler
                      else scaled_activation_bytes(kind, hidden, mlp, tokens))
        contexts.append(ContextCost(entry["index"], kind, weights, activation, record.get("rknn_bytes", weights)))
    return choose(contexts, tokens, host_bytes(hidden, model["blocks"], tokens), budget_bytes,
                  "compiler" if from_compiler else "spec-scaled")


# The host side of a tiled decode: the blended float32 image, its weight sum and the blend's temporaries
# (vae.tiling's figure), beside the runtime itself. A tiled encode holds less (the float32 image it cuts and a
# latent of 1/s^2 of its pixels: vae.tiling's 16 bytes a pixel); the decode's figure stands for both.
VAE_HOST_BYTES_PER_PIXEL = 32


@dataclass(frozen=True)
class VaeStage:
    """The VAE stages of an rknn run: the decoder's one context, opened after the DiT's are closed, and (a set with
    the encoder, image-to-image) the encoder's one context, opened on its own before the DiT's."""

    context: ContextCost
    host_bytes: int
    activation_source: str
    encoder: ContextCost | None = None

    @property
    def peak_bytes(self) -> int:
        """The decode stage's peak."""
        return self.host_bytes + self.context.total_bytes

    @property
    def encode_peak_bytes(self) -> int | None:
        """The encode stage's peak (None without an encoder)."""
        return None if self.encoder is None else self.host_bytes + self.encoder.total_bytes

    def describe(self, dit: MemoryPlan | None = None) -> str:
        c = self.context
        lines = [f"VAE decoder context (activations {self.activation_source}): weights {size(c.weight_bytes)}, "
                 f"activations {size(c.activation_bytes)}, file copy {size(c.file_bytes)}, host side "
                 f"{size(self.host_bytes)}: decode stage peak {size(self.peak_bytes)} (NPU {size(c.npu_bytes)})"]
        peaks = [self.peak_bytes]
        if self.encoder is not None:
            e = self.encoder
            lines.append(f"VAE encoder context: weights {size(e.weight_bytes)}, activations "
                         f"{size(e.activation_bytes)}, file copy {size(e.file_bytes)}, host side "
                         f"{size(self.host_bytes)}: encode stage peak "
                         f"{size(self.encode_peak_bytes)} (NPU {size(e.npu_bytes)})")
            peaks.append(self.encode_peak_bytes)
        if dit is not None:  # the stages follow each other: the run's peak is the largest one
            closed = "DiT contexts closed before the decode" + (", opened after the encode" if self.encoder else "")
            lines.append(f"whole run ({closed}): peak {size(max(dit.peak_bytes, *peaks))}")
        return "\n".join(lines)


def _vae_context(record: dict[str, Any], kind: str) -> tuple[ContextCost, bool]:
    """A VAE context's cost from its conversion record, and whether the compiler gave the sizes (the .rknn file's
    size stands in for any it did not print)."""
    file_bytes = record["rknn_bytes"]
    cost = ContextCost(record["index"], kind, record.get("weight_bytes", file_bytes),
                       record.get("internal_bytes", file_bytes), file_bytes)
    return cost, "internal_bytes" in record and "weight_bytes" in record


def plan_vae(manifest: dict[str, Any], width: int, height: int, budget_bytes: int | None) -> VaeStage:
    """The decode stage (and, for a set with the encoder, the encode stage) of a converted VAE set for a
    width x height image, from the compiler's own figures (the .rknn file's size stands in for any it did not
    print)."""
    if "rknn" not in manifest:
        raise AnimaError("plan the VAE decoder from its converted set: the sizes come from the RKNN compiler")
    records = manifest["rknn"]["subgraphs"]
    context, from_compiler = _vae_context(records[0], VAE_DECODER_KIND)
    encoder = None
    if len(records) > 1:
        encoder, encoder_from_compiler = _vae_context(records[1], VAE_ENCODER_KIND)
        from_compiler = from_compiler and encoder_from_compiler
    stage = VaeStage(context, HOST_RUNTIME_BYTES + VAE_HOST_BYTES_PER_PIXEL * width * height,
                     "compiler" if from_compiler else "file size", encoder)
    for part, cost in (("decoder", context), ("encoder", encoder)):
        if cost is not None and cost.npu_bytes > NPU_DOMAIN_BYTES:
            raise AnimaError(f"the VAE {part} context needs {size(cost.npu_bytes)}, more than the NPU's "
                             f"{size(NPU_DOMAIN_BYTES)} address space: export a smaller tile")
    for stage_name, peak in (("decode", stage.peak_bytes), ("encode", stage.encode_peak_bytes)):
        if budget_bytes is not None and peak is not None and peak > budget_bytes:
            raise AnimaError(f"a memory budget of {size(budget_bytes)} cannot hold the VAE {stage_name} stage: "
                             f"{size(peak)} is needed; export a smaller tile")
    return stage

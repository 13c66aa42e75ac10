"""LoRA adapters for the DiT and its LLM adapter: the file layouts users have, merged into the weights at load.

Three layouts name the same low-rank pair (`down` [rank, in], `up` [out, rank], optional `alpha`) differently:
- ComfyUI / diffusion-pipe: `diffusion_model.<module>.lora_A.weight` / `.lora_B.weight` (or lora_down / lora_up);
- kohya sd-scripts: `lora_unet_<module with "_" for ".">.lora_down.weight` / `.lora_up.weight` / `.alpha`;
- diffusers / PEFT: `transformer.<diffusers module>.lora_A.weight`, `text_conditioner.<adapter module>...`.
Each adds scale * (alpha / rank) * up @ down to the module's weight (alpha defaults to the rank).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from ..checks import check_number, shown
from ..core.files import cached_sha256
from ..core.tensorfile import fingerprint, load_tensors, read_header
from ..errors import AnimaError
from .config import DiTConfig
from .dit import AnimaDiT
from .quantized import QuantizedLinear

MAX_SCALE = 100.0
MAX_LORAS = 16
PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
_PAIR = {"lora_A": "down", "lora_down": "down", "lora_B": "up", "lora_up": "up"}
_KEY = re.compile(r"(?P<module>.+?)\.(?:(?P<part>lora_A|lora_B|lora_down|lora_up)\.weight|(?P<alpha>alpha))")
# Adapter kinds that are not a plain low-rank pair, by a key fragment only they use.
_OTHER_KINDS = {"hada_w1": "LoHa (LyCORIS)", "lokr_w": "LoKr (LyCORIS)", "dora_scale": "DoRA",
                "lora_magnitude_vector": "DoRA", "lora_mid": "LoCon with a Tucker core (LyCORIS)",
                ".diff": "full weight-difference (LyCORIS)", "oft_": "OFT", "boft_": "BOFT", "glora_": "GLoRA"}
# Within a DiT block and at the top: checkpoint module -> diffusers module (CosmosTransformer3DModel).
_DIFFUSERS_BLOCK = {
    "self_attn.q_proj": "attn1.to_q", "self_attn.k_proj": "attn1.to_k", "self_attn.v_proj": "attn1.to_v",
    "self_attn.output_proj": "attn1.to_out.0", "cross_attn.q_proj": "attn2.to_q", "cross_attn.k_proj": "attn2.to_k",
    "cross_attn.v_proj": "attn2.to_v", "cross_attn.output_proj": "attn2.to_out.0", "mlp.layer1": "ff.net.0.proj",
    "mlp.layer2": "ff.net.2", "adaln_modulation_self_attn.1": "norm1.linear_1",
    "adaln_modulation_self_attn.2": "norm1.linear_2", "adaln_modulation_cross_attn.1": "norm2.linear_1",
    "adaln_modulation_cross_attn.2": "norm2.linear_2", "adaln_modulation_mlp.1": "norm3.linear_1",
    "adaln_modulation_mlp.2": "norm3.linear_2",
}  # fmt: skip
_DIFFUSERS_TOP = {
    "x_embedder.proj.1": "patch_embed.proj", "t_embedder.1.linear_1": "time_embed.t_embedder.linear_1",
    "t_embedder.1.linear_2": "time_embed.t_embedder.linear_2", "final_layer.linear": "proj_out",
    "final_layer.adaln_modulation.1": "norm_out.linear_1", "final_layer.adaln_modulation.2": "norm_out.linear_2",
}  # fmt: skip
ADAPTER = "llm_adapter."


@dataclasses.dataclass(frozen=True)
class LoraRef:
    """One `--lora FILE[:SCALE]`: the file and how strongly it applies."""

    path: Path
    scale: float = 1.0

    @property
    def name(self) -> str:
        """What WebUI calls it: the file name without .safetensors, as in <lora:name:scale>."""
        return self.path.name.removesuffix(".safetensors")

    def check(self) -> None:
        check_number(f"LoRA scale for {self.path.name}", self.scale, -MAX_SCALE, MAX_SCALE)
        if self.path.suffix.lower() in PICKLE_SUFFIXES:
            raise AnimaError(f"{self.path} is a pickle ({self.path.suffix}): LoRAs are read from .safetensors only, "
                             "pickles are never loaded")
        if not self.path.is_file():
            raise AnimaError(f"LoRA file not found: {self.path}")

    def as_json(self) -> dict[str, object]:
        return {"path": str(self.path), "scale": self.scale}


def parse_lora_option(text: str) -> LoraRef:
    """`FILE` or `FILE:SCALE`; a path that itself holds a colon works when no scale follows it."""
    path, colon, scale = text.rpartition(":")
    if not colon or "/" in scale or scale.endswith(".safetensors") or (not scale and not path):
        return LoraRef(Path(text))
    return LoraRef(Path(path), _scale(scale, text))


def _scale(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise AnimaError(f"LoRA scale {text!r} in {where!r} is not a number") from None


def lora_refs(items: Iterable[object]) -> list[LoraRef]:
    """LoRA settings as they come from JSON (resume states, requests): LoraRef, {"path", "scale"} or [path, scale]."""
    refs = []
    for item in items:
        if isinstance(item, LoraRef):
            refs.append(item)
        elif isinstance(item, dict) and set(item) <= {"path", "scale"} and isinstance(item.get("path"), str):
            refs.append(LoraRef(Path(item["path"]), item.get("scale", 1.0)))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
            refs.append(LoraRef(Path(item[0]), item[1]))
        else:
            raise AnimaError(f"a LoRA setting must name a path and a scale, got {str(item)[:80]!r}")
    return refs


def linear_shapes(config: DiTConfig) -> dict[str, tuple[int, int]]:
    """Every linear layer of the DiT and its adapter (what a LoRA can touch): module name -> (out, in)."""
    with torch.device("meta"):
        model = AnimaDiT(config)
    return {name: (module.out_features, module.in_features) for name, module in model.named_modules()
            if isinstance(module, nn.Linear)}


def diffusers_module(module: str) -> str:
    """Checkpoint module name -> the name diffusers gives it (transformer.* or text_conditioner.*)."""
    if module.startswith(ADAPTER):
        return "text_conditioner." + module.removeprefix(ADAPTER)
    if match := re.fullmatch(r"blocks\.(\d+)\.(.+)", module):
        return f"transformer.transformer_blocks.{match[1]}.{_DIFFUSERS_BLOCK.get(match[2], match[2])}"
    return "transformer." + _DIFFUSERS_TOP.get(module, module)


def kohya_name(module: str) -> str:
    """sd-scripts' name for a checkpoint module: lora_unet_ and the module path with "_" for "."."""
    return "lora_unet_" + module.replace(".", "_")


def kohya_tensors(pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]], alpha: float) -> dict[str, torch.Tensor]:
    """A LoRA file's tensors in kohya layout: module -> (down [rank, in], up [out, rank]), one alpha for all."""
    tensors = {}
    for module, (down, up) in pairs.items():
        name = kohya_name(module)
        tensors |= {f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up,
                    f"{name}.alpha": torch.tensor(float(alpha))}
    return tensors


def _module_names(modules: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Every name a LoRA file may give a module -> (layout, checkpoint module name)."""
    names = {}
    for module in modules:
        names["diffusion_model." + module] = ("ComfyUI", module)
        names[kohya_name(module)] = ("kohya", module)
        names[diffusers_module(module)] = ("diffusers", module)
    return names


@dataclasses.dataclass(frozen=True)
class LoraLayer:
    module: str  # checkpoint module name, e.g. blocks.0.self_attn.q_proj
    down: str  # keys in the file
    up: str
    alpha: str | None
    rank: int


@dataclasses.dataclass
class Lora:
    """A LoRA file checked against one DiT: every key matched to a linear layer with fitting shapes."""

    ref: LoraRef
    layout: str
    layers: dict[str, LoraLayer]  # by checkpoint weight name, e.g. blocks.0.self_attn.q_proj.weight

    @property
    def sha256(self) -> str:
        """Hashed once per file version (the PNG's Lora hashes and a baked set's check share it)."""
        return cached_sha256(self.ref.path)

    def identity(self) -> dict[str, object]:
        """What a baked subgraph set records of it (and checks again): file name, sha256 and scale."""
        return {"file": self.ref.path.name, "sha256": self.sha256, "scale": float(self.ref.scale)}

    def read(self) -> dict[str, torch.Tensor]:
        """The file's tensors (its values are checked as each layer is merged)."""
        return load_tensors(self.ref.path, "LoRA")

    def factors(self, name: str, tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale * alpha / rank * up, down), in fp32, for the weight `name` (one of self.layers)."""
        layer = self.layers[name]
        parts = {key: tensors[key].float() for key in (layer.down, layer.up, layer.alpha) if key is not None}
        for key, value in parts.items():
            if not bool(torch.isfinite(value).all()):
                raise AnimaError(f"{self.ref.path}: tensor {key} holds NaN or Inf")
        alpha = float(parts[layer.alpha]) if layer.alpha is not None else float(layer.rank)
        return (self.ref.scale * alpha / layer.rank) * parts[layer.up], parts[layer.down]

    def delta(self, name: str, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """scale * alpha / rank * up @ down, in fp32, for the weight `name` (one of self.layers)."""
        up, down = self.factors(name, tensors)
        return up @ down


def _shown_keys(keys: Sequence[str], count: int = 3) -> str:
    more = f" and {len(keys) - count} more" if len(keys) > count else ""
    return ", ".join(keys[:count]) + more


def open_lora(ref: LoraRef, config: DiTConfig, *, ignore_unmatched: bool = False) -> Lora:
    """The file's header read and every key matched to this DiT's linear layers, shapes checked; the tensor
    values are read when merged. Anything else is one line naming the problem."""
    ref.check()
    header = read_header(ref.path, "LoRA")
    keys = sorted(header.tensors)
    for fragment, kind in _OTHER_KINDS.items():
        if any(fragment in key for key in keys):
            raise AnimaError(f"{ref.path.name} is a {kind} adapter; only plain LoRA (low-rank up/down pairs) is "
                             "supported")
    if any(key.startswith(("lora_te", "text_encoders.", "text_encoder.")) for key in keys):
        raise AnimaError(f"{ref.path.name} also adapts the Qwen3 text encoder (lora_te* keys), which is not "
                         "supported; only the DiT and its LLM adapter take LoRAs")
    shapes = linear_shapes(config)
    names = _module_names(shapes)
    parts: dict[str, dict[str, str]] = {}
    layouts, unmatched = set(), []
    for key in keys:
        match = _KEY.fullmatch(key)
        found = names.get(match["module"]) if match else None
        if found is None:
            unmatched.append(key)
            continue
        layouts.add(found[0])
        role = "alpha" if match["alpha"] else _PAIR[match["part"]]
        if role in parts.setdefault(found[1], {}):
            raise AnimaError(f"{ref.path.name}: two keys give the {role} of {found[1]} "
                             f"({parts[found[1]][role]} and {key})")
        parts[found[1]][role] = key
    if not parts:
        raise AnimaError(f"{ref.path.name} is not a LoRA for Anima: none of its {len(keys)} keys names an Anima "
                         f"layer (e.g. {_shown_keys(keys)})")
    if unmatched and not ignore_unmatched:
        raise AnimaError(f"{ref.path.name}: {len(unmatched)} of its {len(keys)} keys match nothing in this "
                         f"Anima model: {_shown_keys(unmatched)} (--lora-ignore-unmatched skips them)")
    if len(layouts) > 1:
        raise AnimaError(f"{ref.path.name} mixes LoRA layouts ({', '.join(sorted(layouts))})")
    layers = {}
    for module, roles in parts.items():
        layers[module + ".weight"] = _layer(ref, module, roles, header.tensors, shapes[module])
    return Lora(ref, layouts.pop(), layers)


def _layer(ref: LoraRef, module: str, roles: Mapping[str, str], tensors: Mapping, shape: tuple[int, int]) -> LoraLayer:
    missing = [role for role in ("down", "up") if role not in roles]
    if missing:
        raise AnimaError(f"{ref.path.name}: {module} has no {' or '.join(missing)} matrix")
    down, up = tensors[roles["down"]].shape, tensors[roles["up"]].shape
    if len(down) != 2 or len(up) != 2 or down[0] != up[1] or down[0] == 0:
        raise AnimaError(f"{ref.path.name}: {module} has down {list(down)} and up {list(up)}, "
                         "not a [rank, in] / [out, rank] pair")
    if (up[0], down[1]) != shape:
        raise AnimaError(f"{ref.path.name}: {roles['up']} x {roles['down']} is [{up[0]}, {down[1]}], "
                         f"the model's {module} is {list(shape)} (a LoRA for another model size?)")
    alpha = roles.get("alpha")
    if alpha is not None and math.prod(tensors[alpha].shape) != 1:
        raise AnimaError(f"{ref.path.name}: {alpha} has shape {list(tensors[alpha].shape)}; alpha is one number")
    return LoraLayer(module, roles["down"], roles["up"], alpha, down[0])


def open_loras(refs: Sequence[LoraRef], config: DiTConfig, *, ignore_unmatched: bool = False) -> list[Lora]:
    if len(refs) > MAX_LORAS:
        raise AnimaError(f"at most {MAX_LORAS} LoRAs apply at once, got {len(refs)}")
    return [open_lora(ref, config, ignore_unmatched=ignore_unmatched) for ref in refs]


def merge_loras(base: Mapping[str, torch.Tensor], loras: Sequence[Lora],
                dtype_of: Callable[[str], torch.dtype]) -> dict[str, torch.Tensor]:
    """New tensors for the weights in `base` that the LoRAs touch: base + every LoRA's delta, summed in fp32,
    then cast to dtype_of(name). Only these are copied, one fp32 working copy at a time; `base` (a file's
    memory map) is never written."""
    touched, files = _touched(base, loras)
    merged = {}
    for name in touched:
        weight = base[name].to(torch.float32, copy=True)
        for lora, tensors in zip(loras, files):
            if name in lora.layers:
                weight += lora.delta(name, tensors)
        _check_merged(name, weight)
        merged[name] = weight.to(dtype_of(name))
    return merged


def _touched(weights: Collection[str], loras: Sequence[Lora]) -> tuple[list[str], list[dict[str, torch.Tensor]]]:
    """The weight names the LoRAs touch among `weights`, and the LoRA files' tensors (read only if any)."""
    touched = sorted(set().union(*(lora.layers for lora in loras)) & set(weights))
    return touched, [lora.read() if touched else {} for lora in loras]


def _check_merged(name: str, weight: torch.Tensor) -> None:
    if not bool(torch.isfinite(weight).all()):
        raise AnimaError(f"merging the LoRAs into {name} gives NaN or Inf: lower their scales")


def attach_loras(layers: Mapping[str, QuantizedLinear], loras: Sequence[Lora]) -> None:
    """LoRAs on quantized layers (by weight name): their factors kept by each layer and added at every
    dequantization (model.quantized); the sum is checked once here, one layer at a time."""
    touched, files = _touched(layers, loras)
    for name in touched:
        for lora, tensors in zip(loras, files):
            if name in lora.layers:
                layers[name].add_lora(*lora.factors(name, tensors))
        _check_merged(name, layers[name].weight_as(torch.float32))


def lora_fingerprints(loras: Sequence[LoraRef]) -> str | None:
    """One identity for a run's LoRAs (resume states): each file's fingerprint and scale, in order."""
    if not loras:
        return None
    return ";".join(f"{fingerprint(ref.path, 'LoRA')}:{float(ref.scale)!r}" for ref in loras)


def lora_tag(ref: LoraRef) -> str:
    """WebUI's prompt tag for it."""
    return f"<lora:{ref.name}:{ref.scale:g}>"


_TAG = re.compile(r"\s*<(lora|lyco|hypernet):([^<>]*)>", re.IGNORECASE)


def prompt_loras(prompt: str, lora_dir: Path | None) -> tuple[str, list[LoraRef]]:
    """WebUI's `<lora:NAME>` / `<lora:NAME:SCALE>` tags taken out of a prompt: the text without them, and the
    LoRAs they name, each `NAME.safetensors` in `lora_dir` (by name only: never a path)."""
    refs = []
    for match in _TAG.finditer(prompt):
        if match[1].lower() != "lora":
            raise AnimaError(f"<{match[1]}:...> prompt tags are not supported; use <lora:NAME:SCALE>")
        name, _, scale = match[2].partition(":")
        refs.append(named_lora(name, _scale(scale, match[0].strip()) if scale else 1.0, lora_dir))
    return _TAG.sub("", prompt).strip(), refs


def named_lora(name: str, scale: float, lora_dir: Path | None) -> LoraRef:
    """The LoRA `name` picks in `lora_dir`: NAME.safetensors there, by plain name only (never a path)."""
    if not isinstance(name, str) or not name or name != name.strip() or any(c in name for c in "/\\\0") \
            or name in (".", ".."):
        raise AnimaError(f"LoRA name {shown(name)} is not a plain file name (no folders)")
    if lora_dir is None:
        raise AnimaError(f"LoRA {name!r} asked for by name: the folder of LoRAs is not set (--lora-dir DIR)")
    path = Path(lora_dir) / f"{name}.safetensors"
    if not path.is_file():
        # The folder is not named: a server's error goes to its clients, who choose LoRAs by name only.
        raise AnimaError(f"LoRA {name!r}: no {path.name} in the LoRA folder (--lora-dir)")
    return LoraRef(path, scale)


__all__ = ["Lora", "LoraRef", "MAX_LORAS", "attach_loras", "kohya_name", "kohya_tensors", "linear_shapes",
           "lora_fingerprints", "lora_refs", "lora_tag", "merge_loras", "named_lora", "open_lora", "open_loras",
           "parse_lora_option", "prompt_loras"]

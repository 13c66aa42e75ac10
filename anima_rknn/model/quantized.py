"""Linear layers whose weights stay GGML-quantized (a GGUF file's blocks, in place in its memory map), each
dequantized to the compute dtype when it runs and dropped after, as ComfyUI-GGUF does: the model then takes
about the file's size in memory, plus one layer's weight at a time.

A LoRA on such a layer is kept as its low-rank factors and added at dequantization (fp32, before the cast), so
the sum is the one load-time merging gives a dense weight, without a dense copy of every touched layer.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..core.quant import QuantizedTensor
from ..errors import AnimaError


WeightBuffers = dict  # (thread, dtype) -> a reused flat tensor, as large as the largest weight so far


class QuantizedLinear(nn.Module):
    """A linear layer over a QuantizedTensor weight. `host` layers compute in fp32 whatever the input (as
    dit.HostLinear); the others in the dtype of their input (the bodies' dtype)."""

    def __init__(self, weight: QuantizedTensor, bias: bool, host: bool) -> None:
        super().__init__()
        self.qweight = weight
        self.out_features, self.in_features = weight.shape
        # the bias is a plain parameter, loaded by load_state_dict with the rest
        self.bias = nn.Parameter(torch.empty(self.out_features, device="meta"), requires_grad=False) if bias else None
        self.host = host
        self.lora: tuple[torch.Tensor, torch.Tensor] | None = None  # (scaled up [out, r], down [r, in]), fp32
        self.buffers: WeightBuffers = {}  # install_quantized gives all layers of a model one

    def add_lora(self, up: torch.Tensor, down: torch.Tensor) -> None:
        self.lora = (up, down) if self.lora is None else (torch.cat([self.lora[0], up], 1),
                                                          torch.cat([self.lora[1], down], 0))

    def weight_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype`, in one buffer per dtype that all this model's layers reuse, whatever their shape
        (they run one at a time, each weight used at once; a fresh weight-sized allocation per call would be
        page-faulted and zeroed every time, and a buffer per shape held 84 MiB for Anima's six shapes, not 38)."""
        if self.lora is None:
            key, size = (threading.get_ident(), dtype), self.out_features * self.in_features
            buffer = self.buffers.get(key)
            if buffer is None or buffer.numel() < size:
                buffer = self.buffers[key] = torch.empty(size, dtype=dtype)
            return self.qweight.dequantize(dtype, out=buffer[:size].view(self.qweight.shape))
        weight = self.qweight.dequantize(torch.float32)
        return weight.addmm_(*self.lora).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if self.host else x.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(x.to(dtype), self.weight_as(dtype), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qweight.dtype}"


def install_quantized(model: nn.Module, tensors: Mapping[str, torch.Tensor | QuantizedTensor],
                      host: type[nn.Module]) -> dict[str, torch.Tensor | QuantizedTensor]:
    """Every quantized `<module>.weight` of a linear layer in `tensors` becomes a QuantizedLinear in `model`;
    returns the tensors left for load_state_dict (biases among them). Linear layers of class `host` compute in
    fp32."""
    left, buffers = dict(tensors), {}
    for name, module in list(model.named_modules()):
        weight = left.get(f"{name}.weight")
        if not isinstance(weight, QuantizedTensor) or not isinstance(module, nn.Linear):
            continue
        if weight.shape != (module.out_features, module.in_features):
            raise AnimaError(f"tensor {name}.weight has shape {list(weight.shape)}, expected "
                             f"{[module.out_features, module.in_features]}")
        del left[f"{name}.weight"]
        parent, _, attr = name.rpartition(".")
        layer = QuantizedLinear(weight, module.bias is not None, isinstance(module, host))
        layer.buffers = buffers
        setattr(model.get_submodule(parent) if parent else model, attr, layer)
    return left


def quantized_layers(model: nn.Module) -> dict[str, QuantizedLinear]:
    """The QuantizedLinear modules of `model` by weight name (`<module>.weight`)."""
    return {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}

"""k-diffusion's real `k_diffusion.sampling`, loaded without the package's `__init__`: the independent reference
of the sampler tests.

k-diffusion's `__init__` imports its whole training stack (CLIP, wandb, torchvision, kornia, ...), none of which
this project installs (k-diffusion itself is installed with --no-deps). Its `sampling` module needs only torch,
scipy, torchsde, torchdiffeq and `k_diffusion.utils`. So a bare package module standing for `k_diffusion`, whose
`__path__` is the installed folder, lets `import k_diffusion.sampling` find the real files without running the
`__init__`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from types import ModuleType

PACKAGE = "k_diffusion"
_PLACEHOLDERS = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


def _installed_folder() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without importing (running) its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("k-diffusion is not installed (pip install --no-deps k-diffusion==0.1.1.post1)")
    return Path(next(iter(spec.submodule_search_locations)))


def _torchvision_importable() -> bool:
    try:
        importlib.import_module("torchvision.transforms.functional")
    except ImportError:
        return False
    return True


def load_sampling() -> ModuleType:
    """The real `k_diffusion.sampling` module (cached in sys.modules after the first call)."""
    if f"{PACKAGE}.sampling" in sys.modules:
        return sys.modules[f"{PACKAGE}.sampling"]
    folder = _installed_folder()
    package = sys.modules.get(PACKAGE)
    if package is None:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(folder)]
        package.__file__ = None
        sys.modules[PACKAGE] = package
    # k_diffusion/utils.py imports torchvision.transforms.functional at top level, for image helpers (to_tensor,
    # resize) that sampling never calls. The PyPI torchvision does not build against this CPU torch (installing it
    # breaks transformers' import), so where it is absent, empty placeholder modules stand in for the length of
    # this import only: left in sys.modules they would make other libraries (transformers, diffusers) believe
    # torchvision is installed.
    placeholders = [] if _torchvision_importable() else [name for name in _PLACEHOLDERS if name not in sys.modules]
    for name in placeholders:
        sys.modules[name] = types.ModuleType(name)
    if placeholders:
        sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
        sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]
    try:
        sampling = importlib.import_module(f"{PACKAGE}.sampling")
    finally:
        for name in placeholders:
            sys.modules.pop(name, None)
    return sampling

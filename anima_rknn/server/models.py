"""The models one server runs (`serve --model` given more than once): their names as WebUI lists them
(/sdapi/v1/sd-models), the one a request gets when it names none (WebUI's sd_model_checkpoint, which options
switch), and the model a request names, found by any of the names WebUI matches (title, name, file name, hash).

The hash is the DiT's fingerprint (core.tensorfile.fingerprint, a sha256 over its header and sampled blocks),
its first 10 hex digits as WebUI's short hash: it tells two files apart as WebUI's does, without reading
gigabytes at start-up. It is not the file's sha256, so `sha256` is null, as WebUI lists a file it has not hashed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..checks import shown
from ..core.tensorfile import fingerprint
from ..errors import AnimaError
from ..model.io import trained_image_size
from ..model.model_set import ModelFiles
from .requests import BadRequest

SHORT_HASH = 10  # WebUI's short hash: the first 10 hex digits


@dataclasses.dataclass(frozen=True)
class ServedModel:
    name: str  # the DiT file's stem: what every API shows
    files: ModelFiles
    hash: str  # the DiT's fingerprint, hex
    trained_size: int | None  # the image size a small trained model records (the demo model's 64), else None

    @classmethod
    def of(cls, name: str, files: ModelFiles) -> ServedModel:
        return cls(name, files, fingerprint(files.dit, "DiT"), trained_image_size(files.dit))

    @property
    def title(self) -> str:
        """WebUI's title: the file name and its short hash."""
        return f"{self.files.dit.name} [{self.hash[:SHORT_HASH]}]"

    def names(self) -> set[str]:
        """Every name a request may give for this model, casefolded."""
        return {text.casefold() for text in (self.title, self.name, self.files.dit.name, self.hash[:SHORT_HASH],
                                              self.hash)}

    def sd_model(self) -> dict[str, Any]:
        """WebUI's fields; `filename` is the file's name alone: a client never learns the server's folders."""
        return {"title": self.title, "model_name": self.name, "hash": self.hash[:SHORT_HASH], "sha256": None,
                "filename": self.files.dit.name, "config": None}


class Models:
    """The served models in the order given, and the current one (the first at start)."""

    def __init__(self, models: list[ServedModel]) -> None:
        if not models:
            raise AnimaError("a server needs a model")
        self.all = models
        for index, model in enumerate(models):
            clash = next((other for other in models[:index] if other.names() & model.names()), None)
            if clash is not None and clash.hash == model.hash:
                raise AnimaError(f"{clash.files.dit} and {model.files.dit} hold the same weights: serve them once")
            if clash is not None:
                raise AnimaError(f"two models are both named {clash.name} ({clash.files.dit} and {model.files.dit}): "
                                 "give each DiT file its own name")
        self.current = models[0]

    def find(self, asked: Any, field: str = "sd_model_checkpoint") -> ServedModel:
        """The model a request names, by any of its names; an unknown one is a 400 naming it and the list."""
        if isinstance(asked, str):
            found = next((model for model in self.all if asked.strip().casefold() in model.names()), None)
            if found is not None:
                return found
        listed = ", ".join(model.title for model in self.all)
        raise BadRequest(f"{field} {shown(asked)}: no such model on this server; it serves {listed}")

    def by_name(self, name: str) -> ServedModel:
        return next(model for model in self.all if model.name == name)

    def files(self) -> dict[str, ModelFiles]:
        """What the job queue runs, by name."""
        return {model.name: model.files for model in self.all}

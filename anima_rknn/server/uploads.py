"""The uploads store: an uploaded init image or mask kept in the data folder, content-addressed
(`data_dir/inputs/<sha256>.img`, written before its job is queued), because a job's saved settings hold only its
fingerprint: a queued or stopped img2img job is given its bytes again after a restart, and one whose input has gone
fails with that reason. An input is removed once no job needs it. The folder is the server's own: a link there is
refused at start and never followed later.

Also the bound on decoding them: at most MAX_DECODES pictures (base64, sha256 and the checks' decode of the
pixels) are decoded at once, the others wait up to DECODE_WAIT_S for a turn, then are told to come back (a 503).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..core.files import Unreadable, read_small_file, write_bytes
from ..errors import AnimaError
from ..generation.images import MAX_IMAGE_BYTES, ImageInput
from ..generation.params import IMAGE_SETTINGS, GenerationParams
from .store import StoreError, remove_temporaries, unwritable

INPUTS = "inputs"  # the folder of data_dir that holds the jobs' uploaded images
# Pictures decoded at once (a request's base64 and sha256, a submit's checks): each holds its decoded pixels, up to
# 256 MiB for the largest.
MAX_DECODES = 2
DECODE_WAIT_S = 10.0  # how long a decode waits for a turn before the request is told to come back
log = logging.getLogger(__name__)


class ServerBusy(AnimaError):
    """A 503 with Retry-After: the server is reading or decoding as many large bodies as it takes at once."""


class DecodeTurns:
    """At most `count` decodes at once, in any threads; a thread that holds a turn takes none again (a request's
    images are decoded, then checked by the submit, in one turn)."""

    def __init__(self, count: int = MAX_DECODES, wait_s: float = DECODE_WAIT_S) -> None:
        self.count, self.wait_s = count, wait_s
        self._turns = threading.BoundedSemaphore(count)
        self._held = threading.local()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """A turn to decode (ServerBusy when none comes within wait_s)."""
        if getattr(self._held, "turn", False):
            yield
            return
        if not self._turns.acquire(timeout=self.wait_s):
            raise ServerBusy(f"the server is decoding {self.count} pictures already; try again shortly")
        self._held.turn = True
        try:
            yield
        finally:
            self._held.turn = False
            self._turns.release()


def image_inputs(params: GenerationParams) -> list[ImageInput]:
    return [image for name in IMAGE_SETTINGS if (image := getattr(params, name)) is not None]


def without_bytes(params: GenerationParams) -> GenerationParams:
    """`params` with its images kept by fingerprint only."""
    images = {image_name: ImageInput(None, image.name, image.sha256) for image_name in IMAGE_SETTINGS
              if (image := getattr(params, image_name)) is not None and image.data is not None}
    return dataclasses.replace(params, **images) if images else params


def is_own_folder(path: Path) -> bool:
    """A folder itself, not a link to one."""
    return path.is_dir() and not path.is_symlink()


def own_folder(path: Path) -> None:
    """`path` as a folder of the data folder's own, made if missing; a link (never followed) or a file there is
    refused in one line."""
    if path.is_symlink():
        raise AnimaError(f"{path} is a symbolic link; the server follows no links in its data folder: remove it")
    if path.exists() and not path.is_dir():
        raise AnimaError(f"{path} is not a folder; the server keeps its uploads there: move it away")
    try:
        path.mkdir(exist_ok=True)
    except OSError as e:
        raise AnimaError(f"cannot create {path}: {e.strerror or e}") from None


class Uploads:
    """The uploaded images of `data_dir`'s jobs, in `data_dir/inputs`."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = data_dir / INPUTS
        own_folder(self.folder)
        remove_temporaries(self.folder)

    def path(self, image: ImageInput) -> Path:
        return self.folder / f"{image.sha256}.img"

    def keep(self, params: GenerationParams) -> None:
        """The job's uploaded images on disk, by sha256 (an image already there is the same bytes)."""
        if image_inputs(params) and not is_own_folder(self.folder):
            raise StoreError(f"the server's data folder holds a {INPUTS} that is not a plain folder (a link?): it "
                             "keeps no uploads there", 503)
        for image in image_inputs(params):
            if not self.path(image).is_file():
                try:
                    write_bytes(self.path(image), image.data, overwrite=True)
                except AnimaError as e:
                    raise unwritable(e, "the uploaded image") from None

    def with_inputs(self, params: GenerationParams) -> GenerationParams:
        """`params` with its fingerprint-only images given their bytes from the inputs folder."""
        found = {}
        for name in IMAGE_SETTINGS:
            image = getattr(params, name)
            if image is None or image.data is not None:
                continue
            label = name.replace("_", " ")
            try:
                data = read_small_file(self.path(image), MAX_IMAGE_BYTES)
            except Unreadable as e:
                raise AnimaError(f"the job's {label} (sha256 {image.sha256[:12]}...) is gone from the server's "
                                 f"{INPUTS} folder ({e}): submit the job again") from None
            if hashlib.sha256(data).hexdigest() != image.sha256:
                raise AnimaError(f"the job's {label} in the server's {INPUTS} folder is not the image it was given "
                                 f"(sha256 {image.sha256[:12]}...): submit the job again")
            found[name] = ImageInput(data, image.name, image.sha256)
        return dataclasses.replace(params, **found) if found else params

    def keep_only(self, needed: Iterable[ImageInput]) -> None:
        """Remove every input but `needed`. An inputs folder replaced by a link (or anything but a folder) since
        the start is left alone: never emptied through it."""
        if not is_own_folder(self.folder):
            log.warning("the data folder's %s is no longer a plain folder: nothing removed from it", INPUTS)
            return
        names = {self.path(image).name for image in needed}
        for path in self.folder.iterdir():
            if path.name not in names:
                path.unlink(missing_ok=True)

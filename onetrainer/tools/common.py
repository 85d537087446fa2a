"""What the mask and caption tools share: reading images, atomic result files, devices, ONNX sessions."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from onetrainer.data.images import open_rgb
from onetrainer.tools.folder_pass import ModelLoadError, SkipImage
from onetrainer.util.fs import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    import torch


def read_image(path: Path) -> Image.Image:
    """The image as RGB, or SkipImage naming why it cannot be read."""
    try:
        return open_rgb(path)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise SkipImage(f"cannot read the image: {e}") from None


def write_png(image: Image.Image, path: Path) -> Path:
    """Write atomically (a crash leaves the old file or the new one, never half a file)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    try:
        atomic_write_bytes(path, buffer.getvalue())
    except OSError as e:
        raise SkipImage(f"cannot write {path}: {e.strerror or e}") from None
    return path


def write_text(path: Path, text: str) -> Path:
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise SkipImage(f"cannot write {path}: {e.strerror or e}") from None
    return path


def resolve_device(name: str | None) -> torch.device:
    """The device asked for; CUDA when none is named and one exists; the CPU (with a note) when it is missing."""
    import torch

    from onetrainer.training.devices import select_device

    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return select_device(name, lambda text: print(f"warning: {text}", file=sys.stderr))


def onnx_session(path: Path, device: torch.device):
    """An onnxruntime session on the device's provider when onnxruntime has it, else on the CPU."""
    try:
        import onnxruntime
    except ImportError:
        raise ModelLoadError("onnxruntime is not installed: pip install onnxruntime (or onnxruntime-gpu)") from None
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: onnxruntime's warnings are not the user's business
    try:
        return onnxruntime.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types for a damaged or foreign file
        raise ModelLoadError(f"cannot load the ONNX model {path}: {e}") from None


def hub_file(repo_or_path: str, filename: str, what: str = "") -> Path:
    """`filename` from a local folder, a local file (taken as it is) or a Hugging Face repo (downloaded, cached)."""
    local = Path(repo_or_path).expanduser()
    if local.is_file():
        return local
    if local.is_dir():
        found = local / filename
        if not found.is_file():
            raise ModelLoadError(f"{found} does not exist")
        return found
    from onetrainer.tools.downloads import DownloadCancelled, progress_bar

    local_only = hub_local_only(repo_or_path, what or f"the model ({filename})", ((filename,),))
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_or_path, filename, tqdm_class=progress_bar(), local_files_only=local_only))
    except DownloadCancelled:
        raise
    except Exception as e:
        raise ModelLoadError(
            f"cannot find {filename} of {repo_or_path} (not a local path, and the hub says: {e})"
        ) from None


def check_available(name: str, what: str) -> None:
    """Fail within seconds when `name` is a hub repo that is neither cached nor downloadable now: called before the
    model's library is imported, so that an offline answer does not wait for seconds of imports either."""
    from onetrainer.tools.downloads import is_hub_id

    if is_hub_id(name):
        hub_local_only(name, f"the {what}")


def hub_local_only(repo_id: str, what: str, file_sets: tuple[tuple[str, ...], ...] = ()) -> bool:
    """Whether the hub repo must be read from the cache alone (it is there, and the hub is off or unreachable).

    Asks the hub once with a short timeout (`util/hub.py`, as Start does for the base model): without it, an
    unreachable hub costs minutes of download retries and ends in a message about a "local directory with the same
    name". A repo that is neither cached nor downloadable raises ModelLoadError naming the model and the cache folder.
    """
    from onetrainer.util.hub import hub_access

    access = hub_access(repo_id, None, False, what, file_sets)
    if access.problem:
        raise ModelLoadError(access.problem)
    return access.local_files_only


def from_pretrained(cls, name: str, what: str, model: str = "", **kwargs):
    """`cls.from_pretrained(name)` with a message a user can act on when the name is neither a folder nor on the hub.
    A hub id is looked for in the cache and on the hub first (within seconds, `hub_local_only`), then downloaded with
    progress shown and cancellable (`tools/downloads.py`). `model` names the whole model in the hub's message (the
    processor and the weights of one repo are one download)."""
    from onetrainer.tools.downloads import DownloadCancelled, hub_snapshot, is_hub_id

    source = name
    if is_hub_id(name):
        local_only = hub_local_only(name, f"the {model or what}")
        try:
            source = hub_snapshot(name, local_only)
        except DownloadCancelled:
            raise
        except Exception as e:
            raise ModelLoadError(f"cannot download the {what} {name}: {type(e).__name__}: {e}") from None
        if source == name:  # not resolved to a folder: never let the library retry downloads
            kwargs["local_files_only"] = True
    try:
        return cls.from_pretrained(source, **kwargs)
    except DownloadCancelled:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load the {what} {name}: {type(e).__name__}: {e}") from None

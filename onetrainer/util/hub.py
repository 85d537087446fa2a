"""Hugging Face hub models: is a repo in the local cache, can the hub be reached, and what to tell the user if neither.

Without this, a hub id with no connection spends half a minute in huggingface_hub's download retries and then reports
a missing config.json. Here the cache is looked at first and the hub is asked once, with a short timeout, so the answer
comes within seconds and names the model, the cache folder and what to do. No torch is imported (the GUI's Start
checks call this).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

# Long enough for a slow connection to answer, short enough that a dropped one is reported while the user waits.
PROBE_TIMEOUT_S = 4.0
# Start's checks and the model loading that follows ask about the same repo within seconds: ask the hub once.
_PROBE_MEMORY_S = 30.0
_probes: dict[tuple[str, str], tuple[float, Probe]] = {}


@dataclass(frozen=True)
class HubAccess:
    """How a hub model can be loaded: from the cache only, with downloads, or not at all (`problem` says why)."""

    local_files_only: bool
    problem: str = ""


def cache_folder(cache_dir: str | None = None) -> Path:
    """Where hub files are looked for: the configured folder, or huggingface_hub's (from HF_HOME / HF_HUB_CACHE)."""
    from huggingface_hub import constants

    return Path(cache_dir or constants.HF_HUB_CACHE).expanduser()


# Sets of files that show a model is in the cache when only some of its repository was downloaded (any one set,
# complete, will do): a family that loads a pipeline part by part never fetches its model_index.json, and a part may be
# one subfolder or one file of a repository. The families declare theirs (`FamilyInfo.hub_file_sets`,
# `part_hub_file_sets`).
FileSets = tuple[tuple[str, ...], ...]


# One file of a hub repository, as the hub's pages link it (OneTrainer's presets name single-file models so):
# https://huggingface.co/<org>/<name>/blob/<revision>/<path>, or `resolve` (the download link) for `blob`.
_HUB_FILE_URL = re.compile(
    r"^https?://(?:www\.)?huggingface\.co/(?P<repo>[\w.-]+/[\w.-]+)/(?:blob|resolve)/(?P<revision>[^/?#\s]+)/"
    r"(?P<filename>[^?#\s]+)(?:[?#]\S*)?$"
)


@dataclass(frozen=True)
class HubFile:
    """One file of a hub repository at a revision (a branch, tag or commit)."""

    repo_id: str
    revision: str
    filename: str

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{self.repo_id}/blob/{self.revision}/{self.filename}"


def hub_file(name: str) -> HubFile | None:
    """The hub file a model name links to (`https://huggingface.co/<repo>/blob/<revision>/<file>`, or `resolve`)."""
    match = _HUB_FILE_URL.match(name.strip())
    if match is None:
        return None
    return HubFile(match["repo"], unquote(match["revision"]), unquote(match["filename"]))


def cached_hub_file(file: HubFile, cache_dir: str | None = None) -> Path | None:
    """The file's path in the local hub cache, None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        file.repo_id, file.filename, cache_dir=str(cache_folder(cache_dir)), revision=file.revision
    )
    return Path(found) if isinstance(found, str) else None


def hub_file_access(file: HubFile, cache_dir: str | None, offline_setting: bool, what: str = "") -> HubAccess:
    """`hub_access` for one file of a repository: in the cache, or downloadable now; else a problem saying why."""
    what = what or "the model"
    if cached_hub_file(file, cache_dir) is not None:
        return HubAccess(True)
    reason = offline_reason(offline_setting)
    if not reason:
        answer = probe(file.repo_id)
        if answer.ok:
            return HubAccess(False)
        reason = answer.reason
    return HubAccess(True, unavailable_message(f"{file.repo_id}/{file.filename}", cache_dir, reason, what))


def download_hub_file(file: HubFile, cache_dir: str | None, offline_setting: bool, what: str = "") -> Path:
    """The file from the local hub cache, else downloaded into it (only this file of the repository). Raises
    FileNotFoundError with `hub_file_access`'s message when neither can be."""
    found = cached_hub_file(file, cache_dir)
    if found is not None:
        return found
    access = hub_file_access(file, cache_dir, offline_setting, what)
    if access.problem:
        raise FileNotFoundError(access.problem)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(
            hf_hub_download(file.repo_id, file.filename, revision=file.revision, cache_dir=str(cache_folder(cache_dir)))
        )
    except (OSError, HfHubHTTPError) as error:
        raise FileNotFoundError(f"{what or 'the model'} {file.url} cannot be downloaded: {error}") from error


def is_cached(repo_id: str, cache_dir: str | None = None, file_sets: FileSets = ()) -> bool:
    """Whether the repo's files are in the local cache: a diffusers model's index and each of its components' folders,
    another model's config.json, or every file of one of `file_sets` (what a part-wise load reads)."""
    from huggingface_hub import try_to_load_from_cache

    folder = str(cache_folder(cache_dir))

    def cached(name: str) -> bool:
        return isinstance(try_to_load_from_cache(repo_id, name, cache_dir=folder), str)

    if any(all(cached(name) for name in names) for names in file_sets):
        return True
    index = try_to_load_from_cache(repo_id, "model_index.json", cache_dir=folder)
    if isinstance(index, str):
        snapshot = Path(index).parent
        try:
            index_data = json.loads(Path(index).read_text())
        except (OSError, ValueError):
            return False
        # A component is ["library", "class"]; [null, null] marks one the pipeline does without.
        components = [k for k, v in index_data.items() if not k.startswith("_") and isinstance(v, list) and v and v[0]]
        return all((snapshot / name).is_dir() for name in components)
    return isinstance(try_to_load_from_cache(repo_id, "config.json", cache_dir=folder), str)


def offline_reason(offline_setting: bool) -> str:
    """Why the hub must not be contacted ("" when it may be)."""
    from huggingface_hub import constants

    if offline_setting:
        return "the Offline setting is on"
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    return ""


@dataclass(frozen=True)
class Probe:
    """The hub's answer about a repo: `answered` False when it could not be reached; `reason` says what went wrong."""

    answered: bool
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.answered and not self.reason


def answer_remembered(repo_id: str) -> bool:
    """Whether `probe(repo_id)` would answer at once, from a recent question (no network)."""
    from huggingface_hub import constants

    remembered = _probes.get((constants.ENDPOINT, repo_id))
    return remembered is not None and time.monotonic() - remembered[0] < _PROBE_MEMORY_S


def probe(repo_id: str, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Ask the hub about the repo once, with a short timeout and without retries."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    key = (constants.ENDPOINT, repo_id)
    remembered = _probes.get(key)
    if remembered and time.monotonic() - remembered[0] < _PROBE_MEMORY_S:
        return remembered[1]
    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(repo_id, timeout=timeout)
        result = Probe(True)
    except GatedRepoError:
        result = Probe(True)  # it exists; the download says whether this user has been granted access
    except RepositoryNotFoundError:
        result = Probe(True, f"the hub has no repo '{repo_id}' (or it is private: log in with `hf auth login`)")
    except HfHubHTTPError as e:
        result = Probe(False, f"the hub ({constants.ENDPOINT}) answered with an error ({e})")
    except Exception as e:  # any transport failure (DNS, refused, timeout, proxy) means "unreachable"
        result = Probe(False, f"the hub ({constants.ENDPOINT}) cannot be reached ({type(e).__name__}: {e})")
    _probes[key] = (time.monotonic(), result)
    return result


def unavailable_message(repo_id: str, cache_dir: str | None, reason: str, what: str = "") -> str:
    """The one message for a hub model that is not in the cache and cannot be downloaded now."""
    return (
        f"{what or 'the model'} '{repo_id}' is not in the local Hugging Face cache ({cache_folder(cache_dir)}) and "
        f"cannot be downloaded: {reason}. To download it, connect to the internet (with Offline off) and start again: "
        "its files go into that folder once, and later runs work offline. Or set the model to a local .safetensors "
        "file or diffusers folder."
    )


def hub_access(
    repo_id: str, cache_dir: str | None, offline_setting: bool, what: str = "", file_sets: FileSets = ()
) -> HubAccess:
    """Decide, within seconds, how a hub model can be loaded.

    Cached and offline (or the hub unreachable): from the cache only, so no download is attempted and retried.
    Not cached and offline or unreachable: a problem naming the model, the cache folder and what to do.
    """
    cached = is_cached(repo_id, cache_dir, file_sets)
    reason = offline_reason(offline_setting)
    if not reason:
        answer = probe(repo_id)
        if answer.ok:
            return HubAccess(False)
        if answer.answered and not cached:
            where = cache_folder(cache_dir)
            return HubAccess(
                False, f"{what or 'the model'} '{repo_id}' is not in the local cache ({where}), and {answer.reason}"
            )
        reason = answer.reason
    if cached:
        return HubAccess(True)
    return HubAccess(True, unavailable_message(repo_id, cache_dir, reason, what))

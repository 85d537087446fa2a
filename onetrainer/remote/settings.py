"""The `cloud` block of a config (OneTrainer's CloudConfig, read as its names say) and the secrets file.

The config keeps where and how to train remotely; the secrets (a key file, a password, an API key) live only in the
secrets file, `secrets.json` in the app's folder (OneTrainer's name and shape: `{"huggingface_token": …, "cloud":
{"host", "port", "user", "key_file", "password", "api_key", "id"}}`). That file is written with mode 0600 and read only
when no one else can read it; a config's own `secrets` block is never uploaded, logged or saved by a remote run.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from onetrainer.util.app_dirs import state_dir

SECRETS_NAME = "secrets.json"
SECRETS_ENV = "ONETRAINER_SECRETS"  # another secrets file than the app folder's (tests, several hosts)
TYPES = ("LINUX", "RUNPOD")
FILE_SYNCS = ("NATIVE_SCP", "FABRIC_SFTP")
ACTIONS = ("NONE", "STOP", "DELETE")
# OneTrainer's default install command clones OneTrainer itself, not this trainer: read as "this checkout's version".
ONETRAINER_INSTALL_CMD = "git clone https://github.com/Nerogar/OneTrainer"


class CloudError(Exception):
    """A cloud setting or the secrets file is wrong; the message names the field or the file."""


@dataclass
class CloudSettings:
    enabled: bool = False
    type: str = "RUNPOD"
    file_sync: str = "NATIVE_SCP"
    create: bool = False
    name: str = "OneTrainer"
    sub_type: str = ""
    gpu_type: str = ""
    volume_size: int = 100
    min_download: int = 0
    remote_dir: str = "/workspace"
    huggingface_cache_dir: str = "/workspace/huggingface_cache"
    onetrainer_dir: str = "/workspace/OneTrainer"
    install_cmd: str = ONETRAINER_INSTALL_CMD
    install_onetrainer: bool = True
    update_onetrainer: bool = True
    detach_trainer: bool = False
    run_id: str = "job1"
    # Only follow the host's run of `run_id`, never start one (the cloud tab's Reattach now; `--set
    # cloud.attach_only=true`): a host without that run refuses the start, naming it.
    attach_only: bool = False
    download_samples: bool = True
    download_output_model: bool = True
    download_saves: bool = True
    download_backups: bool = False
    download_tensorboard: bool = False
    delete_workspace: bool = False
    tensorboard_tunnel: bool = True
    on_finish: str = "NONE"
    on_error: str = "NONE"
    on_detached_finish: str = "NONE"
    on_detached_error: str = "NONE"

    @classmethod
    def from_dict(cls, data: Any) -> CloudSettings:
        """The `cloud` block; an unknown key is ignored (OneTrainer's later fields), a wrong type or value refused by
        name (`cloud.<field>`)."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise CloudError(f"cloud: expected an object of settings, got {type(data).__name__}")
        settings = cls()
        for f in fields(cls):
            if f.name not in data or data[f.name] is None:
                continue
            value, default = data[f.name], getattr(settings, f.name)
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise CloudError(f"cloud.{f.name}: expected true or false, got {value!r}")
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise CloudError(f"cloud.{f.name}: expected a whole number, got {value!r}")
            elif not isinstance(value, str):
                raise CloudError(f"cloud.{f.name}: expected text, got {value!r}")
            setattr(settings, f.name, value)
        for name, choices in (
            ("type", TYPES),
            ("file_sync", FILE_SYNCS),
            ("on_finish", ACTIONS),
            ("on_error", ACTIONS),
            ("on_detached_finish", ACTIONS),
            ("on_detached_error", ACTIONS),
        ):
            if getattr(settings, name) not in choices:
                raise CloudError(f"cloud.{name}: {getattr(settings, name)!r} is not one of {', '.join(choices)}")
        if not settings.run_id or "/" in settings.run_id or settings.run_id in (".", ".."):
            raise CloudError(f"cloud.run_id: {settings.run_id!r} must be a non-empty name without '/'")
        for name in ("remote_dir", "onetrainer_dir"):
            if not getattr(settings, name).startswith("/"):
                raise CloudError(f"cloud.{name}: {getattr(settings, name)!r} must be an absolute path on the host")
        return settings

    @property
    def own_install(self) -> bool:
        """Install this checkout's version (its files uploaded, then its install.sh), not a command of the user's."""
        return self.install_cmd.strip() in ("", ONETRAINER_INSTALL_CMD)


@dataclass
class CloudSecrets:
    host: str = ""
    port: int = 0
    user: str = "root"
    key_file: str = ""
    password: str = ""
    api_key: str = ""
    id: str = ""

    def __repr__(self) -> str:  # never a secret in a traceback, a log line or a message
        hidden = {name: "***" for name in ("password", "api_key") if getattr(self, name)}
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("password", "api_key")}
        return f"CloudSecrets({', '.join(f'{k}={v!r}' for k, v in {**shown, **hidden}.items())})"

    __str__ = __repr__

    @classmethod
    def from_dict(cls, data: Any, where: str) -> CloudSecrets:
        secrets = cls()
        if not data:
            return secrets
        if not isinstance(data, dict):
            raise CloudError(f"{where}: 'cloud' must be an object")
        for f in fields(cls):
            value = data.get(f.name)
            if value is None:
                continue
            if f.name == "port":
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise CloudError(f"{where}: cloud.port must be a port number, got {value!r}") from None
            elif not isinstance(value, str):
                raise CloudError(f"{where}: cloud.{f.name} must be text")
            setattr(secrets, f.name, value)
        return secrets


def secrets_path() -> Path:
    explicit = os.environ.get(SECRETS_ENV)
    return Path(explicit).expanduser() if explicit else state_dir() / SECRETS_NAME


def read_secrets_file(path: Path | None = None) -> dict:
    """The whole secrets file ({} when there is none). Refused when others can read it: the user fixes the mode."""
    path = path or secrets_path()
    if not path.exists():
        return {}
    if os.name != "nt":
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise CloudError(
                f"the secrets file {path} can be read by other users (mode {mode:04o}): run `chmod 600 {path}`"
            )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        # The message names the file, not its text: a parse error may quote a secret.
        raise CloudError(f"the secrets file {path} cannot be read as JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise CloudError(f"the secrets file {path} must hold a JSON object")
    return data


def write_secrets_file(data: dict, path: Path | None = None) -> Path:
    """Write the secrets file, readable and writable by the user alone (0600) from its first byte."""
    path = path or secrets_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=4)
            f.write("\n")
        if os.name != "nt":
            os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    return path


def load_cloud_secrets(config_secrets: Any = None, path: Path | None = None) -> CloudSecrets:
    """The host and credentials: the secrets file's `cloud`, with what a config's own `secrets.cloud` gives (the app
    holds them in memory; they are never written with the config) filling the fields the file leaves empty."""
    path = path or secrets_path()
    secrets = CloudSecrets.from_dict(read_secrets_file(path).get("cloud"), str(path))
    if isinstance(config_secrets, dict) and config_secrets.get("cloud"):
        given = CloudSecrets.from_dict(config_secrets.get("cloud"), "secrets")
        for f in fields(CloudSecrets):
            if getattr(secrets, f.name) in ("", 0, "root") and getattr(given, f.name) not in ("", 0):
                setattr(secrets, f.name, getattr(given, f.name))
    return secrets

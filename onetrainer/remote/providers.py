"""Where a cloud run's host comes from (`cloud.type`), behind one interface.

- LINUX: a machine of the user's; the secrets file names it. Nothing is created, stopped or deleted.
- RUNPOD: a pod of RunPod's, found by `secrets.cloud.id` or created (`cloud.create`); `on_finish` / `on_error` STOP or
  DELETE it through RunPod's API (`runpod.py`).
"""

from __future__ import annotations

from typing import Protocol

from onetrainer.remote.settings import CloudError, CloudSecrets, CloudSettings
from onetrainer.training.events import Broadcast, Warning_


class Provider(Protocol):
    def prepare(self, events: Broadcast) -> CloudSecrets:
        """The host to connect to (found, created or started as needed), with the login from the secrets file."""
        ...

    def act(self, action: str, events: Broadcast, setting: str) -> None:
        """STOP or DELETE the host after the run (`setting` names the cloud field that asked, for messages)."""
        ...

    def detached_command(self, action: str, events: Broadcast, setting: str) -> str | None:
        """The shell command the host runs itself to STOP or DELETE itself when a detached run ends unfollowed."""
        ...


class LinuxProvider:
    def __init__(self, settings: CloudSettings, secrets: CloudSecrets) -> None:
        self.settings = settings
        self.secrets = secrets

    def prepare(self, events: Broadcast) -> CloudSecrets:
        if not self.secrets.host:
            raise CloudError("secrets: cloud.host is empty: a LINUX cloud run needs the host in the secrets file")
        return self.secrets

    def act(self, action: str, events: Broadcast, setting: str) -> None:
        events.emit(Warning_(f"{setting} {action}: a LINUX host is the user's machine: it is left running as it is"))

    def detached_command(self, action: str, events: Broadcast, setting: str) -> str | None:
        if action != "NONE":
            self.act(action, events, setting)
        return None


def provider_for(settings: CloudSettings, secrets: CloudSecrets) -> Provider:
    if settings.type == "LINUX":
        return LinuxProvider(settings, secrets)
    from onetrainer.remote.runpod import RunPodProvider

    return RunPodProvider(settings, secrets)

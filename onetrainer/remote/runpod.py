"""RunPod pods as cloud hosts, through RunPod's REST API (https://rest.runpod.io/v1, a bearer API key).

- `secrets.cloud.id` names the pod to train on; without one, `cloud.create` creates a pod (`cloud.name`,
  `cloud.gpu_type`, `cloud.sub_type` as the cloud type SECURE / COMMUNITY, `cloud.volume_size` GB mounted at
  /workspace, `cloud.min_download` Mbps, port 22 exposed, the public half of `secrets.cloud.key_file` as the pod's
  `PUBLIC_KEY`) and records its id in the secrets file, so the next Start (a reattach) finds the same pod;
- a stopped pod (EXITED) is started; then the pod's public address and the port its SSH (22) is mapped to are waited
  for and become the SSH host and port (the user and key or password are the secrets file's);
- `cloud.on_finish` / `on_error`: STOP stops the pod (its volume is kept, billed at the storage rate), DELETE
  terminates it (everything on it is gone).

The API key is sent only in the Authorization header to the API's address, never logged or shown (an error names the
HTTP status and RunPod's message).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from onetrainer.remote.settings import (
    CloudError,
    CloudSecrets,
    CloudSettings,
    read_secrets_file,
    secrets_path,
    write_secrets_file,
)
from onetrainer.training.events import Broadcast, Status

API_URL = "https://rest.runpod.io/v1"
API_ENV = "ONETRAINER_RUNPOD_API"  # another address for the API (the tests' stand-in server)
# A CUDA image with Python 3.11 and git, where install.sh installs this trainer.
IMAGE = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"
CONTAINER_DISK_GB = 30
WAIT_SECONDS = 900.0  # for a pod's public address after creating or starting it
POLL_SECONDS = 5.0


class RunPodApi:
    def __init__(self, api_key: str, url: str | None = None) -> None:
        self.api_key = api_key
        self.url = (url or os.environ.get(API_ENV) or API_URL).rstrip("/")

    def call(self, method: str, path: str, body: dict | None = None) -> dict | None:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.api_key}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            if e.code == 404 and method == "GET":
                return None
            said = _message(e.read().decode("utf-8", "replace"))
            hint = " (secrets: cloud.api_key)" if e.code in (401, 403) else ""
            raise CloudError(f"RunPod's API refused {method} {path}: HTTP {e.code}{hint}: {said}") from None
        except (urllib.error.URLError, OSError) as e:
            raise CloudError(f"RunPod's API at {self.url} cannot be reached: {e}") from None
        return json.loads(text) if text.strip() else {}


def _message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:200]
    if isinstance(data, dict):
        return str(data.get("error") or data.get("message") or data)[:200]
    return str(data)[:200]


class RunPodProvider:
    def __init__(self, settings: CloudSettings, secrets: CloudSecrets, secrets_file: Path | None = None) -> None:
        if not secrets.api_key:
            raise CloudError("secrets: cloud.api_key is empty: a RUNPOD cloud run needs RunPod's API key")
        if not secrets.id and not settings.create:
            raise CloudError("secrets: cloud.id is empty: name the pod to train on, or turn on cloud.create")
        if not secrets.id and not settings.gpu_type:
            raise CloudError("cloud.gpu_type is empty: cloud.create needs the GPU type (e.g. 'NVIDIA RTX A5000')")
        self.settings = settings
        self.secrets = secrets
        self.secrets_file = secrets_file or secrets_path()
        self.api = RunPodApi(secrets.api_key)

    def prepare(self, events: Broadcast) -> CloudSecrets:
        if not self.secrets.id:
            self._create(events)
        pod = self.api.call("GET", f"/pods/{self.secrets.id}")
        if pod is None:
            raise CloudError(f"secrets: cloud.id: RunPod has no pod {self.secrets.id!r}")
        if pod.get("desiredStatus") == "EXITED":
            events.emit(Status(f"starting the stopped pod {self.secrets.id}"))
            self.api.call("POST", f"/pods/{self.secrets.id}/start")
        return self._wait_for_address(events)

    def _create(self, events: Broadcast) -> None:
        settings = self.settings
        body: dict = {
            "name": settings.name,
            "imageName": IMAGE,
            "gpuTypeIds": [settings.gpu_type],
            "gpuCount": 1,
            "supportPublicIp": True,
            "ports": ["22/tcp"],
            "volumeInGb": settings.volume_size,
            "volumeMountPath": "/workspace",
            "containerDiskInGb": CONTAINER_DISK_GB,
        }
        if settings.sub_type:
            body["cloudType"] = settings.sub_type
        if settings.min_download:
            body["minDownloadMbps"] = settings.min_download
        if self.secrets.key_file:
            public = Path(self.secrets.key_file + ".pub").expanduser()
            if public.is_file():
                body["env"] = {"PUBLIC_KEY": public.read_text(encoding="utf-8").strip()}
        events.emit(Status(f"creating a RunPod pod ({settings.gpu_type}, {settings.volume_size} GB volume)"))
        pod = self.api.call("POST", "/pods", body) or {}
        if not pod.get("id"):
            raise CloudError("RunPod's API created no pod (its answer has no id)")
        self.secrets.id = str(pod["id"])
        # The next Start (a reattach after a restart) must find this pod, not create another.
        data = read_secrets_file(self.secrets_file)
        data.setdefault("cloud", {})["id"] = self.secrets.id
        write_secrets_file(data, self.secrets_file)
        events.emit(Status(f"created the pod {self.secrets.id} (its id is kept in {self.secrets_file})"))

    def _wait_for_address(self, events: Broadcast) -> CloudSecrets:
        deadline = time.monotonic() + WAIT_SECONDS
        said = False
        while True:
            pod = self.api.call("GET", f"/pods/{self.secrets.id}") or {}
            ip, ports = pod.get("publicIp"), pod.get("portMappings") or {}
            port = ports.get("22") if isinstance(ports, dict) else None
            if ip and port:
                events.emit(Status(f"the pod {self.secrets.id} answers SSH at {ip}:{port}"))
                return replace(self.secrets, host=str(ip), port=int(port))
            if time.monotonic() > deadline:
                raise CloudError(
                    f"the pod {self.secrets.id} has no public SSH address after {WAIT_SECONDS:.0f} s: see "
                    f"https://www.runpod.io/console/pods?id={self.secrets.id}"
                )
            if not said:
                events.emit(Status(f"waiting for the pod {self.secrets.id}'s public address"))
                said = True
            time.sleep(POLL_SECONDS)

    def act(self, action: str, events: Broadcast, setting: str) -> None:
        if action == "STOP":
            self.api.call("POST", f"/pods/{self.secrets.id}/stop")
            events.emit(Status(f"{setting}: stopped the pod {self.secrets.id} (its volume is kept)"))
        elif action == "DELETE":
            self.api.call("DELETE", f"/pods/{self.secrets.id}")
            data = read_secrets_file(self.secrets_file)
            if (data.get("cloud") or {}).get("id") == self.secrets.id:  # gone: the next Start creates or names another
                data["cloud"]["id"] = ""
                write_secrets_file(data, self.secrets_file)
            events.emit(Status(f"{setting}: deleted the pod {self.secrets.id}"))

    def detached_command(self, action: str, events: Broadcast, setting: str) -> str | None:
        """RunPod's pods carry `runpodctl` and their own id ($RUNPOD_POD_ID, in /etc/rp_environment for a login)."""
        verb = {"STOP": "stop", "DELETE": "remove"}.get(action)
        if verb is None:
            return None
        return f'[ -f /etc/rp_environment ] && . /etc/rp_environment; runpodctl {verb} pod "$RUNPOD_POD_ID"'

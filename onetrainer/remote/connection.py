"""One SSH connection to the training host (paramiko): the host key checked, commands run, files sent and fetched.

Host keys: the user's `~/.ssh/known_hosts` and the app's own `known_hosts` (in its folder) are read. A host seen for
the first time is trusted and its key recorded in the app's file (as `ssh -o StrictHostKeyChecking=accept-new`); a
host whose key differs from the one recorded is refused, naming the host and the file holding the old key. No
message, log line or exception text carries the password or the key's passphrase.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path

import paramiko

from onetrainer.remote.settings import CloudError, CloudSecrets
from onetrainer.util.app_dirs import state_dir

KNOWN_HOSTS_NAME = "known_hosts"
CONNECT_TIMEOUT = 20.0


class RemoteError(Exception):
    """The host cannot be reached, refused us, or a command on it failed; the message says which, never a secret."""


class HostKeyChanged(RemoteError):
    pass


class AuthenticationFailed(RemoteError):
    pass


def known_hosts_path() -> Path:
    return state_dir() / KNOWN_HOSTS_NAME


def host_label(host: str, port: int) -> str:
    return host if port in (0, 22) else f"[{host}]:{port}"


class _RecordNewHost(paramiko.MissingHostKeyPolicy):
    """Trust a host seen for the first time and record its key in the app's known_hosts."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


class SshHost:
    """A connected host. `run` returns the exit code and output; `check` raises on a non-zero exit."""

    def __init__(self, secrets: CloudSecrets, known_hosts: Path | None = None) -> None:
        if not secrets.host:
            raise CloudError("secrets: cloud.host is empty: set the host in the secrets file (or the cloud tab)")
        if not secrets.key_file and not secrets.password:
            raise CloudError("secrets: give cloud.key_file or cloud.password to log in to the host")
        self.secrets = secrets
        self.port = secrets.port or 22
        self.label = f"{secrets.user}@{host_label(secrets.host, self.port)}"
        self.known_hosts = known_hosts or known_hosts_path()
        self.client = paramiko.SSHClient()
        self._sftp: paramiko.SFTPClient | None = None
        self._connect()

    def _connect(self) -> None:
        client = self.client
        with contextlib.suppress(OSError):
            client.load_system_host_keys()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_RecordNewHost(self.known_hosts))
        key = None
        if self.secrets.key_file:
            key_path = Path(self.secrets.key_file).expanduser()
            try:
                key = paramiko.PKey.from_path(str(key_path), self.secrets.password.encode() or None)
            except FileNotFoundError:
                raise CloudError(f"secrets: cloud.key_file {key_path} does not exist") from None
            except (paramiko.SSHException, ValueError) as e:
                raise CloudError(f"secrets: cloud.key_file {key_path} cannot be read as a private key ({e})") from None
        where = host_label(self.secrets.host, self.port)
        try:
            client.connect(
                self.secrets.host,
                port=self.port,
                username=self.secrets.user,
                pkey=key,
                password=None if key is not None else self.secrets.password,
                timeout=CONNECT_TIMEOUT,
                banner_timeout=CONNECT_TIMEOUT,
                auth_timeout=CONNECT_TIMEOUT,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException:
            raise HostKeyChanged(
                f"the host key of {where} has changed since it was recorded (in {self.known_hosts} or "
                "~/.ssh/known_hosts): refused, as it may be another machine posing as it. If the host was reinstalled, "
                f"remove its line (ssh-keygen -R '{where}' -f FILE) and connect again"
            ) from None
        except paramiko.AuthenticationException:
            how = "the key file" if key is not None else "the password"
            raise AuthenticationFailed(
                f"{self.label} refused the login with {how} (secrets: cloud.user, cloud.key_file, cloud.password)"
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"cannot connect to {where}: {type(e).__name__}: {e}") from None

    # -- commands ---------------------------------------------------------------------------------------------------
    def run(self, command: str, stdin: bytes = b"", timeout: float = 600) -> tuple[int, str, str]:
        self._require_connection()
        try:
            channel_in, channel_out, channel_err = self.client.exec_command(command, timeout=timeout)
            if stdin:
                channel_in.write(stdin)
            channel_in.channel.shutdown_write()
            out = channel_out.read().decode("utf-8", "replace")
            err = channel_err.read().decode("utf-8", "replace")
            return channel_out.channel.recv_exit_status(), out, err
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"the connection to {self.label} failed: {type(e).__name__}: {e}") from None

    def check(self, command: str, what: str, stdin: bytes = b"", timeout: float = 600) -> str:
        code, out, err = self.run(command, stdin, timeout)
        if code != 0:
            lines = [line for line in (err or out).strip().splitlines() if line.strip()]
            tail = "\n".join(lines[-8:])
            raise RemoteError(f"{what} failed on {self.label} (exit code {code})" + (f":\n{tail}" if tail else ""))
        return out

    def _require_connection(self) -> None:
        if not self.alive:
            raise RemoteError(f"the connection to {self.label} is closed")

    @property
    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self._sftp = None
        with contextlib.suppress(Exception):
            self.client.close()

    # -- files ------------------------------------------------------------------------------------------------------
    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None or self._sftp.sock.closed:
            self._require_connection()
            try:
                self._sftp = self.client.open_sftp()
            except (OSError, paramiko.SSHException, EOFError) as e:
                raise RemoteError(f"cannot open SFTP on {self.label}: {type(e).__name__}: {e}") from None
        return self._sftp

    def hashes(self, python: str, paths: list[str]) -> dict[str, str]:
        """The SHA-256 of each remote file that exists, computed on the host (nothing is downloaded)."""
        if not paths:
            return {}
        script = (
            "import hashlib,json,os,sys\n"
            "out={}\n"
            "for p in json.load(sys.stdin):\n"
            "    if os.path.isfile(p):\n"
            "        h=hashlib.sha256()\n"
            "        with open(p,'rb') as f:\n"
            "            for b in iter(lambda:f.read(1<<20),b''): h.update(b)\n"
            "        out[p]=h.hexdigest()\n"
            "print(json.dumps(out))\n"
        )
        command = f"{python_or_system(python)} -c {shlex.quote(script)}"
        out = self.check(command, "hashing the files on the host", stdin=json.dumps(paths).encode())
        return json.loads(out.strip().splitlines()[-1])

    def upload(self, files: dict[str, Path], python: str) -> tuple[int, int]:
        """Send each local file to its remote path unless the host has the same content; (files sent, bytes sent)."""
        remote_hashes = self.hashes(python, list(files))
        sent = size = 0
        made: set[str] = set()
        for remote, local in files.items():
            if remote_hashes.get(remote) == file_hash(local):
                continue
            self.makedirs(posixpath.dirname(remote), made)
            try:
                self.sftp.put(str(local), remote)
            except (OSError, paramiko.SSHException, EOFError) as e:
                raise RemoteError(f"uploading {local} to {self.label}:{remote} failed: {e}") from None
            sent += 1
            size += local.stat().st_size
        return sent, size

    def put_bytes(self, data: bytes, remote: str) -> None:
        self.makedirs(posixpath.dirname(remote), set())
        try:
            with self.sftp.open(remote, "wb") as f:
                f.write(data)
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"writing {self.label}:{remote} failed: {e}") from None

    def read_from(self, remote: str, offset: int) -> bytes | None:
        """A remote file's bytes from `offset` (None when it does not exist)."""
        try:
            with self.sftp.open(remote, "rb") as f:
                f.seek(offset)
                return f.read()
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"reading {self.label}:{remote} failed: {e}") from None

    def makedirs(self, remote: str, made: set[str]) -> None:
        if not remote or remote == "/" or remote in made:
            return
        with self._failing(f"making the folder {remote}"):
            try:
                self.sftp.stat(remote)
            except FileNotFoundError:
                self.makedirs(posixpath.dirname(remote), made)
                with contextlib.suppress(PermissionError, FileExistsError):  # made meanwhile
                    self.sftp.mkdir(remote)
        made.add(remote)

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """A transport error (the connection dropped) as a RemoteError; a missing file stays FileNotFoundError."""
        try:
            yield
        except FileNotFoundError:
            raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise RemoteError(f"{what} on {self.label} failed: {type(e).__name__}: {e}") from None

    def walk(self, remote: str) -> Iterator[tuple[str, int, float]]:
        """Every file under a remote folder (or the file itself): its path, size and modification time."""
        try:
            with self._failing(f"reading {remote}"):
                attributes = self.sftp.stat(remote)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(attributes.st_mode or 0):
            yield remote, attributes.st_size or 0, attributes.st_mtime or 0
            return
        with self._failing(f"listing {remote}"):
            entries = self.sftp.listdir_attr(remote)
        for entry in entries:
            yield from self.walk(posixpath.join(remote, entry.filename))

    def download(self, remote: str, local: Path) -> tuple[int, int]:
        """A remote file or folder into `local`, files that already match by size and time skipped; (files, bytes)."""
        got = size = 0
        for path, length, mtime in list(self.walk(remote)):
            relative = posixpath.relpath(path, remote)
            target = local if relative == "." else local / Path(*relative.split("/"))
            if target.exists() and target.stat().st_size == length and int(target.stat().st_mtime) == int(mtime):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.sftp.get(path, str(target))
            except (OSError, paramiko.SSHException, EOFError) as e:
                raise RemoteError(f"downloading {self.label}:{path} failed: {e}") from None
            os.utime(target, (mtime, mtime))
            got += 1
            size += length
        return got, size


def python_or_system(python: str) -> str:
    """The trainer's Python on the host, or python3 where it is not installed yet."""
    quoted = shlex.quote(python)
    return f"$( [ -x {quoted} ] && echo {quoted} || echo python3 )"


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

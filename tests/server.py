"""A real ``compactor serve`` process, started as a user starts it, for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """The console script of this interpreter's environment, settings from the environment
    (``COMPACTOR_*``: the data dir and port given here, then ``defaults``, then ``env``)."""

    defaults: dict[str, str] = {}

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 120.0) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        script = shutil.which("compactor", path=str(Path(sys.executable).parent)) or "compactor"
        env = {
            **os.environ,
            "COMPACTOR_DATA_DIR": str(self.data_dir),
            "COMPACTOR_PORT": str(self.port),
            "COMPACTOR_HOST": "127.0.0.1",
            **self.defaults,
            **self.extra_env,
        }
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [script, "serve", "--log-level", "warning"], env=env, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy in {timeout:g} s:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash or a power cut of the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """SIGTERM: a clean shutdown; killed if it takes more than 30 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

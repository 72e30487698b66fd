"""A `view-run` (or `view-run-multimodal`) subprocess on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from atroposlib.utils.ports import free_port
from atroposlib.utils.waiting import answers_200
from tests.support.waiting import wait_until


class ViewerProcess:
    """`python -m atroposlib.cli.<module> --port P ARGS...`, up once its page answers."""

    def __init__(self, log_dir: Path, module: str, *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{module}-{self.port}.log"
        cmd = [sys.executable, "-m", f"atroposlib.cli.{module}", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the viewer exited early:\n{self.log()}")
        return answers_200(self.url)

    def wait_ready(self, timeout_s: float = 120) -> ViewerProcess:
        try:
            wait_until(self._answers, timeout_s, "the viewer page did not answer")
        except AssertionError as failure:
            raise AssertionError(f"{failure}:\n{self.log()}") from None
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

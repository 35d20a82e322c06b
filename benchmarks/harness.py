"""Starting servers and clients for the benchmarks: one way to launch a process, wait until it
serves, stop it, and run a load-generation client to its result file.

A pagedserve server is ``python -m pagedserve serve`` (``pagedserve_command``; its router
``python -m pagedserve router``); a peer server (vLLM, llama.cpp) is any command line.
``start`` launches either with its output in a log file (or piped, to read the address a
``--port 0`` server prints); ``wait_ready`` polls an HTTP path until it answers 200,
``read_address`` reads the address pagedserve prints, and ``stop`` sends SIGTERM (pagedserve
drains gracefully) and kills what outlives the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# The line ``pagedserve serve`` prints once it accepts requests, ending in its base URL.
SERVING_ON = "pagedserve: serving on "
PAGEDSERVE = [sys.executable, "-m", "pagedserve"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pagedserve_command(*flags: str) -> list[str]:
    """``pagedserve serve`` with ``flags``, run by this interpreter."""
    return [*PAGEDSERVE, "serve", *flags]


def start(command: list[str], *, log: Path | None = None, append: bool = False,
          env: Mapping[str, str] | None = None, cpus: set[int] | None = None,
          cwd: Path | None = None, new_session: bool = False,
          stderr: int | None = None) -> subprocess.Popen[Any]:
    """``command`` in a child process: stdout and stderr into ``log`` (truncated unless
    ``append``), or stdout piped as text when there is no log (stderr then goes where
    ``stderr`` says, as in ``subprocess``). ``env`` replaces the environment as
    ``subprocess`` does; ``cpus`` pins the process (every thread it starts) to those cores;
    ``new_session`` keeps a terminal's Ctrl-C from reaching it."""
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    if log is None:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=env, preexec_fn=pin, cwd=cwd,
                                start_new_session=new_session)
    with log.open("ab" if append else "wb") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=pin, cwd=cwd, start_new_session=new_session)


def read_address(process: subprocess.Popen[Any], timeout_s: float,
                 ready: str = SERVING_ON) -> str:
    """The base URL a piped ``pagedserve serve`` prints once it serves (at the end of the
    line that starts with ``ready``; ``pagedserve router`` prints its own); kills the
    process and raises if it exits or prints no such line within ``timeout_s``."""
    assert process.stdout is not None, "start the server without a log to read its address"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the server exited with status {process.wait()}")
        if line.startswith(ready):
            return line.rsplit(" ", 1)[1].strip()
    process.kill()
    raise RuntimeError(f"the server did not start in {timeout_s:.0f} s")


def wait_ready(base_url: str, process: subprocess.Popen[Any] | None, timeout_s: float,
               path: str = "/health", poll_s: float = 0.5) -> float:
    """Seconds until ``GET base_url + path`` answers 200, asked every ``poll_s``; raises if the
    process exits first or the time runs out."""
    start_time = time.monotonic()
    while time.monotonic() - start_time < timeout_s:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with status {process.returncode} before it "
                               f"was ready")
        with (contextlib.suppress(OSError),
              urllib.request.urlopen(base_url + path, timeout=5) as response):
            if response.status == 200:
                return time.monotonic() - start_time
        time.sleep(poll_s)
    raise RuntimeError(f"server at {base_url} not ready after {timeout_s:.0f} s")


def stop(process: subprocess.Popen[Any], timeout_s: float = 30.0) -> int:
    """SIGTERM (a graceful drain for pagedserve), then SIGKILL after ``timeout_s``; returns
    the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@contextlib.contextmanager
def running(command: list[str], *, stop_timeout_s: float = 30.0,
            **start_options: Any) -> Iterator[subprocess.Popen[Any]]:
    """``start(command, **start_options)``, stopped when the block ends."""
    process = start(command, **start_options)
    try:
        yield process
    finally:
        stop(process, stop_timeout_s)


def launch_pagedserve(flags: list[str], timeout_s: float) -> tuple[subprocess.Popen[str], str]:
    """``pagedserve serve`` on a free port of 127.0.0.1 with ``flags``; returns the process
    and its base URL once it serves."""
    process = start(pagedserve_command("--host", "127.0.0.1", "--port", "0", *flags))
    return process, read_address(process, timeout_s)


def run_client(command: list[str], result: Path, env: Mapping[str, str] | None = None
               ) -> dict[str, Any]:
    """Runs a load-generation client (``pagedserve bench``, ``vllm bench serve``) that writes
    ``result``, with its output in ``result``'s ``.log`` beside it; returns the result's
    JSON. ``env`` adds to this process's environment."""
    log = result.with_suffix(".log")
    with log.open("wb") as sink:
        done = subprocess.run(command, env={**os.environ, **(env or {})}, stdout=sink,
                              stderr=subprocess.STDOUT, cwd=result.parent, check=False)
    if done.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"client exited with {done.returncode}:\n{tail}")
    return json.loads(result.read_text())

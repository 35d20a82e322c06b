"""benchmarks.harness: starting a server, knowing when it serves, stopping it, and running a
client to its result, on stand-in processes (a few lines of Python each)."""

from __future__ import annotations

import signal
import sys

import pytest

from benchmarks import harness

SERVING = ("import time; print('loading'); print('pagedserve: serving on http://127.0.0.1:1234',"
           " flush=True); time.sleep(60)")


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_read_address_reads_the_line_pagedserve_prints_then_stop_terminates() -> None:
    process = harness.start(python(SERVING))
    assert harness.read_address(process, 30) == "http://127.0.0.1:1234"
    assert harness.stop(process) == -signal.SIGTERM
    assert harness.stop(process) == -signal.SIGTERM  # stopping twice is harmless


def test_read_address_reports_a_server_that_exits() -> None:
    process = harness.start(python("import sys; print('no model'); sys.exit(3)"))
    with pytest.raises(RuntimeError, match="the server exited with status 3"):
        harness.read_address(process, 30)


def test_wait_ready_polls_until_the_path_answers(tmp_path) -> None:
    (tmp_path / "health").write_text("ok")
    port = harness.free_port()
    command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port),
               "--directory", str(tmp_path)]
    with harness.running(command, log=tmp_path / "server.log") as process:
        seconds = harness.wait_ready(f"http://127.0.0.1:{port}", process, 60)
        assert seconds >= 0.0
    assert process.returncode == -signal.SIGTERM
    assert "GET /health" in (tmp_path / "server.log").read_text()


def test_wait_ready_reports_a_server_that_exits_first(tmp_path) -> None:
    process = harness.start(python("import sys; sys.exit(2)"), log=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="server exited with status 2 before it was ready"):
        harness.wait_ready(f"http://127.0.0.1:{harness.free_port()}", process, 60)


def test_a_log_is_truncated_unless_appended(tmp_path) -> None:
    log = tmp_path / "server.log"
    for append in (False, True):
        harness.start(python("print('run')"), log=log, append=append).wait()
    assert log.read_text() == "run\nrun\n"
    harness.start(python("print('run')"), log=log).wait()
    assert log.read_text() == "run\n"


def test_pagedserve_command_runs_the_package_with_this_interpreter() -> None:
    assert harness.pagedserve_command("--model", "tiny") == [
        sys.executable, "-m", "pagedserve", "serve", "--model", "tiny"]


def test_run_client_returns_the_result_and_keeps_its_log(tmp_path) -> None:
    result = tmp_path / "run.json"
    code = ("import json, os, sys; print('sending'); "
            "json.dump({'completed': 3, 'flag': os.environ['FLAG']}, open(sys.argv[1], 'w'))")
    assert harness.run_client(python(code, str(result)), result, {"FLAG": "on"}) == {
        "completed": 3, "flag": "on"}
    assert (tmp_path / "run.log").read_text() == "sending\n"
    failing = tmp_path / "failed.json"
    with pytest.raises(RuntimeError, match="client exited with 1:\nbad flag"):
        harness.run_client(python("import sys; print('bad flag'); sys.exit(1)"), failing)

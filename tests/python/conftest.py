"""Fixtures: a client of the server that run.sh started, and servers started per test
module from a config file (two models, an API key)."""

import os
import pathlib
import socket
import subprocess
import time
import urllib.request

import openai
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = ROOT / "fixtures" / "tiny-llama"


def _log_tail(log: pathlib.Path, lines: int = 40) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        return f"(no log at {log}: {e})"
    return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(proc: subprocess.Popen, url: str, log: pathlib.Path, timeout: float = 60.0):
    """Waits for `url`/health to answer; raises with the log's tail if the server exits or
    is not healthy within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"dcpserve serve exited with {proc.returncode} before it was healthy; "
                f"last lines of {log}:\n{_log_tail(log)}"
            )
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(
        f"dcpserve serve was not healthy at {url} after {timeout:.0f} s; "
        f"last lines of {log}:\n{_log_tail(log)}"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def base_url() -> str:
    url = os.environ.get("DCPSERVE_BASE_URL")
    if not url:
        pytest.skip("DCPSERVE_BASE_URL is not set: run tests/python/run.sh")
    return url


@pytest.fixture(scope="session")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def config_server(tmp_path_factory):
    """`dcpserve serve --config` with the default model and tiny-llama, behind an API key."""
    binary = os.environ.get("DCPSERVE_BIN", str(ROOT / "target" / "release" / "dcpserve"))
    cfg = tmp_path_factory.mktemp("cfg") / "models.toml"
    cfg.write_text(
        f"""
[server]
api_key = "test-key"
max_waiting_requests = 8

[[models]]
name = "smollm2"
path = "{DEFAULT_MODEL}"
kv_cache_memory_bytes = 134217728
max_model_len = 1024
threads = 1

[models.sampling]
temperature = 0.0
max_tokens = 8

[[models]]
name = "tiny"
path = "{TINY}"
dtype = "float32"
kv_cache_memory_bytes = 16777216
threads = 1
"""
    )
    port = _free_port()
    # The server's output goes to a file: a pipe nobody reads could fill and block it.
    log = cfg.parent / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "serve", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, log)
        yield url + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_server(log_dir: pathlib.Path, args: list[str]):
    """Starts `dcpserve serve ARGS` on a free port; yields its /v1 URL and stops it after.
    For module fixtures of servers with their own model and layout."""
    binary = os.environ.get("DCPSERVE_BIN", str(ROOT / "target" / "release" / "dcpserve"))
    port = _free_port()
    log = log_dir / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# The tiny fixture at tp=4 dcp=2 (four ranks; the KV cache sharded by position on two).
TINY_TP4_DCP2 = [
    str(TINY), "--served-model-name", "tiny", "--dtype", "float32",
    "--tensor-parallel-size", "4", "--decode-context-parallel-size", "2",
    "--kv-cache-memory-bytes", "16777216", "--threads", "1", "--max-num-seqs", "64",
]

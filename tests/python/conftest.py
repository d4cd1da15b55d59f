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
    proc = subprocess.Popen(
        [binary, "serve", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode())
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield url + "/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)

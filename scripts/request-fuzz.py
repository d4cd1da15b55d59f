#!/usr/bin/env python3
"""A request storm against a running `dcpserve serve`: valid, boundary and malformed
requests, streamed and not, with random disconnects, from many client threads at once.

    scripts/request-fuzz.py --exe target/release/dcpserve --requests 5000 -- \\
        models/SmolLM2-135M-Instruct.Q4_1.gguf --served-model-name m --threads 2

starts the server itself (`serve --host 127.0.0.1 --port P` plus the arguments after
`--`), or with `--base-url http://127.0.0.1:8000 --model m` uses one already running
(then memory is only checked when `--server-pid` is given). Checks, each a failure that
names the request (kind, seed) which broke it:

* every answer has a status the API documents for the input (2xx, 400, 401, 404, 405,
  413, 415, 422, 429): never a 5xx, and every error body is OpenAI-shaped
  (`{"error": {"message": str, "type": str, ...}}`); a 200 stream ends with
  `data: [DONE]` and carries no error event;
* no request outlives its deadline (`--deadline`, seconds; a hang is a failure);
* afterwards the server's running and waiting counts and its KV usage return to zero
  (`/metrics`), within 10 s;
* the server's resident memory (VmRSS of its process) stays bounded: it never exceeds
  `--rss-max-mb`, and it reaches a plateau: the second half of the storm grows it by
  at most `--rss-growth-mb` over what the first half left (the first half fills the
  allocator's arenas and the engine's buffers; a leak keeps growing);
* a greedy request gives the same text after the storm as before it.

Standard library only. Prints one JSON summary line (counts per kind and status, time,
requests per second, peak and final RSS) and exits 1 on any failure.
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

DOCUMENTED = {200, 400, 401, 404, 405, 413, 415, 422, 429}


# --------------------------------------------------------------------------- requests


def words(rng, n):
    pool = ["the", "capital", "of", "France", "is", "a", "river", "blue", "seven", "ok",
            "Über", "日本", "🙂", "\\n", "{", "}", "\"", "<|im_start|>", "</s>", "\u0000"]
    return " ".join(rng.choice(pool) for _ in range(n))


def sampling(rng):
    """Valid sampling fields, each present or not."""
    out = {}
    if rng.random() < 0.5:
        out["temperature"] = rng.choice([0, 0.0, 0.5, 1.0, 2.0])
    if rng.random() < 0.3:
        out["top_p"] = rng.choice([0.1, 0.9, 1.0])
    if rng.random() < 0.3:
        out["top_k"] = rng.choice([-1, 1, 5, 50])
    if rng.random() < 0.2:
        out["min_p"] = rng.choice([0.0, 0.05])
    if rng.random() < 0.2:
        out["seed"] = rng.randrange(1 << 31)
    if rng.random() < 0.2:
        out["stop"] = rng.choice(["\n", [".", "!"], [], "the"])
    if rng.random() < 0.1:
        out["presence_penalty"] = rng.choice([-2.0, 0.0, 1.5])
    if rng.random() < 0.1:
        out["frequency_penalty"] = rng.choice([-1.0, 0.5])
    if rng.random() < 0.1:
        out["repetition_penalty"] = rng.choice([0.8, 1.0, 1.3])
    if rng.random() < 0.1:
        out["min_tokens"] = rng.choice([0, 1, 2])
    if rng.random() < 0.2:
        out["ignore_eos"] = rng.random() < 0.5
    return out


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                            "n": {"type": "integer"}},
          "required": ["name", "n"]}
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def valid_completion(rng, model):
    body = {"model": model, "max_tokens": rng.randint(1, 8), **sampling(rng)}
    body["prompt"] = rng.choice([
        words(rng, rng.randint(1, 24)),
        [rng.randrange(1, 1000) for _ in range(rng.randint(1, 24))],
        [words(rng, 3), words(rng, 2)],
    ])
    if rng.random() < 0.2:
        body["logprobs"] = rng.choice([0, 1, 5])
    if rng.random() < 0.1:
        body["echo"] = True
    if rng.random() < 0.1:
        body["n"] = 2
    if rng.random() < 0.1:
        body["response_format"] = {"type": "json_object"}
    if rng.random() < 0.05:
        body["guided_choice"] = ["yes", "no"]
    return body


def valid_chat(rng, model):
    msgs = []
    if rng.random() < 0.3:
        msgs.append({"role": "system", "content": words(rng, 4)})
    for _ in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": words(rng, rng.randint(1, 12))})
        if rng.random() < 0.3:
            msgs.append({"role": "assistant", "content": words(rng, 3)})
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": "ok"})
    body = {"model": model, "messages": msgs, "max_tokens": rng.randint(1, 8), **sampling(rng)}
    r = rng.random()
    if r < 0.1:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": SCHEMA}}
    elif r < 0.15:
        body["response_format"] = {"type": "json_object"}
    elif r < 0.2:
        body["tools"] = [TOOL]
        body["tool_choice"] = rng.choice(["none", "auto", "required",
                                          {"type": "function", "function": {"name": "get_weather"}}])
    if rng.random() < 0.1:
        body["logprobs"] = True
        body["top_logprobs"] = rng.choice([0, 2])
    return body


def boundary(rng, model):
    """Valid shapes with values at or past the edges of what is allowed."""
    chat = rng.random() < 0.5
    body = valid_chat(rng, model) if chat else valid_completion(rng, model)
    field, value = rng.choice([
        ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 10**9), ("max_tokens", 2**63),
        ("max_tokens", 1.5), ("temperature", -0.1), ("temperature", 1e39),
        ("temperature", 1e308), ("top_p", 0.0), ("top_p", 1.0000001), ("top_k", 0),
        ("top_k", 10**12), ("min_p", 1.5), ("n", 0), ("n", 1000), ("seed", -1),
        ("seed", 2**64), ("stop", ["x"] * 100), ("stop", [""]), ("logprobs", 100),
        ("top_logprobs", 1000), ("repetition_penalty", 0.0), ("repetition_penalty", 1e-50),
        ("presence_penalty", 3.0), ("min_tokens", 10**6), ("stop_token_ids", [-1]),
        ("stop_token_ids", [10**12]), ("model", "no-such-model"), ("model", ""),
        ("stream_options", {"include_usage": True}), ("response_format", {"type": "text"}),
        ("response_format", {"type": "json_schema"}),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}),
        ("response_format", {"type": "regex"}), ("guided_regex", "[a-z]{0,3}"),
        ("guided_regex", "(("), ("guided_json", {"type": "array", "minItems": 1}),
        ("guided_grammar", "root ::= \"a\""), ("guided_choice", []),
        ("tools", [{"type": "function"}]), ("tool_choice", {"type": "function"}),
    ])
    body[field] = value
    if not chat and rng.random() < 0.5:
        body["prompt"] = rng.choice(["", [], [[]], [-1], [10**9], [[1, 2], "x"], "a" * 20000,
                                     [0] * 5000, "\u00ff" * 300])
    if chat and rng.random() < 0.5:
        body["messages"] = rng.choice([
            [], [{"role": "wizard", "content": "hi"}], [{"role": "user"}],
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            [{"role": "user", "content": None}], [{"content": "hi"}],
            [{"role": "user", "content": "word " * 4000}],
            [{"role": "user", "content": "x"}] * 500,
        ])
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def malformed(rng, model):
    """Bytes that are not a valid request: (method, path, headers, body bytes)."""
    path = rng.choice(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
    ok = json.dumps(valid_completion(rng, model)).encode()
    choice = rng.randrange(16)
    ct = {"Content-Type": "application/json"}
    if choice == 0:
        return "POST", path, ct, ok[: rng.randrange(len(ok))]
    if choice == 1:
        return "POST", path, ct, bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
    if choice == 2:
        return "POST", path, ct, rng.choice([b"[]", b"null", b"1", b"\"x\"", b"{}", b"true"])
    if choice == 3:
        return "POST", path, ct, b"[" * 100000 + b"]" * 100000
    if choice == 4:
        return "POST", path, ct, b'{"prompt": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}"
    if choice == 5:
        return "POST", path, {"Content-Type": "text/plain"}, ok
    if choice == 6:
        return "GET", path, {}, b""
    if choice == 7:
        return rng.choice(["PUT", "DELETE", "PATCH"]), path, ct, ok
    if choice == 8:
        junk = "".join(rng.choice(string.ascii_letters + "/%.") for _ in range(rng.randint(1, 40)))
        return "POST", "/" + junk, ct, ok
    if choice == 9:
        body = {"model": model, "prompt": {"x": 1}, "max_tokens": "7"}
        return "POST", path, ct, json.dumps(body).encode()
    if choice == 10:
        return "POST", path, ct, b'{"prompt": "\xff\xfe", "max_tokens": 1}'
    if choice == 11:
        return "POST", path, ct, b'{"prompt": "a", "prompt": 5, "max_tokens": 1, "max_tokens": -3}'
    if choice == 12:
        return "POST", path, ct, json.dumps({"model": model, "prompt": "x" * (1 << 20),
                                             "max_tokens": 1}).encode()
    if choice == 13:
        return "POST", path, ct, json.dumps({"model": model, "messages": "hi"}).encode()
    if choice == 14:
        return "POST", "/v1/chat/completions", ct, json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "x"}],
             "tools": [{"type": "function", "function": {"name": "f" * 5000,
                                                         "parameters": {"$ref": "#"}}}],
             "tool_choice": "required", "max_tokens": 2}).encode()
    return "POST", path, ct, json.dumps({"model": model, "prompt": "a", "max_tokens": 1,
                                         "n": 2, "stream": True, "echo": True,
                                         "logprobs": 3, "best_of": 5}).encode()


# --------------------------------------------------------------------------- transport


class Failure(Exception):
    pass


def check_error_body(status, data, what):
    try:
        body = json.loads(data)
        err = body["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str)
    except Exception:
        raise Failure(f"{what}: {status} without an OpenAI-style error body: {data[:200]!r}")


def send(host, port, method, path, headers, body, deadline, stream, disconnect_after=None):
    """One request on its own connection. Returns (status, kind) or raises Failure."""
    conn = http.client.HTTPConnection(host, port, timeout=deadline)
    started = time.monotonic()
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if disconnect_after == "body":
            conn.send(body[: len(body) // 2])
            conn.sock.shutdown(socket.SHUT_RDWR)
            return None
        conn.send(body)
        if disconnect_after == "sent":
            conn.sock.shutdown(socket.SHUT_RDWR)
            return None
        resp = conn.getresponse()
        status = resp.status
        if status >= 500 or status not in DOCUMENTED:
            raise Failure(f"status {status}: {resp.read()[:300]!r}")
        if status != 200:
            check_error_body(status, resp.read(), f"{method} {path}")
            return status
        if not stream:
            data = resp.read()
            try:
                json.loads(data)
            except Exception:
                raise Failure(f"200 with a body that is not JSON: {data[:200]!r}")
            return status
        events = 0
        done = False
        while True:
            if time.monotonic() - started > deadline:
                raise Failure("stream past its deadline")
            line = resp.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            events += 1
            if b'"error"' in payload and payload.startswith(b'{"error"'):
                raise Failure(f"error event in a 200 stream: {payload[:200]!r}")
            if disconnect_after == "stream" and events >= 2:
                conn.sock.shutdown(socket.SHUT_RDWR)
                return None
        if not done:
            raise Failure("stream ended without data: [DONE]")
        return status
    except socket.timeout:
        raise Failure(f"no answer within {deadline} s (hang)")
    except (ConnectionResetError, BrokenPipeError) as e:
        # The server may close a connection whose body it refuses (413); anything else
        # resetting is a failure.
        if disconnect_after:
            return None
        if len(body) > (8 << 20):
            return 413
        raise Failure(f"connection reset: {e}")
    finally:
        conn.close()


# --------------------------------------------------------------------------- server side


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = Counter()
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        for m in re.finditer(r"^dcpserve:" + name + r"\{[^}]*\} ([0-9.eE+-]+)$", text, re.M):
            out[name] += float(m.group(1))
    return out


def greedy_text(host, port, model):
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 16,
                       "temperature": 0, "ignore_eos": True}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise Failure(f"greedy request: {r.status} {data[:200]!r}")
    return json.loads(data)["choices"][0]["text"]


def start_server(exe, args, log):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(1200):
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}): {' '.join(cmd)}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, port
        except Exception:
            time.sleep(0.25)
    proc.kill()
    raise SystemExit("server not healthy after 300 s")


def served_model(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


# --------------------------------------------------------------------------- storm


def one(i, args, host, port, model):
    rng = random.Random(args.seed * 1_000_003 + i)
    r = rng.random()
    ct = {"Content-Type": "application/json"}
    disconnect = None
    if r < 0.30:
        kind = "valid"
        chat = rng.random() < 0.5
        body = valid_chat(rng, model) if chat else valid_completion(rng, model)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body["stream"] = rng.random() < 0.5
        method, headers, raw = "POST", ct, json.dumps(body).encode()
    elif r < 0.55:
        kind = "boundary"
        path, body = boundary(rng, model)
        body["stream"] = rng.random() < 0.5
        method, headers, raw = "POST", ct, json.dumps(body).encode()
    elif r < 0.85:
        kind = "malformed"
        method, path, headers, raw = malformed(rng, model)
        body = {}
    else:
        kind = "disconnect"
        chat = rng.random() < 0.5
        body = valid_chat(rng, model) if chat else valid_completion(rng, model)
        body["max_tokens"] = rng.randint(8, 48)
        body["stream"] = rng.random() < 0.7
        path = "/v1/chat/completions" if chat else "/v1/completions"
        method, headers, raw = "POST", ct, json.dumps(body).encode()
        disconnect = rng.choice(["body", "sent", "stream"] if body["stream"] else ["body", "sent"])
    if rng.random() < 0.01 and kind == "malformed":
        raw = b"{" + b" " * (33 << 20) + b"}"  # past the 32 MiB body limit
    if kind == "malformed":
        try:
            parsed = json.loads(raw)
            body = parsed if isinstance(parsed, dict) else {}
        except Exception:
            body = {}
    stream = body.get("stream") is True
    try:
        status = send(host, port, method, path, headers, raw, args.deadline, stream, disconnect)
    except Failure as e:
        return kind, "FAIL", f"request {i} ({kind}, seed {args.seed}, {method} {path}): {e}"
    except OSError as e:
        return kind, "FAIL", f"request {i} ({kind}, seed {args.seed}, {method} {path}): {e!r}"
    return kind, status if status is not None else "disconnected", None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", help="start this dcpserve binary's `serve` (arguments after --)")
    ap.add_argument("--base-url", help="an already running server")
    ap.add_argument("--model", help="model name (default: the first of /v1/models)")
    ap.add_argument("--server-pid", type=int, help="the running server's pid (memory checks)")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=60.0)
    ap.add_argument("--rss-growth-mb", type=float, default=128.0)
    ap.add_argument("--rss-max-mb", type=float, default=4096.0)
    ap.add_argument("serve_args", nargs="*")
    args = ap.parse_args()

    proc = None
    log = None
    if args.exe:
        log = open(os.environ.get("REQUEST_FUZZ_LOG", "/tmp/request-fuzz-serve.log"), "wb")
        proc, port = start_server(args.exe, args.serve_args, log)
        host, pid = "127.0.0.1", proc.pid
    elif args.base_url:
        m = re.match(r"https?://([^:/]+):(\d+)", args.base_url)
        host, port, pid = m.group(1), int(m.group(2)), args.server_pid
    else:
        ap.error("--exe or --base-url")
    base = f"http://{host}:{port}"
    failures = []
    try:
        model = args.model or served_model(base)
        before = greedy_text(host, port, model)
        # Warm-up: one of each valid kind, so the baseline RSS includes the grammar
        # engine and the first batch's buffers.
        for i in range(8):
            one(10**9 + i, args, host, port, model)
        base_rss = rss_mb(pid) if pid else None
        peak = [base_rss or 0.0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                v = rss_mb(pid) if pid else None
                if v:
                    peak[0] = max(peak[0], v)
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        counts = Counter()
        t0 = time.monotonic()
        half = args.requests // 2
        half_rss = None
        for part in (range(half), range(half, args.requests)):
            with ThreadPoolExecutor(args.concurrency) as pool:
                for kind, status, err in pool.map(lambda i: one(i, args, host, port, model),
                                                  part):
                    counts[(kind, status)] += 1
                    if err:
                        failures.append(err)
                        if len(failures) <= 20:
                            print(err, file=sys.stderr)
            if half_rss is None:
                half_rss = rss_mb(pid) if pid else None
        elapsed = time.monotonic() - t0
        stop.set()
        sampler.join()
        # Everything the storm started ends: nothing running or waiting, no KV held.
        drained = None
        for _ in range(50):
            m = metrics(base)
            if all(m[k] == 0 for k in ("num_requests_running", "num_requests_waiting",
                                       "kv_cache_usage_perc")):
                drained = m
                break
            time.sleep(0.2)
        if drained is None:
            failures.append(f"not drained 10 s after the storm: {dict(metrics(base))}")
        final_rss = rss_mb(pid) if pid else None
        if half_rss is not None and final_rss is not None:
            if final_rss - half_rss > args.rss_growth_mb:
                failures.append(f"RSS still growing: {half_rss:.0f} MB after the first half, "
                                f"{final_rss:.0f} after the second (bound +{args.rss_growth_mb:.0f})")
        if peak[0] > args.rss_max_mb:
            failures.append(f"RSS peaked at {peak[0]:.0f} MB (bound {args.rss_max_mb:.0f})")
        after = greedy_text(host, port, model)
        if after != before:
            failures.append(f"greedy text changed: before {before!r}, after {after!r}")
        summary = {
            "requests": args.requests,
            "seed": args.seed,
            "concurrency": args.concurrency,
            "seconds": round(elapsed, 1),
            "requests_per_s": round(args.requests / elapsed, 1),
            "by_kind_and_status": {f"{k}:{s}": n for (k, s), n in sorted(
                counts.items(), key=lambda x: (x[0][0], str(x[0][1])))},
            "rss_mb": {"baseline": base_rss and round(base_rss),
                       "after_first_half": half_rss and round(half_rss),
                       "peak": round(peak[0]), "final": final_rss and round(final_rss)},
            "failures": len(failures),
        }
        print(json.dumps(summary))
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if log:
            log.close()
    if failures:
        print(f"{len(failures)} failures; first: {failures[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The web page (`GET /`) in a real browser: headless Chromium driven through the Chrome
DevTools protocol over `--remote-debugging-pipe` (file descriptors 3 and 4, JSON messages
ended by a NUL byte), from the Python standard library alone.

It starts `dcpserve serve` on the tiny fixture model at tp=4 dcp=2 with an API key, then,
in the page: types the key, types a message and clicks Send, and checks that the answer's
text appears and grows in more than one step; starts a long request (ignore_eos, large
max_tokens), reads the engine view's numbers from the DOM until the running sequence's
KV grows and is split over the DCP ranks, and presses Stop; then asks with a JSON
schema (the answer must be one of its values) and with a required tool (the call shown
must name it, with arguments in its schema). Screenshots of the two
panels go to DIR/web-ui-chat.png and DIR/web-ui-engine.png.

usage: scripts/web-ui-test.py [--exe target/release/dcpserve] [--chromium PATH]
                              [--screenshots DIR] [--default-model]

--screenshots DIR: where the two screenshots go (default target/web-ui; the README's are
refreshed with `--screenshots docs --default-model`). --default-model: the same test on
the default model (SmolLM2-135M) at tp=9 dcp=3, whose text reads as text (slower).

Without Chromium it says so and exits 0, unless CI=true: then it fails.
"""

import argparse
import base64
import json
import os
import pathlib
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
API_KEY = "web-ui-test-key"
# Generous bounds on waiting for the page; none of them measures speed.
WAIT_S = 120.0


class TestFailure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise TestFailure(what)


# --------------------------------------------------------------------------- server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Setup:
    """The model served, its layout, and the long request's length."""

    def __init__(self, default_model):
        if default_model:
            # SmolLM2 has 3 KV heads: DCP needs more TP ranks than that, dividing its 9 heads.
            self.name, self.tp, self.dcp, self.long_tokens = "smollm2", 9, 3, 1000
            self.args = [
                str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
                "--kv-cache-memory-bytes", str(8 << 20),
            ]
        else:
            self.name, self.tp, self.dcp, self.long_tokens = "tiny", 4, 2, 3000
            # A small cache, so that the blocks one request holds show in the view.
            self.args = [
                str(ROOT / "fixtures" / "tiny-llama"), "--dtype", "float32",
                "--kv-cache-memory-bytes", str(256 << 10),
            ]
        self.args += [
            "--served-model-name", self.name, "--threads", "1",
            "--tensor-parallel-size", str(self.tp),
            "--decode-context-parallel-size", str(self.dcp),
        ]


def start_server(exe, setup, log_path):
    port = free_port()
    cmd = [exe, "serve", *setup.args, "--host", "127.0.0.1", "--port", str(port), "--api-key", API_KEY]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TestFailure(f"dcpserve serve exited ({proc.returncode}); see {log_path}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise TestFailure(f"dcpserve serve not healthy after {WAIT_S:.0f} s; see {log_path}")


# --------------------------------------------------------------------------- CDP over a pipe


class Browser:
    """Chromium with `--remote-debugging-pipe`: it reads commands on its fd 3 and writes
    answers and events on its fd 4."""

    def __init__(self, chromium, profile):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        args = [
            chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", "--remote-debugging-pipe", "--no-first-run",
            "--no-default-browser-check", f"--user-data-dir={profile}",
            "--window-size=1280,900", "about:blank",
        ]
        # The shell puts the pipe ends at 3 and 4, the numbers Chromium expects.
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{to_child_r} 4>&{from_child_w}', "chromium", *args],
            pass_fds=(to_child_r, from_child_w),
            stdout=subprocess.DEVNULL,
            stderr=open(pathlib.Path(profile) / "chromium.log", "wb"),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.next_id = 0
        self.messages = queue.Queue()
        self.events = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b""
        while True:
            try:
                chunk = os.read(self.from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.messages.put(None)
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                self.messages.put(json.loads(raw))

    def call(self, method, params=None, session=None, timeout=WAIT_S):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self.to_child, json.dumps(msg).encode() + b"\0")
        except OSError as e:
            raise TestFailure(f"cannot send {method} to Chromium: {e}") from None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TestFailure(f"no answer to {method} in {timeout:.0f} s")
            try:
                m = self.messages.get(timeout=left)
            except queue.Empty:
                continue
            if m is None:
                raise TestFailure(f"Chromium closed the pipe during {method}")
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise TestFailure(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except TestFailure:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Page:
    def __init__(self, browser):
        self.b = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        for m in ("Page.enable", "Runtime.enable"):
            self.call(m)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )

    def call(self, method, params=None):
        return self.b.call(method, params, session=self.session)

    def eval(self, expr):
        r = self.call(
            "Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in r:
            raise TestFailure(f"page script failed: {expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, what, timeout=WAIT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.05)
        raise TestFailure(f"timed out waiting for {what} ({expr})")

    def click(self, selector):
        box = self.eval(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def type_into(self, selector, text):
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", {"text": text})

    def set_value(self, selector, value):
        self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            f" e.value = {json.dumps(value)}; e.dispatchEvent(new Event('change')); }})()"
        )

    def screenshot(self, selector, path):
        r = self.eval(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()"
        )
        shot = self.call(
            "Page.captureScreenshot",
            {"format": "png", "clip": {"x": r[0], "y": r[1], "width": r[2], "height": r[3], "scale": 1}},
        )
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        check(len(data) < 300_000, f"{path} is {len(data)} bytes (limit 300 KB)")
        print(f"  screenshot {path} ({len(data) // 1024} KB)")


# --------------------------------------------------------------------------- the test

LAST_ANSWER = "document.querySelector('#messages .msg.assistant:last-child .content')"


def engine_numbers(page, name):
    """The engine view as the DOM shows it."""
    return page.eval(
        """(() => {
        const m = document.querySelector('#engine .model[data-model=\"""" + name + """\"]');
        if (!m) return null;
        const v = (cls) => m.querySelector('.' + cls + ' .value').textContent;
        const seqs = [...m.querySelectorAll('.seq.running')].map((s) => ({
            id: s.dataset.id, kv: Number(s.dataset.kvTokens),
            split: [...s.querySelectorAll('.seg')].map((g) => Number(g.textContent)),
        }));
        const ranks = [...m.querySelectorAll('tr.rank')].map((r) => ({
            used: Number(r.querySelector('.blocks-used').textContent),
            stored: Number(r.querySelector('.tokens-stored').textContent),
        }));
        return {running: v('stat-running'), tps: v('stat-tps'), seqs, ranks};
    })()"""
    )


def run(page, base, shots, setup):
    model = f"#engine .model[data-model=\"{setup.name}\"]"
    page.call("Page.navigate", {"url": base + "/"})
    page.wait_for("document.readyState === 'complete' && !!document.getElementById('api-key')", "the page")
    # Without the key the API refuses, and the page says so.
    page.wait_for(
        "document.getElementById('engine').textContent.includes('engine status:')",
        "the engine view's error without the key",
    )
    page.type_into("#api-key", API_KEY)
    page.eval("document.getElementById('api-key').dispatchEvent(new Event('change'))")
    page.wait_for(f"document.querySelector('#model option')?.value === '{setup.name}'", "the model list")
    page.wait_for(f"!!document.querySelector({json.dumps(model)})", "the engine view")
    tp = page.eval("document.querySelectorAll('#engine tr.rank').length")
    check(tp == setup.tp, f"the engine view shows {tp} ranks, expected {setup.tp}")

    print("- chat: streamed text appears and grows")
    page.set_value("#temperature", "0")
    page.set_value("#max-tokens", "48")
    page.eval("document.getElementById('ignore-eos').checked = true")
    page.type_into("#prompt", "Tell me a story about a small engine.")
    page.click("#send")
    lengths = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        state = page.eval(
            f"(() => {{ const c = {LAST_ANSWER}; if (!c) return null;"
            " return [c.textContent.length, c.parentElement.classList.contains('streaming')]; })()"
        )
        if state:
            n, streaming = state
            if n and (not lengths or lengths[-1] != n):
                lengths.append(n)
            if not streaming:
                break
        time.sleep(0.01)
    finish = page.wait_for(
        "document.querySelector('#messages .msg.assistant:last-child .finish')?.textContent",
        "the end of the answer",
    )
    check(finish == "finish_reason: length", f"the answer ended with {finish!r}")
    check(lengths and lengths[-1] > 0, "no streamed text appeared")
    check(len(lengths) >= 2, f"the text did not grow in steps: lengths seen {lengths}")
    print(f"  text grew through {len(lengths)} lengths, to {lengths[-1]} characters")
    user = page.eval("document.querySelector('#messages .msg.user .content').textContent")
    check(user == "Tell me a story about a small engine.", f"user message shown as {user!r}")
    page.screenshot("#chat-panel", shots / "web-ui-chat.png")

    print("- engine view: a long request's KV grows over the DCP ranks; Stop ends it")
    page.set_value("#max-tokens", str(setup.long_tokens))
    page.type_into("#prompt", "Now count slowly to a very large number.")
    page.click("#send")
    seen, seen_id = [], None
    shot_taken = False
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        e = engine_numbers(page, setup.name)
        if e and e["seqs"]:
            # The newest sequence (a view refreshed just before the first answer ended
            # may still show that one).
            s = max(e["seqs"], key=lambda q: int(q["id"]))
            check(sum(s["split"]) == s["kv"], f"the DCP split {s['split']} does not add up to {s['kv']}")
            if seen_id != s["id"]:
                seen_id, seen = s["id"], []
            if not seen or seen[-1] != s["kv"]:
                seen.append(s["kv"])
            grown = len(seen) >= 3 and all(b > a for a, b in zip(seen, seen[1:]))
            spread = len(s["split"]) == setup.dcp and min(s["split"]) > 0
            if grown and spread and e["tps"] not in ("–", "0.0"):
                check(e["running"] == "1", f"running shows {e['running']}")
                check(all(r["used"] > 0 for r in e["ranks"]), f"ranks show no blocks used: {e['ranks']}")
                per_dcp = setup.tp // setup.dcp
                check(sum(r["stored"] for r in e["ranks"]) == per_dcp * s["kv"],
                      f"{setup.tp} ranks ({per_dcp} per DCP rank) store {e['ranks']}, sequence holds {s['kv']}")
                page.screenshot("#engine-panel", shots / "web-ui-engine.png")
                shot_taken = True
                break
        time.sleep(0.1)
    check(shot_taken, f"the KV view did not change while the request ran: {seen}")
    print(f"  KV tokens seen: {seen}")
    page.click("#stop")
    finish = page.wait_for(
        "document.querySelector('#messages .msg.assistant:last-child .finish')?.textContent",
        "the stopped answer",
    )
    check(finish == "stopped", f"after Stop the answer says {finish!r}")
    # The aborted sequence leaves the engine: no running sequence, blocks freed.
    page.wait_for(
        f"(() => {{ const m = document.querySelector({json.dumps(model)});"
        " return m && m.querySelector('.stat-running .value').textContent === '0'"
        " && m.querySelectorAll('.seq').length === 0"
        " && [...m.querySelectorAll('.blocks-used')].every((c) => c.textContent === '0'); })()",
        "the engine view to empty after Stop",
    )
    check(page.eval("!document.getElementById('send').disabled"), "Send stays disabled after Stop")

    print("- structured output and tools")
    page.click("#clear")
    page.set_value("#max-tokens", "64")
    page.eval("document.getElementById('structured').open = true")
    # A constrained output ends when its grammar is complete: the server refuses ignore_eos
    # with it, and the page shows that error.
    page.set_value("#response-format", json.dumps({"type": "string", "enum": ["yes", "no"]}))
    answer = ask(page, "Yes or no?")
    check("ignore_eos" in (answer["error"] or ""), f"no error shown for ignore_eos: {answer}")
    page.eval("document.getElementById('ignore-eos').checked = false")
    answer = ask(page, "Yes or no?")
    check(answer["finish"] == "finish_reason: stop", f"the constrained answer ended with {answer}")
    check(answer["text"] in ('"yes"', '"no"'), f"the schema allows \"yes\" or \"no\", got {answer}")
    print(f"  constrained answer {answer['text']}")
    page.set_value("#response-format", "")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"]}}}
    page.set_value("#tools", json.dumps([tool]))
    page.set_value("#tool-choice", "required")
    answer = ask(page, "What is the weather like?")
    check(answer["finish"] == "finish_reason: tool_calls", f"the tool call ended with {answer}")
    call = re.fullmatch(r"tool call \S*: get_weather\((.*)\)", answer["calls"] or "", re.S)
    check(call is not None, f"no get_weather call shown: {answer}")
    check(json.loads(call.group(1)).get("city") in ("Paris", "Oslo"), f"arguments off the schema: {answer}")
    print(f"  {answer['calls']}")


def ask(page, text):
    """Sends `text` and returns the answer's text, tool calls and finish line once it ends."""
    before = page.eval("document.querySelectorAll('#messages .msg.assistant').length")
    page.type_into("#prompt", text)
    page.click("#send")
    page.wait_for(
        f"document.querySelectorAll('#messages .msg.assistant').length > {before}"
        " && !!document.querySelector('#messages .msg.assistant:last-child :is(.finish, .error)')",
        f"the answer to {text!r}",
    )
    return page.eval(
        "(() => { const m = document.querySelector('#messages .msg.assistant:last-child');"
        " return {text: m.querySelector('.content').textContent,"
        " calls: m.querySelector('.tool-calls')?.textContent ?? null,"
        " finish: m.querySelector('.finish')?.textContent ?? null,"
        " error: m.querySelector('.error')?.textContent ?? null}; })()"
    )


def find_chromium(given):
    for c in [given, os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]:
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=str(ROOT / "target" / "release" / "dcpserve"))
    ap.add_argument("--chromium")
    ap.add_argument("--screenshots", default=str(ROOT / "target" / "web-ui"))
    ap.add_argument("--default-model", action="store_true")
    args = ap.parse_args()
    ci = os.environ.get("CI") == "true"
    chromium = find_chromium(args.chromium)
    if not chromium:
        msg = "web-ui-test: Chromium is not installed (scripts/install-chromium.sh)"
        if ci:
            sys.exit(msg + " and CI=true: failing")
        print(msg + ": skipped")
        return
    shots = pathlib.Path(args.screenshots)
    shots.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dcpserve-web-ui-") as tmp:
        setup = Setup(args.default_model)
        server, port = start_server(args.exe, setup, pathlib.Path(tmp) / "serve.log")
        browser, page = None, None
        try:
            browser = Browser(chromium, tmp)
            version = browser.call("Browser.getVersion", timeout=60)
            print(f"web-ui-test: {version.get('product')} against port {port}")
            page = Page(browser)
            run(page, f"http://127.0.0.1:{port}", shots, setup)
            errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
            check(not errors, f"the page threw: {errors}")
        except TestFailure as e:
            if page is not None:
                try:
                    shot = page.call("Page.captureScreenshot", {"format": "png"})
                    (shots / "web-ui-failure.png").write_bytes(base64.b64decode(shot["data"]))
                    print(f"the page at the failure: {shots / 'web-ui-failure.png'}")
                except TestFailure:
                    pass
            log = (pathlib.Path(tmp) / "serve.log").read_text(errors="replace").splitlines()[-20:]
            clog = pathlib.Path(tmp) / "chromium.log"
            ctail = clog.read_text(errors="replace").splitlines()[-20:] if clog.exists() else []
            sys.exit(
                f"web-ui-test FAILED: {e}\n-- server log:\n" + "\n".join(log)
                + "\n-- chromium log:\n" + "\n".join(ctail)
            )
        finally:
            if browser:
                browser.close()
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    print(f"web-ui-test: passed in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()

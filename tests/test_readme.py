"""The README's first run: CI runs its install and test commands, its "try it" server command
works as written (loopback, not announced, a log without dependency noise), its CPU install
pins the same PyTorch, and the add-on's chunk-size figures are the committed benchmark's."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from wyoming_qwen3tts.__main__ import build_parser

from .conftest import ROOT, free_port

README = (ROOT / "README.md").read_text()


def commands(heading: str) -> list[str]:
    """The commands of the first ``sh`` code block after ``heading`` in the README (lines
    continued with a backslash joined)."""
    section = README[README.index(f"\n{heading}\n") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, heading
    return [" ".join(line.split()) for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_install_and_test_commands() -> None:
    (install, run) = commands("## Quick start")
    (test,) = commands("## Tests")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install in ci
    assert f"{test} || rc=$?" in ci
    assert "'.[test]'" in install  # the test command needs pytest: the install brings it
    args = build_parser().parse_args(shlex.split(run)[3:])
    assert args.uri == "tcp://0.0.0.0:10200" and not args.no_zeroconf  # the real set-up: found by Home Assistant


def test_cpu_install_takes_the_pinned_pytorch_from_the_cpu_index() -> None:
    first, second = commands("### On the CPU, without a GPU")
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line)
    assert "--index-url https://download.pytorch.org/whl/cpu" in first
    assert f"torch=={pins['torch']}" in first.split() and f"torchaudio=={pins['torchaudio']}" in first.split()
    assert second == commands("## Quick start")[0].split(" && ")[1]


def test_addon_chunk_size_figures_are_the_committed_benchmark() -> None:
    results = (ROOT / "benchmarks" / "results" / "nvidia-h200" / "results.md").read_text()
    docs = (ROOT / "addon" / "DOCS.md").read_text()
    for chunk in (1, 2):
        row = re.search(rf"^\| wyoming \| aria \| {chunk} \| 1 \| \d+ \| (\d+) \| (\d+) \| ([\d.]+) \|", results, re.M)
        assert row is not None, chunk
        assert f"| {chunk} | {row[1]} / {row[2]} ms | {row[3]} |" in docs


# Fast set: the smoke test of the Wyoming and HTTP doors on a real reference-engine server,
# started as the README says.
def test_try_it_commands_work_as_written(checkpoints: Path, tmp_path: Path) -> None:
    build, serve = commands("### Try it without the real weights")
    # The build command is the one tests/test_checkpoint.py runs; conftest built the same here.
    assert shlex.split(build)[1:] == ["-m", "wyoming_qwen3tts.testing.checkpoint", "--size", "tiny", "--all", "./tiny"]
    (tmp_path / "tiny").symlink_to(checkpoints)
    argv = shlex.split(serve)
    assert argv[:3] == [".venv/bin/python", "-m", "wyoming_qwen3tts"]
    args = build_parser().parse_args(argv[3:])
    assert args.uri.startswith("tcp://127.0.0.1:") and args.http_host == "127.0.0.1" and args.no_zeroconf

    port, http_port = free_port(), free_port()  # the README's own ports may be taken here
    argv = [sys.executable, *argv[1:], "--http-port", str(http_port)]
    argv[argv.index("--uri") + 1] = f"tcp://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while "Ready: Wyoming" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Ready: Wyoming on tcp://127.0.0.1:" in log.read_text(), log.read_text()[-3000:]
        assert f"HTTP on http://127.0.0.1:{http_port}/" in log.read_text()
        info = asyncio.run(_describe(port))
        assert info.tts and info.tts[0].voices
        # The README's curl: a WAV of noise from the default voice.
        body = json.dumps({"input": "Hello!", "response_format": "wav"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/audio/speech", body)
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.read(4) == b"RIFF"
        assert "zeroconf" not in log.read_text().lower()  # not announced
        # The reference engine's line the README quotes (one sentence at a time per model).
        quoted = re.search(r"its log line: `(base model ready.*?)`", " ".join(README.split()))
        assert quoted is not None and quoted[1] in log.read_text(), quoted
        # Started as a user starts it, at the default log level: no dependency noise.
        noise = ["flash-attn", "sox: not found", "SoX could not be found", "Loading weights", "UserWarning"]
        assert [n for n in noise if n in log.read_text()] == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _describe(port: int) -> Info:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 60)
            assert event is not None
            if Info.is_type(event.type):
                return Info.from_event(event)


def test_the_model_field_lists_every_openai_model_name() -> None:
    """``GET /v1/models`` lists the OpenAI names the server takes (``GENERIC_MODELS``): the
    README's ``model`` field and the OpenAPI description name each of them."""
    from wyoming_qwen3tts import openapi
    from wyoming_qwen3tts.http_request import GENERIC_MODELS

    row = next(line for line in README.splitlines() if line.startswith("| `model` | optional |"))
    model = openapi.document(10_000)["components"]["schemas"]["SpeechRequest"]["properties"]["model"]
    described = model["anyOf"][0]["description"]
    assert [name for name in GENERIC_MODELS if f"`{name}`" not in row or name not in described.split(", ")] == []


@pytest.mark.parametrize("heading", ["## Quick start", "### Try it without the real weights", "### On the CPU, without a GPU", "## Tests"])
def test_readme_commands_use_the_projects_virtual_environment(heading: str) -> None:
    for line in commands(heading):
        assert line.startswith((".venv/bin/", "python3 -m venv .venv && .venv/bin/pip ")), line

"""The README's first run: CI runs its install and test commands, its "try it" server command
works as written (loopback, not announced, a log without dependency noise), its CPU install
pins the same PyTorch, and the add-on's chunk-size figures are the committed benchmark's.

And the README stays short, its pages in ``docs/`` stay true: every relative link of the README
and of ``docs/*.md`` reaches a file (and a heading, where it names one), every server command
they show parses with the server's own parser, ``docs/configuration.md`` lists exactly the
server's options and the environment variables the package reads, and ``docs/testing.md`` the
ones the tests read."""

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
#: The pages the README links to for everything it leaves out, by name (``api.md``, ...).
DOCS = {page.name: page.read_text() for page in sorted((ROOT / "docs").glob("*.md"))}
#: The most lines the README may have: a newcomer reads it in five minutes (issue 51).
README_MAX_LINES = 320


def commands(heading: str, text: str = README) -> list[str]:
    """The commands of the first ``sh`` code block after ``heading`` in ``text`` (the README
    unless given; lines continued with a backslash joined)."""
    section = text[text.index(f"\n{heading}\n") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, heading
    return [" ".join(line.split()) for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_install_and_test_commands() -> None:
    (install, run) = commands("## Quick start")
    fast, *_ = commands("## Tests")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install in ci
    assert f"{fast} || rc=$?" in ci
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
    ``model`` field of docs/api.md and the OpenAPI description name each of them."""
    from wyoming_qwen3tts.doors.http import openapi
    from wyoming_qwen3tts.doors.http.request import GENERIC_MODELS

    row = next(line for line in DOCS["api.md"].splitlines() if line.startswith("| `model` | optional |"))
    model = openapi.document(10_000)["components"]["schemas"]["SpeechRequest"]["properties"]["model"]
    described = model["anyOf"][0]["description"]
    assert [name for name in GENERIC_MODELS if f"`{name}`" not in row or name not in described.split(", ")] == []


@pytest.mark.parametrize("heading", ["## Quick start", "### Try it without the real weights", "### On the CPU, without a GPU", "## Tests"])
def test_readme_commands_use_the_projects_virtual_environment(heading: str) -> None:
    for line in commands(heading):
        assert line.startswith((".venv/bin/", "python3 -m venv .venv && .venv/bin/pip ")), line


# --- the README stays short, and docs/ stays true ------------------------------------------


def _outside_code(text: str) -> list[str]:
    """``text``'s lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def test_the_readme_is_read_in_five_minutes() -> None:
    """Under ``README_MAX_LINES`` lines, its prose wrapped at 100 characters (tables, code blocks
    and a line that is one code span excepted), and a link to every page of ``docs/``."""
    assert len(README.splitlines()) < README_MAX_LINES
    long = [line for line in _outside_code(README) if len(line) > 100 and not line.startswith("|")
            and not re.fullmatch(r"`[^`]+`", line)]
    assert long == []
    assert [name for name in DOCS if f"](docs/{name})" not in README] == []


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives ``text``'s headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces as hyphens; a repeated one gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    for line in _outside_code(text):
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_relative_link_reaches_a_file_and_its_heading() -> None:
    """Every link of the README and of ``docs/*.md`` that is not a URL names a file that exists
    (relative to its page) and, with ``#anchor``, a heading of that file (or of its own page)."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = "\n".join(_outside_code(page.read_text()))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def _server_commands() -> list[tuple[str, list[str]]]:
    """Every server command the README and ``docs/*.md`` show, in code blocks or code spans:
    (page, the server's arguments)."""
    found = []
    for name, text in [("README.md", README), *DOCS.items()]:
        shown = [line for block in re.findall(r"```sh\n(.*?)```", text, re.S)
                 for line in block.replace("\\\n", " ").splitlines()]
        shown += re.findall(r"`([^`\n]+)`", "\n".join(_outside_code(text)))
        for command in shown:
            server = re.match(r"\s*(?:\S*python3? -m wyoming_qwen3tts|wyoming-qwen3tts)(?=\s|$)", command)
            if server and command[server.end() :].strip():  # not just its name in the prose
                found.append((name, shlex.split(command[server.end() :], comments=True)))
    return found


def test_every_server_command_shown_parses_with_the_servers_parser() -> None:
    """Each server command of the README and docs/ (an option misspelt, a value the option
    refuses) is one the server's own parser takes."""
    shown = _server_commands()
    assert len(shown) >= 5  # the quick start's, the try-it one, the CPU page's two, the image's
    options = {flag for action in build_parser()._actions for flag in action.option_strings}
    for page, args in shown:
        # argparse takes an option's unambiguous prefix (--max-stream): a page must spell it whole
        spelt = [arg for arg in args if arg.startswith("--") and arg.split("=")[0] not in options]
        assert spelt == [], page
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:  # argparse's refusal
            raise AssertionError(f"{page}: {' '.join(args)}") from exc


def test_the_configuration_page_lists_exactly_the_servers_options() -> None:
    """docs/configuration.md's table names every option of ``build_parser`` (but ``--help``),
    and nothing else."""
    page = DOCS["configuration.md"]
    table = page[page.index("## Command line") : page.index("## Environment variables")]
    listed = {flag for line in table.splitlines() if line.startswith("| `-")
              for flag in re.findall(r"--[a-z][a-z-]*", line.split(" | ")[0])}
    options = {flag for action in build_parser()._actions for flag in action.option_strings
               if flag.startswith("--") and flag != "--help"}
    assert listed == options


def _variables_read(folder: Path) -> set[str]:
    """The environment variables the Python files under ``folder`` read by name."""
    pattern = (r"""(?:environ\.get|environ\.setdefault|getenv)\(\s*["']([A-Z][A-Z0-9_]+)["']"""
               r"""|["']([A-Z][A-Z0-9_]+)["'] (?:not )?in os\.environ""")
    return {a or b for path in folder.rglob("*.py") for a, b in re.findall(pattern, path.read_text())}


def test_every_environment_variable_read_is_documented() -> None:
    """The variables the package reads are in docs/configuration.md's table, the ones the tests
    read in docs/testing.md's (``TRITON_INTERPRET``, which the tests set for themselves, aside)."""
    def table(page: str) -> str:
        text = DOCS[page]
        return text[text.index("## Environment variables") :]

    package = _variables_read(ROOT / "wyoming_qwen3tts")
    tests = _variables_read(ROOT / "tests") - {"TRITON_INTERPRET", "PATH"}
    assert {"QWEN3TTS_KERNELS", "TRITON_CACHE_DIR"} <= package and "QWEN3TTS_SOAK_MINUTES" in tests
    assert [name for name in package if f"| `{name}` |" not in table("configuration.md")] == []
    assert [name for name in tests if f"| `{name}` |" not in table("testing.md")] == []


def test_the_readme_test_commands_are_the_suites_and_ci_runs_them() -> None:
    """The README's test commands are the fast set and the whole suite (``--full``), the same as
    docs/testing.md's (which adds ``-m gpu``); CI runs both, and pytest takes ``--full`` as
    written (an option it does not know is a usage error, exit status 4). CI runs the whole
    suite as the fast set's command and then the rest (``-m 'full and not gpu'``), or whole."""
    fast, full = commands("## Tests")
    assert (fast, full) == (".venv/bin/python -m pytest", ".venv/bin/python -m pytest --full")
    assert commands("## The commands", DOCS["testing.md"]) == [fast, full, f"{fast} -m gpu"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    runs_full = [line for line in ci if line == full or line.startswith(f"{full} ")]
    runs_rest = [line for line in ci if line.startswith(f"{fast} -m 'full and not gpu'")]
    runs_fast = [line for line in ci if line == fast or line.startswith(f"{fast} ||")]
    assert runs_full or (runs_fast and runs_rest), ".ci/run does not run the whole suite"
    argv = [sys.executable, *shlex.split(full)[1:], "--collect-only", "-q", "tests/test_readme.py"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

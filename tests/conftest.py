"""Shared fixtures: tiny random checkpoints and real server processes started as users do.

Every test that uses ``server`` runs on three servers: the CPU reference engine (the CPU
default), the batched engine run eagerly on the CPU (``--engine batched``), and the batched
CUDA-graph engine (marked ``gpu``; ``pytest -m gpu`` on an NVIDIA machine).

Speed classes, each test's own marker (pyproject.toml registers them):

* unmarked: the fast set, what ``python -m pytest`` runs (its ``-m 'not gpu and not full'``
  in pyproject.toml's ``addopts``): every in-process test and a few real-process smoke tests,
  one for each door (Wyoming, HTTP, WebSocket) and each CPU engine (reference, GGML).
* ``full``: slow (a real server process loading models, GGML checkpoints, Chromium, soak,
  fuzzing, HAProxy, network namespaces, kernel builds). ``python -m pytest --full`` runs them
  too: the whole suite but the GPU's (``-m 'not gpu'``).
* ``gpu``: ``pytest -m gpu``, on an NVIDIA machine.

.ci/run runs the fast set, then ``-m 'full and not gpu'`` on pytest-xdist workers, a file at
a time (``--dist loadfile``). Under xdist the checkpoint folders are built once, under a file
lock (``build_checkpoints``), and each worker picks its ports from its own residue class
(``free_ports``), so that two workers never choose the same one; a server whose port another
process took before it bound it starts again on others (``start_server``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from filelock import FileLock


def _cuda_device() -> bool:
    """``torch.cuda.is_available()`` without importing PyTorch (seconds of every run's
    collection): False for a CPU build of torch (its version ends in ``+cpu``), else whether
    the CUDA driver sees a device (``cuInit``, ``cuDeviceGetCount`` of libcuda, what torch
    asks through the CUDA runtime; the driver honours ``CUDA_VISIBLE_DEVICES``). False where
    there is no driver library."""
    import ctypes
    from importlib.metadata import PackageNotFoundError, version

    try:
        if version("torch").endswith("+cpu"):
            return False
        cuda = ctypes.CDLL("libcuda.so.1")
    except (OSError, PackageNotFoundError):
        return False
    count = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


# Without a CUDA device the Triton kernels' tests run them in Triton's interpreter, which
# must be chosen before triton is first imported (transformers imports it during collection;
# conftest is imported before any test module). Servers started by tests inherit it.
if not _cuda_device():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
#: Tiny checkpoints are built once and reused (build_all skips complete folders).
CHECKPOINTS = Path(os.environ.get("QWEN3TTS_TEST_CHECKPOINTS", ROOT / ".ckpt" / "tiny"))
#: Transcript of the test clone voice.
CLONE_TRANSCRIPT = "This is a short reference recording."
#: pyproject.toml's ``-m``: the fast set. ``--full`` turns it into ``FULL``.
FAST = "not gpu and not full"
FULL = "not gpu"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full", action="store_true", default=False,
        help="the whole suite: the slow tests (marked full) too, every test but the GPU's",
    )


def pytest_configure(config: pytest.Config) -> None:
    """``--full`` widens the default selection (pyproject.toml's ``-m``) to every test but
    the GPU's; an ``-m`` given on the command line (or in ``PYTEST_ADDOPTS``) is left as it is.

    Raises:
        pytest.UsageError: ``--full`` with no ``-m`` given, and pyproject.toml's is not ``FAST``
            (the two were changed apart: ``--full`` would run the fast set alone).
    """
    if not config.getoption("full"):
        return
    if config.option.markexpr == FAST:
        config.option.markexpr = FULL
        return
    args = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    if not any(arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")) for arg in args):
        raise pytest.UsageError(
            f"--full widens pyproject.toml's -m {FAST!r} (tests/conftest.py's FAST), but the -m in force "
            f"is {config.option.markexpr!r}: make the two the same"
        )


#: Slow tests the selection left out that ``--full`` would run (not the GPU's), by test id.
_SLOW_LEFT_OUT: set[str] = set()


def pytest_deselected(items: list[pytest.Item]) -> None:
    _SLOW_LEFT_OUT.update(
        item.nodeid for item in items if item.get_closest_marker("full") and not item.get_closest_marker("gpu")
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Under the fast set's selection (no ``-k``), say how many slow tests it left out and
    how to run them."""
    if _SLOW_LEFT_OUT and config.option.markexpr == FAST and not config.option.keyword:
        terminalreporter.write_line(
            f"{len(_SLOW_LEFT_OUT)} slow tests (marked full) left out: `python -m pytest --full` runs the whole suite"
        )


def build_checkpoints(folder: Path, size: str) -> Path:
    """``build_all(folder, size)`` under a file lock beside ``folder``: pytest-xdist workers
    (and test runs in other worktrees sharing the folder) build it once, never at once.

    Returns:
        ``folder``, holding complete ``base``, ``voice_design`` and ``custom_voice`` folders.
    """
    from wyoming_qwen3tts.testing.checkpoint import build_all

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.parent / f".{folder.name}.lock"):
        build_all(folder, size)
    return folder


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct unused TCP ports on 127.0.0.1 (all held while choosing, so that the
    kernel cannot hand the same one out twice). Under pytest-xdist, worker ``gwK`` of ``N``
    takes only ports ``p`` with ``p % N == K``: workers never choose the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < n:
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port % workers == int(worker.removeprefix("gw")):
                chosen.append(port)
        return chosen
    finally:
        for sock in held:
            sock.close()


#: A port chosen by ``free_ports`` is free when chosen, not when the server binds it (after
#: loading its models): another process may take it meanwhile. The server then exits saying so.
_PORT_TAKEN = ("Address already in use", "[Errno 98]")


@pytest.fixture(scope="session")
def checkpoints() -> Path:
    """Folder with tiny ``base``, ``voice_design`` and ``custom_voice`` checkpoints."""
    return build_checkpoints(CHECKPOINTS, "tiny")


@pytest.fixture(scope="session")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone library: ``clone`` (with transcript, ICL) and ``xvec`` (no transcript)."""
    folder = tmp_path_factory.mktemp("voices")
    rng = np.random.default_rng(0)
    t = np.arange(2 * 24000) / 24000
    voice = 0.2 * np.sin(2 * np.pi * 180 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    sf.write(folder / "clone.wav", (voice + 0.01 * rng.standard_normal(len(t))).astype(np.float32), 24000)
    (folder / "clone.txt").write_text(CLONE_TRANSCRIPT)
    sf.write(folder / "xvec.wav", (0.2 * np.sin(2 * np.pi * 120 * np.arange(16000 * 2) / 16000)).astype(np.float32), 16000)
    (folder / "broken.wav").write_bytes(b"RIFF....not a wav file")
    return folder


@dataclass
class Server:
    """A running server process."""

    proc: subprocess.Popen[str]
    port: int
    http_port: int
    log: Path
    device: str
    engine: str = "auto"

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def streams_audio(self) -> bool:
        """True when audio leaves frame by frame (not a whole sentence at once)."""
        return self.device == "cuda" or self.engine == "batched"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(
    checkpoints: Path, voices_dir: Path, log: Path, device: str = "cpu", extra: list[str] | None = None,
    wrap: list[str] | None = None, uri_host: str = "127.0.0.1", timeout: float = 240.0,
    engine: str | None = None,
) -> Server:
    """Start ``python -m wyoming_qwen3tts`` as a user would; wait until it serves.

    ``engine`` defaults to the CPU reference engine: ``auto`` picks the GGML engine where its
    wheel runs, and the tiny checkpoints' codec is narrower than qwentts.cpp can run (see
    ``checkpoint.GGML`` and tests/test_ggml.py). On CUDA it defaults to ``auto`` (the batched
    CUDA-graph engine).

    A server that could not bind its ports because something took them between choosing
    and binding (it exits saying so) is started again on other ports, up to three times.

    Raises:
        RuntimeError: the process exited or did not get ready in ``timeout`` seconds.
    """
    for attempt in range(3):
        try:
            return _start_server(checkpoints, voices_dir, log, device, extra, wrap, uri_host, timeout, engine)
        except _PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    """The server exited because one of its ports was taken before it bound it."""


def _start_server(
    checkpoints: Path, voices_dir: Path, log: Path, device: str, extra: list[str] | None,
    wrap: list[str] | None, uri_host: str, timeout: float, engine: str | None,
) -> Server:
    engine = engine or ("auto" if device == "cuda" else "reference")
    port, http_port = free_ports(2)
    args = [
        sys.executable, "-m", "wyoming_qwen3tts",
        "--uri", f"tcp://{uri_host}:{port}",
        "--data-dir", str(log.parent / "data"),
        "--voices-dir", str(voices_dir),
        "--clone-model", str(checkpoints / "base"),
        "--design-model", str(checkpoints / "voice_design"),
        "--custom-voice-model", str(checkpoints / "custom_voice"),
        "--device", device, "--engine", engine,
        "--http-host", "127.0.0.1", "--http-port", str(http_port),
        "--local-files-only",
    ] + (extra if extra is not None else ["--no-zeroconf"])
    handle = log.open("w")
    proc = subprocess.Popen((wrap or []) + args, stdout=handle, stderr=subprocess.STDOUT, text=True, cwd=log.parent)
    server = Server(proc, port, http_port, log, device, engine)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            output = server.output()
            error = _PortTaken if any(taken in output for taken in _PORT_TAKEN) else RuntimeError
            raise error(f"server exited with {proc.returncode}:\n{output[-4000:]}")
        if "Ready: Wyoming" in server.output():
            return server
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready in {timeout} s:\n{server.output()[-4000:]}")


def stop_server(server: Server) -> None:
    """SIGTERM, then kill if it lingers."""
    server.proc.terminate()
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


#: Server variants: (device, engine) by fixture parameter.
SERVERS = {"cpu": ("cpu", "reference"), "batched": ("cpu", "batched"), "cuda": ("cuda", "auto")}
#: Extra arguments of every test server (the CUDA one runs float32, so that the exact checks
#: of the end-to-end suites hold there too); QWEN3TTS_TEST_DEBUG=1 adds --debug.
EXTRA = {"cuda": ["--dtype", "float32"]}


@pytest.fixture(
    scope="session",
    params=["cpu", "batched", pytest.param("cuda", marks=pytest.mark.gpu)],
)
def server(
    request: pytest.FixtureRequest, checkpoints: Path, voices_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One server with all three model kinds, shared by the session: the CPU reference
    engine, the batched engine on the CPU, and (under -m gpu) the CUDA-graph engine."""
    device, engine = SERVERS[request.param]
    if device == "cuda" and not _cuda():
        pytest.skip("no CUDA device")
    folder = tmp_path_factory.mktemp(f"server-{request.param}")
    # Anchors off: a preset turning from designed-live to anchored mid-session would change
    # what the byte-exact tests compare (tests/test_studio.py covers anchors).
    extra = ["--no-zeroconf", "--anchors", "off", *EXTRA.get(request.param, [])]
    if os.environ.get("QWEN3TTS_TEST_DEBUG"):
        extra.append("--debug")
    srv = start_server(checkpoints, voices_dir, folder / "server.log", device=device, engine=engine, extra=extra)
    yield srv
    stop_server(srv)
    keep = os.environ.get("QWEN3TTS_TEST_LOGS")
    if keep:  # e.g. on the GPU machine, to bring the server's log back
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / f"server-{request.param}.log").write_text(srv.output())


@pytest.fixture(scope="session")
def onnx_data_dir(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder holding the tiny checkpoints' codec step exported to ONNX (the three
    tiny models share one codec), made once a session: the codec step's tests
    (``test_onnx_codec``) reuse it instead of exporting again (about 10-30 s each)."""
    from wyoming_qwen3tts.engine.cpu.onnx_export import checkpoint_decoder, exported_codec

    folder = tmp_path_factory.mktemp("onnx-data")
    exported_codec(checkpoints / "base", folder, lambda: checkpoint_decoder(checkpoints / "base"))
    return folder


def chunk_times_at_once(server: Server, text: str) -> tuple[list[float], list[float]]:
    """A Wyoming client and an OpenAI client ask ``server`` for ``text`` (voice ``ryan``) at
    once; the ``time.monotonic()`` of each audio chunk each received: (Wyoming's, OpenAI's)."""
    import asyncio
    import threading

    import openai
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    times: dict[str, list[float]] = {"wyoming": [], "openai": []}

    def openai_client() -> None:
        client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused")
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="ryan", input=text, response_format="pcm", extra_body={"seed": 2}
        ) as response:
            for data in response.iter_bytes(2048):
                if data:
                    times["openai"].append(time.monotonic())

    async def wyoming_client() -> None:
        async with AsyncTcpClient("127.0.0.1", server.port) as client:
            await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="ryan")).event())
            while True:
                event = await asyncio.wait_for(client.read_event(), timeout=120)
                assert event is not None
                if AudioChunk.is_type(event.type):
                    times["wyoming"].append(time.monotonic())
                if AudioStop.is_type(event.type):
                    return

    other = threading.Thread(target=openai_client)
    other.start()
    asyncio.run(wyoming_client())
    other.join(120)
    return times["wyoming"], times["openai"]

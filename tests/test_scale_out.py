"""Past one GPU: two servers on one voices folder and one data folder, behind a real HAProxy
running the recipe's own ``haproxy/haproxy.cfg`` (only its ports changed).

Two CPU servers on the tiny checkpoints (started in parallel) and ``haproxy -db`` (Debian's
package; ``.ci/run`` installs it) on loopback ports. Checked through the balancer with the
``wyoming`` client and the ``openai`` SDK: requests succeed and land on both servers (each
server's ``/metrics``); a voice uploaded through one server is spoken through the other,
and a rename or delete through one is seen by the other; a preset's anchor is rendered
once; a server stopped mid-run turns not-ready, HAProxy takes it out on its ``/ready``
(not on a refused connection) while it still serves, none of its clients gets a bare
close, and new requests go to the other server.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf
import yaml
from prometheus_client.parser import text_string_to_metric_families
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.__main__ import build_parser

from .conftest import CLONE_TRANSCRIPT, ROOT, Server, free_port, start_server, stop_server

HAPROXY_CFG = ROOT / "haproxy" / "haproxy.cfg"
COMPOSE = ROOT / "docker-compose.scale.yml"
#: Many short sentences: a stream that is still generating when its server is stopped.
LONG_TEXT = "Short sentence here. " * 6
_GUARD_S = 180.0

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy (apt-get install haproxy)")


# --- the recipe ---------------------------------------------------------------------------


def _compose_servers() -> dict[str, list[str]]:
    """The compose recipe's server services and their commands."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {name: service["command"] for name, service in services.items() if name != "haproxy"}


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_compose_recipe_and_the_haproxy_config_agree() -> None:
    """Every server of docker-compose.scale.yml is in haproxy.cfg on its own ports (Wyoming
    backend checked on its HTTP port), each on its own GPU; exactly one announces zeroconf,
    with the balancer's port; every server drains for longer than HAProxy needs to take it
    out; HAProxy accepts the file."""
    cfg = HAPROXY_CFG.read_text()
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    servers = _compose_servers()
    assert len(servers) >= 2
    gpus = set()
    for name, command in servers.items():
        wyoming = _flag(command, "--uri").removeprefix("tcp://")
        http = f"{_flag(command, '--http-host')}:{_flag(command, '--http-port')}"
        assert f"server {name} {wyoming} check port {http.split(':')[1]}\n" in cfg, name
        assert cfg.count(f"server {name} {http} check\n") == 2, name  # http_servers and designs
        assert float(_flag(command, "--drain-seconds")) >= 2 * 1 + 2  # fall 2 x inter 1s, and margin
        (device,) = compose[name]["deploy"]["resources"]["reservations"]["devices"]
        gpus.update(device["device_ids"])
    assert len(gpus) == len(servers)
    parser = build_parser()
    cmd = re.search(r'^CMD (\[.*\])$', (ROOT / "Dockerfile").read_text(), re.M)
    assert cmd is not None
    image_args = json.loads(cmd.group(1))[1:]  # the image's default command, without the program
    for name, command in servers.items():  # the image's command with the recipe's flags appended
        args = parser.parse_args(image_args + command)
        assert (args.data_dir, args.voices_dir) == ("/data", "/data/voices")  # one shared folder
        assert "./data:/data" in compose[name]["volumes"]
        assert compose[name]["healthcheck"]["test"][-1] == args.uri  # the image's check, on its port
    announcing = [c for c in servers.values() if "--no-zeroconf" not in c]
    assert len(announcing) == 1 and _flag(announcing[0], "--zeroconf-address") == ":10200"
    assert "bind :10200" in cfg and "bind :8880" in cfg
    checked = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the cluster --------------------------------------------------------------------------


@dataclass
class Cluster:
    """Two servers (gpu0, gpu1 of the recipe) and HAProxy in front."""

    servers: dict[str, Server]
    haproxy: subprocess.Popen[str]
    haproxy_log: Path
    stats: Path  # HAProxy's stats socket
    wyoming_port: int
    http_port: int
    home: Path

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def server_states(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(backend, server) -> (status, last check), from HAProxy's ``show stat``."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.stats))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        states = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("svname") in self.servers:
                states[(row["pxname"], row["svname"])] = (row["status"], row["check_status"])
        return states


def _haproxy_config(servers: dict[str, Server], wyoming_port: int, http_port: int, stats: Path) -> str:
    """The recipe's haproxy.cfg with the test's ports (each replaced exactly where it is)."""
    cfg = HAPROXY_CFG.read_text()
    replacements = {"bind :10200": f"bind 127.0.0.1:{wyoming_port}", "bind :8880": f"bind 127.0.0.1:{http_port}"}
    for name, command in _compose_servers().items():
        if name not in servers:
            continue
        wyoming = _flag(command, "--uri").removeprefix("tcp://")
        http = f"{_flag(command, '--http-host')}:{_flag(command, '--http-port')}"
        srv = servers[name]
        replacements[f"{name} {wyoming} check port {http.split(':')[1]}"] = (
            f"{name} 127.0.0.1:{srv.port} check port {srv.http_port}"
        )
        replacements[f"{name} {http} check"] = f"{name} 127.0.0.1:{srv.http_port} check"
    for old, new in replacements.items():
        assert old in cfg, old
        cfg = cfg.replace(old, new)
    cfg = cfg.replace("global\n", f"global\n    stats socket {stats} level admin\n", 1)
    # Servers of the recipe this test does not start (a third GPU...) are left out.
    kept = [line for line in cfg.splitlines() if not re.match(r"\s+server (\S+) ", line) or line.split()[1] in servers]
    return "\n".join(kept) + "\n"


@pytest.fixture(scope="module")
def cluster(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("scale-out")
    voices = home / "voices"
    voices.mkdir()
    t = np.arange(2 * 24000) / 24000
    sf.write(voices / "clone.wav", (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    (voices / "clone.txt").write_text(CLONE_TRANSCRIPT)
    drain = _flag(_compose_servers()["gpu0"], "--drain-seconds")  # the recipe's
    extra = ["--no-zeroconf", "--custom-voice-model", "none", "--anchors", "used", "--drain-seconds", drain]
    servers: dict[str, Server] = {}
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:  # both logs in `home`: both servers use home/data as their data folder
            servers[name] = start_server(checkpoints, voices, home / f"{name}.log", extra=extra)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=start, args=(name,)) for name in ("gpu0", "gpu1")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    haproxy = None
    try:
        if errors:
            raise errors[0]
        wyoming_port, http_port, stats = free_port(), free_port(), home / "haproxy.sock"
        (home / "haproxy.cfg").write_text(_haproxy_config(servers, wyoming_port, http_port, stats))
        log = home / "haproxy.log"
        haproxy = subprocess.Popen(
            ["haproxy", "-f", str(home / "haproxy.cfg"), "-db"], stdout=log.open("w"), stderr=subprocess.STDOUT,
            text=True, cwd=home,
        )
        result = Cluster(servers, haproxy, log, stats, wyoming_port, http_port, home)
        deadline = time.monotonic() + 30
        while True:  # every server UP in every backend (2 passed checks)
            assert haproxy.poll() is None, log.read_text()
            if stats.exists():
                states = result.server_states()
                if len(states) == 6 and all(s[0] == "UP" and s[1].startswith("L7OK") for s in states.values()):
                    break
            assert time.monotonic() < deadline, (states, log.read_text())
            time.sleep(0.2)
        yield result
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(10)
        for srv in servers.values():
            if srv.alive():
                stop_server(srv)


# --- clients ------------------------------------------------------------------------------


async def wyoming_speak(port: int, voice: str | None = None, text: str = "Hi") -> list[Event]:
    """One ``synthesize`` on ``port``: its events up to and including ``audio-stop``, or a
    refusal's ``error`` (before any audio).

    Raises:
        AssertionError: the connection closed before either (a bare close).
    """
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice) if voice else None).event())
        events: list[Event] = []
        while True:
            event = await asyncio.wait_for(client.read_event(), _GUARD_S)
            assert event is not None, f"bare close after {[e.type for e in events]}"
            events.append(event)
            if AudioStop.is_type(event.type):
                return events
            if Error.is_type(event.type) and not any(e.type == "audio-start" for e in events):
                return events


def samples(events: list[Event]) -> int:
    """Audio samples of a ``synthesize``'s events; asserts it had no ``error``."""
    assert not any(Error.is_type(e.type) for e in events), [e.data for e in events if Error.is_type(e.type)]
    return sum(len(AudioChunk.from_event(e).audio) // 2 for e in events if AudioChunk.is_type(e.type))


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=_GUARD_S)


def sdk_speak(url: str, voice: str = "aria", text: str = "Hi") -> bytes:
    """One ``/v1/audio/speech`` through the ``openai`` SDK: raw 24 kHz 16-bit PCM."""
    response = sdk(url).audio.speech.create(model="tts-1", voice=voice, input=text, response_format="pcm")
    return response.read()


def sdk_speak_sse(url: str, text: str = "Hi") -> list[dict[str, Any]]:
    """One ``/v1/audio/speech`` with ``stream_format="sse"`` through the ``openai`` SDK: its
    events. A server that stops mid-stream ends it with an ``error`` event (a raw body
    could only be cut)."""
    response = sdk(url).audio.speech.create(
        model="tts-1", voice="aria", input=text, response_format="pcm", stream_format="sse"
    )
    lines = response.read().decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


async def ok_count(server: Server, door: str) -> float:
    """The server's ``tts_requests_total{door, outcome="ok"}``."""
    async with aiohttp.ClientSession() as session, session.get(f"{server.http_url}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tts_requests_total" and sample.labels == {"door": door, "outcome": "ok"}:
                return sample.value
    return 0.0


async def voices_of(url: str) -> dict[str, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/audio/voices") as resp:
        assert resp.status == 200
        return {v["name"]: v for v in (await resp.json())["voices"]}


# --- tests --------------------------------------------------------------------------------


@pytest.mark.full
async def test_requests_through_the_balancer_succeed_and_land_on_both_servers(cluster: Cluster) -> None:
    servers = list(cluster.servers.values())
    before = {door: [await ok_count(s, door) for s in servers] for door in ("wyoming", "http")}
    results = await asyncio.gather(*(wyoming_speak(cluster.wyoming_port) for _ in range(6)))
    assert all(samples(events) > 0 for events in results)
    bodies = await asyncio.gather(*(asyncio.to_thread(sdk_speak, cluster.http_url) for _ in range(6)))
    assert all(len(body) > 0 and len(body) % 2 == 0 for body in bodies)
    for door in ("wyoming", "http"):
        after = [await ok_count(s, door) for s in servers]
        landed = [a - b for a, b in zip(after, before[door], strict=True)]
        assert sum(landed) == 6 and all(n >= 1 for n in landed), (door, landed)


@pytest.mark.full
async def test_a_voice_changed_through_one_server_is_seen_by_the_other(cluster: Cluster) -> None:
    """Upload through gpu0, speak through gpu1 (both doors) and through the balancer;
    rename through gpu1, then gpu0 speaks the new name and refuses the old; delete through
    gpu0, then gpu1 refuses it. No restart, no waiting: every request re-reads the folder."""
    one, other = cluster.servers["gpu0"], cluster.servers["gpu1"]
    clip = io.BytesIO()
    t = np.arange(3 * 24000) / 24000
    sf.write(clip, (0.25 * np.sin(2 * np.pi * 150 * t) * (1 + 0.3 * np.sin(2 * np.pi * 2 * t))).astype(np.float32), 24000, format="WAV")
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("name", "Shared")
    form.add_field("transcript", CLONE_TRANSCRIPT)
    form.add_field("file", clip.getvalue(), filename="shared.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{one.http_url}/v1/audio/voices", data=form) as resp:
            assert resp.status == 201, await resp.text()
        assert "Shared" in await voices_of(other.http_url)
        assert samples(await wyoming_speak(other.port, "Shared")) > 0
        assert len(await asyncio.to_thread(sdk_speak, other.http_url, "Shared")) > 0
        for _ in range(2):  # through the balancer, whichever server it picks
            assert samples(await wyoming_speak(cluster.wyoming_port, "Shared")) > 0
            assert len(await asyncio.to_thread(sdk_speak, cluster.http_url, "Shared")) > 0

        async with session.patch(f"{other.http_url}/v1/audio/voices/Shared", json={"name": "Renamed"}) as resp:
            assert resp.status == 200, await resp.text()
        assert samples(await wyoming_speak(one.port, "Renamed")) > 0
        with pytest.raises(openai.NotFoundError) as refused:
            await asyncio.to_thread(sdk_speak, one.http_url, "Shared")
        assert "Unknown voice 'Shared'" in str(refused.value)

        async with session.delete(f"{one.http_url}/v1/audio/voices/Renamed") as resp:
            assert resp.status == 200, await resp.text()
        events = await wyoming_speak(other.port, "Renamed")
        assert any(Error.is_type(e.type) and "Renamed" in (Error.from_event(e).text or "") for e in events)
        assert "Renamed" not in await voices_of(other.http_url)
    assert not list(cluster.home.glob("voices/*enamed*")) and not list(cluster.home.glob("voices/Shared*"))


@pytest.mark.full
async def test_an_anchor_is_rendered_once_across_the_servers(cluster: Cluster) -> None:
    """Both servers start wanting the default voice's anchor (``--anchors used``): one
    claims and renders it, the other waits for the files; both then serve it."""
    deadline = time.monotonic() + 240
    while True:
        states = [(await voices_of(s.http_url))["aria"]["anchor"] for s in cluster.servers.values()]
        if states == ["ready", "ready"]:
            break
        assert time.monotonic() < deadline, states
        await asyncio.sleep(1)
    logs = [s.output() for s in cluster.servers.values()]
    assert sum(log.count("Rendering the anchor of preset aria ") for log in logs) == 1, logs
    anchors = cluster.home / "data" / "anchors"
    assert len([p for p in anchors.glob("*.json") if p.name != "model-digests.json"]) == 1
    assert not list(anchors.glob("*.claim"))  # released
    for srv in cluster.servers.values():  # each now speaks aria as a clone of the one anchor
        assert samples(await wyoming_speak(srv.port, "aria")) > 0
        assert "voice aria (anchor)" in srv.output()


@pytest.mark.full
async def test_a_server_stopped_mid_run_is_drained(cluster: Cluster) -> None:
    """SIGTERM to gpu0 while long streams run on both servers: its /ready turns 503 and
    HAProxy marks it down on that check while gpu0 still serves (--drain-seconds); short
    requests sent through the balancer all the while succeed, the later ones on gpu1; no
    stream gets a bare close (each ends with audio-stop, gpu0's with server-stopping if
    still unfinished); gpu0 exits 0."""
    stopping, staying = cluster.servers["gpu0"], cluster.servers["gpu1"]

    async def long_stream(port: int) -> list[Event]:
        return await wyoming_speak(port, "aria", LONG_TEXT)

    streams = [asyncio.create_task(long_stream(srv.port)) for srv in (stopping, staying)]
    through = asyncio.create_task(long_stream(cluster.wyoming_port))
    await asyncio.sleep(1.0)  # the streams are generating
    stopping.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()

    async def watch() -> tuple[float, dict[tuple[str, str], tuple[str, str]]] | None:
        """When HAProxy first shows gpu0 DOWN in every backend while gpu0 still runs, and
        the states then."""
        while stopping.alive():
            states = cluster.server_states()
            if all(state == "DOWN" for (_, name), (state, _) in states.items() if name == "gpu0"):
                return time.monotonic() - signalled, states
            await asyncio.sleep(0.1)
        return None

    watcher = asyncio.create_task(watch())
    # (seconds after SIGTERM when sent, the Wyoming request's events, the HTTP one's)
    results: list[tuple[float, list[Event], list[dict[str, Any]]]] = []
    def sent_after_down() -> bool:
        """True once a request was sent after HAProxy took gpu0 out (or gpu0 ended first)."""
        if not watcher.done():
            return False
        seen = watcher.result()
        return seen is None or any(t > seen[0] for t, _, _ in results)

    while stopping.alive() or not sent_after_down():
        sent = time.monotonic() - signalled
        # HTTP: a 503 server-stopping before any audio is retried by HAProxy on gpu1.
        events, sse = await asyncio.gather(
            wyoming_speak(cluster.wyoming_port), asyncio.to_thread(sdk_speak_sse, cluster.http_url)
        )
        results.append((sent, events, sse))
        assert time.monotonic() - signalled < 60
    seen = await watcher
    assert seen is not None, "HAProxy never saw gpu0 not-ready while it was still running"
    down_at, states = seen
    for (_, name), (state, check) in states.items():  # out on its /ready's 503; gpu1 stays
        assert (state, check[:5]) == (("DOWN", "L7STS") if name == "gpu0" else ("UP", "L7OK")), states
    # A request that reached gpu0 before HAProxy took it out and was still running when
    # gpu0's drain ended got server-stopping (Wyoming: TCP, HAProxy cannot retry a stream),
    # never a bare close; every request sent after that was spoken whole, by gpu1.
    for sent, events, sse in results:
        assert sse[-1]["type"] in ("speech.audio.done", "error"), sse[-1]
        assert {e["type"] for e in sse[:-1]} <= {"speech.audio.delta"}
        if sent > down_at:
            assert samples(events) > 0 and sse[-1]["type"] == "speech.audio.done", (sent, down_at, sse[-1])
        else:
            errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
            assert samples(events) > 0 if not errors else errors[0].code == "server-stopping", events
            assert sse[-1]["type"] == "speech.audio.done" or sse[-1]["error"]["code"] == "server-stopping", sse[-1]
    assert any(sent > down_at for sent, _, _ in results)
    code = await asyncio.to_thread(stopping.proc.wait, 20)
    assert code == 0

    after_down = await ok_count(staying, "wyoming")
    for _ in range(3):  # gpu0 is gone: everything lands on gpu1
        assert samples(await wyoming_speak(cluster.wyoming_port)) > 0
    assert await ok_count(staying, "wyoming") >= after_down + 3  # (+ a long stream ending meanwhile)

    for task in (*streams, through):
        events = await task  # audio-stop reached: never a bare close
        errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
        assert all(err.code == "server-stopping" for err in errors), errors
    assert not any(Error.is_type(e.type) for e in streams[1].result())  # gpu1's stream is whole
    log = stopping.output()
    assert "Draining for" in log and "Stopped in" in log and "Traceback" not in log, log[-3000:]
    print(f"gpu0 out of HAProxy's rotation {down_at:.1f} s after SIGTERM; {len(results)} request pairs served meanwhile")

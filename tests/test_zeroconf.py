"""Zeroconf discovery, inside a network namespace of the test's own (no real-network mDNS).

The namespace holds a veth pair with test-only addresses (198.18.0.0/15 is reserved for
benchmarking) and a multicast route, so the server's address detection and a real
python-zeroconf browser both run as they would on a LAN.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Server, start_server, stop_server

#: Slow: real server processes, network namespaces.
pytestmark = pytest.mark.full

SERVER_ADDRESS = "198.18.0.1"

BROWSER = r"""
import json, socket, sys, time
from zeroconf import ServiceBrowser, Zeroconf
found = {}
class Listener:
    def add_service(self, zc, type_, name):
        info = zc.get_service_info(type_, name, timeout=3000)
        if info:
            found[name] = {"addresses": [socket.inet_ntoa(a) for a in info.addresses], "port": info.port}
    update_service = add_service
    def remove_service(self, *args): pass
zc = Zeroconf()
ServiceBrowser(zc, "_wyoming._tcp.local.", Listener())
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not found:
    time.sleep(0.2)
zc.close()
print(json.dumps(found))
"""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def netns() -> Iterator[str]:
    """A namespace with lo and a veth pair (198.18.0.1/24, 198.18.0.2/24) and a multicast route."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create a network namespace")
    name = f"qwen3tts-{uuid.uuid4().hex[:8]}"
    _run("ip", "netns", "add", name)
    try:
        ns = ["ip", "netns", "exec", name]
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1")
        _run(*ns, "ip", "addr", "add", f"{SERVER_ADDRESS}/24", "dev", "veth0")
        _run(*ns, "ip", "addr", "add", "198.18.0.2/24", "dev", "veth1")
        _run(*ns, "ip", "link", "set", "veth0", "up")
        _run(*ns, "ip", "link", "set", "veth1", "up")
        _run(*ns, "ip", "route", "add", "224.0.0.0/4", "dev", "veth0")
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.mark.netns
def test_zeroconf_announces_routable_address_and_port(
    netns: str, checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    wrap = ["ip", "netns", "exec", netns]
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log",
        extra=["--zeroconf", "qwen3tts-test"], wrap=wrap, uri_host="0.0.0.0",
    )
    try:
        browse = subprocess.run(wrap + [sys.executable, "-c", BROWSER], capture_output=True, text=True, timeout=60)
        found = json.loads(browse.stdout or "{}")
    finally:
        stop_server(server)
    service = found.get("qwen3tts-test._wyoming._tcp.local.")
    assert service, f"not found: {found} {browse.stderr[-2000:]}\n{server.output()[-2000:]}"
    assert service["port"] == server.port
    assert service["addresses"] == [SERVER_ADDRESS]  # not 0.0.0.0, not loopback


@pytest.mark.netns
@pytest.mark.parametrize(
    ("flag", "announced"),
    [(":10200", (SERVER_ADDRESS, 10200)), ("198.18.0.77:10300", ("198.18.0.77", 10300))],
    ids=["balancer-on-this-host", "balancer-elsewhere"],
)
def test_zeroconf_address_announces_the_load_balancer(
    netns: str, checkpoints: Path, voices_dir: Path, tmp_path: Path, flag: str, announced: tuple[str, int]
) -> None:
    """A server behind a load balancer (bound to loopback, as in docker-compose.scale.yml)
    announces the balancer's address and port (``--zeroconf-address``), on this host's LAN
    interface, whether the address is this host's or another's."""
    wrap = ["ip", "netns", "exec", netns]
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log",
        extra=["--zeroconf", "qwen3tts-lb", "--zeroconf-address", flag, "--clone-model", "none",
               "--custom-voice-model", "none"],
        wrap=wrap,
    )
    try:
        browse = subprocess.run(wrap + [sys.executable, "-c", BROWSER], capture_output=True, text=True, timeout=60)
        found = json.loads(browse.stdout or "{}")
    finally:
        stop_server(server)
    service = found.get("qwen3tts-lb._wyoming._tcp.local.")
    assert service, f"not found: {found} {browse.stderr[-2000:]}\n{server.output()[-2000:]}"
    assert (service["addresses"], service["port"]) == ([announced[0]], announced[1])


def test_no_zeroconf_announces_nothing(server: Server) -> None:
    """The shared fixture runs with --no-zeroconf: no announcer may have started."""
    assert "Ready: Wyoming" in server.output()
    assert "Zeroconf:" not in server.output()

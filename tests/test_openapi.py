"""``GET /openapi.json`` describes what the HTTP door really accepts and returns.

schemathesis (its CLI, as a user would run it) tests the real server on the tiny
checkpoints against the served description: schema-conforming and schema-violating
requests, every check but ``positive_data_acceptance`` (see ``schemathesis.toml``): no 5xx,
no status, header, content type or body the description does not list, every violating
request refused, the API key enforced; its stateful phase chains the voice-management
routes (create, rename, delete). The server runs with ``--fixed-frames 2`` (one codec frame
a sentence) and ``--max-chars 200`` so that generated requests cost little, on a voices
folder of its own (the tests rename and delete voices). ``POST /v1/audio/designs`` is left
out: each call renders up to four clips of up to 10 s, minutes of CPU time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from wyoming_qwen3tts.doors.http import openapi

from .conftest import Server, start_server, stop_server

API_KEY = "openapi-key"
CONFIG = Path(__file__).parent / "schemathesis.toml"
#: Test cases per operation and phase (schemathesis -n); more with QWEN3TTS_SCHEMATHESIS_EXAMPLES.
EXAMPLES = int(os.environ.get("QWEN3TTS_SCHEMATHESIS_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def described(checkpoints: Path, voices_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("server-openapi")
    voices = folder / "voices"
    shutil.copytree(voices_dir, voices)
    srv = start_server(
        checkpoints, voices, folder / "server.log",
        extra=["--no-zeroconf", "--fixed-frames", "2", "--max-chars", "200", "--api-key", API_KEY],
    )
    yield srv
    stop_server(srv)


@pytest.mark.full
def test_document_is_served_without_the_key(described: Server) -> None:
    with urllib.request.urlopen(f"{described.http_url}/openapi.json", timeout=60) as resp:
        assert resp.status == 200
        doc = json.loads(resp.read())
    assert doc["openapi"].startswith("3.1")
    speech = doc["components"]["schemas"]["SpeechRequest"]["properties"]
    assert speech["input"]["maxLength"] == 200  # the running server's --max-chars
    assert doc["paths"]["/v1/audio/speech"]["post"]["security"] == [{"bearerAuth": []}]
    assert "security" not in doc["paths"]["/health"]["get"]
    # Every operation with a body says it may get 408 (a stalled body: doors.http.shared.watch_body).
    with_body = [op for item in doc["paths"].values() for op in item.values() if "requestBody" in op]
    assert with_body and all("408" in op["responses"] for op in with_body)


def test_every_route_is_described() -> None:
    """The routes ``create_app`` registers and the paths of the description are the same
    (a route added without ``openapi.add_paths`` fails here)."""
    import asyncio

    from aiohttp import web

    from wyoming_qwen3tts.doors.http.api import create_app

    from .stub_service import stub_service

    async def routes() -> set[tuple[str, str]]:
        async with stub_service() as service:
            app = create_app(service)
            return {
                (route.method.lower(), route.resource.canonical)
                for route in app.router.routes()
                if route.method != "HEAD" and route.resource is not None
                and not isinstance(route.resource, web.StaticResource)  # the page's files
            }

    served = asyncio.run(routes())
    doc = openapi.document(1000)
    described = {(method, path) for path, item in doc["paths"].items() for method in item}
    assert served == described


@pytest.mark.full
def test_schemathesis_finds_nothing(described: Server, tmp_path: Path) -> None:
    """The real server against its own description; a failure prints schemathesis's report
    (with a curl line reproducing each case)."""
    report = tmp_path / "junit.xml"
    proc = subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "--no-color",
            "run", f"{described.http_url}/openapi.json",
            "--header", f"Authorization: Bearer {API_KEY}",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--exclude-operation-id", "createDesign",
            "--max-examples", str(EXAMPLES), "--seed", "1", "--generation-database", "none",
            "--workers", "2", "--request-timeout", "120",
            "--report", "junit", "--report-junit-path", str(report),
        ],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,  # its crash cache goes there
    )
    print(proc.stdout[-1500:])
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert re.search(r"Test cases:\n\s+(\d+) generated, \1 passed", proc.stdout), proc.stdout[-3000:]
    log = described.output()
    assert described.alive()
    assert "Traceback" not in log and "never retrieved" not in log, log[-4000:]

"""A server on the GGML engine keeps PyTorch, transformers and qwen_tts out of its process
(0.8 GB resident): the start-up's quieting and device check import none of them, and they
are imported where a PyTorch engine is loaded. Checked in a fresh interpreter, whose
``sys.modules`` nothing else in the test session has filled."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from wyoming_qwen3tts.engine.cpu.ggml import native_support

HEAVY = ("torch", "transformers", "qwen_tts", "faster_qwen3_tts")

SCRIPT = """
import json, logging, sys
from wyoming_qwen3tts.common.quiet import quiet_dependencies
from wyoming_qwen3tts.startup import _device
quiet_dependencies(models=False)
device = _device(sys.argv[1], sys.argv[2])
print(json.dumps({"device": device, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _run(device: str, engine: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, device, engine], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not native_support()[0], reason=f"GGML engine unavailable: {native_support()[1]}")
def test_cpu_start_up_on_the_ggml_engine_imports_no_torch() -> None:
    assert _run("cpu", "ggml") == {"device": "cpu", "loaded": []}


def test_the_device_check_without_a_driver_imports_no_torch() -> None:
    from wyoming_qwen3tts.engine.gpu.cuda_env import driver_cuda_version

    if driver_cuda_version() is not None:
        pytest.skip("an NVIDIA driver is installed: auto asks torch, as it should")
    assert _run("auto", "reference") == {"device": "cpu", "loaded": []}

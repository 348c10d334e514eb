"""Every Triton kernel the engine launches compiles to a cubin for each CUDA target our users
run, on a machine without a GPU.

The CPU tests run the kernels in Triton's interpreter, which does not enforce the compiler's
rules: commit e5197bb fixed ``_im2col_kernel``, which redefined a name with another shape
inside a runtime ``if`` and so broke the decode on the H200 while every CPU test passed.
Triton compiles for a named target without a device, so this test does, for real launches:

* Recording: each kernel module's public wrapper (``im2col``, ``fused_linear``, ...) is called
  on CPU tensors of the models' shapes (``torch.empty``: nothing is computed), with every flag
  it takes, for bfloat16 (what ``--dtype auto`` runs on a GPU) and float32/float16 (the other
  ``--dtype`` choices). Each module's ``launcher`` is replaced by a recorder that keeps the
  kernel and its arguments as Triton's launcher would specialize them (a tensor: a pointer to
  its dtype, 16-byte aligned; an int: i32 or i64 by value, 1 a constant; a float: fp32), the
  constexprs and ``num_warps``/``num_stages``, and launches nothing. Distinct launches are
  compiled with ``PDL`` False on every target and True on those of ``PDL_CAPABILITY`` or newer
  (``griddepcontrol`` needs sm_90: ptxas refuses it below).
* Compiling: ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` in child
  processes without ``TRITON_INTERPRET`` (the kernels imported here are interpreted ones), with
  a fresh cache. Each cubin's shared memory is checked against the target's per-block limit
  (Triton refuses a launch past it: ``OutOfResources``), and ptxas's own report (``-v``,
  printed by ``TRITON_DUMP_PTXAS_LOG``) must show no register spill in a bfloat16 or float16
  launch (``SPILL_FREE_DTYPES``).
* Coverage: the recorded kernels are every ``@triton.jit`` function of ``kernels/*.py`` that
  no other one calls (the device helpers are compiled inside their callers), so a new kernel
  without a wrapper call here fails.

Targets: sm_90 (H100/H200) for every launch; sm_80 (A100), sm_86 (RTX 30), sm_87 (Jetson
Orin), sm_89 (RTX 40, L4), sm_100 (B200), sm_120 (RTX 50) and sm_121 (DGX Spark) for every
bfloat16 launch, and one launch per kernel in the other dtypes (which change only the pointer
types). Skipped only without Triton's NVIDIA backend or its ptxas.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "wyoming_qwen3tts.engine.batched.kernels"

#: Compute capability -> (GPUs, most shared memory a block may use, bytes: the CUDA
#: programming guide's "maximum amount of shared memory per thread block", what Triton checks
#: a launch against).
TARGETS: dict[int, tuple[str, int]] = {
    80: ("A100", 163 * 1024),
    86: ("RTX 30xx, A10, A40", 99 * 1024),
    87: ("Jetson AGX Orin", 163 * 1024),
    89: ("RTX 40xx, L4, L40S", 99 * 1024),
    90: ("H100, H200", 227 * 1024),
    100: ("B200", 227 * 1024),
    120: ("RTX 50xx", 99 * 1024),
    121: ("DGX Spark (GB10)", 99 * 1024),
}
#: Launches that must not spill registers to local memory (ptxas -v's "bytes spill stores"):
#: the dtypes a GPU serves in (``--dtype auto``: bfloat16, float16 before Ampere). Stop 45's
#: attention loop that fetched the next block's keys early needed 255 registers and spilled
#: on the talker's cache; on the H200 it ran 2-3x slower, while every CPU test passed. float32
#: (``--dtype float32``) multiplies in exact IEEE float32 on the FMA units, whose tiles spill
#: today (``_causal_conv_kernel``, used only with ``QWEN3TTS_CONV=kernel``, and the int8
#: product at one row): reported, not failed.
SPILL_FREE_DTYPES = ("bf16", "fp16")
#: The target every bfloat16 launch compiles for.
FULL_TARGET = 90
#: Targets every distinct tile of a kernel compiles for (shared memory), beside one launch per
#: kernel: the 99 KB ones, Ampere/Ada's lowering (``mma`` v2) and consumer Blackwell's.
TILE_TARGETS = (86, 121)


# --- recording ------------------------------------------------------------------------------

def _kind(arg: Any) -> tuple[str, Any]:
    """(Triton signature type, specialization) of a launch argument, as the launcher makes it:
    ("*bf16", "D") for a 16-byte aligned bfloat16 tensor, ("i32", "") for 17,
    ("constexpr", 1) for 1, ("fp32", None) for a float."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        kind, spec = native_specialize_impl(BaseBackend, arg, False, True, True)
        return str(kind), spec
    except ImportError:  # another Triton: the plain kinds
        import torch

        if isinstance(arg, torch.Tensor):
            names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
                     torch.int32: "i32", torch.int8: "i8", torch.bool: "u1"}
            return "*" + names[arg.dtype], None
        if isinstance(arg, bool):
            return "u1", None
        if isinstance(arg, int):
            return ("i32" if -(2**31) <= arg < 2**31 else "i64"), None
        return "fp32", None


class Recorder:
    """Stands in for ``kernels.launcher``: keeps each launch as a compile job, runs nothing."""

    OPTIONS = ("num_warps", "num_stages")

    def __init__(self) -> None:
        self.launches: dict[str, dict[str, Any]] = {}
        self.dtype = "bf16"

    def launcher(self, kernel: Any, t: Any) -> Any:
        recorder = self

        class Launch:
            def __getitem__(self, grid: Any) -> Callable[..., None]:
                return lambda *args, **kwargs: recorder.record(kernel, args, kwargs)

        return Launch()

    def record(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fn = kernel.fn
        names = list(kernel.arg_names)
        options = {k: kwargs.pop(k) for k in self.OPTIONS if k in kwargs}
        assert "PDL" not in kwargs and names[-1] == "PDL", f"{fn.__name__}: PDL is the launcher's, last"
        bound = dict(zip(names, args))
        bound.update(kwargs)
        assert set(bound) == set(names) - {"PDL"}, f"{fn.__name__}: arguments {sorted(bound)} for {names}"
        signature: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        aligned: list[str] = []
        for name in names[:-1]:
            value = bound[name]
            if name in kwargs:  # the kernels pass their constexprs by keyword
                signature[name], constexprs[name] = "constexpr", value
                continue
            kind, spec = _kind(value)
            signature[name] = kind
            if kind == "constexpr":
                constexprs[name] = spec
            elif spec == "D":
                aligned.append(name)
        job = {"module": fn.__module__, "kernel": fn.__name__, "signature": signature,
               "constexprs": constexprs, "aligned": aligned, "options": options}
        self.launches.setdefault(json.dumps(job, sort_keys=True), dict(job, dtype=self.dtype))


@contextmanager
def recording() -> Iterator[Recorder]:
    """Every kernel module's ``launcher`` replaced by one ``Recorder``'s, within."""
    recorder = Recorder()
    saved = {}
    for module in kernel_modules():
        if hasattr(module, "launcher"):
            saved[module] = module.launcher
            module.launcher = recorder.launcher
    try:
        yield recorder
    finally:
        for module, launcher in saved.items():
            module.launcher = launcher


def kernel_modules() -> list[Any]:
    """Every module of the kernels package (importing them)."""
    package = importlib.import_module(PACKAGE)
    return [importlib.import_module(f"{PACKAGE}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]


def scanned_kernels() -> set[str]:
    """``module:name`` of each ``@triton.jit`` function of the package that no other calls."""
    from triton.runtime.jit import KernelInterface

    jitted = {}
    for module in kernel_modules():
        for name, value in vars(module).items():
            if isinstance(value, KernelInterface) and value.fn.__module__ == module.__name__:
                jitted[f"{module.__name__}:{name}"] = value
    sources = {key: Path(fn.fn.__code__.co_filename).read_text() for key, fn in jitted.items()}
    called = set()
    for key in jitted:
        name = key.split(":")[1]
        if any(re.search(rf"\b{name}\(", src.replace(f"def {name}(", "")) for src in sources.values()):
            called.add(key)
    return set(jitted) - called


def launch_wrappers(recorder: Recorder) -> None:
    """Call every kernel wrapper with each flag it takes, at the models' shapes (1.7B talker:
    hidden 2,048, 16 heads of 128, 8 key/value heads, MLP 6,144; code predictor: 1,024 and
    3,072, 15 codebooks of 2,048; codec decoder: 1,536 -> 96 channels, a 72-slot window)."""
    import torch

    from wyoming_qwen3tts.engine.batched.kernels import (
        attention, causal_conv, codebooks, embed, im2col, int8_matmul, linear, noise, rmsnorm, rope,
        rope_attention, rope_tables, sampler, silu_mul, snake,
    )
    from wyoming_qwen3tts.engine.batched.sampling import CANDIDATES, RowParams

    i64, f32 = torch.int64, torch.float32

    def e(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype)

    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32"), (torch.float16, "fp16")):
        recorder.dtype = tag

        def t(*shape: int) -> torch.Tensor:
            return e(*shape, dtype=dtype)

        # The transformer layers (talker, code predictor, codec decoder's transformer).
        for rows, d in ((1, 2048), (3, 1024), (32, 1024)):
            for branch in (None, t(rows, d)):
                rmsnorm.add_rms_norm(t(rows, d), branch, t(d), 1e-6)
            silu_mul.silu_mul(t(rows, 2 * 3072))
        heads, kv, hd = 16, 8, 128
        for b, n, cache in ((4, 1, 2048), (1, 12, 2048), (2, 1, 17)):
            keys, values = t(b, kv, cache, hd), t(b, kv, cache, hd)
            for norm in (None, (t(heads + kv, hd), 1e-6)):
                qkv, cos, pos = t(b, n, heads + 2 * kv, hd), t(1, n, hd), e(b, n, dtype=i64)
                q = rope.qk_rope_kv(qkv, norm, cos, cos, pos, keys, values, heads)
                attention.decode_attention(q, keys, values, pos, 0.088, splits=1)
                if n == 1:
                    rope_attention.rope_attention(qkv, norm, cos, cos, pos, keys, values, heads, 0.088)
            attention.decode_attention(t(b, n, heads, hd), keys, values, e(b, n, dtype=i64), 0.088,
                                       splits=cache // attention.CHUNK)
        ring = t(2, 16, 72, 64)
        rope_attention.rope_attention(t(2, 1, 48, 64), None, t(2, 1, 64), t(2, 1, 64), e(2, 1, dtype=i64), ring, ring,
                                      16, 0.125, window=72)
        for b, n in ((4, 1), (1, 12)):
            rope_tables.rope_cos_sin(e(b, n, dtype=i64), e(hd // 2, dtype=f32), 1.0, dtype)
        # Products: each flag in each kind of tile (broadcast and ``tl.dot``, from ``tiles_for``
        # by rows and outputs, and the wide tile stop 44's sweep (``benchmarks.linear_sweep``)
        # found best for the predictor's residual products), dense and int8.
        wide = (16, 16, 512)
        for rows, n, k, tiles in ((1, 3072, 2048, None), (1, 1024, 2048, None), (3, 1024, 1024, None),
                                  (16, 1024, 2048, None), (16, 1024, 2048, linear.Tiles(*wide, dot=True))):
            for with_norm, silu, res, int8, with_bias, gather in (
                (False, False, False, False, False, False), (True, True, False, False, False, False),
                (True, False, True, False, True, False), (False, True, False, True, True, False),
                (True, False, True, True, False, True),
            ):
                if tiles is not None and not res:
                    continue
                out = n * (2 if silu else 1)
                w = linear.Weight(e(out, k, dtype=torch.int8) if int8 else t(out, k), e(out, dtype=f32) if int8 else None,
                                  t(out) if with_bias else None)
                x, ids = (t(4096, k), (e(rows, dtype=i64), 2048)) if gather else (t(rows, k), None)
                linear.fused_linear(x, w, norm=(t(k), 1e-6) if with_norm else None, silu=silu,
                                    residual=t(rows, n) if res else None, tiles=tiles, gather=ids)
        for rows in (1, 32, 600):
            for int8_bias in (None, t(2048)):
                int8_matmul.int8_linear(t(rows, 1024), e(2048, 1024, dtype=torch.int8), e(2048, dtype=f32),
                                        int8_bias)
        # Sampling and the frame's inputs.
        b = 4
        params = RowParams(e(b, dtype=f32), e(b, dtype=i64), e(b, dtype=f32))
        for vocab in (3072, 2048):
            for penalty, banned, hold in ((False, False, False), (True, True, True), (False, True, False)):
                sampler.sample_fused(
                    t(b, vocab), params, e(b, CANDIDATES, dtype=f32), e(b, dtype=i64),
                    seen=e(b, vocab, dtype=torch.bool) if penalty else None, penalty=e(b, dtype=f32) if penalty else None,
                    banned=e(vocab, dtype=torch.bool) if banned else None,
                    hold=(e(b, dtype=i64), e(b, dtype=i64), 2150) if hold else None,
                    eos=e(b, dtype=torch.bool) if hold else None,
                )
        noise.frame_noise(e(b, dtype=i64), e(b, dtype=i64), 16)
        embed.frame_embeds(e(b, dtype=i64), e(b, 15, dtype=i64), t(3072, 2048), t(15 * 2048, 2048), t(2048),
                           e(b, 16, dtype=i64))
        # The codec decoder.
        codebooks.codebook_sum(t(16 * 2048, 512), e(b, 16, 2, dtype=i64))
        for channels, length, taps, dilation in ((1536, 2, 7, 1), (96, 1920, 7, 9), (192, 640, 7, 3), (384, 160, 3, 1)):
            x = t(b, channels, length)
            for folded in (False, True):
                for advance in (False, True):
                    im2col.im2col(t(b, channels, (taps - 1) * dilation), x, taps, dilation, folded, advance)
            causal_conv.causal_conv(t(b, channels, (taps - 1) * dilation), x, t(taps, channels, channels), dilation)
            for snake_branch, snake_bias in ((None, None), (None, t(channels)), (t(b, channels, length), None),
                                             (t(b, channels, length), t(channels))):
                snake.snake(x, e(channels, dtype=f32), e(channels, dtype=f32), snake_branch, snake_bias)


def _tile(job: dict[str, Any]) -> str:
    """A launch's kernel and what sets its shared memory: warps, stages, block sizes, tl.dot."""
    shape = {k: v for k, v in job["constexprs"].items() if k.startswith("BLOCK") or k in ("DOT", "SILU", "ROWS")}
    return json.dumps([job["kernel"], job["options"], shape], sort_keys=True)


def plan(launches: list[dict[str, Any]], pdl_from: int) -> list[dict[str, Any]]:
    """The compile jobs (a launch with ``target`` and ``pdl``): on ``FULL_TARGET`` every
    bfloat16 launch with PDL, the first of each kernel without, the first of each kernel in
    each other dtype; on ``TILE_TARGETS`` each kernel's distinct tiles (bfloat16); on the
    other targets each kernel's first bfloat16 launch. PDL on targets from ``pdl_from`` (the
    capability as 90 for 9.0), never below."""
    first: dict[str, dict[str, Any]] = {}
    tiles: dict[str, dict[str, Any]] = {}
    jobs = []
    for launch in launches:
        if launch["dtype"] == "bf16":
            first.setdefault(launch["kernel"], launch)
            tiles.setdefault(_tile(launch), launch)
            jobs.append(dict(launch, target=FULL_TARGET, pdl=FULL_TARGET >= pdl_from))
        elif f"{launch['kernel']}:{launch['dtype']}" not in first:
            first[f"{launch['kernel']}:{launch['dtype']}"] = launch
            jobs.append(dict(launch, target=FULL_TARGET, pdl=FULL_TARGET >= pdl_from))
    jobs += [dict(launch, target=FULL_TARGET, pdl=False) for key, launch in first.items() if ":" not in key]
    for target in TARGETS:
        if target != FULL_TARGET:
            chosen = tiles.values() if target in TILE_TARGETS else [v for k, v in first.items() if ":" not in k]
            jobs += [dict(launch, target=target, pdl=target >= pdl_from) for launch in chosen]
    return jobs


# --- compiling (child processes) ------------------------------------------------------------

def ptxas_usage(log: str) -> dict[str, int]:
    """``registers`` (per thread) and ``spill_stores`` (bytes) from ``ptxas -v``'s log of one
    kernel, the most over its functions; {} when the log has neither (Triton printed none).
    The stack frame is not counted: libdevice's sin/cos use one without any spill."""
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    usage = {}
    if registers:
        usage["registers"] = max(registers)
    if spills:
        usage["spill_stores"] = max(spills)
    return usage


def compile_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Compile each job (``Recorder`` job plus ``target`` and ``pdl``); a result per job:
    ``ok``, the cubin's ``shared`` bytes, or the ``error``. Run without ``TRITON_INTERPRET``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results: list[dict[str, Any]] = []
    for job in jobs:
        fn = getattr(importlib.import_module(job["module"]), job["kernel"])
        signature = dict(job["signature"], PDL="constexpr")
        constexprs = dict(job["constexprs"], PDL=job["pdl"])
        attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in job["aligned"]}
        source = ASTSource(fn=fn, signature=signature, attrs=attrs,
                           constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
        start = time.perf_counter()
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log):  # ptxas -v's log (TRITON_DUMP_PTXAS_LOG)
                compiled = triton.compile(source, target=GPUTarget("cuda", job["target"], 32), options=job["options"])
            results.append({"ok": True, "shared": int(compiled.metadata.shared),
                            "seconds": time.perf_counter() - start, **ptxas_usage(log.getvalue())})
        except Exception as error:  # noqa: BLE001 -- reported per job
            text = f"{type(error).__name__}: {error}"
            results.append({"ok": False, "error": text[-1500:], "seconds": time.perf_counter() - start})
    return results


def _compiler_ready() -> str | None:
    """Why the kernels cannot be compiled here (no Triton NVIDIA backend or ptxas), or None."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        return "Triton has no NVIDIA backend"
    from triton import knobs

    for tool in (knobs.nvidia.ptxas, knobs.nvidia.ptxas_blackwell):
        try:
            tool.path  # noqa: B018 -- raises without the binary
        except Exception as error:  # noqa: BLE001
            return f"Triton's ptxas is missing: {error}"
    return None


def test_every_kernel_is_recorded() -> None:
    """The wrapper calls launch every kernel of the package (a new kernel needs a call here)."""
    if reason := _compiler_ready():
        pytest.skip(reason)
    with recording() as recorder:
        launch_wrappers(recorder)
    recorded = {f"{job['module']}:{job['kernel']}" for job in recorder.launches.values()}
    assert recorded == scanned_kernels()


@pytest.mark.full
def test_every_kernel_compiles_for_every_target(tmp_path: Path) -> None:
    """Each distinct launch compiles for sm_90 (and, bfloat16 or one per kernel, every other
    target), with PDL on sm_90+, within each target's shared memory."""
    if reason := _compiler_ready():
        pytest.skip(reason)
    from wyoming_qwen3tts.engine.batched.kernels import PDL_CAPABILITY

    with recording() as recorder:
        launch_wrappers(recorder)
    jobs = plan(list(recorder.launches.values()), PDL_CAPABILITY[0] * 10 + PDL_CAPABILITY[1])
    workers = max(1, min(2, os.cpu_count() or 1))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["TRITON_DUMP_PTXAS_LOG"] = "1"  # ptxas -v's log, for ``ptxas_usage``
    start = time.perf_counter()
    children = [
        subprocess.Popen([sys.executable, __file__], cwd=ROOT, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(workers)
    ]
    shares = [jobs[i::workers] for i in range(workers)]
    outputs = []
    for child, share in zip(children, shares):
        assert child.stdin is not None
        child.stdin.write(json.dumps(share))
        child.stdin.close()
    for child in children:
        assert child.stdout is not None and child.stderr is not None
        out, err = child.stdout.read(), child.stderr.read()
        assert child.wait() == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = time.perf_counter() - start
    failures: list[str] = []
    spilled: list[str] = []  # float32 launches that spill (reported, not failed)
    for share, results in zip(shares, outputs):
        for job, result in zip(share, results):
            where = (f"{job['kernel']} sm_{job['target']} PDL={job['pdl']} {job['dtype']} "
                     f"{job['constexprs']} {job['options']}")
            if not result["ok"]:
                failures.append(f"{where}: {result['error']}")
            elif result["shared"] > TARGETS[job["target"]][1]:
                failures.append(f"{where}: {result['shared']} bytes of shared memory, the target allows "
                                f"{TARGETS[job['target']][1]}")
            elif "spill_stores" not in result:
                failures.append(f"{where}: no ptxas -v log to read (TRITON_DUMP_PTXAS_LOG)")
            elif result["spill_stores"] and job["dtype"] in SPILL_FREE_DTYPES:
                failures.append(f"{where}: spills {result['spill_stores']} bytes of registers to local memory "
                                f"({result['registers']} registers a thread); a smaller tile or fewer values "
                                "live at once keeps it in registers")
            elif result["spill_stores"]:
                spilled.append(f"{job['kernel']} {job['dtype']} sm_{job['target']}: {result['spill_stores']} bytes")
    kernels = {job["kernel"] for job in jobs}
    print(f"{len(jobs)} compiles ({len(recorder.launches)} launches, {len(kernels)} kernels, "
          f"targets {sorted(TARGETS)}) in {elapsed:.1f} s with {workers} processes; float32 spills: "
          f"{'; '.join(sorted(set(spilled))) or 'none'}")
    assert not failures, "\n\n".join(failures)


if __name__ == "__main__":  # a compiling child: jobs on stdin, results on stdout
    sys.path.insert(0, str(ROOT))
    print(json.dumps(compile_jobs(json.load(sys.stdin))))

"""Turns probe (GPU): does a Base model that leaves GPU memory, taking turns with the VoiceDesign
model, free it? In one process, through the real service and on-demand engines, on the
full-size random checkpoints (``.ckpt/full``), optionally under an allocator cap like the
server's ``--gpu-memory`` (``CAP_GB=7.5``, streams then sized automatically).

``CAP_GB=7.5 python -m benchmarks.turns_probe`` prints GPU memory after each phase (loaded,
clones spoken, the preset designed live once the Base model left), whether the Base engine
object is still alive after it left, and what big CUDA tensors remain. On the H200
(2026-12-01) it spoke the preset with and without the cap, where the real server under the
same cap did not (``benchmarks/results/nvidia-h200/turns-probe/``).
"""
import asyncio, gc, sys, types, weakref
from pathlib import Path
import numpy as np, soundfile as sf, torch
from wyoming_qwen3tts.engine import load_engine
from wyoming_qwen3tts.engine.on_demand import GpuLease, OnDemandEngine
from wyoming_qwen3tts.metrics import Metrics
from wyoming_qwen3tts.service import TtsService
from wyoming_qwen3tts.voices import ModelKind, VoiceCatalog
from wyoming_qwen3tts.engine import Segment
from wyoming_qwen3tts.service import SpeechRequest
from wyoming_qwen3tts.voices import Reference


async def _speak(service, text, voice="aria"):
    samples = 0
    async for chunk in service.speak(SpeechRequest(voice=voice), text):
        samples += len(chunk)
    return samples


def _warm(engine):
    return Segment("Hello.", "auto", 2, seed=0, instruct="A calm voice.")


def _clone_warm():
    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)
    return Segment("Hello.", "auto", 2, seed=0, reference=Reference.from_audio(tone, 24000, None))

FULL = Path(".ckpt/full")
voices = Path("/tmp/leakvoices"); voices.mkdir(exist_ok=True)
t = np.arange(72000) / 24000
sf.write(voices / "clone.wav", (0.2 * np.sin(2 * np.pi * 190 * t)).astype("float32"), 24000)
(voices / "clone.txt").write_text("This is a short reference recording.")

def mem(tag):
    gc.collect(); torch.cuda.synchronize(); torch.cuda.empty_cache()
    print(f"{tag}: allocated {torch.cuda.memory_allocated()/1e9:.2f} GB reserved {torch.cuda.memory_reserved()/1e9:.2f} GB", flush=True)

def chains(obj, depth=0, seen=None):
    seen = seen if seen is not None else set()
    if depth > 3: return
    for r in gc.get_referrers(obj):
        if id(r) in seen or isinstance(r, types.FrameType) and r is sys._getframe(): continue
        seen.add(id(r))
        desc = type(r).__name__
        if isinstance(r, dict): desc += " keys=" + ",".join(map(str, list(r)[:8]))
        if isinstance(r, types.FrameType): desc += f" {r.f_code.co_filename}:{r.f_code.co_name}:{r.f_lineno}"
        if isinstance(r, (list, tuple)): desc += f" len={len(r)}"
        print("  " * depth + "<- " + desc[:200], flush=True)
        if not isinstance(r, types.FrameType) and depth < 3 and r is not seen:
            chains(r, depth + 1, seen)

async def main():
    lease = GpuLease()
    import os, logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cap = float(os.environ.get("CAP_GB", "0"))
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap * 1e9 / torch.cuda.mem_get_info()[1])
    def loader(kind, folder):
        return lambda shrink=1.0: load_engine(kind, FULL / folder, "cuda", 4, "batched", None if cap else 4, max_len=1024,
                                              cap_gb=cap or None, shrink=shrink)
    mem("start")
    base = OnDemandEngine(ModelKind.BASE, 4, loader(ModelKind.BASE, "base"), lambda e: _clone_warm(), idle_s=None, lease=lease, home=True, auto_streams=bool(cap))
    design = OnDemandEngine(ModelKind.VOICE_DESIGN, 4, loader(ModelKind.VOICE_DESIGN, "voice_design"), _warm, idle_s=60, lease=lease, auto_streams=bool(cap))
    await asyncio.to_thread(base.warm, _clone_warm())
    await asyncio.to_thread(design.warm, _warm(design))
    mem("base loaded")
    first = weakref.ref(base.inner)
    kinds = {ModelKind.BASE, ModelKind.VOICE_DESIGN}
    service = TtsService(VoiceCatalog(voices, kinds), {ModelKind.BASE: base, ModelKind.VOICE_DESIGN: design}, "aria", Metrics())
    try:
        print("clone", await _speak(service, "A clone first.", voice="clone"), flush=True)
        print("4 clones", await asyncio.gather(*[_speak(service, f"Clone number {i} speaks.", voice="clone") for i in range(4)]), flush=True)
        mem("after clones")
        try:
            print("preset", await _speak(service, "A preset, designed live."), flush=True)
        except Exception as err:
            print("preset failed:", repr(err)[:300], flush=True)
        print("resident base/design", base.resident, design.resident, flush=True)
        mem("design in, base out")
        alive = first()
        print("base engine alive after leaving:", alive is not None, flush=True)
        if alive is not None:
            chains(alive)
            for name in ("state", "step", "decoder", "prefill", "graphs", "_qwen"):
                obj = getattr(alive, name, None)
                if obj is not None:
                    print(f"referrers of engine.{name}:", [type(r).__name__ for r in gc.get_referrers(obj)][:10], flush=True)
            del alive
        else:
            # the engine is gone: which tensors still hold memory?
            big = [o for o in gc.get_objects() if torch.is_tensor(o) and o.is_cuda and o.numel() * o.element_size() > 50e6]
            print("big CUDA tensors alive:", [(tuple(o.shape), str(o.dtype)) for o in big][:20], flush=True)
            if big:
                for r in gc.get_referrers(big[0])[:5]:
                    print("  big[0] <-", type(r).__name__, (list(r)[:6] if isinstance(r, dict) else ""), flush=True)
                    for rr in gc.get_referrers(r)[:4]:
                        print("     <-", type(rr).__name__, (list(rr)[:6] if isinstance(rr, dict) else ""), flush=True)
        print(torch.cuda.memory_summary(abbreviated=True)[:3000], flush=True)
    finally:
        await asyncio.to_thread(service.stop)

if __name__ == "__main__":
    asyncio.run(main())

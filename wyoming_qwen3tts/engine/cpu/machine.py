"""The GGML engine's settings chosen from the machine: streams (native contexts), threads per
stream, weight format and codec runtime. The start-up log says them in one short line at INFO
(``CpuPlan.describe``) and each choice's reason at DEBUG (``CpuPlan.details``).

What the choices rest on (``benchmarks/results/cpu-2core/limits.md``):

* **Threads per stream: as many as leave room for a second stream**, in pairs (half
  generating, half decoding audio beside them; ``ggml.thread_split``), at most 8: 2 on up to
  7 cores, 4 on 8-11, 6 on 12-15, 8 from 16 (one on a 1-core machine). On the GPU machine's
  cores qwentts.cpp's generation and codec both scale nearly linearly with threads (0.6B
  Q8_0, ms a frame with 1 / 2 / 8 threads: codec 361 / 191 / 54, generation 362 / 193 / 52;
  ``benchmarks/results/cpu-8core/limits.json``), and 4 threads a stream on 4 of them gave
  0.34-0.41x where 2 give 0.15x (``cpu-4core/results.json``). (An earlier reading, "more
  threads did not help", set those 4 threads beside 2 threads of the faster 2-core VM.)
* **Streams: the cores over the threads a stream, at least 2, at most 4, as many as memory
  holds.** One context
  generates one stream at a time (the binding's batched rows, ``max_batch`` > 1, ran a
  2-stream batch about 80 times slower on the CPU than one context each, and forbid the
  codec thread). With one context, a second client waits a whole sentence for its first
  audio (43 s in the issue's trial); with two, both are heard at once. On 2 cores two busy
  contexts share the cores (4 threads on 2 CPUs, each at about half speed, the same total);
  an idle one costs only its memory. Each context holds its own copy of the weights (the
  library copies them at load; nothing in its API shares them), so memory caps the count.
* **Weights: Q8_0.** ``Q4_0`` generation weights (4-bit talker and code predictor) read
  30 % fewer bytes a frame; the default stays 8-bit until greedy codes of real weights show
  the voices hold (``--gguf-quant Q4_0`` offers them).
* **Codec runtime: qwentts.cpp's own.** The wheel decodes inside its generation call and
  hands over audio only (codes come out only in a debugging dump after the whole request),
  so another codec cannot serve its streams.

The pipeline engine (``--engine pipeline``, ``pipeline``) generates on one thread and decodes on
another (ONNX Runtime); ``pipeline_threads`` chooses each side's threads:

* **Half the cores each, generation taking the odd one, at most 4 a side**: 1 + 1 on 2 cores,
  2 + 1 on 3, 2 + 2 on 4, 4 + 4 from 8. Generation (98 ms a frame for 0.6B Q8_0 on one core
  here) and ONNX Runtime's codec step (90 ms on one thread, 68 ms on two) cost about the same
  a frame (``benchmarks/results/cpu-2core/limits.md``), so an even split lets neither wait
  long for the other. Beyond 4 threads ggml's per-node barriers on these small matrices cost
  more than the split gains (4 threads a stream on 4 cores: 0.34-0.41x against a predicted
  1.0x, ``cpu-4core``), and every stream of a model shares these two sides.
* **Never more threads than cores**, but for one core, where both sides take turns on it
  (1 + 1: the pipeline needs one thread each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: Threads one stream uses by default at most (see the module text: measured up to 8).
MAX_THREADS_PER_STREAM = 8
#: Streams the default threads leave room for: a second client is heard at once.
ROOM_FOR_STREAMS = 2
#: At most this many contexts by default (each holds the weights).
MAX_DEFAULT_STREAMS = 4
#: Memory a context needs beyond its weight files, bytes: qwentts.cpp's talker KV cache
#: (4096 positions hard-coded, float32: 0.94 GB for 0.6B and 1.7B alike, "896 MB" in its load
#: log) and compute buffers (about 0.07 GB; ``benchmarks/results/cpu-2core/results.md``,
#: Memory: 2.16 GB anonymous for one 0.6B Q8_0 context).
CONTEXT_OVERHEAD = 1024 * 2**20
#: Memory kept free for the rest of the server (other models, the page cache), bytes.
MEMORY_RESERVE = 1536 * 2**20
#: ISA extensions the wheel (an AVX2 build) cannot use, named in the log where present.
UNUSED_ISA = ("avx512f", "amx_tile")


@dataclass(frozen=True)
class CpuPlan:
    """Chosen settings of one model's GGML engine.

    Attributes:
        streams: native contexts (streams generated at once).
        threads: CPU threads per stream (``ggml.thread_split`` divides them).
        quant: GGUF weight format of the generation (``Q8_0``/``Q4_0``...).
        codec: the codec runtime serving the streams.
        reasons: one line per choice and why, for the debug log (``details``).
        cores: CPUs usable when planned.
        memory: bytes of memory available when planned (None: unknown).
        given: the choices the user set (``--ggml-streams``: "streams", ``--ggml-threads``: "threads").
        memory_bound: fewer streams than the cores allow, for lack of memory.
    """

    streams: int
    threads: int
    quant: str
    codec: str
    reasons: list[str] = field(default_factory=list)
    cores: int = 0
    memory: int | None = None
    given: frozenset[str] = frozenset()
    memory_bound: bool = False

    def describe(self) -> str:
        """The choices in plain words, one short line for the start-up log, e.g. "2 requests at
        once, 2 threads each, 8-bit weights (4 cores, 11.2 GB free)"; options the user set
        are named."""
        at_once = f"{self.streams} request{'s' if self.streams != 1 else ''} at once"
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''} each"
        at_once += " (--ggml-streams)" if "streams" in self.given else " (as memory allows)" if self.memory_bound else ""
        threads += " (--ggml-threads)" if "threads" in self.given else ""
        bits = {"Q8_0": "8-bit", "Q4_0": "4-bit", "F16": "16-bit"}.get(self.quant, self.quant)
        machine = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        if self.memory is not None:
            machine += f", {self.memory / 2**30:.1f} GB free"
        return f"{at_once}, {threads}, {bits} weights ({machine})"

    def details(self) -> str:
        """Each choice and why, in one line (``reasons``), for the debug log."""
        return "; ".join(self.reasons)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (x86 ``flags``/aarch64 ``Features`` of /proc/cpuinfo; empty elsewhere)."""
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` in bytes (None where unknown)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under ``taskset``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads(cores: int) -> int:
    """Threads a stream by default on ``cores`` CPUs: an even count (half generating, half
    decoding) that leaves room for ``ROOM_FOR_STREAMS`` streams, 2 to
    ``MAX_THREADS_PER_STREAM`` (1 on one core). 2-7 cores: 2; 8-11: 4; 12-15: 6; 16 and more: 8."""
    if cores < 2:
        return 1
    return 2 * max(1, min(MAX_THREADS_PER_STREAM // 2, cores // (2 * ROOM_FOR_STREAMS)))


def plan(
    cores: int,
    flags: set[str],
    memory: int | None,
    weights: int,
    quant: str,
    streams: int = 0,
    threads: int = 0,
) -> CpuPlan:
    """Settings for one model from the machine; a non-zero ``streams``/``threads`` overrides.

    Args:
        cores: CPUs usable (``usable_cores``).
        flags: CPU flags (``cpu_flags``), for the log's ISA note.
        memory: bytes available now (``available_memory``; None: unknown, not a limit).
        weights: bytes of the model's two GGUF files (a context copies them).
        quant: the weight format in use (chosen by ``--gguf-quant``).
        streams, threads: the user's ``--ggml-streams``/``--ggml-threads`` (0: choose).

    Returns:
        The plan: its ``describe`` says the choices in plain words, its ``reasons`` each
        choice and whether it was given or chosen.
    """
    reasons = []
    given_streams, given_threads = streams, threads
    memory_bound = False
    if threads:
        reasons.append(f"{threads} threads a stream (--ggml-threads)")
    else:
        threads = default_threads(cores)
        split = f"{threads - threads // 2} generating, {threads // 2} decoding audio" if threads > 1 else "one core"
        reasons.append(f"{threads} thread(s) a stream ({split}; {cores} core(s) leave room for {ROOM_FOR_STREAMS} streams)")
    if streams:
        reasons.append(f"{streams} stream(s) (--ggml-streams)")
    else:
        wanted = max(ROOM_FOR_STREAMS, min(MAX_DEFAULT_STREAMS, cores // threads))
        per_context = weights + CONTEXT_OVERHEAD
        fit = wanted if memory is None else max(1, (memory - MEMORY_RESERVE) // per_context)
        streams = int(min(wanted, fit))
        why = f"{cores} core(s): one per {threads} threads, at least {ROOM_FOR_STREAMS} so a second client is heard at once"
        if streams < wanted:
            memory_bound = True
            why = f"{wanted} wanted ({why}) but {memory / 2**30:.1f} GB free holds {streams} of {per_context / 2**30:.1f} GB"  # type: ignore[operator]
        reasons.append(f"{streams} stream(s) ({why})")
    reasons.append(f"weights {quant}" + (" (8-bit: the default until 4-bit is shown to hold the voices)" if quant == "Q8_0" else ""))
    unused = [flag.upper() for flag in UNUSED_ISA if flag in flags]
    codec = "qwentts.cpp"
    reasons.append(
        "codec: qwentts.cpp's own (the wheel decodes inside generation)"
        + (f"; {'/'.join(unused)} here unused by the AVX2 build" if unused else "")
    )
    given = frozenset(k for k, v in (("streams", given_streams), ("threads", given_threads)) if v)
    return CpuPlan(streams, threads, quant, codec, reasons, cores, memory, given, memory_bound)


#: Threads each side of the pipeline engine takes at most by default (see the module text).
MAX_PIPELINE_THREADS = 4


@dataclass(frozen=True)
class ThreadPlan:
    """The pipeline engine's threads: generation's and the codec's.

    Attributes:
        generation: threads generating codec frames (the frame source's).
        codec: ONNX Runtime's intra-op threads decoding them.
        cores: CPUs usable when planned.
        given: the counts the user set ("generation": ``--generation-threads``, "codec":
            ``--codec-threads``).
    """

    generation: int
    codec: int
    cores: int
    given: frozenset[str] = frozenset()

    def describe(self) -> str:
        """The choice in plain words for the start-up log, e.g. "1 thread generating, 1
        decoding audio (2 cores)"; options the user set are named, and threads beyond the
        cores said to share them."""
        generation = f"{self.generation} thread{'s' if self.generation != 1 else ''} generating"
        generation += " (--generation-threads)" if "generation" in self.given else ""
        codec = f"{self.codec} decoding audio" + (" (--codec-threads)" if "codec" in self.given else "")
        machine = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        if self.generation + self.codec > self.cores:
            machine += ", shared: more threads than cores"
        return f"{generation}, {codec} ({machine})"


def pipeline_threads(cores: int, generation: int = 0, codec: int = 0) -> ThreadPlan:
    """Generation and codec threads of the pipeline engine on ``cores`` CPUs (see the module
    text): the codec half the cores (at least 1), generation the rest (at least 1), each at
    most ``MAX_PIPELINE_THREADS``: 1 + 1 on 1 and 2 cores, 2 + 1 on 3, 2 + 2 on 4, 3 + 3 on
    6, 4 + 4 from 8. A non-zero ``generation``/``codec`` (the user's) is kept as given, the
    other side then taking the cores left (at least 1, at most ``MAX_PIPELINE_THREADS``).

    Raises:
        ValueError: a negative count.
    """
    if generation < 0 or codec < 0 or cores < 1:
        raise ValueError(f"threads must be 0 (chosen) or more on at least one core, got {generation}, {codec}, {cores}")
    given = frozenset(k for k, v in (("generation", generation), ("codec", codec)) if v)
    if not codec:
        codec = max(1, min(MAX_PIPELINE_THREADS, (cores - generation) if generation else cores // 2))
    if not generation:
        generation = max(1, min(MAX_PIPELINE_THREADS, cores - codec))
    return ThreadPlan(generation, codec, cores, given)

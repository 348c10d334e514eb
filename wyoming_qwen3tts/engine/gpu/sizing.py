"""GPU memory arithmetic: how long a slot's cache must be, and how many slots fit.

Pure functions (bytes in, counts out) so they are unit-tested without a GPU; the loader
feeds them what ``torch.cuda`` reports. Units: bytes unless a name says otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...common.audio import FRAMES_PER_SECOND
from ...common.vocabulary import MAX_SEGMENT_SECONDS, MAX_REFERENCE_SECONDS

GB = 1024**3

#: Rows with a captured prefill graph (``batched.prefill.Prefill``'s ``graph_rows``) for a
#: model that takes turns on the card and so captures at every swap: a lone arrival (the
#: usual case on a small card) replays a graph, a joint admission of several runs eagerly.
#: 8 graphs instead of 64: the swap on the H200 with 6 GB free spent 3.2-9.5 s capturing
#: prefill graphs, of 7-15 s. The cost, measured there: 4 clients at once right after a load
#: had 3 rows prefilled eagerly in 111-114 ms (first audio about 120 ms instead of 25).
#: Here, not in ``prefill``, so that start-up reads it without importing the engine.
TURNS_GRAPH_ROWS = 1

#: Most slots ``--max-streams auto`` gives one model: the engine's largest batch bucket.
MAX_AUTO_STREAMS = 32
#: Fewest slots a model is loaded with (one stream always fits, or the model does not).
MIN_STREAMS = 1
#: Text tokens per second of speech, an upper bound over the ten languages (English speaks
#: about 3 BPE tokens a second, Chinese and Japanese about 5 characters, one token each).
TEXT_TOKENS_PER_SECOND = 6.0
#: Fixed prompt positions around the text: role and control tokens, the speaker/instruct
#: slot and the codec BOS/pad run (Qwen3-TTS's chat template, measured on the tiny model: 14).
PROMPT_OVERHEAD = 32
#: Generated frames per second of estimated speech: slow speakers and pauses run past
#: ``text.segmenter.estimated_seconds`` by up to a half (the rest of ``frame_budget``'s 2x is a guard
#: against a model that never stops, which the cache end caps as well as the budget would).
SPEECH_SLACK = 1.5
#: What a model needs beyond its weights and slots: CUDA graphs' private pools, the
#: prefill's activations, the allocator's fragmentation (measured on the H200 with the
#: 1.7B models: 0.6 to 0.9 GB; see ``benchmarks/memory.py``).
WORKSPACE_BYTES = int(1.0 * GB)
#: The workspace of a pool of one stream, taken only where ``WORKSPACE_BYTES`` leaves no room
#: for one and no other model's room is kept: its graphs are few and small (two step graphs,
#: one decode graph, the lone-row prefill graphs of a model taking turns). On the H200 with 4 GB free the 1.7B Base model
#: (int8) served with one stream and 0.98 GB left beside its weights and slot; after a swap
#: the driver showed 0.1 GB less (the CUDA context grows as kernels load), and the full
#: workspace no longer fitted one stream.
LEAN_WORKSPACE_BYTES = int(0.8 * GB)
#: What the CUDA context and the libraries' workspaces take from the driver's free memory
#: once a model has run (kernel modules, cuBLAS workspaces per stream), beyond what the
#: first model's load showed: 0.1 GB on the H200 between the Base model's first load and its
#: return with 4 GB free; ``turns_fit`` keeps half as much again.
CONTEXT_GROWTH_BYTES = int(0.15 * GB)
#: Device memory two or more models that stay on the card together leave free, beyond their plans:
#: each thread that first runs a cuBLAS call later (the clip preparer, a prompt worker)
#: creates a handle outside PyTorch's allocator and a 32 MiB workspace per stream. On the
#: H200 with 8 GB free both 1.7B models (int8) sized their streams to the last MB, then a
#: clip's preparation failed in ``cublasCreate`` and a preset request ran out of memory
#: (15.5 MiB free).
DRIVER_HEADROOM_BYTES = int(0.25 * GB)
#: Device memory the driver must still show free for a clone clip to be prepared ahead of its
#: first request (``BatchedEngine.prime``): what serving needs beyond the plan (a prompt
#: worker's cuBLAS handle and 32 MiB workspace, a new clip's codec encoder run, a few MB of
#: decoder state per clip). On the H200 with 4 GB free the Base model (one stream) prepared 13
#: clips at start (12 preset anchors and a clone) and left none: every request then failed in
#: ``cublasCreate``. A clip not prepared ahead is prepared by its first request.
PRIME_HEADROOM_BYTES = int(0.25 * GB)


def slot_positions(
    reference_seconds: float = MAX_REFERENCE_SECONDS,
    segment_seconds: float = MAX_SEGMENT_SECONDS,
    round_to: int = 128,
) -> int:
    """Talker KV positions one slot needs for the longest segment the service sends.

    The longest prompt is an ICL clone's: reference codes (12.5 a second) and transcript
    tokens, then the segment's text; then the generated frames, with ``SPEECH_SLACK``.

    Args:
        reference_seconds: longest reference clip (``vocabulary.MAX_REFERENCE_SECONDS``).
        segment_seconds: longest segment's estimated speech (``vocabulary.MAX_SEGMENT_SECONDS``).
        round_to: positions are rounded up to a multiple of this.

    Returns:
        positions (1,024 for the shipped limits; faster-qwen3-tts's default is 2,048).
    """
    prompt = (
        reference_seconds * FRAMES_PER_SECOND
        + TEXT_TOKENS_PER_SECOND * (reference_seconds + segment_seconds)
        + PROMPT_OVERHEAD
    )
    frames = SPEECH_SLACK * segment_seconds * FRAMES_PER_SECOND
    return int(math.ceil((prompt + frames) / round_to) * round_to)


@dataclass(frozen=True)
class StreamPlan:
    """How many slots a model gets and why (for the log).

    Attributes:
        streams: slots to allocate (at least ``MIN_STREAMS`` when ``fits``).
        fits: False when not even ``MIN_STREAMS`` slots fit; ``streams`` is then 0.
        reason: one line for the log, with the figures in GB.
    """

    streams: int
    fits: bool
    reason: str


def plan_streams(
    free: int,
    slot_bytes: int,
    workspace: int = WORKSPACE_BYTES,
    reserve: int = 0,
    cap: int = MAX_AUTO_STREAMS,
    asked: int | None = None,
) -> StreamPlan:
    """Slots that fit in ``free`` bytes after the workspace and a reserve for other models;
    where the workspace leaves room for none, no reserve is kept and none was asked, one slot
    with ``LEAN_WORKSPACE_BYTES`` if that fits.

    Args:
        free: device memory this process may still allocate (after this model's weights).
        slot_bytes: one slot's KV, decoder state and buffers (``BatchedEngine.slot_bytes``).
        workspace: ``WORKSPACE_BYTES`` (graphs, prefill activations, fragmentation).
        reserve: bytes kept for a model loaded later (the VoiceDesign model's return).
        cap: most slots (``MAX_AUTO_STREAMS``).
        asked: a fixed ``--max-streams``; the plan then says whether it fits.

    Raises:
        ValueError: ``slot_bytes`` is not positive.
    """
    if slot_bytes <= 0:
        raise ValueError(f"slot_bytes must be positive, got {slot_bytes}")
    room = free - workspace - reserve
    fit = max(0, room // slot_bytes)
    figures = (
        f"{free / GB:.1f} GB free after the weights, {workspace / GB:.1f} GB workspace"
        + (f", {reserve / GB:.1f} GB kept for the VoiceDesign model" if reserve else "")
        + f", {slot_bytes / 1e6:.0f} MB a stream"
    )
    if asked is not None:
        ok = fit >= asked
        return StreamPlan(asked, ok, f"{asked} stream(s) asked (--max-streams); {fit} fit ({figures})")
    if fit < MIN_STREAMS:
        if asked is None and not reserve and workspace > LEAN_WORKSPACE_BYTES and free - LEAN_WORKSPACE_BYTES >= slot_bytes:
            return StreamPlan(MIN_STREAMS, True, f"{MIN_STREAMS} stream with a lean workspace of "
                              f"{LEAN_WORKSPACE_BYTES / GB:.1f} GB ({figures})")
        return StreamPlan(0, False, f"not even {MIN_STREAMS} stream fits ({figures})")
    streams = int(min(fit, cap))
    why = f"at most {cap}" if fit > cap else "what the memory holds"
    return StreamPlan(streams, True, f"{streams} stream(s), {why} ({figures})")


def steady_streams(planned: int, last: int | None) -> int:
    """The streams a model loaded again gets: those of its last load while the plan is
    within one stream below or two above them, else the new plan.

    The driver's free memory moves by a stream's worth between loads of a model taking turns
    (the CUDA context grows as kernels load; the other model's last blocks): on the H200 with
    8 GB free the Base model got 11, 10, 10, 10, 11 streams. One stream below the plan is
    within ``WORKSPACE_BYTES``'s margin (measured need 0.6-0.9 GB of its 1.0 GB), and a real
    shortage still shrinks the plan, as does an out-of-memory at capture (``loader.load_fitting``).
    """
    if last is None or not last - 1 <= planned <= last + 2:
        return planned
    return last


def after_out_of_memory(planned: int, budget: int, fitted: tuple[int, int] | None, slot_bytes: int) -> int:
    """The streams a model loaded again gets, given what fitted after an out-of-memory at an
    earlier load: at most those streams, unless the memory it may use has grown by more than
    a stream since.

    A model taking turns loads at every swap. On the H200 with 6 GB free the plan said 14-16
    streams at every load, the capture ran out of memory, and the retry with 60 % (9 streams)
    fitted: each swap spent 1.3-1.8 s on the load that failed (``loader.load_fitting``).

    Args:
        planned: streams the plan allows now (``plan_streams``).
        budget: bytes the model may use now (``memory_budget``, after its weights).
        fitted: (budget then, streams that fitted) from the last load that shrank after an
            out-of-memory, or None.
        slot_bytes: one stream's bytes.
    """
    if fitted is None or budget > fitted[0] + slot_bytes:
        return planned
    return min(planned, fitted[1])


def memory_budget(total: int, allocated: int, free_on_device: int, cap_gb: float | None) -> int:
    """Bytes this process may still allocate on the device.

    ``torch.cuda.mem_get_info`` reports the whole card, shared with other processes; a
    ``--gpu-memory`` cap (``torch.cuda.set_per_process_memory_fraction``) limits what this
    process's allocator may reserve, so the caller passes what it holds reserved after
    ``torch.cuda.empty_cache()``: its tensors and the private pools of captured CUDA graphs,
    which no other allocation may use (counting those pools as free made the second model
    of a 12 and 16 GB card plan more streams than fit, on the H200).

    Args:
        total: the card's memory.
        allocated: bytes this process's allocator holds (``torch.cuda.memory_reserved`` after
            ``empty_cache``).
        free_on_device: free bytes on the card (``mem_get_info()[0]``, after ``empty_cache``).
        cap_gb: ``--gpu-memory`` in GB (2**30 bytes), or None.

    Returns:
        bytes, never negative.
    """
    free = free_on_device
    if cap_gb is not None:
        free = min(free, int(cap_gb * GB) - allocated)
    return max(0, min(free, total))


def cap_fraction(cap_gb: float, total: int) -> float:
    """The fraction of the card ``--gpu-memory`` means (``set_per_process_memory_fraction``).

    Raises:
        ValueError: a cap that is not positive or exceeds the card.
    """
    if cap_gb <= 0:
        raise ValueError(f"--gpu-memory must be more than 0 GB, got {cap_gb}")
    if cap_gb * GB > total:
        raise ValueError(f"--gpu-memory {cap_gb} GB is more than the card's {total / GB:.1f} GB")
    return cap_gb * GB / total


#: Streams each model must get for two models to count as fitting on the card together.
MIN_SHARED_STREAMS = 2
#: ``--design-model-memory`` choices.
DESIGN_MEMORY = ("auto", "resident", "on-demand")


@dataclass(frozen=True)
class ModelNeed:
    """One model's memory needs, estimated before loading.

    Attributes:
        kind: the model kind's value ("base", "voice_design", "custom_voice").
        weights: bytes of its weights in the dtype they load in.
        slot: bytes of one slot (``loader.checkpoint_slot_bytes``).
    """

    kind: str
    weights: int
    slot: int

    def footprint(self, streams: int) -> int:
        """Weights, workspace and ``streams`` slots, in bytes."""
        return self.weights + WORKSPACE_BYTES + streams * self.slot


@dataclass(frozen=True)
class Residency:
    """Which models stay in GPU memory and what each one's sizing leaves for the others.

    Attributes:
        design: "resident" (loaded at start, kept), "on-demand" (loaded when needed, left
            when idle; room for it is kept), "turns" (the models do not fit together: one
            is on the card at a time, each with the whole memory) or "none" (no VoiceDesign
            model).
        reserves: per model kind, bytes its stream sizing leaves free for models loaded
            after it (load order: as given to ``plan_residency``) and, with two models or
            more, ``DRIVER_HEADROOM_BYTES``.
        reason: one log line, with the figures in GB.
        unservable: per model kind that can never be on this card, even alone (its weights,
            workspace and one stream are more than the budget), why, with the figures; empty
            when every model fits alone, or when none does (start-up then fails loading).
        needs: the models' needs the plan was made from (load order).
    """

    design: str
    reserves: dict[str, int]
    reason: str
    unservable: dict[str, str] = field(default_factory=dict)
    needs: tuple[ModelNeed, ...] = ()


def plan_residency(needs: list[ModelNeed], budget: int, policy: str = "auto", design: str = "voice_design") -> Residency:
    """Decide how the VoiceDesign model uses the card, and the reserves of each model.

    Args:
        needs: the enabled models in load order (the VoiceDesign model last).
        budget: bytes this process may allocate (``memory_budget`` before loading).
        policy: ``--design-model-memory``: "auto" keeps the VoiceDesign model resident when
            every model fits with ``MIN_SHARED_STREAMS`` streams, else the models take turns;
            "resident" always keeps it (the user's choice); "on-demand" loads it when needed
            and drops it when idle (taking turns if they do not fit together).

    Raises:
        ValueError: an unknown policy.
    """
    if policy not in DESIGN_MEMORY:
        raise ValueError(f"unknown --design-model-memory {policy!r}; one of {', '.join(DESIGN_MEMORY)}")
    headroom = DRIVER_HEADROOM_BYTES if len(needs) > 1 else 0  # a model alone keeps none, as before
    together = sum(n.footprint(MIN_SHARED_STREAMS) for n in needs) + headroom
    fits = together <= budget
    figures = f"{together / GB:.1f} GB needed with {MIN_SHARED_STREAMS} streams each, {budget / GB:.1f} GB available"
    has_design = any(n.kind == design for n in needs)
    if not has_design:
        mode, reason = "none", f"no VoiceDesign model ({figures})"
    elif policy == "resident" or (policy == "auto" and fits):
        mode = "resident"
        reason = f"the VoiceDesign model stays in GPU memory ({figures}{'' if fits else '; it may not fit'})"
    elif fits:
        mode, reason = "on-demand", f"the VoiceDesign model is loaded when needed and leaves when idle ({figures})"
    else:
        mode = "turns"
        reason = (
            f"the models do not fit on the GPU together ({figures}): one at a time, the VoiceDesign model "
            "only while it renders anchors or designs; --clone-model Qwen/Qwen3-TTS-12Hz-0.6B-Base lets them share it"
        )
    if mode == "turns":
        return Residency(mode, {n.kind: 0 for n in needs}, reason, unservable(needs, budget), tuple(needs))
    room = max(0, budget - sum(n.weights + WORKSPACE_BYTES for n in needs) - headroom)
    share = room // max(1, len(needs))
    reserves = {  # the last model loaded keeps the headroom too
        n.kind: sum(later.weights + WORKSPACE_BYTES + share for later in needs[i + 1 :]) + headroom
        for i, n in enumerate(needs)
    }
    return Residency(mode, reserves, reason, needs=tuple(needs))


def unservable(needs: list[ModelNeed], budget: int) -> dict[str, str]:
    """The models that cannot be on the card even alone: weights, ``WORKSPACE_BYTES`` and
    ``MIN_STREAMS`` streams above ``budget`` (the memory each would have with the others
    gone). Empty when none or all of them are (with none fitting, start-up fails loading).

    Returns:
        per model kind, one line: why, with the figures in GB.
    """
    out = {
        n.kind: (
            f"the {n.kind} model does not fit in this GPU's {budget / GB:.1f} GB even alone: it needs "
            f"{n.footprint(MIN_STREAMS) / GB:.1f} GB ({n.weights / GB:.1f} GB weights, {WORKSPACE_BYTES / GB:.1f} GB "
            f"workspace, {n.slot / 1e6:.0f} MB for {MIN_STREAMS} stream)"
        )
        for n in needs
        if n.footprint(MIN_STREAMS) > budget
    }
    return out if len(out) < len(needs) else {}


def turns_fit(home_free: int, home_weights: int, other: ModelNeed) -> str | None:
    """Whether a model taking turns with the home model (the Base model) can come in once the
    home model leaves, judged from what the home model's own load left: None if it can, else
    why (one line, figures in GB).

    The start-up plan (``unservable``) estimates from the driver's free memory before anything
    loaded; the home model's load then shows what it really had beside its weights. The other
    model gets that, less the difference of their weights and ``CONTEXT_GROWTH_BYTES``, and
    needs ``WORKSPACE_BYTES`` and one stream. On the H200 with 4 GB free the plan let the
    VoiceDesign model come in; it found no room for one stream and every request failed while
    the two models swapped in and out.

    Args:
        home_free: bytes the home model could use beside its weights at its load
            (``loader.free_after_weights``).
        home_weights: the home model's weights, bytes (as planned); ``other``: the model
            that would come in.
    """
    free = home_free - max(0, other.weights - home_weights) - CONTEXT_GROWTH_BYTES
    need = WORKSPACE_BYTES + MIN_STREAMS * other.slot
    if free >= need:
        return None
    return (
        f"the {other.kind} model does not fit when the other model leaves: about {max(0, free) / GB:.1f} GB "
        f"beside its weights, and it needs {need / GB:.1f} GB ({WORKSPACE_BYTES / GB:.1f} GB workspace, "
        f"{other.slot / 1e6:.0f} MB for {MIN_STREAMS} stream)"
    )

"""The engines' back ends in words: each engine named once, what its models share, then
what is one model's own (Wyoming's ``info``, which Home Assistant shows; ``/ready``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..common.vocabulary import ModelKind

#: A count of streams or threads, "2 stream(s)", "1 threads": said as "2 streams", "1 thread".
_COUNTED = re.compile(r"\b(\d+) (stream|thread)(?:\(s\)|s)")


def _split_outside_parentheses(text: str) -> list[str]:
    """``text`` split at each ", " outside parentheses."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(", ", i):
            pieces.append(text[start:i])
            start = i + 2
    return [*pieces, text[start:]]


def _backend_parts(backend: str) -> tuple[str, list[str]]:
    """An engine's ``backend`` as its name and its parts: those in parentheses after the
    name, then those after a comma ("qwentts.cpp GGML on the CPU (Q8_0, 2 stream(s) x 2
    threads, clones in context (ICL))", "batched engine (eager, cpu)", "batched CUDA-graph
    engine, on demand")."""
    head, *tail = _split_outside_parentheses(backend)
    name, paren, inner = head.partition(" (")
    if not paren or not inner.endswith(")"):
        return head, tail
    return name, [*_split_outside_parentheses(inner[:-1]), *tail]


def describe_backends(backends: Mapping[ModelKind, str]) -> str:
    """The models' engines (each model's ``Engine.backend``) in words, for Wyoming's ``info``
    (Home Assistant shows it): each engine named once, with the parts all its models share
    in parentheses, then what is a model's own, named by the model. For example a Base and a
    CustomVoice model on the GGML engine: "qwentts.cpp GGML on the CPU (Q8_0, 2 streams x 2
    threads): base model clones by x-vector". Engines of other names follow after " + "."""
    groups: dict[str, dict[ModelKind, list[str]]] = {}
    for kind, backend in backends.items():
        name, parts = _backend_parts(_COUNTED.sub(lambda m: f"{m[1]} {m[2]}{'' if m[1] == '1' else 's'}", backend))
        groups.setdefault(name, {})[kind] = parts
    said = []
    for name, models in sorted(groups.items()):
        first = next(iter(models.values()))
        common = [part for part in first if all(part in parts for parts in models.values())]
        text = f"{name} ({', '.join(common)})" if common else name
        own = [
            f"{kind.value} model {', '.join(extra)}"
            for kind in ModelKind
            if kind in models and (extra := [part for part in models[kind] if part not in common])
        ]
        said.append(f"{text}: {'; '.join(own)}" if own else text)
    return " + ".join(said)

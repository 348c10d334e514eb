"""Where the milliseconds of a lone request go: the server's per-request timeline, p50 and p99.

``python -m benchmarks.lone_breakdown SERVER_LOG --door wyoming --out DIR`` reads the lines a
server writes as each request ends (``service.SpeechStream``'s INFO line)::

    ... wyoming request ok: voice ryan, 43 chars, 1 sentence(s), first audio 23 ms (queued 0.1,
    taken 0.2, prompt 1.4, admitted 1.5, prefill 3.1, first frame 9.8, decoded 12.0,
    delivered 12.2, written 12.4), 6.00 s of audio

Each point is milliseconds after the door had the request (``timeline.Timeline`` says which code
point each one is). For the ``ok`` requests of one door whose line was written in the window
(``--since`` / ``--until``, the log's own clock; ``--last N`` keeps the last N of them), it gives
p50 and p99 of each point (ms after arrival) and of each phase (ms since the point before it),
and of the server's own first audio (arrival to first chunk). With ``--client`` (a
``benchmarks/poisson.py`` ``poisson.json`` of the same run) it adds first audio at the client,
from its row of that door.

``benchmarks/gpu.sh breakdown`` runs it after 200 requests at 1 req/s. Writes
``lone_breakdown.json`` (``{"door", "n", "points": {name: {"at_p50_ms", "at_p99_ms", "phase_p50_ms",
"phase_p99_ms"}}, "server_first_audio": {...}, "client_first_audio": {...}}``) and
``lone_breakdown.md`` (the table), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from wyoming_qwen3tts.common.timeline import POINTS

from .poisson import percentile

#: A request's line: the log's time, door, outcome, first audio (ms) and the timeline's points.
LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\S* \S+ \S+: (?P<door>\S+) request (?P<outcome>\w+): "
    r".*?first audio (?P<first>\d+) ms \((?P<points>[^)]*)\)"
)
#: One point of a line's timeline: "first frame 9.8".
POINT = re.compile(r"([a-z][a-z ]*?) (-?\d+(?:\.\d+)?)$")


@dataclass
class Request:
    """One request's line.

    Attributes:
        time: when the line was written (the log's clock).
        door: "wyoming", "http" or "websocket".
        first_audio_ms: the server's first audio: stream opened to its first chunk, ms.
        points: each point reached, ms after the door had the request, in log order.
    """

    time: datetime
    door: str
    first_audio_ms: float
    points: dict[str, float]


def parse(lines: list[str], door: str, since: datetime | None = None, until: datetime | None = None) -> list[Request]:
    """The ``ok`` requests of ``door`` (any door when "") whose line time is in
    [``since``, ``until``], in log order. Lines of other kinds are skipped."""
    out: list[Request] = []
    for line in lines:
        match = LINE.match(line)
        if match is None or match["outcome"] != "ok" or (door and match["door"] != door):
            continue
        when = datetime.strptime(match["time"], "%Y-%m-%d %H:%M:%S")
        if (since is not None and when < since) or (until is not None and when > until):
            continue
        points: dict[str, float] = {}
        for part in match["points"].split(", "):
            found = POINT.match(part.strip())
            if found is not None:
                points[found[1]] = float(found[2])
        out.append(Request(when, match["door"], float(match["first"]), points))
    return out


def _stats(values: list[float]) -> dict[str, float | None]:
    def rounded(q: float) -> float | None:
        value = percentile(values, q)
        return None if value is None else round(value, 2)

    return {"p50_ms": rounded(50), "p99_ms": rounded(99), "n": len(values)}


def summarize(requests: list[Request], client: dict[str, Any] | None = None) -> dict[str, Any]:
    """p50 and p99 of each point (ms after arrival: ``at_*``) and each phase (ms since the
    point reached before it in the same request: ``phase_*``; the first point's phase is
    from arrival), of the server's first audio, and (``client``: a ``poisson.json`` row)
    first audio at the client. Points in ``timeline.POINTS`` order; points no request
    reached are left out."""
    points: dict[str, Any] = {}
    for name in POINTS.values():
        at: list[float] = []
        phase: list[float] = []
        for request in requests:
            if name not in request.points:
                continue
            at.append(request.points[name])
            reached = [p for p in POINTS.values() if p in request.points]
            i = reached.index(name)
            phase.append(request.points[name] - (request.points[reached[i - 1]] if i else 0.0))
        if at:
            a, p = _stats(at), _stats(phase)
            points[name] = {"n": a["n"], "at_p50_ms": a["p50_ms"], "at_p99_ms": a["p99_ms"],
                            "phase_p50_ms": p["p50_ms"], "phase_p99_ms": p["p99_ms"]}
    out: dict[str, Any] = {
        "n": len(requests),
        "points": points,
        "server_first_audio": _stats([r.first_audio_ms for r in requests]),
    }
    if client is not None:
        out["client_first_audio"] = {"p50_ms": client.get("ttfa_p50_ms"), "p99_ms": client.get("ttfa_p99_ms"),
                                     "n": client.get("n")}
    return out


def table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table (ms)."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"{summary['n']} requests{' (door ' + summary['door'] + ')' if summary.get('door') else ''}. "
        "Points: ms after the door had the request; phase: ms since the point before.",
        "",
        "| point | at p50 | at p99 | phase p50 | phase p99 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, s in summary["points"].items():
        lines.append(f"| {name} | {cell(s['at_p50_ms'])} | {cell(s['at_p99_ms'])} | "
                     f"{cell(s['phase_p50_ms'])} | {cell(s['phase_p99_ms'])} |")
    for key, label in (("server_first_audio", "first audio, server (arrival to first chunk)"),
                       ("client_first_audio", "first audio, client (sent to first audio)")):
        if key in summary:
            s = summary[key]
            lines.append(f"| {label} | {cell(s['p50_ms'])} | {cell(s['p99_ms'])} | | |")
    return "\n".join(lines) + "\n"


def _client_row(path: Path, door: str) -> dict[str, Any] | None:
    rows = json.loads(path.read_text())["rows"]
    return next((row for row in rows if not door or row["door"] == door), None)


def _when(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def main(argv: list[str] | None = None) -> int:
    """Parse, summarize, write ``lone_breakdown.json`` / ``.md`` under ``--out``; 1 if no request matched."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the server's log")
    parser.add_argument("--door", default="wyoming", help='wyoming, http, websocket; "" for any')
    parser.add_argument("--since", type=_when, help='"YYYY-MM-DD HH:MM:SS", the log\'s clock')
    parser.add_argument("--until", type=_when, help='"YYYY-MM-DD HH:MM:SS", the log\'s clock')
    parser.add_argument("--last", type=int, default=0, help="keep the last N requests in the window (0: all)")
    parser.add_argument("--client", type=Path, help="poisson.json of the same run: first audio at the client")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    requests = parse(args.log.read_text(errors="replace").splitlines(), args.door, args.since, args.until)
    if args.last:
        requests = requests[-args.last:]
    client = _client_row(args.client, args.door) if args.client is not None else None
    summary = {"door": args.door, **summarize(requests, client)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lone_breakdown.json").write_text(json.dumps(summary, indent=2))
    text = table(summary)
    (args.out / "lone_breakdown.md").write_text(text)
    print(text, end="")
    return 0 if requests else 1


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Draws docs/bench/scale/*.svg from the `ccm bench scale --json` results beside this script
(`free-N.json`, `calibrated-N.json`): each figure against cluster size, one line per cost
model, log-scaled sizes. Standard library only."""
import json
import math
import pathlib

HERE = pathlib.Path(__file__).parent
FIGURES = [
    ("cpu-per-1000-nodes", "CCM CPU per 1,000 Nodes (s)", lambda s: s["cpu_seconds_per_1000_nodes"]),
    ("peak-rss", "CCM peak RSS (MB)", lambda s: s["usage"]["peak_rss_mb"]),
    ("initialized-p99", "time to initialized p99 (s)", lambda s: s["time_to_initialized"]["p99"]),
    ("patches-per-node", "CCM PATCH requests per Node", lambda s: s["api_requests_per_node"]["patch"]),
    ("ingress-p99", "LB Service time to ingress p99 (s)", lambda s: s["time_to_ingress"]["p99"]),
    ("join-routed", "one join: time to routed (s)", lambda s: s["join"]["routed_seconds"]),
    ("join-cpu", "one join: CCM CPU (s)", lambda s: s["join"]["cpu_seconds"]),
]
MODELS = [("free", "#1f77b4"), ("calibrated", "#d62728")]
W, H, L, R, T, B = 520, 300, 70, 20, 40, 50


def points(model):
    out = []
    for f in HERE.glob(f"{model}-*.json"):
        s = json.loads(f.read_text())["scenarios"][0]
        out.append((s["nodes"], s))
    return sorted(out, key=lambda p: p[0])


def svg(title, series):
    """`series`: (model, colour, [(nodes, value)]) with at least one point in all."""
    every = [p for _, _, pts in series for p in pts]
    xs = [math.log10(n) for n, _ in every]
    x0, x1 = min(xs), max(xs)
    y1 = max(v for _, v in every) * 1.1 or 1
    px = lambda n: L + (math.log10(n) - x0) / ((x1 - x0) or 1) * (W - L - R)
    py = lambda y: H - B - y / y1 * (H - T - B)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
             f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
             f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
             f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
    for n in sorted({n for n, _ in every}):
        parts.append(f'<text x="{px(n):.1f}" y="{H-B+16}" text-anchor="middle">{n:,}</text>')
    for i, (model, colour, pts) in enumerate(series):
        path = " ".join(f"{'M' if j == 0 else 'L'}{px(n):.1f},{py(v):.1f}" for j, (n, v) in enumerate(pts))
        parts.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for n, v in pts:
            parts.append(f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3" fill="{colour}"/>')
            parts.append(f'<text x="{px(n)+4:.1f}" y="{py(v)-6:.1f}" fill="{colour}">{v:.3g}</text>')
        parts.append(f'<text x="{W-R}" y="{T+14*i}" text-anchor="end" fill="{colour}">{model}</text>')
    parts.append(f'<text x="{W/2}" y="{H-8}" text-anchor="middle">Nodes (log scale)</text>')
    parts.append(f'<text x="{L-8}" y="{py(0):.1f}" text-anchor="end">0</text></svg>')
    return "\n".join(parts) + "\n"


def main():
    runs = [(model, colour, points(model)) for model, colour in MODELS]
    for name, title, get in FIGURES:
        series = [(m, c, [(n, get(s)) for n, s in pts if s.get("join") or "join" not in name])
                  for m, c, pts in runs]
        series = [s for s in series if s[2]]
        if series:
            (HERE / f"{name}.svg").write_text(svg(title, series))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Draws docs/bench/scale/*.svg from the `ccm bench scale --json` results beside this script:
each figure against cluster size, log-scaled sizes. Standard library only."""
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
]
W, H, L, R, T, B = 520, 300, 70, 20, 40, 50


def points():
    out = []
    for f in sorted(HERE.glob("free-*.json")):
        s = json.loads(f.read_text())["scenarios"][0]
        out.append((s["nodes"], s))
    return sorted(out, key=lambda p: p[0])


def svg(title, pts):
    xs = [math.log10(n) for n, _ in pts]
    ys = [v for _, v in pts]
    x0, x1 = min(xs), max(xs)
    y1 = max(ys) * 1.1 or 1
    px = lambda x: L + (x - x0) / ((x1 - x0) or 1) * (W - L - R)
    py = lambda y: H - B - y / y1 * (H - T - B)
    path = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(zip(xs, ys)))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
             f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
             f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
             f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
             f'<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/>']
    for (n, _), x, y in zip(pts, xs, ys):
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="#1f77b4"/>')
        parts.append(f'<text x="{px(x):.1f}" y="{H-B+16}" text-anchor="middle">{n:,}</text>')
        parts.append(f'<text x="{px(x)+4:.1f}" y="{py(y)-6:.1f}">{y:.3g}</text>')
    parts.append(f'<text x="{W/2}" y="{H-8}" text-anchor="middle">Nodes (log scale)</text>')
    parts.append(f'<text x="{L-8}" y="{py(0):.1f}" text-anchor="end">0</text></svg>')
    return "\n".join(parts) + "\n"


def main():
    pts = points()
    for name, title, get in FIGURES:
        (HERE / f"{name}.svg").write_text(svg(title, [(n, get(s)) for n, s in pts]))


if __name__ == "__main__":
    main()

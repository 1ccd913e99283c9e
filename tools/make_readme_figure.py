"""Draw the front page's picture, `nbs/images/overview.svg`, from the library itself (a static SVG, so that it shows
on GitHub and PyPI where plotly cannot run): a GeLU-initialised spline and the exact interpolator's token collapse.

    python tools/make_readme_figure.py
"""
from pathlib import Path

import numpy as np
import torch

from spline_transformers.splines import LinearSpline
from spline_transformers.interpolation import build_interpolator

OUT = Path(__file__).resolve().parents[1] / "nbs" / "images" / "overview.svg"
COLORS = ["#1f77b4", "#d62728", "#2ca02c"]
W, H, PAD = 380, 300, 36


def _scaler(lo, hi, a, b):
    return lambda v: a + (np.asarray(v) - lo) / (hi - lo) * (b - a)


def _panel(x0, title, xs, ys, items):
    "An SVG group: a framed panel with `items` (callables drawing with the panel's scales)."
    sx, sy = _scaler(xs[0], xs[1], x0 + PAD, x0 + W - 10), _scaler(ys[0], ys[1], H - PAD, 40)
    out = [f'<rect x="{x0 + PAD}" y="40" width="{W - PAD - 10}" height="{H - PAD - 40}" fill="none" stroke="#bbb"/>',
           f'<text x="{x0 + W / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{title}</text>']
    for draw in items: out += draw(sx, sy)
    return out


def spline_panel(x0):
    s = LinearSpline(n_knots=12, x_min=-4.0, x_max=4.0, init="gelu")
    x = torch.linspace(-4, 4, 200)
    gelu = torch.nn.functional.gelu(x).numpy()
    with torch.no_grad(): s.values[7] += 0.9; s.values[3] -= 0.5   # a knot moved by hand, as in the widgets chapter
    k, v = s.knots.numpy(), s.values.detach().numpy()
    def line(sx, sy):
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(sx(x.numpy()), sy(gelu)))
        return [f'<polyline points="{pts}" fill="none" stroke="#888" stroke-dasharray="5,4" stroke-width="2"/>',
                f'<text x="{sx(-3.8):.0f}" y="{sy(3.6):.0f}" font-size="12" fill="#888">GeLU (dashed)</text>']
    def spline(sx, sy):
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(sx(k), sy(v)))
        dots = [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="4" fill="{COLORS[0]}"/>' for a, b in zip(sx(k), sy(v))]
        return [f'<polyline points="{pts}" fill="none" stroke="{COLORS[0]}" stroke-width="2.5"/>', *dots,
                f'<text x="{sx(-3.8):.0f}" y="{sy(3.1):.0f}" font-size="12" fill="{COLORS[0]}">learnable spline: 12 knot values</text>']
    return _panel(x0, "A nonlinearity you can train", (-4, 4), (-1, 4), [line, spline])


def collapse_panel(x0):
    rng = np.random.default_rng(3)
    X = [rng.uniform(-1, 1, (6, 2)) for _ in range(3)]
    Y = [rng.uniform(-1, 1, (m, 2)) for m in (1, 2, 3)]
    T = build_interpolator(X, Y, attention="hardmax")
    outs = [T(x).numpy() for x in X]
    def draw(sx, sy):
        g = []
        for j, (x, y, o) in enumerate(zip(X, Y, outs)):
            c = COLORS[j]
            for a, b in zip(x, o):
                g.append(f'<line x1="{sx(a[0]):.1f}" y1="{sy(a[1]):.1f}" x2="{sx(b[0]):.1f}" y2="{sy(b[1]):.1f}" stroke="{c}" stroke-opacity="0.35"/>')
            g += [f'<circle cx="{sx(a[0]):.1f}" cy="{sy(a[1]):.1f}" r="4" fill="white" stroke="{c}" stroke-width="2"/>' for a in x]
            g += [f'<path d="M{sx(a[0]) - 6:.1f},{sy(a[1]):.1f} l6,-6 l6,6 l-6,6 z" fill="{c}"/>' for a in y]
        g.append(f'<text x="{sx(-1.25):.0f}" y="{sy(1.2):.0f}" font-size="12" fill="#555">○ input tokens → ◆ targets, '
                 f'{T.n_blocks} blocks, exact</text>')
        return g
    return _panel(x0, "Tokens collapse exactly onto targets", (-1.3, 1.3), (-1.3, 1.3), [draw])


def main():
    body = spline_panel(0) + collapse_panel(W + 20)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W + 20}" height="{H}" viewBox="0 0 {2 * W + 20} {H}" '
           f'font-family="Helvetica, Arial, sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")
    OUT.parent.mkdir(parents=True, exist_ok=True); OUT.write_text(svg)
    print(f"wrote {OUT} ({len(svg):,} bytes)")


if __name__ == "__main__": main()

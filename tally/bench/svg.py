"""Plain inline-SVG charts for the HTML report: lines, step CDFs, points, background bars and
vertical markers on linear axes. No JavaScript, nothing fetched when the page opens."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

import numpy as np

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
_W, _H = 680, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 56, 30, 44
MAX_POINTS = 1500  # per series; more are thinned evenly (the page stays small)


@dataclass
class Series:
    name: str
    xs: list[float] | np.ndarray
    ys: list[float] | np.ndarray
    kind: str = "line"  # line | step | points
    color: str | None = None


@dataclass
class Chart:
    key: str  # data-plot attribute: how tests and readers find the chart
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    bars: Series | None = None  # background bars on their own right-hand scale
    markers: list[tuple[float, str]] = field(default_factory=list)  # vertical lines (x, label)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= step * m)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def _thin(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(xs) <= MAX_POINTS:
        return xs, ys
    keep = np.linspace(0, len(xs) - 1, MAX_POINTS).round().astype(int)
    return xs[keep], ys[keep]


def _range(values: list[np.ndarray], floor_zero: bool) -> tuple[float, float]:
    data = np.concatenate([v for v in values if len(v)]) if any(len(v) for v in values) else np.zeros(1)
    lo, hi = (0.0 if floor_zero else float(data.min())), float(data.max())
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def render(chart: Chart) -> str:
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    data = [(np.asarray(s.xs, dtype=float), np.asarray(s.ys, dtype=float)) for s in chart.series]
    xs_all = [x for x, _ in data] + ([np.asarray(chart.bars.xs, float)] if chart.bars else [])
    x_lo, x_hi = _range(xs_all, floor_zero=False)
    y_lo, y_hi = _range([y for _, y in data], floor_zero=True)

    def px(x: float) -> float:
        return _LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float, lo: float = y_lo, hi: float = y_hi) -> float:
        return _TOP + plot_h - (y - lo) / (hi - lo) * plot_h

    out = [f'<svg class="plot" data-plot="{escape(chart.key)}" xmlns="http://www.w3.org/2000/svg" '
           f'width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" font-family="sans-serif" '
           f'font-size="11">', f'<text x="{_LEFT}" y="16" font-size="13" font-weight="bold">'
           f'{escape(chart.title)}</text>']
    if chart.bars is not None and len(chart.bars.ys):
        bx, by = np.asarray(chart.bars.xs, float), np.asarray(chart.bars.ys, float)
        b_hi = max(float(by.max()), 1e-9)
        width = plot_w / max(len(bx), 1)
        for x, y in zip(bx, by):
            top = py(y, 0.0, b_hi)
            out.append(f'<rect x="{px(x):.1f}" y="{top:.1f}" width="{max(width - 1, 1):.1f}" '
                       f'height="{_TOP + plot_h - top:.1f}" fill="#ddd"/>')
        out.append(f'<text x="{_W - _RIGHT + 4}" y="{_TOP + 8}" fill="#888">{_fmt(b_hi)}</text>'
                   f'<text x="{_W - _RIGHT + 4}" y="{_TOP + 20}" fill="#888">'
                   f'{escape(chart.bars.name)}</text>')
    for tick in nice_ticks(x_lo, x_hi):
        out.append(f'<line x1="{px(tick):.1f}" y1="{_TOP + plot_h}" x2="{px(tick):.1f}" '
                   f'y2="{_TOP + plot_h + 4}" stroke="#444"/><text x="{px(tick):.1f}" '
                   f'y="{_TOP + plot_h + 16}" text-anchor="middle">{_fmt(tick)}</text>')
    for tick in nice_ticks(y_lo, y_hi):
        out.append(f'<line x1="{_LEFT}" y1="{py(tick):.1f}" x2="{_LEFT + plot_w}" y2="{py(tick):.1f}" '
                   f'stroke="#eee"/><text x="{_LEFT - 6}" y="{py(tick) + 4:.1f}" '
                   f'text-anchor="end">{_fmt(tick)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="#444"/>')
    for x, label in chart.markers:
        if x_lo <= x <= x_hi:
            out.append(f'<line x1="{px(x):.1f}" y1="{_TOP}" x2="{px(x):.1f}" y2="{_TOP + plot_h}" '
                       f'stroke="#999" stroke-dasharray="4 3"/><text x="{px(x) + 3:.1f}" '
                       f'y="{_TOP + 10}" fill="#666">{escape(label)}</text>')
    for i, (series, (xs, ys)) in enumerate(zip(chart.series, data)):
        color = series.color or PALETTE[i % len(PALETTE)]
        xs, ys = _thin(xs, ys)
        if series.kind == "points":
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="1.8" fill="{color}" '
                    f'fill-opacity="0.6"/>' for x, y in zip(xs, ys)]
        elif len(xs):
            if series.kind == "step":  # a CDF: horizontal then vertical
                xs, ys = np.repeat(xs, 2)[1:], np.repeat(ys, 2)[:-1]
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out.append(f'<text x="{_LEFT + 8 + 110 * i}" y="{_TOP + plot_h + 34}" fill="{color}">'
                   f'■ {escape(series.name)}</text>')
    out.append(f'<text x="{_LEFT + plot_w}" y="{_TOP + plot_h + 34}" text-anchor="end">'
               f'{escape(chart.x_label)}</text>')
    out.append(f'<text x="12" y="{_TOP + plot_h / 2}" transform="rotate(-90 12 {_TOP + plot_h / 2})" '
               f'text-anchor="middle">{escape(chart.y_label)}</text></svg>')
    return "\n".join(out)

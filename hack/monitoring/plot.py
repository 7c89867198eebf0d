#!/usr/bin/env python3
"""Draws a Grafana dashboard the other way round: each panel's own queries, read from the
committed dashboard JSON, evaluated by a Prometheus `query_range` and plotted with matplotlib
where the dashboard puts the panel (rows, gridPos, title, unit, legendFormat; a stat panel
shows its last value). Prints how many series each panel drew and exits 1 when a panel
drew none. Run by pictures.sh:

  plot.py --prometheus http://127.0.0.1:39090 --start UNIX --end UNIX \
          --out docs/dashboards [--note TEXT] [--event UNIX]... config/grafana/dashboards/*.json
"""
import argparse
import json
import math
import os
import re
import sys
import textwrap
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

UNIT_IN = 0.36  # inches per gridPos unit of height; the width is 24 units across the page
PAGE_IN = 17.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLORS = plt.get_cmap("tab10").colors


def all_values(dashboard, prom):
    """Each variable as the dashboard's 'All' has it: its `allValue` (`.+`) where it has one,
    else the values its query finds, as Grafana joins them (`(a|b)`)."""
    values = {}
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        if "allValue" in v:
            values[v["name"]] = v["allValue"]
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"])
        qs = urllib.parse.urlencode({"match[]": m.group(1)})
        with urllib.request.urlopen(f"{prom}/api/v1/label/{m.group(2)}/values?{qs}", timeout=60) as r:
            found = json.load(r)["data"]
        # Regex metacharacters escaped, the backslash doubled for PromQL's string literal.
        values[v["name"]] = "(" + "|".join(re.sub(r"([.*+?^${}()|\[\]\\])", r"\\\\\1", x) for x in found) + ")"
    return values


def substitute(expr, values):
    """The query with the variables' 'All' values, `$__rate_interval` one minute (four 5 s
    scrapes and more)."""
    def var(m):
        name = m.group(1) or m.group(2)
        return "1m" if name == "__rate_interval" else values.get(name, ".+")
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, expr)


def query_range(prom, expr, start, end, step):
    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{qs}", timeout=60) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, labels):
    if not fmt or fmt == "__auto":
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def scaled(unit, top):
    """(divisor, suffix) for values up to `top` in Grafana's unit `unit`."""
    top = abs(top) if top and math.isfinite(top) else 0
    if unit == "percentunit":
        return 0.01, "%"
    if unit in ("bytes", "Bps"):
        per = "/s" if unit == "Bps" else ""
        for div, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if top >= div:
                return div, f" {name}{per}"
        return 1, f" B{per}"
    if unit == "s":
        for div, name in ((3600, " h"), (60, " min"), (1, " s"), (1e-3, " ms")):
            if top >= div:
                return div, name
        return 1e-6, " µs"
    per = " ops/s" if unit == "ops" else ""
    for div, name in ((1e9, " B"), (1e6, " M"), (1e3, " k")):
        if top >= div:
            return div, name + per
    return 1, per


def fmt_value(unit, v):
    if v is None or not math.isfinite(v):
        return "–"
    if v == 0:
        return "0"
    div, suffix = scaled(unit, v)
    return f"{v / div:.3g}{suffix}"


class ScaledLocator(MaxNLocator):
    """Round ticks in the unit the largest value is shown in (MiB, min, k), as Grafana."""
    def __init__(self, div):
        super().__init__(5, steps=[1, 2, 2.5, 5, 10])
        self.div = div

    def tick_values(self, vmin, vmax):
        return super().tick_values(vmin / self.div, vmax / self.div) * self.div


def with_gaps(pts, step):
    """Times and values, with a NaN where the series was absent, so no line bridges it."""
    t, v = [], []
    for i, (x, y) in enumerate(pts):
        if i and x - pts[i - 1][0] > 1.5 * step:
            t.append(datetime.fromtimestamp(x - step, timezone.utc))
            v.append(float("nan"))
        t.append(datetime.fromtimestamp(x, timezone.utc))
        v.append(y)
    return t, v


def fetch_panel(panel, prom, start, end, step, values):
    series = []
    for target in panel.get("targets", []):
        for s in query_range(prom, substitute(target["expr"], values), start, end, step):
            pts = [(float(t), float(v)) for t, v in s["values"]]
            name = legend(target.get("legendFormat"), s["metric"])
            series.append((name, pts))
    return [s for s in series if any(math.isfinite(v) for _, v in s[1])]


def legend_entries(series):
    """What the legend lists: every series, but past 6 the ones that stay 0 are one entry."""
    if len(series) <= 6:
        return [name for name, _ in series], 0
    zero = [n for n, pts in series if all(v == 0 for _, v in pts if math.isfinite(v))]
    return [n for n, _ in series if n not in zero], len(zero)


def draw_timeseries(ax, panel, series, step, events):
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    top = max((abs(v) for _, pts in series for _, v in pts if math.isfinite(v)), default=0)
    names, zero = legend_entries(series)
    handles, labels = [], []
    for i, (name, pts) in enumerate(series):
        t, v = with_gaps(pts, step)
        line, = ax.plot(t, v, lw=1.3, color=COLORS[i % len(COLORS)])
        lone = [j for j in range(len(v)) if all(k < 0 or k >= len(v) or math.isnan(v[k]) for k in (j - 1, j + 1))]
        ax.plot([t[j] for j in lone], [v[j] for j in lone], "o", ms=3, color=line.get_color())  # as Grafana shows a lone point
        if name in names:
            handles.append(line)
            labels.append(name)
    if zero:
        handles.append(plt.Line2D([], [], color="grey", lw=1))
        labels.append(f"{zero} more, all 0")
    for t in events:  # what the run did, as Grafana draws annotations
        ax.axvline(datetime.fromtimestamp(t, timezone.utc), color="grey", ls="--", lw=0.8)
    ax.yaxis.set_major_locator(ScaledLocator(scaled(unit, top)[0]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: fmt_value(unit, y)))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=timezone.utc))
    ax.xaxis.set_major_locator(mdates.MinuteLocator(byminute=range(0, 60, 2)))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if top == 0:
        ax.set_ylim(-0.05, 1)
    else:
        ax.set_ylim(bottom=min(0, ax.get_ylim()[0]))
    if any(labels):
        return ax.legend(handles, labels, loc="upper center", ncol=legend_columns(labels), fontsize=6.5,
                         frameon=False, handlelength=1.2, columnspacing=1.0, labelspacing=0.2)


def legend_columns(labels):
    return 2 if max(map(len, labels)) > 28 else 3


def draw_stat(ax, panel, series, step):
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    ax.set_axis_off()
    n = len(series)
    for i, (name, pts) in enumerate(series):
        finite = [(t, v) for t, v in pts if math.isfinite(v)]
        last = finite[-1][1] if finite else float("nan")
        cx = (i + 0.5) / n
        # Grafana's default stat: the last value over a faint sparkline of the range.
        spark = ax.inset_axes([i / n + 0.02, 0.0, 1 / n - 0.04, 0.45])
        t, v = with_gaps(pts, step)
        spark.fill_between(t, v, color="tab:green", alpha=0.25, lw=0)
        spark.plot(t, v, color="tab:green", lw=1)
        spark.set_axis_off()
        ax.text(cx, 0.62, fmt_value(unit, last), ha="center", va="center",
                fontsize=30 if n == 1 else 22, color="tab:green", weight="bold", transform=ax.transAxes)
        if name:
            ax.text(cx, 0.93, name, ha="center", va="center", fontsize=8, transform=ax.transAxes)


def draw(dashboard, path, prom, start, end, step, out, note, events):
    when = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    height_units = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    sub = [f"{os.path.relpath(path, ROOT)}: each panel's queries evaluated by Prometheus, {when(start)} – {when(end)} UTC, "
           f"step {step} s, every variable 'All' (as Grafana has it), $__rate_interval = 1m"] + textwrap.wrap(note, 240)
    head_in = 0.55 + 0.15 * len(sub)
    fig_h = height_units * UNIT_IN + head_in
    fig = plt.figure(figsize=(PAGE_IN, fig_h))
    fx = lambda u: u / 24  # noqa: E731
    fy = lambda u: 1 - (head_in + u * UNIT_IN) / fig_h  # noqa: E731  (gridPos y → figure fraction)
    fig.text(0.01, 1 - 0.3 / fig_h, dashboard["title"], fontsize=16, weight="bold", va="center")
    fig.text(0.01, 1 - 0.5 / fig_h, "\n".join(sub), fontsize=8, va="top", color="dimgrey", linespacing=1.4)
    values = all_values(dashboard, prom)
    empty = []
    for p in panels:
        g = p["gridPos"]
        if p["type"] == "row":
            fig.text(fx(g["x"]) + 0.005, fy(g["y"] + 0.55), p["title"], fontsize=12, weight="bold", va="center")
            fig.add_artist(plt.Line2D([0.005, 0.995], [fy(g["y"] + 1)] * 2, color="lightgrey", lw=1))
            continue
        series = fetch_panel(p, prom, start, end, step, values)
        print(f"  {dashboard['title']} / {p['title']}: {len(series)} series")
        if not series:
            empty.append(p["title"])
        # The panel's frame, its title, then the plot (room below for a legend).
        x0, x1 = fx(g["x"]) + 0.004, fx(g["x"] + g["w"]) - 0.004
        y_top, y_bot = fy(g["y"]) - 0.1 / fig_h, fy(g["y"] + g["h"]) + 0.06 / fig_h
        fig.add_artist(plt.Rectangle((x0, y_bot), x1 - x0, y_top - y_bot, fill=False, ec="lightgrey", lw=0.8))
        fig.text(x0 + 0.006, y_top - 0.18 / fig_h, p["title"], fontsize=10, weight="bold", va="center")
        if p["type"] == "stat":
            ax = fig.add_axes([x0 + 0.01, y_bot + 0.1 / fig_h, x1 - x0 - 0.02, y_top - y_bot - 0.5 / fig_h])
            draw_stat(ax, p, series, step)
        else:
            names, zero = legend_entries(series)
            labels = [n for n in names if n] + (["zero"] if zero else [])
            rows = math.ceil(len(labels) / legend_columns(labels)) if labels else 0
            legend_in = 0.3 + 0.13 * rows
            ax = fig.add_axes([x0 + 0.045, y_bot + legend_in / fig_h, x1 - x0 - 0.055,
                               y_top - y_bot - (0.42 + legend_in) / fig_h])
            leg = draw_timeseries(ax, p, series, step, events)
            if leg:  # under the time axis, whatever the plot's height
                leg.set_bbox_to_anchor(((x0 + x1) / 2, y_bot + (legend_in - 0.24) / fig_h), transform=fig.transFigure)
            ax.set_xlim(datetime.fromtimestamp(start, timezone.utc), datetime.fromtimestamp(end, timezone.utc))
        if not series:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=14, color="grey", transform=ax.transAxes)
    os.makedirs(out, exist_ok=True)
    name = os.path.join(out, os.path.basename(path).removesuffix(".json") + ".png")
    fig.savefig(name, dpi=80)
    plt.close(fig)
    Image.open(name).convert("RGB").save(name, optimize=True)  # no alpha: a smaller file
    print(f"wrote {name} ({os.path.getsize(name) // 1024} KiB)")
    return [f"{dashboard['title']} / {t}" for t in empty]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--end", type=float, required=True)
    ap.add_argument("--step", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="", help="what the run did, under the title")
    ap.add_argument("--event", type=float, action="append", default=[], help="a time (UNIX) marked in every graph")
    ap.add_argument("dashboards", nargs="+")
    a = ap.parse_args()
    empty = []
    for path in a.dashboards:
        with open(path) as f:
            empty += draw(json.load(f), path, a.prometheus, a.start, a.end, a.step, a.out, a.note, a.event)
    if empty:
        print("FAIL: panels without data: " + "; ".join(empty), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Draws the pictures of tests/real_proxy.rs's warm-up, gutter and zone runs from their CSV:

    WARM_ROLLOUT_CSV=/tmp/roll.csv WARM_SCALE_OUT_CSV=/tmp/scale.csv GUTTER_CSV=/tmp/gutter.csv \
        cargo test -p memcached-operator --test real_proxy keeps_the_hit_ratio
    ZONES_CSV=/tmp/zones.csv cargo test -p memcached-operator --test real_proxy losing_a_zone
    hack/memcached/warm-rollout-plot.py roll /tmp/roll.csv docs/proxy/warm-rollout.png
    hack/memcached/warm-rollout-plot.py scale-out /tmp/scale.csv docs/proxy/warm-scale-out.png
    hack/memcached/warm-rollout-plot.py gutter /tmp/gutter.csv docs/proxy/gutter.png
    hack/memcached/warm-rollout-plot.py zones /tmp/zones.csv docs/proxy/zones.png

Needs matplotlib (pip install matplotlib)."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The test's phases, in windows of its load: per pod, 20 with the old pod still running,
# then 4 after it has gone; for the gutter, 30 with the pod down, then 10 replaced; for
# zones, 30 with the zone lost.
WITH_OLD, AFTER = {"gutter": (30, 10), "zones": (30, 0)}.get(sys.argv[1], (20, 4))

kind, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
steps = 4 if kind == "roll" else 1
rows = list(csv.DictReader(open(src)))
x = [int(r["request"]) / 1000 for r in rows]
window = x[0]
steady = float(rows[0]["steady_with"])
fig, ax = plt.subplots(figsize=(10, 4.2), dpi=110)
what = {"gutter": "a gutter", "zones": "a copy per zone"}.get(kind, "warm-up")
without = "one copy over the 12 pods" if kind == "zones" else f"without {what}"
ax.plot(x, [float(r["without"]) for r in rows], label=without, color="#c44e52")
ax.plot(x, [float(r["with"]) for r in rows], label=f"with {what}", color="#4c72b0")
ax.axhline(steady, color="grey", linewidth=0.8, linestyle="--", label=f"steady ({steady:.3f})")
ax.axhline(0.9 * steady, color="grey", linewidth=0.8, linestyle=":", label="90 % of steady")
for step in range(steps):
    start = step * (WITH_OLD + AFTER) * window
    ax.axvline(start, color="black", linewidth=0.6)
    ax.axvline(start + WITH_OLD * window, color="black", linewidth=0.6, linestyle=":")
    label = {
        "roll": f"pod {4 - step} replaced",
        "scale-out": "a fifth pod takes slot 5",
        "gutter": "the pod of the second slot is killed",
        "zones": "zone-a's 4 pods are killed",
    }[kind]
    ax.text(start + 0.3, 0.705, label, fontsize=8)
bottom = 0.55 if kind in ("gutter", "zones") else 0.7
for t in ax.texts:
    t.set_y(bottom + 0.005)
ax.set_ylim(bottom, 1.0)
ax.set_xlabel({
    "roll": "thousands of requests since the roll began (solid: a new pod takes the slot; dotted: the old pod stops)",
    "scale-out": "thousands of requests since the pool grew (dotted: the previous ring is no longer read)",
    "gutter": "thousands of requests since the pod was killed (dotted: a new pod takes its slot, empty)",
    "zones": "thousands of requests since zone-a was lost (the proxy is in zone-a)",
}[kind])
ax.set_ylabel(f"hit ratio per {int(window * 1000)} requests")
what = {
    "roll": "Rolling update of a 4-pod pool",
    "scale-out": "A 4-pod pool grown to 5",
    "gutter": "A pod of a 4-pod pool lost",
    "zones": "A zone of a 12-pod pool in 3 zones lost",
}[kind]
ax.set_title(f"{what} through memcached's proxy (Zipf 0.9, 5,000 keys, cache-aside)")
ax.legend(loc="lower right", fontsize=8)
fig.tight_layout()
fig.savefig(out)
print(f"wrote {out}")

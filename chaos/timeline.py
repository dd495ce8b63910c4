"""The run's timeline: throughput and latency of the workload's ops over time, each fault window
shaded in its colour (``timeline.png``, drawn by the runner after the verdict).

Must not import: rcq; matplotlib but inside :func:`plot_timeline` (a run without it still gets its
verdict; the runner says the picture was not drawn).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.checkers import fault_windows
from chaos.checkers.security import is_security_op
from chaos.history import pair_ops

FAULT_COLORS = ("#e6550d", "#3182bd", "#31a354", "#756bb1", "#636363", "#fd8d3c", "#9ecae1", "#a1d99b", "#bcbddc")


def plot_timeline(history: list[dict[str, Any]], path: Path, title: str = "rcq chaos") -> Path:
    """Throughput (ok / fail / info per second) and latency of every workload op over time, with
    each fault window shaded in its colour — the way Jepsen draws them. The intruder's ops are
    left out: its refusals are the system working, not failing."""
    import matplotlib  # only here: a run without matplotlib still has its verdict

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    pairs = [p for p in pair_ops(history) if p.completion is not None and not is_security_op(p.f)]
    end_s = max((float(op.get("time_s", 0)) for op in history), default=1.0)
    buckets = int(end_s) + 1
    figure, (throughput, latency) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    styles = {"ok": ("#2ca02c", "."), "fail": ("#d62728", "x"), "info": ("#ff7f0e", "^")}
    for type_, (color, marker) in styles.items():
        per_second = [0] * buckets
        times, latencies = [], []
        for pair in pairs:
            if pair.type != type_:
                continue
            done_s = pair.complete_time_s or 0.0
            per_second[min(buckets - 1, int(done_s))] += 1
            times.append(done_s)
            latencies.append(max(pair.latency_s or 0.0, 1e-4))
        throughput.plot(range(buckets), per_second, color=color, label=type_, linewidth=1)
        latency.scatter(times, latencies, s=4, color=color, marker=marker, label=type_, alpha=0.6)
    windows = [w for w in fault_windows(history) if w["f"] != "snapshot"]
    colors: dict[str, str] = {}
    for window in windows:
        color = colors.setdefault(window["f"], FAULT_COLORS[len(colors) % len(FAULT_COLORS)])
        for axis in (throughput, latency):
            axis.axvspan(window["start_s"], window["stop_s"], color=color, alpha=0.15, linewidth=0)
    throughput.set_ylabel("ops completed / s")
    throughput.set_title(title)
    latency.set_yscale("log")
    latency.set_ylabel("latency (s)")
    latency.set_xlabel("time since start (s)")
    handles, labels = throughput.get_legend_handles_labels()
    handles += [Patch(color=c, alpha=0.3) for c in colors.values()]
    labels += list(colors)
    figure.legend(handles, labels, loc="upper right", fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path

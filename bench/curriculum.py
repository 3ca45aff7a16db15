"""The online curriculum against the quickstart's uniform order, over seeds: does it pay?

    python bench/curriculum.py [--seeds 0,1,2] [--level native]

Each seed runs ``examples/curriculum/curriculum.yaml`` twice on the model that seed draws: as
written (``task_selector: difficulty_based``, the sums whose estimated pass rate is nearest
0.5) and with the quickstart's order instead (``sequential`` over the shuffled file: every
sum once, uniformly). Both start from the same SFT warm-up. Printed per arm: the held-out
greedy accuracy at every evaluation (every 10 GRPO steps; median and range over seeds), the
share of groups whose rewards differed (``groups_with_signal``: a group whose rewards are all
equal has advantage 0 and teaches nothing), and the first step at which each arm reaches the
uniform arm's final median accuracy. Writes ``docs/curriculum.svg`` (both arms' median curves
with their ranges) and appends a record to ``bench/results/curriculum.jsonl``. Work folders:
``.bench/curriculum/``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import record  # noqa: E402
from examples.recipes import Example, run  # noqa: E402

WORK = ROOT / ".bench" / "curriculum"
PLOT = ROOT / "docs" / "curriculum.svg"
ARMS: dict[str, dict] = {
    "uniform": {"buffer.explorer_input.taskset.task_selector": {"selector_type": "sequential"}},
    "curriculum": {},
}


def curves(work: Path) -> tuple[dict[int, float], list[float]]:
    """The GRPO stage's eval accuracy by step, and its per-step ``groups_with_signal``."""
    from roles.runtime.monitor import read_metrics

    (metrics,) = sorted((work / "checkpoints").glob("**/grpo/monitor/metrics.jsonl"))
    rows = read_metrics(metrics.parent.parent)
    acc = {r["step"]: r["values"]["accuracy"] for r in rows if r["kind"] == "eval" and r["taskset"] == "test"}
    signal = [r["values"].get("groups_with_signal", 0.0) for r in rows if r["kind"] == "rollout"]
    return acc, signal


def quoted(values: list[float]) -> str:
    """``median% (min-max%)``, as the README quotes it."""
    return f"{statistics.median(values):.1%} ({min(values):.1%}-{max(values):.1%})".replace("%-", "-")


def svg(series: dict[str, dict[int, list[float]]], path: Path) -> None:
    """A line chart: per arm the median over seeds and a band from min to max."""
    w, h, pad = 560, 320, 48
    steps = sorted({s for arm in series.values() for s in arm})
    x = lambda s: pad + (w - 2 * pad) * s / max(steps)  # noqa: E731
    y = lambda a: h - pad - (h - 2 * pad) * a  # noqa: E731
    colors = {"uniform": "#888888", "curriculum": "#d9480f"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    for a in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        yy = y((a - 0.5) * 2)
        out.append(f'<line x1="{pad}" x2="{w - pad}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                   f'<text x="{pad - 6}" y="{yy + 4:.1f}" text-anchor="end">{a:.0%}</text>')
    for s in steps:
        out.append(f'<text x="{x(s):.1f}" y="{h - pad + 16}" text-anchor="middle">{s}</text>')
    out.append(f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle">GRPO step</text>'
               f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">held-out accuracy (greedy)</text>')
    for i, (arm, by_step) in enumerate(series.items()):
        pts = sorted(by_step.items())
        scale = lambda v: y((v - 0.5) * 2)  # noqa: E731  the chart shows 50-100%
        band = [f"{x(s):.1f},{scale(max(v)):.1f}" for s, v in pts] + [f"{x(s):.1f},{scale(min(v)):.1f}" for s, v in reversed(pts)]
        out.append(f'<polygon points="{" ".join(band)}" fill="{colors[arm]}" opacity="0.18"/>')
        line = " ".join(f"{x(s):.1f},{scale(statistics.median(v)):.1f}" for s, v in pts)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colors[arm]}" stroke-width="2.5"/>')
        out.append(f'<text x="{w - pad - 150}" y="{h - pad - 40 + 18 * i}" fill="{colors[arm]}">{arm} (median, range)</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="model seeds (prepare.py --seed)")
    ap.add_argument("--level", default="native", help="CPU kernel level (examples/recipes.py)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    acc: dict[str, dict[int, list[float]]] = {arm: {} for arm in ARMS}
    signal: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for seed in seeds:
        for arm, changes in ARMS.items():
            work = WORK / f"{arm}-{seed}"
            subprocess.run(["rm", "-rf", str(work)], check=True)
            ex = Example("curriculum", "curriculum", "curriculum.yaml", short=changes)
            out = run(ex, work, seed, a.level, short=True)
            if out.rc != 0:
                raise SystemExit(f"{arm} seed {seed}: trinity run exited {out.rc}; see {out.log}")
            by_step, sig = curves(work)
            for step, v in by_step.items():
                acc[arm].setdefault(step, []).append(v)
            signal[arm].append(statistics.mean(sig))
            print(f"{arm:10s} seed {seed}: " + " ".join(f"{s}:{v:.1%}" for s, v in sorted(by_step.items()))
                  + f"  groups_with_signal {statistics.mean(sig):.2f}  {out.seconds / 60:.1f} min", flush=True)
    steps = sorted(acc["uniform"])
    print(f"\nheld-out accuracy, median (range) over seeds {a.seeds}:")
    print("step  " + "  ".join(f"{arm:>22s}" for arm in ARMS))
    for s in steps:
        print(f"{s:4d}  " + "  ".join(
            f"{statistics.median(acc[arm][s]):>8.1%} ({min(acc[arm][s]):.1%}-{max(acc[arm][s]):.1%})" for arm in ARMS))
    goal = statistics.median(acc["uniform"][steps[-1]])
    reach = {arm: next((s for s in steps if statistics.median(acc[arm][s]) >= goal), None) for arm in ARMS}
    print(f"first step at the uniform arm's final median ({goal:.1%}): " +
          ", ".join(f"{arm} {reach[arm]}" for arm in ARMS))
    print("groups with signal per step (mean over the run; range over seeds): " + ", ".join(
        f"{arm} {min(v):.2f}-{max(v):.2f}" for arm, v in signal.items()))
    svg(acc, PLOT)
    print(f"wrote {PLOT.relative_to(ROOT)}")
    figures: dict[str, float | int | str] = {"seeds": a.seeds, "level": a.level}
    for arm in ARMS:
        for s in steps:
            figures[f"{arm} step {s} accuracy"] = quoted(acc[arm][s])
        figures[f"{arm} groups with signal (mean)"] = round(statistics.mean(signal[arm]), 3)
        figures[f"{arm} steps to uniform's final"] = reach[arm] if reach[arm] is not None else "never"
    met = reach["curriculum"] is not None and (reach["uniform"] is None or reach["curriculum"] < reach["uniform"])
    record("curriculum", figures, target="the curriculum reaches the uniform order's final accuracy in fewer steps",
           met=met)


if __name__ == "__main__":
    main()

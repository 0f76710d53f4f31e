"""Draw a run's metrics.jsonl as PNG curves: reward, KL, clip fraction, response length, validation score.

    python scripts/plot_metrics.py runs/default            # writes runs/default/metrics.png
    python scripts/plot_metrics.py RUN_DIR --out plot.png --smooth 5
    python scripts/plot_metrics.py runs/seed0 runs/seed1 runs/seed2 --out seeds.png   # runs overlaid
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PANELS = [  # (title, metric keys drawn in the panel, or a prefix: every key that starts with it)
    ("reward", ["critic/reward/mean", "critic/reward/max", "critic/reward/min"]),
    ("validation score", "val/"),  # every val/test_score/<source> (and val/accepted/<source> for code)
    ("KL", ["actor/ppo_kl", "actor/kl_loss"]),
    ("clip fraction", ["actor/pg_clipfrac"]),
    ("response length", ["response_length/mean", "response_length/max", "response_length/min"]),
    ("entropy and grad norm", ["actor/entropy", "actor/grad_norm"]),
    ("judge verdicts (samples per step)", "critic/verdict/"),  # code runs only
    ("step time (s)", ["timing_s/gen", "timing_s/reward", "timing_s/update", "timing_s/testing"]),
]


def smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out, acc = [], []
    for v in values:
        acc = (acc + [v])[-window:]
        out.append(sum(acc) / len(acc))
    return out


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: pass the output_dir of a training run")
    rows = [json.loads(line) for line in path.open() if line.strip()]
    if not rows:
        raise ValueError(f"{path} is empty")
    return rows


def plot(run_dir: Path | list[Path], out: Path, window: int = 1) -> Path:
    """One run's curves, or several runs (seeds) overlaid, each line labelled with its run's folder name."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    run_dirs = run_dir if isinstance(run_dir, list) else [run_dir]
    runs = [(d, read_rows(d)) for d in run_dirs]
    panels = [(t, k) for t, k in PANELS if not isinstance(k, str) or any(x.startswith(k) for _, r in runs
                                                                           for row in r for x in row)]
    fig, axes = plt.subplots(-(-len(panels) // 3), 3, figsize=(15, 4 * -(-len(panels) // 3)))
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, panel_keys) in zip(axes.flat, panels):
        for d, rows in runs:
            keys = panel_keys if not isinstance(panel_keys, str) else \
                sorted({k for r in rows for k in r if k.startswith(panel_keys)})
            for key in keys:
                points = [(r["training/global_step"], r[key]) for r in rows if key in r]
                if points:
                    steps, values = zip(*points)
                    ax.plot(steps, smooth(list(values), 1 if title == "validation score" else window),
                            marker="o" if len(points) < 20 else None,
                            label=key if len(runs) == 1 else f"{d.name}: {key}")
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(", ".join(str(d) for d in run_dirs))
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="+", help="one run's output_dir, or several to overlay")
    ap.add_argument("--out", default=None, help="PNG path (default: <first RUN_DIR>/metrics.png)")
    ap.add_argument("--smooth", type=int, default=1, help="moving-average window")
    args = ap.parse_args()
    run_dirs = [Path(d) for d in args.run_dir]
    try:
        print(plot(run_dirs, Path(args.out) if args.out else run_dirs[0] / "metrics.png", args.smooth))
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()

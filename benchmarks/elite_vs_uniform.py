"""Learning comparison: elite (custom) replay against uniform (standard) replay.

The seed's claim: elite replay beats uniform replay where the policy changes fast (its
charts: Breakout and Seaquest at fresh:replay ratios 5:5 and 8:2). For every environment,
ratio and seed, both replays train with the same budget, the same batch split and the
same seed; only the off-policy replay differs. Prints, per ratio, the mean and spread
(std over seeds) of the 100-episode average score at evenly spaced environment-step
marks, and the final score (mean ± std, min and max over seeds); records one file per
environment in results/.

    python benchmarks/elite_vs_uniform.py --env MinAtar/Breakout-v1 MinAtar/Seaquest-v1 \\
        --ratios 5:5 8:2 --seeds 1 2 3 4 5 --steps 1000000 --batch_size 20 --capacity 1000 --keep runs/elite
    herd plot --compare runs/elite/MinAtar-Breakout-v1/*      # mean and spread per configuration

A ratio f:r splits every batch into f/(f+r) fresh trajectories and r/(f+r) replayed ones
(the queue's and the replay's sample_ratio); --batch_size 20 splits exactly at 5:5 and
8:2 (herd rounds other splits to whole trajectories). The elite replay is the seed's: ln_norm distance, elite_sampling, lambda 6,
annealing factor 2.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from common import moving_averages, print_table, read_csv, record, run_herd

ELITE_KEYS = {"dist_function": "ln_norm", "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 6,
              "alfa_annealing_factor": 2.0}


def parse_ratio(text: str) -> tuple[int, int]:
    try:
        fresh, replayed = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a fresh:replay ratio such as 5:5 or 8:2") from None
    if fresh < 1 or replayed < 1:
        raise argparse.ArgumentTypeError(f"'{text}': both parts of a fresh:replay ratio must be at least 1")
    return fresh, replayed


def replay_parameters(kind: str, ratio: tuple[int, int], capacity: int) -> str:
    """--replay_parameters for `kind` (uniform or elite) at a fresh:replay ratio."""
    fresh, replayed = ratio[0] / sum(ratio), ratio[1] / sum(ratio)
    replay = {"type": "standard", "capacity": capacity, "sample_ratio": replayed}
    if kind == "elite":
        replay = {"type": "custom", "capacity": capacity, "sample_ratio": replayed, **ELITE_KEYS}
    return json.dumps([{"type": "queue", "capacity": 1, "sample_ratio": fresh}, replay])


def curve(episodes: list[dict], marks: list[int], window: int = 100) -> list[float]:
    """The moving-average score at each mark of environment steps (NaN before any episode)."""
    averages = moving_averages(episodes, window)
    values, latest, index = [], float("nan"), 0
    for mark in marks:
        while index < len(averages) and averages[index][0]["env_step"] <= mark:
            latest = averages[index][1]
            index += 1
        values.append(latest)
    return values


def spread(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.pstdev(values), "min": min(values), "max": max(values)}


def summarise(replay: str, runs: list[list[float]], minutes: list[float], marks: list[int]) -> dict:
    """Curves and final scores of one configuration's runs so far (mean and spread over seeds)."""
    return {
        "replay_parameters": replay,
        "mean": [statistics.mean(run[i] for run in runs) for i in range(len(marks))],
        "std": [statistics.pstdev(run[i] for run in runs) for i in range(len(marks))],
        "final": spread([run[-1] for run in runs]),
        "mean_over_curve": statistics.mean(statistics.mean(run) for run in runs),
        "runs": runs,
        "minutes": minutes,
    }


def compare(env: str, args, marks: list[int], results: Path, save) -> dict:
    """Runs every seed x ratio x replay on `env`; -> {"<f>:<r> <replay>": curves and final scores}.
    Seed by seed, each seed through every configuration, and save(configurations) after every
    run: a long benchmark stopped midway keeps whole seeds of every configuration."""
    done: dict[str, dict] = {}          # name -> replay, runs (curves) and minutes so far
    for seed in args.seeds:
        for ratio in args.ratios:
            for kind in ("uniform", "elite"):
                name = f"{ratio[0]}:{ratio[1]} {kind}"
                replay = replay_parameters(kind, ratio, args.capacity)
                batch = [f"--batch_size={args.batch_size}"] if args.batch_size else []
                run_dir, _, code = run_herd(["train", f"--env={env}", f"--seed={seed}", *batch,
                                             f"--environment_max_steps={args.steps}", f"--replay_parameters={replay}",
                                             "--basic_verbose=False", "--tensorboard=False", *shlex.split(args.extra)],
                                            results, timeout=args.timeout)
                if code != 0:
                    raise SystemExit(f"{env} {name} seed {seed} failed with exit code {code}")
                runs = done.setdefault(name, {"replay": replay, "runs": [], "minutes": []})
                runs["runs"].append(curve(read_csv(run_dir / "episodes.csv"), marks))
                seconds = json.loads((run_dir / "summary.json").read_text())["total_time_s"]
                runs["minutes"].append(round(seconds / 60, 2))
                print(f"{env} {name} seed {seed}: final avg100 {runs['runs'][-1][-1]:.2f} "
                      f"({seconds / 60:.1f} min)", flush=True)
                configurations = {n: summarise(d["replay"], d["runs"], d["minutes"], marks) for n, d in done.items()}
                save(configurations)
    return configurations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", nargs="+", default=["CartPole-v1"])
    parser.add_argument("--ratios", nargs="+", type=parse_ratio, default=[(5, 5)], help="fresh:replay, e.g. 5:5 8:2")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=200_000, help="environment steps per run")
    parser.add_argument("--batch_size", type=int, help="trajectories per batch, fresh and replayed (default: the "
                        "profile's; 20 splits exactly at 5:5 and 8:2)")
    parser.add_argument("--capacity", type=int, default=500, help="trajectories the off-policy replay holds")
    parser.add_argument("--points", type=int, default=20, help="marks on the recorded curves")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--extra", default="", help="extra herd flags in one string")
    parser.add_argument("--tag", default="", help="appended to the results file names (e.g. _short)")
    parser.add_argument("--keep", help="keep the run folders in DIR/<env>/ (for `herd plot --compare DIR/<env>/*`)")
    args = parser.parse_args()
    marks = [args.steps * (i + 1) // args.points for i in range(args.points)]
    with tempfile.TemporaryDirectory() as tmp:
        for env in args.env:
            slug = env.replace("/", "-")
            ratios = "" if args.ratios == [(5, 5)] else "_" + "_".join(f"{f}-{r}" for f, r in args.ratios)

            def save(configurations: dict) -> None:
                record(f"elite_vs_uniform_{slug}{ratios}{args.tag}", {
                    "env": env, "seeds": args.seeds, "steps": args.steps, "batch_size": args.batch_size,
                    "capacity": args.capacity, "extra": args.extra, "marks": marks,
                    "seeds_done": min(len(c["runs"]) for c in configurations.values()),
                    "configurations": configurations,
                    "command": "python benchmarks/elite_vs_uniform.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])})

            configurations = compare(env, args, marks, Path(args.keep or tmp) / slug, save)
            shown = [len(marks) * (i + 1) // 4 - 1 for i in range(4)]          # four marks fit a table
            print_table(["configuration"] + [f"{marks[i] // 1000}k" for i in shown] + ["final mean±std [min, max]"],
                        [[name] + [f"{c['mean'][i]:.2f}±{c['std'][i]:.2f}" for i in shown]
                         + [f"{c['final']['mean']:.2f}±{c['final']['std']:.2f} "
                            f"[{c['final']['min']:.2f}, {c['final']['max']:.2f}]"]
                         for name, c in configurations.items()])


if __name__ == "__main__":
    main()

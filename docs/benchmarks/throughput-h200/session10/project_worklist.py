"""Session 10: what the 8-target sample's folds say about the whole 1,000-target worklist (an estimate,
not a measurement). Two estimators of the worklist's fold time from the sample's per-target fold times:

- stratified: each sampled target stands for every worklist target of its length stratum (the
  sample took the first target of a seeded shuffle in each of 8 equal-width strata);
- power law: fold time = a * residues^b fitted (least squares in log-log) to the 8 folds, summed over
  every worklist target.

Each adds the run's measured start-up once. Usage: python3 project_worklist.py TIMELINE.tsv STARTUP_S
"""

import sys

import numpy as np
import pandas as pd

from foldmill.bench.throughput import sample_targets, synthetic_worklist


def main(timeline_path: str, startup_s: float) -> None:
    worklist = synthetic_worklist(1000, 0, 200, 2800)
    lengths = np.array([target.residues for target in worklist])
    timeline = pd.read_csv(timeline_path, sep="\t")
    seconds = dict(zip(timeline.target_id, timeline.fold_end_s - timeline.fold_start_s))
    sample = sample_targets(worklist, len(timeline), 0, 0, stratified=True)
    low, high = lengths.min(), lengths.max() + 1
    stratum_of = (lengths - low) * len(sample) // (high - low)
    stratified = 0.0
    for target in sample:
        stratum = (target.residues - low) * len(sample) // (high - low)
        stratified += int((stratum_of == stratum).sum()) * seconds[target.target_id]
    sampled = np.array([t.residues for t in sample])
    exponent, log_scale = np.polyfit(np.log(sampled), np.log([seconds[t.target_id] for t in sample]), 1)
    power_law = float((np.exp(log_scale) * lengths**exponent).sum())
    print(f"worklist: {len(lengths)} targets, {lengths.sum()} residues", end=" ")
    print(f"(mean {lengths.mean():.0f}; sample mean {sampled.mean():.0f})")
    for name, fold_s in (("stratified", stratified), (f"power law (exponent {exponent:.2f})", power_law)):
        rate = lengths.sum() / (fold_s + startup_s) * 3600
        print(f"{name}: {fold_s / 3600:.2f} GPU-hours, {rate / 1000:.1f}K residues per GPU-hour")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))

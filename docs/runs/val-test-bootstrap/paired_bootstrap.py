"""Paired bootstrap over sentences: do validation and test_2016 rank two groups of runs the same way?

For each resample of a split's sentences (the same indices for every model), the corpus BLEU of every model, then
``d = mean(trials) - mean(recipe)`` on that split. Validation and test_2016 are independent sets, so they are
resampled independently, and ``d_test - d_val`` measures how far the two sets disagree beyond the noise of
sampling 1,000 sentences. Run seeds are not resampled: each group's mean over its runs stands as measured.

Usage: ``python paired_bootstrap.py models.json [B]``, where models.json maps a run's name to
``{"group": "recipe" | "trial", "val": PATH, "test": PATH}``, each PATH (relative to models.json) a JSON file with
``hypotheses`` and ``bleu`` (what ``hf-vanilla-transformer evaluate --output`` writes; a training run's results.json
holds it under ``test``).
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU

DATA = Path(__file__).resolve().parents[3] / "hf_vanilla_transformer" / "data" / "multi30k"
SPLITS = {"val": "val.de.gz", "test": "test_2016_flickr.de.gz"}


def load_hypotheses(path: Path) -> tuple[list[str], float]:
    record = json.loads(path.read_text())
    if "hypotheses" not in record:
        record = record["test"]
    return record["hypotheses"], record["bleu"]


def summary(samples: np.ndarray, point: float) -> dict[str, float | list[float]]:
    low, high = np.percentile(samples, [2.5, 97.5])
    return {
        "point": round(point, 2),
        "ci95": [round(float(low), 2), round(float(high), 2)],
        "share_at_or_below_0": round(float((samples <= 0).mean()), 4),
    }


def main(models_file: str, resamples: int = 2000) -> dict:
    models = json.loads(Path(models_file).read_text())
    base = Path(models_file).parent
    recipe = [name for name, m in models.items() if m["group"] == "recipe"]
    trials = [name for name, m in models.items() if m["group"] == "trial"]
    bleu = BLEU()
    rng = np.random.default_rng(0)
    result: dict = {"resamples": resamples, "recipe": recipe, "trials": trials, "bleu": {}}
    differences, points = {}, {}
    for split, file in SPLITS.items():
        with gzip.open(DATA / file, "rt", encoding="utf-8") as f:
            references = [line.rstrip("\n") for line in f]
        n = len(references)
        # Resamples as sentence counts: (resamples, n) @ per-sentence stats (n, 10) -> summed stats (resamples, 10).
        counts = np.zeros((resamples, n), dtype=np.int64)
        rows = np.repeat(np.arange(resamples), n)
        np.add.at(counts, (rows, rng.integers(0, n, size=resamples * n)), 1)
        full, sampled = {}, {}
        for name, m in models.items():
            hypotheses, recorded = load_hypotheses(base / m[split])
            # sacreBLEU's per-sentence statistics [hyp_len, ref_len, correct_1..4, total_1..4], summed per resample.
            stats = np.array(bleu._extract_corpus_statistics(hypotheses, [references]), dtype=np.int64)
            full[name] = bleu._compute_score_from_stats(stats.sum(0).tolist()).score
            if abs(full[name] - recorded) > 1e-6:  # the hypotheses must be the ones the recorded score came from
                raise ValueError(f"{name} {split}: recomputed BLEU {full[name]} != recorded {recorded}")
            sampled[name] = np.array([bleu._compute_score_from_stats(row.tolist()).score for row in counts @ stats])
            result["bleu"][f"{name}/{split}"] = round(full[name], 2)
        differences[split] = np.mean([sampled[t] for t in trials], 0) - np.mean([sampled[r] for r in recipe], 0)
        points[split] = float(np.mean([full[t] for t in trials]) - np.mean([full[r] for r in recipe]))
        result[f"trials_minus_recipe_{split}"] = summary(differences[split], points[split])
    result["test_minus_val"] = summary(differences["test"] - differences["val"], points["test"] - points["val"])
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], *(int(a) for a in sys.argv[2:])), indent=1))

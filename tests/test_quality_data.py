"""The shipped data: suites well formed, calibration prompts chat-shaped, and calibration text disjoint
from the evaluation text (a quantizer calibrated on eval text would flatter itself)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tally.quality.scoring import CHECKS
from tally.quality.suites import (
    DATA,
    HELDOUT,
    LONGTAIL,
    TASK_SUITES,
    heldout_text,
    read_jsonl,
)

CALIBRATION_PLAYS = Path(__file__).parents[1] / "tally" / "data" / "shakespeare.txt"


def test_suites_are_well_formed_with_unique_ids():
    ids = []
    for file in TASK_SUITES.values():
        for row in read_jsonl(file):
            assert row["check"]["type"] in CHECKS
            assert [m["role"] for m in row["messages"]] == ["system", "user"]
            ids.append(row["id"])
    for row in read_jsonl(LONGTAIL):
        assert row["category"] in ("long", "languages", "noisy", "tables")
        assert row.get("fill") in (None, *HELDOUT)
        assert ("{filler}" in row["messages"][-1]["content"]) == ("fill" in row)
        ids.append(row["id"])
    assert len(ids) == len(set(ids)) >= 100


def test_calibration_prompts_have_a_system_prompt_and_never_quote_eval_text():
    rows = [json.loads(line) for line in (DATA / "calibration.jsonl").read_text().splitlines()]
    assert len(rows) == 256
    eval_text = _squash(" ".join(heldout_text(name) for name in HELDOUT))
    for row in rows:
        system, user = row["messages"]
        assert system["role"] == "system" and user["role"] == "user"
        passage = _squash(user["content"].split("\n\n", 1)[1])
        # Any 80-character run of a calibration passage found in the eval text would mean overlap.
        for start in range(0, max(1, len(passage) - 80), 80):
            assert passage[start:start + 80] not in eval_text


def test_eval_plays_are_not_the_plays_used_for_calibration():
    bench = CALIBRATION_PLAYS.read_text()
    plays = heldout_text("shakespeare")
    titles = re.findall(r"^([A-Z][A-Z' ]{6,})\n\nby William Shakespeare", plays, flags=re.M)
    assert titles and all(t not in bench for t in titles)


def _squash(text: str) -> str:
    return " ".join(text.split())

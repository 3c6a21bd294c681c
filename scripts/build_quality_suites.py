"""Maintainer script, never imported at run time: writes the task suites (tasks_*.jsonl) from templates
with a fixed seed, so every item and its expected answer is reviewable in one place.

    python scripts/build_quality_suites.py

longtail.jsonl is written by hand (its items are scored against the baseline, not against answers).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parents[1] / "tally" / "quality" / "data"  # what it writes
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Follow the instructions exactly."}
NAMES = ["Alice Martin", "Omar Haddad", "Yuki Tanaka", "Carlos Ruiz", "Ingrid Olsen", "Priya Nair", "Tom Baker",
         "Lena Vogel", "Kwame Mensah", "Sofia Rossi"]
CITIES = ["Lyon", "Cairo", "Osaka", "Seville", "Bergen", "Pune", "Leeds", "Graz", "Accra", "Turin"]
JOBS = ["nurse", "teacher", "pilot", "baker", "engineer", "librarian", "chemist", "farmer"]
PRODUCTS = ["desk lamp", "kettle", "backpack", "keyboard", "umbrella", "teapot", "bicycle bell", "notebook"]
COLORS = ["red", "blue", "green", "black", "white", "yellow"]


def _user(text: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": text}]


def json_items(rng: random.Random) -> list[dict]:
    items = []
    for i in range(30):
        kind = i % 3
        if kind == 0:
            fields = {"name": rng.choice(NAMES), "age": rng.randint(19, 80), "city": rng.choice(CITIES)}
            text = f"{fields['name']} is a {fields['age']}-year-old {rng.choice(JOBS)} who lives in {fields['city']}."
        elif kind == 1:
            fields = {"order_id": f"A{rng.randint(1000, 9999)}", "quantity": rng.randint(2, 60),
                      "product": rng.choice(PRODUCTS)}
            text = (f"Order {fields['order_id']} was shipped on Monday: {fields['quantity']} units of "
                    f"{fields['product']}.")
        else:
            fields = {"product": rng.choice(PRODUCTS), "price": rng.randint(5, 300), "color": rng.choice(COLORS)}
            text = f"The {fields['color']} {fields['product']} costs {fields['price']} euros and ships in two days."
        keys = ", ".join(fields)
        prompt = (f"Extract the fields {keys} from the text below. Answer with only a JSON object, no other text.\n\n"
                  f"Text: {text}")
        items.append({"id": f"json-{i:02d}", "messages": _user(prompt), "check": {"type": "json_fields",
                                                                                  "fields": fields}})
    return items


def number_items(rng: random.Random) -> list[dict]:
    items = []
    for i in range(15):
        n = str(rng.randint(10**11, 10**12 - 1))
        items.append({"id": f"copy-{i:02d}", "messages": _user(f"Repeat this number exactly, digits only: {n}"),
                      "check": {"type": "number", "expected": n}})
    for i in range(15):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        items.append({"id": f"add-{i:02d}", "messages": _user(f"What is {a} + {b}? Answer with the number only."),
                      "check": {"type": "number", "expected": str(a + b)}})
    return items


FORMAT_RULES = [
    ("Describe the sea in exactly {n} words.", {"type": "word_count"}),
    ("Answer in UPPERCASE letters only: which country is {city} in?", {"type": "uppercase"}),
    ("Answer in lowercase letters only: what does a {job} do?", {"type": "lowercase"}),
    ("Name {n} colours as a bullet list of exactly {n} items, each line starting with '- ', and nothing else.",
     {"type": "bullets"}),
    ("Begin your answer with the word 'Yes'. Is a {product} useful?", {"type": "starts_with", "text": "Yes"}),
    ("End your answer with the word 'Done'. Say hello to {name}.", {"type": "ends_with", "text": "Done"}),
]


def format_items(rng: random.Random) -> list[dict]:
    items = []
    for i in range(30):
        template, check = FORMAT_RULES[i % len(FORMAT_RULES)]
        n = rng.randint(2, 6) if check["type"] == "word_count" else 3
        prompt = template.format(n=n, city=rng.choice(CITIES), job=rng.choice(JOBS), product=rng.choice(PRODUCTS),
                                 name=rng.choice(NAMES))
        if check["type"] in ("word_count", "bullets"):
            check = {**check, "n": n}
        items.append({"id": f"format-{i:02d}-{check['type']}", "messages": _user(prompt), "check": check})
    return items


def write(name: str, items: list[dict]) -> None:
    with open(HERE / name, "w") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def main() -> None:
    rng = random.Random(1234)
    write("tasks_json.jsonl", json_items(rng))
    write("tasks_numbers.jsonl", number_items(rng))
    write("tasks_format.jsonl", format_items(rng))


if __name__ == "__main__":
    main()

"""Where `tally eval` writes a report, for the shipped suites and the user's alike: JSON on stdout with --json, else
the table; and the JSON to --out's file too."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable


def write_report(report: Any, ns: argparse.Namespace, command: str, json_text: Callable[[Any, str], str],
                 print_table: Callable[[Any, str], None]) -> None:
    if ns.json:
        sys.stdout.write(json_text(report, command))
    else:
        print_table(report, command)
    if ns.out:
        ns.out.write_text(json_text(report, command))

"""The README's operations loop in one piece, with real processes: every command line of its "Operate it" section is
read from README.md and run in order in one folder, as a user who copied them would — `tally serve --request-log`,
a baseline `tally bench`, `tally alerts` (from the run and from a live window), `tally dashboards`, `promtool check
rules`, `tally plan --lengths` and `tally bench --replay` on the request log, a second `tally serve` as the new
version, `tally route` with a canary under the README's own rules.yaml, traffic through it, its status.

Only the scale changes (SCALE: minutes become seconds, a 5% step 50%), the ports (free ones instead of 8000, 8001
and 8080) and the model (a tiny checkpoint instead of the built-in one); every value replaced must be in the README,
so a README edit that breaks a line breaks this test. The servers the section starts in the background are all
started at the outset (their start-up is most of the time on a small machine), each waited for at its own line.
The live-baseline line gets a trickle of requests while its window runs: the README's server has its users."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tally.server.process import free_port

ROOT = Path(__file__).resolve().parents[1]
SECTION = "**7. Operate it**"
# (flag, the README's value) -> this test's value; each pair must be in the README.
SCALE = {("--duration", "2m"): "3s", ("--duration", "10m"): "8s", ("--rate", "1"): "4", ("--rate", "2"): "4",
         ("--baseline-window", "10m"): "3s", ("--eval-interval", "5s"): "1s",
         ("--plan", "5%:2h,20%:2h,50%:2h,100%"): "50%:2s,100%"}
RULES_SCALE = {"min_samples": 4, "window": "4s"}
DEFAULT_PORTS = {"serve": "8000", "route": "8080"}
TINY_FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB", "--max-model-len", "128",
              "--log-level", "warning"]
TIMEOUT_S = 240.0


def readme_loop() -> tuple[list[tuple[list[str], bool]], str]:
    """The section's shell lines (argv, run in the background?) and its rules.yaml, as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ")]
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    rules = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    lines = []
    for line in bash.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            background = argv[-1] == "&"
            lines.append((argv[:-1] if background else argv, background))
    return lines, rules


def _scaled(argv: list[str], ports: dict[str, int], used: set) -> list[str]:
    out = list(argv)
    for i in range(len(out) - 1):
        new = SCALE.get((out[i], out[i + 1]))
        if new is not None:
            used.add((out[i], out[i + 1]))
            out[i + 1] = new
    for readme_port, port in ports.items():
        out = [a.replace(f"127.0.0.1:{readme_port}", f"127.0.0.1:{port}") for a in out]
        out = [str(port) if a == readme_port and out[i - 1] == "--port" else a for i, a in enumerate(out)]
    return out


class Loop:
    """Runs the README's lines in `cwd`; background ones stay up until close()."""

    def __init__(self, cwd: Path, model: Path) -> None:
        self.cwd, self.model = cwd, model
        self.ports = {"8000": free_port(), "8001": free_port(), "8080": free_port()}
        self.background: dict[int, tuple[subprocess.Popen, Path]] = {}  # by line
        self.outputs: list[tuple[list[str], str]] = []  # (the README's argv, its stdout)
        self.used: set = set()
        self.logged_before: dict[str, int] = {}  # by tally command: request-log lines when it started
        self.took_s: list[tuple[str, float]] = []

    def args(self, argv: list[str]) -> list[str]:
        """The command this test runs for a README line."""
        args = _scaled(argv, self.ports, self.used)
        if args[0] == ".venv/bin/tally":
            command = args[1]
            args = [sys.executable, "-m", "tally.cli", *args[1:]]
            if command == "serve":
                args += ["--model", str(self.model), *TINY_FLAGS]
            if command in DEFAULT_PORTS and "--port" not in args:
                args += ["--port", str(self.ports[DEFAULT_PORTS[command]])]
        return args

    def start_servers(self, lines: list[tuple[list[str], bool]]) -> None:
        for i, (argv, background) in enumerate(lines):
            if background and argv[:2] == [".venv/bin/tally", "serve"]:
                self._start(i, self.args(argv))

    def _start(self, key: int, args: list[str]) -> None:
        log = self.cwd / f"background-{key}.log"
        self.background[key] = (subprocess.Popen(args, cwd=self.cwd, stdout=log.open("w"), stderr=subprocess.STDOUT),
                                log)

    def run(self, key: int, argv: list[str], background: bool) -> None:
        args = self.args(argv)
        if args[0] == "curl":  # curl -s URL: the same GET, without needing curl here
            self.outputs.append((argv, httpx.get(args[-1], timeout=30).text))
            return
        if args[0] == "promtool" and shutil.which("promtool") is None:
            self.outputs.append((argv, "skipped: promtool is not installed"))
            return
        if argv[0] == ".venv/bin/tally":
            self.logged_before[argv[1]] = len(self.logged())
        started_s = time.monotonic()
        try:
            self._run(key, argv, args, background)
        finally:
            self.took_s.append((shlex.join(argv[:3]), round(time.monotonic() - started_s, 1)))

    def logged(self) -> list[dict]:
        return [json.loads(line) for f in sorted((self.cwd / "logs").glob("*.jsonl"))
                for line in f.read_text().splitlines()]

    def _run(self, key: int, argv: list[str], args: list[str], background: bool) -> None:
        if background:
            if key not in self.background:
                self._start(key, args)
            self._healthy(*self.background[key], int(args[args.index("--port") + 1]))
            return
        traffic = self._live_traffic() if "--baseline-window" in args else None
        try:
            done = subprocess.run(args, cwd=self.cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
        finally:
            if traffic is not None:
                traffic.set()
        assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        self.outputs.append((argv, done.stdout))

    def _healthy(self, proc: subprocess.Popen, log: Path, port: int) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{proc.args} never became healthy:\n{log.read_text()[-3000:]}")

    def _live_traffic(self) -> threading.Event:
        """Normal traffic while a live baseline window is read (the README's server has its users)."""
        stop = threading.Event()

        def send() -> None:
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    http.post(f"http://127.0.0.1:{self.ports['8000']}/v1/completions",
                              json={"model": "tiny", "prompt": "The capital of France", "max_tokens": 4})
                    stop.wait(0.2)

        threading.Thread(target=send, daemon=True).start()
        return stop

    def output(self, *words: str) -> str:
        """The stdout of the one README line that starts with these words (after .venv/bin/tally)."""
        found = [out for argv, out in self.outputs if argv[1:1 + len(words)] == list(words) or
                 argv[:len(words)] == list(words)]
        assert len(found) == 1, (words, [a for a, _ in self.outputs])
        return found[0]

    def close(self) -> None:
        for key in sorted(self.background, reverse=True):  # the proxy first, then the servers
            self.background[key][0].terminate()
        for proc, _ in self.background.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_readmes_operations_loop_runs_as_written(tiny_llama, tmp_path):
    lines, rules_text = readme_loop()
    rules = yaml.safe_load(rules_text)
    assert set(RULES_SCALE) <= set(rules)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({**rules, **RULES_SCALE}, sort_keys=False))
    loop = Loop(tmp_path, tiny_llama)
    try:
        loop.start_servers(lines)
        for key, (argv, background) in enumerate(lines):
            loop.run(key, argv, background)
        assert loop.used == set(SCALE), f"the README no longer says {sorted(set(SCALE) - loop.used)}"

        # The request log has the traffic, and planning and replay read it.
        logged = loop.logged()
        assert logged and all(r["output_tokens"] > 0 for r in logged)
        planned = re.search(r"Lengths \((\d+) requests\)", loop.output("plan")).group(1)
        assert int(planned) == loop.logged_before["plan"] > 0
        replay = json.loads((tmp_path / "replay.json").read_text())
        assert replay["summary"]["counts"]["ok"] > 0 and replay["summary"]["counts"]["failed"] == 0

        # Alerts from a baseline (the live window's file overwrote the bench run's), dashboards, promtool.
        baseline = json.loads((tmp_path / "baseline.json").read_text())
        assert not baseline["partial"] and baseline["summary"]["counts"]["failed"] == 0
        alerts = {r["alert"]: r for g in yaml.safe_load((tmp_path / "alerts.yml").read_text())["groups"]
                  for r in g["rules"]}
        assert {"TallyTTFTP99High", "TallyOutputLengthDrop"} <= set(alerts)
        assert (tmp_path / "grafana" / "tally-dashboard.json").is_file()
        promtool = loop.output("promtool", "check", "rules")

        # The canary: traffic through the proxy, none lost; every decision in the audit log, with both sources.
        run = json.loads((tmp_path / "canary-run.json").read_text())
        assert run["summary"]["counts"]["ok"] > 0 and run["summary"]["counts"]["failed"] == 0
        status = json.loads(loop.output("curl", "-s"))
        assert status["urls"] == [f"http://127.0.0.1:{loop.ports['8001']}"]
        audit = [json.loads(line) for line in (tmp_path / "canary.jsonl").read_text().splitlines()]
        assert audit[0]["decision"] == "start" and len(audit[0]["rules"]) == len(rules["rules"])
        judged = [r for r in audit[1:] if r["decision"] != "hold"]
        assert judged, [r["reason"] for r in audit[-3:]]
        for record in judged:  # the figures behind each decision: both sides, both sources
            for side in ("canary", "stable"):
                assert record["sides"][side]["requests"] > 0
                assert record["backend"][side]["prefix"] == "tally:", record["backend"]
        # A twin in everything but int8 weights normally walks to 100%, but a loaded CPU's latency tail may roll it
        # back by a latency rule: either way the decision says which rule and with what figures.
        assert status["phase"] in ("running", "done", "rolled_back")
        if audit[-1]["decision"] == "rollback":
            assert audit[-1]["reason"].startswith(("ttft_p99", "tpot_p99")), audit[-1]["reason"]
        if promtool.startswith("skipped"):
            pytest.skip("everything ran but `promtool check rules`: apt-get install prometheus to check the rules")
        assert "SUCCESS" in promtool
    finally:
        loop.close()
        print("seconds per line:", loop.took_s)  # with -s: where the time went

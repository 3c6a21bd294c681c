"""`tally serve --ray`: Tally's engine as Ray Serve replicas on a local two-CPU Ray cluster, driven by the official
openai client through Ray's HTTP proxy. Every wait is bounded polling of what the cluster reports (replica states,
the merged /metrics), never a timer."""
from __future__ import annotations

import concurrent.futures
import json
import re
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.tiny_models import make_checkpoint

from tally.deploy.ray_forward import prompt_prefix
from tally.errors import ConfigError
from tally.ports import free_port
from tally.server.app_args import allowed_hosts
from tally.server.cli import parse_args
from tally.server.process import ServerProcess

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from tally.deploy.ray_app import build_app  # noqa: E402  (needs Ray)

DEPLOY_DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
NEVER_S = 120.0  # far beyond a replica's start here: reaching it means "never"
SYSTEM = ("You are a careful assistant for a paged KV cache. Blocks of tokens are shared between requests with a "
          "common prefix, so keep this long instruction first in every conversation.")
AFFINITY_CHARS = 100  # the tiny model's context is short: a prefix of 100 characters counts as long here
CLI = "--dtype float32 --kv-cache-memory 8MB --max-model-len 2048 --max-num-seqs 4 --disable-log-stats"


def poll(read: Callable[[], object], done: Callable[[object], bool], what: str, timeout_s: float = NEVER_S):
    deadline = time.monotonic() + timeout_s
    while not done(value := read()):
        assert time.monotonic() < deadline, f"never saw {what}; last: {value}"
        time.sleep(0.2)
    return value


@pytest.mark.parametrize("argv, message", [
    (["--ray", "--replicas", "0"], "--replicas must be ≥ 1, got 0"),
    (["--ray", "--autoscale", "3:2"], "--autoscale 3:2: MIN is above MAX"),
    (["--ray", "--autoscale", "two"], "write MIN:MAX replicas"),
    (["--ray", "--replicas", "2", "--autoscale", "1:2"], "not both"),
    (["--replicas", "2"], "need --ray"),
    (["--ray", "--cpu-affinity", "0"], "--cpu-affinity would pin every replica"),
    (["--ray", "--tensor-parallel-size", "2"], "each replica one process"),
    (["--ray", "--pipeline-parallel-size", "2"], "each replica one process"),
    (["--ray", "--header-timeout", "5"], "--header-timeout cannot apply under --ray: Ray's HTTP proxy accepts"),
])
def test_bad_ray_options_are_refused_with_what_to_write(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_serve_run_builder_refuses_unknown_args_and_bad_flags():
    with pytest.raises(ConfigError, match="unknown args replica;"):
        build_app({"cli": "--replicas 2", "replica": 2})
    with pytest.raises(ConfigError, match="--replicas must be ≥ 1"):
        build_app({"cli": "--replicas 0"})


def test_the_serve_run_config_in_the_docs_is_accepted():
    from ray.serve.schema import ServeDeploySchema

    doc = DEPLOY_DOC.read_text()
    section = doc[doc.index("## Ray Serve\n"):]
    section = section[:section.index("\n## ")]
    config = ServeDeploySchema.model_validate(yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S)[1]))
    (app,) = config.applications
    assert app.import_path == "tally.deploy.ray_app:build_app"
    assert isinstance(build_app(app.args), serve.Application)
    ns = parse_args(["--ray", *shlex.split(app.args["cli"])])
    assert allowed_hosts(ns.allowed_hosts, ns.host) == ("*",)  # the proxy is on 0.0.0.0: clients use any name


@pytest.mark.parametrize("body, prefix", [
    ({"messages": [{"role": "system", "content": "x" * 8}, {"role": "user", "content": "hi"}]}, "system\nxxx"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "abcdefghij"}]}]}, "user\nabcde"),
    ({"prompt": ["0123456789", "zzz"]}, "0123456789"),
    ({"prompt": [[7, 8, 9, 10, 11]]}, "7 8 9 10 1"),
    ({"prompt": "short"}, None),
    (["not", "a", "request"], None),
])
def test_prompt_prefix_is_the_leading_text_of_any_prompt_form(body, prefix):
    assert prompt_prefix(json.dumps(body).encode(), 10) == prefix


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # a context long enough for a request that is still generating when a test kills its replica
    return make_checkpoint(tmp_path_factory.mktemp("tiny-2k"), "llama", max_position_embeddings=2048)


def test_tally_serve_ray_answers_then_stops_cleanly_on_sigterm(checkpoint):
    # before the module's cluster exists: the command starts a local Ray cluster of its own
    with ServerProcess(["--model", str(checkpoint), "--served-model-name", "tiny", *CLI.split(), "--ray",
                        "--replicas", "1"]) as server:
        answer = client(server.url).completions.create(model="tiny", prompt="hello", max_tokens=4)
        assert answer.usage.completion_tokens == 4
    assert server.proc.returncode == 0


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    # Replicas and handles report load every half second instead of every ten, so autoscaling reacts in a test.
    monkeypatch_module.setenv("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
    monkeypatch_module.setenv("RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "0.5")
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=NEVER_S)


def chat(url: str, user: str, system: str | None = None, max_tokens: int = 8, **extra):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    raw = client(url).chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra)
    return raw.headers["tally-replica"].rsplit("#", 1)[1], raw.parse()


def replica_gauges(url: str, name: str = "tally:num_requests_running") -> dict[str, float]:
    """replica id -> the gauge's value, from the one /metrics the ingress merges."""
    text = httpx.get(url + "/metrics", timeout=30).text
    samples = [s for f in text_string_to_metric_families(text) if f.name == name for s in f.samples]
    return {s.labels["replica"]: s.value for s in samples}


def replica_states(app: str) -> dict[str, int]:
    status = serve.status().applications.get(app)
    return {} if status is None else dict(status.deployments["LLMServer"].replica_states)


@pytest.fixture(scope="class")
def url(cluster, checkpoint):
    """Two replicas for the tests of one class; deleted after them, so the autoscaling test has the CPUs."""
    app = build_app({"cli": f"--model {checkpoint} --served-model-name tiny {CLI} --replicas 2",
                     "affinity_chars": AFFINITY_CHARS})
    serve.run(app, name="tally-test", route_prefix="/")
    yield cluster
    serve.delete("tally-test")


class TestTwoReplicas:
    def test_requests_spread_over_both_replicas(self, url):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: chat(url, f"Count to {i}", max_tokens=32, ignore_eos=True), range(8)))
        assert len({replica for replica, _ in answers}) == 2
        assert all(a.usage.completion_tokens == 32 for _, a in answers)

    def test_streamed_answer_is_the_answer_and_arrives_in_pieces(self, url):
        # A stream sends the latest output when it gets to write (tally/engine/async_engine.py): on a loaded machine
        # a short answer from the tiny model can be ready whole by the first write, one piece. 128 tokens take long
        # enough that a write falls between them.
        _, whole = chat(url, "The quick brown fox", max_tokens=128, ignore_eos=True)
        stream = client(url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "The quick brown fox"}], max_tokens=128,
            temperature=0, stream=True, extra_body={"ignore_eos": True})
        pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        assert len(pieces) > 1 and "".join(pieces) == whole.choices[0].message.content

    def test_a_shared_long_prefix_keeps_one_replica_and_hits_its_cache(self, url):
        answers = [chat(url, f"Question {i}: what is a block?", system=SYSTEM) for i in range(6)]
        assert len({replica for replica, _ in answers}) == 1
        assert all(a.usage.prompt_tokens_details.cached_tokens > 0 for _, a in answers[1:])

    def test_metrics_of_every_replica_in_one_scrape(self, url):
        chat(url, "hello")
        assert len(replica_gauges(url)) == 2
        assert replica_gauges(url, "tally:request_success") != {}

    def test_metrics_refuse_a_host_outside_the_allow_list_as_the_replicas_do(self, url):
        rebound = {"Host": "rebound.example"}  # a page whose domain an attacker pointed at this loopback proxy
        metrics, models = (httpx.get(url + path, headers=rebound, timeout=30) for path in ("/metrics", "/v1/models"))
        assert (metrics.status_code, metrics.text) == (models.status_code, models.text) == (400, "Invalid host header")
        assert httpx.get(url + "/metrics", headers={"Host": "localhost"}, timeout=30).status_code == 200

    def test_a_killed_replica_is_replaced_and_no_unstarted_request_is_lost(self, url):
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            pending = [pool.submit(chat, url, f"Story {i}", max_tokens=1000, ignore_eos=True) for i in range(6)]
            running = poll(lambda: replica_gauges(url), lambda g: any(v > 0 for v in g.values()),
                           "a replica generating")
            victim = max(running, key=running.get)
            ray.kill(ray.get_actor(f"SERVE_REPLICA::tally-test#LLMServer#{victim}", namespace="serve"),
                     no_restart=True)
            answers = [f.result() for f in pending]  # non-streamed: none had sent a byte, so none may fail
        assert all(a.usage.completion_tokens == 1000 for _, a in answers)
        assert victim not in {replica for replica, _ in answers}
        poll(lambda: set(replica_gauges(url)), lambda ids: len(ids) == 2 and victim not in ids,
             "a new replica in place of the killed one")


@pytest.mark.exclusive  # a replica starts on the two CPUs while the autoscaler watches the load: none to share
@pytest.mark.filterwarnings("ignore:`look_back_period_s`:FutureWarning")  # a 1 s window keeps the test short
def test_autoscaling_follows_the_engines_queue_up_and_back_down(cluster, checkpoint):
    app = build_app({"cli": f"--model {checkpoint} --served-model-name tiny {CLI} --max-num-seqs 2 --autoscale 1:2",
                     "upscale_delay_s": 0.0, "downscale_delay_s": 2.0, "look_back_period_s": 1.0})
    serve.run(app, name="tally-auto", route_prefix="/")
    try:
        assert replica_states("tally-auto") == {"RUNNING": 1}
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                chat(cluster, "Keep going", max_tokens=64, ignore_eos=True)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            workers = [pool.submit(load) for _ in range(8)]
            poll(lambda: replica_states("tally-auto"), lambda s: s.get("RUNNING") == 2, "a second replica")
            stop.set()
            for w in workers:
                w.result()
        poll(lambda: replica_states("tally-auto"), lambda s: s == {"RUNNING": 1}, "the idle deployment back at one")
    finally:
        serve.delete("tally-auto")

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

import tally  # noqa: F401  before torch, as a user's process: it sets OpenMP's waiting policy (tally/__init__.py)
from support.tiny_models import ARCH_CONFIGS, make_checkpoint


@pytest.hookimpl(trylast=True)  # after the tmpdir plugin's own configure, which makes _tmp_path_factory
def pytest_configure(config):
    """Tally's cache (built kernels, path measurements: tally/platform.py:cache_dir) goes to the run's directory,
    not the user's ~/.cache: a path measured while two workers share two cores would be cached, and serve the user
    after the run, as the slow choice it measured.
    Set before collection, whose skip marks load the kernels; servers the tests start inherit it."""
    os.environ["XDG_CACHE_HOME"] = str(_run_dir(config) / "xdg-cache")


def _run_dir(config: pytest.Config) -> Path:
    """The run's directory: pytest's base temporary directory, or under pytest-xdist the one holding its workers'."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


# The files that take longest under `make test`, longest first (measured on the 2-core machine): the Makefile runs
# pytest-xdist with --no-loadscope-reorder, so workers take files in collection order and none of these is left to
# run alone at the end (xdist's own order, most tests first, put one-test files of minutes last). test_family_gguf.py
# makes the family GGUFs that test_family_checkpoints.py and test_native_experts.py, later, find made
# (tests/support/run_shared.py): beside it, one of them would wait for its conversions instead of running tests.
SLOWEST_FILES = ("test_deploy_ray.py", "test_real_gemma3.py", "test_loader_gguf_builtin.py",
                 "test_pipeline_parallel.py",
                 "test_server_builtin.py", "test_pip_install_bench.py", "test_tensor_parallel_server.py",
                 "test_tensor_parallel.py", "test_ops_canary.py", "test_server_speculative.py",
                 "test_server_admission.py", "test_ops_route.py", "test_server_overload.py",
                 "test_server_vllm_habits.py", "test_family_gguf.py", "test_model_families.py",
                 "test_gguf_direct.py", "test_server_network.py", "test_soak_short.py", "test_ops_loop.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist (`make test`), a test marked `exclusive` runs with no other test beside it: its timing is
    what it checks (a soak's trends, Ray's autoscaler reacting while replicas start on two CPUs), and a neighbour
    worker taking a core would change it. A readers-writer lock over the workers' files: every test holds it
    shared, an exclusive one alone; the turnstile lets no new test start while an exclusive one waits, so it runs
    as soon as the running ones finish. The lock spans setup and teardown, where module fixtures start servers."""
    if not hasattr(item.config, "workerinput"):  # one process: nothing runs beside anything
        yield
        return
    shared = _run_dir(item.config)
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(shared / "exclusive.turnstile", "a") as turnstile, open(shared / "exclusive.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield


@pytest.fixture(scope="session")
def run_shared_dir(request) -> Path:
    """A directory every test file and xdist worker of the run shares: what several files build the same way is
    built there once (tests/support/run_shared.py)."""
    return _run_dir(request.config) / "shared"


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Returns a function arch -> checkpoint dir; each arch is built once per session."""
    cache: dict[str, Path] = {}

    def build(arch: str = "llama") -> Path:
        if arch not in cache:
            cache[arch] = make_checkpoint(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return cache[arch]

    return build


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")


@pytest.fixture(params=sorted(ARCH_CONFIGS))
def tiny_any_arch(request, tiny_model_factory) -> Path:
    return tiny_model_factory(request.param)


@pytest.fixture(scope="session")
def builtin_hf_reference():
    """transformers' tokenizer and fp32 model of the built-in GGUF, the oracle of the tests that read it, from one
    read of the file: its GGUF loader dequantizes in Python (~25 s on a 2-core machine), so they load once a session.
    Tests must not change them."""
    import torch
    import transformers
    from support.gguf_read_once import one_gguf_read

    from tally.models.registry import resolve_model

    path = Path(resolve_model(None).path)
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    with one_gguf_read(path):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs).eval()
    return tokenizer, model


@pytest.fixture(scope="session")
def calib_file(tmp_path_factory):
    """A small chat calibration set with a system prompt (tally quantize's calibrated methods)."""
    import json

    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    lines = [{"messages": [{"role": "system", "content": "Answer briefly."},
                           {"role": "user", "content": f"Tell me about fox number {i} and the lazy dog."}]}
             for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.fixture
def torch_kernels(monkeypatch):
    """TALLY_NATIVE=0 for one test: quantized layers on PyTorch's kernels, which compute with the stored weights
    exactly (the native ones quantize activations to int8; tests/test_native_kernels.py covers them)."""
    from tally.native.library import load

    monkeypatch.setenv("TALLY_NATIVE", "0")
    load.cache_clear()
    yield
    monkeypatch.undo()
    load.cache_clear()


@pytest.fixture
def terminal(monkeypatch, capsys):
    """stderr as a terminal, so progress shows as bars: capsys's stream (pytest swaps the streams between setup
    and the test, hence the class)."""
    import sys

    monkeypatch.setattr(type(sys.stderr), "isatty", lambda _: True)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "120")

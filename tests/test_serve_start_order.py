"""`tally serve` binds its port before it loads the model: a port already in use fails at once, naming the port and
what to do, with nothing loaded; a free port is served as before, its address logged once the server is up."""
from __future__ import annotations

import socket
import subprocess
import sys

from tally.server.process import ServerProcess

TINY_FLAGS = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB"]


def test_a_busy_port_fails_before_the_model_loads(tiny_llama):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "tally.cli", "serve", "--model", str(tiny_llama), *TINY_FLAGS,
                               "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"tally serve: port {port} is already in use on 127.0.0.1" in done.stderr and "--port" in done.stderr
    assert "Loading" not in done.stderr and "Traceback" not in done.stderr  # refused before the weights were read


def test_a_free_port_is_served_and_its_address_logged(tiny_llama):
    with ServerProcess(["--model", str(tiny_llama), *TINY_FLAGS, "--log-level", "info"]) as server:
        log = server.log()
    assert f"Uvicorn running on http://127.0.0.1:{server.port}" in log
    assert log.index("Loading safetensors tensors") < log.index("Uvicorn running on")

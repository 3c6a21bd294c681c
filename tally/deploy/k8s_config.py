"""What `tally deploy k8s` is asked for, validated once: the model, how many replicas, and each pod's shape."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tally.deploy.k8s_canary import CanaryRollout
from tally.deploy.k8s_pools import LONG, MAIN, LengthPools
from tally.errors import ConfigError
from tally.flags import DTYPES, ENGINE_KV_CACHE_DTYPES
from tally.metric_names import METRICS_PREFIXES
from tally.models.registry import DEFAULT_MODEL
from tally.units import GiB
from tally.version import __version__

SIZED_DTYPES = tuple(d for d in DTYPES if d != "auto")  # auto is None here, sized as k8s_sizing.py says

# Service names are DNS-1035 labels; the other objects take the same name, and namespaces DNS-1123 labels.
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# With a canary, the deployment's parts take NAME-suffix names: the stable pods' Service, the canary's objects and the
# router's; the entry Service keeps NAME.
STABLE, CANARY, ROUTE = "stable", "canary", "route"


@dataclass(frozen=True)
class K8sConfig:
    model: str = DEFAULT_MODEL  # the built-in alias (in the image), or a checkpoint / .gguf / preset on model_pvc
    replicas: int = 1  # the Deployment's replicas and the autoscaler's floor
    max_replicas: int | None = None  # the autoscaler's ceiling; None: twice replicas
    name: str = "tally"
    namespace: str | None = None  # None: whatever `kubectl apply` is pointed at
    image: str = f"tally:{__version__}"
    max_model_len: int | None = None  # None: the model's context, as tally serve
    concurrency: int = 8  # requests of max_model_len tokens the KV pool holds at once; shorter ones share it
    max_num_seqs: int | None = None  # None: tally serve's default
    dtype: str | None = None  # None: what --dtype auto serves on any AVX2 CPU (k8s_sizing.py)
    kv_cache_dtype: str = "auto"
    cpus: int = 2  # whole CPUs: requests = limits, so a static CPU manager can pin them
    reserve_bytes: int = GiB  # Python, torch, the server, activations: 0.6-0.7 GiB on the built-in model
    swap_space_gib: float | None = None  # tally serve --swap-space; None: the KV pool's size, at most serve's default
    model_pvc: str | None = None  # a PersistentVolumeClaim holding checkpoints, mounted at /models
    metrics_prefix: str = "tally"
    target_waiting: float = 2.0  # requests waiting per pod above which the autoscaler adds one
    startup_timeout_s: int = 600  # loading the model (from a volume, perhaps) before liveness applies
    drain_timeout_s: int = 30  # tally serve --drain-timeout: running requests finish after SIGTERM
    api_key_secret: str | None = None  # a Secret whose `api-key` becomes TALLY_API_KEY
    monitor_labels: tuple[tuple[str, str], ...] = ()  # labels the Prometheus Operator selects PodMonitors by
    serve_flags: tuple[str, ...] = ()  # tally serve flags after the ones written for the pod: the canary's
    canary: CanaryRollout | None = None  # a canary beside these pods, and the `tally route` router in front
    pools: LengthPools | None = None  # a main and a long pool (tally plan --out), and the router in front

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {self.replicas}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ConfigError(f"--max-replicas {self.max_replicas} is below --replicas {self.replicas}; the "
                              "autoscaler's ceiling must be at least its floor")
        if self.swap_space_gib is not None and not self.swap_space_gib >= 0:
            raise ConfigError(f"--swap-space must be ≥ 0 GiB, got {self.swap_space_gib}")
        for flag, value in (("--concurrency", self.concurrency), ("--cpus", self.cpus),
                            ("--max-num-seqs", self.max_num_seqs), ("--max-model-len", self.max_model_len),
                            ("--startup-timeout", self.startup_timeout_s)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        if self.reserve_bytes < 0 or self.drain_timeout_s < 0:
            raise ConfigError("--reserve and --drain-timeout cannot be negative")
        if not self.target_waiting > 0:
            raise ConfigError(f"--target-waiting must be above 0 requests per pod, got {self.target_waiting}")
        if self.dtype is not None and self.dtype not in SIZED_DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r}: choose {' or '.join(SIZED_DTYPES)}")
        if self.kv_cache_dtype not in ENGINE_KV_CACHE_DTYPES:
            raise ConfigError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: the pods' CPU engine stores one of "
                              f"{', '.join(ENGINE_KV_CACHE_DTYPES)}")
        if self.metrics_prefix not in METRICS_PREFIXES:
            raise ConfigError(f"--metrics-prefix {self.metrics_prefix!r}: choose {' or '.join(METRICS_PREFIXES)}")
        _check(_DNS_1035, "--name", self.name, 63)
        _check(_DNS_1123, "--namespace", self.namespace, 63)
        _check(_SUBDOMAIN, "--model-pvc", self.model_pvc, 253)
        _check(_SUBDOMAIN, "--api-key-secret", self.api_key_secret, 253)
        if self.canary is not None:
            self._check_canary(self.canary)
        if self.pools is not None:
            self._check_pools()

    def _check_pools(self) -> None:
        if self.canary is not None:
            raise ConfigError("--plan (length pools) and --canary are not written together yet: deploy the pools, "
                              "then run a canary in one pool with tally route --canary-pool")
        if self.max_model_len is not None:
            raise ConfigError("--max-model-len comes from --plan with length pools: each pool has its own")
        if max(len(f"{self.name}-{part}") for part in (MAIN, LONG, ROUTE)) > 63:
            raise ConfigError(f"--name {self.name!r} is too long for length pools: its parts are named NAME-{MAIN}, "
                              f"NAME-{LONG} and NAME-{ROUTE}, at most 63 characters each")

    def _check_canary(self, canary: CanaryRollout) -> None:
        if max(len(f"{self.name}-{part}") for part in (STABLE, CANARY, ROUTE)) > 63:
            raise ConfigError(f"--name {self.name!r} is too long for a canary: its parts are named NAME-{STABLE}, "
                              f"NAME-{CANARY} and NAME-{ROUTE}, at most 63 characters each")
        if not canary.serve_flags and canary.image in (None, self.image):
            raise ConfigError("the canary would run what the stable pods run: give it other tally serve flags "
                              "(--canary '--max-num-seqs 32') or another image (--canary-image)")
        if canary.replicas > self.hpa_max_replicas:
            raise ConfigError(f"--canary-replicas {canary.replicas} is above the autoscaler's ceiling "
                              f"({self.hpa_max_replicas}, --max-replicas), which the canary's autoscaler shares")

    @property
    def hpa_max_replicas(self) -> int:
        return self.max_replicas if self.max_replicas is not None else 2 * self.replicas

    def part(self, suffix: str, **changes: object) -> K8sConfig:
        """The same deployment's other part (the canary's pods, the router): its objects named NAME-suffix."""
        return replace(self, name=f"{self.name}-{suffix}", canary=None, pools=None, **changes)


def _check(pattern: re.Pattern, flag: str, value: str | None, max_len: int) -> None:
    if value is not None and not (pattern.fullmatch(value) and len(value) <= max_len):
        raise ConfigError(f"{flag} {value!r} is not a Kubernetes name: lowercase letters, digits and '-', "
                          f"starting with a letter or digit (a letter for --name), at most {max_len} characters")

"""Mirrors ModelBuilder of src/neuronx_distributed/trace/model_builder.py (aws-neuron/
neuronx-distributed, tag v2.28.0 = NxD 0.17), the builder NxD Inference's
application_base.py uses, on CPU.

What is faithful, because a serving backend depends on it:
- `ModelBuilder(router, tp_degree, checkpoint_loader, start_rank_id=0, pp_degree=1,
  ep_degree=1, local_ranks_size=None, world_size=None, compiler_workdir=None, ...)`: the
  real keywords; it asserts torch-neuronx 2.x; `world_size` without `local_ranks_size`
  raises ValueError; the work dir defaults to /tmp/nxd_model/.
- `trace()` first **rmtree's the compiler work dir** (model_builder.py `trace`: "Clean
  compiler working dir"), then writes per model key and bucket
  `<workdir>/<key>/_tp0_bk<rank>/` (the HLO, then the NEFF and metaneff.pb). Two compiles
  with one work dir on one host therefore destroy each other's files; the real one then
  fails somewhere in the compiler or while writing the NEFF. The fake checks that its own
  files are still there (and still its own) before it "compiles" each bucket and at the
  end, and raises RuntimeError when they vanished. NxD's docstring asks to run trace in a
  separate process.
- `shard_checkpoint(serialize_path)` loads the checkpoint through `checkpoint_loader()` and
  writes `tp{rank}_sharded_checkpoint.safetensors` for rank in
  range(start_rank_id, start_rank_id + local_ranks_size).

- The persistent compile cache (model_builder.py `trace`, at the SDK 2.27-2.29 tags): each
  bucket's compiler flags get `--logfile=<absolute path of <workdir>/<key>/_tp0_bk<rank>/
  log-neuron-cc.txt>` appended (unless the flags name one) and ` --enable-internal-neff-wrapper`,
  and the cache key is `get_hash_module`: sha256 of the HLO's text plus the flags without
  spaces, first 20 hex digits. libneuronxla looks the key up in the persistent cache
  (`--cache_dir=` in NEURON_CC_FLAGS, else NEURON_COMPILE_CACHE_URL, else
  /var/tmp/neuron-compile-cache) and compiles only on a miss. So the work dir's absolute path
  is part of every key: a compile in a new scratch folder never hits. The fake's "HLO text" is
  what its trace wrote for the bucket (model key, bucket rank, input shapes, tp_degree, the model
  instance's class); each bucket is logged as a `neff` call with
  `cache` "hit" or "miss" in $FAKE_NEURONX_CALL_LOG.

Inventions of the fake (tests only): `FAKE_NXD_COMPILE_DELAY_S` (default 0) sleeps between
writing the HLOs and compiling them, so a test can run a second compile into the window;
the shard layout is the fake's own (every tensor cut along dim 0 into tp_degree pieces with
torch.tensor_split; `unshard_checkpoint` joins them), not NxD's per-layer partitioning; the
"model instance" added with `add()` only needs `load_module()` and `get(bucket_rank)` ->
(function, aliases), and tracing calls that function on each bucket's example inputs (so
the model's trace-time assertions fire, as in the real HLO generation); `trace()` returns a
plain dict of the programs (key -> list of {"bucket_rank", "input_shapes",
"compiler_args"}) instead of a TorchScript NxDModel.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch_neuronx
from safetensors.torch import save_file

logger = logging.getLogger("Neuron")

GRAPH_HLO_FILE = "graph.hlo"
NEFF_FILE = "model.neff"
LOG_FILE_DEFAULT_NAME = "log-neuron-cc.txt"


class ModelBuilder:
    def __init__(
        self,
        router: Any,
        tp_degree: int,
        checkpoint_loader: Callable[[], dict[str, torch.Tensor]],
        start_rank_id: int = 0,
        pp_degree: int = 1,
        ep_degree: int = 1,
        local_ranks_size: int | None = None,
        world_size: int | None = None,
        compiler_workdir: str | os.PathLike[str] | None = None,
        master_proc_env_vars: dict[str, str] | None = None,
        debug: bool = False,
        num_cores_per_group: int = 1,
        init_custom_process_group_fn: Callable[[], None] | None = None,
        logical_nc_config: int = 1,
        weights_to_skip_layout_optimization: Any = frozenset(),
        compiler_flag_hook: Callable[..., str] | None = None,
    ) -> None:
        if not torch_neuronx.__version__.startswith("2"):
            raise AssertionError(
                f"ModelBuilder requires torch-neuronx>=2.* but found torch-neuronx=={torch_neuronx.__version__}."
            )
        if world_size is None:
            world_size = tp_degree * pp_degree * ep_degree
        elif local_ranks_size is None:
            raise ValueError(
                "`world_size` is specified, but `local_ranks_size` is None. Cannot determine local_ranks_size."
            )
        if local_ranks_size is None:
            local_ranks_size = world_size
        self.router = router
        self.tp_degree = tp_degree
        self.pp_degree = pp_degree
        self.ep_degree = ep_degree
        self.world_size = world_size
        self.start_rank_id = start_rank_id
        self.local_ranks_size = local_ranks_size
        self.checkpoint_loader = checkpoint_loader
        self.compiler_workdir = str(compiler_workdir) if compiler_workdir else "/tmp/nxd_model/"
        self.model_collection: dict[str, dict[str, Any]] = {}
        self.master_proc_env_vars = master_proc_env_vars
        self.debug = debug
        self.num_cores_per_group = num_cores_per_group
        self.init_custom_process_group_fn = init_custom_process_group_fn
        self.logical_nc_config = logical_nc_config
        self.weights_to_skip_layout_optimization = weights_to_skip_layout_optimization
        self.compiler_flag_hook = compiler_flag_hook

    def add(
        self,
        key: str,
        model_instance: Any,
        example_inputs: list[tuple[torch.Tensor, ...]],
        compiler_args: str | None = None,
        bucket_config: Any = None,
        priority_model_idx: int | None = None,
    ) -> ModelBuilder:
        self.model_collection[key] = {
            "model_instance": model_instance,
            "example_inputs": example_inputs,
            "compiler_args": compiler_args or "",
            "priority_model_idx": priority_model_idx,
        }
        return self

    # -- tracing and compiling ------------------------------------------------------
    def trace(self, initialize_model_weights: bool = True, dry_run: bool = False) -> dict[str, list[dict[str, Any]]]:
        if self.master_proc_env_vars:
            os.environ.update(self.master_proc_env_vars)
        # Clean compiler working dir (the real one does exactly this, unconditionally)
        if os.path.exists(self.compiler_workdir):
            shutil.rmtree(self.compiler_workdir)
        token = f"{os.getpid()}-{uuid.uuid4().hex}"
        written: list[str] = []
        cache_keys: dict[str, str] = {}
        programs: dict[str, list[dict[str, Any]]] = {}
        for key, container in self.model_collection.items():
            programs[key] = []
            instance = container["model_instance"]
            if hasattr(instance, "load_module"):
                instance.load_module()
            for bucket_rank, example in enumerate(container["example_inputs"]):
                if hasattr(instance, "get"):  # generating the HLO runs the model on the example inputs
                    func, _ = instance.get(bucket_rank)
                    func(*example)
                output_dir = os.path.join(self.compiler_workdir, key, f"_tp0_bk{bucket_rank}")
                os.makedirs(os.path.join(output_dir, "model"), exist_ok=True)
                shapes = [list(tensor.shape) for tensor in example]
                hlo = os.path.join(output_dir, "model", GRAPH_HLO_FILE)
                module = {
                    "key": key,
                    "bucket_rank": bucket_rank,
                    "shapes": shapes,
                    "tp_degree": self.tp_degree,
                    "model": type(instance).__name__,
                }
                with open(hlo, "w", encoding="utf-8") as handle:
                    json.dump({"owner": token, "module": module}, handle)
                written.append(hlo)
                cache_keys[hlo] = get_hash_module(
                    json.dumps(module, sort_keys=True), bucket_flags(container["compiler_args"], output_dir)
                )
                programs[key].append(
                    {"bucket_rank": bucket_rank, "input_shapes": shapes, "compiler_args": container["compiler_args"]}
                )
        if dry_run:
            return programs
        delay = float(os.environ.get("FAKE_NXD_COMPILE_DELAY_S", "0") or 0)
        if delay > 0:
            time.sleep(delay)
        cache = persistent_cache_dir()
        for hlo in written:
            self._check_owned(hlo, token)
            output_dir = os.path.dirname(os.path.dirname(hlo))
            cached = os.path.join(cache, f"MODULE_{cache_keys[hlo]}", NEFF_FILE)
            hit = os.path.isfile(cached)
            _record("neff", key=cache_keys[hlo], cache="hit" if hit else "miss", workdir=self.compiler_workdir)
            if not hit:
                with open(os.path.join(output_dir, LOG_FILE_DEFAULT_NAME), "w", encoding="utf-8") as handle:
                    handle.write("fake neuronx-cc: compiled\n")
                os.makedirs(os.path.dirname(cached), exist_ok=True)
                with open(cached, "wb") as handle:
                    handle.write(b"FAKE-NEFF cached")
            with open(os.path.join(output_dir, NEFF_FILE), "wb") as handle:
                handle.write(b"FAKE-NEFF " + token.encode())
            with open(os.path.join(output_dir, "metaneff.pb"), "wb") as handle:
                handle.write(b"FAKE-METANEFF")
        for hlo in written:  # a compile that started meanwhile may have wiped the folder again
            self._check_owned(hlo, token)
            self._check_owned(os.path.join(os.path.dirname(os.path.dirname(hlo)), NEFF_FILE), token)
        if initialize_model_weights:
            self.shard_checkpoint(self.compiler_workdir)
        return programs

    def _check_owned(self, path: str, token: str) -> None:
        try:
            with open(path, "rb") as handle:
                content = handle.read()
        except FileNotFoundError:
            raise RuntimeError(
                f"fake neuronx-cc: {path} vanished during the compile: another trace() cleaned the compiler work dir "
                f"{self.compiler_workdir} (ModelBuilder.trace rmtree's it first; give each concurrent compile its own "
                "BASE_COMPILE_WORK_DIR)"
            ) from None
        if token.encode() not in content:
            raise RuntimeError(
                f"fake neuronx-cc: {path} was overwritten by another compile using the same compiler work dir "
                f"{self.compiler_workdir} (give each concurrent compile its own BASE_COMPILE_WORK_DIR)"
            )

    # -- weights ----------------------------------------------------------------------
    def shard_checkpoint(self, serialize_path: str | os.PathLike[str] | None = None) -> list[dict[str, torch.Tensor]]:
        if serialize_path is not None and not os.path.exists(serialize_path):
            os.makedirs(serialize_path)
        checkpoint = self.checkpoint_loader()
        shards = []
        for rank in range(self.start_rank_id, self.start_rank_id + self.local_ranks_size):
            shard = shard_for_rank(checkpoint, rank, self.tp_degree)
            if serialize_path is not None:
                metadata = {"fake_nxd_rank": str(rank), "fake_nxd_tp_degree": str(self.tp_degree)}
                save_file(shard, os.path.join(serialize_path, f"tp{rank}_sharded_checkpoint.safetensors"), metadata)
            shards.append(shard)
        return shards


def bucket_flags(compiler_args: str, output_dir: str) -> str:
    """The flags one bucket is compiled with: the model's, its log file's absolute path, the NEFF wrapper."""
    flags = compiler_args
    if "--logfile" not in flags:
        flags += f" --logfile={Path(os.path.join(output_dir, LOG_FILE_DEFAULT_NAME)).absolute()}"
    return flags + " --enable-internal-neff-wrapper"


def get_hash_module(hlo_text: str, flags: str | None) -> str:
    """model_builder.py get_hash_module: sha256 of the HLO text and the flags without spaces."""
    text = hlo_text + (flags.replace(" ", "") if flags is not None else "")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def persistent_cache_dir() -> str:
    """Where libneuronxla keeps compiled NEFFs: --cache_dir in NEURON_CC_FLAGS, else
    NEURON_COMPILE_CACHE_URL, else /var/tmp/neuron-compile-cache."""
    for flag in shlex.split(os.environ.get("NEURON_CC_FLAGS", "")):
        if flag.startswith("--cache_dir="):
            return flag.split("=", 1)[1]
    return os.environ.get("NEURON_COMPILE_CACHE_URL") or "/var/tmp/neuron-compile-cache"


def _record(call: str, **fields: Any) -> None:
    """A line in $FAKE_NEURONX_CALL_LOG, as the NxDI fake's call log writes them ("fake": "nxd")."""
    path = os.environ.get("FAKE_NEURONX_CALL_LOG")
    if path:
        line = json.dumps({"call": call, "fake": "nxd", "pid": os.getpid(), **fields}, default=str, sort_keys=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


def shard_for_rank(checkpoint: dict[str, torch.Tensor], rank: int, tp_degree: int) -> dict[str, torch.Tensor]:
    """The fake's layout: every tensor cut along dim 0 into tp_degree pieces (empty pieces kept)."""
    piece = rank % tp_degree
    return {
        name: torch.tensor_split(tensor, tp_degree, dim=0)[piece].contiguous() if tensor.dim() else tensor.clone()
        for name, tensor in checkpoint.items()
    }


def unshard_checkpoint(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Joins the pieces of every rank 0..tp_degree-1 back (the inverse of shard_for_rank)."""
    joined = {}
    for name, first in shards[0].items():
        joined[name] = first if first.dim() == 0 else torch.cat([shard[name] for shard in shards], dim=0)
    return joined

"""How much of a NeuronCore's memory a model layout takes, from the checkpoint's config.json
alone (no weights, no SDK): the weights' share of one core, the KV cache's, and a runtime
reserve, against the 16 GiB of HBM each Inferentia2 NeuronCore has. A device backend checks
its configured layout with it before it loads or compiles anything, and the planner
(scripts/plan/) drops layouts that do not fit.

The rules, and where each comes from (transformers-neuronx 0.13, the last release, Dec 2024
sync of github.com/aws-neuron/transformers-neuronx; NxD Inference from
github.com/aws-neuron/neuronx-distributed-inference):

- Q heads are padded to a multiple of tp_degree: `utils.get_qkv_padding` ->
  `round_up_to_divisor(n_head, tp_degree)` (transformers-neuronx); `get_shardable_head_counts`
  -> `get_number_of_extra_heads` (NxDI, neuronx_distributed/parallel_layers/pad.py). So
  Llama-2-7B's 32 heads become 48 at tp_degree 24 (2 per core).
- K/V heads (`padded_kv_heads`):
  - MHA (kv heads = heads): padded like the Q heads (decoder.py `to_neuron`: K and V go through
    the same `qkv_maybe_pad`; NxDI: `updated_num_key_value_heads = updated_num_attention_heads`).
  - GQA, transformers-neuronx: `DecoderLmHeadForSamplingNoEmbedding.check_gqa_fallback` keeps
    shard-over-heads (the default) only when tp_degree divides the kv heads, else switches to
    replicated-heads, where `get_qkv_padding` replicates the kv heads to tp_degree when
    tp_degree is a multiple of them (Llama-3.1-8B at tp 24: 8 -> 24, one per core), and
    otherwise up to the padded Q heads (8 kv heads at tp 12: -> 36, three per core).
    shard-over-batch and all-gather-heads keep the kv heads as they are, when their own
    conditions hold (else they fall back as the SDK does).
  - GQA, NxDI: `determine_sharding_strategy` + `get_shardable_head_counts`: replicate to
    tp_degree when tp_degree is a multiple of the kv heads, else convert to MHA (kv heads =
    padded Q heads). For the default strategies both SDKs agree on every Llama-family shape
    except some where neither rule replicates evenly.
- KV cache per core = 2 (K and V) x layers x kv heads per core x head_dim x n_slots x
  n_positions x the KV dtype's bytes. The cache holds round_up(padded kv heads, tp_degree)
  heads, split over the cores (decoder.py `init_caches`), one line per slot (continuous
  batching: `batch_size` = `max_num_seqs`) of `n_positions` positions; shard-over-batch
  splits the slots over the cores instead of the heads (same bytes per core).
- Weights per core = each matrix's bytes / tp_degree, with the padding above: q/o over the
  padded Q heads, k/v over the padded kv heads (replicated heads are real copies), the MLP's
  intermediate size padded to a multiple of tp_degree (`allow_pad=True` on gate/up/down in
  llama/model.py), the embedding and lm_head over the vocabulary padded to a multiple of
  tp_degree. The norms (2 per layer + the final one) are replicated on every core. A tied
  lm_head is still its own device tensor, and the embedding is counted on the device too
  (transformers-neuronx computes it on the CPU unless `on_device_embedding`; NxDI shards it):
  a slight over-estimate, never an under-estimate. Biases are ignored (Llama has none).
- int8 weights (transformers-neuronx `QuantizationConfig(quant_dtype="s8")`, which quantizes
  the decoder layers' attention and MLP matrices; NxDI `quantized`): those matrices take one
  byte per weight, the embedding, lm_head and norms stay 16-bit. Per-channel scales ignored.
- LoRA adapters (NxDI's multi-LoRA only, `Layout.lora`; modules/lora_serving/lora_module.py and
  lora_layer.py at the SDK 2.28 release, NxDI 0.8, with the defaults the nxdi backend keeps:
  `lora_memory_transpose` and `lora_shard_linear_layer` true). Every targeted projection gets a
  lora_A (rank x in) and a lora_B (out x rank) per adapter place, padded to max_lora_rank, in the
  base layer's dtype (the amp), for NxDI's `max_loras` places (`weight`: every configured adapter
  plus the backend's all-zero base adapter, or with dynamic multi-LoRA max_loras + 1; the rest
  stay in host memory), all split over the cores; plus one row per sequence slot (`weight_active`,
  `batch_size` = n_slots), written at each prefill, whose sharded-linear side is whole on every
  core: q, k, v, gate and up (column-parallel) hold lora_A whole and lora_B split, o and down (row-
  parallel) lora_A split and lora_B whole. Counted as if every adapter targets all 7 projections
  (the adapters' own targets are read after the check): never an under-estimate.
  One Llama-3.1-8B adapter at rank 16 over the 7 projections: 16 x (q 4096+4096, k and v
  4096+1024 each, o 4096+4096, gate and up 4096+14336 each, down 14336+4096 = 81,920) x 32 layers
  = 41.9 M parameters: 83.9 MB in bf16, 167.8 MB in f32. So the "about 170 MB per adapter" of the
  SDK 2.28 multi-LoRA guide matches these shapes in f32 (most likely the file PEFT saves from an
  f32 training run), twice what the device holds in bf16; at tp_degree 2 each core holds half
  (42 MB), and the slot rows add 4 slots x 16 x 55,296 x 32 x 2 bytes = 226 MB per core whatever
  the adapters.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.errors import ConfigError

GIB = 2**30
# 32 GiB of HBM per Inferentia2 chip, 2 NeuronCores per chip (AWS inf2 instance pages; shared/inf2-benchmarks.md).
HBM_PER_CORE_GIB = 16.0
# An assumption, not a published figure: what the Neuron runtime takes per core beside the
# weights and the KV cache. The runtime's device-memory guide (awsdocs-neuron, neuron-runtime/
# explore/device-memory) lists the categories: the "micro-code overhead of 96MB per physical
# Neuron Core" (documented), the compiled programs (one NEFF per prompt bucket and the decode
# kernel), the scratchpad for intermediate activations, DMA rings and collectives' buffers
# (all model- and bucket-dependent, not published). 1 GiB covers the 96 MB plus the rest for
# the bucket sizes this package compiles; a layout within 5 % of the limit is warned about.
RUNTIME_RESERVE_GIB = 1.0
NEAR_LIMIT = 0.05  # a layout whose total is within 5 % of the HBM gets a warning
# An assumption: host RAM to load and shard a checkpoint (transformers-neuronx loads the whole
# checkpoint on the CPU, then pads, casts and shards it layer by layer; NxDI without pre-sharded
# weights re-shards from the HF checkpoint at every load) = the checkpoint's bf16 bytes x 1.2:
# the checkpoint, the layer copies made while sharding and the Python process with torch. It
# puts Llama-3.1-8B at 17.9 GiB, above an inf2.xlarge's 16 GiB (where 8B loads are reported
# killed: shared/pitfalls.md, NxD Inference), and Llama-2-7B at 15.1 GiB, under it
# (optimum-neuron's published 7B runs on inf2.xlarge).
HOST_SHARD_FACTOR = 1.2
# tp_degree values the Neuron runtime's collectives support on Inferentia2: "1, 2, 4, 8, and 24
# on Inf2" (transformers-neuronx developer guide, "Tensor-parallelism support"), plus 12, all
# cores of an inf2.24xlarge, which the guide's list predates and which optimum-neuron's
# benchmarks use (NUM_CORES = 12 for Llama-2 on inf2.24xlarge). Trn1's 16 and 32 are not Inf2's.
INF2_TP_DEGREES = (1, 2, 4, 8, 12, 24)
DTYPE_BYTES = {"f32": 4, "fp32": 4, "bf16": 2, "fp16": 2, "f16": 2, "int8": 1, "s8": 1}
GQA_MODES = ("shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads")
SDKS = ("neuronx", "nxdi")


def _round_up(value: int, divisor: int) -> int:
    return math.ceil(value / divisor) * divisor


def _dtype_bytes(dtype: str, what: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"{what} {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a decoder-only (Llama/Mistral/Qwen2-style) config.json."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> ModelShape:
        """From a Hugging Face config.json's dict (a multimodal one's `text_config` if the top has no
        hidden_size). `head_dim` when the config gives one, else hidden_size // num_attention_heads."""
        if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
            config = config["text_config"]

        def need(key: str) -> int:
            value = config.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"config.json{f' of {name}' if name else ''}: {key} is {value!r}; the memory model needs it as a "
                    "positive integer (a Llama-style decoder config)"
                )
            return value

        experts = config.get("num_local_experts") or config.get("num_experts") or 0
        if isinstance(experts, int) and experts > 1:
            raise ConfigError(
                f"config.json{f' of {name}' if name else ''}: a mixture of {experts} experts; the memory model "
                "covers dense Llama-style decoders only"
            )
        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or hidden // heads
        return cls(
            name=name or str(config.get("_name_or_path") or "the model"),
            layers=need("num_hidden_layers"),
            hidden=hidden,
            heads=heads,
            kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            intermediate=need("intermediate_size"),
            vocab=need("vocab_size"),
            max_positions=int(config.get("max_position_embeddings") or 0),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_path(cls, path: str | Path) -> ModelShape:
        """From a checkpoint directory (its config.json) or a config file; named after the directory,
        or after the file when it is not called config.json (tests/fixtures/configs/llama-2-7b.json)."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        name = file.parent.name if file.name == "config.json" else file.stem
        try:
            config = json.loads(file.read_text())
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read the model's config.json ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise ConfigError(f"{file}: not valid JSON ({exc})") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{file}: expected a JSON object (a Hugging Face config.json)")
        return cls.from_config(config, name or file.stem)

    def parameters(self) -> int:
        """The checkpoint's parameter count: embeddings (+ lm_head unless tied), per layer q, k, v, o,
        the MLP's gate, up and down and 2 norms, and the final norm. No padding (that is the device's)."""
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return embeddings + self.layers * per_layer + self.hidden


@dataclass(frozen=True)
class LoraLayout:
    """NxD Inference's multi-LoRA as compiled (module docstring, LoRA): `device_adapters` adapter
    places in device memory (NxDI's max_loras, the all-zero base adapter included), each padded
    to `rank` (max_lora_rank)."""

    device_adapters: int
    rank: int

    def __post_init__(self) -> None:
        if self.device_adapters < 1 or self.rank < 1:
            raise ConfigError(f"memory layout: LoRA needs at least 1 adapter place and rank 1, got {self}")


@dataclass(frozen=True)
class Layout:
    """One model copy as compiled: `tp_degree` cores, `n_slots` KV lines of `n_positions`.
    `gqa`: transformers-neuronx's group_query_attention setting (None: the SDK's default);
    `sdk`: whose padding rules apply (neuronx: transformers-neuronx, nxdi: NxD Inference);
    `lora`: NxDI's LoRA adapters in device memory (None: none)."""

    tp_degree: int
    n_slots: int
    n_positions: int
    weight_dtype: str = "bf16"  # "bf16" | "fp16" | "int8" | "f32"
    kv_dtype: str = "bf16"  # the amp: the KV cache, LoRA weights and, under int8, the parameters left unquantized
    gqa: str | None = None
    sdk: str = "neuronx"
    lora: LoraLayout | None = None

    def __post_init__(self) -> None:
        for key in ("tp_degree", "n_slots", "n_positions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"memory layout: {key} must be at least 1, got {getattr(self, key)}")
        _dtype_bytes(self.weight_dtype, "memory layout: weight_dtype")
        _dtype_bytes(self.kv_dtype, "memory layout: kv_dtype")
        if self.gqa is not None and self.gqa not in GQA_MODES:
            raise ConfigError(f"memory layout: gqa {self.gqa!r}: expected one of {', '.join(GQA_MODES)}")
        if self.sdk not in SDKS:
            raise ConfigError(f"memory layout: sdk {self.sdk!r}: expected one of {', '.join(SDKS)}")
        if self.lora is not None and self.sdk != "nxdi":
            raise ConfigError("memory layout: LoRA adapters are NxD Inference's multi-LoRA (sdk nxdi)")


@dataclass(frozen=True)
class MemoryEstimate:
    """Per NeuronCore, in GiB."""

    weights_gib: float
    kv_gib: float
    reserve_gib: float
    hbm_gib: float
    padded_heads: int  # Q heads after the SDK's padding (all cores together)
    kv_heads_per_core: float  # after padding / GQA replication
    host_shard_gib: float  # host RAM to shard the checkpoint at load (bf16 checkpoint x HOST_SHARD_FACTOR)
    name: str = ""
    layout: Layout | None = None
    padded_kv_heads: int = 0  # K/V heads after the SDK's padding / replication (all cores together)
    lora_gib: float = 0.0  # LoRA adapters and their per-slot rows (Layout.lora)

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.lora_gib + self.reserve_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.hbm_gib

    @property
    def near_limit(self) -> bool:
        """Fits, but within NEAR_LIMIT (5 %) of the HBM: the reserve is an assumption."""
        return self.fits and self.total_gib > (1 - NEAR_LIMIT) * self.hbm_gib

    def explain(self) -> str:
        """`llama-2-70b bf16 at tp_degree 12, 8 slot(s) x 4096 positions: 12.6 GiB weights + 7.5 GiB KV +
        1.0 GiB reserve = 21.1 GiB per NeuronCore > 16 GiB HBM`."""
        layout = self.layout
        what = self.name or "the model"
        if layout is not None:
            what += (
                f" {layout.weight_dtype} at tp_degree {layout.tp_degree}, {layout.n_slots} slot(s) x "
                f"{layout.n_positions} positions"
            )
        relation = ">" if not self.fits else "<="
        lora = f" + {self.lora_gib:.1f} GiB LoRA" if self.lora_gib else ""
        return (
            f"{what}: {self.weights_gib:.1f} GiB weights + {self.kv_gib:.1f} GiB KV{lora} + {self.reserve_gib:.1f} "
            f"GiB reserve = {self.total_gib:.1f} GiB per NeuronCore {relation} {self.hbm_gib:g} GiB HBM"
        )


def padded_head_counts(shape: ModelShape, layout: Layout) -> tuple[int, int, float]:
    """(Q heads, K/V heads) after the SDK's padding / replication at this tp_degree, all cores
    together, and the K/V heads whose cache one core holds (module docstring)."""
    tp, heads, kv = layout.tp_degree, shape.heads, shape.kv_heads
    q = _round_up(heads, tp)
    if heads == kv:
        return q, q, q / tp
    if layout.sdk == "nxdi":
        if kv < tp or kv % tp:
            kv_padded = tp if tp % kv == 0 else q  # REPLICATE_TO_TP_DEGREE, else CONVERT_TO_MHA
        else:
            kv_padded = kv
        return q, kv_padded, kv_padded / tp
    mode = _neuronx_gqa(layout.gqa, heads, kv, shape.head_dim, tp, layout.n_slots)
    if mode == "shard-over-batch":  # every kv head on every core, for n_slots / tp of the slots
        return q, kv, kv / tp
    kv_padded = _replicated_kv_heads(heads, kv, tp, q) if mode == "replicated-heads" else kv
    return q, kv_padded, _round_up(kv_padded, tp) / tp  # init_caches: the cache's heads rounded up to tp


def _neuronx_gqa(gqa: str | None, heads: int, kv: int, head_dim: int, tp: int, n_slots: int) -> str:
    """transformers-neuronx's check_gqa_fallback: the GQA sharding it really uses."""
    mode = gqa or "shard-over-heads"
    if mode == "replicated-heads":
        return mode
    if mode == "shard-over-batch":
        if n_slots % tp == 0:
            return mode
    elif mode == "all-gather-heads" and (kv * head_dim) % tp == 0:
        if heads % tp == 0 or (_round_up(heads, tp) - heads) % kv == 0:
            return mode
    return "replicated-heads" if kv % tp else "shard-over-heads"


def _replicated_kv_heads(heads: int, kv: int, tp: int, q_padded: int) -> int:
    """transformers-neuronx utils.get_qkv_padding under replicated-heads."""
    ratio = heads // kv  # full replication: as many kv heads as Q heads
    extra = q_padded - heads
    if kv < tp and tp % kv == 0 and (heads % tp == 0 or (extra % kv == 0 and extra > 0)):
        ratio = tp // kv  # partial replication: one kv head per core
    elif q_padded / tp == heads / kv:
        ratio = 1
    padded = max(kv * ratio, tp)
    return q_padded if padded == heads else padded


@dataclass(frozen=True)
class CoreShare:
    """One NeuronCore's share of the parameters at a layout's tp_degree, with the SDK's padding
    (what the memory estimate stores and the step-time model reads)."""

    layer_matrices: float  # q, k, v, o, gate, up and down of every layer
    vocab_table: float  # one vocabulary table: the lm_head (and, as large, the embedding)
    norms: float  # replicated on every core
    q_heads: int  # after padding, all cores together
    kv_heads: int  # after padding / GQA replication, all cores together
    kv_per_core: float


def core_share(shape: ModelShape, layout: Layout) -> CoreShare:
    tp = layout.tp_degree
    q_heads, kv_heads, kv_per_core = padded_head_counts(shape, layout)
    hidden = shape.hidden
    attention = hidden * shape.head_dim * (2 * q_heads + 2 * kv_heads) / tp  # q, o; k, v
    mlp = 3 * hidden * _round_up(shape.intermediate, tp) / tp  # intermediate padded to a multiple of tp
    return CoreShare(
        layer_matrices=shape.layers * (attention + mlp),
        vocab_table=_round_up(shape.vocab, tp) * hidden / tp,
        norms=(2 * shape.layers + 1) * hidden,
        q_heads=q_heads,
        kv_heads=kv_heads,
        kv_per_core=kv_per_core,
    )


def lora_core_elements(shape: ModelShape, layout: Layout, share: CoreShare) -> float:
    """One NeuronCore's LoRA weights (module docstring, LoRA): the adapter places, every side split
    over the cores, and one row per slot, the sharded-linear side whole."""
    lora, tp = layout.lora, layout.tp_degree
    if lora is None:
        return 0.0
    hidden, q, kv = shape.hidden, share.q_heads * shape.head_dim, share.kv_heads * shape.head_dim
    intermediate = _round_up(shape.intermediate, tp)
    column = [(hidden, q), (hidden, kv), (hidden, kv), (hidden, intermediate), (hidden, intermediate)]
    row = [(q, hidden), (intermediate, hidden)]  # o, down: (in, out)
    place = sum(n_in + n_out for n_in, n_out in column + row) / tp
    slot_row = sum(n_in + n_out / tp for n_in, n_out in column) + sum(n_in / tp + n_out for n_in, n_out in row)
    return shape.layers * lora.rank * (lora.device_adapters * place + layout.n_slots * slot_row)


def estimate(shape: ModelShape, layout: Layout, hbm_gib: float = HBM_PER_CORE_GIB) -> MemoryEstimate:
    share = core_share(shape, layout)
    matrix_bytes = _dtype_bytes(layout.weight_dtype, "weight_dtype")
    other_bytes = unquantized_bytes(layout.weight_dtype, layout.kv_dtype)
    weights = share.layer_matrices * matrix_bytes + (2 * share.vocab_table + share.norms) * other_bytes
    kv_bytes = _dtype_bytes(layout.kv_dtype, "kv_dtype")
    kv_cache = 2 * shape.layers * share.kv_per_core * shape.head_dim * layout.n_slots * layout.n_positions * kv_bytes
    return MemoryEstimate(
        weights_gib=weights / GIB,
        kv_gib=kv_cache / GIB,
        reserve_gib=RUNTIME_RESERVE_GIB,
        hbm_gib=hbm_gib,
        padded_heads=share.q_heads,
        kv_heads_per_core=share.kv_per_core,
        host_shard_gib=host_shard_gib(shape),
        name=shape.name,
        layout=layout,
        padded_kv_heads=share.kv_heads,
        lora_gib=lora_core_elements(shape, layout, share) * kv_bytes / GIB,
    )


def unquantized_bytes(weight_dtype: str, amp_dtype: str) -> int:
    """Bytes per parameter of the embedding, lm_head and norms: int8 quantizes the layers'
    matrices only, and the rest stays in the amp dtype."""
    dtype = amp_dtype if weight_dtype == "int8" else weight_dtype
    return _dtype_bytes(dtype, "weight_dtype")


def host_shard_gib(shape: ModelShape) -> float:
    """Host RAM to load and shard the checkpoint (bf16) on the host: HOST_SHARD_FACTOR x its bytes."""
    return shape.parameters() * 2 * HOST_SHARD_FACTOR / GIB


def valid_tp_degrees(cores: int, degrees: Sequence[int] = INF2_TP_DEGREES) -> list[int]:
    """The tp_degree values the SDKs accept on `cores` NeuronCores: the runtime's supported
    degrees (INF2_TP_DEGREES) that fit in the cores. Both SDKs pad the Q heads and replicate or
    pad the K/V heads, the MLP and the vocabulary (module docstring), so a Llama-family shape
    adds no constraint of its own."""
    return [tp for tp in degrees if tp <= cores]


def fit_problem(
    shape: ModelShape,
    layout: Layout,
    hbm_gib: float = HBM_PER_CORE_GIB,
    degrees: Sequence[int] = INF2_TP_DEGREES,
) -> str | None:
    """None if the layout fits; else what it takes against the HBM and what would fit (fit_advice)."""
    found = estimate(shape, layout, hbm_gib)
    if found.fits:
        return None
    return f"{found.explain()}; {fit_advice(shape, layout, hbm_gib, degrees)}"


def fit_advice(
    shape: ModelShape,
    layout: Layout,
    hbm_gib: float = HBM_PER_CORE_GIB,
    degrees: Sequence[int] = INF2_TP_DEGREES,
) -> str:
    """What would fit instead of a layout that does not: the smallest larger tp_degree (of
    `degrees`), the most slots at this tp_degree, else the most positions for one slot, and int8
    weights when they alone would make it fit."""
    options = []
    larger = [tp for tp in degrees if tp > layout.tp_degree]
    tp = next((tp for tp in larger if _fits(shape, layout, hbm_gib, tp_degree=tp)), None)
    if tp is not None:
        options.append(f"tp_degree {tp}")
    slots = next((n for n in range(layout.n_slots - 1, 0, -1) if _fits(shape, layout, hbm_gib, n_slots=n)), None)
    if slots is not None:
        options.append(f"n_slots {slots}")
    else:
        positions = _most_positions(shape, layout, hbm_gib)
        if positions:
            options.append(f"n_positions {positions} with n_slots 1")
    if layout.weight_dtype != "int8" and _fits(shape, layout, hbm_gib, weight_dtype="int8"):
        options.append("int8 weights")
    if options:
        return "try " + " or ".join(options)
    return f"no tp_degree up to {max(degrees)} holds it with these slots and positions; use a larger instance"


def _fits(shape: ModelShape, layout: Layout, hbm_gib: float, **change: Any) -> bool:
    return estimate(shape, dataclasses.replace(layout, **change), hbm_gib).fits


def _most_positions(shape: ModelShape, layout: Layout, hbm_gib: float, step: int = 128) -> int | None:
    """The most positions (a multiple of `step`, fewer than the layout's) one slot can have, or None."""
    one = estimate(shape, dataclasses.replace(layout, n_slots=1, n_positions=step), hbm_gib)
    if not one.fits:
        return None
    steps = int((hbm_gib - one.weights_gib - one.lora_gib - one.reserve_gib) / one.kv_gib)  # KV: linear in them
    positions = min(steps * step, (layout.n_positions - 1) // step * step)
    while positions >= step and not _fits(shape, layout, hbm_gib, n_slots=1, n_positions=positions):
        positions -= step  # float rounding at the edge
    return positions if positions >= step else None

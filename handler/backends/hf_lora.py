"""LoRA adapters on the `hf` backend, with PEFT (issue 43): many adapters on one base model, rows of
different adapters and base rows in one forward, nothing merged into the base weights.

The first adapter wraps the model once (`PeftModel.from_pretrained`: LoRA layers are injected around
the targeted linear layers, in place), later ones are added beside it (`load_adapter`). Every forward
after that hands each LoRA layer `adapter_names`, one per row: PEFT's mixed-batch inference
(`LoraLayer._mixed_batch_forward`) runs the base layer on the whole batch, then adds each adapter's
`B A x` to its own rows only; a base row (PEFT's `"__base__"`) keeps the base layer's output untouched.
When the last adapter goes, the LoRA layers are removed (`unload`, no merge) and the model runs bare.

`PeftModel.forward(adapter_names=...)` does the handing over by walking every module and registering
a hook on each LoRA layer, then removing them, on every call (3.6 ms a step on the default model with
4 adapters); here each LoRA layer gets one hook when it appears, which reads the current call's rows,
and the model is called directly.

Served names never reach PEFT: each adapter gets an internal name (`lora0`, `lora1`, ...), since PEFT
keeps adapters in `nn.ModuleDict`s, whose keys cannot hold a dot, and reserves `"__base__"`.

`peft` is imported when the first adapter loads: a backend that serves none never pays for it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from handler.lora.adapters import AdapterSpec

logger = logging.getLogger(__name__)

PEFT_BASE = "__base__"  # PEFT's name for a row that runs the base model alone


def linear_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """The model's linear layers an adapter may target: leaf name (q_proj, ...) to (in_features,
    out_features). The output head is left out (adapters that target it are not served), and so is a
    name whose layers differ in shape (no one (in, out) fits them all)."""
    head = model.get_output_embeddings()
    shapes: dict[str, tuple[int, int]] = {}
    mixed: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        leaf = name.rsplit(".", 1)[-1]
        shape = (module.in_features, module.out_features)
        if shapes.setdefault(leaf, shape) != shape:
            mixed.add(leaf)
    for leaf in mixed:
        logger.info("hf: linear layers named %r differ in shape; adapters may not target them", leaf)
        del shapes[leaf]
    return shapes


class HFAdapters:
    """The adapters loaded on one base model, and the forward that serves them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.shapes = linear_shapes(model)  # before any LoRA layer wraps a linear one
        self._peft: Any = None  # the PeftModel around `model`, while any adapter is loaded
        self._internal: dict[str, str] = {}  # served name -> PEFT's name
        self._loaded = 0  # adapters ever loaded: the next internal name
        self._hooks: dict[torch.nn.Module, Any] = {}  # LoRA layer -> its hook's handle
        self._rows: list[str] | None = None  # the running forward's adapter per row, PEFT's names

    def __contains__(self, name: object) -> bool:
        return name in self._internal

    def load(self, spec: AdapterSpec) -> None:
        """Adds the (checked) adapter; its weights stay beside the base weights, in their own layers."""
        from handler.lora.adapters import AdapterError

        if spec.name in self._internal:
            raise AdapterError(f"LoRA adapter {spec.name!r} is already loaded")
        try:
            from peft import PeftModel
            from peft.tuners.lora import LoraLayer
        except ImportError as exc:
            raise AdapterError(
                f"LoRA adapter {spec.name!r}: the hf backend serves adapters with peft, which is not installed "
                "here (requirements.txt pins it; requirements-compat.txt for transformers 4.48; the SageMaker "
                "archive does not bundle it)"
            ) from exc
        internal = f"lora{self._loaded}"
        self._loaded += 1
        try:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(self.model, str(spec.path), adapter_name=internal).eval()
            else:
                self._peft.load_adapter(str(spec.path), adapter_name=internal)
        except Exception as exc:
            self._undo(internal, LoraLayer)
            raise AdapterError(f"LoRA adapter {spec.name!r}: peft could not load it ({exc})") from exc
        self._internal[spec.name] = internal
        for module in self.model.modules():  # the layers this adapter added, if it targets new modules
            if isinstance(module, LoraLayer) and module not in self._hooks:
                self._hooks[module] = module.register_forward_pre_hook(self._hand_rows, with_kwargs=True)
        logger.info("hf: LoRA adapter %r loaded (rank %d, %s)", spec.name, spec.rank, ", ".join(spec.target_modules))

    def unload(self, name: str) -> None:
        """Forgets the adapter; with the last one, the LoRA layers go too (the base model runs bare)."""
        internal = self._internal.pop(name, None)
        if internal is None:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        if self._internal:
            # Another one active first: PEFT keeps its active adapter's config at hand (peft < 0.18 has no
            # PeftModel.delete_adapter to do this, and every version runs the active one when not told).
            self._peft.set_adapter(next(iter(self._internal.values())))
            self._peft.base_model.delete_adapter(internal)
        else:
            self._peft.base_model.unload()  # removes every LoRA layer, merging nothing
            self._peft = None
            for handle in self._hooks.values():
                handle.remove()
            self._hooks.clear()
        logger.info("hf: LoRA adapter %r unloaded", name)

    def close(self) -> None:
        self.model = self._peft = None
        self._hooks.clear()

    def _undo(self, internal: str, lora_layer: type) -> None:
        """What a load that failed part-way left: its LoRA layers (PEFT injects them before it reads the
        weights), and with them the wrapping of a first adapter."""
        if self._peft is not None:
            if internal in self._peft.peft_config:
                self._peft.base_model.delete_adapter(internal)
            return
        for name, module in list(self.model.named_modules()):
            if isinstance(module, lora_layer):
                parent, _, leaf = name.rpartition(".")
                setattr(self.model.get_submodule(parent), leaf, module.get_base_layer())

    def forward(self, adapters: Sequence[str | None], **kwargs: Any) -> Any:
        """The model's forward over rows whose adapters are `adapters` (None: the base model), one call.
        While any adapter is loaded every row names its own, a base row included: a LoRA layer told
        nothing applies its active adapter to every row."""
        if self._peft is None:
            return self.model(**kwargs)
        self._rows = [PEFT_BASE if adapter is None else self._internal[adapter] for adapter in adapters]
        try:
            return self.model(**kwargs)
        finally:
            self._rows = None

    def _hand_rows(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A LoRA layer's forward pre-hook: this forward's rows, as PEFT's own hook would give them."""
        if self._rows is not None:
            kwargs["adapter_names"] = self._rows
        return args, kwargs

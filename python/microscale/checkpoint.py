"""Quantized checkpoints in memory: load a model directory written by any of the supported
ecosystems into quantized layers, and save quantized layers in one of their layouts.

>>> import numpy as np, microscale
>>> w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
>>> layer = microscale.QuantizedWeight.from_float(w, mode="nvfp4", global_scale=True)
>>> microscale.save_checkpoint("/tmp/ms_doc", {"model.layers.0.mlp.up_proj": layer},
...                            export="compressed-tensors", force=True)
>>> ck = microscale.load_checkpoint("/tmp/ms_doc")
>>> ck.format, sorted(ck.layers)
('compressed-tensors', ['model.layers.0.mlp.up_proj'])

Layouts (docs/checkpoints.md): ``compressed-tensors`` (nvfp4, mxfp4), ``modelopt`` (nvfp4) and
``mlx`` (every mode; nvfp4 there is two-level). Global scales are held as the tensor amax, as
``microscale.quantize`` takes them; the layout's own convention (2688/amax for
compressed-tensors, amax/2688 for ModelOpt) is applied when reading and writing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

import ml_dtypes
import numpy as np

from . import _as_array, _core
from .weight import QuantizedWeight

# The smallest positive activation amax a layout stores: below it the scale 2688/amax or amax/2688
# is no normal float32 (kMinActivationAmax in src/io/layer.hpp).
_MIN_ACTIVATION_AMAX = np.float32(2688) * np.finfo(np.float32).tiny

__all__ = ["QuantizedWeight", "LoadedCheckpoint", "load_checkpoint", "save_checkpoint", "quantize_checkpoint",
           "QuantizeReport", "BudgetChoice"]

# safetensors dtype names <-> numpy dtypes (F4/F6 have no numpy type: returned as raw uint8 bytes).
_ST_TO_NP = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16), "U16": np.dtype(np.uint16), "I32": np.dtype(np.int32),
    "U32": np.dtype(np.uint32), "I64": np.dtype(np.int64), "U64": np.dtype(np.uint64),
    "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16), "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64), "C64": np.dtype(np.complex64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz), "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_NP_TO_ST = {v: k for k, v in _ST_TO_NP.items()}


@dataclass
class LoadedCheckpoint:
    """What ``load_checkpoint`` returns: quantized layers by module name (``"model.layers.0.mlp.up_proj"``),
    every other tensor by name, the parsed config.json (or None) and the detected layout."""

    layers: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    config: Optional[dict] = None
    format: str = "none"


def load_checkpoint(path) -> LoadedCheckpoint:
    """Read a model directory (config.json + safetensors shards), an index .json or a .safetensors
    file in compressed-tensors, ModelOpt or MLX layout (or unquantized)."""
    data = _core.load_checkpoint(str(path))
    ck = LoadedCheckpoint(format=data.convention,
                          config=json.loads(data.config_json) if data.config_json else None)
    for layer in data.layers:
        ck.layers[layer.module] = QuantizedWeight._from_core(layer.weight, layer.input_amax)
    for name, st_dtype, shape, data_bytes in data.take_tensors():  # moved, not copied
        dt = _ST_TO_NP.get(st_dtype)
        ck.tensors[name] = data_bytes.view(dt).reshape(shape) if dt is not None else data_bytes
    return ck


def _either(names):
    """"a", "a or b", "a, b or c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _check_input_amax(layers, export):
    """The CLI's rules for static activation scales (--activation-amax), so that no input_amax is
    silently left out of a checkpoint."""
    for module, q in layers.items():
        if not isinstance(q, QuantizedWeight):
            raise TypeError(f"layers[{module!r}] must be a QuantizedWeight, got {type(q).__name__}")
    given = [m for m, q in layers.items() if q.input_amax is not None]
    if not given:
        return
    if not _core.Convention.from_name(export).activation_scales:  # (an unknown export raises there)
        names = [c.label for c in _core.Convention.__members__.values() if c.activation_scales and c.model_directory]
        raise ValueError(f"layers[{given[0]!r}].input_amax: static activation scales (W4A4) exist for "
                         f"nvfp4 with export {_either(names)} only, not {export!r}; set "
                         "input_amax = None for a weight-only export")
    for module, q in layers.items():
        what = f"layers[{module!r}].input_amax"
        if q.input_amax is None:
            raise ValueError(f"{what}: W4A4 needs a static activation amax for every quantized layer "
                             f"(given for {given[0]!r}, missing here); set them all, or none for a "
                             "weight-only (NVFP4A16) export")
        if q.mode != "nvfp4":
            raise ValueError(f"{what}: static activation scales (W4A4) exist for nvfp4 only, "
                             f"the layer is {q.mode}")
        v = q.input_amax
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{what} must be a number, got {type(v).__name__}")
        # Stored as float32: a value past its range would be written as Inf.
        try:
            with np.errstate(over="ignore"):
                stored = np.float32(float(v))
        except OverflowError:  # an int beyond float64
            stored = np.float32("inf")
        if not np.isfinite(stored) or stored < 0:
            raise ValueError(f"{what} is not a finite non-negative float32 number: {v}")
        # 1e-50, for one, is 0 in float32, which would be stored as amax 2688.
        if v != 0 and stored < _MIN_ACTIVATION_AMAX:
            raise ValueError(f"{what} is {v}, below 2688 x FLT_MIN ({_MIN_ACTIVATION_AMAX:.6g}): its activation "
                             "scale would not be a normal float32 number")


def save_checkpoint(path, layers, tensors=None, config=None, export="mlx", force=False):
    """Write ``layers`` ({module: QuantizedWeight}) and ``tensors`` ({name: array}, kept as they
    are) to the directory ``path`` as model.safetensors + config.json (+ hf_quant_config.json for
    ModelOpt) in the layout ``export``: "compressed-tensors", "modelopt" or "mlx". ``config`` (a
    dict) is written with its quantization block replaced. Refuses a non-empty directory unless
    ``force``.

    ``input_amax`` (static activation amax, W4A4) is written only by the compressed-tensors and
    ModelOpt layouts for nvfp4, and only when every layer has one, as the CLI's
    ``--activation-amax`` demands; anything else raises instead of dropping it."""
    if not isinstance(layers, dict):
        raise TypeError(f"layers must be a dict {{module: QuantizedWeight}}, got {type(layers).__name__}")
    if tensors is not None and not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict {{name: array}} or None, got {type(tensors).__name__}")
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"config must be a dict (config.json's object) or None, got {type(config).__name__}")
    if not isinstance(export, str):
        raise TypeError(f"export must be a string, got {type(export).__name__}")
    _check_input_amax(layers, export)
    data = _core.CheckpointData()
    for module, q in layers.items():
        data.add_layer(_core.QuantizedLayer(module, q._to_core(),
                                            None if q.input_amax is None else float(q.input_amax)))
    for name, a in (tensors or {}).items():
        a = np.ascontiguousarray(_as_array(a, f"tensors[{name!r}]"))  # float8 in ml_dtypes' types
        st = _NP_TO_ST.get(a.dtype)
        if st is None:
            raise TypeError(f"tensors[{name!r}]: dtype {a.dtype} has no safetensors name")
        data.add_tensor(name, st, [int(d) for d in a.shape], a.reshape(-1).view(np.uint8))
    data.config_json = json.dumps(config) if config is not None else ""
    _core.save_checkpoint(str(path), data, _core.Convention.from_name(export), bool(force))


@dataclass
class BudgetChoice:
    """One choice of ``quantize_checkpoint(budget=...)``: a layer (or a fused group, its modules
    joined by ``+``), the candidate chosen, its bits per weight (scales included) and its
    estimated error."""

    layers: str
    format: str
    bits: float
    error: float


@dataclass
class QuantizeReport:
    """What ``quantize_checkpoint`` did: every tensor written (``name``, ``action``, ``format``,
    ``reason`` for a weight kept in high precision), ``budget``'s choices, and the run's notes."""

    tensors: list = field(default_factory=list)
    budget: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def formats(self) -> dict:
        """{module: format} of the quantized layers."""
        return {t["name"]: t["format"] for t in self.tensors if t["action"] == "quantized"}


def _rules(recipe):
    """A recipe given in Python: a path (the recipe file), a dict {glob: format} (in insertion
    order) or a list of (glob, format) pairs."""
    if recipe is None:
        return "", []
    if isinstance(recipe, (str, os.PathLike)):
        return os.fspath(recipe), []
    items = list(recipe.items()) if isinstance(recipe, dict) else list(recipe)
    rules = []
    for i, r in enumerate(items):
        if not (isinstance(r, (tuple, list)) and len(r) == 2 and all(isinstance(v, str) for v in r)):
            raise TypeError(f"recipe entry {i} must be a (glob, format) pair of strings, got {r!r}")
        rules.append((r[0], r[1]))
    return "", rules


def quantize_checkpoint(model, output, format="nvfp4", export=None, recipe=None, budget=None, candidates=None,
                        budget_csv=None, hessians=None, exclude=(), include=(), force=False) -> QuantizeReport:
    """Quantize the checkpoint at ``model`` (a model directory or .safetensors file) into
    ``output``, as ``microscale quantize`` does (docs/checkpoints.md).

    ``format`` ("nvfp4", "mxfp8", "nvfp4,scale_search=mse", ...) is every layer's unless ``recipe``
    (a recipe file's path, a dict {glob: format} or a list of (glob, format) pairs, first match
    wins; "keep" leaves a layer in high precision) says otherwise. ``budget`` (bits per weight,
    scales included) chooses each layer's format among ``candidates`` (default
    ["nvfp4,scale_search=mse", "mxfp8", "keep"]) to minimise the summed estimated error, exactly;
    ``budget_csv`` writes the table behind the choice; ``hessians`` (a safetensors file of
    H = X^T X per module) weighs the error as trace(dW H dW^T), or runs GPTQ without a budget.
    ``export``: "compressed-tensors", "modelopt", "mlx" or "gguf" (default by format)."""
    rule_file, rules = _rules(recipe)
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise TypeError(f"budget must be a number of bits per weight, got {type(budget).__name__}")
        budget = float(budget)
    cands = [] if candidates is None else list(candidates)
    for c in cands:
        if not isinstance(c, str):
            raise TypeError(f"candidates must be format strings, got {c!r}")
    for name, v in (("format", format), ("export", export)):
        if v is not None and not isinstance(v, str):
            raise TypeError(f"{name} must be a string, got {type(v).__name__}")
    r = _core.quantize_checkpoint(
        os.fspath(model), os.fspath(output), format, export or "", rules, rule_file, budget, cands,
        "" if budget_csv is None else os.fspath(budget_csv), "" if hessians is None else os.fspath(hessians),
        list(exclude), list(include), bool(force))
    return QuantizeReport(tensors=r["tensors"], budget=[BudgetChoice(**b) for b in r["budget"]], notes=r["notes"])

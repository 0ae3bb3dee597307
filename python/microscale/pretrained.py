"""Run a quantized checkpoint as a transformers model on microscale's kernels.

:func:`from_pretrained` builds the model class named by the checkpoint's config.json with
transformers, and replaces every quantized Linear with a :class:`microscale.torch.QuantizedLinear`
(or :class:`~microscale.torch.QQLinear` where the checkpoint carries static activation scales,
W4A4) and every quantized mixture-of-experts block with a
:class:`~microscale.torch.QuantizedExperts`. The modules hold the checkpoint's own packed codes,
block scales and global scales: nothing is requantized and no float copy of a quantized weight
is made. The rest of the model (embeddings, norms, routers, ``lm_head``) is loaded as it is
stored, converted to the model's dtype. The result is an ordinary ``PreTrainedModel``:
``generate``, tokenizers, pipelines and ``torch.compile`` work on it.

>>> import microscale.torch as mst                           # doctest: +SKIP
>>> model = mst.from_pretrained("Llama-3.2-1B-NVFP4")          # doctest: +SKIP
>>> model.generate(**tokenizer("Hello", return_tensors="pt"))  # doctest: +SKIP

Layouts: compressed-tensors (nvfp4, mxfp4), ModelOpt (nvfp4, W4A16 and W4A4) and MLX (every
mode), dense and MoE. Experts stored one Linear per expert (compressed-tensors, ModelOpt) are
stacked once at load; MLX's stacks are used as they are. W4A4 experts (an activation scale on
every expert Linear) keep each expert's activation amax and run through the
``microscale::gather_qqmm`` op, each expert as its own QQLinear would.

:func:`save_pretrained` writes such a model back in its source layout (the layers' bytes as they
were read).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import tempfile
from typing import Any, Iterator, Optional

import ml_dtypes
import numpy as np
import torch

from .checkpoint import QuantizedWeight, load_checkpoint, save_checkpoint
from .torch import DenseLinear, QQLinear, QuantizedExperts, QuantizedLinear

__all__ = ["from_pretrained", "save_pretrained"]

_BF16 = np.dtype(ml_dtypes.bfloat16)

# Expert projections by role, as the ecosystems name them (Mixtral's w1/w3/w2).
_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down",
         "w2": "down"}
# An expert's quantized Linear: per expert (".experts.3.w1") or stacked (MLX's ".switch_mlp.up_proj",
# gpt-oss's ".experts.up_proj").
_EXPERT = re.compile(r"(?P<block>.*)\.(?:experts|switch_mlp)\.(?:(?P<expert>\d+)\.)?(?P<proj>\w+)")


def _torch(a: np.ndarray) -> torch.Tensor:
    """A numpy array from a checkpoint as a torch tensor sharing its memory (bfloat16 through its
    16-bit pattern, 8-bit float codes as uint8)."""
    a = np.ascontiguousarray(a)
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    if a.dtype.itemsize == 1 and a.dtype != np.uint8 and a.dtype != np.int8 and a.dtype != np.bool_:
        return torch.from_numpy(a.view(np.uint8))
    return torch.from_numpy(a)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """The inverse of _torch for saving (bfloat16 back to ml_dtypes)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device (no memory, no initialisation) and
    their buffers real: rotary tables and the like are computed in __init__ and not stored."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: Optional[torch.nn.Parameter]) -> None:
        register(module, name, param)
        if param is not None:
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"),
                                            requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _checkpoint_dir(path: str) -> str:
    return path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))


def _submodule(model: torch.nn.Module, name: str) -> Optional[torch.nn.Module]:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _check_w4a4(name: str, q: QuantizedWeight) -> None:
    """A static activation scale (W4A4) runs with a three-level nvfp4 weight only."""
    if q.input_amax is not None and (q.mode != "nvfp4" or q.global_scale is None):
        raise ValueError(f"{name}: a static activation scale with a {q.mode} weight without a "
                         "global scale; W4A4 is three-level nvfp4")


def _linear(name: str, q: QuantizedWeight, linear: torch.nn.Linear,
            tensors: dict[str, np.ndarray], used: set[str]) -> torch.nn.Module:
    """The microscale module for one quantized nn.Linear, with the Linear's bias if it has one."""
    if tuple(q.shape) != (linear.out_features, linear.in_features):
        raise ValueError(f"{name}: the checkpoint's weight is {list(q.shape)}, the model's Linear "
                         f"is [{linear.out_features}, {linear.in_features}]")
    bias = None
    if linear.bias is not None:
        if f"{name}.bias" not in tensors:
            raise ValueError(f"{name}.bias: the model's Linear has a bias the checkpoint lacks")
        used.add(f"{name}.bias")
        bias = _torch(tensors[f"{name}.bias"]).to(linear.bias.dtype)
    biases = None if q.biases is None else _torch(q.biases)
    _check_w4a4(name, q)
    if q.input_amax is not None:
        return QQLinear(_torch(q.packed), _torch(q.scales), bias, q.mode, q.group_size, q.bits,
                        q.global_scale, q.input_amax, elem=q.elem)
    return QuantizedLinear(_torch(q.packed), _torch(q.scales), biases, bias, q.mode, q.group_size,
                           q.bits, q.global_scale, q.elem)


def _stack(block: str, role: str, members: dict[Optional[int], tuple[str, QuantizedWeight]],
           num_experts: int) -> tuple[dict[str, Any], Any]:
    """(the stack QuantizedExperts takes, the checkpoint names it came from) for one role."""
    if None in members:  # already stacked [E, N, K]
        name, q = members[None]
        if len(q.shape) != 3 or q.shape[0] != num_experts:
            raise ValueError(f"{name}: expected a stack of {num_experts} experts, got "
                             f"{list(q.shape)}")
        if q.global_scale is not None:
            raise ValueError(f"{name}: one global scale for a stack of experts is not a layout "
                             "microscale reads")
        parts = [q]
        names: Any = name
    else:
        missing = [e for e in range(num_experts) if e not in members]
        if missing:
            raise ValueError(f"{block}: the checkpoint has no quantized {role} projection for "
                             f"expert {missing[0]} of {num_experts}")
        parts = [members[e][1] for e in range(num_experts)]
        names = [members[e][0] for e in range(num_experts)]
    first = parts[0]
    for q, n in zip(parts, names if isinstance(names, list) else [names]):
        if (q.mode, q.group_size, q.bits, q.elem) != (first.mode, first.group_size, first.bits,
                                                      first.elem):
            raise ValueError(f"{n}: experts of one block in different formats")
        _check_w4a4(n, q)
        if (q.global_scale is None) != (first.global_scale is None):
            raise ValueError(f"{n}: some experts of the block have a global scale, others not")
        if (q.input_amax is None) != (first.input_amax is None):
            raise ValueError(f"{n}: some experts of the block have a static activation scale "
                             "(W4A4), others not")

    def stacked(get: Any) -> Optional[torch.Tensor]:
        arrays = [get(q) for q in parts]
        if arrays[0] is None:
            return None
        return _torch(arrays[0] if len(arrays) == 1 else np.stack(arrays))

    stack = {"weight": stacked(lambda q: q.packed), "scales": stacked(lambda q: q.scales),
             "biases": stacked(lambda q: q.biases), "mode": first.mode,
             "group_size": first.group_size, "bits": first.bits, "elem": first.elem,
             "shape": [num_experts, *(first.shape[-2:])]}
    if first.global_scale is not None:
        stack["global_scales"] = torch.tensor([q.global_scale for q in parts], dtype=torch.float32)
    if first.input_amax is not None:
        stack["input_global_scales"] = torch.tensor([q.input_amax for q in parts],
                                                    dtype=torch.float32)
    return stack, names


def _experts(block: str, members: dict[str, dict[Optional[int], tuple[str, QuantizedWeight]]],
             model: torch.nn.Module, tensors: dict[str, np.ndarray],
             used: set[str]) -> tuple[str, QuantizedExperts]:
    """(the model's experts module name, its replacement) for one MoE block."""
    name = f"{block}.experts"
    module = _submodule(model, name)
    num_experts = getattr(module, "num_experts", None)
    if module is None or num_experts is None:
        raise ValueError(f"{block}: quantized experts in the checkpoint, but the model has no "
                         f"experts module at {name!r}")
    if set(members) != set(QuantizedExperts.ROLES):
        raise ValueError(f"{block}: quantized experts need gate, up and down projections, the "
                         f"checkpoint has {sorted(members)}")
    stacks, sources = {}, {}
    for role in QuantizedExperts.ROLES:
        stacks[role], sources[role] = _stack(block, role, members[role], int(num_experts))
    gpt_oss = hasattr(module, "alpha") and hasattr(module, "limit")
    biases = {}
    for role, source in sources.items():  # gpt-oss's expert biases, next to MLX's stacks
        if isinstance(source, str) and f"{source}.bias" in tensors:
            dtype = next(module.parameters()).dtype
            biases[role] = _torch(tensors[f"{source}.bias"]).to(dtype)
            used.add(f"{source}.bias")
    if gpt_oss and len(biases) != 3:
        raise ValueError(f"{name}: gpt-oss experts need their gate, up and down biases")
    experts = QuantizedExperts(stacks, getattr(module, "act_fn", None),
                               "gpt_oss" if gpt_oss else "swiglu",
                               float(getattr(module, "alpha", 1.702)),
                               float(getattr(module, "limit", 7.0)), biases or None)
    experts.checkpoint_names = sources  # save_pretrained writes them back under these
    return name, experts


def _load_tensor(model: torch.nn.Module, name: str, array: np.ndarray) -> bool:
    """Put a stored float tensor into the model's parameter or buffer of that name, in the dtype
    the model holds it in. False when the model has no such tensor."""
    owner_name, _, attr = name.rpartition(".")
    owner = _submodule(model, owner_name) if owner_name else model
    if owner is None:
        return False
    current = owner._parameters.get(attr) if attr in owner._parameters else owner._buffers.get(attr)
    if current is None:
        return False
    value = _torch(array)
    if tuple(value.shape) != tuple(current.shape):
        raise ValueError(f"{name}: the checkpoint's tensor is {list(value.shape)}, the model's is "
                         f"{list(current.shape)}")
    value = value.to(current.dtype)
    if attr in owner._parameters:
        owner._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[attr] = value
    return True


def _model_names(model: torch.nn.Module, keys: list[str]) -> dict[str, str]:
    """{checkpoint key: the model's name for it}: transformers' own renamings for the model class
    (Mixtral's ``block_sparse_moe`` is ``mlp`` in transformers 5, for one). Its converters, which
    merge experts into one tensor, are not applied: the experts are stacked here."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, apply_renamings
    except ImportError:  # a transformers without conversion mappings renames nothing
        return {k: k for k in keys}
    renamings = [t for t in get_model_conversion_mapping(model) if not isinstance(t, WeightConverter)]
    return {k: apply_renamings(k, renamings) for k in sorted(keys)}


def from_pretrained(path: Any, dtype: Optional[torch.dtype] = None,
                    trust_remote_code: bool = False) -> Any:
    """A transformers ``PreTrainedModel`` (``AutoModelForCausalLM``'s class for the config) over
    the quantized checkpoint at ``path``: a model directory, an index .json or a .safetensors
    file in compressed-tensors, ModelOpt or MLX layout, or a .gguf file with NVFP4 / MXFP4
    tensors. ``dtype`` is the float dtype of the
    activations and of the unquantized tensors (default: the config's ``dtype``, else
    bfloat16). The model is in eval mode with no gradients."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = os.fspath(path)
    if path.endswith(".gguf"):
        return _from_gguf(path, dtype, trust_remote_code)
    ck = load_checkpoint(path)
    if ck.format == "none":
        raise ValueError(f"{path}: no quantized layers (not a compressed-tensors, ModelOpt or MLX "
                         "checkpoint); load it with transformers")
    config = AutoConfig.from_pretrained(_checkpoint_dir(path), trust_remote_code=trust_remote_code)
    for key in ("quantization_config", "quantization"):  # built here, not by transformers' quantizers
        if hasattr(config, key):
            delattr(config, key)
    if dtype is None:
        dtype = getattr(config, "dtype", None) or torch.bfloat16
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                 trust_remote_code=trust_remote_code)

    # Quantized layers are renamed as their weights would be.
    names = _model_names(model, [f"{n}.weight" for n in ck.layers] + list(ck.tensors))
    layers = {names[f"{n}.weight"].removesuffix(".weight"): q for n, q in ck.layers.items()}
    tensors = {names[n]: t for n, t in ck.tensors.items()}
    used: set[str] = set()
    blocks: dict[str, dict[str, dict[Optional[int], tuple[str, QuantizedWeight]]]] = {}
    for name, q in layers.items():
        module = _submodule(model, name)
        if isinstance(module, torch.nn.Linear):
            _replace(model, name, _linear(name, q, module, tensors, used))
            continue
        m = _EXPERT.fullmatch(name)
        if m is None or m["proj"] not in _ROLE:
            raise ValueError(f"{name}: a quantized layer the model ({type(model).__name__}) has no "
                             "Linear or experts projection for")
        expert = None if m["expert"] is None else int(m["expert"])
        blocks.setdefault(m["block"], {}).setdefault(_ROLE[m["proj"]], {})[expert] = (name, q)
    # Per-expert weights are copied into stacks: drop each block's originals once stacked, and
    # each float tensor once it is in the model's dtype, so that no more than one block's or one
    # tensor's worth is held twice.
    layers.clear()
    ck.layers.clear()
    for block in list(blocks):
        name, experts = _experts(block, blocks.pop(block), model, tensors, used)
        _replace(model, name, experts)
    ck.tensors.clear()
    unused = []
    for n in list(tensors):
        array = tensors.pop(n)
        if n not in used and not _load_tensor(model, n, array):
            unused.append(n)
    if unused:
        raise ValueError(f"{unused[0]}: a tensor of the checkpoint that {type(model).__name__} "
                         f"has no parameter or buffer for ({len(unused)} such tensors)")
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    missing += [n for n, b in model.named_buffers() if b.is_meta]
    if missing:
        raise ValueError(f"{missing[0]}: a tensor of {type(model).__name__} the checkpoint does "
                         f"not hold ({len(missing)} missing)")
    model.eval()
    model.requires_grad_(False)
    for name, module in list(model.named_modules()):  # the layers left in float: lm_head, routers
        if type(module) is torch.nn.Linear:
            _replace(model, name, DenseLinear.sharing(module))
    # What save_pretrained needs to write the source layout back: {model key: checkpoint key}
    # for the renamed keys (experts keep their checkpoint names on their module).
    renamed = {v: k for k, v in names.items() if k != v}
    model.microscale_source = {"format": ck.format, "config": ck.config, "names": renamed}
    # model.save_pretrained(dir) writes the source layout, not transformers' float layout.
    model.save_pretrained = functools.partial(save_pretrained, model)
    return model


def _from_gguf(path: str, dtype: Optional[torch.dtype], trust_remote_code: bool) -> Any:
    """A GGUF file (llama.cpp's NVFP4 / MXFP4 blocks) through the command's byte-preserving
    conversion to compressed-tensors in a temporary directory, read whole before it is removed;
    the model saves as compressed-tensors."""
    from .__main__ import _CLI

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    with tempfile.TemporaryDirectory(prefix="microscale-gguf-") as tmp:
        out = os.path.join(tmp, "model")
        run = subprocess.run([str(_CLI), "convert", path, "--to", "compressed-tensors", "-o", out],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise ValueError(f"{path}: not read as a quantized GGUF: {run.stderr.strip()}")
        return from_pretrained(out, dtype=dtype, trust_remote_code=trust_remote_code)


def _weight(module: torch.nn.Module) -> QuantizedWeight:
    """A QuantizedLinear / QQLinear's parts as the QuantizedWeight save_checkpoint takes."""
    biases = getattr(module, "biases", None)
    amax = getattr(module, "input_global_scale", None)
    k = int(module.weight.shape[-1]) * 8 // module.bits
    return QuantizedWeight(_numpy(module.weight), _numpy(module.scales),
                           None if biases is None else _numpy(biases), module.mode,
                           module.group_size, module.bits, (int(module.weight.shape[0]), k),
                           module.global_scale, amax, module.elem)


def save_pretrained(model: Any, path: Any, force: bool = False) -> None:
    """Write a model built by :func:`from_pretrained` to the directory ``path`` in the layout it
    was read from: every quantized layer's codes and scales as they were loaded, experts under
    their checkpoint names (per expert again where they were stored so), the other tensors in
    the model's dtype, and the source config.json. Modules on the meta device cannot be saved."""
    source = getattr(model, "microscale_source", None)
    if source is None:
        raise ValueError("model: not built by microscale.torch.from_pretrained (it records the "
                         "layout to write)")
    on_meta = [n for n, t in model.state_dict().items() if t.is_meta]
    if on_meta:
        raise ValueError(f"{on_meta[0]}: on the meta device; move the model to the CPU to save it")
    layers: dict[str, QuantizedWeight] = {}
    tensors: dict[str, np.ndarray] = {}
    skip: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, (QuantizedLinear, QQLinear)):
            layers[name] = _weight(module)
            if module.bias is not None:
                tensors[f"{name}.bias"] = _numpy(module.bias)
            skip.add(name)
        elif isinstance(module, QuantizedExperts):
            _save_experts(module, layers, tensors)
            skip.add(name)
    tied = {n for n in ("lm_head.weight",) if getattr(model.config, "tie_word_embeddings", False)}
    for name, t in model.state_dict().items():
        owner = name.rpartition(".")[0]
        if owner in skip or name in tied:
            continue
        tensors[name] = _numpy(t)
    back = source["names"]  # the checkpoint's own names for keys transformers renamed
    layers = {back.get(f"{n}.weight", f"{n}.weight").removesuffix(".weight"): q
              for n, q in layers.items()}
    tensors = {back.get(n, n): t for n, t in tensors.items()}
    save_checkpoint(os.fspath(path), layers, tensors, source["config"], export=source["format"],
                    force=force)


def _save_experts(module: QuantizedExperts, layers: dict[str, QuantizedWeight],
                  tensors: dict[str, np.ndarray]) -> None:
    for role in QuantizedExperts.ROLES:
        names = module.checkpoint_names[role]
        weight = _numpy(getattr(module, f"{role}_weight"))
        scales = _numpy(getattr(module, f"{role}_scales"))
        biases_t = getattr(module, f"{role}_biases")
        biases = None if biases_t is None else _numpy(biases_t)
        amax_t = getattr(module, f"{role}_global_scales")
        amax = None if amax_t is None else amax_t.tolist()
        input_amax_t = getattr(module, f"{role}_input_global_scales")
        input_amax = None if input_amax_t is None else input_amax_t.tolist()
        n, k = int(weight.shape[1]), int(weight.shape[2]) * 8 // module.bits
        spec = (module.mode, module.group_size, module.bits)
        if isinstance(names, str):
            layers[names] = QuantizedWeight(weight, scales, biases, *spec,
                                            (int(weight.shape[0]), n, k), None, None, module.elem)
            bias = getattr(module, f"{role}_bias")
            if bias is not None:
                tensors[f"{names}.bias"] = _numpy(bias)
            continue
        for e, name in enumerate(names):
            layers[name] = QuantizedWeight(weight[e], scales[e],
                                           None if biases is None else biases[e], *spec, (n, k),
                                           None if amax is None else amax[e],
                                           None if input_amax is None else input_amax[e],
                                           module.elem)

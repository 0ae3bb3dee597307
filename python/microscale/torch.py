"""torch integration: fake quantization with a straight-through estimator for quantization-aware
training, and ``torch.nn.Module`` layers over microscale's quantized products.

Importable only where torch is installed (``import microscale.torch``). The functions take
tensors in host memory; the modules' products are torch custom ops with CPU and CUDA kernels, so
a module moved to a CUDA device (``model.to("cuda")``) runs microscale's CUDA backend
(``microscale._cuda``, in builds made with nvcc).

>>> import torch, microscale.torch as mst
>>> w = torch.randn(32, 64, requires_grad=True)
>>> y = mst.fake_quantize(w, mode="nvfp4")          # forward: quantize_dequantize
>>> y.sum().backward()                               # backward: straight-through, see below
>>> lin = mst.QuantizedLinear.from_linear(torch.nn.Linear(64, 32))   # W4A16
>>> lin(torch.randn(2, 64)).shape
torch.Size([2, 32])

Straight-through estimator (:class:`FakeQuantize`): the gradient of ``fake_quantize(x)`` is the
incoming gradient where ``x`` is within its block's representable range and 0 elsewhere. The
range of a block is what its decoded scale can reach: ``|x| <= E_max * scale`` for the fp modes,
with ``E_max`` the element format's largest value (6 for E2M1 in nvfp4 and mxfp4, 448 for E4M3
and 57344 for E5M2 in mxfp8) and ``scale`` the block scale as dequantize applies it (three-level
nvfp4: ``val(s) * amax / 2688``). Beyond that bound the element is clamped to the largest code.
For affine, the codes ``0`` and ``2^bits - 1`` decode to the range's ends ``lo`` and ``hi``;
an element is in range when rounding, not clamping, chose its code: within half a step
(``|hi - lo| / (2^bits - 1) / 2``) of ``[lo, hi]`` (with scale and bias stored in bfloat16 the
group's far edge often lies just outside ``[lo, hi]`` and still rounds to its code). Elements out
of range do not follow x and get gradient 0; NaN and Inf elements, and every element of a block
that decoded to NaN (``nonfinite="propagate"``), get gradient 0. The bounds are computed in
float32 by dequantizing the extreme codes with the block's own scale (and bias), the values the
forward pass saturates to.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import numpy as np
import torch

from . import (OutType, _core, _deliver, _float_input, _global_scale_arg, dequantize, gather_qmm,
               linear, qqmm, quantize, quantized_matmul)
from . import global_scale as global_scale_of

__all__ = ["FakeQuantize", "fake_quantize", "QuantizedLinear", "QQLinear", "DenseLinear", "QuantizedExperts",
           "from_pretrained", "save_pretrained"]

# ---- torch custom ops (torch.library): the products as operators torch.compile traces through
# without a graph break, with fake (meta) implementations giving the result's shape and dtype.

_threads_set = 0


def _torch_openmp_entry() -> Optional[int]:
    """The address of GOMP_parallel in the OpenMP runtime that torch's ATen runs on, if it does.

    torch's OpenMP threads spin for a while after each of its ops, holding the cores that
    microscale's own pool would wait for during the next quantized product: inside a model the
    kernels ran at about one core's pace. Running microscale's loops on torch's team instead
    (set_parallel_runner) lets the spinning threads take the work."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    import ctypes
    import os

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        with open("/proc/self/maps") as maps:
            mapped = {line.split(maxsplit=5)[-1].strip() for line in maps if "omp" in line}
    except OSError:  # not Linux: look beside torch's own libraries
        mapped = {os.path.join(torch_lib, f) for f in os.listdir(torch_lib)} if os.path.isdir(torch_lib) else set()
    runtimes = sorted((p for p in mapped if os.path.basename(p).startswith(("libgomp", "libiomp", "libomp"))),
                      key=lambda p: not p.startswith(torch_lib))  # torch's own copy first
    for path in runtimes:
        try:  # RTLD_NOLOAD: only a runtime this process already runs
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            return ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


def _share_torch_threads() -> None:
    entry = _torch_openmp_entry()
    if entry is None:
        return
    import os

    _core._set_parallel_runner(entry)
    # A forked child (a DataLoader worker) must not enter the parent's OpenMP team.
    os.register_at_fork(after_in_child=lambda: _core._set_parallel_runner(0))


_share_torch_threads()


def _follow_torch_threads() -> None:
    """microscale's pool takes torch's intra-op thread count, so that the two never together run
    more threads than torch was told to use (they take turns, op by op)."""
    global _threads_set
    n = torch.get_num_threads()
    if n != _threads_set:
        from . import set_num_threads

        set_num_threads(n)
        _threads_set = n


def _product_dtype(x: torch.Tensor, scales: torch.Tensor, mode: str) -> torch.dtype:
    """The result dtype of quantized_matmul / gather_qmm: x's; affine: float32 unless x and the
    scales share a half dtype."""
    if mode == "affine" and not (x.dtype == scales.dtype and x.dtype != torch.float32):
        return torch.float32
    return x.dtype


def _widened(x: torch.Tensor) -> torch.Tensor:
    """Half-precision activations of several rows as float32 for the W4A16 products: exact
    (every bfloat16 and float16 value is a float32 one), the products are float32 sums rounded
    once either way, and the float32 GEMM is the faster one on x86 (prefill of a 1B mxfp4 model:
    61-63 -> 70-77 tokens/s; BENCHMARKS.md, "Running a quantized model"). One row (decode) reads
    x in its own dtype: the GEMV gained nothing from it there. The CUDA kernels read half
    precision directly."""
    half = x.dtype == torch.bfloat16 or x.dtype == torch.float16
    return x.float() if half and x.device.type == "cpu" and x.numel() != x.shape[-1] else x


def _same_device(x: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    """A module's input on its weights' device (a whole model on `meta` runs shape-only)."""
    if x.device != weight.device:
        raise ValueError(f"{what}: a tensor on {x.device}, the layer's weights are on "
                         f"{weight.device}; move the input or the module")


def _eager(x: torch.Tensor) -> bool:
    """Call the kernels directly: outside torch.compile's tracing and on plain CPU tensors, where
    the dispatcher's custom-op path adds more than a small GEMV costs (about 0.1 ms a call)."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def _quantized_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
                      biases: Optional[torch.Tensor], bias: Optional[torch.Tensor], mode: str,
                      group_size: int, bits: int, global_scale: Optional[float],
                      elem: str) -> torch.Tensor:
    _follow_torch_threads()
    y: torch.Tensor = quantized_matmul(x.contiguous(), w, scales, biases, True, mode, group_size,
                                       bits, global_scale, elem, bias, out_type="torch")
    return y


_quantized_matmul_op = torch.library.custom_op("microscale::quantized_matmul", _quantized_matmul,
                                               mutates_args=())


@_quantized_matmul_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, biases: Optional[torch.Tensor],
      bias: Optional[torch.Tensor], mode: str, group_size: int, bits: int,
      global_scale: Optional[float], elem: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[-2]), dtype=_product_dtype(x, scales, mode))


def _linear(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    _follow_torch_threads()
    y: torch.Tensor = linear(x.contiguous(), w.contiguous(), bias, out_type="torch")
    return y


_linear_op = torch.library.custom_op("microscale::linear", _linear, mutates_args=())


@_linear_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _linear_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, w, _ = inputs
    ctx.save_for_backward(x, w)


def _linear_backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
    """nn.Linear's gradients, in torch: y = x w^T + b."""
    x, w = ctx.saved_tensors
    rows = grad.reshape(-1, grad.shape[-1])
    gx = (grad @ w.to(grad.dtype)).to(x.dtype) if ctx.needs_input_grad[0] else None
    gw = (rows.T @ x.reshape(-1, x.shape[-1]).to(grad.dtype)).to(w.dtype) if ctx.needs_input_grad[1] else None
    gb = rows.sum(0) if ctx.needs_input_grad[2] else None
    return gx, gw, gb


_linear_op.register_autograd(_linear_backward, setup_context=_linear_setup)


def _gather_qmm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
                biases: Optional[torch.Tensor], lhs_indices: Optional[torch.Tensor],
                rhs_indices: Optional[torch.Tensor], mode: str, group_size: int, bits: int,
                global_scale: Optional[float], elem: str) -> torch.Tensor:
    _follow_torch_threads()
    y: torch.Tensor = gather_qmm(x.contiguous(), w, scales, biases, lhs_indices, rhs_indices, True,
                                 mode, group_size, bits, global_scale, elem, out_type="torch")
    return y


_gather_qmm_op = torch.library.custom_op("microscale::gather_qmm", _gather_qmm, mutates_args=())


def _gather_shape(x: torch.Tensor, w: torch.Tensor, lhs_indices: Optional[torch.Tensor],
                  rhs_indices: Optional[torch.Tensor]) -> tuple[int, ...]:
    """gather_qmm's result shape: the broadcast batch of the two indices (each defaulting to its
    operand's batch axes), then ``[M, N]``."""
    lhs = lhs_indices.shape if lhs_indices is not None else x.shape[:-2]
    rhs = rhs_indices.shape if rhs_indices is not None else w.shape[:-2]
    return (*torch.broadcast_shapes(lhs, rhs), x.shape[-2], w.shape[-2])


@_gather_qmm_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, biases: Optional[torch.Tensor],
      lhs_indices: Optional[torch.Tensor], rhs_indices: Optional[torch.Tensor], mode: str,
      group_size: int, bits: int, global_scale: Optional[float], elem: str) -> torch.Tensor:
    return x.new_empty(_gather_shape(x, w, lhs_indices, rhs_indices),
                       dtype=_product_dtype(x, scales, mode))


def _qqmm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor],
          mode: str, group_size: int, bits: int, input_global_scale: Optional[float],
          global_scale: Optional[float], scale_rule: str, nonfinite: str,
          elem: str) -> torch.Tensor:
    _follow_torch_threads()
    xa = _float_input(x.contiguous(), "x")  # once, for the amax and the product
    gx = input_global_scale
    if global_scale is not None and gx is None:
        gx = float(global_scale_of(xa))  # dynamic per-tensor activation scale
    y: torch.Tensor = qqmm(xa, w, scales, mode, group_size, bits, gx, global_scale, scale_rule,
                           nonfinite, elem, bias, out_type="torch")
    return y


_qqmm_op = torch.library.custom_op("microscale::qqmm", _qqmm, mutates_args=())


@_qqmm_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor],
      mode: str, group_size: int, bits: int, input_global_scale: Optional[float],
      global_scale: Optional[float], scale_rule: str, nonfinite: str,
      elem: str) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], w.shape[-2]))


def _each_expert(x: torch.Tensor, w: torch.Tensor, rhs_indices: torch.Tensor,
                 input_global_scales: torch.Tensor, global_scales: torch.Tensor,
                 product: Any) -> torch.Tensor:
    """gather_qmm's routing (x ``[..., M, K]`` broadcast against ``rhs_indices``) with the rows
    of each expert present multiplied together: ``product(rows [R, M, K], expert, its input
    amax, its weight amax)`` gives their ``[R, M, N]``, scattered back in place."""
    if rhs_indices.dtype not in (torch.int32, torch.int64, torch.uint32):
        raise TypeError(f"gather_qqmm: rhs_indices must be int32, int64 or uint32, got "
                        f"{rhs_indices.dtype}")
    try:
        batch = torch.broadcast_shapes(x.shape[:-2], rhs_indices.shape)
    except RuntimeError:  # gather_qmm's refusal, as a ValueError
        raise ValueError(f"gather_qqmm: index shapes {tuple(x.shape[:-2])} and "
                         f"{tuple(rhs_indices.shape)} do not broadcast") from None
    xs = x.expand(*batch, *x.shape[-2:])
    index = rhs_indices.expand(batch)
    y = x.new_empty(_gather_shape(x, w, None, rhs_indices))
    experts = int(w.shape[0])
    # Python floats equal to the float32 amaxes, as QQLinear holds its own.
    amax_x, amax_w = input_global_scales.tolist(), global_scales.tolist()
    for e in torch.unique(index).tolist():
        if not 0 <= e < experts:
            raise ValueError(f"gather_qqmm: rhs_indices value {e} is out of range [0, {experts})")
        rows = index == e
        y[rows] = product(xs[rows], e, amax_x[e], amax_w[e])
    return y


def _gather_qqmm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
                 global_scales: torch.Tensor, input_global_scales: torch.Tensor,
                 rhs_indices: torch.Tensor, mode: str, group_size: int, bits: int,
                 scale_rule: str, nonfinite: str, elem: str) -> torch.Tensor:
    """W4A4 experts: each (token, expert) as a QQLinear of that expert would compute it (qqmm
    with the expert's static activation amax and weight amax), the experts looped over here,
    inside the op, so that torch.compile sees one opaque call."""
    return _each_expert(x, w, rhs_indices, input_global_scales, global_scales,
                        lambda rows, e, gx, gw: _qqmm(rows, w[e], scales[e], None, mode,
                                                      group_size, bits, gx, gw, scale_rule,
                                                      nonfinite, elem))


_gather_qqmm_op = torch.library.custom_op("microscale::gather_qqmm", _gather_qqmm,
                                          mutates_args=())


@_gather_qqmm_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, global_scales: torch.Tensor,
      input_global_scales: torch.Tensor, rhs_indices: torch.Tensor, mode: str, group_size: int,
      bits: int, scale_rule: str, nonfinite: str, elem: str) -> torch.Tensor:
    return x.new_empty(_gather_shape(x, w, None, rhs_indices))


# ---- CUDA kernels of the four ops: microscale._cuda on the tensors' device memory, the result
# allocated here by torch and the work queued on torch's current stream.

_CUDA_MISSING = ("microscale was built without its CUDA backend (microscale._cuda): nvcc was not "
                 "found when it was built. Rebuild it from source with the CUDA toolkit's nvcc on "
                 "PATH (pip install . in a checkout) to run its modules on a CUDA device")


def _cuda_backend() -> Any:
    """microscale._cuda, imported on first use (torch's CUDA libraries are loaded by then), or a
    RuntimeError saying why it cannot run."""
    try:
        from . import _cuda
    except ImportError as e:
        raise RuntimeError(f"{_CUDA_MISSING} ({e})") from e
    if not _cuda.available():
        raise RuntimeError("microscale's CUDA backend: no CUDA device it has kernels for (it is "
                           "built for sm_90a and sm_100a: Hopper and Blackwell data-center GPUs)")
    return _cuda


def _codes(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The bytes the CUDA backend reads, as the CPU path reads them: float8 scales (or packed
    values) as their uint8 codes, MLX's uint32 words as their little-endian bytes."""
    if t is None:
        return None
    if (t.dtype.itemsize == 1 and t.is_floating_point()) or t.dtype == torch.uint32:
        return t.view(torch.uint8)
    return t


def _cuda_call(x: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
               run: Any) -> torch.Tensor:
    """Allocates the result on x's device and runs ``run(backend, y, stream)`` there."""
    backend = _cuda_backend()
    y = torch.empty(shape, dtype=dtype, device=x.device)
    with torch.cuda.device(x.device):
        run(backend, y, torch.cuda.current_stream(x.device).cuda_stream)
    return y


@_quantized_matmul_op.register_kernel("cuda")
def _quantized_matmul_cuda(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
                           biases: Optional[torch.Tensor], bias: Optional[torch.Tensor], mode: str,
                           group_size: int, bits: int, global_scale: Optional[float],
                           elem: str) -> torch.Tensor:
    x = x.contiguous()
    return _cuda_call(x, (*x.shape[:-1], w.shape[-2]), _product_dtype(x, scales, mode),
                      lambda cuda, y, stream: cuda.quantized_matmul(
                          x, _codes(w), _codes(scales), biases, True, mode, group_size, bits,
                          global_scale, elem, bias, y, stream))


@_gather_qmm_op.register_kernel("cuda")
def _gather_qmm_cuda(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
                     biases: Optional[torch.Tensor], lhs_indices: Optional[torch.Tensor],
                     rhs_indices: Optional[torch.Tensor], mode: str, group_size: int, bits: int,
                     global_scale: Optional[float], elem: str) -> torch.Tensor:
    x = x.contiguous()
    return _cuda_call(x, _gather_shape(x, w, lhs_indices, rhs_indices),
                      _product_dtype(x, scales, mode),
                      lambda cuda, y, stream: cuda.gather_qmm(
                          x, _codes(w), _codes(scales), biases,
                          None if lhs_indices is None else lhs_indices.contiguous(),
                          None if rhs_indices is None else rhs_indices.contiguous(), True, mode,
                          group_size, bits, global_scale, elem, False, y, stream))


@_qqmm_op.register_kernel("cuda")
def _qqmm_cuda(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
               bias: Optional[torch.Tensor], mode: str, group_size: int, bits: int,
               input_global_scale: Optional[float], global_scale: Optional[float],
               scale_rule: str, nonfinite: str, elem: str) -> torch.Tensor:
    x = x.contiguous()

    def run(cuda: Any, y: torch.Tensor, stream: int) -> None:
        gx = input_global_scale
        if global_scale is not None and gx is None:
            gx = cuda.amax(x, stream)  # dynamic per-tensor activation scale, as on the CPU
        cuda.qqmm(x, _codes(w), _codes(scales), mode, group_size, bits, gx, global_scale,
                  scale_rule, nonfinite, elem, bias, y, stream)

    return _cuda_call(x, (*x.shape[:-1], w.shape[-2]), x.dtype, run)


@_gather_qqmm_op.register_kernel("cuda")
def _gather_qqmm_cuda(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
                      global_scales: torch.Tensor, input_global_scales: torch.Tensor,
                      rhs_indices: torch.Tensor, mode: str, group_size: int, bits: int,
                      scale_rule: str, nonfinite: str, elem: str) -> torch.Tensor:
    return _each_expert(x, w, rhs_indices, input_global_scales, global_scales,
                        lambda rows, e, gx, gw: _qqmm_cuda(rows, w[e], scales[e], None, mode,
                                                           group_size, bits, gx, gw, scale_rule,
                                                           nonfinite, elem))


# The byte whose codes are each element format's largest positive value (FP4 packs two codes).
_MAX_CODE_BYTE = {("nvfp4", "e4m3"): 0x77, ("mxfp4", "e4m3"): 0x77, ("mxfp8", "e4m3"): 0x7E,
                  ("mxfp8", "e5m2"): 0x7B}


def _in_range(x: torch.Tensor, parts: tuple[Any, ...], mode: str, group_size: Optional[int],
              bits: Optional[int], global_scale_: Optional[float], elem: str) -> torch.Tensor:
    """Bool tensor: where x is within its block's representable range (see the module doc)."""
    packed, scales = parts[0], parts[1]
    biases = parts[2] if len(parts) == 3 else None
    kw: dict[str, Any] = dict(mode=mode, group_size=group_size, bits=bits,
                              global_scale=global_scale_, elem=elem, dtype="float32",
                              out_type="torch")
    xf = x.detach().float()
    if mode == "affine":
        lo: torch.Tensor = dequantize(torch.zeros_like(packed), scales, biases, **kw)
        hi: torch.Tensor = dequantize(torch.full_like(packed, 0xFF), scales, biases, **kw)  # codes 2^b-1
        half_step = (hi - lo).abs() / (2 * (2 ** (packed.shape[-1] * 8 // x.shape[-1]) - 1))
        return (xf >= torch.minimum(lo, hi) - half_step) & (xf <= torch.maximum(lo, hi) + half_step)
    top: torch.Tensor = dequantize(torch.full_like(packed, _MAX_CODE_BYTE[(mode, elem)]), scales, **kw)
    return xf.abs() <= top


class FakeQuantize(torch.autograd.Function):
    """``quantize_dequantize`` forward, straight-through backward (module doc). Use
    :func:`fake_quantize`; ``apply(x, mode, group_size, bits, global_scale, scale_rule, elem)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mode: str, group_size: Optional[int],
                bits: Optional[int], global_scale_: Optional[float], scale_rule: str,
                elem: str) -> torch.Tensor:
        xd = x.detach()
        parts = quantize(_float_input(xd, "x"), mode=mode, group_size=group_size, bits=bits,
                         global_scale=global_scale_, scale_rule=scale_rule, elem=elem,
                         out_type="torch")
        y: torch.Tensor = dequantize(*parts, mode=mode, group_size=group_size, bits=bits,
                       global_scale=global_scale_, elem=elem, dtype=_dtype_name(x.dtype),
                       out_type="torch")
        ctx.save_for_backward(_in_range(xd, parts, mode, group_size, bits, global_scale_, elem))
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        (mask,) = ctx.saved_tensors
        return grad * mask.to(grad.dtype), None, None, None, None, None, None


_TORCH_FLOAT_NAMES = {torch.float32: "float32", torch.float16: "float16",
                      torch.bfloat16: "bfloat16"}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _TORCH_FLOAT_NAMES.get(dtype)
    if name is None:
        raise TypeError(f"x: unsupported dtype {dtype} (expected float32, float16 or bfloat16)")
    return name


def fake_quantize(x: torch.Tensor, mode: str = "nvfp4", group_size: Optional[int] = None,
                  bits: Optional[int] = None,
                  global_scale: Union[None, float, torch.Tensor] = None,
                  scale_rule: str = "ceil", elem: str = "e4m3") -> torch.Tensor:
    """Fake-quantize a float32 / float16 / bfloat16 CPU tensor ``[..., K]`` for training: the
    forward value is ``microscale.quantize_dequantize(x, ...)`` in x's dtype, the gradient is
    straight-through where x is within range and 0 where it saturated (module doc).
    ``global_scale`` (nvfp4) is the tensor amax for three-level quantization, e.g.
    ``microscale.global_scale(x)``; it is not differentiated. NaN and Inf follow
    ``nonfinite="propagate"``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _dtype_name(x.dtype)
    if isinstance(global_scale, torch.Tensor):
        global_scale = _global_scale_arg(global_scale)
    y: torch.Tensor = FakeQuantize.apply(x, mode, group_size, bits, global_scale, scale_rule, elem)
    return y


def _torch(arr: Any) -> Optional[torch.Tensor]:
    """A part (numpy, from the numpy layers) as a torch tensor sharing its memory."""
    if arr is None:
        return None
    t: torch.Tensor = _deliver(np.ascontiguousarray(arr), OutType.torch)
    return t


def _req(arr: Any) -> torch.Tensor:
    t = _torch(arr)
    assert t is not None
    return t


def _weight_and_bias(linear_or_weight: Union[torch.nn.Linear, torch.Tensor],
                     bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weight, bias) of an nn.Linear or of a weight tensor and an optional bias."""
    if isinstance(linear_or_weight, torch.nn.Linear):
        if bias is not None:
            raise ValueError("bias: an nn.Linear brings its own bias")
        return linear_or_weight.weight.detach(), (None if linear_or_weight.bias is None
                                                  else linear_or_weight.bias.detach())
    return linear_or_weight, bias


class QuantizedLinear(torch.nn.Module):
    """``y = x @ W^T + bias`` with W quantized once and x kept in float (W4A16 for nvfp4 /
    mxfp4, W8A16 for mxfp8, affine as MLX), a ``torch.nn.Module`` over
    :func:`microscale.quantized_matmul`. The quantized parts are buffers (``weight`` packed
    uint8 ``[out, in*bits/8]``, ``scales``, ``biases`` for affine, ``bias``), so they appear in
    ``state_dict()``. Inference only: no gradients flow through it. x: float ``[..., in]`` on the
    module's device (CPU, or CUDA: module doc); the result has x's dtype (affine: see
    quantized_matmul)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor,
                 biases: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                 mode: str = "nvfp4", group_size: Optional[int] = None, bits: Optional[int] = None,
                 global_scale: Optional[float] = None, elem: str = "e4m3") -> None:
        super().__init__()
        defaults = _core.mode_defaults(mode) if isinstance(mode, str) else None
        if defaults is None:
            raise ValueError(f"mode: unknown mode {mode!r} (expected nvfp4, mxfp4, mxfp8 or affine)")
        self.mode = mode
        self.group_size = defaults[0] if group_size is None else int(group_size)
        self.bits = defaults[1] if bits is None else int(bits)
        self.global_scale = None if global_scale is None else float(np.float32(global_scale))
        self.elem = elem
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("biases", biases)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: Union[torch.nn.Linear, torch.Tensor],
                    bias: Optional[torch.Tensor] = None, mode: str = "nvfp4",
                    group_size: Optional[int] = None, bits: Optional[int] = None,
                    use_global_scale: bool = True, global_scale: Optional[float] = None,
                    scale_rule: str = "ceil", elem: str = "e4m3") -> "QuantizedLinear":
        """Quantize an ``nn.Linear`` (or a float ``[out, in]`` weight and optional bias) as
        :meth:`microscale.QuantizedLinear.from_linear` does (nvfp4: three-level with the
        weight's amax unless ``use_global_scale=False`` or ``global_scale`` is given)."""
        from .layers import QuantizedLinear as _NumpyLinear

        w, b = _weight_and_bias(linear, bias)
        layer = _NumpyLinear.from_linear(w, b, mode=mode, group_size=group_size, bits=bits,
                                         use_global_scale=use_global_scale,
                                         global_scale=global_scale, scale_rule=scale_rule,
                                         elem=elem)
        return cls(_req(layer.weight), _req(layer.scales), _torch(layer.biases),
                   _torch(layer.bias), layer.mode, layer.group_size, layer.bits,
                   layer.global_scale, layer.elem)

    # torch.ao's quantized modules are built with from_float(float_module).
    from_float = from_linear

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[-1]) * 8 // self.bits

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _same_device(x, self.weight, "x")
        op = _quantized_matmul if _eager(x) else torch.ops.microscale.quantized_matmul
        y: torch.Tensor = op(_widened(x), self.weight, self.scales, self.biases, self.bias,
                             self.mode, self.group_size, self.bits, self.global_scale, self.elem)
        return y.to(_product_dtype(x, self.scales, self.mode))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"mode={self.mode!r}, group_size={self.group_size}, bits={self.bits}, "
                f"global_scale={self.global_scale}")


class QQLinear(torch.nn.Module):
    """``y = x @ W^T + bias`` with both operands quantized (nvfp4 W4A4, mxfp4, mxfp8), a
    ``torch.nn.Module`` over :func:`microscale.qqmm`: the weight once, x on every call.

    nvfp4 weights are three-level; the activations use their own amax on each call (dynamic
    per-tensor scale) until :meth:`calibrate` freezes a static one (``input_global_scale``), as
    torchao's NVFP4 dynamic and static configurations do. Inference only."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor] = None, mode: str = "nvfp4",
                 group_size: Optional[int] = None, bits: Optional[int] = None,
                 global_scale: Optional[float] = None, input_global_scale: Optional[float] = None,
                 scale_rule: str = "ceil", nonfinite: str = "propagate", elem: str = "e4m3") -> None:
        super().__init__()
        if mode not in ("nvfp4", "mxfp4", "mxfp8"):
            raise ValueError(f"QQLinear: mode must be nvfp4, mxfp4 or mxfp8, got {mode!r}")
        defaults = _core.mode_defaults(mode)
        self.mode = mode
        self.group_size = defaults[0] if group_size is None else int(group_size)
        self.bits = defaults[1] if bits is None else int(bits)
        self.global_scale = None if global_scale is None else float(np.float32(global_scale))
        if input_global_scale is not None and self.global_scale is None:
            raise ValueError("QQLinear: input_global_scale needs a three-level nvfp4 weight "
                             "(global_scale)")
        self.input_global_scale = (None if input_global_scale is None
                                   else float(np.float32(input_global_scale)))
        self.scale_rule = scale_rule
        self.nonfinite = nonfinite
        self.elem = elem
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: Union[torch.nn.Linear, torch.Tensor],
                    bias: Optional[torch.Tensor] = None, mode: str = "nvfp4",
                    group_size: Optional[int] = None, bits: Optional[int] = None,
                    global_scale: Optional[float] = None, scale_rule: str = "ceil",
                    nonfinite: str = "propagate", elem: str = "e4m3") -> "QQLinear":
        """Quantize an ``nn.Linear`` (or a float ``[out, in]`` weight and optional bias) as
        :meth:`microscale.QQLinear.from_linear` does."""
        from .layers import QQLinear as _NumpyQQ

        w, b = _weight_and_bias(linear, bias)
        layer = _NumpyQQ.from_linear(w, b, mode=mode, group_size=group_size, bits=bits,
                                     global_scale=global_scale, scale_rule=scale_rule,
                                     nonfinite=nonfinite, elem=elem)
        return cls(_req(layer.weight), _req(layer.scales), _torch(layer.bias), layer.mode,
                   layer.group_size, layer.bits, layer.global_scale, None, scale_rule,
                   nonfinite, elem)

    from_float = from_linear  # as QuantizedLinear.from_float

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[-1]) * 8 // self.bits

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def calibrate(self, batches: Iterable[torch.Tensor]) -> "QQLinear":
        """Freeze the nvfp4 activation global scale at the largest amax over ``batches`` (float
        tensors ``[..., in_features]``; NaN, Inf, all-zero and wrongly shaped batches are refused,
        as :meth:`microscale.QQLinear.calibrate` refuses them). Returns self."""
        from .layers import QQLinear as _NumpyQQ

        probe = _NumpyQQ(self.weight, self.scales, None, self.mode, self.group_size, self.bits,
                         self.global_scale, None, self.scale_rule, self.nonfinite, self.elem)
        self.input_global_scale = float(probe.calibrate(batches).input_global_scale)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _same_device(x, self.weight, "x")
        op = _qqmm if _eager(x) else torch.ops.microscale.qqmm
        y: torch.Tensor = op(x, self.weight, self.scales, self.bias, self.mode, self.group_size,
                             self.bits, self.input_global_scale, self.global_scale,
                             self.scale_rule, self.nonfinite, self.elem)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"mode={self.mode!r}, global_scale={self.global_scale}, "
                f"input_global_scale={self.input_global_scale}")


class DenseLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose products of up to ``MAX_ROWS`` rows on the CPU (decode) run
    :func:`microscale.linear`: the weight read once, in its own dtype, by microscale's threads.
    A quantized model keeps some layers in bfloat16, and a language model's head is the largest
    of them (525 MB in a 1B Llama): torch's bfloat16 product reads it at about half the memory
    bandwidth. More rows and other devices take ``nn.Linear``'s own path; gradients are
    nn.Linear's, computed by torch. The result differs from nn.Linear's only in float32
    summation order."""

    MAX_ROWS = 8

    @classmethod
    def sharing(cls, module: torch.nn.Linear) -> "DenseLinear":
        """A DenseLinear holding ``module``'s own parameters (not copies: tied weights stay
        tied)."""
        dense = cls.__new__(cls)
        torch.nn.Module.__init__(dense)
        dense.in_features, dense.out_features = module.in_features, module.out_features
        dense.weight = module.weight
        dense.bias = module.bias
        return dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _same_device(x, self.weight, "x")
        if _eager(x):  # refused here by its own name, not as torch's matmul operand
            _float_input(x, "x")
        if (x.device.type != "cpu" or x.numel() > self.MAX_ROWS * self.in_features
                or x.dtype != self.weight.dtype):
            return super().forward(x)
        grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        run = _linear if _eager(x) and not grad else torch.ops.microscale.linear
        y: torch.Tensor = run(x, self.weight, self.bias)
        return y


class QuantizedExperts(torch.nn.Module):
    """The experts of a mixture-of-experts block, each projection a stack ``[E, N, K]`` of
    quantized weights multiplied through :func:`microscale.gather_qmm`, with the forward signature
    of transformers' experts modules: ``(hidden_states [T, H], top_k_index [T, k],
    top_k_weights [T, k]) -> [T, H]``.

    Each stack's buffers are ``{role}_weight``, ``{role}_scales``, ``{role}_biases`` (affine) and
    ``{role}_global_scales`` (nvfp4 three-level: the amax of each expert) for the roles gate, up
    and down. Experts quantized with one global scale each are multiplied in two-level form and
    their outputs scaled by ``amax / 2688`` per expert, which differs from scaling each block's
    decoded scale only in float32 rounding. ``gate_bias`` / ``up_bias`` / ``down_bias`` ``[E, N]``
    (gpt-oss) are added to each product. A stack with ``input_global_scales`` (buffer
    ``{role}_input_global_scales`` ``[E]``: each expert's static activation amax, three-level
    nvfp4 only) runs W4A4: each expert's input quantized with its own amax and multiplied as a
    :class:`QQLinear` of that expert would (``microscale::gather_qqmm``). ``activation`` is
    ``"swiglu"`` (``act(gate) * up``, transformers' default experts) or ``"gpt_oss"`` (its
    clamped gate with ``alpha`` and ``limit``)."""

    ROLES = ("gate", "up", "down")

    def __init__(self, stacks: dict[str, dict[str, Any]], act_fn: Any = None,
                 activation: str = "swiglu", alpha: float = 1.702, limit: float = 7.0,
                 expert_biases: Optional[dict[str, torch.Tensor]] = None) -> None:
        super().__init__()
        if activation not in ("swiglu", "gpt_oss"):
            raise ValueError(f"activation must be 'swiglu' or 'gpt_oss', got {activation!r}")
        specs = {(s["mode"], s["group_size"], s["bits"], s["elem"]) for s in stacks.values()}
        if set(stacks) != set(self.ROLES) or len(specs) != 1:
            raise ValueError("QuantizedExperts: needs gate, up and down stacks of one format")
        self.mode, self.group_size, self.bits, self.elem = specs.pop()
        self.activation = activation
        self.act_fn = act_fn
        self.alpha = float(alpha)
        self.limit = float(limit)
        # One global scale for the whole stack is the exact three-level product; decided here,
        # not per call, so that torch.compile sees no data-dependent branch.
        self._stack_amax: dict[str, Optional[float]] = {}
        self._per_expert_amax: dict[str, bool] = {}
        for role in self.ROLES:
            s = stacks[role]
            amax = s.get("global_scales")
            uniform = amax is None or bool((amax == amax[0]).all())
            self._stack_amax[role] = None if amax is None or not uniform else float(amax[0])
            self._per_expert_amax[role] = not uniform
            input_amax = s.get("input_global_scales")
            if input_amax is not None and (s["mode"] != "nvfp4" or amax is None):
                raise ValueError(f"QuantizedExperts: {role}: input_global_scales need a "
                                 "three-level nvfp4 stack (global_scales); W4A4 is nvfp4")
            if input_amax is not None and tuple(input_amax.shape) != (s["weight"].shape[0],):
                raise ValueError(f"QuantizedExperts: {role}: input_global_scales is "
                                 f"{list(input_amax.shape)}, expected one amax per expert "
                                 f"[{s['weight'].shape[0]}]")
            self.register_buffer(f"{role}_weight", s["weight"])
            self.register_buffer(f"{role}_scales", s["scales"])
            self.register_buffer(f"{role}_biases", s.get("biases"))
            self.register_buffer(f"{role}_global_scales", s.get("global_scales"))
            self.register_buffer(f"{role}_input_global_scales", input_amax)
            bias = (expert_biases or {}).get(role)
            self.register_buffer(f"{role}_bias", bias)

    @property
    def num_experts(self) -> int:
        return int(self.gate_weight.shape[0])

    def _project(self, role: str, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x ``[T, k or 1, 1, K]`` through expert ``index [T, k]`` of one stack: ``[T, k, N]``."""
        weight, scales = getattr(self, f"{role}_weight"), getattr(self, f"{role}_scales")
        # x's batch axes [T, 1] or [T, k] broadcast against index [T, k] (gather_qmm's default
        # lhs_indices), so every token meets each of its k experts.
        gather = _gather_qmm if _eager(x) else torch.ops.microscale.gather_qmm
        input_amax: Optional[torch.Tensor] = getattr(self, f"{role}_input_global_scales")
        if input_amax is not None:  # W4A4 with QQLinear's default rounding rules, as loaded
            gather_qq = _gather_qqmm if _eager(x) else torch.ops.microscale.gather_qqmm
            y = gather_qq(x, weight, scales, getattr(self, f"{role}_global_scales"), input_amax,
                          index, self.mode, self.group_size, self.bits, "ceil", "propagate",
                          self.elem)[:, :, 0, :]
        elif not self._per_expert_amax[role]:
            y = gather(_widened(x), weight, scales, getattr(self, f"{role}_biases"), None, index,
                       self.mode, self.group_size, self.bits, self._stack_amax[role],
                       self.elem)[:, :, 0, :]
        else:
            amax: torch.Tensor = getattr(self, f"{role}_global_scales")
            y = gather(x.float(), weight, scales, None, None, index, self.mode, self.group_size,
                       self.bits, None, self.elem)[:, :, 0, :]
            y = y * (amax / 2688)[index][..., None]
        y = y.to(_product_dtype(x, scales, self.mode))
        bias: Optional[torch.Tensor] = getattr(self, f"{role}_bias")
        if bias is not None:
            y = y + bias[index]
        return y

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        _same_device(hidden_states, self.gate_weight, "hidden_states")
        if _eager(hidden_states):  # refused here by its own name, not as gather_qmm's x
            _float_input(hidden_states, "hidden_states")
        tokens, hidden = hidden_states.shape
        x = hidden_states.reshape(tokens, 1, 1, hidden)
        gate = self._project("gate", x, top_k_index)
        up = self._project("up", x, top_k_index)
        if self.activation == "gpt_oss":
            gate = gate.clamp(max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            h = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        else:
            h = self.act_fn(gate) * up
        down = self._project("down", h.unsqueeze(2), top_k_index)
        out = (down * top_k_weights[..., None].to(down.dtype)).sum(dim=1)
        return out.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, mode={self.mode!r}, "
                f"group_size={self.group_size}, activation={self.activation!r}")


def from_pretrained(path: Any, dtype: Optional[torch.dtype] = None,
                    trust_remote_code: bool = False) -> Any:
    """A transformers model running microscale's kernels on a quantized checkpoint: see
    :func:`microscale.pretrained.from_pretrained`."""
    from .pretrained import from_pretrained as load

    return load(path, dtype=dtype, trust_remote_code=trust_remote_code)


def save_pretrained(model: Any, path: Any, force: bool = False) -> None:
    """Write a model from :func:`from_pretrained` in its source layout (see
    :mod:`microscale.pretrained`)."""
    from .pretrained import save_pretrained as save

    save(model, path, force=force)

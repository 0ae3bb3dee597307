# Type stubs of the public API (mypy --strict clean; tests/python/typing_usage.py exercises them).
# Array arguments are numpy arrays, anything numpy can read, or any array with __dlpack__ (torch,
# MLX, JAX). Results are typed as numpy arrays when the first array argument is one (or with
# out_type="numpy"); other inputs give their own array type at run time, typed Any here so that
# the stubs need no torch or MLX.
import enum
import os
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Optional, Protocol, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str
__all__: list[str]

class _DLPackArray(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

NDArray = np.ndarray[Any, np.dtype[Any]]
ArrayIn = Union[npt.ArrayLike, _DLPackArray]
# The dtypes an output may be asked for: names, numpy / ml_dtypes types, torch or MLX dtypes.
DTypeLike = Union[Literal["float32", "float16", "bfloat16"], npt.DTypeLike, Any]
Scalar = Union[float, np.floating[Any], NDArray, _DLPackArray]

class OutType(enum.Enum):
    numpy = "numpy"
    torch = "torch"
    mlx = "mlx"

OutTypeArg = Union[None, Literal["numpy", "torch", "mlx"], OutType]
_NumpyOut = Union[None, Literal["numpy"]]

@overload
def quantize(w: NDArray, mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
             global_scale: Optional[Scalar] = ..., layout: str = ..., scale_rule: str = ...,
             nonfinite: str = ..., elem: str = ..., scale_search: str = ...,
             scale_2d: bool = ..., hadamard: bool = ..., sr_seed: Optional[int] = ...,
             out_type: _NumpyOut = ...) -> tuple[NDArray, ...]: ...
@overload
def quantize(w: ArrayIn, mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
             global_scale: Optional[Scalar] = ..., layout: str = ..., scale_rule: str = ...,
             nonfinite: str = ..., elem: str = ..., scale_search: str = ...,
             scale_2d: bool = ..., hadamard: bool = ..., sr_seed: Optional[int] = ...,
             out_type: OutTypeArg = ...) -> tuple[Any, ...]: ...
@overload
def dequantize(w_q: NDArray, scales: ArrayIn, biases: Optional[ArrayIn] = ..., mode: str = ...,
               global_scale: Optional[Scalar] = ..., dtype: DTypeLike = ..., layout: str = ...,
               group_size: Optional[int] = ..., bits: Optional[int] = ..., scale_rule: str = ...,
               nonfinite: str = ..., elem: str = ..., out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def dequantize(w_q: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ..., mode: str = ...,
               global_scale: Optional[Scalar] = ..., dtype: DTypeLike = ..., layout: str = ...,
               group_size: Optional[int] = ..., bits: Optional[int] = ..., scale_rule: str = ...,
               nonfinite: str = ..., elem: str = ..., out_type: OutTypeArg = ...) -> Any: ...
@overload
def quantize_dequantize(x: NDArray, mode: str = ..., group_size: Optional[int] = ...,
                        bits: Optional[int] = ..., global_scale: Optional[Scalar] = ...,
                        scale_rule: str = ..., nonfinite: str = ..., elem: str = ...,
                        dtype: Optional[DTypeLike] = ..., scale_2d: bool = ...,
                        hadamard: bool = ..., sr_seed: Optional[int] = ...,
                        out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def quantize_dequantize(x: ArrayIn, mode: str = ..., group_size: Optional[int] = ...,
                        bits: Optional[int] = ..., global_scale: Optional[Scalar] = ...,
                        scale_rule: str = ..., nonfinite: str = ..., elem: str = ...,
                        dtype: Optional[DTypeLike] = ..., scale_2d: bool = ...,
                        hadamard: bool = ..., sr_seed: Optional[int] = ...,
                        out_type: OutTypeArg = ...) -> Any: ...
@overload
def gptq(w: NDArray, hessian: npt.ArrayLike, mode: str = ..., group_size: Optional[int] = ...,
         bits: Optional[int] = ..., global_scale: Optional[Scalar] = ..., layout: str = ...,
         scale_rule: str = ..., elem: str = ..., damp: float = ..., block_size: int = ...,
         out_type: _NumpyOut = ...) -> tuple[NDArray, ...]:
    """GPTQ quantization of ``w`` (float32 / float16 / bfloat16 ``[N, K]``) with
    ``hessian = X^T X`` (float64 or float32 ``[K, K]``); returns what :func:`quantize` returns
    for the mode: ``(w_q, scales)`` or ``(w_q, scales, biases)`` for affine."""
@overload
def gptq(w: ArrayIn, hessian: npt.ArrayLike, mode: str = ..., group_size: Optional[int] = ...,
         bits: Optional[int] = ..., global_scale: Optional[Scalar] = ..., layout: str = ...,
         scale_rule: str = ..., elem: str = ..., damp: float = ..., block_size: int = ...,
         out_type: OutTypeArg = ...) -> tuple[Any, ...]: ...
def accumulate_hessian(x: ArrayIn, h: Optional[NDArray] = ...) -> NDArray:
    """``H += X^T X`` in float64 for activations ``x`` (float32 / float16 / bfloat16
    ``[..., K]``); ``h`` None or a float64 C-contiguous ``[K, K]`` numpy array updated in place;
    returns ``h``."""
def global_scale(w: ArrayIn) -> np.float32: ...
@overload
def hadamard_transform(x: NDArray, dtype: DTypeLike = ..., out_type: _NumpyOut = ...) -> NDArray:
    """16-point random Hadamard transform along the last axis (K % 16 == 0); bfloat16 values."""
@overload
def hadamard_transform(x: ArrayIn, dtype: DTypeLike = ..., out_type: OutTypeArg = ...) -> Any:
    """16-point random Hadamard transform along the last axis (K % 16 == 0); bfloat16 values."""
@overload
def swizzle_scales(scales: NDArray, out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def swizzle_scales(scales: ArrayIn, out_type: OutTypeArg = ...) -> Any: ...
@overload
def unswizzle_scales(scales: NDArray, rows: int, cols: int, out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def unswizzle_scales(scales: ArrayIn, rows: int, cols: int, out_type: OutTypeArg = ...) -> Any: ...
@overload
def encode(x: NDArray, fmt: str, out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def encode(x: ArrayIn, fmt: str, out_type: OutTypeArg = ...) -> Any: ...
@overload
def decode(codes: NDArray, fmt: str, out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def decode(codes: ArrayIn, fmt: str, out_type: OutTypeArg = ...) -> Any: ...
def set_backend(name: str) -> None: ...
def backend() -> str: ...
def set_cpu_target(name: str) -> None: ...
def cpu_target() -> str: ...
def available_cpu_targets() -> list[str]: ...
def set_num_threads(n: int) -> None: ...
def num_threads() -> int: ...

@overload
def quantized_matmul(x: NDArray, w_q: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ...,
                     transpose: bool = ..., mode: str = ..., group_size: Optional[int] = ...,
                     bits: Optional[int] = ..., global_scale_w: Optional[Scalar] = ...,
                     elem: str = ..., bias: Optional[ArrayIn] = ..., out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def quantized_matmul(x: ArrayIn, w_q: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ...,
                     transpose: bool = ..., mode: str = ..., group_size: Optional[int] = ...,
                     bits: Optional[int] = ..., global_scale_w: Optional[Scalar] = ...,
                     elem: str = ..., bias: Optional[ArrayIn] = ..., out_type: OutTypeArg = ...) -> Any: ...
@overload
def linear(x: NDArray, w: ArrayIn, bias: Optional[ArrayIn] = ..., out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def linear(x: ArrayIn, w: ArrayIn, bias: Optional[ArrayIn] = ..., out_type: OutTypeArg = ...) -> Any: ...
@overload
def qqmm(x: NDArray, w: ArrayIn, scales: Optional[ArrayIn] = ..., mode: str = ...,
         group_size: Optional[int] = ..., bits: Optional[int] = ..., global_scale_x: Optional[Scalar] = ...,
         global_scale_w: Optional[Scalar] = ..., scale_rule: str = ..., nonfinite: str = ...,
         elem: str = ..., bias: Optional[ArrayIn] = ..., out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def qqmm(x: ArrayIn, w: ArrayIn, scales: Optional[ArrayIn] = ..., mode: str = ...,
         group_size: Optional[int] = ..., bits: Optional[int] = ..., global_scale_x: Optional[Scalar] = ...,
         global_scale_w: Optional[Scalar] = ..., scale_rule: str = ..., nonfinite: str = ...,
         elem: str = ..., bias: Optional[ArrayIn] = ..., out_type: OutTypeArg = ...) -> Any: ...
@overload
def gather_qmm(x: NDArray, w_q: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ...,
               lhs_indices: Optional[ArrayIn] = ..., rhs_indices: Optional[ArrayIn] = ...,
               transpose: bool = ..., mode: str = ..., group_size: Optional[int] = ...,
               bits: Optional[int] = ..., global_scale_w: Optional[Scalar] = ..., elem: str = ...,
               sorted_indices: bool = ..., out_type: _NumpyOut = ...) -> NDArray: ...
@overload
def gather_qmm(x: ArrayIn, w_q: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ...,
               lhs_indices: Optional[ArrayIn] = ..., rhs_indices: Optional[ArrayIn] = ...,
               transpose: bool = ..., mode: str = ..., group_size: Optional[int] = ...,
               bits: Optional[int] = ..., global_scale_w: Optional[Scalar] = ..., elem: str = ...,
               sorted_indices: bool = ..., out_type: OutTypeArg = ...) -> Any: ...

@dataclass
class QuantizedWeight:
    packed: NDArray
    scales: NDArray
    biases: Optional[NDArray]
    mode: str
    group_size: int
    bits: int
    shape: tuple[int, ...]
    global_scale: Optional[float] = ...
    input_amax: Optional[float] = ...
    elem: str = ...
    @classmethod
    def from_float(cls, w: ArrayIn, mode: str = ..., group_size: Optional[int] = ...,
                   bits: Optional[int] = ..., global_scale: Union[bool, float, None] = ...,
                   **kwargs: Any) -> QuantizedWeight: ...
    def dequantize(self, dtype: DTypeLike = ...) -> NDArray: ...

class _Layer(QuantizedWeight):
    @property
    def weight(self) -> NDArray: ...
    @weight.setter
    def weight(self, value: NDArray) -> None: ...

class QuantizedLinear(_Layer):
    bias: Optional[NDArray]
    def __init__(self, weight: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ...,
                 bias: Optional[ArrayIn] = ..., mode: str = ..., group_size: Optional[int] = ...,
                 bits: Optional[int] = ..., global_scale: Optional[Scalar] = ..., elem: str = ...) -> None: ...
    @classmethod
    def from_linear(cls, weight: ArrayIn, bias: Optional[ArrayIn] = ..., mode: str = ...,
                    group_size: Optional[int] = ..., bits: Optional[int] = ...,
                    use_global_scale: bool = ..., global_scale: Optional[Scalar] = ...,
                    scale_rule: str = ..., nonfinite: str = ..., elem: str = ...) -> QuantizedLinear: ...
    from_float = from_linear  # type: ignore[assignment]
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    @overload
    def __call__(self, x: NDArray, out_type: _NumpyOut = ...) -> NDArray: ...
    @overload
    def __call__(self, x: ArrayIn, out_type: OutTypeArg = ...) -> Any: ...
    forward = __call__

class QuantizedEmbedding(_Layer):
    dtype: np.dtype[Any]
    def __init__(self, weight: ArrayIn, scales: ArrayIn, biases: Optional[ArrayIn] = ...,
                 mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
                 global_scale: Optional[Scalar] = ..., elem: str = ..., dtype: DTypeLike = ...) -> None: ...
    @classmethod
    def from_embedding(cls, table: ArrayIn, mode: str = ..., group_size: Optional[int] = ...,
                       bits: Optional[int] = ..., use_global_scale: bool = ...,
                       global_scale: Optional[Scalar] = ..., scale_rule: str = ...,
                       nonfinite: str = ..., elem: str = ...) -> QuantizedEmbedding: ...
    from_float = from_embedding  # type: ignore[assignment]
    @property
    def num_embeddings(self) -> int: ...
    @property
    def dims(self) -> int: ...
    @overload
    def __call__(self, indices: NDArray, out_type: _NumpyOut = ...) -> NDArray: ...
    @overload
    def __call__(self, indices: ArrayIn, out_type: OutTypeArg = ...) -> Any: ...
    forward = __call__
    @overload
    def as_linear(self, x: NDArray, out_type: _NumpyOut = ...) -> NDArray: ...
    @overload
    def as_linear(self, x: ArrayIn, out_type: OutTypeArg = ...) -> Any: ...

class QQLinear(_Layer):
    bias: Optional[NDArray]
    input_global_scale: Optional[np.float32]
    scale_rule: str
    nonfinite: str
    def __init__(self, weight: ArrayIn, scales: ArrayIn, bias: Optional[ArrayIn] = ...,
                 mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
                 global_scale: Optional[Scalar] = ..., input_global_scale: Optional[Scalar] = ...,
                 scale_rule: str = ..., nonfinite: str = ..., elem: str = ...) -> None: ...
    @classmethod
    def from_linear(cls, weight: ArrayIn, bias: Optional[ArrayIn] = ..., mode: str = ...,
                    group_size: Optional[int] = ..., bits: Optional[int] = ...,
                    global_scale: Optional[Scalar] = ..., scale_rule: str = ...,
                    nonfinite: str = ..., elem: str = ...) -> QQLinear: ...
    from_float = from_linear  # type: ignore[assignment]
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    def calibrate(self, batches: Iterable[ArrayIn]) -> QQLinear: ...
    @overload
    def __call__(self, x: NDArray, out_type: _NumpyOut = ...) -> NDArray: ...
    @overload
    def __call__(self, x: ArrayIn, out_type: OutTypeArg = ...) -> Any: ...
    forward = __call__

@dataclass
class LoadedCheckpoint:
    layers: dict[str, QuantizedWeight] = ...
    tensors: dict[str, NDArray] = ...
    config: Optional[dict[str, Any]] = ...
    format: str = ...

def load_checkpoint(path: Union[str, os.PathLike[str]]) -> LoadedCheckpoint: ...
def save_checkpoint(path: Union[str, os.PathLike[str]], layers: dict[str, QuantizedWeight],
                    tensors: Optional[dict[str, ArrayIn]] = ..., config: Optional[dict[str, Any]] = ...,
                    export: str = ..., force: bool = ...) -> None: ...

@dataclass
class BudgetChoice:
    layers: str
    format: str
    bits: float
    error: float

@dataclass
class QuantizeReport:
    tensors: list[dict[str, str]] = ...
    budget: list[BudgetChoice] = ...
    notes: list[str] = ...
    def formats(self) -> dict[str, str]: ...

_Path = Union[str, os.PathLike[str]]
def quantize_checkpoint(model: _Path, output: _Path, format: str = ..., export: Optional[str] = ...,
                        recipe: Union[_Path, dict[str, str], Sequence[tuple[str, str]], None] = ...,
                        budget: Optional[float] = ..., candidates: Optional[Sequence[str]] = ...,
                        budget_csv: Optional[_Path] = ..., hessians: Optional[_Path] = ...,
                        exclude: Sequence[str] = ..., include: Sequence[str] = ...,
                        force: bool = ...) -> QuantizeReport: ...

# Internal, for microscale.torch.
_core: Any
def _deliver(result: Any, kind: OutType) -> Any: ...

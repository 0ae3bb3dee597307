# Type stubs of microscale.torch (needs torch; mypy --strict clean, see
# tests/python/typing_usage_torch.py).
import os
from typing import Any, Iterable, Optional, Union

import torch

__all__: list[str]

class FakeQuantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mode: str, group_size: Optional[int], bits: Optional[int],
                global_scale_: Optional[float], scale_rule: str, elem: str) -> torch.Tensor: ...
    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]: ...

def fake_quantize(x: torch.Tensor, mode: str = ..., group_size: Optional[int] = ...,
                  bits: Optional[int] = ..., global_scale: Union[None, float, torch.Tensor] = ...,
                  scale_rule: str = ..., elem: str = ...) -> torch.Tensor: ...

class QuantizedLinear(torch.nn.Module):
    weight: torch.Tensor
    scales: torch.Tensor
    biases: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    mode: str
    group_size: int
    bits: int
    global_scale: Optional[float]
    elem: str
    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, biases: Optional[torch.Tensor] = ...,
                 bias: Optional[torch.Tensor] = ..., mode: str = ..., group_size: Optional[int] = ...,
                 bits: Optional[int] = ..., global_scale: Optional[float] = ..., elem: str = ...) -> None: ...
    @classmethod
    def from_linear(cls, linear: Union[torch.nn.Linear, torch.Tensor], bias: Optional[torch.Tensor] = ...,
                    mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
                    use_global_scale: bool = ..., global_scale: Optional[float] = ...,
                    scale_rule: str = ..., elem: str = ...) -> QuantizedLinear: ...
    from_float = from_linear
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

class QQLinear(torch.nn.Module):
    weight: torch.Tensor
    scales: torch.Tensor
    bias: Optional[torch.Tensor]
    mode: str
    group_size: int
    bits: int
    global_scale: Optional[float]
    input_global_scale: Optional[float]
    scale_rule: str
    nonfinite: str
    elem: str
    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: Optional[torch.Tensor] = ...,
                 mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
                 global_scale: Optional[float] = ..., input_global_scale: Optional[float] = ...,
                 scale_rule: str = ..., nonfinite: str = ..., elem: str = ...) -> None: ...
    @classmethod
    def from_linear(cls, linear: Union[torch.nn.Linear, torch.Tensor], bias: Optional[torch.Tensor] = ...,
                    mode: str = ..., group_size: Optional[int] = ..., bits: Optional[int] = ...,
                    global_scale: Optional[float] = ..., scale_rule: str = ..., nonfinite: str = ...,
                    elem: str = ...) -> QQLinear: ...
    from_float = from_linear
    @property
    def in_features(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    def calibrate(self, batches: Iterable[torch.Tensor]) -> QQLinear: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

class DenseLinear(torch.nn.Linear):
    MAX_ROWS: int
    @classmethod
    def sharing(cls, module: torch.nn.Linear) -> DenseLinear: ...
    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

class QuantizedExperts(torch.nn.Module):
    ROLES: tuple[str, str, str]
    mode: str
    group_size: int
    bits: int
    elem: str
    activation: str
    checkpoint_names: dict[str, Union[str, list[str]]]
    def __init__(self, stacks: dict[str, dict[str, Any]], act_fn: Any = ..., activation: str = ...,
                 alpha: float = ..., limit: float = ...,
                 expert_biases: Optional[dict[str, torch.Tensor]] = ...) -> None: ...
    @property
    def num_experts(self) -> int: ...
    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor: ...
    def __call__(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor: ...

# A transformers PreTrainedModel (Any: the stubs do not import transformers).
def from_pretrained(path: Union[str, os.PathLike[str]], dtype: Optional[torch.dtype] = ...,
                    trust_remote_code: bool = ...) -> Any: ...
def save_pretrained(model: Any, path: Union[str, os.PathLike[str]], force: bool = ...) -> None: ...

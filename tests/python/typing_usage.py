"""Type-checked, not run: mypy --strict on this file checks the package's stubs
(python/microscale/*.pyi) against ordinary use (tests/python/test_typing.py runs it)."""

from __future__ import annotations

from typing import Any

import numpy as np

import microscale


def numpy_use() -> float:
    w = np.zeros((4, 64), np.float32)
    wq, scales = microscale.quantize(w, mode="nvfp4", global_scale=microscale.global_scale(w))
    y: np.ndarray[Any, np.dtype[Any]] = microscale.dequantize(wq, scales, mode="nvfp4", dtype="bfloat16")
    fq = microscale.quantize_dequantize(w, mode="mxfp4", scale_rule="floor")
    mm = microscale.quantized_matmul(np.ones((2, 64), np.float32), wq, scales, mode="nvfp4")
    qq = microscale.qqmm(w, w, mode="mxfp8", elem="e5m2")
    dense: np.ndarray[Any, np.dtype[Any]] = microscale.linear(np.ones((1, 64), np.float32), w)
    layer = microscale.QuantizedLinear.from_linear(w, mode="nvfp4")
    out = layer(np.ones((1, 64), np.float32))
    q2 = microscale.QQLinear.from_linear(w).calibrate([w, 2 * w])
    as_float: microscale.QuantizedLinear = microscale.QuantizedLinear.from_float(w, mode="mxfp4")
    emb: microscale.QuantizedEmbedding = microscale.QuantizedEmbedding.from_float(w, mode="mxfp8")
    qq_float: microscale.QQLinear = microscale.QQLinear.from_float(w, None, "mxfp8")
    codes = microscale.encode(w, "e4m3")
    back = microscale.decode(codes, "e4m3", out_type=microscale.OutType.numpy)
    microscale.set_num_threads(1)
    targets: list[str] = microscale.available_cpu_targets()
    return float(y.sum() + fq.sum() + mm.sum() + qq.sum() + out.sum() + back.sum() + dense.sum()) + len(targets) + (
        q2.out_features + as_float.in_features + emb.dims + qq_float.out_features)


def dlpack_use(t: Any) -> Any:
    """Any array with __dlpack__ (a torch tensor here) goes in; its own type comes out."""
    packed, scales = microscale.quantize(t, mode="mxfp8")
    return microscale.dequantize(packed, scales, mode="mxfp8", dtype="float16", out_type="torch")


def checkpoint_use() -> float:
    report: microscale.QuantizeReport = microscale.quantize_checkpoint(
        "model", "out", format="nvfp4,scale_search=mse", export="mlx",
        recipe={"*.down_proj": "mxfp8", "*.o_proj": "keep"}, budget=5.0, candidates=["nvfp4", "mxfp8", "keep"],
        budget_csv="choice.csv", exclude=["lm_head"], force=True)
    microscale.quantize_checkpoint("model", "out", recipe=[("*.down_proj", "mxfp8")])
    microscale.quantize_checkpoint("model", "out", recipe="recipe.json")
    formats: dict[str, str] = report.formats()
    first: microscale.BudgetChoice = report.budget[0]
    return first.bits + first.error + len(formats) + len(report.notes)

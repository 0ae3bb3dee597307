"""Type-checked, not run, where torch is installed: mypy --strict over microscale.torch's
annotations in ordinary use (tests/python/test_typing.py runs it)."""

from __future__ import annotations

import torch

import microscale
import microscale.torch as mst


def train_step(w: torch.Tensor, x: torch.Tensor) -> float:
    y = mst.fake_quantize(w, mode="nvfp4", global_scale=float(microscale.global_scale(w)))
    loss = (x @ y.T).square().mean()
    lin = mst.QuantizedLinear.from_linear(torch.nn.Linear(64, 32), mode="mxfp4")
    qq = mst.QQLinear.from_linear(w).calibrate([x])
    lin_float: mst.QuantizedLinear = mst.QuantizedLinear.from_float(torch.nn.Linear(64, 32), mode="mxfp8")
    qq_float: mst.QQLinear = mst.QQLinear.from_float(torch.nn.Linear(64, 32), None, "mxfp4")
    dense: mst.DenseLinear = mst.DenseLinear.sharing(torch.nn.Linear(64, 32))
    out: torch.Tensor = lin(x) + qq(x) + dense(x)
    return float(out.sum()) + float(loss) + lin.in_features + lin_float.out_features + qq_float.out_features


def run_checkpoint(path: str) -> torch.Tensor:
    model = mst.from_pretrained(path, dtype=torch.bfloat16)
    mst.save_pretrained(model, path + "-copy", force=True)
    experts = [m for m in model.modules() if isinstance(m, mst.QuantizedExperts)]
    ids = torch.zeros(1, 4, dtype=torch.long)
    logits: torch.Tensor = model(ids).logits
    return logits if not experts else experts[0](logits[0], ids[0, :, None], logits[0, :, :1])

"""Every public function that takes arrays, fed each kind of tensor torch users hold (issue 27).

Each array argument of each call is replaced in turn by another kind of tensor holding the same
values: a transposed or step-sliced view, a tensor with torch's negative bit, one that requires
grad, a plain subclass, a Parameter. The result must be that of the plain contiguous tensor. The
kinds that hold no readable memory (FakeTensor, a meta tensor, a wrapper subclass) and the complex
conjugate-bit tensors must be refused with a ValueError or TypeError naming the argument. 0-size
tensors (torch gives them a null data pointer) must behave as numpy's 0-size arrays do.
"""

import re

import ml_dtypes
import numpy as np
import pytest

import microscale

torch = pytest.importorskip("torch")
mst = pytest.importorskip("microscale.torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._pytree import tree_map  # noqa: E402

from conftest import assert_same_bits  # noqa: E402


class _Wrapper(torch.Tensor):
    """A wrapper subclass (torchao's and DTensor's mechanism): no storage of its own, every op
    forwarded to the tensor it wraps."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,
                                                   device=inner.device, strides=inner.stride())

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a.inner if isinstance(a, _Wrapper) else a  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda o: _Wrapper(o) if isinstance(o, torch.Tensor) else o, out)


class _Plain(torch.Tensor):
    """A subclass without dispatch of its own: its memory is a plain tensor's."""


def _stepped(p):
    """p as a view with a step along the last axis (a non-unit stride)."""
    big = torch.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=p.dtype)
    big[..., ::2] = p
    return big[..., ::2]


def _transposed(p):
    return p.mT.contiguous().mT


def _negative_bit(p):
    t = torch._neg_view(-p)
    assert t.is_neg()
    return t


def _requires_grad(p):
    if not p.is_floating_point():
        raise NotImplementedError("only float tensors require grad")
    return p.clone().requires_grad_()


def _fake(p):
    return FakeTensorMode(allow_non_fake_inputs=True).from_tensor(p)


# Kinds with the same values as the plain tensor: the results must be the plain tensor's.
READABLE = {
    "transposed": _transposed,
    "stepped": _stepped,
    "negative_bit": _negative_bit,
    "requires_grad": _requires_grad,
    "plain_subclass": lambda p: p.as_subclass(_Plain),
    "parameter": lambda p: torch.nn.Parameter(p, requires_grad=False),
}
# Kinds with no memory that holds their values: refused by name.
STORAGE_LESS = {
    "fake": _fake,
    "meta": lambda p: p.to("meta"),
    "wrapper_subclass": _Wrapper,
}


def _rng_tensor(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _parts(w, **kw):
    return microscale.quantize(w, **kw)


def _cases():
    """(name, call, arrays): call(**arrays) runs one public function on the tensors `arrays`."""
    x = _rng_tensor((4, 64), 1)
    xb = _rng_tensor((3, 64), 2, torch.bfloat16)
    w = _rng_tensor((8, 64), 3)
    bias = _rng_tensor((8,), 4)
    wq, s = _parts(w, mode="nvfp4")
    wq_mx, s_mx = _parts(w, mode="mxfp8")
    wq_a, s_a, b_a = _parts(w, mode="affine", group_size=32)
    g = microscale.global_scale(w)
    wq3, s3 = _parts(w, mode="nvfp4", global_scale=g)
    h = microscale.accumulate_hessian(x.numpy())
    experts = _rng_tensor((2, 8, 64), 5)
    wq_e, s_e = _parts(experts, mode="mxfp4")
    xe = _rng_tensor((3, 1, 1, 64), 6)
    idx = torch.tensor([[1], [0], [1]], dtype=torch.int64)
    codes = torch.arange(0, 256, dtype=torch.int64).to(torch.uint8).reshape(4, 64)
    table = _rng_tensor((10, 64), 7)
    tokens = torch.tensor([[3, 1], [9, 0]], dtype=torch.int64)
    sw = microscale.swizzle_scales(s)

    nv_linear = microscale.QuantizedLinear.from_linear(w.numpy(), bias.numpy(), mode="nvfp4")
    embedding = microscale.QuantizedEmbedding.from_embedding(table.numpy(), mode="mxfp8")
    qq = microscale.QQLinear.from_linear(w.numpy(), mode="nvfp4")
    t_linear = mst.QuantizedLinear.from_linear(torch.nn.Linear(64, 8))
    t_qq = mst.QQLinear.from_linear(torch.nn.Linear(64, 8), mode="mxfp8")
    t_dense = mst.DenseLinear.sharing(torch.nn.Linear(64, 8).requires_grad_(False))

    def expert_stack(n, k, seed):
        packed, scales = _parts(_rng_tensor((2, n, k), seed), mode="mxfp4")
        return {"weight": packed, "scales": scales, "mode": "mxfp4", "group_size": 32, "bits": 4,
                "elem": "e4m3"}

    t_experts = mst.QuantizedExperts({"gate": expert_stack(32, 64, 11), "up": expert_stack(32, 64, 12),
                                      "down": expert_stack(64, 32, 13)}, torch.nn.functional.silu)

    def w4a4_stack(n, k, seed):
        w = _rng_tensor((2, n, k), seed)
        amax = float(w.abs().max())
        packed, scales = _parts(w, mode="nvfp4", global_scale=amax)
        return {"weight": packed, "scales": scales, "mode": "nvfp4", "group_size": 16, "bits": 4, "elem": "e4m3",
                "global_scales": torch.full((2,), amax), "input_global_scales": torch.tensor([3.0, 5.0])}

    t_w4a4_experts = mst.QuantizedExperts({"gate": w4a4_stack(32, 64, 14), "up": w4a4_stack(32, 64, 15),
                                           "down": w4a4_stack(64, 32, 16)}, torch.nn.functional.silu)
    routing = (torch.tensor([[1], [0], [1], [0]]), torch.full((4, 1), 0.5))

    def gs_tensor():
        return torch.tensor(float(g))

    return [
        ("quantize nvfp4", lambda w: microscale.quantize(w, mode="nvfp4"), {"w": x}),
        ("quantize bf16 affine", lambda w: microscale.quantize(w, mode="affine"), {"w": xb}),
        ("quantize out_type", lambda w: microscale.quantize(w, mode="mxfp8", out_type="numpy"), {"w": x}),
        ("quantize global_scale", lambda global_scale: microscale.quantize(x, global_scale=global_scale),
         {"global_scale": gs_tensor()}),
        ("quantize_dequantize", lambda x: microscale.quantize_dequantize(x, mode="mxfp4"), {"x": x}),
        ("dequantize nvfp4", lambda w_q, scales: microscale.dequantize(w_q, scales, mode="nvfp4"),
         {"w_q": wq, "scales": s}),
        ("dequantize nvfp4 float8 scales",
         lambda w_q, scales: microscale.dequantize(w_q, scales, mode="nvfp4", global_scale=g),
         {"w_q": wq3, "scales": s3.view(torch.float8_e4m3fn)}),
        ("dequantize mxfp8", lambda w_q, scales: microscale.dequantize(w_q, scales, mode="mxfp8"),
         {"w_q": wq_mx, "scales": s_mx}),
        ("dequantize affine",
         lambda w_q, scales, biases: microscale.dequantize(w_q, scales, biases, mode="affine", group_size=32),
         {"w_q": wq_a, "scales": s_a, "biases": b_a}),
        ("global_scale", lambda w: microscale.global_scale(w), {"w": x}),
        ("gptq", lambda w, hessian: microscale.gptq(w, hessian, mode="mxfp4"),
         {"w": w, "hessian": torch.from_numpy(h)}),
        ("accumulate_hessian", lambda x: microscale.accumulate_hessian(x), {"x": x}),
        ("hadamard_transform", lambda x: microscale.hadamard_transform(x), {"x": x}),
        ("swizzle_scales", lambda scales: microscale.swizzle_scales(scales), {"scales": s}),
        ("unswizzle_scales", lambda scales: microscale.unswizzle_scales(scales, 8, 4), {"scales": sw}),
        ("encode", lambda x: microscale.encode(x, "e4m3"), {"x": x}),
        ("decode", lambda codes: microscale.decode(codes, "e5m2"), {"codes": codes}),
        ("quantized_matmul nvfp4",
         lambda x, w_q, scales, bias: microscale.quantized_matmul(x, w_q, scales, mode="nvfp4", bias=bias),
         {"x": x, "w_q": wq, "scales": s, "bias": bias}),
        ("quantized_matmul affine",
         lambda x, w_q, scales, biases: microscale.quantized_matmul(x, w_q, scales, biases, mode="affine",
                                                                     group_size=32),
         {"x": xb, "w_q": wq_a, "scales": s_a, "biases": b_a}),
        ("qqmm float", lambda x, w: microscale.qqmm(x, w, mode="mxfp8"), {"x": x, "w": w}),
        ("linear", lambda x, w, bias: microscale.linear(x, w, bias), {"x": x, "w": w, "bias": bias}),
        ("qqmm packed", lambda x, w, scales: microscale.qqmm(x, w, scales, mode="nvfp4"),
         {"x": x, "w": wq, "scales": s}),
        ("gather_qmm",
         lambda x, w_q, scales, rhs_indices: microscale.gather_qmm(x, w_q, scales, rhs_indices=rhs_indices,
                                                                    mode="mxfp4"),
         {"x": xe, "w_q": wq_e, "scales": s_e, "rhs_indices": idx}),
        ("QuantizedLinear.from_linear",
         lambda weight, bias: microscale.QuantizedLinear.from_linear(weight, bias, mode="mxfp4")(x.numpy()),
         {"weight": w, "bias": bias}),
        ("QuantizedLinear(parts)",
         lambda weight, scales: microscale.QuantizedLinear(weight, scales, mode="nvfp4")(x.numpy()),
         {"weight": wq, "scales": s}),
        ("QuantizedLinear.__call__", lambda x: nv_linear(x), {"x": x}),
        ("QuantizedEmbedding.from_embedding",
         lambda table: microscale.QuantizedEmbedding.from_embedding(table, mode="nvfp4")(tokens.numpy()),
         {"table": table}),
        ("QuantizedEmbedding.__call__", lambda indices: embedding(indices), {"indices": tokens}),
        ("QuantizedEmbedding.as_linear", lambda x: embedding.as_linear(x), {"x": x}),
        ("QQLinear.from_linear", lambda weight: microscale.QQLinear.from_linear(weight, mode="mxfp8")(x.numpy()),
         {"weight": w}),
        ("QQLinear.__call__", lambda x: qq(x), {"x": x}),
        ("QQLinear.calibrate",
         lambda batches: microscale.QQLinear.from_linear(w.numpy()).calibrate([batches]).input_global_scale,
         {"batches": x}),
        ("QuantizedWeight.from_float",
         lambda w: microscale.QuantizedWeight.from_float(w, mode="nvfp4", global_scale=True).dequantize(),
         {"w": w}),
        ("torch.fake_quantize", lambda x: mst.fake_quantize(x, mode="nvfp4"), {"x": x}),
        ("torch.QuantizedLinear.from_linear",
         lambda weight, bias: mst.QuantizedLinear.from_linear(weight, bias, mode="mxfp8")(x), {"weight": w, "bias": bias}),
        ("torch.QuantizedLinear.forward", lambda x: t_linear(x), {"x": x}),
        ("torch.QQLinear.forward", lambda x: t_qq(x), {"x": x}),
        ("torch.DenseLinear.forward", lambda x: t_dense(x), {"x": x}),
        ("torch.QuantizedExperts.forward", lambda hidden_states: t_experts(hidden_states, *routing),
         {"hidden_states": x}),
        ("torch.QuantizedExperts.forward W4A4", lambda hidden_states: t_w4a4_experts(hidden_states, *routing),
         {"hidden_states": x}),
    ]


CASES = _cases()
CASE_IDS = [c[0] for c in CASES]


def _numpy(r):
    """A result as comparable numpy values (tuples element-wise, layers by their parts)."""
    if isinstance(r, tuple):
        return tuple(_numpy(v) for v in r)
    if isinstance(r, torch.Tensor):
        r = r.detach()
        if r.dtype == torch.bfloat16:
            return r.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if str(r.dtype).startswith("torch.float8_"):
            return r.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(r.dtype)[6:]))
        return r.numpy()
    if r is None:
        return None
    return np.asarray(r)


def _assert_same(got, want, what):
    got, want = _numpy(got), _numpy(want)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{what}[{i}]")
    else:
        assert_same_bits(got, want, what)


def _assert_names(error, arg):
    msg = str(error)
    assert "incompatible function arguments" not in msg, msg
    # The layers prefix their own name ("QuantizedLinear: weight: ..."); the products name their
    # operands ("x: ...", "w_q: ...").
    assert re.search(rf"(^|[\s:(\[.'\"]){re.escape(arg)}\b", msg), f"{arg!r} not named in: {msg}"


def _kinds_of(arrays, make, min_ndim=0):
    """(argument, arrays with that one argument replaced by make(it)) for each argument of which
    torch can make that kind (no negative bit for float8, no grad for integers)."""
    for arg, p in arrays.items():
        if p.ndim < min_ndim:
            continue
        try:
            t = make(p)
        except (NotImplementedError, RuntimeError):
            continue
        yield arg, {**arrays, arg: t}


@pytest.mark.parametrize("kind", list(READABLE))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_readable_kinds_give_the_plain_result(case, kind):
    name, call, arrays = case
    want = call(**arrays)
    min_ndim = {"transposed": 2, "stepped": 1}.get(kind, 0)
    for arg, kind_arrays in _kinds_of(arrays, READABLE[kind], min_ndim):
        _assert_same(call(**kind_arrays), want, f"{name}, {arg} {kind}")


@pytest.mark.parametrize("kind", list(STORAGE_LESS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_storage_less_kinds_are_refused_by_name(case, kind):
    name, call, arrays = case
    for arg, kind_arrays in _kinds_of(arrays, STORAGE_LESS[kind]):
        with pytest.raises((TypeError, ValueError)) as e:
            call(**kind_arrays)
        _assert_names(e.value, arg)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_conjugate_bit_is_refused_by_name(case):
    """Complex tensors are no input of microscale's, with the conjugate bit or without."""
    name, call, arrays = case
    for arg in arrays:
        p = arrays[arg]
        c = torch.complex(p.float(), torch.ones_like(p, dtype=torch.float32)).conj()
        assert c.is_conj()
        with pytest.raises((TypeError, ValueError)) as e:
            call(**{**arrays, arg: c})
        _assert_names(e.value, arg)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_zero_size_tensors_behave_as_numpy_zero_size_arrays(case):
    """torch gives every 0-size tensor a null data pointer: that is no reason to refuse it. The call
    must do what it does with numpy's 0-size array of the same shape and dtype (the same result, or
    an error of the same type); microscale.torch's functions, which take torch tensors only, must
    give a result or a clean error that is not about the missing data."""
    name, call, arrays = case
    for arg, p in arrays.items():
        if p.ndim == 0:
            continue
        empty = torch.empty((0,) + tuple(p.shape[1:]), dtype=p.dtype)
        assert empty.data_ptr() == 0
        reference = np.zeros(empty.shape, _numpy(p).dtype)
        if name.startswith("torch."):
            reference = torch.from_numpy(reference)
        outcomes = []
        for a in (empty, reference):
            try:
                outcomes.append(("result", _numpy(call(**{**arrays, arg: a}))))
            except (TypeError, ValueError) as e:
                assert "no data" not in str(e), (name, arg, str(e))
                outcomes.append(("error", type(e)))
        assert outcomes[0][0] == outcomes[1][0], (name, arg, outcomes)
        if outcomes[0][0] == "error":
            assert outcomes[0][1] is outcomes[1][1], (name, arg, outcomes)
        else:
            _assert_same(outcomes[0][1], outcomes[1][1], f"{name}, {arg} 0-size")


def test_negative_bit_of_a_complex_tensor_is_read_with_its_sign():
    """The issue's case: ``x.conj().imag`` is the negated imaginary part, a view with the
    negative bit set over the original storage."""
    g = torch.Generator().manual_seed(8)
    c = torch.complex(torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g))
    neg = c.conj().imag
    assert neg.is_neg()
    plain = neg.resolve_neg().clone()
    for f in (lambda t: microscale.quantize(t, mode="nvfp4"), microscale.quantize_dequantize,
              lambda t: mst.fake_quantize(t, mode="mxfp8"), microscale.global_scale):
        _assert_same(f(neg), f(plain), "x.conj().imag")


def test_every_public_array_function_is_covered():
    """The cases above name every public function and layer that takes arrays."""
    covered = " ".join(CASE_IDS)
    takes_no_array = {"OutType", "set_backend", "backend", "set_cpu_target", "cpu_target",
                      "available_cpu_targets", "set_num_threads", "num_threads", "LoadedCheckpoint",
                      "load_checkpoint", "save_checkpoint",  # save_checkpoint: test_save_checkpoint_kinds
                      "quantize_checkpoint", "QuantizeReport", "BudgetChoice"}  # paths and reports
    for public in set(microscale.__all__) - takes_no_array:
        assert public in covered, public
    for public in mst.__all__:
        # fake_quantize's autograd function; the model loaders, which take paths
        if public not in ("FakeQuantize", "from_pretrained", "save_pretrained"):
            assert f"torch.{public}" in covered or public in covered, public


@pytest.mark.parametrize("kind", list(READABLE) + list(STORAGE_LESS))
def test_save_checkpoint_kinds(tmp_path, kind):
    """save_checkpoint's tensors and a QuantizedWeight's parts, of each kind."""
    w = _rng_tensor((8, 64), 9)
    wq, s = microscale.quantize(w, mode="nvfp4")
    extra = _rng_tensor((3, 5), 10)
    make = {**READABLE, **STORAGE_LESS}[kind]

    def save(what, packed, scales, tensor):
        layer = microscale.QuantizedWeight(packed, scales, None, "nvfp4", 16, 4, (8, 64))
        out = tmp_path / what
        microscale.save_checkpoint(out, {"m.proj": layer}, {"extra": tensor}, export="mlx")
        ck = microscale.load_checkpoint(out)
        return ck.layers["m.proj"].dequantize(), ck.tensors["extra"]

    want = save("plain", wq, s, extra)
    for arg, args in (("packed", (wq, s, extra)), ("scales", (wq, s, extra)), ("extra", (wq, s, extra))):
        i = ("packed", "scales", "extra").index(arg)
        try:
            args = args[:i] + (make(args[i]),) + args[i + 1:]
        except (NotImplementedError, RuntimeError):  # no grad for integers
            continue
        if kind in STORAGE_LESS:
            with pytest.raises((TypeError, ValueError)) as e:
                save(f"{kind}-{arg}", *args)
            _assert_names(e.value, arg)
        else:
            _assert_same(save(f"{kind}-{arg}", *args), want, f"save_checkpoint {arg} {kind}")

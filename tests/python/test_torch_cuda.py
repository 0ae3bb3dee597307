"""microscale.torch on a CUDA device: the custom ops' CUDA kernels over microscale._cuda.

Host-tested (no GPU needed): the extension loads after torch and says no device is there, every op
has a CUDA kernel, the binding refuses host memory, wrong dtypes and mismatched shapes by name,
the modules' fake (shape-only) CUDA forward and torch.compile's tracing of it, and the clear error
the CUDA kernels raise where they cannot run. The last test compares a fixture model's logits on a
CUDA device with the CPU's and runs only where microscale._cuda finds a device."""

import contextlib
import ctypes
import os
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: microscale.torch needs it")

import microscale  # noqa: E402
import microscale.torch as mst  # noqa: E402
from torch._subclasses import FakeTensorMode  # noqa: E402

OPS = ("quantized_matmul", "gather_qmm", "qqmm", "gather_qqmm")


def _nvcc_here():
    return shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")


@pytest.fixture(scope="module")
def cuda_ext():
    """microscale._cuda. A build made where nvcc is found must have it; elsewhere it is absent
    by design and these tests are skipped."""
    try:
        import microscale._cuda as ext
    except ImportError as e:
        if _nvcc_here():
            raise AssertionError(f"nvcc is installed but microscale._cuda does not import: {e}")
        pytest.skip(f"microscale was built without nvcc, so without microscale._cuda ({e})")
    return ext


def _device_array(a):
    """A DLPack capsule of numpy array `a` that says its memory is on CUDA device 0: the binding's
    checks of a device operand (dtype, layout, shape) without a GPU. Only for calls refused before
    any memory is read."""
    cap = a.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    tensor = get(cap, b"dltensor")  # DLManagedTensor: DLTensor {void* data; DLDevice device; ...}
    ctypes.c_int32.from_address(tensor + ctypes.sizeof(ctypes.c_void_p)).value = 2  # kDLCUDA
    return cap


def _qmm_args(**override):
    """Arguments of _cuda.quantized_matmul for x [2, 32] and an nvfp4 W [4, 32], as device arrays."""
    args = dict(x=np.zeros((2, 32), np.float32), w_q=np.zeros((4, 16), np.uint8),
                scales=np.zeros((4, 2), np.uint8), biases=None, transpose=True, mode="nvfp4",
                group_size=16, bits=4, global_scale=None, elem="e4m3", bias=None,
                y=np.zeros((2, 4), np.float32), stream=0)
    args.update(override)
    return {k: _device_array(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}


def test_extension_loads_after_torch_and_finds_no_device(cuda_ext):
    assert "torch" in sys.modules
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: available() is checked by the GPU test below")
    assert cuda_ext.available() is False


@pytest.mark.parametrize("op", OPS)
def test_every_op_has_a_cuda_kernel(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"microscale::{op}", "CUDA")


@pytest.mark.parametrize("what", ["x", "w_q", "scales", "y"])
def test_binding_refuses_host_memory_naming_the_argument(cuda_ext, what):
    args = _qmm_args()
    args[what] = torch.zeros(2, 2, dtype=torch.uint8 if what in ("w_q", "scales") else torch.float32)
    with pytest.raises(ValueError, match=f"^{what}: the array is not in CUDA memory"):
        cuda_ext.quantized_matmul(**args)


def test_binding_amax_refuses_host_memory(cuda_ext):
    with pytest.raises(ValueError, match="^x: the array is not in CUDA memory"):
        cuda_ext.amax(np.zeros(4, np.float32), 0)


@pytest.mark.parametrize("what,bad,message", [
    ("x", np.zeros((2, 32), np.int32), "x: unsupported dtype int32"),
    ("w_q", np.zeros((4, 16), np.float32), "w_q: unsupported dtype float32 .expected uint8"),
    ("y", np.zeros((2, 4), np.uint8), "y: unsupported dtype uint8"),
    ("bias", np.zeros(4, np.int64), "bias: unsupported dtype int64"),
    ("x", np.zeros((32, 2), np.float32).T, "x: the array must be contiguous"),
    ("x", np.zeros((2, 48), np.float32), "x has K = 48 but the weight"),
    ("scales", np.zeros((4, 3), np.uint8), "scales must have shape \\(4, 2\\)"),
])
def test_binding_refuses_wrong_dtypes_layouts_and_shapes(cuda_ext, what, bad, message):
    with pytest.raises(ValueError, match=message):
        cuda_ext.quantized_matmul(**_qmm_args(**{what: bad}))


def test_binding_refuses_bad_gather_indices_and_qqmm_operands(cuda_ext):
    base = dict(x=np.zeros((3, 1, 1, 32), np.float32), w_q=np.zeros((2, 4, 16), np.uint8),
                scales=np.zeros((2, 4, 2), np.uint8), biases=None, lhs_indices=None, transpose=True,
                mode="nvfp4", group_size=16, bits=4, global_scale=None, elem="e4m3",
                sorted_indices=False, y=np.zeros((3, 1, 1, 4), np.float32), stream=0)
    dev = {k: _device_array(v) if isinstance(v, np.ndarray) else v for k, v in base.items()}
    with pytest.raises(ValueError, match="rhs_indices: unsupported dtype float32"):
        cuda_ext.gather_qmm(**dev, rhs_indices=_device_array(np.zeros((3, 1), np.float32)))
    dev = {k: _device_array(v) if isinstance(v, np.ndarray) else v for k, v in base.items()}
    with pytest.raises(ValueError, match="rhs_indices: the array is not in CUDA memory"):
        cuda_ext.gather_qmm(**dev, rhs_indices=np.zeros((3, 1), np.int64))
    with pytest.raises(ValueError, match="w: unsupported dtype int32"):
        cuda_ext.qqmm(_device_array(np.zeros((2, 32), np.float32)), _device_array(np.zeros((4, 16), np.int32)),
                      None, "nvfp4", 16, 4, None, None, "ceil", "propagate", "e4m3", None,
                      _device_array(np.zeros((2, 4), np.float32)), 0)


@contextlib.contextmanager
def _dynamo_reset_after():
    try:
        yield
    finally:
        torch._dynamo.reset()


def _linear_modules():
    lin = torch.nn.Linear(64, 32)
    return {"QuantizedLinear": mst.QuantizedLinear.from_linear(lin),
            "QuantizedLinear-affine": mst.QuantizedLinear.from_linear(lin, mode="affine"),
            "QQLinear": mst.QQLinear.from_linear(lin)}


def _experts(per_expert_amax, w4a4=False):
    def stack(n, k, seed):
        w = torch.randn(2, n, k, generator=torch.Generator().manual_seed(seed))
        amax = torch.stack([w[e].abs().max() for e in range(2)])
        if not per_expert_amax:
            amax = amax.max().expand(2).clone()
        packed, scales = microscale.quantize(w.reshape(2 * n, k), mode="nvfp4", global_scale=float(amax.max()))
        parts = {"weight": packed.reshape(2, n, k // 2), "scales": scales.reshape(2, n, k // 16), "mode": "nvfp4",
                 "group_size": 16, "bits": 4, "elem": "e4m3", "global_scales": amax}
        if w4a4:
            parts["input_global_scales"] = torch.tensor([3.0, 4.0])
        return parts

    return mst.QuantizedExperts({"gate": stack(32, 64, 1), "up": stack(32, 64, 2), "down": stack(64, 32, 3)},
                                torch.nn.functional.silu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_fake_cuda_forward_and_compile_tracing(dtype):
    """Modules moved to a (fake) CUDA device: .to() moves every buffer, the forward dispatches
    the custom ops to their fake implementations with CUDA tensors, and torch.compile traces
    the quantized layers in one graph (fullgraph) with CUDA outputs of the right shape and dtype."""
    modules = {**_linear_modules(), "QuantizedExperts": _experts(False),
               "QuantizedExperts-per-expert": _experts(True), "QuantizedExperts-w4a4": _experts(True, w4a4=True)}
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    # Fresh dynamo caches (other tests compile the same forward code), none left with fake tensors.
    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True), _dynamo_reset_after():
        for name, module in modules.items():
            module.to("cuda")
            assert all(b.device.type == "cuda" for b in module.buffers()), name
            if isinstance(module, mst.QuantizedExperts):
                x = torch.empty(5, 64, device="cuda", dtype=dtype)
                args = (x, torch.zeros(5, 2, dtype=torch.int64, device="cuda"),
                        torch.empty(5, 2, device="cuda", dtype=dtype))
                want = (5, 64)
            else:
                args = (torch.empty(3, 7, 64, device="cuda", dtype=dtype),)
                want = (3, 7, 32)
            # affine with float32 scales: float32 results, as on the CPU
            want_dtype = torch.float32 if name.endswith("affine") else dtype
            for run in (module, torch.compile(module, backend=capture, fullgraph=True)):
                y = run(*args)
                assert (y.device.type, tuple(y.shape), y.dtype) == ("cuda", want, want_dtype), name
    ops = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert all(any(op.startswith(f"microscale.{name}") for op in ops) for name in OPS)


def test_pretrained_modules_keep_their_tensors_as_buffers():
    """model.to("cuda") moves what .to() sees: each module's tensors are all buffers."""
    for module in (*_linear_modules().values(), _experts(True), _experts(True, w4a4=True)):
        registered = {id(t) for t in module.buffers()}
        loose = [k for k, v in vars(module).items() if isinstance(v, torch.Tensor) and id(v) not in registered]
        assert not loose, (type(module).__name__, loose)


def _cuda_keyset():
    return torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("op", OPS)
def test_cuda_kernel_without_a_device_raises_the_clear_error(cuda_ext, op):
    """The CUDA kernel, reached through the dispatcher, says there is no device it can run on."""
    lin = mst.QuantizedLinear.from_linear(torch.nn.Linear(64, 32))
    x = torch.randn(3, 64)
    args = {"quantized_matmul": (x, lin.weight, lin.scales, None, None, "nvfp4", 16, 4, None, "e4m3"),
            "gather_qmm": (x.view(3, 1, 1, 64), lin.weight[None], lin.scales[None], None, None,
                           torch.zeros(3, 1, dtype=torch.int64), "nvfp4", 16, 4, None, "e4m3"),
            "qqmm": (x, lin.weight, lin.scales, None, "nvfp4", 16, 4, None, None, "ceil", "propagate", "e4m3"),
            "gather_qqmm": (x.view(3, 1, 1, 64), lin.weight[None], lin.scales[None], torch.tensor([lin.global_scale]),
                            torch.tensor([4.0]), torch.zeros(3, 1, dtype=torch.int64), "nvfp4", 16, 4, "ceil",
                            "propagate", "e4m3")}
    overload = getattr(torch.ops.microscale, op).default
    with pytest.raises(RuntimeError, match="CUDA backend: no CUDA device it has kernels for"):
        overload.redispatch(_cuda_keyset(), *args[op])


def test_cuda_kernel_of_a_build_without_nvcc_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "microscale._cuda", None)  # import fails as where it was not built
    monkeypatch.delattr(microscale, "_cuda", raising=False)
    lin = mst.QuantizedLinear.from_linear(torch.nn.Linear(64, 32))
    with pytest.raises(RuntimeError, match="built without its CUDA backend.*nvcc.*Rebuild it from source"):
        torch.ops.microscale.quantized_matmul.default.redispatch(
            _cuda_keyset(), torch.randn(3, 64), lin.weight, lin.scales, None, None, "nvfp4", 16, 4, None, "e4m3")


def _gpu_ready():
    try:
        import microscale._cuda as ext
    except ImportError:
        return False
    return torch.cuda.is_available() and ext.available()


@pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA device microscale._cuda has kernels for "
                                              "(sm_90a or sm_100a)")
@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_fixture_model_logits_on_cuda_match_the_cpu(arch, tmp_path):
    """A fixture model from_pretrained, moved to the GPU: its logits equal the CPU's up to float32
    summation order (test_pretrained's tolerance), and a QQLinear's and W4A4 experts' too."""
    from ckpt_support import ROOT, ok, skip_without_cli

    skip_without_cli()
    out = tmp_path / arch
    ok("quantize", os.path.join(ROOT, "tests", "fixtures", arch), "--format", "nvfp4", "--export",
       "compressed-tensors", "-o", out)
    model = mst.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cpu = model(ids).logits
        gpu = model.to("cuda")(ids.to("cuda")).logits.cpu()
    assert ((gpu - cpu).abs().max() / cpu.abs().max()).item() <= 1e-5
    qq = mst.QQLinear.from_linear(torch.nn.Linear(64, 32))
    x = torch.randn(3, 64)
    want = qq(x)
    got = qq.to("cuda")(x.to("cuda")).cpu()
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5
    experts = _experts(True, w4a4=True)
    hidden, weights = torch.randn(5, 64), torch.rand(5, 2)
    index = torch.tensor([[0, 1], [1, 1], [1, 0], [0, 0], [0, 1]])
    want = experts(hidden, index, weights)
    got = experts.to("cuda")(hidden.to("cuda"), index.to("cuda"), weights.to("cuda")).cpu()
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5

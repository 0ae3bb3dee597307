"""microscale.torch.from_pretrained: every fixture architecture, quantized by the CLI in each
layout, runs as a transformers model on microscale's kernels.

The oracle is transformers' own model class loaded with the float32 weights `microscale
dequantize` writes: the logits must equal it up to float32 summation order (relative to the
largest logit: 1e-5, see docs/python.md), and greedy generation must give the same 32 tokens.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: microscale.torch needs it")
transformers = pytest.importorskip("transformers")

import microscale  # noqa: E402
import microscale.torch as mst  # noqa: E402
from ckpt_support import ROOT, ok, skip_without_cli  # noqa: E402

skip_without_cli()

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
ARCHS = sorted(a for a in os.listdir(FIXTURES) if os.path.exists(os.path.join(FIXTURES, a, "config.json"))
               and a != "gpt2")  # GPT-2's Conv1D projections are not quantized (test_architectures)
LAYOUTS = [("nvfp4", "compressed-tensors"), ("mxfp4", "compressed-tensors"), ("nvfp4", "modelopt"),
           ("nvfp4", "mlx"), ("mxfp4", "mlx"), ("mxfp8", "mlx"), ("affine4", "mlx")]
MOE = ("mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3")
TOLERANCE = 1e-5  # of the largest |logit|: float32 products summed in another order
MICROSCALE_MODULES = (mst.QuantizedLinear, mst.QQLinear, mst.QuantizedExperts)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(arch, format, export): (quantized dir, its float32 dequantized dir)}, made on demand."""
    root = tmp_path_factory.mktemp("pretrained")
    made = {}

    def get(arch, fmt, export, *extra):
        key = (arch, fmt, export, *extra)
        if key not in made:
            out = root / "-".join([arch, fmt, export, str(len(made))])
            ok("quantize", os.path.join(FIXTURES, arch), "--format", fmt, "--export", export, "-o", out,
               *extra)
            ok("dequantize", out, "--dtype", "float32", "-o", f"{out}-f32")
            made[key] = (str(out), f"{out}-f32")
        return made[key]

    return get


@pytest.fixture(scope="module")
def w4a4_checkpoints(checkpoints, tmp_path_factory):
    """{(arch, export): (W4A4 dir, float32 dir, {layer: activation amax})}: the CLI's W4A4 export
    with a static activation amax for every quantized layer, each expert's and each role's its own."""
    root = tmp_path_factory.mktemp("w4a4")

    def get(arch, export):
        layers = sorted(microscale.load_checkpoint(checkpoints(arch, "nvfp4", export)[0]).layers)
        amax = {name: 2.0 + 0.125 * (i % 17) for i, name in enumerate(layers)}
        amax_file = root / f"{arch}-amax.json"
        amax_file.write_text(json.dumps(amax))
        return (*checkpoints(arch, "nvfp4", export, "--activation-amax", str(amax_file)), amax)

    return get


def reference(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def tokens(model, seed=0, shape=(2, 16)):
    return torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def relative_error(x, y):
    return ((x.float() - y.float()).abs().max() / y.float().abs().max()).item()


def greedy(model, ids, steps=32):
    return model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)


@pytest.mark.parametrize("fmt,export", LAYOUTS, ids=[f"{f}-{e}" for f, e in LAYOUTS])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_tokens_match_the_dequantized_model(checkpoints, arch, fmt, export):
    quantized, dequantized = checkpoints(arch, fmt, export)
    model = mst.from_pretrained(quantized, dtype=torch.float32)
    ref = reference(dequantized)
    assert isinstance(model, transformers.PreTrainedModel) and type(model) is type(ref)

    # Every quantized layer is a microscale module over the checkpoint's own bytes: no float
    # Linear weight is left for a layer the checkpoint quantized.
    ck = microscale.load_checkpoint(quantized)
    held = {bytes(b.detach().numpy().tobytes()) for m in model.modules() if isinstance(m, MICROSCALE_MODULES)
            for n, b in m.named_buffers() if n.endswith("weight")}
    for name, q in ck.layers.items():
        packed = np.ascontiguousarray(q.packed)
        stacked = packed.tobytes() in held or any(packed.tobytes() in h for h in held)
        assert stacked, f"{name}: its packed codes are not held by any microscale module"
    floats = {n for n, p in model.named_parameters()}
    assert not any(n.removesuffix(".weight") in ck.layers for n in floats)

    ids = tokens(model)
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert relative_error(got, want) <= TOLERANCE
    assert torch.equal(greedy(model, ids[:1]), greedy(ref, ids[:1]))


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations(checkpoints, arch, dtype):
    quantized, dequantized = checkpoints(arch, "nvfp4", "compressed-tensors")
    model = mst.from_pretrained(quantized, dtype=dtype)
    ids = tokens(model)
    with torch.no_grad():
        got, want = model(ids).logits, reference(dequantized)(ids).logits
    assert got.dtype == dtype
    # Activations rounded to 8 (bfloat16) or 11 (float16) bits between layers.
    assert relative_error(got, want) <= (3e-2 if dtype == torch.bfloat16 else 5e-3)


@pytest.mark.parametrize("export", ["compressed-tensors", "modelopt"])
def test_w4a4_runs_qqmm_with_the_checkpoints_activation_scales(checkpoints, tmp_path, export):
    """The reference quantizes each Linear's input as the checkpoint says (nvfp4 with its static
    amax), through microscale.torch.fake_quantize, then multiplies by the dequantized weight."""
    amax = {f"model.layers.{i}.{p}": 2.5 + 0.25 * j
            for i in range(2) for j, p in enumerate(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                     "mlp.down_proj"])}
    amax_file = tmp_path / "amax.json"
    amax_file.write_text(json.dumps(amax))
    quantized, dequantized = checkpoints("llama", "nvfp4", export, "--activation-amax", str(amax_file))
    model = mst.from_pretrained(quantized, dtype=torch.float32)
    ref = reference(dequantized)
    for name, a in amax.items():
        layer = model.get_submodule(name)
        assert isinstance(layer, mst.QQLinear) and layer.input_global_scale == pytest.approx(a)
        ref.get_submodule(name).register_forward_pre_hook(
            lambda module, args, a=a: (mst.fake_quantize(args[0], "nvfp4", global_scale=a),))
    ids = tokens(model)
    with torch.no_grad():
        assert relative_error(model(ids).logits, ref(ids).logits) <= TOLERANCE


_EXPERT_LAYER = re.compile(r"model\.layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe)\.experts\.(?P<expert>\d+)\."
                           r"(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)")
_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}


def fake_quantized_experts(experts, amax):
    """Replaces a transformers experts module's forward (fused gate_up_proj [E, 2I, H], down_proj
    [E, H, I]) with a loop over the experts present in which each projection's input is
    fake-quantized with that expert's activation amax for it (amax[role][e]): per (token, expert)
    what a QQLinear of that expert computes, on the dequantized weights."""
    def project(role, e, x, w):
        return torch.nn.functional.linear(mst.fake_quantize(x, "nvfp4", global_scale=amax[role][e]), w[e])

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        gate_w, up_w = experts.gate_up_proj.chunk(2, dim=1)
        for e in top_k_index.unique().tolist():
            token, slot = torch.where(top_k_index == e)
            x = hidden_states[token]
            h = experts.act_fn(project("gate", e, x, gate_w)) * project("up", e, x, up_w)
            down = project("down", e, h, experts.down_proj) * top_k_weights[token, slot, None]
            out.index_add_(0, token, down.to(out.dtype))
        return out

    experts.forward = forward


@pytest.mark.parametrize("export", ["compressed-tensors", "modelopt"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_w4a4_experts_run_gather_qqmm_with_each_experts_activation_scale(w4a4_checkpoints, arch, export):
    """A W4A4 MoE export (an activation amax per expert Linear, as NVIDIA's ModelOpt NVFP4 MoE
    checkpoints carry) runs: attention through QQLinear, experts through gather_qqmm, each expert's
    input quantized with its own amax. The reference fake-quantizes every Linear's input likewise."""
    quantized, dequantized, given = w4a4_checkpoints(arch, export)
    # The amaxes as stored (a float32 scale, amax / 2688 or its inverse) and read back.
    amax = {name: q.input_amax for name, q in microscale.load_checkpoint(quantized).layers.items()}
    assert amax == pytest.approx(given, rel=1e-6)
    model = mst.from_pretrained(quantized, dtype=torch.float32)
    ref = reference(dequantized)
    per_expert = {}  # {experts module: {role: {expert: amax}}}
    for name, a in amax.items():
        m = _EXPERT_LAYER.fullmatch(name)
        if m is None:
            layer = model.get_submodule(name)
            assert isinstance(layer, mst.QQLinear) and layer.input_global_scale == np.float32(a), name
            ref.get_submodule(name).register_forward_pre_hook(
                lambda module, args, a=a: (mst.fake_quantize(args[0], "nvfp4", global_scale=a),))
            continue
        roles = per_expert.setdefault(f"model.layers.{m['layer']}.mlp.experts", {})
        roles.setdefault(_ROLE[m["proj"]], {})[int(m["expert"])] = a
    assert per_expert, "the export has expert layers"
    for name, roles in per_expert.items():
        experts = model.get_submodule(name)
        assert isinstance(experts, mst.QuantizedExperts)
        for role, by_expert in roles.items():
            want = torch.tensor([by_expert[e] for e in range(len(by_expert))], dtype=torch.float32)
            assert torch.equal(getattr(experts, f"{role}_input_global_scales"), want), (name, role)
        fake_quantized_experts(ref.get_submodule(name), roles)
    ids = tokens(model)
    with torch.no_grad():
        assert relative_error(model(ids).logits, ref(ids).logits) <= TOLERANCE


def _w4a4_experts(num_experts=3, hidden=64, inner=32, seed=0):
    """A W4A4 QuantizedExperts of random three-level nvfp4 stacks, and {role: [QQLinear of expert e]}
    over the same bytes and scales."""
    gen = torch.Generator().manual_seed(seed)
    stacks, linears = {}, {}
    for i, (role, n, k) in enumerate([("gate", inner, hidden), ("up", inner, hidden), ("down", hidden, inner)]):
        layers = [mst.QQLinear.from_linear(torch.randn(n, k, generator=gen)) for _ in range(num_experts)]
        input_amax = [1.5 + 0.5 * e + 0.25 * i for e in range(num_experts)]
        for layer, a in zip(layers, input_amax):
            layer.input_global_scale = a
        stacks[role] = {"weight": torch.stack([q.weight for q in layers]),
                        "scales": torch.stack([q.scales for q in layers]), "mode": "nvfp4", "group_size": 16,
                        "bits": 4, "elem": "e4m3",
                        "global_scales": torch.tensor([q.global_scale for q in layers]),
                        "input_global_scales": torch.tensor(input_amax)}
        linears[role] = layers
    return mst.QuantizedExperts(stacks, torch.nn.functional.silu), linears


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, TOLERANCE), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)],
                         ids=["float32", "bfloat16", "float16"])
def test_w4a4_quantized_experts_equal_a_qqlinear_per_token_and_expert(dtype, tolerance):
    """Each (token, expert) as that expert's QQLinear computes it, one token at a time (half
    activations: the module sums the k experts' outputs in x's dtype, the loop here in float32)."""
    experts, linears = _w4a4_experts()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(7, 64, generator=gen).to(dtype)
    index = torch.tensor([[0, 2], [2, 1], [1, 0], [2, 0], [0, 1], [2, 1], [1, 2]])
    weights = torch.rand(7, 2, generator=gen).to(dtype)
    want = torch.zeros(7, 64)
    for t in range(7):
        for j, e in enumerate(index[t].tolist()):
            h = torch.nn.functional.silu(linears["gate"][e](x[t:t + 1])) * linears["up"][e](x[t:t + 1])
            want[t] += (weights[t, j] * linears["down"][e](h)[0]).float()
    with torch.no_grad():
        got = experts(x, index, weights)
    assert got.dtype == dtype and relative_error(got, want) <= tolerance


def test_gather_qqmm_gives_each_experts_qqlinear_and_refuses_bad_indices():
    experts, linears = _w4a4_experts()
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(2))
    # Rows routed to one expert only: that expert's QQLinear, bit for bit.
    gate = experts.gate_weight, experts.gate_scales, experts.gate_global_scales
    y = torch.ops.microscale.gather_qqmm(x.view(7, 1, 1, 64), *gate, experts.gate_input_global_scales,
                                         torch.full((7, 1), 2), "nvfp4", 16, 4, "ceil", "propagate", "e4m3")
    assert torch.equal(y[:, 0, 0], linears["gate"][2](x))
    refused = [(torch.full((7, 1), 3), ValueError, r"rhs_indices value 3 is out of range \[0, 3\)"),
               (torch.zeros(6, 2, dtype=torch.int64), ValueError,
                r"index shapes \(7, 1\) and \(6, 2\) do not broadcast"),
               (torch.zeros(7, 1), TypeError, "rhs_indices must be int32, int64 or uint32")]
    for index, error, match in refused:
        with pytest.raises(error, match=match):
            torch.ops.microscale.gather_qqmm(x.view(7, 1, 1, 64), *gate, experts.gate_input_global_scales, index,
                                             "nvfp4", 16, 4, "ceil", "propagate", "e4m3")


def test_w4a4_moe_model_compiles_in_one_graph(w4a4_checkpoints):
    """torch.compile(fullgraph=True) of a W4A4 MoE model: gather_qqmm is one opaque op in the graph
    (its loop over experts runs inside it), and the compiled logits are the eager ones."""
    torch._dynamo.reset()
    model = mst.from_pretrained(w4a4_checkpoints("qwen3_moe", "modelopt")[0], dtype=torch.float32)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ids = tokens(model)
    try:
        with torch.no_grad():
            eager = model(ids).logits
            compiled = torch.compile(model, backend=capture, fullgraph=True)(ids).logits
    finally:
        torch._dynamo.reset()
    ops = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert sum(op.startswith("microscale.gather_qqmm") for op in ops) == 3 * model.config.num_hidden_layers
    assert any(op.startswith("microscale.qqmm") for op in ops)
    assert torch.equal(compiled, eager)


def test_w4a4_experts_refusals(w4a4_checkpoints, tmp_path):
    from microscale import pretrained

    # A block where some experts carry an activation scale and others not: refused by name.
    quantized, _, amax = w4a4_checkpoints("qwen3_moe", "compressed-tensors")
    ck = microscale.load_checkpoint(quantized)
    members = {e: (f"b.experts.{e}.up_proj", ck.layers[f"model.layers.0.mlp.experts.{e}.up_proj"]) for e in range(4)}
    members[2][1].input_amax = None
    with pytest.raises(ValueError, match=r"b\.experts\.[0-3]\.up_proj: some experts of the block have a static "
                                         r"activation scale \(W4A4\), others not"):
        pretrained._stack("b", "up", members, 4)
    # An activation scale with a weight that is not three-level nvfp4.
    w = torch.randn(4, 32, 64)
    for mode, global_scale in (("mxfp4", None), ("nvfp4", None)):
        stack = {e: (f"b.experts.{e}.w1", microscale.QuantizedWeight.from_float(w[e].numpy(), mode=mode))
                 for e in range(4)}
        for _, q in stack.values():
            q.input_amax = 3.0
        with pytest.raises(ValueError, match=rf"b\.experts\.0\.w1: a static activation scale with a {mode} weight "
                                             "without a global scale; W4A4 is three-level nvfp4"):
            pretrained._stack("b", "gate", stack, 4)
    experts, _ = _w4a4_experts()
    stacks = {r: {k: getattr(experts, f"{r}_{k}") for k in ("weight", "scales", "global_scales",
                                                           "input_global_scales")} for r in experts.ROLES}
    for s in stacks.values():
        s.update(mode="nvfp4", group_size=16, bits=4, elem="e4m3")
    stacks["down"]["input_global_scales"] = torch.tensor([3.0, 4.0])
    with pytest.raises(ValueError, match=r"down: input_global_scales is \[2\], expected one amax per expert \[3\]"):
        mst.QuantizedExperts(stacks, torch.nn.functional.silu)
    del stacks["up"]["global_scales"]
    with pytest.raises(ValueError, match="up: input_global_scales need a three-level nvfp4 stack"):
        mst.QuantizedExperts(stacks, torch.nn.functional.silu)


@pytest.mark.parametrize("arch", ["llama", "mixtral"])
def test_torch_compile_fullgraph(checkpoints, arch):
    """The kernels are torch custom ops with fake implementations: the whole model compiles into
    one graph (fullgraph=True raises on any graph break) and gives the eager logits."""
    torch._dynamo.reset()
    model = mst.from_pretrained(checkpoints(arch, "nvfp4", "compressed-tensors")[0], dtype=torch.float32)
    ids = tokens(model)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True)(ids).logits
    assert relative_error(compiled, eager) <= TOLERANCE


def test_custom_ops_pass_torch_opcheck():
    """torch.library.opcheck: schema, fake (meta) implementation and autograd registration agree
    with the real kernels."""
    w = torch.randn(32, 64)
    layer = mst.QuantizedLinear.from_linear(w)
    x = torch.randn(3, 64)
    torch.library.opcheck(torch.ops.microscale.quantized_matmul.default,
                          (x, layer.weight, layer.scales, None, None, "nvfp4", 16, 4, layer.global_scale, "e4m3"))
    qq = mst.QQLinear.from_linear(w)
    torch.library.opcheck(torch.ops.microscale.qqmm.default,
                          (x, qq.weight, qq.scales, None, "nvfp4", 16, 4, None, qq.global_scale, "ceil",
                           "propagate", "e4m3"))
    stack_q, stack_s = microscale.quantize(torch.randn(4, 32, 64), mode="mxfp4")
    index = torch.tensor([[0, 3], [2, 2], [1, 0]])
    torch.library.opcheck(torch.ops.microscale.gather_qmm.default,
                          (x.view(3, 1, 1, 64), stack_q, stack_s, None, None, index, "mxfp4", 32, 4, None, "e4m3"))
    torch.library.opcheck(torch.ops.microscale.linear.default, (x, w.bfloat16().float(), torch.randn(32)))
    torch.library.opcheck(torch.ops.microscale.linear.default, (x[:1].bfloat16(), w.bfloat16(), None))
    experts, _ = _w4a4_experts(num_experts=4, hidden=64)
    for xs in (x.view(3, 1, 1, 64), x.view(3, 1, 1, 64).expand(3, 2, 1, 64).contiguous()):
        torch.library.opcheck(torch.ops.microscale.gather_qqmm.default,
                              (xs, experts.gate_weight, experts.gate_scales, experts.gate_global_scales,
                               experts.gate_input_global_scales, index, "nvfp4", 16, 4, "ceil", "propagate", "e4m3"))


def test_meta_device_and_threads(checkpoints):
    model = mst.from_pretrained(checkpoints("qwen3_moe", "nvfp4", "compressed-tensors")[0], dtype=torch.float32)
    ids = tokens(model)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            model(ids)
        assert microscale.num_threads() == 1  # the pool follows torch's intra-op count
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        model(ids)
    assert microscale.num_threads() == threads
    model.to("meta")
    assert all(b.is_meta for b in model.buffers()) and all(p.is_meta for p in model.parameters())
    with torch.no_grad():
        logits = model(ids.to("meta")).logits  # shapes from the fake implementations
    assert logits.is_meta and logits.shape == (*ids.shape, model.config.vocab_size)
    with pytest.raises(ValueError, match="meta device"):
        mst.save_pretrained(model, "/nonexistent-never-written")


@pytest.mark.parametrize("arch,fmt,export,w4a4", [("mixtral", "nvfp4", "compressed-tensors", False),
                                                  ("qwen3_moe", "nvfp4", "modelopt", False),
                                                  ("gpt_oss", "mxfp4", "mlx", False),
                                                  ("llama", "affine4", "mlx", False),
                                                  ("qwen3_moe", "nvfp4", "modelopt", True),
                                                  ("mixtral", "nvfp4", "compressed-tensors", True)])
def test_save_pretrained_writes_the_source_layout_back(checkpoints, w4a4_checkpoints, tmp_path, arch, fmt, export,
                                                       w4a4):
    quantized = w4a4_checkpoints(arch, export)[0] if w4a4 else checkpoints(arch, fmt, export)[0]
    model = mst.from_pretrained(quantized)
    model.save_pretrained(tmp_path / "saved")
    before, after = microscale.load_checkpoint(quantized), microscale.load_checkpoint(tmp_path / "saved")
    assert after.format == before.format
    assert sorted(after.layers) == sorted(before.layers)
    for name, q in before.layers.items():
        r = after.layers[name]
        assert (r.mode, r.group_size, r.bits, r.global_scale, r.input_amax, r.shape) == (
            q.mode, q.group_size, q.bits, q.global_scale, q.input_amax, q.shape), name
        assert (q.input_amax is not None) == w4a4, name
        for part in ("packed", "scales", "biases"):
            a, b = getattr(q, part), getattr(r, part)
            assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes()), (name, part)
    assert sorted(after.tensors) == sorted(before.tensors)
    for name, t in before.tensors.items():
        assert t.tobytes() == after.tensors[name].tobytes(), name
    # Every stored tensor, the activation scales' among them: dtype, shape and bytes under its own name.
    assert stored_tensors(Path(quantized)) == stored_tensors(tmp_path / "saved")


def stored_tensors(directory):
    """{name: (dtype, shape, bytes)} of a directory's model.safetensors, read from the file's header."""
    data = (directory / "model.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def test_refusals(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="no quantized layers"):
        mst.from_pretrained(os.path.join(FIXTURES, "llama"))
    with pytest.raises(ValueError, match="not built by microscale"):
        mst.save_pretrained(transformers.AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, "llama")),
                            tmp_path / "x")
    # A config whose hidden layer is wider than the stored weights: refused, naming the layer.
    quantized, _ = checkpoints("llama", "nvfp4", "compressed-tensors")
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in os.listdir(quantized):
        src = os.path.join(quantized, f)
        if f == "config.json":
            text = open(src).read().replace('"intermediate_size": 128', '"intermediate_size": 256')
            (bad / f).write_text(text)
        else:
            os.symlink(src, bad / f)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.(down|gate|up)_proj"):
        mst.from_pretrained(bad)


def test_readme_example_runs(checkpoints, tmp_path):
    """The README's "Run a quantized model" example, on the llama fixture's nvfp4 export."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Run a quantized model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    quantized, _ = checkpoints("llama", "nvfp4", "compressed-tensors")
    assert 'path = "' in code
    code = re.sub(r'path = "[^"]*"', f"path = {quantized!r}", code)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip(), "the example prints the generated text"


@pytest.mark.parametrize("arch,fmt", [("llama", "nvfp4"), ("qwen3_moe", "mxfp4"), ("mixtral", "nvfp4")])
def test_gguf(tmp_path, arch, fmt):
    """A GGUF export runs as the model `microscale dequantize` reads out of the same file."""
    gguf = tmp_path / f"{arch}.gguf"
    ok("quantize", os.path.join(FIXTURES, arch), "--format", fmt, "--export", "gguf", "-o", gguf)
    ok("dequantize", gguf, "--dtype", "float32", "-o", tmp_path / "f32")
    model = mst.from_pretrained(gguf, dtype=torch.float32)
    assert any(isinstance(m, MICROSCALE_MODULES) for m in model.modules())
    ids = tokens(model)
    with torch.no_grad():
        assert relative_error(model(ids).logits, reference(tmp_path / "f32")(ids).logits) <= TOLERANCE
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        mst.from_pretrained(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("not a GGUF file")
    with pytest.raises(ValueError, match="text.gguf: not read as a quantized GGUF"):
        mst.from_pretrained(tmp_path / "text.gguf")


def test_text_generation_pipeline(checkpoints):
    """transformers' pipeline takes the model as it is, with the tokenizer files the export copied."""
    quantized, dequantized = checkpoints("llama", "mxfp4", "compressed-tensors")
    tokenizer = transformers.AutoTokenizer.from_pretrained(quantized)
    generate = transformers.pipeline("text-generation", model=mst.from_pretrained(quantized, dtype=torch.float32),
                                     tokenizer=tokenizer)
    ref = transformers.pipeline("text-generation", model=reference(dequantized), tokenizer=tokenizer)
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    text = generate("hello world", **kwargs)[0]["generated_text"]
    assert text.startswith("hello world") and text == ref("hello world", **kwargs)[0]["generated_text"]


def test_float_layers_run_microscale_linear_sharing_their_weights(checkpoints):
    """The layers a checkpoint keeps in float (lm_head, routers) become DenseLinear over the same
    Parameter objects: a tied head stays the embedding, and the logits are the reference's."""
    quantized, dequantized = checkpoints("llama", "nvfp4", "compressed-tensors")
    model = mst.from_pretrained(quantized, dtype=torch.float32)
    head = model.get_output_embeddings()
    assert isinstance(head, mst.DenseLinear)
    if model.config.tie_word_embeddings:
        assert head.weight is model.get_input_embeddings().weight
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    ids = tokens(model)
    with torch.no_grad():
        assert relative_error(model(ids).logits, reference(dequantized)(ids).logits) <= TOLERANCE

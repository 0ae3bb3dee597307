"""microscale.torch.from_pretrained: every fixture architecture, quantized by the CLI in each
layout, runs as a transformers model on microscale's kernels.

The oracle is transformers' own model class loaded with the float32 weights `microscale
dequantize` writes: the logits must equal it up to float32 summation order (relative to the
largest logit: 1e-5, see docs/python.md), and greedy generation must give the same 32 tokens.
"""

import os
import re
import subprocess
import sys

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
    amax_file.write_text(__import__("json").dumps(amax))
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


@pytest.mark.parametrize("arch,fmt,export", [("mixtral", "nvfp4", "compressed-tensors"),
                                             ("qwen3_moe", "nvfp4", "modelopt"), ("gpt_oss", "mxfp4", "mlx"),
                                             ("llama", "affine4", "mlx")])
def test_save_pretrained_writes_the_source_layout_back(checkpoints, tmp_path, arch, fmt, export):
    quantized, _ = checkpoints(arch, fmt, export)
    model = mst.from_pretrained(quantized)
    model.save_pretrained(tmp_path / "saved")
    before, after = microscale.load_checkpoint(quantized), microscale.load_checkpoint(tmp_path / "saved")
    assert after.format == before.format
    assert sorted(after.layers) == sorted(before.layers)
    for name, q in before.layers.items():
        r = after.layers[name]
        assert (r.mode, r.group_size, r.bits, r.global_scale, r.shape) == (q.mode, q.group_size, q.bits,
                                                                          q.global_scale, q.shape), name
        for part in ("packed", "scales", "biases"):
            a, b = getattr(q, part), getattr(r, part)
            assert (a is None) == (b is None) and (a is None or a.tobytes() == b.tobytes()), (name, part)
    assert sorted(after.tensors) == sorted(before.tensors)
    for name, t in before.tensors.items():
        assert t.tobytes() == after.tensors[name].tobytes(), name


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

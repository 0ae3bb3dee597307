"""One measurement of bench/model_bench.sh (issue 29: running a quantized model), printed as one
JSON line. Each call is its own process, so no measurement inherits another's allocations,
threads or page-cache state beyond the files it reads.

    python bench/model_bench.py speed RUNNER MODEL METRIC [--dtype D] [--prompt N] [--new N] [--prefill N]
    python bench/model_bench.py split MODEL [--dtype D] [--prompt N] [--new N] [--prefill N]
    python bench/model_bench.py bandwidth
    python bench/model_bench.py memory RUNNER MODEL [--tokens N]
    python bench/model_bench.py report SPEED_JSONL SPLIT_JSONL BANDWIDTH_JSONL MEMORY_JSONL

RUNNER: ``microscale`` (microscale.torch.from_pretrained on a quantized checkpoint),
``transformers`` (AutoModelForCausalLM.from_pretrained; for the memory row, transformers' own
compressed-tensors load) or ``llama`` (llama-cpp-python on a GGUF). Threads: 2 everywhere
(torch.set_num_threads, llama.cpp's n_threads and n_threads_batch).

What ``speed`` times, after loading and one 8-token warm-up pass (which also faults in every
weight page), with the same pseudo-random token ids for every runner:

- decode: a PROMPT-token prefill (not timed), then NEW single-token steps, each a forward pass
  with the KV cache and the argmax of its logits (greedy); tokens/s = NEW / the time of those
  steps. llama.cpp: ``Llama.eval([token])`` per step, the argmax read from its last logits.
- prefill: one forward pass over PREFILL tokens into an empty KV cache, logits of the last
  position only (as ``generate`` asks: logits_to_keep=1; llama.cpp computes only the last
  position's logits when logits_all is off); tokens/s = PREFILL / its time. llama.cpp:
  ``Llama.eval(tokens)`` with n_batch = n_ubatch = 512.

``split`` runs the same decode and prefill on a microscale model with timers around every
quantized module (the custom ops ``microscale::quantized_matmul`` and the like) and around
``lm_head``; the rest of the forward pass is the difference. It reports the bytes each part
reads per token, and the quantized modules' pace called back to back outside the model.
``bandwidth`` gives the machine's yardsticks: the read bandwidth (a 1- and 2-thread sum over a
1 GiB float32 tensor; torch's float32 GEMV over it) and torch's float32 GEMM pace.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

THREADS = 2
WARMUP_TOKENS = 8


def token_ids(vocab, n):
    import numpy as np

    # Ordinary tokens only: a Llama 3 vocabulary ends with 256 special ones.
    high = vocab - 256 if vocab > 1024 else vocab
    return [int(i) for i in np.random.default_rng(29).integers(0, high, n)]


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


def load_torch(runner, model, dtype):
    import torch

    torch.set_num_threads(THREADS)
    if runner == "microscale":
        import microscale.torch as mst

        return mst.from_pretrained(model, dtype=dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()


def torch_vocab(model):
    return int(model.config.get_text_config().vocab_size)


def torch_decode(model, prompt, new, before_steps=None):
    """Seconds of the NEW greedy steps after the prompt's prefill (before_steps() runs between)."""
    import torch

    with torch.inference_mode():
        out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        cache, token = out.cache, out.logits[:, -1:].argmax(-1)
        if before_steps:
            before_steps()
        start = time.perf_counter()
        for _ in range(new):
            out = model(token, cache=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1)
        return time.perf_counter() - start


def torch_prefill(model, ids):
    import torch

    with torch.inference_mode():
        start = time.perf_counter()
        model(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        return time.perf_counter() - start


def torch_warm_up(model, ids):
    import torch

    with torch.inference_mode():
        model(torch.tensor([ids[:WARMUP_TOKENS]]), use_cache=True, logits_to_keep=1)


def llama_model(path, n_ctx):
    from llama_cpp import Llama

    return Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=THREADS,
                 n_threads_batch=THREADS, seed=0, verbose=False)


def llama_argmax(llm):
    import numpy as np

    return int(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).argmax())


def speed(args):
    t0 = time.perf_counter()
    if args.runner == "llama":
        llm = llama_model(args.model, n_ctx=max(args.prefill, args.prompt + args.new) + WARMUP_TOKENS)
        vocab = llm.n_vocab()
    else:
        import torch

        model = load_torch(args.runner, args.model, getattr(torch, args.dtype))
        vocab = torch_vocab(model)
    load_s = time.perf_counter() - t0
    n = args.prompt if args.metric == "decode" else args.prefill
    ids = token_ids(vocab, max(n, WARMUP_TOKENS))[:n]
    load = loadavg()
    if args.runner == "llama":
        llm.eval(ids[:WARMUP_TOKENS])
        llm.reset()
        if args.metric == "decode":
            llm.eval(ids)
            token = llama_argmax(llm)
            start = time.perf_counter()
            for _ in range(args.new):
                llm.eval([token])
                token = llama_argmax(llm)
            seconds = time.perf_counter() - start
        else:
            start = time.perf_counter()
            llm.eval(ids)
            seconds = time.perf_counter() - start
    else:
        torch_warm_up(model, ids)
        if args.metric == "decode":
            seconds = torch_decode(model, ids, args.new)
        else:
            seconds = torch_prefill(model, ids)
    tokens = args.new if args.metric == "decode" else args.prefill
    return {"runner": args.runner, "model": args.model, "dtype": args.dtype if args.runner != "llama" else None,
            "metric": args.metric, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "load_s": load_s, "loadavg": load}


class Timers:
    """Wall time spent inside chosen modules' forward calls."""

    def __init__(self, modules):
        self.total, self.hooks = {}, []
        for label, module in modules:
            self.total.setdefault(label, 0.0)
            self.hooks.append(module.register_forward_pre_hook(self._enter))
            self.hooks.append(module.register_forward_hook(lambda m, i, o, label=label: self._leave(label)))

    def _enter(self, module, inputs):
        self._start = time.perf_counter()

    def _leave(self, label):
        self.total[label] += time.perf_counter() - self._start

    def reset(self):
        self.total = dict.fromkeys(self.total, 0.0)

    def remove(self):
        for hook in self.hooks:
            hook.remove()


def split(args):
    import torch
    import microscale
    from microscale.torch import QQLinear, QuantizedExperts, QuantizedLinear

    model = load_torch("microscale", args.model, getattr(torch, args.dtype))
    quantized = [m for m in model.modules() if isinstance(m, (QuantizedLinear, QQLinear, QuantizedExperts))]
    head = model.get_output_embeddings()
    timers = Timers([("kernels", m) for m in quantized] + [("lm_head", head)])
    # Bytes read per token: every quantized module's codes and scales; lm_head's float weight.
    q_bytes = sum(b.numel() * b.element_size() for m in quantized for b in m.buffers() if b is not None)
    q_macs = sum(m.in_features * m.out_features for m in quantized if hasattr(m, "in_features"))
    head_bytes = head.weight.numel() * head.weight.element_size()
    vocab = torch_vocab(model)
    ids = token_ids(vocab, max(args.prefill, args.prompt, WARMUP_TOKENS))
    torch_warm_up(model, ids)
    out = {"model": args.model, "dtype": args.dtype, "cpu_target": microscale.cpu_target(),
           "quantized_bytes": q_bytes, "quantized_macs_per_token": q_macs, "lm_head_bytes": head_bytes,
           "lm_head_macs_per_token": head.weight.numel(), "loadavg": loadavg()}
    total = torch_decode(model, ids[:args.prompt], args.new, before_steps=timers.reset)
    out["decode"] = {"tokens": args.new, "ms_per_token": 1e3 * total / args.new,
                     **{f"{k}_ms_per_token": 1e3 * v / args.new for k, v in timers.total.items()}}
    timers.reset()
    total = torch_prefill(model, ids[:args.prefill])
    out["prefill"] = {"tokens": args.prefill, "ms_per_token": 1e3 * total / args.prefill,
                      **{f"{k}_ms_per_token": 1e3 * v / args.prefill for k, v in timers.total.items()}}
    for phase in ("decode", "prefill"):
        d = out[phase]
        d["rest_ms_per_token"] = d["ms_per_token"] - d["kernels_ms_per_token"] - d["lm_head_ms_per_token"]
    # The same decode products with nothing between them: every quantized Linear once on one
    # row, back to back (the kernels' own pace, at 1 and at 2 threads), and lm_head alone.
    timers.remove()
    linears = [m for m in quantized if hasattr(m, "in_features")]
    rows = [torch.randn(1, m.in_features, dtype=getattr(torch, args.dtype)) for m in linears]
    with torch.inference_mode():
        for threads in (1, THREADS):
            torch.set_num_threads(threads)
            times = [_timed(lambda: [m(x) for m, x in zip(linears, rows)]) for _ in range(5)]
            out["decode"][f"kernels_alone_{threads}_threads_ms"] = 1e3 * statistics.median(times)
        out["decode"]["lm_head_alone_ms"] = 1e3 * statistics.median(_timed(lambda: head(rows[0])) for _ in range(5))
    return out


def bandwidth(args):
    import torch

    x = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    out = {"loadavg": loadavg()}
    for threads in (1, THREADS):
        torch.set_num_threads(threads)
        best = min(_timed(x.sum) for _ in range(7))
        out[f"read_GBps_{threads}_threads"] = x.numel() * x.element_size() / best / 1e9
    out["read_GBps"] = out[f"read_GBps_{THREADS}_threads"]
    # torch's float32 GEMV over the same bytes, which reads faster than the sum on some machines.
    matrix, vector = x.view(-1, 2048), torch.ones(2048)
    best = min(_timed(lambda: torch.mv(matrix, vector)) for _ in range(7))
    out["f32_gemv_GBps"] = x.numel() * x.element_size() / best / 1e9
    # The machine's float32 matrix-product pace (torch's own GEMM, a prefill-sized product).
    a, b = torch.randn(512, 2048), torch.randn(2048, 8192)
    torch.mm(a, b)
    out["f32_gemm_GFLOPs"] = 2 * 512 * 2048 * 8192 / min(_timed(lambda: torch.mm(a, b)) for _ in range(5)) / 1e9
    return out


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def memory(args):
    """Peak RSS at three points: after the imports (torch, transformers, the model's modeling
    module and, for microscale, microscale.torch), after loading, after one forward pass of
    TOKENS tokens. Peak RSS never decreases, so each figure is the peak up to that point."""
    import glob

    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    torch.set_num_threads(THREADS)
    if args.runner == "microscale":
        import microscale.torch  # noqa: F401
    config = AutoConfig.from_pretrained(args.model)
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # imports the modeling module
    rss_imports = max_rss_bytes()
    start = time.perf_counter()
    if args.runner == "microscale":
        import microscale.torch as mst

        model = mst.from_pretrained(args.model)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    load_s = time.perf_counter() - start
    rss_load = max_rss_bytes()
    ids = token_ids(torch_vocab(model), args.tokens)
    with torch.inference_mode():
        out = model(torch.tensor([ids]), use_cache=True)
    rss_forward = max_rss_bytes()
    kv = sum(t.numel() * t.element_size() for layer in out.cache.layers for t in (layer.keys, layer.values))
    text = config.get_text_config()
    dtype_bytes = next(model.parameters()).element_size()
    # The forward pass's largest transient tensors: the MLP's gate, up and activation
    # [tokens, intermediate], the attention's q/k/v/o [tokens, hidden], the logits [tokens, vocab].
    activations = args.tokens * dtype_bytes * (3 * text.intermediate_size + 4 * text.hidden_size + text.vocab_size)
    ckpt = sum(os.path.getsize(f) for f in glob.glob(os.path.join(args.model, "*.safetensors")))
    linears = {type(m).__name__ for m in model.modules() if "Linear" in type(m).__name__}
    return {"runner": args.runner, "model": args.model, "checkpoint_bytes": ckpt, "tokens": args.tokens,
            "rss_imports": rss_imports, "rss_load": rss_load, "rss_forward": rss_forward,
            "kv_cache_bytes": kv, "activation_bytes": activations, "load_s": load_s,
            "dtype": str(next(model.parameters()).dtype), "linear_modules": sorted(linears),
            "transformers": transformers.__version__, "torch": torch.__version__}


def _read(path):
    # JSON lines only: a failed measurement leaves none.
    return [json.loads(line) for line in open(path) if line.startswith("{")] if os.path.exists(path) else []


def _label(row):
    fmt = "nvfp4" if "nvfp4" in row["model"] else "mxfp4" if "mxfp4" in row["model"] else "bf16"
    if row["runner"] == "llama":
        return f"llama.cpp {fmt} GGUF"
    dtype = {"bfloat16": "bf16", "float32": "f32"}[row["dtype"]]
    if row["runner"] == "transformers":
        return f"transformers {dtype}"
    return f"microscale {fmt}, {dtype} activations"


def report(args):
    """Markdown tables: medians of the speed rounds with same-run ratios; the split; memory."""
    rows = _read(args.speed)
    med = {}
    for row in rows:
        med.setdefault((_label(row), row["metric"]), []).append(row["tok_s"])
    labels = list(dict.fromkeys(_label(r) for r in rows))
    tf = "transformers bf16"
    print("| run | decode tok/s | prefill tok/s | decode vs transformers bf16 | decode vs llama.cpp | "
          "prefill vs llama.cpp | rounds (decode; prefill) |")
    print("|---|---|---|---|---|---|---|")

    def m(label, metric):
        v = med.get((label, metric))
        return statistics.median(v) if v else float("nan")

    for label in labels:
        fmt = next((f for f in ("nvfp4", "mxfp4") if f in label), None)
        ll = f"llama.cpp {fmt} GGUF" if fmt else None
        ratio = lambda a, b: f"{a / b:.2f}x" if b == b and a == a and label not in (tf, ll) else ""  # noqa: E731
        vs_llama_d = ratio(m(label, "decode"), m(ll, "decode")) if ll else ""
        vs_llama_p = ratio(m(label, "prefill"), m(ll, "prefill")) if ll else ""
        rounds = "; ".join(", ".join(f"{v:.2f}" for v in med.get((label, k), [])) for k in ("decode", "prefill"))
        print(f"| {label} | {m(label, 'decode'):.2f} | {m(label, 'prefill'):.2f} | "
              f"{ratio(m(label, 'decode'), m(tf, 'decode'))} | {vs_llama_d} | {vs_llama_p} | {rounds} |")
    bws = _read(args.bandwidth)
    for threads in (1, THREADS):
        bw = [r[f"read_GBps_{threads}_threads"] for r in bws if f"read_GBps_{threads}_threads" in r]
        if bw:
            print(f"\nmemory read bandwidth ({threads} thread{'s' if threads > 1 else ''}, sum of a 1 GiB float32 "
                  f"tensor): median {statistics.median(bw):.1f} GB/s ({', '.join(f'{b:.1f}' for b in bw)})")
    gemv = [r["f32_gemv_GBps"] for r in bws if "f32_gemv_GBps" in r]
    if gemv:
        print(f"\ntorch float32 GEMV over the 1 GiB, {THREADS} threads: median {statistics.median(gemv):.1f} GB/s "
              f"({', '.join(f'{g:.1f}' for g in gemv)})")
    gemm = [r["f32_gemm_GFLOPs"] for r in bws if "f32_gemm_GFLOPs" in r]
    if gemm:
        print(f"\ntorch float32 GEMM [512, 2048] x [2048, 8192], {THREADS} threads: median "
              f"{statistics.median(gemm):.0f} GFLOP/s ({', '.join(f'{g:.0f}' for g in gemm)})")
    gbps = statistics.median(r["read_GBps"] for r in bws) if bws else float("nan")
    splits = _read(args.split)
    alone_rows = []
    if splits:
        print("\n| microscale model | phase | ms/token | kernels | lm_head | rest | kernels' bytes/token "
              "at the bandwidth | lm_head's likewise | kernels GFLOP/s |")
        print("|---|---|---|---|---|---|---|---|---|")
    for s in splits:
        for phase in ("decode", "prefill"):
            d = s[phase]
            kb, hb = s["quantized_bytes"], s["lm_head_bytes"]
            # Prefill reuses each weight for all its tokens: bytes per token are the weight's / tokens.
            per = 1 if phase == "decode" else d["tokens"]
            head_tokens = 1 if phase == "decode" else d["tokens"]  # logits of the last position only
            gflops = 2 * s["quantized_macs_per_token"] / d["kernels_ms_per_token"] / 1e6
            print(f"| {os.path.basename(s['model'].rstrip('/'))}, {s['dtype']} | {phase} | {d['ms_per_token']:.2f} | "
                  f"{d['kernels_ms_per_token']:.2f} | {d['lm_head_ms_per_token']:.2f} | {d['rest_ms_per_token']:.2f} | "
                  f"{kb / per / 1e6:.0f} MB: {kb / per / gbps / 1e6:.2f} ms | "
                  f"{hb / head_tokens / 1e6:.0f} MB: {hb / head_tokens / gbps / 1e6:.2f} ms | {gflops:.0f} |")
        d = s["decode"]
        if "kernels_alone_1_threads_ms" in d:
            alone = ", ".join(f"{t} thread{'s' if t > 1 else ''} {d[f'kernels_alone_{t}_threads_ms']:.1f} ms "
                              f"({s['quantized_bytes'] / d[f'kernels_alone_{t}_threads_ms'] / 1e6:.1f} GB/s)"
                              for t in (1, THREADS))
            alone_rows.append(f"- {os.path.basename(s['model'].rstrip('/'))}: the quantized Linears of one decode "
                              f"step back to back: {alone}; lm_head alone {d['lm_head_alone_ms']:.1f} ms "
                              f"({s['lm_head_bytes'] / d['lm_head_alone_ms'] / 1e6:.1f} GB/s)")
    if alone_rows:
        print("\n" + "\n".join(alone_rows))
    mem = _read(args.memory)
    if mem:
        print("\n| load + one forward | checkpoint MB | peak RSS after imports MB | after load MB | after forward MB "
              "| KV + activations MB | peak / (checkpoint + runtime buffers) |")
        print("|---|---|---|---|---|---|---|")
    for r in mem:
        buffers = r["rss_imports"] + r["kv_cache_bytes"] + r["activation_bytes"]
        print(f"| {r['runner']} ({r['dtype']}, {', '.join(r['linear_modules'])}) | {r['checkpoint_bytes'] / 1e6:.0f} | "
              f"{r['rss_imports'] / 1e6:.0f} | {r['rss_load'] / 1e6:.0f} | {r['rss_forward'] / 1e6:.0f} | "
              f"{(r['kv_cache_bytes'] + r['activation_bytes']) / 1e6:.1f} | "
              f"{r['rss_forward'] / (r['checkpoint_bytes'] + buffers):.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("speed", "split"):
        s = sub.add_parser(name)
        if name == "speed":
            s.add_argument("runner", choices=["microscale", "transformers", "llama"])
        s.add_argument("model")
        if name == "speed":
            s.add_argument("metric", choices=["decode", "prefill"])
        s.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
        s.add_argument("--prompt", type=int, default=16)
        s.add_argument("--new", type=int, default=64)
        s.add_argument("--prefill", type=int, default=512)
    sub.add_parser("bandwidth")
    s = sub.add_parser("memory")
    s.add_argument("runner", choices=["microscale", "transformers"])
    s.add_argument("model")
    s.add_argument("--tokens", type=int, default=16)
    s = sub.add_parser("report")
    for name in ("speed", "split", "bandwidth", "memory"):
        s.add_argument(name)
    args = p.parse_args()
    if args.command == "report":
        report(args)
        return
    print(json.dumps({"speed": speed, "split": split, "bandwidth": bandwidth, "memory": memory}[args.command](args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""compare_torch — bench_transformer's computations timed in PyTorch on this machine, and one
table of dissect against torch.

    /usr/bin/python3 bench/compare_torch.py --dissect build/bench/bench/bench_transformer
    /usr/bin/python3 bench/compare_torch.py --dissect ... --cases 'attention' --threads 1

The same work in both, float32, B = 1, one case per row:

- prefill gpt2-small T=128|512: token + learned position embeddings, 12 pre-LayerNorm blocks
  (fused qkv, causal attention, c_proj, GELU-tanh MLP, residuals), ln_f and the head tied to the
  token embedding, logits for all T tokens;
- decode gpt2-small context=128|1023: one token after a KV cache holding C positions, filled
  once before timing (preallocated [L, B, H, capacity, d_k] tensors; each step writes position
  C, so every step is the same step, as dissect's truncate makes it);
- prefill / decode llama-7b-layer: LLaMA-7B shapes with one layer and a 256-token vocabulary
  (embedding, RMSNorm, fused qkv as dissect's QKVProjection, RoPE in rotate_half form, causal
  attention, o_proj, RMSNorm, SwiGLU with separate gate and up, RMSNorm, untied head);
- attention T=512|2048|4096: causal scaled-dot-product attention of [1, 12, T, 64] q, k, v;
- flash_fwd / flash_bwd T=512 … 8192: causal attention of [1, 8, T, 64] q, k, v, its forward and
  its backward alone (torch: autograd.grad of the kept graph with a given dout; T ≤ 4096 for the
  backward, whose [T, T] weights and their gradient take 2 GiB at 8192), against
  bench_attention's attention/flash_fwd and attention/flash_bwd (--dissect-attention); backward
  counted as 2.5 × the forward's FLOPs.

Attention is F.scaled_dot_product_attention where torch has it (2.0 and later), else torch
1.13's F._scaled_dot_product_attention, whose CPU path materialises the [T, T] weights.

torch is timed in a child process per thread count, with OMP_NUM_THREADS, OPENBLAS_NUM_THREADS
and MKL_NUM_THREADS set before torch is imported and torch.set_num_threads(n), under
torch.inference_mode(): warm-up runs, then the median of several runs (at least --runs and at
least a second). Then the dissect binary runs with --benchmark_format=json (median of
--dissect-repetitions) and one table is printed: tokens/s (GFLOP/s for attention, both counted
as causal_attention_flops does, the causal triangle) and dissect / torch.

Only torch and the standard library are needed. The script checks its own models before timing
them: attention against a hand-written masked softmax, decoding against a full forward.
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

GPT2 = dict(d_model=768, layers=12, heads=12, vocab=50257, context=1024)
LLAMA_LAYER = dict(d_model=4096, layers=1, heads=32, d_ff=11008, vocab=256, context=2048)
ATTENTION = dict(heads=12, head_dim=64)
FLASH = dict(heads=8, head_dim=64)
FLASH_KINDS = ("flash_fwd", "flash_bwd")


@dataclass(frozen=True)
class Case:
    kind: str   # prefill, decode, attention
    model: str  # gpt2-small, llama-7b-layer, "" for attention
    key: str    # T or context
    size: int

    @property
    def name(self):
        return " ".join(part for part in (self.kind, self.model, f"{self.key}={self.size}") if part)

    @property
    def unit(self):
        return "GFLOP/s" if self.kind in ("attention", *FLASH_KINDS) else "tokens/s"

    @property
    def dissect_prefix(self):
        """The dissect benchmark's name up to /threads=."""
        if self.kind == "attention":
            return f"attention/dissect/T={self.size}"
        if self.kind in FLASH_KINDS:
            return f"attention/{self.kind}/T={self.size}"
        return f"{self.kind}/{self.model}/{self.key}={self.size}"


CASES = [Case("prefill", "gpt2-small", "T", t) for t in (128, 512)]
CASES += [Case("decode", "gpt2-small", "context", c) for c in (128, 1023)]
CASES += [Case("prefill", "llama-7b-layer", "T", t) for t in (128, 512)]
CASES += [Case("decode", "llama-7b-layer", "context", c) for c in (128, 1024)]
CASES += [Case("attention", "", "T", t) for t in (512, 2048, 4096)]
CASES += [Case("flash_fwd", "", "T", t) for t in (512, 1024, 2048, 4096, 8192)]
CASES += [Case("flash_bwd", "", "T", t) for t in (512, 1024, 2048, 4096)]


def causal_attention_flops(batch, heads, tokens, keys, head_dim):
    """dissect's causal_attention_flops: 4·B·H·d_k·Σ_t (S − T + t + 1)."""
    pairs = tokens * (keys - tokens) + tokens * (tokens + 1) // 2
    return 4 * batch * heads * head_dim * pairs


def log(*args):
    print(*args, file=sys.stderr, flush=True)


# ---- the torch side (child process) ------------------------------------------------------------

def torch_worker(threads, cases, runs, warmup):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    sdpa_name = "F.scaled_dot_product_attention"
    if hasattr(F, "scaled_dot_product_attention"):
        def sdpa(q, k, v, causal):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        sdpa_name = "F._scaled_dot_product_attention (torch 1.13, materialises [T, S])"

        def sdpa(q, k, v, causal):
            return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]

    def time_median(run):
        for _ in range(warmup):
            run()
        times = []
        while len(times) < runs or (sum(times) < 1.0 and len(times) < 50):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times), len(times)

    generator = torch.Generator().manual_seed(threads)

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=generator).mul_(std)

    def split_heads(x, heads):
        """[B, T, H·d_k] → [B, H, T, d_k]."""
        b, t, width = x.shape
        return x.view(b, t, heads, width // heads).transpose(1, 2)

    def merge_heads(x):
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)

    class KVCache:
        """Preallocated keys and values of every layer: [L, B, H, capacity, d_k]."""

        def __init__(self, layers, heads, capacity, head_dim):
            self.k = torch.zeros(layers, 1, heads, capacity, head_dim)
            self.v = torch.zeros(layers, 1, heads, capacity, head_dim)

        def attend(self, layer, q, k, v, position):
            """Writes k, v at position … and attends q to every position up to them: one new
            query sees every key held; several (a prefill, from position 0) need the mask."""
            assert k.shape[2] == 1 or position == 0, "a multi-token step starts at position 0"
            end = position + k.shape[2]
            self.k[layer, :, :, position:end] = k
            self.v[layer, :, :, position:end] = v
            return sdpa(q, self.k[layer, :, :, :end], self.v[layer, :, :, :end], k.shape[2] > 1)

    class Gpt2:
        def __init__(self, d_model, layers, heads, vocab, context):
            self.heads, self.d_model = heads, d_model
            D, residual_std = d_model, 0.02 / math.sqrt(2 * layers)
            self.wte, self.wpe = normal(vocab, D), normal(context, D)
            self.blocks = [dict(ln1_w=torch.ones(D), ln1_b=torch.zeros(D),
                                qkv_w=normal(3 * D, D), qkv_b=torch.zeros(3 * D),
                                proj_w=normal(D, D, std=residual_std), proj_b=torch.zeros(D),
                                ln2_w=torch.ones(D), ln2_b=torch.zeros(D),
                                up_w=normal(4 * D, D), up_b=torch.zeros(4 * D),
                                down_w=normal(D, 4 * D, std=residual_std), down_b=torch.zeros(D))
                           for _ in range(layers)]
            self.lnf_w, self.lnf_b = torch.ones(D), torch.zeros(D)

        def new_cache(self):
            return KVCache(len(self.blocks), self.heads, self.wpe.shape[0],
                           self.d_model // self.heads)

        def forward(self, ids, cache=None, position=0):
            """ids [1, T] at positions position … → logits [1, T, V]."""
            D, T = self.d_model, ids.shape[1]
            x = self.wte[ids] + self.wpe[position:position + T]
            for layer, p in enumerate(self.blocks):
                h = F.layer_norm(x, (D,), p["ln1_w"], p["ln1_b"], 1e-5)
                q, k, v = (split_heads(part, self.heads)
                           for part in F.linear(h, p["qkv_w"], p["qkv_b"]).split(D, dim=2))
                if cache is None:
                    a = sdpa(q, k, v, True)
                else:
                    a = cache.attend(layer, q, k, v, position)
                x = x + F.linear(merge_heads(a), p["proj_w"], p["proj_b"])
                h = F.layer_norm(x, (D,), p["ln2_w"], p["ln2_b"], 1e-5)
                h = F.gelu(F.linear(h, p["up_w"], p["up_b"]), approximate="tanh")
                x = x + F.linear(h, p["down_w"], p["down_b"])
            x = F.layer_norm(x, (D,), self.lnf_w, self.lnf_b, 1e-5)
            return F.linear(x, self.wte)  # tied head

    def rms_norm(x, weight, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    class LlamaLayerModel:
        def __init__(self, d_model, layers, heads, d_ff, vocab, context, theta=10000.0):
            self.heads, self.d_model = heads, d_model
            D, F_, d_k = d_model, d_ff, d_model // heads
            residual_std = 0.02 / math.sqrt(2 * layers)
            self.embed = normal(vocab, D)
            self.layers = [dict(norm1=torch.ones(D), qkv_w=normal(3 * D, D),
                                o_w=normal(D, D, std=residual_std), norm2=torch.ones(D),
                                gate_w=normal(F_, D), up_w=normal(F_, D),
                                down_w=normal(D, F_, std=residual_std))
                           for _ in range(layers)]
            self.norm, self.head = torch.ones(D), normal(vocab, D)
            # RoPE's tables, computed in double as dissect's RotaryTable: [context, d_k].
            inv_freq = 1.0 / theta ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
            angles = torch.outer(torch.arange(context, dtype=torch.float64), inv_freq)
            angles = torch.cat((angles, angles), dim=1)
            self.cos, self.sin = angles.cos().float(), angles.sin().float()

        def new_cache(self):
            return KVCache(len(self.layers), self.heads, self.cos.shape[0],
                           self.d_model // self.heads)

        def rope(self, x, position):
            cos = self.cos[position:position + x.shape[2]]
            sin = self.sin[position:position + x.shape[2]]
            half = x.shape[-1] // 2
            rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
            return x * cos + rotated * sin

        def forward(self, ids, cache=None, position=0):
            D = self.d_model
            x = self.embed[ids]
            for layer, p in enumerate(self.layers):
                h = rms_norm(x, p["norm1"])
                q, k, v = (split_heads(part, self.heads)
                           for part in F.linear(h, p["qkv_w"]).split(D, dim=2))
                q, k = self.rope(q, position), self.rope(k, position)
                if cache is None:
                    a = sdpa(q, k, v, True)
                else:
                    a = cache.attend(layer, q, k, v, position)
                x = x + F.linear(merge_heads(a), p["o_w"])
                h = rms_norm(x, p["norm2"])
                h = F.silu(F.linear(h, p["gate_w"])) * F.linear(h, p["up_w"])
                x = x + F.linear(h, p["down_w"])
            return F.linear(rms_norm(x, self.norm), self.head)

    def check_attention():
        q, k, v = (torch.randn(1, 3, 9, 8, generator=generator) for _ in range(3))
        scores = q @ k.transpose(-1, -2) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
        expected = scores.softmax(-1) @ v
        if not torch.allclose(sdpa(q, k, v, True), expected, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{sdpa_name} with is_causal=True is not causal attention")

    def check_decode(model, name, context):
        """The decoded step equals the last row of a full forward over context + 1 tokens."""
        ids = torch.randint(0, model_vocab(model), (1, context + 1), generator=generator)
        cache = model.new_cache()
        model.forward(ids[:, :context], cache, 0)
        step = model.forward(ids[:, context:], cache, context)[0, -1]
        full = model.forward(ids)[0, -1]
        distance = (step - full).abs().max() / full.abs().max()
        if not distance < 1e-4:
            raise SystemExit(f"{name}: decoded logits differ from a full forward by {distance}")

    def model_vocab(model):
        return model.wte.shape[0] if isinstance(model, Gpt2) else model.embed.shape[0]

    results = {}

    def record(case, seconds, count, rate):
        results[case.name] = dict(seconds=seconds, runs=count, rate=rate)
        log(f"  torch {case.name:<34} threads={threads}  {rate:12.2f} {case.unit} "
            f"(median of {count}: {seconds * 1e3:.2f} ms)")

    def model_cases(model, name, config):
        for case in (c for c in cases if c.model == name):
            ids = torch.randint(0, config["vocab"], (1, case.size + 1), generator=generator)
            if case.kind == "prefill":
                prompt = ids[:, :case.size]
                seconds, count = time_median(lambda: model.forward(prompt))
                record(case, seconds, count, case.size / seconds)
            else:
                cache = model.new_cache()
                model.forward(ids[:, :case.size], cache, 0)
                token = ids[:, case.size:]
                seconds, count = time_median(lambda: model.forward(token, cache, case.size))
                record(case, seconds, count, 1 / seconds)

    with torch.inference_mode():
        check_attention()
        if any(c.model == "gpt2-small" for c in cases):
            model = Gpt2(**GPT2)
            check_decode(model, "gpt2-small", 128)
            model_cases(model, "gpt2-small", GPT2)
            del model
        if any(c.model == "llama-7b-layer" for c in cases):
            model = LlamaLayerModel(**LLAMA_LAYER)
            check_decode(model, "llama-7b-layer", 128)
            model_cases(model, "llama-7b-layer", LLAMA_LAYER)
            del model
        for case in (c for c in cases if c.kind == "attention"):
            shape = (1, ATTENTION["heads"], case.size, ATTENTION["head_dim"])
            q, k, v = (torch.randn(*shape, generator=generator) for _ in range(3))
            seconds, count = time_median(lambda: sdpa(q, k, v, True))
            flops = causal_attention_flops(1, ATTENTION["heads"], case.size, case.size,
                                           ATTENTION["head_dim"])
            record(case, seconds, count, flops / seconds / 1e9)
        for case in (c for c in cases if c.kind in FLASH_KINDS):
            shape = (1, FLASH["heads"], case.size, FLASH["head_dim"])
            flops = causal_attention_flops(1, FLASH["heads"], case.size, case.size,
                                           FLASH["head_dim"])
            if case.kind == "flash_fwd":
                q, k, v = (torch.randn(*shape, generator=generator) for _ in range(3))
                seconds, count = time_median(lambda: sdpa(q, k, v, True))
                record(case, seconds, count, flops / seconds / 1e9)
                continue
            with torch.inference_mode(False), torch.enable_grad():
                q, k, v = (torch.randn(*shape, generator=generator).requires_grad_(True)
                           for _ in range(3))
                dout = torch.randn(*shape, generator=generator)
                out = sdpa(q, k, v, True)
                seconds, count = time_median(
                    lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                del out
            record(case, seconds, count, 2.5 * flops / seconds / 1e9)

    return dict(threads=threads, torch=torch.__version__, attention=sdpa_name,
                torch_threads=torch.get_num_threads(),
                interop_threads=torch.get_num_interop_threads(), blas=blas_info(),
                results=results)


def blas_info():
    """OpenBLAS's own view, when torch's BLAS is OpenBLAS (Debian's libblas.so.3 usually is)."""
    import ctypes
    try:
        blas = ctypes.CDLL("libblas.so.3")
        blas.openblas_get_config.restype = ctypes.c_char_p
        blas.openblas_get_corename.restype = ctypes.c_char_p
        return (f"OpenBLAS {blas.openblas_get_config().decode()}, core "
                f"{blas.openblas_get_corename().decode()}, "
                f"{blas.openblas_get_num_threads()} threads")
    except (OSError, AttributeError):
        return "libblas.so.3 is not OpenBLAS (or not found)"


def run_torch(threads, cases, args):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    command = [sys.executable, os.path.abspath(__file__), "--worker", str(threads),
               "--cases", args.cases, "--runs", str(args.runs), "--warmup", str(args.warmup)]
    output = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(output.stdout)


# ---- the dissect side ---------------------------------------------------------------------------

def run_dissect(binary, cases, threads, args):
    # Google Benchmark's filter is a POSIX extended regex, where re.escape's "\-" is an error.
    special = re.compile(r"([.^$*+?()\[\]{}|\\])")
    prefixes = "|".join(special.sub(r"\\\1", case.dissect_prefix) for case in cases)
    thread_pattern = "|".join(str(t) for t in threads)
    command = [binary, "--benchmark_format=json",
               f"--benchmark_filter=^({prefixes})/threads=({thread_pattern})/",
               f"--benchmark_repetitions={args.dissect_repetitions}",
               "--benchmark_report_aggregates_only=true", *args.dissect_arg]
    log("$ " + " ".join(command))
    output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
    # The binary prints its context (threads, SIMD, flags) before the JSON.
    start = output.find("\n{")
    if start < 0:
        raise SystemExit(f"{binary} printed no JSON results:\n{output}")
    context, data = output[:start + 1], json.loads(output[start + 1:])
    has_median = any(b.get("aggregate_name") == "median" for b in data["benchmarks"])
    by_prefix = {case.dissect_prefix: case for case in cases}
    results = {}
    for bench in data["benchmarks"]:
        if has_median and bench.get("aggregate_name") != "median":
            continue
        match = re.match(r"^(.*)/threads=(\d+)/", bench.get("run_name", bench["name"]))
        if not match or match[1] not in by_prefix:
            continue
        case = by_prefix[match[1]]
        rate = bench["GFLOP/s"] / 1e9 if case.unit == "GFLOP/s" else bench["tokens_per_second"]
        results[(case.name, int(match[2]))] = rate
    return context, data.get("context", {}), results


# ---- main ---------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dissect", help="the bench_transformer binary (omit: torch only)")
    parser.add_argument("--dissect-attention",
                        help="the bench_attention binary, for the flash_* cases (omit: torch only)")
    parser.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    parser.add_argument("--cases", default=".", help="regex over case names, e.g. 'decode'")
    parser.add_argument("--runs", type=int, default=5, help="torch: timed runs at least (5)")
    parser.add_argument("--warmup", type=int, default=2, help="torch: warm-up runs (2)")
    parser.add_argument("--dissect-repetitions", type=int, default=3,
                        help="dissect: --benchmark_repetitions, the median is used (3)")
    parser.add_argument("--dissect-arg", action="append", default=[],
                        help="one more argument for the dissect binary (repeatable)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = [case for case in CASES if re.search(args.cases, case.name)]
    if not cases:
        parser.error(f"--cases {args.cases!r} matches none of: " +
                     ", ".join(case.name for case in CASES))
    if args.worker is not None:
        print(json.dumps(torch_worker(args.worker, cases, args.runs, args.warmup)))
        return

    threads = [int(t) for t in args.threads.split(",")]
    load_before = os.getloadavg()
    torch_runs = {}
    for n in threads:
        log(f"torch, {n} thread(s):")
        torch_runs[n] = run_torch(n, cases, args)
    dissect = {}
    flash_cases = [case for case in cases if case.kind in FLASH_KINDS]
    other_cases = [case for case in cases if case.kind not in FLASH_KINDS]
    if args.dissect and other_cases:
        context_text, context, dissect = run_dissect(args.dissect, other_cases, threads, args)
    if args.dissect_attention and flash_cases:
        context_text, context, flash = run_dissect(args.dissect_attention, flash_cases, threads,
                                                   args)
        dissect.update(flash)
    load_after = os.getloadavg()

    first = torch_runs[threads[0]]
    print(f"torch {first['torch']}; attention: {first['attention']}")
    for n, run in torch_runs.items():
        print(f"  {n} thread(s): torch.get_num_threads() = {run['torch_threads']}, interop "
              f"{run['interop_threads']}, OMP/OPENBLAS/MKL_NUM_THREADS = {n}; {run['blas']}")
    print(f"  OPENBLAS_CORETYPE = {os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    if args.dissect or args.dissect_attention:
        print(context_text.rstrip())
        print(f"  date {context.get('date', '?')}, host {context.get('host_name', '?')}")
    print(f"load average (1, 5, 15 min): before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}")
    print()
    print("| case | unit | threads | dissect | torch | dissect / torch |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        for n in threads:
            theirs = torch_runs[n]["results"].get(case.name, {}).get("rate")
            ours = dissect.get((case.name, n))
            ratio = f"{ours / theirs:.2f}" if ours and theirs else "–"
            mine = f"{ours:.1f}" if ours else "–"
            torch_text = f"{theirs:.1f}" if theirs else "–"
            print(f"| {case.name} | {case.unit} | {n} | {mine} | {torch_text} | {ratio} |")


if __name__ == "__main__":
    main()

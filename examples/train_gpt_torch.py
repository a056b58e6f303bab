#!/usr/bin/python3
"""train_gpt_torch — examples/train_gpt.cpp in PyTorch, step for step.

    build/release/examples/train_gpt --save-init init.safetensors     # the initial weights
    OMP_NUM_THREADS=1 /usr/bin/python3 examples/train_gpt_torch.py --init init.safetensors
    build/release/examples/train_gpt --compare train_gpt_torch.csv    # both curves in one SVG

Trains the identical character-level GPT-2 on Debian's fortunes with Debian's python3-torch
and prints the same lines, so that the two programs can be compared number for number. What is
shared, exactly:

- The model: pre-LayerNorm GPT-2 blocks (LayerNorm eps 1e-5; one fused qkv Linear whose rows
  are the H query heads, then the key heads, then the value heads, d_k = D/H each; causal
  softmax attention scaled by 1/sqrt(d_k); proj; a D -> 4D -> D MLP with tanh GELU), learned
  positions, a final LayerNorm and a head tied to the token embedding. The parameters carry
  dissect's state_dict names (wte.weight, h.0.attn.qkv.weight, ...).
- The initial weights: read from the safetensors file train_gpt --save-init wrote, parsed
  here by hand (an 8-byte little-endian header length, a JSON header, raw little-endian data),
  with its metadata checked against the flags and the data's vocabulary.
- The data: the same files, joined the same way, one token per byte, the same 90/10 split.
- The batches: dissect's generator (SplitMix64) re-implemented below with Python integers
  modulo 2**64, so every window offset is the same: next_u64() % (n - T - 1), b = 0 ... B-1,
  training batches from Generator(seed + 1000), validation batches from Generator(seed + 2000).
- The optimizer and schedule: torch.optim.AdamW with two parameter groups (matrices with
  --weight-decay, the rest without), betas (0.9, 0.95), eps 1e-8; the learning rate set before
  every step by the same linear warm-up and cosine to lr/10. No gradient clipping.

The float32 arithmetic is not the same (other GEMM kernels, summation orders, attention and
GELU code), so the two runs drift apart by rounding; their loss curves agree within the noise
of the batches, not bit for bit. tokens/s counts training tokens over the training steps' time
(batch sampling included, evaluation excluded), as train_gpt does.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
DEFAULT_DATA = "/usr/share/games/fortunes"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="train a character-level GPT-2 on Debian's fortunes "
                                "(PyTorch twin of examples/train_gpt.cpp)")
    p.add_argument("--init", required=True,
                   help="the initial weights: the file `train_gpt --save-init PATH` wrote")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=None, help="default min(100, steps // 10)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--curves", default="train_gpt_torch.csv",
                   help="CSV of the curves, train_gpt's --curves format (\"none\" to skip)")
    p.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (default 1)")
    args = p.parse_args(argv)
    for name in ("d_model", "layers", "heads", "context", "steps", "batch", "eval_every",
                 "eval_batches", "threads"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: must be > 0")
    if args.d_model % args.heads:
        p.error(f"--heads: {args.heads} does not divide --d-model {args.d_model}")
    if args.warmup is None:
        args.warmup = min(100, args.steps // 10)
    if not 0 <= args.warmup <= args.steps:
        p.error(f"--warmup: must be in [0, {args.steps}]")
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error("--lr: must be a finite number > 0")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        p.error("--weight-decay: must be a finite number >= 0")
    if not 0 <= args.seed <= MASK64:
        p.error("--seed: must be in [0, 2**64 - 1]")
    return args


# ---- dissect's generator (include/dissect/tensor/init.hpp) ----------------------------------------------


class SplitMix64:
    """dissect::Generator: state += golden gamma, then the mixer, all modulo 2**64."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + GOLDEN_GAMMA) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


# ---- data ---------------------------------------------------------------------------------------


class DataMissing(Exception):
    pass


def read_fortunes(directory):
    """The joined text (bytes) and the file names, as train_gpt's read_fortunes."""
    if not os.path.isdir(directory):
        raise DataMissing(f"{directory} is not a directory")
    names = sorted(entry.name.encode() for entry in os.scandir(directory)
                   if entry.is_file(follow_symlinks=False) and not entry.is_symlink()
                   and not entry.name.endswith((".dat", ".u8")) and not entry.name.startswith("."))
    if not names:
        raise DataMissing(f"no fortune file in {directory}")
    parts = []
    for name in names:
        with open(os.path.join(directory.encode(), name), "rb") as f:
            data = f.read()
        if not data:
            continue
        if not data.endswith(b"\n"):
            data += b"\n"
        if not data.endswith(b"\n%\n") and data != b"%\n":
            data += b"%\n"
        parts.append(data)
    return b"".join(parts), [n.decode() for n in names]


def sample_batch(split, context, batch, gen, torch):
    """B windows of T + 1 tokens at next_u64() % (n - T - 1): inputs and targets [B, T]."""
    span = len(split) - context - 1
    offsets = torch.tensor([gen.next_u64() % span for _ in range(batch)], dtype=torch.int64)
    windows = split[offsets[:, None] + torch.arange(context + 1)]
    return windows[:, :-1], windows[:, 1:]


# ---- safetensors, by hand -----------------------------------------------------------------------

DTYPES = {"F32": np.float32, "F64": np.float64}


def read_safetensors(path):
    """{name: float32 numpy array} and the __metadata__ dict of a .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than a safetensors header")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}; this reader knows "
                             f"{', '.join(DTYPES)}")
        begin, end = info["data_offsets"]
        dtype = np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")
        count = math.prod(info["shape"])
        if end - begin != count * dtype.itemsize or end > len(data):
            raise ValueError(f"{path}: {name}: data_offsets [{begin}, {end}] do not hold "
                             f"{info['shape']} of {info['dtype']}")
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"])
        tensors[name] = array.astype(np.float32)
    return tensors, metadata


# ---- the model ----------------------------------------------------------------------------------


def build_model(torch, config):
    nn, F = torch.nn, torch.nn.functional
    D, L, H, T, V = (config[k] for k in ("d_model", "n_layers", "n_heads", "context", "vocab"))
    d_ff, d_k = config["d_ff"], D // H

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(D, eps=1e-5)
            self.attn = nn.Module()
            self.attn.qkv = nn.Linear(D, 3 * D)
            self.attn.proj = nn.Linear(D, D)
            self.ln_2 = nn.LayerNorm(D, eps=1e-5)
            self.mlp = nn.Module()
            self.mlp.up = nn.Linear(D, d_ff)
            self.mlp.down = nn.Linear(d_ff, D)

        def forward(self, x, mask):
            B, T_, _ = x.shape
            q, k, v = self.attn.qkv(self.ln_1(x)).split(D, dim=-1)
            q, k, v = (t.view(B, T_, H, d_k).transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d_k)
            scores = scores.masked_fill(mask[:T_, :T_], float("-inf"))
            attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T_, D)
            x = x + self.attn.proj(attended)
            return x + self.mlp.down(F.gelu(self.mlp.up(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, D)
            self.wpe = nn.Embedding(T, D)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(D, eps=1e-5)
            # Key position > query position: masked out.
            self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1),
                                 persistent=False)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for block in self.h:
                x = block(x, self.mask)
            return F.linear(self.ln_f(x), self.wte.weight)  # the tied head

    return GPT()


def load_initial_weights(torch, model, tensors, path):
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise ValueError(f"{path}: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name, parameter in own.items():
            if tuple(tensors[name].shape) != tuple(parameter.shape):
                raise ValueError(f"{path}: {name} is {list(tensors[name].shape)}, the model's "
                                 f"{list(parameter.shape)}")
            parameter.copy_(torch.from_numpy(tensors[name]))


# ---- training -----------------------------------------------------------------------------------


def learning_rate(args, step):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    low = 0.1 * args.lr
    progress = (step - args.warmup + 1) / (args.steps - args.warmup)
    return low + 0.5 * (args.lr - low) * (1.0 + math.cos(math.pi * progress))


def format_duration(seconds):
    s = round(max(seconds, 0.0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


def progress_line(step, steps, loss, val, lr, tokens_per_second, eta):
    line = f"step {step:6d}/{steps}  loss {loss:.4f}"
    if val is not None:
        line += f"  val {val:.4f}"
    return line + f"  lr {lr:.2e}  {tokens_per_second:,.0f} tok/s  ETA {format_duration(eta)}"


def main(argv=None):
    args = parse_args(argv)
    # Before torch loads: set_num_threads does not bound OpenBLAS's own pool.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)

    load_start = time.perf_counter()
    try:
        text, files = read_fortunes(args.data)
    except DataMissing as missing:
        print(f"train_gpt_torch: {missing}\nThe fortunes are not installed. Install them with:\n"
              "  sudo apt-get install fortunes\nor point --data at a directory of fortune files.",
              file=sys.stderr)
        return 2
    vocab = sorted(set(text))
    id_of = np.full(256, -1, dtype=np.int64)
    id_of[vocab] = np.arange(len(vocab))
    ids = torch.from_numpy(id_of[np.frombuffer(text, dtype=np.uint8)])
    n = len(ids)
    n_train = n * 9 // 10
    train, valid = ids[:n_train], ids[n_train:]
    load_seconds = time.perf_counter() - load_start
    B, T = args.batch, args.context
    if len(valid) < T + 2:
        print(f"train_gpt_torch: --context: {T} needs splits of at least {T + 2} characters",
              file=sys.stderr)
        return 2

    config = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads,
              "d_ff": 4 * args.d_model, "vocab": len(vocab), "context": T}
    tensors, metadata = read_safetensors(args.init)
    # The file must describe this very model and vocabulary (dissect's save_model keys).
    saved = json.loads(metadata.get("dissect.config", "{}"))
    for key, value in config.items():
        if key in saved and saved[key] != value:
            print(f"train_gpt_torch: --init {args.init}: {key} is {saved[key]}, the flags "
                  f"and data give {value}", file=sys.stderr)
            return 2
    if "dissect.vocab_bytes" in metadata and json.loads(metadata["dissect.vocab_bytes"]) != vocab:
        print(f"train_gpt_torch: --init {args.init}: its vocab_bytes differ from the data's",
              file=sys.stderr)
        return 2
    model = build_model(torch, config)
    load_initial_weights(torch, model, tensors, args.init)
    n_params = sum(p.numel() for p in model.parameters())

    matrices = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": args.weight_decay},
                             {"params": others, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    valid_gen = SplitMix64(args.seed + 2000)
    valid_batches = [sample_batch(valid, T, B, valid_gen, torch) for _ in range(args.eval_batches)]
    train_gen = SplitMix64(args.seed + 1000)

    def evaluate():
        model.eval()
        with torch.no_grad():
            total = sum(F.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1)).item()
                        for x, y in valid_batches)
        model.train()
        return total / len(valid_batches)

    D, L, H = args.d_model, args.layers, args.heads
    print(f"train_gpt_torch: GPT-2 D {D}, L {L}, H {H}, F {4 * D}, context {T}, vocabulary "
          f"{len(vocab)} (tied head): {n_params:,} parameters (12·D²·L = {12 * D * D * L:,})")
    print(f"  data: {n:,} bytes of {len(files)} fortune files in {args.data} (read in "
          f"{load_seconds:.2f} s): {n_train:,} train, {n - n_train:,} validation")
    print(f"  AdamW lr {args.lr:g} (warm-up {args.warmup} steps, cosine to {0.1 * args.lr:g}), "
          f"betas (0.9, 0.95), weight decay {args.weight_decay:g} on matrices; batch {B} × {T} "
          f"tokens, {args.steps} steps, seed {args.seed}")
    blas = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"env {blas or 'without OPENBLAS_* overrides'}; weights from {args.init}")

    tty = sys.stdout.isatty()
    rows = [(0, None, None, evaluate())]  # (step, lr, train loss, val loss)
    print(f"step {0:6d}/{args.steps}  val {rows[0][3]:.4f}  (before training)", flush=True)

    start = last_redraw = time.perf_counter()
    train_seconds = interval_seconds = interval_loss = 0.0
    interval_steps = 0
    train_losses = []
    for step in range(args.steps):
        step_start = time.perf_counter()
        x, y = sample_batch(train, T, B, train_gen, torch)
        lr = learning_rate(args, step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, len(vocab)), y.reshape(-1))
        loss.backward()
        opt.step()
        loss = loss.item()
        if not math.isfinite(loss):
            print(f"\ntrain_gpt_torch: training diverged: the loss of step {step + 1} is {loss}",
                  file=sys.stderr)
            return 1
        seconds = time.perf_counter() - step_start
        train_seconds += seconds
        interval_seconds += seconds
        interval_loss += loss
        interval_steps += 1
        train_losses.append(loss)

        done = step + 1
        report = done % args.eval_every == 0 or done == args.steps
        val = evaluate() if report else None
        rows.append((done, lr, loss, val))
        eta = (time.perf_counter() - start) / done * (args.steps - done)
        redraw = tty and time.perf_counter() - last_redraw >= 0.1  # ten times a second at most
        if redraw:
            last_redraw = time.perf_counter()
        if report or redraw:
            line = progress_line(done, args.steps, interval_loss / interval_steps, val, lr,
                                 interval_steps * B * T / max(interval_seconds, 1e-9), eta)
            print(f"\r{line:<90}" if tty else line, end="\n" if report else "", flush=True)
        if report:
            interval_loss, interval_steps, interval_seconds = 0.0, 0, 0.0
    total_seconds = time.perf_counter() - start
    last = min(args.steps, args.eval_every)
    print(f"final: train loss {sum(train_losses[-last:]) / last:.4f} (mean of the last {last} "
          f"steps), val loss {rows[-1][3]:.4f}; {args.steps} steps in {total_seconds:.1f} s, "
          f"training {train_seconds:.1f} s = {args.steps * B * T / train_seconds:,.0f} tok/s")

    if args.curves and args.curves != "none":
        with open(args.curves, "w") as f:
            f.write("step,lr,train_loss,val_loss\n")
            for done, lr, loss, val in rows:
                cells = [str(done), "" if lr is None else f"{lr:.6e}",
                         "" if loss is None else f"{loss:.6f}", "" if val is None else f"{val:.6f}"]
                f.write(",".join(cells) + "\n")
        print(f"wrote {args.curves}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

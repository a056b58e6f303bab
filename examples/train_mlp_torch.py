#!/usr/bin/python3
"""train_mlp_torch — examples/train_mlp.cpp in PyTorch, step for step.

    OMP_NUM_THREADS=1 /usr/bin/python3 examples/train_mlp_torch.py            # same defaults
    /usr/bin/python3 examples/train_mlp_torch.py --epochs 1 --train-limit 2000 --test-limit 500

Trains the identical model on Fashion-MNIST (Debian package dataset-fashion-mnist) with Debian's
python3-torch, and prints the same per-epoch lines, so the two programs can be compared number
for number. What is shared, exactly:

- Initial weights: dissect's generator is SplitMix64, re-implemented below with numpy. Layer i
  draws from Generator(seed + i): for --init pytorch W ~ U(-1/sqrt(in), 1/sqrt(in)) row-major
  and then b with the same bound; for --init kaiming W ~ U(-sqrt(6/in), sqrt(6/in)) and b = 0.
  dissect computes each draw as fma(high - low, u, low) in double with u = (next_u64() >> 11)
  * 2**-53; with low = -high that is one rounding of bound * (2u - 1), which numpy reproduces
  exactly, so both programs start from bit-identical float32 weights.
- Batch order: each epoch runs Fisher-Yates over the indices 0..n-1, i from n-1 down to 1,
  j = next_u64() mod (i + 1), from one Generator(seed + 1000) that runs on across epochs. The
  modulo's bias (< 60000 / 2**64) does not matter here.
- Inputs: float32(pixel) / 255, then (x - 0.2860) / 0.3530 (the training set's mean and
  standard deviation) unless --no-normalize, in float32.
- Loss, optimizer and hyperparameters: nn.CrossEntropyLoss (mean); torch.optim.Adam, AdamW or
  SGD with the same defaults as train_mlp.

The float32 arithmetic is not the same (different GEMM kernels and summation orders), so the
two runs drift apart by rounding and their accuracies agree to a few tenths of a percent, not
exactly. samples/s counts training images over the training loop's time, evaluation excluded.
"""

import argparse
import gzip
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

CLASSES = 10
MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="train an MLP on Fashion-MNIST (PyTorch twin of "
                                "examples/train_mlp.cpp)")
    p.add_argument("--hidden", default="256,128", help="hidden widths, comma-separated")
    p.add_argument("--init", choices=["pytorch", "kaiming"], default="pytorch")
    p.add_argument("--optimizer", choices=["adam", "adamw", "sgd"], default="adam")
    p.add_argument("--lr", type=float, default=None,
                   help="default 1e-3 for adam/adamw, 0.05 for sgd")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="default 0; 0.01 for adamw")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--train-limit", type=int, default=-1)
    p.add_argument("--test-limit", type=int, default=-1)
    p.add_argument("--no-normalize", dest="normalize", action="store_false",
                   help="pixels scaled to [0, 1] only; by default also (x - 0.2860) / 0.3530")
    p.add_argument("--threads", type=int, default=1,
                   help="torch and BLAS threads (default 1)")
    p.add_argument("--svg", default=None,
                   help="write the curves with matplotlib, if it is installed")
    args = p.parse_args(argv)
    for name in ("epochs", "batch", "threads"):
        if getattr(args, name) <= 0:
            p.error(f"--{name}: must be > 0")
    try:
        args.hidden = [int(w) for w in args.hidden.split(",") if w]
    except ValueError:
        p.error(f"--hidden: cannot read {args.hidden!r}")
    if any(w <= 0 for w in args.hidden):
        p.error("--hidden: widths must be > 0")
    return args


# ---- dissect's generator (include/dissect/tensor/init.hpp), vectorised -----------------------------------


class SplitMix64:
    """dissect::Generator: the k-th output mixes seed + k * golden_gamma (mod 2**64)."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self, count):
        steps = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(GOLDEN_GAMMA)
        z = steps + np.uint64(self.state)  # uint64 arithmetic wraps, as in C++
        self.state = (self.state + count * GOLDEN_GAMMA) & MASK64
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    def symmetric_uniform(self, count, bound):
        """U(-bound, bound) as dissect draws it (see the module docstring)."""
        u = (self.next_u64(count) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return bound * (2.0 * u - 1.0)


def init_layer(fan_in, fan_out, scheme, seed):
    gen = SplitMix64(seed)
    if scheme == "pytorch":
        bound = math.sqrt(1.0 / fan_in) if fan_in > 0 else 0.0
        w = gen.symmetric_uniform(fan_out * fan_in, bound)
        b = gen.symmetric_uniform(fan_out, bound)
    else:
        bound = math.sqrt(6.0 / fan_in) if fan_in > 0 else 0.0
        w = gen.symmetric_uniform(fan_out * fan_in, bound)
        b = np.zeros(fan_out)
    return (w.astype(np.float32).reshape(fan_out, fan_in), b.astype(np.float32))


def shuffle(order, gen):
    n = len(order)
    if n < 2:
        return order
    draws = gen.next_u64(n - 1)  # one per i = n-1 .. 1
    i = np.arange(n - 1, 0, -1, dtype=np.uint64)
    js = (draws % (i + np.uint64(1))).tolist()
    for i, j in zip(range(n - 1, 0, -1), js):
        order[i], order[j] = order[j], order[i]
    return order


# ---- data ---------------------------------------------------------------------------------------


class DatasetMissing(Exception):
    pass


def read_idx(directory, name, magic, limit):
    for path in (Path(directory) / (name + ".gz"), Path(directory) / name):
        if path.is_file():
            break
    else:
        raise DatasetMissing(f"Fashion-MNIST file {Path(directory) / (name + '.gz')} not found")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        header = f.read(4)
        if int.from_bytes(header, "big") != magic:
            raise RuntimeError(f"{path}: IDX magic {int.from_bytes(header, 'big')}, expected {magic}")
        dims = [int.from_bytes(f.read(4), "big") for _ in range(magic & 0xFF)]
        count = dims[0] if limit < 0 else min(limit, dims[0])
        per_item = math.prod(dims[1:])
        data = f.read(count * per_item)
        if len(data) != count * per_item:
            raise RuntimeError(f"{path}: file ends early")
    return np.frombuffer(data, dtype=np.uint8).reshape(count, per_item), dims


def load_split(directory, split, limit):
    images, dims = read_idx(directory, f"{split}-images-idx3-ubyte", 0x0803, limit)
    labels, label_dims = read_idx(directory, f"{split}-labels-idx1-ubyte", 0x0801, limit)
    if dims[0] != label_dims[0]:
        raise RuntimeError(f"Fashion-MNIST {split}: {dims[0]} images but {label_dims[0]} labels")
    return images, labels.reshape(-1).astype(np.int64)


def pixel_table(normalize):
    table = np.arange(256, dtype=np.float32) / np.float32(255)
    if normalize:
        table = (table - np.float32(0.2860)) / np.float32(0.3530)
    return table


# ---- training -----------------------------------------------------------------------------------


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
        train_images, train_labels = load_split(args.data, "train", args.train_limit)
        test_images, test_labels = load_split(args.data, "t10k", args.test_limit)
    except DatasetMissing as missing:
        print(f"train_mlp_torch: {missing}\nFashion-MNIST is not installed. Install it with:\n"
              "  sudo apt-get install dataset-fashion-mnist\n"
              "or point --data at a directory holding the four *-idx*-ubyte[.gz] files.",
              file=sys.stderr)
        return 2
    table = pixel_table(args.normalize)
    x_train = torch.from_numpy(table[train_images])
    y_train = torch.from_numpy(train_labels)
    x_test = torch.from_numpy(table[test_images])
    y_test = torch.from_numpy(test_labels)
    load_seconds = time.perf_counter() - load_start

    widths = [x_train.shape[1], *args.hidden, CLASSES]
    layers = []
    for i in range(len(widths) - 1):
        lin = torch.nn.Linear(widths[i], widths[i + 1])
        w, b = init_layer(widths[i], widths[i + 1], args.init, args.seed + i)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        layers.append(lin)
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    n_params = sum(p.numel() for p in model.parameters())

    if args.optimizer == "sgd":
        lr = 0.05 if args.lr is None else args.lr
        wd = args.weight_decay or 0.0
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum,
                              nesterov=args.nesterov, weight_decay=wd)
    elif args.optimizer == "adamw":
        lr = 1e-3 if args.lr is None else args.lr
        wd = 1e-2 if args.weight_decay is None else args.weight_decay
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    else:
        lr = 1e-3 if args.lr is None else args.lr
        wd = args.weight_decay or 0.0
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)

    n_train, n_test = len(y_train), len(y_test)
    batch = min(args.batch, n_train)
    eval_batch = min(1000, n_test)
    order_gen = SplitMix64(args.seed + 1000)

    print(f"train_mlp_torch: MLP {'-'.join(map(str, widths))} (ReLU), {n_params:,} parameters, "
          f"init {args.init}")
    print(f"  data: {n_train} train / {n_test} test images from {args.data} "
          f"(read in {load_seconds:.2f} s), "
          f"{'standardised' if args.normalize else 'scaled to [0, 1]'}")
    momentum = (f" momentum {args.momentum:g}{' (nesterov)' if args.nesterov else ''}"
                if args.optimizer == "sgd" else "")
    print(f"  {args.optimizer} lr {lr:g}{momentum} weight decay {wd:g}, batch {batch}, "
          f"{args.epochs} epochs, seed {args.seed}")
    blas = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    print(f"  torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"env {blas or 'without OPENBLAS_* overrides'}")
    sys.stdout.flush()

    history = {"x": [], "train_loss": [], "test_loss": [], "train_acc": [], "test_acc": []}
    total_train_seconds = 0.0
    for epoch in range(1, args.epochs + 1):
        order = torch.tensor(shuffle(list(range(n_train)), order_gen), dtype=torch.int64)
        model.train()
        start = time.perf_counter()
        loss_sum, correct = 0.0, 0
        for first in range(0, n_train, batch):
            idx = order[first:first + batch]
            xb, yb = x_train.index_select(0, idx), y_train.index_select(0, idx)
            opt.zero_grad()
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == yb).sum().item()
        train_seconds = time.perf_counter() - start
        total_train_seconds += train_seconds

        model.eval()
        start = time.perf_counter()
        test_loss_sum, test_correct = 0.0, 0
        with torch.no_grad():
            for first in range(0, n_test, eval_batch):
                logits = model(x_test[first:first + eval_batch])
                yb = y_test[first:first + eval_batch]
                test_loss_sum += F.cross_entropy(logits, yb).item() * len(yb)
                test_correct += (logits.argmax(1) == yb).sum().item()
        eval_seconds = time.perf_counter() - start

        history["x"].append(epoch)
        history["train_loss"].append(loss_sum / n_train)
        history["train_acc"].append(100.0 * correct / n_train)
        history["test_loss"].append(test_loss_sum / n_test)
        history["test_acc"].append(100.0 * test_correct / n_test)
        print(f"epoch {epoch:3d}/{args.epochs}  loss {history['train_loss'][-1]:.4f}  "
              f"train acc {history['train_acc'][-1]:6.2f}%  "
              f"test loss {history['test_loss'][-1]:.4f}  "
              f"test acc {history['test_acc'][-1]:6.2f}%  train {train_seconds:6.2f} s  "
              f"eval {eval_seconds:5.2f} s  {n_train / train_seconds:,.0f} samples/s")
        sys.stdout.flush()
    print(f"final test accuracy {history['test_acc'][-1]:.2f}% after {args.epochs} epochs; "
          f"training took {total_train_seconds:.2f} s "
          f"({n_train * args.epochs / total_train_seconds:,.0f} samples/s)")

    if args.svg and args.svg != "none":
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--svg: matplotlib is not installed; no figure written", file=sys.stderr)
            return 0
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4.2))
        ax_loss.plot(history["x"], history["train_loss"], label="train (epoch mean)")
        ax_loss.plot(history["x"], history["test_loss"], label="test")
        ax_loss.set(title="cross-entropy loss", xlabel="epoch", ylabel="loss")
        ax_acc.plot(history["x"], history["train_acc"], label="train")
        ax_acc.plot(history["x"], history["test_acc"], label="test")
        ax_acc.set(title="accuracy", xlabel="epoch", ylabel="accuracy (%)")
        for ax in (ax_loss, ax_acc):
            ax.legend()
        fig.savefig(args.svg)
        print(f"wrote {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

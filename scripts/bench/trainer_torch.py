#!/usr/bin/env python3
# trainer_torch.py: the PyTorch twin of gpusync-train for scripts/bench/trainer.sh: the same
# model (trainer/tests/torch_twins.py: the MLP, the LeNet or the ResNet, PyTorch's default init),
# optimiser (Adam, or SGD with momentum and weight decay) with a per-step CosineAnnealingLR, batch
# and precision (bf16/fp16 under autocast, fp16 with GradScaler), on one GPU. Two ways users write
# the loop:
#   --mode dataloader  a Dataset returning one sample at a time and a shuffling DataLoader
#                      (num_workers, pin_memory), .item() on the loss each step
#   --mode resident    the whole dataset on the GPU, a torch.randperm per epoch, batches by
#                      indexing, no host sync inside the epoch
# It writes one JSON line per epoch with the fields gpusync-train's --metrics writes.
import argparse
import gzip
import json
import os
import struct
import time

import sys

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "trainer",
                                "tests"))
import torch_twins  # noqa: E402


def read_idx(path):
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rb") as f:
                data = f.read()
            ndim = data[3]
            dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
            return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise FileNotFoundError(path)


def load(data_dir, prefix, limit=0):
    """Images as (N, 1, side, side) uint8 and labels as int64, the first `limit` when set."""
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    return x.reshape(len(x), 1, x.shape[1], x.shape[2]), y.astype(np.int64)


class Samples(torch.utils.data.Dataset):
    """One sample at a time, scaled to [0,1] as torchvision's ToTensor does."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i].astype(np.float32) / 255.0), int(self.y[i])


def evaluate(model, xt, yt, dev):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(yt), 1000):
            out = model(xt[i:i + 1000])
            correct += (out.argmax(1) == yt[i:i + 1000]).sum()
    model.train()
    return int(correct) / len(yt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--mode", choices=["dataloader", "resident"], required=True)
    ap.add_argument("--model", choices=["mlp", "lenet", "resnet"], default="mlp")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden", default="512,256")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--optim", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--limit-train", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (torch.set_num_threads); default: PyTorch's own choice")
    ap.add_argument("--metrics", default=None)
    args = ap.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    x, y = load(args.data, "train", args.limit_train)
    xt_np, yt_np = load(args.data, "t10k")
    xt = torch.from_numpy(xt_np.astype(np.float32) / 255.0).to(dev)
    yt = torch.from_numpy(yt_np).to(dev)
    hidden = [int(h) for h in args.hidden.split(",")]
    model = torch_twins.make(args.model, hidden, args.dropout).to(dev)
    if args.optim == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                              weight_decay=args.weight_decay)
    # autocast as the seeds' --mixed_precision does; fp16 with GradScaler (2^16, x2 per 2000)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    autocast = lambda: torch.autocast(dev.type, dtype=half, enabled=half is not None)  # noqa
    fp16 = args.precision == "fp16"
    if hasattr(torch.amp, "GradScaler"):  # torch >= 2.3; torch.cuda.amp's is deprecated there
        scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 16, enabled=fp16)
    else:
        scaler = torch.cuda.amp.GradScaler(init_scale=2.0 ** 16, enabled=fp16)
    steps_per_epoch = (len(y) + args.batch_size - 1) // args.batch_size
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps_per_epoch * args.epochs)
    lossf = nn.CrossEntropyLoss()
    out = open(args.metrics, "a") if args.metrics else None

    if args.mode == "dataloader":
        loader = torch.utils.data.DataLoader(Samples(x, y), batch_size=args.batch_size,
                                             shuffle=True, num_workers=args.num_workers,
                                             pin_memory=dev.type == "cuda",
                                             persistent_workers=args.num_workers > 0)
    else:
        xg = torch.from_numpy(x.astype(np.float32) / 255.0).to(dev)
        yg = torch.from_numpy(y).to(dev)

    for epoch in range(args.epochs):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        if args.mode == "dataloader":
            for xb, yb in loader:
                xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
                opt.zero_grad()
                with autocast():
                    loss = lossf(model(xb), yb)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                sched.step()
                total += loss.item() * len(yb)
        else:
            perm = torch.randperm(len(yg), device=dev)
            acc = torch.zeros((), device=dev)
            for i in range(0, len(yg), args.batch_size):
                idx = perm[i:i + args.batch_size]
                opt.zero_grad(set_to_none=True)
                with autocast():
                    loss = lossf(model(xg[idx]), yg[idx])
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                sched.step()
                acc += loss.detach().float() * len(idx)
            total = float(acc)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        test_acc = evaluate(model, xt, yt, dev)
        t2 = time.perf_counter()
        rec = {"epoch": epoch + 1, "train_loss": total / len(y), "test_acc": test_acc,
               "samples_per_s": len(y) / (t1 - t0), "epoch_time_s": t2 - t0,
               "global_batch": args.batch_size, "world_size": 1, "mode": args.mode,
               "model": args.model, "precision": args.precision}
        print(json.dumps(rec), flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()

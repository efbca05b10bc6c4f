#!/usr/bin/env python3
"""gen_tree.py: deterministic benchmark trees.

  gen_tree.py small DIR   2,000 files of 4 KiB in 20 directories
  gen_tree.py project DIR a realistic ML project: ~3,000 files of mixed sizes, ~30 MB
  gen_tree.py big DIR     20,000 small files in 200 directories
  gen_tree.py huge DIR    200,000 tiny files in 400 directories
Content is seeded random bytes (incompressible, like checkpoints; it makes no tool look better
through compression)."""
import os
import random
import sys


def write(path, size, rng):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(rng.randbytes(size))


def small(root, rng):
    for i in range(2000):
        write(os.path.join(root, f"d{i % 20:02d}", f"f{i:05d}.txt"), 4096, rng)


def project(root, rng):
    for i in range(2400):  # source, configs, notebooks
        write(os.path.join(root, "src", f"pkg{i % 40:02d}", f"mod{i:04d}.py"), rng.randint(500, 8000), rng)
    for i in range(500):  # tests and assets
        write(os.path.join(root, "assets", f"a{i % 10}", f"asset{i:04d}.bin"), rng.randint(10_000, 40_000), rng)
    for i in range(6):  # small checkpoints and data
        write(os.path.join(root, "weights", f"w{i}.bin"), 2_000_000, rng)


def big(root, rng):
    for i in range(20000):
        write(os.path.join(root, f"d{i % 200:03d}", f"f{i:05d}.py"), 512, rng)


def huge(root, rng):  # a tree with a vendored environment in it: 200,000 files
    for i in range(200000):
        write(os.path.join(root, f"d{i % 400:03d}", f"f{i:06d}.py"), 64, rng)


if __name__ == "__main__":
    kind, root = sys.argv[1], sys.argv[2]
    {"small": small, "project": project, "big": big, "huge": huge}[kind](root, random.Random(42))

#!/usr/bin/env python3
"""notebook.py: a notebook-like file for the delta benchmark (delta.sh), and its edits.

  notebook.py gen FILE [MB]            JSON cells of code with base64 "images" as outputs (20 MB)
  notebook.py edit FILE N              changes one cell's source in place (as a save does)
  notebook.py latency FILE REMOTE N    N edits, each timed until the server copy matches (ms)
The edit is the one a person makes: one cell's text changes, the rest of the file stays."""
import base64
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency import Watch, save  # noqa: E402


def gen(path, mb):
    rng = random.Random(7)
    cells, size = [], 0
    while size < mb * 1000 * 1000:
        src = [f"x{len(cells)} = model.layer({rng.randint(0, 999)})\n", "plt.imshow(x)\n"]
        png = base64.b64encode(rng.randbytes(150 * 1000)).decode()
        cells.append({"cell_type": "code", "execution_count": len(cells), "metadata": {},
                      "source": src, "outputs": [{"output_type": "display_data",
                                                  "data": {"image/png": png}}]})
        size += len(png) + 200
    with open(path, "w") as f:
        json.dump({"cells": cells, "nbformat": 4, "nbformat_minor": 5}, f, indent=1)


def edited(path, n):
    with open(path, "rb") as f:
        data = f.read()
    at = data.index(b"model.layer(", len(data) // 2)  # one cell in the middle of the file
    new = b"model.layer(%d, t=%d)" % (n, time.time_ns())
    end = data.index(b")", at) + 1
    return data[:at] + new + data[end:]


def main():
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "gen":
        gen(path, int(sys.argv[3]) if len(sys.argv) > 3 else 20)
    elif cmd == "edit":
        save(path, edited(path, int(sys.argv[3])))
    elif cmd == "latency":
        remote, n = sys.argv[3], int(sys.argv[4])
        watch = Watch(os.path.dirname(remote))
        for i in range(n):
            content = edited(path, i)
            t0 = time.monotonic()
            save(path, content)
            t1 = watch.wait_for(remote, content, 60)
            print(f"{(t1 - t0) * 1000:.2f}", flush=True)
            time.sleep(0.3)  # a person's saves are not back to back


if __name__ == "__main__":
    main()

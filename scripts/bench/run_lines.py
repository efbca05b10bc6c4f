#!/usr/bin/env python3
"""run_lines.py: timing of `gpusync run` output, read from its stdout.

  run_lines.py first CMD...   prints the seconds from starting CMD to its first stdout line
  run_lines.py lines CMD...   CMD's lines are server-side timestamps (date +%s%N); prints, per
                              line, the milliseconds from that timestamp to reading it here
The sandbox server is this machine, so both ends share one clock."""
import subprocess
import sys
import time


def main():
    mode, cmd = sys.argv[1], sys.argv[2:]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for raw in p.stdout:
        now = time.time_ns()
        line = raw.decode(errors="replace").strip().split()[-1]
        if mode == "first":
            print(f"{time.monotonic() - t0:.3f}")
            p.kill()
            break
        if line.isdigit():
            print(f"{(now - int(line)) / 1e6:.2f}", flush=True)
    p.wait()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""latency.py: save-to-visible latency of one edited file, measured on the server side.

The sandbox server is this machine, so the "server" directory is local and shares our clock: an
inotify watch there records when the new content appears. For each sample the file is saved in the
local project (written to a temporary name and renamed, as editors do) and the time until the server
copy holds that content is recorded.

  latency.py gpusync LOCAL_FILE REMOTE_FILE N
  latency.py rsync   LOCAL_FILE REMOTE_FILE N  -- RSYNC_ARGS...   (rsync of the tree per change)
  latency.py sftp    LOCAL_FILE REMOTE_FILE N  -- SFTP_ARGS...    (one sftp session, put per change)
Prints one latency in milliseconds per line."""
import ctypes
import os
import select
import struct
import subprocess
import sys
import time

libc = ctypes.CDLL("libc.so.6", use_errno=True)
IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100


class Watch:
    def __init__(self, directory):
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        libc.inotify_add_watch(self.fd, directory.encode(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE)

    def wait_for(self, path, content, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(path, "rb") as f:
                    if f.read() == content:
                        return time.monotonic()
            except FileNotFoundError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(path)
            select.select([self.fd], [], [], left)
            try:
                os.read(self.fd, 65536)
            except BlockingIOError:
                pass


def save(path, content):
    tmp = path + ".tmp~"
    with open(tmp, "wb") as f:
        f.write(content)
    os.rename(tmp, path)


def main():
    tool, local, remote, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    watch = Watch(os.path.dirname(remote))
    sftp = None
    if tool == "sftp":
        sftp = subprocess.Popen(["sftp", "-q", "-b", "-"] + extra, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)
    for i in range(n):
        # The size changes every sample: rsync's quick check (size and whole-second mtime) would
        # skip a same-size file saved within the second of the previous one.
        content = f"sample {i} {time.time_ns()}\n".encode() * (20 + i % 2)
        t0 = time.monotonic()
        save(local, content)
        if tool == "rsync":
            subprocess.run(["rsync"] + extra, check=True)
        elif tool == "sftp":
            sftp.stdin.write(f"put {local} {remote}\n")
            sftp.stdin.flush()
        t1 = watch.wait_for(remote, content, 30)
        print(f"{(t1 - t0) * 1000:.2f}", flush=True)
        time.sleep(0.05)  # a person's saves are not back to back
    if sftp:
        sftp.stdin.close()
        sftp.wait()


if __name__ == "__main__":
    main()

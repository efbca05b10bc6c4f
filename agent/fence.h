/* agent/fence.h: the writer lock that makes one `serve` session the only writer of its root.
 *
 * Every serve session takes an exclusive POSIX record lock on <root>/.gpusync/writer.lock before it
 * answers HELLO. A session whose link stalled still holds it; the next session kills that agent
 * (after checking in /proc that it is a gpusync-agent serve process) and waits until the kernel
 * releases the lock, which happens only once the old process has exited: nothing it still held
 * (a request in its buffers, in the pipe from sshd, in TCP) can reach the tree afterwards. The lock
 * file holds the writer's pid while it runs and is emptied at a clean end, so a non-empty file at
 * acquisition means the previous writer died (killed, crashed, fenced): then the temporaries it
 * may have left (`.gpusync-tmp-<pid>-<n>`) are swept. C99 + POSIX, libc only. */
#ifndef GA_FENCE_H
#define GA_FENCE_H

#include <stddef.h>

#define GA_FENCE_LOCK_PATH ".gpusync/writer.lock" /* relative to the root */
#define GA_FENCE_WAIT_MS   10000 /* longest wait for a killed writer to release the lock */

struct ga_fence {
    int fd;      /* the lock file, open (and locked) for the life of the session; -1 if not held */
    long killed; /* pid of the previous writer this session killed, 0 if none */
    long swept;  /* stale temporaries removed at acquisition */
};

/* Sets up a fence that holds nothing. */
void ga_fence_init(struct ga_fence *f);

/* Makes this process the only writer of the root open as rootfd (`root` names it in messages):
 * opens .gpusync/writer.lock (creating .gpusync and the file, never following a symlink), locks
 * it, killing a previous holder that is verifiably a gpusync-agent serve process and waiting up to
 * GA_FENCE_WAIT_MS for its lock to go, records our pid in the file and, if the previous writer
 * did not end cleanly, sweeps stale temporaries (ga_fence_sweep). Returns 0 with the lock held
 * until ga_fence_release. On failure returns a negative errno, explains it in err (errlen bytes)
 * and holds nothing: -EBUSY when a holder exists that cannot be verified, cannot be killed or does
 * not exit in time (the message names the pid and root and says what to do; at most a verified
 * agent was killed); any other code means no lock could be taken at all (-ELOOP: a symlink in the
 * way; -EROFS, -EACCES, -ENOLCK, ...) and nothing was killed. */
int ga_fence_acquire(struct ga_fence *f, int rootfd, const char *root, char *err, size_t errlen);

/* Releases the lock. With `clean` (the session ended at end of input, having removed its own
 * temporaries) the lock file is emptied first, so the next writer does not sweep. Safe on a fence
 * that holds nothing. */
void ga_fence_release(struct ga_fence *f, int clean);

/* Removes every `.gpusync-tmp-<digits>-<digits>` entry below the root open as rootfd whose pid is
 * not this process's, never following a symlink and skipping .gpusync/runs (run logs). Only call
 * it holding the lock: every agent that writes temporaries holds it, so none of them is alive.
 * Other names, such as the SFTP fallback's `.gpusync-tmp-<pid>`, are left alone. Returns the
 * number removed; entries that cannot be read or removed are skipped (best effort). */
long ga_fence_sweep(int rootfd);

#endif

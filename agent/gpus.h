/* gpus: which GPUs of this machine gpusync's runs hold. Each GPU index has a lock file in one
 * machine-wide directory per user (ga_gpus_dir); the supervisor of a run flock()s the files of
 * its GPUs for as long as it lives and writes its run id and project into them, so a reservation
 * ends with the process however it ends (kill -9 included) and a refusal can say who holds what.
 * Launches choose under the directory's choose.lock, so two racing launches never take the same
 * GPU. nvidia-smi knows nothing of this: the client orders the GPUs by memory in use, and the
 * launch takes the first free ones in that order. */
#ifndef GA_GPUS_H
#define GA_GPUS_H

#include <stddef.h>

/* The most GPU indices one request may name. */
#define GA_GPUS_MAX 256

/* ga_gpus_reserve's failures (its successes are descriptors, >= 0). */
#define GA_GPUS_ERROR -1 /* the lock directory is unusable; the message says why */
#define GA_GPUS_BUSY  -2 /* not enough free GPUs, and no --wait; the message names the holders */
#define GA_GPUS_GONE  -3 /* the client hung up while the launch waited */

/* What a launch asks for. */
struct ga_gpus_req {
    const char *list; /* "0,2": exactly these; with count > 0, the order to choose from */
    int count;        /* > 0: the first `count` GPUs of list that no run holds */
    int wait;         /* queue until they are free instead of refusing */
    /* Called while queuing, each time what the launch waits for changes, with text such as
     * "for GPU 1: GPU 1 held by run ID in /root/proj" (no '\n'). */
    void (*waiting)(const char *text);
};

/* Writes the lock directory into buf (cap bytes): $GPUSYNC_GPU_LOCK_DIR when set, otherwise
 * /tmp/gpusync-<uid>/gpus. /tmp, not $HOME: GPUs belong to one machine, and a home directory on
 * NFS (clusters) is shared by machines whose GPU 0 are different devices; /tmp is local to each
 * (and to each container). Per user: a directory others can write would let them hold our GPUs
 * or name false holders. Creates the directory (0700) if missing and refuses one that is a
 * symlink or owned by another user. Returns 0, or -1 with the reason in err (errlen bytes). */
int ga_gpus_dir(char *buf, size_t cap, char *err, size_t errlen);

/* Chooses the GPUs for req (queuing when req->wait) and writes them into out ("1,3", cap bytes).
 * Returns the descriptor of the held choose.lock: the caller keeps it open until the supervisor
 * holds the chosen GPUs (ga_gpus_hold), then closes it, so no other launch can choose them in
 * between. Otherwise returns GA_GPUS_ERROR, GA_GPUS_BUSY or GA_GPUS_GONE with the reason in err;
 * nothing is then held. */
int ga_gpus_reserve(const struct ga_gpus_req *req, char *out, size_t cap, char *err, size_t errlen);

/* Holds every GPU of list for the rest of the calling process's life (the descriptors stay open
 * on purpose and are close-on-exec, so ranks do not inherit them) and records run id of project
 * root as their holder. Returns 0, or -1 with errno set (EBUSY: one was held by someone else);
 * whatever it had taken is then let go again. */
int ga_gpus_hold(const char *list, const char *id, const char *root);

/* Checks a GPU list ("0,2": non-negative indices, none twice, at most GA_GPUS_MAX). Returns the
 * number of GPUs in it, or -1. */
int ga_gpus_parse(const char *list, int *idx, int max);

#endif

/* common/config_slurm.h: the Slurm keys of [remote] (scheduler = slurm and what sbatch is asked
 * for), kept apart from config.c so that the cluster settings read as one block. */
#ifndef GS_CONFIG_SLURM_H
#define GS_CONFIG_SLURM_H

#include <stddef.h>

#include "common/buf.h"

/* What a Slurm run asks the scheduler for; 0 / NULL: not set (sbatch's default). */
struct gs_slurm_config {
    int enabled;       /* scheduler = slurm: runs go through sbatch on the login node (host) */
    char *partition;   /* --partition */
    char *account;     /* --account */
    char *time;        /* --time, as sbatch reads it ("1:00:00") */
    char *mem;         /* --mem ("16G") */
    char *sbatch_args; /* more sbatch options, a shell line as written */
    int nodes;         /* --nodes (default 1) */
    int gpus_per_node; /* tasks per node, one GPU each; 0 with cpus: CPU tasks */
    int cpus_per_task; /* --cpus-per-task */
};

/* Takes [remote] `key` = `value` when it is a Slurm key. Returns 1 when taken, 0 when `key` is
 * not one of them, -1 when the value is wrong (a sentence saying why in `why`). */
int gs_config_slurm_key(struct gs_slurm_config *s, const char *key, const char *value, char *why,
                        size_t why_size);

/* Appends the keys that are set as config lines ("\tpartition = gpu\n"). */
void gs_config_slurm_format(const struct gs_slurm_config *s, struct gs_buf *out);

/* Frees the strings and zeroes `s`. */
void gs_config_slurm_release(struct gs_slurm_config *s);

#endif

/* common/config_slurm.c: the Slurm keys of [remote] (see config_slurm.h). */
#include "common/config_slurm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wrapper.h"

static int set_string(char **slot, const char *key, const char *value, char *why, size_t cap)
{
    if (!value[0]) {
        snprintf(why, cap, "remote.%s: empty value", key);
        return -1;
    }
    free(*slot);
    *slot = gs_xstrdup(value);
    return 1;
}

static int set_count(int *slot, const char *key, const char *value, char *why, size_t cap)
{
    char *end;
    long v = strtol(value, &end, 10);
    if (end == value || *end || v < 1 || v > 4096) {
        snprintf(why, cap, "remote.%s: '%s' is not a count (1 to 4096)", key, value);
        return -1;
    }
    *slot = (int)v;
    return 1;
}

static int set_scheduler(struct gs_slurm_config *s, const char *value, char *why, size_t cap)
{
    if (strcmp(value, "slurm") != 0 && strcmp(value, "none") != 0) {
        snprintf(why, cap, "remote.scheduler: '%s' is not one of: slurm, none", value);
        return -1;
    }
    s->enabled = strcmp(value, "slurm") == 0;
    return 1;
}

int gs_config_slurm_key(struct gs_slurm_config *s, const char *key, const char *value, char *why,
                        size_t cap)
{
    struct {
        const char *key;
        char **str;
        int *count;
    } keys[] = {
        {"partition", &s->partition, NULL},
        {"account", &s->account, NULL},
        {"time", &s->time, NULL},
        {"mem", &s->mem, NULL},
        {"sbatch_args", &s->sbatch_args, NULL},
        {"nodes", NULL, &s->nodes},
        {"gpus_per_node", NULL, &s->gpus_per_node},
        {"cpus_per_task", NULL, &s->cpus_per_task},
    };
    if (strcmp(key, "scheduler") == 0)
        return set_scheduler(s, value, why, cap);
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcmp(key, keys[i].key) == 0)
            return keys[i].str ? set_string(keys[i].str, key, value, why, cap)
                               : set_count(keys[i].count, key, value, why, cap);
    return 0;
}

void gs_config_slurm_format(const struct gs_slurm_config *s, struct gs_buf *out)
{
    if (s->enabled)
        gs_buf_adds(out, "\tscheduler = slurm\n");
    const char *names[] = {"partition", "account", "time", "mem", "sbatch_args"};
    const char *values[] = {s->partition, s->account, s->time, s->mem, s->sbatch_args};
    for (size_t i = 0; i < 5; i++)
        if (values[i])
            gs_buf_addf(out, "\t%s = %s\n", names[i], values[i]);
    if (s->nodes)
        gs_buf_addf(out, "\tnodes = %d\n", s->nodes);
    if (s->gpus_per_node)
        gs_buf_addf(out, "\tgpus_per_node = %d\n", s->gpus_per_node);
    if (s->cpus_per_task)
        gs_buf_addf(out, "\tcpus_per_task = %d\n", s->cpus_per_task);
}

void gs_config_slurm_release(struct gs_slurm_config *s)
{
    free(s->partition);
    free(s->account);
    free(s->time);
    free(s->mem);
    free(s->sbatch_args);
    memset(s, 0, sizeof(*s));
}

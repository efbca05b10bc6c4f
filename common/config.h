/* common/config.h: the project configuration, .gpusync/config, a git-config-style INI file read
 * with libinih:
 *
 *   [remote]            host, port, user, path, identity, hosts and master_addr (multi-node
 *                       runs), scheduler = slurm and its keys (config_slurm.h)
 *   [sync]              exclude (repeatable glob), transport = agent | sftp,
 *                       compress = auto | zstd | off, resident = on | off,
 *                       check_every = SECONDS | off
 *   [job "NAME"]        command, gpus | cpu
 *
 * Every error names the file, the line and the key, so a user can fix it without guessing. */
#ifndef GS_CONFIG_H
#define GS_CONFIG_H

#include <stddef.h>

#include "common/config_slurm.h"
#include "common/error.h"

/* The highest GPU number a list may name, and the most CPU ranks a job may ask for (the
 * launcher's limit on one node). */
#define GS_CONFIG_MAX_GPU 1023
#define GS_CONFIG_MAX_CPU 4096

/* The largest config file read (bytes): a real one is a few hundred; anything bigger is the wrong
 * file, and reading it unbounded (a link to /dev/zero) would exhaust memory. */
#define GS_CONFIG_MAX_SIZE (1024 * 1024)

/* The longest line (characters, without its newline and indentation): libinih reads lines into a
 * buffer of INI_MAX_LINE (200) bytes, which must hold the newline and a NUL too. A longer line is
 * a configuration error naming it. */
#define GS_CONFIG_MAX_LINE 198

enum gs_transport { GS_TRANSPORT_AGENT, GS_TRANSPORT_SFTP };
/* auto: zstd level 1 where the agent has it; zstd: level 9 (for slow links); off: never. Either
 * way an agent built without libzstd is spoken to uncompressed (proto/zframes.h). */
enum gs_compress { GS_COMPRESS_AUTO, GS_COMPRESS_ZSTD, GS_COMPRESS_OFF };
#define GS_CHECK_EVERY_DEFAULT_S 60

struct gs_job {
    char *name;
    char *command; /* a shell command line, run in the remote project directory; never "" */
    char *gpus;    /* "2", "0,2", or NULL when the config does not say (checked: see below) */
    int cpu;       /* CPU ranks; 0 when the config does not say (never set with gpus) */
};

struct gs_config {
    char *file;        /* the file read, for messages */
    char *host;        /* host name, address, or ~/.ssh/config alias */
    int port;          /* 0: not set (22, or what ssh -G says) */
    char *user;        /* NULL: not set */
    char *remote_path; /* project directory on the server; NULL: ~/gpusync/<basename> */
    char *identity;    /* an identity file to try first; NULL: the defaults */
    char *hosts;       /* multi-node runs: "[user@]host[:port][/path],..." (first = master);
                        * kept as written, parsed by `gpusync run`; NULL: not set */
    char *master_addr; /* multi-node runs: the address the nodes reach node 0 by (MASTER_ADDR);
                        * NULL: detected from node 0's route to node 1 */
    struct gs_slurm_config slurm; /* scheduler = slurm: host is the login node */
    enum gs_transport transport;
    enum gs_compress compress;
    int no_resident;   /* resident = off: every session execs the agent through the login shell */
    int check_every_s; /* check_every: seconds between the watch daemon's checks of the server
                        * while idle (syncd/verify.h); 0: unset (GS_CHECK_EVERY_DEFAULT_S),
                        * -1: off (only at connection, push and flush) */
    char **excludes;
    size_t n_excludes;
    struct gs_job *jobs;
    size_t n_jobs;
};

/* Reads `path` into `cfg` (which it initialises). On error returns GS_E_CONFIG (or GS_E_IO when the
 * file cannot be read) with "FILE:LINE: message" in err, and leaves `cfg` released. A path that is
 * not a regular file, or is larger than GS_CONFIG_MAX_SIZE, is GS_E_CONFIG naming the file. */
int gs_config_load(struct gs_config *cfg, const char *path, struct gs_error *err);

/* As gs_config_load, from text in memory; `name` stands for the file in messages. */
int gs_config_parse(struct gs_config *cfg, const char *text, const char *name,
                    struct gs_error *err);

/* Frees everything `cfg` owns and zeroes it. Safe on a zeroed config. */
void gs_config_release(struct gs_config *cfg);

/* The job named `name`, or NULL. The pointer lives as long as `cfg`. */
const struct gs_job *gs_config_job(const struct gs_config *cfg, const char *name);

/* Checks a GPU request as `--gpus` and a job's `gpus` take it: a count ("2", at least 1) or a
 * list of distinct device numbers ("0,2"; a list is told from a count by its comma). Returns the
 * number of ranks it asks for, or 0 when it is neither (with a sentence saying why in `why`). */
int gs_config_gpus_check(const char *spec, char *why, size_t why_size);

/* Writes `cfg`'s remote and sync settings and jobs to `path` as a fresh config file, atomically
 * (temporary file and rename). Returns 0 or GS_E_IO. */
int gs_config_save(const struct gs_config *cfg, const char *path, struct gs_error *err);

/* Splits "[user@]host[:port]" into cfg->user, cfg->host, cfg->port (replacing what they held).
 * Accepts "[v6addr]:port". Returns 0 or GS_E_USAGE with a message. */
int gs_config_parse_target(struct gs_config *cfg, const char *target, struct gs_error *err);

#endif

/* common/config.c: reading and writing .gpusync/config with libinih (see config.h). */
#include "common/config.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "common/wrapper.h"

/* The parse state handed to inih: the config being filled and the first error seen. inih reports
 * the line of the first handler failure as ini_parse's return value, so the handler only needs to
 * remember the message. */
struct parse_state {
    struct gs_config *cfg;
    char first_error[512];
    struct gs_buf seen;    /* "section\037key\n" for each single-valued key set so far */
    char dup_section[256]; /* the section and key of a duplicate, to find its first line */
    char dup_key[128];
};

static int fail(struct parse_state *st, const char *fmt, const char *a, const char *b)
{
    if (!st->first_error[0])
        snprintf(st->first_error, sizeof(st->first_error), fmt, a, b);
    return 0;
}

static int replace_string(char **slot, const char *value)
{
    char *copy = gs_xstrdup(value);
    free(*slot);
    *slot = copy;
    return 1;
}

static int parse_port(const char *value, int *port)
{
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end || v < 1 || v > 65535)
        return 0;
    *port = (int)v;
    return 1;
}

/* Checks one "[user@]host[:port][/path]" of a hosts list as `gpusync run` reads it. */
static int check_host_spec(const char *spec, struct gs_error *err)
{
    const char *at = strrchr(spec, '@'), *host = at ? at + 1 : spec;
    const char *bracket = host[0] == '[' ? strchr(host, ']') : host;
    const char *slash = strchr(bracket ? bracket : host, '/');
    char *target = gs_xstrndup(spec, slash ? (size_t)(slash - spec) : strlen(spec));
    struct gs_config t = {0};
    int rc = gs_config_parse_target(&t, target, err);
    gs_config_release(&t);
    free(target);
    return rc;
}

/* Checks every entry of [remote] hosts, so a malformed one is a config error naming its line
 * rather than a usage error from `run` that names neither. */
static int set_hosts(struct parse_state *st, const char *value)
{
    if (!value[0])
        return fail(st, "remote.hosts: empty list%s%s", "", "");
    char *list = gs_xstrdup(value), *save = NULL;
    struct gs_error err = {0};
    int n = 0;
    for (char *tok = strtok_r(list, ", \t", &save); tok && !err.code;
         tok = strtok_r(NULL, ", \t", &save), n++)
        check_host_spec(tok, &err);
    free(list);
    if (n == 0)
        return fail(st, "remote.hosts: no host in the list%s%s", "", "");
    if (err.code)
        return fail(st, "remote.hosts: %.400s%s", err.msg, "");
    /* a repeated `hosts =` continues the list: a config line holds GS_CONFIG_MAX_LINE characters,
     * which four nodes with paths outgrow */
    struct gs_buf joined = GS_BUF_INIT;
    gs_buf_addf(&joined, "%s%s%s", st->cfg->hosts ? st->cfg->hosts : "", st->cfg->hosts ? ", " : "",
                value);
    free(st->cfg->hosts);
    st->cfg->hosts = gs_buf_detach(&joined, NULL);
    return 1;
}

static int set_remote(struct parse_state *st, const char *key, const char *value)
{
    struct gs_config *cfg = st->cfg;
    if (strcmp(key, "host") == 0) /* empty, it would pass the "host is set" check at the end */
        return value[0] ? replace_string(&cfg->host, value)
                        : fail(st,
                               "remote.host: empty; write the server's name, address or "
                               "~/.ssh/config alias%s%s",
                               "", "");
    if (strcmp(key, "user") == 0)
        return replace_string(&cfg->user, value);
    if (strcmp(key, "path") == 0)
        return replace_string(&cfg->remote_path, value);
    if (strcmp(key, "identity") == 0)
        return replace_string(&cfg->identity, value);
    if (strcmp(key, "hosts") == 0)
        return set_hosts(st, value);
    if (strcmp(key, "master_addr") == 0)
        return value[0] ? replace_string(&cfg->master_addr, value)
                        : fail(st, "remote.master_addr: empty address%s%s", "", "");
    char why[300];
    int slurm = gs_config_slurm_key(&cfg->slurm, key, value, why, sizeof(why));
    if (slurm != 0)
        return slurm > 0 ? 1 : fail(st, "%s%s", why, "");
    if (strcmp(key, "port") == 0)
        return parse_port(value, &cfg->port)
                   ? 1
                   : fail(st, "remote.port: '%s' is not a port number (1-65535)%s", value, "");
    return fail(st, "unknown key '%s' in section [remote]%s", key, "");
}

static int add_exclude(struct gs_config *cfg, const char *value)
{
    cfg->excludes = gs_xrealloc(cfg->excludes, (cfg->n_excludes + 1) * sizeof(*cfg->excludes));
    cfg->excludes[cfg->n_excludes++] = gs_xstrdup(value);
    return 1;
}

static int set_sync(struct parse_state *st, const char *key, const char *value)
{
    if (strcmp(key, "exclude") == 0)
        return value[0] ? add_exclude(st->cfg, value)
                        : fail(st, "sync.exclude: empty pattern%s%s", "", "");
    if (strcmp(key, "transport") == 0) {
        if (strcmp(value, "agent") == 0)
            st->cfg->transport = GS_TRANSPORT_AGENT;
        else if (strcmp(value, "sftp") == 0)
            st->cfg->transport = GS_TRANSPORT_SFTP;
        else
            return fail(st, "sync.transport: '%s' is not one of: agent, sftp%s", value, "");
        return 1;
    }
    if (strcmp(key, "compress") == 0) {
        static const char *const names[] = {"auto", "zstd", "off"};
        for (int i = 0; i < 3; i++)
            if (strcmp(value, names[i]) == 0) {
                st->cfg->compress = (enum gs_compress)i;
                return 1;
            }
        return fail(st, "sync.compress: '%s' is not one of: auto, zstd, off%s", value, "");
    }
    if (strcmp(key, "check_every") == 0) {
        char *end;
        errno = 0;
        long v = strcmp(value, "off") == 0 ? 0 : strtol(value, &end, 10);
        if (strcmp(value, "off") != 0 && (errno || end == value || *end || v < 0 || v > 86400))
            return fail(st,
                        "sync.check_every: '%s' is not a number of seconds (0 to 86400) or "
                        "off%s",
                        value, "");
        st->cfg->check_every_s = v > 0 ? (int)v : -1;
        return 1;
    }
    if (strcmp(key, "resident") == 0) {
        if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0)
            return fail(st, "sync.resident: '%s' is not one of: on, off%s", value, "");
        st->cfg->no_resident = strcmp(value, "off") == 0;
        return 1;
    }
    return fail(st, "unknown key '%s' in section [sync]%s", key, "");
}

/* Returns the job called `name`, creating it on first mention. */
static struct gs_job *job_for(struct gs_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_jobs; i++)
        if (strcmp(cfg->jobs[i].name, name) == 0)
            return &cfg->jobs[i];
    cfg->jobs = gs_xrealloc(cfg->jobs, (cfg->n_jobs + 1) * sizeof(*cfg->jobs));
    struct gs_job *job = &cfg->jobs[cfg->n_jobs++];
    memset(job, 0, sizeof(*job));
    job->name = gs_xstrdup(name);
    return job;
}

/* Parses `job "NAME"` into NAME (written to `name`); 0 if the section is not of that form. */
static int job_section_name(const char *section, char *name, size_t size)
{
    if (strncmp(section, "job", 3) != 0)
        return 0;
    const char *p = section + 3;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t len = strlen(p);
    if (len < 3 || p[0] != '"' || p[len - 1] != '"' || len - 2 >= size)
        return 0;
    memcpy(name, p + 1, len - 2);
    name[len - 2] = '\0';
    return strchr(name, '"') == NULL;
}

/* Parses a decimal number of at most `max` (only digits). Returns it, or -1. */
static long parse_small(const char *s, size_t len, long max)
{
    long v = 0;
    if (len == 0 || len > 9 || strspn(s, "0123456789") < len)
        return -1;
    for (size_t i = 0; i < len; i++)
        v = v * 10 + (s[i] - '0');
    return v <= max ? v : -1;
}

/* The number of distinct device numbers in the list "0,2", or 0 when it is malformed. */
static int count_gpu_list(const char *spec)
{
    char seen[GS_CONFIG_MAX_GPU + 1] = {0};
    int n = 0;
    for (const char *p = spec;; n++) {
        size_t len = strcspn(p, ",");
        long dev = parse_small(p, len, GS_CONFIG_MAX_GPU);
        if (dev < 0 || seen[dev])
            return 0;
        seen[dev] = 1;
        if (!p[len])
            return n + 1;
        p += len + 1;
    }
}

int gs_config_gpus_check(const char *spec, char *why, size_t why_size)
{
    int n = strchr(spec, ',') ? count_gpu_list(spec)
                              : (int)parse_small(spec, strlen(spec), GS_CONFIG_MAX_GPU);
    if (n >= 1)
        return n;
    snprintf(why, why_size,
             "'%s' is not a GPU count (1 or more) or a list of distinct GPU numbers such as "
             "0,2%s",
             spec,
             strncmp(spec, "cpu", 3) == 0 || strcmp(spec, "0") == 0
                 ? "; CPU ranks are asked for with --cpu N, or cpu = N in a [job]"
                 : "");
    return 0;
}

/* Checks and sets a job's `gpus` or `cpu`: they exclude each other. */
static int set_job_ranks(struct parse_state *st, struct gs_job *job, const char *key,
                         const char *value)
{
    char why[300], msg[400];
    int cpu = strcmp(key, "cpu") == 0;
    if (cpu ? job->gpus != NULL : job->cpu != 0) {
        snprintf(msg, sizeof(msg),
                 "[job \"%s\"] %s: the job sets %s already; a job runs on GPUs "
                 "or on CPU ranks, not both",
                 job->name, key, cpu ? "gpus" : "cpu");
        return fail(st, "%s%s", msg, "");
    }
    if (cpu) {
        long n = parse_small(value, strlen(value), GS_CONFIG_MAX_CPU);
        job->cpu = n >= 1 ? (int)n : 0;
        if (job->cpu)
            return 1;
        snprintf(msg, sizeof(msg),
                 "[job \"%s\"] cpu: '%s' is not a number of CPU ranks (1 to "
                 "%d)",
                 job->name, value, GS_CONFIG_MAX_CPU);
        return fail(st, "%s%s", msg, "");
    }
    if (gs_config_gpus_check(value, why, sizeof(why)) > 0)
        return replace_string(&job->gpus, value);
    snprintf(msg, sizeof(msg), "[job \"%s\"] gpus: %s", job->name, why);
    return fail(st, "%s%s", msg, "");
}

static int set_job(struct parse_state *st, const char *job_name, const char *key, const char *value)
{
    struct gs_job *job = job_for(st->cfg, job_name);
    if (strcmp(key, "command") == 0)
        return value[0] ? replace_string(&job->command, value)
                        : fail(st, "[job \"%s\"] command: empty; write the command line to run%s",
                               job_name, "");
    if (strcmp(key, "gpus") == 0 || strcmp(key, "cpu") == 0)
        return set_job_ranks(st, job, key, value);
    return fail(st, "unknown key '%s' in section [job \"%s\"] (expected command, gpus or cpu)", key,
                job_name);
}

/* Drops an inline comment that starts with whitespace and '#' (libinih strips only ';' ones; git
 * config takes both), and the blanks before it. A value that starts with '#' is all comment (it
 * followed the '=' and its blanks): `command = # later` is an empty command, not a shell comment
 * that runs nothing. Returns `buf`. */
static const char *strip_hash_comment(const char *value, char *buf, size_t size)
{
    snprintf(buf, size, "%s", value);
    for (char *p = buf; *p; p++)
        if (*p == '#' && (p == buf || p[-1] == ' ' || p[-1] == '\t')) {
            *p = '\0';
            break;
        }
    size_t len = strlen(buf);
    while (len && (buf[len - 1] == ' ' || buf[len - 1] == '\t'))
        buf[--len] = '\0';
    return buf;
}

/* Whether `key` of `section` was set before; records it otherwise. Only sync.exclude and
 * remote.hosts may repeat (each line adds to the list): for any other key the last one would
 * silently win (a second `host =` redirecting every push). */
static int seen_before(struct parse_state *st, const char *section, const char *key)
{
    if ((strcmp(section, "sync") == 0 && strcmp(key, "exclude") == 0) ||
        (strcmp(section, "remote") == 0 && strcmp(key, "hosts") == 0))
        return 0;
    struct gs_buf entry = GS_BUF_INIT;
    gs_buf_addf(&entry, "%s\037%s\n", section, key);
    const char *all = st->seen.data ? st->seen.data : "";
    int found = strncmp(all, entry.data, entry.len) == 0;
    for (const char *p = strchr(all, '\n'); !found && p; p = strchr(p + 1, '\n'))
        found = strncmp(p + 1, entry.data, entry.len) == 0;
    if (!found)
        gs_buf_add(&st->seen, entry.data, entry.len);
    gs_buf_release(&entry);
    if (found && !st->first_error[0]) {
        snprintf(st->dup_section, sizeof(st->dup_section), "%s", section);
        snprintf(st->dup_key, sizeof(st->dup_key), "%s", key);
    }
    return found;
}

static int on_entry(void *user, const char *section, const char *key, const char *raw)
{
    struct parse_state *st = user;
    if (seen_before(st, section, key))
        return fail(st, "duplicate key '%s' in section [%s]", key, section);
    char value_buf[4096];
    const char *value = strip_hash_comment(raw, value_buf, sizeof(value_buf));
    char job_name[256];
    if (strcmp(section, "remote") == 0)
        return set_remote(st, key, value);
    if (strcmp(section, "sync") == 0)
        return set_sync(st, key, value);
    if (job_section_name(section, job_name, sizeof(job_name)))
        return set_job(st, job_name, key, value);
    if (section[0] == '\0')
        return fail(
            st, "key '%s' is outside any section (expected [remote], [sync] or [job \"NAME\"])%s",
            key, "");
    return fail(st, "unknown section [%s] (expected [remote], [sync] or [job \"NAME\"])%s", section,
                "");
}

static int finish_parse(struct gs_config *cfg, int line, struct parse_state *st, const char *name,
                        struct gs_error *err)
{
    if (line == 0 && !cfg->host)
        line = -2; /* parsed, but the one required key is missing */
    if (line == 0)
        return 0;
    if (line == -2)
        gs_error_set(err, GS_E_CONFIG, "%s: missing required key 'host' in section [remote]", name);
    else if (line < 0)
        gs_error_set(err, GS_E_NOMEM, "%s: out of memory while parsing", name);
    else if (st->first_error[0])
        gs_error_set(err, GS_E_CONFIG, "%s:%d: %s", name, line, st->first_error);
    else
        gs_error_set(err, GS_E_CONFIG,
                     "%s:%d: syntax error (expected 'key = value' or '[section]')", name, line);
    gs_config_release(cfg);
    return err ? err->code : GS_E_CONFIG;
}

/* Copies `text` without the leading blanks of each line. Debian's libinih is built with
 * multi-line values on, so an indented line (git-config style) would otherwise continue the
 * previous value; line numbers are unchanged. */
static void dedent(const char *text, struct gs_buf *out)
{
    int at_line_start = 1;
    for (const char *p = text; *p; p++) {
        if (at_line_start && (*p == ' ' || *p == '\t'))
            continue;
        at_line_start = *p == '\n';
        gs_buf_addc(out, *p);
    }
    if (!out->data)
        gs_buf_grow(out, 0);
}

/* The first byte of `s` that does not start a valid UTF-8 sequence (overlong forms and
 * surrogates included), or NULL when all of it is UTF-8. */
static const unsigned char *utf8_bad(const unsigned char *p)
{
    for (; *p; p++) {
        int n = *p < 0x80 ? 0 : *p < 0xc2 ? -1 : *p < 0xe0 ? 1 : *p < 0xf0 ? 2 : *p < 0xf5 ? 3 : -1;
        if (n < 0 || (p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
            (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
            return p;
        for (int i = 1; i <= n; i++) /* stops at the NUL too: it is no continuation byte */
            if ((p[i] & 0xc0) != 0x80)
                return p;
        p += n;
    }
    return NULL;
}

/* Refuses text that is not UTF-8, naming the line: its values end up in --json output, whose
 * strings must be UTF-8, and no host, user or command needs other bytes. */
static int check_utf8(const char *text, const char *name, struct gs_error *err)
{
    const unsigned char *bad = utf8_bad((const unsigned char *)text);
    if (!bad)
        return 0;
    int line = 1;
    for (const char *p = text; p < (const char *)bad; p++)
        line += *p == '\n';
    return gs_error_set(err, GS_E_CONFIG,
                        "%s:%d: not valid UTF-8 (byte 0x%02X); save the file as UTF-8", name, line,
                        *bad);
}

/* The line of `text` (as inih reads it: dedented, no continuations) that first sets `key` in
 * `section`, before line `before`; 0 if none is found. */
static int first_line_of(const char *text, const char *section, const char *key, int before)
{
    char current[256] = "";
    int line = 1;
    for (const char *p = text; *p && line < before; line++) {
        size_t len = strcspn(p, "\n");
        const char *close = memchr(p, ']', len);
        size_t klen = strcspn(p, "=:");
        if (p[0] == '[' && close && (size_t)(close - p - 1) < sizeof(current))
            snprintf(current, sizeof(current), "%.*s", (int)(close - p - 1), p + 1);
        else if (klen < len && strcmp(current, section) == 0) {
            while (klen && (p[klen - 1] == ' ' || p[klen - 1] == '\t'))
                klen--;
            if (klen == strlen(key) && strncmp(p, key, klen) == 0)
                return line;
        }
        p += len + (p[len] == '\n');
    }
    return 0;
}

/* Adds the line that first set a duplicate key to the error message, so both are named. */
static void name_first_line(struct parse_state *st, const char *text, int line)
{
    int first = st->dup_key[0] ? first_line_of(text, st->dup_section, st->dup_key, line) : 0;
    size_t len = strlen(st->first_error);
    if (first > 0)
        snprintf(st->first_error + len, sizeof(st->first_error) - len,
                 ": line %d sets it already; keep one", first);
}

/* Refuses a line longer than GS_CONFIG_MAX_LINE, naming it. inih reads a line into a fixed buffer
 * and parses the rest as the next line, so a long value was "a syntax error" on a line after it. */
static int check_line_lengths(const char *text, const char *name, struct gs_error *err)
{
    int line = 1;
    for (const char *p = text; *p; line++) {
        size_t len = strcspn(p, "\n");
        if (len > GS_CONFIG_MAX_LINE)
            return gs_error_set(err, GS_E_CONFIG,
                                "%s:%d: line too long (%zu characters; the limit is %d)", name,
                                line, len, GS_CONFIG_MAX_LINE);
        p += len + (p[len] == '\n');
    }
    return 0;
}

/* Parses the dedented text `flat` into `cfg` (zeroed) with inih. */
static int parse_flat(struct gs_config *cfg, const char *flat, const char *name,
                      struct gs_error *err)
{
    struct parse_state st = {.cfg = cfg};
    cfg->file = gs_xstrdup(name);
    int line = ini_parse_string(flat, on_entry, &st);
    if (line > 0)
        name_first_line(&st, flat, line);
    gs_buf_release(&st.seen);
    return finish_parse(cfg, line, &st, name, err);
}

int gs_config_parse(struct gs_config *cfg, const char *text, const char *name, struct gs_error *err)
{
    memset(cfg, 0, sizeof(*cfg));
    struct gs_buf flat = GS_BUF_INIT;
    dedent(text, &flat); /* line numbers are unchanged */
    int rc = check_utf8(flat.data, name, err);
    if (rc == 0)
        rc = check_line_lengths(flat.data, name, err);
    if (rc == 0)
        rc = parse_flat(cfg, flat.data, name, err);
    gs_buf_release(&flat);
    return rc;
}

/* Reads all of `fd` (a regular file of at most GS_CONFIG_MAX_SIZE bytes) into `text`. Returns 0,
 * or GS_E_CONFIG / GS_E_IO naming `path`. */
static int read_bounded(int fd, const char *path, struct gs_buf *text, struct gs_error *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return gs_error_errno(err, GS_E_IO, "cannot read config %s", path);
    /* A device or FIFO (a symlink to /dev/zero, say) never ends: reading it would take all
     * memory. */
    if (!S_ISREG(st.st_mode))
        return gs_error_set(
            err, GS_E_CONFIG,
            "%s: not a regular file (a device, FIFO or directory); it must be a text file", path);
    char chunk[4096];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof(chunk))) > 0) {
        gs_buf_add(text, chunk, (size_t)n);
        /* checked while reading too: the file may grow after fstat */
        if (text->len > GS_CONFIG_MAX_SIZE)
            break;
    }
    if (n < 0)
        return gs_error_errno(err, GS_E_IO, "cannot read config %s", path);
    if (text->len > GS_CONFIG_MAX_SIZE || (size_t)st.st_size > GS_CONFIG_MAX_SIZE)
        return gs_error_set(err, GS_E_CONFIG, "%s: larger than %d KiB; is it the right file?", path,
                            GS_CONFIG_MAX_SIZE / 1024);
    return 0;
}

int gs_config_load(struct gs_config *cfg, const char *path, struct gs_error *err)
{
    memset(cfg, 0, sizeof(*cfg));
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return gs_error_errno(err, GS_E_IO, "cannot read config %s", path);
    struct gs_buf text = GS_BUF_INIT;
    int rc = read_bounded(fd, path, &text, err);
    close(fd);
    if (rc == 0)
        rc = gs_config_parse(cfg, text.data ? text.data : "", path, err);
    gs_buf_release(&text);
    return rc;
}

void gs_config_release(struct gs_config *cfg)
{
    free(cfg->file);
    free(cfg->host);
    free(cfg->user);
    free(cfg->remote_path);
    free(cfg->identity);
    free(cfg->hosts);
    free(cfg->master_addr);
    gs_config_slurm_release(&cfg->slurm);
    for (size_t i = 0; i < cfg->n_excludes; i++)
        free(cfg->excludes[i]);
    free(cfg->excludes);
    for (size_t i = 0; i < cfg->n_jobs; i++) {
        free(cfg->jobs[i].name);
        free(cfg->jobs[i].command);
        free(cfg->jobs[i].gpus);
    }
    free(cfg->jobs);
    memset(cfg, 0, sizeof(*cfg));
}

const struct gs_job *gs_config_job(const struct gs_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_jobs; i++)
        if (strcmp(cfg->jobs[i].name, name) == 0)
            return &cfg->jobs[i];
    return NULL;
}

/* One `hosts =` line per node, so that no line outgrows GS_CONFIG_MAX_LINE. */
static void format_hosts(const char *hosts, struct gs_buf *out)
{
    char *list = gs_xstrdup(hosts ? hosts : ""), *save = NULL;
    for (char *tok = strtok_r(list, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save))
        gs_buf_addf(out, "\thosts = %s\n", tok);
    free(list);
}

static void format_config(const struct gs_config *cfg, struct gs_buf *out)
{
    gs_buf_adds(out, "# gpusync project configuration (see README.md)\n[remote]\n");
    gs_buf_addf(out, "\thost = %s\n", cfg->host);
    if (cfg->port)
        gs_buf_addf(out, "\tport = %d\n", cfg->port);
    if (cfg->user)
        gs_buf_addf(out, "\tuser = %s\n", cfg->user);
    if (cfg->remote_path)
        gs_buf_addf(out, "\tpath = %s\n", cfg->remote_path);
    if (cfg->identity)
        gs_buf_addf(out, "\tidentity = %s\n", cfg->identity);
    format_hosts(cfg->hosts, out);
    if (cfg->master_addr)
        gs_buf_addf(out, "\tmaster_addr = %s\n", cfg->master_addr);
    gs_config_slurm_format(&cfg->slurm, out);
    gs_buf_addf(out, "\n[sync]\n\ttransport = %s\n",
                cfg->transport == GS_TRANSPORT_SFTP ? "sftp" : "agent");
    if (cfg->compress != GS_COMPRESS_AUTO)
        gs_buf_addf(out, "\tcompress = %s\n", cfg->compress == GS_COMPRESS_ZSTD ? "zstd" : "off");
    if (cfg->no_resident)
        gs_buf_adds(out, "\tresident = off\n");
    if (cfg->check_every_s < 0)
        gs_buf_adds(out, "\tcheck_every = off\n");
    else if (cfg->check_every_s > 0)
        gs_buf_addf(out, "\tcheck_every = %d\n", cfg->check_every_s);
    for (size_t i = 0; i < cfg->n_excludes; i++)
        gs_buf_addf(out, "\texclude = %s\n", cfg->excludes[i]);
    for (size_t i = 0; i < cfg->n_jobs; i++) {
        const struct gs_job *job = &cfg->jobs[i];
        gs_buf_addf(out, "\n[job \"%s\"]\n", job->name);
        if (job->command)
            gs_buf_addf(out, "\tcommand = %s\n", job->command);
        if (job->gpus)
            gs_buf_addf(out, "\tgpus = %s\n", job->gpus);
        if (job->cpu)
            gs_buf_addf(out, "\tcpu = %d\n", job->cpu);
    }
}

int gs_config_save(const struct gs_config *cfg, const char *path, struct gs_error *err)
{
    struct gs_buf text = GS_BUF_INIT, tmp = GS_BUF_INIT;
    format_config(cfg, &text);
    gs_buf_addf(&tmp, "%s.tmp.%d", path, (int)getpid());
    int rc = 0;
    int fd = gs_path_open_private(tmp.data, O_WRONLY | O_CREAT | O_EXCL);
    FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!fp) {
        if (fd >= 0)
            close(fd);
        rc = gs_error_errno(err, GS_E_IO, "cannot write %s", tmp.data);
        goto out;
    }
    size_t wrote = fwrite(text.data, 1, text.len, fp);
    if (fclose(fp) != 0 || wrote != text.len)
        rc = gs_error_errno(err, GS_E_IO, "cannot write %s", tmp.data);
    else if (rename(tmp.data, path) < 0)
        rc = gs_error_errno(err, GS_E_IO, "cannot rename %s to %s", tmp.data, path);
    if (rc)
        unlink(tmp.data);
out:
    gs_buf_release(&text);
    gs_buf_release(&tmp);
    return rc;
}

static int split_port(struct gs_config *cfg, const char *host_end, struct gs_error *err,
                      const char *target)
{
    if (*host_end == '\0')
        return 0;
    if (*host_end != ':' || !parse_port(host_end + 1, &cfg->port))
        return gs_error_set(err, GS_E_USAGE,
                            "'%s': expected [user@]host[:port] with a port 1-65535", target);
    return 0;
}

int gs_config_parse_target(struct gs_config *cfg, const char *target, struct gs_error *err)
{
    const char *at = strrchr(target, '@');
    const char *host = at ? at + 1 : target;
    if (at) {
        free(cfg->user);
        cfg->user = gs_xstrndup(target, (size_t)(at - target));
    }
    const char *host_end;
    if (host[0] == '[') {
        host_end = strchr(host, ']');
        if (!host_end)
            return gs_error_set(err, GS_E_USAGE, "'%s': unclosed '[' in host", target);
        free(cfg->host);
        cfg->host = gs_xstrndup(host + 1, (size_t)(host_end - host - 1));
        host_end++;
    } else {
        host_end = strchr(host, ':');
        if (!host_end)
            host_end = host + strlen(host);
        free(cfg->host);
        cfg->host = gs_xstrndup(host, (size_t)(host_end - host));
    }
    if (!cfg->host || !cfg->host[0])
        return gs_error_set(err, GS_E_USAGE, "'%s': no host name", target);
    return split_port(cfg, host_end, err, target);
}

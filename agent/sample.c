/* sample: `gpusync-agent sample`, a live reading of the server for `gpusync top` (see sample.h).
 * Counters come from /proc, read at each tick and subtracted from the previous tick's, so one
 * process and one channel serve the whole session; nvidia-smi is the only program it starts,
 * once per tick, killed if it hangs (a wedged driver can stall it for seconds). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "sample.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jsonw.h"
#include "procs.h"
#include "runs.h"
#include "wrapper.h"

#define SAMPLE_DEFAULT_MS 1000
#define SAMPLE_MIN_MS     100
#define GPU_TIMEOUT_MS    3000      /* nvidia-smi slower than this is reported, not waited for */
#define GPU_OUT_MAX       65536     /* its CSV for up to a few hundred GPUs */
#define LOG_TAIL_BYTES    65536     /* how far back in rank 0's log a progress line is looked for */
#define MIB               1048576.0 /* iostat -m's MB */
#define NVIDIA_SMI_FIELDS                                                                          \
    "index,name,utilization.gpu,memory.used,memory.total,power.draw,"                              \
    "temperature.gpu"

/* One device's two cumulative counters: sectors read and written (disks), bytes received and
 * sent (network interfaces). */
struct dev_counter {
    char name[64];
    unsigned long long a, b;
};

struct dev_list {
    struct dev_counter *v;
    size_t n, cap;
};

/* Everything read at one tick. */
struct reading {
    long long mono_ms;
    unsigned long long cpu_total, cpu_idle, cpu_iowait;
    struct dev_list disks, nets;
};

static void reading_release(struct reading *r)
{
    free(r->disks.v);
    free(r->nets.v);
    memset(r, 0, sizeof(*r));
}

static void dev_add(struct dev_list *l, const char *name, unsigned long long a,
                    unsigned long long b)
{
    GA_ALLOC_GROW(l->v, l->n + 1, l->cap);
    struct dev_counter *d = &l->v[l->n++];
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->a = a;
    d->b = b;
}

static const struct dev_counter *dev_find(const struct dev_list *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].name, name))
            return &l->v[i];
    return NULL;
}

/* ---- /proc readers ----------------------------------------------------------------------- */

/* The aggregate "cpu" line of /proc/stat: user nice system idle iowait irq softirq steal. */
static void read_cpu(struct reading *r)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
               &v[5], &v[6], &v[7]) >= 4) {
        for (int i = 0; i < 8; i++)
            r->cpu_total += v[i];
        r->cpu_idle = v[3] + v[4];
        r->cpu_iowait = v[4];
    }
    fclose(f);
}

/* A whole disk, as iostat lists it without -p: one that /sys/block has (partitions are not
 * there), and not a loop or RAM device, whose traffic is another device's or memory's. */
static int whole_disk(const char *name)
{
    if (!strncmp(name, "loop", 4) || !strncmp(name, "ram", 3) || !strncmp(name, "zram", 4))
        return 0;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/block/%s", name);
    for (char *p = path + strlen("/sys/block/"); *p; p++)
        if (*p == '/') /* cciss/c0d0 is cciss!c0d0 in sysfs */
            *p = '!';
    return access(path, F_OK) == 0;
}

/* /proc/diskstats: major minor name, then reads, merged, sectors read, ms, writes, merged,
 * sectors written. Sectors are 512 bytes whatever the device's own block size. */
static void read_disks(struct reading *r)
{
    char line[512], name[64];
    unsigned long long rd, wr;
    FILE *f = fopen("/proc/diskstats", "r");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "%*u %*u %63s %*u %*u %llu %*u %*u %*u %llu", name, &rd, &wr) == 3 &&
            whole_disk(name))
            dev_add(&r->disks, name, rd, wr);
    if (f)
        fclose(f);
}

/* /proc/net/dev: two header lines, then "name: rx_bytes (7 more) tx_bytes ...". */
static void read_net(struct reading *r)
{
    char line[512];
    unsigned long long rx, tx;
    FILE *f = fopen("/proc/net/dev", "r");
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':'), *name = line;
        if (!colon)
            continue;
        *colon = 0;
        while (*name == ' ')
            name++;
        if (strcmp(name, "lo") != 0 &&
            sscanf(colon + 1, "%llu %*u %*u %*u %*u %*u %*u %*u %llu", &rx, &tx) == 2)
            dev_add(&r->nets, name, rx, tx);
    }
    if (f)
        fclose(f);
}

static void take_reading(struct reading *r)
{
    memset(r, 0, sizeof(*r));
    r->mono_ms = ga_runs_mono_ms();
    read_cpu(r);
    read_disks(r);
    read_net(r);
}

/* ---- writing ----------------------------------------------------------------------------- */

/* A number with `decimals` places; null when negative (unknown). */
static void jw_num(struct ga_jw *w, double v, int decimals)
{
    char num[64];
    int n = snprintf(num, sizeof(num), "%.*f", decimals, v);
    if (v < 0 || n <= 0 || (size_t)n >= sizeof(num))
        ga_jw_null(w);
    else
        ga_jw_raw(w, num, (size_t)n);
}

static void jw_key_num(struct ga_jw *w, const char *key, double v, int decimals)
{
    ga_jw_key(w, key);
    jw_num(w, v, decimals);
}

/* A number as read, to 15 significant digits (0.4 stays 0.4, 51234 stays 51234); null when
 * negative (unknown) or not finite (a log's digits past what a double holds). */
static void jw_key_real(struct ga_jw *w, const char *key, double v)
{
    char num[64];
    int n = snprintf(num, sizeof(num), "%.15g", v);
    ga_jw_key(w, key);
    if (v < 0 || !isfinite(v) || n <= 0 || (size_t)n >= sizeof(num))
        ga_jw_null(w);
    else
        ga_jw_raw(w, num, (size_t)n);
}

static double pct(unsigned long long part, unsigned long long whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static void write_cpu(struct ga_jw *w, const struct reading *prev, const struct reading *cur)
{
    double load[3] = {-1, -1, -1};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = -1;
        fclose(f);
    }
    unsigned long long total = cur->cpu_total - prev->cpu_total;
    ga_jw_key(w, "cpu");
    ga_jw_obj(w);
    ga_jw_key_int(w, "cores", sysconf(_SC_NPROCESSORS_ONLN));
    jw_key_num(w, "load1", load[0], 2);
    jw_key_num(w, "load5", load[1], 2);
    jw_key_num(w, "load15", load[2], 2);
    jw_key_num(w, "util_pct", 100.0 - pct(cur->cpu_idle - prev->cpu_idle, total), 1);
    jw_key_num(w, "iowait_pct", pct(cur->cpu_iowait - prev->cpu_iowait, total), 1);
    ga_jw_obj_end(w);
}

static void write_memory(struct ga_jw *w)
{
    char line[256];
    unsigned long long kb, total = 0, avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemTotal: %llu", &kb) == 1)
            total = kb;
        else if (sscanf(line, "MemAvailable: %llu", &kb) == 1)
            avail = kb;
    }
    if (f)
        fclose(f);
    ga_jw_key(w, "memory");
    ga_jw_obj(w);
    jw_key_num(w, "total_mib", total / 1024.0, 0);
    jw_key_num(w, "used_mib", (total - (avail < total ? avail : total)) / 1024.0, 0);
    jw_key_num(w, "available_mib", avail / 1024.0, 0);
    ga_jw_obj_end(w);
}

/* [{name, <ka>, <kb>}] with each counter's rate in MB/s (counters times `unit` bytes) over
 * `secs`. A device that was not there at the previous tick waits for the next one. */
static void write_rates(struct ga_jw *w, const struct dev_list *prev, const struct dev_list *cur,
                        const char *ka, const char *kb, double unit, double secs)
{
    ga_jw_arr(w);
    for (size_t i = 0; i < cur->n; i++) {
        const struct dev_counter *c = &cur->v[i], *p = dev_find(prev, c->name);
        if (!p)
            continue;
        ga_jw_obj(w);
        ga_jw_key_str(w, "name", c->name);
        /* a counter that went back (device reset, 32-bit wrap) reads as 0, not as a huge rate */
        jw_key_num(w, ka, c->a >= p->a ? (double)(c->a - p->a) * unit / MIB / secs : 0, 2);
        jw_key_num(w, kb, c->b >= p->b ? (double)(c->b - p->b) * unit / MIB / secs : 0, 2);
        ga_jw_obj_end(w);
    }
    ga_jw_arr_end(w);
}

/* ---- GPUs -------------------------------------------------------------------------------- */

/* Reads the child's output from fd into out (cap bytes, NUL-terminated) until EOF or
 * `deadline_ms`. Returns 0 at EOF, -1 past the deadline. */
static int read_until(int fd, char *out, size_t cap, long long deadline_ms)
{
    size_t n = 0;
    for (;;) {
        long long left = deadline_ms - ga_runs_mono_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0)
            return -1;
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char junk[4096];
        ssize_t r = n + 1 < cap ? read(fd, out + n, cap - 1 - n) : read(fd, junk, sizeof(junk));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (n + 1 < cap)
            n += (size_t)r;
    }
    out[n] = 0;
    return 0;
}

/* The child: nvidia-smi's CSV on the pipe, its stderr and stdin on /dev/null. */
static void exec_nvidia_smi(int out_fd)
{
    int null = open("/dev/null", O_RDWR);
    dup2(out_fd, 1);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 2);
    }
    signal(SIGPIPE, SIG_DFL);
    execlp("nvidia-smi", "nvidia-smi", "--query-gpu=" NVIDIA_SMI_FIELDS,
           "--format=csv,noheader,nounits", (char *)NULL);
    _exit(127);
}

/* Runs nvidia-smi once into out. Returns NULL, or why there is no list. */
static const char *query_gpus(char *out, size_t cap)
{
    int fds[2], status = 0;
    out[0] = 0;
    if (pipe(fds) < 0)
        return "cannot start nvidia-smi: out of file descriptors";
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        exec_nvidia_smi(fds[1]);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return "cannot start nvidia-smi: fork failed";
    }
    int late = read_until(fds[0], out, cap, ga_runs_mono_ms() + GPU_TIMEOUT_MS) < 0;
    close(fds[0]);
    if (late)
        kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (late)
        return "nvidia-smi did not answer within 3 s (a busy or wedged driver?)";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return "nvidia-smi is not on the server's PATH (no NVIDIA driver?)";
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return "nvidia-smi failed (run it on the server to see why)";
    return NULL;
}

/* Cuts the next comma-separated field off *s, trimmed. */
static char *next_field(char **s)
{
    char *f = *s, *end;
    if (!f)
        return NULL;
    char *comma = strchr(f, ',');
    *s = comma ? comma + 1 : NULL;
    if (comma)
        *comma = 0;
    while (*f == ' ')
        f++;
    end = f + strlen(f);
    while (end > f && (end[-1] == ' ' || end[-1] == '\r'))
        *--end = 0;
    return f;
}

/* A numeric field, or null for what nvidia-smi prints when it has none ("[N/A]",
 * "[Not Supported]"). */
static void jw_field_num(struct ga_jw *w, const char *key, const char *field, int decimals)
{
    char *end;
    double v = field ? strtod(field, &end) : 0;
    ga_jw_key(w, key);
    if (!field || end == field || *end)
        ga_jw_null(w);
    else
        jw_num(w, v, decimals);
}

/* One CSV line: index, name, util %, memory used and total (MiB), power (W), temperature (C). */
static void write_gpu_line(struct ga_jw *w, char *line)
{
    char *f[7];
    for (int i = 0; i < 7; i++)
        f[i] = next_field(&line);
    if (!f[1])
        return;
    ga_jw_obj(w);
    jw_field_num(w, "index", f[0], 0);
    ga_jw_key_str(w, "name", f[1]);
    jw_field_num(w, "util_pct", f[2], 0);
    jw_field_num(w, "mem_used_mib", f[3], 0);
    jw_field_num(w, "mem_total_mib", f[4], 0);
    jw_field_num(w, "power_w", f[5], 1);
    jw_field_num(w, "temp_c", f[6], 0);
    ga_jw_obj_end(w);
}

static void write_gpus(struct ga_jw *w)
{
    static char csv[GPU_OUT_MAX];
    const char *why = query_gpus(csv, sizeof(csv));
    ga_jw_key(w, "gpus");
    ga_jw_arr(w);
    for (char *save = NULL, *line = why ? NULL : strtok_r(csv, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save))
        write_gpu_line(w, line);
    ga_jw_arr_end(w);
    ga_jw_key_str(w, "gpu_error", why);
}

/* ---- the current run --------------------------------------------------------------------- */

/* The id of the newest run under runs whose supervisor lives, into id; 0 if there is one. */
static int newest_running(const char *runs, char *id, size_t cap)
{
    char best_start[40] = "", dir[PATH_MAX];
    DIR *d = opendir(runs);
    for (struct dirent *e; d && (e = readdir(d));) {
        struct ga_runs_status st;
        if (!ga_runs_id_valid(e->d_name) || ga_runs_join(dir, sizeof(dir), runs, e->d_name) < 0 ||
            ga_runs_read_status(dir, &st) < 0)
            continue;
        size_t len = strlen(e->d_name);
        if (!strcmp(st.state, "running") && strcmp(st.start, best_start) > 0 && len < cap &&
            ga_runs_supervisor_alive(dir)) {
            snprintf(best_start, sizeof(best_start), "%s", st.start);
            memcpy(id, e->d_name, len + 1);
        }
        ga_runs_status_release(&st);
    }
    if (d)
        closedir(d);
    return best_start[0] ? 0 : -1;
}

/* The last "N samples/s" in the end of dir/rank0.log (the trainer's epoch line:
 * "epoch  3/10 | ... | 51234 samples/s | 1.20 s"), or -1. */
static double last_samples_per_s(const char *dir)
{
    char path[PATH_MAX], buf[LOG_TAIL_BYTES + 1];
    double v = -1;
    if (ga_runs_join(path, sizeof(path), dir, "rank0.log") < 0)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    off_t size = lseek(fd, 0, SEEK_END);
    off_t from = size > LOG_TAIL_BYTES ? size - LOG_TAIL_BYTES : 0;
    ssize_t n = pread(fd, buf, LOG_TAIL_BYTES, from);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    for (char *p = buf; (p = strstr(p, " samples/s")); p++) {
        char *start = p;
        while (start > buf && (start[-1] == '.' || (start[-1] >= '0' && start[-1] <= '9')))
            start--;
        if (start < p)
            v = strtod(start, NULL);
    }
    return v;
}

static const char *rank_state(const struct ga_runs_rank *r)
{
    return r->exit_code < 0 ? "running" : r->signal ? "killed" : "exited";
}

static void write_run_ranks(struct ga_jw *w, const struct ga_runs_status *st)
{
    ga_jw_key(w, "ranks");
    ga_jw_arr(w);
    for (int i = 0; i < st->nranks; i++) {
        const struct ga_runs_rank *r = &st->ranks[i];
        ga_jw_obj(w);
        ga_jw_key_int(w, "rank", r->rank);
        ga_jw_key_int(w, "pid", r->pid);
        ga_jw_key_str(w, "state", rank_state(r));
        ga_jw_key(w, "exit_code");
        if (r->exit_code < 0)
            ga_jw_null(w);
        else
            ga_jw_int(w, r->exit_code);
        ga_jw_key_bool(w, "paused", r->paused);
        ga_jw_obj_end(w);
    }
    ga_jw_arr_end(w);
}

static void write_run(struct ga_jw *w, const char *root)
{
    char runs[PATH_MAX], dir[PATH_MAX], id[GS_PROTO_RUN_ID_MAX + 1];
    struct ga_runs_status st;
    ga_jw_key(w, "run");
    if (ga_runs_path(runs, sizeof(runs), root, NULL) < 0 ||
        newest_running(runs, id, sizeof(id)) < 0 || ga_runs_join(dir, sizeof(dir), runs, id) < 0 ||
        ga_runs_read_status(dir, &st) < 0) {
        ga_jw_null(w);
        return;
    }
    /* newest_running saw its supervisor alive: the ranks' groups are the run's to ask about */
    struct ga_proclist stopped = {0};
    ga_procs_stopped(&stopped); /* /proc unreadable: nothing is called paused */
    ga_runs_mark_paused(&st, &stopped);
    ga_proclist_release(&stopped);
    ga_jw_obj(w);
    ga_jw_key_str(w, "id", id);
    ga_jw_key_str(w, "state", st.state);
    write_run_ranks(w, &st);
    jw_key_real(w, "samples_per_s", last_samples_per_s(dir));
    ga_jw_obj_end(w);
    ga_runs_status_release(&st);
}

/* ---- the loop ---------------------------------------------------------------------------- */

static void write_sample(struct ga_jw *w, const char *root, const struct reading *prev,
                         const struct reading *cur)
{
    char now[40];
    double secs = (cur->mono_ms - prev->mono_ms) / 1000.0;
    if (secs <= 0)
        secs = 0.001;
    ga_runs_now_iso(now, sizeof(now));
    ga_jw_obj(w);
    ga_jw_key_str(w, "time", now);
    ga_jw_key_int(w, "interval_ms", cur->mono_ms - prev->mono_ms);
    write_cpu(w, prev, cur);
    write_memory(w);
    ga_jw_key(w, "disks");
    write_rates(w, &prev->disks, &cur->disks, "read_mb_s", "write_mb_s", 512, secs);
    ga_jw_key(w, "net");
    write_rates(w, &prev->nets, &cur->nets, "rx_mb_s", "tx_mb_s", 1, secs);
    write_gpus(w);
    write_run(w, root);
    ga_jw_obj_end(w);
    ga_jw_text(w, "\n");
}

/* Sleeps until `until_ms` (monotonic), watching stdout. Returns -1 as soon as the reader of
 * stdout is gone: the channel closed, and nothing else would end this process (sshd does not
 * signal a command when its channel closes). */
static int wait_watching_stdout(long long until_ms)
{
    for (;;) {
        long long left = until_ms - ga_runs_mono_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {1, 0, 0};
        int n = poll(&p, 1, (int)left);
        if (n > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)))
            return -1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static int parse_args(int argc, char **argv, const char **root, long *interval_ms, long *count)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--root") && v)
            *root = argv[++i];
        else if (!strcmp(a, "--interval-ms") && v)
            *interval_ms = strtol(argv[++i], &end, 10);
        else if (!strcmp(a, "--count") && v)
            *count = strtol(argv[++i], &end, 10);
        else {
            fprintf(stderr, "gpusync-agent sample: unknown argument '%s'\n", a);
            return -1;
        }
        if (end && (*end || end == argv[i])) {
            fprintf(stderr, "gpusync-agent sample: %s needs a number, not '%s'\n", a, argv[i]);
            return -1;
        }
    }
    if (*interval_ms < SAMPLE_MIN_MS || *count < 0) {
        fprintf(stderr, "gpusync-agent sample: --interval-ms must be at least %d, --count >= 0\n",
                SAMPLE_MIN_MS);
        return -1;
    }
    return 0;
}

int ga_sample_main(int argc, char **argv)
{
    const char *root = ".";
    long interval_ms = SAMPLE_DEFAULT_MS, count = 0;
    if (parse_args(argc, argv, &root, &interval_ms, &count) < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN); /* a closed channel ends in a write error, handled below */
    struct reading prev, cur;
    struct ga_jw w;
    take_reading(&prev);
    long long next = prev.mono_ms + interval_ms;
    for (long done = 0; count == 0 || done < count; done++) {
        if (wait_watching_stdout(next) < 0)
            break;
        next += interval_ms;
        take_reading(&cur);
        ga_jw_init(&w);
        write_sample(&w, root, &prev, &cur);
        int failed = ga_write_all(1, w.buf, w.len) < 0;
        ga_jw_release(&w);
        reading_release(&prev);
        prev = cur;
        if (failed)
            break;
        if (next < ga_runs_mono_ms()) /* a slow nvidia-smi: no burst of catch-up samples */
            next = ga_runs_mono_ms() + interval_ms;
    }
    reading_release(&prev);
    return 0;
}

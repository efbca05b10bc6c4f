/* launch: the run supervisor (see launch.h). The calling process parses and validates, creates
 * the run directory and picks MASTER_PORT; a double fork + setsid puts the supervisor in its own
 * session, which reports "started" (or why not) back through a pipe. The supervisor is a
 * single-threaded loop over a signalfd (SIGCHLD, SIGTERM, SIGINT) with the grace deadline as
 * the poll timeout; it is a child subreaper, so a rank's orphaned workers are reparented to it
 * and reaped, and it holds supervisor.lock for as long as it lives. A run ends only when every
 * process descended from it has: what left its rank's process group (setsid, a daemon) is found
 * through /proc and the run's cgroup (procs.h), sent SIGTERM with the ranks and SIGKILL after the
 * grace period, and what had to be killed is recorded in status.json for `stop` to report. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpus.h"
#include "jsonw.h"
#include "logtimes.h"
#include "pgroup.h"
#include "procs.h"
#include "proto/run.h"
#include "runlog.h"
#include "runs.h"

#define LAUNCH_USAGE                                                                               \
    "usage: gpusync-agent launch --root DIR --id ID --nproc N [--gpus 0,2 [--ngpus G] [--wait]]\n" \
    "         [--max-restarts K] [--name NAME] [--nnodes M --node-rank R --master-addr HOST\n"     \
    "         --master-port P] [--grace-ms MS] [--follow RANKS] -- CMD ARGS...\n"                  \
    "  --gpus LIST     reserve these GPUs for the run (exit 3 while other runs hold them)\n"       \
    "  --ngpus G       reserve the first G of --gpus LIST that no run holds\n"                     \
    "  --wait          queue until the GPUs are free instead of exiting 3\n"                       \
    "                  (without --gpus the ranks see no GPU: CUDA_VISIBLE_DEVICES is empty)\n"     \
    "  --follow RANKS  after the 'started' line, stream the run's logs as `tail --follow` does\n"

/* How long processes may survive SIGKILL before the run is declared over without them. */
#define LAUNCH_UNKILLABLE_MS 10000

struct launch_opts {
    const char *root, *id, *name, *gpus, *master_addr, *follow;
    long nproc, max_restarts, nnodes, node_rank, master_port, grace_ms, ngpus;
    int wait;                              /* --wait: queue for the GPUs */
    char **cmd;                            /* NULL-terminated, points into argv */
    char gpus_held[GS_PROTO_RUN_GPUS_MAX]; /* the GPUs reserved (gpus.h); gpus points here */
    char rootabs[PATH_MAX];
    char dir[PATH_MAX]; /* the run directory */
    long agent_pid;     /* the process that ran `launch` */
};

/* The supervisor's state for the current attempt. */
struct sup {
    struct launch_opts *o;
    struct ga_runs_status st;
    int sfd;                /* signalfd */
    int alive;              /* ranks not yet reaped */
    int first_fail;         /* exit code of the first failing rank, -1 if none */
    int stop_sig;           /* SIGTERM/SIGINT received, 0 if none */
    int terminating;        /* SIGTERM sent to the groups */
    long long kill_at;      /* monotonic ms of the SIGKILL escalation, 0 if none */
    long long killed_at;    /* monotonic ms of the first SIGKILL, 0 if none */
    long long oom_base;     /* the OOM kill count when the attempt started; -1 unknown */
    struct ga_procs procs;  /* the run's processes beyond its ranks' groups */
    struct ga_logtimes lt;  /* when the rank logs grew, for tail's time order */
    long long dir_check_at; /* monotonic ms of the next look at the run's folder (keep_run_dir) */
};

/* ---- options ----------------------------------------------------------------------------- */

/* Parses a non-negative decimal long; returns 0 or -1. */
static int parse_long(const char *s, long max, long *out)
{
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || e == s || *e || v < 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Returns 1 if s is a comma-separated list of distinct non-negative integers. */
static int gpus_valid(const char *s)
{
    int idx[GA_GPUS_MAX];
    return strspn(s, "0123456789,") == strlen(s) && ga_gpus_parse(s, idx, GA_GPUS_MAX) > 0;
}

/* Handles one option that takes a number. Returns 1 if name matched, -1 on a bad value. */
static int opt_number(struct launch_opts *o, const char *name, const char *val)
{
    static const struct {
        const char *name;
        size_t off;
        long max;
    } nums[] = {
        {"--nproc", offsetof(struct launch_opts, nproc), GS_PROTO_RUN_MAX_RANKS},
        {"--max-restarts", offsetof(struct launch_opts, max_restarts), 1000000},
        {"--nnodes", offsetof(struct launch_opts, nnodes), 100000},
        {"--node-rank", offsetof(struct launch_opts, node_rank), 100000},
        {"--master-port", offsetof(struct launch_opts, master_port), 65535},
        {"--grace-ms", offsetof(struct launch_opts, grace_ms), 3600 * 1000},
        {"--ngpus", offsetof(struct launch_opts, ngpus), GA_GPUS_MAX},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
        if (!strcmp(name, nums[i].name))
            return parse_long(val, nums[i].max, (long *)((char *)o + nums[i].off)) < 0 ? -1 : 1;
    return 0;
}

/* Handles one option that takes a string. Returns 1 if name matched. */
static int opt_string(struct launch_opts *o, const char *name, const char *val)
{
    const char **dst = !strcmp(name, "--root")          ? &o->root
                       : !strcmp(name, "--id")          ? &o->id
                       : !strcmp(name, "--name")        ? &o->name
                       : !strcmp(name, "--gpus")        ? &o->gpus
                       : !strcmp(name, "--master-addr") ? &o->master_addr
                       : !strcmp(name, "--follow")      ? &o->follow
                                                        : NULL;
    if (dst)
        *dst = val;
    return dst != NULL;
}

/* Checks option combinations; returns NULL or the complaint. */
static const char *opts_check(const struct launch_opts *o)
{
    if (!o->root || !o->id || o->nproc < 1 || !o->cmd || !o->cmd[0])
        return "--root, --id, --nproc >= 1 and -- CMD are required";
    if (!ga_runs_id_valid(o->id))
        return "--id must be 1-64 characters of [A-Za-z0-9._-], not starting with '.'";
    if (o->name && strlen(o->name) > GA_RUNS_NAME_MAX)
        return "--name is longer than 128 characters";
    if (o->gpus && !gpus_valid(o->gpus))
        return "--gpus wants a list of distinct device numbers such as 0,2";
    if (o->ngpus && !o->gpus)
        return "--ngpus G chooses from --gpus LIST: it needs one";
    if (o->wait && !o->gpus)
        return "--wait queues for GPUs: it needs --gpus";
    if (o->nnodes < 1 || o->node_rank >= o->nnodes)
        return "--node-rank must be below --nnodes";
    if (o->node_rank > 0 && (!o->master_addr || o->master_port == 0))
        return "a node other than 0 needs --master-addr and --master-port of node 0";
    return NULL;
}

/* Parses argv into o. Returns 0, or -1 after printing the usage problem. */
static int opts_parse(struct launch_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    o->nnodes = 1;
    o->grace_ms = 10000;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--")) {
            o->cmd = argv + i + 1;
            break;
        }
        if (!strcmp(argv[i], "--wait")) { /* the one option without a value */
            o->wait = 1;
            i--;
            continue;
        }
        int m = i + 1 < argc ? opt_number(o, argv[i], argv[i + 1]) : 0;
        if (m == 0 && i + 1 < argc)
            m = opt_string(o, argv[i], argv[i + 1]);
        if (m <= 0) {
            fprintf(stderr, "gpusync-agent launch: bad argument '%s'%s\n%s", argv[i],
                    m < 0 ? " (bad value)" : "", LAUNCH_USAGE);
            return -1;
        }
    }
    const char *bad = opts_check(o);
    if (bad) {
        fprintf(stderr, "gpusync-agent launch: %s\n%s", bad, LAUNCH_USAGE);
        return -1;
    }
    return 0;
}

/* ---- preparation (in the calling process) ------------------------------------------------ */

/* Asks the kernel for a free TCP port by binding port 0 on all interfaces (the master listens
 * there); the socket is closed again, as torchrun does. Returns the port or -1. */
static int pick_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    int port = -1;
    if (bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(s);
    return port;
}

/* A run's files hold its full command line and everything it printed: readable by the user
 * who ran it only, whatever the umask (shared servers have other users). */
#define RUN_DIR_MODE  0700
#define RUN_FILE_MODE 0600

/* mkdir that accepts an existing directory. */
static int mkdir_ok(const char *path)
{
    return mkdir(path, RUN_DIR_MODE) == 0 || errno == EEXIST ? 0 : -1;
}

/* Creates DIR/.gpusync/runs/ID (which must not exist yet). Returns 0, or -1 after printing. */
static int make_run_dir(struct launch_opts *o)
{
    char p[PATH_MAX];
    if (!realpath(o->root, o->rootabs)) {
        fprintf(stderr, "gpusync-agent launch: --root %s: %s\n", o->root, strerror(errno));
        return -1;
    }
    if (ga_runs_join(p, sizeof(p), o->rootabs, ".gpusync") < 0 || mkdir_ok(p) < 0 ||
        ga_runs_path(p, sizeof(p), o->rootabs, NULL) < 0 || mkdir_ok(p) < 0 ||
        ga_runs_path(o->dir, sizeof(o->dir), o->rootabs, o->id) < 0) {
        fprintf(stderr, "gpusync-agent launch: cannot create %s: %s\n", p, strerror(errno));
        return -1;
    }
    if (mkdir(o->dir, RUN_DIR_MODE) < 0) {
        fprintf(stderr, "gpusync-agent launch: %s: %s%s\n", o->dir, strerror(errno),
                errno == EEXIST ? " (run ids must be unique)" : "");
        return -1;
    }
    return 0;
}

/* ---- meta.json --------------------------------------------------------------------------- */

/* Writes meta.json: what was started, where and when. Returns 0 or -1 with errno set. */
static int write_meta(const struct launch_opts *o, const char *start)
{
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    struct ga_jw w;
    ga_jw_init(&w);
    ga_jw_obj(&w);
    ga_jw_key(&w, "id"), ga_jw_str(&w, o->id);
    ga_jw_key(&w, "name"), ga_jw_str(&w, o->name);
    ga_jw_key(&w, "command"), ga_jw_arr(&w);
    for (char **a = o->cmd; *a; a++)
        ga_jw_str(&w, *a);
    ga_jw_arr_end(&w);
    ga_jw_key(&w, "cwd"), ga_jw_str(&w, o->rootabs);
    ga_jw_key(&w, "nproc"), ga_jw_int(&w, o->nproc);
    ga_jw_key(&w, "gpus");
    if (o->gpus) {
        ga_jw_arr(&w);
        for (const char *p = o->gpus; *p; p += strcspn(p, ","), p += *p == ',')
            ga_jw_int(&w, strtol(p, NULL, 10));
        ga_jw_arr_end(&w);
    } else {
        ga_jw_null(&w);
    }
    ga_jw_key(&w, "host"), ga_jw_str(&w, host);
    ga_jw_key(&w, "nnodes"), ga_jw_int(&w, o->nnodes);
    ga_jw_key(&w, "node_rank"), ga_jw_int(&w, o->node_rank);
    ga_jw_key(&w, "master_addr"), ga_jw_str(&w, o->master_addr);
    ga_jw_key(&w, "master_port"), ga_jw_int(&w, o->master_port);
    ga_jw_key(&w, "max_restarts"), ga_jw_int(&w, o->max_restarts);
    ga_jw_key(&w, "start"), ga_jw_str(&w, start);
    ga_jw_key(&w, "agent_pid"), ga_jw_int(&w, o->agent_pid);
    ga_jw_key(&w, "supervisor_pid"), ga_jw_int(&w, getpid());
    ga_jw_obj_end(&w);
    ga_jw_text(&w, "\n");
    int rc = ga_runs_write_atomic(o->dir, "meta.json", w.buf, w.len);
    ga_jw_release(&w);
    return rc;
}

/* ---- ranks ------------------------------------------------------------------------------- */

static void set_env_long(const char *k, long v)
{
    char num[32];
    snprintf(num, sizeof(num), "%ld", v);
    setenv(k, num, 1);
}

/* Sets torchrun's environment for one rank (in the forked child, before exec). */
static void rank_env(const struct sup *s, int local, int restart)
{
    const struct launch_opts *o = s->o;
    long world = o->nnodes * o->nproc, rank = o->node_rank * o->nproc + local;
    set_env_long("RANK", rank);
    set_env_long("LOCAL_RANK", local);
    set_env_long("WORLD_SIZE", world);
    set_env_long("LOCAL_WORLD_SIZE", o->nproc);
    set_env_long("GROUP_RANK", o->node_rank);
    set_env_long("NODE_RANK", o->node_rank); /* torch.distributed.launch, Lightning */
    set_env_long("GROUP_WORLD_SIZE", o->nnodes);
    set_env_long("ROLE_RANK", rank);
    set_env_long("ROLE_WORLD_SIZE", world);
    setenv("ROLE_NAME", "default", 1);
    setenv("MASTER_ADDR", o->master_addr ? o->master_addr : "127.0.0.1", 1);
    set_env_long("MASTER_PORT", o->master_port);
    set_env_long("TORCHELASTIC_RESTART_COUNT", restart);
    set_env_long("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
    setenv("TORCHELASTIC_RUN_ID", o->id, 1);
    setenv("GPUSYNC_RUN_ID", o->id, 1);
    setenv("GPUSYNC_RUN_DIR", o->dir, 1); /* also how stop finds what escaped the supervisor */
    /* torchrun's rule: ranks sharing a node get one OpenMP thread each unless the caller says
     * otherwise; a single rank keeps its libraries' default (every core). */
    if (o->nproc > 1)
        setenv("OMP_NUM_THREADS", "1", 0);
    /* A rank's stdout is a log file, not a terminal, so Python would hold print()'s lines back
     * in an 8 KB buffer and a job printing a line an epoch would look hung for hours; the user's
     * own setting wins. */
    setenv("PYTHONUNBUFFERED", "1", 0);
    /* CPU ranks see no GPU at all, rather than every GPU that other runs hold. */
    setenv("CUDA_VISIBLE_DEVICES", o->gpus ? o->gpus : "", 1);
    /* Not TORCHELASTIC_USE_AGENT_STORE: rank 0 must host the TCPStore itself. */
}

/* In the forked rank: own process group, log as stdout and stderr, default signal handling,
 * the environment, exec. Never returns. If the command cannot be started, the errno goes to
 * err_fd (close-on-exec, so EOF there means the exec worked), the reason to the rank log, and
 * the rank exits 127 (126 when the file is not executable), as a shell would. */
static void rank_exec(const struct sup *s, int local, int restart, const char *log, int err_fd)
{
    static const int reset[] = {SIGPIPE, SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGCHLD};
    sigset_t none;
    setpgid(0, 0);
    ga_procs_cgroup_enter(&s->procs); /* best effort: /proc and the environment still mark it */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (size_t i = 0; i < sizeof(reset) / sizeof(reset[0]); i++)
        signal(reset[i], SIG_DFL); /* ignored signals would survive exec */
    /* A rank must not outlive a supervisor killed outright (it would hold its GPU forever). */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != (pid_t)s->st.supervisor_pid)
        _exit(127);
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, RUN_FILE_MODE), e;
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) {
        e = errno;
        (void)!write(err_fd, &e, sizeof(e));
        _exit(127);
    }
    if (fd > 2)
        close(fd);
    rank_env(s, local, restart);
    execvp(s->o->cmd[0], s->o->cmd);
    e = errno;
    (void)!write(err_fd, &e, sizeof(e));
    dprintf(2, "gpusync-agent: cannot run '%s': %s\n", s->o->cmd[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

/* Writes the log path of global rank into buf. */
static void rank_log_path(const struct sup *s, int rank, char *buf, size_t cap)
{
    char name[32];
    snprintf(name, sizeof(name), "rank%d.log", rank);
    if (ga_runs_join(buf, cap, s->o->dir, name) < 0)
        buf[0] = 0;
}

/* Forks rank r and waits until its command runs. Returns 0, the errno that kept the command
 * from starting (the rank then exits by itself and is reaped as usual), or -1 if fork failed. */
static int spawn_one(struct sup *s, struct ga_runs_rank *r, int restart)
{
    char log[PATH_MAX];
    int p[2], e = 0;
    rank_log_path(s, r->rank, log, sizeof(log));
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        rank_exec(s, r->local_rank, restart, log, p[1]);
    }
    close(p[1]);
    if (pid > 0) {
        /* Both sides set the group, so a kill right after fork already reaches it. */
        setpgid(pid, pid);
        ga_pgroup_record(r, pid);
        s->alive++;
        while (read(p[0], &e, sizeof(e)) < 0 && errno == EINTR)
            ;
    }
    close(p[0]);
    return pid < 0 ? -1 : e;
}

/* Starts every local rank of attempt number restart. Returns 0, or the exit code the run gets
 * because a rank could not start (127 or 126, with the reason in why); the ranks already
 * started keep running and are stopped by the caller. */
static int spawn_ranks(struct sup *s, int restart, char *why, size_t cap)
{
    for (int i = 0; i < s->st.nranks; i++) {
        struct ga_runs_rank *r = &s->st.ranks[i];
        memset(r, 0, sizeof(*r));
        r->local_rank = i;
        r->rank = (int)(s->o->node_rank * s->o->nproc + i);
        r->exit_code = -1;
        int e = spawn_one(s, r, restart);
        if (e < 0)
            snprintf(why, cap, "fork: %s", strerror(errno));
        else if (e > 0)
            snprintf(why, cap, "cannot run '%s': %s", s->o->cmd[0], strerror(e));
        if (e != 0)
            return e == EACCES || e == ENOEXEC ? 126 : 127;
    }
    return 0;
}

/* Appends "=== restart N ===" to every rank log, on a line of its own. */
static void mark_restart(const struct sup *s, int n)
{
    for (int i = 0; i < s->st.nranks; i++) {
        char log[PATH_MAX], last = '\n';
        rank_log_path(s, s->st.ranks[i].rank, log, sizeof(log));
        int fd = open(log, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, RUN_FILE_MODE);
        if (fd < 0)
            continue;
        off_t end = lseek(fd, 0, SEEK_END);
        if (end > 0 && pread(fd, &last, 1, end - 1) != 1)
            last = '\n';
        dprintf(fd, "%s=== restart %d ===\n", last == '\n' ? "" : "\n", n);
        close(fd);
    }
}

/* ---- the supervision loop ---------------------------------------------------------------- */

static void save_status(struct sup *s)
{
    ga_runs_write_status(s->o->dir, &s->st);
}

/* 1 while some rank group is still the run's and not empty; marks the others gone (pgroup.h)
 * and saves that, so neither this loop nor `stop` ever signals them again. */
static int groups_alive(struct sup *s)
{
    int alive = 0, gone_before = 0, gone_after = 0;
    for (int i = 0; i < s->st.nranks; i++) {
        gone_before += s->st.ranks[i].group_gone;
        alive |= ga_pgroup_alive(&s->st.ranks[i]);
        gone_after += s->st.ranks[i].group_gone;
    }
    if (gone_after != gone_before)
        save_status(s);
    return alive;
}

/* 1 while a rank has exited but its group has not yet been seen empty: its leftover members are
 * not our children (no SIGCHLD), so the loop looks at the group on a timer. */
static int groups_orphaned(const struct sup *s)
{
    for (int i = 0; i < s->st.nranks; i++)
        if (s->st.ranks[i].exit_code >= 0 && !s->st.ranks[i].group_gone)
            return 1;
    return 0;
}

static void signal_groups(struct sup *s, int sig)
{
    for (int i = 0; i < s->st.nranks; i++)
        ga_pgroup_signal(&s->st.ranks[i], sig);
}

/* 1 if pgid is the group of a rank (whose members a group signal reaches anyway). */
static int rank_group(const struct sup *s, long pgid)
{
    for (int i = 0; i < s->st.nranks; i++)
        if (s->st.ranks[i].pgid == pgid && !s->st.ranks[i].group_gone)
            return 1;
    return 0;
}

/* SIGTERM to the run's processes outside its ranks' groups (a setsid child, a daemon), each
 * once: a group signal already reached the others, and a second SIGTERM may cut short the
 * cleanup a handler started on the first. */
static void term_others(struct sup *s)
{
    struct ga_proclist l = {0};
    ga_procs_find(&s->procs, GA_PROCS_DESCENDANTS, &l);
    size_t kept = 0;
    for (size_t i = 0; i < l.n; i++)
        if (!rank_group(s, l.v[i].pgid))
            l.v[kept++] = l.v[i];
    l.n = kept;
    s->st.others_termed += (long)ga_procs_signal(&l, SIGTERM);
    ga_proclist_release(&l);
}

static void reap(struct sup *s);

/* SIGTERM to every rank group and every other process of the run, with SIGKILL due after the
 * grace period. */
static void terminate(struct sup *s)
{
    if (s->terminating)
        return;
    s->terminating = 1;
    /* a rank that failed at about the same moment as the first one is dead already, waiting to be
     * reaped: it exited on its own, with its own status, and is not one this stop stopped */
    reap(s);
    for (int i = 0; i < s->st.nranks; i++)
        s->st.ranks[i].stopped = s->st.ranks[i].exit_code < 0;
    signal_groups(s, SIGTERM); /* and SIGCONT, for a stopped process (pgroup.h) */
    term_others(s);
    s->kill_at = ga_runs_mono_ms() + s->st.grace_ms;
    save_status(s);
}

/* SIGKILL to everything of the run that is left: the cgroup at once where there is one, then
 * each group and each process found. */
static void kill_all(struct sup *s)
{
    struct ga_proclist l = {0};
    ga_procs_find(&s->procs, GA_PROCS_DESCENDANTS, &l);
    ga_runs_note_killed(&s->st, &l);
    ga_procs_cgroup_kill(&s->procs);
    signal_groups(s, SIGKILL);
    ga_procs_signal(&l, SIGKILL);
    ga_proclist_release(&l);
    save_status(s);
}

/* 1 while a process of the run outside its ranks' groups lives on (a scan of /proc: asked only
 * once no rank and no rank group is left). */
static int others_alive(struct sup *s)
{
    struct ga_proclist l = {0};
    int alive = ga_procs_find(&s->procs, GA_PROCS_DESCENDANTS, &l) == 0 && l.n > 0;
    ga_proclist_release(&l);
    return alive;
}

/* 1 if the kernel counted an OOM kill since the attempt started (for a rank that died of a
 * SIGKILL the supervisor did not send), and records where it was counted. */
static int killed_by_oom(struct sup *s)
{
    const char *scope = NULL;
    long long now = ga_procs_oom_kills(&s->procs, &scope);
    if (s->oom_base < 0 || now <= s->oom_base)
        return 0;
    snprintf(s->st.oom_scope, sizeof(s->st.oom_scope), "%s", scope);
    return 1;
}

/* Records the exit of the rank with this pid (if it is one: reparented orphans are not). */
static void rank_exited(struct sup *s, pid_t pid, int ws)
{
    for (int i = 0; i < s->st.nranks; i++) {
        struct ga_runs_rank *r = &s->st.ranks[i];
        if (r->pid != pid || r->exit_code >= 0)
            continue;
        r->signal = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
        r->exit_code = WIFSIGNALED(ws) ? 128 + r->signal : WEXITSTATUS(ws);
        s->alive--;
        ga_pgroup_alive(r); /* the leader was the only member: its number is free from now on */
        if (r->signal == SIGKILL && !s->killed_at)
            r->oom = killed_by_oom(s);
        if (r->exit_code != 0 && s->first_fail < 0 && !s->terminating) {
            s->first_fail = r->exit_code;
            s->st.failed_rank = r->rank;
            terminate(s);
        }
        save_status(s);
        return;
    }
}

static void reap(struct sup *s)
{
    int ws;
    pid_t pid;
    while ((pid = waitpid(-1, &ws, WNOHANG)) > 0)
        rank_exited(s, pid, ws);
}

/* Handles one signal from the signalfd. `stop` sends SIGTERM with sigqueue(3), its value the
 * grace period it asks for in milliseconds; a plain kill keeps the run's own. */
static void on_signal(struct sup *s, const struct signalfd_siginfo *si)
{
    int sig = (int)si->ssi_signo;
    if (sig == SIGCHLD) {
        reap(s);
        return;
    }
    if (si->ssi_code == SI_QUEUE && si->ssi_int >= 0) {
        s->st.grace_ms = si->ssi_int;
        if (s->kill_at) /* already terminating: the new grace counts from now */
            s->kill_at = ga_runs_mono_ms() + s->st.grace_ms;
    }
    if (s->stop_sig) /* a second stop request: no more grace */
        s->kill_at = ga_runs_mono_ms();
    s->stop_sig = sig;
    terminate(s);
}

/* How often the supervisor looks for its run's folder (keep_run_dir). */
#define RUN_DIR_CHECK_MS 2000

/* status.json damaged or removed in a folder that is still there (a hand edit, a sync tool,
 * a full disk's truncation): ps skipped the run and stop could not read it. Written again. */
static void keep_status(struct sup *s)
{
    struct ga_runs_status now;
    if (ga_runs_read_status(s->o->dir, &now) == 0) {
        ga_runs_status_release(&now);
        return;
    }
    save_status(s);
}

/* A run's folder removed on the server (an `rm -rf` of .gpusync/runs, or of the whole project,
 * which watch makes again) while it runs: its ranks went on, holding their GPUs, where neither
 * `ps` nor `stop` could see them. The supervisor makes the folder again, with meta.json and
 * status.json, so that both find the run; what the ranks printed is lost (their logs were the
 * removed files, which they keep writing). */
static void keep_run_dir(struct sup *s, long long now)
{
    if (now < s->dir_check_at)
        return;
    s->dir_check_at = now + RUN_DIR_CHECK_MS;
    struct stat st;
    char p[PATH_MAX];
    if (stat(s->o->dir, &st) == 0) {
        keep_status(s);
        return;
    }
    if (errno != ENOENT)
        return;
    if (ga_runs_join(p, sizeof(p), s->o->rootabs, ".gpusync") < 0 || mkdir_ok(p) < 0 ||
        ga_runs_path(p, sizeof(p), s->o->rootabs, NULL) < 0 || mkdir_ok(p) < 0 ||
        mkdir_ok(s->o->dir) < 0)
        return; /* the project folder itself is gone: looked for again in RUN_DIR_CHECK_MS */
    write_meta(s->o, s->st.start);
    save_status(s);
}

/* Poll timeout until the next deadline: SIGKILL escalation, a short recheck of groups whose
 * leftover members are not our children (they give no SIGCHLD), or the next look at the run's
 * folder. */
static int next_timeout(const struct sup *s)
{
    long long t = s->alive == 0 ? 20 : groups_orphaned(s) ? 100 : -1;
    long long dir = s->dir_check_at - ga_runs_mono_ms();
    dir = dir < 0 ? 0 : dir;
    t = t < 0 || dir < t ? dir : t;
    if (s->alive == 0 && s->terminating)
        t = 50; /* waiting for processes that are not our children: each pass scans /proc */
    long long times = ga_logtimes_timeout(&s->lt);
    if (times >= 0 && (t < 0 || times < t))
        t = times;
    if (s->kill_at) {
        long long left = s->kill_at - ga_runs_mono_ms();
        left = left < 0 ? 0 : left;
        t = t < 0 || left < t ? left : t;
    }
    return (int)t;
}

/* Names in supervisor.log what survived SIGKILL for LAUNCH_UNKILLABLE_MS. */
static void log_unkillable(struct sup *s)
{
    struct ga_proclist l = {0};
    char what[1024];
    ga_procs_find(&s->procs, GA_PROCS_DESCENDANTS, &l);
    ga_proclist_describe(&l, 8, what, sizeof(what));
    fprintf(stderr, "gpusync-agent: run %s: %s survived SIGKILL\n", s->o->id, what);
    ga_proclist_release(&l);
}

/* Runs until every rank has exited and every process of the run is gone (rank groups, and what
 * left them), or until processes have survived SIGKILL for LAUNCH_UNKILLABLE_MS (stuck in the
 * kernel, e.g. in a GPU driver): the run then ends anyway, and supervisor.log names them. */
static void wait_group(struct sup *s)
{
    /* every pass: a group seen empty is let go; /proc is scanned only once no rank is left */
    while (groups_alive(s) || s->alive > 0 || others_alive(s)) {
        if (s->alive == 0)
            terminate(s); /* leftovers of ranks that exited: they must not outlive the run */
        struct pollfd p[2] = {{s->sfd, POLLIN, 0}, {ga_logtimes_fd(&s->lt), POLLIN, 0}};
        int n = poll(p, p[1].fd >= 0 ? 2 : 1, next_timeout(s));
        if (n > 0 && p[0].revents) {
            struct signalfd_siginfo si;
            while (read(s->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                on_signal(s, &si);
        }
        ga_logtimes_update(&s->lt);
        reap(s);
        long long now = ga_runs_mono_ms();
        keep_run_dir(s, now);
        if (s->killed_at && now - s->killed_at > LAUNCH_UNKILLABLE_MS)
            return log_unkillable(s);
        if (s->kill_at && now >= s->kill_at) {
            kill_all(s);
            s->killed_at = s->killed_at ? s->killed_at : now;
            s->kill_at = now + 1000; /* and again, should anything linger */
        }
    }
}

/* Ends the run: final state, exit code and end time in status.json. */
static void finish(struct sup *s, const char *state, int code)
{
    snprintf(s->st.state, sizeof(s->st.state), "%s", state);
    s->st.exit_code = code;
    ga_runs_now_iso(s->st.end, sizeof(s->st.end));
    ga_logtimes_flush(&s->lt); /* before the end is visible: tail's last pass sees every record */
    save_status(s);
}

/* Tells the launch how the first attempt started, and closes fd: "ok", or "exit CODE WHY" when
 * the command could not start, CODE being the exit code the run will record (127, 126), so the
 * launch can say it as the run ended with (start_supervisor reads it). */
static void report_start(int fd, int cannot, const char *why)
{
    if (cannot)
        dprintf(fd, "exit %d %s\n", cannot, why);
    else
        dprintf(fd, "ok\n");
    close(fd);
}

/* Runs attempts until success, a stop, or restarts are used up. Reports the first attempt's
 * start to report_fd (report_start). */
static void supervise(struct sup *s, int report_fd)
{
    for (int attempt = 0;; attempt++) {
        char why[512] = "";
        s->first_fail = -1;
        s->terminating = 0;
        s->kill_at = s->killed_at = 0;
        s->st.restarts = attempt;
        s->st.failed_rank = -1;
        s->oom_base = ga_procs_oom_kills(&s->procs, NULL);
        int cannot = spawn_ranks(s, attempt, why, sizeof(why));
        save_status(s);
        if (report_fd >= 0) {
            report_start(report_fd, cannot, why);
            report_fd = -1;
        }
        if (cannot) {
            s->first_fail = cannot;
            terminate(s);
        }
        wait_group(s);
        if (s->stop_sig)
            return finish(s, "stopped", 128 + s->stop_sig);
        if (s->first_fail < 0)
            return finish(s, "succeeded", 0);
        if (attempt >= s->o->max_restarts || cannot)
            return finish(s, "failed", s->first_fail);
        mark_restart(s, attempt + 1);
    }
}

/* Takes supervisor.lock for the supervisor's lifetime (the fd is deliberately kept open; it is
 * close-on-exec, so ranks do not inherit it). Returns 0 or -1. */
static int take_lock(const struct launch_opts *o)
{
    char path[PATH_MAX];
    if (ga_runs_join(path, sizeof(path), o->dir, "supervisor.lock") < 0)
        return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, RUN_FILE_MODE);
    return fd < 0 || flock(fd, LOCK_EX) < 0 ? -1 : 0;
}

/* Holds the run's GPUs for the supervisor's lifetime (gpus.h). Returns 0 or -1. */
static int hold_gpus(const struct launch_opts *o)
{
    return o->gpus ? ga_gpus_hold(o->gpus, o->id, o->rootabs) : 0;
}

/* Blocks the signals the loop handles and returns a signalfd for them, or -1. */
static int signals_setup(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    /* Whatever the caller ignored: SIGCHLD ignored would reap the ranks behind our back. */
    signal(SIGCHLD, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGPIPE, SIG_IGN); /* the launch process may be gone when we report */
    signal(SIGHUP, SIG_IGN);
    if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
        return -1;
    return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/* The supervisor process: sets up, reports to report_fd, supervises, exits. */
static void supervisor_main(struct launch_opts *o, int report_fd)
{
    struct sup s;
    memset(&s, 0, sizeof(s));
    s.o = o;
    s.sfd = signals_setup();
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    snprintf(s.st.id, sizeof(s.st.id), "%s", o->id);
    snprintf(s.st.state, sizeof(s.st.state), "running");
    s.st.exit_code = -1;
    ga_runs_now_iso(s.st.start, sizeof(s.st.start));
    s.st.supervisor_pid = getpid();
    s.st.master_port = (int)o->master_port;
    s.st.nranks = (int)o->nproc;
    s.st.ranks = calloc((size_t)o->nproc, sizeof(*s.st.ranks));
    s.st.max_restarts = (int)o->max_restarts;
    s.st.grace_ms = o->grace_ms;
    s.st.failed_rank = -1;
    s.procs.supervisor = s.st.supervisor_pid;
    snprintf(s.procs.id, sizeof(s.procs.id), "%s", o->id);
    snprintf(s.procs.dir, sizeof(s.procs.dir), "%s", o->dir);
    const char *fail = s.sfd < 0                   ? "signalfd"
                       : !s.st.ranks               ? "out of memory"
                       : take_lock(o)              ? "cannot lock supervisor.lock"
                       : hold_gpus(o)              ? "cannot reserve the GPUs"
                       : write_meta(o, s.st.start) ? "cannot write meta.json"
                                                   : NULL;
    if (fail) {
        dprintf(report_fd, "%s: %s\n", fail, strerror(errno));
        _exit(1);
    }
    ga_procs_cgroup_make(&s.procs);
    snprintf(s.st.cgroup, sizeof(s.st.cgroup), "%s", s.procs.cgroup);
    /* Before the ranks start, so their first bytes are seen; without it the logs are still
     * kept, and tail reads them rank by rank. */
    ga_logtimes_open(&s.lt, o->dir, (int)(o->node_rank * o->nproc), (int)o->nproc);
    supervise(&s, report_fd);
    ga_procs_cgroup_remove(&s.procs);
    ga_logtimes_close(&s.lt);
    ga_runs_status_release(&s.st);
    _exit(0);
}

/* ---- detaching --------------------------------------------------------------------------- */

/* Points stdin at /dev/null and stdout/stderr at the run's supervisor.log, and closes every
 * other inherited descriptor except keep, so nothing holds the SSH channel open. */
static void detach_fds(const struct launch_opts *o, int keep)
{
    char log[PATH_MAX];
    int in = open("/dev/null", O_RDONLY);
    int out = ga_runs_join(log, sizeof(log), o->dir, "supervisor.log") == 0
                  ? open(log, O_WRONLY | O_CREAT | O_APPEND, RUN_FILE_MODE)
                  : -1;
    if (out < 0)
        out = open("/dev/null", O_WRONLY);
    dup2(in, 0), dup2(out, 1), dup2(out, 2);
    DIR *d = opendir("/proc/self/fd");
    int dfd = d ? dirfd(d) : -1;
    for (struct dirent *e; d && (e = readdir(d));) {
        int fd = atoi(e->d_name);
        if (fd > 2 && fd != keep && fd != dfd && e->d_name[0] != '.')
            close(fd);
    }
    if (d)
        closedir(d);
}

/* The middle child: new session, fork the supervisor, exit. */
static void middle_child(struct launch_opts *o, int report_fd)
{
    if (setsid() < 0)
        _exit(1);
    pid_t pid = fork();
    if (pid < 0)
        _exit(1);
    if (pid > 0)
        _exit(0);
    detach_fds(o, report_fd);
    if (chdir(o->rootabs) < 0) {
        dprintf(report_fd, "chdir %s: %s\n", o->rootabs, strerror(errno));
        _exit(1);
    }
    supervisor_main(o, report_fd);
}

/* Reads the supervisor's report line into buf (until EOF). */
static void read_report(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (n += (size_t)r) == cap - 1)
            break;
    }
    buf[n] = 0;
}

/* Reads the supervisor's report (report_start) in why: 0 for "ok"; else -1 with the reason left
 * in why and, when the command could not start, the run's exit code in *code (0 otherwise). */
static int parse_report(char *why, size_t cap, int *code)
{
    int at = 0;
    *code = 0;
    if (strcmp(why, "ok\n") == 0)
        return 0;
    if (sscanf(why, "exit %d %n", code, &at) == 1 && at > 0)
        memmove(why, why + at, strlen(why + at) + 1);
    else if (!why[0])
        snprintf(why, cap, "the supervisor died before it started the ranks");
    why[strcspn(why, "\n")] = 0;
    return -1;
}

/* Detaches the supervisor and waits for its report. Returns the supervisor's pid, or -1 with
 * the reason in why and, when the run's command could not start, the exit code the run ends with
 * in *code (0 otherwise). */
static long start_supervisor(struct launch_opts *o, char *why, size_t cap, int *code)
{
    int p[2];
    *code = 0;
    if (pipe2(p, O_CLOEXEC) < 0) {
        snprintf(why, cap, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t mid = fork();
    if (mid == 0) {
        close(p[0]);
        middle_child(o, p[1]);
    }
    close(p[1]);
    if (mid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        close(p[0]);
        return -1;
    }
    waitpid(mid, NULL, 0);
    read_report(p[0], why, cap);
    close(p[0]);
    if (parse_report(why, cap, code) < 0)
        return -1;
    struct ga_runs_status st;
    long pid = ga_runs_read_status(o->dir, &st) == 0 ? st.supervisor_pid : -1;
    ga_runs_status_release(&st);
    if (pid < 0)
        snprintf(why, cap, "cannot read the run's status.json");
    return pid;
}

/* Streams the new run's logs on stdout, as `tail --follow` would: the client then needs one exec,
 * not two, between its command and the first log line. */
static int follow_logs(struct launch_opts *o)
{
    char *argv[] = {"tail",    "--root",          (char *)o->root, "--id", (char *)o->id,
                    "--ranks", (char *)o->follow, "--follow",      NULL};
    return ga_tail_main((int)(sizeof(argv) / sizeof(argv[0])) - 1, argv);
}

/* For a run whose command could not start (code > 0): the X line (proto/run.h) saying how the
 * run ended, so the client exits with the code that the run records and `ps` shows, as `exec`
 * of the same command would, rather than with a generic remote error. */
static void print_not_started(int code)
{
    char line[64];
    if (code > 0 && gs_proto_run_exit_format(line, sizeof(line), code, "failed", NULL) > 0) {
        fputs(line, stdout);
        fflush(stdout);
    }
}

/* Prints a waiting line (proto/run.h) while the launch queues for GPUs. */
static void print_waiting(const char *text)
{
    char line[GS_PROTO_RUN_WAIT_MAX + 16];
    if (gs_proto_run_waiting_format(line, sizeof(line), text) > 0) {
        fputs(line, stdout);
        fflush(stdout);
    }
}

/* Reserves the GPUs of --gpus / --ngpus (queuing with --wait) and points o->gpus at the chosen
 * list. Returns the choose.lock descriptor to close once the supervisor holds them (-1 when the
 * run has no GPUs), or an exit status < -1 after saying why: -1 - status. */
static int reserve_gpus(struct launch_opts *o)
{
    if (!o->gpus)
        return -1;
    struct ga_gpus_req req = {o->gpus, (int)o->ngpus, o->wait, print_waiting};
    char why[4096];
    int fd = ga_gpus_reserve(&req, o->gpus_held, sizeof(o->gpus_held), why, sizeof(why));
    if (fd >= 0) {
        o->gpus = o->gpus_held;
        return fd;
    }
    fprintf(stderr, "gpusync-agent launch: %s\n", why);
    return -1 - (fd == GA_GPUS_BUSY ? GS_PROTO_RUN_EXIT_BUSY : 1);
}

int ga_launch_main(int argc, char **argv)
{
    struct launch_opts o;
    if (opts_parse(&o, argc, argv) < 0)
        return 2;
    /* Before the run directory: a launch refused or given up leaves nothing behind. */
    int choosing = reserve_gpus(&o);
    if (choosing < -1)
        return -1 - choosing;
    if (make_run_dir(&o) < 0)
        return 1;
    if (o.master_port == 0 && (o.master_port = pick_free_port()) < 0) {
        fprintf(stderr, "gpusync-agent launch: cannot find a free port: %s\n", strerror(errno));
        return 1;
    }
    o.agent_pid = getpid();
    char why[512];
    int code;
    long pid = start_supervisor(&o, why, sizeof(why), &code);
    if (choosing >= 0)
        close(choosing); /* the supervisor holds the GPUs now (or never will) */
    if (pid < 0) {
        fprintf(stderr, "gpusync-agent launch: run %s did not start: %s\n", o.id, why);
        print_not_started(code);
        return 1;
    }
    /* The agent's own path comes last: a client that ran whichever build was cached uses it for
     * its later commands (tail after a reconnect, stop). */
    char exe[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[n > 0 ? n : 0] = '\0';
    char line[PATH_MAX + 160];
    if (o.gpus && gs_proto_run_gpus_format(line, sizeof(line), o.gpus) > 0)
        fputs(line, stdout);
    if (gs_proto_run_started_format(line, sizeof(line), o.id, pid, o.master_port, exe) < 0 ||
        fputs(line, stdout) < 0 || fflush(stdout) != 0)
        return 1;
    return o.follow ? follow_logs(&o) : 0;
}

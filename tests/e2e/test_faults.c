/* tests/e2e/test_faults.c: randomised fault test of `gpusync watch` (issue 11). Each sequence is a
 * fresh project synced through the WAN simulator to the sandbox sshd, a seeded mix of random file
 * operations (fixtures/tree.h) and faults injected between them: a concurrent `gpusync push`
 * SIGKILLed part-way, the watch daemon SIGKILLed or stopped with `watch --stop` (and restarted with
 * `watch -d`; a stop that says it left nothing unsent must leave the trees equal), sshd killed with
 * every session below it (agents included; then restarted), the link stalled then resumed, the link
 * cut then restored, a file gpusync wrote deleted on the server behind its back (and the record of
 * what the agent last checked there garbled). A sequence ends with `gpusync flush` (exit 0 wanted),
 * `status --json` (state up_to_date), an exact comparison of both trees (kind, mode, size, bytes,
 * symlink targets), and, once every server process of the project has ended, the comparison again
 * (a write that lands after the flush) and a search of the remote root for `.gpusync-tmp-*` and
 * `*.gpusync-conflict-*` (nobody edits the server here, so every conflict copy is unexplained).
 * Every sequence runs even when an earlier one failed; one line per sequence, a summary table at
 * the end, and the test fails if any sequence did.
 *
 * Environment: GS_FAULT_SEQUENCES (default 5; 1 when GS_TEST_SEED is set), GS_FAULT_OPS (random
 * operations per sequence, default 40), GS_TEST_SEED (sequence k runs seed+k), GS_FAULT_KINDS (a
 * subset, e.g. "stall,cut"; names: push-kill daemon-kill sshd-kill stall cut daemon-stop
 * server-delete, any
 * unique prefix; a planned fault of another kind becomes one of these, at the same place),
 * GS_TEST_KEEP=1 (keep every project folder) or =failed (keep failed ones), GS_TEST_OPLOG=FILE (log
 * the operations). The operations, the faults, where they fall in the sequence and how long they
 * last follow from the seed alone (the faults draw from their own stream, so GS_FAULT_KINDS leaves
 * the operations, and the faults of the kinds it keeps, as they were); what the daemon has sent
 * when a fault hits is timing, and is not. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"
#include "wansim_harness.h"

#define ARGS(...)       ((const char *const[]){__VA_ARGS__, NULL})
#define CMD_TIMEOUT_MS  120000 /* any one gpusync command; past it the command is a failure */
#define FLUSH_TIMEOUT_S "60"
#define QUIET_LIMIT_MS  20000 /* for the server's processes to end once the client left */
#define MAX_FAULTS      64

static struct gs_test_sshd sshd;

/* ---- faults ---- */

enum fault_kind { F_PUSH, F_DAEMON, F_SSHD, F_STALL, F_CUT, F_STOP, F_TAMPER, F_KINDS };
static const char *const fault_names[F_KINDS] = {
    "push-kill", "daemon-kill", "sshd-kill", "stall", "cut", "daemon-stop", "server-delete"};

/* One fault as the seed plans it: where it falls and how long its phases last. */
struct fault {
    int at_op;            /* injected before this operation */
    enum fault_kind kind; /* what */
    int d1_ms, d2_ms;     /* phase lengths (see fault_step) */
    unsigned burst_seed;  /* the files written just before a kill */
};

/* Settings from the environment. */
struct settings {
    int sequences, ops;
    unsigned seed;
    unsigned kinds; /* bit per enum fault_kind */
    const char *keep;
};
static struct settings set;

/* One sequence: its project, its link, the fault under way and what it found. */
struct seq {
    unsigned seed, ops_rng;
    char base[256], local[512], remote[512];
    struct wansim_proc wan;
    struct fault plan[MAX_FAULTS];
    int n_plan, next_fault;
    struct fault *active; /* the fault under way, or NULL */
    int phase;            /* its phase: 0 not started, then 1, 2 */
    int64_t next_at;      /* when its next phase begins */
    pid_t push_pid;       /* the concurrent push, while it runs */
    int daemon_down;      /* we killed the daemon and have not restarted it */
    int injected[F_KINDS];
    struct gs_buf faults_text; /* "stall@12/2.3s sshd-kill@30/0.8s" */
    /* findings */
    struct gs_buf problems;
    int failed, mismatch, flush_failed, not_up_to_date, late_write, tmp, conflicts, lingering;
    int false_stop;       /* `watch --stop` said nothing was left unsent, and the trees differed */
    int64_t slowest_stop; /* ms, the longest `watch --stop` of the sequence */
};
static struct seq cur;

/* Totals over the run, for the summary table. */
struct totals {
    int sequences, failed, ops, injected[F_KINDS];
    int mismatches, flush_failures, not_up_to_date, late_writes, tmp_seqs, tmp_files;
    int conflict_seqs, conflict_files, lingering, stops, false_stops;
    int64_t slowest_stop;
    struct gs_buf failed_seeds, mismatch_seeds, tmp_seeds, conflict_seeds, false_stop_seeds;
};

/* ---- running gpusync ---- */

/* Starts gpusync `args` in the project, stdin /dev/null, in its own session. With `log` set,
 * stdout and stderr go there (append); otherwise into the pipes *out_fd and *err_fd. */
static pid_t spawn_gpusync(const char *const *args, const char *log, int *out_fd, int *err_fd)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (!log) {
        assert_int_equal(pipe2(out, O_CLOEXEC), 0);
        assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setsid();
        if (chdir(cur.local) != 0)
            _exit(126);
        int null = open("/dev/null", O_RDONLY);
        int logfd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
        dup2(null, 0);
        dup2(log ? logfd : out[1], 1);
        dup2(log ? logfd : err[1], 2);
        const char *argv[32] = {gs_test_gpusync()};
        for (int n = 1; args[n - 1] && n < 31; n++)
            argv[n] = args[n - 1];
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (!log) {
        close(out[1]);
        close(err[1]);
        *out_fd = out[0];
        *err_fd = err[0];
    }
    return pid;
}

/* Runs gpusync `args` in the project and returns what it printed and its status; a command that
 * runs past CMD_TIMEOUT_MS is killed and reads as status 124 (a finding, not a harness error). */
static struct gs_test_result gs_run(const char *const *args)
{
    struct gs_test_result r = {0, GS_BUF_INIT, GS_BUF_INIT, 0};
    int out, err, status;
    pid_t pid = spawn_gpusync(args, NULL, &out, &err);
    int timed_out = gs_test_drain_until(out, err, &r, gs_clock_mono_ms() + CMD_TIMEOUT_MS) < 0;
    if (timed_out)
        kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    r.status = timed_out ? 124 : gs_test_exit_status(status);
    gs_buf_grow(&r.out, 0);
    gs_buf_grow(&r.err, 0);
    return r;
}

/* ---- findings ---- */

static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...)
{
    va_list ap;
    if (cur.problems.len)
        gs_buf_adds(&cur.problems, "; ");
    va_start(ap, fmt);
    gs_buf_vaddf(&cur.problems, fmt, ap);
    va_end(ap);
    cur.failed = 1;
}

/* The first line of `s` (at most 200 bytes), for a one-line report. */
static const char *first_line(const char *s, char *out, size_t size)
{
    size_t n = s ? strcspn(s, "\n") : 0;
    snprintf(out, size, "%.*s", (int)n, s ? s : "");
    return out;
}

/* Runs gpusync `args` and records a problem unless it exits 0. Returns its status. */
static int gs_expect_ok(const char *const *args, const char *what)
{
    struct gs_test_result r = gs_run(args);
    char line[256];
    if (r.status != 0)
        problem("%s: exit %d (%s)", what, r.status,
                first_line(r.err.len ? r.err.data : r.out.data, line, sizeof(line)));
    int status = r.status;
    gs_test_result_release(&r);
    return status;
}

/* ---- the project and its daemon ---- */

/* The pid in the project's daemon lock if that process lives, else 0. */
static pid_t daemon_pid(void)
{
    pid_t pid = gs_test_daemon_lock_pid(cur.local);
    return pid > 0 && kill(pid, 0) == 0 ? pid : 0;
}

static void write_random_file(const char *abs, unsigned *rng, size_t size)
{
    int fd = open(abs, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return; /* a directory there, or no parent: the burst skips it */
    char *data = malloc(size);
    for (size_t k = 0; k < size; k++)
        data[k] = (char)rand_r(rng);
    if (write(fd, data, size) != (ssize_t)size) {
        /* a full disk would show as a tree difference */
    }
    close(fd);
    free(data);
}

/* Writes `min` to 2*min-1 files of `min_kib` to 11*min_kib KiB at random paths of the operations'
 * namespace, so that a kill finds transfers under way and later operations rename and delete what
 * the burst placed. */
static void burst(unsigned seed, int min, unsigned min_kib)
{
    int n = min + (int)gs_test_rnd(&seed, (unsigned)min);
    for (int i = 0; i < n; i++) {
        char rel[128], abs[700];
        gs_test_random_path(&seed, rel, sizeof(rel), 0);
        snprintf(abs, sizeof(abs), "%s/%s", cur.local, rel);
        write_random_file(abs, &seed, (min_kib + gs_test_rnd(&seed, 10 * min_kib + 1)) * 1024);
    }
}

static void wan_command(const char *cmd)
{
    char reply[256];
    if (wansim_command(&cur.wan, cmd, reply, sizeof(reply)) != 0)
        fail_msg("wansim %s: %s", cmd, reply);
}

static void daemon_start(const char *what)
{
    gs_expect_ok(ARGS("watch", "-d"), what);
}

/* ---- the fault schedule ---- */

/* The (r mod n)th of the kinds GS_FAULT_KINDS selected. */
static enum fault_kind selected_kind(unsigned r)
{
    int n = 0, pick;
    for (int i = 0; i < F_KINDS; i++)
        n += (set.kinds >> i) & 1;
    pick = (int)(r % (unsigned)n);
    for (int i = 0; i < F_KINDS; i++)
        if (((set.kinds >> i) & 1) && pick-- == 0)
            return (enum fault_kind)i;
    return F_STALL;
}

/* Plans 1 to ops/13+1 faults at distinct operations, from the seed's fault stream. */
static void plan_faults(unsigned seed)
{
    unsigned rng = seed ^ 0x9e3779b9u;
    int max = set.ops / 13 + 1, n = 1 + (int)gs_test_rnd(&rng, (unsigned)max);
    cur.n_plan = 0;
    for (int i = 0; i < n && i < MAX_FAULTS; i++) {
        struct fault *f = &cur.plan[cur.n_plan++];
        f->at_op = (int)gs_test_rnd(&rng, (unsigned)set.ops);
        f->kind = (enum fault_kind)gs_test_rnd(&rng, F_KINDS);
        f->d1_ms = 500 + (int)gs_test_rnd(&rng, 5501); /* outage 0.5-6 s */
        f->d2_ms = (int)gs_test_rnd(&rng, 1001);
        f->burst_seed = (unsigned)rand_r(&rng);
        if (!((set.kinds >> f->kind) & 1)) /* excluded: one of the selected kinds instead */
            f->kind = selected_kind(f->burst_seed);
    }
    /* in operation order (insertion sort: a handful of entries) */
    for (int i = 1; i < cur.n_plan; i++)
        for (int j = i; j > 0 && cur.plan[j].at_op < cur.plan[j - 1].at_op; j--) {
            struct fault t = cur.plan[j];
            cur.plan[j] = cur.plan[j - 1];
            cur.plan[j - 1] = t;
        }
}

/* Starts fault `f` and says when its next phase is due. Every kind starts with a burst of
 * writes, so that the fault tends to find transfers under way; its random delay places it. The
 * phases:
 *   push-kill:   a bigger burst (about 3.5 MB, 0.7 s at the link's 40 Mbit/s, which the daemon
 *                shares), start `gpusync push`; after 100 + 1.5 * d2 ms (up to 1.6 s) SIGKILL it.
 *   daemon-kill: burst; after d2 ms SIGKILL the daemon; d1 ms later `watch -d` again.
 *   daemon-stop: the same with `watch --stop`, whose word is checked (stop_daemon_checked).
 *   sshd-kill:   burst; after d2 ms SIGKILL sshd and all below it; d1 ms later restart it.
 *   stall, cut:  burst; after d2 / 4 ms stall (cut) the link; d1 ms later resume (restore) it. */
static void fault_begin(struct fault *f, int op)
{
    int64_t now = gs_clock_mono_ms();
    cur.active = f;
    cur.phase = 1;
    cur.injected[f->kind]++;
    gs_buf_addf(&cur.faults_text, "%s%s@%d", cur.faults_text.len ? " " : "", fault_names[f->kind],
                op);
    if (f->kind == F_PUSH) {
        char log[600];
        burst(f->burst_seed, 3, 96);
        snprintf(log, sizeof(log), "%s/push.log", cur.base);
        cur.push_pid = spawn_gpusync(ARGS("push"), log, NULL, NULL);
        cur.next_at = now + 100 + f->d2_ms * 3 / 2;
        return;
    }
    burst(f->burst_seed, 2, 32);
    cur.next_at = now + (f->kind == F_STALL || f->kind == F_CUT ? f->d2_ms / 4 : f->d2_ms);
}

/* Kills the concurrent push; notes whether it had already finished. */
static void push_kill(void)
{
    int status;
    int done = waitpid(cur.push_pid, &status, WNOHANG) == cur.push_pid;
    if (!done) {
        kill(cur.push_pid, SIGKILL);
        assert_int_equal(waitpid(cur.push_pid, &status, 0), cur.push_pid);
    }
    if (done)
        gs_buf_addf(&cur.faults_text, "(push had ended: exit %d)", gs_test_exit_status(status));
    cur.push_pid = 0;
}

static int check_trees(const char *when);

/* `watch --stop` in the middle of the operations, perhaps of a batch: it must stop the daemon
 * (exit 0), and what it says must hold: when it left nothing unsent and had checked every file,
 * the server matches the project right now (nothing was written since). */
static void stop_daemon_checked(void)
{
    int64_t start = gs_clock_mono_ms();
    struct gs_test_result r = gs_run(ARGS("watch", "--stop", "--json"));
    int64_t ms = gs_clock_mono_ms() - start;
    cur.slowest_stop = ms > cur.slowest_stop ? ms : cur.slowest_stop;
    json_t *o = r.status == 0 ? json_loads(r.out.data, 0, NULL) : NULL;
    json_int_t unsent = json_integer_value(json_object_get(o, "unsent"));
    int unchecked = json_is_true(json_object_get(o, "unchecked"));
    char line[256];
    if (!json_is_true(json_object_get(o, "was_running")))
        problem("watch --stop: exit %d (%s)", r.status,
                first_line(r.err.len ? r.err.data : r.out.data, line, sizeof(line)));
    else if (!unsent && !unchecked && check_trees("after watch --stop said nothing was unsent"))
        cur.false_stop = 1;
    gs_buf_addf(&cur.faults_text, "(%.1f s, unsent %lld%s)", ms / 1000.0, (long long)unsent,
                unchecked ? ", unchecked" : "");
    json_decref(o);
    gs_test_result_release(&r);
}

/* What a user or a job does on the server behind gpusync's back: deletes one of the files gpusync
 * wrote there (the (seed mod n)th in path order), and with every other seed also garbles the list
 * the agent saved of what it checked (.gpusync/check-kept: a server whose record lies). The
 * final flush must put the file back (syncd/verify.h) with no conflict copy: nothing was edited. */
static void server_delete(unsigned seed)
{
    char cmd[1400];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && f=$(find . -path ./.gpusync -prune -o -type f ! -name '*.gpusync-*' "
             "-print | LC_ALL=C sort | awk -v k=%u 'NR == 1 {n = 0} {a[n++] = $0} END "
             "{if (n) print a[k %% n]}') && if [ -n \"$f\" ]; then rm -f \"$f\"; fi%s",
             cur.remote, seed / 2,
             seed & 1 ? " && if [ -f .gpusync/check-kept ]; then echo garbage > "
                        ".gpusync/check-kept; fi"
                      : "");
    if (gs_test_sh("%s", cmd) != 0)
        problem("server-delete: the shell failed");
    gs_buf_addf(&cur.faults_text, "%s", seed & 1 ? "(and its record garbled)" : "");
}

/* Injects the fault (phase 1 of every kind but push-kill). */
static void fault_inject(struct fault *f)
{
    pid_t pid;
    switch (f->kind) {
    case F_DAEMON:
        if ((pid = daemon_pid()) > 0) {
            kill(pid, SIGKILL);
            gs_test_await_gone(pid);
        } else {
            problem("no daemon ran when daemon-kill came");
        }
        cur.daemon_down = 1;
        break;
    case F_STOP:
        if ((pid = daemon_pid()) > 0) {
            stop_daemon_checked();
            gs_test_await_gone(pid);
        } else {
            problem("no daemon ran when daemon-stop came");
        }
        cur.daemon_down = 1;
        break;
    case F_SSHD:
        gs_test_sshd_kill(&sshd);
        break;
    case F_STALL:
    case F_CUT:
        wan_command(f->kind == F_STALL ? "stall" : "cut");
        break;
    case F_TAMPER:
        server_delete(f->burst_seed);
        break;
    default:
        break;
    }
    gs_buf_addf(&cur.faults_text, "/%.1fs", f->d1_ms / 1000.0);
}

/* Ends the fault (its last phase). */
static void fault_heal(struct fault *f)
{
    switch (f->kind) {
    case F_PUSH:
        push_kill();
        break;
    case F_DAEMON:
    case F_STOP:
        cur.daemon_down = 0;
        daemon_start(f->kind == F_STOP ? "watch -d after watch --stop"
                                       : "watch -d after the daemon was killed");
        break;
    case F_SSHD:
        if (gs_test_sshd_restart(&sshd, 0) != 0)
            fail_msg("sshd did not restart");
        break;
    case F_STALL:
        wan_command("resume");
        break;
    case F_CUT:
        wan_command("restore");
        break;
    default:
        break;
    }
    gs_test_clear_stale_pyenv_lock(); /* shells the fault killed (see sshd.h) */
}

/* Runs the active fault's next phase. */
static void fault_step(void)
{
    struct fault *f = cur.active;
    if (f->kind != F_PUSH && cur.phase == 1) {
        fault_inject(f);
        cur.phase = 2;
        cur.next_at = gs_clock_mono_ms() + f->d1_ms;
        return;
    }
    fault_heal(f);
    cur.active = NULL;
}

/* Sleeps up to `ms`, running the active fault's phases when they fall due. */
static void pause_ms(int ms)
{
    int64_t end = gs_clock_mono_ms() + ms;
    for (;;) {
        int64_t now = gs_clock_mono_ms();
        if (cur.active && now >= cur.next_at) {
            fault_step();
            continue;
        }
        if (now >= end)
            return;
        int64_t until = cur.active && cur.next_at < end ? cur.next_at : end;
        usleep((useconds_t)(until - now) * 1000); /* the test's pacing, not synchronisation */
    }
}

/* Finishes the active fault: its remaining phases run at their planned times. */
static void fault_finish(void)
{
    while (cur.active)
        pause_ms((int)(cur.next_at - gs_clock_mono_ms()) + 1);
}

/* Injects the planned faults that fall before operation `op` (one at a time: a fault due while
 * another is under way waits for it to finish). */
static void faults_before(int op)
{
    while (cur.next_fault < cur.n_plan && cur.plan[cur.next_fault].at_op <= op) {
        struct fault *f = &cur.plan[cur.next_fault++];
        fault_finish();
        fault_begin(f, op);
    }
}

/* ---- one sequence ---- */

static void seq_begin(unsigned seed)
{
    memset(&cur, 0, sizeof(cur));
    cur.seed = cur.ops_rng = seed;
    gs_buf_init(&cur.faults_text);
    gs_buf_init(&cur.problems);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(cur.base, sizeof(cur.base), "%s/gs-e2e-faults.XXXXXX", tmp);
    assert_non_null(mkdtemp(cur.base));
    snprintf(cur.local, sizeof(cur.local), "%s/proj", cur.base);
    snprintf(cur.remote, sizeof(cur.remote), "%s/remote", cur.base);
    assert_int_equal(mkdir(cur.local, 0755), 0);
    char err[256];
    unsigned rng = seed ^ 0x5bd1e995u;
    struct wansim_opts o = {
        .target_port = sshd.port, .delay_ms = 5 + gs_test_rnd(&rng, 6), .rate_mbit = 40};
    if (wansim_start(&cur.wan, &o, err, sizeof(err)) != 0)
        fail_msg("wansim: %s", err);
    plan_faults(seed);
}

/* A project with a few directories and files, initialised through the link, watched, flushed. */
static void seq_setup(void)
{
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", cur.wan.port);
    struct gs_test_result r =
        gs_run(ARGS("init", target, "--path", cur.remote, "--accept-new-host-key"));
    if (r.status != 0)
        fail_msg("gpusync init: exit %d: %s", r.status, r.err.data);
    gs_test_result_release(&r);
    assert_int_equal(gs_test_sh("cd '%s' && mkdir -p d0/s0 d1/s1 d2", cur.local), 0);
    for (int i = 0; i < 10; i++)
        gs_test_random_op(cur.local, &cur.ops_rng, -1 - i);
    daemon_start("watch -d");
    gs_expect_ok(ARGS("flush", "--timeout", FLUSH_TIMEOUT_S), "first flush");
}

/* The operations with the faults between them, paced by random pauses (0-60 ms). */
static void seq_run(void)
{
    unsigned pace = cur.seed ^ 0x1b873593u;
    for (int i = 0; i < set.ops; i++) {
        faults_before(i);
        gs_test_random_op(cur.local, &cur.ops_rng, i);
        pause_ms((int)gs_test_rnd(&pace, 61));
    }
    fault_finish();
}

/* `gpusync status --json` must say up_to_date. */
static void check_status(void)
{
    struct gs_test_result r = gs_run(ARGS("status", "--json"));
    json_error_t jerr;
    json_t *st = r.status == 0 ? json_loads(r.out.data, 0, &jerr) : NULL;
    const char *state = st ? json_string_value(json_object_get(st, "state")) : NULL;
    if (!state || strcmp(state, "up_to_date") != 0) {
        char line[4096];
        cur.not_up_to_date = 1;
        problem("status --json after the flush: %s",
                first_line(r.out.len ? r.out.data : r.err.data, line, sizeof(line)));
    }
    json_decref(st);
    gs_test_result_release(&r);
}

/* Compares the trees; `when` names the moment in the report. Returns the number of differences. */
static int check_trees(const char *when)
{
    struct gs_buf msg = GS_BUF_INIT;
    int n = gs_test_tree_diff(cur.local, cur.remote,
                              GS_TEST_TREE_ALL | GS_TEST_TREE_NO_DEBRIS | GS_TEST_TREE_MTIME, &msg);
    if (n)
        problem("%s: %d difference%s: %.600s%s", when, n, n == 1 ? "" : "s", msg.data,
                msg.len > 600 ? "..." : "");
    gs_buf_release(&msg);
    return n;
}

/* Stops the daemon and waits (bounded) until no process runs below sshd: whatever an old session
 * still had to write has landed. Processes still there are noted and killed. */
static void quiesce(void)
{
    struct gs_test_result r = gs_run(ARGS("watch", "--stop"));
    gs_test_result_release(&r);
    pid_t pid = daemon_pid();
    if (pid > 0) {
        kill(pid, SIGKILL);
        gs_test_await_gone(pid);
    }
    int64_t end = gs_clock_mono_ms() + QUIET_LIMIT_MS;
    int n;
    while ((n = gs_test_sshd_descendants(&sshd)) > 0 && gs_clock_mono_ms() < end)
        usleep(50000); /* polling process exits, with a deadline */
    if (n > 0) {
        cur.lingering = n;
        gs_test_sshd_kill(&sshd);
        if (gs_test_sshd_restart(&sshd, 0) != 0)
            fail_msg("sshd did not restart");
    }
}

/* Leftovers anywhere under the remote root. */
static void check_debris(void)
{
    struct gs_buf list = GS_BUF_INIT;
    if ((cur.tmp = gs_test_tree_debris(cur.remote, ".gpusync-tmp-", &list)))
        problem("%d temporar%s left: %s", cur.tmp, cur.tmp == 1 ? "y" : "ies", list.data);
    gs_buf_reset(&list);
    if ((cur.conflicts = gs_test_tree_debris(cur.remote, ".gpusync-conflict-", &list)))
        problem("%d unexplained conflict cop%s: %s", cur.conflicts,
                cur.conflicts == 1 ? "y" : "ies", list.data);
    gs_buf_release(&list);
}

/* Makes sure a daemon runs, flushes, and checks everything the sequence must end with. */
static void seq_check(void)
{
    gs_test_clear_stale_pyenv_lock(); /* a shell killed late by a fault (see sshd.h) */
    if (!daemon_pid()) {
        problem("no daemon running at the end (it died without being killed)");
        daemon_start("watch -d at the end");
    }
    if (gs_expect_ok(ARGS("flush", "--timeout", FLUSH_TIMEOUT_S), "final flush") != 0)
        cur.flush_failed = 1;
    check_status();
    cur.mismatch = check_trees("after the flush") > 0;
    quiesce();
    if (!cur.mismatch && check_trees("once the server's processes ended (a late write)"))
        cur.late_write = 1;
    check_debris();
}

/* Stops what the sequence started and removes its folder (kept if GS_TEST_KEEP says so). */
static void seq_end(void)
{
    if (cur.push_pid > 0) {
        kill(cur.push_pid, SIGKILL);
        waitpid(cur.push_pid, NULL, 0);
    }
    if (cur.local[0]) {
        pid_t pid = daemon_pid();
        if (pid > 0)
            kill(pid, SIGKILL);
    }
    if (cur.wan.pid)
        wansim_stop(&cur.wan);
    if (sshd.pid <= 0 && gs_test_sshd_restart(&sshd, 0) != 0)
        fprintf(stderr, "sshd did not restart\n");
    int keep = set.keep && (!strcmp(set.keep, "1") || (cur.failed && !strcmp(set.keep, "failed")));
    if (cur.base[0] && !keep)
        gs_test_sh("rm -rf '%s'", cur.base);
    gs_buf_release(&cur.faults_text);
    gs_buf_release(&cur.problems);
    memset(&cur, 0, sizeof(cur));
}

/* ---- the report ---- */

static void seq_report(int k, int64_t ms)
{
    char counts[256];
    int len = 0;
    for (int i = 0; i < F_KINDS; i++)
        len += snprintf(counts + len, sizeof(counts) - (size_t)len, "%s%s=%d", i ? " " : "",
                        fault_names[i], cur.injected[i]);
    char kept[300] = "";
    if (set.keep && (cur.failed || !strcmp(set.keep, "1")))
        snprintf(kept, sizeof(kept), " (kept in %s)", cur.base);
    print_message(
        "seq %d/%d seed %u: %d ops, faults %s [%s], %.1f s: %s%s%s%s\n", k + 1, set.sequences,
        cur.seed, set.ops, counts, cur.faults_text.len ? cur.faults_text.data : "none", ms / 1000.0,
        cur.failed ? "FAIL: " : "ok", cur.failed ? cur.problems.data : "",
        cur.lingering ? "; note: server processes still ran 20 s after the client left" : "", kept);
    if (cur.failed)
        print_message("    replay: GS_TEST_SEED=%u GS_FAULT_SEQUENCES=1 GS_FAULT_OPS=%d%s%s\n",
                      cur.seed, set.ops, getenv("GS_FAULT_KINDS") ? " GS_FAULT_KINDS=" : "",
                      getenv("GS_FAULT_KINDS") ? getenv("GS_FAULT_KINDS") : "");
}

static void seed_to(struct gs_buf *b, unsigned seed)
{
    gs_buf_addf(b, "%s%u", b->len ? " " : "", seed);
}

static void tally(struct totals *t)
{
    t->sequences++;
    t->ops += set.ops;
    for (int i = 0; i < F_KINDS; i++)
        t->injected[i] += cur.injected[i];
    t->failed += cur.failed;
    t->flush_failures += cur.flush_failed;
    t->not_up_to_date += cur.not_up_to_date;
    t->late_writes += cur.late_write;
    t->lingering += cur.lingering > 0;
    t->stops += cur.injected[F_STOP];
    t->slowest_stop = cur.slowest_stop > t->slowest_stop ? cur.slowest_stop : t->slowest_stop;
    if (cur.false_stop) {
        t->false_stops++;
        seed_to(&t->false_stop_seeds, cur.seed);
    }
    if (cur.failed)
        seed_to(&t->failed_seeds, cur.seed);
    if (cur.mismatch || cur.late_write) {
        t->mismatches++;
        seed_to(&t->mismatch_seeds, cur.seed);
    }
    if (cur.tmp) {
        t->tmp_seqs++;
        t->tmp_files += cur.tmp;
        seed_to(&t->tmp_seeds, cur.seed);
    }
    if (cur.conflicts) {
        t->conflict_seqs++;
        t->conflict_files += cur.conflicts;
        seed_to(&t->conflict_seeds, cur.seed);
    }
}

static const char *or_none(const struct gs_buf *b)
{
    return b->len ? b->data : "-";
}

static void print_summary(const struct totals *t)
{
    print_message("\nfault sequences: summary\n");
    print_message("  %-34s %d (%d operations)\n", "sequences", t->sequences, t->ops);
    for (int i = 0; i < F_KINDS; i++)
        print_message("  faults injected: %-17s %d\n", fault_names[i], t->injected[i]);
    print_message("  %-34s %d  seeds: %s\n", "sequences failed", t->failed,
                  or_none(&t->failed_seeds));
    print_message("  %-34s %d  seeds: %s\n", "tree mismatches", t->mismatches,
                  or_none(&t->mismatch_seeds));
    print_message("  %-34s %d\n", "  of which late writes", t->late_writes);
    print_message("  %-34s %d\n", "final flush failed", t->flush_failures);
    print_message("  %-34s %d\n", "status not up_to_date", t->not_up_to_date);
    print_message("  %-34s %d in %d sequences  seeds: %s\n", "temporaries left", t->tmp_files,
                  t->tmp_seqs, or_none(&t->tmp_seeds));
    print_message("  %-34s %d in %d sequences  seeds: %s\n", "unexplained conflicts",
                  t->conflict_files, t->conflict_seqs, or_none(&t->conflict_seeds));
    print_message("  %-34s %d  seeds: %s\n", "stop said 'nothing unsent', wrongly", t->false_stops,
                  or_none(&t->false_stop_seeds));
    if (t->stops)
        print_message("  %-34s %.1f s\n", "slowest watch --stop", t->slowest_stop / 1000.0);
    print_message("  %-34s %d (noted, not a failure)\n", "server processes lingering",
                  t->lingering);
}

/* ---- settings ---- */

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : def;
}

/* GS_FAULT_KINDS: a comma-separated list of kinds (unique prefixes allowed). */
static unsigned parse_kinds(const char *list)
{
    if (!list || !*list)
        return (1u << F_KINDS) - 1;
    unsigned mask = 0;
    char copy[256], *save = NULL;
    snprintf(copy, sizeof(copy), "%s", list);
    for (char *tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        int hit = -1;
        for (int i = 0; i < F_KINDS; i++)
            if (!strncmp(fault_names[i], tok, strlen(tok)))
                hit = hit == -1 ? i : -2;
        if (hit < 0)
            fail_msg("GS_FAULT_KINDS: '%s' is %s (kinds: push-kill daemon-kill sshd-kill stall "
                     "cut daemon-stop server-delete)",
                     tok, hit == -1 ? "unknown" : "ambiguous");
        mask |= 1u << hit;
    }
    return mask;
}

static void read_settings(void)
{
    const char *seed = getenv("GS_TEST_SEED");
    set.seed = seed ? (unsigned)strtoul(seed, NULL, 10) : (unsigned)time(NULL);
    set.sequences = env_int("GS_FAULT_SEQUENCES", seed ? 1 : 5);
    set.ops = env_int("GS_FAULT_OPS", 40);
    set.kinds = parse_kinds(getenv("GS_FAULT_KINDS"));
    set.keep = getenv("GS_TEST_KEEP");
}

/* ---- the test ---- */

static void test_faults__random_sequences_converge(void **state)
{
    (void)state;
    read_settings();
    print_message("fault sequences: %d x %d operations, seeds %u..%u, kinds %s\n", set.sequences,
                  set.ops, set.seed, set.seed + (unsigned)set.sequences - 1,
                  getenv("GS_FAULT_KINDS") ? getenv("GS_FAULT_KINDS") : "all");
    struct totals t = {0};
    for (int k = 0; k < set.sequences; k++) {
        int64_t start = gs_clock_mono_ms();
        seq_begin(set.seed + (unsigned)k);
        seq_setup();
        seq_run();
        seq_check();
        seq_report(k, gs_clock_mono_ms() - start);
        tally(&t);
        seq_end();
    }
    print_summary(&t);
    int failed = t.failed;
    char seeds[512];
    snprintf(seeds, sizeof(seeds), "%s", or_none(&t.failed_seeds));
    gs_buf_release(&t.failed_seeds);
    gs_buf_release(&t.mismatch_seeds);
    gs_buf_release(&t.tmp_seeds);
    gs_buf_release(&t.conflict_seeds);
    gs_buf_release(&t.false_stop_seeds);
    if (failed)
        fail_msg("%d of %d fault sequences failed (seeds %s)", failed, set.sequences, seeds);
}

static int test_teardown(void **state)
{
    (void)state;
    if (cur.base[0]) /* a harness failure left a sequence behind */
        seq_end();
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return gs_test_sshd_start_for_cli(&sshd) != 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&sshd);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_faults__random_sequences_converge, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

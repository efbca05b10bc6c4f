/* tests/e2e/test_cli_basic.c: the built `gpusync` binary run as a user would, without a terminal,
 * against the sandbox sshd: init (host-key policy, --install-key), exec (exit codes, signals,
 * arguments, streams), doctor --json, and the command table (--help, prefixes, errors); and
 * foreground watch's status line, on a pseudo-terminal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/error.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"

#define PW_USER        "gsuser"
#define PW_PASSWORD    "Gs-E2e-Pw-73"
#define RUN_TIMEOUT_MS 60000

static struct gs_test_sshd shared; /* key auth, for init/exec/doctor */
static char project[600];          /* a local project directory initialised against `shared` */
static char remote_dir[700];       /* its remote directory (same machine) */

/* Runs gpusync in `cwd` with `args`, `env` ("K=V" to set, "K" to unset) and `input` on stdin,
 * without a controlling terminal, as in CI or a pipe. */
static struct gs_test_result run_gpusync(const char *cwd, const char *const *env, const char *input,
                                         const char *const *args)
{
    return gs_test_run_gpusync(cwd, env, input, args, RUN_TIMEOUT_MS);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static int count_lines_with(const char *path, const char *needle)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), fp))
        n += strstr(line, needle) != NULL;
    fclose(fp);
    return n;
}

static void make_dir(char *out, size_t size, const char *tmpl)
{
    snprintf(out, size, "%s", tmpl);
    assert_non_null(mkdtemp(out));
}

static const char *target_of(const struct gs_test_sshd *d, const char *user)
{
    static char t[128];
    snprintf(t, sizeof(t), "%s@127.0.0.1:%d", user, d->port);
    return t;
}

/* ---- group: one key-auth server and one project initialised against it ---- */

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&shared) != 0)
        return -1;
    snprintf(project, sizeof(project), "%s/work/my project", shared.dir);
    snprintf(remote_dir, sizeof(remote_dir), "%s/remote proj", shared.dir);
    if (gs_test_sh("mkdir -p '%s'", project) != 0)
        return -1;
    struct gs_test_result r = run_gpusync(
        project, NULL, NULL, ARGS("init", target_of(&shared, "root"), "--path", remote_dir));
    int ok = r.status == 0;
    if (!ok)
        fprintf(stderr, "init failed (%d): %s%s\n", r.status, r.out.data, r.err.data);
    gs_test_result_release(&r);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&shared);
    return 0;
}

static int use_shared_home(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 1);
    return 0;
}

/* ---- command table ---- */

static void test_cli__help_lists_the_commands(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS("--help"));
    gs_test_expect_status(&r, 0, "gpusync --help");
    assert_non_null(strstr(r.out.data, "usage: gpusync"));
    assert_non_null(strstr(r.out.data, "init"));
    assert_non_null(strstr(r.out.data, "exec"));
    assert_non_null(strstr(r.out.data, "doctor"));
    gs_test_result_release(&r);
    r = run_gpusync(NULL, NULL, NULL, ARGS("help", "exec"));
    gs_test_expect_status(&r, 0, "gpusync help exec");
    assert_non_null(strstr(r.out.data, "usage: gpusync exec"));
    gs_test_result_release(&r);
}

static void test_cli__unique_prefix_runs_the_command_help(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS("in", "--help"));
    gs_test_expect_status(&r, 0, "gpusync in --help");
    assert_non_null(strstr(r.out.data, "usage: gpusync init"));
    assert_non_null(strstr(r.out.data, "--install-key"));
    gs_test_result_release(&r);
    r = run_gpusync(NULL, NULL, NULL, ARGS("doctor", "--help"));
    gs_test_expect_status(&r, 0, "gpusync doctor --help");
    assert_non_null(strstr(r.out.data, "--json"));
    gs_test_result_release(&r);
}

/* Prefixes are matched against help too, and an alias is exact: `st` stays status (its alias),
 * `h` is ambiguous (hosts, help: it ran hosts), `he` is help (it was unknown), `help --help`
 * prints the overview (it was "unknown command"), and "" is unknown, not ambiguous. */
static void test_cli__prefixes_count_help_and_aliases_are_exact(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS("st", "--help"));
    gs_test_expect_status(&r, 0, "gpusync st --help");
    assert_true(r.out.data && strncmp(r.out.data, "usage: gpusync status", 21) == 0);
    gs_test_result_release(&r);
    r = run_gpusync(NULL, NULL, NULL, ARGS("h", "--help"));
    gs_test_expect_status(&r, 2, "gpusync h --help");
    assert_int_equal(r.out.len, 0);
    gs_test_result_release(&r);
    const char *const overview[][3] = {{"he", NULL}, {"help", "--help"}, {"hel", "-h"}};
    for (size_t i = 0; i < sizeof(overview) / sizeof(overview[0]); i++) {
        r = run_gpusync(NULL, NULL, NULL, ARGS(overview[i][0], overview[i][1]));
        gs_test_expect_status(&r, 0, overview[i][0]);
        assert_true(r.out.data && strncmp(r.out.data, "usage: gpusync COMMAND", 22) == 0);
        gs_test_result_release(&r);
    }
    r = run_gpusync(NULL, NULL, NULL, ARGS(""));
    gs_test_expect_status(&r, 2, "gpusync ''");
    assert_true(r.err.data && !strstr(r.err.data, "ambiguous"));
    gs_test_result_release(&r);
}

/* The paragraph of `text` that starts with "Exit codes:" (up to a blank line), in `out`. */
static void exit_code_paragraph(const char *text, const char *what, struct gs_buf *out)
{
    const char *start = strstr(text, "Exit codes:");
    if (!start)
        fail_msg("%s has no \"Exit codes:\" paragraph", what);
    const char *end = strstr(start, "\n\n");
    gs_buf_reset(out);
    gs_buf_add(out, start, end ? (size_t)(end - start) : strlen(start));
}

/* Marks in `seen` every number written in `text` ("128+N" counts as 128). */
static void numbers_in(const char *text, int seen[256])
{
    memset(seen, 0, 256 * sizeof(int));
    for (const char *p = text; *p;) {
        if (*p < '0' || *p > '9') {
            p++;
            continue;
        }
        char *end;
        long n = strtol(p, &end, 10);
        if (n >= 0 && n < 256)
            seen[n] = 1;
        p = end;
    }
}

/* Every exit status gpusync can give is listed in `gpusync --help`, and README.md's paragraph
 * lists the same ones: the two drifted apart once (help stopped at 4). */
static void test_cli__help_lists_every_exit_code_the_readme_lists(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS("--help"));
    gs_test_expect_status(&r, 0, "gpusync --help");
    struct gs_buf help = GS_BUF_INIT, readme = GS_BUF_INIT, text = GS_BUF_INIT;
    exit_code_paragraph(r.out.data, "gpusync --help", &help);
    assert_int_equal(gs_test_slurp(gs_test_source_path("README.md"), &text), 0);
    exit_code_paragraph(text.data, "README.md", &readme);
    int in_help[256], in_readme[256];
    numbers_in(help.data, in_help);
    numbers_in(readme.data, in_readme);
    for (int n = 0; n < 256; n++)
        if (in_help[n] != in_readme[n])
            fail_msg("%d is in %s only\n--help: %s\nREADME.md: %s", n,
                     in_help[n] ? "--help" : "README.md", help.data, readme.data);
#define GS_X_EXIT(name, exit, text) exit,
    static const int statuses[] = {GS_ERROR_LIST(GS_X_EXIT) 255 /* exec, run: connection */};
#undef GS_X_EXIT
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++)
        if (!in_help[statuses[i]])
            fail_msg("exit status %d is missing from --help: %s", statuses[i], help.data);
    gs_buf_release(&help);
    gs_buf_release(&readme);
    gs_buf_release(&text);
    gs_test_result_release(&r);
}

static void test_cli__unknown_command_exits_2(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS("frobnicate"));
    gs_test_expect_status(&r, 2, "gpusync frobnicate");
    assert_non_null(strstr(r.err.data, "unknown command"));
    assert_non_null(strstr(r.err.data, "frobnicate"));
    gs_test_result_release(&r);
    r = run_gpusync(NULL, NULL, NULL, ARGS("exec", "--no-such-option", "true"));
    gs_test_expect_status(&r, 2, "gpusync exec --no-such-option");
    gs_test_result_release(&r);
    r = run_gpusync(NULL, NULL, NULL, ARGS("exec"));
    gs_test_expect_status(&r, 2, "gpusync exec (no command)");
    gs_test_result_release(&r);
}

/* Two command names from --help sharing their first two letters (push/pull), or skip. */
static int find_ambiguous_prefix(char *prefix, char *a, char *b)
{
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS("--help"));
    char names[16][32];
    int n = 0;
    const char *p = strstr(r.out.data, "commands:\n");
    for (p = p ? strchr(p, '\n') + 1 : NULL; p && n < 16 && strncmp(p, "  ", 2) == 0;
         p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (sscanf(p, " %31s", names[n]) == 1)
            n++;
    gs_test_result_release(&r);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strncmp(names[i], names[j], 2) == 0) {
                memcpy(prefix, names[i], 2);
                prefix[2] = '\0';
                strcpy(a, names[i]);
                strcpy(b, names[j]);
                return 1;
            }
    return 0;
}

static void test_cli__ambiguous_prefix_names_the_candidates(void **state)
{
    (void)state;
    char prefix[4], a[32], b[32];
    if (!find_ambiguous_prefix(prefix, a, b)) {
        print_message("no two commands share a prefix yet; skipped\n");
        skip();
    }
    struct gs_test_result r = run_gpusync(NULL, NULL, NULL, ARGS(prefix));
    gs_test_expect_status(&r, 2, "ambiguous prefix");
    assert_non_null(strstr(r.err.data, "ambiguous"));
    assert_non_null(strstr(r.err.data, a));
    assert_non_null(strstr(r.err.data, b));
    gs_test_result_release(&r);
}

/* ---- init ---- */

static void test_init__unknown_host_without_accept_fails_4_and_records_nothing(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0); /* empty known_hosts */
    char dir[64];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-init.XXXXXX");
    struct gs_test_result r =
        run_gpusync(dir, NULL, NULL, ARGS("init", target_of(&shared, "root")));
    gs_test_expect_status(&r, 4, "init without --accept-new-host-key");
    assert_non_null(strstr(r.err.data, "--accept-new-host-key"));
    assert_non_null(strstr(r.err.data, "SHA256:"));
    char kh[700], cfg[128];
    snprintf(kh, sizeof(kh), "%s/.ssh/known_hosts", shared.home);
    struct stat st;
    assert_int_equal(stat(kh, &st), 0);
    assert_int_equal(st.st_size, 0);
    snprintf(cfg, sizeof(cfg), "%s/.gpusync/config", dir);
    assert_int_not_equal(access(cfg, F_OK), 0);
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

static void test_init__accept_new_writes_config_and_known_host(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    char dir[64], cfg[128], remote[800], kh[700], entry[64];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-init.XXXXXX");
    snprintf(remote, sizeof(remote), "%s/init-remote", shared.dir);
    struct gs_test_result r = run_gpusync(
        dir, NULL, NULL,
        ARGS("init", target_of(&shared, "root"), "--path", remote, "--accept-new-host-key"));
    gs_test_expect_status(&r, 0, "init --accept-new-host-key");
    snprintf(cfg, sizeof(cfg), "%s/.gpusync/config", dir);
    char port[32];
    snprintf(port, sizeof(port), "port = %d", shared.port);
    assert_int_equal(count_lines_with(cfg, "host = 127.0.0.1"), 1);
    assert_int_equal(count_lines_with(cfg, port), 1);
    assert_int_equal(count_lines_with(cfg, "user = root"), 1);
    assert_int_equal(count_lines_with(cfg, remote), 1);
    snprintf(kh, sizeof(kh), "%s/.ssh/known_hosts", shared.home);
    snprintf(entry, sizeof(entry), "[127.0.0.1]:%d ", shared.port);
    assert_int_equal(count_lines_with(kh, entry), 1);
    struct stat st;
    assert_int_equal(stat(remote, &st), 0); /* the remote directory was created */
    assert_true(S_ISDIR(st.st_mode));
    gs_test_result_release(&r);
    /* the project now works from a subdirectory, like git */
    char sub[128];
    snprintf(sub, sizeof(sub), "%s/src/deep", dir);
    assert_int_equal(gs_test_sh("mkdir -p '%s'", sub), 0);
    r = run_gpusync(sub, NULL, NULL, ARGS("exec", "pwd"));
    gs_test_expect_status(&r, 0, "exec from a subdirectory");
    char want[900];
    snprintf(want, sizeof(want), "%s\n", remote);
    assert_string_equal(r.out.data, want);
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

/* init to another server in a project whose [remote] hosts starts with the old one (as `hosts add`
 * writes it): the list's first node becomes the new server, or runs went on starting rank 0 on the
 * old one. ("localhost" is another server here: another name, another host key entry.) */
static void test_init__to_another_server_moves_the_first_of_the_hosts(void **state)
{
    (void)state;
    char dir[64], remote[800];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-init-hosts.XXXXXX");
    snprintf(remote, sizeof(remote), "%s/init-hosts-remote", shared.dir);
    struct gs_test_result r =
        run_gpusync(dir, NULL, NULL, ARGS("init", target_of(&shared, "root"), "--path", remote));
    gs_test_expect_status(&r, 0, "init");
    gs_test_result_release(&r);
    assert_int_equal(gs_test_sh("cd '%s' && sed -i 's|^\\[sync\\]$|\\thosts = root@127.0.0.1:%d, "
                                "n2/abs\\n\\n[sync]|' .gpusync/config",
                                dir, shared.port),
                     0);
    char other[128];
    snprintf(other, sizeof(other), "root@localhost:%d", shared.port);
    r = run_gpusync(dir, NULL, NULL,
                    ARGS("init", other, "--path", remote, "--accept-new-host-key"));
    gs_test_expect_status(&r, 0, "init to another server");
    gs_test_result_release(&r);
    r = run_gpusync(dir, NULL, NULL, ARGS("hosts"));
    gs_test_expect_status(&r, 0, "hosts");
    char want[256];
    snprintf(want, sizeof(want), "root@localhost:%d, n2/abs\n", shared.port);
    assert_string_equal(r.out.data, want);
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

static void test_init__bad_target_is_usage_error(void **state)
{
    (void)state;
    char dir[64];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-init.XXXXXX");
    struct gs_test_result r = run_gpusync(dir, NULL, NULL, ARGS("init", "root@host:99999"));
    gs_test_expect_status(&r, 2, "init with a bad port");
    gs_test_result_release(&r);
    r = run_gpusync(dir, NULL, NULL, ARGS("init"));
    gs_test_expect_status(&r, 2, "init without a target");
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

/* `--path ""` (an unset variable, most likely) is a usage error: it was accepted, wrote `path = `
 * and reported an empty remote path while push used the default. Nothing is written, and an
 * existing project keeps its remote path. */
static void test_init__empty_path_is_usage_error_and_writes_nothing(void **state)
{
    (void)state;
    char dir[64], cfg[128];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-init.XXXXXX");
    struct gs_test_result r = run_gpusync(
        dir, NULL, NULL,
        ARGS("init", target_of(&shared, "root"), "--accept-new-host-key", "--path", "", "--json"));
    gs_test_expect_status(&r, 2, "init --path ''");
    assert_string_equal(r.out.data, ""); /* no {"ok":true,"remote_path":""} */
    assert_non_null(strstr(r.err.data, "--path"));
    gs_test_result_release(&r);
    snprintf(cfg, sizeof(cfg), "%s/.gpusync/config", dir);
    assert_int_not_equal(access(cfg, F_OK), 0);
    gs_test_sh("rm -rf '%s'", dir);

    r = run_gpusync(project, NULL, NULL, ARGS("init", target_of(&shared, "root"), "--path", ""));
    gs_test_expect_status(&r, 2, "init --path '' in a project");
    gs_test_result_release(&r);
    char project_cfg[700];
    snprintf(project_cfg, sizeof(project_cfg), "%s/.gpusync/config", project);
    assert_int_equal(count_lines_with(project_cfg, remote_dir), 1);
}

static void test_exec__outside_a_project_fails_with_hint(void **state)
{
    (void)state;
    char dir[64];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-noproj.XXXXXX");
    struct gs_test_result r = run_gpusync(dir, NULL, NULL, ARGS("exec", "true"));
    assert_int_not_equal(r.status, 0);
    assert_non_null(strstr(r.err.data, "gpusync init"));
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

/* ---- foreground watch ---- */

/* Reads the terminal `fd` into `screen` until the text after `from` holds `first`, then `then`
 * after it (NULL: anything). Fails the test after 30 s. */
static void read_screen_until(int fd, struct gs_buf *screen, size_t from, const char *first,
                              const char *then)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    for (;;) {
        gs_buf_adds(screen, ""); /* NUL-terminated, even when empty */
        const char *a = strstr(screen->data + from, first);
        if (a && (!then || strstr(a + strlen(first), then)))
            return;
        int left = (int)(end - gs_clock_mono_ms());
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            fail_msg("the status line never showed \"%s\" then \"%s\"; it showed:\n%s", first, then,
                     screen->data);
        char chunk[4096];
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n <= 0)
            fail_msg("watch ended early; the terminal showed:\n%s", screen->data);
        gs_buf_add(screen, chunk, (size_t)n);
    }
}

/* Fails unless the status line, from `from` on, shows `want` and no batch of 0 paths. */
static void expect_screen(const struct gs_buf *screen, size_t from, const char *want)
{
    if (!strstr(screen->data + from, want) || strstr(screen->data + from, "syncing 0 path"))
        fail_msg("the status line should show \"%s\", and never \"syncing 0 paths\":\n%s", want,
                 screen->data + from);
}

static pid_t fg_watch = -1; /* the foreground watch under test, stopped by its teardown */
static int fg_terminal = -1;

/* Stops the foreground watch (SIGTERM ends it as Ctrl-C does) and closes its terminal. */
static int stop_foreground_watch(void **state)
{
    (void)state;
    if (fg_watch > 0) {
        kill(fg_watch, SIGTERM);
        waitpid(fg_watch, NULL, 0);
    }
    if (fg_terminal >= 0)
        close(fg_terminal);
    fg_watch = fg_terminal = -1;
    return 0;
}

/* Foreground `watch` on a terminal: its status line says what the daemon is doing. It said
 * "syncing 0 paths" for every batch (the count it printed was of the paths queued after the
 * batch was taken); a full check and a batch of edits now read differently, with real counts. */
static void test_watch__foreground_status_line_counts_the_batch(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 1);
    pid_t pid = fg_watch = forkpty(&fg_terminal, NULL, NULL, NULL);
    int fd = fg_terminal;
    assert_true(pid >= 0);
    if (pid == 0) {
        if (chdir(project) != 0)
            _exit(126);
        execl(gs_test_gpusync(), "gpusync", "watch", (char *)NULL);
        _exit(127);
    }
    struct gs_buf screen = GS_BUF_INIT;
    read_screen_until(fd, &screen, 0, "up to date", NULL); /* after the first full sync */
    expect_screen(&screen, 0, "connecting to");
    expect_screen(&screen, 0, "checking every file");
    size_t mark = screen.len;
    char local[700];
    snprintf(local, sizeof(local), "%s/fg-edit.txt", project);
    FILE *fp = fopen(local, "w");
    assert_non_null(fp);
    fputs("edited\n", fp);
    assert_int_equal(fclose(fp), 0);
    read_screen_until(fd, &screen, mark, "syncing", "up to date");
    expect_screen(&screen, mark, "syncing 1 path");
    stop_foreground_watch(NULL);
    char remote[800];
    snprintf(remote, sizeof(remote), "%s/fg-edit.txt", remote_dir);
    assert_int_equal(access(remote, F_OK), 0);
    gs_buf_release(&screen);
}

/* ---- option values ---- */

/* Runs gpusync in the shared project with `args`, which must be a usage error (exit 2). */
static void expect_usage_error(const char *const *args, const char *what)
{
    struct gs_test_result r = run_gpusync(project, NULL, NULL, args);
    gs_test_expect_status(&r, 2, what);
    gs_test_result_release(&r);
}

/* A bad option value or a stray operand is a usage error, found before anything connects or is
 * synced; these were accepted (atoi read "abc" as 0, -1 as -1) or misreported. */
static void test_options__bad_values_are_usage_errors(void **state)
{
    (void)state;
    expect_usage_error(ARGS("stop", "--grace", "abc", "r1"), "stop --grace abc");
    expect_usage_error(ARGS("logs", "--rank", "x"), "logs --rank x");
    expect_usage_error(ARGS("logs", "--rank", "-1"), "logs --rank -1");
    expect_usage_error(ARGS("logs", "--rank", "0,"), "logs --rank 0,");
    expect_usage_error(ARGS("logs", "--tail", "abc"), "logs --tail abc");
    expect_usage_error(ARGS("logs", "--tail", "-1"), "logs --tail -1");
    expect_usage_error(ARGS("logs", "--tail", "0"), "logs --tail 0");
    expect_usage_error(ARGS("flush", "--timeout", "abc"), "flush --timeout abc");
    expect_usage_error(ARGS("flush", "--timeout", "-1"), "flush --timeout -1");
    expect_usage_error(ARGS("status", "bogus-arg"), "status bogus-arg");
}

/* --max-restarts -1 is refused before the sync: the server's launcher used to refuse it after
 * the project had been sent (exit 5). */
static void test_run__bad_max_restarts_is_refused_before_the_sync(void **state)
{
    (void)state;
    assert_int_equal(gs_test_sh("echo x > '%s/restarts-marker.txt'", project), 0);
    expect_usage_error(ARGS("run", "--max-restarts", "-1", "--cpu", "1", "--", "true"),
                       "run --max-restarts -1");
    expect_usage_error(ARGS("run", "--max-restarts", "abc", "--cpu", "1", "--", "true"),
                       "run --max-restarts abc");
    char remote[900];
    snprintf(remote, sizeof(remote), "%s/restarts-marker.txt", remote_dir);
    assert_int_equal(access(remote, F_OK), -1);
    assert_int_equal(gs_test_sh("rm -f '%s/restarts-marker.txt'", project), 0);
}

/* `stop --grace S RUN` reads S as the grace period: it used to share --json's option number, so
 * it printed JSON instead of the text report and never read S. */
static void test_stop__grace_is_read_and_text_stays_text(void **state)
{
    (void)state;
    struct gs_test_result r =
        run_gpusync(project, NULL, NULL,
                    ARGS("run", "--cpu", "1", "--detach", "--name", "gr1", "--", "sleep", "100"));
    gs_test_expect_status(&r, 0, "run --detach");
    gs_test_result_release(&r);
    r = run_gpusync(project, NULL, NULL, ARGS("stop", "--grace", "1", "gr1"));
    gs_test_expect_status(&r, 0, "stop --grace 1 gr1");
    if (r.out.data && r.out.data[0] == '{')
        fail_msg("stop without --json printed JSON: %s", r.out.data);
    gs_test_result_release(&r);
}

/* ---- exec ---- */

static void test_exec__exit_codes_and_signal(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(project, NULL, NULL, ARGS("exec", "true"));
    gs_test_expect_status(&r, 0, "exec true");
    gs_test_result_release(&r);
    r = run_gpusync(project, NULL, NULL, ARGS("exec", "exit 7"));
    gs_test_expect_status(&r, 7, "exec 'exit 7'");
    gs_test_result_release(&r);
    r = run_gpusync(project, NULL, NULL, ARGS("exec", "--", "sh", "-c", "exit 42"));
    gs_test_expect_status(&r, 42, "exec -- sh -c 'exit 42'");
    gs_test_result_release(&r);
    r = run_gpusync(project, NULL, NULL, ARGS("exec", "kill -TERM $$"));
    gs_test_expect_status(&r, 143, "exec 'kill -TERM $$'");
    gs_test_result_release(&r);
}

/* A loopback port nothing listens on: bound, read back, closed. */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* exec, run and logs -f exit with the remote command's status, and a command may well exit 4: a
 * failed connection is 255 there (as with ssh), while the other commands keep 4. */
static void test_exec__unreachable_server_exits_255_where_push_exits_4(void **state)
{
    (void)state;
    char dir[64];
    make_dir(dir, sizeof(dir), "/tmp/gs-e2e-closed.XXXXXX");
    assert_int_equal(gs_test_sh("mkdir '%s/.gpusync' && printf '[remote]\\nhost = 127.0.0.1\\n"
                                "port = %d\\nuser = root\\npath = %s/remote\\n' > "
                                "'%s/.gpusync/config'",
                                dir, closed_port(), dir, dir),
                     0);
    struct gs_test_result r = run_gpusync(dir, NULL, NULL, ARGS("exec", "--", "true"));
    gs_test_expect_status(&r, 255, "exec -- true against a closed port");
    gs_test_result_release(&r);
    r = run_gpusync(dir, NULL, NULL, ARGS("run", "--cpu", "1", "--", "true"));
    gs_test_expect_status(&r, 255, "run --cpu 1 -- true against a closed port");
    gs_test_result_release(&r);
    r = run_gpusync(dir, NULL, NULL, ARGS("logs", "-f", "some-run"));
    gs_test_expect_status(&r, 255, "logs -f (the run's status) against a closed port");
    gs_test_result_release(&r);
    r = run_gpusync(dir, NULL, NULL, ARGS("logs", "some-run"));
    gs_test_expect_status(&r, 4, "logs without -f against a closed port");
    gs_test_result_release(&r);
    r = run_gpusync(dir, NULL, NULL, ARGS("push"));
    gs_test_expect_status(&r, 4, "push against a closed port");
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

/* The whole class of exit status 4 is covered, not just a refused TCP connection. */
static void test_exec__unknown_host_key_exits_255(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0); /* empty known_hosts */
    struct gs_test_result r = run_gpusync(project, NULL, NULL, ARGS("exec", "true"));
    gs_test_expect_status(&r, 255, "exec with an unknown host key");
    assert_non_null(strstr(r.err.data, "--accept-new-host-key"));
    gs_test_result_release(&r);
    r = run_gpusync(project, NULL, NULL, ARGS("run", "--no-sync", "--cpu", "1", "--", "true"));
    gs_test_expect_status(&r, 255, "run with an unknown host key");
    gs_test_result_release(&r);
}

static void test_exec__runs_in_the_remote_project_directory(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(project, NULL, NULL, ARGS("exec", "pwd"));
    gs_test_expect_status(&r, 0, "exec pwd");
    char want[800];
    snprintf(want, sizeof(want), "%s\n", remote_dir);
    assert_string_equal(r.out.data, want);
    gs_test_result_release(&r);
}

static void test_exec__arguments_reach_the_command_unchanged(void **state)
{
    (void)state;
    struct gs_test_result r =
        run_gpusync(project, NULL, NULL,
                    ARGS("exec", "--", "printf", "<%s>", "a b", "it's", "\"dq\"", "$HOME;echo x",
                         "l1\nl2", "-n", "", "*", "\xff\xfe"));
    gs_test_expect_status(&r, 0, "exec -- printf ...");
    assert_string_equal(r.out.data, "<a b><it's><\"dq\"><$HOME;echo x><l1\nl2><-n><><*><\xff\xfe>");
    gs_test_result_release(&r);
}

static void test_exec__stdout_stderr_separate_and_stdin_forwarded(void **state)
{
    (void)state;
    struct gs_test_result r =
        run_gpusync(project, NULL, NULL, ARGS("exec", "echo to-out; echo to-err >&2; exit 3"));
    gs_test_expect_status(&r, 3, "exec with both streams");
    assert_string_equal(r.out.data, "to-out\n");
    assert_non_null(strstr(r.err.data, "to-err\n"));
    assert_null(strstr(r.out.data, "to-err"));
    gs_test_result_release(&r);
    r = run_gpusync(project, NULL, "line one\nline 'two' $x\n", ARGS("exec", "cat"));
    gs_test_expect_status(&r, 0, "exec cat with stdin");
    assert_string_equal(r.out.data, "line one\nline 'two' $x\n");
    gs_test_result_release(&r);
}

/* Reads the child's stdout into `out` until it holds `want` (20 s at most, else fails). */
static void read_until(int fd, struct gs_buf *out, const char *want)
{
    int64_t end = gs_clock_mono_ms() + 20000;
    while (!strstr(out->data ? out->data : "", want)) {
        int64_t left = end - gs_clock_mono_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            fail_msg("no '%s' from the remote command in 20 s; it printed: %s", want,
                     out->data ? out->data : "");
        char chunk[512];
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n <= 0)
            fail_msg("its output ended before '%s': %s", want, out->data ? out->data : "");
        gs_buf_add(out, chunk, (size_t)n);
    }
}

/* Waits (10 s at most, else ends it and fails) until no process is left in process group `pgid`. */
static void await_group_gone(pid_t pgid)
{
    int64_t end = gs_clock_mono_ms() + 10000;
    while (kill(-pgid, 0) == 0) {
        if (gs_clock_mono_ms() > end && kill(-pgid, SIGKILL) == 0) /* no busy loop left behind */
            fail_msg("process group %d still lives on the server 10 s after the client ended",
                     (int)pgid);
        usleep(20000);
    }
}

/* Starts `exec COMMAND` with a stdin pipe held open and silent, waits until the command (a shell
 * that prints "pid $$") runs, and returns that shell's pid: the remote session's process group. */
static pid_t start_remote_shell(const char *command, pid_t *client, int *in, int *out, int *err)
{
    *client = gs_test_start_gpusync_piped(project, NULL, ARGS("exec", command), in, out, err);
    struct gs_buf seen = GS_BUF_INIT;
    read_until(*out, &seen, "\n");
    pid_t pgid = 0;
    assert_int_equal(sscanf(seen.data, "pid %d", &pgid), 1);
    gs_buf_release(&seen);
    return pgid;
}

/* Ctrl-C, SIGTERM and SIGHUP on the client reach the remote command's whole process group (a
 * shell and the sleep it waits for): nothing is left running on the server with no terminal,
 * where `ps` and `stop` cannot find it. The exit status is the signal's, as ssh -t reports it.
 * stdin is a pipe that stays open and silent: the command's output and the signal still pass. */
static void test_exec__signals_reach_the_remote_command(void **state)
{
    (void)state;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        pid_t client;
        int in, out, err;
        pid_t pgid = start_remote_shell("echo pid $$; sleep 600; echo not reached", &client, &in,
                                        &out, &err);
        assert_int_equal(kill(client, sigs[i]), 0);
        struct gs_test_result r = gs_test_finish(client, out, err, 20000);
        close(in);
        char what[64];
        snprintf(what, sizeof(what), "exec after signal %d", sigs[i]);
        gs_test_expect_status(&r, 128 + sigs[i], what);
        assert_null(strstr(r.out.data, "not reached"));
        gs_test_result_release(&r);
        await_group_gone(pgid);
    }
}

/* A command that ignores Ctrl-C is killed by the third. */
static void test_exec__a_third_ctrl_c_kills_a_command_that_ignores_it(void **state)
{
    (void)state;
    pid_t client;
    int in, out, err;
    pid_t pgid =
        start_remote_shell("trap '' INT; echo pid $$; sleep 600", &client, &in, &out, &err);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kill(client, SIGINT), 0);
        usleep(100000); /* three presses, not one: the handler counts signals, not their queue */
    }
    struct gs_test_result r = gs_test_finish(client, out, err, 20000);
    close(in);
    gs_test_expect_status(&r, 128 + SIGKILL, "exec after three Ctrl-Cs");
    assert_non_null(strstr(r.err.data, "SIGKILL"));
    gs_test_result_release(&r);
    await_group_gone(pgid);
}

/* As gs_test_finish with 20 s, except that a client still running then is killed along with the
 * remote process group `pgid` before the test fails: a failure leaves no loop running there. */
static struct gs_test_result finish_exec(pid_t client, int out, int err, pid_t pgid)
{
    struct gs_test_result r = {0, GS_BUF_INIT, GS_BUF_INIT, 0};
    if (gs_test_drain_until(out, err, &r, gs_clock_mono_ms() + 20000) < 0) {
        kill(client, SIGKILL);
        kill(-pgid, SIGKILL);
        waitpid(client, NULL, 0);
        fail_msg("exec did not end within 20 s of the signals; stderr: %s",
                 r.err.data ? r.err.data : "");
    }
    int status;
    assert_int_equal(waitpid(client, &status, 0), client);
    r.status = gs_test_exit_status(status);
    gs_buf_grow(&r.out, 0);
    gs_buf_grow(&r.err, 0);
    return r;
}

/* Ctrl-C reaches a command line that starts no process of its own (a shell loop, a shell that
 * stopped itself): the remote shell running the line is signalled, not only what it starts. */
static void test_exec__ctrl_c_reaches_a_command_line_with_no_child(void **state)
{
    (void)state;
    static const char *const lines[] = {"echo pid $$; i=0; while :; do i=$((i+1)); done",
                                        "echo pid $$; kill -STOP $$; echo not reached"};
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        pid_t client;
        int in, out, err;
        pid_t pgid = start_remote_shell(lines[i], &client, &in, &out, &err);
        assert_int_equal(kill(client, SIGINT), 0);
        struct gs_test_result r = finish_exec(client, out, err, pgid);
        close(in);
        gs_test_expect_status(&r, 128 + SIGINT, lines[i]);
        assert_null(strstr(r.out.data, "not reached"));
        gs_test_result_release(&r);
        await_group_gone(pgid);
    }
}

/* Sends three Ctrl-Cs to `client`, 100 ms apart: three presses, not one (the handler counts
 * signals, not their queue). */
static void press_ctrl_c_three_times(pid_t client)
{
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kill(client, SIGINT), 0);
        usleep(100000);
    }
}

/* The third Ctrl-C kills a command line that ignores Ctrl-C and starts no process of its own. */
static void test_exec__a_third_ctrl_c_kills_a_command_line_with_no_child(void **state)
{
    (void)state;
    pid_t client;
    int in, out, err;
    pid_t pgid = start_remote_shell("trap '' INT; echo pid $$; while :; do :; done", &client, &in,
                                    &out, &err);
    press_ctrl_c_three_times(client);
    struct gs_test_result r = finish_exec(client, out, err, pgid);
    close(in);
    gs_test_expect_status(&r, 128 + SIGKILL, "exec of a shell loop after three Ctrl-Cs");
    gs_test_result_release(&r);
    await_group_gone(pgid);
}

/* A command the third Ctrl-C cannot end does not keep exec waiting: a process that left the tag's
 * environment holds the output open (in a session of its own, or as the command line itself). exec
 * exits 130 within seconds, the process still runs (nothing claimed it gone), and is ended here. */
static void test_exec__a_third_ctrl_c_that_cannot_end_the_command_gives_up(void **state)
{
    (void)state;
    static const char *const lines[] = {
        "trap '' INT; setsid env -u GPUSYNC_EXEC sleep 600 & echo pid $!; wait",
        "echo pid $$; exec env -u GPUSYNC_EXEC sleep 600"};
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        pid_t client;
        int in, out, err;
        pid_t holder = start_remote_shell(lines[i], &client, &in, &out, &err);
        press_ctrl_c_three_times(client);
        int64_t t0 = gs_clock_mono_ms();
        struct gs_test_result r = finish_exec(client, out, err, holder);
        int64_t took = gs_clock_mono_ms() - t0;
        close(in);
        int alive = kill(holder, 0) == 0;
        kill(holder, SIGKILL);
        gs_test_expect_status(&r, 128 + SIGINT, lines[i]);
        assert_true(alive);
        assert_true(took < 15000);
        gs_test_result_release(&r);
    }
}

/* ---- doctor ---- */

static json_t *object_field(json_t *o, const char *key, int type)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        fail_msg("doctor --json: no '%s'", key);
    if (type >= 0 && (int)json_typeof(v) != type)
        fail_msg("doctor --json: '%s' has JSON type %d, want %d", key, json_typeof(v), type);
    return v;
}

static void test_doctor__json_has_checks_and_facts(void **state)
{
    (void)state;
    struct gs_test_result r = run_gpusync(project, NULL, NULL, ARGS("doctor", "--json"));
    if (r.status != 0 && r.status != 1)
        fail_msg("doctor --json exit %d: %s", r.status, r.err.data);
    json_error_t jerr;
    json_t *root = json_loads(r.out.data, 0, &jerr);
    if (!root)
        fail_msg("doctor --json output does not parse (%s): %s", jerr.text, r.out.data);
    assert_int_equal(json_integer_value(object_field(root, "v", JSON_INTEGER)), 1);
    json_t *ok = object_field(root, "ok", -1);
    assert_true(json_is_boolean(ok));
    json_t *checks = object_field(root, "checks", JSON_ARRAY);
    assert_true(json_array_size(checks) >= 3);
    size_t i;
    json_t *c;
    int saw_ssh = 0, failed = 0;
    json_array_foreach(checks, i, c)
    {
        const char *name = json_string_value(object_field(c, "name", JSON_STRING));
        const char *status = json_string_value(object_field(c, "status", JSON_STRING));
        object_field(c, "detail", JSON_STRING);
        if (strcmp(status, "ok") && strcmp(status, "warn") && strcmp(status, "fail"))
            fail_msg("check %s has status '%s'", name, status);
        failed |= strcmp(status, "fail") == 0;
        if (strcmp(name, "ssh") == 0) {
            saw_ssh = 1;
            assert_string_equal(status, "ok");
        }
    }
    assert_true(saw_ssh);
    assert_int_equal(json_is_true(ok), !failed); /* ok is the absence of failures */
    assert_int_equal(r.status, failed ? 1 : 0);
    json_t *facts = object_field(root, "facts", JSON_OBJECT);
    const char *auth = json_string_value(object_field(facts, "auth", JSON_STRING));
    assert_non_null(strstr(auth, "publickey"));
    double rtt = json_number_value(object_field(facts, "rtt_ms", -1));
    assert_true(json_is_number(json_object_get(facts, "rtt_ms")));
    assert_true(rtt > 0 && rtt < 1000);
    assert_string_equal(json_string_value(object_field(facts, "os", JSON_STRING)), "Linux");
    char arch[64];
    FILE *p = popen("uname -m", "r");
    assert_non_null(p);
    assert_non_null(fgets(arch, sizeof(arch), p));
    pclose(p);
    arch[strcspn(arch, "\n")] = '\0';
    assert_string_equal(json_string_value(object_field(facts, "arch", JSON_STRING)), arch);
    json_t *disk = object_field(facts, "disk_free_bytes", -1);
    assert_true(json_is_integer(disk) || json_is_real(disk));
    assert_true(json_number_value(disk) > 0);
    object_field(facts, "gpus", JSON_ARRAY);
    json_decref(root);
    gs_test_result_release(&r);
}

/* ---- --install-key with a password user ---- */

static struct gs_test_sshd pw_server;

static char key_dir[64]; /* the local project of the --install-key test */

static int destroy_pw_server(void **state)
{
    (void)state;
    if (key_dir[0])
        gs_test_sh("rm -rf '%s'", key_dir);
    key_dir[0] = '\0';
    if (pw_server.dir[0])
        gs_test_sshd_destroy(&pw_server);
    memset(&pw_server, 0, sizeof(pw_server));
    return 0;
}

/* The sandbox's sshd reads only its own authorized_keys file, but --install-key writes the user's
 * ~/.ssh/authorized_keys, as on a real server: relaunch the server (same port) reading both. */
static void relaunch_reading_home_authorized_keys(struct gs_test_sshd *d)
{
    assert_int_equal(gs_test_sh("sed -i 's|^AuthorizedKeysFile .*|& .ssh/authorized_keys|' "
                                "'%s/sshd_config'",
                                d->dir),
                     0);
    if (gs_test_sshd_relaunch(d) != 0)
        fail_msg("sshd did not restart; see %s/sshd.log", d->dir);
}

static void test_init__install_key_with_password_once_then_key_only(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        print_message("needs root for useradd; skipped\n");
        skip();
    }
    if (gs_test_sshd_start(&pw_server, "--password-user " PW_USER ":" PW_PASSWORD) != 0)
        fail_msg("password sandbox did not start");
    relaunch_reading_home_authorized_keys(&pw_server);
    gs_test_sshd_use_home(&pw_server, 1);
    /* no usable key in HOME: the sandbox's AuthorizedKeysFile would accept it for any user */
    assert_int_equal(gs_test_sh("rm -f '%s/.ssh/id_ed25519' '%s/.ssh/id_ed25519.pub' "
                                "~" PW_USER "/.ssh/authorized_keys",
                                pw_server.home, pw_server.home),
                     0);
    char *dir = key_dir, home_env[700], keyfile[800], pub[4096] = "";
    make_dir(key_dir, sizeof(key_dir), "/tmp/gs-e2e-key.XXXXXX");
    snprintf(home_env, sizeof(home_env), "HOME=%s", pw_server.home);
    const char *const with_pw[] = {home_env, "GPUSYNC_PASSWORD=" PW_PASSWORD, NULL};
    const char *const no_pw[] = {home_env, "GPUSYNC_PASSWORD", NULL};

    /* a wrong password: exit 4, nothing installed */
    const char *const bad_pw[] = {home_env, "GPUSYNC_PASSWORD=wrong-" PW_PASSWORD, NULL};
    struct gs_test_result r = run_gpusync(
        dir, bad_pw, NULL, ARGS("init", target_of(&pw_server, PW_USER), "--install-key"));
    gs_test_expect_status(&r, 4, "init --install-key with a wrong password");
    gs_test_result_release(&r);
    assert_int_not_equal(access("/home/" PW_USER "/.ssh/authorized_keys", F_OK), 0);

    r = run_gpusync(dir, with_pw, NULL,
                    ARGS("init", target_of(&pw_server, PW_USER), "--install-key"));
    gs_test_expect_status(&r, 0, "init --install-key");
    gs_test_result_release(&r);
    snprintf(keyfile, sizeof(keyfile), "%s/.ssh/gpusync_ed25519.pub", pw_server.home);
    FILE *fp = fopen(keyfile, "r");
    assert_non_null(fp);
    assert_non_null(fgets(pub, sizeof(pub), fp));
    fclose(fp);
    pub[strcspn(pub, "\n")] = '\0';
    char *b64 = strchr(pub, ' ');
    assert_non_null(b64);
    *strchr(b64 + 1, ' ') = '\0';
    const char *authorized = "/home/" PW_USER "/.ssh/authorized_keys";
    assert_int_equal(count_lines_with(authorized, b64 + 1), 1);

    /* twice: still one line */
    r = run_gpusync(dir, with_pw, NULL,
                    ARGS("init", target_of(&pw_server, PW_USER), "--install-key"));
    gs_test_expect_status(&r, 0, "init --install-key, second time");
    gs_test_result_release(&r);
    assert_int_equal(count_lines_with(authorized, b64 + 1), 1);

    /* and exec works without any password */
    r = run_gpusync(dir, no_pw, NULL, ARGS("exec", "id -un"));
    gs_test_expect_status(&r, 0, "exec with the installed key");
    assert_string_equal(r.out.data, PW_USER "\n");
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

/* ---- connection lost mid-command ---- */

static struct gs_test_sshd lost_server;

static char lost_dir[64]; /* the local project of the connection-lost test */

static int destroy_lost_server(void **state)
{
    (void)state;
    if (lost_dir[0])
        gs_test_sh("rm -rf '%s'", lost_dir);
    lost_dir[0] = '\0';
    if (lost_server.dir[0])
        gs_test_sshd_destroy(&lost_server);
    memset(&lost_server, 0, sizeof(lost_server));
    return 0;
}

/* Sends `sig` to every descendant of `ppid` (sshd's connection processes run in sessions of
 * their own, so the fixture's stop does not reach them). */
static void signal_descendants(pid_t ppid, int sig)
{
    DIR *proc = opendir("/proc");
    if (!proc)
        return;
    struct dirent *e;
    while ((e = readdir(proc))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *fp = pid > 0 ? fopen(path, "r") : NULL;
        if (!fp)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
        fclose(fp);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')');
        int parent = 0;
        if (rp && sscanf(rp + 2, "%*c %d", &parent) == 1 && parent == ppid) {
            signal_descendants(pid, sig);
            kill(pid, sig);
        }
    }
    closedir(proc);
}

struct killer {
    char marker[800];
};

static void *kill_server_when_started(void *arg)
{
    struct killer *k = arg;
    int64_t end = gs_clock_mono_ms() + 20000;
    while (access(k->marker, F_OK) != 0 && gs_clock_mono_ms() < end)
        usleep(10000);
    /* only if lost_server.pid really is that sandbox's sshd (never a recycled pid) */
    char path[64], cmdline[1024] = "";
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)lost_server.pid);
    FILE *fp = fopen(path, "r");
    size_t n = fp ? fread(cmdline, 1, sizeof(cmdline) - 1, fp) : 0;
    if (fp)
        fclose(fp);
    for (size_t i = 0; i < n; i++)
        cmdline[i] = cmdline[i] ? cmdline[i] : ' ';
    if (!strstr(cmdline, lost_server.dir)) {
        fprintf(stderr, "pid %d is not the sandbox sshd (%s)\n", (int)lost_server.pid, cmdline);
        return NULL;
    }
    /* freeze everything first: a connection process that saw its command die would still
     * report "killed by signal" to the client before dying itself */
    kill(lost_server.pid, SIGSTOP);
    signal_descendants(lost_server.pid, SIGSTOP);
    signal_descendants(lost_server.pid, SIGKILL);
    gs_test_sshd_stop(&lost_server);
    return NULL;
}

static void test_exec__connection_lost_exits_255_quickly(void **state)
{
    (void)state;
    if (gs_test_sshd_start(&lost_server, NULL) != 0)
        fail_msg("sandbox sshd did not start");
    gs_test_sshd_use_home(&lost_server, 1);
    char *dir = lost_dir, remote[700];
    make_dir(lost_dir, sizeof(lost_dir), "/tmp/gs-e2e-lost.XXXXXX");
    snprintf(remote, sizeof(remote), "%s/remote", lost_server.dir);
    struct gs_test_result r = run_gpusync(
        dir, NULL, NULL, ARGS("init", target_of(&lost_server, "root"), "--path", remote));
    gs_test_expect_status(&r, 0, "init");
    gs_test_result_release(&r);
    struct killer k;
    snprintf(k.marker, sizeof(k.marker), "%s/started", remote);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, kill_server_when_started, &k), 0);
    int64_t t0 = gs_clock_mono_ms();
    r = run_gpusync(dir, NULL, NULL, ARGS("exec", "touch started && sleep 30"));
    int64_t took = gs_clock_mono_ms() - t0;
    pthread_join(th, NULL);
    gs_test_expect_status(&r, 255, "exec while the server dies");
    print_message("exec ended %lld ms after start: %s", (long long)took, r.err.data);
    assert_true(took < 15000);
    assert_non_null(strstr(r.err.data, "gpusync: "));
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli__help_lists_the_commands),
        cmocka_unit_test(test_cli__help_lists_every_exit_code_the_readme_lists),
        cmocka_unit_test(test_cli__unique_prefix_runs_the_command_help),
        cmocka_unit_test(test_cli__prefixes_count_help_and_aliases_are_exact),
        cmocka_unit_test(test_cli__unknown_command_exits_2),
        cmocka_unit_test(test_cli__ambiguous_prefix_names_the_candidates),
        cmocka_unit_test_setup(test_init__unknown_host_without_accept_fails_4_and_records_nothing,
                               use_shared_home),
        cmocka_unit_test_setup(test_init__accept_new_writes_config_and_known_host, use_shared_home),
        cmocka_unit_test_setup(test_init__to_another_server_moves_the_first_of_the_hosts,
                               use_shared_home),
        cmocka_unit_test_setup(test_init__bad_target_is_usage_error, use_shared_home),
        cmocka_unit_test_setup(test_init__empty_path_is_usage_error_and_writes_nothing,
                               use_shared_home),
        cmocka_unit_test_setup(test_exec__outside_a_project_fails_with_hint, use_shared_home),
        cmocka_unit_test_setup(test_exec__exit_codes_and_signal, use_shared_home),
        cmocka_unit_test_setup(test_options__bad_values_are_usage_errors, use_shared_home),
        cmocka_unit_test_setup(test_run__bad_max_restarts_is_refused_before_the_sync,
                               use_shared_home),
        cmocka_unit_test_setup(test_stop__grace_is_read_and_text_stays_text, use_shared_home),
        cmocka_unit_test_setup(test_exec__unreachable_server_exits_255_where_push_exits_4,
                               use_shared_home),
        cmocka_unit_test_setup(test_exec__unknown_host_key_exits_255, use_shared_home),
        cmocka_unit_test_setup(test_exec__runs_in_the_remote_project_directory, use_shared_home),
        cmocka_unit_test_setup(test_exec__arguments_reach_the_command_unchanged, use_shared_home),
        cmocka_unit_test_setup(test_exec__stdout_stderr_separate_and_stdin_forwarded,
                               use_shared_home),
        cmocka_unit_test_setup(test_exec__signals_reach_the_remote_command, use_shared_home),
        cmocka_unit_test_setup(test_exec__a_third_ctrl_c_kills_a_command_that_ignores_it,
                               use_shared_home),
        cmocka_unit_test_setup(test_exec__ctrl_c_reaches_a_command_line_with_no_child,
                               use_shared_home),
        cmocka_unit_test_setup(test_exec__a_third_ctrl_c_kills_a_command_line_with_no_child,
                               use_shared_home),
        cmocka_unit_test_setup(test_exec__a_third_ctrl_c_that_cannot_end_the_command_gives_up,
                               use_shared_home),
        cmocka_unit_test_setup(test_doctor__json_has_checks_and_facts, use_shared_home),
        cmocka_unit_test_teardown(test_watch__foreground_status_line_counts_the_batch,
                                  stop_foreground_watch),
        cmocka_unit_test_teardown(test_exec__connection_lost_exits_255_quickly,
                                  destroy_lost_server),
        cmocka_unit_test_teardown(test_init__install_key_with_password_once_then_key_only,
                                  destroy_pw_server),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

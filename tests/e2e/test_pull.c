/* tests/e2e/test_pull.c: `gpusync pull` keeps what the user has and trusts nothing the server
 * says: a local file gpusync did not sync (edited since its sync, or never pushed) is kept as a
 * conflict copy before the pull replaces it, a local symlink is never written through, REMOTE_PATH
 * is read as push reads its paths, and a server that lies in its listing (a path outside the
 * directory asked for, or one that climbs out with "..") gets the pull refused with nothing
 * written. The lying server is the real agent behind a filter that rewrites paths in both
 * directions, so its answers stay well-formed frames.
 * Pulled files never keep set-id bits.
 * A server's symlinks arrive as symlinks; what pull cannot make (a fifo) is named in `skipped`.
 * A pull from a wiped server says there is nothing to pull, not that it sends.
 * Behind the WAN simulator (tests/tools/wansim), slow enough that a pull takes seconds, a job
 * rewrites or removes files on the server during the pull: a file changed while read is read
 * again, never reported pulled cut off or mixed; one removed is skipped and named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"
#include "wansim_harness.h"

#define TIMEOUT_MS 60000

static struct gs_test_sshd server;
static char base[64];     /* holds proj/ and remote/ */
static char project[128]; /* the local project */
static char remote[128];  /* its remote directory (the server is this machine) */
static char liar[128];    /* the lying agent's script */

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void expect_content(const char *path, const char *want)
{
    char got[256] = "";
    FILE *fp = fopen(path, "r");
    if (!fp)
        fail_msg("%s does not exist", path);
    size_t n = fread(got, 1, sizeof(got) - 1, fp);
    fclose(fp);
    got[n] = '\0';
    if (strcmp(got, want) != 0)
        fail_msg("%s holds \"%s\", want \"%s\"", path, got, want);
}

static struct gs_test_result gpusync_env(const char *const *env, const char *const *args)
{
    return gs_test_run_gpusync(project, env, NULL, args, TIMEOUT_MS);
}

/* The agent, with `from` rewritten to `to` in what it says and back in what it is told (the same
 * length, so every frame stays well formed): a server that lies about paths. It runs on the
 * server, where no environment of ours reaches, so the strings are written into it. */
static void write_liar(const char *from, const char *to)
{
    assert_int_equal(strlen(from), strlen(to));
    FILE *fp = fopen(liar, "w");
    assert_non_null(fp);
    fprintf(fp,
            "#!/bin/sh\n"
            "swap='$|=1; binmode STDIN; binmode STDOUT; my ($a, $b) = @ARGV;"
            " while (sysread(STDIN, my $buf, 65536)) { $buf =~ s/\\Q$a\\E/$b/g;"
            " syswrite(STDOUT, $buf) }'\n"
            "perl -e \"$swap\" '%s' '%s' | '%s' \"$@\" | perl -e \"$swap\" '%s' '%s'\n",
            to, from, gs_test_build_path("agent/gpusync-agent"), from, to);
    assert_int_equal(fclose(fp), 0);
    assert_int_equal(chmod(liar, 0755), 0);
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&server) != 0)
        return -1;
    snprintf(base, sizeof(base), "/tmp/gs-test-pull.XXXXXX");
    if (!mkdtemp(base))
        return -1;
    snprintf(project, sizeof(project), "%s/proj", base);
    snprintf(remote, sizeof(remote), "%s/remote", base);
    snprintf(liar, sizeof(liar), "%s/lying-agent", base);
    mkdir(project, 0755);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", server.port);
    struct gs_test_result r = gs_test_run_gpusync(
        project, NULL, NULL, GS_TEST_ARGS("init", target, "--path", remote), TIMEOUT_MS);
    int ok = r.status == 0;
    if (!ok)
        fprintf(stderr, "init: %s%s\n", r.out.data, r.err.data);
    gs_test_result_release(&r);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sh("rm -rf '%s'", base);
    gs_test_sshd_destroy(&server);
    return 0;
}

static void a_synced_file_edited_since_is_kept_before_the_pull_replaces_it(void **state)
{
    (void)state;
    char path[256];
    gs_test_sh("mkdir -p '%s/res'", project);
    snprintf(path, sizeof(path), "%s/res/a.txt", project);
    write_file(path, "v1");
    snprintf(path, sizeof(path), "%s/res/b.txt", project);
    write_file(path, "same");
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("push"));
    gs_test_expect_status(&r, 0, "push");
    gs_test_result_release(&r);
    /* the user edits a.txt; the job rewrites both on the server */
    snprintf(path, sizeof(path), "%s/res/a.txt", project);
    write_file(path, "local edit, never synced");
    snprintf(path, sizeof(path), "%s/res/a.txt", remote);
    write_file(path, "server v2");
    snprintf(path, sizeof(path), "%s/res/b.txt", remote);
    write_file(path, "server b2");

    r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "res"));
    gs_test_expect_status(&r, 0, "pull");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    json_t *kept = json_object_get(o, "kept");
    assert_int_equal(json_array_size(kept), 1);
    const char *copy = json_string_value(json_object_get(json_array_get(kept, 0), "kept"));
    assert_non_null(strstr(copy, "/res/a.txt.gpusync-conflict-"));
    expect_content(copy, "local edit, never synced");
    json_decref(o);
    gs_test_result_release(&r);
    snprintf(path, sizeof(path), "%s/res/a.txt", project);
    expect_content(path, "server v2");
    snprintf(path, sizeof(path), "%s/res/b.txt", project); /* unedited: simply replaced */
    expect_content(path, "server b2");
    assert_int_equal(gs_test_sh("ls '%s/res' | grep -q 'b.txt.gpusync-conflict'", project), 1);
}

static void a_listing_that_climbs_out_of_the_project_writes_nothing(void **state)
{
    (void)state;
    gs_test_sh("mkdir -p '%s/results/abcde' && printf owned > '%s/results/abcde/evil.txt'", remote,
               remote);
    write_liar("results/abcde/", "results/../../");
    char agent_env[200];
    snprintf(agent_env, sizeof(agent_env), "GPUSYNC_AGENT=%s", liar);
    const char *env[] = {agent_env, NULL};
    struct gs_test_result r = gpusync_env(env, GS_TEST_ARGS("pull", "results"));
    gs_test_expect_status(&r, 5, "pull from a server that lists results/../../evil.txt");
    gs_test_result_release(&r);
    char outside[256];
    snprintf(outside, sizeof(outside), "%s/evil.txt", base); /* proj/results/../../evil.txt */
    assert_int_not_equal(access(outside, F_OK), 0);
}

static void a_listing_outside_the_directory_asked_for_is_refused(void **state)
{
    (void)state;
    gs_test_sh("mkdir -p '%s/results/abcde' && printf data > '%s/results/abcde/f.txt'", remote,
               remote);
    write_liar("results/abcde/", "resultz/abcde/");
    char agent_env[200];
    snprintf(agent_env, sizeof(agent_env), "GPUSYNC_AGENT=%s", liar);
    const char *env[] = {agent_env, NULL};
    struct gs_test_result r = gpusync_env(env, GS_TEST_ARGS("pull", "results", "got"));
    gs_test_expect_status(&r, 5, "pull from a server that lists resultz/abcde/f.txt for results");
    gs_test_result_release(&r);
    char path[256];
    snprintf(path, sizeof(path), "%s/got/abcde/f.txt", project);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* A pull that fails creates no local directory: the missing path's parents (made before the
 * download) and a refused listing's LOCAL_PATH parents were left behind, and the next push sent
 * them to the server as new folders. */
static void a_failed_pull_leaves_no_directory_behind(void **state)
{
    (void)state;
    char path[256], agent_env[200];
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "nosuch/deep/file.txt"));
    if (r.status == 0)
        fail_msg("pull of a missing remote file succeeded");
    gs_test_result_release(&r);
    snprintf(path, sizeof(path), "%s/nosuch", project);
    assert_int_not_equal(access(path, F_OK), 0);

    gs_test_sh("mkdir -p '%s/results/abcde' && printf data > '%s/results/abcde/f.txt'", remote,
               remote);
    write_liar("results/abcde/", "resultz/abcde/");
    snprintf(agent_env, sizeof(agent_env), "GPUSYNC_AGENT=%s", liar);
    const char *env[] = {agent_env, NULL};
    r = gpusync_env(env, GS_TEST_ARGS("pull", "results", "made/by/pull"));
    gs_test_expect_status(&r, 5, "pull refused, into made/by/pull");
    gs_test_result_release(&r);
    snprintf(path, sizeof(path), "%s/made", project);
    assert_int_not_equal(access(path, F_OK), 0);
}

static void a_local_file_never_pushed_is_kept_before_the_pull_replaces_it(void **state)
{
    (void)state;
    gs_test_sh("mkdir -p '%s/fresh' '%s/fresh'", project, remote);
    gs_test_write_file(project, "fresh/new.txt", "mine, never pushed");
    gs_test_write_file(remote, "fresh/new.txt", "the job's");
    gs_test_write_file(project, "fresh/same.txt", "identical"); /* never pushed, nothing differs */
    gs_test_write_file(remote, "fresh/same.txt", "identical");

    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "fresh"));
    gs_test_expect_status(&r, 0, "pull over a local file that was never pushed");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    json_t *kept = json_object_get(o, "kept");
    assert_int_equal(json_array_size(kept), 1);
    const char *copy = json_string_value(json_object_get(json_array_get(kept, 0), "kept"));
    assert_non_null(strstr(copy, "/fresh/new.txt.gpusync-conflict-"));
    expect_content(copy, "mine, never pushed");
    json_decref(o);
    gs_test_result_release(&r);
    char path[256];
    snprintf(path, sizeof(path), "%s/fresh/new.txt", project);
    expect_content(path, "the job's");
    snprintf(path, sizeof(path), "%s/fresh/same.txt", project);
    expect_content(path, "identical");
    assert_int_equal(gs_test_sh("ls '%s/fresh' | grep -q 'same.txt.gpusync-conflict'", project), 1);
}

/* Runs `pull --json args...` and expects exit 6 with the JSON error "conflict". */
static void expect_pull_refused(const char *const *args, const char *what)
{
    struct gs_test_result r = gpusync_env(NULL, args);
    gs_test_expect_status(&r, 6, what);
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "error")), "conflict");
    json_decref(o);
    gs_test_result_release(&r);
}

static void a_local_symlink_is_never_written_through(void **state)
{
    (void)state;
    /* outside/ holds the user's files; the project links to it three ways, the server holds
     * real directories and files at those paths */
    gs_test_sh("mkdir -p '%s/outside/sub' '%s/real' '%s/ldir' '%s/deep/sub' '%s/real/inner'", base,
               project, remote, remote, remote);
    gs_test_write_file(base, "outside/f", "precious");
    gs_test_write_file(base, "outside/sub/f", "precious too");
    gs_test_sh("cd '%s' && ln -s '%s/outside' ldir && ln -s '%s/outside' deep && "
               "ln -s '%s/outside' real/inner && ln -s '%s/outside/f' w.pt",
               project, base, base, base, base);
    gs_test_write_file(remote, "ldir/f", "server");
    gs_test_write_file(remote, "deep/sub/f", "server");
    gs_test_write_file(remote, "real/inner/f", "server");
    gs_test_write_file(remote, "w.pt", "server");

    expect_pull_refused(GS_TEST_ARGS("pull", "--json", "ldir"), "pull onto a symlinked dir");
    expect_pull_refused(GS_TEST_ARGS("pull", "--json", "deep/sub/f"), "pull below a symlink");
    expect_pull_refused(GS_TEST_ARGS("pull", "--json", "real"), "pull of a dir holding a symlink");
    expect_pull_refused(GS_TEST_ARGS("pull", "--json", "w.pt"), "pull over a symlink to a file");
    char path[256];
    snprintf(path, sizeof(path), "%s/outside/f", base);
    expect_content(path, "precious");
    snprintf(path, sizeof(path), "%s/outside/sub/f", base);
    expect_content(path, "precious too");
    assert_int_equal(gs_test_sh("ls -A '%s/outside' | grep -qv '^f$\\|^sub$'", base), 1);
    assert_int_equal(gs_test_sh("test -L '%s/ldir' && test -L '%s/w.pt'", project, project), 0);
}

static void a_remote_path_is_read_as_push_reads_its_paths(void **state)
{
    (void)state;
    gs_test_sh("mkdir -p '%s/dot/sub' '%s/dot/sub'", remote, project);
    gs_test_write_file(remote, "dot/a.txt", "a");
    gs_test_write_file(remote, "dot/sub/b.txt", "b");
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "./dot/a.txt"));
    gs_test_expect_status(&r, 0, "pull ./dot/a.txt");
    gs_test_result_release(&r);
    r = gpusync_env(NULL, GS_TEST_ARGS("pull", "./dot//sub/", "got-dot"));
    gs_test_expect_status(&r, 0, "pull ./dot//sub/ got-dot");
    gs_test_result_release(&r);
    char cwd[256], path[256];
    snprintf(cwd, sizeof(cwd), "%s/dot/sub", project); /* relative to the current directory */
    r = gs_test_run_gpusync(cwd, NULL, NULL, GS_TEST_ARGS("pull", "b.txt"), TIMEOUT_MS);
    gs_test_expect_status(&r, 0, "pull b.txt in dot/sub");
    gs_test_result_release(&r);
    snprintf(path, sizeof(path), "%s/dot/a.txt", project);
    expect_content(path, "a");
    snprintf(path, sizeof(path), "%s/dot/sub/b.txt", project);
    expect_content(path, "b");
    snprintf(path, sizeof(path), "%s/got-dot/b.txt", project);
    expect_content(path, "b");

    const char *bad[] = {"", "..", ".", "../x", "/etc/passwd"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", bad[i]));
        gs_test_expect_status(&r, 2, bad[i]);
        json_t *o = json_loads(r.out.data, 0, NULL);
        assert_non_null(o);
        assert_string_equal(json_string_value(json_object_get(o, "error")), "usage error");
        json_decref(o);
        gs_test_result_release(&r);
    }
}

/* lstat's mode of `dir/rel`, or fails. */
static mode_t local_mode(const char *dir, const char *rel)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    if (lstat(path, &st) != 0)
        fail_msg("%s does not exist", path);
    return st.st_mode;
}

/* Fails unless `dir/rel` is a symlink whose target reads `want`. */
static void expect_link(const char *dir, const char *rel, const char *want)
{
    char path[256], got[256];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    ssize_t n = readlink(path, got, sizeof(got) - 1);
    if (n < 0)
        fail_msg("%s is not a symlink", path);
    got[n < 0 ? 0 : n] = '\0'; /* fail_msg is not marked noreturn */
    if (strcmp(got, want) != 0)
        fail_msg("%s points to \"%s\", want \"%s\"", path, got, want);
}

/* A job's outputs hold symlinks (latest.pt -> ckpt-200.pt, one to a folder, one out of the
 * project) and a fifo: the links were neither pulled nor named, and the pull said it was done. */
static void a_servers_symlinks_are_pulled_as_links_and_what_is_not_pulled_is_named(void **state)
{
    (void)state;
    gs_test_sh("mkdir -p '%s/outs/run1' && cd '%s/outs' && printf w200 > ckpt-200.pt && "
               "printf log > run1/log && ln -s ckpt-200.pt latest.pt && ln -s run1 latest-run && "
               "ln -s /etc/passwd elsewhere && mkfifo pipe",
               remote, remote);
    for (int pass = 0; pass < 2; pass++) { /* again: the links already there are no conflict */
        struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "outs"));
        gs_test_expect_status(&r, 0, "pull outs");
        json_t *o = json_loads(r.out.data, 0, NULL);
        assert_non_null(o);
        assert_int_equal(json_array_size(json_object_get(o, "symlinks")), 3);
        assert_int_equal(json_array_size(json_object_get(o, "kept")), 0);
        json_t *skipped = json_object_get(o, "skipped");
        assert_int_equal(json_array_size(skipped), 1);
        json_t *sk = json_array_get(skipped, 0);
        assert_string_equal(json_string_value(json_object_get(sk, "path")), "outs/pipe");
        assert_string_equal(json_string_value(json_object_get(sk, "kind")), "fifo");
        json_decref(o);
        gs_test_result_release(&r);
    }
    expect_link(project, "outs/latest.pt", "ckpt-200.pt");
    expect_link(project, "outs/latest-run", "run1");
    expect_link(project, "outs/elsewhere", "/etc/passwd"); /* a link, as the server has it */
    char path[256];
    snprintf(path, sizeof(path), "%s/outs/latest.pt", project);
    expect_content(path, "w200");
    snprintf(path, sizeof(path), "%s/outs/latest-run/log", project);
    expect_content(path, "log");
    snprintf(path, sizeof(path), "%s/outs/pipe", project);
    assert_int_not_equal(access(path, F_OK), 0);
    /* a link asked for by its own path is made as one too (it was "a path component is a
     * symlink", exit 5), and again with the link already here */
    gs_test_sh("rm -rf '%s/outs/latest.pt' '%s/outs/latest-run'", project, project);
    const char *links[] = {"outs/latest.pt", "outs/latest.pt", "outs/latest-run"};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", links[i]));
        gs_test_expect_status(&r, 0, links[i]);
        json_t *o = json_loads(r.out.data, 0, NULL);
        assert_non_null(o);
        assert_int_equal(json_array_size(json_object_get(o, "symlinks")), 1);
        assert_int_equal(json_array_size(json_object_get(o, "files")), 0);
        assert_int_equal(json_array_size(json_object_get(o, "kept")), 0);
        json_decref(o);
        gs_test_result_release(&r);
    }
    expect_link(project, "outs/latest.pt", "ckpt-200.pt");
    expect_link(project, "outs/latest-run", "run1");
}

/* push strips setuid and setgid; pull kept them (and sticky), so a server could plant a local
 * set-id program owned by whoever runs gpusync. */
static void set_id_and_sticky_bits_on_the_server_are_not_pulled(void **state)
{
    (void)state;
    gs_test_sh("mkdir -p '%s/modes' && cd '%s/modes' && cp /bin/true tool && chmod 6755 tool && "
               "printf x > sticky && chmod 1644 sticky",
               remote, remote);
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "modes"));
    gs_test_expect_status(&r, 0, "pull modes");
    gs_test_result_release(&r);
    assert_int_equal(local_mode(project, "modes/tool") & 07777, 0755);
    assert_int_equal(local_mode(project, "modes/sticky") & 07777, 0644);
    r = gpusync_env(NULL, GS_TEST_ARGS("pull", "modes/tool", "tool-alone"));
    gs_test_expect_status(&r, 0, "pull modes/tool tool-alone");
    gs_test_result_release(&r);
    assert_int_equal(local_mode(project, "tool-alone") & 07777, 0755);
}

/* After the server was wiped, a pull said "sending everything again", sent nothing, and failed on
 * the listing. It must say the server was wiped and that there is nothing to pull there. Last in
 * the group: it removes the remote project. */
static void a_pull_from_a_wiped_server_says_there_is_nothing_to_pull(void **state)
{
    (void)state;
    gs_test_write_file(project, "kept-here.txt", "local");
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("push"));
    gs_test_expect_status(&r, 0, "push");
    gs_test_result_release(&r);
    gs_test_sh("rm -rf '%s'", remote);

    r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "res-gone"));
    gs_test_expect_status(&r, 1, "pull from a wiped server");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "error")), "not found");
    const char *msg = json_string_value(json_object_get(o, "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "wiped or recreated"));
    assert_non_null(strstr(msg, "nothing to pull"));
    json_decref(o);
    if (strstr(r.err.data, "sending everything again"))
        fail_msg("pull promised to send: %s", r.err.data);
    gs_test_result_release(&r);
    char path[256];
    snprintf(path, sizeof(path), "%s/kept-here.txt", project);
    expect_content(path, "local");
    snprintf(path, sizeof(path), "%s/res-gone", project);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* ---- pulled files stay the server's until they are edited here ---- */

/* Runs `gpusync push --json PATH`, expects exit 0, and returns its answer (a new reference). */
static json_t *push_json(const char *path, const char *what)
{
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("push", "--json", path));
    gs_test_expect_status(&r, 0, what);
    json_t *o = json_loads(r.out.data, 0, NULL);
    if (!o)
        fail_msg("%s: not JSON: %s", what, r.out.data);
    gs_test_result_release(&r);
    return o;
}

static long long field(json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    if (!json_is_integer(v))
        fail_msg("push --json has no integer \"%s\"", name);
    return (long long)json_integer_value(v);
}

/* Expects a push that sent no file, moved no byte for one and kept no conflict copy, then frees
 * its answer. */
static void expect_nothing_sent(json_t *o, const char *what)
{
    if (field(o, "sent") || field(o, "bytes") || field(o, "link_bytes") || field(o, "deleted") ||
        json_array_size(json_object_get(o, "conflicts"))) {
        char *text = json_dumps(o, JSON_COMPACT);
        fail_msg("%s sent something: %s", what, text);
    }
    json_decref(o);
}

/* What a job on the server does: writes `text` to `rel` under the remote directory. */
static void job_writes(const char *rel, const char *text)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/%s", remote, rel);
    *strrchr(dir, '/') = '\0';
    gs_test_sh("mkdir -p '%s'", dir);
    gs_test_write_file(remote, rel, text);
}

static void pull_ok(const char *path)
{
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", path));
    gs_test_expect_status(&r, 0, "pull");
    gs_test_result_release(&r);
}

/* Expects `rel` under `root` to hold `want`. */
static void expect_at(const char *root, const char *rel, const char *want)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    expect_content(path, want);
}

/* Expects the folder `rel` under `root` to hold exactly the names `want` ("a|b|", sorted). */
static void expect_names(const char *root, const char *rel, const char *want)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls -A '%s/%s' | LC_ALL=C sort | tr '\\n' '|'", root, rel);
    struct gs_buf out = GS_BUF_INIT;
    FILE *fp = popen(cmd, "r");
    assert_non_null(fp);
    char buf[256];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), fp)) > 0)
        gs_buf_add(&out, buf, n);
    pclose(fp);
    if (strcmp(out.data ? out.data : "", want) != 0)
        fail_msg("%s/%s holds %s, want %s", root, rel, out.data ? out.data : "", want);
    gs_buf_release(&out);
}

/* The audit's case without a daemon: a pulled output is not sent back, and the job's newer copy
 * is neither "changed on the server" nor replaced by the pulled one. */
/* A symlink a job made (latest.pt -> ckpt-1.pt) is pulled as a link and stays the server's too:
 * not sent back, and the job pointing it at its next checkpoint is neither reverted nor called a
 * conflict. */
static void a_pulled_symlink_stays_the_jobs_when_it_points_it_elsewhere(void **state)
{
    (void)state;
    job_writes("outl/ckpt-1.pt", "one");
    job_writes("outl/ckpt-2.pt", "two");
    char link[256];
    snprintf(link, sizeof(link), "%s/outl/latest.pt", remote);
    assert_int_equal(symlink("ckpt-1.pt", link), 0);
    pull_ok("outl");
    expect_nothing_sent(push_json("outl", "push after pulling a link"), "push after the pull");
    assert_int_equal(unlink(link), 0);
    assert_int_equal(symlink("ckpt-2.pt", link), 0); /* the job's next checkpoint */
    json_t *o = push_json("outl", "push after the job moved its link");
    assert_int_equal(field(o, "server_changed"), 0);
    expect_nothing_sent(o, "push after the job moved its link");
    char target[64] = {0};
    assert_true(readlink(link, target, sizeof(target) - 1) > 0);
    assert_string_equal(target, "ckpt-2.pt");
    expect_names(remote, "outl", "ckpt-1.pt|ckpt-2.pt|latest.pt|");
}

static void pulled_outputs_are_not_sent_back_and_the_jobs_newer_one_stays(void **state)
{
    (void)state;
    job_writes("outa/model.pt", "epoch 1 weights");
    job_writes("outa/log.txt", "step 1\n");
    pull_ok("outa");
    expect_nothing_sent(push_json("outa", "push after the pull"), "push after the pull");
    job_writes("outa/model.pt", "epoch 2 weights (better)");
    json_t *o = push_json("outa", "push after the job's new checkpoint");
    assert_int_equal(field(o, "server_changed"), 0);
    expect_nothing_sent(o, "push after the job's new checkpoint");
    expect_at(remote, "outa/model.pt", "epoch 2 weights (better)");
    expect_names(remote, "outa", "log.txt|model.pt|");
    expect_at(project, "outa/model.pt", "epoch 1 weights");
}

/* Pulling results again: the copy pulled before, unchanged here, is simply replaced. */
static void a_second_pull_replaces_an_unchanged_pulled_file_without_a_copy(void **state)
{
    (void)state;
    job_writes("outb/model.pt", "epoch 1 weights");
    pull_ok("outb");
    job_writes("outb/model.pt", "epoch 2 weights (better)");
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "outb"));
    gs_test_expect_status(&r, 0, "second pull");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_array_size(json_object_get(o, "kept")), 0);
    json_decref(o);
    gs_test_result_release(&r);
    expect_at(project, "outb/model.pt", "epoch 2 weights (better)");
    expect_names(project, "outb", "model.pt|");
}

/* Expects push answer `o` (taken) to report one conflict copy holding the job's "lr=3, by the
 * job", and `rel` on the server to hold the edit made here. */
static void expect_jobs_copy_kept(json_t *o, const char *rel)
{
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 1);
    const char *copy = json_string_value(
        json_object_get(json_array_get(json_object_get(o, "conflicts"), 0), "kept"));
    assert_non_null(copy);
    expect_at(remote, copy, "lr=3, by the job\n");
    json_decref(o);
    expect_at(remote, rel, "lr=2, edited here\n");
}

/* A pulled file edited here is sent, and is gpusync's from then on: a later change on the server
 * is kept aside and the local copy put back, as for any file gpusync wrote. */
static void a_pulled_file_edited_here_is_pushed_and_becomes_gpusyncs(void **state)
{
    (void)state;
    job_writes("outc/cfg.txt", "lr=1\n");
    pull_ok("outc");
    expect_nothing_sent(push_json("outc", "push after the pull"), "push after the pull");
    gs_test_write_file(project, "outc/cfg.txt", "lr=2, edited here\n");
    json_t *o = push_json("outc", "push of the edit");
    assert_int_equal(field(o, "sent"), 1);
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
    expect_at(remote, "outc/cfg.txt", "lr=2, edited here\n");
    job_writes("outc/cfg.txt", "lr=3, by the job\n");
    o = push_json("outc", "push after the job changed the edited file");
    expect_jobs_copy_kept(o, "outc/cfg.txt");
}

/* Edited on both sides: the edit is sent expecting what was pulled, so the job's newer copy is
 * kept as a conflict copy, not lost. */
static void a_pulled_file_edited_on_both_sides_keeps_the_jobs_copy(void **state)
{
    (void)state;
    job_writes("outd/cfg.txt", "lr=1\n");
    pull_ok("outd");
    expect_nothing_sent(push_json("outd", "push after the pull"), "push after the pull");
    job_writes("outd/cfg.txt", "lr=3, by the job\n");
    gs_test_write_file(project, "outd/cfg.txt", "lr=2, edited here\n");
    json_t *o = push_json("outd", "push of the edit");
    assert_int_equal(field(o, "sent"), 1);
    expect_jobs_copy_kept(o, "outd/cfg.txt");
}

/* Deleting a pulled file here (done looking at it) leaves the job's output on the server; the
 * index forgets it, and pulling it again brings it back with no conflict copy. */
static void a_pulled_file_deleted_here_stays_on_the_server(void **state)
{
    (void)state;
    job_writes("oute/model.pt", "epoch 1 weights");
    job_writes("oute/log.txt", "step 1\n");
    pull_ok("oute");
    expect_nothing_sent(push_json("oute", "push after the pull"), "push after the pull");
    char path[256];
    snprintf(path, sizeof(path), "%s/oute/model.pt", project);
    assert_int_equal(unlink(path), 0);
    expect_nothing_sent(push_json("oute", "push after the delete"), "push after the delete");
    expect_at(remote, "oute/model.pt", "epoch 1 weights");
    expect_names(remote, "oute", "log.txt|model.pt|");
    job_writes("oute/model.pt", "epoch 2 weights (better)");
    expect_nothing_sent(push_json("oute", "push after the job's write"), "push after the job's");
    expect_at(remote, "oute/model.pt", "epoch 2 weights (better)");
    pull_ok("oute");
    expect_at(project, "oute/model.pt", "epoch 2 weights (better)");
    expect_names(project, "oute", "log.txt|model.pt|");
}

/* ---- a job writing on the server during the pull (a slow link) ---- */

static struct wansim_proc wan;
static char slow_proj[128], slow_remote[128]; /* a project reached through wansim */

static int wan_teardown(void **state)
{
    (void)state;
    if (wan.pid)
        wansim_stop(&wan);
    memset(&wan, 0, sizeof(wan));
    return 0;
}

/* Starts wansim at `rate_mbit` (each direction) in front of the server and a new project behind
 * it, in slow_proj (its remote directory slow_remote). */
static void slow_project(const char *name, double rate_mbit)
{
    char err[256], target[64];
    struct wansim_opts wo = {.target_port = server.port, .delay_ms = 2, .rate_mbit = rate_mbit};
    if (wansim_start(&wan, &wo, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    snprintf(slow_proj, sizeof(slow_proj), "%s/%s", base, name);
    snprintf(slow_remote, sizeof(slow_remote), "%s/%s-remote", base, name);
    assert_int_equal(mkdir(slow_proj, 0755), 0);
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", wan.port);
    struct gs_test_result r = gs_test_run_gpusync(
        slow_proj, NULL, NULL,
        GS_TEST_ARGS("init", target, "--path", slow_remote, "--accept-new-host-key"), TIMEOUT_MS);
    gs_test_expect_status(&r, 0, "init through wansim");
    gs_test_result_release(&r);
}

/* `n` pseudo-random bytes from `seed` (the caller frees them). */
static uint8_t *random_bytes(size_t n, uint64_t seed)
{
    uint8_t *p = malloc(n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (uint8_t)(seed >> 56);
    }
    return p;
}

/* Writes `n` bytes at `off` of root/rel, made with its folder if missing; truncated first when
 * `trunc` (torch.save opens with O_TRUNC; dd conv=notrunc writes in place). */
static void write_at(const char *root, const char *rel, const uint8_t *data, size_t n, off_t off,
                     int trunc)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    gs_test_sh("mkdir -p \"$(dirname '%s')\"", path);
    int fd = open(path, O_WRONLY | O_CREAT | (trunc ? O_TRUNC : 0), 0644);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, n, off), (ssize_t)n);
    assert_int_equal(close(fd), 0);
}

/* Fails unless the files a/rel and b/rel hold the same bytes (b may be another root). */
static void expect_same_file(const char *a, const char *b, const char *rel)
{
    if (gs_test_sh("cmp -s '%s/%s' '%s/%s'", a, rel, b, rel) != 0)
        fail_msg("%s differs between %s and %s (or is missing)", rel, a, b);
}

/* The size of the largest pull temporary (.gpusync-tmp-*) in `dir`, or -1 when there is none. */
static long long temp_size(const char *dir)
{
    long long size = -1;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char path[512];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (!strncmp(e->d_name, ".gpusync-tmp-", 13) && stat(path, &st) == 0 && st.st_size > size)
            size = st.st_size;
    }
    if (d)
        closedir(d);
    return size;
}

/* How many files (not temporaries) `dir` holds. */
static long long files_in(const char *dir)
{
    long long n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* Waits (30 s at most) until the pull `pid` (its output on `out` and `err`) has written `bytes`
 * of a file into `dir` (the server is then mid-read: the link holds a few MiB at most), or with
 * `bytes` 0, until a whole file is there. */
static void await_pull_in(pid_t pid, int out, int err, const char *dir, long long bytes)
{
    for (int64_t end = gs_clock_mono_ms() + 30000; gs_clock_mono_ms() < end; usleep(5000)) {
        if (bytes ? temp_size(dir) >= bytes : files_in(dir) > 0)
            return;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            struct gs_test_result r = {0};
            gs_test_drain_until(out, err, &r, gs_clock_mono_ms() + 1000);
            fail_msg("the pull ended before %lld bytes of a file arrived: %s%s", bytes,
                     r.out.data ? r.out.data : "", r.err.data ? r.err.data : "");
        }
    }
    fail_msg("no pull temporary reached %lld bytes in %s", bytes, dir);
}

/* Starts `gpusync pull --json ARG` in the slow project; finish it with gs_test_finish. */
static pid_t start_pull(const char *arg, int *out, int *err)
{
    return gs_test_start_gpusync(slow_proj, NULL, NULL, GS_TEST_ARGS("pull", "--json", arg), out,
                                 err);
}

/* a checkpoint: 4 s through 32 Mbit/s, far more than the link holds */
#define CK_SIZE (16u << 20)

/* A job saves a checkpoint while it is pulled: truncated and written smaller (torch.save), or
 * written in place at two offsets. Either way the pull reads it again and ends with the server's
 * file exactly as it is now: never the first bytes of the old one, nor old and new mixed (the pull
 * used to say "pulled 1 file" with either). */
static void a_file_rewritten_during_the_pull_is_pulled_again_whole(void **state)
{
    (void)state;
    slow_project("rewrite", 32);
    uint8_t *old = random_bytes(CK_SIZE, 1), *smaller = random_bytes(CK_SIZE / 5, 2);
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/res", slow_proj);
    for (int in_place = 0; in_place <= 1; in_place++) {
        int out, err;
        write_at(slow_remote, "res/ck.pt", old, CK_SIZE, 0, 1);
        pid_t pid = start_pull("res/ck.pt", &out, &err);
        await_pull_in(pid, out, err, dir, 1 << 20);
        if (in_place) { /* behind the read and ahead of it */
            write_at(slow_remote, "res/ck.pt", smaller, 64 << 10, 512 << 10, 0);
            write_at(slow_remote, "res/ck.pt", smaller, 64 << 10, CK_SIZE - (1 << 20), 0);
        } else {
            write_at(slow_remote, "res/ck.pt", smaller, CK_SIZE / 5, 0, 1);
        }
        struct gs_test_result r = gs_test_finish(pid, out, err, TIMEOUT_MS);
        gs_test_expect_status(&r, 0, in_place ? "pull during in-place writes" : "pull during save");
        json_t *o = json_loads(r.out.data, 0, NULL);
        assert_non_null(o);
        assert_true(json_is_true(json_object_get(o, "ok")));
        assert_int_equal(json_integer_value(json_object_get(o, "bytes")),
                         in_place ? CK_SIZE : CK_SIZE / 5);
        json_decref(o);
        gs_test_result_release(&r);
        expect_same_file(slow_remote, slow_proj, "res/ck.pt");
        assert_int_equal(temp_size(dir), -1);
    }
    free(old);
    free(smaller);
}

/* Rewrites the file `path` in place every 20 ms until killed: a job that never stops writing it. */
static pid_t start_writer(const char *path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char block[4096];
        for (unsigned n = 0;; n++) {
            memset(block, (int)(n & 0xff), sizeof(block));
            int fd = open(path, O_WRONLY);
            if (fd < 0 || pwrite(fd, block, sizeof(block), 0) < 0)
                _exit(1);
            close(fd);
            usleep(20000);
        }
    }
    return pid;
}

#define BUSY_SIZE (8u << 20) /* more than the link holds: the agent reads it for a while */

/* A file a job keeps writing is read again a few times, then not pulled: the pull says which file
 * (`failures`, `ok` false, exit 1), pulls the folder's other files, and leaves the local copy of
 * the busy one as it was, with no temporary beside it. It used to report it pulled. */
static void a_file_that_keeps_changing_fails_and_the_local_copy_stays(void **state)
{
    (void)state;
    slow_project("busy", 64);
    uint8_t *v1 = random_bytes(BUSY_SIZE, 3);
    write_at(slow_remote, "res5/busy.pt", v1, BUSY_SIZE, 0, 1);
    write_at(slow_remote, "res5/done.txt", (const uint8_t *)"final\n", 6, 0, 1);
    struct gs_test_result r = gs_test_run_gpusync(slow_proj, NULL, NULL,
                                                  GS_TEST_ARGS("pull", "res5/busy.pt"), TIMEOUT_MS);
    gs_test_expect_status(&r, 0, "first pull of busy.pt");
    gs_test_result_release(&r);

    char path[512];
    snprintf(path, sizeof(path), "%s/res5/busy.pt", slow_remote);
    pid_t writer = start_writer(path);
    r = gs_test_run_gpusync(slow_proj, NULL, NULL, GS_TEST_ARGS("pull", "--json", "res5"),
                            TIMEOUT_MS);
    kill(writer, SIGKILL);
    waitpid(writer, NULL, 0);
    gs_test_expect_status(&r, 1, "pull of a folder holding a file a job keeps writing");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    assert_true(json_is_false(json_object_get(o, "ok")));
    json_t *failures = json_object_get(o, "failures"), *files = json_object_get(o, "files");
    assert_int_equal(json_array_size(failures), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(failures, 0), "path")),
                        "res5/busy.pt");
    assert_int_equal(json_array_size(files), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(files, 0), "remote")),
                        "res5/done.txt");
    json_decref(o);
    gs_test_result_release(&r);
    expect_at(slow_proj, "res5/done.txt", "final\n");
    char local[512];
    snprintf(local, sizeof(local), "%s/res5/busy.pt", slow_proj);
    struct gs_buf got = GS_BUF_INIT;
    assert_int_equal(gs_test_slurp(local, &got), 0);
    assert_int_equal(got.len, BUSY_SIZE);
    assert_memory_equal(got.data, v1, BUSY_SIZE); /* the first pull's copy, untouched */
    gs_buf_release(&got);
    snprintf(local, sizeof(local), "%s/res5", slow_proj);
    assert_int_equal(temp_size(local), -1);
    free(v1);
}

/* Appends a line to `path` every 20 ms until killed: a training log, or TensorBoard's events. */
static pid_t start_appender(const char *path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (unsigned n = 0;; n++) {
            char line[64];
            int len = snprintf(line, sizeof(line), "step %u loss 0.%04u\n", n, n % 10000);
            int fd = open(path, O_WRONLY | O_APPEND);
            if (fd < 0 || write(fd, line, (size_t)len) != len)
                _exit(1);
            close(fd);
            usleep(20000);
        }
    }
    return pid;
}

/* A log a job appends to all the time is pulled as it was when the agent began reading it: exit
 * 0, the local file the server's first bytes, at least what it held before the pull. Over a slow
 * link every read saw it grow, so it was read again 3 times and not pulled (exit 1). */
static void a_log_appended_to_during_the_pull_is_pulled_as_it_was(void **state)
{
    (void)state;
    slow_project("append", 32);
    uint8_t *start = random_bytes(BUSY_SIZE, 5);
    write_at(slow_remote, "res6/train.log", start, BUSY_SIZE, 0, 1);
    char path[512], local[512];
    snprintf(path, sizeof(path), "%s/res6/train.log", slow_remote);
    pid_t appender = start_appender(path);
    struct gs_test_result r = gs_test_run_gpusync(
        slow_proj, NULL, NULL, GS_TEST_ARGS("pull", "--json", "res6/train.log"), TIMEOUT_MS);
    kill(appender, SIGKILL);
    waitpid(appender, NULL, 0);
    gs_test_expect_status(&r, 0, "pull of a log a job appends to");
    gs_test_result_release(&r);
    struct gs_buf got = GS_BUF_INIT, server = GS_BUF_INIT;
    snprintf(local, sizeof(local), "%s/res6/train.log", slow_proj);
    assert_int_equal(gs_test_slurp(local, &got), 0);
    assert_int_equal(gs_test_slurp(path, &server), 0);
    assert_true(got.len >= BUSY_SIZE && got.len <= server.len);
    assert_memory_equal(got.data, server.data, got.len);
    gs_buf_release(&got);
    gs_buf_release(&server);
    free(start);
}

/* A job saving `path` (opened with O_TRUNC) that writes its first half, then pauses until
 * *resume is written to, writes `n` bytes in all and closes it. Returns once the half is there. */
static pid_t start_half_save(const char *path, const uint8_t *data, size_t n, int *resume)
{
    int go[2], half[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(half), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char c;
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, data, n / 2) != (ssize_t)(n / 2) || write(half[1], "h", 1) != 1 ||
            read(go[0], &c, 1) != 1 || write(fd, data + n / 2, n - n / 2) != (ssize_t)(n - n / 2))
            _exit(1);
        _exit(close(fd) == 0 ? 0 : 1);
    }
    close(go[0]);
    close(half[1]);
    char c;
    assert_int_equal(read(half[0], &c, 1), 1);
    close(half[0]);
    *resume = go[1];
    return pid;
}

/* A checkpoint a job has half saved, its writer paused between two writes, is pulled as it is,
 * and named: a process on the server holds it open for writing (`open_for_writing`, with the
 * writer's pid). Nothing had changed while it was read, so pull took the half for the file and
 * said nothing of it. Saved and closed, it is pulled whole and not named. */
static void a_file_open_for_writing_on_the_server_is_named(void **state)
{
    (void)state;
    size_t n = 1u << 20;
    uint8_t *data = random_bytes(n, 6);
    char path[512], local[512], want[64];
    gs_test_sh("mkdir -p '%s/res7'", remote);
    snprintf(path, sizeof(path), "%s/res7/ck.pt", remote);
    snprintf(local, sizeof(local), "%s/res7/ck.pt", project);
    int resume;
    pid_t job = start_half_save(path, data, n, &resume);
    struct gs_test_result r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "res7/ck.pt"));
    gs_test_expect_status(&r, 0, "pull of a checkpoint being saved");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    json_t *held = json_object_get(o, "open_for_writing");
    assert_int_equal(json_array_size(held), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(held, 0), "path")),
                        "res7/ck.pt");
    snprintf(want, sizeof(want), "pid %ld (", (long)job);
    assert_true(strncmp(json_string_value(json_object_get(json_array_get(held, 0), "writer")), want,
                        strlen(want)) == 0);
    json_decref(o);
    gs_test_result_release(&r);
    struct gs_buf got = GS_BUF_INIT;
    assert_int_equal(gs_test_slurp(local, &got), 0);
    assert_int_equal(got.len, n / 2); /* the file as it was: half */
    gs_buf_release(&got);
    assert_int_equal(write(resume, "g", 1), 1);
    close(resume);
    int st;
    assert_int_equal(waitpid(job, &st, 0), job);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    r = gpusync_env(NULL, GS_TEST_ARGS("pull", "--json", "res7/ck.pt"));
    gs_test_expect_status(&r, 0, "pull of the saved checkpoint");
    o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_array_size(json_object_get(o, "open_for_writing")), 0);
    json_decref(o);
    gs_test_result_release(&r);
    expect_same_file(remote, project, "res7/ck.pt");
    free(data);
}

/* Whether the JSON array `a` of objects has one whose `key` is the string `want`. */
static int has_entry(json_t *a, const char *key, const char *want)
{
    for (size_t i = 0; i < json_array_size(a); i++) {
        const char *v = json_string_value(json_object_get(json_array_get(a, i), key));
        if (v && !strcmp(v, want))
            return 1;
    }
    return 0;
}

#define N_RES4 8

/* Files removed on the server while their folder is pulled are skipped and named (`skipped`, kind
 * "vanished"), and every file still there is pulled: the pull used to fail on the first missing
 * one, leaving an arbitrary part of the folder (some files the server no longer had, without some
 * it still had). */
static void files_removed_during_a_folder_pull_are_skipped_and_the_rest_pulled(void **state)
{
    (void)state;
    slow_project("vanish", 32);
    uint8_t *data = random_bytes(1u << 20, 4);
    for (int i = 1; i <= N_RES4; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "res4/f%d.bin", i);
        data[0] = (uint8_t)i;
        write_at(slow_remote, rel, data, 1u << 20, 0, 1);
    }
    int out, err;
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/res4", slow_proj);
    pid_t pid = start_pull("res4", &out, &err);
    await_pull_in(pid, out, err, dir, 0);
    /* three files not here yet go (the one being read among them, maybe) */
    char removed[N_RES4 + 1] = "";
    for (int i = N_RES4, n = 0; i >= 1 && n < 3; i--) {
        char path[512];
        snprintf(path, sizeof(path), "%s/f%d.bin", dir, i);
        if (access(path, F_OK) == 0)
            continue;
        snprintf(path, sizeof(path), "%s/res4/f%d.bin", slow_remote, i);
        assert_int_equal(unlink(path), 0);
        removed[i] = 1, n++;
    }
    struct gs_test_result r = gs_test_finish(pid, out, err, TIMEOUT_MS);
    gs_test_expect_status(&r, 0, "pull of a folder whose files go meanwhile");
    json_t *o = json_loads(r.out.data, 0, NULL);
    assert_non_null(o);
    json_t *files = json_object_get(o, "files"), *skipped = json_object_get(o, "skipped");
    int n_skipped = 0;
    for (int i = 1; i <= N_RES4; i++) {
        char rel[512];
        snprintf(rel, sizeof(rel), "res4/f%d.bin", i);
        if (!removed[i]) { /* still there: pulled, whole */
            assert_true(has_entry(files, "remote", rel));
            expect_same_file(slow_remote, slow_proj, rel);
        } else if (has_entry(skipped, "path", rel)) {
            n_skipped++;
            snprintf(rel, sizeof(rel), "%s/f%d.bin", dir, i);
            assert_int_not_equal(access(rel, F_OK), 0);
        } else { /* pulled in the moment before it went */
            assert_true(has_entry(files, "remote", rel));
        }
    }
    assert_true(n_skipped >= 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(skipped, 0), "kind")),
                        "vanished");
    json_decref(o);
    gs_test_result_release(&r);
    assert_int_equal(temp_size(dir), -1);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_synced_file_edited_since_is_kept_before_the_pull_replaces_it),
        cmocka_unit_test(a_listing_that_climbs_out_of_the_project_writes_nothing),
        cmocka_unit_test(a_listing_outside_the_directory_asked_for_is_refused),
        cmocka_unit_test(a_failed_pull_leaves_no_directory_behind),
        cmocka_unit_test(a_local_file_never_pushed_is_kept_before_the_pull_replaces_it),
        cmocka_unit_test(a_local_symlink_is_never_written_through),
        cmocka_unit_test(a_remote_path_is_read_as_push_reads_its_paths),
        cmocka_unit_test(a_servers_symlinks_are_pulled_as_links_and_what_is_not_pulled_is_named),
        cmocka_unit_test(set_id_and_sticky_bits_on_the_server_are_not_pulled),
        cmocka_unit_test(pulled_outputs_are_not_sent_back_and_the_jobs_newer_one_stays),
        cmocka_unit_test(a_pulled_symlink_stays_the_jobs_when_it_points_it_elsewhere),
        cmocka_unit_test(a_second_pull_replaces_an_unchanged_pulled_file_without_a_copy),
        cmocka_unit_test(a_pulled_file_edited_here_is_pushed_and_becomes_gpusyncs),
        cmocka_unit_test(a_pulled_file_edited_on_both_sides_keeps_the_jobs_copy),
        cmocka_unit_test(a_pulled_file_deleted_here_stays_on_the_server),
        cmocka_unit_test_teardown(a_file_rewritten_during_the_pull_is_pulled_again_whole,
                                  wan_teardown),
        cmocka_unit_test_teardown(a_file_that_keeps_changing_fails_and_the_local_copy_stays,
                                  wan_teardown),
        cmocka_unit_test_teardown(
            files_removed_during_a_folder_pull_are_skipped_and_the_rest_pulled, wan_teardown),
        cmocka_unit_test_teardown(a_log_appended_to_during_the_pull_is_pulled_as_it_was,
                                  wan_teardown),
        cmocka_unit_test(a_file_open_for_writing_on_the_server_is_named),
        cmocka_unit_test(a_pull_from_a_wiped_server_says_there_is_nothing_to_pull), /* last */
    };
    if (getenv("GS_TEST_FILTER")) /* e.g. GS_TEST_FILTER='*symlink*' */
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

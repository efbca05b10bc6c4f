/* tests/e2e/test_journey.c: a new user's whole first session against an AutoDL-like setup (issue
 * 13), one step after another, each asserted on what the user would observe: two password-only
 * servers (PAM, custom ports, SFTP through the login shell) whose .bashrc prints a banner, an
 * ~/.ssh/config alias for the first, a second node prepared with `hosts add`, then init, a second
 * project, push, a two-node run, jobs, a lost run's logs, git, status and doctor. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define USER1      "gsjourney"
#define USER2      "gsjourney2"
#define PASSWORD   "Journey-Pw-58"
#define TIMEOUT_MS 120000
#define NOISE      "Welcome to your GPU instance"

static struct gs_test_sshd node1, node2;
static char work[700];     /* local projects */
static char home_env[700]; /* HOME=... */
static char node2_spec[128];

#define ENV(...) ((const char *const[]){home_env, __VA_ARGS__, NULL})

static struct gs_test_result gpusync_in(const char *cwd, const char *const *env,
                                        const char *const *args)
{
    return gs_test_run_gpusync(cwd, env, NULL, args, TIMEOUT_MS);
}

/* Runs gpusync, expects `want`, returns stdout parsed as JSON (NULL when it is not JSON). */
static json_t *step(const char *cwd, const char *const *env, const char *const *args, int want,
                    const char *what)
{
    struct gs_test_result r = gpusync_in(cwd, env, args);
    gs_test_expect_status(&r, want, what);
    json_t *o = json_loads(r.out.data, 0, NULL);
    gs_test_result_release(&r);
    return o;
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static int lines_in(const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0;
    int n = 0, c;
    while ((c = fgetc(fp)) != EOF)
        n += c == '\n';
    fclose(fp);
    return n;
}

static const char *project(const char *name)
{
    static char dir[4][800];
    static int which;
    which = (which + 1) % 4;
    snprintf(dir[which], sizeof(dir[which]), "%s/%s", work, name);
    assert_int_equal(gs_test_sh("mkdir -p '%s'", dir[which]), 0);
    return dir[which];
}

/* A rented image: a .bashrc that prints on both streams for every login, interactive or not. */
static void make_noisy(const char *user)
{
    assert_int_equal(gs_test_sh("printf 'echo \"" NOISE "\"\\necho \"(base) conda ready\" >&2\\n' "
                                "> /home/%s/.bashrc",
                                user),
                     0);
}

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    const char *sftp = " --sftp-server /usr/lib/openssh/sftp-server";
    char extra[256];
    snprintf(extra, sizeof(extra), "--password-user " USER1 ":" PASSWORD "%s", sftp);
    if (gs_test_sshd_start(&node1, extra) != 0)
        return -1;
    snprintf(extra, sizeof(extra), "--password-user " USER2 ":" PASSWORD "%s", sftp);
    if (gs_test_sshd_start(&node2, extra) != 0)
        return -1;
    /* the sandbox client key would log in as anyone: this user has only a password */
    gs_test_sshd_use_home(&node1, 0);
    gs_test_sh("rm -f '%s'/.ssh/id_* '%s'/.ssh/gpusync_ed25519* && rm -rf /home/" USER1
               "/.ssh /home/" USER1 "/gpusync /home/" USER2 "/.ssh /home/" USER2 "/gpusync",
               node1.home, node1.home);
    make_noisy(USER1);
    make_noisy(USER2);
    char config[800];
    snprintf(config, sizeof(config), "%s/.ssh/config", node1.home);
    FILE *fp = fopen(config, "w");
    if (!fp)
        return -1;
    fprintf(fp, "Host autodl\n    HostName 127.0.0.1\n    Port %d\n    User " USER1 "\n",
            node1.port);
    fclose(fp);
    snprintf(work, sizeof(work), "%s/work", node1.dir);
    snprintf(home_env, sizeof(home_env), "HOME=%s", node1.home);
    snprintf(node2_spec, sizeof(node2_spec), USER2 "@127.0.0.1:%d", node2.port);
    return gs_test_sh("mkdir -p '%s'", work) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sh("rm -f /home/" USER1 "/.bashrc /home/" USER2 "/.bashrc");
    gs_test_sshd_destroy(&node1);
    gs_test_sshd_destroy(&node2);
    return 0;
}

static void the_whole_first_session(void **state)
{
    (void)state;
    char path[1024];
    const char *proj = project("mnist");
    snprintf(path, sizeof(path), "%s/train.py", proj);
    write_file(path, "print('training')\n");

    /* init through the alias, with the password once; the host key is new */
    json_t *o = step(proj, ENV("GPUSYNC_PASSWORD=" PASSWORD),
                     GS_TEST_ARGS("init", "autodl", "--install-key", "--accept-new-host-key"), 0,
                     "init autodl --install-key");
    json_decref(o);
    assert_int_equal(lines_in("/home/" USER1 "/.ssh/authorized_keys"), 1);

    /* git sees the project, never gpusync's state */
    assert_int_equal(gs_test_sh("cd '%s' && git init -q . && git add -A && "
                                "! git status --porcelain | grep -q gpusync",
                                proj),
                     0);
    /* status names the server the alias resolves to, port included */
    struct gs_test_result r = gpusync_in(proj, NULL, GS_TEST_ARGS("status"));
    gs_test_expect_status(&r, 0, "status");
    char want[64];
    snprintf(want, sizeof(want), USER1 "@127.0.0.1:%d", node1.port);
    assert_non_null(strstr(r.out.data, want));
    gs_test_result_release(&r);

    /* installing again adds nothing */
    json_decref(step(proj, ENV("GPUSYNC_PASSWORD=" PASSWORD),
                     GS_TEST_ARGS("init", "autodl", "--install-key"), 0,
                     "init --install-key again"));
    assert_int_equal(lines_in("/home/" USER1 "/.ssh/authorized_keys"), 1);

    /* a second node: a wrong password is called that, the right one prepares it once */
    o = step(proj, ENV("GPUSYNC_PASSWORD=wrong-" PASSWORD),
             GS_TEST_ARGS("hosts", "add", node2_spec, "--accept-new-host-key", "--json"), 4,
             "hosts add with a wrong password");
    const char *msg = json_string_value(json_object_get(o, "message"));
    assert_non_null(msg);
    assert_non_null(strstr(msg, "password rejected"));
    json_decref(o);
    json_decref(step(proj, ENV("GPUSYNC_PASSWORD=" PASSWORD),
                     GS_TEST_ARGS("hosts", "add", node2_spec, "--accept-new-host-key"), 0,
                     "hosts add"));
    assert_int_equal(lines_in("/home/" USER2 "/.ssh/authorized_keys"), 1);

    /* a second project on the same server: no password at all */
    const char *other = project("other");
    json_decref(step(other, ENV("GPUSYNC_PASSWORD"), GS_TEST_ARGS("init", "autodl"), 0,
                     "init of a second project"));

    /* push reads past the banner */
    o = step(proj, ENV("GPUSYNC_PASSWORD"), GS_TEST_ARGS("push", "--json"), 0, "push");
    assert_int_equal(json_integer_value(json_object_get(o, "sent")), 1);
    json_decref(o);
    assert_int_equal(gs_test_sh("grep -q training /home/" USER1 "/gpusync/mnist/train.py"), 0);

    /* a run on both nodes, with neither a password nor --accept-new-host-key */
    r = gpusync_in(
        proj, ENV("GPUSYNC_PASSWORD"),
        GS_TEST_ARGS("run", "--cpu", "1", "--", "sh", "-c", "echo rank=$RANK of $WORLD_SIZE"));
    gs_test_expect_status(&r, 0, "a two-node run");
    if (!strstr(r.out.data, "rank=0 of 2") || !strstr(r.out.data, "rank=1 of 2"))
        fail_msg("two-node run output:\n%s\nstderr:\n%s", r.out.data, r.err.data);
    assert_non_null(strstr(r.out.data, "rank=1 of 2"));
    assert_null(strstr(r.out.data, NOISE));
    gs_test_result_release(&r);

    /* jobs: CPU ranks from the config; an empty command refused before anything is synced */
    char config[1024];
    snprintf(config, sizeof(config), "%s/.gpusync/config", proj);
    assert_int_equal(gs_test_sh("cp '%s' '%s.saved' && printf '\\n[job \"cpu2\"]\\ncommand = "
                                "echo rank $RANK\\ncpu = 2\\n' >> '%s'",
                                config, config, config),
                     0);
    r = gpusync_in(proj, NULL, GS_TEST_ARGS("run", "cpu2"));
    gs_test_expect_status(&r, 0, "run of a [job] with cpu = 2 on both nodes");
    assert_non_null(strstr(r.out.data, "rank 3"));
    gs_test_result_release(&r);
    assert_int_equal(gs_test_sh("printf '[job \"empty\"]\\ncommand =\\n' >> '%s'", config), 0);
    snprintf(path, sizeof(path), "%s/never-synced.txt", proj);
    write_file(path, "x\n");
    json_decref(step(proj, NULL, GS_TEST_ARGS("run", "empty"), 3, "run of an empty command"));
    assert_int_not_equal(gs_test_sh("test -e /home/" USER1 "/gpusync/mnist/never-synced.txt"), 0);
    unlink(path);
    assert_int_equal(gs_test_sh("mv '%s.saved' '%s'", config, config), 0);

    /* doctor names the file that prints */
    o = step(proj, NULL, GS_TEST_ARGS("doctor", "--json"), 0, "doctor");
    json_t *facts = json_object_get(o, "facts");
    assert_string_equal(json_string_value(json_object_get(facts, "shell_noise_files")),
                        "/home/" USER1 "/.bashrc");
    json_decref(o);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_journey needs root (it creates the servers' users)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_whole_first_session),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* tests/e2e/test_keys.c: keys and hosts (issue 13) through the built CLI, without a terminal,
 * against two sandbox sshd servers with a password user each (real PAM logins, each user with its
 * own home, so each server has its own ~/.ssh/authorized_keys): gpusync's key tried by default,
 * installed once whatever is already in authorized_keys, `hosts add` preparing a second node, one
 * index per node however it is written, and what the authentication errors say. */
#include <dirent.h>
#include <fcntl.h>
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

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"

#define USER_A         "gskeya"
#define USER_B         "gskeyb"
#define PASSWORD       "Gs-Keys-Pw-41"
#define RUN_TIMEOUT_MS 120000

static struct gs_test_sshd srv_a, srv_b; /* node A ([remote]) and node B */
static char work[700];                   /* local projects live under it; reset by each test */
static char home_env[700];               /* "HOME=..." (A's sandbox home) */

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define ENV(...)  ((const char *const[]){home_env, __VA_ARGS__, NULL})

/* Runs gpusync in `cwd` with `env` ("K=V" to set, "K" to unset) and `args`, stdin empty and no
 * controlling terminal, as in CI or an editor. */
static struct gs_test_result gpusync_in(const char *cwd, const char *const *env,
                                        const char *const *args)
{
    return gs_test_run_gpusync(cwd, env, NULL, args, RUN_TIMEOUT_MS);
}

/* Runs gpusync, expects exit `want`, releases the result. */
static void expect_run(const char *cwd, const char *const *env, const char *const *args, int want,
                       const char *what)
{
    struct gs_test_result r = gpusync_in(cwd, env, args);
    gs_test_expect_status(&r, want, what);
    gs_test_result_release(&r);
}

/* The "message" of the JSON error object a failed `--json` command printed. Caller frees. */
static char *json_error_message(const struct gs_test_result *r)
{
    json_t *o = json_loads(r->out.data, 0, NULL);
    if (!o)
        fail_msg("no JSON on stdout: %s\nstderr: %s", r->out.data, r->err.data);
    assert_false(json_is_true(json_object_get(o, "ok")));
    assert_string_equal(json_string_value(json_object_get(o, "error")), "authentication failed");
    char *msg = strdup(json_string_value(json_object_get(o, "message")));
    json_decref(o);
    return msg;
}

static const char *target(const struct gs_test_sshd *d, const char *user)
{
    static char t[2][128];
    static int which;
    which ^= 1;
    snprintf(t[which], sizeof(t[which]), "%s@127.0.0.1:%d", user, d->port);
    return t[which];
}

/* How many lines of `path` contain `needle`. */
static int lines_with(const char *path, const char *needle)
{
    FILE *fp = fopen(path, "r");
    char line[8192];
    int n = 0;
    while (fp && fgets(line, sizeof(line), fp))
        n += strstr(line, needle) != NULL;
    if (fp)
        fclose(fp);
    return n;
}

/* The base64 field of a public key file (what identifies the key). */
static void key_blob(const char *pub_path, char *blob, size_t size)
{
    FILE *fp = fopen(pub_path, "r");
    assert_non_null(fp);
    char type[64], b64[4096];
    assert_int_equal(fscanf(fp, "%63s %4095s", type, b64), 2);
    fclose(fp);
    snprintf(blob, size, "%s", b64);
}

static const char *managed_pub(void)
{
    static char path[800];
    snprintf(path, sizeof(path), "%s/.ssh/gpusync_ed25519.pub", srv_a.home);
    return path;
}

static const char *authorized(const char *user)
{
    static char path[2][128];
    static int which;
    which ^= 1;
    snprintf(path[which], sizeof(path[which]), "/home/%s/.ssh/authorized_keys", user);
    return path[which];
}

/* A new local project directory under `work`. */
static const char *project(const char *name)
{
    static char dir[4][800];
    static int which;
    which = (which + 1) % 4;
    snprintf(dir[which], sizeof(dir[which]), "%s/%s", work, name);
    assert_int_equal(gs_test_sh("mkdir -p '%s'", dir[which]), 0);
    return dir[which];
}

/* ---- setup: two servers once; every test starts from no key anywhere ---- */

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_keys needs root (useradd for the password users)\n");
        return -1;
    }
    signal(SIGPIPE, SIG_IGN);
    if (gs_test_sshd_start(&srv_a, "--password-user " USER_A ":" PASSWORD) != 0 ||
        gs_test_sshd_start(&srv_b, "--password-user " USER_B ":" PASSWORD) != 0)
        return -1;
    snprintf(work, sizeof(work), "%s/work", srv_a.dir);
    snprintf(home_env, sizeof(home_env), "HOME=%s", srv_a.home);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&srv_a);
    gs_test_sshd_destroy(&srv_b);
    return 0;
}

/* HOME is A's sandbox home with A's host key trusted and no key at all (the sandbox client key
 * would be accepted for any user: a password must be what gets the first login); neither user
 * has a ~/.ssh or a project on its server. */
static int fresh_state(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&srv_a, 1);
    return gs_test_sh("rm -rf '%s' '%s'/.ssh/id_* '%s'/.ssh/gpusync_ed25519* '%s/.ssh/config' "
                      "/home/" USER_A "/.ssh /home/" USER_A "/gpusync /home/" USER_B "/.ssh "
                      "/home/" USER_B "/gpusync && mkdir -p '%s'",
                      work, srv_a.home, srv_a.home, srv_a.home, work);
}

/* init --install-key against A in a new project `name`, with the password. */
static const char *init_with_key(const char *name)
{
    const char *dir = project(name);
    expect_run(dir, ENV("GPUSYNC_PASSWORD=" PASSWORD),
               ARGS("init", target(&srv_a, USER_A), "--install-key"), 0, "init --install-key");
    return dir;
}

/* ---- point 2: the managed key ---- */

static void test_keys__second_project_logs_in_with_the_managed_key(void **state)
{
    (void)state;
    init_with_key("first");
    /* a second project on the same server: no password, no --install-key */
    const char *second = project("second");
    expect_run(second, ENV("GPUSYNC_PASSWORD"), ARGS("init", target(&srv_a, USER_A)), 0,
               "init of a second project without a password");
    struct gs_test_result r = gpusync_in(second, ENV("GPUSYNC_PASSWORD"), ARGS("exec", "id -un"));
    gs_test_expect_status(&r, 0, "exec in the second project");
    assert_string_equal(r.out.data, USER_A "\n");
    gs_test_result_release(&r);
}

/* GPUSYNC_PASSWORD is read once: the watch daemon (and any other child) must not carry it. */
static void test_keys__the_password_does_not_stay_in_the_environment(void **state)
{
    (void)state;
    const char *dir = init_with_key("envcheck");
    expect_run(dir, ENV("GPUSYNC_PASSWORD=" PASSWORD), ARGS("watch", "-d"), 0, "watch -d");
    pid_t daemon = gs_test_daemon_lock_pid(dir);
    assert_true(daemon > 0);
    int leaked =
        gs_test_sh("tr '\\0' '\\n' < /proc/%d/environ | grep -qF '" PASSWORD "'", (int)daemon);
    expect_run(dir, NULL, ARGS("watch", "--stop"), 0, "watch --stop");
    assert_int_equal(leaked, 1); /* grep found nothing */
}

/* Replaces USER_A's authorized_keys with `text` (printf format, no arguments). */
static void set_authorized(const char *text)
{
    assert_int_equal(gs_test_sh("mkdir -p /home/" USER_A
                                "/.ssh && printf '%s' > '%s' && chown -R " USER_A ": /home/" USER_A
                                "/.ssh",
                                text, authorized(USER_A)),
                     0);
}

static void test_keys__install_adds_the_key_once_whatever_is_there(void **state)
{
    (void)state;
    assert_int_equal(gs_test_sh("ssh-keygen -q -t ed25519 -N '' -C gpusync -f '%s/.ssh/"
                                "gpusync_ed25519' && ssh-keygen -q -t ed25519 -N '' -C other -f "
                                "'%s/other'",
                                srv_a.home, work),
                     0);
    char blob[4096], other_blob[4096], text[8400], whole[8500];
    key_blob(managed_pub(), blob, sizeof(blob));
    snprintf(text, sizeof(text), "%s/other.pub", work);
    key_blob(text, other_blob, sizeof(other_blob));

    /* a copy is there already, with options in front and another comment: not added again */
    snprintf(text, sizeof(text), "restrict ssh-ed25519 %s me@laptop\\n", blob);
    set_authorized(text);
    init_with_key("again");
    assert_int_equal(lines_with(authorized(USER_A), blob), 1);

    /* the last line (another key) has no newline: ours goes on a line of its own */
    snprintf(text, sizeof(text), "ssh-ed25519 %s other", other_blob);
    set_authorized(text);
    init_with_key("again");
    snprintf(whole, sizeof(whole), "%s\n", text);
    assert_int_equal(lines_with(authorized(USER_A), whole), 1);
    assert_int_equal(lines_with(authorized(USER_A), blob), 1);

    /* and a second --install-key leaves it at that */
    init_with_key("again");
    assert_int_equal(lines_with(authorized(USER_A), blob), 1);
    assert_int_equal(lines_with(authorized(USER_A), whole), 1);
}

/* ---- point 5: what the errors say ---- */

static void test_keys__wrong_password_is_reported_as_rejected(void **state)
{
    (void)state;
    const char *dir = project("wrong");
    struct gs_test_result r = gpusync_in(dir, ENV("GPUSYNC_PASSWORD=wrong-" PASSWORD),
                                         ARGS("init", "--json", target(&srv_a, USER_A)));
    gs_test_expect_status(&r, 4, "init with a wrong password");
    char *msg = json_error_message(&r);
    if (!strstr(msg, "password rejected"))
        fail_msg("the message does not say the password was rejected: %s", msg);
    free(msg);
    gs_test_result_release(&r);
}

static void test_keys__install_key_without_password_or_terminal_asks_for_the_password(void **state)
{
    (void)state;
    const char *dir = project("nopw");
    struct gs_test_result r =
        gpusync_in(dir, ENV("GPUSYNC_PASSWORD"),
                   ARGS("init", "--json", target(&srv_a, USER_A), "--install-key"));
    gs_test_expect_status(&r, 4, "init --install-key without a password");
    char *msg = json_error_message(&r);
    if (strstr(msg, "--install-key") || !strstr(msg, "GPUSYNC_PASSWORD") ||
        !strstr(msg, "--password-stdin"))
        fail_msg("the message should ask for the password, not for --install-key: %s", msg);
    free(msg);
    gs_test_result_release(&r);
    /* nothing was installed */
    assert_int_not_equal(access(authorized(USER_A), F_OK), 0);
}

static void test_keys__missing_identity_file_is_named_not_blamed_on_rsa(void **state)
{
    (void)state;
    /* only an RSA key in ~/.ssh, and a config naming a key that does not exist */
    const char *dir = project("identity");
    assert_int_equal(
        gs_test_sh("ssh-keygen -q -t rsa -b 2048 -N '' -f '%s/.ssh/id_rsa' && "
                   "mkdir -p '%s/.gpusync' && printf '[remote]\\n\\thost = 127.0.0.1\\n"
                   "\\tport = %d\\n\\tuser = %s\\n\\tidentity = ~/.ssh/gone_ed25519\\n' "
                   "> '%s/.gpusync/config'",
                   srv_a.home, dir, srv_a.port, USER_A, dir),
        0);
    struct gs_test_result r =
        gpusync_in(dir, ENV("GPUSYNC_PASSWORD"), ARGS("exec", "--json", "true"));
    gs_test_expect_status(&r, 255, "exec with a missing identity file"); /* exec: as ssh */
    char *msg = json_error_message(&r);
    if (!strstr(msg, "gone_ed25519") || strstr(msg, "RSA"))
        fail_msg("the message should name the missing identity file, not RSA: %s", msg);
    free(msg);
    gs_test_result_release(&r);
}

/* ---- point 3: a second node ---- */

/* A file the run commands below leave in a node's project directory. */
static const char *node_file(const char *user, const char *proj, const char *name)
{
    static char path[2][900];
    static int which;
    which ^= 1;
    snprintf(path[which], sizeof(path[which]), "/home/%s/gpusync/%s/%s", user, proj, name);
    return path[which];
}

static void expect_file(const char *path, const char *want)
{
    char got[256] = "";
    FILE *fp = fopen(path, "r");
    if (!fp)
        fail_msg("%s does not exist", path);
    size_t n = fread(got, 1, sizeof(got) - 1, fp);
    fclose(fp);
    got[n] = '\0';
    assert_string_equal(got, want);
}

static void test_hosts__add_prepares_a_node_once(void **state)
{
    (void)state;
    const char *dir = init_with_key("multi");
    char kh[800], b_name[64], blob[4096];
    snprintf(kh, sizeof(kh), "%s/.ssh/known_hosts", srv_a.home);
    snprintf(b_name, sizeof(b_name), "[127.0.0.1]:%d ", srv_b.port);
    key_blob(managed_pub(), blob, sizeof(blob));
    assert_int_equal(lines_with(kh, b_name), 0);

    /* an unknown host key without a terminal or --accept-new-host-key: refused, nothing kept */
    expect_run(dir, ENV("GPUSYNC_PASSWORD=" PASSWORD), ARGS("hosts", "add", target(&srv_b, USER_B)),
               4, "hosts add of an unknown host");
    assert_int_equal(lines_with(kh, b_name), 0);
    assert_int_equal(lines_with(authorized(USER_B), blob), 0);

    expect_run(dir, ENV("GPUSYNC_PASSWORD=" PASSWORD),
               ARGS("hosts", "add", "--accept-new-host-key", target(&srv_b, USER_B)), 0,
               "hosts add");
    assert_int_equal(lines_with(kh, b_name), 1);
    assert_int_equal(lines_with(authorized(USER_B), blob), 1);
    char config[900];
    snprintf(config, sizeof(config), "%s/.gpusync/config", dir);
    assert_int_equal(lines_with(config, target(&srv_b, USER_B)), 1);

    /* again, with nothing to do: no password needed, nothing added twice */
    expect_run(dir, ENV("GPUSYNC_PASSWORD"), ARGS("hosts", "add", target(&srv_b, USER_B)), 0,
               "hosts add, second time");
    assert_int_equal(lines_with(kh, b_name), 1);
    assert_int_equal(lines_with(authorized(USER_B), blob), 1);
    assert_int_equal(lines_with(config, target(&srv_b, USER_B)), 1);

    /* a two-node run now needs neither a password nor --accept-new-host-key */
    expect_run(dir, ENV("GPUSYNC_PASSWORD"),
               ARGS("run", "--cpu", "1", "--", "sh", "-c", "id -un > who-$GROUP_RANK.txt"), 0,
               "two-node run after hosts add");
    expect_file(node_file(USER_A, "multi", "who-0.txt"), USER_A "\n");
    expect_file(node_file(USER_B, "multi", "who-1.txt"), USER_B "\n");
}

/* ---- point 4: one index per node, however it is written ---- */

/* The node indexes in `dir`/.gpusync (index.<node>.db; index.db is the project's own). */
static int node_indexes(const char *dir)
{
    char path[900];
    snprintf(path, sizeof(path), "%s/.gpusync", dir);
    DIR *d = opendir(path);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        n += strncmp(e->d_name, "index.", 6) == 0 && strcmp(e->d_name, "index.db") != 0 &&
             len > 3 && strcmp(e->d_name + len - 3, ".db") == 0;
    }
    closedir(d);
    return n;
}

static ino_t inode_of(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        fail_msg("%s does not exist", path);
    return st.st_ino;
}

/* The case: a project set up with ~/.ssh/config aliases (no user or port of its own), and
 * the same nodes written out in full in --hosts on another day. (The password and
 * --accept-new-host-key keep this test apart from `hosts add`.) */
static void test_hosts__one_node_written_two_ways_keeps_one_index(void **state)
{
    (void)state;
    assert_int_equal(
        gs_test_sh("printf 'Host node-a\\n\\tHostName 127.0.0.1\\n\\tPort %d\\n\\tUser "
                   "%s\\nHost node-b\\n\\tHostName 127.0.0.1\\n\\tPort %d\\n\\tUser "
                   "%s\\n' > '%s/.ssh/config'",
                   srv_a.port, USER_A, srv_b.port, USER_B, srv_a.home),
        0);
    const char *dir = project("spell");
    const char *const pw[] = {home_env, "GPUSYNC_PASSWORD=" PASSWORD, NULL};
    expect_run(dir, pw, ARGS("init", "node-a"), 0, "init node-a");
    assert_int_equal(gs_test_sh("echo data > '%s/data.txt'", dir), 0);
    expect_run(dir, pw,
               ARGS("run", "--accept-new-host-key", "--hosts", "node-a,node-b", "--cpu", "1", "--",
                    "true"),
               0, "run on node-a,node-b");
    ino_t on_a = inode_of(node_file(USER_A, "spell", "data.txt"));
    ino_t on_b = inode_of(node_file(USER_B, "spell", "data.txt"));
    char written_out[300];
    snprintf(written_out, sizeof(written_out), "%s,%s", target(&srv_a, USER_A),
             target(&srv_b, USER_B));
    expect_run(dir, pw, ARGS("run", "--hosts", written_out, "--cpu", "1", "--", "true"), 0,
               "run with user@host:port");
    /* B has one index; A, [remote] itself, uses the project's */
    assert_int_equal(node_indexes(dir), 1);
    /* and nothing was sent again (a new copy would be a new file, renamed into place) */
    assert_true(inode_of(node_file(USER_A, "spell", "data.txt")) == on_a);
    assert_true(inode_of(node_file(USER_B, "spell", "data.txt")) == on_b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_keys__second_project_logs_in_with_the_managed_key, fresh_state),
        cmocka_unit_test_setup(test_keys__install_adds_the_key_once_whatever_is_there, fresh_state),
        cmocka_unit_test_setup(test_keys__wrong_password_is_reported_as_rejected, fresh_state),
        cmocka_unit_test_setup(test_keys__the_password_does_not_stay_in_the_environment,
                               fresh_state),
        cmocka_unit_test_setup(
            test_keys__install_key_without_password_or_terminal_asks_for_the_password, fresh_state),
        cmocka_unit_test_setup(test_keys__missing_identity_file_is_named_not_blamed_on_rsa,
                               fresh_state),
        cmocka_unit_test_setup(test_hosts__add_prepares_a_node_once, fresh_state),
        cmocka_unit_test_setup(test_hosts__one_node_written_two_ways_keeps_one_index, fresh_state),
    };
    /* GS_TEST_FILTER=PATTERN runs only the matching tests (cmocka's * wildcard) */
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

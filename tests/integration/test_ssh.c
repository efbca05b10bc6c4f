/* tests/integration/test_ssh.c: remote/ against a real OpenSSH server (tests/fixtures/sshd.h):
 * key and password auth, host-key policy, exec channels, SFTP transfers and hostile names, and a
 * server that dies mid-command. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <libssh2.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/shell.h"
#include "fixtures/sshd.h"
#include "remote/exec.h"
#include "remote/sftp_ops.h"
#include "remote/ssh.h"

#define PW_USER     "gsuser"
#define PW_PASSWORD "Gs-Test-Pw-41"

/* The server most tests share (key auth, trusted host key), and one a test starts for itself
 * (stopped by the teardown even when the test fails half-way). */
static struct gs_test_sshd shared;
static struct gs_test_sshd own;

/* ---- helpers ---- */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* First line of a shell command's output. */
static void sh_line(char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void sh_line(char *out, size_t size, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    if (!fgets(out, (int)size, p))
        out[0] = '\0';
    pclose(p);
    out[strcspn(out, "\n")] = '\0';
}

static struct gs_ssh_opts opts_for(const struct gs_test_sshd *d)
{
    struct gs_ssh_opts o;
    memset(&o, 0, sizeof(o));
    o.host = "127.0.0.1";
    o.port = d->port;
    o.user = "root";
    o.connect_timeout_ms = 10000;
    return o;
}

static struct gs_ssh *connect_ok(const struct gs_ssh_opts *o)
{
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int rc = gs_ssh_connect(&s, o, &err);
    if (rc != 0)
        fail_msg("connect failed (%d): %s", rc, err.msg);
    assert_non_null(s);
    return s;
}

static void start_own(struct gs_test_sshd *d, const char *extra, int trust)
{
    if (gs_test_sshd_start(d, extra) != 0)
        fail_msg("sandbox sshd did not start");
    gs_test_sshd_use_home(d, trust);
}

static void host_fingerprint(const struct gs_test_sshd *d, const char *key, char *out, size_t n)
{
    sh_line(out, n, "ssh-keygen -lf '%s/%s.pub' | awk '{print $2}'", d->dir, key);
}

static int count_in_file(const char *path, const char *needle)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), fp))
        n += strstr(line, needle) != NULL;
    fclose(fp);
    return n;
}

/* Waits (polling the file, bounded) until `needle` appears in `path` at least `count` times. */
static int await_in_file(const char *path, const char *needle, int count, int timeout_ms)
{
    int64_t end = gs_clock_mono_ms() + timeout_ms;
    while (count_in_file(path, needle) < count) {
        if (gs_clock_mono_ms() > end)
            return 0;
        usleep(20000);
    }
    return 1;
}

static int run_capture(struct gs_ssh *s, const char *cmd, struct gs_buf *out, struct gs_buf *errb)
{
    struct gs_error err = {0};
    int rc = gs_exec_capture(s, cmd, out, errb, &err);
    if (rc < 0)
        fail_msg("exec '%s' failed (%d): %s", cmd, rc, err.msg);
    return rc;
}

/* Kills every process whose parent is `ppid`, and their descendants (sshd's per-connection
 * processes each run in their own session, so killing the listener's group does not end them). */
static void signal_descendants(pid_t ppid, int sig)
{
    DIR *proc = opendir("/proc");
    if (!proc)
        return;
    struct dirent *e;
    while ((e = readdir(proc))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *fp = fopen(path, "r");
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

static void kill_server_and_connections(struct gs_test_sshd *d)
{
    kill(d->pid, SIGSTOP); /* no new connection children while we collect them */
    /* freeze everything first: a connection process that saw its command die would still
     * report "killed by signal" to the client before dying itself */
    signal_descendants(d->pid, SIGSTOP);
    signal_descendants(d->pid, SIGKILL);
    gs_test_sshd_stop(d);
}

/* ---- group fixture ---- */

static int group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_IGN);
    libssh2_init(0);
    if (gs_test_sshd_start(&shared, NULL) != 0)
        return -1;
    gs_test_sshd_use_home(&shared, 1);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&shared);
    libssh2_exit();
    return 0;
}

static int destroy_own(void **state)
{
    (void)state;
    if (own.dir[0]) {
        if (own.pid > 0)
            kill_server_and_connections(&own);
        gs_test_sshd_destroy(&own);
    }
    memset(&own, 0, sizeof(own));
    return 0;
}

static int use_shared(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 1);
    return 0;
}

/* ---- auth ---- */

static void test_auth__key_login_reports_method_and_host_fingerprint(void **state)
{
    (void)state;
    struct gs_ssh_opts o = opts_for(&shared);
    struct gs_ssh *s = connect_ok(&o);
    assert_non_null(strstr(gs_ssh_auth_method(s), "publickey"));
    assert_non_null(strstr(gs_ssh_auth_method(s), "id_ed25519"));
    char fp[128];
    host_fingerprint(&shared, "host_ed25519", fp, sizeof(fp));
    assert_string_equal(gs_ssh_fingerprint(s), fp);
    char want[64];
    snprintf(want, sizeof(want), "root@127.0.0.1:%d", shared.port);
    assert_string_equal(gs_ssh_target(s), want);
    int64_t rtt = -1;
    struct gs_error err = {0};
    assert_int_equal(gs_ssh_ping(s, &rtt, &err), 0);
    assert_true(rtt > 0 && rtt < 2000000);
    gs_ssh_free(s);
}

static void test_auth__explicit_identity_is_tried_first_and_named(void **state)
{
    /* the config's `identity` (what init --install-key sets) goes before the defaults */
    (void)state;
    char key[700];
    snprintf(key, sizeof(key), "%s/.ssh/gs_extra_key", shared.home);
    if (access(key, F_OK) != 0)
        assert_int_equal(sh("ssh-keygen -q -t ed25519 -N '' -f '%s' && cat '%s.pub' >> "
                            "'%s/authorized_keys'",
                            key, key, shared.dir),
                         0);
    struct gs_ssh_opts o = opts_for(&shared);
    o.identity = "~/.ssh/gs_extra_key";
    struct gs_ssh *s = connect_ok(&o);
    char want[800];
    snprintf(want, sizeof(want), "publickey (%s)", key);
    assert_string_equal(gs_ssh_auth_method(s), want);
    gs_ssh_free(s);
}

/* A loopback port that was free a moment ago (bound to port 0 and closed): a fixed port such as 1
 * may be taken on a shared machine. */
static int closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static void test_connect__closed_port_fails_fast_with_connect_error(void **state)
{
    (void)state;
    struct gs_ssh_opts o = opts_for(&shared);
    o.port = closed_port(); /* a port just released: nothing listens there */
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int64_t t0 = gs_clock_mono_ms();
    assert_int_equal(gs_ssh_connect(&s, &o, &err), GS_E_CONNECT);
    assert_true(gs_clock_mono_ms() - t0 < 3000);
    assert_null(s);
    assert_non_null(strstr(err.msg, "127.0.0.1"));
}

static void require_root(void)
{
    if (geteuid() != 0) {
        print_message("password tests need root (useradd); skipped\n");
        skip();
    }
}

/* A server with the password user; the sandbox key is removed from HOME, because the sandbox's
 * AuthorizedKeysFile would let it log in as any user. */
static void start_password_server(struct gs_test_sshd *d)
{
    start_own(d, "--password-user " PW_USER ":" PW_PASSWORD, 1);
    assert_int_equal(sh("rm -f '%s/.ssh/id_ed25519' '%s/.ssh/id_ed25519.pub'", d->home, d->home),
                     0);
}

static void test_auth__password_login(void **state)
{
    (void)state;
    require_root();
    start_password_server(&own);
    struct gs_ssh_opts o = opts_for(&own);
    o.user = PW_USER;
    o.password = PW_PASSWORD;
    struct gs_ssh *s = connect_ok(&o);
    assert_string_equal(gs_ssh_auth_method(s), "password");
    struct gs_buf out = GS_BUF_INIT;
    assert_int_equal(run_capture(s, "id -un", &out, NULL), 0);
    assert_string_equal(out.data, PW_USER "\n");
    gs_buf_release(&out);
    gs_ssh_free(s);
}

static void test_auth__wrong_password_fails_quickly_with_one_attempt(void **state)
{
    (void)state;
    require_root();
    start_password_server(&own);
    struct gs_ssh_opts o = opts_for(&own);
    o.user = PW_USER;
    o.password = "not-the-password";
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int64_t t0 = gs_clock_mono_ms();
    int rc = gs_ssh_connect(&s, &o, &err);
    int64_t took = gs_clock_mono_ms() - t0;
    assert_int_equal(rc, GS_E_AUTH);
    assert_null(s);
    print_message("wrong password refused after %lld ms\n", (long long)took);
    assert_true(took < 10000);
    assert_non_null(strstr(err.msg, "authentication"));
    assert_non_null(strstr(err.msg, "password"));
    /* the server saw exactly one password attempt: wait for the connection's end in the log */
    char log[700];
    snprintf(log, sizeof(log), "%s/sshd.log", own.dir);
    assert_true(await_in_file(log, "Failed password", 1, 5000));
    await_in_file(log, "closed", 1, 3000);
    int failures = count_in_file(log, "Failed password");
    if (failures != 1)
        fail_msg("sshd logged %d failed password attempts (want 1)", failures);
}

static void test_auth__rsa_only_key_explains_rsa_sha2_and_install_key(void **state)
{
    (void)state;
    start_own(&own, NULL, 1);
    assert_int_equal(sh("rm -f '%s/.ssh/id_ed25519' '%s/.ssh/id_ed25519.pub' && "
                        "ssh-keygen -q -t rsa -b 2048 -N '' -f '%s/.ssh/id_rsa' && "
                        "cat '%s/.ssh/id_rsa.pub' >> '%s/authorized_keys'",
                        own.home, own.home, own.home, own.home, own.dir),
                     0);
    struct gs_ssh_opts o = opts_for(&own);
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int rc = gs_ssh_connect(&s, &o, &err);
    if (rc == 0)
        fail_msg("an RSA-only client logged in (libssh2 signed with rsa-sha2?)");
    assert_int_equal(rc, GS_E_AUTH);
    assert_non_null(strstr(err.msg, "rsa-sha2"));
    assert_non_null(strstr(err.msg, "--install-key"));
}

/* ---- host keys ---- */

static void known_hosts_path(const struct gs_test_sshd *d, char *out, size_t size)
{
    snprintf(out, size, "%s/.ssh/known_hosts", d->home);
}

static void test_hostkey__unknown_host_refused_without_accept_new(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0); /* empty known_hosts */
    struct gs_ssh_opts o = opts_for(&shared);
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    assert_int_equal(gs_ssh_connect(&s, &o, &err), GS_E_HOSTKEY_UNKNOWN);
    assert_null(s);
    char fp[128], kh[700];
    host_fingerprint(&shared, "host_ed25519", fp, sizeof(fp));
    assert_non_null(strstr(err.msg, fp));
    assert_non_null(strstr(err.msg, "--accept-new-host-key"));
    known_hosts_path(&shared, kh, sizeof(kh));
    struct stat st;
    assert_int_equal(stat(kh, &st), 0);
    assert_int_equal(st.st_size, 0); /* nothing recorded */
}

static int confirm_no(void *ctx, const char *question)
{
    (*(int *)ctx)++;
    assert_non_null(strstr(question, "SHA256:"));
    return 0;
}

static void test_hostkey__unknown_host_declined_at_prompt_is_not_recorded(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    int asked = 0;
    struct gs_ssh_opts o = opts_for(&shared);
    o.confirm = confirm_no;
    o.prompt_ctx = &asked;
    struct gs_ssh *s = NULL;
    assert_int_equal(gs_ssh_connect(&s, &o, NULL), GS_E_HOSTKEY_UNKNOWN);
    assert_int_equal(asked, 1);
    char kh[700];
    known_hosts_path(&shared, kh, sizeof(kh));
    assert_int_equal(count_in_file(kh, "ssh-ed25519"), 0);
}

static int confirm_yes(void *ctx, const char *question)
{
    (*(int *)ctx)++;
    assert_non_null(strstr(question, "SHA256:"));
    return 1;
}

static void test_hostkey__unknown_host_accepted_at_prompt_is_recorded(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    int asked = 0;
    struct gs_ssh_opts o = opts_for(&shared);
    o.confirm = confirm_yes;
    o.prompt_ctx = &asked;
    gs_ssh_free(connect_ok(&o));
    assert_int_equal(asked, 1);
    gs_ssh_free(connect_ok(&o)); /* known now: no second question */
    assert_int_equal(asked, 1);
    char kh[700], entry[64];
    known_hosts_path(&shared, kh, sizeof(kh));
    snprintf(entry, sizeof(entry), "[127.0.0.1]:%d ", shared.port);
    assert_int_equal(count_in_file(kh, entry), 1);
}

static void test_hostkey__accept_new_records_bracketed_entry_and_then_trusts_it(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    struct gs_ssh_opts o = opts_for(&shared);
    o.accept_new_host_key = 1;
    struct gs_ssh *s = connect_ok(&o);
    gs_ssh_free(s);
    char kh[700], entry[64];
    known_hosts_path(&shared, kh, sizeof(kh));
    snprintf(entry, sizeof(entry), "[127.0.0.1]:%d ", shared.port);
    assert_int_equal(count_in_file(kh, entry), 1);
    /* OpenSSH itself finds the recorded line */
    assert_int_equal(
        sh("ssh-keygen -F '[127.0.0.1]:%d' -f '%s' | grep -q ssh-ed25519", shared.port, kh), 0);
    /* and a second connection needs no acceptance and adds nothing */
    o.accept_new_host_key = 0;
    s = connect_ok(&o);
    gs_ssh_free(s);
    assert_int_equal(count_in_file(kh, entry), 1);
}

static void test_hostkey__hashed_known_hosts_entry_is_trusted(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 1);
    char kh[700];
    known_hosts_path(&shared, kh, sizeof(kh));
    assert_int_equal(sh("ssh-keygen -q -H -f '%s' >/dev/null 2>&1 && grep -q '^|1|' '%s'", kh, kh),
                     0);
    struct gs_ssh_opts o = opts_for(&shared);
    struct gs_ssh *s = connect_ok(&o);
    gs_ssh_free(s);
}

static void test_hostkey__changed_key_refused_with_both_fingerprints(void **state)
{
    (void)state;
    start_own(&own, NULL, 1);
    char old_fp[128], new_fp[128];
    host_fingerprint(&own, "host_ed25519", old_fp, sizeof(old_fp));
    struct gs_ssh_opts o = opts_for(&own);
    gs_ssh_free(connect_ok(&o));
    assert_int_equal(gs_test_sshd_restart(&own, 1), 0);
    host_fingerprint(&own, "host_ed25519", new_fp, sizeof(new_fp));
    assert_string_not_equal(old_fp, new_fp);
    for (int accept = 0; accept <= 1; accept++) { /* --accept-new-host-key never overrides */
        o.accept_new_host_key = accept;
        struct gs_ssh *s = NULL;
        struct gs_error err = {0};
        assert_int_equal(gs_ssh_connect(&s, &o, &err), GS_E_HOSTKEY_CHANGED);
        assert_null(s);
        char name[64];
        snprintf(name, sizeof(name), "[127.0.0.1]:%d", own.port);
        if (!strstr(err.msg, old_fp) || !strstr(err.msg, new_fp) || !strstr(err.msg, name) ||
            !strstr(err.msg, "ssh-keygen -R"))
            fail_msg("message lacks fingerprints/host/fix: %s (old %s, new %s)", err.msg, old_fp,
                     new_fp);
    }
    char kh[700];
    known_hosts_path(&own, kh, sizeof(kh));
    assert_int_equal(count_in_file(kh, "ssh-ed25519"), 1); /* the file was not touched */
}

/* A different ed25519 key, as "TYPE BASE64" of a line, for the shared server's name. */
static void foreign_key_line(char *out, size_t size)
{
    char dir[64] = "/tmp/gs-test-foreign.XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(sh("ssh-keygen -q -t ed25519 -N '' -f '%s/k' </dev/null", dir), 0);
    sh_line(out, size, "cut -d' ' -f1,2 '%s/k.pub'", dir);
    sh("rm -rf '%s'", dir);
}

/* Connecting with accept-new must fail as a changed key, and leave `unchanged` as it was. */
static void expect_refused_with_accept_new(struct gs_ssh_opts *o, const char *unchanged,
                                           const char *needle)
{
    o->accept_new_host_key = 1;
    struct stat before, after;
    assert_int_equal(stat(unchanged, &before), 0);
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int rc = gs_ssh_connect(&s, o, &err);
    if (rc != GS_E_HOSTKEY_CHANGED)
        fail_msg("accept-new overrode a pinned key (%d): %s", rc, err.msg);
    assert_null(s);
    if (!strstr(err.msg, needle))
        fail_msg("message does not say '%s': %s", needle, err.msg);
    assert_int_equal(stat(unchanged, &after), 0);
    assert_int_equal(after.st_size, before.st_size); /* nothing appended */
}

static void test_hostkey__key_pinned_in_files_named_by_ssh_config_beats_accept_new(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    char foreign[1024];
    foreign_key_line(foreign, sizeof(foreign));
    /* the old key lives only where ~/.ssh/config points OpenSSH: a GlobalKnownHostsFile */
    assert_int_equal(sh("cd '%s/.ssh' && printf '[127.0.0.1]:%d %s\\n' > global_kh && : > user_kh"
                        " && printf 'Host pinned\\n HostName 127.0.0.1\\n Port %d\\n User root"
                        "\\n UserKnownHostsFile %s/.ssh/user_kh\\n GlobalKnownHostsFile "
                        "%s/.ssh/global_kh\\n' > config",
                        shared.home, shared.port, foreign, shared.port, shared.home, shared.home),
                     0);
    struct gs_ssh_opts o = opts_for(&shared);
    o.host = "pinned";
    o.port = 0;
    o.user = NULL;
    char user_kh[700];
    snprintf(user_kh, sizeof(user_kh), "%s/.ssh/user_kh", shared.home);
    expect_refused_with_accept_new(&o, user_kh, "global_kh");
    sh("rm -f '%s/.ssh/config' '%s/.ssh/global_kh' '%s'", shared.home, shared.home, user_kh);
}

static void test_hostkey__revoked_or_after_a_bad_line_beats_accept_new(void **state)
{
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    char kh[700], own_key[1024], foreign[1024];
    known_hosts_path(&shared, kh, sizeof(kh));
    sh_line(own_key, sizeof(own_key), "cut -d' ' -f1,2 '%s/host_ed25519.pub'", shared.dir);
    foreign_key_line(foreign, sizeof(foreign));
    struct gs_ssh_opts o = opts_for(&shared);
    /* libssh2 1.10 read "@revoked" as a host name: the revocation was invisible */
    assert_int_equal(sh("printf '@revoked [127.0.0.1]:%d %s\\n' > '%s'", shared.port, own_key, kh),
                     0);
    expect_refused_with_accept_new(&o, kh, "revoked");
    /* libssh2 stopped reading at a line it could not parse, losing the pinned key below it */
    assert_int_equal(
        sh("printf 'this line is garbage\\n[127.0.0.1]:%d %s\\n' > '%s'", shared.port, foreign, kh),
        0);
    expect_refused_with_accept_new(&o, kh, "changed");
    gs_test_sshd_use_home(&shared, 1);
}

/* Restarts d's server with an extra ECDSA host key (the sandbox script makes only ed25519), on
 * the same port. */
static void relaunch_with_ecdsa(struct gs_test_sshd *d)
{
    assert_int_equal(sh("cd '%s' && ssh-keygen -q -t ecdsa -N '' -f host_ecdsa && "
                        "echo 'HostKey %s/host_ecdsa' >> sshd_config",
                        d->dir, d->dir),
                     0);
    if (gs_test_sshd_relaunch(d) != 0)
        fail_msg("sshd with an ECDSA host key did not start; see %s/sshd.log", d->dir);
}

static void test_hostkey__known_ed25519_with_server_also_offering_ecdsa_connects(void **state)
{
    (void)state;
    start_own(&own, NULL, 1); /* known_hosts: the ed25519 key only */
    relaunch_with_ecdsa(&own);
    char fp[128];
    host_fingerprint(&own, "host_ed25519", fp, sizeof(fp));
    struct gs_ssh_opts o = opts_for(&own);
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int rc = gs_ssh_connect(&s, &o, &err);
    if (rc != 0)
        fail_msg("known ed25519 host with an extra ECDSA key refused (%d): %s", rc, err.msg);
    assert_string_equal(gs_ssh_fingerprint(s), fp);
    gs_ssh_free(s);

    /* the other way round: only the ECDSA key recorded */
    char kh[700];
    known_hosts_path(&own, kh, sizeof(kh));
    assert_int_equal(sh("printf '[127.0.0.1]:%d %%s\\n' \"$(cut -d' ' -f1,2 '%s/host_ecdsa.pub')\" "
                        "> '%s'",
                        own.port, own.dir, kh),
                     0);
    host_fingerprint(&own, "host_ecdsa", fp, sizeof(fp));
    rc = gs_ssh_connect(&s, &o, &err);
    if (rc != 0)
        fail_msg("known ECDSA host refused (%d): %s", rc, err.msg);
    assert_string_equal(gs_ssh_fingerprint(s), fp);
    gs_ssh_free(s);
}

static void test_hostkey__port_22_entry_does_not_vouch_for_another_port(void **state)
{
    /* OpenSSH looks up "[127.0.0.1]:PORT" only; a plain "127.0.0.1" line (another server, on port
     * 22) must not make this server look "changed" */
    (void)state;
    gs_test_sshd_use_home(&shared, 0);
    char dir[] = "/tmp/gs-test-otherkey.XXXXXX", kh[700];
    assert_non_null(mkdtemp(dir));
    known_hosts_path(&shared, kh, sizeof(kh));
    assert_int_equal(sh("ssh-keygen -q -t ed25519 -N '' -f '%s/k' && "
                        "printf '127.0.0.1 %%s\\n' \"$(cut -d' ' -f1,2 '%s/k.pub')\" > '%s'",
                        dir, dir, kh),
                     0);
    sh("rm -rf '%s'", dir);
    struct gs_ssh_opts o = opts_for(&shared);
    o.accept_new_host_key = 1;
    struct gs_ssh *s = NULL;
    struct gs_error err = {0};
    int rc = gs_ssh_connect(&s, &o, &err);
    if (rc != 0)
        fail_msg("refused (%d) because of a port-22 entry: %s", rc, err.msg);
    gs_ssh_free(s);
}

/* ---- exec ---- */

static struct gs_ssh *shared_session(void)
{
    struct gs_ssh_opts o = opts_for(&shared);
    return connect_ok(&o);
}

static void test_exec__exit_codes_and_signal(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    assert_int_equal(run_capture(s, "exit 0", NULL, NULL), 0);
    assert_int_equal(run_capture(s, "exit 7", NULL, NULL), 7);
    assert_int_equal(run_capture(s, "exit 255", NULL, NULL), 255);
    assert_int_equal(run_capture(s, "kill -TERM $$", NULL, NULL), 128 + 15);
    assert_int_equal(run_capture(s, "kill -KILL $$", NULL, NULL), 128 + 9);
    assert_int_equal(run_capture(s, "no-such-command-gs 2>/dev/null", NULL, NULL), 127);
    gs_ssh_free(s);
}

static void test_exec__stdout_and_stderr_stay_separate(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    struct gs_buf out = GS_BUF_INIT, errb = GS_BUF_INIT;
    assert_int_equal(run_capture(s, "echo to-out; echo to-err >&2; echo more-out", &out, &errb), 0);
    assert_string_equal(out.data, "to-out\nmore-out\n");
    assert_string_equal(errb.data, "to-err\n");
    gs_buf_reset(&out);
    gs_buf_reset(&errb);
    /* a lot on both at once: no deadlock, no mixing */
    assert_int_equal(run_capture(s,
                                 "head -c 3000000 /dev/zero | tr '\\0' o & "
                                 "head -c 2000000 /dev/zero | tr '\\0' e >&2; wait",
                                 &out, &errb),
                     0);
    assert_int_equal(out.len, 3000000);
    assert_int_equal(errb.len, 2000000);
    assert_null(memchr(out.data, 'e', out.len));
    assert_null(memchr(errb.data, 'o', errb.len));
    gs_buf_release(&out);
    gs_buf_release(&errb);
    gs_ssh_free(s);
}

static void test_exec__output_to_file_descriptors(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    char path[] = "/tmp/gs-test-exec-fd.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdout_fd = fd;
    struct gs_error err = {0};
    assert_int_equal(gs_exec_run(s, "printf 'a\\nb'", &io, &err), 0);
    close(fd);
    char line[64];
    sh_line(line, sizeof(line), "od -An -c '%s' | tr -s ' '", path);
    assert_string_equal(line, " a \\n b");
    unlink(path);
    gs_ssh_free(s);
}

static void test_exec__stdin_is_streamed_from_memory_and_fd(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    size_t n = 5 << 20;
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (char)(i * 7 + (i >> 13));
    struct gs_buf out = GS_BUF_INIT;
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdin_data = data;
    io.stdin_len = n;
    io.stdout_buf = &out;
    struct gs_error err = {0};
    assert_int_equal(gs_exec_run(s, "cat", &io, &err), 0);
    assert_int_equal(out.len, n);
    assert_memory_equal(out.data, data, n);

    /* from a file descriptor */
    char path[] = "/tmp/gs-test-exec-in.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, n), (ssize_t)n);
    lseek(fd, 0, SEEK_SET);
    gs_buf_reset(&out);
    struct gs_exec_io io2 = GS_EXEC_IO_INIT;
    io2.stdin_fd = fd;
    io2.stdout_buf = &out;
    assert_int_equal(gs_exec_run(s, "wc -c", &io2, &err), 0);
    char want[32];
    snprintf(want, sizeof(want), "%zu\n", n);
    assert_string_equal(out.data, want);
    close(fd);
    unlink(path);
    /* no stdin: the command sees EOF at once */
    gs_buf_reset(&out);
    assert_int_equal(run_capture(s, "wc -c", &out, NULL), 0);
    assert_string_equal(out.data, "0\n");
    free(data);
    gs_buf_release(&out);
    gs_ssh_free(s);
}

static void test_exec__quoted_arguments_arrive_unchanged(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    char *argv[] = {"printf", "<%s>", "a b", "it's", "$HOME;x", "l1\nl2", "-n", "\xff\xfe"};
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_shell_quote_argv(&cmd, 8, argv);
    assert_int_equal(run_capture(s, cmd.data, &out, NULL), 0);
    assert_string_equal(out.data, "<a b><it's><$HOME;x><l1\nl2><-n><\xff\xfe>");
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    gs_ssh_free(s);
}

static void test_exec__many_commands_on_one_session(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    for (int i = 0; i < 30; i++) {
        char cmd[32], want[16];
        struct gs_buf out = GS_BUF_INIT;
        snprintf(cmd, sizeof(cmd), "echo %d; exit %d", i, i % 5);
        snprintf(want, sizeof(want), "%d\n", i);
        assert_int_equal(run_capture(s, cmd, &out, NULL), i % 5);
        assert_string_equal(out.data, want);
        gs_buf_release(&out);
    }
    gs_ssh_free(s);
}

/* The server dies while `sleep 30` runs: a clear error within seconds, not a hang. */
struct killer {
    struct gs_test_sshd *d;
    char marker[700];
};

static void *kill_when_started(void *arg)
{
    struct killer *k = arg;
    int64_t end = gs_clock_mono_ms() + 10000;
    while (access(k->marker, F_OK) != 0 && gs_clock_mono_ms() < end)
        usleep(10000);
    kill_server_and_connections(k->d);
    return NULL;
}

static void test_exec__server_killed_mid_command_gives_clear_error_fast(void **state)
{
    (void)state;
    start_own(&own, NULL, 1);
    struct gs_ssh_opts o = opts_for(&own);
    o.keepalive_ms = 1000;
    o.dead_after_ms = 3000;
    struct gs_ssh *s = connect_ok(&o);
    struct killer k = {.d = &own};
    snprintf(k.marker, sizeof(k.marker), "%s/started", own.dir);
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "touch '%s' && sleep 30", k.marker);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, kill_when_started, &k), 0);
    struct gs_error err = {0};
    int64_t t0 = gs_clock_mono_ms();
    int rc = gs_exec_capture(s, cmd, NULL, NULL, &err);
    int64_t took = gs_clock_mono_ms() - t0;
    pthread_join(th, NULL);
    if (rc != GS_E_DISCONNECTED && rc != GS_E_REMOTE)
        fail_msg("got %d after %lld ms (%s), want a disconnection error", rc, (long long)took,
                 err.msg);
    print_message("server killed: %s after %lld ms: %s\n", gs_error_name(rc), (long long)took,
                  err.msg);
    assert_true(took < 8000);
    assert_true(err.msg[0] != '\0');
    gs_ssh_free(s);
}

static void test_exec__silent_dead_link_detected_by_keepalive(void **state)
{
    /* sshd frozen (SIGSTOP): the socket stays open but nothing answers; our keepalive must
     * declare the link dead after dead_after_ms instead of waiting for the command forever */
    (void)state;
    start_own(&own, NULL, 1);
    struct gs_ssh_opts o = opts_for(&own);
    o.keepalive_ms = 500;
    o.dead_after_ms = 2000;
    struct gs_ssh *s = connect_ok(&o);
    /* freeze the connection's processes, not the listener */
    signal_descendants(own.pid, SIGSTOP);
    struct gs_error err = {0};
    int64_t t0 = gs_clock_mono_ms();
    int rc = gs_exec_capture(s, "sleep 30", NULL, NULL, &err);
    int64_t took = gs_clock_mono_ms() - t0;
    signal_descendants(own.pid, SIGKILL);
    if (rc != GS_E_DISCONNECTED)
        fail_msg("got %d after %lld ms (%s), want GS_E_DISCONNECTED", rc, (long long)took, err.msg);
    print_message("frozen server detected after %lld ms: %s\n", (long long)took, err.msg);
    assert_true(took < 6000);
    gs_ssh_free(s);
}

/* ---- SFTP ---- */

/* The SFTP transport users run (remote/sftp_ops.c, behind struct gs_fileops), rooted at the
 * shared server's folder; paths in requests are relative to it. */

/* The last completion, its strings copied (they live only during the callback). */
struct sftp_done {
    int n, ok, noop, err_no;
    char message[1024], kept[1024];
};

static void sftp_on_done(void *cb_ctx, void *req_ctx, const struct gs_fop_result *r)
{
    struct sftp_done *d = cb_ctx;
    (void)req_ctx;
    d->n++;
    d->ok = r->ok;
    d->noop = r->noop;
    d->err_no = r->err_no;
    snprintf(d->message, sizeof(d->message), "%s", r->message ? r->message : "");
    snprintf(d->kept, sizeof(d->kept), "%s", r->kept ? r->kept : "");
}

static struct gs_fileops *open_sftp(struct gs_ssh *s, struct sftp_done *done)
{
    struct gs_fileops *ops = NULL;
    struct gs_error err = {0};
    if (gs_sftp_ops_open(&ops, s, shared.dir, &err) != 0)
        fail_msg("sftp: %s", err.msg);
    ops->done = sftp_on_done;
    ops->done_ctx = done;
    return ops;
}

/* Runs one request to its end and returns its completion. */
static struct sftp_done *sftp_run(struct gs_fileops *ops, const struct gs_fop_req *req)
{
    struct sftp_done *d = ops->done_ctx;
    struct gs_error err = {0};
    memset(d, 0, sizeof(*d));
    if (ops->submit(ops, req, &err) != 0 || ops->drain(ops, &err) != 0)
        fail_msg("SFTP transport failed: %s", err.msg);
    assert_int_equal(d->n, 1);
    return d;
}

/* Uploads local file `local` to `rel` with `mode`, replacing whatever is there. */
static struct sftp_done *sftp_put(struct gs_fileops *ops, const char *local, const char *rel,
                                  uint32_t mode)
{
    struct stat st;
    assert_int_equal(stat(local, &st), 0);
    struct gs_fop_req req = {.type = GS_FOP_PUT,
                             .path = rel,
                             .local_file = local,
                             .size = (uint64_t)st.st_size,
                             .mode = mode,
                             .mtime_ns = (int64_t)st.st_mtime * 1000000000,
                             .expect = GS_FOP_EXPECT_FORCE};
    return sftp_run(ops, &req);
}

static struct sftp_done *sftp_mkdir(struct gs_fileops *ops, const char *rel)
{
    struct gs_fop_req req = {.type = GS_FOP_MKDIR, .path = rel, .mode = 0755};
    return sftp_run(ops, &req);
}

static struct sftp_done *sftp_rename(struct gs_fileops *ops, const char *from, const char *to,
                                     enum gs_fop_expect expect)
{
    struct gs_fop_req req = {.type = GS_FOP_RENAME, .path = from, .path2 = to, .expect = expect};
    return sftp_run(ops, &req);
}

static struct sftp_done *sftp_delete(struct gs_fileops *ops, const char *rel)
{
    struct gs_fop_req req = {.type = GS_FOP_DELETE, .path = rel};
    return sftp_run(ops, &req);
}

/* What the server holds at `rel`, a file's content hashed (read back whole). */
static struct gs_fop_stat sftp_probe(struct gs_fileops *ops, const char *rel)
{
    struct gs_fop_stat st;
    struct gs_error err = {0};
    if (ops->probe(ops, &rel, 1, &st, &err) != 0)
        fail_msg("probe %s: %s", rel, err.msg);
    return st;
}

/* XXH3-128 of `len` bytes, canonical, as the transport reports a file's hash. */
static void hash_bytes(const void *data, size_t len, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, len));
    memcpy(out, c.digest, 16);
}

static void hash_file(const char *path, uint8_t out[16])
{
    struct gs_buf b = GS_BUF_INIT;
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
        gs_buf_add(&b, chunk, n);
    fclose(fp);
    hash_bytes(b.data, b.len, out);
    gs_buf_release(&b);
}

static void make_random_file(const char *path, int mib)
{
    assert_int_equal(sh("head -c %dM /dev/urandom > '%s'", mib, path), 0);
}

static void test_sftp__upload_200mb_byte_for_byte(void **state)
{
    (void)state;
    char local[] = "/tmp/gs-test-up.XXXXXX", remote[800];
    int fd = mkstemp(local);
    assert_true(fd >= 0);
    close(fd);
    make_random_file(local, 200);
    snprintf(remote, sizeof(remote), "%s/uploaded.bin", shared.dir);
    struct gs_ssh *s = shared_session();
    struct sftp_done done;
    struct gs_fileops *ops = open_sftp(s, &done);
    int64_t t0 = gs_clock_mono_ms();
    struct sftp_done *r = sftp_put(ops, local, "uploaded.bin", 0640);
    int64_t took = gs_clock_mono_ms() - t0;
    if (!r->ok)
        fail_msg("upload failed: %s", r->message);
    print_message("200 MiB SFTP upload: %lld ms (%.1f MiB/s)\n", (long long)took,
                  200.0 * 1000.0 / (double)(took ? took : 1));
    assert_true(took < 60000);
    assert_int_equal(sh("cmp -s '%s' '%s'", local, remote), 0);
    struct gs_fop_stat st = sftp_probe(ops, "uploaded.bin");
    assert_int_equal(st.kind, GS_FOP_KIND_FILE); /* there, and no directory */
    assert_int_equal(st.size, 200u << 20);
    assert_int_equal(st.mode, 0640);
    /* no temporary file left beside it */
    assert_int_equal(sh("ls '%s' | grep -q gpusync-tmp", shared.dir), 1);
    ops->close(ops);
    gs_ssh_free(s);
    unlink(local);
    unlink(remote);
}

/* The transport reads a server file back whole (to tell whether it was edited there before it
 * replaces or deletes it): what it reads is what was sent. */
static void test_sftp__read_back_round_trip_and_missing_file(void **state)
{
    (void)state;
    char local[] = "/tmp/gs-test-down.XXXXXX", remote[800];
    int fd = mkstemp(local);
    assert_true(fd >= 0);
    close(fd);
    make_random_file(local, 20);
    snprintf(remote, sizeof(remote), "%s/round.bin", shared.dir);
    struct gs_ssh *s = shared_session();
    struct sftp_done done;
    struct gs_fileops *ops = open_sftp(s, &done);
    assert_true(sftp_put(ops, local, "round.bin", 0600)->ok);
    struct gs_fop_stat st = sftp_probe(ops, "round.bin");
    uint8_t want[16];
    hash_file(local, want);
    assert_true(st.has_hash);
    assert_memory_equal(st.hash, want, 16);
    /* a missing file: nothing there, and an operation on it fails naming it */
    assert_int_equal(sftp_probe(ops, "no-such-file").kind, GS_FOP_KIND_NONE);
    struct gs_fop_req chmod = {.type = GS_FOP_CHMOD, .path = "no-such-file", .mode = 0644};
    struct sftp_done *r = sftp_run(ops, &chmod);
    assert_false(r->ok);
    assert_int_equal(r->err_no, ENOENT);
    assert_non_null(strstr(r->message, "no-such-file"));
    assert_int_equal(sh("cmp -s '%s' '%s'", local, remote), 0); /* untouched by the failure */
    ops->close(ops);
    gs_ssh_free(s);
    unlink(local);
    unlink(remote);
}

static void test_sftp__mkdir_p_rename_unlink(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    struct sftp_done done;
    struct gs_fileops *ops = open_sftp(s, &done);
    char local[] = "/tmp/gs-test-ren.XXXXXX";
    const char *dir = "m/n/o", *a = "m/n/o/a", *b = "m/n/o/b";
    assert_true(sftp_mkdir(ops, dir)->ok);
    assert_true(sftp_mkdir(ops, dir)->ok);
    assert_int_equal(sftp_probe(ops, dir).kind, GS_FOP_KIND_DIR);
    int fd = mkstemp(local);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "one", 3), 3);
    close(fd);
    assert_true(sftp_put(ops, local, a, 0644)->ok);
    assert_true(sftp_put(ops, local, b, 0644)->ok);
    /* a rename over an existing file never loses it unless told to replace it */
    struct sftp_done *r = sftp_rename(ops, a, b, GS_FOP_EXPECT_ABSENT);
    assert_true(r->ok);
    assert_non_null(strstr(r->kept, "m/n/o/b.gpusync-conflict-"));
    assert_true(sftp_put(ops, local, a, 0644)->ok);
    assert_true(sftp_rename(ops, a, b, GS_FOP_EXPECT_FORCE)->ok);
    assert_int_equal(sftp_probe(ops, a).kind, GS_FOP_KIND_NONE);
    assert_true(sftp_delete(ops, b)->ok);
    assert_int_equal(sftp_probe(ops, b).kind, GS_FOP_KIND_NONE);
    r = sftp_delete(ops, b); /* nothing to delete: done already */
    assert_true(r->ok && r->noop);
    /* mkdir -p through a file is refused with a message */
    assert_true(sftp_put(ops, local, a, 0644)->ok);
    r = sftp_mkdir(ops, "m/n/o/a/sub");
    assert_false(r->ok);
    assert_int_equal(r->err_no, ENOTDIR);
    assert_non_null(strstr(r->message, "not a directory"));
    ops->close(ops);
    gs_ssh_free(s);
    unlink(local);
    sh("rm -rf '%s/m'", shared.dir);
}

/* Uploads a small file under `name` in `dir` (relative to the root), checks the bytes arrived
 * under exactly that name, probes, renames it and deletes it. */
static void hostile_name_round_trip(struct gs_fileops *ops, const char *dir, const char *name)
{
    char local[] = "/tmp/gs-test-name.XXXXXX";
    int fd = mkstemp(local);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, name, strlen(name)), (ssize_t)strlen(name));
    close(fd);
    struct gs_buf rel = GS_BUF_INIT, renamed = GS_BUF_INIT, seen = GS_BUF_INIT;
    gs_buf_addf(&rel, "%s/%s", dir, name);
    gs_buf_addf(&renamed, "%s/r%s", dir, name);
    if (renamed.len > strlen(dir) + 1 + 255) /* keep "r"+name within NAME_MAX */
        renamed.data[strlen(dir) + 1 + 255] = '\0';
    struct sftp_done *r = sftp_put(ops, local, rel.data, 0644);
    if (!r->ok) {
        unlink(local);
        fail_msg("upload of a %zu-byte name failed: %s", strlen(name), r->message);
    }
    /* same machine: the file is there under that exact name with the right bytes */
    struct stat lst;
    gs_buf_addf(&seen, "%s/%s", shared.dir, rel.data);
    assert_int_equal(stat(seen.data, &lst), 0);
    assert_int_equal(lst.st_size, (off_t)strlen(name));
    struct gs_fop_stat st = sftp_probe(ops, rel.data);
    assert_int_equal(st.kind, GS_FOP_KIND_FILE);
    assert_int_equal(st.size, strlen(name));
    uint8_t want[16];
    hash_bytes(name, strlen(name), want);
    assert_true(st.has_hash);
    assert_memory_equal(st.hash, want, 16); /* read back: the same bytes */
    assert_true(sftp_rename(ops, rel.data, renamed.data, GS_FOP_EXPECT_FORCE)->ok);
    gs_buf_reset(&seen);
    gs_buf_addf(&seen, "%s/%s", shared.dir, renamed.data);
    assert_int_equal(stat(seen.data, &lst), 0);
    assert_true(sftp_delete(ops, renamed.data)->ok);
    assert_int_not_equal(stat(seen.data, &lst), 0);
    unlink(local);
    gs_buf_release(&rel);
    gs_buf_release(&renamed);
    gs_buf_release(&seen);
}

static void test_sftp__hostile_names(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    struct sftp_done done;
    struct gs_fileops *ops = open_sftp(s, &done);
    const char *dir = "hostile dir -x";
    assert_true(sftp_mkdir(ops, dir)->ok);
    const char *names[] = {
        "with space",
        "new\nline",
        "-leading-dash",
        "--",
        "\xff\xfe\x80-not-utf8",
        "quote'and\"dq",
        "$(touch gs-test-pwned);x",
        "tab\there",
        "*",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        hostile_name_round_trip(ops, dir, names[i]);
    char pwned[900];
    snprintf(pwned, sizeof(pwned), "%s/gs-test-pwned", shared.home);
    assert_int_not_equal(access(pwned, F_OK), 0);
    assert_int_not_equal(access("gs-test-pwned", F_OK), 0);
    ops->close(ops);
    gs_ssh_free(s);
    sh("rm -rf '%s/%s'", shared.dir, dir);
}

static void test_sftp__255_byte_name(void **state)
{
    (void)state;
    struct gs_ssh *s = shared_session();
    struct sftp_done done;
    struct gs_fileops *ops = open_sftp(s, &done);
    char name[256];
    assert_true(sftp_mkdir(ops, "long")->ok);
    memset(name, 'n', 255);
    name[255] = '\0';
    hostile_name_round_trip(ops, "long", name);
    ops->close(ops);
    gs_ssh_free(s);
    sh("rm -rf '%s/long'", shared.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_auth__key_login_reports_method_and_host_fingerprint,
                               use_shared),
        cmocka_unit_test_setup(test_auth__explicit_identity_is_tried_first_and_named, use_shared),
        cmocka_unit_test_setup(test_connect__closed_port_fails_fast_with_connect_error, use_shared),
        cmocka_unit_test_teardown(test_auth__password_login, destroy_own),
        cmocka_unit_test_teardown(test_auth__wrong_password_fails_quickly_with_one_attempt,
                                  destroy_own),
        cmocka_unit_test_teardown(test_auth__rsa_only_key_explains_rsa_sha2_and_install_key,
                                  destroy_own),
        cmocka_unit_test(test_hostkey__unknown_host_refused_without_accept_new),
        cmocka_unit_test(test_hostkey__unknown_host_declined_at_prompt_is_not_recorded),
        cmocka_unit_test(test_hostkey__unknown_host_accepted_at_prompt_is_recorded),
        cmocka_unit_test(test_hostkey__accept_new_records_bracketed_entry_and_then_trusts_it),
        cmocka_unit_test(test_hostkey__hashed_known_hosts_entry_is_trusted),
        cmocka_unit_test_teardown(test_hostkey__changed_key_refused_with_both_fingerprints,
                                  destroy_own),
        cmocka_unit_test_teardown(
            test_hostkey__known_ed25519_with_server_also_offering_ecdsa_connects, destroy_own),
        cmocka_unit_test(test_hostkey__port_22_entry_does_not_vouch_for_another_port),
        cmocka_unit_test(test_hostkey__key_pinned_in_files_named_by_ssh_config_beats_accept_new),
        cmocka_unit_test(test_hostkey__revoked_or_after_a_bad_line_beats_accept_new),
        cmocka_unit_test_setup(test_exec__exit_codes_and_signal, use_shared),
        cmocka_unit_test_setup(test_exec__stdout_and_stderr_stay_separate, use_shared),
        cmocka_unit_test_setup(test_exec__output_to_file_descriptors, use_shared),
        cmocka_unit_test_setup(test_exec__stdin_is_streamed_from_memory_and_fd, use_shared),
        cmocka_unit_test_setup(test_exec__quoted_arguments_arrive_unchanged, use_shared),
        cmocka_unit_test_setup(test_exec__many_commands_on_one_session, use_shared),
        cmocka_unit_test_teardown(test_exec__server_killed_mid_command_gives_clear_error_fast,
                                  destroy_own),
        cmocka_unit_test_teardown(test_exec__silent_dead_link_detected_by_keepalive, destroy_own),
        cmocka_unit_test_setup(test_sftp__upload_200mb_byte_for_byte, use_shared),
        cmocka_unit_test_setup(test_sftp__read_back_round_trip_and_missing_file, use_shared),
        cmocka_unit_test_setup(test_sftp__mkdir_p_rename_unlink, use_shared),
        cmocka_unit_test_setup(test_sftp__hostile_names, use_shared),
        cmocka_unit_test_setup(test_sftp__255_byte_name, use_shared),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* tests/e2e/test_shell_noise.c: a server whose login shell prints in non-interactive sessions (a
 * banner, nvidia-smi, conda in .bashrc, as on many rented images): push, run, pull, exec and the
 * watch daemon's relay must read past it, doctor must name the file, SFTP (which nothing can
 * read past) must fail with exit 5 and no summary, and a slow shell start must be announced. */
#include <setjmp.h>
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

#define USER       "gsnoisy"
#define USER_HOME  "/home/" USER
#define BASHRC     USER_HOME "/.bashrc"
#define TIMEOUT_MS 90000

/* What a noisy image prints: a banner without a final newline, the first bytes of gpusync's own
 * marker (a partial match must not swallow or corrupt anything), and a line on stderr. */
static const char noisy_bashrc[] = "echo 'Welcome to the GPU cloud'\n"
                                   "printf '\\036gpu half a marker'\n"
                                   "echo 'conda: (base) activated' >&2\n"
                                   "printf 'no newline at the end'\n";

static struct gs_test_sshd server;
static char project[600], remote_dir[700], target[128];

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void read_file(const char *path, struct gs_buf *out)
{
    gs_buf_reset(out);
    FILE *fp = fopen(path, "r");
    if (!fp)
        fail_msg("cannot read %s", path);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
        gs_buf_add(out, chunk, n);
    fclose(fp);
    gs_buf_grow(out, 0);
}

static struct gs_test_result gpusync(const char *const *args)
{
    return gs_test_run_gpusync(project, NULL, NULL, args, TIMEOUT_MS);
}

static json_t *parse_json(const struct gs_test_result *r, const char *what)
{
    json_error_t e;
    json_t *o = json_loads(r->out.data, 0, &e);
    if (!o)
        fail_msg("%s: not JSON (%s): %s", what, e.text, r->out.data);
    return o;
}

static void expect_no_noise(const struct gs_test_result *r, const char *what)
{
    if (strstr(r->out.data, "Welcome") || strstr(r->out.data, "newline at the end") ||
        strstr(r->err.data, "conda:") || strchr(r->out.data, '\036'))
        fail_msg("%s: the shell's noise reached the output\nstdout: %s\nstderr: %s", what,
                 r->out.data, r->err.data);
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli_with(&server, "--password-user " USER ":Noisy-Pw-41 "
                                                 "--sftp-server /usr/lib/openssh/sftp-server") != 0)
        return -1;
    /* sshd reads the authorised keys as the user logging in: let USER through the 0700 folder */
    gs_test_sh("chmod 711 %s && chmod 644 %s/authorized_keys", server.dir, server.dir);
    write_file(BASHRC, noisy_bashrc);
    snprintf(project, sizeof(project), "/tmp/gs-noise-proj.XXXXXX");
    if (!mkdtemp(project))
        return -1;
    const char *base = strrchr(project, '/') + 1;
    snprintf(remote_dir, sizeof(remote_dir), USER_HOME "/gpusync/%s", base);
    snprintf(target, sizeof(target), USER "@127.0.0.1:%d", server.port);
    struct gs_test_result r =
        gs_test_run_gpusync(project, NULL, NULL, GS_TEST_ARGS("init", target), TIMEOUT_MS);
    int ok = r.status == 0;
    if (!ok)
        fprintf(stderr, "init failed: %s%s\n", r.out.data, r.err.data);
    gs_test_result_release(&r);
    return ok ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sh("rm -rf %s %s; rm -f %s", project, remote_dir, BASHRC);
    gs_test_sshd_destroy(&server);
    return 0;
}

static int restore_noise(void **state)
{
    (void)state;
    write_file(BASHRC, noisy_bashrc);
    gs_test_sh("sed -i 's/^\\ttransport = .*/\\ttransport = agent/; /^resident = off/d' "
               "%s/.gpusync/config",
               project);
    return 0;
}

static void push_run_pull_and_exec_read_past_the_noise(void **state)
{
    (void)state;
    char path[800];
    snprintf(path, sizeof(path), "%s/train.py", project);
    write_file(path, "print('hello')\n");
    struct gs_test_result r = gpusync(GS_TEST_ARGS("push", "--json"));
    gs_test_expect_status(&r, 0, "push");
    json_t *o = parse_json(&r, "push");
    assert_int_equal(json_integer_value(json_object_get(o, "sent")), 1);
    json_decref(o);
    gs_test_result_release(&r);
    struct gs_buf got = GS_BUF_INIT;
    snprintf(path, sizeof(path), "%s/train.py", remote_dir);
    read_file(path, &got);
    assert_string_equal(got.data, "print('hello')\n");

    r = gpusync(GS_TEST_ARGS("run", "--cpu", "2", "--", "sh", "-c", "echo rank=$RANK"));
    gs_test_expect_status(&r, 0, "run");
    expect_no_noise(&r, "run");
    assert_non_null(strstr(r.out.data, "rank=0"));
    assert_non_null(strstr(r.out.data, "rank=1"));
    gs_test_result_release(&r);

    r = gpusync(GS_TEST_ARGS("exec", "--", "sh", "-c", "printf out; printf err >&2; exit 3"));
    gs_test_expect_status(&r, 3, "exec");
    assert_string_equal(r.out.data, "out");
    assert_string_equal(r.err.data, "err");
    gs_test_result_release(&r);

    r = gpusync(GS_TEST_ARGS("exec", "--", "sh", "-c", "mkdir -p out && printf 42 > out/r.txt"));
    gs_test_expect_status(&r, 0, "exec mkdir");
    gs_test_result_release(&r);
    r = gpusync(GS_TEST_ARGS("pull", "out"));
    gs_test_expect_status(&r, 0, "pull");
    gs_test_result_release(&r);
    snprintf(path, sizeof(path), "%s/out/r.txt", project);
    read_file(path, &got);
    assert_string_equal(got.data, "42");
    gs_buf_release(&got);
}

static void the_watch_daemon_and_its_relay_read_past_the_noise(void **state)
{
    (void)state;
    struct gs_test_result r = gpusync(GS_TEST_ARGS("watch", "-d"));
    gs_test_expect_status(&r, 0, "watch -d");
    gs_test_result_release(&r);
    char path[800];
    snprintf(path, sizeof(path), "%s/saved.txt", project);
    write_file(path, "saved under watch\n");
    r = gpusync(GS_TEST_ARGS("flush"));
    gs_test_expect_status(&r, 0, "flush");
    gs_test_result_release(&r);
    r = gpusync(GS_TEST_ARGS("run", "--cpu", "1", "--", "cat", "saved.txt"));
    gs_test_expect_status(&r, 0, "run through the daemon");
    expect_no_noise(&r, "run through the daemon");
    assert_non_null(strstr(r.out.data, "saved under watch"));
    gs_test_result_release(&r);
    r = gpusync(GS_TEST_ARGS("watch", "--stop"));
    gs_test_expect_status(&r, 0, "watch --stop");
    gs_test_result_release(&r);
    struct gs_buf got = GS_BUF_INIT;
    snprintf(path, sizeof(path), "%s/saved.txt", remote_dir);
    read_file(path, &got);
    assert_string_equal(got.data, "saved under watch\n");
    gs_buf_release(&got);
}

/* The status of doctor --json's check `name`. */
static const char *check_status(json_t *o, const char *name)
{
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(o, "checks"), i, c)
    {
        if (strcmp(json_string_value(json_object_get(c, "name")), name) == 0)
            return json_string_value(json_object_get(c, "status"));
    }
    return "missing";
}

static const char *shell_check(json_t *o)
{
    return check_status(o, "shell");
}

static void doctor_names_the_file_that_prints(void **state)
{
    (void)state;
    struct gs_test_result r = gpusync(GS_TEST_ARGS("doctor", "--json"));
    gs_test_expect_status(&r, 0, "doctor (agent transport: a warning)");
    json_t *o = parse_json(&r, "doctor");
    assert_string_equal(shell_check(o), "warn");
    assert_string_equal(check_status(o, "stdin"), "ok");
    json_t *facts = json_object_get(o, "facts");
    assert_string_equal(json_string_value(json_object_get(facts, "shell_noise_files")), BASHRC);
    assert_non_null(strstr(json_string_value(json_object_get(facts, "shell_noise")), "Welcome"));
    json_decref(o);
    gs_test_result_release(&r);

    write_file(BASHRC, "case $- in *i*) echo 'Welcome, interactive user' ;; esac\n");
    r = gpusync(GS_TEST_ARGS("doctor", "--json"));
    gs_test_expect_status(&r, 0, "doctor on a quiet shell");
    o = parse_json(&r, "doctor");
    assert_string_equal(shell_check(o), "ok");
    assert_true(json_is_null(json_object_get(json_object_get(o, "facts"), "shell_noise")));
    json_decref(o);
    gs_test_result_release(&r);
}

static void sftp_through_a_noisy_shell_fails_with_exit_5_and_no_summary(void **state)
{
    (void)state;
    gs_test_sh("sed -i 's/^\\ttransport = .*/\\ttransport = sftp/' %s/.gpusync/config", project);
    char path[800];
    snprintf(path, sizeof(path), "%s/by-sftp.txt", project);
    write_file(path, "never half-sent\n");
    struct gs_test_result r = gpusync(GS_TEST_ARGS("push", "--json"));
    gs_test_expect_status(&r, 5, "push over SFTP through a noisy shell");
    json_t *o = parse_json(&r, "push");
    assert_false(json_is_true(json_object_get(o, "ok")));
    assert_null(json_object_get(o, "sent")); /* an error, not a summary of nothing sent */
    json_decref(o);
    gs_test_result_release(&r);
    snprintf(path, sizeof(path), "%s/by-sftp.txt", remote_dir);
    assert_int_not_equal(access(path, F_OK), 0);

    r = gpusync(GS_TEST_ARGS("doctor", "--json"));
    gs_test_expect_status(&r, 1, "doctor with transport = sftp (a failure)");
    o = parse_json(&r, "doctor");
    assert_string_equal(shell_check(o), "fail");
    json_decref(o);
    gs_test_result_release(&r);

    write_file(BASHRC, "# quiet now\n");
    r = gpusync(GS_TEST_ARGS("push", "--json"));
    gs_test_expect_status(&r, 0, "push over SFTP once the shell is quiet");
    gs_test_result_release(&r);
    assert_int_equal(access(path, F_OK), 0);
}

static void a_slow_shell_start_is_announced(void **state)
{
    (void)state;
    write_file(BASHRC, "sleep 3\n");
    struct gs_test_result r = gpusync(GS_TEST_ARGS("exec", "--", "printf", "late"));
    gs_test_expect_status(&r, 0, "exec behind a slow shell");
    assert_string_equal(r.out.data, "late");
    assert_non_null(strstr(r.err.data, "waiting for the login shell"));
    gs_test_result_release(&r);
}

/* Gives the user the startup file `bashrc` and the project resident = off (every session starts
 * the agent through the shell), and expects doctor to fail (exit 1) with its check `check`. */
static void shell_makes_doctor_fail(const char *bashrc, const char *check)
{
    write_file(BASHRC, bashrc);
    gs_test_sh("printf '[sync]\\nresident = off\\n' >> %s/.gpusync/config", project);
    struct gs_test_result r = gpusync(GS_TEST_ARGS("doctor", "--json"));
    gs_test_expect_status(&r, 1, bashrc);
    json_t *o = parse_json(&r, "doctor");
    assert_string_equal(check_status(o, check), "fail");
    json_decref(o);
    gs_test_result_release(&r);
}

/* A startup file that reads standard input takes what gpusync sends the agent (resident = off:
 * every session starts it through the shell). push waited for ever; it now gives up with exit 5
 * and says why, and doctor, whose other probes end their input at once, names it. */
static void a_shell_that_reads_input_is_named_and_push_gives_up(void **state)
{
    (void)state;
    shell_makes_doctor_fail("read LINE\n", "stdin");
    char path[800];
    snprintf(path, sizeof(path), "%s/behind-a-read.txt", project);
    write_file(path, "x\n");
    struct gs_test_result r = gpusync(GS_TEST_ARGS("push", "--json"));
    gs_test_expect_status(&r, 5, "push through a shell that reads its input");
    json_t *o = parse_json(&r, "push");
    assert_false(json_is_true(json_object_get(o, "ok")));
    const char *message = json_string_value(json_object_get(o, "message"));
    if (!message || !strstr(message, "standard input"))
        fail_msg("push through a shell that reads its input: %s", r.out.data);
    json_decref(o);
    gs_test_result_release(&r);
}

/* A startup file that breaks PATH: every command gpusync runs there fails, and each of doctor,
 * push and exec says that, not "not Linux", "no C compiler" or "remove what is there". */
static void a_broken_path_is_named_by_doctor_push_and_exec(void **state)
{
    (void)state;
    shell_makes_doctor_fail("export PATH=/nonexistent\n", "system");
    struct gs_test_result r = gpusync(GS_TEST_ARGS("push", "--json"));
    gs_test_expect_status(&r, 5, "push through a shell with a broken PATH");
    json_t *o = parse_json(&r, "push");
    assert_non_null(strstr(json_string_value(json_object_get(o, "message")), "'/nonexistent'"));
    json_decref(o);
    gs_test_result_release(&r);

    r = gpusync(GS_TEST_ARGS("exec", "--", "true"));
    gs_test_expect_status(&r, 255, "exec through a shell with a broken PATH");
    assert_non_null(strstr(r.err.data, "its PATH is '/nonexistent'"));
    gs_test_result_release(&r);
}

/* The remote home full (a rented server's small system disk) while the project sits on a roomy
 * data disk: every push failed to install the agent, and doctor said "disk ok". It now fails its
 * disk check naming ~/.gpusync. (This user's own home: root's is the machine's.) */
static void doctor_fails_its_disk_check_when_the_agent_has_no_room(void **state)
{
    (void)state;
    write_file(BASHRC, "# quiet\n");
    const char *dir = USER_HOME "/.gpusync";
    gs_test_sh("umount %s 2>/dev/null; rm -rf %s; mkdir -p %s", dir, dir, dir);
    if (gs_test_sh("mount -t tmpfs -o size=64k,mode=0755 tmpfs %s && chown " USER " %s && "
                   "head -c 100000 /dev/zero > %s/filler 2>/dev/null; true",
                   dir, dir, dir) != 0)
        fail_msg("could not mount a small tmpfs on %s", dir);
    struct gs_test_result r = gpusync(GS_TEST_ARGS("doctor", "--json"));
    gs_test_sh("umount %s; rmdir %s", dir, dir);
    gs_test_expect_status(&r, 1, "doctor with a full ~/.gpusync");
    json_t *o = parse_json(&r, "doctor");
    json_t *c;
    size_t i;
    int failed = 0;
    json_array_foreach(json_object_get(o, "checks"), i, c)
    {
        failed |= !strcmp(json_string_value(json_object_get(c, "name")), "disk") &&
                  !strcmp(json_string_value(json_object_get(c, "status")), "fail");
    }
    assert_true(failed);
    json_decref(o);
    gs_test_result_release(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(push_run_pull_and_exec_read_past_the_noise, restore_noise),
        cmocka_unit_test_teardown(the_watch_daemon_and_its_relay_read_past_the_noise,
                                  restore_noise),
        cmocka_unit_test_teardown(doctor_names_the_file_that_prints, restore_noise),
        cmocka_unit_test_teardown(sftp_through_a_noisy_shell_fails_with_exit_5_and_no_summary,
                                  restore_noise),
        cmocka_unit_test_teardown(a_slow_shell_start_is_announced, restore_noise),
        cmocka_unit_test_teardown(a_shell_that_reads_input_is_named_and_push_gives_up,
                                  restore_noise),
        cmocka_unit_test_teardown(a_broken_path_is_named_by_doctor_push_and_exec, restore_noise),
        cmocka_unit_test_teardown(doctor_fails_its_disk_check_when_the_agent_has_no_room,
                                  restore_noise),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

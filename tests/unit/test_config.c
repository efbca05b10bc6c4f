/* tests/unit/test_config.c: .gpusync/config parsing, every malformed form's file:line message,
 * target strings ("[user@]host[:port]") and the save/load round trip. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"

static const char valid_config[] = "# a comment\n"
                                   "[remote]\n"
                                   "\thost = gpu1.example.com\n"
                                   "\tport = 2222\n"
                                   "\tuser = alice\n"
                                   "\tpath = ~/work/proj\n"
                                   "\tidentity = ~/.ssh/gpusync_ed25519\n"
                                   "\n"
                                   "[sync]\n"
                                   "    exclude = *.pyc\n"
                                   "    exclude = data/\n"
                                   "    exclude = .venv\n"
                                   "    transport = sftp\n"
                                   "    compress = zstd\n"
                                   "    resident = off\n"
                                   "    check_every = 300\n"
                                   "\n"
                                   "[job \"train\"]\n"
                                   "\tcommand = python train.py --lr 0.1\n"
                                   "\tgpus = 0,2\n"
                                   "[job \"eval\"]\n"
                                   "\tcommand = ./eval.sh\n";

static void test_config__valid_file_fills_every_field(void **state)
{
    (void)state;
    struct gs_config cfg;
    struct gs_error err = {0};
    assert_int_equal(gs_config_parse(&cfg, valid_config, "cfg", &err), 0);
    assert_string_equal(cfg.host, "gpu1.example.com");
    assert_int_equal(cfg.port, 2222);
    assert_string_equal(cfg.user, "alice");
    assert_string_equal(cfg.remote_path, "~/work/proj");
    assert_string_equal(cfg.identity, "~/.ssh/gpusync_ed25519");
    assert_int_equal(cfg.transport, GS_TRANSPORT_SFTP);
    assert_int_equal(cfg.compress, GS_COMPRESS_ZSTD);
    assert_int_equal(cfg.no_resident, 1);
    assert_int_equal(cfg.check_every_s, 300);
    assert_string_equal(cfg.file, "cfg");
    gs_config_release(&cfg);
}

static void test_config__indented_git_style_lines_are_separate_keys(void **state)
{
    (void)state;
    /* Debian's inih treats indented lines as continuations unless gpusync dedents them. */
    struct gs_config cfg;
    const char *text = "[remote]\n    host = h\n    user = u\n\t\tport = 22\n";
    assert_int_equal(gs_config_parse(&cfg, text, "cfg", NULL), 0);
    assert_string_equal(cfg.host, "h");
    assert_string_equal(cfg.user, "u");
    assert_int_equal(cfg.port, 22);
    gs_config_release(&cfg);
}

static void test_config__inline_comments_with_hash_or_semicolon_are_dropped(void **state)
{
    (void)state;
    struct gs_config cfg;
    const char *text = "[remote]\nhost = 10.1.2.3   # the lab box\nport = 2222 ; ssh\n"
                       "path = runs#1\n";
    assert_int_equal(gs_config_parse(&cfg, text, "cfg", NULL), 0);
    assert_string_equal(cfg.host, "10.1.2.3");
    assert_int_equal(cfg.port, 2222);
    assert_string_equal(cfg.remote_path, "runs#1"); /* '#' inside a word is part of it */
    gs_config_release(&cfg);
}

static void test_config__repeated_exclude_accumulates_in_order(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, valid_config, "cfg", NULL), 0);
    assert_int_equal(cfg.n_excludes, 3);
    assert_string_equal(cfg.excludes[0], "*.pyc");
    assert_string_equal(cfg.excludes[1], "data/");
    assert_string_equal(cfg.excludes[2], ".venv");
    gs_config_release(&cfg);
}

static void test_config__job_sections_by_name(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, valid_config, "cfg", NULL), 0);
    assert_int_equal(cfg.n_jobs, 2);
    const struct gs_job *train = gs_config_job(&cfg, "train");
    assert_non_null(train);
    assert_string_equal(train->command, "python train.py --lr 0.1");
    assert_string_equal(train->gpus, "0,2");
    const struct gs_job *eval = gs_config_job(&cfg, "eval");
    assert_non_null(eval);
    assert_string_equal(eval->command, "./eval.sh");
    assert_null(eval->gpus);
    assert_null(gs_config_job(&cfg, "nope"));
    gs_config_release(&cfg);
}

static void test_config__defaults_when_only_host_given(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, "[remote]\nhost=h\n", "cfg", NULL), 0);
    assert_int_equal(cfg.port, 0);
    assert_null(cfg.user);
    assert_null(cfg.remote_path);
    assert_int_equal(cfg.transport, GS_TRANSPORT_AGENT);
    assert_int_equal(cfg.n_excludes, 0);
    assert_int_equal(cfg.n_jobs, 0);
    gs_config_release(&cfg);
}

/* Parses `text`, expects GS_E_CONFIG and a message starting with "prefix" holding each of the
 * NULL-terminated fragments. */
static void expect_error(const char *text, const char *prefix, ...)
{
    struct gs_config cfg;
    struct gs_error err = {0};
    int rc = gs_config_parse(&cfg, text, "/p/.gpusync/config", &err);
    assert_int_equal(rc, GS_E_CONFIG);
    assert_int_equal(err.code, GS_E_CONFIG);
    if (strncmp(err.msg, prefix, strlen(prefix)) != 0)
        fail_msg("message '%s' does not start with '%s'", err.msg, prefix);
    va_list ap;
    va_start(ap, prefix);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(err.msg, frag))
            fail_msg("message '%s' lacks '%s'", err.msg, frag);
    va_end(ap);
    /* the config is left released */
    assert_null(cfg.host);
    assert_null(cfg.excludes);
    assert_null(cfg.jobs);
}

static void test_config__unknown_key_names_file_line_and_key(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\nhots = typo\n", "/p/.gpusync/config:3:", "hots", "[remote]",
                 NULL);
    expect_error("[sync]\nexclude = a\ncolour = red\n[remote]\nhost=h\n",
                 "/p/.gpusync/config:3:", "colour", "[sync]", NULL);
    expect_error("[remote]\nhost=h\n[job \"t\"]\ncommand = x\ngpu = 1\n",
                 "/p/.gpusync/config:5:", "gpu", "t", NULL);
    expect_error("[remote]\nhost=h\n[sync]\nresident = yes\n",
                 "/p/.gpusync/config:4:", "sync.resident", "'yes'", "on, off", NULL);
    expect_error("[remote]\nhost=h\n[sync]\ncheck_every = 1m\n",
                 "/p/.gpusync/config:4:", "sync.check_every", "'1m'", "seconds", NULL);
    expect_error("[remote]\nhost=h\n[sync]\ncheck_every = -5\n",
                 "/p/.gpusync/config:4:", "sync.check_every", "'-5'", NULL);
}

/* check_every: seconds, or off (0 too); unset leaves the default to the daemon. */
static void test_config__check_every_takes_seconds_or_off(void **state)
{
    (void)state;
    const char *const texts[] = {"[remote]\nhost=h\n",
                                 "[remote]\nhost=h\n[sync]\ncheck_every = off\n",
                                 "[remote]\nhost=h\n[sync]\ncheck_every = 0\n",
                                 "[remote]\nhost=h\n[sync]\ncheck_every = 5\n"};
    const int want[] = {0, -1, -1, 5};
    for (int i = 0; i < 4; i++) {
        struct gs_config cfg;
        struct gs_error err = {0};
        if (gs_config_parse(&cfg, texts[i], "cfg", &err) != 0)
            fail_msg("%s: %s", texts[i], err.msg);
        assert_int_equal(cfg.check_every_s, want[i]);
        gs_config_release(&cfg);
    }
}

/* [job] cpu = N asks for CPU ranks; a job with neither gpus nor cpu leaves both unset. */
static void test_config__job_cpu_ranks_are_read_and_saved(void **state)
{
    (void)state;
    struct gs_config cfg;
    struct gs_error err = {0};
    const char *text = "[remote]\nhost = h\n[job \"c\"]\ncommand = ./t.sh\ncpu = 3\n";
    if (gs_config_parse(&cfg, text, "cfg", &err) != 0)
        fail_msg("cpu = 3 refused: %s", err.msg);
    const struct gs_job *job = gs_config_job(&cfg, "c");
    assert_non_null(job);
    assert_int_equal(job->cpu, 3);
    assert_null(job->gpus);
    char dir[] = "/tmp/gs-test-config-cpu.XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/config", dir);
    assert_int_equal(gs_config_save(&cfg, path, &err), 0);
    struct gs_config back;
    assert_int_equal(gs_config_load(&back, path, &err), 0);
    assert_int_equal(gs_config_job(&back, "c")->cpu, 3);
    gs_config_release(&back);
    gs_config_release(&cfg);
    unlink(path);
    rmdir(dir);
}

/* A job's gpus is a count of 1 or more or a list of distinct GPU numbers; anything else (the
 * editors' "cpu=3" among them) is refused where it is written, not after a sync. */
static void test_config__job_gpus_must_be_a_count_or_a_list(void **state)
{
    (void)state;
    expect_error("[remote]\nhost=h\n[job \"t\"]\ncommand = x\ngpus = cpu=3\n",
                 "/p/.gpusync/config:5:", "gpus", "cpu=3", "cpu = N", NULL);
    expect_error("[remote]\nhost=h\n[job \"t\"]\ngpus = 0\n", "/p/.gpusync/config:4:", "gpus",
                 "'0'", NULL);
    const char *bad[] = {"0,,2", "0,0", ",1", "1,", "two", "-1", "1.5", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[128], value[32];
        snprintf(text, sizeof(text), "[remote]\nhost=h\n[job \"t\"]\ngpus = %s\n", bad[i]);
        snprintf(value, sizeof(value), "'%s'", bad[i]);
        expect_error(text, "/p/.gpusync/config:4:", "gpus", value, NULL);
    }
    char why[300];
    assert_int_equal(gs_config_gpus_check("2", why, sizeof(why)), 2);
    assert_int_equal(gs_config_gpus_check("3", why, sizeof(why)), 3);
    assert_int_equal(gs_config_gpus_check("0,2", why, sizeof(why)), 2);
    assert_int_equal(gs_config_gpus_check("7,1,4", why, sizeof(why)), 3);
    assert_int_equal(gs_config_gpus_check("0", why, sizeof(why)), 0);
}

static void test_config__job_cpu_must_be_a_positive_count(void **state)
{
    (void)state;
    const char *bad[] = {"0", "-2", "x", "", "99999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[128], value[32];
        snprintf(text, sizeof(text), "[remote]\nhost=h\n[job \"t\"]\ncpu = %s\n", bad[i]);
        snprintf(value, sizeof(value), "'%s'", bad[i]);
        expect_error(text, "/p/.gpusync/config:4:", "cpu", value, NULL);
    }
}

static void test_config__job_gpus_and_cpu_exclude_each_other(void **state)
{
    (void)state;
    expect_error("[remote]\nhost=h\n[job \"t\"]\ngpus = 2\ncpu = 2\n",
                 "/p/.gpusync/config:5:", "cpu", "gpus", NULL);
    expect_error("[remote]\nhost=h\n[job \"t\"]\ncpu = 2\ngpus = 1\n",
                 "/p/.gpusync/config:5:", "cpu", "gpus", NULL);
}

/* An empty command would run `sh -c ''` and "succeed": it is refused at its line. */
static void test_config__job_empty_command_names_line(void **state)
{
    (void)state;
    expect_error("[remote]\nhost=h\n[job \"t\"]\ngpus = 1\ncommand =\n",
                 "/p/.gpusync/config:5:", "command", "empty", "\"t\"", NULL);
    expect_error("[remote]\nhost=h\n[job \"t\"]\ncommand = # only a comment\n",
                 "/p/.gpusync/config:4:", "command", "empty", NULL);
}

static void test_config__unknown_section_names_line_and_section(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\n\n[remot]\nport = 1\n", "/p/.gpusync/config:5:", "remot",
                 NULL);
}

static void test_config__bad_port_names_line_key_and_value(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\nport = 70000\n", "/p/.gpusync/config:3:", "port", "70000",
                 NULL);
    expect_error("[remote]\nhost = h\nport = 0\n", "/p/.gpusync/config:3:", "port", NULL);
    expect_error("[remote]\nhost = h\nport = 22x\n", "/p/.gpusync/config:3:", "22x", NULL);
    expect_error("[remote]\nhost = h\nport = -1\n", "/p/.gpusync/config:3:", "port", NULL);
    expect_error("[remote]\nhost = h\nport =\n", "/p/.gpusync/config:3:", "port", NULL);
}

static void test_config__key_outside_a_section_names_line_and_key(void **state)
{
    (void)state;
    expect_error("# header\nhost = h\n[remote]\nhost = h\n", "/p/.gpusync/config:2:", "host",
                 "outside", NULL);
}

static void test_config__syntax_error_names_line(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\nthis line has no equals sign\n",
                 "/p/.gpusync/config:3:", "syntax", NULL);
    expect_error("[remote]\nhost = h\n[sync\n", "/p/.gpusync/config:3:", NULL);
}

static void test_config__bad_compress_names_value(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\n[sync]\ncompress = fast\n",
                 "/p/.gpusync/config:4:", "compress", "fast", NULL);
}

static void test_config__bad_transport_names_value(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\n[sync]\ntransport = rsync\n",
                 "/p/.gpusync/config:4:", "transport", "rsync", NULL);
}

static void test_config__missing_host_is_an_error_naming_the_key(void **state)
{
    (void)state;
    expect_error("[remote]\nport = 22\n", "/p/.gpusync/config", "host", "[remote]", NULL);
    expect_error("", "/p/.gpusync/config", "host", NULL);
}

/* Values reach --json output, whose strings are UTF-8: other bytes are refused by line, and real
 * UTF-8 (a path in another script) is kept as written. */
static void test_config__bytes_that_are_not_utf8_name_the_line(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\nuser = r\xe9oot\n", "/p/.gpusync/config:3:", "UTF-8", NULL);
    expect_error("[remote]\nhost = h\npath = \xc0\xaf\n", "/p/.gpusync/config:3:", "UTF-8",
                 NULL); /* an overlong '/' */
    expect_error("[remote]\nhost = h\n[job \"t\"]\ncommand = x \xed\xa0\x80\n",
                 "/p/.gpusync/config:4:", "UTF-8", NULL); /* a surrogate */
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg,
                                     "[remote]\nhost = h\npath = ~/caf\xc3\xa9/\xf0\x9f\x9a\x80\n",
                                     "cfg", NULL),
                     0);
    assert_string_equal(cfg.remote_path, "~/caf\xc3\xa9/\xf0\x9f\x9a\x80");
    gs_config_release(&cfg);
}

/* `host =` with nothing after it is no host: the line is named, as for any other bad value
 * (it used to pass as a set host and fail later, as a usage error or not at all). */
static void test_config__empty_host_names_the_line(void **state)
{
    (void)state;
    expect_error("[remote]\nhost =\nport = 22\n", "/p/.gpusync/config:2:", "remote.host", "empty",
                 NULL);
    expect_error("[remote]\nhost =   # later\n", "/p/.gpusync/config:2:", "remote.host", NULL);
}

/* A key set twice is an error naming both lines: the last one silently won before, so a second
 * `host =` redirected every push. Repeating exclude is how a list is written, and stays allowed. */
static void test_config__duplicate_key_names_both_lines(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = 127.0.0.1\nport = 22\nhost = 10.9.9.9\n",
                 "/p/.gpusync/config:4:", "duplicate", "'host'", "line 2", NULL);
    expect_error("[remote]\nhost = h\n[sync]\ntransport = sftp\n[remote]\nport = 1\nhost : h2\n",
                 "/p/.gpusync/config:7:", "'host'", "[remote]", "line 2", NULL);
    expect_error("[remote]\nhost = h\n[job \"t\"]\ncommand = a\n[job \"u\"]\ncommand = b\n"
                 "[job \"t\"]\ncommand = c\n",
                 "/p/.gpusync/config:8:", "'command'", "line 4", NULL);
    struct gs_config cfg; /* the same key in two jobs, and a repeated exclude, are fine */
    assert_int_equal(gs_config_parse(&cfg,
                                     "[remote]\nhost = h\n[sync]\nexclude = a\nexclude = b\n"
                                     "[job \"t\"]\ngpus = 1\n[job \"u\"]\ngpus = 2\n",
                                     "cfg", NULL),
                     0);
    assert_int_equal(cfg.n_excludes, 2);
    gs_config_release(&cfg);
}

/* A config whose line 3 is "exclude = " and `len` more characters, then `after`. */
static char *config_with_long_line(size_t len, const char *after)
{
    size_t size = 64 + len + strlen(after);
    char *text = malloc(size);
    int n = snprintf(text, size, "[remote]\nhost = h\n[sync]\n\texclude = ");
    memset(text + n, 'a', len);
    snprintf(text + n + len, size - (size_t)n - len, "\n%s", after);
    return text;
}

/* A line at the limit is read whole (the next line keeps its number); one past it is "too long"
 * on its own line, where inih used to report a syntax error on the line after. */
static void test_config__long_line_is_refused_by_its_own_number(void **state)
{
    (void)state;
    size_t at_limit = GS_CONFIG_MAX_LINE - strlen("exclude = ");
    char *text = config_with_long_line(at_limit, "bogus = 1\n");
    expect_error(text, "/p/.gpusync/config:5:", "bogus", NULL);
    free(text);
    text = config_with_long_line(at_limit + 1, "");
    expect_error(text, "/p/.gpusync/config:4:", "too long", NULL);
    free(text);
    text = config_with_long_line(4000, "");
    expect_error(text, "/p/.gpusync/config:4:", "too long", NULL);
    free(text);
    struct gs_config cfg;
    text = config_with_long_line(at_limit, "");
    assert_int_equal(gs_config_parse(&cfg, text, "cfg", NULL), 0);
    assert_int_equal(strlen(cfg.excludes[0]), at_limit);
    gs_config_release(&cfg);
    free(text);
}

/* Each entry of [remote] hosts is checked where the file is read: a malformed one was accepted
 * here and failed later in `run` as a usage error that named neither the file nor the line. */
static void test_config__bad_hosts_entry_names_the_line(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\nport = 22\nhosts = root@:, @@:99999\n",
                 "/p/.gpusync/config:4:", "remote.hosts", "root@:", NULL);
    expect_error("[remote]\nhost = h\nhosts = a, b:99999\n",
                 "/p/.gpusync/config:3:", "remote.hosts", "b:99999", NULL);
    expect_error("[remote]\nhost = h\nhosts = , ,\n", "/p/.gpusync/config:3:", "remote.hosts",
                 NULL);
    struct gs_config cfg;
    const char *good = "[remote]\nhost = h\nhosts = root@10.0.0.1, u@[::1]:2222/srv/p, n2/abs\n";
    assert_int_equal(gs_config_parse(&cfg, good, "cfg", NULL), 0);
    assert_string_equal(cfg.hosts, "root@10.0.0.1, u@[::1]:2222/srv/p, n2/abs");
    gs_config_release(&cfg);
}

/* `hosts add` appends nodes to one list; four nodes with paths outgrow a config line, and the file
 * it wrote then failed to load ("line too long"). Each node goes on a `hosts =` line of its own,
 * and repeated lines continue the list. */
static void test_config__a_long_hosts_list_saves_and_loads_back(void **state)
{
    (void)state;
    struct gs_config cfg;
    struct gs_error err = {0};
    const char *two = "[remote]\nhost = h\nhosts = a, b\nhosts = c/abs\n";
    assert_int_equal(gs_config_parse(&cfg, two, "cfg", &err), 0);
    assert_string_equal(cfg.hosts, "a, b, c/abs");
    struct gs_buf list = GS_BUF_INIT;
    for (int i = 0; i < 8; i++)
        gs_buf_addf(&list, "%sroot@connect.westb.seetacloud.com:%d/root/autodl-tmp/project-%d",
                    i ? ", " : "", 20000 + i, i);
    free(cfg.hosts);
    cfg.hosts = gs_buf_detach(&list, NULL);
    char dir[] = "/tmp/gs-test-config-hosts.XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/config", dir);
    assert_int_equal(gs_config_save(&cfg, path, &err), 0);
    struct gs_config back;
    if (gs_config_load(&back, path, &err) != 0)
        fail_msg("the saved config does not load: %s", err.msg);
    assert_string_equal(back.hosts, cfg.hosts);
    gs_config_release(&back);
    gs_config_release(&cfg);
    unlink(path);
    rmdir(dir);
}

static void test_config__first_error_wins(void **state)
{
    (void)state;
    expect_error("[remote]\nhost = h\nbad1 = x\nbad2 = y\n", "/p/.gpusync/config:3:", "bad1", NULL);
}

static void test_config__load_missing_file_is_io_error_naming_it(void **state)
{
    (void)state;
    struct gs_config cfg;
    struct gs_error err = {0};
    assert_int_equal(gs_config_load(&cfg, "/nonexistent/gs/config", &err), GS_E_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/gs/config"));
}

static void test_config__load_reports_real_path_in_messages(void **state)
{
    (void)state;
    char path[] = "/tmp/gs-test-config.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "[remote]\nhost = h\n\nbogus = 1\n";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
    close(fd);
    struct gs_config cfg;
    struct gs_error err = {0};
    assert_int_equal(gs_config_load(&cfg, path, &err), GS_E_CONFIG);
    char want[128];
    snprintf(want, sizeof(want), "%s:4:", path);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "bogus"));
    unlink(path);
}

/* Loads `path`, which must fail with GS_E_CONFIG naming it. */
static void expect_load_refused(const char *path)
{
    struct gs_config cfg;
    struct gs_error err = {0};
    assert_int_equal(gs_config_load(&cfg, path, &err), GS_E_CONFIG);
    if (!strstr(err.msg, path))
        fail_msg("message '%s' does not name %s", err.msg, path);
    assert_null(cfg.host);
}

/* A config that is a link to /dev/zero (or a FIFO) never ends: it is refused, not read until
 * memory runs out (or, for a FIFO, waited on forever). */
static void test_config__load_refuses_what_is_not_a_regular_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/gs-test-config.XXXXXX", link[64], fifo[64];
    assert_non_null(mkdtemp(dir));
    snprintf(link, sizeof(link), "%s/zero", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(symlink("/dev/zero", link), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_load_refused(link);
    expect_load_refused(fifo);
    expect_load_refused(dir);
    unlink(link);
    unlink(fifo);
    rmdir(dir);
}

/* A file over GS_CONFIG_MAX_SIZE is refused even though every line of it is a valid comment. */
static void test_config__load_refuses_a_file_over_the_size_limit(void **state)
{
    (void)state;
    char path[] = "/tmp/gs-test-config.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    fputs("[remote]\nhost = h\n", fp);
    for (size_t n = 0; n <= GS_CONFIG_MAX_SIZE; n += 8)
        fputs("# pad..\n", fp);
    fclose(fp);
    expect_load_refused(path);
    unlink(path);
}

/* parse_target */

static void target_ok(const char *target, const char *user, const char *host, int port)
{
    struct gs_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    struct gs_error err = {0};
    int rc = gs_config_parse_target(&cfg, target, &err);
    if (rc != 0)
        fail_msg("'%s' rejected: %s", target, err.msg);
    if (user)
        assert_string_equal(cfg.user, user);
    else
        assert_null(cfg.user);
    assert_string_equal(cfg.host, host);
    assert_int_equal(cfg.port, port);
    gs_config_release(&cfg);
}

static void target_bad(const char *target)
{
    struct gs_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    struct gs_error err = {0};
    int rc = gs_config_parse_target(&cfg, target, &err);
    if (rc != GS_E_USAGE)
        fail_msg("'%s' accepted (rc %d, host '%s', port %d)", target, rc,
                 cfg.host ? cfg.host : "(null)", cfg.port);
    assert_true(err.msg[0] != '\0');
    gs_config_release(&cfg);
}

static void test_parse_target__forms(void **state)
{
    (void)state;
    target_ok("host", NULL, "host", 0);
    target_ok("gpu.example.com:2222", NULL, "gpu.example.com", 2222);
    target_ok("root@10.0.0.5", "root", "10.0.0.5", 0);
    target_ok("root@10.0.0.5:22", "root", "10.0.0.5", 22);
    target_ok("[::1]:2222", NULL, "::1", 2222);
    target_ok("bob@[fe80::1]", "bob", "fe80::1", 0);
    target_ok("bob@[::1]:65535", "bob", "::1", 65535);
    target_ok("a.b@c@host:1", "a.b@c", "host", 1); /* the last @ separates the user */
}

static void test_parse_target__bad_ports_and_empty_hosts(void **state)
{
    (void)state;
    target_bad("host:0");
    target_bad("host:65536");
    target_bad("host:abc");
    target_bad("host:");
    target_bad("host:22x");
    target_bad("host:-1");
    target_bad("[::1]:99999");
    target_bad("[::1");
    target_bad("[::1]x");
    target_bad("user@");
    target_bad("");
    target_bad(":22");
}

static void test_parse_target__replaces_previous_values(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, "[remote]\nhost=old\nuser=olduser\nport=1\n", "c", NULL),
                     0);
    assert_int_equal(gs_config_parse_target(&cfg, "new@newhost:2", NULL), 0);
    assert_string_equal(cfg.host, "newhost");
    assert_string_equal(cfg.user, "new");
    assert_int_equal(cfg.port, 2);
    gs_config_release(&cfg);
}

/* save + load */

static void test_config__save_then_load_round_trips(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, valid_config, "cfg", NULL), 0);
    char dir[] = "/tmp/gs-test-config-save.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/config", dir);
    struct gs_error err = {0};
    assert_int_equal(gs_config_save(&cfg, path, &err), 0);

    struct gs_config back;
    if (gs_config_load(&back, path, &err) != 0)
        fail_msg("saved config does not load: %s", err.msg);
    assert_string_equal(back.host, cfg.host);
    assert_int_equal(back.port, cfg.port);
    assert_string_equal(back.user, cfg.user);
    assert_string_equal(back.remote_path, cfg.remote_path);
    assert_string_equal(back.identity, cfg.identity);
    assert_int_equal(back.transport, cfg.transport);
    assert_int_equal(back.compress, cfg.compress);
    assert_int_equal(back.no_resident, cfg.no_resident);
    assert_int_equal(back.check_every_s, cfg.check_every_s);
    assert_int_equal(back.n_excludes, cfg.n_excludes);
    for (size_t i = 0; i < cfg.n_excludes; i++)
        assert_string_equal(back.excludes[i], cfg.excludes[i]);
    assert_int_equal(back.n_jobs, cfg.n_jobs);
    for (size_t i = 0; i < cfg.n_jobs; i++) {
        assert_string_equal(back.jobs[i].name, cfg.jobs[i].name);
        assert_string_equal(back.jobs[i].command, cfg.jobs[i].command);
        if (cfg.jobs[i].gpus)
            assert_string_equal(back.jobs[i].gpus, cfg.jobs[i].gpus);
        else
            assert_null(back.jobs[i].gpus);
    }
    /* the temporary file is gone: only "config" is in the directory */
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "test \"$(ls -A '%s')\" = config", dir);
    assert_int_equal(system(cmd), 0);
    gs_config_release(&back);
    gs_config_release(&cfg);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* [remote] master_addr (multi-node runs) is read, survives a save (hosts add rewrites the
 * file), and an empty one names the key. */
static void test_config__master_addr_is_read_saved_and_checked(void **state)
{
    (void)state;
    struct gs_config cfg, back;
    struct gs_error err = {0};
    assert_int_equal(
        gs_config_parse(&cfg, "[remote]\nhost = h\nmaster_addr = 10.0.0.5\n", "c", &err), 0);
    assert_string_equal(cfg.master_addr, "10.0.0.5");
    char dir[] = "/tmp/gs-test-config-maddr.XXXXXX", path[128], cmd[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/config", dir);
    assert_int_equal(gs_config_save(&cfg, path, &err), 0);
    assert_int_equal(gs_config_load(&back, path, &err), 0);
    assert_non_null(back.master_addr);
    assert_string_equal(back.master_addr, "10.0.0.5");
    gs_config_release(&back);
    gs_config_release(&cfg);
    assert_int_not_equal(gs_config_parse(&cfg, "[remote]\nhost = h\nmaster_addr =\n", "c", &err),
                         0);
    assert_non_null(strstr(err.msg, "remote.master_addr"));
    gs_config_release(&cfg);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_config__slurm_keys_are_read_saved_and_checked(void **state)
{
    (void)state;
    struct gs_config cfg, back;
    struct gs_error err = {0};
    assert_int_equal(gs_config_parse(&cfg,
                                     "[remote]\nhost = login\nscheduler = slurm\npartition = gpu\n"
                                     "account = lab\ntime = 1:00:00\nmem = 16G\nnodes = 2\n"
                                     "gpus_per_node = 4\ncpus_per_task = 8\n"
                                     "sbatch_args = --qos=high --exclusive\n",
                                     "c", &err),
                     0);
    assert_true(cfg.slurm.enabled);
    assert_string_equal(cfg.slurm.partition, "gpu");
    assert_int_equal(cfg.slurm.nodes, 2);
    assert_int_equal(cfg.slurm.gpus_per_node, 4);
    assert_string_equal(cfg.slurm.sbatch_args, "--qos=high --exclusive");
    char dir[] = "/tmp/gs-test-config-slurm.XXXXXX", path[128], cmd[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/config", dir);
    assert_int_equal(gs_config_save(&cfg, path, &err), 0);
    assert_int_equal(gs_config_load(&back, path, &err), 0);
    assert_true(back.slurm.enabled);
    assert_string_equal(back.slurm.account, "lab");
    assert_string_equal(back.slurm.time, "1:00:00");
    assert_string_equal(back.slurm.mem, "16G");
    assert_int_equal(back.slurm.cpus_per_task, 8);
    assert_string_equal(back.slurm.sbatch_args, "--qos=high --exclusive");
    gs_config_release(&back);
    gs_config_release(&cfg);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    expect_error("[remote]\nhost = h\nscheduler = pbs\n",
                 "/p/.gpusync/config:3:", "remote.scheduler", "pbs", NULL);
    expect_error("[remote]\nhost = h\nnodes = 0\n", "/p/.gpusync/config:3:", "remote.nodes", NULL);
    expect_error("[remote]\nhost = h\npartition =\n", "/p/.gpusync/config:3:", "remote.partition",
                 NULL);
}

static void test_config__save_minimal_round_trips_unset_fields_as_unset(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, "[remote]\nhost = only\n", "c", NULL), 0);
    char path[] = "/tmp/gs-test-config-min.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gs_config_save(&cfg, path, NULL), 0);
    struct gs_config back;
    assert_int_equal(gs_config_load(&back, path, NULL), 0);
    assert_string_equal(back.host, "only");
    assert_int_equal(back.port, 0);
    assert_null(back.user);
    assert_null(back.remote_path);
    assert_int_equal(back.n_jobs, 0);
    gs_config_release(&back);
    gs_config_release(&cfg);
    unlink(path);
}

static void test_config__save_into_missing_directory_is_io_error(void **state)
{
    (void)state;
    struct gs_config cfg;
    assert_int_equal(gs_config_parse(&cfg, "[remote]\nhost = h\n", "c", NULL), 0);
    struct gs_error err = {0};
    assert_int_equal(gs_config_save(&cfg, "/nonexistent-dir/gs/config", &err), GS_E_IO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/gs/config"));
    gs_config_release(&cfg);
}

static void test_config__release_is_safe_on_zeroed_and_twice(void **state)
{
    (void)state;
    struct gs_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    gs_config_release(&cfg);
    assert_int_equal(gs_config_parse(&cfg, valid_config, "c", NULL), 0);
    gs_config_release(&cfg);
    gs_config_release(&cfg);
    assert_null(cfg.host);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config__valid_file_fills_every_field),
        cmocka_unit_test(test_config__indented_git_style_lines_are_separate_keys),
        cmocka_unit_test(test_config__check_every_takes_seconds_or_off),
        cmocka_unit_test(test_config__repeated_exclude_accumulates_in_order),
        cmocka_unit_test(test_config__inline_comments_with_hash_or_semicolon_are_dropped),
        cmocka_unit_test(test_config__job_sections_by_name),
        cmocka_unit_test(test_config__defaults_when_only_host_given),
        cmocka_unit_test(test_config__unknown_key_names_file_line_and_key),
        cmocka_unit_test(test_config__job_cpu_ranks_are_read_and_saved),
        cmocka_unit_test(test_config__job_gpus_must_be_a_count_or_a_list),
        cmocka_unit_test(test_config__job_cpu_must_be_a_positive_count),
        cmocka_unit_test(test_config__job_gpus_and_cpu_exclude_each_other),
        cmocka_unit_test(test_config__job_empty_command_names_line),
        cmocka_unit_test(test_config__unknown_section_names_line_and_section),
        cmocka_unit_test(test_config__bad_port_names_line_key_and_value),
        cmocka_unit_test(test_config__key_outside_a_section_names_line_and_key),
        cmocka_unit_test(test_config__syntax_error_names_line),
        cmocka_unit_test(test_config__bad_transport_names_value),
        cmocka_unit_test(test_config__bad_compress_names_value),
        cmocka_unit_test(test_config__missing_host_is_an_error_naming_the_key),
        cmocka_unit_test(test_config__first_error_wins),
        cmocka_unit_test(test_config__bad_hosts_entry_names_the_line),
        cmocka_unit_test(test_config__a_long_hosts_list_saves_and_loads_back),
        cmocka_unit_test(test_config__long_line_is_refused_by_its_own_number),
        cmocka_unit_test(test_config__duplicate_key_names_both_lines),
        cmocka_unit_test(test_config__empty_host_names_the_line),
        cmocka_unit_test(test_config__bytes_that_are_not_utf8_name_the_line),
        cmocka_unit_test(test_config__load_missing_file_is_io_error_naming_it),
        cmocka_unit_test(test_config__load_reports_real_path_in_messages),
        cmocka_unit_test(test_config__load_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(test_config__load_refuses_a_file_over_the_size_limit),
        cmocka_unit_test(test_parse_target__forms),
        cmocka_unit_test(test_parse_target__bad_ports_and_empty_hosts),
        cmocka_unit_test(test_parse_target__replaces_previous_values),
        cmocka_unit_test(test_config__save_then_load_round_trips),
        cmocka_unit_test(test_config__master_addr_is_read_saved_and_checked),
        cmocka_unit_test(test_config__slurm_keys_are_read_saved_and_checked),
        cmocka_unit_test(test_config__save_minimal_round_trips_unset_fields_as_unset),
        cmocka_unit_test(test_config__save_into_missing_directory_is_io_error),
        cmocka_unit_test(test_config__release_is_safe_on_zeroed_and_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

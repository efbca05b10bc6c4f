/* cli/cli.c: what all commands share: common options, loading the project, connecting, printing
 * errors and JSON, and terminal prompts. */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "cli/run_util.h"
#include "common/path.h"
#include "common/quote.h"
#include "common/shell.h"

void gs_cli_print_help(const struct gs_cmd *cmd)
{
    const char *common = GS_CLI_COMMON_HELP;
    if (cmd->flags & GS_CMD_TEXT_ONLY) /* the common options without --json */
        common += strlen(GS_CLI_JSON_HELP);
    printf("usage: gpusync %s\n\n%s\n\noptions:\n%s%s", cmd->usage, cmd->summary,
           cmd->help ? cmd->help : "", common);
}

int gs_cli_usage_error(const struct gs_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpusync: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: gpusync %s (see 'gpusync %s --help')\n", cmd->usage, cmd->name);
    return GS_EXIT_USAGE;
}

/* Reads the password from stdin: the first line, without its newline. */
static int read_password_stdin(struct gs_cli *cli)
{
    struct gs_buf b = GS_BUF_INIT;
    int c;
    while ((c = getchar()) != EOF && c != '\n')
        gs_buf_addc(&b, (char)c);
    if (b.len == 0) {
        gs_buf_release(&b);
        fprintf(stderr, "gpusync: --password-stdin: no password on standard input\n");
        return -1;
    }
    free(cli->password);
    cli->password = gs_buf_detach(&b, NULL);
    return 1;
}

int gs_cli_common_option(struct gs_cli *cli, const struct gs_cmd *cmd, int opt)
{
    switch (opt) {
    case GS_OPT_JSON:
        if (cmd->flags & GS_CMD_TEXT_ONLY) {
            fprintf(stderr, "gpusync: %s prints text only; it has no --json\n", cmd->name);
            fprintf(stderr, "usage: gpusync %s (see 'gpusync %s --help')\n", cmd->usage, cmd->name);
            return -1;
        }
        cli->json = 1;
        return 1;
    case GS_OPT_ACCEPT_NEW:
        cli->accept_new_host_key = 1;
        return 1;
    case GS_OPT_PASS_STDIN:
        return read_password_stdin(cli);
    case GS_OPT_HELP:
        gs_cli_print_help(cmd);
        exit(0);
    case '?':
        fprintf(stderr, "usage: gpusync %s (see 'gpusync %s --help')\n", cmd->usage, cmd->name);
        return -1;
    default:
        return 0;
    }
}

int gs_cli_load_project(struct gs_cli *cli)
{
    int rc = gs_path_find_project(NULL, &cli->root, &cli->err);
    if (rc < 0)
        return rc;
    struct gs_buf file = GS_BUF_INIT;
    gs_path_join(&file, cli->root.data, GS_CONFIG_FILE);
    rc = gs_config_load(&cli->cfg, file.data, &cli->err);
    gs_buf_release(&file);
    return rc;
}

/* A long wait in the connection layer, said on stderr (stdout may carry JSON). */
static void notice_on_stderr(void *ctx, const char *message)
{
    (void)ctx;
    fprintf(stderr, "gpusync: %s\n", message);
}

void gs_cli_ssh_opts(struct gs_cli *cli, struct gs_ssh_opts *opts)
{
    *opts = (struct gs_ssh_opts){
        .host = cli->cfg.host,
        .port = cli->cfg.port,
        .user = cli->cfg.user,
        .identity = cli->cfg.identity,
        .password = cli->password,
        .accept_new_host_key = cli->accept_new_host_key,
        .confirm = cli->interactive ? gs_cli_tty_confirm : NULL,
        .ask_secret = cli->interactive && !cli->password ? gs_cli_tty_secret : NULL,
        .notice = notice_on_stderr,
    };
}

int gs_cli_connect(struct gs_cli *cli)
{
    struct gs_ssh_opts opts;
    gs_cli_ssh_opts(cli, &opts);
    return gs_ssh_connect(&cli->ssh, &opts, &cli->err);
}

void gs_cli_remote_spec(const struct gs_config *cfg, struct gs_buf *out)
{
    int v6 = strchr(cfg->host, ':') != NULL;
    if (cfg->user)
        gs_buf_addf(out, "%s@", cfg->user);
    gs_buf_addf(out, v6 ? "[%s]" : "%s", cfg->host);
    if (cfg->port)
        gs_buf_addf(out, ":%d", cfg->port);
}

void gs_cli_remote_dir(const struct gs_cli *cli, struct gs_buf *out)
{
    const char *path = cli->cfg.remote_path;
    if (!path || !*path) {
        const char *base = strrchr(cli->root.data ? cli->root.data : "/project", '/');
        gs_buf_adds(out, "gpusync/");
        gs_shell_quote(out, base && base[1] ? base + 1 : "project");
        return;
    }
    /* "~/x" means x under the remote home, where an SSH command starts. */
    if (path[0] == '~' && (path[1] == '/' || path[1] == '\0'))
        path += path[1] ? 2 : 1;
    gs_shell_quote(out, *path ? path : ".");
}

void gs_cli_json_print(json_t *obj)
{
    /* json_pack gives NULL when a string in it is not UTF-8; the contract still owes the reader
     * one object, so it gets an error rather than an empty stdout. */
    if (!obj)
        obj = json_pack("{s:b,s:s,s:s}", "ok", 0, "error", gs_error_name(GS_E_ERR), "message",
                        "gpusync: a reply held text that is not UTF-8 and could not be printed");
    json_object_set_new(obj, "v", json_integer(GS_CLI_JSON_VERSION));
    /* 15 significant digits: jansson's default 17 prints 0.083 as 0.083000000000000004 */
    char *text = json_dumps(obj, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
    if (text) {
        puts(text);
        free(text);
    }
    fflush(stdout);
    json_decref(obj);
}

char *gs_cli_terminal_safe(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p; p++) {
        if ((*p < 0x20 && *p != '\t' && *p != '\n') || *p == 0x7f)
            *p = '?';
        else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) /* U+0080..U+009F */
            p[0] = p[1] = '?';
    }
    return s;
}

int gs_cli_fail(struct gs_cli *cli, int code)
{
    return gs_cli_fail_with(cli, code, NULL);
}

int gs_cli_fail_with(struct gs_cli *cli, int code, json_t *extra)
{
    const char *msg = cli->err.msg[0] ? cli->err.msg : gs_error_name(code);
    if (cli->json) {
        /* the message may quote paths or server output: bytes, not always UTF-8 */
        json_t *o = json_pack("{s:i,s:b,s:s,s:o}", "v", 1, "ok", 0, "error", gs_error_name(code),
                              "message", gs_json_text(msg));
        if (extra)
            json_object_update_missing(o, extra);
        gs_cli_json_print(o);
    }
    json_decref(extra);
    /* a message may hold a file's name, or a server's words: no raw control byte on the terminal */
    struct gs_buf text = GS_BUF_INIT;
    gs_quote_message(&text, msg, NULL, GS_QUOTE_KEEP_LINES);
    fprintf(stderr, "gpusync: %s\n", text.data);
    gs_buf_release(&text);
    int status = gs_error_exit_code(code);
    return cli->remote_status && status == GS_EXIT_CONNECT ? GS_EXIT_REMOTE_LOST : status;
}

/* Reads one line from the terminal, echo off when `secret`. Returns a malloc'd string or NULL. */
static char *tty_read(const char *prompt, int secret)
{
    int fd = open("/dev/tty", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct termios saved, quiet;
    int restore = secret && tcgetattr(fd, &saved) == 0;
    if (restore) {
        quiet = saved;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        tcsetattr(fd, TCSAFLUSH, &quiet);
    }
    if (write(fd, prompt, strlen(prompt)) < 0) {
        /* nothing to do: the read below still works */
    }
    struct gs_buf b = GS_BUF_INIT;
    char c;
    ssize_t n;
    while ((n = read(fd, &c, 1)) == 1 && c != '\n')
        gs_buf_addc(&b, c);
    if (restore) {
        tcsetattr(fd, TCSAFLUSH, &saved);
        if (write(fd, "\n", 1) < 0) {
        }
    }
    close(fd);
    if (n < 0 && b.len == 0) {
        gs_buf_release(&b);
        return NULL;
    }
    return gs_buf_detach(&b, NULL);
}

int gs_cli_tty_confirm(void *ctx, const char *question)
{
    (void)ctx;
    for (;;) {
        char *answer = tty_read(question, 0);
        if (!answer)
            return 0;
        int yes = strcmp(answer, "yes") == 0, no = strcmp(answer, "no") == 0 || !*answer;
        free(answer);
        if (yes || no)
            return yes;
        question = "Please type 'yes' or 'no': ";
    }
}

char *gs_cli_tty_secret(void *ctx, const char *prompt)
{
    (void)ctx;
    return tty_read(prompt, 1);
}

int gs_cli_parse_options(struct gs_cli *cli, const struct gs_cmd *cmd, int argc, char **argv,
                         const char *shortopts, const struct option *longopts,
                         int (*own)(struct gs_cli *cli, int opt, const char *arg))
{
    int opt, r;
    optind = 1;
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if ((r = gs_cli_common_option(cli, cmd, opt)) < 0)
            return GS_EXIT_USAGE;
        if (r == 0 && !own)
            return gs_cli_usage_error(cmd, "unexpected option");
        if (r == 0 && (r = own(cli, opt, optarg)) != 0)
            return r;
    }
    cli->argc = argc - optind;
    cli->argv = argv + optind;
    return 0;
}

/* The parse of a command without options or operands of its own. */
static int parse_common_only(struct gs_cli *cli, const struct gs_cmd *cmd, int argc, char **argv)
{
    static const struct option common[] = {GS_CLI_COMMON_LONGOPTS, {NULL, 0, NULL, 0}};
    int r = gs_cli_parse_options(cli, cmd, argc, argv, "h", common, NULL);
    if (r == 0 && cli->argc > 0)
        return gs_cli_usage_error(cmd, "unexpected argument '%s'", cli->argv[0]);
    return r;
}

int gs_cli_prepare(struct gs_cli *cli, int needs)
{
    int rc = 0;
    if ((needs & GS_CMD_NEEDS) && !cli->root.len)
        rc = gs_cli_load_project(cli);
    if (rc == 0 && (needs & GS_CMD_NEED_CONNECTION) && !cli->ssh)
        rc = gs_cli_connect(cli);
    if (rc == 0 && (needs & GS_CMD_NEED_SERVER))
        rc = gs_cli_connect_unless_daemon(cli);
    return rc < 0 ? gs_cli_fail(cli, rc) : 0;
}

int gs_cli_run(struct gs_cli *cli, const struct gs_cmd *cmd, int argc, char **argv)
{
    cli->needs = cmd->flags & GS_CMD_NEEDS;
    cli->remote_status = (cmd->flags & GS_CMD_REMOTE_STATUS) != 0;
    int rc = cmd->parse ? cmd->parse(cli, argc, argv) : parse_common_only(cli, cmd, argc, argv);
    if (rc == 0)
        rc = gs_cli_prepare(cli, cli->needs);
    return rc != 0 ? rc : cmd->exec(cli);
}

int gs_cli_parse_number(const char *arg, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int gs_cli_parse_grace(const char *arg, long *ms, char *why, size_t cap)
{
    char *end;
    errno = 0;
    double sec = strtod(arg, &end);
    if (errno || end == arg || *end || !(sec >= 0 && sec <= 3600)) {
        snprintf(why, cap, "--grace %s: expected seconds from 0 to 3600 (e.g. 30 or 2.5)", arg);
        return -1;
    }
    *ms = (long)(sec * 1000.0 + 0.5);
    return 0;
}

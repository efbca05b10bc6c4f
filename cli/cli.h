/* cli/cli.h: the gpusync command line: the command table, the shared context each command runs
 * with, and the helpers that turn configuration into a connection.
 *
 * Like tmux's cmd_table and git's commands[], each command is one file exporting one struct
 * gs_cmd. A command runs in three steps (gs_cli_run): its parse reads the command line, then what
 * its flags need (the project, a connection, the server through the watch daemon) is prepared in
 * one place, as git's RUN_SETUP, then its exec does the work; so --help and usage errors need no
 * project, and no command opens what another would open differently. Only cli/ prints to the
 * user and chooses exit codes. */
#ifndef GS_CLI_H
#define GS_CLI_H

#include <getopt.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/error.h"
#include "remote/ssh.h"
#include "syncd/json_text.h" /* gs_json_text, for every path in --json output */

/* Exit codes: each error's is GS_EXIT_<error> (common/error.h, from GS_ERROR_LIST, which also
 * writes the list `gpusync help` prints). One more belongs to the command line alone: exec and
 * run exit with the remote command's status, and with this one when the connection failed,
 * before or while the command ran. 255, as ssh uses, and not 4: that is a common status of the
 * command itself. */
#define GS_EXIT_REMOTE_LOST 255

/* What a command needs before it runs, prepared by the dispatcher (gs_cli_run) after the
 * command has parsed its options, as git's RUN_SETUP; and how it reports. */
enum gs_cmd_flags {
    GS_CMD_NEED_PROJECT = 1 << 0,    /* load .gpusync/config, found upwards from the cwd */
    GS_CMD_NEED_CONNECTION = 1 << 1, /* a connection of our own to the configured server */
    GS_CMD_NEED_SERVER = 1 << 2,     /* the server: through the watch daemon when one runs (its
                                        spare connection), else a connection of our own */
    GS_CMD_TEXT_ONLY = 1 << 3,       /* prints text only: --json is refused, and not offered */
    GS_CMD_REMOTE_STATUS = 1 << 4,   /* exits with a remote command's status: gs_cli_fail turns a
                                        connection failure (4) into GS_EXIT_REMOTE_LOST */
};
#define GS_CMD_NEEDS (GS_CMD_NEED_PROJECT | GS_CMD_NEED_CONNECTION | GS_CMD_NEED_SERVER)

struct gs_cli {
    int json;                /* --json: machine-readable output on stdout */
    int accept_new_host_key; /* --accept-new-host-key */
    int interactive;         /* a terminal is attached: prompts are allowed */
    int remote_status;       /* the command has GS_CMD_REMOTE_STATUS */
    int needs;               /* GS_CMD_NEED_*: the command's flags, as its parse left them */
    int argc;                /* the operands its parse left (after the options) */
    char **argv;
    char *password;       /* from --password-stdin or GPUSYNC_PASSWORD; owned */
    struct gs_buf root;   /* project root (absolute) when NEED_PROJECT */
    struct gs_config cfg; /* when NEED_PROJECT */
    struct gs_ssh *ssh;   /* when NEED_CONNECTION */
    struct gs_error err;
};

struct gs_cmd {
    const char *name;
    const char *alias;   /* or NULL */
    const char *usage;   /* "init [user@]host[:port] [--path DIR] [--install-key]" */
    const char *summary; /* one line for `gpusync help` */
    const char *help;    /* the options, one per line, for `gpusync CMD --help` */
    int flags;
    /* Reads the command line (argv[0] is the command's name): the common options through
     * gs_cli_common_option, the command's own into its file's static options (a process runs one
     * command), the operands into cli->argc/argv. May change cli->needs for this invocation. Runs
     * before anything is loaded, so --help and usage errors need no project. Returns 0, or the
     * exit code to stop with. NULL: the common options only, and no operands. */
    int (*parse)(struct gs_cli *cli, int argc, char **argv);
    /* Does the command's work, once what cli->needs asks for is prepared. Returns the exit
     * code. */
    int (*exec)(struct gs_cli *cli);
};

/* Options every command understands; commands append their own after GS_CLI_COMMON_LONGOPTS. */
#define GS_OPT_JSON       1000
#define GS_OPT_ACCEPT_NEW 1001
#define GS_OPT_PASS_STDIN 1002
#define GS_OPT_HELP       'h'
#define GS_CLI_COMMON_LONGOPTS                                                                     \
    {"json", no_argument, NULL, GS_OPT_JSON},                                                      \
        {"accept-new-host-key", no_argument, NULL, GS_OPT_ACCEPT_NEW},                             \
        {"password-stdin", no_argument, NULL, GS_OPT_PASS_STDIN},                                  \
    {                                                                                              \
        "help", no_argument, NULL, GS_OPT_HELP                                                     \
    }
#define GS_CLI_JSON_HELP "  --json                 machine-readable output\n"
#define GS_CLI_COMMON_HELP                                                                         \
    GS_CLI_JSON_HELP                                                                               \
    "  --accept-new-host-key  trust and record an unknown server key (after checking it)\n"        \
    "  --password-stdin       read the SSH password from standard input\n"                         \
    "  -h, --help             this help\n"

/* Handles a common option seen by a command's getopt loop. Returns 1 if it was one (and handled),
 * 0 if not, or -1 after printing an error (bad option). `opt` '?' is reported as a usage error. */
int gs_cli_common_option(struct gs_cli *cli, const struct gs_cmd *cmd, int opt);

/* Runs `cmd` with `cli`: parse, prepare what cli->needs asks for, exec. Returns the exit code. */
int gs_cli_run(struct gs_cli *cli, const struct gs_cmd *cmd, int argc, char **argv);

/* Prepares `needs` (GS_CMD_NEED_*) now: for a command whose needs depend on what it finds in the
 * project (run: one server or several). What is there already is kept. Returns 0, or the exit
 * code after printing the error. */
int gs_cli_prepare(struct gs_cli *cli, int needs);

/* The parse of a command whose operands are checked by its exec: the common options, then every
 * operand into cli->argc/argv. `shortopts` and `longopts` as getopt_long's; an option of the
 * command's own (not a common one) is handed to `own` with its optarg (NULL: the command has
 * none). Returns 0 or the exit code to stop with. */
int gs_cli_parse_options(struct gs_cli *cli, const struct gs_cmd *cmd, int argc, char **argv,
                         const char *shortopts, const struct option *longopts,
                         int (*own)(struct gs_cli *cli, int opt, const char *arg));

/* Reads `arg` as a whole decimal number from `min` to `max` into *out. Returns 0, or -1 (and *out
 * is unchanged) for anything else: "abc", "-1", "2x", out of range. */
int gs_cli_parse_number(const char *arg, long min, long max, long *out);

/* Reads a --grace value: seconds, decimals allowed, 0 to 3600, into *ms. Returns 0, or -1 with
 * what is wrong in why. */
int gs_cli_parse_grace(const char *arg, long *ms, char *why, size_t cap);

/* Loads the project (root and config) into cli. Returns 0 or a GS_E_* code with cli->err set. */
int gs_cli_load_project(struct gs_cli *cli);

/* Fills `opts` with how to reach the configured server (cli->cfg and the command-line flags). The
 * strings stay owned by `cli`. */
void gs_cli_ssh_opts(struct gs_cli *cli, struct gs_ssh_opts *opts);

/* Connects to the configured server (cli->cfg). Returns 0 or a GS_E_* code with cli->err set. */
int gs_cli_connect(struct gs_cli *cli);

/* Makes sure gpusync's own key (GS_TARGET_MANAGED_KEY) logs in to the configured server: creates
 * it if needed, logs in (with the password only when no key works; asked on a terminal when none
 * was given), adds it to ~/.ssh/authorized_keys unless it is there, then logs in again with keys
 * alone. Leaves that connection in cli->ssh and sets *added when the key was written. Returns 0
 * or a GS_E_* code with cli->err set. Defined in cmd_init.c; `hosts add` uses it too. */
int gs_cli_install_key(struct gs_cli *cli, int *added);

/* [remote]'s own server as a --hosts entry: "user@host:port" (the parts the config sets), brackets
 * around an IPv6 address. Appended to `out`. */
void gs_cli_remote_spec(const struct gs_config *cfg, struct gs_buf *out);

/* The remote project directory as a shell word, quoted; relative paths are under the remote home.
 */
void gs_cli_remote_dir(const struct gs_cli *cli, struct gs_buf *out);

/* Makes text from the server safe to print on a terminal, in place: control characters (C0 but tab
 * and newline, DEL, and C1 as UTF-8) become '?', so that a GPU name with an escape sequence in it
 * cannot redraw or retitle the user's terminal. Returns s. */
char *gs_cli_terminal_safe(char *s);

/* Prints "gpusync: <message>" on stderr (or a JSON error object on stdout with --json) and returns
 * the exit code for `code`: gs_error_exit_code's, except GS_EXIT_REMOTE_LOST for a connection
 * failure of a command that exits with a remote status (cli->remote_status). */
int gs_cli_fail(struct gs_cli *cli, int code);
/* gs_cli_fail whose JSON error object also carries extra's fields (e.g. what each node said);
 * takes extra's reference (NULL: none). */
int gs_cli_fail_with(struct gs_cli *cli, int code, json_t *extra);

/* Prints a usage error for `cmd` and returns GS_EXIT_USAGE. */
int gs_cli_usage_error(const struct gs_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints `cmd`'s --help text on stdout. */
void gs_cli_print_help(const struct gs_cmd *cmd);

/* The version of the --json contract (docs/json-contract.md); every object printed carries it as
 * "v". It is not the control socket's version: daemon replies passed through get this one. */
#define GS_CLI_JSON_VERSION 1

/* Dumps `obj` as one line of JSON on stdout, with "v" set to GS_CLI_JSON_VERSION, and drops the
 * reference. */
void gs_cli_json_print(json_t *obj);

/* Prints the watch daemon's unacknowledged conflict copies ([{path, kept}]), if any (status and
 * flush). */
void gs_cli_print_conflicts(json_t *conflicts);

/* Prompt helpers handed to remote/ (they use /dev/tty, never stdout). */
int gs_cli_tty_confirm(void *ctx, const char *question);
char *gs_cli_tty_secret(void *ctx, const char *prompt);

extern const struct gs_cmd gs_cmd_init;
extern const struct gs_cmd gs_cmd_exec;
extern const struct gs_cmd gs_cmd_doctor;
extern const struct gs_cmd gs_cmd_push;
extern const struct gs_cmd gs_cmd_pull;
extern const struct gs_cmd gs_cmd_status;
extern const struct gs_cmd gs_cmd_watch;
extern const struct gs_cmd gs_cmd_flush;
extern const struct gs_cmd gs_cmd_events;
extern const struct gs_cmd gs_cmd_run;
extern const struct gs_cmd gs_cmd_logs;
extern const struct gs_cmd gs_cmd_ps;
extern const struct gs_cmd gs_cmd_stop;
extern const struct gs_cmd gs_cmd_top;
extern const struct gs_cmd gs_cmd_hosts;

#endif

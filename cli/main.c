/* cli/main.c: the gpusync entry point: finds the command in the table, prepares what it needs
 * (project, connection) and runs it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/log.h"
#include "common/wrapper.h"

#ifndef GS_VERSION
#define GS_VERSION "0.0.0"
#endif

static const struct gs_cmd *const cmd_table[] = {
    /* one per line, in the order `gpusync help` lists them */
    &gs_cmd_init,   //
    &gs_cmd_hosts,  //
    &gs_cmd_push,   //
    &gs_cmd_pull,   //
    &gs_cmd_watch,  //
    &gs_cmd_status, //
    &gs_cmd_flush,  //
    &gs_cmd_events, //
    &gs_cmd_run,    //
    &gs_cmd_logs,   //
    &gs_cmd_ps,     //
    &gs_cmd_stop,   //
    &gs_cmd_top,    //
    &gs_cmd_exec,   //
    &gs_cmd_doctor, //
};
#define N_COMMANDS (sizeof(cmd_table) / sizeof(cmd_table[0]))

/* Prints `text` on `out`, its lines filled up to 79 columns. */
static void print_filled(FILE *out, const char *text)
{
    struct gs_buf copy = GS_BUF_INIT;
    gs_buf_adds(&copy, text);
    size_t col = 0;
    for (char *w = strtok(copy.data, " "); w; w = strtok(NULL, " ")) {
        size_t len = strlen(w);
        if (col && col + 1 + len >= 80) {
            fputc('\n', out);
            col = 0;
        } else if (col) {
            fputc(' ', out);
            col++;
        }
        fputs(w, out);
        col += len;
    }
    fputc('\n', out);
    gs_buf_release(&copy);
}

/* The errors GS_ERROR_LIST defines, with the exit status each gives. */
static const struct {
    int exit;
    const char *text;
} errors[] = {
#define GS_X_ROW(name, exit, text) {exit, text},
    GS_ERROR_LIST(GS_X_ROW)
#undef GS_X_ROW
};
#define N_ERRORS (sizeof(errors) / sizeof(errors[0]))

/* "Exit codes: 0 success; 1 error, out of memory, ...": each status with the errors that give
 * it, from GS_ERROR_LIST, so the list cannot miss one. README.md's paragraph says the same
 * (test_cli_basic compares them). */
static void print_exit_codes(FILE *out)
{
    struct gs_buf text = GS_BUF_INIT;
    gs_buf_adds(&text, "Exit codes:");
    int groups = 0;
    for (size_t i = 0; i < N_ERRORS; i++) {
        size_t first = 0;
        while (errors[first].exit != errors[i].exit)
            first++;
        if (first < i) /* listed with the first error of its status */
            continue;
        gs_buf_addf(&text, "%s %d", groups++ ? ";" : "", errors[i].exit);
        for (size_t j = i; j < N_ERRORS; j++)
            if (errors[j].exit == errors[i].exit)
                gs_buf_addf(&text, "%s %s", j == i ? "" : ",", errors[j].text);
    }
    gs_buf_adds(&text, ". exec, run and logs -f exit with the remote command's status (128+N for "
                       "signal N; 127 not found, 126 not executable), or 255 when the connection "
                       "failed.");
    print_filled(out, text.data);
    gs_buf_release(&text);
}

static void print_overview(FILE *out)
{
    fprintf(out, "usage: gpusync COMMAND [OPTIONS] [ARGS]\n\n"
                 "Mirror a project to a remote GPU server and run jobs there.\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", cmd_table[i]->name, cmd_table[i]->summary);
    fprintf(out, "\n'gpusync COMMAND --help' shows a command's options.\n\n");
    print_exit_codes(out);
}

/* `help` and `version` are no entries of cmd_table (they need no context), but they are
 * commands to the user: prefixes are matched against them too, so `h` is ambiguous (hosts,
 * help) rather than hosts, and `he` is help. */
static const struct gs_cmd help_cmd = {.name = "help"};
static const struct gs_cmd version_cmd = {.name = "version"};
static const struct gs_cmd *const builtin_cmds[] = {&help_cmd, &version_cmd};
#define N_NAMES (N_COMMANDS + sizeof(builtin_cmds) / sizeof(builtin_cmds[0]))

/* The i-th command name of N_NAMES: the table's, then the built-in ones. */
static const struct gs_cmd *nth_command(size_t i)
{
    return i < N_COMMANDS ? cmd_table[i] : builtin_cmds[i - N_COMMANDS];
}

/* Whether `name` is a non-empty prefix of c's name. */
static int is_prefix(const char *name, const struct gs_cmd *c)
{
    return name[0] && strncmp(c->name, name, strlen(name)) == 0;
}

/* Exact name or alias first (`st` is status's alias, though it also begins stop), then a unique
 * prefix, as tmux does. Returns NULL after saying why on stderr. */
static const struct gs_cmd *find_command(const char *name)
{
    const struct gs_cmd *found = NULL;
    int matches = 0;
    for (size_t i = 0; i < N_NAMES; i++) {
        const struct gs_cmd *c = nth_command(i);
        if (strcmp(c->name, name) == 0 || (c->alias && strcmp(c->alias, name) == 0))
            return c;
        if (is_prefix(name, c)) {
            found = c;
            matches++;
        }
    }
    if (matches == 1)
        return found;
    if (matches > 1) {
        fprintf(stderr, "gpusync: ambiguous command: %s, could be:", name);
        for (size_t i = 0; i < N_NAMES; i++)
            if (is_prefix(name, nth_command(i)))
                fprintf(stderr, " %s", nth_command(i)->name);
        fputc('\n', stderr);
    } else {
        fprintf(stderr, "gpusync: unknown command: '%s' (see 'gpusync help')\n", name);
    }
    return NULL;
}

static int is_help_option(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* `gpusync help [COMMAND]`: the overview, or COMMAND's help (a prefix works there too). */
static int help_exec(int argc, char **argv)
{
    const struct gs_cmd *cmd = argc >= 2 && !is_help_option(argv[1]) ? find_command(argv[1]) : NULL;
    if (argc >= 2 && !is_help_option(argv[1]) && !cmd)
        return GS_EXIT_USAGE;
    if (cmd && cmd != &help_cmd && cmd != &version_cmd)
        gs_cli_print_help(cmd);
    else
        print_overview(stdout);
    return 0;
}

static void cli_release(struct gs_cli *cli)
{
    gs_ssh_free(cli->ssh);
    gs_config_release(&cli->cfg);
    gs_buf_release(&cli->root);
    if (cli->password)
        memset(cli->password, 0, strlen(cli->password));
    free(cli->password);
}

/* Runs `cmd` (gs_cli_run: its parse, what its flags need, its exec) with a fresh context. */
static int run_command(const struct gs_cmd *cmd, int argc, char **argv)
{
    struct gs_cli cli = {.root = GS_BUF_INIT};
    cli.interactive = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    char *pw = getenv("GPUSYNC_PASSWORD");
    if (pw && *pw)
        cli.password = gs_xstrdup(pw);
    /* Read once. Unsetting keeps it from the programs we start (ssh -G, ssh-keygen); clearing the
     * bytes in place also empties the copy a forked watch daemon would still show in
     * /proc/PID/environ, which is the process's original environment block. */
    if (pw)
        memset(pw, 0, strlen(pw));
    unsetenv("GPUSYNC_PASSWORD");
    int rc = gs_cli_run(&cli, cmd, argc, argv);
    cli_release(&cli);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_overview(stderr);
        return GS_EXIT_USAGE;
    }
    const struct gs_cmd *cmd = is_help_option(argv[1])             ? &help_cmd
                               : strcmp(argv[1], "--version") == 0 ? &version_cmd
                                                                   : find_command(argv[1]);
    if (!cmd)
        return GS_EXIT_USAGE;
    if (cmd == &help_cmd)
        return help_exec(argc - 1, argv + 1);
    if (cmd == &version_cmd) {
        printf("gpusync %s\n", GS_VERSION);
        return 0;
    }
    return run_command(cmd, argc - 1, argv + 1);
}

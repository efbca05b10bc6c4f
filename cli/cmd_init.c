/* cli/cmd_init.c: `gpusync init [user@]host[:port]`: writes .gpusync/config, verifies the
 * connection and creates the remote project directory. With --install-key it makes a dedicated
 * ed25519 key (libssh2 1.10 cannot use RSA against OpenSSH 8.8+) and installs it with the password
 * once; every later command, and every other project on that server, logs in with it (it is always
 * among the keys tried). Running it again is safe: the key is never added twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "remote/auth.h"
#include "remote/exec.h"

enum { OPT_PATH = 2000, OPT_INSTALL_KEY };

static const struct option init_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {"path", required_argument, NULL, OPT_PATH},
    {"install-key", no_argument, NULL, OPT_INSTALL_KEY},
    {NULL, 0, NULL, 0},
};

struct init_args {
    const char *target;
    const char *path;
    int install_key;
};

/* Loads an existing config in the current directory (to update it) or starts an empty one. */
static int start_config(struct gs_cli *cli)
{
    char cwd[4096];
    if (!getcwd(cwd, sizeof(cwd)))
        return gs_error_errno(&cli->err, GS_E_IO, "current directory");
    gs_buf_adds(&cli->root, cwd);
    struct gs_buf file = GS_BUF_INIT;
    gs_path_join(&file, cwd, GS_CONFIG_FILE);
    int rc = 0;
    if (gs_path_exists(file.data))
        rc = gs_config_load(&cli->cfg, file.data, &cli->err);
    gs_buf_release(&file);
    return rc;
}

/* `hosts add` starts [remote] hosts with [remote]'s own server, the master (node 0). init to
 * another server left the old one there: runs synced to it and started rank 0 on it, and the new
 * server was not used. The list's entry for the old server now names the new one; a list that does
 * not start with it is the user's own, and is left as written, with a word. */
static void move_master(struct gs_cli *cli, const char *old_spec)
{
    struct gs_buf now = GS_BUF_INIT, list = GS_BUF_INIT;
    gs_cli_remote_spec(&cli->cfg, &now);
    const char *hosts = cli->cfg.hosts;
    size_t first = strcspn(hosts, ", \t");
    if (strcmp(now.data, old_spec) == 0) {
        /* the same server */
    } else if (strlen(old_spec) == first && strncmp(hosts, old_spec, first) == 0) {
        gs_buf_addf(&list, "%s%s", now.data, hosts + first);
        free(cli->cfg.hosts);
        cli->cfg.hosts = gs_buf_detach(&list, NULL);
        if (!cli->json)
            fprintf(stderr, "gpusync: [remote] hosts now starts with %s, not %s\n", now.data,
                    old_spec);
    } else if (!cli->json) {
        fprintf(stderr,
                "gpusync: [remote] hosts is unchanged (%s): runs with it start rank 0 on %.*s; "
                "edit .gpusync/config if that is not the new server's place\n",
                hosts, (int)first, hosts);
    }
    gs_buf_release(&now);
    gs_buf_release(&list);
}

static int apply_args(struct gs_cli *cli, const struct init_args *a)
{
    struct gs_buf old_spec = GS_BUF_INIT;
    if (cli->cfg.host && cli->cfg.hosts)
        gs_cli_remote_spec(&cli->cfg, &old_spec);
    int rc = gs_config_parse_target(&cli->cfg, a->target, &cli->err);
    if (rc == 0 && old_spec.len)
        move_master(cli, old_spec.data);
    gs_buf_release(&old_spec);
    if (rc < 0)
        return rc;
    if (a->path) {
        free(cli->cfg.remote_path);
        cli->cfg.remote_path = gs_xstrdup(a->path);
    } else if (!cli->cfg.remote_path) {
        const char *base = strrchr(cli->root.data, '/');
        struct gs_buf p = GS_BUF_INIT;
        gs_buf_addf(&p, "gpusync/%s", base && base[1] ? base + 1 : "project");
        cli->cfg.remote_path = gs_buf_detach(&p, NULL);
    }
    return 0;
}

/* Connects for installing the key: with the password when no key works (asked on a terminal if
 * none was given), or, when `key_only`, with keys alone, to prove that the installed key works. */
static int connect_for_key(struct gs_cli *cli, int key_only)
{
    struct gs_ssh_opts opts;
    gs_cli_ssh_opts(cli, &opts);
    opts.installing_key = !key_only;
    if (key_only) {
        opts.password = NULL;
        opts.ask_secret = NULL;
    }
    return gs_ssh_connect(&cli->ssh, &opts, &cli->err);
}

int gs_cli_install_key(struct gs_cli *cli, int *added)
{
    int rc = gs_auth_managed_key_ensure(&cli->err);
    if (rc == 0)
        rc = connect_for_key(cli, 0);
    if (rc == 0)
        rc = gs_auth_managed_key_install(cli->ssh, added, &cli->err);
    if (rc < 0)
        return rc;
    char target[512];
    snprintf(target, sizeof(target), "%s", gs_ssh_target(cli->ssh));
    gs_ssh_free(cli->ssh);
    cli->ssh = NULL;
    rc = connect_for_key(cli, 1);
    if (rc == GS_E_AUTH)
        gs_error_set(&cli->err, rc,
                     "%s: %s.pub is in ~/.ssh/authorized_keys there, but the server does not take "
                     "it; check sshd's AuthorizedKeysFile and the permissions of ~/.ssh",
                     target, GS_TARGET_MANAGED_KEY);
    return rc;
}

/* With --install-key: install the managed key, and name it in the config. */
static int do_install_key(struct gs_cli *cli)
{
    int added;
    int rc = gs_cli_install_key(cli, &added);
    if (rc == 0) {
        free(cli->cfg.identity);
        cli->cfg.identity = gs_xstrdup(GS_TARGET_MANAGED_KEY);
    }
    return rc;
}

static int make_remote_dir(struct gs_cli *cli)
{
    struct gs_buf dir = GS_BUF_INIT, cmd = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    gs_buf_addf(&cmd, "mkdir -p -- %s && cd -- %s && pwd", dir.data, dir.data);
    struct gs_buf out = GS_BUF_INIT, errout = GS_BUF_INIT;
    int rc = gs_exec_capture(cli->ssh, cmd.data, &out, &errout, &cli->err);
    if (rc > 0)
        rc = gs_error_set(&cli->err, GS_E_REMOTE, "cannot create the remote directory %s: %s",
                          cli->cfg.remote_path, errout.data ? errout.data : "");
    gs_buf_release(&dir);
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    gs_buf_release(&errout);
    return rc;
}

static int save_config(struct gs_cli *cli)
{
    struct gs_buf file = GS_BUF_INIT;
    gs_path_join(&file, cli->root.data, GS_CONFIG_FILE);
    int rc = gs_path_state_dir(cli->root.data, &cli->err);
    if (rc == 0)
        rc = gs_config_save(&cli->cfg, file.data, &cli->err);
    gs_buf_release(&file);
    return rc;
}

static void print_result(struct gs_cli *cli)
{
    if (cli->json) {
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:s,s:s,s:s}", "v", 1, "ok", 1, "target",
                                    gs_ssh_target(cli->ssh), "remote_path", cli->cfg.remote_path,
                                    "auth", gs_ssh_auth_method(cli->ssh), "host_key",
                                    gs_ssh_fingerprint(cli->ssh)));
        return;
    }
    printf("Initialised %s/%s\n  server:      %s\n  remote path: %s\n  auth:        %s\n",
           cli->root.data, GS_CONFIG_FILE, gs_ssh_target(cli->ssh), cli->cfg.remote_path,
           gs_ssh_auth_method(cli->ssh));
}

static int run_init(struct gs_cli *cli, const struct init_args *a)
{
    int rc = start_config(cli);
    if (rc == 0)
        rc = apply_args(cli, a);
    if (rc == 0)
        rc = a->install_key ? do_install_key(cli) : gs_cli_connect(cli);
    if (rc == 0)
        rc = make_remote_dir(cli);
    if (rc == 0)
        rc = save_config(cli);
    if (rc < 0)
        return gs_cli_fail(cli, rc);
    print_result(cli);
    return 0;
}

static struct init_args opts;

static int init_option(struct gs_cli *cli, int opt, const char *arg)
{
    (void)cli;
    if (opt == OPT_PATH && !arg[0]) /* an unset variable, most likely: not the default unasked */
        return gs_cli_usage_error(&gs_cmd_init,
                                  "--path is empty: give the remote project directory, or leave "
                                  "--path out for gpusync/<name> under the remote home");
    if (opt == OPT_PATH)
        opts.path = arg;
    else if (opt == OPT_INSTALL_KEY)
        opts.install_key = 1;
    else
        return gs_cli_usage_error(&gs_cmd_init, "unexpected option");
    return 0;
}

static int init_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_init, argc, argv, "h", init_options, init_option);
    if (r == 0 && cli->argc != 1)
        return gs_cli_usage_error(&gs_cmd_init, "expected one [user@]host[:port]");
    opts.target = r == 0 ? cli->argv[0] : NULL;
    return r;
}

/* Creates the project, so it needs none: it connects itself once the target is known. */
static int init_exec(struct gs_cli *cli)
{
    return run_init(cli, &opts);
}

const struct gs_cmd gs_cmd_init = {
    .name = "init",
    .usage = "init [user@]host[:port] [--path REMOTE_DIR] [--install-key]",
    .summary = "Set up this directory as a gpusync project for a server",
    .help = "  --path REMOTE_DIR      project directory on the server (default gpusync/<name>\n"
            "                         under the remote home)\n"
            "  --install-key          create ~/.ssh/gpusync_ed25519 and install it on the server\n"
            "                         using the password once (GPUSYNC_PASSWORD, --password-stdin\n"
            "                         or a prompt); not needed when that key already logs in\n",
    .flags = 0,
    .parse = init_parse,
    .exec = init_exec,
};

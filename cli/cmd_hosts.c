/* cli/cmd_hosts.c: `gpusync hosts` lists the nodes of multi-node runs ([remote] hosts), and
 * `gpusync hosts add NODE...` prepares new ones, once: for each node it checks the host key (asking
 * on a terminal, or trusting it with --accept-new-host-key) and records it in known_hosts, installs
 * gpusync's key there (with the password only when no key works yet), and adds the node to
 * [remote] hosts. Later `run --hosts` then needs neither a password nor --accept-new-host-key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run.h"
#include "cli/run_util.h"
#include "common/path.h"
#include "common/wrapper.h"
#include "remote/target.h"

static const struct option hosts_options[] = {
    GS_CLI_COMMON_LONGOPTS,
    {NULL, 0, NULL, 0},
};

/* 1 when the list `hosts` already names the node whose key is `key` (gs_cli_node_key), however
 * it is written there. */
static int list_has(struct gs_cli *cli, const char *hosts, const char *key)
{
    char *list = gs_xstrdup(hosts), *save = NULL;
    int found = 0;
    for (char *tok = strtok_r(list, ", \t", &save); tok && !found;
         tok = strtok_r(NULL, ", \t", &save)) {
        struct gs_node_spec n = {0};
        if (gs_node_spec_parse(cli, tok, &n) == 0) {
            char *k = gs_cli_node_key(&n.cfg);
            found = strcmp(k, key) == 0;
            free(k);
        }
        gs_node_spec_release(&n);
    }
    free(list);
    gs_error_clear(&cli->err);
    return found;
}

/* Appends `spec` to [remote] hosts unless the list names that node already. A new list starts
 * with [remote]'s server: the first host is the master, and it is where the project has run. */
static void add_to_list(struct gs_cli *cli, const char *spec, const char *key)
{
    struct gs_buf list = GS_BUF_INIT;
    if (cli->cfg.hosts) {
        if (list_has(cli, cli->cfg.hosts, key))
            return;
        gs_buf_adds(&list, cli->cfg.hosts);
    } else {
        gs_cli_remote_spec(&cli->cfg, &list);
        if (list_has(cli, list.data, key)) {
            gs_buf_release(&list);
            return; /* [remote] itself: a list of one is no multi-node set-up yet */
        }
    }
    gs_buf_addf(&list, ", %s", spec);
    free(cli->cfg.hosts);
    cli->cfg.hosts = gs_buf_detach(&list, NULL);
}

/* Prepares one node; says what was done on stdout. Returns 0 or a GS_E_* code in cli->err. */
static int add_node(struct gs_cli *cli, const char *spec)
{
    struct gs_node_spec n = {0};
    struct gs_cli node_cli = *cli; /* shares the password and options; owns only its connection */
    node_cli.ssh = NULL;
    int added = 0, rc = gs_node_spec_parse(cli, spec, &n);
    node_cli.cfg = n.cfg;
    if (rc == 0)
        rc = gs_cli_install_key(&node_cli, &added);
    if (rc == 0) {
        char *key = gs_cli_node_key(&n.cfg);
        add_to_list(cli, spec, key);
        printf("%s: host key %s recorded, %s %s\n", gs_ssh_target(node_cli.ssh),
               gs_ssh_fingerprint(node_cli.ssh), GS_TARGET_MANAGED_KEY,
               added ? "installed" : "was already installed");
        free(key);
    } else if (node_cli.err.code) {
        cli->err = node_cli.err;
    }
    gs_ssh_free(node_cli.ssh);
    gs_node_spec_release(&n);
    return rc;
}

static int save_config(struct gs_cli *cli)
{
    struct gs_buf file = GS_BUF_INIT;
    gs_path_join(&file, cli->root.data, GS_CONFIG_FILE);
    int rc = gs_config_save(&cli->cfg, file.data, &cli->err);
    gs_buf_release(&file);
    return rc;
}

/* Adds every node (stopping at the first that fails) and saves the list with those that worked. */
static int hosts_add(struct gs_cli *cli, int n, char **specs)
{
    int rc = 0, done = 0;
    for (int i = 0; i < n && rc == 0; i++)
        if ((rc = add_node(cli, specs[i])) == 0)
            done++;
    int saved = done ? save_config(cli) : 0;
    if (rc == 0 && saved < 0)
        rc = saved;
    if (rc < 0)
        return gs_cli_fail(cli, rc);
    printf("[remote] hosts = %s\n", cli->cfg.hosts ? cli->cfg.hosts : "(unset)");
    return 0;
}

static int hosts_list(struct gs_cli *cli)
{
    if (cli->cfg.hosts)
        printf("%s\n", cli->cfg.hosts);
    else
        printf("no [remote] hosts: runs use the one server, %s\n", cli->cfg.host);
    return 0;
}

static int hosts_parse(struct gs_cli *cli, int argc, char **argv)
{
    int r = gs_cli_parse_options(cli, &gs_cmd_hosts, argc, argv, "h", hosts_options, NULL);
    if (r != 0 || cli->argc == 0)
        return r;
    if (strcmp(cli->argv[0], "add") != 0)
        return gs_cli_usage_error(&gs_cmd_hosts, "unknown subcommand '%s'", cli->argv[0]);
    if (cli->argc == 1)
        return gs_cli_usage_error(&gs_cmd_hosts, "hosts add: expected [user@]host[:port][/path]");
    return 0;
}

/* Connects to each node itself (not GS_CMD_NEED_CONNECTION): the nodes are not [remote]. */
static int hosts_exec(struct gs_cli *cli)
{
    return cli->argc ? hosts_add(cli, cli->argc - 1, cli->argv + 1) : hosts_list(cli);
}

const struct gs_cmd gs_cmd_hosts = {
    .name = "hosts",
    .usage = "hosts [add [user@]host[:port][/path]...]",
    .summary = "List or prepare the nodes of multi-node runs ([remote] hosts)",
    .help = "  (no argument)          print [remote] hosts\n"
            "  add NODE...            for each node: check its host key and record it (asks on a\n"
            "                         terminal; else --accept-new-host-key), install\n"
            "                         ~/.ssh/gpusync_ed25519 there (with the password once, if no\n"
            "                         key works yet: GPUSYNC_PASSWORD, --password-stdin or a\n"
            "                         prompt), and add it to [remote] hosts\n",
    .flags = GS_CMD_NEED_PROJECT,
    .parse = hosts_parse,
    .exec = hosts_exec,
};

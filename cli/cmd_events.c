/* cli/cmd_events.c: `gpusync events --json`: the daemon's event stream, one JSON object per line
 * (synced, deleted, renamed, conflict, error, connected, disconnected, idle), for editor plugins.
 */
#include <stdio.h>
#include <unistd.h>

#include "cli/cli.h"
#include "syncd/control.h"

static void print_event(struct gs_cli *cli, json_t *ev)
{
    if (cli->json) {
        gs_cli_json_print(json_incref(ev));
        return;
    }
    const char *kind = json_string_value(json_object_get(ev, "event"));
    const char *path = json_string_value(json_object_get(ev, "path"));
    const char *detail = json_string_value(json_object_get(ev, "kept"));
    if (!detail)
        detail = json_string_value(json_object_get(ev, "message"));
    if (!detail)
        detail = json_string_value(json_object_get(ev, "target"));
    printf("%-12s %s%s%s\n", kind ? kind : "?", path ? path : "", detail ? "  " : "",
           detail ? detail : "");
    fflush(stdout);
}

static int events_exec(struct gs_cli *cli)
{
    int rc, fd = gs_control_connect(cli->root.data, &cli->err);
    if (fd < 0)
        return gs_cli_fail(cli, gs_error_set(&cli->err, GS_E_NOTFOUND,
                                             "no gpusync watch is running here; start one with "
                                             "'gpusync watch -d'"));
    json_t *req = json_pack("{s:s}", "cmd", "events"), *msg = NULL;
    struct gs_buf buf = GS_BUF_INIT;
    rc = gs_control_send(fd, req, &cli->err);
    json_decref(req);
    if (rc == 0)
        rc = gs_control_recv(fd, &buf, &msg, 5000, &cli->err); /* the {"ok":true} */
    json_decref(msg);
    while (rc == 0 && (rc = gs_control_recv(fd, &buf, &msg, -1, &cli->err)) == 0) {
        print_event(cli, msg);
        json_decref(msg);
    }
    close(fd);
    gs_buf_release(&buf);
    return rc == GS_E_DISCONNECTED ? 0 : gs_cli_fail(cli, rc);
}

const struct gs_cmd gs_cmd_events = {
    .name = "events",
    .usage = "events [--json]",
    .summary = "Stream the daemon's sync events (for editor plugins)",
    .help = "  Ends when the daemon stops.\n",
    .flags = GS_CMD_NEED_PROJECT,
    .exec = events_exec,
};

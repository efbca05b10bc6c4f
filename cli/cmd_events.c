/* cli/cmd_events.c: `gpusync events --json`: the daemon's event stream, one JSON object per line
 * (synced, deleted, renamed, conflict, error, connected, disconnected, idle), for editor plugins.
 */
#include <stdio.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/quote.h"
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
    /* names and messages as the daemon sent them (U+FFFD for bytes that were not UTF-8): quoted,
     * and the event's path quoted alike inside its message */
    struct gs_buf line = GS_BUF_INIT;
    const char *names[] = {path, NULL};
    gs_buf_addf(&line, "%-12s ", kind ? kind : "?");
    gs_quote_path(&line, path ? path : "");
    if (detail && json_object_get(ev, "message")) {
        gs_buf_adds(&line, "  ");
        gs_quote_message(&line, detail, path ? names : NULL, 0);
    } else if (detail) {
        gs_buf_adds(&line, "  ");
        gs_quote_path(&line, detail);
    }
    printf("%s\n", line.data);
    fflush(stdout);
    gs_buf_release(&line);
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

/* cli/run_nodes_attach.c: a multi-node run after `run` returned, as one run: the node list this
 * machine keeps of it (.gpusync/runs/<id>/nodes.json), and `logs`, `ps` and `stop` over every
 * node in that list (see run_nodes.h). Each node gets its own connection; one that cannot be
 * reached is named, never skipped in silence. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/run_local.h"
#include "cli/run_nodes.h"
#include "common/log.h"
#include "common/path.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/exec.h"

#define RECORD_FILE "nodes.json"

/* ---- the node list ---- */

/* Writes `rec` as run `id`'s node list, atomically. Returns 0, or -1 with a warning. */
static int record_save(const char *root, const char *id, json_t *rec)
{
    struct gs_buf dir = GS_BUF_INIT, tmp = GS_BUF_INIT, path = GS_BUF_INIT;
    gs_buf_addf(&dir, "%s/%s/runs/%s", root, GS_DIR, id);
    gs_buf_addf(&tmp, "%s/.%s.tmp", dir.data, RECORD_FILE);
    gs_buf_addf(&path, "%s/%s", dir.data, RECORD_FILE);
    int rc = gs_path_mkdir_p(dir.data, 0755, NULL) < 0 || json_dump_file(rec, tmp.data, 0) < 0 ||
                     rename(tmp.data, path.data) < 0
                 ? -1
                 : 0;
    if (rc < 0)
        gs_warn("cannot keep the node list of run %s in %s", id, path.data);
    gs_buf_release(&dir);
    gs_buf_release(&tmp);
    gs_buf_release(&path);
    return rc;
}

void gs_nodes_record(struct gs_cli *cli, const struct gs_nodes *m, int count, const char *name,
                     const char *master_addr, int master_port)
{
    json_t *nodes = json_array();
    struct gs_buf hosts = GS_BUF_INIT;
    for (int i = 0, first = 0; i < count && i < m->n; first += m->nodes[i++].nproc) {
        char *spec = gs_node_spec_format(&m->nodes[i]);
        gs_buf_addf(&hosts, "%s%s", i ? "," : "", spec);
        json_array_append_new(nodes, json_pack("{s:i,s:s,s:i,s:i}", "node", i, "host", spec,
                                               "nproc", m->nodes[i].nproc, "first_rank", first));
        free(spec);
    }
    json_t *rec = json_pack("{s:i,s:s,s:s?,s:s,s:o,s:s,s:i}", "v", 1, "id", m->id, "name", name,
                            "hosts", hosts.data, "nodes", nodes, "master_addr", master_addr,
                            "master_port", master_port);
    if (record_save(cli->root.data, m->id, rec) < 0)
        gs_warn("logs, ps and stop will reach the [remote] server only for run %s", m->id);
    json_decref(rec);
    gs_buf_release(&hosts);
}

/* The record in runs/<entry>/, when it is one and names `run` (any, when NULL). */
static json_t *record_load(const char *runs, const char *entry, const char *run)
{
    struct gs_buf path = GS_BUF_INIT;
    gs_buf_addf(&path, "%s/%s/%s", runs, entry, RECORD_FILE);
    json_t *rec = entry[0] != '.' ? json_load_file(path.data, 0, NULL) : NULL;
    gs_buf_release(&path);
    const char *id = json_string_value(json_object_get(rec, "id"));
    const char *name = json_string_value(json_object_get(rec, "name"));
    const char *hosts = json_string_value(json_object_get(rec, "hosts"));
    if (id && hosts && (!run || !strcmp(id, run) || (name && !strcmp(name, run))))
        return rec;
    json_decref(rec);
    return NULL;
}

/* Every record that names `run` (every one, when NULL), as a new array. */
static json_t *records_all(const char *root, const char *run)
{
    struct gs_buf runs = GS_BUF_INIT;
    gs_buf_addf(&runs, "%s/%s/runs", root, GS_DIR);
    json_t *all = json_array();
    DIR *d = opendir(runs.data);
    for (struct dirent *e; d && (e = readdir(d));) {
        json_t *rec = record_load(runs.data, e->d_name, run);
        if (rec)
            json_array_append_new(all, rec);
    }
    if (d)
        closedir(d);
    gs_buf_release(&runs);
    return all;
}

static const char *rec_str(json_t *rec, const char *key)
{
    return json_string_value(json_object_get(rec, key));
}

/* The node list of the newest recorded multi-node run whose id or name is `run` (any, when
 * NULL), as a new reference, or NULL when this project recorded none. */
static json_t *record_find(const char *root, const char *run)
{
    json_t *all = records_all(root, run), *rec, *best = NULL;
    size_t i;
    json_array_foreach(all, i, rec)
    {
        /* run ids begin with their UTC start time (gs_runcmd_new_id): newest is greatest */
        if (!best || strcmp(rec_str(rec, "id"), rec_str(best, "id")) > 0)
            best = rec;
    }
    json_incref(best);
    json_decref(all);
    return best;
}

json_t *gs_nodes_resolve(struct gs_cli *cli, struct gs_run_ctx *rc, const char *run, int live,
                         struct gs_buf *id, int *r)
{
    json_t *rec = record_find(cli->root.data, run);
    const char *rid = rec_str(rec, "id");
    *r = 0;
    if (rec && run && !strcmp(rid, run))
        return rec; /* an exact id: nothing to compare */
    *r = gs_run_ctx_resolve(cli, rc, run, live, id);
    if (rec && *r == 0 && strcmp(rid, id->data) < 0) {
        json_decref(rec); /* [remote] has a newer run by that name: that one */
        return NULL;
    }
    if (rec) {
        *r = 0;
        gs_error_clear(&cli->err);
    }
    return rec;
}

/* ---- connecting to the recorded nodes ---- */

/* Makes `m` the recorded run's nodes and connects to each (agent installed). Returns 0, or the
 * first node's error (named) in cli->err; with `keep_going`, every node is tried, each failure
 * is left in its node (result, cli.err) and 0 is returned. */
static int nodes_attach(struct gs_cli *cli, json_t *rec, struct gs_nodes *m, int keep_going)
{
    int r = gs_nodes_init(cli, m, rec_str(rec, "id"), rec_str(rec, "hosts"));
    json_t *list = json_object_get(rec, "nodes");
    for (int i = 0; r == 0 && i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        n->nproc = (int)json_integer_value(json_object_get(json_array_get(list, i), "nproc"));
        n->result = gs_cli_connect(&n->cli);
        if (n->result == 0)
            n->result = gs_run_ctx_open(&n->cli, &n->rc);
        if (n->result < 0) {
            struct gs_error why = n->cli.err; /* a copy: the message is rewritten in place */
            gs_error_set(&n->cli.err, n->result, "%s cannot be reached: %s", gs_node_name(n, i),
                         why.msg);
        }
        if (n->result < 0 && !keep_going) {
            cli->err = n->cli.err;
            r = n->result;
        }
    }
    return r;
}

/* ---- logs ---- */

/* The ranks of `ranks` that node `n` runs (its global ranks begin at `first`), as a comma list
 * (malloc'd), or NULL when it runs none of them. */
static char *node_ranks(const struct gs_node *n, int first, const char *ranks)
{
    struct gs_buf b = GS_BUF_INIT;
    for (int k = first; k < first + n->nproc; k++)
        if (gs_run_ranks_has(ranks, k))
            gs_buf_addf(&b, "%s%d", b.len ? "," : "", k);
    return b.len ? gs_buf_detach(&b, NULL) : NULL;
}

/* A replay of a local copy that notes where each rank's copy ends (a follow goes on from there). */
struct local_replay {
    struct gs_log_printer *printer;
    struct gs_tail_state *st;
};

static void local_chunk(void *ctx, int rank, uint64_t off, const char *data, size_t len)
{
    struct local_replay *lr = ctx;
    if (off + len > lr->st->offset[rank])
        lr->st->offset[rank] = off + len;
    gs_log_printer_chunk(lr->printer, rank, off, data, len);
}

/* Shows the local copy of the ranks `mine` of node `n`, which cannot be reached (n->cli.err
 * says why), saying so on stderr first; n->end gets the offsets the copy ends at. A missing copy
 * is said, not failed on. With `follow`, the line also says that the others are followed. */
static void node_show_local(struct gs_cli *cli, struct gs_nodes *m, struct gs_node *n,
                            const char *mine, struct gs_log_printer *printer, int follow)
{
    struct gs_error err = {0};
    struct local_replay lr = {.printer = printer, .st = n->end};
    int was = printer->from_local_copy; /* logs -f prints through the printer of every node */
    fprintf(stderr,
            "gpusync: %s; showing rank%s %s from the local copy in %s/runs/%s/ (what this "
            "machine received while following)%s\n",
            n->cli.err.msg, strchr(mine, ',') ? "s" : "", mine, GS_DIR, m->id,
            follow ? "; following the others, and trying it again while they run" : "");
    printer->from_local_copy = 1;
    if (gs_run_local_replay(cli->root.data, m->id, mine, local_chunk, &lr, &err) < 0)
        fprintf(stderr, "gpusync: warning: %s\n", err.msg);
    printer->from_local_copy = was;
    n->said = 1;
}

void gs_nodes_show_unreached(struct gs_cli *cli, struct gs_nodes *m)
{
    for (int i = 0, first = 0; i < m->n; first += m->nodes[i++].nproc) {
        struct gs_node *n = &m->nodes[i];
        char *mine = n->unreached && !n->said ? node_ranks(n, first, m->ranks) : NULL;
        if (!n->end)
            n->end = gs_xcalloc(1, sizeof(*n->end));
        if (mine)
            node_show_local(cli, m, n, mine, &m->printer, 1);
        else if (n->unreached && !n->said) /* none of its ranks asked for: only its end counts */
            fprintf(stderr,
                    "gpusync: %s; following the others, and trying it again while they run\n",
                    n->cli.err.msg);
        n->said = 1;
        free(mine);
    }
}

/* Prints every node's logs so far, node by node (--tail N: the last N lines of each node),
 * leaving each node's offsets in n->end, from which gs_nodes_follow goes on (logs -f --tail).
 * A node that could not be reached (attached with keep_going) is shown from the local copy and
 * named; the exit code is then its error's, after every other node was shown; with `follow`, 0:
 * the follow tries that node again. */
static int logs_show(struct gs_cli *cli, struct gs_nodes *m, const char *ranks, int tail,
                     int follow)
{
    static volatile sig_atomic_t never;
    struct gs_node *lost = NULL;
    int total = 0, r = 0;
    for (int i = 0; i < m->n; i++)
        total += m->nodes[i].nproc;
    for (int i = 0, first = 0; i < m->n && r == 0; first += m->nodes[i++].nproc) {
        struct gs_node *n = &m->nodes[i];
        char *mine = node_ranks(n, first, ranks);
        struct gs_log_printer printer;
        if (!n->end)
            n->end = gs_xcalloc(1, sizeof(*n->end));
        gs_log_printer_init(&printer, cli, m->id,
                            total > 1 && !(ranks && !strchr(ranks, ',') && strcmp(ranks, "all")));
        printer.tail_lines = tail;
        if (mine && n->result < 0) {
            node_show_local(cli, m, n, mine, &printer, follow);
            if (!follow && !lost) /* -f tries it again, and says at the end if in vain */
                lost = n;
        } else if (mine) {
            r = gs_run_ctx_tail(&n->cli, &n->rc, m->id, ranks, 0, n->end, &printer, &never);
        }
        if (follow && mine && n->result >= 0) /* the follow prints a line in progress whole */
            gs_log_printer_end_tail(&printer, n->end);
        else
            gs_log_printer_finish(&printer);
        free(mine);
        if (r < 0) {
            gs_error_set(&cli->err, r, "%s: %s", gs_node_name(n, i), n->cli.err.msg);
            return gs_cli_fail(cli, r);
        }
    }
    if (!lost)
        return 0;
    gs_error_set(&cli->err, lost->result,
                 "run %s: not every node could be reached (see above); run 'gpusync logs %s' "
                 "again once it is back for the lines this machine did not receive",
                 m->id, m->id);
    return gs_cli_fail(cli, lost->result);
}

/* --rank against the ranks the recorded run has over all its nodes. Returns 0 or GS_E_USAGE in
 * cli->err. */
static int check_ranks(struct gs_cli *cli, json_t *rec, const char *ranks)
{
    int total = 0;
    size_t i;
    json_t *node;
    json_array_foreach(json_object_get(rec, "nodes"), i, node)
    {
        total += (int)json_integer_value(json_object_get(node, "nproc"));
    }
    struct gs_buf what = GS_BUF_INIT;
    gs_buf_addf(&what, "run %s", rec_str(rec, "id"));
    int r = gs_run_check_ranks(cli, "--rank", ranks, total, what.data);
    gs_buf_release(&what);
    return r;
}

int gs_nodes_logs(struct gs_cli *cli, json_t *rec, const char *ranks, int follow, int tail)
{
    struct gs_nodes m;
    int r = check_ranks(cli, rec, ranks);
    if (r < 0)
        return gs_cli_fail(cli, r);
    int detached = 0, code;
    r = nodes_attach(cli, rec, &m, 1); /* an unreachable node: its local copy; -f tries again */
    for (int i = 0; follow && r == 0 && i < m.n; i++)
        m.nodes[i].unreached = m.nodes[i].result < 0;
    if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (follow && tail && (code = logs_show(cli, &m, ranks, tail, 1)) != 0)
        ; /* -f --tail N: the last lines so far, then the rest as it comes */
    else if (follow)
        code = gs_nodes_follow(cli, &m, ranks, &detached); /* 130 when detached */
    else
        code = logs_show(cli, &m, ranks, tail, 0);
    gs_nodes_release(&m);
    return code;
}

/* ---- stop ---- */

/* A stopper thread: stops the run on its (connected) node. */
static void *node_stop(void *arg)
{
    struct gs_node *n = arg;
    n->result = gs_run_ctx_stop(&n->cli, &n->rc, n->m->id, n->m->grace_ms, &n->report);
    if (n->result < 0) {
        struct gs_error why = n->cli.err;
        gs_error_set(&n->cli.err, n->result, "%s: %s", gs_node_name(n, (int)(n - n->m->nodes)),
                     why.msg);
    }
    return NULL;
}

/* Stops the run on every connected node at once (each may wait out the grace period). */
static void stop_all(struct gs_nodes *m)
{
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        n->has_thread = n->result == 0 && pthread_create(&n->thread, NULL, node_stop, n) == 0;
        if (n->result == 0 && !n->has_thread)
            node_stop(n);
    }
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i].has_thread)
            pthread_join(m->nodes[i].thread, NULL);
}

/* Prints each node's outcome; returns the index of the first node that failed, or -1. */
static int stop_report(struct gs_cli *cli, struct gs_nodes *m, json_t *list)
{
    int failed = -1;
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        char *spec = gs_node_spec_format(n);
        const char *report = n->report.len ? n->report.data : "stopped\n";
        if (n->result < 0 && failed < 0)
            failed = i;
        if (n->result < 0)
            fprintf(stderr, "gpusync: %s\n", n->cli.err.msg);
        else if (!cli->json)
            printf("%s: %s", gs_node_name(n, i), report);
        json_array_append_new(list, json_pack("{s:i,s:s,s:b,s:s}", "node", i, "host", spec, "ok",
                                              n->result == 0, "report",
                                              n->result < 0 ? n->cli.err.msg : report));
        free(spec);
    }
    return failed;
}

int gs_nodes_stop(struct gs_cli *cli, json_t *rec, long grace_ms)
{
    struct gs_nodes m;
    int code = 0, r = nodes_attach(cli, rec, &m, 1);
    json_t *list = json_array();
    m.grace_ms = grace_ms;
    if (r == 0) {
        stop_all(&m);
        int failed = stop_report(cli, &m, list);
        if (failed >= 0) {
            gs_error_set(&cli->err, m.nodes[failed].result,
                         "run %s was not stopped on every node (not on %s); run 'gpusync stop "
                         "%s' again once every node can be reached",
                         m.id, gs_node_name(&m.nodes[failed], failed), m.id);
            r = m.nodes[failed].result;
        }
    }
    if (r < 0 && json_array_size(list) > 0) /* what each node said, for --json */
        code = gs_cli_fail_with(cli, r, json_pack("{s:s,s:O}", "id", m.id, "nodes", list));
    else if (r < 0)
        code = gs_cli_fail(cli, r);
    else if (cli->json)
        gs_cli_json_print(
            json_pack("{s:i,s:b,s:s,s:O}", "v", 1, "ok", 1, "id", m.id, "nodes", list));
    json_decref(list);
    gs_nodes_release(&m);
    return code;
}

/* ---- ps ---- */

/* The run lists of the nodes asked so far, by node key (gs_cli_node_key): a JSON array, or a
 * string (why the node could not be asked). */
static json_t *node_list(struct gs_node *n, int i, json_t *cache, json_t *remote_runs)
{
    char *key = gs_cli_node_key(&n->cli.cfg);
    json_t *got = json_object_get(cache, key);
    if (!got && n->primary)
        json_object_set(cache, key, got = remote_runs);
    if (!got) {
        struct gs_buf out = GS_BUF_INIT;
        gs_run_ctx_init(&n->cli, &n->rc);
        int r = gs_cli_connect(&n->cli);
        if (r == 0)
            r = gs_run_ctx_list(&n->cli, &n->rc, &out);
        got = r == 0 ? json_loads(out.data ? out.data : "[]", 0, NULL) : NULL;
        if (!json_is_array(got)) {
            json_decref(got);
            got = json_string(r < 0 ? n->cli.err.msg : "garbled run list");
            fprintf(stderr, "gpusync: warning: %s cannot be reached: %s\n", gs_node_name(n, i),
                    json_string_value(got));
        }
        json_object_set_new(cache, key, got);
        gs_buf_release(&out);
    }
    free(key);
    return got;
}

/* The entry of run `id` in a node's list, or NULL. */
static json_t *entry_of(json_t *list, const char *id)
{
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        const char *eid = json_string_value(json_object_get(e, "id"));
        if (eid && !strcmp(eid, id))
            return e;
    }
    return NULL;
}

/* The run's state over its nodes: running while any node runs, then failed if any failed, then
 * lost, unknown (a node could not be asked or lacks the run), stopped, and succeeded when every
 * node succeeded. */
static const char *combine_state(const char *a, const char *b)
{
    static const char *order[] = {"running", "failed", "lost", "unknown", "stopped", "succeeded"};
    for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++)
        if (!strcmp(a, order[k]) || !strcmp(b, order[k]))
            return order[k];
    return "unknown";
}

/* One node's part of the combined entry, folding its state, ranks and exit code into `all`. */
static void fold_node(json_t *all, json_t *list, json_t *e, int i, const char *spec,
                      const char **state)
{
    const char *st = e ? json_string_value(json_object_get(e, "state")) : NULL;
    const char *node_state = st ? st : json_is_string(list) ? "unreachable" : "missing";
    json_t *node = json_pack("{s:i,s:s,s:s}", "node", i, "host", spec, "state", node_state);
    if (e) {
        json_object_set(node, "exit_code", json_object_get(e, "exit_code"));
        json_array_extend(json_object_get(all, "ranks"), json_object_get(e, "ranks"));
        if (!strcmp(node_state, "failed") && strcmp(*state, "failed"))
            json_object_set(all, "exit_code", json_object_get(e, "exit_code"));
        json_t *d = json_object_get(e, "duration_ms"), *dmax = json_object_get(all, "duration_ms");
        if (json_integer_value(d) > json_integer_value(dmax))
            json_object_set(all, "duration_ms", d);
    } else {
        json_object_set_new(node, "error",
                            json_string(json_is_string(list) ? json_string_value(list)
                                                             : "the node has no such run"));
    }
    *state = combine_state(*state, st ? st : "unknown");
    json_array_append_new(json_object_get(all, "nodes"), node);
}

/* The entry of the recorded run `rec` combined over its nodes, or NULL when no node has it
 * and every node could be asked (the servers were recreated: nothing to show). */
static json_t *combine(struct gs_cli *cli, json_t *rec, json_t *cache, json_t *remote_runs)
{
    struct gs_nodes m;
    const char *id = rec_str(rec, "id"), *state = "succeeded";
    json_t *all = NULL;
    int found = 0, unreachable = 0;
    if (gs_nodes_init(cli, &m, id, rec_str(rec, "hosts")) == 0) {
        /* start, gpus, command and exit_code come from the first node that has the run */
        all = json_pack("{s:s,s:s?,s:[],s:[],s:i}", "id", id, "name", rec_str(rec, "name"), "ranks",
                        "nodes", "duration_ms", 0);
        for (int i = 0; i < m.n; i++) {
            json_t *list = node_list(&m.nodes[i], i, cache, remote_runs);
            json_t *e = json_is_array(list) ? entry_of(list, id) : NULL;
            char *spec = gs_node_spec_format(&m.nodes[i]);
            if (e && !found)
                json_object_update_missing(all, e);
            found |= e != NULL;
            unreachable |= json_is_string(list);
            fold_node(all, list, e, i, spec, &state);
            free(spec);
        }
        json_object_set_new(all, "state", json_string(state));
    }
    gs_nodes_release(&m);
    if (!found && !unreachable) {
        json_decref(all);
        return NULL;
    }
    return all;
}

/* 1 when every node of the combined entry `all` has ended for good (succeeded, failed or
 * stopped; a lost run may still be stopped, an unreachable node still be asked). */
static int ended_everywhere(json_t *all)
{
    size_t i;
    json_t *node;
    json_array_foreach(json_object_get(all, "nodes"), i, node)
    {
        const char *st = json_string_value(json_object_get(node, "state"));
        if (!st || (strcmp(st, "succeeded") && strcmp(st, "failed") && strcmp(st, "stopped")))
            return 0;
    }
    return json_array_size(json_object_get(all, "nodes")) > 0;
}

/* Orders runs newest first by their "start" (ISO times compare as strings). */
static int by_start(const void *a, const void *b)
{
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "start"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "start"));
    return strcmp(y ? y : "", x ? x : "");
}

static void sort_runs(json_t *runs)
{
    size_t n = json_array_size(runs);
    json_t **v = gs_xcalloc(n + 1, sizeof(*v));
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(runs, i));
    qsort(v, n, sizeof(*v), by_start);
    json_array_clear(runs);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(runs, v[i]);
    free(v);
}

int gs_nodes_ps_merge(struct gs_cli *cli, json_t *runs)
{
    json_t *recs = records_all(cli->root.data, NULL), *rec, *cache = json_object();
    json_t *remote_runs = json_deep_copy(runs); /* [remote]'s own list, as listed */
    size_t i;
    json_array_foreach(recs, i, rec)
    {
        json_t *all = json_incref(json_object_get(rec, "final"));
        if (!all && (all = combine(cli, rec, cache, remote_runs)) && ended_everywhere(all)) {
            json_object_set(rec, "final", all); /* nothing changes now: no need to ask again */
            record_save(cli->root.data, rec_str(rec, "id"), rec);
        }
        json_t *mine = entry_of(runs, rec_str(rec, "id"));
        for (size_t k = 0; mine && k < json_array_size(runs); k++)
            if (json_array_get(runs, k) == mine)
                json_array_remove(runs, k);
        if (all)
            json_array_append_new(runs, all);
    }
    if (json_array_size(recs))
        sort_runs(runs);
    json_decref(recs);
    json_decref(cache);
    json_decref(remote_runs);
    return 0;
}

/* ---- doctor: can node 1 reach MASTER_ADDR? ---- */

#define REACH_CONNECT_MS 3000
#define REACH_LISTEN_MS  (REACH_CONNECT_MS + 1500)

/* The one-shot listener on node 0, run in its own thread (its own SSH session). */
struct listener {
    struct gs_node *n;
    int out_fd; /* the write end of the pipe its stdout goes to; closed when it ends */
    struct gs_buf errout;
    int status;
};

static void *listener_main(void *arg)
{
    struct listener *l = arg;
    struct gs_buf cmd = GS_BUF_INIT, args = GS_BUF_INIT;
    gs_buf_addf(&args, GS_PROTO_NET_LISTEN " --timeout-ms %d", REACH_LISTEN_MS);
    gs_run_agent_command(l->n->rc.agent.data, l->n->rc.dir.data, GS_PROTO_RUN_NET, args.data, &cmd);
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdout_fd = l->out_fd;
    io.stderr_buf = &l->errout;
    l->status = gs_exec_run(l->n->cli.ssh, cmd.data, &io, &l->n->cli.err);
    close(l->out_fd);
    gs_buf_release(&cmd);
    gs_buf_release(&args);
    return NULL;
}

/* Reads the listener's stdout to its end (it ends within REACH_LISTEN_MS plus a round trip). */
static void read_all(int fd, struct gs_buf *out)
{
    char chunk[512];
    ssize_t got;
    while ((got = read(fd, chunk, sizeof(chunk))) > 0 || (got < 0 && errno == EINTR))
        if (got > 0)
            gs_buf_add(out, chunk, (size_t)got);
}

/* Node 1 connects to `addr` at the port node 0's listener announced in `heard` (read so far
 * from `fd`, which is read up to the "port" line first). Returns the agent's exit status, with
 * what it printed on stderr in `why`. */
static int connect_from(struct gs_node *n1, const char *addr, int fd, struct gs_buf *heard,
                        struct gs_buf *why)
{
    char chunk[256];
    ssize_t got;
    while (!strchr(heard->data ? heard->data : "", '\n') &&
           ((got = read(fd, chunk, sizeof(chunk))) > 0 || (got < 0 && errno == EINTR)))
        if (got > 0)
            gs_buf_add(heard, chunk, (size_t)got);
    int port = 0;
    if (!heard->data || sscanf(heard->data, "port %d", &port) != 1) {
        gs_buf_adds(why, "node 0 could not listen on a free port");
        return -1;
    }
    struct gs_buf cmd = GS_BUF_INIT, args = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_buf_adds(&args, GS_PROTO_NET_CONNECT " ");
    gs_shell_quote(&args, addr);
    gs_buf_addf(&args, " %d --timeout-ms %d", port, REACH_CONNECT_MS);
    gs_run_agent_command(n1->rc.agent.data, n1->rc.dir.data, GS_PROTO_RUN_NET, args.data, &cmd);
    int r = gs_exec_capture(n1->cli.ssh, cmd.data, &out, why, &n1->cli.err);
    if (r < 0)
        gs_buf_adds(why, n1->cli.err.msg);
    gs_buf_release(&cmd);
    gs_buf_release(&args);
    gs_buf_release(&out);
    return r;
}

/* Runs the listener on node 0 and the connect on node 1; fills `detail`. Returns 1 when node 0
 * accepted node 1's connection, else 0. */
static int reach_probe(struct gs_nodes *m, const char *addr, char *detail, size_t cap)
{
    struct listener l = {.n = &m->nodes[0]};
    struct gs_buf heard = GS_BUF_INIT, why = GS_BUF_INIT;
    int fds[2], ok = 0;
    if (pipe(fds) < 0) {
        snprintf(detail, cap, "pipe: %s", strerror(errno));
        return 0;
    }
    l.out_fd = fds[1];
    pthread_t t;
    int started = pthread_create(&t, NULL, listener_main, &l) == 0;
    if (!started)
        close(fds[1]);
    int r = started ? connect_from(&m->nodes[1], addr, fds[0], &heard, &why) : -1;
    read_all(fds[0], &heard);
    close(fds[0]);
    if (started)
        pthread_join(t, NULL);
    ok = r == 0 && heard.data && strstr(heard.data, "\naccepted ");
    const char *because = why.len ? why.data : l.errout.len ? l.errout.data : "no answer";
    if (ok)
        snprintf(detail, cap, "node 1 reaches MASTER_ADDR %s on a free port of node 0", addr);
    else
        snprintf(detail, cap, "node 1 cannot reach MASTER_ADDR %s on a port of node 0: %.300s",
                 addr, because);
    gs_buf_release(&heard);
    gs_buf_release(&why);
    gs_buf_release(&l.errout);
    return ok;
}

int gs_nodes_check_reach(struct gs_cli *cli, const char *hosts, const char *given, char *detail,
                         size_t cap)
{
    struct gs_nodes m;
    int ok = 0;
    json_t *rec = json_pack("{s:s,s:s,s:[]}", "id", "doctor", "hosts", hosts, "nodes");
    if (nodes_attach(cli, rec, &m, 0) < 0) {
        snprintf(detail, cap, "%s", cli->err.msg);
    } else if (m.n < 2) {
        snprintf(detail, cap, "[remote] hosts names one host: nothing to reach");
        ok = 1;
    } else {
        const char *how;
        char *addr = gs_nodes_master_addr(&m, given, &how);
        ok = reach_probe(&m, addr, detail, cap);
        free(addr);
    }
    gs_error_clear(&cli->err);
    json_decref(rec);
    gs_nodes_release(&m);
    return ok;
}

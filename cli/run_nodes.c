/* cli/run_nodes.c: `gpusync run` on several hosts (--hosts a,b or [remote] hosts): one
 * connection, sync and launcher per host, node 0 first so that its free MASTER_PORT can be handed
 * to the others; one follower thread per node (each with its own connection, so a slow or cut link
 * stalls only its own logs); the first node to fail gets the others stopped, and its exit code is
 * the run's. MASTER_ADDR is given or detected here; the node list is kept for logs, ps and stop
 * (run_nodes_attach.c), which follow with the same threads (gs_nodes_follow). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/socket.h>
#include <time.h>

#include "cli/run_end.h"
#include "cli/run_nodes.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/exec.h"
#include "remote/runs.h"
#include "remote/target.h"

int gs_node_spec_parse(struct gs_cli *cli, const char *spec, struct gs_node_spec *n)
{
    const char *at = strrchr(spec, '@'), *host = at ? at + 1 : spec;
    const char *bracket = host[0] == '[' ? strchr(host, ']') : host;
    const char *slash = strchr(bracket ? bracket : host, '/'); /* hosts hold no '/' */
    char *target = gs_xstrndup(spec, slash ? (size_t)(slash - spec) : strlen(spec));
    struct gs_config t = {0};
    int rc = gs_config_parse_target(&t, target, &cli->err);
    free(target);
    n->host = t.host;
    n->user = t.user;
    n->path = slash ? gs_xstrdup(slash) : NULL;
    n->cfg = cli->cfg;
    n->cfg.host = n->host;
    n->cfg.user = n->user ? n->user : cli->cfg.user;
    n->cfg.port = t.port                                           ? t.port
                  : n->host && strcmp(n->host, cli->cfg.host) == 0 ? cli->cfg.port
                                                                   : 0;
    n->cfg.remote_path = n->path ? n->path : cli->cfg.remote_path;
    return rc;
}

void gs_node_spec_release(struct gs_node_spec *n)
{
    free(n->host);
    free(n->user);
    free(n->path);
    memset(n, 0, sizeof(*n));
}

/* Makes `n` the node `spec` names, with its own copy of the command's context. Returns 0 or
 * GS_E_USAGE in cli->err. */
static int node_parse(struct gs_cli *cli, const char *spec, struct gs_node *n)
{
    int r = gs_node_spec_parse(cli, spec, &n->spec);
    if (r < 0)
        return r;
    n->cli = *cli;
    n->cli.ssh = NULL;
    gs_error_clear(&n->cli.err);
    n->cli.cfg = n->spec.cfg;
    /* [remote] written another way (an alias, the port left out) is still [remote]: it is synced
     * with the project's index, under the name that index knows it by. */
    char *mine = gs_cli_node_key(&n->cli.cfg), *main_id = gs_cli_node_key(&cli->cfg);
    n->primary = strcmp(mine, main_id) == 0;
    if (n->primary) {
        n->cli.cfg.host = cli->cfg.host;
        n->cli.cfg.user = cli->cfg.user;
        n->cli.cfg.port = cli->cfg.port;
    }
    free(mine);
    free(main_id);
    return 0;
}

/* Parses the comma list into m->nodes. Returns 0 or a usage error in cli->err. */
static int nodes_parse(struct gs_cli *cli, const char *hosts, struct gs_nodes *m)
{
    char *list = gs_xstrdup(hosts), *save = NULL;
    m->nodes = gs_xcalloc(strlen(hosts) / 2 + 1, sizeof(*m->nodes));
    int r = 0;
    for (char *tok = strtok_r(list, ", \t", &save); tok && r == 0;
         tok = strtok_r(NULL, ", \t", &save)) {
        m->nodes[m->n].m = m;
        r = node_parse(cli, tok, &m->nodes[m->n++]);
    }
    free(list);
    if (r == 0 && m->n == 0)
        r = gs_error_set(&cli->err, GS_E_USAGE, "--hosts: no host given");
    return r;
}

int gs_nodes_init(struct gs_cli *cli, struct gs_nodes *m, const char *id, const char *hosts)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->cond, NULL);
    m->id = id;
    return nodes_parse(cli, hosts, m);
}

void gs_nodes_release(struct gs_nodes *m)
{
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        gs_ssh_free(n->cli.ssh);
        gs_run_ctx_release(&n->rc);
        if (n->planned)
            gs_runcmd_plan_release(&n->plan);
        gs_node_spec_release(&n->spec);
        gs_buf_release(&n->report);
        free(n->end);
    }
    free(m->nodes);
    pthread_cond_destroy(&m->cond);
    pthread_mutex_destroy(&m->lock);
    memset(m, 0, sizeof(*m));
}

char *gs_node_spec_format(const struct gs_node *n)
{
    const struct gs_config *c = &n->cli.cfg;
    struct gs_buf b = GS_BUF_INIT;
    if (c->user)
        gs_buf_addf(&b, "%s@", c->user);
    gs_buf_addf(&b, strchr(c->host, ':') ? "[%s]" : "%s", c->host);
    if (c->port)
        gs_buf_addf(&b, ":%d", c->port);
    if (c->remote_path && c->remote_path[0] == '/')
        gs_buf_adds(&b, c->remote_path);
    return gs_buf_detach(&b, NULL);
}

const char *gs_node_name(struct gs_node *n, int rank)
{
    const struct gs_config *c = &n->cli.cfg;
    if (n->cli.ssh)
        snprintf(n->name, sizeof(n->name), "node %d (%s)", rank, gs_ssh_target(n->cli.ssh));
    else if (c->port)
        snprintf(n->name, sizeof(n->name), "node %d (%s%s%s:%d)", rank, c->user ? c->user : "",
                 c->user ? "@" : "", c->host, c->port);
    else
        snprintf(n->name, sizeof(n->name), "node %d (%s%s%s)", rank, c->user ? c->user : "",
                 c->user ? "@" : "", c->host);
    return n->name;
}

/* Copies a node's error into the command's context and prints it. Returns the exit code. */
static int node_fail(struct gs_cli *cli, struct gs_node *n, int r)
{
    cli->err = n->cli.err;
    return gs_cli_fail(cli, r);
}

/* Connects to every node, installs the agent and settles what it runs on which devices; then,
 * when every node can run its part, syncs them. Returns 0 or the exit code. */
static int nodes_prepare(struct gs_cli *cli, struct run_args *a, struct gs_nodes *m)
{
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        int r = gs_cli_connect(&n->cli);
        if (r == 0)
            r = gs_run_ctx_open(&n->cli, &n->rc);
        if (r == 0) {
            n->planned = 1;
            r = gs_runcmd_plan(&n->cli, a, &n->plan);
        }
        if (r < 0)
            return node_fail(cli, n, r);
    }
    /* --ranks names global ranks, node by node (launch numbers them so), before any upload. */
    int total = 0;
    for (int i = 0; i < m->n; i++)
        total += m->nodes[i].plan.nproc;
    int r = gs_run_check_ranks(cli, "--ranks", a->ranks, total, "the run");
    if (r < 0)
        return gs_cli_fail(cli, r);
    for (int i = 0; i < m->n && !a->no_sync; i++) {
        struct gs_node *n = &m->nodes[i];
        int r = n->primary ? gs_cli_sync(&n->cli) : gs_cli_sync_node(&n->cli);
        if (r < 0)
            return node_fail(cli, n, r);
    }
    return 0;
}

/* The address the other nodes reach node 0 at, when nothing says better: its real host name
 * (an ~/.ssh/config alias resolved as OpenSSH would). */
static char *first_host_name(struct gs_node *n0)
{
    struct gs_target t;
    struct gs_error err = {0};
    char *addr = NULL;
    if (gs_target_resolve(&t, n0->spec.host, n0->cli.cfg.port, n0->cli.cfg.user, &err) == 0) {
        addr = gs_xstrdup(t.hostname ? t.hostname : n0->spec.host);
        gs_target_release(&t);
    }
    return addr ? addr : gs_xstrdup(n0->spec.host); /* the name as given when ssh -G cannot tell */
}

/* The numeric address this machine's connection reached node `n` at, into buf ("" when the
 * connection is not a plain socket, e.g. a proxy command). */
static void peer_addr(struct gs_node *n, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = n->cli.ssh ? gs_ssh_fd(n->cli.ssh) : -1;
    buf[0] = 0;
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &len) < 0 ||
        getnameinfo((struct sockaddr *)&ss, len, buf, (socklen_t)cap, NULL, 0, NI_NUMERICHOST))
        buf[0] = 0;
}

/* Runs the agent's `net src TO` on connected node `n`: its address on its route to TO, into
 * `out`. Returns 0, or -1. */
static int route_src(struct gs_node *n, const char *to, struct gs_buf *out)
{
    struct gs_buf args = GS_BUF_INIT, cmd = GS_BUF_INIT;
    gs_buf_adds(&args, GS_PROTO_NET_SRC " ");
    gs_shell_quote(&args, to);
    gs_run_agent_command(n->rc.agent.data, n->rc.dir.data, GS_PROTO_RUN_NET, args.data, &cmd);
    int r = gs_exec_capture(n->cli.ssh, cmd.data, out, NULL, &n->cli.err);
    while (out->len && (out->data[out->len - 1] == '\n' || out->data[out->len - 1] == ' '))
        out->data[--out->len] = 0;
    int ok = r == 0 && out->len > 0 && !strchr(out->data, ' ');
    gs_buf_release(&args);
    gs_buf_release(&cmd);
    return ok ? 0 : -1;
}

/* Node 0's address on its route to node 1 (malloc'd), or NULL when it cannot be told. Node 1
 * first says which of its addresses faces node 0 (as this machine reached node 0: through a NAT
 * or a bastion, that is node 1's own inside address), then node 0 which of its addresses faces
 * that one: on a cluster, its address on the network the nodes share. */
static char *detect_master_addr(struct gs_nodes *m)
{
    struct gs_node *n0 = &m->nodes[0], *n1 = &m->nodes[1];
    char p0[128], p1[128];
    struct gs_buf a1 = GS_BUF_INIT, s0 = GS_BUF_INIT;
    peer_addr(n0, p0, sizeof(p0));
    peer_addr(n1, p1, sizeof(p1));
    int r = p0[0] ? route_src(n1, p0, &a1) : -1;
    if (r < 0 && p1[0]) { /* node 1 as this machine reaches it */
        gs_buf_reset(&a1);
        gs_buf_adds(&a1, p1);
        r = 0;
    }
    if (r == 0)
        r = route_src(n0, a1.data, &s0);
    gs_buf_release(&a1);
    if (r < 0)
        gs_buf_release(&s0);
    return r < 0 ? NULL : gs_buf_detach(&s0, NULL);
}

char *gs_nodes_master_addr(struct gs_nodes *m, const char *given, const char **how)
{
    char *addr = NULL;
    if (given) {
        *how = "as configured";
        return gs_xstrdup(given);
    }
    if (m->n > 1 && (addr = detect_master_addr(m))) {
        *how = "node 0's address on its route to node 1";
        return addr;
    }
    *how = "the first host's name";
    return first_host_name(&m->nodes[0]);
}

/* Launches node `rank` of the run. Returns 0 (with *port filled for node 0) or a negative code
 * in the node's error. */
static int node_launch(struct run_args *a, struct gs_nodes *m, int rank, const char *addr,
                       int *port)
{
    struct gs_node *n = &m->nodes[rank];
    struct run_plan *p = &n->plan;
    struct gs_run_spec spec = {.agent = n->rc.agent.data,
                               .remote_dir = n->rc.dir.data,
                               .id = m->id,
                               .name = a->name,
                               .nproc = p->nproc,
                               .gpus = p->gpus.len ? p->gpus.data : NULL,
                               .gpu_count = p->gpu_count,
                               .max_restarts = a->max_restarts,
                               .grace_ms = a->grace_ms,
                               .argc = p->c.argc,
                               .argv = p->c.argv,
                               .nnodes = m->n,
                               .node_rank = rank,
                               .master_addr = addr,
                               .master_port = rank ? *port : 0};
    struct gs_tail_state *st = gs_xmalloc(sizeof(*st));
    int r = gs_run_launch_state(n->cli.ssh, &spec, st, &n->cli.err);
    if (r == 0 && rank == 0)
        *port = st->port;
    /* a command that could not start: the code its run recorded (127, 126), as on one server */
    n->start_code = r < 0 && st->finished && st->exit_code > 0 ? st->exit_code : 0;
    if (n->start_code) /* the run exists there, failed: ps counts its ranks */
        n->nproc = p->nproc;
    free(st);
    if (r == 0) {
        n->launched = 1;
        n->nproc = p->nproc;
        fprintf(stderr, "gpusync: node %d (%s): %d rank%s\n", rank, gs_ssh_target(n->cli.ssh),
                p->nproc, p->nproc == 1 ? "" : "s");
    }
    return r;
}

/* Stops the run on every node that was launched (from the main thread, no follower running). */
static void nodes_stop(struct gs_nodes *m)
{
    struct gs_notice notice;
    gs_notice_begin(&notice, GS_NOTICE_MS,
                    "stopping run %s on %d nodes: waiting for the ranks to exit after "
                    "SIGTERM; any still running 10 s after it get SIGKILL",
                    m->id, m->n);
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        struct gs_buf out = GS_BUF_INIT;
        if (n->launched && gs_run_stop(n->cli.ssh, n->rc.agent.data, n->rc.dir.data, m->id, &out,
                                       &n->cli.err) == 0)
            fprintf(stderr, "gpusync: node %d: %s", i, out.data ? out.data : "stopped\n");
        gs_buf_release(&out);
    }
    gs_notice_end(&notice);
}

/* Ctrl-C during a multi-node follow: detach, or stop every node on a second Ctrl-C. */
static int multi_interrupt(const struct run_args *a, struct gs_nodes *m)
{
    struct gs_buf msg = GS_BUF_INIT;
    gs_buf_addf(&msg,
                "\ngpusync: detached; run %s keeps going on %d nodes.\n"
                "  re-attach: gpusync logs -f %s\n  stop:      gpusync stop %s   (every node)\n"
                "(Ctrl-C again within 2 s stops it on every node now)\n",
                m->id, m->n, m->id, m->id);
    if (gs_runcmd_wants_stop(a, msg.data))
        nodes_stop(m);
    gs_buf_release(&msg);
    return 130;
}

/* How long node_reach waits before its first try, and at most between two. */
#define REACH_FIRST_MS 500
#define REACH_MAX_MS   5000

/* 1 while a node other than `n` is followed (reached, its follow not ended). Under m->lock. */
static int others_followed(struct gs_nodes *m, const struct gs_node *n)
{
    for (int i = 0; i < m->n; i++)
        if (&m->nodes[i] != n && !m->nodes[i].done && !m->nodes[i].unreached)
            return 1;
    return 0;
}

/* Waits `ms`, or less once no other node is followed or the follow is to end (Ctrl-C). Returns
 * 1 when it is then time to give up (after one more try, if no Ctrl-C). */
static int reach_wait(struct gs_node *n, int ms)
{
    int give_up = 0;
    for (int left = ms; left > 0 && !give_up && !n->abort; left -= 100) {
        usleep((useconds_t)(left < 100 ? left : 100) * 1000);
        pthread_mutex_lock(&n->m->lock);
        give_up = !others_followed(n->m, n);
        pthread_mutex_unlock(&n->m->lock);
    }
    return give_up;
}

/* logs -f: connects to node `n`, which could not be reached at attach, trying again (every few
 * seconds) while another node is followed: its ranks may print on, and the run end there,
 * meanwhile. Once no other node is followed, one last try; then it gives up. Returns 0 once
 * connected (n->unreached cleared: it is followed from the local copy's end, n->end), or an
 * error in n->cli.err. */
static int node_reach(struct gs_node *n, int rank)
{
    struct gs_nodes *m = n->m;
    int r, delay = REACH_FIRST_MS, give_up = 0;
    pthread_mutex_lock(&m->lock);
    give_up = !others_followed(m, n);
    pthread_mutex_unlock(&m->lock);
    for (;;) {
        give_up = give_up || reach_wait(n, delay);
        if (n->abort)
            return GS_E_INTERRUPTED;
        gs_ssh_free(n->cli.ssh);
        n->cli.ssh = NULL;
        gs_run_ctx_release(&n->rc);
        r = gs_cli_connect(&n->cli);
        if (r == 0)
            r = gs_run_ctx_open(&n->cli, &n->rc);
        if (r == 0 || give_up)
            break;
        delay = delay * 2 > REACH_MAX_MS ? REACH_MAX_MS : delay * 2;
    }
    if (r < 0) {
        struct gs_error why = n->cli.err; /* a copy: the message is rewritten in place */
        gs_error_set(&n->cli.err, r, "cannot be reached: %s", why.msg);
        return r;
    }
    pthread_mutex_lock(&m->lock);
    n->unreached = 0;
    fprintf(stderr, "gpusync: %s reached; following it on from where the local copy ends\n",
            gs_node_name(n, rank));
    pthread_mutex_unlock(&m->lock);
    return 0;
}

/* A follower thread: follows the node's part of the run to its end (logs -f: once reached, if it
 * could not be at attach); when told to (another node failed), stops it and follows on from the
 * offsets already shown (n->end keeps them), so its last lines and its end still arrive, each
 * line once. */
static void *node_follow(void *arg)
{
    struct gs_node *n = arg;
    struct gs_nodes *m = n->m;
    int code = 0, r = n->unreached ? node_reach(n, (int)(n - m->nodes)) : 0;
    while (r == 0) {
        /* Each node's end is kept, not said: gs_nodes_follow says the run's once. */
        r = gs_run_ctx_follow_end(&n->cli, &n->rc, m->id, m->ranks, &m->printer, &n->abort, &code,
                                  n->end);
        pthread_mutex_lock(&m->lock);
        int stop = r == GS_E_INTERRUPTED && n->stop_wanted;
        n->stop_wanted = 0;
        if (stop)
            n->abort = 0;
        pthread_mutex_unlock(&m->lock);
        if (!stop)
            break;
        struct gs_buf out = GS_BUF_INIT;
        r = gs_run_stop(n->cli.ssh, n->rc.agent.data, n->rc.dir.data, m->id, &out, &n->cli.err);
        gs_buf_release(&out);
        if (r < 0)
            break; /* not confirmed stopped: gs_nodes_follow names the node */
    }
    pthread_mutex_lock(&m->lock);
    n->done = 1;
    n->end_seq = ++m->ended;
    n->result = r;
    n->exit_code = code;
    pthread_cond_signal(&m->cond);
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* Waits for every follower; on Ctrl-C ends them all (returns 1), and when a node fails first,
 * has the others stopped and records its exit code in *first_code (else it stays -1). */
static int nodes_wait(struct gs_nodes *m, int *first_code)
{
    int left = m->n, detached = 0;
    pthread_mutex_lock(&m->lock);
    while (left > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&m->cond, &m->lock, &ts);
        left = 0;
        for (int i = 0; i < m->n; i++) {
            struct gs_node *n = &m->nodes[i];
            left += !n->done;
            if (gs_runcmd_interrupted && !detached)
                n->abort = 1;
            if (n->done != 1)
                continue;
            n->done = 2; /* seen */
            if (n->result == 0 && n->exit_code != 0 && *first_code < 0) {
                *first_code = n->exit_code;
                for (int j = 0; j < m->n && m->stop_on_failure; j++)
                    if (!m->nodes[j].done)
                        m->nodes[j].stop_wanted = 1, m->nodes[j].abort = 1;
            }
        }
        detached |= gs_runcmd_interrupted > 0;
    }
    pthread_mutex_unlock(&m->lock);
    return detached;
}

/* 1 when `ranks` asks for one rank only: its lines then go without "[rank N]" prefixes. */
static int one_rank(const char *ranks)
{
    return ranks && !strchr(ranks, ',') && strcmp(ranks, "all") != 0;
}

/* Starts a follower thread per node (SIGINT blocked there: the main thread handles it). */
static void start_followers(struct gs_nodes *m)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        if (!n->end)
            n->end = gs_xcalloc(1, sizeof(*n->end));
        n->has_thread = pthread_create(&n->thread, NULL, node_follow, n) == 0;
        if (!n->has_thread) { /* counted as ended, so the wait does not wait for it */
            n->done = 1;
            n->result = gs_error_set(&n->cli.err, GS_E_NOMEM, "cannot start a thread to follow %s",
                                     gs_node_name(n, i)); /* not connected, if unreached */
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* How much a node's end state decides the run's: as ps combines the nodes (run_nodes_attach.c),
 * failed before lost, unknown, stopped and succeeded. */
static int state_weight(const char *state)
{
    static const char *order[] = {"failed", "lost", "unknown", "stopped", "succeeded"};
    for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++)
        if (!strcmp(state, order[k]))
            return (int)k;
    return 2; /* a state this client does not know: as unknown */
}

/* The node whose end is the run's (see gs_nodes_follow), or NULL when no follow saw an end. */
static struct gs_node *deciding_node(struct gs_nodes *m)
{
    struct gs_node *d = NULL;
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        if (n->result != 0 || !n->end || !n->end->finished)
            continue;
        int w = state_weight(n->end->state), dw = d ? state_weight(d->end->state) : 99;
        if (w < dw || (w == dw && n->end_seq < d->end_seq))
            d = n;
    }
    return d;
}

/* Adds the integer `key` of `from` to that of `into` (max instead of sum when `max`). */
static void fold_int(json_t *into, json_t *from, const char *key, int max)
{
    json_int_t a = json_integer_value(json_object_get(into, key));
    json_int_t b = json_integer_value(json_object_get(from, key));
    if (json_is_integer(json_object_get(from, key)))
        json_object_set_new(into, key, json_integer(max ? (a > b ? a : b) : a + b));
}

/* The summary of the run over its nodes: the deciding node's, with the other nodes' stopped
 * ranks and processes added and the longest duration. malloc'd JSON text, or NULL. */
static char *nodes_summary(struct gs_nodes *m, struct gs_node *d)
{
    json_t *all = json_loads(d->end->summary, 0, NULL);
    if (!json_is_object(all)) {
        json_decref(all);
        return NULL;
    }
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        json_t *s =
            n != d && n->end && n->end->finished ? json_loads(n->end->summary, 0, NULL) : NULL;
        if (!json_is_object(s)) {
            json_decref(s);
            continue;
        }
        json_t *ranks = json_object_get(all, "stopped_ranks");
        if (json_is_array(ranks))
            json_array_extend(ranks, json_object_get(s, "stopped_ranks"));
        fold_int(all, s, "others_termed", 0);
        fold_int(all, s, "killed_count", 0);
        fold_int(all, s, "duration_ms", 1);
        json_decref(s);
    }
    char *text = json_dumps(all, JSON_COMPACT);
    json_decref(all);
    return text;
}

/* Says once how the run ended, as its deciding node did. Returns the run's exit code. */
static int nodes_say_end(struct gs_cli *cli, struct gs_nodes *m, struct gs_node *d)
{
    char *summary = nodes_summary(m, d);
    gs_run_end_print(cli, m->id, d->end->state, d->end->exit_code, summary ? summary : "");
    free(summary);
    return d->exit_code;
}

/* Adds to `msg` how node `d`'s part ended ("run ID failed on node 0 (HOST) (exit 5: rank 0
 * exited with 5)"), or "run ID" when no node's end was seen. */
static void say_known_end(struct gs_nodes *m, struct gs_node *d, struct gs_buf *msg)
{
    if (!d) {
        gs_buf_addf(msg, "run %s", m->id);
        return;
    }
    json_t *s = json_loads(d->end->summary, 0, NULL);
    char why[512] = "";
    if (json_is_object(json_object_get(s, "failed")))
        gs_run_end_failure(json_object_get(s, "failed"), why, sizeof(why));
    json_decref(s);
    gs_buf_addf(msg, "run %s %s on %s (exit %d%s%s)", m->id, d->end->state,
                gs_node_name(d, (int)(d - m->nodes)), d->end->exit_code, why[0] ? ": " : "", why);
}

/* Some node's follow ended in an error, or (logs -f) a node was never reached: its part of the
 * run may still run, so the run is not said to have ended. Names each such node and how to stop
 * it (and, never reached, to see its lines); `d` is the node whose end would decide the run's
 * (NULL if none ended). Returns the exit code as for a connection that failed on one server
 * (255 with `run` and `logs -f`), or the first such node's own; when every such node was never
 * reached, its error's as plain `logs` gives it (4): no follow was lost, and 255 would read as
 * one. */
static int nodes_say_unconfirmed(struct gs_cli *cli, struct gs_nodes *m, struct gs_node *d)
{
    struct gs_buf msg = GS_BUF_INIT;
    int code = 0, lost = 0;
    say_known_end(m, d, &msg);
    for (int i = 0; i < m->n; i++) {
        struct gs_node *n = &m->nodes[i];
        if (n->result >= 0)
            continue;
        gs_buf_addf(&msg, "%s on %s: %s",
                    code ? "; nor"
                    : d  ? ", but it could not be confirmed ended"
                         : " could not be confirmed ended",
                    gs_node_name(n, i), n->cli.err.msg);
        code = code ? code : n->result;
        lost |= !n->unreached;
    }
    gs_buf_addf(&msg,
                "; its ranks there may still run: once the node can be reached, stop them with "
                "'gpusync stop %s'",
                m->id);
    if (!lost)
        gs_buf_addf(&msg, ", and see the lines this machine did not receive with 'gpusync logs %s'",
                    m->id);
    gs_error_set(&cli->err, code, "%s", msg.data);
    gs_buf_release(&msg);
    if (!lost)
        cli->remote_status = 0;
    return gs_cli_fail(cli, code);
}

int gs_nodes_follow(struct gs_cli *cli, struct gs_nodes *m, const char *ranks, int *detached)
{
    int total = 0, first_code = -1;
    for (int i = 0; i < m->n; i++)
        total += m->nodes[i].nproc;
    gs_log_printer_init(&m->printer, cli, m->id, total > 1 && !one_rank(ranks));
    m->printer.lock = &m->lock;
    m->ranks = ranks;
    struct sigaction sa = {.sa_handler = gs_runcmd_on_sigint};
    sigaction(SIGINT, &sa, NULL);
    gs_nodes_show_unreached(cli, m); /* logs -f: before any line of the others, in one printer */
    start_followers(m);
    *detached = nodes_wait(m, &first_code);
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i].has_thread)
            pthread_join(m->nodes[i].thread, NULL);
    m->printer.lock = NULL;
    gs_log_printer_finish(&m->printer);
    if (*detached)
        return 130;
    struct gs_node *d = deciding_node(m);
    for (int i = 0; i < m->n; i++)
        if (m->nodes[i].result < 0)
            return nodes_say_unconfirmed(cli, m, d);
    if (first_code >= 0)
        return d ? nodes_say_end(cli, m, d) : first_code;
    return d ? nodes_say_end(cli, m, d) : 0;
}

/* Follows every node; Ctrl-C detaches (or stops, see multi_interrupt). */
static int nodes_follow(struct gs_cli *cli, struct run_args *a, struct gs_nodes *m)
{
    int detached = 0;
    m->stop_on_failure = 1;
    int code = gs_nodes_follow(cli, m, a->ranks, &detached);
    return detached ? multi_interrupt(a, m) : code;
}

/* Launches node 0 (which picks MASTER_PORT), then the others with that port. Returns 0, or the
 * exit code after stopping what had started. */
static int nodes_launch(struct gs_cli *cli, struct run_args *a, struct gs_nodes *m)
{
    const char *how;
    char *addr = gs_nodes_master_addr(m, a->master_addr, &how);
    int port = 0, r = 0, i;
    for (i = 0; i < m->n && r == 0; i++)
        r = node_launch(a, m, i, addr, &port);
    int code = 0;
    if (r < 0) {
        /* the nodes that have the run (launched, or recorded it failed) are a prefix: ps, logs
         * and stop then see it as the failed run it was on them */
        int had = i - (m->nodes[i - 1].start_code ? 0 : 1);
        if (had > 0)
            gs_nodes_record(cli, m, had, a->name, addr, port);
        code = node_fail(cli, &m->nodes[i - 1], r);
        code = m->nodes[i - 1].start_code ? m->nodes[i - 1].start_code : code;
        nodes_stop(m);
    } else if (cli->json) {
        gs_nodes_record(cli, m, m->n, a->name, addr, port);
        gs_cli_json_print(json_pack("{s:i,s:b,s:s,s:i,s:i,s:s,s:i}", "v", 1, "ok", 1, "id", m->id,
                                    "nodes", m->n, "ranks", m->n * m->nodes[0].nproc, "master_addr",
                                    addr, "master_port", port));
    } else {
        gs_nodes_record(cli, m, m->n, a->name, addr, port);
        fprintf(stderr,
                "gpusync: run %s started on %d nodes (MASTER_ADDR %s: %s; MASTER_PORT %d)\n", m->id,
                m->n, addr, how, port);
    }
    free(addr);
    return code;
}

int gs_runcmd_multi(struct gs_cli *cli, struct run_args *a)
{
    struct gs_nodes m;
    char id[64];
    gs_runcmd_new_id(id);
    int r = gs_nodes_init(cli, &m, id, a->hosts);
    int code = r < 0 ? gs_cli_fail(cli, r) : nodes_prepare(cli, a, &m);
    if (code == 0)
        code = nodes_launch(cli, a, &m);
    if (code == 0 && !a->detach)
        code = nodes_follow(cli, a, &m);
    gs_nodes_release(&m);
    return code;
}

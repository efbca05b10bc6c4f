/* remote/agent_client.c: pipelined requests to gpusync-agent over an exec channel (see
 * agent_client.h and proto/sync.h). */
#include "remote/agent_client.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/wrapper.h"
#include "proto/sync.h"
#include "proto/zframes.h"
#include "remote/agent_install.h"
#include "remote/check_set.h"
#include "remote/delta.h"

#define XXH_INLINE_ALL
#include <xxhash.h>
#include "remote/exec.h"

#define OUT_HIGH_WATER  (4u << 20)  /* stop queueing and pump when this much is unsent */
#define WRITE_BATCH     (32u << 10) /* write once this much is queued (one full SSH packet) */
#define SMALL_PUT_MAX   (64u << 10) /* files up to this size go as one PUT frame */
#define MAX_IN_FLIGHT   8192        /* requests awaiting a reply */
#define READ_CHUNK      (256u << 10)
#define IN_READ_MAX     (2 * GS_PROTO_MAX_FRAME) /* stop reading replies and dispatch them */
#define STDERR_KEEP     4096
#define EARLY_PLAIN_MAX (64u << 10) /* sent plain while compression is offered, not yet agreed */
/* The level for a slow link, and what counts as one (judge_link): see agent_client.h. */
#define SLOW_LEVEL      GS_AGENT_SLOW_LEVEL
#define LINK_JUDGE_MS   250 /* answers over this long, the link busy all along, make a rate */
#define LINK_BUSY_MIN   (256u << 10) /* wire bytes sent and unanswered: the link has work queued */
#define JUDGE_AHEAD_MAX (1u << 20)   /* wire bytes unanswered while the link is not judged yet */

struct pending {
    uint32_t id;
    void *ctx;
    struct gs_fop_req *resend; /* a PUT_DELTA's request, owned: sent whole if the basis is gone */
    uint64_t plain_end;        /* the request's end in the stream of frames (judge_link) */
    int verified;              /* a stream whose PUT_END carries GS_PUTEND_VERIFY */
};

/* What the agent's answers say of the link: the agent answers a request once it has read all of
 * it, so the stream position of answered requests moves at the link's pace, whatever the socket
 * buffers (and a slow link's queues) took in at once. */
struct link_judge {
    int on;         /* the level may still be raised: compress = auto, not judged slow yet */
    int64_t t0_ms;  /* since when the link has been kept busy */
    uint64_t base;  /* the stream position answered then */
    uint64_t acked; /* the furthest position answered */
    double rate;    /* wire bytes a second over the busy time, once LINK_JUDGE_MS long; or 0 */
    uint64_t raised_ahead; /* packed and unanswered when the level was raised, or 0 */
};

/* A request whose replies the caller consumes itself (handshake, GET, LIST, ping). */
struct sync_call {
    uint32_t id;
    uint32_t span; /* replies come for ids id .. id + span - 1 (0 counts as 1) */
    int done;
    int (*on_frame)(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *call);
    void *state;
};

struct check_call;

struct gs_agent {
    struct gs_fileops ops; /* first, so the fileops pointer is the agent */
    struct gs_ssh *ssh;
    LIBSSH2_CHANNEL *ch;
    struct gs_exec_gate gate; /* the shell's noise before the agent's first byte is not a frame */
    struct gs_exec_pending exec; /* the exec request, answered while the first requests go */
    struct gs_proto_buf out;     /* whole frames queued, not yet on their way: from out_at on */
    struct gs_proto_buf wire; /* bytes being written: frames from `out`, packed when zstd is on */
    size_t out_at, wire_at;   /* how far each has been taken (read offsets: see take_out) */
    uint64_t taken;           /* frame bytes moved from `out` to the wire, in all */
    struct link_judge link;
    struct gs_zframes *z;    /* compression offered in HELLO (NULL: off) */
    int zstd;                /* the agent agreed: pack what goes out, unpack ZFRAMES_R */
    struct gs_proto_buf zin; /* the frames of the last ZFRAMES_R */
    size_t early_plain;      /* bytes sent plain before the agent answered the offer */
    int early_hold;          /* what is queued would compress: wait for the answer */
    uint8_t *in;
    size_t in_len, in_cap;
    struct gs_buf errtail; /* the agent's stderr, for messages when it dies */
    struct pending *q;     /* FIFO of requests awaiting DONE/ERROR */
    size_t q_head, q_len, q_cap;
    uint32_t next_id;
    int eof;
    struct sync_call *sync[4]; /* calls whose replies the caller consumes, matched by id */
    int n_sync;
    /* The handshake is pipelined: requests follow HELLO at once, and its answer is checked when
     * it arrives (the agent answers in order, so a refusal comes before any other reply). */
    struct sync_call hello_call;
    int hello_rc;
    char sync_id[GS_SYNC_ID_MAX + 1]; /* from HELLO_OK: the root's .gpusync/sync-id */
    int want_resident, via_socket;    /* GS_HELLO_RESIDENT asked; reached through the listener */
    int resident_ran;                 /* HELLO_OK: the listener was running before this session */
    char resident[GS_AGENT_RESIDENT_MAX]; /* from HELLO_OK: the listener's socket, or "" */
    char *root;                           /* from HELLO_OK: the root's absolute path */
    struct gs_error *hello_err;
    int64_t started_ms; /* when the shell was seen to start the agent (its marker); 0 before */
    int delta;          /* the agent agreed to PUT_DELTA */
    char *sig_dir;      /* where signatures are kept (gs_agent_set_delta_dir), or NULL */
    struct gs_fop_req **resend; /* deltas refused for want of a basis, to send whole (owned) */
    size_t n_resend, resend_cap;
    struct gs_agent_delta *ready; /* deltas made before the session was ready (owned) */
    size_t n_ready;
    struct gs_check_set kept;    /* the beliefs the agent keeps for CHECK */
    char *check_file;            /* where they are kept between sessions, or NULL */
    struct check_call *checking; /* the check under way (check_send), or NULL */
};

/* ---- reading, writing, dispatching ---- */

/* The serve command could not make the project's folder (gs_agent_serve_command's marker ends
 * its stderr): the server answered, so this is a remote error for the user to fix there, not a
 * lost connection to retry. Returns GS_E_REMOTE with the reason mkdir gave, or 0 if not so. */
static int root_unusable(struct gs_agent *a, struct gs_error *err)
{
    char *mark = a->errtail.len ? strstr(a->errtail.data, GS_AGENT_ROOT_UNUSABLE) : NULL;
    if (!mark || a->hello_call.done)
        return 0;
    if (gs_exec_path_broken(a->ssh, a->errtail.data, err) < 0)
        return GS_E_REMOTE; /* mkdir was not found, not refused */
    while (mark > a->errtail.data && mark[-1] == '\n')
        mark--;
    return gs_error_set(err, GS_E_REMOTE,
                        "cannot use the remote project folder on %s: %.*s; remove or rename what "
                        "is there, or choose another folder (gpusync init --path)",
                        gs_ssh_target(a->ssh), (int)(mark - a->errtail.data), a->errtail.data);
}

static int agent_gone(struct gs_agent *a, struct gs_error *err)
{
    while (a->errtail.len && (a->errtail.data[a->errtail.len - 1] == '\n'))
        a->errtail.data[--a->errtail.len] = '\0';
    int rc = root_unusable(a, err);
    if (rc)
        return rc;
    /* A resident listener that closes before the handshake's answer started no session (its
     * `serve` could not start, or refused): the SSH connection is fine, and the caller falls back
     * to the shell. */
    if (a->via_socket && !a->hello_call.done)
        return gs_error_set(err, GS_E_REMOTE,
                            "the resident gpusync agent on %s closed before its "
                            "handshake",
                            gs_ssh_target(a->ssh));
    rc = gs_error_set(err, GS_E_DISCONNECTED, "the gpusync agent on %s %s%s%s",
                      gs_ssh_target(a->ssh), a->gate.passed[0] ? "stopped" : "did not start",
                      a->errtail.len ? ": " : "", a->errtail.len ? a->errtail.data : "");
    if (!a->gate.passed[0])
        gs_exec_blame_noise(&a->gate, err);
    return rc;
}

static void keep_stderr(struct gs_agent *a)
{
    char buf[1024];
    ssize_t n;
    while ((n = gs_exec_read(a->ch, &a->gate, 1, buf, sizeof(buf))) > 0) {
        gs_buf_add(&a->errtail, buf, (size_t)n);
        if (a->errtail.len > STDERR_KEEP)
            gs_buf_consume(&a->errtail, a->errtail.len - STDERR_KEEP);
    }
}

/* Reads what the channel has. Returns >0 on progress, 0 if nothing, <0 on a transport error. */
static int read_some(struct gs_agent *a, struct gs_error *err)
{
    GS_ALLOC_GROW(a->in, a->in_len + READ_CHUNK, a->in_cap);
    ssize_t n = gs_exec_read(a->ch, &a->gate, 0, (char *)a->in + a->in_len, a->in_cap - a->in_len);
    keep_stderr(a);
    if (n == LIBSSH2_ERROR_EAGAIN)
        return 0;
    if (n < 0)
        return gs_ssh_error(a->ssh, (int)n, "reading from the agent", err);
    if (n == 0 && libssh2_channel_eof(a->ch)) {
        a->eof = 1;
        return 0;
    }
    a->in_len += (size_t)n;
    return n > 0;
}

static int delta_refused(struct gs_agent *a, struct pending *p, const struct gs_proto_msg *m);

/* Wire bytes per stream byte so far (the compression ratio; 1 before any was packed). */
static double wire_ratio(const struct gs_agent *a)
{
    unsigned long long plain, wire;
    gs_zframes_stats(a->z, &plain, &wire);
    return plain ? (double)wire / (double)plain : 1.0;
}

/* Reads the link's rate from the answers while it is kept busy (LINK_BUSY_MIN wire bytes or more
 * sent and unanswered: the link, not this side's reading and compressing, sets the pace), as
 * answered stream bytes a second at the compression ratio so far; an idle moment starts the
 * count again. Once the rate over LINK_JUDGE_MS is below GS_AGENT_SLOW_LINK_BPS, raises the level
 * (compress = auto). Never lowered: a push is short, and each change costs the stream's
 * history. What the socket buffers take in says nothing here: they (and a slow link's queues)
 * swallow megabytes at once. */
static void judge_link(struct gs_agent *a, uint64_t plain_end)
{
    struct link_judge *j = &a->link;
    if (!a->zstd || plain_end <= j->acked)
        return;
    int64_t now = gs_clock_mono_ms();
    j->acked = plain_end;
    double ratio = wire_ratio(a);
    double backlog = (double)(a->taken > plain_end ? a->taken - plain_end : 0) * ratio;
    if (!j->t0_ms || backlog < LINK_BUSY_MIN) {
        j->t0_ms = now;
        j->base = plain_end;
        return;
    }
    if (now - j->t0_ms < LINK_JUDGE_MS)
        return;
    j->rate = (double)(plain_end - j->base) * ratio * 1000.0 / (double)(now - j->t0_ms);
    if (j->on && j->rate < GS_AGENT_SLOW_LINK_BPS) {
        gs_debug("link: %.1f Mbit/s with %.0f kB unanswered: zstd level %d", j->rate * 8 / 1e6,
                 backlog / 1024, SLOW_LEVEL);
        gs_zframes_set_level(a->z, SLOW_LEVEL);
        j->raised_ahead = a->taken - plain_end;
        j->on = 0;
    }
}

static void complete(struct gs_agent *a, const struct gs_proto_msg *m)
{
    struct pending p = a->q[a->q_head];
    a->q_head = (a->q_head + 1) % a->q_cap;
    a->q_len--;
    judge_link(a, p.plain_end);
    if (delta_refused(a, &p, m))
        return; /* completed when the whole file is answered */
    char message[1024] = "", kept[4200] = "";
    struct gs_fop_result r = {.ok = m->type == GS_MSG_DONE};
    if (m->type == GS_MSG_DONE) {
        r.noop = (m->flags & GS_DONE_NOOP) != 0;
        r.moved_aside = (m->flags & GS_DONE_MOVED_ASIDE) != 0;
        if (m->path2.len) {
            snprintf(kept, sizeof(kept), "%.*s", (int)m->path2.len, m->path2.p);
            r.kept = kept;
        }
    } else {
        /* A verified stream refused as malformed got other bytes than were hashed: the file
         * changed while it was read. EAGAIN, as when that is seen before sending (put_vanished). */
        r.err_no = p.verified && m->err == EBADMSG ? EAGAIN : m->err;
        snprintf(message, sizeof(message), "%.*s", (int)m->text.len, m->text.p);
        r.message = message;
    }
    if (a->ops.done)
        a->ops.done(a->ops.done_ctx, p.ctx, &r);
}

static int handle_frame(struct gs_agent *a, const struct gs_proto_frame *f, struct gs_error *err);

/* Handles the reply frames a ZFRAMES_R carries, in order. */
static int unpack_replies(struct gs_agent *a, const struct gs_proto_msg *m, struct gs_error *err)
{
    if (!a->z || gs_zframes_unpack(a->z, m, &a->zin) < 0)
        return gs_error_set(err, GS_E_PROTO, "malformed compressed replies from the agent on %s",
                            gs_ssh_target(a->ssh));
    int rc = 0;
    for (size_t at = 0; rc == 0 && at < a->zin.len;) {
        struct gs_proto_frame g;
        long len = gs_proto_parse_frame(a->zin.data + at, a->zin.len - at, &g);
        if (len <= 0 || g.type == GS_MSG_ZFRAMES_R)
            return gs_error_set(err, GS_E_PROTO,
                                "a malformed frame inside compressed replies "
                                "from the agent on %s",
                                gs_ssh_target(a->ssh));
        at += (size_t)len;
        rc = handle_frame(a, &g, err);
    }
    return rc;
}

/* What a session's start looks like when a startup file of the login shell reads standard input:
 * it takes the first bytes sent, and the agent waits for the rest of a frame or refuses what it
 * reads instead of HELLO. */
#define STDIN_EATEN                                                                                \
    "a startup file of the login shell that reads standard input (a `read` or `cat` in ~/.bashrc " \
    "outside its interactive-only part) takes the start of what gpusync sends; `gpusync doctor` "  \
    "checks it"

/* An ERROR for no request (id 0), or one that came before HELLO's answer: the agent did not read
 * our HELLO, and ends the session. */
static int session_refused(struct gs_agent *a, const struct gs_proto_msg *m, struct gs_error *err)
{
    int eaten = !a->hello_call.done && !a->via_socket; /* through a login shell */
    return gs_error_set(
        err, GS_E_PROTO, "the agent on %s %s the session: %.*s%s%s", gs_ssh_target(a->ssh),
        a->hello_call.done ? "ended" : "refused", (int)m->text.len, m->text.p,
        eaten ? "; it did not get gpusync's first bytes as sent: " : "", eaten ? STDIN_EATEN : "");
}

static int handle_frame(struct gs_agent *a, const struct gs_proto_frame *f, struct gs_error *err)
{
    struct gs_proto_msg m;
    if (gs_proto_decode(f, &m) != 0)
        return gs_error_set(err, GS_E_PROTO, "malformed %s reply from the agent on %s",
                            gs_proto_type_name(f->type), gs_ssh_target(a->ssh));
    if (m.type == GS_MSG_ZFRAMES_R)
        return unpack_replies(a, &m, err);
    for (int i = 0; i < a->n_sync; i++) {
        struct sync_call *c = a->sync[i];
        if (m.id - c->id < (c->span ? c->span : 1u)) /* unsigned: ids below c->id are huge */
            return c->on_frame(a, &m, c);
    }
    if (m.type == GS_MSG_ERROR && (m.id == 0 || !a->hello_call.done))
        return session_refused(a, &m, err);
    if ((m.type != GS_MSG_DONE && m.type != GS_MSG_ERROR) || a->q_len == 0 ||
        a->q[a->q_head].id != m.id)
        return gs_error_set(err, GS_E_PROTO, "unexpected %s (id %u) from the agent on %s",
                            gs_proto_type_name(m.type), m.id, gs_ssh_target(a->ssh));
    complete(a, &m);
    return 0;
}

static int dispatch(struct gs_agent *a, struct gs_error *err)
{
    size_t pos = 0;
    int rc = 0;
    for (;;) {
        struct gs_proto_frame f;
        long size = gs_proto_parse_frame(a->in + pos, a->in_len - pos, &f);
        if (size < 0)
            rc = gs_error_set(err, GS_E_PROTO, "garbage from the agent on %s (bad frame length)",
                              gs_ssh_target(a->ssh));
        if (size <= 0 || (rc = handle_frame(a, &f, err)) < 0)
            break;
        pos += (size_t)size;
    }
    memmove(a->in, a->in + pos, a->in_len - pos);
    a->in_len -= pos;
    return rc;
}

/* Bytes of the wire not yet written. */
static size_t wire_left(const struct gs_agent *a)
{
    return a->wire.len - a->wire_at;
}

/* Bytes queued in `out`, not yet moved to the wire. */
static size_t out_left(const struct gs_agent *a)
{
    return a->out.len - a->out_at;
}

/* 1 when libssh2 holds a half-sent packet: then only the same write may be called (1.10). */
static int half_sent(struct gs_agent *a)
{
    return wire_left(a) && (libssh2_session_block_directions(gs_ssh_session(a->ssh)) &
                            LIBSSH2_SESSION_BLOCK_OUTBOUND);
}

/* Bytes queued or being written. */
static size_t unsent(const struct gs_agent *a)
{
    return out_left(a) + wire_left(a);
}

/* Marks n queued bytes as moved to the wire. Both buffers are read through an offset, not
 * shifted: libssh2 takes at most one 32 KiB packet per write, and moving the megabytes behind it
 * each time cost 15% of the client's CPU on a loopback upload (perf). `out` is shifted down
 * only when the part already taken is the larger one, so each byte moves at most about once. */
static void take_out(struct gs_agent *a, size_t n)
{
    a->taken += n;
    a->out_at += n;
    if (a->out_at == a->out.len)
        a->out.len = a->out_at = 0;
    else if (a->out_at >= out_left(a)) {
        memmove(a->out.data, a->out.data + a->out_at, out_left(a));
        a->out.len = out_left(a);
        a->out_at = 0;
    }
}

/* 1 while compress = auto has not judged the link yet and JUDGE_AHEAD_MAX wire bytes already
 * wait for answers: what is packed now waits for the judgment, or it would all go at level 1
 * (the socket buffers and a slow link's queue take a whole push of a few MB at once, so a first
 * push at 10 Mbit/s was judged slow only once nearly everything was packed). Only while a whole
 * request waits for its answer, which is sure to come: a request larger than that goes on. */
static int wait_for_judgment(const struct gs_agent *a)
{
    const struct link_judge *j = &a->link;
    if (!j->on || j->rate > 0 || !a->q_len)
        return 0;
    uint64_t oldest_end = a->q[a->q_head].plain_end;
    if (!oldest_end || oldest_end > a->taken)
        return 0;
    return (double)(a->taken - j->acked) * wire_ratio(a) > JUDGE_AHEAD_MAX;
}

/* Refills the wire from the queue once it is empty: whole frames, packed by zstd where that pays
 * (zframes.h), else the queue as it is (the buffers swap: no copy). Returns 0 or -1 (ENOMEM). */
static int refill_wire(struct gs_agent *a)
{
    if (wire_left(a) || !out_left(a))
        return 0;
    a->wire.len = a->wire_at = 0;
    const uint8_t *queued = a->out.data + a->out_at;
    if (!a->zstd && a->z && !a->hello_call.done) {
        /* Compression offered, the answer not in yet (the agent is still starting): the first
         * EARLY_PLAIN_MAX go at once (a save is not held back); after that, a batch that would
         * compress waits for the answer, while one that would not goes now, since waiting
         * could not make it smaller. Measured at 50 ms / 50 Mbit/s: sending all of it plain
         * meant 1.67 s for Python's stdlib where waiting gives 1.01 s; holding everything cost
         * 8 MB of random files 0.3 s (2.11 s against 1.82 s) for nothing. */
        if (a->early_hold)
            return 0;
        int first = a->early_plain < EARLY_PLAIN_MAX;
        size_t take = gs_zframes_whole(queued, out_left(a),
                                       first ? EARLY_PLAIN_MAX - a->early_plain : GS_ZFRAMES_TAKE);
        if (!first && take >= GS_ZFRAMES_MIN && gs_zframes_compressible(a->z, queued, take)) {
            a->early_hold = 1;
            return 0;
        }
        if (take == 0 || gs_proto_buf_reserve(&a->wire, take) < 0)
            return 0;
        memcpy(a->wire.data, queued, take);
        a->wire.len = take;
        a->early_plain += take;
        take_out(a, take);
        return 0;
    }
    if (!a->zstd) {
        a->taken += out_left(a);
        struct gs_proto_buf t = a->wire;
        a->wire = a->out;
        a->wire_at = a->out_at;
        a->out = t;
        a->out_at = 0;
        return 0;
    }
    if (wait_for_judgment(a))
        return 0;
    long used = gs_zframes_pack(a->z, GS_MSG_ZFRAMES, queued, out_left(a), &a->wire);
    if (used < 0)
        return -1;
    take_out(a, (size_t)used);
    return 0;
}

/* Tells the caller how much content has been handed over and how much of it still waits here
 * (fileops.h); frame headers and compression make the waiting part an estimate. */
static void report_progress(struct gs_agent *a)
{
    a->ops.bytes_unsent = unsent(a);
    if (a->ops.progress)
        a->ops.progress(a->ops.progress_ctx);
}

static int write_some(struct gs_agent *a, int *progress, struct gs_error *err)
{
    if (refill_wire(a) < 0)
        return gs_error_set(err, GS_E_NOMEM, "out of memory compressing requests");
    if (!wire_left(a))
        return 0;
    ssize_t n = libssh2_channel_write(a->ch, (const char *)a->wire.data + a->wire_at, wire_left(a));
    if (n == LIBSSH2_ERROR_EAGAIN)
        return 0;
    if (n < 0)
        return gs_ssh_error(a->ssh, (int)n, "writing to the agent", err);
    a->wire_at += (size_t)n;
    *progress |= n > 0;
    if (n > 0)
        report_progress(a);
    return 0;
}

/* Writes what the channel takes now, reading nothing: a caller with more to do before an answer
 * may be handled (submit_delta_put keeps the signature that the answer confirms) sends first. */
static int write_now(struct gs_agent *a, struct gs_error *err)
{
    int progress, rc = gs_exec_answered(a->ssh, a->ch, &a->exec, err);
    do {
        progress = 0;
        rc = rc < 0 ? rc : write_some(a, &progress, err);
    } while (rc >= 0 && progress && (wire_left(a) || out_left(a)));
    return rc < 0 ? rc : 0;
}

/* The agent answers HELLO at once, or after waiting GA_FENCE_WAIT_MS (10 s) for a killed writer's
 * lock and sweeping its temporaries. One that has not answered long after its shell started it
 * did not get the HELLO: a startup file that reads standard input (a `read` in ~/.bashrc) took
 * the start of the stream, and the agent waits for a frame that will never be whole. */
#define HELLO_GIVE_UP_MS 60000
static int hello_overdue(struct gs_agent *a, struct gs_error *err)
{
    if (!a->gate.passed[0])
        return 0; /* the shell has not started it: gs_ssh_wait gives up on that one */
    int64_t now = gs_clock_mono_ms();
    if (!a->started_ms)
        a->started_ms = now;
    if (now - a->started_ms < HELLO_GIVE_UP_MS)
        return 0;
    return gs_error_set(err, GS_E_REMOTE,
                        "the gpusync agent on %s started but has not answered its handshake in "
                        "%d s: " STDIN_EATEN,
                        gs_ssh_target(a->ssh), HELLO_GIVE_UP_MS / 1000);
}

/* One round of I/O: write what we can, read and dispatch what arrived. With `block`, waits for
 * the socket when nothing moved. Returns 0 or a negative code. */
static int pump(struct gs_agent *a, int block, struct gs_error *err)
{
    int progress = 0, rc = gs_exec_answered(a->ssh, a->ch, &a->exec, err);
    rc = rc < 0 ? rc : write_some(a, &progress, err);
    if (rc == 0 && !half_sent(a)) {
        /* Bounded: on a fast link a GET's data frames arrive faster than they are written out,
         * and reading until EAGAIN piled a whole file into memory (measured: 256 MB resident to
         * pull a 400 MB file). IN_READ_MAX holds at least one whole frame, so dispatch always
         * frees room, and `progress` makes the caller come back without waiting. */
        while (a->in_len < IN_READ_MAX && (rc = read_some(a, err)) > 0)
            progress = 1;
        if (rc > 0)
            rc = 0;
        if (rc == 0)
            rc = dispatch(a, err);
    }
    if (rc == 0 && a->hello_rc)
        rc = a->hello_rc;
    if (rc == 0 && a->eof && (a->q_len || a->n_sync))
        rc = agent_gone(a, err);
    if (rc == 0 && !a->hello_call.done)
        rc = hello_overdue(a, err);
    if (rc == 0 && !progress && block)
        rc = gs_ssh_wait(a->ssh, 0, err);
    return rc;
}

/* ---- requests ---- */

static uint32_t new_id(struct gs_agent *a)
{
    if (++a->next_id == 0)
        a->next_id = 1;
    return a->next_id;
}

static int push_pending(struct gs_agent *a, uint32_t id, void *ctx)
{
    if (a->q_len == a->q_cap) {
        size_t cap = a->q_cap ? a->q_cap * 2 : 256;
        struct pending *q = gs_xmalloc(cap * sizeof(*q));
        for (size_t i = 0; i < a->q_len; i++)
            q[i] = a->q[(a->q_head + i) % (a->q_cap ? a->q_cap : 1)];
        free(a->q);
        a->q = q;
        a->q_cap = cap;
        a->q_head = 0;
    }
    a->q[(a->q_head + a->q_len) % a->q_cap] = (struct pending){id, ctx, NULL, 0, 0};
    a->q_len++;
    return 0;
}

/* The request queued last, or NULL when none waits. */
static struct pending *newest_pending(struct gs_agent *a)
{
    return a->q_len ? &a->q[(a->q_head + a->q_len - 1) % a->q_cap] : NULL;
}

/* Keeps the pipeline bounded: pumps until the unsent bytes and pending replies are below limits.
 * Below WRITE_BATCH nothing is written yet: a packet per small file cost 40 bytes of SSH framing
 * each (drain writes the rest, so a lone save is not held back). */
static int make_room(struct gs_agent *a, struct gs_error *err)
{
    int rc = 0;
    while (rc == 0 && (unsent(a) > OUT_HIGH_WATER || a->q_len >= MAX_IN_FLIGHT))
        rc = pump(a, 1, err);
    return rc == 0 && unsent(a) >= WRITE_BATCH ? pump(a, 0, err) : rc;
}

static void set_expect(struct gs_proto_msg *m, const struct gs_fop_req *req)
{
    static const uint8_t kinds[] = {
        [GS_FOP_EXPECT_FORCE] = GS_EXPECT_FORCE,
        [GS_FOP_EXPECT_ABSENT] = GS_EXPECT_ABSENT,
        [GS_FOP_EXPECT_HASH] = GS_EXPECT_HASH,
        [GS_FOP_EXPECT_DIR] = GS_EXPECT_DIR,
    };
    m->expect.kind = kinds[req->expect];
    if (req->expect == GS_FOP_EXPECT_HASH)
        memcpy(m->expect.hash, req->hash, GS_PROTO_HASH_LEN);
}

/* Mode and mtime (one before 1970 as the second before it and the nanoseconds after). */
static void set_meta(struct gs_proto_msg *m, const struct gs_fop_req *req)
{
    long nsec;
    m->meta.mode = req->mode & 07777;
    m->meta.mtime_sec = gs_time_sec(req->mtime_ns, &nsec);
    m->meta.mtime_nsec = (uint32_t)nsec;
}

static int encode(struct gs_agent *a, const struct gs_proto_msg *m, struct gs_error *err)
{
    if (gs_proto_encode(&a->out, m) != 0)
        return gs_error_set(err, GS_E_PROTO, "cannot encode %s request (path too long?)",
                            gs_proto_type_name(m->type));
    return 0;
}

/* Appends one PUT_DATA frame read straight from `fd`. Returns bytes read (0 at EOF) or -1. */
static ssize_t append_data(struct gs_agent *a, uint32_t id, int fd)
{
    size_t mark = a->out.len;
    if (gs_proto_encode_header(&a->out, GS_MSG_PUT_DATA, id, GS_PROTO_CHUNK) != 0 ||
        gs_proto_buf_reserve(&a->out, GS_PROTO_CHUNK) != 0)
        return -1;
    ssize_t n;
    do
        n = read(fd, a->out.data + a->out.len, GS_PROTO_CHUNK);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        a->out.len = mark;
        return n;
    }
    a->out.len = mark;
    gs_proto_encode_header(&a->out, GS_MSG_PUT_DATA, id, (uint32_t)n);
    a->out.len += (size_t)n;
    a->ops.bytes_sent += (uint64_t)n;
    report_progress(a);
    return n;
}

/* Reports a put that could not start because its local file is gone (it changed during the sync;
 * the next sync sees the change). */
static void put_vanished(struct gs_agent *a, const struct gs_fop_req *req, int err_no)
{
    char msg[600];
    snprintf(msg, sizeof(msg), "%s: %s (changed during sync)", req->path,
             err_no == EAGAIN ? "its content is not what was planned" : strerror(err_no));
    struct gs_fop_result r = {.ok = 0, .err_no = err_no, .message = msg};
    if (a->ops.done)
        a->ops.done(a->ops.done_ctx, req->ctx, &r);
}

/* Reads all of the regular file `fd` (at most SMALL_PUT_MAX bytes) into `data`. Returns 0, or -1
 * when it is longer or unreadable. */
static int read_small(int fd, struct gs_buf *data)
{
    char chunk[8192];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof(chunk))) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || data->len + (size_t)n > SMALL_PUT_MAX)
            return -1;
        gs_buf_add(data, chunk, (size_t)n);
    }
    return 0;
}

/* The XXH3-128 of `len` bytes, in the canonical byte order the protocol carries. */
static void content_hash(const void *data, size_t len, uint8_t out[GS_PROTO_HASH_LEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data ? data : "", len));
    memcpy(out, c.digest, GS_PROTO_HASH_LEN);
}

/* Sends a small file as one PUT frame: about 50 bytes less than a stream per file, 2.5% of a
 * tree of 4 KiB files. The agent cannot check these bytes against the plan's size and hash as it
 * does at PUT_END, so the check is made here: a file changed since it was hashed is not sent (the
 * next sync sends its new content). Returns 1 when it was answered here, or 0 / a negative code. */
static int submit_small_put(struct gs_agent *a, const struct gs_fop_req *req, uint32_t id, int fd,
                            struct gs_error *err)
{
    struct gs_buf data = GS_BUF_INIT;
    uint8_t hash[GS_PROTO_HASH_LEN];
    int rc = read_small(fd, &data);
    if (rc == 0)
        content_hash(data.data, data.len, hash);
    if (rc < 0 || data.len != req->size || memcmp(hash, req->content_hash, sizeof(hash)) != 0) {
        gs_buf_release(&data);
        put_vanished(a, req, EAGAIN);
        return 1;
    }
    struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = id};
    m.path = gs_proto_cstr(req->path);
    m.data = (struct gs_proto_str){data.data ? data.data : "", (uint32_t)data.len};
    set_meta(&m, req);
    set_expect(&m, req);
    rc = push_pending(a, id, req->ctx);
    if (rc == 0)
        rc = encode(a, &m, err);
    if (rc == 0)
        a->ops.bytes_sent += data.len;
    gs_buf_release(&data);
    return rc;
}

/* ---- deltas: PUT_DELTA (proto/sync.h, DELTA) against kept signatures (remote/delta.h) ---- */

/* Larger files go whole and get no signature. Keeping one costs a second read of the file and
 * about 1.4 ms of CPU a MB (BLAKE2 and the rolling sum) on every send, on the push's path: for a
 * 200 MB file on loopback that made the agent path 1.5x OpenSSH sftp's time, against 1.0x
 * without. Files this large are mostly checkpoints and data shards, rewritten whole; the files a
 * delta is for (notebooks, CSVs, logs) are smaller. (The file is also held in memory to make a
 * delta.) */
#define DELTA_FILE_MAX (64ull << 20)

static void free_req(struct gs_fop_req *r)
{
    if (!r)
        return;
    free((char *)r->path);
    free((char *)r->local_file);
    free(r);
}

/* A put's request, owned, for sending again after its delta was refused. */
static struct gs_fop_req *copy_req(const struct gs_fop_req *req)
{
    struct gs_fop_req *r = gs_xmalloc(sizeof(*r));
    *r = *req;
    r->path = gs_xstrdup(req->path);
    r->local_file = gs_xstrdup(req->local_file);
    r->path2 = NULL;
    return r;
}

/* 1 when a file of this size gets its signature kept once sent: the agent takes deltas (or has
 * not said yet: the first sync of a tree goes before the handshake's answer). */
static int delta_keeps(const struct gs_agent *a, const struct stat *st)
{
    return a->sig_dir && (a->delta || !a->hello_call.done) && st->st_size >= GS_DELTA_MIN &&
           (uint64_t)st->st_size <= DELTA_FILE_MAX;
}

/* 1 when this put may go as a delta: the server's copy is known by its hash. Before the
 * handshake's answer the agent is taken to accept deltas (a push sends while it starts); one that
 * does not refuses them with ENOSYS, and delta_refused sends the file whole. */
static int delta_wanted(const struct gs_agent *a, const struct gs_fop_req *req,
                        const struct stat *st)
{
    return (a->delta || !a->hello_call.done) && req->expect == GS_FOP_EXPECT_HASH &&
           delta_keeps(a, st);
}

/* Sends `data` as a PUT_DELTA against the server's copy (req->hash). The request is kept to
 * be sent whole if the agent answers ESTALE (delta_refused). Returns 0 or a negative code. */
static int send_delta(struct gs_agent *a, const struct gs_fop_req *req, uint32_t id,
                      const struct gs_buf *delta, struct gs_error *err)
{
    struct gs_proto_msg m = {.type = GS_MSG_PUT_DELTA, .id = id};
    m.path = gs_proto_cstr(req->path);
    m.data = (struct gs_proto_str){delta->data, (uint32_t)delta->len};
    memcpy(m.hash, req->content_hash, sizeof(m.hash));
    set_meta(&m, req);
    set_expect(&m, req);
    int rc = push_pending(a, id, req->ctx);
    if (rc == 0)
        rc = encode(a, &m, err);
    if (rc == 0) {
        a->q[(a->q_head + a->q_len - 1) % a->q_cap].resend = copy_req(req);
        a->ops.bytes_sent += delta->len;
    }
    return rc;
}

/* The largest delta worth sending for a file of `size` bytes. */
static size_t delta_max(uint64_t size)
{
    return size / 2 < GS_PROTO_DELTA_MAX ? (size_t)(size / 2) : GS_PROTO_DELTA_MAX;
}

/* Makes the delta from basis's kept signature to data. Returns 0, or -1 when none applies. */
static int make_delta(const char *sig_dir, const uint8_t basis[16], const struct gs_buf *data,
                      struct gs_buf *delta)
{
    struct gs_buf sig = GS_BUF_INIT;
    int rc = gs_delta_sig_load(sig_dir, basis, &sig) == 0 &&
                     gs_delta_make(sig.data, sig.len, data->data, data->len, delta_max(data->len),
                                   delta, NULL) == 0
                 ? 0
                 : -1;
    gs_buf_release(&sig);
    return rc;
}

int gs_agent_prepare_delta(const char *sig_dir, const char *file, uint64_t size,
                           const uint8_t basis[16], const uint8_t content[16],
                           struct gs_agent_delta *out)
{
    memset(out, 0, sizeof(*out));
    if (size < GS_DELTA_MIN || size > DELTA_FILE_MAX || !gs_delta_sig_exists(sig_dir, basis))
        return -1;
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    int rc = fd >= 0 && gs_delta_read_file(fd, (size_t)size, content, &out->data) == 0 &&
                     make_delta(sig_dir, basis, &out->data, &out->delta) == 0
                 ? 0
                 : -1;
    if (fd >= 0)
        close(fd);
    memcpy(out->basis, basis, 16);
    memcpy(out->content, content, 16);
    if (rc < 0)
        gs_agent_delta_release(out);
    return rc;
}

void gs_agent_delta_release(struct gs_agent_delta *d)
{
    gs_buf_release(&d->data);
    gs_buf_release(&d->delta);
}

void gs_agent_deltas_free(struct gs_agent_delta *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gs_agent_delta_release(&list[i]);
    free(list);
}

void gs_agent_take_deltas(struct gs_agent *a, struct gs_agent_delta *list, size_t n)
{
    gs_agent_deltas_free(a->ready, a->n_ready);
    a->ready = list;
    a->n_ready = n;
}

/* Moves the prepared delta for req's basis and content, if there is one, into data and delta. */
static int take_ready(struct gs_agent *a, const struct gs_fop_req *req, struct gs_buf *data,
                      struct gs_buf *delta)
{
    for (size_t i = 0; i < a->n_ready; i++) {
        struct gs_agent_delta *d = &a->ready[i];
        if (memcmp(d->basis, req->hash, 16) != 0 || memcmp(d->content, req->content_hash, 16) != 0)
            continue;
        *data = d->data;
        *delta = d->delta;
        a->ready[i] = a->ready[--a->n_ready];
        return 1;
    }
    return 0;
}

/* Sends a file the server holds an older copy of as a delta against that copy's kept signature
 * (made ahead, or now). Returns 0 or a negative code when sent (or 1 when answered here: the file
 * changed), and 2 when no delta applies (no signature, or one as large as the file): then the
 * caller streams the file, whose signature this has kept already. */
static int submit_delta_put(struct gs_agent *a, const struct gs_fop_req *req, uint32_t id, int fd,
                            const struct stat *st, struct gs_error *err)
{
    struct gs_buf data = GS_BUF_INIT, delta = GS_BUF_INIT;
    int rc = 2, made = take_ready(a, req, &data, &delta);
    if (!made && gs_delta_read_file(fd, (size_t)st->st_size, req->content_hash, &data) < 0) {
        put_vanished(a, req, EAGAIN); /* it changed since it was hashed */
        rc = 1;
    } else if (made || make_delta(a->sig_dir, req->hash, &data, &delta) == 0) {
        rc = send_delta(a, req, id, &delta, err);
        if (rc == 0)
            rc = write_now(a, err); /* the save goes now; its answer is read after the below */
    }
    /* The new content's signature is made from the bytes in hand: for a delta, while it travels
     * and the server rebuilds the file (42 ms of CPU for 20 MB, which a push that waited for the
     * answer first spent after it: 8% of a one-cell notebook push at 50 ms RTT), pending until
     * the server confirms (delta_refused). No delta: the file goes whole, now. */
    if (rc == 0)
        gs_delta_keep_pending(a->sig_dir, req->content_hash, data.data, data.len);
    if (rc == 2)
        gs_delta_keep(a->sig_dir, req->content_hash, data.data, data.len);
    /* the old signature goes once the server holds the new content (delta_refused): a delta cut
     * off on its way is sent again as a delta */
    if (rc == 2 && memcmp(req->hash, req->content_hash, GS_PROTO_HASH_LEN) != 0)
        gs_delta_sig_drop(a->sig_dir, req->hash);
    gs_buf_release(&data);
    gs_buf_release(&delta);
    return rc;
}

/* A PUT_DELTA refused for want of its basis (ESTALE: the server's copy changed or went) is sent
 * again whole, with the same expectation, so the agent keeps the server's copy as a conflict
 * copy and reports it; so is one sent before the handshake's answer to an agent that takes no
 * deltas (ENOSYS). Returns 1 when `m` was such a refusal (completed later), else 0. */
static int delta_refused(struct gs_agent *a, struct pending *p, const struct gs_proto_msg *m)
{
    struct gs_fop_req *r = p->resend;
    if (!r)
        return 0;
    p->resend = NULL;
    int done = m->type == GS_MSG_DONE, same = !memcmp(r->hash, r->content_hash, GS_PROTO_HASH_LEN);
    /* the new content's signature, made while the delta travelled, stands once the server has
     * that content; the basis's then goes (unless it is the same content) */
    gs_delta_pending_end(a->sig_dir, r->content_hash, done && !same);
    if (m->type == GS_MSG_ERROR && m->err == ENOSYS && !a->delta) {
        GS_ALLOC_GROW(a->resend, a->n_resend + 1, a->resend_cap);
        a->resend[a->n_resend++] = r; /* its basis's signature stays: it is still the server's */
        return 1;
    }
    if (!done || !same) /* refused otherwise: the basis's may be wrong */
        gs_delta_sig_drop(a->sig_dir, r->hash);
    if (m->type != GS_MSG_ERROR || m->err != ESTALE) {
        free_req(r);
        return 0;
    }
    GS_ALLOC_GROW(a->resend, a->n_resend + 1, a->resend_cap);
    a->resend[a->n_resend++] = r;
    return 1;
}

static int submit_put(struct gs_agent *a, const struct gs_fop_req *req, uint32_t id,
                      struct gs_error *err);

/* Sends the first refused delta's file whole. Returns 0 or a negative code. */
static int resend_whole(struct gs_agent *a, struct gs_error *err)
{
    struct gs_fop_req *r = a->resend[0];
    memmove(a->resend, a->resend + 1, --a->n_resend * sizeof(*a->resend));
    int delta = a->delta;
    a->delta = 0; /* whole, this time */
    int rc = submit_put(a, r, new_id(a), err);
    a->delta = delta;
    free_req(r);
    return rc < 0 ? rc : 0;
}

void gs_agent_set_check_file(struct gs_agent *a, const char *path)
{
    free(a->check_file);
    a->check_file = path ? gs_xstrdup(path) : NULL;
    if (path && !a->checking && gs_check_set_load(&a->kept, path) == 0)
        gs_debug("%zu paths the last check of the server kept", a->kept.n);
}

/* Keeps what the agent kept for the next session, which the agent saves as it ends: only once a
 * check of this session was answered (else the file still says what the agent saved before). */
static void save_checked(struct gs_agent *a)
{
    if (a->check_file && a->kept.n && !a->kept.saved &&
        gs_check_set_save(&a->kept, a->check_file) < 0)
        gs_debug("cannot keep the checked paths in %s: %s", a->check_file, strerror(errno));
}

int gs_agent_set_delta_dir(struct gs_agent *a, const char *dir)
{
    free(a->sig_dir);
    a->sig_dir = dir ? gs_xstrdup(dir) : NULL;
    return 0;
}

/* Streams a file as PUT_BEGIN, PUT_DATA..., PUT_END. The END carries the hash the plan computed,
 * with VERIFY: if the file changed since it was hashed, the agent refuses to commit and the
 * target stays as it was; the next sync sends the new content. */
static int submit_put(struct gs_agent *a, const struct gs_fop_req *req, uint32_t id,
                      struct gs_error *err)
{
    /* Only a regular file is streamed: the path may have become a directory (open succeeds,
     * read fails) or a symlink since it was planned; either is a change the next sync sends. */
    int fd = open(req->local_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
        errno = EISDIR;
    }
    if (fd < 0) {
        put_vanished(a, req, errno);
        return 1; /* completed here: no reply to wait for */
    }
    if (st.st_size <= (off_t)SMALL_PUT_MAX && req->size <= SMALL_PUT_MAX) {
        int rc = submit_small_put(a, req, id, fd, err);
        close(fd);
        return rc;
    }
    int kept = 0;
    if (delta_wanted(a, req, &st)) {
        int rc = submit_delta_put(a, req, id, fd, &st, err);
        if (rc != 2 || lseek(fd, 0, SEEK_SET) != 0) {
            close(fd);
            return rc == 2 ? gs_error_errno(err, GS_E_IO, "%s: cannot rewind", req->local_file)
                           : rc;
        }
        kept = 1; /* its signature, by submit_delta_put */
    }
    struct gs_proto_msg m = {.type = GS_MSG_PUT_BEGIN, .id = id, .size = req->size};
    m.path = gs_proto_cstr(req->path);
    set_meta(&m, req);
    set_expect(&m, req);
    /* Pending before the first byte goes out: a reply cannot overtake its queue entry. */
    int rc = push_pending(a, id, req->ctx);
    newest_pending(a)->verified = 1;
    if (rc == 0)
        rc = encode(a, &m, err);
    ssize_t n = 1;
    while (rc == 0 && (n = append_data(a, id, fd)) > 0)
        rc = make_room(a, err);
    close(fd);
    /* A stream that was begun is always ended, even after a read error: the bytes then do not
     * match the hash, the agent refuses the file and answers, and requests and replies stay in
     * step (an unanswered stream would shift every later reply onto the wrong request). */
    (void)n;
    struct gs_proto_msg end = {.type = GS_MSG_PUT_END, .id = id, .flags = GS_PUTEND_VERIFY};
    memcpy(end.hash, req->content_hash, sizeof(end.hash));
    end.has_hash = 1;
    rc = rc ? rc : encode(a, &end, err);
    if (rc == 0 && !kept && delta_keeps(a, &st))
        gs_delta_keep_file(a->sig_dir, req->local_file, req->content_hash); /* next: a delta */
    return rc;
}

static int submit_simple(struct gs_agent *a, const struct gs_fop_req *req, uint32_t id,
                         struct gs_error *err)
{
    static const uint8_t types[] = {
        [GS_FOP_MKDIR] = GS_MSG_MKDIR,   [GS_FOP_DELETE] = GS_MSG_DELETE,
        [GS_FOP_RENAME] = GS_MSG_RENAME, [GS_FOP_SYMLINK] = GS_MSG_SYMLINK,
        [GS_FOP_CHMOD] = GS_MSG_CHMOD,
    };
    struct gs_proto_msg m = {.type = types[req->type], .id = id};
    m.path = gs_proto_cstr(req->path);
    if (req->path2)
        m.path2 = gs_proto_cstr(req->path2);
    m.meta.mode = req->mode & 07777;
    if (req->type == GS_FOP_CHMOD && req->stamp) { /* v10: the mtime, on the content named */
        set_meta(&m, req);
        m.has_hash = 1;
        memcpy(m.hash, req->hash, GS_PROTO_HASH_LEN);
    }
    if (req->type == GS_FOP_DELETE && req->recursive)
        m.flags = GS_DEL_RECURSIVE;
    set_expect(&m, req);
    if (req->type == GS_FOP_RENAME && req->from_expect == GS_FOP_EXPECT_HASH) {
        m.expect2.kind = GS_EXPECT_HASH;
        memcpy(m.expect2.hash, req->from_hash, GS_PROTO_HASH_LEN);
    } else if (req->type == GS_FOP_RENAME && req->from_expect == GS_FOP_EXPECT_DIR) {
        m.expect2.kind = GS_EXPECT_DIR;
    }
    return encode(a, &m, err);
}

static int agent_submit(struct gs_fileops *ops, const struct gs_fop_req *req, struct gs_error *err)
{
    struct gs_agent *a = (struct gs_agent *)ops;
    uint32_t id = new_id(a);
    int rc;
    if (req->type == GS_FOP_PUT) {
        rc = submit_put(a, req, id, err);
    } else {
        rc = push_pending(a, id, req->ctx);
        if (rc == 0)
            rc = submit_simple(a, req, id, err);
    }
    struct pending *last = newest_pending(a);
    if (last && last->id == id) /* its frames are all queued: where they end in the stream */
        last->plain_end = a->taken + out_left(a);
    return rc < 0 ? rc : make_room(a, err);
}

static int agent_drain(struct gs_fileops *ops, struct gs_error *err)
{
    struct gs_agent *a = (struct gs_agent *)ops;
    int rc = 0;
    while (rc == 0 && (a->q_len || unsent(a) || !a->hello_call.done || a->n_resend))
        rc = a->n_resend ? resend_whole(a, err) : pump(a, 1, err);
    return rc;
}

static void agent_close_ops(struct gs_fileops *ops)
{
    gs_agent_close((struct gs_agent *)ops);
}

/* ---- synchronous calls: handshake, GET, LIST, ping ---- */

static void sync_add(struct gs_agent *a, struct sync_call *c)
{
    if (a->n_sync < (int)(sizeof(a->sync) / sizeof(a->sync[0])))
        a->sync[a->n_sync++] = c;
}

static void sync_remove(struct gs_agent *a, struct sync_call *c)
{
    for (int i = 0; i < a->n_sync; i++)
        if (a->sync[i] == c) {
            a->sync[i] = a->sync[--a->n_sync];
            return;
        }
}

/* Waits until every earlier request has been answered, the handshake included, so that a
 * synchronous call's replies cannot interleave with theirs. */
static int quiesce(struct gs_agent *a, struct gs_error *err)
{
    int rc = agent_drain(&a->ops, err);
    while (rc == 0 && !a->hello_call.done)
        rc = pump(a, 1, err);
    return rc;
}

/* Sends `m` and pumps until its sync handler says done. */
static int call(struct gs_agent *a, struct gs_proto_msg *m, struct sync_call *c,
                struct gs_error *err)
{
    int rc = quiesce(a, err);
    c->id = m->id = new_id(a);
    if (rc == 0)
        rc = encode(a, m, err);
    sync_add(a, c);
    while (rc == 0 && !c->done)
        rc = pump(a, 1, err);
    sync_remove(a, c);
    return rc;
}

/* ---- probe: a STAT and a HASH per path, all pipelined (one round trip a chunk) ---- */

#define PROBE_CHUNK 1024 /* paths per round trip */

struct probe_call {
    struct sync_call call; /* first: the handler gets it back as a sync_call */
    struct gs_fop_stat *out;
    size_t n, answered;
};

/* What the server holds, as a STAT reply or a CHECK entry says; a symlink's target is hashed
 * here, as the agent hashes it. */
static void take_stat(struct gs_fop_stat *st, uint8_t kind, const struct gs_proto_meta *meta,
                      uint64_t size, struct gs_proto_str link)
{
    st->kind = (enum gs_fop_kind)kind;
    st->mode = meta->mode;
    st->size = size;
    st->mtime_ns = gs_time_ns(meta->mtime_sec, (long)meta->mtime_nsec);
    if (st->kind == GS_FOP_KIND_SYMLINK) {
        content_hash(link.p, link.len, st->hash);
        st->has_hash = 1;
    }
}

/* Path i's replies: STAT at 2i, then its HASH at 2i + 1 (an error there: a directory, or no
 * file). */
static int on_probe(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *c)
{
    (void)a;
    struct probe_call *p = (struct probe_call *)c;
    uint32_t k = m->id - c->id;
    struct gs_fop_stat *st = &p->out[k / 2];
    int is_stat = k % 2 == 0;
    if (is_stat && m->type == GS_MSG_STAT_R) {
        take_stat(st, m->kind, &m->meta, m->size, m->path2);
    } else if (is_stat) { /* a missing parent is nothing there; a refusal tells nothing */
        int gone = m->type == GS_MSG_ERROR && (m->err == ENOENT || m->err == ENOTDIR);
        st->kind = gone ? GS_FOP_KIND_NONE : GS_FOP_KIND_UNKNOWN;
    } else if (m->type == GS_MSG_HASH_R && m->has_hash) {
        st->has_hash = 1;
        memcpy(st->hash, m->hash, sizeof(st->hash));
    }
    c->done = ++p->answered == 2 * p->n;
    return 0;
}

/* Makes sure ids first .. first + span - 1 are the next ones and do not wrap. */
static uint32_t reserve_ids(struct gs_agent *a, uint32_t span)
{
    if (a->next_id > UINT32_MAX - span - 2)
        a->next_id = 0;
    return a->next_id + 1;
}

static int probe_chunk(struct gs_agent *a, const char *const *paths, size_t n,
                       struct gs_fop_stat *out, struct gs_error *err)
{
    int rc = quiesce(a, err);
    struct probe_call p = {
        .call = {.on_frame = on_probe, .span = (uint32_t)(2 * n)}, .out = out, .n = n};
    p.call.id = reserve_ids(a, p.call.span);
    for (size_t i = 0; rc == 0 && i < 2 * n; i++) {
        struct gs_proto_msg m = {.type = i % 2 ? GS_MSG_HASH : GS_MSG_STAT, .id = new_id(a)};
        m.path = gs_proto_cstr(paths[i / 2]);
        rc = encode(a, &m, err);
    }
    sync_add(a, &p.call);
    while (rc == 0 && !p.call.done)
        rc = pump(a, 1, err);
    sync_remove(a, &p.call);
    return rc;
}

static int agent_probe(struct gs_fileops *ops, const char *const *paths, size_t n,
                       struct gs_fop_stat *out, struct gs_error *err)
{
    struct gs_agent *a = (struct gs_agent *)ops;
    memset(out, 0, n * sizeof(*out));
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i += PROBE_CHUNK)
        rc = probe_chunk(a, paths + i, n - i < PROBE_CHUNK ? n - i : PROBE_CHUNK, out + i, err);
    return rc;
}

/* ---- check: what differs from the beliefs, in a frame or a few (remote/check_set.h) ---- */

struct check_call {
    struct sync_call call;
    struct gs_check_set asked; /* a copy: what the agent keeps once it has answered */
    struct gs_fop_stat *out;   /* the answer, indexed as `asked` */
    uint32_t answered;         /* frames answered (LIST_END or ERROR) */
    int refused;               /* an ERROR: the agent dropped what it kept */
    int stale;                 /* ESTALE: it saved another set than the file says; ask again */
    int malformed;
};

/* Takes the paths a LIST_ENTRIES reply lists as differing. */
static void check_entries(struct check_call *k, const struct gs_proto_msg *m)
{
    size_t pos = 0;
    struct gs_proto_entry e;
    int more;
    while ((more = gs_proto_list_next(m, &pos, &e)) == 1) {
        long i = gs_check_find(k->asked.v, k->asked.n, e.path.p, e.path.len);
        if (i < 0) { /* not asked about */
            k->malformed = 1;
            return;
        }
        k->out[i].has_hash = 0;
        take_stat(&k->out[i], e.kind, &e.meta, e.size, e.link);
    }
    k->malformed |= more < 0;
}

static int on_check(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *c)
{
    struct check_call *k = (struct check_call *)c;
    if (m->type == GS_MSG_LIST_ENTRIES) {
        check_entries(k, m);
        return 0;
    }
    if (m->type == GS_MSG_ERROR && m->err == ESTALE && a->kept.saved && !k->answered) {
        k->stale = k->refused = 1; /* asked again, from nothing (check_wait) */
    } else if (m->type == GS_MSG_ERROR && !k->refused) {
        k->refused = 1;
        gs_warn("the agent on %s could not check the server: %.*s", gs_ssh_target(a->ssh),
                (int)m->text.len, m->text.p);
    } else if (m->type != GS_MSG_LIST_END && m->type != GS_MSG_ERROR) {
        k->malformed = 1;
    }
    c->done = ++k->answered == c->span;
    return 0;
}

/* Ends the check under way, if any: what the agent keeps is known only after a clean answer. */
static void check_end(struct gs_agent *a, int clean)
{
    struct check_call *k = a->checking;
    if (!k)
        return;
    sync_remove(a, &k->call);
    gs_check_set_clear(&a->kept);
    if (clean && !k->refused && gs_check_keeps(k->asked.n))
        a->kept = k->asked;
    else
        gs_check_set_clear(&k->asked);
    free(k->out);
    free(k);
    a->checking = NULL;
}

/* Queues the frames of check `k` (remote/check_set.h) and waits for nothing. */
static int check_ask(struct gs_agent *a, struct check_call *k, struct gs_error *err)
{
    size_t n = k->asked.n;
    for (size_t i = 0; i < n; i++)
        k->out[i] = (struct gs_fop_stat){.kind = GS_FOP_KIND_UNKNOWN};
    k->answered = 0;
    k->refused = k->stale = k->call.done = 0;
    /* at most one frame per belief, and one more */
    k->call.id = reserve_ids(a, (uint32_t)(n > UINT32_MAX / 2 ? UINT32_MAX / 2 : n + 1));
    k->call.span = gs_check_encode(&a->kept, k->asked.v, n, k->call.id, &a->out);
    a->next_id = k->call.id + k->call.span - 1;
    return pump(a, 0, err); /* on its way now, whatever is submitted next */
}

/* Waits for the check under way, if any, and copies its answer to out (NULL: dropped). */
static int check_wait(struct gs_agent *a, struct gs_fop_stat *out, struct gs_error *err)
{
    struct check_call *k = a->checking;
    if (!k)
        return 0;
    int rc = 0;
    while (rc == 0 && !k->call.done)
        rc = pump(a, 1, err);
    if (rc == 0 && k->stale) { /* the agent saved another set: from nothing, then */
        gs_check_set_clear(&a->kept);
        rc = check_ask(a, k, err);
        while (rc == 0 && !k->call.done)
            rc = pump(a, 1, err);
    }
    if (rc == 0 && k->malformed)
        rc = gs_error_set(err, GS_E_PROTO, "malformed answer to a check from the agent on %s",
                          gs_ssh_target(a->ssh));
    if (rc == 0 && out)
        memcpy(out, k->out, k->asked.n * sizeof(*out));
    check_end(a, rc == 0);
    return rc;
}

static int agent_check_send(struct gs_fileops *ops, const struct gs_fop_belief *beliefs, size_t n,
                            struct gs_error *err)
{
    struct gs_agent *a = (struct gs_agent *)ops;
    int rc = check_wait(a, NULL, err); /* one at a time: an earlier one nobody waited for */
    if (rc < 0)
        return rc;
    struct check_call *k = gs_xcalloc(1, sizeof(*k));
    k->call.on_frame = on_check;
    gs_check_set_assign(&k->asked, beliefs, n);
    k->out = gs_xcalloc(n ? n : 1, sizeof(*k->out));
    a->checking = k;
    sync_add(a, &k->call);
    return check_ask(a, k, err);
}

static int agent_check_wait(struct gs_fileops *ops, struct gs_fop_stat *out, struct gs_error *err)
{
    return check_wait((struct gs_agent *)ops, out, err);
}

static int reply_error(struct gs_agent *a, const struct gs_proto_msg *m, struct gs_error *err)
{
    int code = m->err == ENOENT ? GS_E_NOTFOUND : GS_E_REMOTE;
    return gs_error_set(err, code, "%s: %.*s", gs_ssh_target(a->ssh), (int)m->text.len, m->text.p);
}

static int on_hello(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *c)
{
    c->done = 1;
    sync_remove(a, c);
    if (m->type == GS_MSG_HELLO_OK && m->magic == GS_PROTO_MAGIC) {
        size_t n = m->path.len < GS_SYNC_ID_MAX ? m->path.len : GS_SYNC_ID_MAX;
        memcpy(a->sync_id, m->path.p, n);
        a->sync_id[n] = '\0';
        a->zstd = a->z && (m->flags & GS_HELLO_ZSTD);
        a->delta = (m->flags & GS_HELLO_DELTA) != 0;
        a->resident_ran = (m->flags & GS_HELLO_RESIDENT) != 0;
        free(a->root);
        a->root = gs_xstrndup(m->path2.p, m->path2.len);
        if (m->data.len < sizeof(a->resident) && !memchr(m->data.p, '\0', m->data.len)) {
            memcpy(a->resident, m->data.p, m->data.len);
            a->resident[m->data.len] = '\0';
        }
        return 0;
    }
    return a->hello_rc =
               m->type == GS_MSG_ERROR
                   ? gs_error_set(a->hello_err, GS_E_PROTO, "agent handshake refused: %.*s",
                                  (int)m->text.len, m->text.p)
                   : gs_error_set(a->hello_err, GS_E_PROTO, "agent handshake: unexpected %s",
                                  gs_proto_type_name(m->type));
}

/* Sends HELLO without waiting for the answer: on_hello handles it whenever it arrives, so the
 * round trip overlaps whatever the caller does next (gs_agent_wait_ready collects it). */
static int handshake(struct gs_agent *a, struct gs_error *err)
{
    struct gs_proto_msg m = {.type = GS_MSG_HELLO,
                             .magic = GS_PROTO_MAGIC,
                             .version = GS_PROTO_VERSION,
                             .flags = GS_HELLO_SYNC_ID | GS_HELLO_DELTA |
                                      (a->z ? GS_HELLO_ZSTD : 0) |
                                      (a->want_resident ? GS_HELLO_RESIDENT : 0)};
    a->hello_call = (struct sync_call){.on_frame = on_hello};
    a->hello_call.id = m.id = new_id(a);
    a->hello_err = err;
    sync_add(a, &a->hello_call);
    int rc = encode(a, &m, err);
    return rc ? rc : pump(a, 0, err);
}

int gs_agent_wait_ready(struct gs_agent *a, struct gs_error *err)
{
    a->hello_err = err;
    int rc = 0;
    while (rc == 0 && !a->hello_call.done)
        rc = pump(a, 1, err);
    return rc ? rc : a->hello_rc;
}

/* Opens the channel `how` names; the exec's answer comes while the first requests go. */
static LIBSSH2_CHANNEL *open_channel(struct gs_agent *a, const struct gs_agent_how *how,
                                     struct gs_error *err)
{
    if (!how->socket)
        return gs_exec_start(a->ssh, how->command, &a->exec, err);
    a->via_socket = 1;
    a->exec.answered = 1;
    a->gate.passed[0] = a->gate.passed[1] = 1; /* no shell: the first byte is the agent's */
    return gs_exec_open_socket(a->ssh, how->socket, err);
}

/* The listener's OPEN, which names the root, goes before HELLO. */
static int send_open(struct gs_agent *a, const char *root, struct gs_error *err)
{
    struct gs_proto_msg m = {.type = GS_MSG_OPEN, .data = gs_proto_cstr(root)};
    return encode(a, &m, err);
}

int gs_agent_start(struct gs_agent **out, struct gs_ssh *ssh, const struct gs_agent_how *how,
                   struct gs_error *err)
{
    *out = NULL;
    struct gs_agent *a = gs_xcalloc(1, sizeof(*a));
    a->ssh = ssh;
    a->z = how->compress_level > 0 ? gs_zframes_new(how->compress_level) : NULL;
    a->link.on = how->compress_level > 0 && how->compress_level < SLOW_LEVEL; /* auto */
    a->want_resident = how->want_resident;
    a->ops = (struct gs_fileops){.submit = agent_submit,
                                 .drain = agent_drain,
                                 .probe = agent_probe,
                                 .check_send = agent_check_send,
                                 .check_wait = agent_check_wait,
                                 .close = agent_close_ops};
    gs_proto_buf_init(&a->out);
    gs_buf_init(&a->errtail);
    gs_exec_gate_init(&a->gate, ssh);
    a->ch = open_channel(a, how, err); /* HELLO goes without waiting */
    int rc = a->ch ? 0 : (err && err->code ? err->code : GS_E_REMOTE);
    if (rc == 0 && how->socket)
        rc = send_open(a, how->root, err);
    if (rc == 0)
        rc = handshake(a, err);
    if (rc < 0) {
        gs_agent_close(a);
        return rc;
    }
    *out = a;
    return 0;
}

int gs_agent_open(struct gs_agent **out, struct gs_ssh *ssh, const char *command,
                  int compress_level, struct gs_error *err)
{
    struct gs_agent_how how = {.command = command, .compress_level = compress_level};
    return gs_agent_start(out, ssh, &how, err);
}

int gs_agent_is_resident(const struct gs_agent *a)
{
    return a->via_socket;
}

const char *gs_agent_resident(const struct gs_agent *a)
{
    return a->resident;
}

int gs_agent_resident_ran(const struct gs_agent *a)
{
    return a->resident_ran;
}

const char *gs_agent_root(const struct gs_agent *a)
{
    return a->root ? a->root : "";
}

int gs_agent_compression(const struct gs_agent *a, unsigned long long *frames,
                         unsigned long long *wire)
{
    gs_zframes_stats(a->zstd ? a->z : NULL, frames, wire);
    return a->zstd;
}

int gs_agent_compress_level(const struct gs_agent *a)
{
    return gs_zframes_level(a->zstd ? a->z : NULL);
}

double gs_agent_link_rate(const struct gs_agent *a)
{
    return a->link.rate;
}

uint64_t gs_agent_level_raised_ahead(const struct gs_agent *a)
{
    return a->link.raised_ahead;
}

const char *gs_agent_sync_id(struct gs_agent *a)
{
    return a->sync_id;
}

struct gs_fileops *gs_agent_fileops(struct gs_agent *a)
{
    return &a->ops;
}

void gs_agent_close(struct gs_agent *a)
{
    if (!a)
        return;
    /* Every answer that matters has been read (or never will be): the agent exits on EOF, and
     * waiting for that would cost a round trip at the end of every push. */
    if (a->ch && !a->eof && !half_sent(a))
        gs_exec_abandon(a->ssh, a->ch);
    else if (a->ch && a->eof)
        libssh2_channel_free(a->ch);
    gs_buf_release(&a->exec.request);
    gs_proto_buf_release(&a->out);
    gs_proto_buf_release(&a->wire);
    gs_proto_buf_release(&a->zin);
    gs_zframes_free(a->z);
    gs_buf_release(&a->errtail);
    free(a->in);
    for (size_t i = 0; i < a->q_len; i++)
        free_req(a->q[(a->q_head + i) % a->q_cap].resend);
    for (size_t i = 0; i < a->n_resend; i++)
        free_req(a->resend[i]);
    free(a->resend);
    free(a->sig_dir);
    free(a->root);
    gs_agent_take_deltas(a, NULL, 0);
    check_end(a, 0);
    save_checked(a);
    gs_check_set_clear(&a->kept);
    free(a->check_file);
    free(a->q);
    free(a);
}

struct get_state {
    int fd;
    uint64_t got;
    gs_agent_progress_fn progress;
    void *ctx;
    struct gs_proto_meta meta;
    uint64_t size;            /* as GET_END states it */
    struct gs_agent_got said; /* changed (ERROR EAGAIN), or who held it open for writing */
    struct gs_error *err;
    int rc;
};

static int on_get(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *c)
{
    struct get_state *st = c->state;
    if (m->type == GS_MSG_GET_DATA) {
        if (st->rc == 0 && gs_write_all(st->fd, m->data.p, m->data.len) != 0)
            st->rc = gs_error_errno(st->err, GS_E_IO, "writing the downloaded file");
        st->got += m->data.len;
        if (st->progress)
            st->progress(st->ctx, st->got, 0);
        return 0;
    }
    c->done = 1;
    if (m->type == GS_MSG_GET_END) {
        st->meta = m->meta;
        st->size = m->size;
        size_t n =
            m->text.len < sizeof(st->said.writer) ? m->text.len : sizeof(st->said.writer) - 1;
        if (n) /* text.p is NULL when GET_END names no writer */
            memcpy(st->said.writer, m->text.p, n);
        st->said.writer[n] = '\0';
    } else if (m->type == GS_MSG_ERROR && st->rc == 0) {
        st->said.changed = m->err == EAGAIN;
        st->rc = reply_error(a, m, st->err);
    }
    return 0;
}

static int finish_download(int fd, const char *tmp, const char *local,
                           const struct gs_proto_meta *meta, struct gs_error *err)
{
    /* push never mirrors set-id bits; a server's must not make a local set-id program either */
    fchmod(fd, meta->mode ? meta->mode & 0777 : 0644);
    struct timespec times[2] = {{0, UTIME_OMIT}, {meta->mtime_sec, meta->mtime_nsec}};
    futimens(fd, times);
    if (close(fd) < 0)
        return gs_error_errno(err, GS_E_IO, "writing %s", tmp);
    if (rename(tmp, local) < 0)
        return gs_error_errno(err, GS_E_IO, "cannot rename %s to %s", tmp, local);
    return 0;
}

int gs_agent_get(struct gs_agent *a, const char *path, const char *local,
                 gs_agent_progress_fn progress, void *ctx, struct gs_agent_got *got,
                 struct gs_error *err)
{
    struct gs_buf tmp = GS_BUF_INIT;
    const char *slash = strrchr(local, '/');
    if (slash) /* a name beside the target that fits NAME_MAX however long the target's is */
        gs_buf_add(&tmp, local, (size_t)(slash - local) + 1);
    gs_buf_addf(&tmp, ".gpusync-tmp-%d", (int)getpid());
    struct get_state st = {.progress = progress, .ctx = ctx, .err = err};
    if (got)
        memset(got, 0, sizeof(*got));
    /* a fresh file, never through a link someone left at that name */
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    st.fd = open(tmp.data, flags, 0600);
    if (st.fd < 0 && errno == EEXIST && unlink(tmp.data) == 0) /* a killed pull's leftover */
        st.fd = open(tmp.data, flags, 0600);
    if (st.fd < 0) {
        int rc = gs_error_errno(err, GS_E_IO, "cannot create %s", tmp.data);
        gs_buf_release(&tmp);
        return rc;
    }
    struct sync_call c = {.on_frame = on_get, .state = &st};
    struct gs_proto_msg m = {.type = GS_MSG_GET};
    m.path = gs_proto_cstr(path);
    int rc = call(a, &m, &c, err);
    if (rc == 0)
        rc = st.rc;
    if (rc == 0 && st.size != st.got)
        rc = gs_error_set(err, GS_E_PROTO, "get %s: the agent sent %llu bytes and said %llu", path,
                          (unsigned long long)st.got, (unsigned long long)st.size);
    if (got)
        *got = st.said;
    if (rc == 0)
        rc = finish_download(st.fd, tmp.data, local, &st.meta, err);
    else
        close(st.fd);
    if (rc < 0)
        unlink(tmp.data);
    gs_buf_release(&tmp);
    return rc;
}

struct list_state {
    gs_agent_list_fn fn;
    void *ctx;
    struct gs_error *err;
    int rc;
};

static int list_entries(const struct gs_proto_msg *m, struct list_state *st)
{
    size_t pos = 0;
    struct gs_proto_entry e;
    int more = 0;
    while (st->rc == 0 && (more = gs_proto_list_next(m, &pos, &e)) > 0) {
        if (gs_proto_check_path(e.path.p, e.path.len, 0) != 0) {
            st->rc = gs_error_set(st->err, GS_E_PROTO,
                                  "the agent listed an unsafe path (\"%.*s\"); refused",
                                  (int)(e.path.len > 200 ? 200 : e.path.len), e.path.p);
            break;
        }
        char *path = gs_xstrndup(e.path.p, e.path.len), *link = gs_xstrndup(e.link.p, e.link.len);
        struct gs_agent_entry out = {.path = path,
                                     .kind = e.kind,
                                     .mode = e.meta.mode,
                                     .mtime_ns =
                                         gs_time_ns(e.meta.mtime_sec, (long)e.meta.mtime_nsec),
                                     .size = e.size,
                                     .has_hash = e.has_hash,
                                     .link = link};
        memcpy(out.hash, e.hash, sizeof(out.hash));
        st->rc = st->fn(st->ctx, &out);
        free(path);
        free(link);
    }
    if (more < 0 && st->rc == 0)
        st->rc = gs_error_set(st->err, GS_E_PROTO, "malformed listing from the agent");
    return 0;
}

/* Hands a path the agent left out of the listing to the callback (kind 0, `skipped` set). Its
 * length may pass the wire limit (that can be why it was skipped); its form may not. */
static int list_skipped(const struct gs_proto_msg *m, struct list_state *st)
{
    if (st->rc == 0 && gs_proto_check_path(m->path.p, m->path.len, 0) == -EPERM)
        st->rc = gs_error_set(st->err, GS_E_PROTO,
                              "the agent reported an unsafe path (\"%.*s\"); refused",
                              (int)(m->path.len > 200 ? 200 : m->path.len), m->path.p);
    if (st->rc != 0)
        return 0;
    char *path = gs_xstrndup(m->path.p, m->path.len);
    struct gs_agent_entry out = {.path = path, .skipped = m->err ? m->err : EIO, .link = ""};
    st->rc = st->fn(st->ctx, &out);
    free(path);
    return 0;
}

static int on_list(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *c)
{
    struct list_state *st = c->state;
    if (m->type == GS_MSG_LIST_ENTRIES)
        return list_entries(m, st);
    if (m->type == GS_MSG_LIST_SKIPPED)
        return list_skipped(m, st);
    c->done = 1;
    if (m->type == GS_MSG_ERROR && st->rc == 0)
        st->rc = reply_error(a, m, st->err);
    return 0;
}

int gs_agent_list(struct gs_agent *a, const char *path, int hashes, gs_agent_list_fn fn, void *ctx,
                  struct gs_error *err)
{
    struct list_state st = {.fn = fn, .ctx = ctx, .err = err};
    struct sync_call c = {.on_frame = on_list, .state = &st};
    struct gs_proto_msg m = {.type = GS_MSG_LIST, .flags = hashes ? GS_LIST_HASH : 0};
    m.path = gs_proto_cstr(path);
    int rc = call(a, &m, &c, err);
    return rc ? rc : st.rc;
}

struct hash_call {
    struct sync_call call;
    int rc;
    uint8_t hash[16];
};

static int on_hash(struct gs_agent *a, const struct gs_proto_msg *m, struct sync_call *c)
{
    struct hash_call *h = (struct hash_call *)c;
    c->done = 1;
    sync_remove(a, c);
    if (m->type == GS_MSG_HASH_R && m->has_hash)
        memcpy(h->hash, m->hash, sizeof(h->hash));
    else
        h->rc = m->type == GS_MSG_ERROR && m->err == ENOENT ? GS_E_NOTFOUND : GS_E_REMOTE;
    return 0;
}

int gs_agent_hash(struct gs_agent *a, const char *path, uint8_t hash[16], struct gs_error *err)
{
    struct hash_call h = {.call = {.on_frame = on_hash}};
    struct gs_proto_msg m = {.type = GS_MSG_HASH};
    m.path = gs_proto_cstr(path);
    int rc = call(a, &m, &h.call, err);
    if (rc == 0 && h.rc < 0)
        rc = gs_error_set(err, h.rc, "%s: cannot hash on the server", path);
    if (rc == 0)
        memcpy(hash, h.hash, 16);
    return rc;
}

/* remote/check_set.h: the client's half of CHECK (proto/sync.h): the copy of the beliefs the agent
 * keeps for a connection, and the request frames that bring the agent's up to date. No I/O:
 * agent_client.c sends the frames and reads the replies.
 *
 * A check asks about every path gpusync wrote (syncd/verify.h); between two checks of one
 * connection few of those beliefs change, so once the agent keeps them a check sends only the
 * changes, and the frames cost a few bytes instead of about 50 per path. */
#ifndef GS_REMOTE_CHECK_SET_H
#define GS_REMOTE_CHECK_SET_H

#include <stddef.h>
#include <stdint.h>

#include "proto/sync.h"
#include "remote/fileops.h"

/* What the agent keeps: beliefs in path order, strings owned. Zeroed: nothing kept. */
struct gs_check_set {
    struct gs_fop_belief *v;
    size_t n;
    int saved; /* loaded from the last session's file: the agent holds it only as saved */
};

/* Appends to `out` the CHECK frames, with ids first_id, first_id + 1, ..., that ask the agent
 * about beliefs[0..n) (in path order). When n fits an agent's kept set, they carry only what
 * differs from `kept` (the last frame examines the whole set), starting from the set the agent
 * saved when `kept` was loaded from the file that mirrors it (GS_CHECK_SAVED: an agent that has
 * another answers ESTALE, and the client asks again with an empty `kept`); otherwise every
 * belief, each frame examined by itself. Returns the number of frames (at least 1). */
uint32_t gs_check_encode(const struct gs_check_set *kept, const struct gs_fop_belief *b, size_t n,
                         uint32_t first_id, struct gs_proto_buf *out);

/* 1 when gs_check_encode makes the agent keep beliefs[0..n): then, once answered, the client
 * records them with gs_check_set_assign. */
int gs_check_keeps(size_t n);

/* Makes `kept` a copy of beliefs[0..n). */
void gs_check_set_assign(struct gs_check_set *kept, const struct gs_fop_belief *b, size_t n);

/* Forgets what the agent was thought to keep (after an error, the agent drops it too). */
void gs_check_set_clear(struct gs_check_set *kept);

/* Between sessions: the agent saves its kept set on the server when a session ends, and the
 * client keeps the same set in a file of its own (the project's .gpusync/check-kept), so that the
 * next session's check starts from it. gs_check_set_save writes `kept` there (0 or -1, errno
 * set); gs_check_set_load replaces `kept` with what the file holds and marks it `saved` (0), or
 * leaves it empty (-1: none, or unreadable); gs_check_set_digest is the digest that names the set
 * (proto/sync.h, CHECK). */
int gs_check_set_save(const struct gs_check_set *kept, const char *path);
int gs_check_set_load(struct gs_check_set *kept, const char *path);
void gs_check_set_digest(const struct gs_check_set *kept, uint8_t out[GS_PROTO_HASH_LEN]);

/* The index in beliefs[0..n) (in path order) of the path p[0..len), or -1. */
long gs_check_find(const struct gs_fop_belief *b, size_t n, const char *p, size_t len);

#endif

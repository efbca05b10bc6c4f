/* Internal interface between the parts of the agent's serve session: serve.c (session, replies,
 * dispatch, loop), serve_put.c (put, put streams, symlink), serve_ops.c (mkdir, chmod, delete,
 * rename), serve_query.c (stat, hash, get, list) and serve_check.c (check). Not part of the
 * protocol; the client never includes it. Every handler answers its request with exactly one reply
 * (or a data stream that ends in one), so the client can match replies to pipelined requests by id.
 */
#ifndef GA_SERVE_INT_H
#define GA_SERVE_INT_H

#include <stdint.h>

#include "fs.h"
#include "proto/sync.h"
#include "serve.h"

#define XXH_INLINE_ALL
#include "xxhash.h"

#define GA_SERVE_FLUSH_AT (1u << 20) /* write replies out once this many bytes are buffered */

/* An open put stream (PUT_BEGIN .. PUT_END), keyed by request id. */
struct ga_serve_stream {
    int used, failed; /* failed: replied ERROR already; later DATA/END are dropped */
    uint32_t id;
    int fd, dirfd; /* temporary file and its directory, -1 when closed */
    char *path;    /* relative path as sent, owned */
    char name[GA_FS_NAME_MAX + 1];
    char tmp[64];
    struct gs_proto_meta meta;
    struct gs_proto_expect expect;
    uint64_t size, received; /* announced in PUT_BEGIN (GS_PROTO_SIZE_UNKNOWN), and so far */
    XXH3_state_t hs;         /* hash of the bytes written so far */
};

/* Appends a reply (flushing past GA_SERVE_FLUSH_AT); out of memory ends the session. */
void ga_serve_emit(struct ga_serve *s, const struct gs_proto_msg *m);

/* Replies ERROR with a positive errno and a printf-style message. */
void ga_serve_reply_error(struct ga_serve *s, uint32_t id, int err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Replies ERROR "<op> <path>: <reason>" for a negative errno. */
void ga_serve_reply_op_error(struct ga_serve *s, uint32_t id, int err, const char *op,
                             const char *path);

/* Once the root's folder was removed (rm -rf of the project), nothing can be created under it
 * again through rootfd, and retrying cannot help: replies a session-wide ERROR (id 0) that says
 * so and ends the session (s->fatal), so the client connects again and the new session makes the
 * folder anew. Returns 1 then, 0 while the root is still there. Cheap (one fstat): called where
 * a request met ENOENT and at each CHECK. */
int ga_serve_end_if_root_gone(struct ga_serve *s);

/* The reason text for an errno of a file operation, worded for a symlink in the way (ELOOP). An
 * EPERM here is the file system's (strerror); a path refused by its form is worded by
 * ga_serve_take_path alone. */
const char *ga_serve_why(int err);

/* Replies DONE; kept (may be NULL or "") is the conflict copy's name in path's directory. */
void ga_serve_reply_done(struct ga_serve *s, uint32_t id, uint32_t flags, const char *path,
                         const char *kept);

/* Checks a wire path and returns it NUL-terminated in *out (caller frees); on failure replies
 * ERROR and returns -1. */
int ga_serve_take_path(struct ga_serve *s, const struct gs_proto_msg *m, struct gs_proto_str p,
                       int allow_empty, char **out);

/* Opens path's parent (ga_fs_open_parent); on failure replies ERROR and returns < 0. */
int ga_serve_parent(struct ga_serve *s, const struct gs_proto_msg *m, const char *op,
                    const char *path, int create, int *dirfd, char *name);

/* Moves dirfd/tmp over dirfd/name after the conflict check (new_hash: the content's hash), and
 * replies. On failure the temporary is removed and the target is untouched (or kept as a
 * conflict copy). */
void ga_serve_commit(struct ga_serve *s, uint32_t id, const char *op, const char *path, int dirfd,
                     const char *tmp, const char *name, const struct gs_proto_expect *expect,
                     const uint8_t *new_hash);

/* Finishes a temporary file: metadata, optional fsync, close. Returns 0 or a negative errno;
 * the fd is closed either way. */
int ga_serve_finish_tmp(struct ga_serve *s, int fd, const struct gs_proto_meta *meta);

/* Closes a stream's descriptors, removes its temporary file and frees the slot. */
void ga_serve_stream_free(struct ga_serve_stream *st);

/* A LIST_ENTRIES reply being filled (LIST, CHECK): frames of about 64 KiB, written out as the
 * reply buffer fills. begin and add return 0 or a negative errno; end closes the current frame. */
struct ga_entries_out {
    struct ga_serve *s;
    uint32_t id;
    size_t mark;
};
int ga_entries_begin(struct ga_entries_out *o, struct ga_serve *s, uint32_t id);
int ga_entries_add(struct ga_entries_out *o, const struct gs_proto_entry *e);
void ga_entries_end(struct ga_entries_out *o);

/* Frees the entries a session keeps for CHECK (serve_check.c). */
void ga_serve_check_release(struct ga_serve *s);

/* Saves them for the next session (GS_PROTO_CHECK_SAVED) when they changed since loaded and this
 * session is the root's writer; a failure is only said on stderr (the next check sends all). */
void ga_serve_check_save(struct ga_serve *s);

/* Request handlers: each replies for m->id. */
void ga_serve_put(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_put_begin(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_put_data(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_put_end(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_put_delta(struct ga_serve *s, const struct gs_proto_msg *m); /* serve_delta.c */
void ga_serve_symlink(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_mkdir(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_chmod(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_delete(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_rename(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_stat(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_hash(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_get(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_list(struct ga_serve *s, const struct gs_proto_msg *m);
void ga_serve_check(struct ga_serve *s, const struct gs_proto_msg *m); /* serve_check.c */

#endif

/* remote/delta.h: rdiff signatures and deltas (librsync) for PUT_DELTA (proto/sync.h, DELTA),
 * and the store of signatures the client keeps beside the index.
 *
 * After a large file reaches the server, the client keeps the signature of that content in
 * `<dir>/<hex content hash>.sig` (dir is the project's .gpusync/sigs). The next save of the file
 * is turned into a delta against it locally, with no round trip to fetch a signature: the index
 * says which content the server holds, and its hash names the signature. A signature is about 0.3%
 * of its file (4.5 KiB blocks, 8-byte strong sums for 20 MB). */
#ifndef GS_DELTA_H
#define GS_DELTA_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/error.h"

#define GS_DELTA_MIN (256u << 10) /* files below this size are sent whole: a delta saves little */

/* Computes the signature of data[0..len) into sig (appended). Returns 0, or GS_E_NOMEM/GS_E_ERR
 * with sig left as it was. */
int gs_delta_signature(const void *data, size_t len, struct gs_buf *sig, struct gs_error *err);

/* Computes the delta that turns the content whose signature is sig[0..sig_len) into
 * data[0..len), appended to delta. Returns 0; 1 when the delta would pass `max` bytes (then
 * sending the file whole is as good); GS_E_PROTO for a malformed signature. On any result but 0,
 * delta is left as it was. */
int gs_delta_make(const void *sig, size_t sig_len, const void *data, size_t len, size_t max,
                  struct gs_buf *delta, struct gs_error *err);

/* Loads the stored signature of the content with this hash into sig (appended). Returns 0, or
 * GS_E_NOTFOUND when none is stored (or it cannot be read). */
int gs_delta_sig_load(const char *dir, const uint8_t hash[16], struct gs_buf *sig);

/* 1 when a signature of the content with this hash is stored. */
int gs_delta_sig_exists(const char *dir, const uint8_t hash[16]);

/* Stores a signature for the content with this hash, atomically (temporary file, rename), making
 * dir if needed. Returns 0 or GS_E_IO; a failure only costs a later delta. */
int gs_delta_sig_save(const char *dir, const uint8_t hash[16], const void *sig, size_t len,
                      struct gs_error *err);

/* Removes the stored signature for this hash, if any. */
void gs_delta_sig_drop(const char *dir, const uint8_t hash[16]);

/* The signature of content sent as a delta, kept while the delta travels (computing it costs
 * 42 ms for 20 MB, which would otherwise follow the answer) but not used before the server has
 * confirmed that content: gs_delta_pending_end makes it the stored signature (`confirmed`) or
 * drops it. gs_delta_sweep_pending drops what a session that ended early left pending (call it
 * when no other session of the project can be sending: under its sync lock). Failures are
 * silent: they only cost a later delta. */
void gs_delta_keep_pending(const char *dir, const uint8_t hash[16], const void *data, size_t len);
void gs_delta_pending_end(const char *dir, const uint8_t hash[16], int confirmed);
void gs_delta_sweep_pending(const char *dir);

/* Reads all of `fd` (about `size` bytes) into data (appended) and checks that it is the content
 * with this hash. Returns 0, or -1 when it is unreadable or is other content (it changed since
 * it was hashed). */
int gs_delta_read_file(int fd, size_t size, const uint8_t hash[16], struct gs_buf *data);

/* Computes and stores the signature of data[0..len), whose hash is `hash`; failures are silent:
 * they only cost a later delta. */
void gs_delta_keep(const char *dir, const uint8_t hash[16], const void *data, size_t len);

/* As gs_delta_keep for the file at `path`, if it still is the content with this hash. */
void gs_delta_keep_file(const char *dir, const char *path, const uint8_t hash[16]);

#endif

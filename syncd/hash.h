/* syncd/hash.h: content hashes of files, XXH3-128, the same function and byte order
 * (XXH128_canonical_t, big-endian high half first) the agent uses, so a hash computed here can be
 * compared with one the agent reports. Files are read in fixed-size chunks: never whole in memory.
 */
#ifndef GS_SYNCD_HASH_H
#define GS_SYNCD_HASH_H

#include <stddef.h>
#include <stdint.h>

#include <sys/stat.h>

#include "common/error.h"

#define GS_HASH_LEN     16
#define GS_HASH_HEX_LEN (2 * GS_HASH_LEN)

/* A content hash in canonical byte order. All-zero bytes are a valid hash value, not "no hash". */
struct gs_hash {
    unsigned char b[GS_HASH_LEN];
};

/* Told about every GS_HASH_CHECK_BYTES read while a file is hashed, with the bytes of it read so
 * far: nonzero abandons the hash with GS_E_INTERRUPTED, so a watch daemon told to stop does not
 * wait for a large file's hash. */
typedef int (*gs_hash_check_fn)(void *ctx, uint64_t bytes);
struct gs_hash_check {
    gs_hash_check_fn fn;
    void *ctx;
};
#define GS_HASH_CHECK_BYTES (4 << 20)

/* Hashes the regular file `path`, read through a descriptor opened with O_NOFOLLOW (a symlink is
 * refused, never followed). Returns 0 and fills `out`; GS_E_NOTFOUND when the file is gone (so a
 * caller can treat a vanished file as deleted), GS_E_IO on any other failure; `out` is then
 * unspecified. */
int gs_hash_file(const char *path, struct gs_hash *out, struct gs_error *err);

/* As gs_hash_file, for `name` relative to the directory descriptor `dirfd` (openat semantics).
 * `after`, when not NULL, gets the file's stat taken once it was read: a size or mtime other than
 * a scan's says the file changed after that scan. `check` may be NULL; when it stops the hash,
 * the result is GS_E_INTERRUPTED. */
int gs_hash_file_at(int dirfd, const char *name, struct gs_hash *out, struct stat *after,
                    const struct gs_hash_check *check, struct gs_error *err);

/* Hashes everything readable from `fd` up to end of file, from its current offset. `what` names
 * the file in messages. Returns 0 or GS_E_IO; the descriptor stays open and its offset is at the
 * end on success. */
int gs_hash_fd(int fd, const char *what, struct gs_hash *out, struct gs_error *err);

/* Hashes `len` bytes of memory. Never fails. */
void gs_hash_bytes(const void *data, size_t len, struct gs_hash *out);

/* Hashes a symlink's target string (NULL: ""), as the agent hashes a symlink. */
void gs_hash_link(const char *link, struct gs_hash *out);

/* Writes the 32 lowercase hex digits of `h` and a NUL into `hex`. Returns `hex`. */
char *gs_hash_hex(const struct gs_hash *h, char hex[GS_HASH_HEX_LEN + 1]);

/* Parses 32 hex digits (either case, nothing after them). Returns 0, or GS_E_USAGE. */
int gs_hash_from_hex(const char *hex, struct gs_hash *out, struct gs_error *err);

/* 1 when equal, 0 otherwise. */
int gs_hash_equal(const struct gs_hash *a, const struct gs_hash *b);

#endif

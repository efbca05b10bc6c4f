/* syncd/hash.c: streaming XXH3-128 of files (see hash.h). */
#include "syncd/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/wrapper.h"

/* Large enough that read(2) overhead is invisible next to disk speed, small enough for the stack
 * of any thread. */
#define HASH_CHUNK (128 * 1024)

static void hash_store(XXH128_hash_t h, struct gs_hash *out)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out->b, c.digest, GS_HASH_LEN);
}

static int hash_fd_checked(int fd, const char *what, struct gs_hash *out,
                           const struct gs_hash_check *check, struct gs_error *err)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return gs_error_set(err, GS_E_NOMEM, "%s: no memory to hash", what);
    XXH3_128bits_reset(st);
    char *chunk = gs_xmalloc(HASH_CHUNK);
    int rc = 0;
    uint64_t read_bytes = 0, unchecked = 0; /* unchecked: read since check was last told */
    while (rc == 0) {
        ssize_t n = read(fd, chunk, HASH_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = gs_error_errno(err, GS_E_IO, "%s: cannot read", what);
        else if (n == 0)
            break;
        else
            XXH3_128bits_update(st, chunk, (size_t)n);
        read_bytes += n > 0 ? (uint64_t)n : 0;
        unchecked += n > 0 ? (uint64_t)n : 0;
        if (rc == 0 && check && unchecked >= GS_HASH_CHECK_BYTES) {
            unchecked = 0;
            if (check->fn(check->ctx, read_bytes))
                rc = gs_error_set(err, GS_E_INTERRUPTED, "%s: hashing stopped", what);
        }
    }
    if (rc == 0)
        hash_store(XXH3_128bits_digest(st), out);
    free(chunk);
    XXH3_freeState(st);
    return rc;
}

int gs_hash_fd(int fd, const char *what, struct gs_hash *out, struct gs_error *err)
{
    return hash_fd_checked(fd, what, out, NULL, err);
}

int gs_hash_file_at(int dirfd, const char *name, struct gs_hash *out, struct stat *after,
                    const struct gs_hash_check *check, struct gs_error *err)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        return gs_error_errno(err, GS_E_NOTFOUND, "%s: cannot open to hash", name);
    if (fd < 0)
        return gs_error_errno(err, GS_E_IO, "%s: cannot open to hash", name);
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0)
        rc = gs_error_errno(err, GS_E_IO, "%s: cannot stat to hash", name);
    else if (!S_ISREG(st.st_mode))
        rc = gs_error_set(err, GS_E_IO, "%s: not a regular file, cannot hash it", name);
    else
        rc = hash_fd_checked(fd, name, out, check, err);
    if (rc == 0 && after && fstat(fd, after) < 0)
        rc = gs_error_errno(err, GS_E_IO, "%s: cannot stat after hashing", name);
    close(fd);
    return rc;
}

int gs_hash_file(const char *path, struct gs_hash *out, struct gs_error *err)
{
    return gs_hash_file_at(AT_FDCWD, path, out, NULL, NULL, err);
}

void gs_hash_bytes(const void *data, size_t len, struct gs_hash *out)
{
    hash_store(XXH3_128bits(data, len), out);
}

void gs_hash_link(const char *link, struct gs_hash *out)
{
    gs_hash_bytes(link ? link : "", link ? strlen(link) : 0, out);
}

char *gs_hash_hex(const struct gs_hash *h, char hex[GS_HASH_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < GS_HASH_LEN; i++) {
        hex[2 * i] = digits[h->b[i] >> 4];
        hex[2 * i + 1] = digits[h->b[i] & 15];
    }
    hex[GS_HASH_HEX_LEN] = '\0';
    return hex;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int gs_hash_from_hex(const char *hex, struct gs_hash *out, struct gs_error *err)
{
    for (int i = 0; i < GS_HASH_LEN; i++) {
        int hi = hex_digit(hex[2 * i]);
        int lo = hi < 0 ? -1 : hex_digit(hex[2 * i + 1]);
        if (lo < 0)
            return gs_error_set(err, GS_E_USAGE, "'%s' is not a 32-digit hex hash", hex);
        out->b[i] = (unsigned char)(hi << 4 | lo);
    }
    if (hex[GS_HASH_HEX_LEN] != '\0')
        return gs_error_set(err, GS_E_USAGE, "'%s' is not a 32-digit hex hash", hex);
    return 0;
}

int gs_hash_equal(const struct gs_hash *a, const struct gs_hash *b)
{
    return memcmp(a->b, b->b, GS_HASH_LEN) == 0;
}

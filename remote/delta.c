/* remote/delta.c: rdiff signatures and deltas over memory with librsync's streaming jobs, and the
 * signature store (delta.h). */
#include "remote/delta.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librsync.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/path.h"

#define JOB_OUT (64u << 10) /* output bytes per step of a job */

/* Runs a job over all of in[0..len), appending its output to out (NULL: the job keeps what it
 * makes, as loadsig does). Stops with 1 once out would pass max. Returns 0, 1, or librsync's
 * failure as a negative rs_result. */
static int run_job(rs_job_t *job, const void *in, size_t len, struct gs_buf *out, size_t max)
{
    char chunk[JOB_OUT];
    rs_buffers_t b = {.next_in = (char *)in, .avail_in = len, .eof_in = 1};
    rs_result r;
    do {
        b.next_out = chunk, b.avail_out = sizeof(chunk);
        r = rs_job_iter(job, &b);
        size_t n = sizeof(chunk) - b.avail_out;
        if (out && out->len + n > max)
            return 1;
        if (out && n)
            gs_buf_add(out, chunk, n);
    } while (r == RS_BLOCKED);
    return r == RS_DONE ? 0 : -(int)r;
}

int gs_delta_signature(const void *data, size_t len, struct gs_buf *sig, struct gs_error *err)
{
    rs_magic_number magic = RS_BLAKE2_SIG_MAGIC;
    size_t block_len = 0, strong_len = 8; /* 64 bits: a false block match needs 2^64 tries */
    if (rs_sig_args((rs_long_t)len, &magic, &block_len, &strong_len) != RS_DONE)
        return gs_error_set(err, GS_E_ERR, "cannot size a signature for %zu bytes", len);
    rs_job_t *job = rs_sig_begin(block_len, strong_len, magic);
    size_t mark = sig->len;
    int rc = job ? run_job(job, data, len, sig, SIZE_MAX) : -RS_MEM_ERROR;
    if (job)
        rs_job_free(job);
    if (rc != 0) {
        sig->len = mark;
        return gs_error_set(err, GS_E_NOMEM, "cannot compute a signature: %s",
                            rs_strerror((rs_result)-rc));
    }
    return 0;
}

/* Loads and indexes a signature. Returns it, or NULL when malformed. */
static rs_signature_t *load_signature(const void *sig, size_t sig_len)
{
    rs_signature_t *sums = NULL;
    rs_job_t *job = rs_loadsig_begin(&sums);
    int rc = run_job(job, sig, sig_len, NULL, 0);
    rs_job_free(job);
    if (rc == 0 && sums && rs_build_hash_table(sums) == RS_DONE)
        return sums;
    if (sums)
        rs_free_sumset(sums);
    return NULL;
}

int gs_delta_make(const void *sig, size_t sig_len, const void *data, size_t len, size_t max,
                  struct gs_buf *delta, struct gs_error *err)
{
    rs_signature_t *sums = load_signature(sig, sig_len);
    if (!sums)
        return gs_error_set(err, GS_E_PROTO, "a stored signature is malformed");
    rs_job_t *job = rs_delta_begin(sums);
    size_t mark = delta->len;
    int rc = run_job(job, data, len, delta, mark + max);
    rs_job_free(job);
    rs_free_sumset(sums);
    if (rc != 0)
        delta->len = mark;
    if (rc < 0)
        return gs_error_set(err, GS_E_ERR, "cannot compute a delta: %s",
                            rs_strerror((rs_result)-rc));
    return rc;
}

/* ---- the store ---- */

#define SIG_SUFFIX     ".sig"
#define PENDING_SUFFIX ".sig.pending" /* the signature of content sent, not yet confirmed */

static void sig_path(const char *dir, const uint8_t hash[16], const char *suffix, char *out,
                     size_t n)
{
    int at = snprintf(out, n, "%s/", dir);
    for (int i = 0; i < 16 && at > 0 && (size_t)at + 3 < n; i++)
        at += snprintf(out + at, n - (size_t)at, "%02x", hash[i]);
    snprintf(out + at, n - (size_t)at, "%s", suffix);
}

int gs_delta_sig_exists(const char *dir, const uint8_t hash[16])
{
    char path[4200];
    sig_path(dir, hash, SIG_SUFFIX, path, sizeof(path));
    return access(path, R_OK) == 0;
}

int gs_delta_sig_load(const char *dir, const uint8_t hash[16], struct gs_buf *sig)
{
    char path[4200];
    sig_path(dir, hash, SIG_SUFFIX, path, sizeof(path));
    size_t mark = sig->len;
    if (gs_path_read_file(path, sig) == 0)
        return 0;
    sig->len = mark;
    return GS_E_NOTFOUND;
}

/* Stores a signature under the name for this hash and suffix, atomically. */
static int save_as(const char *dir, const uint8_t hash[16], const char *suffix, const void *sig,
                   size_t len, struct gs_error *err)
{
    char path[4200], tmp[4300];
    sig_path(dir, hash, suffix, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid());
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return gs_error_errno(err, GS_E_IO, "%s: cannot make the signature store", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return gs_error_errno(err, GS_E_IO, "%s: cannot write a signature", tmp);
    ssize_t n = write(fd, sig, len);
    int ok = n == (ssize_t)len && close(fd) == 0;
    if (n != (ssize_t)len)
        close(fd);
    if (!ok || rename(tmp, path) < 0) {
        int saved = errno;
        unlink(tmp);
        errno = saved;
        return gs_error_errno(err, GS_E_IO, "%s: cannot write a signature", path);
    }
    return 0;
}

int gs_delta_sig_save(const char *dir, const uint8_t hash[16], const void *sig, size_t len,
                      struct gs_error *err)
{
    return save_as(dir, hash, SIG_SUFFIX, sig, len, err);
}

void gs_delta_sig_drop(const char *dir, const uint8_t hash[16])
{
    char path[4200];
    sig_path(dir, hash, SIG_SUFFIX, path, sizeof(path));
    unlink(path);
}

/* Computes the signature of data[0..len) and stores it under this hash and suffix; silent. */
static void keep_as(const char *dir, const uint8_t hash[16], const char *suffix, const void *data,
                    size_t len)
{
    struct gs_buf sig = GS_BUF_INIT;
    if (gs_delta_signature(data, len, &sig, NULL) == 0)
        save_as(dir, hash, suffix, sig.data, sig.len, NULL);
    gs_buf_release(&sig);
}

void gs_delta_keep_pending(const char *dir, const uint8_t hash[16], const void *data, size_t len)
{
    keep_as(dir, hash, PENDING_SUFFIX, data, len);
}

void gs_delta_pending_end(const char *dir, const uint8_t hash[16], int confirmed)
{
    char pending[4200], path[4200];
    sig_path(dir, hash, PENDING_SUFFIX, pending, sizeof(pending));
    sig_path(dir, hash, SIG_SUFFIX, path, sizeof(path));
    if (!confirmed || rename(pending, path) < 0)
        unlink(pending);
}

/* 1 when `name` ends with `suffix`. */
static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0;
}

void gs_delta_sweep_pending(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (ends_with(e->d_name, PENDING_SUFFIX) || strstr(e->d_name, ".tmp-"))
            unlinkat(dirfd(d), e->d_name, 0);
    if (d)
        closedir(d);
}

int gs_delta_read_file(int fd, size_t size, const uint8_t hash[16], struct gs_buf *data)
{
    gs_buf_grow(data, size + 1);
    ssize_t n;
    do {
        n = read(fd, data->data + data->len, data->cap - data->len - 1);
        if (n > 0)
            data->len += (size_t)n;
        if (n > 0 && data->len + 1 == data->cap)
            gs_buf_grow(data, data->cap);
    } while (n > 0 || (n < 0 && errno == EINTR));
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data->data, data->len));
    return n < 0 || memcmp(c.digest, hash, 16) != 0 ? -1 : 0;
}

void gs_delta_keep(const char *dir, const uint8_t hash[16], const void *data, size_t len)
{
    keep_as(dir, hash, SIG_SUFFIX, data, len);
}

void gs_delta_keep_file(const char *dir, const char *path, const uint8_t hash[16])
{
    struct gs_buf data = GS_BUF_INIT;
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0 && fstat(fd, &st) == 0 &&
        gs_delta_read_file(fd, (size_t)st.st_size, hash, &data) == 0)
        gs_delta_keep(dir, hash, data.data, data.len);
    if (fd >= 0)
        close(fd);
    gs_buf_release(&data);
}

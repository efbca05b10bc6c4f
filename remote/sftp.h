/* remote/sftp.h: the SFTP operations gpusync needs, over a small pool of SFTP channels.
 *
 * SFTP is the fallback transport (design decision 4): it works against any SSH server, but each
 * operation of a kind is serialised per channel, so the pool (at most 8: OpenSSH allows 10 sessions
 * per connection) lets callers keep several in flight. Large writes are passed to libssh2 in 4 MiB
 * calls, which lets 1.10 pipeline its 30 KB packets and approach OpenSSH's own speed. */
#ifndef GS_SFTP_H
#define GS_SFTP_H

#include <libssh2.h>
#include <libssh2_sftp.h>
#include <stdint.h>

#include "common/error.h"
#include "remote/ssh.h"

#define GS_SFTP_POOL_MAX 8

struct gs_sftp_pool {
    struct gs_ssh *ssh;
    LIBSSH2_SFTP *chan[GS_SFTP_POOL_MAX];
    int n;
};

struct gs_sftp_stat {
    int exists;
    int is_dir;
    int is_link;
    uint32_t mode; /* permission bits */
    uint64_t size;
    int64_t mtime; /* seconds */
};

/* Opens `n` SFTP channels (1..GS_SFTP_POOL_MAX). Returns 0 or a negative code; on failure the
 * pool holds nothing. Release with gs_sftp_pool_release before freeing the ssh session. */
int gs_sftp_pool_open(struct gs_sftp_pool *pool, struct gs_ssh *ssh, int n, struct gs_error *err);
void gs_sftp_pool_release(struct gs_sftp_pool *pool);

/* lstat. A missing path is not an error: st->exists is 0. */
int gs_sftp_stat(struct gs_sftp_pool *pool, const char *path, struct gs_sftp_stat *st,
                 struct gs_error *err);
/* mkdir -p: creates every missing component of `path`. */
int gs_sftp_mkdir_p(struct gs_sftp_pool *pool, const char *path, int mode, struct gs_error *err);
int gs_sftp_unlink(struct gs_sftp_pool *pool, const char *path, struct gs_error *err);
/* Renames; when `replace`, an existing target is removed first (OpenSSH's SFTP rename refuses to
 * overwrite and libssh2 1.10 has no posix-rename): that replace is NOT atomic. */
int gs_sftp_rename(struct gs_sftp_pool *pool, const char *from, const char *to, int replace,
                   struct gs_error *err);

/* Progress callback for transfers: bytes done so far of `total`. */
typedef void (*gs_sftp_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Uploads local file `local` to `remote` with `mode`. Writes to "<remote>.gpusync-tmp-<pid>" and
 * renames into place at the end, so a failure leaves the old file untouched. */
int gs_sftp_upload(struct gs_sftp_pool *pool, const char *local, const char *remote, int mode,
                   gs_sftp_progress_fn progress, void *ctx, struct gs_error *err);
/* Downloads `remote` to `local` (through a temporary file and rename). */
int gs_sftp_download(struct gs_sftp_pool *pool, const char *remote, const char *local,
                     gs_sftp_progress_fn progress, void *ctx, struct gs_error *err);

#endif

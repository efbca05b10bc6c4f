/* remote/sftp.c: SFTP operations over a channel pool (see sftp.h). */
#include "remote/sftp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "remote/exec.h"

#define SFTP_CHUNK (4u << 20)

static const char *fx_text(unsigned long fx)
{
    switch (fx) {
    case LIBSSH2_FX_NO_SUCH_FILE:
        return "no such file or directory";
    case LIBSSH2_FX_PERMISSION_DENIED:
        return "permission denied";
    case LIBSSH2_FX_NO_SPACE_ON_FILESYSTEM:
        return "no space left on the server's disk";
    case LIBSSH2_FX_QUOTA_EXCEEDED:
        return "disk quota exceeded on the server";
    case LIBSSH2_FX_FILE_ALREADY_EXISTS:
        return "file already exists";
    case LIBSSH2_FX_NOT_A_DIRECTORY:
        return "not a directory";
    default:
        return "failure";
    }
}

/* Reports a failed SFTP call on `path`: an SFTP status when the server sent one, else the
 * session's error (a dropped connection). */
static int sftp_fail(struct gs_sftp_pool *pool, LIBSSH2_SFTP *sftp, int rc, const char *what,
                     const char *path, struct gs_error *err)
{
    if (GS_IS_ERROR(rc))
        return rc;
    if (rc == LIBSSH2_ERROR_SFTP_PROTOCOL) {
        unsigned long fx = libssh2_sftp_last_error(sftp);
        return gs_error_set(err, GS_E_REMOTE, "%s %s on %s: %s", what, path,
                            gs_ssh_target(pool->ssh), fx_text(fx));
    }
    char label[600];
    snprintf(label, sizeof(label), "%s %s", what, path);
    return gs_ssh_error(pool->ssh, rc, label, err);
}

/* SFTP runs as a program started through the user's login shell, so an rc file that prints
 * (a banner, nvidia-smi) corrupts its first packet and the start times out. No SFTP client can
 * work through that (OpenSSH's sftp, scp and rsync fail too), so say what is wrong: a command
 * started behind remote/exec.h's marker shows whether the shell prints. */
static int sftp_start_failed(struct gs_ssh *ssh, struct gs_error *err)
{
    struct gs_buf out = GS_BUF_INIT;
    struct gs_error probe = {0};
    int rc = gs_exec_capture(ssh, "true", &out, NULL, &probe);
    gs_buf_release(&out);
    const char *noise = gs_ssh_shell_noise(ssh);
    if (rc < 0 || !*noise)
        return gs_ssh_error(ssh, libssh2_session_last_errno(gs_ssh_session(ssh)),
                            "starting SFTP (is the sftp subsystem enabled?)", err);
    char first[81];
    size_t n = strcspn(noise, "\r\n");
    snprintf(first, sizeof(first), "%.*s", (int)(n < 80 ? n : 80), noise);
    return gs_error_set(err, GS_E_PROTO,
                        "SFTP cannot start on %s: the server's shell prints text before any "
                        "command runs (\"%s\"), which breaks the SFTP protocol (OpenSSH's sftp, "
                        "scp and rsync fail there too). Make that rc file quiet when the shell is "
                        "not interactive (`gpusync doctor` names it), or use transport = agent, "
                        "which is not affected",
                        gs_ssh_target(ssh), first);
}

int gs_sftp_pool_open(struct gs_sftp_pool *pool, struct gs_ssh *ssh, int n, struct gs_error *err)
{
    memset(pool, 0, sizeof(*pool));
    pool->ssh = ssh;
    if (n < 1 || n > GS_SFTP_POOL_MAX)
        n = n < 1 ? 1 : GS_SFTP_POOL_MAX;
    for (int i = 0; i < n; i++) {
        int rc;
        LIBSSH2_SFTP *sftp;
        GS_SSH_RETRY_PTR(ssh, sftp, libssh2_sftp_init(gs_ssh_session(ssh)), 0, err, rc);
        if (!sftp) {
            if (rc == 0)
                sftp_start_failed(ssh, err);
            gs_sftp_pool_release(pool);
            return err && err->code ? err->code : GS_E_REMOTE;
        }
        pool->chan[pool->n++] = sftp;
    }
    return 0;
}

void gs_sftp_pool_release(struct gs_sftp_pool *pool)
{
    for (int i = 0; i < pool->n; i++) {
        int rc;
        GS_SSH_RETRY(pool->ssh, rc, libssh2_sftp_shutdown(pool->chan[i]), 0, NULL);
        (void)rc;
    }
    pool->n = 0;
}

int gs_sftp_stat(struct gs_sftp_pool *pool, const char *path, struct gs_sftp_stat *st,
                 struct gs_error *err)
{
    LIBSSH2_SFTP *sftp = pool->chan[0];
    LIBSSH2_SFTP_ATTRIBUTES attrs;
    int rc;
    memset(st, 0, sizeof(*st));
    GS_SSH_RETRY(
        pool->ssh, rc,
        libssh2_sftp_stat_ex(sftp, path, (unsigned)strlen(path), LIBSSH2_SFTP_LSTAT, &attrs), 0,
        err);
    if (rc == LIBSSH2_ERROR_SFTP_PROTOCOL &&
        libssh2_sftp_last_error(sftp) == LIBSSH2_FX_NO_SUCH_FILE)
        return 0;
    if (rc < 0)
        return sftp_fail(pool, sftp, rc, "stat", path, err);
    st->exists = 1;
    st->is_dir = LIBSSH2_SFTP_S_ISDIR(attrs.permissions);
    st->is_link = LIBSSH2_SFTP_S_ISLNK(attrs.permissions);
    st->mode = attrs.permissions & 07777;
    st->size = attrs.filesize;
    st->mtime = (int64_t)attrs.mtime;
    return 0;
}

static int mkdir_one(struct gs_sftp_pool *pool, const char *path, int mode, struct gs_error *err)
{
    struct gs_sftp_stat st;
    int rc = gs_sftp_stat(pool, path, &st, err);
    if (rc < 0 || (st.exists && st.is_dir))
        return rc;
    if (st.exists)
        return gs_error_set(err, GS_E_REMOTE, "%s on %s exists and is not a directory", path,
                            gs_ssh_target(pool->ssh));
    GS_SSH_RETRY(pool->ssh, rc,
                 libssh2_sftp_mkdir_ex(pool->chan[0], path, (unsigned)strlen(path), mode), 0, err);
    return rc < 0 ? sftp_fail(pool, pool->chan[0], rc, "mkdir", path, err) : 0;
}

int gs_sftp_mkdir_p(struct gs_sftp_pool *pool, const char *path, int mode, struct gs_error *err)
{
    if (!path[0])
        return 0;
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b, path);
    int rc = 0;
    for (char *p = b.data + 1; rc == 0; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        rc = mkdir_one(pool, b.data, mode, err);
        *p = saved;
        if (saved == '\0')
            break;
    }
    gs_buf_release(&b);
    return rc;
}

int gs_sftp_unlink(struct gs_sftp_pool *pool, const char *path, struct gs_error *err)
{
    int rc;
    GS_SSH_RETRY(pool->ssh, rc, libssh2_sftp_unlink_ex(pool->chan[0], path, (unsigned)strlen(path)),
                 0, err);
    return rc < 0 ? sftp_fail(pool, pool->chan[0], rc, "delete", path, err) : 0;
}

static int rename_once(struct gs_sftp_pool *pool, const char *from, const char *to,
                       struct gs_error *err)
{
    int rc;
    long flags =
        LIBSSH2_SFTP_RENAME_OVERWRITE | LIBSSH2_SFTP_RENAME_ATOMIC | LIBSSH2_SFTP_RENAME_NATIVE;
    GS_SSH_RETRY(pool->ssh, rc,
                 libssh2_sftp_rename_ex(pool->chan[0], from, (unsigned)strlen(from), to,
                                        (unsigned)strlen(to), flags),
                 0, err);
    return rc;
}

int gs_sftp_rename(struct gs_sftp_pool *pool, const char *from, const char *to, int replace,
                   struct gs_error *err)
{
    int rc = rename_once(pool, from, to, err);
    if (rc == LIBSSH2_ERROR_SFTP_PROTOCOL && replace) {
        struct gs_sftp_stat st;
        if (gs_sftp_stat(pool, to, &st, err) == 0 && st.exists && !st.is_dir) {
            rc = gs_sftp_unlink(pool, to, err);
            if (rc == 0)
                rc = rename_once(pool, from, to, err);
        }
    }
    return rc < 0 ? sftp_fail(pool, pool->chan[0], rc, "rename", from, err) : 0;
}

/* A temporary name beside `path` for an atomic-ish replace: "<dir>/.gpusync-tmp-<pid>-<n>", which
 * fits NAME_MAX whatever the length of the final name. */
static void temp_name(const char *path, struct gs_buf *out)
{
    static unsigned counter;
    const char *slash = strrchr(path, '/');
    if (slash)
        gs_buf_add(out, path, (size_t)(slash - path) + 1);
    gs_buf_addf(out, ".gpusync-tmp-%d-%u", (int)getpid(), counter++);
}

/* Writes all of buf[0..len) to the handle, 4 MiB per call so libssh2 pipelines its packets. */
static int write_full(struct gs_sftp_pool *pool, LIBSSH2_SFTP_HANDLE *h, const char *buf,
                      size_t len, const char *path, struct gs_error *err)
{
    while (len) {
        ssize_t n;
        GS_SSH_RETRY(pool->ssh, n, libssh2_sftp_write(h, buf, len), 0, err);
        if (n < 0)
            return sftp_fail(pool, pool->chan[0], (int)n, "write", path, err);
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static LIBSSH2_SFTP_HANDLE *open_remote(struct gs_sftp_pool *pool, const char *path, long flags,
                                        int mode, struct gs_error *err)
{
    LIBSSH2_SFTP_HANDLE *h;
    int rc;
    GS_SSH_RETRY_PTR(pool->ssh, h,
                     libssh2_sftp_open_ex(pool->chan[0], path, (unsigned)strlen(path), flags, mode,
                                          LIBSSH2_SFTP_OPENFILE),
                     0, err, rc);
    if (!h && rc == 0)
        sftp_fail(pool, pool->chan[0], libssh2_session_last_errno(gs_ssh_session(pool->ssh)),
                  "open", path, err);
    return h;
}

static void close_remote(struct gs_sftp_pool *pool, LIBSSH2_SFTP_HANDLE *h)
{
    int rc;
    GS_SSH_RETRY(pool->ssh, rc, libssh2_sftp_close_handle(h), 0, NULL);
    (void)rc;
}

static int copy_up(struct gs_sftp_pool *pool, int fd, LIBSSH2_SFTP_HANDLE *h, const char *path,
                   uint64_t total, gs_sftp_progress_fn progress, void *ctx, struct gs_error *err)
{
    char *buf = malloc(SFTP_CHUNK);
    if (!buf)
        return gs_error_set(err, GS_E_NOMEM, "out of memory");
    uint64_t done = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, SFTP_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = gs_error_errno(err, GS_E_IO, "reading local file for %s", path);
        if (n <= 0 || (rc = write_full(pool, h, buf, (size_t)n, path, err)) < 0)
            break;
        done += (uint64_t)n;
        if (progress)
            progress(ctx, done, total);
    }
    free(buf);
    return rc;
}

int gs_sftp_upload(struct gs_sftp_pool *pool, const char *local, const char *remote, int mode,
                   gs_sftp_progress_fn progress, void *ctx, struct gs_error *err)
{
    int fd = open(local, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gs_error_errno(err, GS_E_IO, "cannot open %s", local);
    struct stat st;
    fstat(fd, &st);
    struct gs_buf tmp = GS_BUF_INIT;
    temp_name(remote, &tmp);
    int rc = GS_E_REMOTE;
    LIBSSH2_SFTP_HANDLE *h = open_remote(
        pool, tmp.data, LIBSSH2_FXF_WRITE | LIBSSH2_FXF_CREAT | LIBSSH2_FXF_TRUNC, mode, err);
    if (h) {
        rc = copy_up(pool, fd, h, remote, (uint64_t)st.st_size, progress, ctx, err);
        close_remote(pool, h);
        if (rc == 0)
            rc = gs_sftp_rename(pool, tmp.data, remote, 1, err);
        if (rc < 0 && rc != GS_E_DISCONNECTED)
            gs_sftp_unlink(pool, tmp.data, NULL);
    } else if (err && err->code) {
        rc = err->code;
    }
    close(fd);
    gs_buf_release(&tmp);
    return rc;
}

static int copy_down(struct gs_sftp_pool *pool, LIBSSH2_SFTP_HANDLE *h, int fd, const char *path,
                     uint64_t total, gs_sftp_progress_fn progress, void *ctx, struct gs_error *err)
{
    char *buf = malloc(SFTP_CHUNK);
    if (!buf)
        return gs_error_set(err, GS_E_NOMEM, "out of memory");
    uint64_t done = 0;
    int rc = 0;
    for (;;) {
        ssize_t n;
        GS_SSH_RETRY(pool->ssh, n, libssh2_sftp_read(h, buf, SFTP_CHUNK), 0, err);
        if (n < 0)
            rc = sftp_fail(pool, pool->chan[0], (int)n, "read", path, err);
        if (n <= 0)
            break;
        for (ssize_t off = 0; off < n && rc == 0;) {
            ssize_t w = write(fd, buf + off, (size_t)(n - off));
            if (w < 0 && errno != EINTR)
                rc = gs_error_errno(err, GS_E_IO, "writing local copy of %s", path);
            off += w > 0 ? w : 0;
        }
        if (rc < 0)
            break;
        done += (uint64_t)n;
        if (progress)
            progress(ctx, done, total);
    }
    free(buf);
    return rc;
}

int gs_sftp_download(struct gs_sftp_pool *pool, const char *remote, const char *local,
                     gs_sftp_progress_fn progress, void *ctx, struct gs_error *err)
{
    struct gs_sftp_stat st;
    int rc = gs_sftp_stat(pool, remote, &st, err);
    if (rc < 0)
        return rc;
    if (!st.exists)
        return gs_error_set(err, GS_E_NOTFOUND, "%s: no such file on %s", remote,
                            gs_ssh_target(pool->ssh));
    LIBSSH2_SFTP_HANDLE *h = open_remote(pool, remote, LIBSSH2_FXF_READ, 0, err);
    if (!h)
        return err && err->code ? err->code : GS_E_REMOTE;
    struct gs_buf tmp = GS_BUF_INIT;
    temp_name(local, &tmp);
    int fd = open(tmp.data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, st.mode ? st.mode : 0644);
    if (fd < 0) {
        rc = gs_error_errno(err, GS_E_IO, "cannot create %s", tmp.data);
    } else {
        rc = copy_down(pool, h, fd, remote, st.size, progress, ctx, err);
        if (close(fd) < 0 && rc == 0)
            rc = gs_error_errno(err, GS_E_IO, "cannot write %s", tmp.data);
        if (rc == 0 && rename(tmp.data, local) < 0)
            rc = gs_error_errno(err, GS_E_IO, "cannot rename %s to %s", tmp.data, local);
        if (rc < 0)
            unlink(tmp.data);
    }
    close_remote(pool, h);
    gs_buf_release(&tmp);
    return rc;
}

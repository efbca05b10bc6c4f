/* remote/sftp_ops.c: struct gs_fileops over SFTP (see sftp_ops.h): small PUTs overlapped across
 * a pool of channels (the window section), everything else one operation at a time.
 *
 * Every step returns 0 on success, a positive errno when the operation failed on the server (the
 * message is in o->msg and the op completes with !ok), or a negative GS_E_* code when the
 * transport failed (the message is in err, and the transport is dead from then on). */
#include "remote/sftp_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/clock.h"
#include "common/buf.h"
#include "common/wrapper.h"
#include "remote/sftp.h"

#define OPS_CHUNK      (4u << 20) /* bytes per libssh2_sftp_write: lets 1.10 pipeline */
#define OPS_NAME_MAX   255
#define OPS_TREE_DEPTH 256
#define OPS_CONFLICT   ".gpusync-conflict-"
#define OPS_LOW_SPACE  (64u << 10)
#define OPS_SMALL      (256u << 10) /* PUTs up to this size overlap across channels */

/* Where an overlapped PUT stands: one SFTP request per step (see the window section). */
enum put_step { PS_STAT, PS_OPEN, PS_WRITE, PS_META, PS_CLOSE, PS_UNLINK, PS_RENAME, PS_DONE };

/* One overlapped PUT, on its own channel, from submission until its completion is delivered. */
struct put_entry {
    struct gs_fop_req req; /* path and local_file point at `path` and `local` */
    char *path, *local;
    struct gs_buf full, tmp;
    char *data; /* the whole file, read at submission */
    size_t len, off;
    int chan;
    enum put_step step;
    LIBSSH2_SFTP_ATTRIBUTES attrs;
    LIBSSH2_SFTP_HANDLE *h;
    int target_exists;
    int err_no;       /* the result, once step is PS_DONE */
    char *msg, *kept; /* malloc'd copies, or NULL */
};

/* A set of relative directory paths (open addressing, XXH3 of the bytes). */
struct dir_set {
    char **slot;
    size_t cap, n; /* cap is 0 or a power of two */
};

struct sftp_ops {
    struct gs_fileops base; /* first: the engine holds a pointer to it */
    struct gs_sftp_pool pool;
    struct gs_ssh *ssh;
    LIBSSH2_SFTP *sftp;
    char *root;
    int openssh; /* send SSH_FXP_SYMLINK's paths in OpenSSH's order */
    int dead;    /* a transport failure happened: refuse everything */
    struct gs_error dead_err;
    unsigned long fx; /* SFTP status of the last failed call */
    char *iobuf;      /* OPS_CHUNK bytes */
    struct gs_buf msg, kept;
    /* the window of overlapped PUTs, oldest first: win[(win_head + i) % GS_SFTP_POOL_MAX] */
    struct put_entry *win[GS_SFTP_POOL_MAX];
    int win_head, win_n;
    int single;          /* GPUSYNC_SFTP_SEQUENTIAL: no window (for comparisons) */
    struct dir_set dirs; /* directories below the root seen to be real (see check_parents) */
};

/* What lstat says about a remote path. */
struct rstat {
    int exists, is_dir, is_link, is_reg;
    uint32_t mode;
    uint64_t size;
};

/* ---- errors -------------------------------------------------------------------------------- */

static int fx_errno(unsigned long fx)
{
    switch (fx) {
    case LIBSSH2_FX_NO_SUCH_FILE:
    case LIBSSH2_FX_NO_SUCH_PATH:
        return ENOENT;
    case LIBSSH2_FX_PERMISSION_DENIED:
        return EACCES;
    case LIBSSH2_FX_BAD_MESSAGE:
    case LIBSSH2_FX_INVALID_FILENAME:
    case LIBSSH2_FX_UNKNOWN_PRINCIPAL:
        return EINVAL;
    case LIBSSH2_FX_OP_UNSUPPORTED:
        return ENOTSUP;
    case LIBSSH2_FX_INVALID_HANDLE:
        return EBADF;
    case LIBSSH2_FX_FILE_ALREADY_EXISTS:
        return EEXIST;
    case LIBSSH2_FX_WRITE_PROTECT:
        return EROFS;
    case LIBSSH2_FX_NO_MEDIA:
        return ENODEV;
    case LIBSSH2_FX_NO_SPACE_ON_FILESYSTEM:
        return ENOSPC;
    case LIBSSH2_FX_QUOTA_EXCEEDED:
        return EDQUOT;
    case LIBSSH2_FX_LOCK_CONFLICT:
        return ENOLCK;
    case LIBSSH2_FX_DIR_NOT_EMPTY:
        return ENOTEMPTY;
    case LIBSSH2_FX_NOT_A_DIRECTORY:
        return ENOTDIR;
    case LIBSSH2_FX_LINK_LOOP:
        return ELOOP;
    default: /* SSH_FX_FAILURE: OpenSSH's answer for most errnos */
        return EIO;
    }
}

/* Records an operation failure: errno `e` and a message "what PATH: why". Returns `e`. */
static int op_fail(struct sftp_ops *o, int e, const char *what, const char *path)
{
    gs_buf_reset(&o->msg);
    gs_buf_addf(&o->msg, "%s %s on %s: %s", what, path, gs_ssh_target(o->ssh), strerror(e));
    return e;
}

/* Classifies the result of a libssh2 call: 0, a positive errno for an SFTP status, or a negative
 * transport code. */
static int check(struct sftp_ops *o, int rc, const char *what, const char *path,
                 struct gs_error *err)
{
    if (rc >= 0)
        return 0;
    if (GS_IS_ERROR(rc))
        return rc;
    if (rc == LIBSSH2_ERROR_SFTP_PROTOCOL) {
        o->fx = libssh2_sftp_last_error(o->sftp);
        return op_fail(o, fx_errno(o->fx), what, path);
    }
    o->fx = 0;
    char label[600];
    snprintf(label, sizeof(label), "%s %s", what, path);
    return gs_ssh_error(o->ssh, rc, label, err);
}

/* As check, for a libssh2 call that returned NULL; `rc` is GS_SSH_RETRY_PTR's code. */
static int check_ptr(struct sftp_ops *o, int rc, const char *what, const char *path,
                     struct gs_error *err)
{
    if (rc == 0)
        rc = libssh2_session_last_errno(gs_ssh_session(o->ssh));
    return check(o, rc < 0 ? rc : LIBSSH2_ERROR_SFTP_PROTOCOL, what, path, err);
}

/* After a bare SSH_FX_FAILURE while writing: tells a full disk from other trouble. */
static int space_errno(struct sftp_ops *o, int e, const char *dir, uint64_t need)
{
    LIBSSH2_SFTP_STATVFS vfs;
    int rc;
    if (e != EIO)
        return e;
    GS_SSH_RETRY(o->ssh, rc, libssh2_sftp_statvfs(o->sftp, dir, strlen(dir), &vfs), 0, NULL);
    if (rc < 0)
        return e;
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail < OPS_LOW_SPACE || avail < need || (vfs.f_files && vfs.f_favail == 0))
        return ENOSPC;
    return e;
}

/* ---- path helpers -------------------------------------------------------------------------- */

/* root/rel into `b`; returns b->data. */
static const char *full_path(struct sftp_ops *o, struct gs_buf *b, const char *rel)
{
    gs_buf_reset(b);
    gs_buf_addf(b, "%s/%s", o->root, rel);
    return b->data;
}

/* Length of the directory part of `p` (up to, not including, the last slash); 0 if none. */
static size_t dir_len(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? (size_t)(s - p) : 0;
}

/* The permission bits a request may set on the server: never setuid or setgid (the agent's
 * rule, agent/fs.h: where sftp-server runs as root they would make root set-id programs
 * of pushed files). */
static uint32_t safe_mode(uint32_t mode)
{
    return mode & 07777 & ~06000u;
}

/* ---- the set of directories seen to be real ------------------------------------------------ */

static size_t set_slot(const struct dir_set *s, const char *p, size_t len)
{
    size_t i = (size_t)XXH3_64bits(p, len) & (s->cap - 1);
    while (s->slot[i] && (strlen(s->slot[i]) != len || memcmp(s->slot[i], p, len) != 0))
        i = (i + 1) & (s->cap - 1);
    return i;
}

static int set_has(const struct dir_set *s, const char *p, size_t len)
{
    return s->cap && s->slot[set_slot(s, p, len)] != NULL;
}

static void set_clear(struct dir_set *s)
{
    for (size_t i = 0; i < s->cap; i++)
        free(s->slot[i]);
    free(s->slot);
    memset(s, 0, sizeof(*s));
}

/* Adds p[0..len) (nothing if present); doubles the table at half full. */
static void set_add(struct dir_set *s, const char *p, size_t len)
{
    if (2 * (s->n + 1) > s->cap) {
        struct dir_set big = {gs_xcalloc(s->cap ? 2 * s->cap : 64, sizeof(char *)),
                              s->cap ? 2 * s->cap : 64, s->n};
        for (size_t i = 0; i < s->cap; i++)
            if (s->slot[i])
                big.slot[set_slot(&big, s->slot[i], strlen(s->slot[i]))] = s->slot[i];
        free(s->slot);
        *s = big;
    }
    size_t i = set_slot(s, p, len);
    if (s->slot[i])
        return;
    s->slot[i] = gs_xstrndup(p, len);
    s->n++;
}

/* ---- single SFTP calls --------------------------------------------------------------------- */

static int r_lstat(struct sftp_ops *o, const char *full, const char *rel, struct rstat *st,
                   struct gs_error *err)
{
    LIBSSH2_SFTP_ATTRIBUTES a;
    int rc;
    memset(st, 0, sizeof(*st));
    GS_SSH_RETRY(
        o->ssh, rc,
        libssh2_sftp_stat_ex(o->sftp, full, (unsigned)strlen(full), LIBSSH2_SFTP_LSTAT, &a), 0,
        err);
    rc = check(o, rc, "stat", rel, err);
    if (rc == ENOENT)
        return 0;
    if (rc != 0)
        return rc;
    st->exists = 1;
    st->is_dir = LIBSSH2_SFTP_S_ISDIR(a.permissions);
    st->is_link = LIBSSH2_SFTP_S_ISLNK(a.permissions);
    st->is_reg = LIBSSH2_SFTP_S_ISREG(a.permissions);
    st->mode = a.permissions & 07777;
    st->size = a.filesize;
    return 0;
}

static int r_setstat(struct sftp_ops *o, const char *full, const char *rel,
                     LIBSSH2_SFTP_ATTRIBUTES *a, struct gs_error *err)
{
    int rc;
    GS_SSH_RETRY(
        o->ssh, rc,
        libssh2_sftp_stat_ex(o->sftp, full, (unsigned)strlen(full), LIBSSH2_SFTP_SETSTAT, a), 0,
        err);
    return check(o, rc, "chmod", rel, err);
}

static int r_chmod(struct sftp_ops *o, const char *full, const char *rel, uint32_t mode,
                   struct gs_error *err)
{
    LIBSSH2_SFTP_ATTRIBUTES a;
    memset(&a, 0, sizeof(a));
    a.flags = LIBSSH2_SFTP_ATTR_PERMISSIONS;
    a.permissions = safe_mode(mode);
    return r_setstat(o, full, rel, &a, err);
}

static int r_unlink(struct sftp_ops *o, const char *full, const char *rel, struct gs_error *err)
{
    int rc;
    GS_SSH_RETRY(o->ssh, rc, libssh2_sftp_unlink_ex(o->sftp, full, (unsigned)strlen(full)), 0, err);
    return check(o, rc, "delete", rel, err);
}

/* rmdir; a bare failure on a directory is taken to mean it is not empty. */
static int r_rmdir(struct sftp_ops *o, const char *full, const char *rel, struct gs_error *err)
{
    int rc;
    GS_SSH_RETRY(o->ssh, rc, libssh2_sftp_rmdir_ex(o->sftp, full, (unsigned)strlen(full)), 0, err);
    rc = check(o, rc, "delete", rel, err);
    return rc == EIO ? op_fail(o, ENOTEMPTY, "delete", rel) : rc;
}

/* Renames without replacing: OpenSSH refuses when `to` exists. */
static int r_rename(struct sftp_ops *o, const char *from, const char *to, const char *rel,
                    struct gs_error *err)
{
    int rc;
    long flags = LIBSSH2_SFTP_RENAME_ATOMIC | LIBSSH2_SFTP_RENAME_NATIVE;
    GS_SSH_RETRY(o->ssh, rc,
                 libssh2_sftp_rename_ex(o->sftp, from, (unsigned)strlen(from), to,
                                        (unsigned)strlen(to), flags),
                 0, err);
    return check(o, rc, "rename", rel, err);
}

static int r_mkdir(struct sftp_ops *o, const char *full, const char *rel, uint32_t mode,
                   struct gs_error *err)
{
    int rc;
    GS_SSH_RETRY(o->ssh, rc,
                 libssh2_sftp_mkdir_ex(o->sftp, full, (unsigned)strlen(full), (long)mode), 0, err);
    return check(o, rc, "mkdir", rel, err);
}

/* Reads link `full` into buf (NUL-terminated). */
static int r_readlink(struct sftp_ops *o, const char *full, const char *rel, char *buf,
                      unsigned len, struct gs_error *err)
{
    int rc;
    GS_SSH_RETRY(o->ssh, rc,
                 libssh2_sftp_symlink_ex(o->sftp, full, (unsigned)strlen(full), buf, len - 1,
                                         LIBSSH2_SFTP_READLINK),
                 0, err);
    if (rc >= 0)
        buf[rc] = '\0';
    return check(o, rc, "readlink", rel, err);
}

/* Creates link `full` holding `target`. The draft orders SSH_FXP_SYMLINK's paths (link, target);
 * OpenSSH reads them as (target, link), and libssh2 sends its (path, target) arguments in order. */
static int r_symlink(struct sftp_ops *o, const char *full, const char *target, const char *rel,
                     struct gs_error *err)
{
    const char *first = o->openssh ? target : full;
    const char *second = o->openssh ? full : target;
    int rc;
    GS_SSH_RETRY(o->ssh, rc,
                 libssh2_sftp_symlink_ex(o->sftp, first, (unsigned)strlen(first), (char *)second,
                                         (unsigned)strlen(second), LIBSSH2_SFTP_SYMLINK),
                 0, err);
    rc = check(o, rc, "symlink", rel, err);
    if (rc <= 0)
        return rc;
    /* libssh2 1.10 misreads SSH_FXP_SYMLINK's status (measured against OpenSSH 9.2: a created
     * link reported as fx 6, ENOENT as fx 4): the link itself is the answer. */
    int e = rc;
    char have[4096];
    rc = r_readlink(o, full, rel, have, sizeof(have), err);
    if (rc < 0)
        return rc;
    return rc == 0 && strcmp(have, target) == 0 ? 0 : op_fail(o, e, "symlink", rel);
}

/* ---- composite steps ----------------------------------------------------------------------- */

/* mkdir -p `full`: tries the leaf first (one round trip when the parent exists) and climbs only
 * when the server says a component is missing. New directories get `mode` (umask applies).
 * gs_path_mkdir_p (common/path.c) walks down from the top instead: a local mkdir is cheap, a
 * round trip is not, so the two share no walk. */
static int mkdir_p(struct sftp_ops *o, const char *full, const char *rel, uint32_t mode,
                   struct gs_error *err)
{
    int rc = r_mkdir(o, full, rel, mode, err);
    if (rc == ENOENT && dir_len(full) > 0) {
        char *parent = gs_xstrndup(full, dir_len(full));
        rc = mkdir_p(o, parent, rel, 0755, err);
        free(parent);
        if (rc == 0)
            rc = r_mkdir(o, full, rel, mode, err);
    }
    if (rc > 0 && rc != ENOENT) { /* OpenSSH says only "failure" when it exists */
        struct rstat st;
        int r = r_lstat(o, full, rel, &st, err);
        if (r != 0)
            return r;
        if (st.exists)
            return st.is_dir ? 0 : op_fail(o, ENOTDIR, "mkdir", rel);
    }
    return rc;
}

/* Makes the parent directory of `full` exist. */
static int mkdir_parent(struct sftp_ops *o, const char *full, const char *rel, struct gs_error *err)
{
    size_t n = dir_len(full);
    if (n == 0)
        return op_fail(o, ENOENT, "mkdir", rel);
    char *parent = gs_xstrndup(full, n);
    int rc = mkdir_p(o, parent, rel, 0755, err);
    free(parent);
    return rc;
}

/* Records why a path is refused: `dir`, a parent of it, is a symlink or no directory. */
static int refuse_parent(struct sftp_ops *o, int e, const char *what, const char *rel, size_t dir)
{
    gs_buf_reset(&o->msg);
    gs_buf_addf(&o->msg, "%s %s on %s: %.*s is %s on the server; gpusync never writes through it",
                what, rel, gs_ssh_target(o->ssh), (int)dir, rel,
                e == ELOOP ? "a symlink" : "not a directory");
    return e;
}

/* 1 when every parent directory of rel is in the set of directories seen to be real. */
static int parents_known(const struct sftp_ops *o, const char *rel)
{
    for (const char *s = strchr(rel, '/'); s; s = strchr(s + 1, '/'))
        if (!set_has(&o->dirs, rel, (size_t)(s - rel)))
            return 0;
    return 1;
}

/* Refuses rel when one of its parent directories below the root is a symlink or not a
 * directory, as the agent does: the SFTP server resolves paths itself and follows every link, so
 * a directory replaced by a link on the server would let a write or delete land outside the
 * root. Each directory is looked at (lstat) once; those seen to be real are remembered until
 * the next drain, or until a delete, rename or conflict copy may have changed them. The first
 * missing directory ends the check: mkdir creates real ones below it. Returns 0, ELOOP or
 * ENOTDIR (message in o->msg), another positive errno, or a negative transport code. */
static int check_parents(struct sftp_ops *o, const char *what, const char *rel,
                         struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT;
    int rc = 0;
    for (const char *s = strchr(rel, '/'); s && rc == 0; s = strchr(s + 1, '/')) {
        size_t n = (size_t)(s - rel);
        struct rstat st;
        if (set_has(&o->dirs, rel, n))
            continue;
        gs_buf_reset(&full);
        gs_buf_addf(&full, "%s/%.*s", o->root, (int)n, rel);
        if ((rc = r_lstat(o, full.data, rel, &st, err)) != 0 || !st.exists)
            break;
        if (st.is_link || !st.is_dir)
            rc = refuse_parent(o, st.is_link ? ELOOP : ENOTDIR, what, rel, n);
        else
            set_add(&o->dirs, rel, n);
    }
    gs_buf_release(&full);
    return rc;
}

/* One entry of a remote directory listing. */
struct dirent_list {
    char **names;
    int *is_dir;
    size_t n, cap;
};

static void list_free(struct dirent_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    free(l->is_dir);
    memset(l, 0, sizeof(*l));
}

static void list_add(struct dirent_list *l, const char *name, size_t len, int is_dir)
{
    if (l->n == l->cap) { /* two arrays, one capacity */
        l->cap = GS_ALLOC_NR(l->cap);
        l->names = gs_xreallocarray(l->names, l->cap, sizeof(*l->names));
        l->is_dir = gs_xreallocarray(l->is_dir, l->cap, sizeof(*l->is_dir));
    }
    l->names[l->n] = gs_xstrndup(name, len);
    l->is_dir[l->n++] = is_dir;
}

/* Reads directory `full` (without . and ..) into `l`. */
static int list_dir(struct sftp_ops *o, const char *full, const char *rel, struct dirent_list *l,
                    struct gs_error *err)
{
    LIBSSH2_SFTP_HANDLE *h;
    int rc;
    GS_SSH_RETRY_PTR(
        o->ssh, h,
        libssh2_sftp_open_ex(o->sftp, full, (unsigned)strlen(full), 0, 0, LIBSSH2_SFTP_OPENDIR), 0,
        err, rc);
    if (!h)
        return check_ptr(o, rc, "delete", rel, err);
    char name[1024];
    LIBSSH2_SFTP_ATTRIBUTES a;
    for (;;) {
        GS_SSH_RETRY(o->ssh, rc, libssh2_sftp_readdir_ex(h, name, sizeof(name), NULL, 0, &a), 0,
                     err);
        if (rc <= 0)
            break;
        if ((rc == 1 && name[0] == '.') || (rc == 2 && name[0] == '.' && name[1] == '.'))
            continue;
        /* OpenSSH's readdir attributes come from lstat, so a symlink is never taken for a dir */
        int is_dir =
            (a.flags & LIBSSH2_SFTP_ATTR_PERMISSIONS) && LIBSSH2_SFTP_S_ISDIR(a.permissions);
        list_add(l, name, (size_t)rc, is_dir);
    }
    rc = check(o, rc, "delete", rel, err);
    if (rc >= 0) { /* after a transport failure, closing would only wait for the link again */
        int r;
        GS_SSH_RETRY(o->ssh, r, libssh2_sftp_close_handle(h), 0, NULL);
    }
    return rc;
}

/* rm -rf `full`. */
static int remove_tree(struct sftp_ops *o, const char *full, const char *rel, int depth,
                       struct gs_error *err)
{
    if (depth > OPS_TREE_DEPTH)
        return op_fail(o, ELOOP, "delete", rel);
    struct dirent_list l = {0};
    struct gs_buf child = GS_BUF_INIT;
    int rc = list_dir(o, full, rel, &l, err);
    for (size_t i = 0; i < l.n && rc == 0; i++) {
        gs_buf_reset(&child);
        gs_buf_addf(&child, "%s/%s", full, l.names[i]);
        rc = l.is_dir[i] ? remove_tree(o, child.data, rel, depth + 1, err)
                         : r_unlink(o, child.data, rel, err);
    }
    if (rc == 0)
        rc = r_rmdir(o, full, rel, err);
    gs_buf_release(&child);
    list_free(&l);
    return rc;
}

/* Removes whatever is at `full`: file, symlink, directory (a tree when `recursive`). */
static int remove_entry(struct sftp_ops *o, const char *full, const char *rel,
                        const struct rstat *st, int recursive, struct gs_error *err)
{
    if (!st->is_dir)
        return r_unlink(o, full, rel, err);
    return recursive ? remove_tree(o, full, rel, 0, err) : r_rmdir(o, full, rel, err);
}

/* Renames `full` to a free NAME.gpusync-conflict-STAMP[-N] beside it and stores the copy's path
 * relative to the root in o->kept. */
static int keep_conflict(struct sftp_ops *o, const char *full, const char *rel,
                         struct gs_error *err)
{
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm))
        return op_fail(o, EINVAL, "keeping a conflict copy of", rel);
    const char *base = full + dir_len(full) + (strchr(full, '/') ? 1 : 0);
    /* Shorten NAME rather than exceed NAME_MAX with the tag, stamp and "-NNN". */
    int keep = OPS_NAME_MAX - (int)(strlen(OPS_CONFLICT) + strlen(stamp) + 4);
    struct gs_buf to = GS_BUF_INIT;
    int rc = EEXIST;
    for (int n = 0; n < 1000 && rc == EEXIST; n++) {
        struct rstat st;
        gs_buf_reset(&to);
        gs_buf_add(&to, full, (size_t)(base - full));
        gs_buf_addf(&to, "%.*s%s%s", keep, base, OPS_CONFLICT, stamp);
        if (n > 0)
            gs_buf_addf(&to, "-%d", n);
        rc = r_lstat(o, to.data, rel, &st, err);
        if (rc == 0)
            rc = st.exists ? EEXIST : r_rename(o, full, to.data, rel, err);
    }
    if (rc == 0) {
        set_clear(&o->dirs); /* what was moved aside may have been a directory */
        gs_buf_reset(&o->kept);
        gs_buf_add(&o->kept, rel, (size_t)(strrchr(rel, '/') ? dir_len(rel) + 1 : 0));
        gs_buf_adds(&o->kept, to.data + (base - full));
    } else if (rc == EEXIST) {
        op_fail(o, EEXIST, "keeping a conflict copy of", rel);
    }
    gs_buf_release(&to);
    return rc;
}

/* Whether what `st` shows at the path contradicts req->expect (see sftp_ops.h for the limits). */
static int conflicts(const struct gs_fop_req *req, const struct rstat *st)
{
    if (!st->exists || req->expect == GS_FOP_EXPECT_FORCE)
        return 0;
    if (req->expect == GS_FOP_EXPECT_DIR)
        return !st->is_dir;
    if (req->expect == GS_FOP_EXPECT_HASH)
        return !st->is_reg && !st->is_link;
    if (req->type == GS_FOP_PUT)
        return !st->is_reg || st->size != req->size;
    return 1; /* a symlink already right was handled as a no-op before */
}

/* Stores the XXH3-128 of what the server holds at `full` (a regular file: its bytes, read back;
 * a symlink: its target, as push.c hashes a symlink's expectation) in `out`, canonical bytes as
 * the index keeps them. Returns 0, a positive errno, or a negative transport code. */
static int r_hash(struct sftp_ops *o, const char *full, const char *rel, const struct rstat *st,
                  uint8_t out[16], struct gs_error *err)
{
    XXH3_state_t *xs = XXH3_createState();
    XXH3_128bits_reset(xs);
    LIBSSH2_SFTP_HANDLE *h = NULL;
    int rc = 0;
    if (st->is_link) {
        char target[4096] = "";
        if ((rc = r_readlink(o, full, rel, target, sizeof(target), err)) == 0)
            XXH3_128bits_update(xs, target, strlen(target));
    } else {
        GS_SSH_RETRY_PTR(o->ssh, h,
                         libssh2_sftp_open_ex(o->sftp, full, (unsigned)strlen(full),
                                              LIBSSH2_FXF_READ, 0, LIBSSH2_SFTP_OPENFILE),
                         0, err, rc);
        rc = h ? 0 : check_ptr(o, rc, "reading", rel, err);
    }
    for (ssize_t n = 1; h && rc == 0 && n > 0;) {
        GS_SSH_RETRY(o->ssh, n, libssh2_sftp_read(h, o->iobuf, OPS_CHUNK), 0, err);
        if (n > 0)
            XXH3_128bits_update(xs, o->iobuf, (size_t)n);
        rc = n < 0 ? check(o, (int)n, "reading", rel, err) : 0;
    }
    if (h && rc >= 0) {
        int rc_close;
        GS_SSH_RETRY(o->ssh, rc_close, libssh2_sftp_close_handle(h), 0, err);
        rc = rc ? rc : check(o, rc_close, "reading", rel, err);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(xs));
    memcpy(out, c.digest, 16);
    XXH3_freeState(xs);
    return rc;
}

/* A PUT of a new file that meets a file of its size: what an interrupted push left there, or
 * someone else's file; only its bytes tell (check_edit). */
static int absent_put_meets_file(const struct gs_fop_req *req, const struct rstat *st)
{
    return req->type == GS_FOP_PUT && req->expect == GS_FOP_EXPECT_ABSENT && st->exists &&
           st->is_reg;
}

/* Sets *edited when the entry `st` at `full` is not what req->expect says gpusync left there.
 * conflicts() judges by kind and size; for GS_FOP_EXPECT_HASH, and for a new file that meets one
 * of its size, the content is hashed too (read back whole, whatever its size), because accepting
 * any file would let a PUT or DELETE destroy an edit made on the server, which design decision 10
 * forbids: a size limit here once let edits of files over 8 MiB be overwritten, and judging a new
 * file's path by size alone replaced a same-sized server file without a copy. Content that
 * already equals what a PUT sends (an interrupted push) is no conflict. Returns 0 or an error as
 * r_hash. */
static int check_edit(struct sftp_ops *o, const struct gs_fop_req *req, const char *full,
                      const char *rel, const struct rstat *st, int *edited, struct gs_error *err)
{
    *edited = conflicts(req, st);
    int absent = absent_put_meets_file(req, st);
    if (*edited || !st->exists || (req->expect != GS_FOP_EXPECT_HASH && !absent) ||
        (!st->is_link && !st->is_reg))
        return 0;
    uint8_t have[16];
    int rc = r_hash(o, full, rel, st, have, err);
    int sent_already = req->type == GS_FOP_PUT && memcmp(have, req->content_hash, 16) == 0;
    if (rc == 0)
        *edited = (absent || memcmp(have, req->hash, 16) != 0) && !sent_already;
    return rc;
}

/* Clears the way for a new entry at `full`: keeps a conflicting entry as a copy, else removes
 * a file or symlink. A directory in the way of a forced replace is an error (as with the agent). */
static int clear_target(struct sftp_ops *o, const struct gs_fop_req *req, const char *full,
                        const char *rel, const struct rstat *st, struct gs_error *err)
{
    int edited = 0;
    if (!st->exists)
        return 0;
    int rc = check_edit(o, req, full, rel, st, &edited, err);
    if (rc != 0)
        return rc;
    if (edited)
        return keep_conflict(o, full, rel, err);
    if (st->is_dir)
        return op_fail(o, EISDIR, req->type == GS_FOP_RENAME ? "rename onto" : "replace", rel);
    return r_unlink(o, full, rel, err);
}

/* ---- put ----------------------------------------------------------------------------------- */

/* Opens `tmp` for writing, creating the parent directories when they are missing. */
static int open_tmp(struct sftp_ops *o, const char *tmp, const char *rel, LIBSSH2_SFTP_HANDLE **h,
                    struct gs_error *err)
{
    long flags = LIBSSH2_FXF_WRITE | LIBSSH2_FXF_CREAT | LIBSSH2_FXF_TRUNC;
    for (int attempt = 0;; attempt++) {
        int rc;
        GS_SSH_RETRY_PTR(o->ssh, *h,
                         libssh2_sftp_open_ex(o->sftp, tmp, (unsigned)strlen(tmp), flags, 0600,
                                              LIBSSH2_SFTP_OPENFILE),
                         0, err, rc);
        if (*h)
            return 0;
        rc = check_ptr(o, rc, "put", rel, err);
        if (rc != ENOENT || attempt > 0)
            return rc;
        if ((rc = mkdir_parent(o, tmp, rel, err)) != 0)
            return rc;
    }
}

/* Writes all of buf[0..len) to the handle in one libssh2 call per OPS_CHUNK. */
static int write_all(struct sftp_ops *o, LIBSSH2_SFTP_HANDLE *h, const char *buf, size_t len,
                     const char *rel, struct gs_error *err)
{
    while (len) {
        ssize_t n;
        GS_SSH_RETRY(o->ssh, n, libssh2_sftp_write(h, buf, len), 0, err);
        if (n < 0)
            return check(o, (int)n, "put", rel, err);
        buf += n;
        len -= (size_t)n;
        o->base.bytes_sent += (uint64_t)n;
        if (o->base.progress)
            o->base.progress(o->base.progress_ctx);
    }
    return 0;
}

/* Streams the local file to the open handle; what is read is what is sent. */
static int copy_up(struct sftp_ops *o, const struct gs_fop_req *req, LIBSSH2_SFTP_HANDLE *h,
                   struct gs_error *err)
{
    int fd = open(req->local_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return op_fail(o, errno, "reading local file for", req->path);
    int rc = 0;
    while (rc == 0) {
        ssize_t n = read(fd, o->iobuf, OPS_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = op_fail(o, errno, "reading local file for", req->path);
        if (n <= 0)
            break;
        rc = write_all(o, h, o->iobuf, (size_t)n, req->path, err);
    }
    close(fd);
    return rc;
}

/* The attributes a PUT leaves: mode, and mtime (atime = mtime) in whole seconds. */
static void set_meta_attrs(const struct gs_fop_req *req, LIBSSH2_SFTP_ATTRIBUTES *a)
{
    int64_t sec = gs_time_sec(req->mtime_ns, NULL);
    /* SFTP v3 times are unsigned 32-bit seconds: the nearest one, not a wrapped one (a file of
     * 1969 once landed in 2106) */
    sec = sec < 0 ? 0 : sec > (int64_t)UINT32_MAX ? (int64_t)UINT32_MAX : sec;
    memset(a, 0, sizeof(*a));
    a->flags = LIBSSH2_SFTP_ATTR_PERMISSIONS | LIBSSH2_SFTP_ATTR_ACMODTIME;
    a->permissions = req->mode ? safe_mode(req->mode) : 0644;
    a->atime = a->mtime = (unsigned long)sec;
}

/* Sets mode and mtime on the open temporary. */
static int set_meta(struct sftp_ops *o, const struct gs_fop_req *req, LIBSSH2_SFTP_HANDLE *h,
                    struct gs_error *err)
{
    LIBSSH2_SFTP_ATTRIBUTES a;
    set_meta_attrs(req, &a);
    int rc;
    GS_SSH_RETRY(o->ssh, rc, libssh2_sftp_fsetstat(h, &a), 0, err);
    return check(o, rc, "setting mode and mtime of", req->path, err);
}

/* After an upload failed: a bare SSH_FX_FAILURE on a full disk becomes ENOSPC. Runs before the
 * temporary is removed, which frees the space again. */
static int upload_errno(struct sftp_ops *o, const struct gs_fop_req *req, int rc, uint64_t sent)
{
    if (rc != EIO || o->fx != LIBSSH2_FX_FAILURE)
        return rc;
    int e = space_errno(o, rc, o->root, req->size > sent ? req->size - sent : 0);
    return e == rc ? rc : op_fail(o, e, "put", req->path);
}

/* Uploads the local file to `tmp` with its metadata. On an operation failure the temporary is
 * removed; the target is untouched either way. */
static int upload_tmp(struct sftp_ops *o, const struct gs_fop_req *req, const char *tmp,
                      struct gs_error *err)
{
    LIBSSH2_SFTP_HANDLE *h;
    uint64_t start = o->base.bytes_sent;
    int rc = open_tmp(o, tmp, req->path, &h, err);
    if (rc != 0)
        return upload_errno(o, req, rc, 0);
    rc = copy_up(o, req, h, err);
    if (rc == 0)
        rc = set_meta(o, req, h, err);
    if (rc < 0) /* the link is gone: closing would only wait for it again */
        return rc;
    int rc_close;
    GS_SSH_RETRY(o->ssh, rc_close, libssh2_sftp_close_handle(h), 0, err);
    if (rc == 0)
        rc = check(o, rc_close, "put", req->path, err);
    if (rc > 0) {
        rc = upload_errno(o, req, rc, o->base.bytes_sent - start);
        r_unlink(o, tmp, req->path, NULL);
    }
    return rc;
}

/* "<full>.gpusync-tmp-<pid>", the name shortened where it would pass NAME_MAX. */
static void tmp_path(struct gs_buf *tmp, const char *full)
{
    char suffix[32];
    size_t base = dir_len(full) + 1;
    int n = snprintf(suffix, sizeof(suffix), ".gpusync-tmp-%d", (int)getpid());
    size_t keep = strlen(full + base);
    if (keep > OPS_NAME_MAX - (size_t)n)
        keep = OPS_NAME_MAX - (size_t)n;
    gs_buf_add(tmp, full, base + keep);
    gs_buf_adds(tmp, suffix);
}

/* Uploads to a temporary, then moves it into place; the old target is only touched once the new
 * content is complete on the server. */
static int op_put(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT, tmp = GS_BUF_INIT;
    struct rstat st;
    full_path(o, &full, req->path);
    tmp_path(&tmp, full.data);
    int rc = check_parents(o, "put", req->path, err);
    if (rc == 0)
        rc = r_lstat(o, full.data, req->path, &st, err);
    if (rc == 0 && st.is_dir && !conflicts(req, &st))
        rc = op_fail(o, EISDIR, "put", req->path);
    if (rc == 0 && (rc = upload_tmp(o, req, tmp.data, err)) == 0) {
        rc = clear_target(o, req, full.data, req->path, &st, err);
        if (rc == 0)
            rc = r_rename(o, tmp.data, full.data, req->path, err);
        if (rc > 0)
            r_unlink(o, tmp.data, req->path, NULL);
    }
    gs_buf_release(&full);
    gs_buf_release(&tmp);
    return rc;
}

/* ---- the other operations ------------------------------------------------------------------ */

static int op_mkdir(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_fop_result *res,
                    struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT;
    struct rstat st;
    uint32_t mode = req->mode ? safe_mode(req->mode) : 0755;
    full_path(o, &full, req->path);
    int rc = check_parents(o, "mkdir", req->path, err);
    if (rc == 0)
        rc = r_lstat(o, full.data, req->path, &st, err);
    if (rc == 0 && st.exists && !st.is_dir)
        rc = op_fail(o, st.is_link ? ELOOP : EEXIST, "mkdir", req->path);
    else if (rc == 0 && !st.exists)
        rc = mkdir_p(o, full.data, req->path, mode, err);
    res->noop = rc == 0 && st.exists && st.is_dir && st.mode == mode;
    /* the server's umask applied to a new directory; an old one may have another mode */
    if (rc == 0 && !res->noop)
        rc = r_chmod(o, full.data, req->path, mode, err);
    if (rc == 0)
        set_add(&o->dirs, req->path, strlen(req->path));
    gs_buf_release(&full);
    return rc;
}

static int op_delete(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_fop_result *res,
                     struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT;
    struct rstat st;
    full_path(o, &full, req->path);
    int rc = check_parents(o, "delete", req->path, err);
    if (rc == 0)
        rc = r_lstat(o, full.data, req->path, &st, err);
    res->noop = rc == 0 && !st.exists;
    int edited = 0;
    if (rc == 0 && st.exists)
        rc = check_edit(o, req, full.data, req->path, &st, &edited, err);
    if (rc == 0 && st.exists) {
        if (edited)
            rc = keep_conflict(o, full.data, req->path, err);
        else
            rc = remove_entry(o, full.data, req->path, &st, req->recursive, err);
    }
    gs_buf_release(&full);
    return rc;
}

static int op_rename(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_error *err)
{
    struct gs_buf from = GS_BUF_INIT, to = GS_BUF_INIT;
    struct rstat sf = {0}, st = {0};
    full_path(o, &from, req->path);
    full_path(o, &to, req->path2);
    int rc = check_parents(o, "rename", req->path, err);
    if (rc == 0)
        rc = check_parents(o, "rename to", req->path2, err);
    if (rc == 0)
        rc = r_lstat(o, from.data, req->path, &sf, err);
    if (rc == 0 && !sf.exists)
        rc = op_fail(o, ENOENT, "rename", req->path);
    if (rc == 0)
        rc = r_lstat(o, to.data, req->path2, &st, err);
    if (rc == 0)
        rc = clear_target(o, req, to.data, req->path2, &st, err);
    if (rc == 0)
        rc = r_rename(o, from.data, to.data, req->path, err);
    if (rc == ENOENT && sf.exists && !st.exists &&
        (rc = mkdir_parent(o, to.data, req->path2, err)) == 0)
        rc = r_rename(o, from.data, to.data, req->path, err);
    gs_buf_release(&from);
    gs_buf_release(&to);
    return rc;
}

static int op_symlink(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_fop_result *res,
                      struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT;
    struct rstat st;
    char have[4096] = "";
    full_path(o, &full, req->path);
    int rc = check_parents(o, "symlink", req->path, err);
    if (rc == 0)
        rc = r_lstat(o, full.data, req->path, &st, err);
    if (rc == 0 && st.is_link)
        rc = r_readlink(o, full.data, req->path, have, sizeof(have), err);
    res->noop = rc == 0 && st.is_link && strcmp(have, req->path2) == 0;
    if (rc == 0 && !res->noop) {
        rc = clear_target(o, req, full.data, req->path, &st, err);
        if (rc == 0)
            rc = r_symlink(o, full.data, req->path2, req->path, err);
        /* the status is unreliable (see r_symlink): try the parent after any failure */
        if (rc > 0 && !st.exists && (rc = mkdir_parent(o, full.data, req->path, err)) == 0)
            rc = r_symlink(o, full.data, req->path2, req->path, err);
    }
    gs_buf_release(&full);
    return rc;
}

/* The hash of the file at `full`, for a stamp: one the server's user may not read (0200) gets
 * the asked mode first, as the agent does, and if it still cannot be read, counts as holding
 * `req->hash` (its mtime is then set unchecked, as a plain chmod would). */
static int stamp_hash(struct sftp_ops *o, const struct gs_fop_req *req, const char *full,
                      const struct rstat *st, uint8_t have[16], struct gs_error *err)
{
    int rc = r_hash(o, full, req->path, st, have, err);
    if (rc != EACCES)
        return rc;
    rc = r_chmod(o, full, req->path, req->mode, err);
    if (rc == 0)
        rc = r_hash(o, full, req->path, st, have, err);
    if (rc == EACCES)
        memcpy(have, req->hash, 16), rc = 0;
    return rc;
}

/* A chmod that sets the mtime too (req->stamp: a touch): only on the content req->hash names,
 * checked by its size and then read back whole, as a replace checks what it replaces (SFTP has
 * no hash). Anything else there is ESTALE and left as it was: the engine sends the whole file,
 * and the server's copy is kept as a conflict copy. The mtime lands in whole seconds. */
static int stamp(struct sftp_ops *o, const struct gs_fop_req *req, const char *full,
                 const struct rstat *st, struct gs_error *err)
{
    uint8_t have[16];
    int rc = st->is_reg && st->size == req->size ? stamp_hash(o, req, full, st, have, err) : 0;
    if (rc != 0)
        return rc;
    if (!st->is_reg || st->size != req->size || memcmp(have, req->hash, 16) != 0) {
        gs_buf_reset(&o->msg);
        gs_buf_addf(&o->msg,
                    "chmod %s on %s: the server holds other content than gpusync wrote there; "
                    "mode and mtime left as they were",
                    req->path, gs_ssh_target(o->ssh));
        return ESTALE;
    }
    LIBSSH2_SFTP_ATTRIBUTES a;
    set_meta_attrs(req, &a);
    a.permissions = safe_mode(req->mode);
    return r_setstat(o, full, req->path, &a, err);
}

static int op_chmod(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT;
    struct rstat st;
    full_path(o, &full, req->path);
    int rc = check_parents(o, "chmod", req->path, err);
    if (rc == 0)
        rc = r_lstat(o, full.data, req->path, &st, err);
    if (rc == 0 && !st.exists)
        rc = op_fail(o, ENOENT, "chmod", req->path);
    else if (rc == 0 && st.is_link) /* setstat would follow it; links have no mode of their own */
        rc = op_fail(o, ELOOP, "chmod", req->path);
    else if (rc == 0 && req->stamp)
        rc = stamp(o, req, full.data, &st, err);
    else if (rc == 0)
        rc = r_chmod(o, full.data, req->path, req->mode, err);
    gs_buf_release(&full);
    return rc;
}

/* Runs one operation; fills `res` unless the transport failed (negative return). */
static int run_op(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_fop_result *res,
                  struct gs_error *err)
{
    int rc;
    memset(res, 0, sizeof(*res));
    gs_buf_reset(&o->kept);
    o->fx = 0;
    switch (req->type) {
    case GS_FOP_PUT:
        rc = op_put(o, req, err);
        break;
    case GS_FOP_MKDIR:
        rc = op_mkdir(o, req, res, err);
        break;
    case GS_FOP_DELETE: /* a directory it removes or moves is no longer known to be one */
        rc = op_delete(o, req, res, err);
        set_clear(&o->dirs);
        break;
    case GS_FOP_RENAME:
        rc = op_rename(o, req, err);
        set_clear(&o->dirs);
        break;
    case GS_FOP_SYMLINK:
        rc = op_symlink(o, req, res, err);
        break;
    case GS_FOP_CHMOD:
        rc = op_chmod(o, req, err);
        break;
    default:
        rc = op_fail(o, EINVAL, "unknown operation on", req->path ? req->path : "");
    }
    if (rc < 0)
        return rc;
    res->ok = rc == 0;
    res->noop = res->ok && res->noop;
    res->err_no = rc;
    res->message = rc ? o->msg.data : NULL;
    res->kept = o->kept.len ? o->kept.data : NULL;
    return 0;
}

/* ---- the window: small PUTs overlapped across channels ------------------------------------ *
 *
 * A sequential PUT costs about six round trips (lstat, open, write, fsetstat, close, rename), and
 * SFTP requests of one kind are serialised per channel, so small files run as one state machine
 * per channel of the pool. Each step is one non-blocking libssh2 call, repeated until it stops
 * returning EAGAIN; while one entry waits for its reply the others run. libssh2 1.10 allows only
 * one half-sent packet per session, so an entry blocked while *sending* is repeated, and nothing
 * else is called, until its packet is out. Anything unusual (something in the way, a missing
 * parent, any SFTP error) re-runs that PUT with the sequential code on the entry's own channel,
 * which gives the same results and messages as without the window. Any other operation, a large
 * file, or a second PUT of a path still in the window waits for the window to empty first, so
 * operations take effect in submission order wherever the order matters. */

#define PUT_SENDING 2

static struct put_entry *win_at(struct sftp_ops *o, int i)
{
    return o->win[(o->win_head + i) % GS_SFTP_POOL_MAX];
}

static void entry_free(struct put_entry *e)
{
    free(e->path);
    free(e->local);
    free(e->data);
    free(e->msg);
    free(e->kept);
    gs_buf_release(&e->full);
    gs_buf_release(&e->tmp);
    free(e);
}

/* Finishes `e` with errno `rc` (0: success), the message in o->msg and the copy in o->kept. */
static void entry_finish(struct sftp_ops *o, struct put_entry *e, int rc)
{
    e->step = PS_DONE;
    e->err_no = rc;
    e->msg = rc ? gs_xstrdup(o->msg.data) : NULL;
    e->kept = o->kept.len ? gs_xstrdup(o->kept.data) : NULL;
}

/* Reads the whole local file (what is read is what is sent); 0 or an errno. */
static int entry_read(struct sftp_ops *o, struct put_entry *e)
{
    int fd = open(e->local, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return op_fail(o, errno, "reading local file for", e->path);
    size_t cap = e->req.size + 1;
    int rc = 0;
    e->data = gs_xmalloc(cap);
    while (rc == 0) {
        if (e->len == cap)
            e->data = gs_xrealloc(e->data, cap *= 2);
        ssize_t n = read(fd, e->data + e->len, cap - e->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = op_fail(o, errno, "reading local file for", e->path);
        if (n <= 0)
            break;
        e->len += (size_t)n;
    }
    close(fd);
    return rc;
}

/* One libssh2 call for the entry's step: its return code, LIBSSH2_ERROR_EAGAIN, or 1 when a
 * write went through in part. */
static int put_call(struct sftp_ops *o, struct put_entry *e)
{
    LIBSSH2_SFTP *ch = o->pool.chan[e->chan];
    const char *full = e->full.data, *tmp = e->tmp.data;
    long flags = LIBSSH2_FXF_WRITE | LIBSSH2_FXF_CREAT | LIBSSH2_FXF_TRUNC;
    switch (e->step) {
    case PS_STAT:
        return libssh2_sftp_stat_ex(ch, full, (unsigned)strlen(full), LIBSSH2_SFTP_LSTAT,
                                    &e->attrs);
    case PS_OPEN:
        e->h = libssh2_sftp_open_ex(ch, tmp, (unsigned)strlen(tmp), flags, 0600,
                                    LIBSSH2_SFTP_OPENFILE);
        return e->h ? 0 : libssh2_session_last_errno(gs_ssh_session(o->ssh));
    case PS_WRITE: {
        ssize_t n = libssh2_sftp_write(e->h, e->data + e->off, e->len - e->off);
        if (n == 0) /* nothing acknowledged yet: wait, never take it as the end */
            return LIBSSH2_ERROR_EAGAIN;
        if (n < 0)
            return (int)n;
        e->off += (size_t)n;
        o->base.bytes_sent += (uint64_t)n;
        if (o->base.progress)
            o->base.progress(o->base.progress_ctx);
        return e->off < e->len;
    }
    case PS_META:
        return libssh2_sftp_fsetstat(e->h, &e->attrs);
    case PS_CLOSE: {
        int rc = libssh2_sftp_close_handle(e->h);
        if (rc != LIBSSH2_ERROR_EAGAIN)
            e->h = NULL; /* libssh2 frees the handle whatever the status */
        return rc;
    }
    case PS_UNLINK:
        return libssh2_sftp_unlink_ex(ch, full, (unsigned)strlen(full));
    case PS_RENAME:
        return libssh2_sftp_rename_ex(ch, tmp, (unsigned)strlen(tmp), full, (unsigned)strlen(full),
                                      LIBSSH2_SFTP_RENAME_ATOMIC | LIBSSH2_SFTP_RENAME_NATIVE);
    default:
        return 0;
    }
}

/* Re-runs the entry's PUT with the sequential code on its own channel, after removing what the
 * overlapped attempt left. Returns 0 or a negative transport code. */
static int put_fallback(struct sftp_ops *o, struct put_entry *e, struct gs_error *err)
{
    int rc = 0;
    o->sftp = o->pool.chan[e->chan];
    o->base.bytes_sent -= e->off;
    if (e->h)
        GS_SSH_RETRY(o->ssh, rc, libssh2_sftp_close_handle(e->h), 0, err);
    e->h = NULL;
    if (!GS_IS_ERROR(rc)) {
        rc = e->step > PS_OPEN ? r_unlink(o, e->tmp.data, e->path, err) : 0;
        gs_buf_reset(&o->kept);
        o->fx = 0;
        rc = rc < 0 ? rc : op_put(o, &e->req, err);
    }
    o->sftp = o->pool.chan[0];
    if (rc >= 0)
        entry_finish(o, e, rc);
    return rc < 0 ? rc : 0;
}

/* Whether what the lstat step found lets the overlapped PUT go on. */
static int put_stat_ok(struct put_entry *e)
{
    struct rstat st = {.exists = 1,
                       .is_dir = LIBSSH2_SFTP_S_ISDIR(e->attrs.permissions),
                       .is_link = LIBSSH2_SFTP_S_ISLNK(e->attrs.permissions),
                       .is_reg = LIBSSH2_SFTP_S_ISREG(e->attrs.permissions),
                       .size = e->attrs.filesize};
    /* a file gpusync expects to hold a given content, or a new file's path that holds one of
     * its size, is checked by hashing it, which only the sequential path does (check_edit) */
    return !st.is_dir && !conflicts(&e->req, &st) && e->req.expect != GS_FOP_EXPECT_HASH &&
           !absent_put_meets_file(&e->req, &st);
}

/* Moves `e` on after `rc` from put_call. Returns 0 or a negative transport code. */
static int put_next(struct sftp_ops *o, struct put_entry *e, int rc, struct gs_error *err)
{
    if (rc < 0 && rc != LIBSSH2_ERROR_SFTP_PROTOCOL)
        return check(o, rc, "put", e->path, err);
    if (rc == LIBSSH2_ERROR_SFTP_PROTOCOL) {
        unsigned long fx = libssh2_sftp_last_error(o->pool.chan[e->chan]);
        if (e->step == PS_STAT && fx == LIBSSH2_FX_NO_SUCH_FILE) {
            e->step = PS_OPEN; /* nothing there: the common case */
            return 0;
        }
        if (e->step == PS_RENAME && !e->target_exists && e->req.expect == GS_FOP_EXPECT_FORCE) {
            e->target_exists = 1; /* OpenSSH refuses to rename over a file: unlink first */
            e->step = PS_UNLINK;
            return 0;
        }
        return put_fallback(o, e, err);
    }
    if (e->step == PS_STAT && !put_stat_ok(e))
        return put_fallback(o, e, err);
    if (e->step == PS_STAT)
        e->target_exists = 1;
    if (rc == 1) /* a write with more to send */
        return 0;
    e->step = e->step == PS_CLOSE && !e->target_exists ? PS_RENAME : e->step + 1;
    if (e->step == PS_WRITE && e->len == 0)
        e->step = PS_META;
    if (e->step == PS_META)
        set_meta_attrs(&e->req, &e->attrs);
    if (e->step == PS_DONE) {
        gs_buf_reset(&o->kept);
        entry_finish(o, e, 0);
    }
    return 0;
}

/* Advances `e` as far as it goes without waiting. Returns 1 if it moved, 0 if it waits for a
 * reply, PUT_SENDING if libssh2 holds a half-sent packet of it, or a negative transport code. */
static int put_advance(struct sftp_ops *o, struct put_entry *e, struct gs_error *err)
{
    int moved = 0;
    while (e->step != PS_DONE) {
        int rc = put_call(o, e);
        if (rc == LIBSSH2_ERROR_EAGAIN) {
            int dir = libssh2_session_block_directions(gs_ssh_session(o->ssh));
            return dir & LIBSSH2_SESSION_BLOCK_OUTBOUND ? PUT_SENDING : moved;
        }
        if ((rc = put_next(o, e, rc, err)) < 0)
            return rc;
        moved = 1;
    }
    return moved;
}

/* Advances `e`, finishing any half-sent packet before returning. */
static int put_run(struct sftp_ops *o, struct put_entry *e, struct gs_error *err)
{
    int rc;
    while ((rc = put_advance(o, e, err)) == PUT_SENDING) {
        int w = gs_ssh_wait(o->ssh, 0, err);
        if (w < 0)
            return w;
    }
    return rc;
}

/* Hands finished entries at the head of the window to the engine, in order. */
static void win_deliver(struct sftp_ops *o)
{
    while (o->win_n > 0 && win_at(o, 0)->step == PS_DONE) {
        struct put_entry *e = win_at(o, 0);
        struct gs_fop_result res = {
            .ok = e->err_no == 0, .err_no = e->err_no, .message = e->msg, .kept = e->kept};
        o->win_head = (o->win_head + 1) % GS_SFTP_POOL_MAX;
        o->win_n--;
        if (o->base.done)
            o->base.done(o->base.done_ctx, e->req.ctx, &res);
        entry_free(e);
    }
}

/* Runs the window until it holds fewer than `max` entries. Two passes without progress go by
 * before waiting on the socket: a reply that one entry's call read off the socket may sit queued
 * for an entry already passed over in that pass. */
static int win_pump(struct sftp_ops *o, int max, struct gs_error *err)
{
    int idle = 0;
    win_deliver(o);
    while (o->win_n >= max && o->win_n > 0) {
        int moved = 0;
        for (int i = 0; i < o->win_n; i++) {
            int rc = win_at(o, i)->step == PS_DONE ? 0 : put_run(o, win_at(o, i), err);
            if (rc < 0)
                return rc;
            moved |= rc;
        }
        win_deliver(o);
        idle = moved ? 0 : idle + 1;
        int rc = idle >= 2 ? gs_ssh_wait(o->ssh, 0, err) : 0;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Whether `req` can join the window. */
static int win_fits(struct sftp_ops *o, const struct gs_fop_req *req)
{
    if (req->type != GS_FOP_PUT || req->size > OPS_SMALL || o->single)
        return 0;
    for (int i = 0; i < o->win_n; i++)
        if (strcmp(win_at(o, i)->path, req->path) == 0)
            return 0;
    return 1;
}

/* A channel no entry of the window uses (the window is smaller than the pool). */
static int win_free_chan(struct sftp_ops *o)
{
    for (int c = 0; c < o->pool.n; c++) {
        int used = 0;
        for (int i = 0; i < o->win_n && !used; i++)
            used = win_at(o, i)->chan == c;
        if (!used)
            return c;
    }
    return 0;
}

/* Queues a small PUT in the window and sends its first request. Returns 0 or a negative
 * transport code. */
static int win_submit(struct sftp_ops *o, const struct gs_fop_req *req, struct gs_error *err)
{
    int rc = 0;
    if (o->win_n >= o->pool.n)
        rc = gs_sftp_pool_grow(&o->pool, err);
    if (rc == 0)
        rc = win_pump(o, o->pool.n, err);
    if (rc < 0)
        return rc;
    struct put_entry *e = gs_xcalloc(1, sizeof(*e));
    e->path = gs_xstrdup(req->path);
    e->local = gs_xstrdup(req->local_file);
    e->req = *req;
    e->req.path = e->path;
    e->req.local_file = e->local;
    e->chan = win_free_chan(o);
    full_path(o, &e->full, e->path);
    tmp_path(&e->tmp, e->full.data);
    /* a forced PUT skips the lstat: the rename tells whether something is in the way */
    e->step = req->expect == GS_FOP_EXPECT_FORCE ? PS_OPEN : PS_STAT;
    o->win[(o->win_head + o->win_n++) % GS_SFTP_POOL_MAX] = e;
    gs_buf_reset(&o->kept);
    rc = entry_read(o, e);
    if (rc > 0) {
        entry_finish(o, e, rc);
        return 0;
    }
    rc = put_run(o, e, err);
    return rc < 0 ? rc : 0;
}

/* ---- struct gs_fileops --------------------------------------------------------------------- */

/* Records a transport failure: from now on every call returns it. */
static int ops_die(struct sftp_ops *o, int rc, struct gs_error *err)
{
    o->dead = 1;
    o->dead_err.code = rc;
    return gs_error_set(err, rc, "%s", o->dead_err.msg);
}

static int ops_submit(struct gs_fileops *ops, const struct gs_fop_req *req, struct gs_error *err)
{
    struct sftp_ops *o = (struct sftp_ops *)ops;
    struct gs_fop_result res;
    if (o->dead)
        return gs_error_set(err, o->dead_err.code, "%s", o->dead_err.msg);
    /* a PUT into a directory not yet checked runs alone once: check_parents uses channel 0 */
    if (win_fits(o, req) && parents_known(o, req->path)) {
        int rc = win_submit(o, req, &o->dead_err);
        return rc < 0 ? ops_die(o, rc, err) : 0;
    }
    int rc = win_pump(o, 1, &o->dead_err); /* a barrier: the window empties first */
    if (rc == 0)
        rc = run_op(o, req, &res, &o->dead_err);
    if (rc < 0)
        return ops_die(o, rc, err);
    if (ops->done)
        ops->done(ops->done_ctx, req->ctx, &res);
    return 0;
}

static int ops_drain(struct gs_fileops *ops, struct gs_error *err)
{
    struct sftp_ops *o = (struct sftp_ops *)ops;
    if (o->dead)
        return gs_error_set(err, o->dead_err.code, "%s", o->dead_err.msg);
    int rc = win_pump(o, 1, &o->dead_err);
    set_clear(&o->dirs); /* the next batch looks again: the server may change meanwhile */
    return rc < 0 ? ops_die(o, rc, err) : 0;
}

static enum gs_fop_kind kind_of(const struct rstat *st)
{
    return !st->exists   ? GS_FOP_KIND_NONE
           : st->is_dir  ? GS_FOP_KIND_DIR
           : st->is_link ? GS_FOP_KIND_SYMLINK
           : st->is_reg  ? GS_FOP_KIND_FILE
                         : GS_FOP_KIND_OTHER;
}

/* Probes one path: lstat, then the hash of a file's bytes (read back) or of a link's target.
 * Returns 0 or a negative transport code; an SFTP refusal leaves the path GS_FOP_KIND_UNKNOWN. */
static int probe_one(struct sftp_ops *o, const char *rel, struct gs_fop_stat *out,
                     struct gs_error *err)
{
    struct gs_buf full = GS_BUF_INIT;
    struct rstat st = {0};
    int rc = check_parents(o, "probe", rel, err); /* what lies behind a link is not ours */
    if (rc == 0)
        rc = r_lstat(o, full_path(o, &full, rel), rel, &st, err);
    out->kind = rc == 0 ? kind_of(&st) : GS_FOP_KIND_UNKNOWN;
    out->mode = st.mode;
    out->size = st.size;
    if (rc == 0 && (st.is_reg || st.is_link)) {
        rc = r_hash(o, full.data, rel, &st, out->hash, err);
        out->has_hash = rc == 0;
    }
    gs_buf_release(&full);
    return rc < 0 ? rc : 0;
}

static int ops_probe(struct gs_fileops *ops, const char *const *paths, size_t n,
                     struct gs_fop_stat *out, struct gs_error *err)
{
    struct sftp_ops *o = (struct sftp_ops *)ops;
    memset(out, 0, n * sizeof(*out));
    int rc = ops_drain(ops, err);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if ((rc = probe_one(o, paths[i], &out[i], &o->dead_err)) < 0)
            return ops_die(o, rc, err);
    return rc;
}

static void ops_close(struct gs_fileops *ops)
{
    struct sftp_ops *o = (struct sftp_ops *)ops;
    if (!o)
        return;
    if (!o->dead && o->win_n) { /* closed without a drain: finish, without completions */
        struct gs_error ignored;
        o->base.done = NULL;
        if (win_pump(o, 1, &ignored) < 0)
            o->dead = 1;
    }
    for (int i = 0; i < o->win_n; i++) /* after a transport failure: dropped */
        entry_free(win_at(o, i));
    if (!o->dead) {
        gs_sftp_pool_release(&o->pool);
    } else { /* one try each, no waiting on a dead link: frees what it can */
        for (int i = 0; i < o->pool.n; i++)
            libssh2_sftp_shutdown(o->pool.chan[i]);
    }
    set_clear(&o->dirs);
    free(o->root);
    free(o->iobuf);
    gs_buf_release(&o->msg);
    gs_buf_release(&o->kept);
    free(o);
}

/* The root without trailing slashes; "" becomes "." (the start directory). */
static char *clean_root(const char *root)
{
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    return n ? gs_xstrndup(root, n) : gs_xstrdup(".");
}

static int is_openssh(struct gs_ssh *ssh)
{
    const char *banner = libssh2_session_banner_get(gs_ssh_session(ssh));
    return banner && strstr(banner, "OpenSSH") != NULL;
}

int gs_sftp_ops_open(struct gs_fileops **out, struct gs_ssh *ssh, const char *remote_root,
                     struct gs_error *err)
{
    *out = NULL;
    struct sftp_ops *o = gs_xcalloc(1, sizeof(*o));
    o->root = clean_root(remote_root);
    o->iobuf = gs_xmalloc(OPS_CHUNK);
    o->base.submit = ops_submit;
    o->base.drain = ops_drain;
    o->base.probe = ops_probe;
    o->base.close = ops_close;
    o->ssh = ssh;
    o->openssh = is_openssh(ssh);
    o->single = getenv("GPUSYNC_SFTP_SEQUENTIAL") != NULL;
    int rc = gs_sftp_pool_open(&o->pool, ssh, err);
    if (rc < 0) {
        o->dead = 1; /* the pool released itself */
        ops_close(&o->base);
        return rc;
    }
    o->sftp = o->pool.chan[0];
    rc = strcmp(o->root, "/") ? mkdir_p(o, o->root, o->root, 0755, err) : 0;
    if (rc > 0)
        rc = gs_error_set(err, GS_E_REMOTE, "cannot create the remote project directory: %s",
                          o->msg.data);
    if (rc < 0) {
        ops_close(&o->base);
        return rc;
    }
    *out = &o->base;
    return 0;
}

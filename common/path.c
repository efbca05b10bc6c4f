/* common/path.c: local path helpers (see path.h). */
#include "common/path.h"
#include "common/wrapper.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void gs_path_join(struct gs_buf *out, const char *a, const char *b)
{
    size_t alen = strlen(a);
    while (alen > 1 && a[alen - 1] == '/')
        alen--;
    gs_buf_add(out, a, alen);
    while (*b == '/')
        b++;
    if (alen && a[alen - 1] != '/' && *b)
        gs_buf_addc(out, '/');
    gs_buf_adds(out, b);
}

char *gs_path_expand_home(const char *path)
{
    const char *home = getenv("HOME");
    if (path[0] != '~' || (path[1] != '/' && path[1] != '\0') || !home)
        return gs_xstrdup(path);
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b, home);
    gs_buf_adds(&b, path + 1);
    return gs_buf_detach(&b, NULL);
}

int gs_path_mkdir_p(const char *path, int mode, struct gs_error *err)
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
        if (mkdir(b.data, (mode_t)mode) < 0 && errno != EEXIST)
            rc = gs_error_errno(err, GS_E_IO, "cannot create directory %s", b.data);
        *p = saved;
        if (saved == '\0')
            break;
    }
    gs_buf_release(&b);
    return rc;
}

int gs_path_exists(const char *name)
{
    struct stat st;
    return lstat(name, &st) == 0;
}

int gs_path_find_project(const char *start, struct gs_buf *root, struct gs_error *err)
{
    char dir[PATH_MAX];
    if (!realpath(start ? start : ".", dir))
        return gs_error_errno(err, GS_E_IO, "%s", start ? start : "current directory");
    struct gs_buf probe = GS_BUF_INIT;
    for (;;) {
        gs_buf_reset(&probe);
        gs_path_join(&probe, dir, GS_CONFIG_FILE);
        if (gs_path_exists(probe.data)) {
            gs_buf_reset(root);
            gs_buf_adds(root, dir);
            gs_buf_release(&probe);
            return 0;
        }
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir)
            break;
        *slash = '\0';
    }
    gs_buf_release(&probe);
    return gs_error_set(err, GS_E_NOTFOUND,
                        "not a gpusync project (no %s here or in any parent directory); "
                        "run 'gpusync init [user@]host[:port]' first",
                        GS_CONFIG_FILE);
}

/* Appends the normalised form of `path` (absolute) to `out`: "." dropped, ".." pops a component. */
static void normalise(const char *path, struct gs_buf *out)
{
    gs_buf_reset(out);
    for (const char *p = path; *p;) {
        while (*p == '/')
            p++;
        size_t len = strcspn(p, "/");
        if (len == 0)
            break;
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            char *slash = out->len ? strrchr(out->data, '/') : NULL;
            out->len = slash ? (size_t)(slash - out->data) : 0;
            if (out->data)
                out->data[out->len] = '\0';
        } else if (!(len == 1 && p[0] == '.')) {
            gs_buf_addc(out, '/');
            gs_buf_add(out, p, len);
        }
        p += len;
    }
    if (!out->len)
        gs_buf_addc(out, '/');
}

int gs_path_project_relative(const char *root, const char *arg, struct gs_buf *out,
                             struct gs_error *err)
{
    struct gs_buf abs = GS_BUF_INIT, norm = GS_BUF_INIT;
    char cwd[PATH_MAX];
    if (arg[0] != '/' && getcwd(cwd, sizeof(cwd)))
        gs_path_join(&abs, cwd, arg);
    else
        gs_buf_adds(&abs, arg);
    normalise(abs.data, &norm);
    size_t rlen = strlen(root);
    int rc = 0;
    if (strcmp(norm.data, root) == 0)
        ;
    else if (strncmp(norm.data, root, rlen) == 0 && norm.data[rlen] == '/')
        gs_buf_adds(out, norm.data + rlen + 1);
    else
        rc = gs_error_set(err, GS_E_USAGE, "%s is outside the project %s", arg, root);
    gs_buf_release(&abs);
    gs_buf_release(&norm);
    return rc;
}

#define CONFLICT_TAG ".gpusync-conflict-"

int gs_path_keep_conflict(const char *path, struct gs_buf *kept, struct gs_error *err)
{
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm))
        return gs_error_set(err, GS_E_IO, "%s: cannot make a conflict copy name", path);
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    /* shorten NAME rather than exceed NAME_MAX with the tag, the stamp and "-NNN" */
    int keep = NAME_MAX - (int)(strlen(CONFLICT_TAG) + strlen(stamp) + 4);
    int rc = -1;
    for (int n = 0; n < 1000 && rc != 0; n++) {
        gs_buf_reset(kept);
        gs_buf_add(kept, path, dir_len);
        gs_buf_addf(kept, "%.*s%s%s", keep, path + dir_len, CONFLICT_TAG, stamp);
        if (n > 0)
            gs_buf_addf(kept, "-%d", n);
        rc = renameat2(AT_FDCWD, path, AT_FDCWD, kept->data, RENAME_NOREPLACE);
        if (rc != 0 && errno != EEXIST)
            break;
    }
    return rc == 0 ? 0 : gs_error_errno(err, GS_E_IO, "cannot keep %s as a conflict copy", path);
}

int gs_path_open_private(const char *path, int flags)
{
    return open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600);
}

int gs_path_write_atomic(const char *path, const void *data, size_t len)
{
    struct gs_buf tmp = GS_BUF_INIT;
    gs_buf_addf(&tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = gs_path_open_private(tmp.data, O_WRONLY | O_CREAT | O_TRUNC);
    int rc = fd < 0 || gs_write_all(fd, data, len) < 0 ? -1 : 0;
    if (fd >= 0 && close(fd) != 0)
        rc = -1;
    if (rc == 0 && rename(tmp.data, path) != 0)
        rc = -1;
    if (rc < 0) {
        int saved = errno;
        unlink(tmp.data);
        errno = saved;
    }
    gs_buf_release(&tmp);
    return rc;
}

int gs_path_read_file(const char *path, struct gs_buf *out)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char chunk[65536];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof(chunk))) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        gs_buf_add(out, chunk, (size_t)n);
    }
    int saved = errno;
    close(fd);
    errno = saved;
    return n < 0 ? -1 : 0;
}

#define STATE_GITIGNORE "# gpusync's state (index, daemon socket, logs): never for git\n*\n"

int gs_path_state_dir(const char *root, struct gs_error *err)
{
    struct gs_buf dir = GS_BUF_INIT, ignore = GS_BUF_INIT;
    gs_path_join(&dir, root, GS_DIR);
    gs_path_join(&ignore, dir.data, ".gitignore");
    int rc = gs_path_mkdir_p(dir.data, 0700, err);
    struct stat st;
    if (rc == 0 && lstat(dir.data, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 077))
        chmod(dir.data, 0700); /* made by an older gpusync under the umask */
    int fd = rc == 0 ? gs_path_open_private(ignore.data, O_WRONLY | O_CREAT | O_EXCL) : -1;
    if (fd >= 0) {
        int wrc = gs_write_all(fd, STATE_GITIGNORE, sizeof(STATE_GITIGNORE) - 1);
        if (close(fd) != 0 || wrc != 0)
            unlink(ignore.data); /* a partial one would be worse than none: next time */
    }
    gs_buf_release(&dir);
    gs_buf_release(&ignore);
    return rc;
}

size_t gs_path_lower_bound(const void *v, size_t n, size_t size, size_t off, const char *key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *path = *(const char *const *)((const char *)v + mid * size + off);
        if (strcmp(path, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

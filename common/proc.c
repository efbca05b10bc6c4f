/* common/proc.c: local helper programs (see proc.h). */
#include "common/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int gs_proc_in_path(const char *name)
{
    const char *path = getenv("PATH");
    if (!path || strchr(name, '/'))
        return access(name, X_OK) == 0;
    struct gs_buf b = GS_BUF_INIT;
    int found = 0;
    for (const char *p = path; !found && *p;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        gs_buf_reset(&b);
        gs_buf_add(&b, p, len);
        gs_buf_addf(&b, "/%s", name);
        found = access(b.data, X_OK) == 0;
        p += len + (colon ? 1 : 0);
    }
    gs_buf_release(&b);
    return found;
}

static void read_all(int fd, struct gs_buf *out)
{
    char chunk[4096];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        gs_buf_add(out, chunk, (size_t)n);
    }
}

int gs_proc_capture(char *const argv[], struct gs_buf *out, struct gs_error *err)
{
    if (!gs_proc_in_path(argv[0]))
        return gs_error_set(err, GS_E_NOTFOUND, "%s: program not found in PATH", argv[0]);
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        return gs_error_errno(err, GS_E_IO, "pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        errno = rc;
        return gs_error_errno(err, GS_E_IO, "cannot run %s", argv[0]);
    }
    read_all(pipefd[0], out);
    close(pipefd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* trainer/tests/gt_check.h: what the trainer's GPU tests share: CHECK, which reports a failure and
 * returns 1 from the test function rather than abort, so the other cases still run; and running
 * each check in a child of its own. Include after gpu.h. */
#ifndef GT_CHECK_H
#define GT_CHECK_H

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* The number of visible GPUs (capped), for isolated(): 0 without one, saying why. */
static inline int probe_devices(void)
{
    const char *why = NULL;
    int n = gt_gpu_device_count(&why);
    if (n <= 0) {
        printf("CUDA: %s\n", why);
        fflush(stdout); /* isolated() ends the child with _exit */
    }
    return n > 100 ? 100 : n;
}

/* Runs fn in a forked child and returns its exit status (1 for a crash): each check gets a
 * fresh CUDA context, and the parent never initialises CUDA, so later forks stay legal. */
static inline int isolated(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = fn();
        fflush(NULL); /* _exit flushes nothing: a piped stdout would lose the child's report */
        _exit(rc);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return 1;
    return WEXITSTATUS(st);
}

#endif

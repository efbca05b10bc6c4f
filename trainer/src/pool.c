/* pool.c: a fixed set of worker threads, woken for each loop by a generation count (pool.h). */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "model.h"

#ifdef GT_HAVE_CBLAS
/* OpenBLAS's own (CMakeLists.txt links OpenBLAS whenever it uses a CBLAS). */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
#endif

#define GT_POOL_MAX 256

typedef struct loop {
    gt_pool_fn fn;
    void *ctx;
    int n, workers;
} loop;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    pthread_t tid[GT_POOL_MAX];
    float *scratch[GT_POOL_MAX];
    size_t scratch_len;
    int threads;  /* the caller plus the workers started */
    unsigned gen; /* bumped for each loop; a worker runs each generation once */
    int pending;  /* workers yet to finish the current loop */
    bool quit;
    bool running; /* between gt_pool_start and gt_pool_stop, workers or not */
    loop cur;
    int blas_threads; /* the BLAS's count before the pool took the cores */
} P = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .wake = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER,
       .threads = 1};

/* Items [lo, hi) of chunk w when n items are split into parts. */
static void chunk(int n, int parts, int w, int *lo, int *hi)
{
    *lo = (int)((int64_t)n * w / parts);
    *hi = (int)((int64_t)n * (w + 1) / parts);
}

static void *worker_main(void *arg)
{
    int w = (int)(intptr_t)arg;
    unsigned seen = 0; /* gt_pool_start resets gen before any worker runs */
    pthread_mutex_lock(&P.mu);
    for (;;) {
        while (P.gen == seen && !P.quit)
            pthread_cond_wait(&P.wake, &P.mu);
        if (P.quit)
            break;
        seen = P.gen;
        loop l = P.cur;
        if (w >= l.workers)
            continue; /* not part of this loop, and not counted in pending */
        pthread_mutex_unlock(&P.mu);
        int lo, hi;
        chunk(l.n, l.workers, w, &lo, &hi);
        if (lo < hi)
            l.fn(l.ctx, w, lo, hi);
        pthread_mutex_lock(&P.mu);
        if (--P.pending == 0)
            pthread_cond_signal(&P.done);
    }
    pthread_mutex_unlock(&P.mu);
    gt_gemm_release_scratch();
    return NULL;
}

int gt_pool_start(int threads)
{
    gt_pool_stop();
    threads = threads > GT_POOL_MAX ? GT_POOL_MAX : threads;
    P.gen = 0;
    P.scratch_len = 0; /* a loop without workers reserved nothing */
    int started = 1;
    for (int w = 1; w < threads; w++) {
        if (pthread_create(&P.tid[w], NULL, worker_main, (void *)(intptr_t)w) != 0)
            break;
        started++;
    }
    P.threads = started;
    P.running = true;
#ifdef GT_HAVE_CBLAS
    P.blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
#endif
    return threads > 1 && started == 1 ? -1 : 0;
}

void gt_pool_stop(void)
{
    if (!P.running)
        return;
    P.running = false;
#ifdef GT_HAVE_CBLAS
    openblas_set_num_threads(P.blas_threads);
#endif
    if (P.threads < 2)
        return;
    pthread_mutex_lock(&P.mu);
    P.quit = true;
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    for (int w = 1; w < P.threads; w++) {
        pthread_join(P.tid[w], NULL);
        free(P.scratch[w]);
        P.scratch[w] = NULL;
    }
    P.threads = 1;
    P.scratch_len = 0;
    P.quit = false;
}

int gt_pool_threads(void)
{
    return P.threads;
}

/* A positive count from environment variable name, or 0. */
static int env_count(const char *name)
{
    const char *v = getenv(name);
    char *end;
    long n = v && *v ? strtol(v, &end, 10) : 0;
    return n > 0 && n <= GT_POOL_MAX && *end == '\0' ? (int)n : 0;
}

int gt_pool_default_threads(void)
{
    int n = env_count("OPENBLAS_NUM_THREADS");
    n = n ? n : env_count("OMP_NUM_THREADS");
    if (n)
        return n;
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    int local = env_count("LOCAL_WORLD_SIZE");
    n = cpus / (local ? local : 1);
    return n < 1 ? 1 : n;
}

int gt_pool_reserve(size_t floats)
{
    if (P.threads < 2 || floats <= P.scratch_len)
        return P.threads;
    for (int w = 1; w < P.threads; w++) {
        float *p = realloc(P.scratch[w], floats * sizeof(float));
        if (!p)
            return 1;
        P.scratch[w] = p;
    }
    P.scratch_len = floats;
    return P.threads;
}

float *gt_pool_scratch(int w)
{
    return P.scratch[w];
}

int gt_pool_for(int n, int workers, gt_pool_fn fn, void *ctx)
{
    workers = workers < P.threads ? workers : P.threads;
    workers = workers < n ? workers : n;
    if (workers < 2) {
        if (n > 0)
            fn(ctx, 0, 0, n);
        return n > 0 ? 1 : 0;
    }
    pthread_mutex_lock(&P.mu);
    P.cur = (loop){.fn = fn, .ctx = ctx, .n = n, .workers = workers};
    P.pending = workers - 1;
    P.gen++;
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
    int lo, hi;
    chunk(n, workers, 0, &lo, &hi);
    fn(ctx, 0, lo, hi);
    pthread_mutex_lock(&P.mu);
    while (P.pending > 0)
        pthread_cond_wait(&P.done, &P.mu);
    pthread_mutex_unlock(&P.mu);
    return workers;
}

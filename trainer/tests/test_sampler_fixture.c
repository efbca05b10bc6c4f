/* test_sampler_fixture.c: compares gt_randperm and gt_sampler with index lists that PyTorch
 * printed (fixtures/torch_sampler.txt, made by fixtures/make_sampler_fixture.py with Debian 12's
 * python3-torch 1.13.1; scripts/gpu-check.sh makes it again with the GPU machine's torch 2.x). A
 * missing file exits 77 (skipped) rather than pass on an invented fixture.
 * Usage: test_sampler_fixture [FIXTURE_FILE]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

#ifndef GT_FIXTURE_DIR
#define GT_FIXTURE_DIR "."
#endif

enum { MAX_IDX = 70000 };

/* Parses the integers after ':' into out; returns how many. */
static long parse_list(const char *line, int64_t *out)
{
    const char *p = strchr(line, ':');
    long k = 0;
    if (!p)
        return -1;
    p++;
    char *end;
    for (;;) {
        long long v = strtoll(p, &end, 10);
        if (end == p || k == MAX_IDX)
            break;
        out[k++] = v;
        p = end;
    }
    return k;
}

static int check_randperm(const char *line, int64_t *want, int64_t *got)
{
    unsigned long long seed;
    long long n;
    if (sscanf(line, "randperm %llu %lld", &seed, &n) != 2 || n > MAX_IDX ||
        parse_list(line, want) != n)
        return fprintf(stderr, "malformed fixture line: %.80s\n", line), 1;
    gt_randperm(n, seed, got);
    if (memcmp(want, got, (size_t)n * sizeof(int64_t)) != 0)
        return fprintf(stderr, "FAIL randperm seed %llu n %lld differs\n", seed, n), 1;
    return 0;
}

static int check_sampler(const char *line, int64_t *want, int64_t *got)
{
    long long n;
    int world, rank, drop;
    unsigned long long seed, epoch;
    if (sscanf(line, "sampler %lld %d %d %llu %llu %d", &n, &world, &rank, &seed, &epoch, &drop) !=
            6 ||
        n > MAX_IDX)
        return fprintf(stderr, "malformed fixture line: %.80s\n", line), 1;
    long k = parse_list(line, want);
    gt_sampler s;
    gt_err err = {{0}};
    if (gt_sampler_init(&s, n, world, rank, true, drop != 0, seed, &err) != 0)
        return fprintf(stderr, "FAIL sampler init: %s\n", err.msg), 1;
    gt_sampler_indices(&s, epoch, got, NULL);
    if (k != s.num_samples || memcmp(want, got, (size_t)k * sizeof(int64_t)) != 0)
        return fprintf(stderr, "FAIL sampler %.60s differs\n", line), 1;
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : GT_FIXTURE_DIR "/torch_sampler.txt";
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("SKIP: %s absent; generate it with fixtures/make_sampler_fixture.py\n", path);
        return 77;
    }
    static char line[1 << 20];
    static int64_t want[MAX_IDX], got[MAX_IDX];
    int failures = 0, checked = 0;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "randperm ", 9) == 0)
            failures += check_randperm(line, want, got), checked++;
        else if (strncmp(line, "sampler ", 8) == 0)
            failures += check_sampler(line, want, got), checked++;
    }
    fclose(f);
    printf("%d fixture lines checked, %d failed\n", checked, failures);
    return failures || checked == 0 ? 1 : 0;
}

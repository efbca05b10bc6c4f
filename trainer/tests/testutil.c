/* testutil.c: see testutil.h. Ranks run as forked children so that each has its own process
 * state, as real ranks do, and a crash in one shows up as its exit status. */
#include "testutil.h"

#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

void tu_mkdtemp(char *dir, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, len, "%s/gt-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir))
        abort();
}

void tu_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void be32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)(v >> 24);
    b[1] = (uint8_t)(v >> 16);
    b[2] = (uint8_t)(v >> 8);
    b[3] = (uint8_t)v;
}

int tu_write_idx(const char *path, int gz, const uint32_t *dims, int ndim, const uint8_t *data)
{
    size_t hlen = 4 + 4 * (size_t)ndim, n = 1;
    uint8_t hdr[4 + 4 * 8] = {0, 0, 0x08, (uint8_t)ndim};
    for (int i = 0; i < ndim; i++) {
        be32(hdr + 4 + 4 * i, dims[i]);
        n *= dims[i];
    }
    if (!gz) {
        FILE *f = fopen(path, "wb");
        int ok = f && fwrite(hdr, 1, hlen, f) == hlen && fwrite(data, 1, n, f) == n;
        return (f && fclose(f) == 0 && ok) ? 0 : -1;
    }
    gzFile g = gzopen(path, "wb");
    if (!g)
        return -1;
    int ok =
        gzwrite(g, hdr, (unsigned)hlen) == (int)hlen && gzwrite(g, data, (unsigned)n) == (int)n;
    return gzclose(g) == Z_OK && ok ? 0 : -1;
}

int tu_write_raw(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(data, 1, n, f) == n;
    return (f && fclose(f) == 0 && ok) ? 0 : -1;
}

/* A tiny xorshift: the synthetic data only needs to be fixed and noisy. */
static uint32_t xs(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static int write_split(const char *dir, const char *prefix, int count, int side, int nclasses,
                       uint32_t *seed)
{
    size_t px = (size_t)side * side;
    uint8_t *img = malloc((size_t)count * px), *lab = malloc((size_t)count);
    if (!img || !lab) {
        free(img);
        free(lab);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        int y = (int)(xs(seed) % (uint32_t)nclasses);
        lab[i] = (uint8_t)y;
        for (size_t p = 0; p < px; p++) {
            int row = (int)(p / (size_t)side);
            int on = row % nclasses == y;
            img[(size_t)i * px + p] = (uint8_t)((on ? 140 : 0) + xs(seed) % 110);
        }
    }
    char path[4096];
    uint32_t idims[3] = {(uint32_t)count, (uint32_t)side, (uint32_t)side};
    uint32_t ldims[1] = {(uint32_t)count};
    snprintf(path, sizeof(path), "%s/%s-images-idx3-ubyte.gz", dir, prefix);
    int rc = tu_write_idx(path, 1, idims, 3, img);
    snprintf(path, sizeof(path), "%s/%s-labels-idx1-ubyte", dir, prefix);
    rc = rc ? rc : tu_write_idx(path, 0, ldims, 1, lab);
    free(img);
    free(lab);
    return rc;
}

int tu_write_synthetic(const char *dir, int ntrain, int ntest, int side, int nclasses,
                       uint32_t seed)
{
    uint32_t s = seed ? seed : 1;
    if (write_split(dir, "train", ntrain, side, nclasses, &s) != 0)
        return -1;
    return write_split(dir, "t10k", ntest, side, nclasses, &s);
}

int tu_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        abort();
    close(fd);
    return ntohs(sa.sin_port);
}

int tu_run_ranks(const gt_config *c, int world, int port,
                 void (*rank_cfg)(gt_config *c, int rank, void *arg), void *arg,
                 const char *err_dir)
{
    pid_t pids[16];
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            abort();
        if (pids[r] > 0)
            continue;
        gt_config mine = *c;
        mine.dist.rank = r;
        mine.dist.world = world;
        mine.dist.local_rank = r;
        mine.dist.port = port;
        snprintf(mine.dist.host, sizeof(mine.dist.host), "127.0.0.1");
        mine.dist.source = "forked test ranks";
        if (rank_cfg)
            rank_cfg(&mine, r, arg);
        gt_err err = {{0}};
        int rc = gt_train_run(&mine, &err);
        if (rc != 0) {
            fprintf(stderr, "[test rank %d] %s\n", r, err.msg);
            char path[4096];
            snprintf(path, sizeof(path), "%s/rank%d.err", err_dir ? err_dir : "", r);
            if (err_dir)
                tu_write_raw(path, err.msg, strlen(err.msg));
        }
        fflush(NULL);
        _exit(rc == 0 ? 0 : 1);
    }
    int failed = 0;
    for (int r = 0; r < world; r++) {
        int st = 0;
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
    }
    return failed;
}

void *tu_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(len > 0 ? (size_t)len : 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = buf ? (size_t)len : 0;
    return buf;
}

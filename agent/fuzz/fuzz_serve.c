/* libFuzzer target over the agent's frame parser and request dispatch (serve.c) against a
 * temporary root that contains symlinks pointing outside it. Each input is one session; after
 * each, the target aborts if anything appeared outside the root or a descriptor leaked.
 * Built and run by run_fuzz.sh; with -DGA_FUZZ_SEEDS it is instead a program that writes a
 * seed corpus of valid requests into the directory given as argv[1]. */
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs.h"
#include "proto/sync.h"
#include "serve.h"

#ifdef GA_FUZZ_SEEDS
/* Writes one seed file holding the frames in b, after the selector byte (0: prepend HELLO; 2:
 * prepend a HELLO that offers zstd). */
static void seed_as(const char *dir, int n, struct gs_proto_buf *b, int selector)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/seed-%02d", dir, n);
    FILE *f = fopen(p, "wb");
    if (f) {
        fputc(selector, f);
        fwrite(b->data, 1, b->len, f);
        fclose(f);
    }
    b->len = 0;
}

static void seed(const char *dir, int n, struct gs_proto_buf *b)
{
    seed_as(dir, n, b, 0);
}

/* Seeds whose requests come packed in a ZFRAMES (v6): compressible PUTs, so packing pays. */
static int zframes_seeds(const char *dir, int n)
{
    struct gs_zframes *z = gs_zframes_new(1);
    struct gs_proto_buf plain, b;
    char text[2048];
    if (!z)
        return n; /* built without zstd: nothing to seed */
    memset(text, 'x', sizeof(text));
    gs_proto_buf_init(&plain);
    gs_proto_buf_init(&b);
    for (int i = 0; i < 2; i++) {
        struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = (uint32_t)(10 + i)};
        m.path = gs_proto_cstr(i ? "d/e/f" : "a");
        m.data = (struct gs_proto_str){text, sizeof(text)};
        m.meta.mode = 0644;
        gs_proto_encode(&plain, &m);
    }
    gs_zframes_pack(z, GS_MSG_ZFRAMES, plain.data, plain.len, &b);
    seed_as(dir, n++, &b, 2);
    gs_proto_buf_release(&plain);
    gs_proto_buf_release(&b);
    gs_zframes_free(z);
    return n;
}

/* A PUT of "data" then a PUT_DELTA that applies to it ("data!"): a seed that reaches the patch
 * job, so mutations explore librsync's delta commands, not only the frame's fields. */
static int delta_seed(const char *dir, int n)
{
    static const uint8_t delta[] = {'r',  's', 0x02, '6', /* RS_DELTA_MAGIC */
                                    0x45, 0,   4,         /* COPY pos 0, len 4 */
                                    0x41, 1,   '!',       /* LITERAL 1 byte */
                                    0};                   /* END */
    struct gs_proto_buf b;
    struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = 2};
    gs_proto_buf_init(&b);
    m.path = gs_proto_cstr("a");
    m.data = gs_proto_cstr("data");
    m.meta.mode = 0644;
    gs_proto_encode(&b, &m);
    m.type = GS_MSG_PUT_DELTA, m.id = 3, m.expect.kind = GS_EXPECT_HASH;
    ga_fs_hash_mem("data", 4, m.expect.hash);
    ga_fs_hash_mem("data!", 5, m.hash);
    m.data = (struct gs_proto_str){(const char *)delta, sizeof(delta)};
    gs_proto_encode(&b, &m);
    seed(dir, n++, &b);
    gs_proto_buf_release(&b);
    return n;
}

/* A PUT, then CHECKs that keep beliefs about it and paths around it (v9): seeds that reach the
 * kept set's merge and the examination, symlinks that leave the root included. */
static int check_seed(const char *dir, int n)
{
    static const char *const paths[] = {"a", "abs/y", "d/e/f", "lnk", "out/x"}; /* ascending */
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = 2};
    m.path = gs_proto_cstr("a");
    m.data = gs_proto_cstr("data");
    m.meta.mode = 0644;
    gs_proto_encode(&b, &m);
    for (uint32_t flags = 0; flags < 4; flags++) {
        size_t mark;
        gs_proto_list_begin(&b, GS_MSG_CHECK, 3 + flags, flags, &mark);
        for (size_t i = flags; i < sizeof(paths) / sizeof(paths[0]); i++) {
            struct gs_proto_entry e = {.path = gs_proto_cstr(paths[i]),
                                       .kind = (uint8_t)(i % 4),
                                       .meta = {.mode = 0644},
                                       .size = 4,
                                       .link = gs_proto_cstr(i == 3 ? "/etc" : "")};
            gs_proto_list_add(&b, mark, GS_PROTO_MAX_PAYLOAD, &e);
        }
        gs_proto_list_end(&b, mark);
    }
    seed(dir, n++, &b);
    gs_proto_buf_release(&b);
    return n;
}

/* A PUT, then v10 CHMODs carrying an mtime (one before 1970) and a hash: the content's, which
 * stamps it, another, which is ESTALE, and a mode the agent cannot read back. */
static int stamp_seed(const char *dir, int n)
{
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    struct gs_proto_msg m = {.type = GS_MSG_PUT, .id = 2};
    m.path = gs_proto_cstr("a");
    m.data = gs_proto_cstr("data");
    m.meta.mode = 0644;
    gs_proto_encode(&b, &m);
    static const int64_t secs[] = {1700000000, -1, 0};
    static const uint32_t modes[] = {0755, 0644, 0200};
    for (uint32_t i = 0; i < 3; i++) {
        struct gs_proto_msg c = {.type = GS_MSG_CHMOD, .id = 3 + i, .has_hash = 1};
        c.path = gs_proto_cstr("a");
        c.meta = (struct gs_proto_meta){modes[i], secs[i], 999999999u - i};
        ga_fs_hash_mem(i == 1 ? "other" : "data", i == 1 ? 5 : 4, c.hash);
        gs_proto_encode(&b, &c);
    }
    seed(dir, n++, &b);
    gs_proto_buf_release(&b);
    return n;
}

int main(int argc, char **argv)
{
    struct gs_proto_buf b;
    struct gs_proto_msg m;
    const char *paths[] = {"a", "d/e/f", "out/x", "abs/y", "../z", "lnk"};
    uint8_t types[] = {GS_MSG_PUT,     GS_MSG_MKDIR, GS_MSG_DELETE,    GS_MSG_RENAME,
                       GS_MSG_SYMLINK, GS_MSG_CHMOD, GS_MSG_STAT,      GS_MSG_HASH,
                       GS_MSG_GET,     GS_MSG_LIST,  GS_MSG_PUT_BEGIN, GS_MSG_PUT_DELTA};
    int n = 0;
    if (argc < 2)
        return 2;
    gs_proto_buf_init(&b);
    for (size_t t = 0; t < sizeof(types); t++) {
        for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
            memset(&m, 0, sizeof(m));
            m.type = types[t];
            m.id = (uint32_t)(n + 2);
            m.path = gs_proto_cstr(paths[i]);
            m.path2 = gs_proto_cstr(paths[(i + 1) % 6]);
            m.data = gs_proto_cstr("data");
            m.meta.mode = 0644;
            m.expect.kind = (uint8_t)(i % 4); /* FORCE, ABSENT, HASH, DIR */
            m.flags = (uint32_t)(i & 1);
            gs_proto_encode(&b, &m);
            if (types[t] == GS_MSG_PUT_BEGIN) {
                m.type = GS_MSG_PUT_DATA;
                gs_proto_encode(&b, &m);
                m.type = GS_MSG_PUT_END;
                gs_proto_encode(&b, &m);
            }
            seed(argv[1], n++, &b);
        }
    }
    n = delta_seed(argv[1], n);
    n = check_seed(argv[1], n);
    n = stamp_seed(argv[1], n);
    zframes_seeds(argv[1], n);
    gs_proto_buf_release(&b);
    return 0;
}
#else

static char base[4096], root[4200], outside[4200];

/* Appends a HELLO frame of the current version (offering zstd if asked: then ZFRAMES frames are
 * unpacked and their frames served). */
static void hello(struct gs_proto_buf *b, int zstd)
{
    struct gs_proto_msg m = {0};
    m.type = GS_MSG_HELLO;
    m.id = 1;
    m.magic = GS_PROTO_MAGIC;
    m.version = GS_PROTO_VERSION;
    m.flags = (zstd ? GS_HELLO_ZSTD : 0) | GS_HELLO_DELTA; /* PUT_DELTA reaches librsync */
    gs_proto_encode(b, &m);
}

/* Open descriptors of this process (entries of /proc/self/fd, counting the one that reads it). */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        abort();
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int discard(void *ctx, const uint8_t *p, size_t n)
{
    (void)ctx, (void)p, (void)n;
    return 0;
}

/* Recreates the root's fixtures: a file, a directory, and symlinks leading outside. */
static void reset_root(void)
{
    char p[4300];
    int fd = open(base, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        abort();
    if (ga_fs_remove_tree(fd, "root") < 0 && access(root, F_OK) == 0) {
        /* An input may have chmod'ed a directory to 0: make it removable, then retry. */
        snprintf(p, sizeof(p), "chmod -R u+rwx '%s'", root);
        if (system(p) != 0 || ga_fs_remove_tree(fd, "root") < 0)
            abort();
    }
    close(fd);
    if (mkdir(root, 0755) < 0)
        abort();
    snprintf(p, sizeof(p), "%s/a", root);
    FILE *f = fopen(p, "w");
    if (!f)
        abort();
    fputs("a", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/d", root);
    mkdir(p, 0755);
    snprintf(p, sizeof(p), "%s/out", root);
    if (symlink("../outside", p) < 0)
        abort();
    snprintf(p, sizeof(p), "%s/abs", root);
    if (symlink(outside, p) < 0)
        abort();
    snprintf(p, sizeof(p), "%s/lnk", root);
    if (symlink("../outside/victim", p) < 0)
        abort();
}

/* Aborts unless outside/ holds exactly its one untouched file. */
static void check_outside(void)
{
    char p[4300];
    struct stat st;
    DIR *d = opendir(outside);
    int n = 0;
    if (!d)
        abort();
    while (readdir(d))
        n++;
    closedir(d);
    snprintf(p, sizeof(p), "%s/victim", outside);
    if (n != 3 || stat(p, &st) < 0 || st.st_size != 7 || (st.st_mode & 07777) != 0600)
        abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *dir = getenv("GS_FUZZ_DIR");
    snprintf(base, sizeof(base), "%s", dir ? dir : "/tmp");
    snprintf(root, sizeof(root), "%s/root", base);
    snprintf(outside, sizeof(outside), "%s/outside", base);
    mkdir(outside, 0755);
    char p[4300];
    snprintf(p, sizeof(p), "%s/victim", outside);
    FILE *f = fopen(p, "w");
    if (!f)
        abort();
    fputs("secret!", f); /* 7 bytes, mode 0600: what check_outside expects */
    fclose(f);
    chmod(p, 0600);
    reset_root();
    return 0;
}

/* Decodes every frame of the input as the client would (replies included, LIST entries
 * walked), so the client's side of the codec is fuzzed too. */
static void decode_all(const uint8_t *p, size_t n)
{
    struct gs_proto_frame f;
    struct gs_proto_msg m;
    struct gs_proto_entry e;
    long len;
    while (n > 0 && (len = gs_proto_parse_frame(p, n, &f)) > 0) {
        if (gs_proto_decode(&f, &m) == 0 &&
            (m.type == GS_MSG_LIST_ENTRIES || m.type == GS_MSG_CHECK)) {
            size_t pos = 0;
            while (gs_proto_list_next(&m, &pos, &e) == 1)
                ;
        }
        p += len;
        n -= (size_t)len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 0 && (data[0] & 3) == 3) {
        decode_all(data + 1, size - 1);
        return 0;
    }
    struct ga_serve s;
    char err[256];
    /* Counted around this one session, not once at start: libFuzzer opens descriptors of its own
     * between inputs (its symbolizer helper's pipes, once it prints a PC), which are no leak. */
    int fds_before = count_fds();
    if (ga_serve_init(&s, root, 1, discard, NULL, err, sizeof(err)) < 0)
        abort();
    struct gs_proto_buf in;
    gs_proto_buf_init(&in);
    /* The first byte picks the mode: even = a valid HELLO first, so requests are reached (with
     * bit 1, one that offers zstd, so ZFRAMES are unpacked); 3 mod 4 = decode only (above). */
    if (size > 0 && (data[0] & 1) == 0)
        hello(&in, data[0] & 2);
    if (size > 1 && gs_proto_buf_reserve(&in, size - 1) == 0) {
        memcpy(in.data + in.len, data + 1, size - 1);
        in.len += size - 1;
    }
    ga_serve_feed(&s, in.data, in.len);
    gs_proto_buf_release(&in);
    ga_serve_release(&s);
    check_outside();
    if (count_fds() != fds_before)
        abort(); /* a descriptor leaked */
    reset_root();
    return 0;
}
#endif

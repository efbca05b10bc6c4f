/* tests/unit/test_verify.c: syncd/verify's copy of the index kept between checks (the watch
 * daemon's, at every flush). Two real SQLite indexes take the same random writes (puts, deletes,
 * subtrees, renames, stat refreshes, rolled-back transactions, another connection's writes,
 * clears, a move to another file); one is checked through a copy kept across rounds, the other
 * read whole each time. Each round both must ask the server about the same beliefs and, given
 * the same answer (some paths gone or changed there), end with the same entries. The transport
 * is a stub that records what it is asked and answers as told: nothing here crosses SSH (the
 * agent's side of a check is tested in test_agent_serve and test_agent_client). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "syncd/index.h"
#include "syncd/verify.h"

#define REMOTE "root@gpu.example:2222:/root/proj"
#define ROUNDS 400

/* A transport that records the beliefs it is asked about and answers from `answer`. */
struct stub {
    struct gs_fileops ops;
    struct gs_buf asked;     /* the beliefs, one line each */
    struct gs_fop_belief *b; /* and as sent (their strings not kept) */
    size_t n;
    unsigned answer_seed; /* which paths the "server" lost or changed */
};

static int stub_check_send(struct gs_fileops *ops, const struct gs_fop_belief *b, size_t n,
                           struct gs_error *err)
{
    (void)err;
    struct stub *s = (struct stub *)ops;
    gs_buf_reset(&s->asked);
    for (size_t i = 0; i < n; i++)
        gs_buf_addf(&s->asked, "%s %d %o %llu %lld %s\n", b[i].path, (int)b[i].kind, b[i].mode,
                    (unsigned long long)b[i].size, (long long)b[i].mtime_ns,
                    b[i].link ? b[i].link : "-");
    s->n = n;
    free(s->b);
    s->b = calloc(n ? n : 1, sizeof(*b));
    memcpy(s->b, b, n * sizeof(*b));
    return 0;
}

/* Every 7th path (from a seed-chosen start) is gone there, every 11th has another size, every
 * 13th only another mode. */
static int stub_check_wait(struct gs_fileops *ops, struct gs_fop_stat *out, struct gs_error *err)
{
    (void)err;
    struct stub *s = (struct stub *)ops;
    for (size_t i = 0; i < s->n; i++) {
        out[i] = (struct gs_fop_stat){.kind = GS_FOP_KIND_UNKNOWN};
        if ((i + s->answer_seed) % 7 == 0)
            out[i].kind = GS_FOP_KIND_NONE;
        else if ((i + s->answer_seed) % 11 == 0)
            out[i] = (struct gs_fop_stat){.kind = GS_FOP_KIND_FILE, .mode = 0600, .size = 99};
        else if ((i + s->answer_seed) % 13 == 0 && s->b[i].kind != GS_FOP_KIND_SYMLINK)
            out[i] = (struct gs_fop_stat){.kind = s->b[i].kind,
                                          .mode = 0600,
                                          .size = s->b[i].size,
                                          .mtime_ns = s->b[i].mtime_ns};
    }
    return 0;
}

static void stub_init(struct stub *s)
{
    memset(s, 0, sizeof(*s));
    s->ops.check_send = stub_check_send;
    s->ops.check_wait = stub_check_wait;
    gs_buf_init(&s->asked);
}

struct fx {
    char dir[64];
    char path[2][128];
    struct gs_index *idx[2]; /* [0] checked through the copy, [1] read whole */
    struct gs_index *other;  /* another connection to [0]'s file */
    struct gs_verify_copy *copy;
    unsigned seed;
    size_t asked; /* beliefs asked about, all rounds */
};

static struct gs_index *open_at(const char *path)
{
    struct gs_index *idx = NULL;
    struct gs_error err = {0};
    if (gs_index_open(&idx, path, REMOTE, &err) != 0)
        fail_msg("open %s: %s", path, err.msg);
    return idx;
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    strcpy(f->dir, "/tmp/gs-test-verify-XXXXXX");
    if (!f || !mkdtemp(f->dir))
        return -1;
    for (int i = 0; i < 2; i++) {
        snprintf(f->path[i], sizeof(f->path[i]), "%s/index%d.db", f->dir, i);
        f->idx[i] = open_at(f->path[i]);
    }
    f->other = open_at(f->path[0]);
    f->copy = gs_verify_copy_new();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    gs_verify_copy_free(f->copy);
    gs_index_close(f->other);
    for (int i = 0; i < 2; i++)
        gs_index_close(f->idx[i]);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

/* Paths that share prefixes the way subtrees do not: "a-b" sorts between "a" and "a/x". */
static const char *const paths[] = {"a", "a-b", "a/b",   "a/b/c", "a/b/d", "a/x", "a.txt",
                                    "b", "b/a", "b/a/z", "c",     "c/d",   "d",   "e"};
#define N_PATHS (sizeof(paths) / sizeof(paths[0]))

static unsigned next(struct fx *f)
{
    f->seed = f->seed * 1103515245u + 12345u;
    return (f->seed >> 16) & 0x7fff;
}

static struct gs_index_entry entry(const char *path, unsigned r)
{
    struct gs_index_entry e = {.path = (char *)path,
                               .mode = 0644,
                               .size = r % 50,
                               .mtime_ns = (int64_t)(r % 9) * 1000000000LL};
    e.kind = r % 5 == 0 ? GS_KIND_DIR : r % 5 == 1 ? GS_KIND_SYMLINK : GS_KIND_FILE;
    if (e.kind == GS_KIND_SYMLINK)
        e.link = r % 2 ? "target" : "../elsewhere";
    if (e.kind == GS_KIND_FILE) {
        e.has_hash = 1;
        memset(e.hash.b, (int)(r & 0xff), GS_HASH_LEN);
        e.has_local = 1;
        e.local_size = r;
        e.local_mtime_ns = r * 3;
    }
    return e;
}

/* One random write, the same to both indexes (through `other` for [0], at times). */
static void random_write(struct fx *f)
{
    unsigned r = next(f), op = r % 16, clear = next(f) % 4 == 0;
    const char *p = paths[next(f) % N_PATHS], *q = paths[next(f) % N_PATHS];
    struct gs_index_entry e = entry(p, next(f));
    int via_other = op == 15;
    for (int i = 0; i < 2; i++) {
        struct gs_index *idx = via_other && i == 0 ? f->other : f->idx[i];
        if (op < 6 || via_other)
            assert_int_equal(gs_index_put(idx, &e, NULL), 0);
        else if (op < 8)
            assert_int_equal(gs_index_delete(idx, p, NULL), 0);
        else if (op < 9)
            assert_int_equal(gs_index_delete_subtree(idx, p, NULL), 0);
        else if (op < 10)
            gs_index_rename(idx, p, q, NULL); /* refused when one lies in the other */
        else if (op < 12)
            assert_int_equal(gs_index_set_local(idx, p, r, r * 7, r, r * 3, NULL), 0);
        else if (op < 13) { /* written, then rolled back */
            assert_int_equal(gs_index_begin(idx, NULL), 0);
            assert_int_equal(gs_index_delete_subtree(idx, p, NULL), 0);
            assert_int_equal(gs_index_put(idx, &e, NULL), 0);
            assert_int_equal(gs_index_rollback(idx, NULL), 0);
        } else if (op < 14 && clear) {
            assert_int_equal(gs_index_clear(idx, NULL), 0);
        }
    }
}

/* Every entry of `idx`, one line each. */
static int dump_one(const struct gs_index_entry *e, void *ctx)
{
    gs_buf_addf(ctx, "%s %d %o %llu %lld %d %02x %s %d %llu %lld %llu\n", e->path, (int)e->kind,
                e->mode, (unsigned long long)e->size, (long long)e->mtime_ns, e->has_hash,
                e->hash.b[0], e->link ? e->link : "-", e->has_local,
                (unsigned long long)e->local_size, (long long)e->local_mtime_ns,
                (unsigned long long)e->local_ino);
    return 0;
}

static void dump(struct gs_index *idx, struct gs_buf *out)
{
    gs_buf_reset(out);
    assert_int_equal(gs_index_foreach(idx, NULL, dump_one, out, NULL), 0);
}

/* One check of each index with the same answer; what was asked and what the indexes hold after
 * must be the same. */
static void check_both(struct fx *f, unsigned answer_seed, int abandon)
{
    struct stub s[2];
    for (int i = 0; i < 2; i++) {
        stub_init(&s[i]);
        s[i].answer_seed = answer_seed;
        struct gs_verify *v = NULL;
        struct gs_verify_result res;
        struct gs_error err = {0};
        if (gs_verify_prepare(f->idx[i], i == 0 ? f->copy : NULL, &v, &err) != 0)
            fail_msg("prepare: %s", err.msg);
        assert_int_equal(gs_verify_send(v, &s[i].ops, &err), 0);
        if (abandon)
            gs_verify_abandon(v);
        else
            assert_int_equal(gs_verify_finish(v, &s[i].ops, NULL, &res, &err), 0);
    }
    assert_string_equal(s[0].asked.data ? s[0].asked.data : "",
                        s[1].asked.data ? s[1].asked.data : "");
    struct gs_buf a = GS_BUF_INIT, b = GS_BUF_INIT;
    dump(f->idx[0], &a);
    dump(f->idx[1], &b);
    assert_string_equal(a.data ? a.data : "", b.data ? b.data : "");
    f->asked += s[0].n;
    gs_buf_release(&a);
    gs_buf_release(&b);
    for (int i = 0; i < 2; i++) {
        gs_buf_release(&s[i].asked);
        free(s[i].b);
    }
}

static void test_verify__a_kept_copy_asks_what_a_fresh_read_asks(void **state)
{
    struct fx *f = *state;
    f->seed = 20261127;
    for (int round = 0; round < ROUNDS; round++) {
        int writes = (int)(next(f) % 6);
        for (int w = 0; w < writes; w++)
            random_write(f);
        if (round == ROUNDS / 2) { /* the copy's index moves to another file (verify.h) */
            char moved[160];
            snprintf(moved, sizeof(moved), "%s/moved.db", f->dir);
            assert_int_equal(gs_index_move(f->idx[0], moved, NULL), 0);
            gs_index_close(f->other);
            f->other = open_at(moved);
        }
        /* a quiet check answers "all as believed" now and then, so entries accumulate */
        unsigned answer = round % 3 == 0 ? next(f) : 1000003u;
        check_both(f, answer == 1000003u ? 5 : answer, round % 10 == 9);
    }
    assert_true(f->asked > 2 * ROUNDS); /* the rounds asked about something */
}

/* The copy follows a new index handle (the daemon reopens its index after .gpusync/ was removed):
 * after a reset it reads the new one whole. */
static void test_verify__a_reset_copy_reads_a_new_index_whole(void **state)
{
    struct fx *f = *state;
    f->seed = 7;
    for (int w = 0; w < 30; w++)
        random_write(f);
    check_both(f, 3, 0);
    gs_verify_copy_reset(f->copy);
    gs_index_close(f->idx[0]);
    f->idx[0] = open_at(f->path[0]);
    for (int w = 0; w < 30; w++)
        random_write(f);
    check_both(f, 4, 0);
}

/* A stub server that lost one path: `lost` is gone there, everything else as believed. */
static const char *lost;

static int lost_check_wait(struct gs_fileops *ops, struct gs_fop_stat *out, struct gs_error *err)
{
    (void)err;
    struct stub *s = (struct stub *)ops;
    for (size_t i = 0; i < s->n; i++)
        out[i] = (struct gs_fop_stat){
            .kind = strcmp(s->b[i].path, lost) == 0 ? GS_FOP_KIND_NONE : GS_FOP_KIND_UNKNOWN};
    return 0;
}

/* The watch daemon checks while a batch runs. The server lost a/f1 behind gpusync's back; the
 * check finds it gone, but meanwhile the batch renamed a to b (the agent renamed what the server
 * held, so b lacks f1 too). The finding cannot be applied at a/f1, which the index no longer
 * holds, and was dropped as if a sync had made it true: a flush then said up to date while the
 * server lacked b/f1 (faults.sh seed 1795799507). It is counted as moved, so that the daemon
 * checks again before it answers a flush. */
static void test_verify__a_finding_at_a_path_renamed_meanwhile_counts_as_moved(void **state)
{
    struct fx *f = *state;
    struct gs_index *idx = f->idx[1];
    struct gs_error err = {0};
    const char *files[] = {"a/f0", "a/f1", "a/f2"};
    for (int i = 0; i < 3; i++) {
        struct gs_index_entry e = entry(files[i], 7); /* a file */
        assert_int_equal(gs_index_put(idx, &e, NULL), 0);
    }
    struct stub s;
    stub_init(&s);
    s.ops.check_wait = lost_check_wait;
    lost = "a/f1";
    struct gs_verify *v = NULL;
    struct gs_verify_result res;
    assert_int_equal(gs_verify_prepare(idx, NULL, &v, &err), 0);
    assert_int_equal(gs_verify_send(v, &s.ops, &err), 0);
    assert_int_equal(gs_index_rename(idx, "a", "b", &err), 0); /* the batch, meanwhile */
    assert_int_equal(gs_verify_finish(v, &s.ops, NULL, &res, &err), 0);
    assert_int_equal(res.gone, 0);
    assert_int_equal(res.moved, 1);
    /* and checked again, it is found where it now is */
    lost = "b/f1";
    assert_int_equal(gs_verify_server(idx, &s.ops, NULL, &res, &err), 0);
    assert_int_equal(res.gone, 1);
    assert_int_equal(res.moved, 0);
    gs_buf_release(&s.asked);
    free(s.b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_verify__a_kept_copy_asks_what_a_fresh_read_asks, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_verify__a_reset_copy_reads_a_new_index_whole, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_verify__a_finding_at_a_path_renamed_meanwhile_counts_as_moved, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

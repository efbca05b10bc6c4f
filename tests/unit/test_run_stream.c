/* tests/unit/test_run_stream.c: the client's parser of `launch --follow` / `tail` output
 * (remote/runs.c): L frames deliver each byte once and in order, and a frame whose length or
 * rank cannot be true is garbage, never a read past the buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "remote/runs.h"

struct seen {
    char text[256];
    size_t len;
    int calls;
};

static void on_chunk(void *ctx, int rank, uint64_t off, const char *data, size_t len)
{
    struct seen *s = ctx;
    (void)rank, (void)off;
    assert_true(s->len + len < sizeof(s->text));
    memcpy(s->text + s->len, data, len);
    s->len += len;
    s->calls++;
}

static int feed(struct gs_tail_state *st, struct seen *s, const char *text)
{
    struct gs_run_stream p = {.st = st, .fn = on_chunk, .ctx = s};
    int rc = gs_run_stream_feed(&p, text, strlen(text));
    gs_run_stream_release(&p);
    return rc;
}

static void test_stream__frames_deliver_each_byte_once(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct seen s = {0};
    assert_int_equal(feed(st, &s, "L 0 0 6\nhello\nL 0 0 6\nhello\nL 0 6 4\nbye\nX 0 succeeded\n"),
                     0);
    assert_int_equal(s.calls, 2);
    assert_memory_equal(s.text, "hello\nbye\n", 10);
    assert_true(st->finished);
    free(st);
}

static void test_stream__lengths_that_cannot_be_true_are_garbage(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct seen s = {0};
    /* head + len wrapped to a small number: the old parser then read past its buffer */
    assert_int_equal(feed(st, &s, "L 0 0 18446744073709551615\nshort\n"), -1);
    assert_int_equal(feed(st, &s, "L 0 18446744073709551615 2\nab"), -1);
    assert_int_equal(feed(st, &s, "L 4096 0 2\nab"), -1);
    assert_int_equal(feed(st, &s, "L -1 0 2\nab"), -1);
    assert_int_equal(s.calls, 0);
    /* the largest rank per node is fine */
    assert_int_equal(feed(st, &s, "L 4095 0 2\nab"), 0);
    assert_int_equal(s.calls, 1);
    free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream__frames_deliver_each_byte_once),
        cmocka_unit_test(test_stream__lengths_that_cannot_be_true_are_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

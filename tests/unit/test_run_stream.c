/* tests/unit/test_run_stream.c: the client's parser of `launch --follow` / `tail` output
 * (remote/runs.c, lines of proto/run.h): L frames deliver each byte once and in order however the
 * stream is cut into reads, data bytes pass untouched, the started line names the agent, waiting
 * and gpus lines come before it (launch --wait, GPU reservations), the X line ends the run, and a
 * line that is no frame, or a frame whose length or rank cannot be true, is garbage, never a read
 * past the buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/buf.h"
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

/* ---- a transcript of everything the parser reports, in order ---- */

/* Appends "C RANK OFF LEN:" and the chunk's bytes, then '\n'. */
static void record_chunk(void *ctx, int rank, uint64_t off, const char *data, size_t len)
{
    struct gs_buf *log = ctx;
    gs_buf_addf(log, "C %d %llu %zu:", rank, (unsigned long long)off, len);
    gs_buf_add(log, data, len);
    gs_buf_addc(log, '\n');
}

/* Appends "S PID PORT AGENT GPUS", or "W TEXT" while the launch waits for GPUs. */
static void record_started(void *ctx, const struct gs_tail_state *st)
{
    if (!st->launched)
        gs_buf_addf(ctx, "W %s\n", st->waiting);
    else
        gs_buf_addf(ctx, "S %ld %d %s%s%s\n", st->pid, st->port, st->agent, st->gpus[0] ? " " : "",
                    st->gpus);
}

/* Feeds `len` bytes of `text` in pieces of at most `piece` bytes, the first one `first` bytes
 * long; appends the run's end ("X CODE STATE") to `log` if it was seen. Returns the last
 * gs_run_stream_feed result. */
static int feed_pieces(struct gs_tail_state *st, struct gs_buf *log, const char *text, size_t len,
                       size_t first, size_t piece)
{
    struct gs_run_stream p = {.st = st, .fn = record_chunk, .started = record_started, .ctx = log};
    int rc = 0;
    for (size_t at = 0, n = first; at < len && rc == 0; at += n, n = piece) {
        n = n < len - at ? n : len - at;
        rc = gs_run_stream_feed(&p, text + at, n);
    }
    if (st->finished)
        gs_buf_addf(log, "X %d %s\n", st->exit_code, st->state);
    gs_run_stream_release(&p);
    return rc;
}

/* Feeds a whole NUL-terminated stream to a fresh state; the transcript goes to `log`. */
static int feed_text(struct gs_tail_state *st, struct gs_buf *log, const char *text)
{
    return feed_pieces(st, log, text, strlen(text), strlen(text), strlen(text));
}

/* A follow of a two-rank run: an agent path with a space, data holding CR LF, a NUL, and bytes
 * that read like a frame header, then the end. */
static const char STREAM[] = "started r1 4242 29500 /opt/my tools/gpusync-agent\n"
                             "L 0 0 6\nhello\n"
                             "L 1 0 4\na\r\nb"
                             "L 0 6 9\nL 0 0 1\nx"
                             "L 1 4 3\n\0\nz"
                             "X 3 failed\n";
static const char TRANSCRIPT[] = "S 4242 29500 '/opt/my tools/gpusync-agent'\n"
                                 "C 0 0 6:hello\n\n"
                                 "C 1 0 4:a\r\nb\n"
                                 "C 0 6 9:L 0 0 1\nx\n"
                                 "C 1 4 3:\0\nz\n"
                                 "X 3 failed\n";

/* Feeds STREAM cut as asked and checks the transcript and the offsets it leaves. */
static void expect_stream_result(size_t first, size_t piece)
{
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    assert_int_equal(feed_pieces(st, &log, STREAM, sizeof(STREAM) - 1, first, piece), 0);
    if (log.len != sizeof(TRANSCRIPT) - 1 || memcmp(log.data, TRANSCRIPT, log.len) != 0)
        fail_msg("cut at %zu then every %zu bytes: got '%s'", first, piece, log.data);
    assert_int_equal(st->offset[0], 15);
    assert_int_equal(st->offset[1], 7);
    gs_buf_release(&log);
    free(st);
}

static void test_stream__any_cut_into_reads_gives_the_same_frames(void **state)
{
    (void)state;
    for (size_t at = 0; at <= sizeof(STREAM) - 1; at++)
        expect_stream_result(at, sizeof(STREAM));
    expect_stream_result(1, 1); /* one byte per read */
}

static void test_stream__a_frame_longer_than_what_arrived_waits_for_the_rest(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    struct gs_run_stream p = {.st = st, .fn = record_chunk, .ctx = &log};
    assert_int_equal(gs_run_stream_feed(&p, "L 0 0 10\nabc", 12), 0);
    assert_int_equal(log.len, 0);
    assert_int_equal(st->offset[0], 0);
    assert_int_equal(gs_run_stream_feed(&p, "defghij", 7), 0);
    assert_string_equal(log.data, "C 0 0 10:abcdefghij\n");
    assert_int_equal(st->offset[0], 10);
    /* the longest chunk a frame may announce waits too; one byte more is garbage */
    assert_int_equal(gs_run_stream_feed(&p, "L 0 10 16777216\nab", 18), 0);
    gs_run_stream_release(&p);
    assert_int_equal(feed_text(st, &log, "L 0 0 16777217\n"), -1);
    gs_buf_release(&log);
    free(st);
}

static void test_stream__lines_that_are_not_frames_are_garbage(void **state)
{
    (void)state;
    static const char *const garbage[] = {
        "hello\n",
        "\n",
        "L x 0 1\n",
        "L 0 0\n",
        "X\n",
        "X 0\n",
        "started r1 pid port /a\n",
        "started r1 1 2 /a\nstarted r2 3 4 /b\n", /* a second started line */
        "L 0 0 2\nabnot a frame\n",
        /* a short line must not borrow fields from the next one */
        "X 0\nL 0 0 1\nx\n",
        "L 0\n0 2\nab",
        "L 0 0 1 extra\nx",
        "X 0 succeeded now\n",
        "started r1 1\n2 /a\n",
        /* waiting and gpus lines belong before the started line, and a LIST is numbers */
        "started r1 1 2 /a\ngpus 1\n",
        "started r1 1 2 /a\nwaiting for GPU 1\n",
        "gpus 1;reboot\n",
        "gpus \n",
    };
    for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
        struct gs_tail_state *st = calloc(1, sizeof(*st));
        struct gs_buf log = GS_BUF_INIT;
        if (feed_text(st, &log, garbage[i]) != -1)
            fail_msg("'%s' was taken for frames: '%s'", garbage[i], log.data ? log.data : "");
        gs_buf_release(&log);
        free(st);
    }
}

static void test_stream__an_unfinished_line_is_not_judged_yet(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    assert_int_equal(feed_text(st, &log, "not a frame, but no line end yet"), 0);
    assert_int_equal(log.len, 0);
    gs_buf_release(&log);
    free(st);
}

static void test_stream__the_exit_line_ends_the_run_with_its_code_and_state(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    assert_int_equal(feed_text(st, &log, "X 0 succeeded\n"), 0);
    assert_true(st->finished);
    assert_int_equal(st->exit_code, 0);
    assert_string_equal(st->state, "succeeded");
    memset(st, 0, sizeof(*st));
    assert_int_equal(feed_text(st, &log, "X null lost\n"), 0);
    assert_true(st->finished);
    assert_int_equal(st->exit_code, -1); /* a lost run has no exit code */
    assert_string_equal(st->state, "lost");
    assert_string_equal(st->summary, "");
    /* the summary of how it ended: the rest of the line, kept whole */
    memset(st, 0, sizeof(*st));
    assert_int_equal(feed_text(st, &log, "X 137 failed {\"failed\":{\"rank\":1,\"s\":\"a b\"}}\n"),
                     0);
    assert_int_equal(st->exit_code, 137);
    assert_string_equal(st->state, "failed");
    assert_string_equal(st->summary, "{\"failed\":{\"rank\":1,\"s\":\"a b\"}}");
    gs_buf_release(&log);
    free(st);
}

static void test_stream__crlf_line_ends_are_line_ends(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    /* the data starts after the '\n', so the '\r' is not taken for a byte of the log */
    assert_int_equal(feed_text(st, &log, "L 0 0 3\r\nabcX 2 failed\r\n"), 0);
    assert_string_equal(log.data, "C 0 0 3:abc\nX 2 failed\n");
    assert_int_equal(st->offset[0], 3);
    gs_buf_release(&log);
    free(st);
}

static void test_stream__the_started_line_names_the_agent_as_a_shell_word(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    assert_int_equal(feed_text(st, &log, "started r1 7 29501 /home/a b/it's here/agent\n"), 0);
    assert_true(st->launched);
    assert_int_equal(st->pid, 7);
    assert_int_equal(st->port, 29501);
    assert_string_equal(st->agent, "'/home/a b/it'\\''s here/agent'");
    assert_string_equal(log.data, "S 7 29501 '/home/a b/it'\\''s here/agent'\n");
    /* an older agent prints no path: the client then names none */
    memset(st, 0, sizeof(*st));
    gs_buf_reset(&log);
    assert_int_equal(feed_text(st, &log, "started r1 7 29501\n"), 0);
    assert_true(st->launched);
    assert_string_equal(st->agent, "");
    gs_buf_release(&log);
    free(st);
}

/* launch --wait: each waiting line reaches the started callback (not yet launched), the gpus
 * line names the GPUs reserved, then the run starts as usual. */
static void test_stream__waiting_and_gpus_lines_come_before_the_started_line(void **state)
{
    (void)state;
    struct gs_tail_state *st = calloc(1, sizeof(*st));
    struct gs_buf log = GS_BUF_INIT;
    assert_int_equal(feed_pieces(st, &log,
                                 "waiting for GPU 1: GPU 1 held by run r0 in /p q\n"
                                 "waiting for GPU 1: GPU 1 held by run r9 in /x\n"
                                 "gpus 1,3\nstarted r1 7 29501 /a\nL 0 0 2\nok",
                                 135, 5, 7),
                     0);
    assert_string_equal(log.data, "W for GPU 1: GPU 1 held by run r0 in /p q\n"
                                  "W for GPU 1: GPU 1 held by run r9 in /x\n"
                                  "S 7 29501 '/a' 1,3\n"
                                  "C 0 0 2:ok\n");
    assert_string_equal(st->gpus, "1,3");
    gs_buf_release(&log);
    free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream__frames_deliver_each_byte_once),
        cmocka_unit_test(test_stream__lengths_that_cannot_be_true_are_garbage),
        cmocka_unit_test(test_stream__any_cut_into_reads_gives_the_same_frames),
        cmocka_unit_test(test_stream__a_frame_longer_than_what_arrived_waits_for_the_rest),
        cmocka_unit_test(test_stream__lines_that_are_not_frames_are_garbage),
        cmocka_unit_test(test_stream__an_unfinished_line_is_not_judged_yet),
        cmocka_unit_test(test_stream__the_exit_line_ends_the_run_with_its_code_and_state),
        cmocka_unit_test(test_stream__crlf_line_ends_are_line_ends),
        cmocka_unit_test(test_stream__the_started_line_names_the_agent_as_a_shell_word),
        cmocka_unit_test(test_stream__waiting_and_gpus_lines_come_before_the_started_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

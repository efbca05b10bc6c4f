/* Unit tests for the control socket's exec-stream frames (syncd/control.c): what the daemon's
 * relay sends after an "exec" request, parsed by the CLI. Complete, partial, garbage and oversized
 * input, as a slow or hostile peer could deliver it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "syncd/control.h"

static void test_control__frames_pop_in_order_with_binary_data(void **state)
{
    (void)state;
    struct gs_buf in = GS_BUF_INIT, data = GS_BUF_INIT;
    static const char stream[] = "o 5\na\0b\nce 3\nerrx 7\n";
    gs_buf_add(&in, stream, sizeof(stream) - 1);
    char kind;
    int status = -1;
    assert_int_equal(gs_control_frame_pop(&in, &kind, &data, &status), 1);
    assert_int_equal(kind, 'o');
    assert_int_equal(data.len, 5);
    assert_memory_equal(data.data, "a\0b\nc", 5);
    assert_int_equal(gs_control_frame_pop(&in, &kind, &data, &status), 1);
    assert_int_equal(kind, 'e');
    assert_memory_equal(data.data, "err", 3);
    assert_int_equal(gs_control_frame_pop(&in, &kind, &data, &status), 1);
    assert_int_equal(kind, 'x');
    assert_int_equal(status, 7);
    assert_int_equal(in.len, 0);
    assert_int_equal(gs_control_frame_pop(&in, &kind, &data, &status), 0);
    gs_buf_release(&in);
    gs_buf_release(&data);
}

/* Bytes that arrive one at a time make no frame until the frame is whole. */
static void test_control__a_frame_split_anywhere_waits_for_the_rest(void **state)
{
    (void)state;
    static const char stream[] = "o 4\nabcdx -1\n";
    struct gs_buf in = GS_BUF_INIT, data = GS_BUF_INIT;
    char kind;
    int status = 0, frames = 0;
    for (size_t i = 0; i < sizeof(stream) - 1; i++) {
        gs_buf_add(&in, stream + i, 1);
        int rc;
        while ((rc = gs_control_frame_pop(&in, &kind, &data, &status)) == 1) {
            frames++;
            if (kind == 'o')
                assert_memory_equal(data.data, "abcd", 4);
        }
        assert_int_equal(rc, 0);
        assert_int_equal(frames, i < 7 ? 0 : i < sizeof(stream) - 2 ? 1 : 2);
    }
    assert_int_equal(kind, 'x');
    assert_int_equal(status, -1);
    gs_buf_release(&in);
    gs_buf_release(&data);
}

static void test_control__garbage_and_oversized_frames_are_errors(void **state)
{
    (void)state;
    static const char *bad[] = {"q 3\nabc", "o x\n", "o 999999999999\n", "\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct gs_buf in = GS_BUF_INIT, data = GS_BUF_INIT;
        char kind;
        int status;
        gs_buf_adds(&in, bad[i]);
        assert_int_equal(gs_control_frame_pop(&in, &kind, &data, &status), -1);
        gs_buf_release(&in);
        gs_buf_release(&data);
    }
    /* A header line that never ends is garbage too, not a reason to buffer forever. */
    struct gs_buf in = GS_BUF_INIT, data = GS_BUF_INIT;
    char kind;
    int status;
    for (int i = 0; i < 100; i++)
        gs_buf_addc(&in, 'o');
    assert_int_equal(gs_control_frame_pop(&in, &kind, &data, &status), -1);
    gs_buf_release(&in);
    gs_buf_release(&data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control__frames_pop_in_order_with_binary_data),
        cmocka_unit_test(test_control__a_frame_split_anywhere_waits_for_the_rest),
        cmocka_unit_test(test_control__garbage_and_oversized_frames_are_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

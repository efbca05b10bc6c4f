/* test_sampler.c: mt19937 against the C++ standard's check value, torch.randperm's swap
 * shuffle on its defining properties, and DistributedSampler's layout (interleaved shards,
 * padding by wrap-around, drop_last) on hand-computed cases. The bit-exact comparison with
 * PyTorch's own output is test_sampler_fixture.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sampler.h"

static void test_mt19937__10000th_output_matches_the_cpp_standard(void **state)
{
    (void)state;
    gt_mt19937 mt;
    gt_mt_seed(&mt, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++)
        v = gt_mt_next(&mt);
    assert_int_equal(v, 4123659995u); /* [rand.predef]: mt19937 */
}

static void test_mt19937__seed_keeps_only_the_low_32_bits(void **state)
{
    (void)state;
    gt_mt19937 a, b;
    gt_mt_seed(&a, 5489);
    gt_mt_seed(&b, 5489 + (1ull << 32));
    for (int i = 0; i < 700; i++)
        assert_int_equal(gt_mt_next(&a), gt_mt_next(&b));
}

static void test_randperm__is_a_permutation_and_depends_on_the_seed(void **state)
{
    (void)state;
    enum { N = 1000 };
    int64_t a[N], b[N];
    int seen[N] = {0};
    gt_randperm(N, 42, a);
    gt_randperm(N, 43, b);
    for (int i = 0; i < N; i++) {
        assert_true(a[i] >= 0 && a[i] < N);
        seen[a[i]]++;
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    assert_memory_not_equal(a, b, sizeof(a));
    int64_t again[N];
    gt_randperm(N, 42, again);
    assert_memory_equal(a, again, sizeof(a));
}

static void test_randperm__first_swap_uses_first_draw_mod_n(void **state)
{
    (void)state;
    /* torch's small-n path: out[0] ends as the element at z = random() % n. */
    gt_mt19937 mt;
    gt_mt_seed(&mt, 7);
    uint32_t first = gt_mt_next(&mt);
    int64_t p[17];
    gt_randperm(17, 7, p);
    assert_int_equal(p[0], first % 17);
    int64_t one[1];
    gt_randperm(1, 7, one);
    assert_int_equal(one[0], 0);
}

static void test_randperm__large_n_path_is_inside_out_fisher_yates(void **state)
{
    (void)state;
    enum { N = 500 };
    int64_t p[N];
    int seen[N] = {0};
    gt_mt19937 mt, ref;
    gt_mt_seed(&mt, 11);
    gt_mt_seed(&ref, 11);
    gt_randperm_inside_out(N, &mt, p);
    for (int i = 0; i < N; i++)
        seen[p[i]]++;
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    /* Step 1 draws random64() % 2: 0 swaps the first two elements, 1 keeps them. */
    gt_mt_next64(&ref);
    uint64_t second = gt_mt_next64(&ref);
    int64_t q[2];
    gt_mt_seed(&mt, 11);
    gt_randperm_inside_out(2, &mt, q);
    assert_int_equal(q[1], second % 2 == 0 ? 0 : 1);
}

static void expect_shard(int64_t n, int W, int rank, bool drop, const int64_t *want,
                         const int64_t *want_pos, int64_t count)
{
    gt_sampler s;
    gt_err err = {{0}};
    assert_int_equal(gt_sampler_init(&s, n, W, rank, false, drop, 0, &err), 0);
    assert_int_equal(s.num_samples, count);
    int64_t got[64], pos[64];
    gt_sampler_indices(&s, 0, got, pos);
    assert_memory_equal(got, want, (size_t)count * sizeof(int64_t));
    if (want_pos)
        assert_memory_equal(pos, want_pos, (size_t)count * sizeof(int64_t));
}

static void test_sampler__pads_by_repeating_the_head(void **state)
{
    (void)state;
    /* DistributedSampler(range(10), 3, shuffle=False): [0..9, 0, 1], rank r takes r::3. */
    expect_shard(10, 3, 0, false, (int64_t[]){0, 3, 6, 9}, (int64_t[]){0, 3, 6, 9}, 4);
    expect_shard(10, 3, 1, false, (int64_t[]){1, 4, 7, 0}, (int64_t[]){1, 4, 7, 10}, 4);
    expect_shard(10, 3, 2, false, (int64_t[]){2, 5, 8, 1}, (int64_t[]){2, 5, 8, 11}, 4);
}

static void test_sampler__pads_more_than_the_dataset_by_repetition(void **state)
{
    (void)state;
    /* n=2 over 5 ranks: indices * ceil(3/2) -> [0,1,0,1,0]. */
    expect_shard(2, 5, 3, false, (int64_t[]){1}, (int64_t[]){3}, 1);
    expect_shard(2, 5, 4, false, (int64_t[]){0}, (int64_t[]){4}, 1);
}

static void test_sampler__drop_last_truncates_the_tail(void **state)
{
    (void)state;
    expect_shard(10, 3, 0, true, (int64_t[]){0, 3, 6}, NULL, 3);
    expect_shard(10, 3, 2, true, (int64_t[]){2, 5, 8}, NULL, 3);
    expect_shard(9, 3, 1, true, (int64_t[]){1, 4, 7}, NULL, 3);
}

static void test_sampler__shuffled_shards_interleave_the_epoch_permutation(void **state)
{
    (void)state;
    enum { N = 101, W = 4 };
    int64_t perm[N];
    gt_randperm(N, 5 + 3, perm); /* seed 5, epoch 3 */
    int counted[N] = {0};
    for (int r = 0; r < W; r++) {
        gt_sampler s;
        assert_int_equal(gt_sampler_init(&s, N, W, r, true, false, 5, NULL), 0);
        int64_t got[32], pos[32];
        gt_sampler_indices(&s, 3, got, pos);
        for (int64_t k = 0; k < s.num_samples; k++) {
            assert_int_equal(got[k], perm[(r + k * W) % N]);
            if (pos[k] < N)
                counted[got[k]]++;
        }
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(counted[i], 1); /* padding excluded, every sample exactly once */
}

static void test_sampler__rejects_bad_rank_and_tiny_dataset(void **state)
{
    (void)state;
    gt_sampler s;
    gt_err err = {{0}};
    assert_int_equal(gt_sampler_init(&s, 10, 2, 2, true, false, 0, &err), -1);
    assert_non_null(strstr(err.msg, "rank 2"));
    assert_int_equal(gt_sampler_init(&s, 1, 2, 0, true, true, 0, &err), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mt19937__10000th_output_matches_the_cpp_standard),
        cmocka_unit_test(test_mt19937__seed_keeps_only_the_low_32_bits),
        cmocka_unit_test(test_randperm__is_a_permutation_and_depends_on_the_seed),
        cmocka_unit_test(test_randperm__first_swap_uses_first_draw_mod_n),
        cmocka_unit_test(test_randperm__large_n_path_is_inside_out_fisher_yates),
        cmocka_unit_test(test_sampler__pads_by_repeating_the_head),
        cmocka_unit_test(test_sampler__pads_more_than_the_dataset_by_repetition),
        cmocka_unit_test(test_sampler__drop_last_truncates_the_tail),
        cmocka_unit_test(test_sampler__shuffled_shards_interleave_the_epoch_permutation),
        cmocka_unit_test(test_sampler__rejects_bad_rank_and_tiny_dataset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

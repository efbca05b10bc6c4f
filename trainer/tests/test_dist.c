/* test_dist.c: the TCP process group. Three forked ranks all-reduce and broadcast and check the
 * results; a missing rank makes the rendezvous time out with an error naming the rank; a peer
 * that dies mid-collective makes its neighbour fail promptly instead of hanging; the torchrun,
 * Slurm and --master settings are parsed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dist.h"
#include "testutil.h"

static gt_dist_config config(int rank, int world, int port, int rdzv_s, int timeout_s)
{
    gt_dist_config c;
    memset(&c, 0, sizeof(c));
    c.rank = rank;
    c.world = world;
    c.port = port;
    c.rdzv_timeout_s = rdzv_s;
    c.timeout_s = timeout_s;
    snprintf(c.host, sizeof(c.host), "127.0.0.1");
    return c;
}

/* Body of one rank of the collective test; returns the exit status. */
static int collective_rank(int rank, int world, int port)
{
    gt_dist d;
    gt_err err = {{0}};
    gt_dist_config c = config(rank, world, port, 20, 20);
    if (gt_dist_init(&d, &c, &err) != 0)
        return fprintf(stderr, "%s\n", err.msg), 10;
    enum { N = 100003 }; /* not a multiple of the world: uneven chunks */
    float *f = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        f[i] = (float)(rank + 1) * (float)(i % 1000);
    double g[3] = {rank + 0.5, 1.0, -2.0 * rank};
    int rc = gt_dist_allreduce_f32(&d, f, N, &err) || gt_dist_allreduce_f64(&d, g, 3, &err);
    float sumr = (float)(world * (world + 1) / 2);
    for (int i = 0; rc == 0 && i < N; i++)
        if (f[i] != sumr * (float)(i % 1000))
            rc = 11;
    double want0 = world * (world - 1) / 2.0 + 0.5 * world;
    if (rc == 0 && (g[0] != want0 || g[1] != world || g[2] != -(double)world * (world - 1)))
        rc = 12;
    char msg[16] = "";
    if (rank == 0)
        snprintf(msg, sizeof(msg), "from rank 0");
    if (rc == 0 && gt_dist_broadcast(&d, msg, sizeof(msg), &err) != 0)
        rc = 13;
    if (rc == 0 && strcmp(msg, "from rank 0") != 0)
        rc = 14;
    if (rc)
        fprintf(stderr, "rank %d: rc %d %s\n", rank, rc, err.msg);
    free(f);
    gt_dist_release(&d);
    return rc;
}

static void test_dist__three_ranks_allreduce_and_broadcast(void **state)
{
    (void)state;
    int port = tu_free_port();
    pid_t pids[3];
    for (int r = 0; r < 3; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(collective_rank(r, 3, port));
    }
    for (int r = 0; r < 3; r++) {
        int st = 0;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

static void test_dist__missing_rank_times_out_naming_the_rank(void **state)
{
    (void)state;
    gt_dist d;
    gt_err err = {{0}};
    gt_dist_config c = config(0, 2, tu_free_port(), 1, 1);
    time_t t0 = time(NULL);
    assert_int_equal(gt_dist_init(&d, &c, &err), -1);
    assert_true(time(NULL) - t0 <= 5);
    assert_non_null(strstr(err.msg, "rank 0: timed out waiting for 1 more rank(s)"));
    c = config(1, 2, tu_free_port(), 1, 1);
    assert_int_equal(gt_dist_init(&d, &c, &err), -1);
    assert_non_null(strstr(err.msg, "rank 1: cannot reach the rank 0 rendezvous"));
}

static void test_dist__dead_peer_fails_the_collective(void **state)
{
    (void)state;
    int port = tu_free_port();
    pid_t pid = fork();
    if (pid == 0) {
        gt_dist d;
        gt_dist_config c = config(1, 2, port, 20, 20);
        _exit(gt_dist_init(&d, &c, NULL) == 0 ? 0 : 1); /* joins, then exits at once */
    }
    gt_dist d;
    gt_err err = {{0}};
    gt_dist_config c = config(0, 2, port, 20, 30);
    assert_int_equal(gt_dist_init(&d, &c, &err), 0);
    float buf[1000] = {0};
    time_t t0 = time(NULL);
    assert_int_equal(gt_dist_allreduce_f32(&d, buf, 1000, &err), -1);
    assert_true(time(NULL) - t0 < 20); /* EOF, not the 30 s timeout */
    assert_non_null(strstr(err.msg, "rank 0:"));
    assert_non_null(strstr(err.msg, "rank 1"));
    gt_dist_release(&d);
    int st;
    waitpid(pid, &st, 0);
}

static void test_dist__config_from_torchrun_and_slurm_env(void **state)
{
    (void)state;
    gt_dist_config c;
    gt_err err = {{0}};
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.7", 1);
    setenv("MASTER_PORT", "29999", 1);
    assert_int_equal(gt_dist_config_from_env(&c, &err), 0);
    assert_int_equal(c.rank, 3);
    assert_int_equal(c.world, 8);
    assert_int_equal(c.local_rank, 1);
    assert_int_equal(c.port, 29999);
    assert_string_equal(c.host, "10.0.0.7");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("MASTER_ADDR");
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "6", 1);
    setenv("SLURM_LOCALID", "2", 1);
    setenv("SLURM_LAUNCH_NODE_IPADDR", "10.0.0.9", 1);
    assert_int_equal(gt_dist_config_from_env(&c, &err), 0);
    assert_int_equal(c.rank, 5);
    assert_int_equal(c.world, 6);
    assert_int_equal(c.local_rank, 2);
    assert_string_equal(c.host, "10.0.0.9");
    setenv("SLURM_NTASKS", "six", 1);
    assert_int_equal(gt_dist_config_from_env(&c, &err), -1);
    assert_non_null(strstr(err.msg, "SLURM_NTASKS=six"));
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
    unsetenv("SLURM_LOCALID");
    unsetenv("SLURM_LAUNCH_NODE_IPADDR");
    unsetenv("MASTER_PORT");
}

static void test_dist__master_flag_parses_host_and_port(void **state)
{
    (void)state;
    gt_dist_config c;
    memset(&c, 0, sizeof(c));
    assert_int_equal(gt_dist_parse_master(&c, "tcp://node1.example:1234", NULL), 0);
    assert_string_equal(c.host, "node1.example");
    assert_int_equal(c.port, 1234);
    assert_int_equal(gt_dist_parse_master(&c, "10.1.2.3:80", NULL), 0);
    assert_string_equal(c.host, "10.1.2.3");
    gt_err err = {{0}};
    assert_int_equal(gt_dist_parse_master(&c, "tcp://host", &err), -1);
    assert_int_equal(gt_dist_parse_master(&c, "tcp://host:99999", &err), -1);
    assert_non_null(strstr(err.msg, "bad port"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dist__three_ranks_allreduce_and_broadcast),
        cmocka_unit_test(test_dist__missing_rank_times_out_naming_the_rank),
        cmocka_unit_test(test_dist__dead_peer_fails_the_collective),
        cmocka_unit_test(test_dist__config_from_torchrun_and_slurm_env),
        cmocka_unit_test(test_dist__master_flag_parses_host_and_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

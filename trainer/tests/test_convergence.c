/* test_convergence.c: the default configuration (784-512-256-10, Adam lr 1e-3 with a cosine
 * schedule, batch 64 per rank, 10 epochs, seed 0) trained on two CPU ranks over loopback must
 * reach >= 0.885 test accuracy on Fashion-MNIST in the final epoch (the published MLP baseline
 * 256-128-100 reaches 0.8833). Skipped (77) when the dataset is not installed.
 * Arguments (all optional): DATA_DIR WORLD MODEL EPOCHS BAR, for the short low-bar runs of the
 * other models that CI adds (see tests/CMakeLists.txt); the full bars are
 * scripts/bench/trainer.sh --accuracy's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "train.h"

#ifndef GT_DEFAULT_DATA_DIR
#define GT_DEFAULT_DATA_DIR GT_DEFAULT_DATA
#endif

static double last_test_acc(const char *metrics, int *epochs)
{
    size_t n;
    char *text = tu_read_file(metrics, &n);
    if (!text)
        return -1;
    text = realloc(text, n + 1);
    text[n] = '\0';
    char *last = NULL, *p = text;
    *epochs = 0;
    while ((p = strstr(p, "\"test_acc\":")) != NULL) {
        last = p++;
        (*epochs)++;
    }
    double acc = last ? strtod(last + strlen("\"test_acc\":"), NULL) : -1;
    free(text);
    return acc;
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : GT_DEFAULT_DATA_DIR;
    int world = argc > 2 ? atoi(argv[2]) : 2;
    char probe[4096];
    struct stat st;
    snprintf(probe, sizeof(probe), "%s/train-images-idx3-ubyte.gz", data);
    if (stat(probe, &st) != 0) {
        snprintf(probe, sizeof(probe), "%s/train-images-idx3-ubyte", data);
        if (stat(probe, &st) != 0) {
            printf("SKIP: no Fashion-MNIST in %s\n", data);
            return 77;
        }
    }
    char dir[256], metrics[512];
    tu_mkdtemp(dir, sizeof(dir));
    snprintf(metrics, sizeof(metrics), "%s/metrics.jsonl", dir);
    gt_config c;
    gt_config_defaults(&c);
    c.data_dir = data;
    c.metrics = metrics;
    c.use_gpu = false;
    c.dist.rdzv_timeout_s = 60;
    c.dist.timeout_s = 120;
    const char *model = argc > 3 ? argv[3] : "mlp";
    c.model = strcmp(model, "lenet") == 0    ? GT_MODEL_LENET
              : strcmp(model, "resnet") == 0 ? GT_MODEL_RESNET
                                             : GT_MODEL_MLP;
    gt_config_model_defaults(&c); /* the model's own defaults, as --model gives them */
    if (argc > 4)
        c.epochs = atoi(argv[4]);
    double bar = argc > 5 ? atof(argv[5]) : 0.885;
    time_t t0 = time(NULL);
    int failed = tu_run_ranks(&c, world, tu_free_port(), NULL, NULL, NULL);
    int epochs = 0;
    double acc = last_test_acc(metrics, &epochs);
    printf("%s, %d CPU rank(s), %d epochs in %lld s: final test accuracy %.4f (need >= %.3f)\n",
           model, world, epochs, (long long)(time(NULL) - t0), acc, bar);
    unlink(metrics);
    rmdir(dir);
    return failed == 0 && epochs == c.epochs && acc >= bar ? 0 : 1;
}

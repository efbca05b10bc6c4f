/* main.c: gpusync-train's entry point: defaults, then the environment's rank settings, then
 * flags; the run itself lives in train.c. Exit status: 0 success, 1 failure, 2 usage error (a
 * --resume of a run with other settings included). */
#include <stdio.h>
#include <string.h>

#include "flags.h"
#include "train.h"

int main(int argc, char **argv)
{
    gt_config c;
    gt_err err = {{0}};
    gt_config_defaults(&c);
    if (gt_dist_config_from_env(&c.dist, &err) != 0) {
        fprintf(stderr, "gpusync-train: %s\n", err.msg);
        return 2;
    }
    const char *dev[] = {"--device", "auto"};
    gt_flags_parse(&c, 2, (char **)dev, NULL);
    int rc = gt_flags_parse(&c, argc - 1, argv + 1, &err);
    if (rc == 1) {
        gt_flags_usage(stdout);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "gpusync-train: %s\n", err.msg);
        return 2;
    }
    rc = gt_train_run(&c, &err);
    if (rc != 0) {
        fprintf(stderr, "gpusync-train: %s\n", err.msg);
        return rc == GT_TRAIN_USAGE ? 2 : 1;
    }
    return 0;
}

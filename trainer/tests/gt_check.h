/* trainer/tests/gt_check.h: CHECK for the trainer's GPU tests, which report a failure and return 1
 * from the test function rather than abort, so the other cases still run. */
#ifndef GT_CHECK_H
#define GT_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif

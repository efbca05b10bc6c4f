/* flags.h: gpusync-train's command line, declared once as a table that drives both parsing and
 * --help, so every flag is documented by construction. */
#ifndef GT_FLAGS_H
#define GT_FLAGS_H

#include <stdio.h>

#include "gt_err.h"
#include "train.h"

/* Applies argv (after the program name) over c, which holds the defaults and the environment's
 * distributed settings. Returns 0, 1 when --help was asked for, or -1 with a message in err. */
int gt_flags_parse(gt_config *c, int argc, char **argv, gt_err *err);
void gt_flags_usage(FILE *out);

#endif

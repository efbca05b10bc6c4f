/* remote/trainer_install.h: building the bundled trainer (gpusync-train) on a server. Its sources
 * travel as a tarball through an exec channel and are built there (cmake when present, with CUDA
 * and NCCL when found; otherwise the C compiler directly, CPU only), cached per content hash in
 * ~/.gpusync/trainer-<hash>. */
#ifndef GS_TRAINER_INSTALL_H
#define GS_TRAINER_INSTALL_H

#include "common/buf.h"
#include "common/error.h"
#include "remote/ssh.h"

/* Makes sure the trainer is built on the server and appends its path (a shell word) to `path`.
 * Sets *how to "cached" or "built". A build writes a line per step ("gpusync: trainer build:
 * compiling (8 jobs)...") to progress_fd (-1: nowhere). On a failed build returns GS_E_REMOTE
 * with the build log's tail and the command that reproduces it in the message. */
int gs_trainer_install(struct gs_ssh *ssh, struct gs_buf *path, const char **how, int progress_fd,
                       struct gs_error *err);

/* Where this build of the trainer lives on a server (appended to `path`, a shell word) and a
 * command that prints "present" when it is built there (appended to `probe`): for a caller that
 * runs the probe some other way and installs only when it is missing. Returns 0 or GS_E_IO. */
int gs_trainer_locate(struct gs_buf *path, struct gs_buf *probe, struct gs_error *err);

#endif

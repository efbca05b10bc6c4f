/* remote/trainer_install.c: the trainer's build on a server (see trainer_install.h). */
#include "remote/trainer_install.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/proc.h"
#include "common/shell.h"
#include "remote/exec.h"

#ifndef GS_TRAINER_SOURCE_DIR
#define GS_TRAINER_SOURCE_DIR ""
#endif

/* A tarball of the trainer's sources whose bytes depend only on their content (sorted names, fixed
 * owners and times), so its hash is a stable cache key. */
static int pack_sources(struct gs_buf *tar, struct gs_error *err)
{
    const char *dir = getenv("GPUSYNC_TRAINER_SRC");
    if (!dir || !*dir)
        dir = GS_TRAINER_SOURCE_DIR;
    char *argv[] = {"tar",
                    "-C",
                    (char *)dir,
                    "--sort=name",
                    "--mtime=@0",
                    "--owner=0",
                    "--group=0",
                    "--numeric-owner",
                    "--exclude=./build",
                    "--exclude=./build-*",
                    "-cf",
                    "-",
                    ".",
                    NULL};
    int rc = gs_proc_capture(argv, tar, err);
    if (rc != 0 || tar->len == 0)
        return gs_error_set(err, GS_E_NOTFOUND, "cannot pack the trainer sources in %s (tar: %d)",
                            dir, rc);
    return 0;
}

/* The build, as the server runs it: cmake with CUDA when nvcc exists, else cc directly. A build
 * takes from a few seconds to a minute, so each step says on stdout what it is doing (the caller
 * shows it); the compilers' own output goes to build.log, whose tail is the error message. */
static const char build_script[] =
    "set -e\n"
    "d=~/.gpusync/trainer-%s; t0=$(date +%%s)\n"
    "echo 'gpusync: building the bundled trainer on the server (first use of this version;"
    " it is kept for later runs)'\n"
    "rm -rf \"$d.tmp\"; mkdir -p \"$d.tmp/src\" \"$d.tmp/bin\"\n"
    "tar -xf - -C \"$d.tmp/src\"\n"
    "cd \"$d.tmp\"\n"
    "step() {\n"
    "  echo \"gpusync: trainer build: $1...\"\n"
    "  if ! sh -c \"$2\" >>build.log 2>&1; then\n"
    "    echo '--- trainer build failed; last lines of the log:' >&2\n"
    "    tail -n 25 build.log >&2\n"
    "    echo \"--- reproduce with: cd $d.tmp && $2\" >&2\n"
    "    exit 3\n"
    "  fi\n"
    "}\n"
    "if command -v cmake >/dev/null 2>&1; then\n"
    "  cuda=; nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)\n"
    "  [ -n \"$nvcc\" ] && cuda=\"-DCMAKE_CUDA_COMPILER=$nvcc\"\n"
    "  step \"configuring with cmake${nvcc:+ (CUDA: $nvcc)}\" "
    "\"cmake -S src -B build -DCMAKE_BUILD_TYPE=Release $cuda\"\n"
    "  j=$(nproc 2>/dev/null || echo 2)\n"
    "  step \"compiling ($j jobs)\" \"cmake --build build -j$j\"\n"
    "else\n"
    "  step 'compiling with cc (no cmake on the server: CPU only)' "
    "'cc -O2 -std=c11 -D_GNU_SOURCE -o bin/gpusync-train src/src/*.c -lz -lm -lpthread'\n"
    "fi\n"
    "[ -x bin/gpusync-train ] || cp \"$(find build -name gpusync-train -type f | head -n1)\" bin/\n"
    "cd ..; rm -rf \"$d\"; mv \"$d.tmp\" \"$d\"\n"
    "echo \"gpusync: trainer build: done in $(( $(date +%%s) - t0 )) s\"\n";

static int build(struct gs_ssh *ssh, const char *key, const struct gs_buf *tar, int progress_fd,
                 struct gs_error *err)
{
    struct gs_buf script = GS_BUF_INIT, cmd = GS_BUF_INIT, errout = GS_BUF_INIT;
    gs_buf_addf(&script, build_script, key);
    gs_buf_adds(&cmd, "sh -c ");
    gs_shell_quote(&cmd, script.data);
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdin_data = tar->data;
    io.stdin_len = tar->len;
    io.stdout_fd = progress_fd;
    io.stderr_buf = &errout;
    int rc = gs_exec_run(ssh, cmd.data, &io, err);
    if (rc > 0)
        rc = gs_error_set(err, GS_E_REMOTE, "building gpusync-train on %s failed:\n%s",
                          gs_ssh_target(ssh), errout.data ? errout.data : "");
    gs_buf_release(&script);
    gs_buf_release(&cmd);
    gs_buf_release(&errout);
    return rc;
}

/* The content key of the trainer sources in `tar`. */
static void trainer_key(const struct gs_buf *tar, char key[20])
{
    snprintf(key, 20, "%016llx", (unsigned long long)XXH3_64bits(tar->data, tar->len));
}

static void add_path(struct gs_buf *path, const char *key)
{
    gs_buf_addf(path, "~/.gpusync/trainer-%s/bin/gpusync-train", key);
}

static void add_probe(struct gs_buf *probe, const char *key)
{
    gs_buf_adds(probe, "test -x ");
    add_path(probe, key);
    gs_buf_adds(probe, " && echo present; exit 0");
}

int gs_trainer_locate(struct gs_buf *path, struct gs_buf *probe, struct gs_error *err)
{
    struct gs_buf tar = GS_BUF_INIT;
    char key[20];
    int rc = pack_sources(&tar, err);
    if (rc == 0) {
        trainer_key(&tar, key);
        add_path(path, key);
        add_probe(probe, key);
    }
    gs_buf_release(&tar);
    return rc;
}

int gs_trainer_install(struct gs_ssh *ssh, struct gs_buf *path, const char **how, int progress_fd,
                       struct gs_error *err)
{
    struct gs_buf tar = GS_BUF_INIT, probe = GS_BUF_INIT, out = GS_BUF_INIT;
    int rc = pack_sources(&tar, err);
    char key[20];
    trainer_key(&tar, key);
    if (rc == 0) {
        add_probe(&probe, key);
        rc = gs_exec_capture(ssh, probe.data, &out, NULL, err);
    }
    if (rc == 0) {
        int present = out.data && strstr(out.data, "present");
        *how = present ? "cached" : "built";
        if (!present)
            rc = build(ssh, key, &tar, progress_fd, err);
    }
    if (rc == 0)
        add_path(path, key);
    gs_buf_release(&tar);
    gs_buf_release(&probe);
    gs_buf_release(&out);
    return rc;
}

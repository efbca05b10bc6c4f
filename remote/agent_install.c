/* remote/agent_install.c: installing the agent on a server (see agent_install.h). */
#include "remote/agent_install.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/path.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/exec.h"

#ifndef GS_AGENT_SOURCE_DIR
#define GS_AGENT_SOURCE_DIR ""
#endif

/* A build on the server gets every .c and .h of the agent (agent/) and of the protocol it shares
 * with the client (proto/), under those folder names, as the agent includes "proto/..." from the
 * repository root; and Debian's xxhash.h (the agent inlines it) at that root. So the source list
 * never goes stale as the agent grows. */
#define MAX_SOURCES   64
#define XXHASH_HEADER "/usr/include/xxhash.h"

struct sources {
    char *names[MAX_SOURCES]; /* "agent/x.c", "proto/x.h", sorted; the last is "xxhash.h" */
    struct gs_buf text[MAX_SOURCES];
    size_t n;
};

static int read_file(const char *path, struct gs_buf *out)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return -1;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
        gs_buf_add(out, chunk, n);
    int bad = ferror(fp);
    fclose(fp);
    return bad ? -1 : 0;
}

const char *gs_agent_local_binary(void)
{
    static char path[PATH_MAX + 64];
    const char *env = getenv("GPUSYNC_AGENT");
    if (env && *env)
        return access(env, X_OK) == 0 ? env : NULL;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    static const char *const rel[] = {"../agent/gpusync-agent", "../lib/gpusync/gpusync-agent",
                                      "gpusync-agent"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", exe, rel[i]);
        if (access(path, X_OK) == 0)
            return path;
    }
    return NULL;
}

static void hex_key(const void *data, size_t len, const char *prefix, char key[40])
{
    snprintf(key, 40, "%s%016llx", prefix, (unsigned long long)XXH3_64bits(data, len));
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void sources_release(struct sources *src)
{
    for (size_t i = 0; i < src->n; i++) {
        free(src->names[i]);
        gs_buf_release(&src->text[i]);
    }
    src->n = 0;
}

/* Adds the names of the .c and .h files in `dir` to src as "sub/NAME". */
static void list_sources(struct sources *src, const char *dir, const char *sub)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) && src->n < MAX_SOURCES - 1) {
        size_t len = strlen(de->d_name);
        if (len > 2 && de->d_name[len - 2] == '.' && strchr("ch", de->d_name[len - 1])) {
            struct gs_buf name = GS_BUF_INIT;
            gs_buf_addf(&name, "%s/%s", sub, de->d_name);
            src->names[src->n++] = gs_buf_detach(&name, NULL);
        }
    }
    if (d)
        closedir(d);
}

/* Reads source `i` from the agent folder `dir` (proto/ is its sibling). Returns 0 or -1. */
static int read_source(struct sources *src, size_t i, const char *dir)
{
    struct gs_buf path = GS_BUF_INIT;
    const char *name = src->names[i];
    if (strncmp(name, "agent/", 6) == 0)
        gs_buf_addf(&path, "%s/%s", dir, name + 6);
    else
        gs_buf_addf(&path, "%s/../%s", dir, name);
    gs_buf_init(&src->text[i]);
    int rc = read_file(path.data, &src->text[i]);
    gs_buf_release(&path);
    return rc;
}

/* Reads the agent's and the protocol's sources (sorted, for a stable key) plus xxhash.h.
 * Returns 0 or -1. */
static int load_sources(struct sources *src)
{
    const char *dir = getenv("GPUSYNC_AGENT_SRC");
    if (!dir || !*dir)
        dir = GS_AGENT_SOURCE_DIR;
    memset(src, 0, sizeof(*src));
    list_sources(src, dir, "agent");
    if (src->n == 0)
        return -1;
    struct gs_buf proto = GS_BUF_INIT;
    gs_buf_addf(&proto, "%s/../proto", dir);
    list_sources(src, proto.data, "proto");
    gs_buf_release(&proto);
    qsort(src->names, src->n, sizeof(char *), name_cmp);
    int rc = 0;
    for (size_t i = 0; i < src->n && rc == 0; i++)
        rc = read_source(src, i, dir);
    gs_buf_init(&src->text[src->n]);
    src->names[src->n] = gs_xstrdup("xxhash.h");
    if (rc == 0)
        rc = read_file(XXHASH_HEADER, &src->text[src->n]);
    src->n++;
    if (rc < 0)
        sources_release(src);
    return rc;
}

struct probe {
    char arch[64];
    int present;
    int has_cc;
};

static int probe_server(struct gs_ssh *ssh, const char *key, struct probe *p, struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_buf_addf(&cmd,
                "uname -sm; test -x ~/.gpusync/bin/gpusync-agent-%s && echo present; "
                "command -v cc >/dev/null 2>&1 && echo cc; " GS_EXEC_PATH_PROBE "exit 0",
                key);
    int rc = gs_exec_capture(ssh, cmd.data, &out, NULL, err);
    if (rc == 0)
        rc = gs_exec_path_broken(ssh, out.data, err); /* not "not Linux", not "no compiler" */
    memset(p, 0, sizeof(*p));
    if (rc == 0 && out.data) {
        sscanf(out.data, "%*s %63s", p->arch);
        p->present = strstr(out.data, "\npresent") != NULL;
        p->has_cc = strstr(out.data, "\ncc") != NULL;
        if (strncmp(out.data, "Linux ", 6) != 0)
            p->arch[0] = '\0'; /* not Linux: our static build cannot run there */
    }
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    return rc < 0 ? rc : 0;
}

/* Sends `bytes` to the server as ~/.gpusync/bin/gpusync-agent-KEY through one exec channel. */
static int upload_binary(struct gs_ssh *ssh, const struct gs_buf *bytes, const char *key,
                         struct gs_error *err)
{
    struct gs_buf cmd = GS_BUF_INIT, errout = GS_BUF_INIT;
    gs_buf_addf(&cmd,
                "set -e; mkdir -p ~/.gpusync/bin; t=~/.gpusync/bin/.upload-%s.$$; "
                "cat > \"$t\"; chmod 755 \"$t\"; mv -f \"$t\" ~/.gpusync/bin/gpusync-agent-%s",
                key, key);
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdin_data = bytes->data;
    io.stdin_len = bytes->len;
    io.stderr_buf = &errout;
    int rc = gs_exec_run(ssh, cmd.data, &io, err);
    while (errout.len && errout.data[errout.len - 1] == '\n') /* one line in the message */
        errout.data[--errout.len] = '\0';
    if (rc > 0)
        rc = gs_error_set(err, GS_E_REMOTE,
                          "cannot install the agent on %s: %s; it goes in ~/.gpusync/bin: make "
                          "that writable there, or set transport = sftp in [sync]",
                          gs_ssh_target(ssh), errout.data ? errout.data : "");
    gs_buf_release(&cmd);
    gs_buf_release(&errout);
    return rc;
}

/* A shell script that writes the sources to a temporary directory and compiles them. */
static void build_script(const struct sources *src, const char *key, struct gs_buf *sh)
{
    gs_buf_adds(sh, "set -e; d=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT; cd \"$d\"\n"
                    "mkdir agent proto\n");
    for (size_t i = 0; i < src->n; i++) {
        gs_buf_addf(sh, "cat > %s <<'GPUSYNC_SOURCE_END_7f3a'\n", src->names[i]);
        gs_buf_add(sh, src->text[i].data, src->text[i].len);
        if (src->text[i].len && src->text[i].data[src->text[i].len - 1] != '\n')
            gs_buf_addc(sh, '\n');
        gs_buf_adds(sh, "GPUSYNC_SOURCE_END_7f3a\n");
    }
    gs_buf_addf(sh,
                /* with the server's libzstd and librsync if it has them (a compressed stream,
                 * deltas), else with what it has */
                "cc -std=c99 -O2 -D_GNU_SOURCE -DGS_ZSTD -DGS_RSYNC -I. -o gpusync-agent "
                "agent/*.c proto/*.c -lzstd -lrsync >build.log 2>&1 || "
                "cc -std=c99 -O2 -D_GNU_SOURCE -DGS_ZSTD -I. -o gpusync-agent agent/*.c "
                "proto/*.c -lzstd >>build.log 2>&1 || "
                "cc -std=c99 -O2 -D_GNU_SOURCE -I. -o gpusync-agent agent/*.c proto/*.c "
                ">>build.log 2>&1 || { echo 'agent build failed:' >&2; tail -n 20 build.log >&2; "
                "exit 3; }\n"
                "mkdir -p ~/.gpusync/bin; mv -f gpusync-agent ~/.gpusync/bin/gpusync-agent-%s\n",
                key);
}

static int build_on_server(struct gs_ssh *ssh, const struct sources *src, const char *key,
                           struct gs_error *err)
{
    struct gs_buf script = GS_BUF_INIT, errout = GS_BUF_INIT;
    build_script(src, key, &script);
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdin_data = script.data;
    io.stdin_len = script.len;
    io.stderr_buf = &errout;
    int rc = gs_exec_run(ssh, "sh -s", &io, err);
    if (rc > 0)
        rc = gs_error_set(err, GS_E_NOTFOUND, "building the agent on %s failed: %s",
                          gs_ssh_target(ssh), errout.data ? errout.data : "");
    gs_buf_release(&script);
    gs_buf_release(&errout);
    return rc;
}

static int local_arch_matches(const char *remote_arch)
{
    struct utsname u;
    return uname(&u) == 0 && strcmp(u.machine, remote_arch) == 0;
}

/* The key of a source build: a hash over every file's name and text. */
static void sources_key(const struct sources *src, char key[40])
{
    struct gs_buf all = GS_BUF_INIT;
    for (size_t i = 0; i < src->n; i++) {
        gs_buf_adds(&all, src->names[i]);
        gs_buf_add(&all, src->text[i].data, src->text[i].len);
    }
    hex_key(all.data, all.len, "src-", key);
    gs_buf_release(&all);
}

/* The cache keys of the local static build ("" if none) and of the sources ("" if none). */
static void local_keys(char bin_key[40], char src_key[40])
{
    const char *bin = getenv("GPUSYNC_AGENT_FORCE_BUILD") ? NULL : gs_agent_local_binary();
    struct gs_buf binary = GS_BUF_INIT;
    struct sources src;
    bin_key[0] = src_key[0] = '\0';
    if (bin && read_file(bin, &binary) == 0)
        hex_key(binary.data, binary.len, "", bin_key);
    if (load_sources(&src) == 0) {
        sources_key(&src, src_key);
        sources_release(&src);
    }
    gs_buf_release(&binary);
}

void gs_agent_cached_command(const char *body, struct gs_buf *command)
{
    char bin_key[40], src_key[40];
    local_keys(bin_key, src_key);
    gs_buf_adds(command, "for a in");
    if (bin_key[0])
        gs_buf_addf(command, " ~/.gpusync/bin/gpusync-agent-%s", bin_key);
    if (src_key[0])
        gs_buf_addf(command, " ~/.gpusync/bin/gpusync-agent-%s", src_key);
    gs_buf_addf(command, "; do [ -x \"$a\" ] || continue; %s; exit $?; done; echo %s >&2; exit 127",
                body, GS_AGENT_MISSING);
}

int gs_agent_reported_missing(const struct gs_buf *errout)
{
    return errout->len && strstr(errout->data, GS_AGENT_MISSING) != NULL;
}

void gs_agent_cached_serve_command(const char *remote_dir, struct gs_buf *command)
{
    struct gs_buf body = GS_BUF_INIT;
    gs_agent_serve_command(GS_AGENT_CACHED, remote_dir, &body);
    gs_agent_cached_command(body.data, command);
    gs_buf_release(&body);
}

/* Chooses between the static binary (same arch) and a source build; fills `key`. */
static int install(struct gs_ssh *ssh, char key[40], const char **how, struct gs_error *err)
{
    const char *bin = getenv("GPUSYNC_AGENT_FORCE_BUILD") ? NULL : gs_agent_local_binary();
    struct gs_buf binary = GS_BUF_INIT;
    struct sources src;
    int have_bin = bin && read_file(bin, &binary) == 0;
    int have_src = load_sources(&src) == 0;
    struct probe p;
    memset(&p, 0, sizeof(p));
    int rc = 0;
    if (have_bin) {
        hex_key(binary.data, binary.len, "", key);
        rc = probe_server(ssh, key, &p, err);
    }
    if (rc == 0 && have_bin && local_arch_matches(p.arch)) {
        *how = p.present ? "cached" : "uploaded";
        rc = p.present ? 0 : upload_binary(ssh, &binary, key, err);
    } else if (rc == 0 && have_src) {
        sources_key(&src, key);
        rc = probe_server(ssh, key, &p, err);
        *how = p.present ? "cached" : "built";
        if (rc == 0 && !p.present)
            rc = p.has_cc ? build_on_server(ssh, &src, key, err)
                          : gs_error_set(err, GS_E_NOTFOUND,
                                         "%s (%s) has no C compiler to build the agent",
                                         gs_ssh_target(ssh), p.arch[0] ? p.arch : "not Linux");
    } else if (rc == 0) {
        rc = gs_error_set(err, GS_E_NOTFOUND,
                          "no agent binary or sources found locally (set GPUSYNC_AGENT)");
    }
    gs_buf_release(&binary);
    if (have_src)
        sources_release(&src);
    return rc;
}

int gs_agent_install(struct gs_ssh *ssh, struct gs_buf *agent, const char **how,
                     struct gs_error *err)
{
    char key[40] = "";
    int rc = install(ssh, key, how, err);
    if (rc == 0)
        gs_buf_addf(agent, "~/.gpusync/bin/gpusync-agent-%s", key);
    return rc;
}

void gs_agent_serve_command(const char *agent, const char *remote_dir, struct gs_buf *command)
{
    /* stderr only: stdout is the protocol's */
    gs_buf_addf(command,
                "mkdir -p -- %s || { { " GS_EXEC_PATH_PROBE "echo %s; } >&2; exit 3; }; "
                "exec %s serve --root %s",
                remote_dir, GS_AGENT_ROOT_UNUSABLE, agent, remote_dir);
}

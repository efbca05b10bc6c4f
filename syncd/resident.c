/* syncd/resident.c: the project's memory of the resident listener (see resident.h). The file is
 * four lines: a version, the key, the socket's path and the root's, or, after a refusal, the word
 * "refused" and the time of it; a value with a newline in it is never remembered. */
#include "syncd/resident.h"

#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "remote/agent_install.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#define HEADER  "gpusync-resident 1"
#define REFUSED "refused"

void gs_resident_key(const char *target, const char *remote_dir, char key[GS_RESIDENT_KEY])
{
    struct gs_buf command = GS_BUF_INIT;
    gs_agent_cached_serve_command(remote_dir, &command);
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, target, strlen(target) + 1); /* the NUL keeps the two apart */
    XXH3_128bits_update(&st, command.data, command.len);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    gs_buf_release(&command);
    snprintf(key, GS_RESIDENT_KEY, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
}

static void file_path(const char *project, struct gs_buf *out)
{
    gs_path_join(out, project, GS_RESIDENT_FILE);
}

/* Reads one line into out (cap bytes) without its newline; -1 if it is missing or too long. */
static int read_line(FILE *fp, char *out, size_t cap)
{
    if (!fgets(out, (int)cap, fp))
        return -1;
    size_t n = strlen(out);
    if (n == 0 || out[n - 1] != '\n')
        return -1;
    out[n - 1] = '\0';
    return 0;
}

/* Whether a refusal stored at `when` (seconds since the epoch) still holds. */
static int refusal_holds(const char *when)
{
    long long t = atoll(when);
    long long now = (long long)time(NULL);
    return t > 0 && now >= t && now - t < GS_RESIDENT_RETRY_S;
}

int gs_resident_recall(const char *project, const char *key, struct gs_resident *r)
{
    struct gs_buf path = GS_BUF_INIT;
    file_path(project, &path);
    FILE *fp = fopen(path.data, "r");
    gs_buf_release(&path);
    if (!fp)
        return -1;
    char header[64], stored[GS_RESIDENT_KEY + 2];
    int rc = -1;
    if (read_line(fp, header, sizeof(header)) == 0 && strcmp(header, HEADER) == 0 &&
        read_line(fp, stored, sizeof(stored)) == 0 && strcmp(stored, key) == 0 &&
        read_line(fp, r->socket, sizeof(r->socket)) == 0 &&
        read_line(fp, r->root, sizeof(r->root)) == 0) {
        if (strcmp(r->socket, REFUSED) == 0)
            rc = refusal_holds(r->root) ? 1 : -1;
        else if (r->socket[0] == '/' && r->root[0] == '/')
            rc = 0;
    }
    fclose(fp);
    return rc;
}

/* Replaces the file with the four lines. */
static void store(const char *project, const char *key, const char *line3, const char *line4)
{
    struct gs_buf path = GS_BUF_INIT, text = GS_BUF_INIT;
    file_path(project, &path);
    gs_buf_addf(&text, HEADER "\n%s\n%s\n%s\n", key, line3, line4);
    (void)gs_path_write_atomic(path.data, text.data, text.len); /* best effort, as before */
    gs_buf_release(&path);
    gs_buf_release(&text);
}

void gs_resident_remember(const char *project, const char *key, const char *socket,
                          const char *root)
{
    if (!strchr(socket, '\n') && !strchr(root, '\n') && socket[0] == '/' && root[0] == '/')
        store(project, key, socket, root);
}

void gs_resident_refused(const char *project, const char *key)
{
    char when[32];
    snprintf(when, sizeof(when), "%lld", (long long)time(NULL));
    store(project, key, REFUSED, when);
}

void gs_resident_forget(const char *project)
{
    struct gs_buf path = GS_BUF_INIT;
    file_path(project, &path);
    unlink(path.data);
    gs_buf_release(&path);
}

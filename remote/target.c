/* remote/target.c: resolving a host through `ssh -G` (see target.h). */
#include "remote/target.h"

#include <dirent.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "common/proc.h"
#include "common/wrapper.h"

static void set_string(char **slot, const char *value, size_t len)
{
    free(*slot);
    *slot = gs_xstrndup(value, len);
}

/* `path` (len bytes) as "~/..." when it lies in the passwd home and $HOME is elsewhere: ssh -G
 * prints some files (UserKnownHostsFile) with "~" already expanded from the passwd home, but
 * gpusync follows $HOME (see home_ssh_config), as it does for the files ssh -G leaves as "~/".
 * Returns a malloc'd copy. */
static char *follow_home(const char *path, size_t len)
{
    const char *home = getenv("HOME");
    struct passwd *pw = getpwuid(getuid());
    size_t plen = pw && pw->pw_dir ? strlen(pw->pw_dir) : 0;
    if (!home || plen < 2 || strcmp(pw->pw_dir, home) == 0 || len <= plen ||
        memcmp(path, pw->pw_dir, plen) != 0 || path[plen] != '/')
        return gs_xstrndup(path, len);
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b, "~");
    gs_buf_add(&b, path + plen, len - plen);
    return gs_buf_detach(&b, NULL);
}

/* Appends a path ("~" expanded) to a list unless it is there already. */
static void add_path(char ***list, size_t *n, const char *path, size_t len)
{
    char *raw = follow_home(path, len);
    char *expanded = gs_path_expand_home(raw);
    free(raw);
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*list)[i], expanded) == 0) {
            free(expanded);
            return;
        }
    *list = gs_xrealloc(*list, (*n + 1) * sizeof(char *));
    (*list)[(*n)++] = expanded;
}

static void add_identity(struct gs_target *t, const char *path, size_t len)
{
    add_path(&t->identities, &t->n_identities, path, len);
}

static void free_paths(char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* Replaces a list with the space-separated paths of one ssh -G value. */
static void set_paths(char ***list, size_t *n, const char *value, size_t len)
{
    free_paths(*list, *n);
    *list = NULL;
    *n = 0;
    for (size_t i = 0; i < len;) {
        size_t word = strcspn(value + i, " \n");
        if (word > len - i)
            word = len - i;
        if (word)
            add_path(list, n, value + i, word);
        i += word + 1;
    }
}

/* 1 for one of OpenSSH's default key names (~/.ssh/id_rsa, id_ed25519...), which `ssh -G` lists
 * when the config names no IdentityFile. */
static int is_default_key_name(const char *path)
{
    const char *base = strrchr(path, '/');
    return base && strncmp(base + 1, "id_", 3) == 0 && base - path >= 5 &&
           strncmp(base - 5, "/.ssh", 5) == 0;
}

/* Puts GS_TARGET_MANAGED_KEY after the keys an ~/.ssh/config names for this host and before the
 * default ones: each key that fails counts towards the server's MaxAuthTries, and the managed
 * key exists only because gpusync installed it somewhere, so it must not wait behind id_rsa. */
static void add_managed_key(struct gs_target *t)
{
    size_t n = t->n_identities, at = 0;
    add_identity(t, GS_TARGET_MANAGED_KEY, strlen(GS_TARGET_MANAGED_KEY));
    if (t->n_identities == n)
        return; /* an IdentityFile names it already: keep the config's order */
    while (at < n && !is_default_key_name(t->identities[at]))
        at++;
    char *managed = t->identities[n];
    memmove(&t->identities[at + 1], &t->identities[at], (n - at) * sizeof(char *));
    t->identities[at] = managed;
}

/* Applies one "key value" line of ssh -G output. */
static void apply_line(struct gs_target *t, const char *line, size_t len)
{
    const char *space = memchr(line, ' ', len);
    if (!space)
        return;
    size_t klen = (size_t)(space - line);
    const char *value = space + 1;
    size_t vlen = len - klen - 1;
    if (klen == 8 && memcmp(line, "hostname", 8) == 0)
        set_string(&t->hostname, value, vlen);
    else if (klen == 4 && memcmp(line, "port", 4) == 0)
        t->port = atoi(value);
    else if (klen == 4 && memcmp(line, "user", 4) == 0)
        set_string(&t->user, value, vlen);
    else if (klen == 12 && memcmp(line, "identityfile", 12) == 0)
        add_identity(t, value, vlen);
    else if (klen == 18 && memcmp(line, "userknownhostsfile", 18) == 0)
        set_paths(&t->user_known_hosts, &t->n_user_known_hosts, value, vlen);
    else if (klen == 20 && memcmp(line, "globalknownhostsfile", 20) == 0)
        set_paths(&t->global_known_hosts, &t->n_global_known_hosts, value, vlen);
}

void gs_target_apply_ssh_g(struct gs_target *t, const char *output)
{
    for (const char *p = output; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        apply_line(t, p, len);
        p += len + (nl ? 1 : 0);
    }
}

static void apply_defaults(struct gs_target *t)
{
    if (!t->hostname)
        t->hostname = gs_xstrdup(t->alias);
    if (!t->port)
        t->port = 22;
    if (!t->user) {
        const char *u = getenv("USER");
        struct passwd *pw = u ? NULL : getpwuid(getuid());
        t->user = gs_xstrdup(u ? u : pw ? pw->pw_name : "root");
    }
    static const char *defaults[] = {"~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa"};
    for (size_t i = 0; i < 3; i++)
        add_identity(t, defaults[i], strlen(defaults[i]));
    /* OpenSSH's defaults, when ssh -G did not name the files */
    static const char user_kh[] = "~/.ssh/known_hosts ~/.ssh/known_hosts2";
    static const char global_kh[] = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2";
    if (!t->n_user_known_hosts)
        set_paths(&t->user_known_hosts, &t->n_user_known_hosts, user_kh, strlen(user_kh));
    if (!t->n_global_known_hosts)
        set_paths(&t->global_known_hosts, &t->n_global_known_hosts, global_kh, strlen(global_kh));
}

/* OpenSSH reads ~/.ssh/config from the passwd home; gpusync follows $HOME (as for identities and
 * known_hosts), so when they differ the file is named explicitly. Returns it, or NULL. */
static char *home_ssh_config(void)
{
    const char *home = getenv("HOME");
    struct passwd *pw = getpwuid(getuid());
    if (!home || (pw && pw->pw_dir && strcmp(pw->pw_dir, home) == 0))
        return NULL;
    char *path = gs_path_expand_home("~/.ssh/config");
    if (path && access(path, R_OK) == 0)
        return path;
    free(path);
    return NULL;
}

#define SYSTEM_CONFIG     "/etc/ssh/ssh_config"
#define SYSTEM_CONFIG_DIR "/etc/ssh/ssh_config.d"

static int dir_has_entries(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d)))
        found = e->d_name[0] != '.';
    if (d)
        closedir(d);
    return found;
}

/* 1 when a line of the system config could change the host, port, user or keys. */
static int system_line_matters(const char *line)
{
    static const char *keys[] = {"hostname",
                                 "port",
                                 "user",
                                 "identityfile",
                                 "match",
                                 "include",
                                 "userknownhostsfile",
                                 "globalknownhostsfile"};
    char key[32], value[256] = "";
    if (sscanf(line, " %31[^ \t=]%*[ \t=]%255s", key, value) < 1 || key[0] == '#')
        return 0;
    if (strcasecmp(key, "include") == 0 && strcmp(value, SYSTEM_CONFIG_DIR "/*.conf") == 0)
        return 0; /* Debian's own include of a folder checked separately */
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcasecmp(key, keys[i]) == 0)
            return 1;
    return 0;
}

/* Whether an OpenSSH config file could say something about this connection. Without one, `ssh -G`
 * only echoes the defaults, and starting it costs 20-40 ms on every command. */
static int ssh_config_may_apply(void)
{
    char *user_config = gs_path_expand_home("~/.ssh/config");
    struct passwd *pw = getpwuid(getuid());
    char pw_config[4096] = "";
    if (pw && pw->pw_dir)
        snprintf(pw_config, sizeof(pw_config), "%s/.ssh/config", pw->pw_dir);
    int found = (user_config && access(user_config, F_OK) == 0) ||
                (pw_config[0] && access(pw_config, F_OK) == 0) ||
                dir_has_entries(SYSTEM_CONFIG_DIR);
    free(user_config);
    FILE *fp = found ? NULL : fopen(SYSTEM_CONFIG, "r");
    char line[512];
    while (fp && !found && fgets(line, sizeof(line), fp))
        found = system_line_matters(line);
    if (fp)
        fclose(fp);
    return found;
}

static void ask_ssh_g(struct gs_target *t, const char *host, int port, const char *user)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    char *argv[12];
    char *config = home_ssh_config();
    int n = 0;
    argv[n++] = "ssh";
    argv[n++] = "-G";
    if (config) {
        argv[n++] = "-F";
        argv[n++] = config;
    }
    if (port) {
        argv[n++] = "-p";
        argv[n++] = port_s;
    }
    if (user) {
        argv[n++] = "-l";
        argv[n++] = (char *)user;
    }
    argv[n++] = "--";
    argv[n++] = (char *)host;
    argv[n] = NULL;
    struct gs_buf out = GS_BUF_INIT;
    if (gs_proc_capture(argv, &out, NULL) == 0)
        gs_target_apply_ssh_g(t, out.data ? out.data : "");
    gs_buf_release(&out);
    free(config);
}

int gs_target_resolve(struct gs_target *t, const char *host, int port, const char *user,
                      struct gs_error *err)
{
    memset(t, 0, sizeof(*t));
    if (!host || !host[0])
        return gs_error_set(err, GS_E_USAGE, "no host given");
    t->alias = gs_xstrdup(host);
    if (host[0] != '-' && ssh_config_may_apply())
        ask_ssh_g(t, host, port, user);
    add_managed_key(t);
    if (port)
        t->port = port;
    if (user)
        set_string(&t->user, user, strlen(user));
    apply_defaults(t);
    return 0;
}

char *gs_target_id(const struct gs_target *t)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_addf(&b, "%s@%s:%d", t->user, t->hostname, t->port);
    return gs_buf_detach(&b, NULL);
}

void gs_target_release(struct gs_target *t)
{
    free(t->alias);
    free(t->hostname);
    free(t->user);
    free_paths(t->identities, t->n_identities);
    free_paths(t->user_known_hosts, t->n_user_known_hosts);
    free_paths(t->global_known_hosts, t->n_global_known_hosts);
    memset(t, 0, sizeof(*t));
}

void gs_target_name(const char *host, int port, const char *user, char *out, size_t size)
{
    struct gs_target t;
    if (gs_target_resolve(&t, host, port, user, NULL) < 0) {
        snprintf(out, size, "%s", host ? host : "");
        return;
    }
    char *id = gs_target_id(&t);
    snprintf(out, size, "%s", id ? id : t.hostname);
    free(id);
    gs_target_release(&t);
}

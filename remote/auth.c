/* remote/auth.c: authentication methods, tried in order (see auth.h). */
#include "remote/auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"

struct auth_run {
    struct gs_ssh *s;
    const struct gs_target *t;
    const struct gs_ssh_opts *opts;
    struct gs_buf tried;    /* "ssh-agent (2 keys), ~/.ssh/id_ed25519, password" */
    int rsa_only_candidate; /* an RSA key was found and tried */
    int usable_key_found;   /* a non-RSA key was found */
    const char *password;   /* for the keyboard-interactive callback */
    char last_key[4096];    /* the identity file tried last (a copy: paths are freed) */
};

static void note_tried(struct auth_run *run, const char *what)
{
    gs_buf_addf(&run->tried, "%s%s", run->tried.len ? ", " : "", what);
}

static int authenticated(struct auth_run *run)
{
    return libssh2_userauth_authenticated(gs_ssh_session(run->s));
}

/* The server's accepted methods ("publickey,password"), or NULL if "none" already succeeded. */
static char *list_methods(struct auth_run *run, struct gs_error *err)
{
    LIBSSH2_SESSION *session = gs_ssh_session(run->s);
    const char *user = run->t->user;
    char *list;
    int rc;
    GS_SSH_RETRY_PTR(run->s, list, libssh2_userauth_list(session, user, (unsigned)strlen(user)), 0,
                     err, rc);
    if (rc < 0)
        return NULL;
    return list ? strdup(list) : NULL;
}

static int try_agent(struct auth_run *run, struct gs_error *err)
{
    if (!getenv("SSH_AUTH_SOCK"))
        return 0;
    LIBSSH2_SESSION *session = gs_ssh_session(run->s);
    LIBSSH2_AGENT *agent = libssh2_agent_init(session);
    if (!agent)
        return 0;
    int keys = 0;
    if (libssh2_agent_connect(agent) == 0 && libssh2_agent_list_identities(agent) == 0) {
        struct libssh2_agent_publickey *id = NULL, *prev = NULL;
        while (!authenticated(run) && libssh2_agent_get_identity(agent, &id, prev) == 0) {
            int rc;
            keys++;
            GS_SSH_RETRY(run->s, rc, libssh2_agent_userauth(agent, run->t->user, id), 0, err);
            if (rc == GS_E_DISCONNECTED || rc == GS_E_TIMEOUT)
                break;
            prev = id;
        }
        libssh2_agent_disconnect(agent);
    }
    libssh2_agent_free(agent);
    char what[64];
    snprintf(what, sizeof(what), "ssh-agent (%d key%s)", keys, keys == 1 ? "" : "s");
    note_tried(run, what);
    return 0;
}

/* 1 if the key's .pub file says ssh-rsa: libssh2 1.10 signs only with SHA-1 for those. */
static int is_rsa_key(const char *private_path)
{
    char pub[4096], head[16] = "";
    snprintf(pub, sizeof(pub), "%s.pub", private_path);
    FILE *fp = fopen(pub, "r");
    if (!fp)
        return strstr(private_path, "id_rsa") != NULL;
    size_t n = fread(head, 1, sizeof(head) - 1, fp);
    fclose(fp);
    head[n] = '\0';
    return strncmp(head, "ssh-rsa ", 8) == 0;
}

static int userauth_file(struct auth_run *run, const char *path, const char *passphrase,
                         struct gs_error *err)
{
    LIBSSH2_SESSION *session = gs_ssh_session(run->s);
    const char *user = run->t->user;
    int rc;
    GS_SSH_RETRY(run->s, rc,
                 libssh2_userauth_publickey_fromfile_ex(session, user, (unsigned)strlen(user), NULL,
                                                        path, passphrase),
                 0, err);
    return rc;
}

static int try_identity(struct auth_run *run, const char *path, struct gs_error *err)
{
    if (access(path, R_OK) != 0)
        return 0;
    int rsa = is_rsa_key(path);
    if (rsa)
        run->rsa_only_candidate = 1;
    else
        run->usable_key_found = 1;
    note_tried(run, path);
    snprintf(run->last_key, sizeof(run->last_key), "%s", path);
    int rc = userauth_file(run, path, NULL, err);
    if (rc == LIBSSH2_ERROR_FILE && run->opts->ask_secret) {
        char prompt[512];
        snprintf(prompt, sizeof(prompt), "Enter passphrase for key '%s': ", path);
        char *pass = run->opts->ask_secret(run->opts->prompt_ctx, prompt);
        if (pass) {
            rc = userauth_file(run, path, pass, err);
            memset(pass, 0, strlen(pass));
            free(pass);
        }
    }
    return rc == GS_E_DISCONNECTED || rc == GS_E_TIMEOUT ? rc : 0;
}

static int try_identities(struct auth_run *run, struct gs_error *err)
{
    int rc = 0;
    if (run->opts->identity) {
        char *path = gs_path_expand_home(run->opts->identity);
        rc = try_identity(run, path, err);
        free(path);
    }
    for (size_t i = 0; rc == 0 && !authenticated(run) && i < run->t->n_identities; i++)
        rc = try_identity(run, run->t->identities[i], err);
    return rc;
}

static void kbd_callback(const char *name, int name_len, const char *instruction,
                         int instruction_len, int num_prompts,
                         const LIBSSH2_USERAUTH_KBDINT_PROMPT *prompts,
                         LIBSSH2_USERAUTH_KBDINT_RESPONSE *responses, void **abstract)
{
    (void)name, (void)name_len, (void)instruction, (void)instruction_len, (void)prompts;
    struct auth_run *run = *abstract;
    for (int i = 0; i < num_prompts; i++) {
        responses[i].text = strdup(run->password);
        responses[i].length = (unsigned)strlen(run->password);
    }
}

static int send_password(struct auth_run *run, const char *methods, const char *password,
                         struct gs_error *err)
{
    LIBSSH2_SESSION *session = gs_ssh_session(run->s);
    const char *user = run->t->user;
    unsigned ulen = (unsigned)strlen(user);
    int rc = LIBSSH2_ERROR_AUTHENTICATION_FAILED;
    if (strstr(methods, "password"))
        GS_SSH_RETRY(run->s, rc,
                     libssh2_userauth_password_ex(session, user, ulen, password,
                                                  (unsigned)strlen(password), NULL),
                     0, err);
    /* Keyboard-interactive only when "password" is not offered: a wrong password must cost one
     * attempt, not two (servers count them towards MaxAuthTries and fail2ban). */
    if (!strstr(methods, "password") && strstr(methods, "keyboard-interactive")) {
        run->password = password;
        void **abstract = libssh2_session_abstract(session);
        void *saved = *abstract;
        *abstract = run;
        GS_SSH_RETRY(run->s, rc,
                     libssh2_userauth_keyboard_interactive_ex(session, user, ulen, kbd_callback), 0,
                     err);
        *abstract = saved;
    }
    return rc == GS_E_DISCONNECTED || rc == GS_E_TIMEOUT ? rc : 0;
}

/* A given password is tried once; a prompted one up to three times, as ssh does. */
static int try_password(struct auth_run *run, const char *methods, struct gs_error *err)
{
    if (!strstr(methods, "password") && !strstr(methods, "keyboard-interactive"))
        return 0;
    if (run->opts->password) {
        note_tried(run, "password");
        return send_password(run, methods, run->opts->password, err);
    }
    if (!run->opts->ask_secret)
        return 0;
    int rc = 0;
    for (int attempt = 0; attempt < 3 && rc == 0 && !authenticated(run); attempt++) {
        char prompt[512];
        snprintf(prompt, sizeof(prompt), "%s@%s's password: ", run->t->user, run->t->hostname);
        char *pass = run->opts->ask_secret(run->opts->prompt_ctx, prompt);
        if (!pass)
            break;
        if (attempt == 0)
            note_tried(run, "password");
        rc = send_password(run, methods, pass, err);
        memset(pass, 0, strlen(pass));
        free(pass);
    }
    return rc;
}

static int auth_failed(struct auth_run *run, const char *methods, struct gs_error *err)
{
    const char *target = gs_ssh_target(run->s);
    if (run->rsa_only_candidate && !run->usable_key_found && !run->opts->password)
        return gs_error_set(err, GS_E_AUTH,
                            "authentication to %s failed: only an RSA key was found (tried: %s). "
                            "This libssh2 (1.10) cannot sign with rsa-sha2, which OpenSSH 8.8 and "
                            "later require. Run 'gpusync init --install-key' to create a dedicated "
                            "ed25519 key and install it with your password once",
                            target, run->tried.len ? run->tried.data : "nothing");
    return gs_error_set(err, GS_E_AUTH,
                        "authentication to %s failed (server accepts: %s; tried: %s). Set "
                        "GPUSYNC_PASSWORD or use --password-stdin for password login, or run "
                        "'gpusync init --install-key' to install a key",
                        target, methods, run->tried.len ? run->tried.data : "nothing");
}

/* Tries ssh-agent and identity files; stores what worked in *method. Returns 0, GS_E_AUTH when
 * no key worked, or a connection error. */
static int run_methods(struct auth_run *run, const char *methods, char **method,
                       struct gs_error *err)
{
    int rc = try_agent(run, err);
    if (rc == 0 && authenticated(run)) {
        *method = strdup("publickey (ssh-agent)");
        return 0;
    }
    if (rc == 0 && (rc = try_identities(run, err)) == 0 && authenticated(run)) {
        struct gs_buf b = GS_BUF_INIT;
        gs_buf_addf(&b, "publickey (%s)", run->last_key);
        *method = gs_buf_detach(&b, NULL);
        return 0;
    }
    return rc ? rc : auth_failed(run, methods, err);
}

/* The password methods, once the server has said which it takes. */
static int run_methods_password(struct auth_run *run, const char *methods, char **method,
                                struct gs_error *err)
{
    int rc = try_password(run, methods, err);
    if (rc == 0 && authenticated(run)) {
        *method = strdup("password");
        return 0;
    }
    return rc ? rc : auth_failed(run, methods, err);
}

int gs_auth_login(struct gs_ssh *s, const struct gs_target *t, const struct gs_ssh_opts *opts,
                  char **method, struct gs_error *err)
{
    struct auth_run run = {.s = s, .t = t, .opts = opts, .tried = GS_BUF_INIT};
    /* Keys first, without asking for the method list: almost every server takes publickey, and
     * the list costs a round trip. Only when no key worked do we ask what else it accepts. */
    int rc = run_methods(&run, "publickey", method, err);
    if (rc == GS_E_AUTH && !authenticated(&run)) {
        gs_error_clear(err);
        char *methods = list_methods(&run, err);
        if (methods)
            rc = strstr(methods, "password") || strstr(methods, "keyboard-interactive")
                     ? run_methods_password(&run, methods, method, err)
                     : auth_failed(&run, methods, err);
        else if (authenticated(&run))
            rc = (*method = strdup("none")) ? 0 : GS_E_NOMEM;
        else
            rc = err && err->code
                     ? err->code
                     : gs_error_set(err, GS_E_AUTH, "%s: cannot list authentication methods",
                                    gs_ssh_target(s));
        free(methods);
    }
    gs_buf_release(&run.tried);
    return rc;
}

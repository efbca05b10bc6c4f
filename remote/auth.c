/* remote/auth.c: authentication methods, tried in order (see auth.h). */
#include "remote/auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "common/proc.h"
#include "common/shell.h"
#include "common/wrapper.h"
#include "remote/exec.h"

struct auth_run {
    struct gs_ssh *s;
    const struct gs_target *t;
    const struct gs_ssh_opts *opts;
    struct gs_buf tried;    /* "ssh-agent (2 keys), ~/.ssh/id_ed25519, password" */
    int rsa_only_candidate; /* an RSA key was found and tried */
    int usable_key_found;   /* a non-RSA key was found */
    const char *password;   /* for the keyboard-interactive callback */
    char unanswered[160];   /* a keyboard-interactive prompt that was not for the password */
    int passwords_rejected; /* passwords the server answered "wrong" to */
    char last_key[4096];    /* the identity file tried last (a copy: paths are freed) */
    char missing_key[4200]; /* "PATH: why", when the config's identity file cannot be read */
};

static void note_tried(struct auth_run *run, const char *what)
{
    gs_buf_addf(&run->tried, "%s%s", run->tried.len ? ", " : "", what);
}

static int authenticated(struct auth_run *run)
{
    return libssh2_userauth_authenticated(gs_ssh_session(run->s));
}

/* 1 when the server's method list ("publickey,password") takes a password in some form. */
static int accepts_password(const char *methods)
{
    return strstr(methods, "password") || strstr(methods, "keyboard-interactive");
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
    return list ? gs_xstrdup(list) : NULL;
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

/* The config's `identity =` file first (noting why when it cannot be read: that, not the keys
 * tried after it, is then what the user must fix), then the target's list without it. */
static int try_identities(struct auth_run *run, struct gs_error *err)
{
    int rc = 0;
    char *named = run->opts->identity ? gs_path_expand_home(run->opts->identity) : NULL;
    if (named && access(named, R_OK) != 0)
        snprintf(run->missing_key, sizeof(run->missing_key), "%s: %s", named, strerror(errno));
    else if (named)
        rc = try_identity(run, named, err);
    for (size_t i = 0; rc == 0 && !authenticated(run) && i < run->t->n_identities; i++)
        if (!named || strcmp(named, run->t->identities[i]) != 0)
            rc = try_identity(run, run->t->identities[i], err);
    free(named);
    return rc;
}

int gs_auth_is_password_prompt(const char *prompt, size_t len)
{
    for (size_t i = 0; i + 8 <= len; i++)
        if (strncasecmp(prompt + i, "password", 8) == 0)
            return 1;
    return 0;
}

/* The login in progress on this thread, for kbd_callback: libssh2 hands the callback the session's
 * abstract pointer, which is the gs_ssh its socket hook needs, so it cannot carry the run. */
static __thread struct auth_run *kbd_run;

/* Answers the server's prompts: the password only where the prompt asks for a password; any
 * other (a one-time code) is asked of the user on a terminal, or left unanswered and named. */
static void kbd_callback(const char *name, int name_len, const char *instruction,
                         int instruction_len, int num_prompts,
                         const LIBSSH2_USERAUTH_KBDINT_PROMPT *prompts,
                         LIBSSH2_USERAUTH_KBDINT_RESPONSE *responses, void **abstract)
{
    (void)name, (void)name_len, (void)instruction, (void)instruction_len, (void)abstract;
    struct auth_run *run = kbd_run;
    for (int i = 0; i < num_prompts; i++) {
        const char *text = (const char *)prompts[i].text;
        char *answer = NULL;
        if (gs_auth_is_password_prompt(text, prompts[i].length)) {
            answer = gs_xstrdup(run->password);
        } else {
            char question[160];
            snprintf(question, sizeof(question), "%.*s", (int)prompts[i].length, text);
            answer = run->opts->ask_secret ? run->opts->ask_secret(run->opts->prompt_ctx, question)
                                           : NULL;
            if (!answer)
                snprintf(run->unanswered, sizeof(run->unanswered), "%s", question);
        }
        responses[i].text = answer ? answer : gs_xstrdup("");
        responses[i].length = (unsigned)strlen(responses[i].text);
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
        kbd_run = run;
        GS_SSH_RETRY(run->s, rc,
                     libssh2_userauth_keyboard_interactive_ex(session, user, ulen, kbd_callback), 0,
                     err);
        kbd_run = NULL;
    }
    if (rc == LIBSSH2_ERROR_AUTHENTICATION_FAILED && run->unanswered[0])
        return 0; /* not the password's fault: auth_failed names the prompt */
    if (rc == LIBSSH2_ERROR_AUTHENTICATION_FAILED)
        run->passwords_rejected++;
    return rc == GS_E_DISCONNECTED || rc == GS_E_TIMEOUT ? rc : 0;
}

/* A given password is tried once; a prompted one up to three times, as ssh does. */
static int try_password(struct auth_run *run, const char *methods, struct gs_error *err)
{
    if (!accepts_password(methods))
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

/* Why nothing worked, the most specific cause first, and what to do about it. */
static int auth_failed(struct auth_run *run, const char *methods, struct gs_error *err)
{
    const char *target = gs_ssh_target(run->s);
    const char *tried = run->tried.len ? run->tried.data : "nothing";
    int installing = run->opts->installing_key;
    if (run->unanswered[0])
        return gs_error_set(err, GS_E_AUTH,
                            "authentication to %s failed: the server asked \"%s\", which is not a "
                            "password prompt and needs a terminal to answer (tried: %s). Run the "
                            "command in a terminal, or install a key there with --install-key",
                            target, run->unanswered, tried);
    if (run->passwords_rejected)
        return gs_error_set(err, GS_E_AUTH,
                            "authentication to %s failed: password rejected%s (tried: %s). Check "
                            "the password (GPUSYNC_PASSWORD, --password-stdin or the prompt) and "
                            "the user name",
                            target, run->passwords_rejected > 1 ? " each time" : "", tried);
    if (run->missing_key[0])
        return gs_error_set(err, GS_E_AUTH,
                            "authentication to %s failed: the key named by 'identity =' in "
                            ".gpusync/config cannot be read (%s; tried: %s). Correct that line "
                            "or remove it",
                            target, run->missing_key, tried);
    if (installing && accepts_password(methods))
        return gs_error_set(err, GS_E_AUTH,
                            "cannot install a key on %s: it accepted none of the keys (tried: %s), "
                            "so the password is needed once, and none was given%s. Set "
                            "GPUSYNC_PASSWORD or pass it on standard input with --password-stdin",
                            target, tried, run->opts->ask_secret ? "" : " (no terminal to ask on)");
    if (run->rsa_only_candidate && !run->usable_key_found && !installing)
        return gs_error_set(err, GS_E_AUTH,
                            "authentication to %s failed: only an RSA key was found (tried: %s). "
                            "This libssh2 (1.10) cannot sign with rsa-sha2, which OpenSSH 8.8 and "
                            "later require. Run 'gpusync init --install-key' to create a dedicated "
                            "ed25519 key and install it with your password once",
                            target, tried);
    if (!accepts_password(methods))
        return gs_error_set(err, GS_E_AUTH,
                            "authentication to %s failed: the server takes no password (only %s) "
                            "and accepted none of the keys (tried: %s). Add a public key to "
                            "~/.ssh/authorized_keys on the server (gpusync's own is %s.pub), e.g. "
                            "through the provider's console",
                            target, methods, tried, GS_TARGET_MANAGED_KEY);
    return gs_error_set(err, GS_E_AUTH,
                        "authentication to %s failed: no key was accepted (tried: %s) and no "
                        "password was given%s. Set GPUSYNC_PASSWORD or use --password-stdin; "
                        "'gpusync init --install-key' installs a key with it once, so that later "
                        "commands need none",
                        target, tried, run->opts->ask_secret ? "" : " (no terminal to ask on)");
}

/* Tries ssh-agent and identity files; stores what worked in *method. Returns 0, GS_E_AUTH when
 * no key worked, or a connection error. */
static int run_methods(struct auth_run *run, const char *methods, char **method,
                       struct gs_error *err)
{
    int rc = try_agent(run, err);
    if (rc == 0 && authenticated(run)) {
        *method = gs_xstrdup("publickey (ssh-agent)");
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
        *method = gs_xstrdup("password");
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
        if (methods) {
            rc = accepts_password(methods) ? run_methods_password(&run, methods, method, err)
                                           : auth_failed(&run, methods, err);
        } else if (authenticated(&run)) {
            *method = gs_xstrdup("none");
            rc = 0;
        } else {
            rc = err && err->code
                     ? err->code
                     : gs_error_set(err, GS_E_AUTH, "%s: cannot list authentication methods",
                                    gs_ssh_target(s));
        }
        free(methods);
    }
    gs_buf_release(&run.tried);
    return rc;
}

int gs_auth_managed_key_ensure(struct gs_error *err)
{
    char *key = gs_path_expand_home(GS_TARGET_MANAGED_KEY);
    char *dir = gs_xstrdup(key);
    *strrchr(dir, '/') = '\0';
    mkdir(dir, 0700);
    free(dir);
    char *argv[] = {"ssh-keygen", "-q",      "-t", "ed25519", "-N", "",
                    "-C",         "gpusync", "-f", key,       NULL};
    struct gs_buf out = GS_BUF_INIT;
    int rc = gs_path_exists(key) ? 0 : gs_proc_capture(argv, &out, err);
    if (rc > 0)
        rc = gs_error_set(err, GS_E_IO, "ssh-keygen could not create %s (install openssh-client)",
                          key);
    gs_buf_release(&out);
    free(key);
    return rc;
}

/* The first line of the managed key's .pub ("ssh-ed25519 AAAA... gpusync") into `line`, and its
 * key field (the base64 blob, which identifies the key whatever comment a copy carries) into
 * `blob`. Returns 0 or GS_E_IO. */
static int read_managed_pub(struct gs_buf *line, struct gs_buf *blob, struct gs_error *err)
{
    char *key = gs_path_expand_home(GS_TARGET_MANAGED_KEY ".pub");
    FILE *fp = fopen(key, "r");
    char text[8192] = "", field[8192] = "";
    int rc = fp ? 0 : gs_error_errno(err, GS_E_IO, "cannot read %s", key);
    if (fp && (!fgets(text, sizeof(text), fp) || sscanf(text, "%*s %8191s", field) != 1))
        rc = gs_error_set(err, GS_E_IO, "%s is not a public key", key);
    if (fp)
        fclose(fp);
    text[strcspn(text, "\r\n")] = '\0';
    gs_buf_adds(line, text);
    gs_buf_adds(blob, field);
    free(key);
    return rc;
}

/* The shell command that installs `line` unless a line holds `blob` as one of its fields (so a
 * copy with options in front or another comment counts); prints "added" when it wrote. */
static void install_command(struct gs_buf *cmd, const char *line, const char *blob)
{
    gs_buf_adds(cmd, "umask 077 && mkdir -p ~/.ssh && f=~/.ssh/authorized_keys && touch \"$f\" && "
                     "if awk -v k=");
    gs_shell_quote(cmd, blob);
    gs_buf_adds(cmd, " '{ sub(/\\r$/, \"\"); for (i = 1; i <= NF; i++) if ($i == k) found = 1 } "
                     "END { exit !found }' \"$f\"; then :; else "
                     "{ [ -z \"$(tail -c 1 \"$f\")\" ] || echo; printf '%s\\n' ");
    gs_shell_quote(cmd, line);
    gs_buf_adds(cmd, "; } >> \"$f\" && echo added; fi");
}

int gs_auth_managed_key_install(struct gs_ssh *s, int *added, struct gs_error *err)
{
    struct gs_buf line = GS_BUF_INIT, blob = GS_BUF_INIT, cmd = GS_BUF_INIT;
    struct gs_buf out = GS_BUF_INIT, errout = GS_BUF_INIT;
    int rc = read_managed_pub(&line, &blob, err);
    if (rc == 0) {
        install_command(&cmd, line.data, blob.data);
        rc = gs_exec_capture(s, cmd.data, &out, &errout, err);
    }
    if (rc > 0)
        rc =
            gs_error_set(err, GS_E_REMOTE, "%s: could not add %s.pub to ~/.ssh/authorized_keys: %s",
                         gs_ssh_target(s), GS_TARGET_MANAGED_KEY,
                         errout.len ? errout.data : "the command failed");
    *added = rc == 0 && out.data && strstr(out.data, "added") != NULL;
    gs_buf_release(&line);
    gs_buf_release(&blob);
    gs_buf_release(&cmd);
    gs_buf_release(&out);
    gs_buf_release(&errout);
    return rc;
}

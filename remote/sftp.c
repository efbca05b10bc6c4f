/* remote/sftp.c: opening and closing a session's SFTP channels (see sftp.h). */
#include "remote/sftp.h"

#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "remote/exec.h"

/* SFTP runs as a program started through the user's login shell, so an rc file that prints
 * (a banner, nvidia-smi) corrupts its first packet and the start times out. No SFTP client can
 * work through that (OpenSSH's sftp, scp and rsync fail too), so say what is wrong: a command
 * started behind remote/exec.h's marker shows whether the shell prints. */
static int sftp_start_failed(struct gs_ssh *ssh, struct gs_error *err)
{
    struct gs_buf out = GS_BUF_INIT;
    struct gs_error probe = {0};
    int rc = gs_exec_capture(ssh, "true", &out, NULL, &probe);
    gs_buf_release(&out);
    const char *noise = gs_ssh_shell_noise(ssh);
    if (rc < 0 || !*noise)
        return gs_ssh_error(ssh, libssh2_session_last_errno(gs_ssh_session(ssh)),
                            "starting SFTP (is the sftp subsystem enabled?)", err);
    char first[81];
    size_t n = strcspn(noise, "\r\n");
    snprintf(first, sizeof(first), "%.*s", (int)(n < 80 ? n : 80), noise);
    return gs_error_set(err, GS_E_PROTO,
                        "SFTP cannot start on %s: the server's shell prints text before any "
                        "command runs (\"%s\"), which breaks the SFTP protocol (OpenSSH's sftp, "
                        "scp and rsync fail there too). Make that rc file quiet when the shell is "
                        "not interactive (`gpusync doctor` names it), or use transport = agent, "
                        "which is not affected",
                        gs_ssh_target(ssh), first);
}

int gs_sftp_pool_open(struct gs_sftp_pool *pool, struct gs_ssh *ssh, struct gs_error *err)
{
    int rc;
    LIBSSH2_SFTP *sftp;
    memset(pool, 0, sizeof(*pool));
    pool->ssh = ssh;
    GS_SSH_RETRY_PTR(ssh, sftp, libssh2_sftp_init(gs_ssh_session(ssh)), 0, err, rc);
    if (!sftp) {
        if (rc == 0)
            sftp_start_failed(ssh, err);
        return err && err->code ? err->code : GS_E_REMOTE;
    }
    pool->chan[pool->n++] = sftp;
    return 0;
}

int gs_sftp_pool_grow(struct gs_sftp_pool *pool, struct gs_error *err)
{
    LIBSSH2_SFTP *sftp;
    int rc;
    if (pool->n >= GS_SFTP_POOL_MAX)
        pool->full = 1;
    if (pool->full)
        return 0;
    GS_SSH_RETRY_PTR(pool->ssh, sftp, libssh2_sftp_init(gs_ssh_session(pool->ssh)), 0, err, rc);
    if (rc < 0)
        return rc;
    if (sftp) {
        pool->chan[pool->n++] = sftp;
        return 0;
    }
    pool->full = 1;
    rc = libssh2_session_last_errno(gs_ssh_session(pool->ssh));
    if (rc == LIBSSH2_ERROR_SOCKET_DISCONNECT || rc == LIBSSH2_ERROR_SOCKET_SEND ||
        rc == LIBSSH2_ERROR_SOCKET_RECV)
        return gs_ssh_error(pool->ssh, rc, "opening an SFTP channel", err);
    return 0;
}

void gs_sftp_pool_release(struct gs_sftp_pool *pool)
{
    for (int i = 0; i < pool->n; i++) {
        int rc;
        GS_SSH_RETRY(pool->ssh, rc, libssh2_sftp_shutdown(pool->chan[i]), 0, NULL);
        (void)rc;
    }
    pool->n = 0;
}

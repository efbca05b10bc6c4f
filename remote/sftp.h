/* remote/sftp.h: the SFTP channels of one SSH session, opened as a small pool.
 *
 * SFTP is the fallback transport (design decision 4); its operations live in remote/sftp_ops.c,
 * behind struct gs_fileops. Each SFTP request of a kind is serialised per channel, so a pool (at
 * most 8: OpenSSH allows 10 sessions per connection) lets that transport keep several in flight.
 * This module only opens and closes the channels, and says why when SFTP cannot start. */
#ifndef GS_SFTP_H
#define GS_SFTP_H

#include <libssh2.h>
#include <libssh2_sftp.h>

#include "common/error.h"
#include "remote/ssh.h"

#define GS_SFTP_POOL_MAX 8

struct gs_sftp_pool {
    struct gs_ssh *ssh;
    LIBSSH2_SFTP *chan[GS_SFTP_POOL_MAX];
    int n;
    int full; /* GS_SFTP_POOL_MAX channels, or the server refused another (its MaxSessions) */
};

/* Opens the pool with one channel (gs_sftp_pool_grow adds more). Returns 0, or a negative code
 * with a message (a login shell that prints breaks SFTP: the message says so) and the pool holds
 * nothing. Release with gs_sftp_pool_release before freeing `ssh`, which the pool borrows. */
int gs_sftp_pool_open(struct gs_sftp_pool *pool, struct gs_ssh *ssh, struct gs_error *err);

/* Opens one more channel unless the pool is full. A refusal by the server is no error: it sets
 * pool->full and the pool keeps the channels it has. Returns 0, or a negative code when the
 * connection failed. */
int gs_sftp_pool_grow(struct gs_sftp_pool *pool, struct gs_error *err);

/* Shuts every channel down, waiting for the server's answers; the pool is empty afterwards. */
void gs_sftp_pool_release(struct gs_sftp_pool *pool);

#endif

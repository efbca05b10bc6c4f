/* remote/sftp_ops.h: the SFTP fallback transport (design decision 4) behind struct gs_fileops.
 *
 * PUTs of files up to 256 KiB overlap: each runs on its own SFTP channel of a pool that grows on
 * demand to GS_SFTP_POOL_MAX (fewer if the server's MaxSessions refuses more), so up to 8 are in
 * flight. Every other operation, a larger file, or a PUT of a path still in flight first waits
 * for those to finish and then runs alone, so operations take effect in submission order
 * wherever the order matters. Completions come from inside submit or drain, always in
 * submission order. Setting GPUSYNC_SFTP_SEQUENTIAL in the environment turns the overlap off
 * (for comparisons and for diagnosing a server). Measured through the WAN simulator at 50 ms RTT
 * and 50 Mbit/s: about 37 ms per 4 KiB file overlapped, 312 ms one at a time.
 * It works against any SFTP server, with these limits, which the agent does not have:
 *   - Replace is not atomic: OpenSSH's SFTP rename refuses to overwrite and libssh2 1.10 has no
 *     posix-rename, so a PUT uploads to "<path>.gpusync-tmp-<pid>", then unlinks the old target,
 *     then renames. A reader can see the path missing for one round trip, never a partial file.
 *   - SFTP cannot hash a remote file without downloading it, so GS_FOP_EXPECT_HASH reads the
 *     server's file back whole before replacing or deleting it (whatever its size: a large file
 *     costs its download once more) and keeps it as NAME.gpusync-conflict-YYYYmmdd-HHMMSS[-N]
 *     (local time of the client) when its content differs (a directory in the way is kept too).
 *     GS_FOP_EXPECT_ABSENT keeps what is there when it is not a regular file or its size
 *     differs from req->size; an equal-sized regular file is read back too, and kept unless it
 *     holds req->content_hash (an interrupted push's); for DELETE, RENAME and SYMLINK, anything
 *     there is kept, except a symlink already pointing at the requested target.
 *     GS_FOP_EXPECT_DIR keeps anything that is not a directory.
 *   - The server resolves paths itself and follows symlinks, so before any write, delete,
 *     rename, chmod or probe every parent directory below the root is looked at (lstat, once
 *     per directory between two drains): a path through a symlink or a non-directory is refused
 *     with ELOOP or ENOTDIR, as the agent refuses it. A link swapped in between that check and
 *     the operation is not caught: SFTP has no equivalent of openat(O_NOFOLLOW).
 *   - Modes are sent without setuid and setgid (as the agent applies them).
 *   - mtime travels as whole seconds from 1970 to 2106 (SFTP v3 has unsigned 32-bit second
 *     times; one outside is set to the nearest); atime is set to mtime.
 *   - OpenSSH reports most failures as a bare SSH_FX_FAILURE. A failed open, write or close is
 *     reported as ENOSPC when the server's filesystem (statvfs@openssh.com) is out of space or
 *     inodes, else as EIO; a failed rmdir of a directory as ENOTEMPTY.
 *   - OpenSSH takes SSH_FXP_SYMLINK's two paths in the reverse of the draft's order; the server's
 *     banner decides which order is sent. libssh2 1.10 misreads the status of SSH_FXP_SYMLINK
 *     (measured: a created link reported as a failure), so a symlink is checked by reading it
 *     back, one more round trip.
 * Paths are not checked for ".." (the sync engine only sends paths from its own scan). */
#ifndef GS_SFTP_OPS_H
#define GS_SFTP_OPS_H

#include "common/error.h"
#include "remote/fileops.h"
#include "remote/ssh.h"

/* Opens an SFTP channel on `ssh` (more are opened as PUTs overlap) and creates `remote_root`
 * (mkdir -p): an absolute path, or one relative to the SFTP start directory (the login's home).
 * Request paths are relative to it. On success stores the transport in *out and returns 0: set
 * its done/done_ctx before submitting, and close it with (*out)->close before freeing `ssh`,
 * which it borrows. close after a drain ends at once; close with operations still in flight
 * lets them finish first, without completions. On failure returns a negative code with a
 * message naming the root and the server, and *out is NULL.
 * An operation that fails on the server completes with !ok, an errno and a message naming its
 * path; a transport failure makes submit and drain (that call and every later one) return a
 * negative GS_E_* code, and no further completions come. */
int gs_sftp_ops_open(struct gs_fileops **out, struct gs_ssh *ssh, const char *remote_root,
                     struct gs_error *err);

#endif

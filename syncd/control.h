/* syncd/control.h: the daemon's control socket protocol, the one definition for the daemon and
 * every client (the CLI, and through it the editor plugins).
 *
 * Socket: .gpusync/daemon.sock in the project (UNIX stream). Messages are JSON objects, one per
 * line, and every message carries "v": GS_CONTROL_VERSION. Requests:
 *
 *   {"v":1,"cmd":"status"}   -> {"v":1,"ok":true,"daemon":true,"state":"up_to_date"|"syncing"|
 *                               "disconnected"|"connecting","connected":bool,"pending":N,
 *                               "last_error":S|null,"last_latency_ms":N|null,"target":S,
 *                               "transport":S,"pid":N,"watches":N,"polling":bool,
 *                               "spare_ready":bool,"relayed":N,"unreachable_since":S|null,
 *                               "conflicts":[{"path":S,"kept":S}]}
 *   {"v":1,"cmd":"ack_conflicts"}
 *                            -> the status reply as it was, then "conflicts" is emptied: what is
 *                               acknowledged is exactly what the caller shows
 *   {"v":1,"cmd":"flush"}    -> {"v":1,"ok":true,"ms":N,"conflicts":[...]} once the server matches
 *                               what was on disk when the request arrived, or
 *                               {"v":1,"ok":false,"error":S} (during an outage also
 *                               "unreachable_since":S and "pending":N)
 *   {"v":1,"cmd":"events"}   -> {"v":1,"ok":true} then one event per line until the client leaves:
 *                               {"v":1,"event":"synced","path":S,"ms":N}
 *                               {"v":1,"event":"deleted","path":S}
 *                               {"v":1,"event":"renamed","path":S,"from":S}
 *                               {"v":1,"event":"conflict","path":S,"kept":S}
 *                               {"v":1,"event":"error","path":S|null,"message":S}
 *                               {"v":1,"event":"connected","target":S}
 *                               {"v":1,"event":"disconnected","message":S}
 *                               {"v":1,"event":"idle"} (the server matches the local tree)
 *   {"v":1,"cmd":"stop"}     -> {"v":1,"ok":true}, then the daemon exits
 *   {"v":1,"cmd":"exec","command":S}
 *                            -> {"v":1,"ok":true}, then S's output on the daemon's spare
 *                               connection (relay.h) as frames, not JSON: "o LEN\n" and LEN bytes
 *                               of stdout, "e LEN\n" and LEN bytes of stderr, and at the end
 *                               "x STATUS\n" (its exit status, -1 if unknown); then the daemon
 *                               closes. Or {"v":1,"ok":false,"error":S} and close.
 *
 * A request with another "v" gets {"v":1,"ok":false,"error":"protocol version ..."}. */
#ifndef GS_SYNCD_CONTROL_H
#define GS_SYNCD_CONTROL_H

#include <jansson.h>

#include "common/buf.h"
#include "common/error.h"

#define GS_CONTROL_VERSION 1
/* The longest request line a client may send; more without a newline is garbage (a client that
 * streams bytes must not grow the daemon's memory without bound). */
#define GS_CONTROL_MAX_LINE    (64 * 1024)
#define GS_CONTROL_SOCKET_NAME "daemon.sock" /* in the project's .gpusync/ */
#define GS_CONTROL_SOCKET      ".gpusync/daemon.sock"
#define GS_CONTROL_LOCK        ".gpusync/daemon.lock"
#define GS_CONTROL_LOG         ".gpusync/daemon.log"

/* Binds (daemon) or connects (client) the socket of the project at `root`, working around the
 * 108-byte limit of socket paths. Return a descriptor, or GS_E_NOTFOUND (client: no daemon
 * listening) / GS_E_IO. */
int gs_control_listen(const char *root, struct gs_error *err);
int gs_control_connect(const char *root, struct gs_error *err);

/* Sends one message (adds "v" and the newline). Returns 0 or GS_E_IO. Does not steal `msg`. */
int gs_control_send(int fd, json_t *msg, struct gs_error *err);

/* Reads the next message from `fd`, buffering partial lines in `buf`. Waits up to `timeout_ms`
 * (-1: forever). Returns 0 with *msg (a new reference), GS_E_TIMEOUT, GS_E_DISCONNECTED at EOF, or
 * GS_E_PROTO for a line that is not JSON or has the wrong version. */
int gs_control_recv(int fd, struct gs_buf *buf, json_t **msg, int timeout_ms, struct gs_error *err);

/* One request and its answer: connects to the daemon of the project at `root`, sends
 * {"cmd": cmd}, waits up to `timeout_ms` for the reply and closes. Returns 0 with *reply (a new
 * reference), GS_E_NOTFOUND when no daemon listens (err untouched), or GS_E_TIMEOUT /
 * GS_E_DISCONNECTED / GS_E_PROTO with err set. */
int gs_control_request(const char *root, const char *cmd, int timeout_ms, json_t **reply,
                       struct gs_error *err);

/* As gs_control_request, and meanwhile follows the daemon's event stream on a second connection,
 * handing each "progress" event (a batch's {ops_done, ops_total, bytes, bytes_total}) to `fn`:
 * a flush or push that waits on a large upload shows it moving. */
typedef void (*gs_control_progress_fn)(void *ctx, const json_t *event);
int gs_control_request_progress(const char *root, const char *cmd, int timeout_ms,
                                gs_control_progress_fn fn, void *ctx, json_t **reply,
                                struct gs_error *err);

/* Asks the daemon of the project at `root` to run `command` on the server ("exec" above). Returns
 * a descriptor whose next bytes are the frames (any already read are left in `buf`), GS_E_NOTFOUND
 * when no daemon listens or it does not relay (err untouched then), or GS_E_REMOTE with the
 * daemon's error (it could not reach the server). */
int gs_control_exec(const char *root, const char *command, struct gs_buf *buf,
                    struct gs_error *err);

/* Pops one frame of an exec stream from `buf`: returns 1 with *kind 'o' or 'e' and the bytes in
 * `data` (replaced), or 'x' with *status; 0 when no frame is complete; -1 on garbage. */
int gs_control_frame_pop(struct gs_buf *buf, char *kind, struct gs_buf *data, int *status);

/* Pops one complete line from `buf` as JSON, or returns 0 with *msg NULL if none is complete. */
int gs_control_pop(struct gs_buf *buf, json_t **msg, struct gs_error *err);

#endif

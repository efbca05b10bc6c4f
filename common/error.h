/* common/error.h: gpusync's error codes, defined once, and the error-message convention.
 *
 * Library code never prints or exits: a failing function returns a negative GS_E* code and, when
 * given a non-NULL `struct gs_error *`, fills in a message that says what failed, where, and what
 * to do next. Only cli/ decides what the user sees and which exit status follows
 * (gs_error_exit_code). */
#ifndef GS_ERROR_H
#define GS_ERROR_H

#include <stdarg.h>

/* X(NAME, exit status, short description). GS_E_OK is 0; the others are -1000 - position, far from
 * libssh2's own negative codes (-1 to -50), so a value from either library is never mistaken for
 * the other's. */
#define GS_ERROR_LIST(X)                                                                           \
    X(OK, 0, "success")                                                                            \
    X(ERR, 1, "error")                                                                             \
    X(NOMEM, 1, "out of memory")                                                                   \
    X(IO, 1, "input/output error")                                                                 \
    X(USAGE, 2, "usage error")                                                                     \
    X(CONFIG, 3, "configuration error")                                                            \
    X(NOTFOUND, 1, "not found")                                                                    \
    X(CONNECT, 4, "cannot connect")                                                                \
    X(HOSTKEY_UNKNOWN, 4, "unknown host key")                                                      \
    X(HOSTKEY_CHANGED, 4, "host key changed")                                                      \
    X(AUTH, 4, "authentication failed")                                                            \
    X(TIMEOUT, 4, "timed out")                                                                     \
    X(DISCONNECTED, 4, "connection lost")                                                          \
    X(PROTO, 5, "protocol error")                                                                  \
    X(REMOTE, 5, "remote error")                                                                   \
    X(CONFLICT, 6, "conflict")                                                                     \
    X(INTERRUPTED, 130, "interrupted")

/* The exit status each error gives, by the error's name: GS_EXIT_USAGE is 2, GS_EXIT_CONNECT 4. */
enum gs_exit_status {
#define GS_X_EXIT(name, exit, text) GS_EXIT_##name = exit,
    GS_ERROR_LIST(GS_X_EXIT)
#undef GS_X_EXIT
};

enum gs_error_code {
#define GS_X_ENUM(name, exit, text) GS_E_##name##_POS,
    GS_ERROR_LIST(GS_X_ENUM)
#undef GS_X_ENUM
        GS_E__COUNT
};

#define GS_E_BASE       1000
#define GS_E_CODE(name) (GS_E_##name##_POS ? -(GS_E_BASE + (int)GS_E_##name##_POS) : 0)
/* True for a gpusync error code (as opposed to a libssh2 or other negative code). */
#define GS_IS_ERROR(rc)      ((rc) <= -GS_E_BASE)
#define GS_E_OK              GS_E_CODE(OK)
#define GS_E_ERR             GS_E_CODE(ERR)
#define GS_E_NOMEM           GS_E_CODE(NOMEM)
#define GS_E_IO              GS_E_CODE(IO)
#define GS_E_USAGE           GS_E_CODE(USAGE)
#define GS_E_CONFIG          GS_E_CODE(CONFIG)
#define GS_E_NOTFOUND        GS_E_CODE(NOTFOUND)
#define GS_E_CONNECT         GS_E_CODE(CONNECT)
#define GS_E_HOSTKEY_UNKNOWN GS_E_CODE(HOSTKEY_UNKNOWN)
#define GS_E_HOSTKEY_CHANGED GS_E_CODE(HOSTKEY_CHANGED)
#define GS_E_AUTH            GS_E_CODE(AUTH)
#define GS_E_TIMEOUT         GS_E_CODE(TIMEOUT)
#define GS_E_DISCONNECTED    GS_E_CODE(DISCONNECTED)
#define GS_E_PROTO           GS_E_CODE(PROTO)
#define GS_E_REMOTE          GS_E_CODE(REMOTE)
#define GS_E_CONFLICT        GS_E_CODE(CONFLICT)
#define GS_E_INTERRUPTED     GS_E_CODE(INTERRUPTED)

#define GS_ERROR_MSG_MAX 1024

/* An error as returned to the caller: a code and a full sentence. Zero-initialise before use. */
struct gs_error {
    int code;
    char msg[GS_ERROR_MSG_MAX];
};

/* Records `code` and a printf-style message in `err` (if not NULL) and returns `code`, so a failure
 * is one line: `return gs_error_set(err, GS_E_IO, "%s: cannot read", path);`. */
int gs_error_set(struct gs_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* As gs_error_set, appending ": strerror(errno)" for the errno current at the call. errno is
 * preserved. */
int gs_error_errno(struct gs_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the message already in `err` with more context ("connecting to host: <old message>"). */
int gs_error_wrap(struct gs_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Static text for a code ("host key changed"); "unknown error" for a code outside the list. */
const char *gs_error_name(int code);

/* The process exit status for a code, as documented in README.md and `gpusync --help`. (exec and
 * run exit 255 where this says 4: cli/ decides that, in gs_cli_fail.) */
int gs_error_exit_code(int code);

/* Clears `err` back to GS_E_OK with an empty message. */
void gs_error_clear(struct gs_error *err);

#endif

/* common/quote.h: file names and messages rendered for a human's terminal, so that a name with a
 * newline, an escape sequence or bytes that are not UTF-8 can neither redraw the terminal nor
 * pass for two lines or another name.
 *
 * A name that needs it is shown in double quotes with C escapes (\n \t \r \e \\ \" \' \xNN),
 * which bash's $'...' reads back to the same bytes; any other name, valid non-ASCII UTF-8 included,
 * is shown as it is. Only text output uses this: --json output escapes by JSON's own rules. */
#ifndef GS_QUOTE_H
#define GS_QUOTE_H

#include <stddef.h>

#include "common/buf.h"

/* Flags of gs_quote_message. */
enum gs_quote_flags {
    GS_QUOTE_KEEP_LINES = 1 << 0, /* newlines and tabs outside the names stay (a multi-line
                                     message, such as a build's output) */
};

/* The length (1 to 4) of the valid UTF-8 sequence at s, or 0 when the byte there starts none
 * (overlong forms, surrogates and code points past U+10FFFF included). s is NUL-terminated. */
size_t gs_quote_utf8_len(const char *s);

/* Whether `name` must be quoted: it holds a control byte (below 0x20, 0x7f, or a C1 control as
 * UTF-8), a bidirectional formatting character (U+202E and the like), `"`, `\` or bytes that are
 * not UTF-8. */
int gs_quote_needed(const char *name);

/* Appends `name` quoted with C escapes, whether it needs it or not (see gs_quote_path). */
void gs_quote_always(struct gs_buf *out, const char *name);

/* Appends `name` for a human: quoted with C escapes when gs_quote_needed says so, else as it is.
 * The text appended is always valid UTF-8 without control bytes. */
void gs_quote_path(struct gs_buf *out, const char *name);

/* The same, into a buffer of the caller's that lives until the next call with it: for a printf
 * argument. Returns buf->data after resetting `buf`. */
const char *gs_quote_str(struct gs_buf *buf, const char *name);

/* Appends `msg`, a message built elsewhere (the transport, the agent, the daemon) that may hold
 * raw file names: each occurrence of a name of `names` (NULL-terminated; NULL: none) is replaced
 * by its gs_quote_path form, and any other control byte or byte that is not UTF-8 is written as
 * its C escape, without quotes. The text appended is valid UTF-8 without control bytes, except the
 * newlines and tabs GS_QUOTE_KEEP_LINES keeps. */
void gs_quote_message(struct gs_buf *out, const char *msg, const char *const *names, int flags);

#endif

/* common/quote.c: file names and messages rendered for a human's terminal (see quote.h). */
#include "common/quote.h"

#include <string.h>

size_t gs_quote_utf8_len(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    static const unsigned min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (s[0] < 0x80)
        return 1;
    size_t n = (s[0] & 0xE0) == 0xC0   ? 2
               : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4
                                       : 0;
    if (!n)
        return 0;
    unsigned cp = s[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) /* a NUL ends the string here too */
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* Whether the 3-byte sequence at s is a bidirectional formatting character: U+200E and U+200F
 * (marks), U+202A to U+202E (embeddings and overrides), U+2066 to U+2069 (isolates). Printed raw,
 * one reorders the rest of the line on the terminal: "a\u202etxt.exe" shows as "aexe.txt". */
static int is_bidi(const unsigned char *s)
{
    return s[0] == 0xe2 &&
           ((s[1] == 0x80 && (s[2] == 0x8e || s[2] == 0x8f || (s[2] >= 0xaa && s[2] <= 0xae))) ||
            (s[1] == 0x81 && s[2] >= 0xa6 && s[2] <= 0xa9));
}

/* Whether the sequence of length n at s is a control character: C0, DEL, C1 (U+0080 to U+009F,
 * which some terminals take as CSI and the like), or a bidirectional formatting one. */
static int is_control(const unsigned char *s, size_t n)
{
    return (n == 1 && (s[0] < 0x20 || s[0] == 0x7f)) || (n == 2 && s[0] == 0xc2 && s[1] <= 0x9f) ||
           (n == 3 && is_bidi(s));
}

int gs_quote_needed(const char *name)
{
    for (const unsigned char *s = (const unsigned char *)name; *s;) {
        size_t n = gs_quote_utf8_len((const char *)s);
        if (!n || is_control(s, n) || *s == '"' || *s == '\\')
            return 1;
        s += n;
    }
    return 0;
}

/* Appends the C escape of the single byte c. */
static void add_escape(struct gs_buf *out, unsigned char c)
{
    static const char named[] = {['\n'] = 'n', ['\t'] = 't', ['\r'] = 'r', [0x1b] = 'e'};
    if (c < sizeof(named) && named[c])
        gs_buf_addf(out, "\\%c", named[c]);
    else
        gs_buf_addf(out, "\\x%02x", c);
}

/* Appends the sequence at s (its length n, 0 for a byte that starts none), escaped if it is a
 * control or not UTF-8; `"`, `\` and `'` too inside quotes. Returns the bytes it took. */
static size_t add_char(struct gs_buf *out, const unsigned char *s, size_t n, int quoted)
{
    if (!n || is_control(s, n)) {
        for (size_t i = 0; i < (n ? n : 1); i++)
            add_escape(out, s[i]);
    } else if (quoted && (*s == '"' || *s == '\\' || *s == '\'')) { /* ' ends bash's $'...' */
        gs_buf_addf(out, "\\%c", *s);
    } else {
        gs_buf_add(out, s, n);
    }
    return n ? n : 1;
}

void gs_quote_always(struct gs_buf *out, const char *name)
{
    gs_buf_addc(out, '"');
    for (const unsigned char *s = (const unsigned char *)name; *s;)
        s += add_char(out, s, gs_quote_utf8_len((const char *)s), 1);
    gs_buf_addc(out, '"');
}

void gs_quote_path(struct gs_buf *out, const char *name)
{
    if (gs_quote_needed(name))
        gs_quote_always(out, name);
    else
        gs_buf_adds(out, name);
}

const char *gs_quote_str(struct gs_buf *buf, const char *name)
{
    gs_buf_reset(buf);
    gs_buf_grow(buf, 0); /* data is never NULL, even for an empty name */
    gs_quote_path(buf, name ? name : "");
    return buf->data;
}

/* The longest name of `names` that `msg` starts with, or NULL. */
static const char *name_at(const char *msg, const char *const *names)
{
    const char *best = NULL;
    for (size_t i = 0; names && names[i]; i++) {
        size_t len = strlen(names[i]);
        if (len && strncmp(msg, names[i], len) == 0 && (!best || len > strlen(best)))
            best = names[i];
    }
    return best;
}

void gs_quote_message(struct gs_buf *out, const char *msg, const char *const *names, int flags)
{
    gs_buf_grow(out, strlen(msg)); /* never NULL data, even for an empty message */
    for (const unsigned char *s = (const unsigned char *)msg; *s;) {
        const char *name = name_at((const char *)s, names);
        if (name) {
            gs_quote_path(out, name);
            s += strlen(name);
        } else if ((flags & GS_QUOTE_KEEP_LINES) && (*s == '\n' || *s == '\t')) {
            gs_buf_addc(out, (char)*s++);
        } else {
            s += add_char(out, s, gs_quote_utf8_len((const char *)s), 0);
        }
    }
}

/* jsonw: a minimal JSON writer and span reader for the agent's run files (see jsonw.h). The
 * reader never allocates: it walks the caller's text and hands back spans. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "jsonw.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wrapper.h"

void ga_jw_init(struct ga_jw *w)
{
    memset(w, 0, sizeof(*w));
}

void ga_jw_release(struct ga_jw *w)
{
    free(w->buf);
    ga_jw_init(w);
}

/* Appends n bytes, growing the buffer geometrically. */
static void jw_put(struct ga_jw *w, const char *s, size_t n)
{
    GA_ALLOC_GROW(w->buf, w->len + n + 1, w->cap);
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = 0;
}

/* Called before every value or key: separates it from the previous one. */
static void jw_sep(struct ga_jw *w)
{
    if (w->need_comma)
        jw_put(w, ",", 1);
    w->need_comma = 0;
}

void ga_jw_obj(struct ga_jw *w)
{
    jw_sep(w);
    jw_put(w, "{", 1);
}

void ga_jw_obj_end(struct ga_jw *w)
{
    jw_put(w, "}", 1);
    w->need_comma = 1;
}

void ga_jw_arr(struct ga_jw *w)
{
    jw_sep(w);
    jw_put(w, "[", 1);
}

void ga_jw_arr_end(struct ga_jw *w)
{
    jw_put(w, "]", 1);
    w->need_comma = 1;
}

/* Writes a quoted, escaped string without separator handling. */
static void jw_quoted(struct ga_jw *w, const char *s)
{
    jw_put(w, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            jw_put(w, esc, 2);
        } else if (*p == '\n') {
            jw_put(w, "\\n", 2);
        } else if (*p == '\t') {
            jw_put(w, "\\t", 2);
        } else if (*p < 0x20 || *p == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", *p);
            jw_put(w, esc, 6);
        } else {
            jw_put(w, (const char *)p, 1);
        }
    }
    jw_put(w, "\"", 1);
}

void ga_jw_key(struct ga_jw *w, const char *key)
{
    jw_sep(w);
    jw_quoted(w, key);
    jw_put(w, ":", 1);
}

void ga_jw_str(struct ga_jw *w, const char *s)
{
    if (!s) {
        ga_jw_null(w);
        return;
    }
    jw_sep(w);
    jw_quoted(w, s);
    w->need_comma = 1;
}

void ga_jw_int(struct ga_jw *w, long long v)
{
    char num[32];
    int n = snprintf(num, sizeof(num), "%lld", v);
    jw_sep(w);
    jw_put(w, num, (size_t)n);
    w->need_comma = 1;
}

void ga_jw_null(struct ga_jw *w)
{
    jw_sep(w);
    jw_put(w, "null", 4);
    w->need_comma = 1;
}

void ga_jw_bool(struct ga_jw *w, int v)
{
    ga_jw_raw(w, v ? "true" : "false", v ? 4 : 5);
}

void ga_jw_key_int(struct ga_jw *w, const char *key, long long v)
{
    ga_jw_key(w, key);
    ga_jw_int(w, v);
}

void ga_jw_key_str(struct ga_jw *w, const char *key, const char *s)
{
    ga_jw_key(w, key);
    ga_jw_str(w, s);
}

void ga_jw_key_bool(struct ga_jw *w, const char *key, int v)
{
    ga_jw_key(w, key);
    ga_jw_bool(w, v);
}

void ga_jw_raw(struct ga_jw *w, const char *json, size_t n)
{
    jw_sep(w);
    jw_put(w, json, n);
    w->need_comma = 1;
}

void ga_jw_text(struct ga_jw *w, const char *text)
{
    jw_put(w, text, strlen(text));
}

/* ---- reader ------------------------------------------------------------------------------ */

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Returns the end of the string starting at p (on its quote), or NULL. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

/* Returns the end of the value starting at p, or NULL if malformed. Containers are matched by
 * depth, with strings skipped so brackets inside them do not count. */
static const char *skip_value(const char *p, const char *end)
{
    if (p >= end)
        return NULL;
    if (*p == '"')
        return skip_string(p, end);
    if (*p != '{' && *p != '[') {
        while (p < end && !strchr(",}] \t\r\n", *p))
            p++;
        return p;
    }
    int depth = 0;
    while (p < end) {
        if (*p == '"') {
            p = skip_string(p, end);
            if (!p)
                return NULL;
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        p++;
        if (depth == 0)
            return p;
    }
    return NULL;
}

/* Steps over one member or element separator inside a container: returns the start of the
 * next item, NULL at the closing bracket, or sets *bad. */
static const char *next_item(const char *p, const char *end, char close, int first, int *bad)
{
    p = skip_ws(p, end);
    if (p < end && *p == close)
        return NULL;
    if (!first) {
        if (p >= end || *p != ',') {
            *bad = 1;
            return NULL;
        }
        p = skip_ws(p + 1, end);
    }
    if (p >= end)
        *bad = 1;
    return p < end ? p : NULL;
}

int ga_json_next(struct ga_json_span arr, size_t *pos, struct ga_json_span *elem)
{
    const char *end = arr.p + arr.n, *p = skip_ws(arr.p, end);
    if (p >= end || *p != '[')
        return -1;
    int bad = 0, first = *pos == 0;
    p = first ? p + 1 : arr.p + *pos;
    p = next_item(p, end, ']', first, &bad);
    if (!p)
        return bad ? -1 : 0;
    const char *e = skip_value(p, end);
    if (!e)
        return -1;
    elem->p = p;
    elem->n = (size_t)(e - p);
    *pos = (size_t)(e - arr.p);
    return 1;
}

int ga_json_get(struct ga_json_span obj, const char *key, struct ga_json_span *val)
{
    const char *end = obj.p + obj.n, *p = skip_ws(obj.p, end);
    if (p >= end || *p != '{')
        return -1;
    p++;
    size_t klen = strlen(key);
    for (int first = 1;; first = 0) {
        int bad = 0;
        p = next_item(p, end, '}', first, &bad);
        if (!p || *p != '"')
            return -1;
        const char *ke = skip_string(p, end);
        if (!ke)
            return -1;
        int match = (size_t)(ke - p - 2) == klen && !memcmp(p + 1, key, klen);
        p = skip_ws(ke, end);
        if (p >= end || *p != ':')
            return -1;
        p = skip_ws(p + 1, end);
        const char *ve = skip_value(p, end);
        if (!ve)
            return -1;
        if (match) {
            val->p = p;
            val->n = (size_t)(ve - p);
            return 0;
        }
        p = ve;
    }
}

int ga_json_is_null(struct ga_json_span v)
{
    return v.n == 4 && !memcmp(v.p, "null", 4);
}

int ga_json_int(struct ga_json_span v, long long *out)
{
    char num[32];
    if (v.n == 0 || v.n >= sizeof(num))
        return -1;
    memcpy(num, v.p, v.n);
    num[v.n] = 0;
    char *e;
    errno = 0;
    long long x = strtoll(num, &e, 10);
    if (errno || *e || e == num)
        return -1;
    *out = x;
    return 0;
}

/* Appends the UTF-8 encoding of code point c; returns bytes written or -1 if no room. */
static int put_utf8(char *d, size_t room, unsigned c)
{
    if (c < 0x80 && room >= 1) {
        d[0] = (char)c;
        return 1;
    }
    if (c < 0x800 && room >= 2) {
        d[0] = (char)(0xc0 | (c >> 6));
        d[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c >= 0x800 && room >= 3) {
        d[0] = (char)(0xe0 | (c >> 12));
        d[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        d[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    return -1;
}

/* Decodes one escape after a backslash at *pp; advances *pp. Returns bytes written or -1. */
static int unescape_one(const char **pp, const char *end, char *d, size_t room)
{
    const char *p = *pp;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *k = p < end ? strchr(from, *p) : NULL;
    if (k && *p) {
        *pp = p + 1;
        return room ? (d[0] = to[k - from], 1) : -1;
    }
    if (p + 5 > end || *p != 'u')
        return -1;
    char hex[5] = {p[1], p[2], p[3], p[4], 0};
    char *e;
    unsigned c = (unsigned)strtoul(hex, &e, 16);
    if (*e)
        return -1;
    *pp = p + 5;
    return put_utf8(d, room, c);
}

int ga_json_str(struct ga_json_span v, char *dst, size_t cap)
{
    if (v.n < 2 || v.p[0] != '"' || v.p[v.n - 1] != '"' || cap == 0)
        return -1;
    const char *p = v.p + 1, *end = v.p + v.n - 1;
    size_t o = 0;
    while (p < end) {
        int n;
        if (*p == '\\') {
            p++;
            n = unescape_one(&p, end, dst + o, cap - 1 - o);
        } else {
            n = o + 1 < cap ? (dst[o] = *p++, 1) : -1;
        }
        if (n < 0)
            return -1;
        o += (size_t)n;
    }
    dst[o] = 0;
    return 0;
}

long long ga_json_get_int(struct ga_json_span obj, const char *key, long long def)
{
    struct ga_json_span v;
    long long x;
    if (ga_json_get(obj, key, &v) < 0 || ga_json_int(v, &x) < 0)
        return def;
    return x;
}

void ga_json_get_str(struct ga_json_span obj, const char *key, char *dst, size_t cap)
{
    struct ga_json_span v;
    if (cap)
        dst[0] = 0;
    if (ga_json_get(obj, key, &v) < 0 || ga_json_str(v, dst, cap) < 0) {
        if (cap)
            dst[0] = 0;
    }
}

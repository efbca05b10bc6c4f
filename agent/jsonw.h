/* jsonw: the agent's tiny JSON support, libc only: a writer that appends to a growable buffer
 * (meta.json, status.json, `ps --json`) and a reader that finds the raw text of a value by key,
 * enough to read back the flat files the agent itself writes. */
#ifndef GA_JSONW_H
#define GA_JSONW_H

#include <stddef.h>

/* A JSON document being written. Commas are inserted automatically. Memory comes from
 * ga_xrealloc (wrapper.h), so writing cannot fail. */
struct ga_jw {
    char *buf; /* NUL-terminated text, owned; NULL until the first write */
    size_t len, cap;
    int need_comma; /* a value was just completed at the current level */
};

void ga_jw_init(struct ga_jw *w);
/* Frees the text; *w is then empty (init state). */
void ga_jw_release(struct ga_jw *w);
void ga_jw_obj(struct ga_jw *w);
void ga_jw_obj_end(struct ga_jw *w);
void ga_jw_arr(struct ga_jw *w);
void ga_jw_arr_end(struct ga_jw *w);
/* Writes "key": ; the next call writes its value. */
void ga_jw_key(struct ga_jw *w, const char *key);
/* Writes s as a JSON string (escaped), or null if s is NULL. */
void ga_jw_str(struct ga_jw *w, const char *s);
void ga_jw_int(struct ga_jw *w, long long v);
void ga_jw_null(struct ga_jw *w);
void ga_jw_bool(struct ga_jw *w, int v);
/* "key": value, in one call. */
void ga_jw_key_int(struct ga_jw *w, const char *key, long long v);
void ga_jw_key_str(struct ga_jw *w, const char *key, const char *s);
void ga_jw_key_bool(struct ga_jw *w, const char *key, int v);
/* Writes n bytes of already valid JSON as one value. */
void ga_jw_raw(struct ga_jw *w, const char *json, size_t n);

/* Appends text verbatim, outside the value structure (e.g. a final newline). */
void ga_jw_text(struct ga_jw *w, const char *text);

/* A value inside a JSON text: [p, p + n). Not NUL-terminated; points into the caller's text. */
struct ga_json_span {
    const char *p;
    size_t n;
};

/* Finds key in the object that obj spans (top level only). Returns 0 and the value's span, or
 * -1 if obj is not an object, is malformed, or lacks the key. */
int ga_json_get(struct ga_json_span obj, const char *key, struct ga_json_span *val);

/* Steps through an array: *pos starts at 0. Returns 1 and the next element, 0 at the end, -1
 * if arr is not a well-formed array. */
int ga_json_next(struct ga_json_span arr, size_t *pos, struct ga_json_span *elem);

/* Returns 1 if v is the literal null. */
int ga_json_is_null(struct ga_json_span v);

/* Converts an integer value. Returns 0, or -1 (null, not an integer, out of range). */
int ga_json_int(struct ga_json_span v, long long *out);

/* Unescapes a string value into dst (cap bytes, NUL-terminated; \uXXXX becomes UTF-8). Returns
 * 0, or -1 if v is not a string or does not fit. */
int ga_json_str(struct ga_json_span v, char *dst, size_t cap);

/* Shorthands on an object: key's integer (def when missing or null) and string (empty when
 * missing or null). */
long long ga_json_get_int(struct ga_json_span obj, const char *key, long long def);
void ga_json_get_str(struct ga_json_span obj, const char *key, char *dst, size_t cap);

#endif

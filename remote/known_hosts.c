/* remote/known_hosts.c: an OpenSSH known_hosts reader (see known_hosts.h). */
#include "remote/known_hosts.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/wrapper.h"

enum marker { MARK_NONE, MARK_REVOKED, MARK_CA };

/* One parsed line; the strings point into the line, the blob is owned. */
struct entry {
    enum marker marker;
    const char *hosts;
    const char *type;
    unsigned char *blob;
    size_t len;
};

void gs_kh_fingerprint(const unsigned char *blob, size_t len, char *out)
{
    unsigned char digest[SHA256_DIGEST_LENGTH];
    unsigned char b64[64];
    SHA256(blob, len, digest);
    int n = EVP_EncodeBlock(b64, digest, sizeof(digest));
    while (n > 0 && b64[n - 1] == '=') /* OpenSSH prints the base64 without padding */
        n--;
    snprintf(out, 64, "SHA256:%.*s", n, (const char *)b64);
}

/* Decodes padded base64 into a new buffer; NULL when it is not base64. */
static unsigned char *decode_b64(const char *text, size_t *out_len)
{
    size_t len = strlen(text);
    if (len == 0 || len % 4 != 0)
        return NULL;
    unsigned char *out = gs_xmalloc(len);
    int n = EVP_DecodeBlock(out, (const unsigned char *)text, (int)len);
    if (n < 0) {
        free(out);
        return NULL;
    }
    for (size_t i = len; i > 0 && text[i - 1] == '='; i--) /* DecodeBlock counts padding bytes */
        n--;
    *out_len = (size_t)n;
    return out;
}

/* Splits off the next field (spaces or tabs between fields); NULL at the end of the line. */
static char *next_field(char **cursor)
{
    char *p = *cursor + strspn(*cursor, " \t");
    if (!*p)
        return NULL;
    size_t n = strcspn(p, " \t");
    *cursor = p + n + (p[n] ? 1 : 0);
    p[n] = '\0';
    return p;
}

/* Parses one line. Returns 1 for an entry, 0 for a blank or comment line, -1 for a bad line. */
static int parse_entry(char *line, struct entry *e)
{
    line[strcspn(line, "\r\n")] = '\0';
    char *cursor = line;
    char *first = next_field(&cursor);
    if (!first || first[0] == '#')
        return 0;
    memset(e, 0, sizeof(*e));
    if (first[0] == '@') {
        if (strcmp(first, "@revoked") == 0)
            e->marker = MARK_REVOKED;
        else if (strcmp(first, "@cert-authority") == 0)
            e->marker = MARK_CA;
        else
            return -1;
        first = next_field(&cursor);
    }
    char *type = next_field(&cursor), *key = next_field(&cursor);
    if (!first || !type || !key)
        return -1;
    e->hosts = first;
    e->type = type;
    e->blob = decode_b64(key, &e->len);
    return e->blob ? 1 : -1;
}

/* OpenSSH's wildcard match: `*` any run, `?` one character, case-insensitive. */
static int wildcard_match(const char *pat, size_t plen, const char *s)
{
    if (plen == 0)
        return *s == '\0';
    if (*pat == '*') {
        for (const char *t = s;; t++) {
            if (wildcard_match(pat + 1, plen - 1, t))
                return 1;
            if (!*t)
                return 0;
        }
    }
    if (!*s || (*pat != '?' && tolower((unsigned char)*pat) != tolower((unsigned char)*s)))
        return 0;
    return wildcard_match(pat + 1, plen - 1, s + 1);
}

/* |1|salt|hash: the HMAC-SHA1 of the name keyed with the salt. */
static int hashed_match(const char *field, const char *name)
{
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", field + 3);
    char *bar = strchr(copy, '|');
    if (!bar)
        return -1;
    *bar = '\0';
    size_t salt_len = 0, hash_len = 0;
    unsigned char *salt = decode_b64(copy, &salt_len), *hash = decode_b64(bar + 1, &hash_len);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    int match = -1;
    if (salt && hash &&
        HMAC(EVP_sha1(), salt, (int)salt_len, (const unsigned char *)name, strlen(name), mac,
             &mac_len))
        match = mac_len == hash_len && memcmp(mac, hash, hash_len) == 0;
    free(salt);
    free(hash);
    return match;
}

/* Whether a line's host field names `name`: 1, 0, or -1 when the field is unreadable. A negated
 * pattern that matches excludes the line, as in OpenSSH. */
static int hosts_match(const char *field, const char *name)
{
    if (strncmp(field, "|1|", 3) == 0)
        return hashed_match(field, name);
    int matched = 0;
    for (const char *p = field; *p;) {
        size_t n = strcspn(p, ",");
        int negated = *p == '!';
        if (wildcard_match(p + negated, n - (size_t)negated, name)) {
            if (negated)
                return 0;
            matched = 1;
        }
        p += n + (p[n] ? 1 : 0);
    }
    return matched;
}

/* What the lines seen so far say, and where. */
struct scan {
    const char *name;
    const unsigned char *blob;
    size_t len;
    int matched, revoked, ca, other; /* entries for the host: holding the key, revoked, CA, other */
    struct gs_kh_result *out;
};

static void note_position(struct gs_kh_result *out, const char *file, int line,
                          const struct entry *e)
{
    snprintf(out->file, sizeof(out->file), "%s", file);
    out->line = line;
    snprintf(out->recorded_type, sizeof(out->recorded_type), "%s", e->type);
    gs_kh_fingerprint(e->blob, e->len, out->recorded_fp);
}

static void consider(struct scan *sc, const char *file, int line, const struct entry *e)
{
    int same_key = sc->blob && e->len == sc->len && memcmp(e->blob, sc->blob, e->len) == 0;
    if (e->marker == MARK_REVOKED) {
        if (same_key && !sc->revoked++)
            note_position(sc->out, file, line, e);
    } else if (e->marker == MARK_CA) {
        sc->ca++;
    } else if (same_key) {
        if (!sc->matched++ && !sc->revoked)
            note_position(sc->out, file, line, e);
    } else if (!sc->other++ && !sc->matched && !sc->revoked) {
        note_position(sc->out, file, line, e);
    }
}

static void note_bad_line(struct scan *sc, const char *file, int line)
{
    if (!sc->out->bad_lines++)
        snprintf(sc->out->first_bad, sizeof(sc->out->first_bad), "%s:%d", file, line);
    gs_warn("%s:%d: unreadable known_hosts line skipped", file, line);
}

static void scan_file(struct scan *sc, const char *file)
{
    FILE *fp = fopen(file, "r");
    if (!fp)
        return;
    char *line = NULL;
    size_t cap = 0;
    for (int number = 1; getline(&line, &cap, fp) >= 0; number++) {
        struct entry e;
        int parsed = parse_entry(line, &e);
        int applies = parsed > 0 ? hosts_match(e.hosts, sc->name) : 0;
        if (parsed < 0 || applies < 0)
            note_bad_line(sc, file, number);
        else if (applies)
            consider(sc, file, number, &e);
        if (parsed > 0)
            free(e.blob);
    }
    free(line);
    fclose(fp);
}

void gs_kh_lookup(const char *const *files, size_t n_files, const char *name,
                  const unsigned char *blob, size_t len, struct gs_kh_result *out)
{
    memset(out, 0, sizeof(*out));
    struct scan sc = {.name = name, .blob = blob, .len = len, .out = out};
    for (size_t i = 0; i < n_files; i++)
        scan_file(&sc, files[i]);
    if (sc.revoked)
        out->verdict = GS_KH_REVOKED;
    else if (sc.matched)
        out->verdict = GS_KH_MATCH;
    else if (sc.other)
        out->verdict = GS_KH_CHANGED;
    else if (sc.ca)
        out->verdict = GS_KH_CA_ONLY;
    else
        out->verdict = GS_KH_UNKNOWN;
}

int gs_kh_recorded_type(const char *const *files, size_t n_files, const char *name, char *type,
                        size_t size)
{
    struct gs_kh_result r;
    gs_kh_lookup(files, n_files, name, NULL, 0, &r);
    if (r.verdict != GS_KH_CHANGED)
        return -1;
    snprintf(type, size, "%s", r.recorded_type);
    return 0;
}

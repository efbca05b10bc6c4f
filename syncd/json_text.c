/* syncd/json_text.c: JSON strings from bytes that need not be UTF-8 (see json_text.h). */
#include "syncd/json_text.h"

#include <string.h>

#include "common/buf.h"
#include "common/quote.h"

json_t *gs_json_text(const char *s)
{
    s = s ? s : "";
    json_t *str = json_string(s);
    if (str) /* valid already: the common case, no copy */
        return str;
    struct gs_buf b = GS_BUF_INIT;
    for (size_t n; *s; s += n ? n : 1) {
        n = gs_quote_utf8_len(s);
        if (n)
            gs_buf_add(&b, s, n);
        else
            gs_buf_adds(&b, "\xef\xbf\xbd"); /* U+FFFD REPLACEMENT CHARACTER */
    }
    str = json_stringn(b.data ? b.data : "", b.len);
    gs_buf_release(&b);
    return str;
}

/* common/shell.c: POSIX shell quoting (see shell.h). */
#include "common/shell.h"

void gs_shell_quote(struct gs_buf *out, const char *arg)
{
    gs_buf_addc(out, '\'');
    for (const char *p = arg; *p; p++) {
        if (*p == '\'')
            gs_buf_adds(out, "'\\''");
        else
            gs_buf_addc(out, *p);
    }
    gs_buf_addc(out, '\'');
}

void gs_shell_quote_argv(struct gs_buf *out, int argc, char *const argv[])
{
    for (int i = 0; i < argc; i++) {
        if (i)
            gs_buf_addc(out, ' ');
        gs_shell_quote(out, argv[i]);
    }
}

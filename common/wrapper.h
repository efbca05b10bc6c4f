/* common/wrapper.h: the client's allocation and write policy, as git's xmalloc, ALLOC_GROW and
 * write_in_full (agent/wrapper.h is its libc-only twin in the agent). An allocation that fails
 * prints one line naming the size to stderr and aborts: the one exception to "library code never
 * prints or exits", since gpusync can do nothing useful without the memory, and checking every
 * allocation would hide the logic. A write goes on until every byte is out. */
#ifndef GS_WRAPPER_H
#define GS_WRAPPER_H

#include <stddef.h>

/* The one reaction to a failed allocation, for allocators other than these (a library's
 * constructor returning NULL): prints "gpusync: out of memory (N bytes)" (N unknown: 0) and
 * aborts. */
void gs_out_of_memory(size_t size) __attribute__((noreturn));

/* malloc, calloc, realloc and strdup that never return NULL: on failure they print "gpusync:
 * out of memory (N bytes)" and abort(). A size of 0 still returns a unique pointer. The caller
 * owns and frees the result. */
void *gs_xmalloc(size_t size);
void *gs_xcalloc(size_t nmemb, size_t size);
void *gs_xrealloc(void *p, size_t size);
char *gs_xstrdup(const char *s);
/* The first n bytes of s (fewer if s ends sooner), NUL-terminated. */
char *gs_xstrndup(const char *s, size_t n);
/* realloc of nmemb elements of size bytes; a product that overflows counts as a failure. */
void *gs_xreallocarray(void *p, size_t nmemb, size_t size);

/* The next capacity after `alloc`: about 1.5 times it, as git's alloc_nr. */
#define GS_ALLOC_NR(alloc) (((alloc) + 16) * 3 / 2)

/* Makes room for `nr` elements in `array`, whose capacity `alloc` (a size_t lvalue) counts
 * elements: grows it to GS_ALLOC_NR(alloc), or to nr when that is more. As git's ALLOC_GROW. */
#define GS_ALLOC_GROW(array, nr, alloc)                                                            \
    do {                                                                                           \
        if ((nr) > (alloc)) {                                                                      \
            (alloc) = GS_ALLOC_NR(alloc) < (nr) ? (nr) : GS_ALLOC_NR(alloc);                       \
            (array) = gs_xreallocarray((array), (alloc), sizeof(*(array)));                        \
        }                                                                                          \
    } while (0)

/* Writes all n bytes of buf to fd, retrying short writes and EINTR. Returns 0, or -1 with errno
 * set (ENOSPC when write(2) wrote nothing); how much was written is then unknown. */
int gs_write_all(int fd, const void *buf, size_t n);

#endif

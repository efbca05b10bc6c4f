/* wrapper: the agent's allocation and write policy, libc only, the twin of the client's in
 * common/. An allocation that fails prints one line naming the size to stderr and aborts (the
 * agent cannot do its job without the memory, and a core is the useful trace); a write goes on
 * until every byte is out. */
#ifndef GA_WRAPPER_H
#define GA_WRAPPER_H

#include <stddef.h>

/* malloc, calloc, realloc and strdup that never return NULL: on failure they print "gpusync-agent:
 * out of memory (N bytes)" and abort(). A size of 0 still returns a unique pointer. The caller
 * owns and frees the result. */
void *ga_xmalloc(size_t size);
void *ga_xcalloc(size_t nmemb, size_t size);
void *ga_xrealloc(void *p, size_t size);
char *ga_xstrdup(const char *s);
/* realloc of nmemb elements of size bytes; a product that overflows counts as a failure. */
void *ga_xreallocarray(void *p, size_t nmemb, size_t size);

/* The next capacity after `alloc`: about 1.5 times it, as git's alloc_nr. */
#define GA_ALLOC_NR(alloc) (((alloc) + 16) * 3 / 2)

/* Makes room for `nr` elements in `array`, whose capacity `alloc` (a size_t lvalue) counts
 * elements: grows it to GA_ALLOC_NR(alloc), or to nr when that is more. As git's ALLOC_GROW. */
#define GA_ALLOC_GROW(array, nr, alloc)                                                            \
    do {                                                                                           \
        if ((nr) > (alloc)) {                                                                      \
            (alloc) = GA_ALLOC_NR(alloc) < (nr) ? (nr) : GA_ALLOC_NR(alloc);                       \
            (array) = ga_xreallocarray((array), (alloc), sizeof(*(array)));                        \
        }                                                                                          \
    } while (0)

/* Writes all n bytes of buf to fd, retrying short writes and EINTR. Returns 0, or -1 with errno
 * set (ENOSPC when write(2) wrote nothing); how much was written is then unknown. */
int ga_write_all(int fd, const void *buf, size_t n);
/* ga_write_all that skips (lseek) each whole block of GA_HOLE_BLOCK zero bytes, aligned to the
 * file offset, leaving a hole: a sparse file (a zeroed numpy.memmap, a disk image) costs the
 * server the disk it costs here, not its full size. The file's size is the caller's to set
 * (ftruncate) when it may end in a hole. Returns 0 or -1 (errno). */
#define GA_HOLE_BLOCK 4096
int ga_write_sparse(int fd, const void *buf, size_t n);

#endif

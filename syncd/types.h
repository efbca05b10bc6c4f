/* syncd/types.h: the kinds of tree entries that scan, index and plan share. Regular files,
 * directories and symbolic links are mirrored; anything else (fifos, sockets, devices) is skipped
 * by the scanner and never reaches the index. */
#ifndef GS_SYNCD_TYPES_H
#define GS_SYNCD_TYPES_H

enum gs_kind {
    GS_KIND_NONE = 0, /* absent: no entry */
    GS_KIND_FILE = 1,
    GS_KIND_DIR = 2,
    GS_KIND_SYMLINK = 3,
};

#endif

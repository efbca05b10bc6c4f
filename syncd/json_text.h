/* syncd/json_text.h: text for a JSON string, which must be UTF-8, from bytes that need not be: file
 * names and the messages that quote them, for the daemon's events and replies and the CLI's --json
 * output alike.
 *
 * jansson refuses a string that is not UTF-8 (json_string gives NULL, and json_pack with it fails
 * as a whole), so every such text put in JSON goes through here; an entry with an odd name stays
 * visible instead of vanishing. */
#ifndef GS_JSON_TEXT_H
#define GS_JSON_TEXT_H

#include <jansson.h>

/* A JSON string holding `s`, each byte that is not part of a valid UTF-8 sequence replaced by
 * U+FFFD; valid UTF-8 (controls included: JSON escapes them) is kept as it is. NULL `s` gives
 * "". Returns a new reference, NULL only when out of memory. */
json_t *gs_json_text(const char *s);

#endif

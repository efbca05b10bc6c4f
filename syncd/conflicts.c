/* syncd/conflicts.c: the unacknowledged conflict copies, kept in the index's metadata (see
 * conflicts.h). */
#include "syncd/conflicts.h"

#include <stdlib.h>
#include <string.h>

#include "syncd/json_text.h"

#define META_KEY "conflicts"

int gs_conflicts_load(struct gs_index *idx, json_t **out, struct gs_error *err)
{
    char *text = NULL;
    *out = NULL;
    int rc = gs_index_get_meta(idx, META_KEY, &text, err);
    if (rc < 0)
        return rc;
    json_t *stored = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    /* the list names files on one server: after the index was claimed for another, it is stale */
    const char *server = json_string_value(json_object_get(stored, "server"));
    json_t *list = json_object_get(stored, "conflicts");
    int ours = server && strcmp(server, gs_index_remote(idx)) == 0 && json_is_array(list);
    *out = ours ? json_incref(list) : json_array();
    json_decref(stored);
    return 0;
}

int gs_conflicts_save(struct gs_index *idx, json_t *list, struct gs_error *err)
{
    json_t *stored = json_pack("{s:s,s:O}", "server", gs_index_remote(idx), "conflicts", list);
    char *text = stored ? json_dumps(stored, JSON_COMPACT) : NULL;
    json_decref(stored);
    if (!text)
        return gs_error_set(err, GS_E_NOMEM, "no memory to record the conflict copies");
    int rc = gs_index_set_meta(idx, META_KEY, text, err);
    free(text);
    return rc;
}

void gs_conflicts_add(json_t *list, const char *path, const char *kept)
{
    while (json_array_size(list) >= GS_CONFLICTS_MAX)
        json_array_remove(list, 0);
    /* names are bytes: one that is not UTF-8 is listed with U+FFFD rather than dropped */
    json_array_append_new(
        list, json_pack("{s:o,s:o}", "path", gs_json_text(path), "kept", gs_json_text(kept)));
}

/* tb_names.c -- name <-> enum tables.
 *
 * Every enum that a configuration names (policies, algorithms, header
 * styles, priorities) or a log line prints (error kinds, sources,
 * breaker states) keeps its names in an array in enum order; these two
 * functions are the only lookups, so each table is one array and no
 * if-else chain of strcmp repeats it.
 */
#include <string.h>
#include <strings.h>

#include "base/tb_base.h"

int tb_name_index(const char *const *names, int n, const char *s, int nocase)
{
    int i;

    for (i = 0; s && names && i < n; i++) {
        if (names[i] && (nocase ? strcasecmp(s, names[i])
                                : strcmp(s, names[i])) == 0) {
            return i;
        }
    }
    return -1;
}

const char *tb_name_at(const char *const *names, int n, int i)
{
    return names && i >= 0 && i < n && names[i] ? names[i] : "unknown";
}

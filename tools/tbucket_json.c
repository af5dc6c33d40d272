/* tbucket_json.c -- a small JSON reader for the status page's JSON view:
 * values, nested at most JSON_DEPTH deep, strings decoded (non-ASCII shown
 * as '?'), numbers read in the C locale. Enough for tbucket top, which
 * reads what a server it does not trust sends: every allocation is
 * checked and every failure frees what was built. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tbucket_tool.h"

#define JSON_DEPTH 32

typedef struct jparse {
    const char *p;
    int depth;
} jparse_t;

void json_free(jval_t *v)
{
    size_t i;

    for (i = 0; i < v->n; i++) {
        json_free(&v->items[i]);
        if (v->keys) {
            free(v->keys[i]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof(*v));
}

static void jspace(jparse_t *j)
{
    while (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r') {
        j->p++;
    }
}

static int jvalue(jparse_t *j, jval_t *v);

/* A string at j->p (after its opening quote) into *out. */
static int jstring(jparse_t *j, char **out)
{
    const char *p = j->p;
    size_t n = 0;
    char *s;

    /* Decoded, a string is never longer than its text. */
    while (*p && *p != '"') {
        p += *p == '\\' && p[1] ? 2 : 1;
    }
    if (*p != '"' || !(s = malloc((size_t)(p - j->p) + 1))) {
        return -1;
    }
    for (p = j->p; *p != '"'; p++) {
        if (*p != '\\') {
            s[n++] = (unsigned char)*p < 0x80 ? *p : '?';
            continue;
        }
        p++;
        switch (*p) {
        case 'n': s[n++] = '\n'; break;
        case 't': s[n++] = '\t'; break;
        case 'r': s[n++] = '\r'; break;
        case 'b': s[n++] = '\b'; break;
        case 'f': s[n++] = '\f'; break;
        case 'u': {
            unsigned c = 0;
            int i;

            for (i = 1; i <= 4 && isxdigit((unsigned char)p[i]); i++) {
                c = c * 16 + (unsigned)(isdigit((unsigned char)p[i])
                                        ? p[i] - '0'
                                        : (tolower((unsigned char)p[i])
                                           - 'a' + 10));
            }
            if (i != 5) {
                free(s);
                return -1;
            }
            s[n++] = c < 0x80 ? (char)c : '?';
            p += 4;
            break;
        }
        default: s[n++] = *p; break;
        }
    }
    s[n] = '\0';
    j->p = p + 1;
    *out = s;
    return 0;
}

/* A list of values (arr) or of "name": value members, after its opening
 * bracket. */
static int jlist(jparse_t *j, jval_t *v, int obj)
{
    char close = obj ? '}' : ']';
    size_t cap = 0;

    v->type = obj ? J_OBJ : J_ARR;
    jspace(j);
    if (*j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        if (v->n == cap) {
            jval_t *ni;
            char **nk = NULL;

            cap = cap ? 2 * cap : 8;
            ni = realloc(v->items, cap * sizeof(*ni));
            if (ni) {
                v->items = ni;
            }
            if (obj && ni) {
                nk = realloc(v->keys, cap * sizeof(*nk));
                if (nk) {
                    v->keys = nk;
                }
            }
            if (!ni || (obj && !nk)) {
                return -1;
            }
        }
        memset(&v->items[v->n], 0, sizeof(v->items[0]));
        if (obj) {
            jspace(j);
            if (*j->p != '"') {
                return -1;
            }
            j->p++;
            if (jstring(j, &v->keys[v->n]) != 0) {
                return -1;
            }
            jspace(j);
            if (*j->p++ != ':') {
                free(v->keys[v->n]);
                return -1;
            }
        }
        if (jvalue(j, &v->items[v->n]) != 0) {
            if (obj) {
                free(v->keys[v->n]);
            }
            json_free(&v->items[v->n]);
            return -1;
        }
        v->n++;
        jspace(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p++ != close) {
            return -1;
        }
        return 0;
    }
}

static int jvalue(jparse_t *j, jval_t *v)
{
    char *end;
    int rc;

    jspace(j);
    memset(v, 0, sizeof(*v));
    switch (*j->p) {
    case '{':
    case '[':
        if (++j->depth > JSON_DEPTH) {
            return -1;
        }
        j->p++;
        rc = jlist(j, v, j->p[-1] == '{');
        j->depth--;
        return rc;
    case '"':
        j->p++;
        v->type = J_STR;
        return jstring(j, &v->str);
    case 't':
    case 'f':
    case 'n':
        if (!strncmp(j->p, "true", 4) || !strncmp(j->p, "null", 4)) {
            v->type = *j->p == 't' ? J_BOOL : J_NULL;
            v->num = *j->p == 't';
            j->p += 4;
            return 0;
        }
        if (!strncmp(j->p, "false", 5)) {
            v->type = J_BOOL;
            j->p += 5;
            return 0;
        }
        return -1;
    default:
        v->num = tb_strtod_c(j->p, &end);
        if (end == j->p) {
            return -1;
        }
        v->type = J_NUM;
        j->p = end;
        return 0;
    }
}

const jval_t *json_get(const jval_t *o, const char *name)
{
    size_t i;

    for (i = 0; o && o->type == J_OBJ && i < o->n; i++) {
        if (strcmp(o->keys[i], name) == 0) {
            return &o->items[i];
        }
    }
    return NULL;
}

double json_num(const jval_t *o, const char *name)
{
    const jval_t *v = json_get(o, name);

    return v && v->type == J_NUM ? v->num : 0;
}

/* A string member with every control character shown as '?', so that
 * nothing the server sends can drive the terminal; "-" when absent. */
const char *json_text(const jval_t *o, const char *name, char *buf,
                      size_t len)
{
    const jval_t *v = json_get(o, name);
    size_t i;

    if (!v || v->type != J_STR) {
        return "-";
    }
    for (i = 0; v->str[i] && i + 1 < len; i++) {
        unsigned char c = (unsigned char)v->str[i];

        buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    buf[i] = '\0';
    return buf;
}

int json_parse(const char *text, jval_t *out)
{
    jparse_t j;

    j.p = text;
    j.depth = 0;
    if (jvalue(&j, out) != 0) {
        json_free(out);
        return -1;
    }
    jspace(&j);
    if (*j.p) {
        json_free(out);
        return -1;
    }
    return 0;
}

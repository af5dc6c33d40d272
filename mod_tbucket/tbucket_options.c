/* tbucket_options.c -- how every directive reads its values: one table
 * entry (tbucket_value) says what a value is (a whole number, a duration,
 * one of some names, text, or a reader of its own), its range and the
 * record field it goes to; one reader takes a scalar directive's argument
 * and one takes the name=value options of a line.
 *
 * Whatever the directive, a refusal has one form, naming directive,
 * option and value: "TBucketRule: bad ban '3x': expected a duration such
 * as 500ms, 30s, 15m, 1h or 1d, from 1s to 30d", and an option a
 * directive does not have is "unknown option 'WORD' (expected ...)", the
 * list made from the table. Durations are the core's one grammar
 * (tb_parse_duration), with the range of each option. Checks that span
 * several values of a line (min= above max=) stay with the directive.
 */
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"

#include "mod_tbucket.h"

const char *tbucket_bad_value(cmd_parms *cmd, const char *what,
                              const char *value, const char *why)
{
    return apr_psprintf(cmd->pool, "%s: bad %s '%s': %s", cmd->cmd->name,
                        what, value, why);
}

const char *tbucket_htaccess_denied(cmd_parms *cmd)
{
    /* Only .htaccess is read in the temporary pool. */
    if (!ap_check_cmd_context(cmd, NOT_IN_HTACCESS)
        || (cmd->override & OR_LIMIT)
        || (cmd->override_list
            && apr_table_get(cmd->override_list, cmd->cmd->name))) {
        return NULL;
    }
    return apr_psprintf(cmd->pool, "%s in .htaccess needs \"AllowOverride "
                        "Limit\" (or \"AllowOverrideList %s\") for this "
                        "directory in the server's configuration",
                        cmd->cmd->name, cmd->cmd->name);
}

const char *tbucket_int_value(cmd_parms *cmd, const char *what,
                              const char *arg, int64_t min, int64_t max,
                              int64_t *n)
{
    char err[128];

    if (tb_parse_int(arg, min, max, n, err, sizeof(err)) != TB_OK) {
        return tbucket_bad_value(cmd, what, arg, err);
    }
    return NULL;
}

const char *tbucket_split_opt(apr_pool_t *p, const char *word,
                              const char **value)
{
    const char *eq = strchr(word, '=');

    if (!eq) {
        return NULL;
    }
    *value = eq + 1;
    return apr_pstrmemdup(p, word, eq - word);
}

/* The n names joined, "a, b or c" (between ", ", last " or "), from
 * p. */
static const char *names_list(apr_pool_t *p, const char *const *names,
                              int n, const char *between, const char *last)
{
    const char *s = names[0];
    int i;

    for (i = 1; i < n; i++) {
        s = apr_pstrcat(p, s, i == n - 1 ? last : between, names[i], NULL);
    }
    return s;
}

/* What a bad value of v should have been: v->why with its range. */
static const char *why_of(cmd_parms *cmd, const tbucket_value *v,
                          const char *err)
{
    if (v->kind == TBUCKET_V_NAME) {
        return v->why ? v->why
                      : apr_pstrcat(cmd->temp_pool, "expected ",
                                    names_list(cmd->temp_pool, v->names,
                                               (int)v->max, ", ", " or "),
                                    NULL);
    }
    return v->why ? apr_psprintf(cmd->temp_pool, "%s (%s)", err, v->why)
                  : err;
}

/* The number text stands for under v, into *n (a duration in ms). */
static int read_number(const tbucket_value *v, const char *text, int64_t *n,
                       char *err, size_t errlen)
{
    if (v->kind == TBUCKET_V_DURATION) {
        return tb_parse_duration(text, v->min, v->max, v->flags, n, err,
                                 errlen);
    }
    if (v->kind == TBUCKET_V_NAME) {
        *n = tb_name_index(v->names, (int)v->max, text, 1);
        return *n < 0 ? TB_ERR : TB_OK;
    }
    return tb_parse_int(text, v->min, v->max, n, err, errlen);
}

const char *tbucket_value_store(cmd_parms *cmd, const tbucket_value *v,
                                void *rec, const char *text)
{
    void *field = (char *)rec + v->off;
    char err[160] = "";
    int64_t n;

    if (v->kind == TBUCKET_V_FN) {
        return v->fn(cmd, rec, text);
    }
    if (v->kind == TBUCKET_V_TEXT) {
        *(const char **)field = apr_pstrdup(cmd->pool, text);
        return NULL;
    }
    if (read_number(v, text, &n, err, sizeof(err)) != TB_OK) {
        return tbucket_bad_value(cmd, v->name, text, why_of(cmd, v, err));
    }
    switch (v->at) {
    case TBUCKET_AT_INT64:
        *(int64_t *)field = n;
        break;
    case TBUCKET_AT_DOUBLE:
        *(double *)field = (double)n;
        break;
    default:
        *(int *)field = (int)n;
    }
    return NULL;
}

/* "a=N, b=DURATION or c=x|y" of the options of table a line may name. */
static const char *usage(cmd_parms *cmd, const tbucket_value *table)
{
    const char *forms[32];
    const tbucket_value *v;
    int n = 0;

    for (v = table; v->name && n < 32; v++) {
        const char *form = v->form;

        if (v->kind == TBUCKET_V_NAME && !form) {
            form = names_list(cmd->temp_pool, v->names, (int)v->max, "|",
                              "|");
        }
        if (form) {
            forms[n++] = apr_pstrcat(cmd->temp_pool, v->name, "=", form,
                                     NULL);
        }
    }
    return n ? names_list(cmd->temp_pool, forms, n, ", ", " or ") : "none";
}

const char *tbucket_options(cmd_parms *cmd, const tbucket_value *table,
                            void *rec, unsigned int *set, const char *args,
                            int *count)
{
    const char *word, *name, *value, *msg;
    const tbucket_value *v;

    while (*(word = ap_getword_conf(cmd->temp_pool, &args))) {
        name = tbucket_split_opt(cmd->temp_pool, word, &value);
        for (v = table; name && v->name && strcasecmp(v->name, name); v++) {
        }
        if (!name || !v->name) {
            return apr_psprintf(cmd->pool, "%s: unknown option '%s' "
                                "(expected %s)", cmd->cmd->name, word,
                                usage(cmd, table));
        }
        if ((msg = tbucket_value_store(cmd, v, rec, value))) {
            return msg;
        }
        if (set) {
            *set |= v->set;
        }
        if (count) {
            ++*count;
        }
    }
    return NULL;
}

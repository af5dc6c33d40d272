/* tbucket_metrics.c -- the status page's table of metrics: labels and
 * how a sample's value and labels are written.
 *
 * tbucket_status.c builds the table and prints its text and JSON views,
 * tbucket_status_top.c adds the top keys, tbucket_status_html.c prints
 * its HTML view; what they need of a sample or a string lives here,
 * below them, so that none calls another's helpers. A renamed family is
 * served once more under its old name for one release, as a deprecated
 * alias with the same samples (tbucket_family_alias), so that a scraper's
 * queries and alerts keep working while they are moved.
 */
#include "apr_strings.h"

#include "httpd.h"

#include "mod_tbucket.h"
#include "tbucket_status.h"

tbucket_family *tbucket_family_add(tbucket_metrics *t, const char *name,
                                   const char *type, const char *help)
{
    tbucket_family *f = apr_pcalloc(t->p, sizeof(*f));

    f->name = name;
    f->type = type;
    f->help = help;
    f->samples = apr_array_make(t->p, 8, sizeof(tbucket_sample));
    APR_ARRAY_PUSH(t->families, tbucket_family *) = f;
    return f;
}

tbucket_sample *tbucket_sample_add(tbucket_family *f, const char *suffix,
                                   const tbucket_labels *l, uint64_t v)
{
    tbucket_sample *s = apr_array_push(f->samples);

    memset(s, 0, sizeof(*s));
    s->suffix = suffix;
    if (l) {
        s->labels = *l;
    }
    s->value = v;
    return s;
}

void tbucket_family_single(tbucket_metrics *t, const char *name,
                           const char *type, const char *help, uint64_t v)
{
    tbucket_sample_add(tbucket_family_add(t, name, type, help), "", NULL, v);
}

/* The version that stops serving the deprecated names. */
#define ALIAS_REMOVED_IN "0.3.0"

tbucket_family *tbucket_family_alias(tbucket_metrics *t,
                                     const tbucket_family *f,
                                     const char *name, const char *label,
                                     const char *old_label)
{
    tbucket_family *a = tbucket_family_add(t, name, f->type, apr_psprintf(
        t->p, "Deprecated alias of %s (its label %s is %s here), removed "
        "in " ALIAS_REMOVED_IN ".", f->name, label, old_label));
    int i, k;

    for (i = 0; i < f->samples->nelts; i++) {
        const tbucket_sample *s = &APR_ARRAY_IDX(f->samples, i,
                                                 tbucket_sample);
        tbucket_sample *c = tbucket_sample_add(a, s->suffix, &s->labels,
                                               s->value);

        c->micro = s->micro;
        for (k = 0; k < c->labels.n; k++) {
            if (!strcmp(c->labels.name[k], label)) {
                c->labels.name[k] = old_label;
            }
        }
    }
    return a;
}

tbucket_labels tbucket_labels_with(const tbucket_labels *base,
                                   const char *name, const char *value)
{
    tbucket_labels l;

    if (base) {
        l = *base;
    }
    else {
        memset(&l, 0, sizeof(l));
    }
    if (l.n < TBUCKET_MAX_LABELS) {
        l.name[l.n] = name;
        l.value[l.n] = value;
        l.n++;
    }
    return l;
}

/* A label value with \, " and newline escaped as the format requires. */
static const char *esc(apr_pool_t *p, const char *s)
{
    apr_size_t n = 0;
    const char *q;
    char *out, *o;

    for (q = s; *q; q++) {
        n += (*q == '\\' || *q == '"' || *q == '\n') ? 2 : 1;
    }
    o = out = apr_palloc(p, n + 1);
    for (q = s; *q; q++) {
        if (*q == '\\' || *q == '"') {
            *o++ = '\\';
            *o++ = *q;
        }
        else if (*q == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        }
        else {
            *o++ = *q;
        }
    }
    *o = '\0';
    return out;
}

const char *tbucket_prom_labels(apr_pool_t *p, const tbucket_labels *l)
{
    const char *out = "";
    int i;

    for (i = 0; i < l->n; i++) {
        out = apr_pstrcat(p, out, i ? "," : "", l->name[i], "=\"",
                          esc(p, l->value[i]), "\"", NULL);
    }
    return out;
}

const char *tbucket_sample_text(apr_pool_t *p, const tbucket_sample *s)
{
    if (s->micro) {
        return apr_psprintf(p, "%" APR_UINT64_T_FMT ".%06u",
                            (apr_uint64_t)(s->value / 1000000),
                            (unsigned)(s->value % 1000000));
    }
    return apr_psprintf(p, "%" APR_UINT64_T_FMT, (apr_uint64_t)s->value);
}

const char *tbucket_json_esc(apr_pool_t *p, const char *s)
{
    apr_size_t n = 0;
    const unsigned char *q;
    char *out, *o;

    for (q = (const unsigned char *)s; *q; q++) {
        n += (*q == '"' || *q == '\\') ? 2 : *q < 0x20 ? 6 : 1;
    }
    o = out = apr_palloc(p, n + 1);
    for (q = (const unsigned char *)s; *q; q++) {
        if (*q == '"' || *q == '\\') {
            *o++ = '\\';
            *o++ = (char)*q;
        }
        else if (*q < 0x20) {
            apr_snprintf(o, 7, "\\u%04x", *q);
            o += 6;
        }
        else {
            *o++ = (char)*q;
        }
    }
    *o = '\0';
    return out;
}

const char *tbucket_vhost_of(const tbucket_metrics *t, uint32_t i)
{
    return i < t->nvhosts ? t->vhost_names[i] : "-";
}

/* tbucket_status.h -- the table of metrics behind the status page.
 *
 * Both views of the page are rendered from one table, built once per
 * request by tbucket_status.c: a list of families (name, type, help),
 * each with its samples (a suffix, labels and a value). Label values are
 * stored raw; each renderer escapes them for its own format, so a vhost
 * name is escaped once for Prometheus and once for HTML and never twice.
 * The figures of the two views cannot drift because neither reads the
 * segment. tbucket_status.c builds it and prints the Prometheus text and
 * JSON views, tbucket_status_top.c adds the top keys, the scopes and
 * the named limits (and the JSON view's "top" object),
 * tbucket_status_html.c prints the HTML view, tbucket_status_chart.c
 * draws the last 15 minutes,
 * tbucket_status_bans.c lists the active bans, and tbucket_metrics.c
 * holds what all need of a sample; only these six include this.
 */
#ifndef TBUCKET_STATUS_H
#define TBUCKET_STATUS_H

#include "httpd.h"
#include "apr_tables.h"

#include "tb.h"
#include "tbucket_ring.h"

#define TBUCKET_MAX_LABELS 4

typedef struct tbucket_labels {
    int n;
    const char *name[TBUCKET_MAX_LABELS];
    const char *value[TBUCKET_MAX_LABELS];  /* Raw, unescaped. */
} tbucket_labels;

typedef struct tbucket_sample {
    const char *suffix;               /* "" or "_bucket", "_sum", "_count". */
    tbucket_labels labels;
    uint64_t value;                   /* In millionths when micro is 1.   */
    int micro;
} tbucket_sample;

typedef struct tbucket_family {
    const char *name;
    const char *type;                 /* "counter", "gauge", "histogram". */
    const char *help;
    apr_array_header_t *samples;      /* tbucket_sample, in output order. */
} tbucket_family;

/* Why a Redis configuration's breaker last opened. The text view has
 * the time and kind only (a sample of
 * tbucket_redis_last_failure_timestamp_seconds): a free-text reason
 * would make a new series for every message. The HTML view shows all. */
typedef struct tbucket_failure_note {
    tbucket_labels labels;            /* redis and policy.                */
    const char *kind;                 /* tb_err_name of the failed call.  */
    apr_time_t time;
    const char *reason;               /* Raw, unescaped.                  */
} tbucket_failure_note;

/* The top keys of one window, as read from the segment once per page:
 * the rankings carry more than a sample can (errors, allowed and
 * refused, the last refusal), so they are kept beside the families. */
typedef struct tbucket_top_window {
    int minutes;                      /* 1 or 15 (tb_topk_query_t).       */
    tb_topk_result_t res;
    tb_topk_entry_t *by_refusals;     /* res.n_refusals entries.          */
    tb_topk_entry_t *by_decisions;    /* res.n_decisions entries.         */
} tbucket_top_window;

#define TBUCKET_TOP_WINDOWS 2

typedef struct tbucket_top {
    int k;                            /* Keys per ranking.                */
    int counters;                     /* m, counters per sketch.          */
    apr_size_t bytes;                 /* Their shared memory.             */
    tbucket_top_window w[TBUCKET_TOP_WINDOWS];
} tbucket_top;

typedef struct tbucket_metrics {
    apr_pool_t *p;
    apr_array_header_t *families;     /* tbucket_family *, in output order. */
    apr_array_header_t *failures;     /* tbucket_failure_note, one per Redis
                                       * configuration that has one.      */
    tbucket_top *top;                 /* NULL when TBucketTopKeys is Off. */
    const char *const *vhost_names;   /* By vhost slot: an entry's vhost. */
    uint32_t nvhosts;
    const tbucket_ring_series *series; /* The last 15 minutes, or NULL. */
    apr_array_header_t *bans;         /* tbucket_ban_note, newest first;
                                       * NULL when not asked (the text
                                       * view).                         */
    const char *bans_note;            /* Why some were not listed.      */
    int bans_more;                    /* More are active than listed.   */
} tbucket_metrics;

/* An active ban, as the answering child's client listed it. */
typedef struct tbucket_ban_note {
    const char *redis;                /* The client's redacted URL.     */
    const char *prefix;
    tb_ban_t ban;
    int64_t refused;                  /* Refusals of its key under its
                                       * rule, last 15 minutes' top
                                       * keys; -1: not among them.      */
} tbucket_ban_note;

/* A new family at the end of t's table, from t->p, with no samples. */
tbucket_family *tbucket_family_add(tbucket_metrics *t, const char *name,
                                   const char *type, const char *help);

/* A sample at the end of f: suffix ("" for none), a copy of the labels l
 * (NULL for none) and the value v, not in millionths (set micro on the
 * sample returned for that). */
tbucket_sample *tbucket_sample_add(tbucket_family *f, const char *suffix,
                                   const tbucket_labels *l, uint64_t v);

/* A family of one sample without labels: v. */
void tbucket_family_single(tbucket_metrics *t, const char *name,
                           const char *type, const char *help, uint64_t v);

/* A deprecated alias of f, added at the end of t's table: the family
 * name with the same type and samples (the same values), the label
 * named label renamed to old_label, and a HELP text naming f and the
 * version that removes the alias. Call it once f is filled. */
tbucket_family *tbucket_family_alias(tbucket_metrics *t,
                                     const tbucket_family *f,
                                     const char *name, const char *label,
                                     const char *old_label);

/* A copy of base with one more label (base may be NULL); past
 * TBUCKET_MAX_LABELS the label is dropped. */
tbucket_labels tbucket_labels_with(const tbucket_labels *base,
                                   const char *name, const char *value);

/* The labels in Prometheus syntax, without the braces ("" when none),
 * from p. */
const char *tbucket_prom_labels(apr_pool_t *p, const tbucket_labels *l);

/* A sample's value as both views print it, from p: an integer, or
 * seconds with six decimals for values kept in microseconds. */
const char *tbucket_sample_text(apr_pool_t *p, const tbucket_sample *s);

/* s as the inside of a JSON string, from p: quote, backslash and every
 * control character escaped. */
const char *tbucket_json_esc(apr_pool_t *p, const char *s);

/* The name of the virtual host of slot i, "-" when unknown. */
const char *tbucket_vhost_of(const tbucket_metrics *t, uint32_t i);

/* The top keys (t->top and the family tbucket_top_key_refusals), the
 * scopes' decisions (tbucket_scope_decisions_total) and the named
 * limits' events (tbucket_limit_events_total), each followed by its
 * deprecated alias, at now (tbucket_status_top.c). */
void tbucket_collect_top(tbucket_metrics *t, apr_time_t now);

/* The JSON view's "top" member, with a leading comma: the rankings of
 * both windows with every field of their entries, or null when
 * TBucketTopKeys is Off. */
void tbucket_top_json(request_rec *r, const tbucket_metrics *t);

/* The HTML view of t, the body of the response to r
 * (tbucket_status_html.c). */
void tbucket_status_html(request_rec *r, const tbucket_metrics *t);

/* ---- The last 15 minutes (tbucket_status_chart.c) ---------------- */

/* A moment the charts mark: the slot in which a breaker opened after
 * one in which none was open, or in which rules began to set bans. */
typedef enum {
    TBUCKET_MARK_BREAKER = 0,
    TBUCKET_MARK_BAN_WAVE,
    TBUCKET_MARK_KINDS
} tbucket_mark_kind;

typedef struct tbucket_mark {
    int slot;                         /* Index in the series.           */
    tbucket_mark_kind kind;
} tbucket_mark;

#define TBUCKET_MAX_MARKS 8

/* The marks of s, oldest first, at most max of them: how many. */
int tbucket_series_marks(const tbucket_ring_series *s, tbucket_mark *m,
                         int max);

/* Slot i's refusals of every kind (limit, rule, ban, shed, local cap). */
uint64_t tbucket_series_refused(const tbucket_ring_series *s, int i);

/* The series at now, from p, or NULL before the segment exists. */
const tbucket_ring_series *tbucket_series_read(apr_pool_t *p,
                                               apr_time_t now);

/* The HTML view's charts of t->series (nothing when it is NULL), and
 * the JSON view's "series" member, with a leading comma. */
void tbucket_series_html(request_rec *r, const tbucket_metrics *t);
void tbucket_series_json(request_rec *r, const tbucket_metrics *t);

/* ---- What the HTML view's files share (tbucket_status_html.c) ---- */

/* The family called name, or NULL. */
const tbucket_family *tbucket_html_family(const tbucket_metrics *t,
                                          const char *name);
/* The value of label name in l, or NULL. */
const char *tbucket_html_label(const tbucket_labels *l, const char *name);
/* The first sample of f with suffix carrying every label of want. */
const tbucket_sample *tbucket_html_sample(const tbucket_family *f,
                                          const char *suffix,
                                          const tbucket_labels *want);
/* One figure in a <td> (cell 1) or <span>, tagged with data-metric and
 * data-labels; a dash without a sample. */
void tbucket_html_value(request_rec *r, const tbucket_family *f,
                        const tbucket_sample *s, int cell);
/* A bar cell, n out of max. */
void tbucket_html_bar(request_rec *r, uint64_t n, uint64_t max);

/* Local protection's section (tbucket_status_local.c). */
void tbucket_html_local(request_rec *r, const tbucket_metrics *t);

/* ---- Active bans (tbucket_status_bans.c) ------------------------- */

/* Ask Redis for the active bans (t->bans, t->bans_note, t->bans_more;
 * t->p is the only other field read): once per client and prefix of
 * this child, bounded, never through an open breaker. Before the other
 * figures are read, so that the pool figures include its calls. Then
 * tbucket_bans_refused, once t->top is there, adds each key's refusals. */
void tbucket_collect_bans(tbucket_metrics *t);
void tbucket_bans_refused(tbucket_metrics *t);

/* The HTML view's section of bans, and the JSON view's "bans" members
 * (with a leading comma; nothing when t->bans is NULL). */
void tbucket_bans_html(request_rec *r, const tbucket_metrics *t);
void tbucket_bans_json(request_rec *r, const tbucket_metrics *t);

#endif /* TBUCKET_STATUS_H */

/* tbucket_rules.c -- TBucketRule: several limits per request, each with a
 * key of its own, charged before the handler or by the response's status,
 * with bans every replica honours.
 *
 * A scope's rules ride in the same decision as its TBucketLimit and
 * routes (one Redis call, all or nothing: the core's rule buckets), each
 * keyed by its own expression; rules whose keys come later (the form
 * body, the authenticated user) are decided when their keys exist
 * (mod_tbucket.c's parts). This file owns the directive and its merge, a
 * request's rule buckets and the rules' counters, and count=: before the
 * handler a counted rule takes its cost as a reservation, so parallel
 * attempts see each other; once the final status is known a protocol
 * filter keeps the reservations whose rule counts the status and gives
 * the others back, before the first byte leaves. A protocol-level filter
 * survives internal redirects and ErrorDocument and sees error responses
 * made before the handler. */
#include "apr_lib.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "util_filter.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

#define CHARGE_FILTER "TBUCKET_CHARGE"
#define KNOWN_FILTER "TBUCKET_KNOWN"
#define RULE_NAME_MAX 32

/* The rules of the configuration being read (pconf), for their records. */
static apr_array_header_t *named;

static ap_filter_rec_t *charge_filter_handle;
static ap_filter_rec_t *known_filter_handle;

/* The reservations of a chain's count= rules, settled by the status;
 * kept in the root's pool. */
struct tbucket_charge {
    tbucket_srv_conf *sc;
    tb_request_t q;                   /* Prefix, clock: the decision's. */
    int n;                            /* 0 once settled or cancelled.   */
    int marked;                       /* Known clients marked already.  */
    tb_take_t takes[TBUCKET_MAX_RULES];
    const tbucket_named_rule *which[TBUCKET_MAX_RULES];
    const char *base_key[TBUCKET_MAX_RULES]; /* known= rules' K.       */
};

/* ---- The directive ---------------------------------------------------- */

int tbucket_key_is_late(const char *expr)
{
    static const char *const late[] = {
        "REMOTE_USER", "AUTH_TYPE", "ENV:", "reqenv:", "note:"
    };
    size_t i;

    for (i = 0; i < sizeof(late) / sizeof(late[0]); i++) {
        if (ap_strcasestr(expr, late[i])) {
            return 1;
        }
    }
    return 0;
}

static int name_valid(const char *s)
{
    size_t n = strlen(s), i;

    for (i = 0; i < n; i++) {
        if (!apr_isalnum(s[i]) && s[i] != '_' && s[i] != '-') {
            return 0;
        }
    }
    return n >= 1 && n <= RULE_NAME_MAX;
}

/* count=200,401,4xx into the rule rec's count. */
static const char *parse_count(cmd_parms *cmd, void *rec, const char *list)
{
    tbucket_named_rule *ru = rec;
    char *copy = apr_pstrdup(cmd->temp_pool, list), *tok, *last;

    for (tok = apr_strtok(copy, ",", &last); tok;
         tok = apr_strtok(NULL, ",", &last)) {
        int lo, hi, s;

        if (strlen(tok) == 3 && tok[0] >= '1' && tok[0] <= '5'
            && (tok[1] == 'x' || tok[1] == 'X') && tok[2] == tok[1]) {
            lo = (tok[0] - '0') * 100;
            hi = lo + 99;
        }
        else if (strlen(tok) == 3 && apr_isdigit(tok[0])
                 && apr_isdigit(tok[1]) && apr_isdigit(tok[2])
                 && atoi(tok) >= 100 && atoi(tok) <= 599) {
            lo = hi = atoi(tok);
        }
        else {
            return tbucket_bad_value(cmd, "count", list, "each is a status "
                                     "from 100 to 599 or a class 1xx..5xx, "
                                     "comma-separated");
        }
        for (s = lo; s <= hi; s++) {
            ru->count[(s - 100) / 8] |= (unsigned char)(1u << ((s - 100) % 8));
        }
    }
    ru->counted = 1;
    return NULL;
}

/* known-by=cookie|address|cookie,address into the rule rec. */
static const char *parse_known_by(cmd_parms *cmd, void *rec, const char *v)
{
    tbucket_named_rule *ru = rec;
    char *copy = apr_pstrdup(cmd->temp_pool, v), *tok, *last;

    ru->known_by = 0;
    for (tok = apr_strtok(copy, ",", &last); tok;
         tok = apr_strtok(NULL, ",", &last)) {
        if (!strcasecmp(tok, "cookie")) {
            ru->known_by |= TBUCKET_KNOWN_COOKIE;
        }
        else if (!strcasecmp(tok, "address")) {
            ru->known_by |= TBUCKET_KNOWN_ADDRESS;
        }
        else {
            ru->known_by = 0;
            break;
        }
    }
    return ru->known_by ? NULL : tbucket_bad_value(cmd, "known-by", v,
                                                   "cookie, address or "
                                                   "cookie,address");
}

#define RULE(f) APR_OFFSETOF(tbucket_named_rule, f)
#define KNOWN_MAX_MS (400LL * 86400000)

/* The options after CAPACITY RATE. ban= takes no bare number: it never
 * did, and a ban of "30" milliseconds is no ban. */
static const tbucket_value rule_opts[] = {
    { "cost", TBUCKET_V_INT, TBUCKET_AT_DOUBLE, RULE(cost), 0, 1,
      (int64_t)TB_MAX_CAPACITY, 0, NULL, "N", NULL, NULL },
    { "count", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL,
      "STATUS,...", NULL, parse_count },
    { "ban", TBUCKET_V_DURATION, TBUCKET_AT_INT64, RULE(ban_ms), 0, 1000,
      TB_MAX_BAN_MS, 0, NULL, "DURATION", NULL, NULL },
    { "known", TBUCKET_V_DURATION, TBUCKET_AT_INT64, RULE(known_ms), 0, 1000,
      KNOWN_MAX_MS, 0, NULL, "DURATION", NULL, NULL },
    { "known-by", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL,
      "cookie|address", NULL, parse_known_by },
    { NULL }
};

/* The options after CAPACITY RATE; a cost must fit the capacity. */
static const char *parse_options(cmd_parms *cmd, const char *args,
                                 tbucket_named_rule *ru)
{
    const char *msg = tbucket_options(cmd, rule_opts, ru, NULL, args, NULL);

    if (!msg && ru->cost > ru->limit.capacity) {
        return tbucket_bad_value(cmd, "cost", apr_psprintf(cmd->temp_pool,
                                 "%.0f", ru->cost), apr_psprintf(
                                 cmd->temp_pool, "more than the capacity, "
                                 "%.0f: it could never be taken",
                                 ru->limit.capacity));
    }
    if (!msg && ru->known_ms && !ru->counted) {
        msg = tbucket_bad_value(cmd, "known", "", "known= needs count=: "
                                "a client becomes known by a status the "
                                "rule does not count");
    }
    if (!msg && ru->known_ms && !ru->known_by) {
        ru->known_by = TBUCKET_KNOWN_COOKIE;
    }
    if (!msg && ru->known_ms) {
        ru->cookie = apr_pstrcat(cmd->pool, "tbk_", ru->name, NULL);
    }
    return msg;
}

static const char *parse_key(cmd_parms *cmd, const char *key,
                             tbucket_named_rule *ru)
{
    const char *err = NULL;

    if (tbucket_quote_in_var_arg(key)) {
        return tbucket_bad_value(cmd, "key", key, "a quote inside "
                                 "%{NAME:arg} (httpd's expression scanner "
                                 "cannot take it)");
    }
    ru->key = ap_expr_parse_cmd(cmd, key, AP_EXPR_FLAG_STRING_RESULT
                                | AP_EXPR_FLAG_DONT_VARY, &err, NULL);
    if (err || !ru->key) {
        return tbucket_bad_value(cmd, "key", key,
                                 err ? err : "cannot parse the expression");
    }
    ru->key_addr = !strcasecmp(key, "%{REMOTE_ADDR}");
    ru->key_late = tbucket_key_is_late(key);
    ru->key_body = ap_strcasestr(key, "%{FORM:") != NULL
                   || ap_strcasestr(key, "%{FORMLOGIN:") != NULL;
    ru->key_const = tbucket_expr_constant(cmd, key);
    ru->key_user = ru->key_body || ap_strcasestr(key, "REMOTE_USER")
                   || ap_strcasestr(key, "%{HTTP:")
                   || ap_strcasestr(key, "%{HTTP_")
                   || ap_strcasestr(key, "req(")
                   || ap_strcasestr(key, "http(");
    return NULL;
}

/* The rule from the words after NAME. */
static const char *parse_rule(cmd_parms *cmd, const char *args,
                              tbucket_named_rule *ru)
{
    const char *key = ap_getword_conf(cmd->temp_pool, &args);
    const char *cap = ap_getword_conf(cmd->temp_pool, &args);
    const char *rate = ap_getword_conf(cmd->temp_pool, &args);
    const char *msg;

    if (!strcasecmp(key, "off") && !*cap) {
        ru->off = 1;
        return NULL;
    }
    if (!*key || !*cap || !*rate) {
        return apr_psprintf(cmd->pool, "TBucketRule %s: expected NAME KEY "
                            "CAPACITY RATE [cost=N] [count=STATUS,...] "
                            "[ban=DURATION] [known=DURATION] [known-by="
                            "cookie|address], or NAME Off", ru->name);
    }
    if ((msg = parse_key(cmd, key, ru)) != NULL
        || (msg = tbucket_parse_limit(cmd, cap, rate, &ru->limit)) != NULL) {
        return msg;
    }
    ru->cost = 1;
    return parse_options(cmd, args, ru);
}

/* When dc's rules can be decided (tbucket_rule_part), and whether one
 * of them counts by status. */
static void rules_flags(tbucket_dir_conf *dc)
{
    int i;

    dc->rules_late = dc->rules_body = dc->rules_counted = 0;
    for (i = 0; i < dc->nrules; i++) {
        const tbucket_named_rule *ru = dc->rules[i];

        if (ru->off) {
            continue;
        }
        dc->rules_late |= ru->key_late;
        dc->rules_body |= ru->key_body && !ru->key_late;
        dc->rules_counted |= ru->counted;
    }
}

int tbucket_rule_part(const tbucket_named_rule *ru)
{
    return ru->key_late ? TBUCKET_PART_LATE
           : ru->key_body ? TBUCKET_PART_BODY : TBUCKET_PART_EARLY;
}

const char *tbucket_set_rule(cmd_parms *cmd, void *dcv, const char *args)
{
    tbucket_dir_conf *dc = dcv;
    tbucket_named_rule *ru = apr_pcalloc(cmd->pool, sizeof(*ru));
    const char *msg;
    int i;

    ru->name = ap_getword_conf(cmd->pool, &args);
    ru->slot = -1;
    if (!name_valid(ru->name)) {
        return tbucket_bad_value(cmd, "name", ru->name, "1 to 32 of "
                                 "A-Z, a-z, 0-9, '_' and '-'");
    }
    for (i = 0; i < dc->nrules; i++) {
        if (!strcmp(dc->rules[i]->name, ru->name)) {
            return tbucket_bad_value(cmd, "name", ru->name, "a rule of "
                                     "that name is set in this scope "
                                     "already");
        }
    }
    if (dc->nrules >= TBUCKET_MAX_RULES) {
        return tbucket_bad_value(cmd, "name", ru->name, apr_psprintf(
                                 cmd->temp_pool, "a scope holds at most %d "
                                 "rules", TBUCKET_MAX_RULES));
    }
    if ((msg = parse_rule(cmd, args, ru)) != NULL) {
        return msg;
    }
    dc->rules[dc->nrules++] = ru;
    rules_flags(dc);
    if (named && !ru->off && !ap_check_cmd_context(cmd, NOT_IN_HTACCESS)) {
        APR_ARRAY_PUSH(named, tbucket_named_rule *) = ru;
    }
    return NULL;
}

const char *tbucket_set_form_limit(cmd_parms *cmd, void *dcv,
                                   const char *arg)
{
    tbucket_dir_conf *dc = dcv;
    int64_t n;
    const char *msg = tbucket_int_value(cmd, "size", arg, 1, 1048576, &n);

    if (!msg) {
        dc->form_limit = (apr_off_t)n;
    }
    return msg;
}

void tbucket_named_rules_pre_config(apr_pool_t *pconf)
{
    named = apr_array_make(pconf, 8, sizeof(tbucket_named_rule *));
}

int tbucket_named_rules_ban(void)
{
    int i;

    for (i = 0; named && i < named->nelts; i++) {
        if (APR_ARRAY_IDX(named, i, tbucket_named_rule *)->ban_ms > 0) {
            return 1;
        }
    }
    return 0;
}

void tbucket_named_rules_setup(server_rec *main_s)
{
    int i;

    for (i = 0; named && i < named->nelts; i++) {
        tbucket_named_rule *ru = APR_ARRAY_IDX(named, i,
                                               tbucket_named_rule *);

        ru->slot = tbucket_shm_named_slot(ru->name);
        if (ru->slot < 0) {
            ap_log_error(APLOG_MARK, APLOG_WARNING, 0, main_s, TBLOGNO(00170)
                         "TBucketRule %s: no record left for its counts on "
                         "the status page (256 names at most)", ru->name);
        }
    }
}

/* ---- The merge ------------------------------------------------------- */

void tbucket_rules_merge(tbucket_dir_conf *m, const tbucket_dir_conf *base,
                         const tbucket_dir_conf *add)
{
    int i, j, n = 0;

    for (i = 0; i < base->nrules; i++) {
        m->rules[n++] = base->rules[i];
    }
    for (j = 0; j < add->nrules; j++) {
        const tbucket_named_rule *ru = add->rules[j];

        for (i = 0; i < n && strcmp(m->rules[i]->name, ru->name); i++) {
        }
        if (i < n) {
            /* An inner rule of the name replaces the outer one; Off
             * removes it. */
            memmove(&m->rules[i], &m->rules[i + 1],
                    (size_t)(n - i - 1) * sizeof(m->rules[0]));
            n--;
        }
        if (!ru->off && n < TBUCKET_MAX_RULES) {
            m->rules[n++] = ru;
        }
    }
    m->nrules = n;
    rules_flags(m);
    m->form_timeout_ms = add->form_timeout_ms != -1 ? add->form_timeout_ms
                                                    : base->form_timeout_ms;
    m->form_limit = add->form_limit != -1 ? add->form_limit
                                          : base->form_limit;
}

/* ---- The request's buckets ------------------------------------------- */

/* A rule's key for r, or NULL when it does not apply (empty, or the
 * expression failed). Keyed by the address, an IPv6 client is keyed by
 * its network, as TBucketKey's default is. */
static const char *rule_key(request_rec *r, const tbucket_named_rule *ru,
                            const tbucket_srv_conf *sc)
{
    const char *err = NULL, *key = ap_expr_str_exec(r, ru->key, &err);
    char *net;

    if (err) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00171)
                      "TBucketRule %s: key not evaluated (%s): the rule "
                      "does not apply", ru->name, err);
        return NULL;
    }
    if (!key || !*key) {
        return NULL;
    }
    if (ru->key_addr && strchr(key, ':')) {
        net = apr_palloc(r->pool, TB_IP_KEY_LEN);
        if (tb_ip_key(key, sc->ipv6_bits, net, TB_IP_KEY_LEN)) {
            return net;
        }
    }
    return key;
}

int tbucket_rules_takes(request_rec *r, const tbucket_dir_conf *dc,
                        const tbucket_srv_conf *sc, tbucket_decision *d,
                        int parts)
{
    tb_take_t *takes = d->takes;
    const tbucket_named_rule **which = d->which;
    int i, n = d->q.ntakes;

    for (i = 0; i < dc->nrules && n < TB_MAX_BUCKETS; i++) {
        const tbucket_named_rule *ru = dc->rules[i];
        const char *key;

        if (ru->off || !(tbucket_rule_part(ru) & parts)
            || !(key = rule_key(r, ru, sc))) {
            continue;
        }
        memset(&takes[n], 0, sizeof(takes[n]));
        d->base_key[n] = NULL;
        if (ru->known_ms) {
            int known;

            d->base_key[n] = key;
            key = tbucket_known_key(r, ru, sc, key, &known);
            d->known |= (unsigned)known << n;
        }
        takes[n].limit = ru->limit;
        takes[n].cost = ru->cost;
        takes[n].route = ru->name;
        /* The server's prefix, whatever keys the client (an IP-keyed
         * client's buckets live under TBucketPrefix + "ip:"): a rule's
         * buckets are the same in every scope that has it. */
        takes[n].prefix = sc->prefix;
        takes[n].key = key;
        takes[n].key_len = strlen(key);
        /* A count= rule takes its cost now, as a reservation the
         * response's status keeps or gives back: held without taking,
         * N parallel attempts would all pass a bucket holding one. */
        takes[n].hold = 0;
        takes[n].ban_ms = ru->ban_ms;
        which[n++] = ru;
    }
    d->q.ntakes = n;
    return n;
}

void tbucket_rules_count(const tb_request_t *q,
                         const tbucket_named_rule *const *which,
                         unsigned known, const tb_result_t *res)
{
    int i;

    for (i = 0; i < q->ntakes; i++) {
        if (!which[i]) {
            continue;
        }
        tbucket_count_named(which[i]->slot, TBUCKET_RULE_APPLIED);
        if (known & (1u << i)) {
            tbucket_count_named(which[i]->slot, TBUCKET_RULE_KNOWN);
        }
        if (res->bans_set & (1u << i)) {
            tbucket_count_named(which[i]->slot, TBUCKET_RULE_BANS);
        }
        if (!res->allowed && res->binding == i
            && res->refused_by == TB_LIMIT_RATE) {
            tbucket_count_named(which[i]->slot,
                                res->banned ? TBUCKET_RULE_BANNED
                                            : TBUCKET_RULE_REFUSED);
        }
    }
}

/* ---- count=: reservations settled by the status --------------------- */

tbucket_charge *tbucket_rules_reserve(request_rec *root,
                                      tbucket_srv_conf *sc,
                                      const tbucket_decision *d,
                                      tbucket_charge *ch)
{
    const tb_request_t *q = &d->q;
    const tbucket_named_rule *const *which = d->which;
    int i, added = 0;

    for (i = 0; i < q->ntakes; i++) {
        if (!which[i] || !which[i]->counted) {
            continue;
        }
        if (!ch) {
            ch = apr_pcalloc(root->pool, sizeof(*ch));
            ch->sc = sc;
            ch->q.prefix = q->prefix;
            ch->q.now_ms = q->now_ms;
            added = 1;
        }
        if (ch->n >= TBUCKET_MAX_RULES) {
            break;
        }
        ch->takes[ch->n] = q->takes[i];
        ch->takes[ch->n].key = apr_pstrmemdup(root->pool, q->takes[i].key,
                                              q->takes[i].key_len);
        ch->takes[ch->n].ban_ms = 0;
        ch->base_key[ch->n] = d->base_key[i]
                              ? apr_pstrdup(root->pool, d->base_key[i]) : NULL;
        ch->which[ch->n++] = which[i];
    }
    if (added) {
        ap_add_output_filter_handle(charge_filter_handle, ch, root,
                                    root->connection);
        ap_add_output_filter_handle(known_filter_handle, ch, root,
                                    root->connection);
    }
    return ch;
}

void tbucket_rules_cancel(tbucket_charge *ch)
{
    if (ch) {
        ch->n = 0;
    }
}

static int counts(const tbucket_named_rule *ru, int status)
{
    return status >= 100 && status <= 599
           && (ru->count[(status - 100) / 8] & (1u << ((status - 100) % 8)));
}

/* Settle ch by status: a reservation whose rule counts the status is
 * kept (no call), the others are given back in one call per slot. */
static void settle(request_rec *r, tbucket_charge *ch, int status)
{
    tb_take_t takes[TBUCKET_MAX_RULES];
    const tbucket_named_rule *which[TBUCKET_MAX_RULES];
    tb_request_t q = ch->q;
    tb_result_t res;
    tbucket_client *c = ch->sc->client;
    int i, n = 0;

    for (i = 0; i < ch->n; i++) {
        if (counts(ch->which[i], status)) {
            tbucket_count_named(ch->which[i]->slot, TBUCKET_RULE_CHARGED);
        }
        else {
            which[n] = ch->which[i];
            takes[n++] = ch->takes[i];
        }
    }
    ch->n = 0;
    if (!n || !c || !c->tb) {
        return;
    }
    q.takes = takes;
    q.ntakes = n;
    if (tb_client_refund(c->tb, &q, &res) != TB_OK) {
        tbucket_note_breaker(r, c, &res, ch->sc);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00172)
                      "status %d: %d reservation(s) not given back (%s: "
                      "%s)", status, n, tb_err_name(res.err), c->tb->errstr);
        return;
    }
    tbucket_note_breaker(r, c, &res, ch->sc);
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00173)
                  "status %d: gave back %d reservation(s), first %s", status,
                  n, which[0]->name);
}

/* The first brigade of the final response: its status is known and no
 * byte of it has left. Settle, then step aside. */
static apr_status_t charge_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    settle(f->r, f->ctx, f->r->status);
    ap_remove_output_filter(f);
    return ap_pass_brigade(f->next, bb);
}

/* The first brigade of a response of the chain, before its headers are
 * made: a known= rule whose status this is not counted and is under 400
 * (a success) makes
 * the client known for its key, by a Set-Cookie the response still
 * carries. */
static apr_status_t known_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    tbucket_charge *ch = f->ctx;
    int i;

    for (i = 0; i < ch->n && !ch->marked; i++) {
        /* A success: a status the rule does not count, and not an
         * error (a 401, a 500 is never a login). */
        if (ch->base_key[i] && f->r->status < 400
            && !counts(ch->which[i], f->r->status)) {
            tbucket_known_mark(f->r, ch->which[i], ch->sc, ch->base_key[i]);
        }
    }
    ch->marked = 1;
    ap_remove_output_filter(f);
    return ap_pass_brigade(f->next, bb);
}

/* Every later request of a chain with known= reservations gets the
 * filter again: an internal redirect's request starts from the
 * connection's filters. */
static void insert_known(request_rec *r)
{
    const tbucket_req *rq;
    int i;

    if (r->main || !r->prev) {
        return;
    }
    rq = ap_get_module_config(tbucket_chain_root(r)->request_config,
                              &tbucket_module);
    for (i = 0; rq && rq->charge && !rq->charge->marked
                && i < rq->charge->n; i++) {
        if (rq->charge->base_key[i]) {
            ap_add_output_filter_handle(known_filter_handle, rq->charge, r,
                                        r->connection);
            return;
        }
    }
}

void tbucket_rules_no_ranges(request_rec *r, const tbucket_dir_conf *dc)
{
    /* httpd's byte-range filter would turn the status count= judges (a
     * failed login's 200) into a 206 before the filter sees it; the
     * scope's pages are logins, not downloads to resume. */
    if (dc->rules_counted) {
        apr_table_unset(r->headers_in, "Range");
        apr_table_unset(r->headers_in, "Request-Range");
        apr_table_unset(r->headers_in, "If-Range");
    }
}

void tbucket_rules_register(void)
{
    /* After HTTP_HEADER (AP_FTYPE_PROTOCOL) and before the connection's
     * filters: the status is final, nothing has been sent. (A filter of
     * httpd's own type goes after BYTERANGE, measured: no use; the
     * byte ranges are kept off by tbucket_rules_no_ranges instead.) */
    charge_filter_handle = ap_register_output_filter(
        CHARGE_FILTER, charge_filter, NULL,
        (ap_filter_type)(AP_FTYPE_PROTOCOL + 1));
    /* Before the response's headers are made, to add a cookie to them;
     * a request filter, so each request of a chain gets its own. */
    known_filter_handle = ap_register_output_filter(
        KNOWN_FILTER, known_filter, NULL, AP_FTYPE_CONTENT_SET);
    ap_hook_insert_filter(insert_known, NULL, NULL, APR_HOOK_MIDDLE);
    tbucket_form_register();
}

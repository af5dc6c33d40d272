/* tbucket_rules.c -- TBucketRule: several limits per request, each with a
 * key of its own, charged before the handler or by the response's status,
 * with bans every replica honours.
 *
 * A scope's rules ride in the same decision as its TBucketLimit and
 * routes (one Redis call, all or nothing: the core's rule buckets), each
 * keyed by its own expression. This file owns the directive and its
 * merge, a request's rule buckets and the rules' counters, and count=:
 * before the handler a counted rule's bucket must hold its cost but is
 * not charged; once the final status is known a protocol filter charges
 * the rules that count it, before the first byte leaves, so a client that
 * waits for each answer is never one charge behind. A protocol-level
 * filter survives internal redirects and ErrorDocument and sees error
 * responses made before the handler. */
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
#define RULE_NAME_MAX 32

/* The rules of the configuration being read (pconf), for their records. */
static apr_array_header_t *named;

static ap_filter_rec_t *charge_filter_handle;

/* What charging a chain's count= rules needs, kept in the root's pool. */
struct tbucket_charge {
    tbucket_srv_conf *sc;
    tb_request_t q;                   /* Prefix, clock: the decision's. */
    int n;
    tb_take_t takes[TBUCKET_MAX_RULES];
    const tbucket_named_rule *which[TBUCKET_MAX_RULES];
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

/* count=200,401,4xx into ru->count. */
static const char *parse_count(cmd_parms *cmd, const char *list,
                               tbucket_named_rule *ru)
{
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

/* ban=30s|15m|1h|1d: 1 s .. 30 days. */
static const char *parse_ban(cmd_parms *cmd, const char *v,
                             tbucket_named_rule *ru)
{
    static const struct { char unit; int64_t ms; } units[] = {
        { 's', 1000 }, { 'm', 60000 }, { 'h', 3600000 }, { 'd', 86400000 }
    };
    const char *why = "a whole number of s, m, h or d, from 1s to 30d";
    size_t len = strlen(v), i;
    char *end;
    long long n;

    if (len < 2 || !apr_isdigit(v[0])) {
        return tbucket_bad_value(cmd, "ban", v, why);
    }
    n = strtoll(v, &end, 10);
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (end == v + len - 1 && *end == units[i].unit && n > 0
            && n <= TB_MAX_BAN_MS / units[i].ms) {
            ru->ban_ms = n * units[i].ms;
            return NULL;
        }
    }
    return tbucket_bad_value(cmd, "ban", v, why);
}

/* The options after CAPACITY RATE. */
static const char *parse_options(cmd_parms *cmd, const char **args,
                                 tbucket_named_rule *ru)
{
    const char *w, *msg = NULL;
    int64_t n;

    while (!msg && *(w = ap_getword_conf(cmd->temp_pool, args))) {
        if (!strncasecmp(w, "cost=", 5)) {
            msg = tbucket_int_value(cmd, "cost", w + 5, 1,
                                    (int64_t)ru->limit.capacity, &n);
            ru->cost = (double)n;
        }
        else if (!strncasecmp(w, "count=", 6)) {
            msg = parse_count(cmd, w + 6, ru);
        }
        else if (!strncasecmp(w, "ban=", 4)) {
            msg = parse_ban(cmd, w + 4, ru);
        }
        else {
            msg = tbucket_bad_value(cmd, "option", w, "expected cost=N, "
                                    "count=STATUS,... or ban=DURATION");
        }
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
    ru->key_form = ap_strcasestr(key, "%{FORM:") != NULL;
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
                            "[ban=DURATION], or NAME Off", ru->name);
    }
    if ((msg = parse_key(cmd, key, ru)) != NULL
        || (msg = tbucket_parse_limit(cmd, cap, rate, &ru->limit)) != NULL) {
        return msg;
    }
    ru->cost = 1;
    return parse_options(cmd, &args, ru);
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
    dc->rules_late |= ru->key_late;
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

    m->rules_late = 0;
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
    for (i = 0; i < n; i++) {
        m->rules_late |= m->rules[i]->key_late;
    }
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
                        const tbucket_srv_conf *sc, tb_take_t *takes,
                        const tbucket_named_rule **which, int n)
{
    int i;

    for (i = 0; i < dc->nrules && n < TB_MAX_BUCKETS; i++) {
        const tbucket_named_rule *ru = dc->rules[i];
        const char *key;

        if (ru->off || !(key = rule_key(r, ru, sc))) {
            continue;
        }
        memset(&takes[n], 0, sizeof(takes[n]));
        takes[n].limit = ru->limit;
        takes[n].cost = ru->cost;
        takes[n].route = ru->name;
        /* The server's prefix, whatever keys the client (an IP-keyed
         * client's buckets live under TBucketPrefix + "ip:"): a rule's
         * buckets are the same in every scope that has it. */
        takes[n].prefix = sc->prefix;
        takes[n].key = key;
        takes[n].key_len = strlen(key);
        takes[n].hold = ru->counted;
        takes[n].ban_ms = ru->ban_ms;
        which[n++] = ru;
    }
    return n;
}

void tbucket_rules_count(const tb_request_t *q,
                         const tbucket_named_rule *const *which,
                         const tb_result_t *res)
{
    int i;

    for (i = 0; i < q->ntakes; i++) {
        if (!which[i]) {
            continue;
        }
        tbucket_count_named(which[i]->slot, TBUCKET_RULE_APPLIED);
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

/* ---- count=: the charge once the status is known --------------------- */

tbucket_charge *tbucket_rules_hold(request_rec *root,
                                   tbucket_srv_conf *sc,
                                   const tb_request_t *q,
                                   const tbucket_named_rule *const *which)
{
    tbucket_charge *ch = NULL;
    int i;

    for (i = 0; i < q->ntakes; i++) {
        if (!which[i] || !q->takes[i].hold) {
            continue;
        }
        if (!ch) {
            ch = apr_pcalloc(root->pool, sizeof(*ch));
            ch->sc = sc;
            ch->q.prefix = q->prefix;
            ch->q.now_ms = q->now_ms;
        }
        ch->takes[ch->n] = q->takes[i];
        ch->takes[ch->n].key = apr_pstrmemdup(root->pool, q->takes[i].key,
                                              q->takes[i].key_len);
        ch->takes[ch->n].hold = 0;
        ch->takes[ch->n].ban_ms = 0;
        ch->which[ch->n++] = which[i];
    }
    if (ch) {
        ap_add_output_filter_handle(charge_filter_handle, ch, root,
                                    root->connection);
    }
    return ch;
}

static int counts(const tbucket_named_rule *ru, int status)
{
    return status >= 100 && status <= 599
           && (ru->count[(status - 100) / 8] & (1u << ((status - 100) % 8)));
}

/* Charge the rules of ch that count status, in one call per slot. */
static void charge(request_rec *r, tbucket_charge *ch, int status)
{
    tb_take_t takes[TBUCKET_MAX_RULES];
    const tbucket_named_rule *which[TBUCKET_MAX_RULES];
    tb_request_t q = ch->q;
    tb_result_t res;
    tbucket_client *c = ch->sc->client;
    int i, n = 0;

    for (i = 0; i < ch->n; i++) {
        if (counts(ch->which[i], status)) {
            which[n] = ch->which[i];
            takes[n++] = ch->takes[i];
        }
    }
    if (!n || !c || !c->tb) {
        return;
    }
    q.takes = takes;
    q.ntakes = n;
    if (tb_client_charge(c->tb, &q, &res) != TB_OK) {
        tbucket_note_breaker(r, c, &res, ch->sc);
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00172)
                      "status %d: %d rule(s) not charged (%s: %s)", status,
                      n, tb_err_name(res.err), c->tb->errstr);
        return;
    }
    tbucket_note_breaker(r, c, &res, ch->sc);
    for (i = 0; i < n; i++) {
        tbucket_count_named(which[i]->slot, TBUCKET_RULE_CHARGED);
    }
    ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00173)
                  "status %d: charged %d rule(s), first %s (%s)", status, n,
                  which[0]->name, res.allowed ? "no debt" : "in debt");
}

/* The first brigade of the final response: its status is known and no
 * byte of it has left. Charge, then step aside. */
static apr_status_t charge_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    charge(f->r, f->ctx, f->r->status);
    ap_remove_output_filter(f);
    return ap_pass_brigade(f->next, bb);
}

void tbucket_rules_register(void)
{
    /* After HTTP_HEADER (AP_FTYPE_PROTOCOL) and before the connection's
     * filters: the status is final, nothing has been sent. */
    charge_filter_handle = ap_register_output_filter(
        CHARGE_FILTER, charge_filter, NULL,
        (ap_filter_type)(AP_FTYPE_PROTOCOL + 1));
    tbucket_form_register();
}

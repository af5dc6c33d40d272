/* tbucket_limits.c -- the one bucket record: TBucketLimit [NAME] and its
 * aliases, the merge of a scope's named limits, and the one function
 * that turns a scope's limits into a request's takes.
 *
 * `TBucketLimit CAPACITY RATE` is the scope's own bucket, keyed by
 * TBucketKey. `TBucketLimit NAME CAPACITY RATE [key=EXPR] [cost=N]
 * [count=...] [ban=D] [known=D] [known-by=...]` is one more, decided in
 * the same call: without key= keyed by TBucketKey ("...:route:NAME"),
 * with key= by its own expression ("...:rule:NAME"). TBucketRouteLimit
 * NAME CAPACITY RATE and TBucketRule NAME KEY CAPACITY RATE [options]
 * are the two older spellings of those and make the same records, so a
 * configuration keeps its decisions and Redis keys. Named limits merge
 * by name whatever spelled them (inner replaces outer, NAME Off
 * removes); past TBUCKET_MAX_LIMITS the outermost are dropped, which
 * check_config reports. Which options go together is tbucket_check.c's
 * table. */
#include "apr_lib.h"
#include "apr_strings.h"

#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"

#include "mod_tbucket.h"

APLOG_USE_MODULE(tbucket);

/* A name that keys its own bucket also names a cookie (tbk_NAME) and a
 * record of the segment: shorter, without '.'. */
#define OWN_NAME_MAX 32
#define KNOWN_MAX_MS (400LL * 86400000)
#define LIM(f) APR_OFFSETOF(tbucket_limit, f)

/* The named limits of the configuration being read (pconf), for their
 * records in the segment. */
static apr_array_header_t *named;

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

static int own_name_valid(const char *s)
{
    size_t n = strlen(s), i;

    for (i = 0; i < n; i++) {
        if (!apr_isalnum(s[i]) && s[i] != '_' && s[i] != '-') {
            return 0;
        }
    }
    return n >= 1 && n <= OWN_NAME_MAX;
}

/* ---- The options ------------------------------------------------------ */

/* count=200,401,4xx into the record's count. */
static const char *parse_count(cmd_parms *cmd, void *rec, const char *list)
{
    tbucket_limit *l = rec;
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
            l->count[(s - 100) / 8] |= (unsigned char)(1u << ((s - 100) % 8));
        }
    }
    l->counted = 1;
    l->count_text = apr_pstrdup(cmd->pool, list);
    return NULL;
}

/* known-by=cookie|address|cookie,address into the record. */
static const char *parse_known_by(cmd_parms *cmd, void *rec, const char *v)
{
    tbucket_limit *l = rec;
    char *copy = apr_pstrdup(cmd->temp_pool, v), *tok, *last;

    l->known_by = 0;
    for (tok = apr_strtok(copy, ",", &last); tok;
         tok = apr_strtok(NULL, ",", &last)) {
        if (!strcasecmp(tok, "cookie")) {
            l->known_by |= TBUCKET_KNOWN_COOKIE;
        }
        else if (!strcasecmp(tok, "address")) {
            l->known_by |= TBUCKET_KNOWN_ADDRESS;
        }
        else {
            l->known_by = 0;
            break;
        }
    }
    return l->known_by ? NULL : tbucket_bad_value(cmd, "known-by", v,
                                                   "cookie, address or "
                                                   "cookie,address");
}

/* The key expression into the record, with what it names. */
static const char *parse_key(cmd_parms *cmd, void *rec, const char *key)
{
    tbucket_limit *l = rec;
    const char *err = NULL;
    size_t n = strlen(key);

    /* key="..." in a line keeps its quotes (httpd strips them only
     * around a whole word): they are the option's, not the key's. */
    if (n >= 2 && (key[0] == '"' || key[0] == '\'') && key[n - 1] == key[0]) {
        key = apr_pstrmemdup(cmd->temp_pool, key + 1, n - 2);
    }
    if (tbucket_quote_in_var_arg(key)) {
        return tbucket_bad_value(cmd, "key", key, "a quote inside "
                                 "%{NAME:arg} (httpd's expression scanner "
                                 "cannot take it)");
    }
    l->key = ap_expr_parse_cmd(cmd, key, AP_EXPR_FLAG_STRING_RESULT
                               | AP_EXPR_FLAG_DONT_VARY, &err, NULL);
    if (err || !l->key) {
        return tbucket_bad_value(cmd, "key", key,
                                 err ? err : "cannot parse the expression");
    }
    l->own_key = 1;
    l->key_text = apr_pstrdup(cmd->pool, key);
    l->key_addr = !strcasecmp(key, "%{REMOTE_ADDR}");
    l->key_late = tbucket_key_is_late(key);
    l->key_body = ap_strcasestr(key, "%{FORM:") != NULL
                  || ap_strcasestr(key, "%{FORMLOGIN:") != NULL;
    l->key_const = tbucket_expr_constant(cmd, key);
    l->key_user = l->key_body || ap_strcasestr(key, "REMOTE_USER")
                  || ap_strcasestr(key, "%{HTTP:")
                  || ap_strcasestr(key, "%{HTTP_")
                  || ap_strcasestr(key, "req(")
                  || ap_strcasestr(key, "http(");
    l->part = l->key_late ? TBUCKET_PART_LATE
              : l->key_body ? TBUCKET_PART_BODY : TBUCKET_PART_EARLY;
    return NULL;
}

static const char *parse_cost(cmd_parms *cmd, void *rec, const char *v)
{
    tbucket_limit *l = rec;
    int64_t n;
    const char *msg = tbucket_int_value(cmd, "cost", v, 1,
                                        (int64_t)TB_MAX_CAPACITY, &n);

    if (!msg) {
        l->cost = (double)n;
        l->cost_set = 1;
    }
    return msg;
}

/* The options after CAPACITY RATE, in one table: TBucketRule's spelling
 * reads the same ones but key= and algorithm= (its key is a word of its
 * own, its algorithm the token bucket's), so it starts at RULE_OPTS.
 * ban= takes no bare number: a ban of "30" milliseconds is no ban. */
static const tbucket_value limit_opts[] = {
    { "key", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL, "EXPR",
      NULL, parse_key },
    { "algorithm", TBUCKET_V_NAME, TBUCKET_AT_INT, LIM(algo), 0, 0,
      TB_ALGO_COUNT, 0, tb_algo_names, NULL, NULL, NULL },
    { "cost", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL, "N", NULL,
      parse_cost },
    { "count", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL,
      "STATUS,...", NULL, parse_count },
    { "ban", TBUCKET_V_DURATION, TBUCKET_AT_INT64, LIM(ban_ms), 0, 1000,
      TB_MAX_BAN_MS, 0, NULL, "DURATION", NULL, NULL },
    { "known", TBUCKET_V_DURATION, TBUCKET_AT_INT64, LIM(known_ms), 0, 1000,
      KNOWN_MAX_MS, 0, NULL, "DURATION", NULL, NULL },
    { "known-by", TBUCKET_V_FN, TBUCKET_AT_INT, 0, 0, 0, 0, 0, NULL,
      "cookie|address", NULL, parse_known_by },
    { NULL }
};
#define RULE_OPTS (&limit_opts[2])

/* What one record's options mean together: a cost that fits, what
 * known= needs and implies, then the combination table. */
static const char *finish_options(cmd_parms *cmd, tbucket_limit *l)
{
    const char *msg;

    if (l->cost > l->limit.capacity) {
        return tbucket_bad_value(cmd, "cost", apr_psprintf(cmd->temp_pool,
                                 "%.0f", l->cost), apr_psprintf(
                                 cmd->temp_pool, "more than the capacity, "
                                 "%.0f: it could never be taken",
                                 l->limit.capacity));
    }
    if ((msg = tbucket_refuse_options(cmd, l)) != NULL) {
        return msg;
    }
    if (l->known_ms && !l->known_by) {
        l->known_by = TBUCKET_KNOWN_COOKIE;
    }
    if (l->known_ms) {
        l->cookie = apr_pstrcat(cmd->pool, "tbk_", l->name, NULL);
    }
    return NULL;
}

/* ---- The records of a scope ------------------------------------------- */

/* When dc's named limits can be decided (tbucket_limit_part), and
 * whether one of them counts by status. */
static void limits_flags(tbucket_dir_conf *dc)
{
    int i;

    dc->limits_late = dc->limits_body = dc->limits_counted = 0;
    dc->limits_scoped = 0;
    for (i = 0; i < dc->nlimits; i++) {
        const tbucket_limit *l = dc->limits[i];

        if (l->off) {
            continue;
        }
        dc->limits_scoped += !l->own_key;
        dc->limits_late |= l->key_late;
        dc->limits_body |= l->key_body && !l->key_late;
        dc->limits_counted |= l->counted;
    }
}

int tbucket_limit_part(const tbucket_limit *l)
{
    return l->part;
}

/* The record l into dc: one name once per scope, TBUCKET_MAX_LIMITS at
 * most; kept for its counters unless it is an Off or in .htaccess. */
static const char *add_limit(cmd_parms *cmd, tbucket_dir_conf *dc,
                             tbucket_limit *l)
{
    int i;

    for (i = 0; i < dc->nlimits; i++) {
        if (!strcmp(dc->limits[i]->name, l->name)) {
            return tbucket_bad_value(cmd, "name", l->name, "a limit of "
                                     "that name is set in this scope "
                                     "already");
        }
    }
    if (dc->nlimits >= TBUCKET_MAX_LIMITS) {
        return tbucket_bad_value(cmd, "name", l->name, apr_psprintf(
                                 cmd->temp_pool, "a scope holds at most %d "
                                 "named limits", TBUCKET_MAX_LIMITS));
    }
    dc->limits[dc->nlimits++] = l;
    limits_flags(dc);
    if (named && !l->off && !ap_check_cmd_context(cmd, NOT_IN_HTACCESS)) {
        APR_ARRAY_PUSH(named, tbucket_limit *) = l;
    }
    return NULL;
}

/* A record named name, by cmd's directive, or the refusal of the name. */
static tbucket_limit *new_limit(cmd_parms *cmd, const char *name)
{
    tbucket_limit *l = apr_pcalloc(cmd->pool, sizeof(*l));

    l->name = name;
    l->directive = cmd->cmd->name;
    l->slot = -1;
    l->algo = -1;
    l->cost = 1;
    return l;
}

static const char *check_name(cmd_parms *cmd, const tbucket_limit *l)
{
    if (l->own_key ? !own_name_valid(l->name) : !tb_name_valid(l->name)) {
        return tbucket_bad_value(cmd, "name", l->name, l->own_key
                                 ? "1 to 32 of A-Z, a-z, 0-9, '_' and '-' "
                                   "(it keys a bucket of its own)"
                                 : "1 to 64 of A-Z, a-z, 0-9, '_', '.' "
                                   "and '-'");
    }
    return NULL;
}

/* ---- The directives --------------------------------------------------- */

/* TBucketLimit CAPACITY RATE [algorithm=] [cost=]: the scope's own
 * bucket; its options are TBucketAlgorithm's and TBucketCost's. */
static const char *set_unnamed(cmd_parms *cmd, tbucket_dir_conf *dc,
                               const char *cap, const char *args)
{
    tbucket_limit l;
    const char *rate = ap_getword_conf(cmd->temp_pool, &args), *msg;

    if ((msg = tbucket_parse_limit(cmd, cap, rate, &dc->limit)) != NULL) {
        return msg;
    }
    memset(&l, 0, sizeof(l));
    l.directive = cmd->cmd->name;
    l.algo = -1;
    l.limit = dc->limit;
    if ((msg = tbucket_options(cmd, limit_opts, &l, NULL, args, NULL))
        || (msg = tbucket_refuse_options(cmd, &l))) {
        return msg;
    }
    if (l.algo != -1) {
        dc->algo = l.algo;
    }
    if (l.cost_set) {
        dc->cost = l.cost;
        dc->cost_set = 1;
    }
    dc->limit_set = 1;
    dc->rule = tbucket_scope_record(cmd, dc);
    return NULL;
}

const char *tbucket_set_limit(cmd_parms *cmd, void *dcv, const char *args)
{
    tbucket_dir_conf *dc = dcv;
    const char *first = ap_getword_conf(cmd->temp_pool, &args), *cap, *msg;
    tbucket_limit *l;

    TBUCKET_HTACCESS_CHECK(cmd);

    if (apr_isdigit(*first)) {
        return set_unnamed(cmd, dc, first, args);
    }
    if (!*first) {
        return "TBucketLimit: expected CAPACITY RATE, or NAME CAPACITY RATE "
               "[key=EXPR] [cost=N] [count=STATUS,...] [ban=DURATION] "
               "[known=DURATION] [known-by=cookie|address], or NAME Off";
    }
    l = new_limit(cmd, apr_pstrdup(cmd->pool, first));
    cap = ap_getword_conf(cmd->temp_pool, &args);
    if (!strcasecmp(cap, "off") && !*args) {
        l->off = 1;
        return add_limit(cmd, dc, l);
    }
    if ((msg = tbucket_parse_limit(cmd, cap, ap_getword_conf(cmd->temp_pool,
                                                             &args),
                                   &l->limit))
        || (msg = tbucket_options(cmd, limit_opts, l, NULL, args, NULL))
        || (msg = check_name(cmd, l)) || (msg = finish_options(cmd, l))) {
        return msg;
    }
    return add_limit(cmd, dc, l);
}

/* TBucketRouteLimit NAME CAPACITY RATE: TBucketLimit NAME CAPACITY RATE. */
const char *tbucket_set_route(cmd_parms *cmd, void *dcv, const char *name,
                              const char *cap, const char *rate)
{
    tbucket_limit *l = new_limit(cmd, apr_pstrdup(cmd->pool, name));
    const char *msg;

    TBUCKET_HTACCESS_CHECK(cmd);

    if ((msg = check_name(cmd, l))
        || (msg = tbucket_parse_limit(cmd, cap, rate, &l->limit))) {
        return msg;
    }
    return add_limit(cmd, dcv, l);
}

/* TBucketRule NAME KEY CAPACITY RATE [options]: TBucketLimit NAME
 * CAPACITY RATE key=KEY [options], its cost 1 unless it says. */
const char *tbucket_set_rule(cmd_parms *cmd, void *dcv, const char *args)
{
    tbucket_limit *l = new_limit(cmd, ap_getword_conf(cmd->pool, &args));
    const char *key = ap_getword_conf(cmd->temp_pool, &args);
    const char *cap = ap_getword_conf(cmd->temp_pool, &args);
    const char *rate = ap_getword_conf(cmd->temp_pool, &args), *msg;

    TBUCKET_HTACCESS_CHECK(cmd);

    l->own_key = 1;
    if ((msg = check_name(cmd, l)) != NULL) {
        return msg;
    }
    if (!strcasecmp(key, "off") && !*cap) {
        l->off = 1;
        return add_limit(cmd, dcv, l);
    }
    if (!*key || !*cap || !*rate) {
        return apr_psprintf(cmd->pool, "TBucketRule %s: expected NAME KEY "
                            "CAPACITY RATE [cost=N] [count=STATUS,...] "
                            "[ban=DURATION] [known=DURATION] [known-by="
                            "cookie|address], or NAME Off", l->name);
    }
    l->cost_set = 1;
    if ((msg = parse_key(cmd, l, key))
        || (msg = tbucket_parse_limit(cmd, cap, rate, &l->limit))
        || (msg = tbucket_options(cmd, RULE_OPTS, l, NULL, args, NULL))
        || (msg = finish_options(cmd, l))) {
        return msg;
    }
    return add_limit(cmd, dcv, l);
}

void tbucket_limits_pre_config(apr_pool_t *pconf)
{
    named = apr_array_make(pconf, 8, sizeof(tbucket_limit *));
}

int tbucket_limits_ban(void)
{
    int i;

    for (i = 0; named && i < named->nelts; i++) {
        if (APR_ARRAY_IDX(named, i, tbucket_limit *)->ban_ms > 0) {
            return 1;
        }
    }
    return 0;
}

void tbucket_limits_setup(server_rec *main_s)
{
    int i;

    for (i = 0; named && i < named->nelts; i++) {
        tbucket_limit *l = APR_ARRAY_IDX(named, i, tbucket_limit *);

        l->slot = tbucket_shm_named_slot(l->name);
        if (l->slot < 0) {
            ap_log_error(APLOG_MARK, APLOG_WARNING, 0, main_s, TBLOGNO(00170)
                         "%s %s: no record left for its counts on the "
                         "status page (256 names at most)", l->directive,
                         l->name);
        }
    }
}

/* ---- The merge -------------------------------------------------------- */

/* Outer first, an inner limit of a name replacing the outer one, Off
 * removing it; all of them into all[], their count returned (at most
 * 2 * TBUCKET_MAX_LIMITS). */
static int merged(const tbucket_dir_conf *base, const tbucket_dir_conf *add,
                  const tbucket_limit **all)
{
    int i, j, n = 0;

    for (i = 0; i < base->nlimits; i++) {
        all[n++] = base->limits[i];
    }
    for (j = 0; j < add->nlimits; j++) {
        const tbucket_limit *l = add->limits[j];

        for (i = 0; i < n && strcmp(all[i]->name, l->name); i++) {
        }
        if (i < n) {
            memmove(&all[i], &all[i + 1], (size_t)(n - i - 1) * sizeof(*all));
            n--;
        }
        if (!l->off) {
            all[n++] = l;
        }
    }
    return n;
}

int tbucket_limits_dropped(const tbucket_dir_conf *base,
                           const tbucket_dir_conf *add, const char **names,
                           apr_pool_t *p)
{
    const tbucket_limit *all[2 * TBUCKET_MAX_LIMITS];
    int n = merged(base, add, all), i, over = n - TBUCKET_MAX_LIMITS;

    *names = "";
    for (i = 0; i < over; i++) {
        *names = apr_pstrcat(p, *names, i ? ", " : "", all[i]->name, NULL);
    }
    return over > 0 ? over : 0;
}

void tbucket_limits_merge(tbucket_dir_conf *m, const tbucket_dir_conf *base,
                          const tbucket_dir_conf *add)
{
    const tbucket_limit *all[2 * TBUCKET_MAX_LIMITS];
    int n = merged(base, add, all), from = 0;

    /* Past the maximum the outermost go: what the inner scope says about
     * its own URLs wins (check_config names the dropped ones). */
    if (n > TBUCKET_MAX_LIMITS) {
        from = n - TBUCKET_MAX_LIMITS;
        n = TBUCKET_MAX_LIMITS;
    }
    memcpy(m->limits, all + from, (size_t)n * sizeof(*all));
    m->nlimits = n;
    limits_flags(m);
    m->form_timeout_ms = add->form_timeout_ms != -1 ? add->form_timeout_ms
                                                    : base->form_timeout_ms;
    m->form_limit = add->form_limit != -1 ? add->form_limit
                                          : base->form_limit;
}

/* ---- The request's takes ---------------------------------------------- */

/* A limit's own key for r, or NULL when it does not apply (empty, or
 * the expression failed). Keyed by the address, an IPv6 client is keyed
 * by its network, as TBucketKey's default is. */
static const char *own_key(request_rec *r, const tbucket_limit *l,
                           const tbucket_srv_conf *sc)
{
    const char *err = NULL, *key = ap_expr_str_exec(r, l->key, &err);
    char *net;

    if (err) {
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, TBLOGNO(00171)
                      "%s %s: key not evaluated (%s): the limit does not "
                      "apply", l->directive, l->name, err);
        return NULL;
    }
    if (!key || !*key) {
        tbucket_limit_keyless(r, l);
        return NULL;
    }
    if (l->key_body) {
        tbucket_limit_keyed(r, l);
    }
    if (l->key_addr && strchr(key, ':')) {
        net = apr_palloc(r->pool, TB_IP_KEY_LEN);
        if (tb_ip_key(key, sc->ipv6_bits, net, TB_IP_KEY_LEN)) {
            return net;
        }
    }
    return key;
}

/* The take of l with its own key (NULL: it does not apply to r) at
 * d->takes[n]. */
static int own_take(request_rec *r, const tbucket_limit *l,
                    const tbucket_srv_conf *sc, tbucket_decision *d, int n)
{
    tb_take_t *t = &d->takes[n];
    const char *key = own_key(r, l, sc);

    if (!key) {
        return 0;
    }
    d->base_key[n] = NULL;
    if (l->known_ms) {
        int known;

        d->base_key[n] = key;
        key = tbucket_known_key(r, l, sc, key, &known);
        d->known |= (unsigned)known << n;
    }
    /* The server's prefix, whatever keys the client (an IP-keyed
     * client's buckets live under TBucketPrefix + "ip:"): a limit's own
     * buckets are the same in every scope that has it. */
    t->prefix = sc->prefix;
    t->key = key;
    t->key_len = strlen(key);
    /* A count= limit takes its cost now, as a reservation the response's
     * status keeps or gives back: held without taking, N parallel
     * attempts would all pass a bucket holding one. */
    t->hold = 0;
    t->ban_ms = l->ban_ms;
    return 1;
}

int tbucket_limits_takes(request_rec *r, const tbucket_dir_conf *dc,
                         const tbucket_srv_conf *sc, tbucket_decision *d,
                         int parts, int main, const tb_limit_t *main_limit)
{
    int i, pass, n = d->q.ntakes;
    /* The parts each pass takes: TBucketKey's (with the scope's own
     * bucket), then those of the limits with keys of their own. */
    int want[2];

    want[0] = main && dc->limits_scoped;
    want[1] = parts;
    if (main_limit && n < TB_MAX_BUCKETS) {
        memset(&d->takes[n], 0, sizeof(d->takes[n]));
        d->takes[n].limit = *main_limit;
        d->takes[n++].cost = dc->cost;
    }
    /* Scope-keyed limits before own-keyed ones: the order of the takes
     * (and so which of two equally tight buckets binds) is the order the
     * older spellings gave. */
    for (pass = 0; pass < 2; pass++) {
        for (i = 0; want[pass] && i < dc->nlimits && n < TB_MAX_BUCKETS;
             i++) {
            const tbucket_limit *l = dc->limits[i];

            if (l->off || l->own_key != pass || (pass
                && !(l->part & parts))) {
                continue;
            }
            memset(&d->takes[n], 0, sizeof(d->takes[n]));
            if (pass && !own_take(r, l, sc, d, n)) {
                continue;
            }
            d->takes[n].limit = l->limit;
            d->takes[n].cost = l->cost_set ? l->cost : dc->cost;
            d->takes[n].name = l->name;
            d->takes[n].kind = pass ? TB_TAKE_KEYED : TB_TAKE_NAMED;
            d->which[n++] = l;
        }
    }
    d->q.ntakes = n;
    return n;
}

/* driver_rules.h -- tb_driver's commands for rule buckets (TBucketRule):
 * decisions over buckets of several client keys, held and banning, the
 * later charge, and bans. Included once, by tb_driver.c, which owns the
 * helpers (unescape, to_double, to_i64, print_result, held[]).
 *
 *   rules NOW CONC KEY [NAME RKEY CAP RATE COST HOLD BAN_MS ...]
 *       One decision: NAME "-" is KEY's main bucket, RKEY "-" the route
 *       NAME of KEY, else the bucket of rule NAME for client key RKEY
 *       (checked, not charged, when HOLD is 1; banning for BAN_MS ms).
 *       NOW is a clock in ms or "-" for Redis's; CONC 0 or a concurrency
 *       limit (default ttl). Prints banned= bans_set= (bit masks)
 *       handle= (for release) refused_by= then what take prints.
 *   charge NOW NAME RKEY CAP RATE COST [...]
 *       tb_client_charge() of those rule buckets (NOW as for rules):
 *       what take prints.
 *   ban RULE KEY MS       tb_client_ban(): rc=
 *   unban RULE KEY [keep] tb_client_unban() (keep: the bucket
 *                         kept): rc= found=
 *   bans MAX              tb_client_bans(): n= then rule/key/left_ms per
 *                         ban, as ban=RULE,KEY,MS (KEY %-escaped).
 */
#ifndef DRIVER_RULES_H
#define DRIVER_RULES_H

/* One bucket of a rules command: av[0..6] as above into *x. */
static int parse_rule_take(char **av, tb_take_t *x)
{
    int64_t hold, ban;
    long klen;

    memset(x, 0, sizeof(*x));
    x->name = strcmp(av[0], "-") == 0 ? NULL : av[0];
    x->kind = x->name ? TB_TAKE_NAMED : TB_TAKE_MAIN;
    if (strcmp(av[1], "-") != 0) {
        x->kind = TB_TAKE_KEYED;
        if ((klen = unescape(av[1])) < 0) {
            return -1;
        }
        x->key = av[1];
        x->key_len = (size_t)klen;
    }
    if (to_double(av[2], &x->limit.capacity)
        || to_double(av[3], &x->limit.rate_per_sec)
        || to_double(av[4], &x->cost) || to_i64(av[5], &hold)
        || to_i64(av[6], &ban)) {
        return -1;
    }
    x->hold = (int)hold;
    x->ban_ms = ban;
    return 0;
}

static int parse_rule_takes(char **av, int ac, tb_take_t *t, int *n)
{
    int i;

    if (ac % 7 != 0 || ac / 7 > TB_MAX_BUCKETS) {
        return -1;
    }
    for (*n = 0, i = 0; i < ac; i += 7) {
        if (parse_rule_take(av + i, &t[(*n)++])) {
            return -1;
        }
    }
    return 0;
}

static void cmd_rules(tb_client_t *c, char **av, int ac)
{
    tb_take_t t[TB_MAX_BUCKETS];
    tb_request_t q;
    tb_result_t r;
    int64_t now = 0, conc;
    long klen;
    int n, rc, h = -1;

    if (ac < 3 || (strcmp(av[0], "-") != 0 && to_i64(av[0], &now))
        || to_i64(av[1], &conc) || (klen = unescape(av[2])) < 0
        || (size_t)klen >= sizeof(held[0].key)
        || parse_rule_takes(av + 3, ac - 3, t, &n)) {
        printf("error usage: rules NOW CONC KEY [NAME RKEY CAP RATE COST "
               "HOLD BAN_MS ...]\n");
        return;
    }
    request_init(&q, prefix, av[2], (size_t)klen, t, n);
    q.now_ms = strcmp(av[0], "-") != 0 ? &now : NULL;
    q.concurrency = (int)conc;
    rc = tb_client_run(c, &q, &r);
    if (r.slot.kind != TB_SLOT_NONE && nheld < MAX_HELD) {
        h = nheld++;
        memcpy(held[h].key, av[2], (size_t)klen);
        held[h].key_len = (size_t)klen;
        held[h].ttl_ms = 0;
        held[h].slot = r.slot;
    }
    printf("ok banned=%u bans_set=%u handle=%d refused_by=%s ", r.banned,
           r.bans_set, h, limit_kind_name(r.refused_by));
    print_result(rc, &r, 0);
}

static void cmd_charge(tb_client_t *c, char **av, int ac)
{
    tb_take_t t[TB_MAX_BUCKETS];
    tb_request_t q;
    tb_result_t r;
    int64_t now = 0;
    int n, rc, with_now;

    with_now = ac > 0 && strcmp(av[0], "-") != 0;
    if (ac < 6 || (ac - 1) % 5 != 0 || (ac - 1) / 5 > TB_MAX_BUCKETS
        || (with_now && to_i64(av[0], &now))) {
        printf("error usage: charge NOW NAME RKEY CAP RATE COST ...\n");
        return;
    }
    av++;
    ac--;
    for (n = 0; n < ac / 5; n++) {
        char zero[2][2] = { "0", "0" };
        char *w[7] = { av[5 * n], av[5 * n + 1], av[5 * n + 2],
                       av[5 * n + 3], av[5 * n + 4], zero[0], zero[1] };

        if (parse_rule_take(w, &t[n])) {
            printf("error usage: charge NOW NAME RKEY CAP RATE COST ...\n");
            return;
        }
    }
    request_init(&q, prefix, NULL, 0, t, n);
    q.now_ms = with_now ? &now : NULL;
    rc = tb_client_charge(c, &q, &r);
    print_result(rc, &r, 0);
}

static void cmd_ban(tb_client_t *c, char **av, int ac, int lift)
{
    int64_t ms = 0;
    long klen;
    int rc, found = 0;

    if ((lift ? ac < 2 || ac > 3 || (ac == 3 && strcmp(av[2], "keep"))
              : ac != 3) || (klen = unescape(av[1])) < 0
        || (!lift && to_i64(av[2], &ms))) {
        printf("error usage: ban RULE KEY MS | unban RULE KEY [keep]\n");
        return;
    }
    rc = lift ? tb_client_unban(c, prefix, av[0], av[1], (size_t)klen,
                                ac == 3 ? TB_UNBAN_KEEP_BUCKET : 0, &found)
              : tb_client_ban(c, prefix, av[0], av[1], (size_t)klen, ms);
    printf("ok rc=%d found=%d err=%s\n", rc, found,
           rc == TB_OK ? "none" : tb_err_name(c->err));
}

static void cmd_bans(tb_client_t *c, char **av, int ac)
{
    tb_ban_t b[64];
    int64_t max;
    int i, j, n = 0, rc;

    if (ac != 1 || to_i64(av[0], &max) || max < 0 || max > 64) {
        printf("error usage: bans MAX (0..64)\n");
        return;
    }
    rc = tb_client_bans(c, prefix, b, (int)max, &n);
    printf("ok rc=%d n=%d", rc, n);
    for (i = 0; i < n; i++) {
        printf(" ban=%s,", b[i].rule);
        for (j = 0; b[i].key[j]; j++) {
            unsigned char ch = (unsigned char)b[i].key[j];

            printf(ch <= ' ' || ch == ',' || ch == '%' || ch >= 0x7f
                   ? "%%%02X" : "%c", ch);
        }
        printf(",%lld", (long long)b[i].left_ms);
    }
    printf("\n");
}

#endif /* DRIVER_RULES_H */

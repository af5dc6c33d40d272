/* tb_token.c -- known-client tokens: the signed entries a cookie holds
 * for the user names a browser has logged in as.
 *
 * An entry says "this client logged in as KEY under rule RULE, until
 * EXP": kh-exp-mac, where kh (8 hex digits) names the key without
 * showing it (HMAC of rule and key, truncated), exp is the end in Unix
 * seconds and mac (32 hex digits) is HMAC-SHA-256 over rule, key and
 * exp under the site's secret, truncated to 128 bits. A cookie holds up
 * to TB_TOKEN_MAX entries joined by '.', so a family computer keeps
 * several names. Checking an entry costs two HMACs and no Redis call.
 * A secret being rotated out (the previous one) still verifies, so
 * clients stay known across a rotation; new entries are signed with the
 * current one. Pure: the caller passes the clock; nothing is kept.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tb_base.h"

#define KH_HEX 8
#define MAC_HEX 32
#define KEY_MAX 1024
#define MSG_MAX (TB_NAME_MAX + KEY_MAX + 48)

static void hex(const unsigned char *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    size_t i;

    for (i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* tag NUL rule NUL key [NUL exp] into msg: its length, 0 if too long. */
static size_t message(char tag, const char *rule, const char *key,
                      size_t klen, long long exp, char *msg)
{
    size_t rl = strlen(rule), n;

    if (rl > TB_NAME_MAX || klen > KEY_MAX) {
        return 0;
    }
    msg[0] = tag;
    msg[1] = '\0';
    memcpy(msg + 2, rule, rl + 1);
    memcpy(msg + 3 + rl, key, klen);
    n = 3 + rl + klen;
    if (exp >= 0) {
        msg[n++] = '\0';
        n += (size_t)snprintf(msg + n, 24, "%lld", exp);
    }
    return n;
}

/* The entry's kh and mac for (rule, key, exp) under secret. */
static int sign(const unsigned char secret[32], const char *rule,
                const char *key, size_t klen, long long exp,
                char kh[KH_HEX + 1], char mac[MAC_HEX + 1])
{
    char msg[MSG_MAX];
    unsigned char d[32];
    size_t n = message('k', rule, key, klen, -1, msg);

    if (!n || tb_hmac_sha256(secret, msg, n, d) != TB_OK) {
        return 0;
    }
    hex(d, KH_HEX / 2, kh);
    n = message('m', rule, key, klen, exp, msg);
    if (!n || tb_hmac_sha256(secret, msg, n, d) != TB_OK) {
        return 0;
    }
    hex(d, MAC_HEX / 2, mac);
    return 1;
}

/* Differences between a and b (n bytes), in time independent of where. */
static int differs(const char *a, const char *b, size_t n)
{
    unsigned char acc = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        acc |= (unsigned char)(a[i] ^ b[i]);
    }
    return acc != 0;
}

/* One entry at s (n bytes) split into kh, exp and mac: 1 when well
 * formed. */
static int split(const char *s, size_t n, const char **kh, long long *exp,
                 const char **mac)
{
    char num[24];
    size_t elen;

    if (n < KH_HEX + MAC_HEX + 3 || s[KH_HEX] != '-'
        || s[n - MAC_HEX - 1] != '-') {
        return 0;
    }
    elen = n - KH_HEX - MAC_HEX - 2;
    if (elen < 1 || elen >= sizeof(num)) {
        return 0;
    }
    memcpy(num, s + KH_HEX + 1, elen);
    num[elen] = '\0';
    if (strspn(num, "0123456789") != elen) {
        return 0;
    }
    *kh = s;
    *exp = strtoll(num, NULL, 10);
    *mac = s + n - MAC_HEX;
    return 1;
}

/* Whether the entry (kh, exp, mac) is key's under one of the secrets. */
static int entry_is(const tb_token_about_t *a, const char *kh,
                    long long exp, const char *mac)
{
    char want_kh[KH_HEX + 1], want_mac[MAC_HEX + 1];
    int i;

    for (i = 0; i < a->keys->n; i++) {
        if (sign(a->keys->secret[i], a->rule, a->key, a->klen, exp, want_kh,
                 want_mac)
            && !differs(kh, want_kh, KH_HEX)
            && !differs(mac, want_mac, MAC_HEX)) {
            return 1;
        }
    }
    return 0;
}

int tb_token_find(const tb_token_about_t *a, const char *cookie,
                  size_t clen, char id[TB_TOKEN_ID_LEN])
{
    const char *p = cookie, *end = cookie + clen;

    while (p < end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *stop = dot ? dot : end, *kh, *mac;
        long long exp;

        if (split(p, (size_t)(stop - p), &kh, &exp, &mac) && exp > a->now_s
            && entry_is(a, kh, exp, mac)) {
            memcpy(id, mac, TB_TOKEN_ID_LEN - 1);
            id[TB_TOKEN_ID_LEN - 1] = '\0';
            return 1;
        }
        p = stop + 1;
    }
    return 0;
}

size_t tb_token_update(const tb_token_about_t *a, int64_t exp_s,
                       const char *cookie, size_t clen, char *out)
{
    const char *p = cookie, *end = cookie + clen;
    char kh[KH_HEX + 1], mac[MAC_HEX + 1];
    size_t n, kept = 0;

    if (a->keys->n < 1 || !sign(a->keys->secret[0], a->rule, a->key,
                                a->klen, (long long)exp_s, kh, mac)) {
        return 0;
    }
    n = (size_t)sprintf(out, "%s-%lld-%s", kh, (long long)exp_s, mac);
    /* The others that are still valid, newest first as they came, up to
     * the most a cookie holds: key's old entry and expired ones go. */
    while (p < end && kept < TB_TOKEN_MAX - 1) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *stop = dot ? dot : end, *ekh, *emac;
        long long exp;
        size_t len = (size_t)(stop - p);

        if (split(p, len, &ekh, &exp, &emac) && exp > a->now_s
            && len <= TB_TOKEN_ENTRY_LEN && !entry_is(a, ekh, exp, emac)) {
            out[n++] = '.';
            memcpy(out + n, p, len);
            n += len;
            kept++;
        }
        p = stop + 1;
    }
    out[n] = '\0';
    return n;
}

void tb_token_keys_add(tb_token_keys_t *k, const void *material,
                       size_t len)
{
    if (k->n < 2 && tb_sha256(material, len, k->secret[k->n]) == TB_OK) {
        k->n++;
    }
}

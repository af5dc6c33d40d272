/* tb_known.h -- the part of libtb's public header about logins: rule
 * buckets' charges and refunds (tb_rules.c), and known clients,
 * the signed tokens a cookie holds (base/tb_token.c) and the marks of
 * clients known by address (tb_known.c). Included by tb.h, which hosts
 * include alone. */
#ifndef TB_KNOWN_H
#define TB_KNOWN_H

#ifndef TB_H
#error "include tb.h, not tb_known.h"
#endif

/* ==== Rules: charges and refunds after the response ================= */

/* Charge every bucket of req its cost now: req's takes are rule buckets
 * (tb_take_t.key), typically the held ones of an allowed decision whose
 * response says the request counts (a failed login). Taken without a
 * check, into debt down to -capacity, like a settlement
 * (tb_client_settle): later decisions wait the debt out. Token bucket;
 * hold and ban_ms are not read. One script call per Cluster slot the
 * keys lie in. TB_OK when every bucket was charged (res as
 * tb_client_settle's), TB_ERR when some could not be (res->source
 * TB_SRC_ERROR, res->err why). No failure policy applies. Thread-safe. */
int tb_client_charge(tb_client_t *c, const tb_request_t *req,
                     tb_result_t *res);

/* Give every bucket of req its cost back, up to its capacity (a count=
 * reservation whose status does not count; what a refused request's
 * earlier part took): as tb_client_charge(), the other way. */
int tb_client_refund(tb_client_t *c, const tb_request_t *req,
                     tb_result_t *res);

/* ==== Known clients ================================================== */

/* The secrets that sign and check tokens: secret[0] signs, both check
 * (the previous one while it is rotated out). Fill with
 * tb_token_keys_add(), current first. */
typedef struct tb_token_keys {
    unsigned char secret[2][32];
    int n;
} tb_token_keys_t;

/* The most entries a token cookie holds, one entry's length at most, a
 * cookie value's at most (NUL included), and a client id's (NUL
 * included). */
#define TB_TOKEN_MAX 8
#define TB_TOKEN_ENTRY_LEN 64
#define TB_TOKEN_COOKIE_LEN (TB_TOKEN_MAX * (TB_TOKEN_ENTRY_LEN + 1) + 1)
#define TB_TOKEN_ID_LEN 17

/* What a token is about: a rule, a key of it (klen bytes), the clock in
 * Unix seconds, and the secrets. */
typedef struct tb_token_about {
    const tb_token_keys_t *keys;
    const char *rule;
    const char *key;
    size_t klen;
    int64_t now_s;
} tb_token_about_t;

/* Add a secret from len bytes of material (a file's contents: its
 * SHA-256 is the key); at most two. */
void tb_token_keys_add(tb_token_keys_t *k, const void *material,
                       size_t len);

/* 1 when cookie (clen bytes, entries kh-exp-mac joined by '.') holds an
 * entry for a's rule and key, signed by one of its secrets, ending after
 * its now_s; id then names the entry (16 hex digits of its mac: a client
 * of its own). 0 otherwise: forged, expired, another key's or another
 * rule's. Thread-safe. */
int tb_token_find(const tb_token_about_t *a, const char *cookie,
                  size_t clen, char id[TB_TOKEN_ID_LEN]);

/* The cookie value that makes the client known for a's rule and key
 * until exp_s, into out (TB_TOKEN_COOKIE_LEN bytes): a fresh entry
 * first, then the other entries of cookie that are well formed and not
 * expired (the key's old one dropped), at most TB_TOKEN_MAX in all.
 * Returns its length, 0 when it could not be signed. Thread-safe. */
size_t tb_token_update(const tb_token_about_t *a, int64_t exp_s,
                       const char *cookie, size_t clen, char *out);

/* Whether client (an address, or an IPv6 network as tb_ip_key writes
 * it) has logged in as key (len bytes) under rule: one EXISTS on its
 * mark "<prefix>{key}:rule:<rule>:known:<client>"; *known 0 when not,
 * or on TB_ERR (Redis could not say: unknown). Thread-safe. */
int tb_client_known(tb_client_t *c, const char *prefix, const char *rule,
                    const char *key, size_t len, const char *client,
                    int *known);

/* Mark client known for (rule, key) for ttl_ms: one SET with PX. TB_OK
 * or TB_ERR. Thread-safe. */
int tb_client_know(tb_client_t *c, const char *prefix, const char *rule,
                   const char *key, size_t len, const char *client,
                   int64_t ttl_ms);

/* Whether rule's bucket of key (the one unknown clients share) is
 * banned at now_ms (the host's clock in ms since the epoch; Redis's
 * clock writes the ban): one HGET, for the status page's count of
 * refusals a known client was spared. TB_OK or TB_ERR (*banned 0). */
int tb_client_banned(tb_client_t *c, const char *prefix, const char *rule,
                     const char *key, size_t len, int64_t now_ms,
                     int *banned);

#endif /* TB_KNOWN_H */

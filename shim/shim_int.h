/* shim_int.h -- what the shim's own files share, and nothing more.
 *
 * tb_shim.c holds the exported wrappers and initialisation; it calls the
 * core only through shim_core.c, asks shim_match.c which rule applies,
 * shim_local.c for a rule's local place and shim_lease.c for the lease
 * table. This header joins them: the thread-local re-entrancy guard, the
 * warning line, the calls into the core, the local places, the leases
 * and the rule lookup. Nothing
 * declared here is exported from the .so (-fvisibility=hidden and
 * tb_shim.map), and nothing here allocates. tb_shim.h stays what the
 * config loader hands out, shared with the tbucket tool; shim_slots.h
 * is the table of concurrency slots.
 */
#ifndef SHIM_INT_H
#define SHIM_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "shim_slots.h"
#include "tb_shim.h"

/* The preloaded library is in the initial TLS block, so the cheapest TLS
 * model applies: one %fs-relative load per guard check. */
#define SHIM_TLS __thread __attribute__((tls_model("initial-exec")))

/* Monotonic milliseconds, from the core's one reader of the clock. */
static inline int64_t shim_now_ms(void)
{
    return (int64_t)(tb_clock_monotonic_us() / 1000);
}

/* ---- The re-entrancy guard (shim_core.c) ---------------------------- */

/* Non-zero while this thread is inside the shim's own work: a call into
 * the core, or initialisation. Every wrapper reads it first and, when it
 * is set, goes straight to the real function. Raised and lowered in
 * pairs (a count, not a flag); a forked child starts at 0. */
extern SHIM_TLS int shim_guard;

/* ---- Logging (tb_shim.c) -------------------------------------------- */

/* One line on stderr, "tbucket-shim[pid]: " and the message, written
 * with the real write(2); nothing when fd 2 is a TCP socket. errno is
 * preserved. Thread-safe. */
void shim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- Calling the core (shim_core.c) --------------------------------- */

/* Hand the core's client to shim_core.c, once, at initialisation, before
 * the wrappers start limiting: it is used by every later call and never
 * freed. `policy` is named in the warning when Redis cannot decide. Also
 * records this process's pid and registers the fork handler. */
void shim_core_start(tb_client_t *c, tb_policy_t policy);

/* For a guarded connect() that returned rc: during a core call, an fd
 * that connected or is connecting is one of the core's Redis sockets
 * and is remembered as ours. errno is preserved. */
void shim_core_connected(int fd, int rc);

/* 1 when fd is one of the core's Redis sockets, still open and still
 * the socket that was recorded. Thread-safe. */
int shim_fds_is_ours(int fd);

/* 1 when this process has the pid the shim last recorded (at start, in
 * the fork handler, or at a core call or local take); 0 in a child made
 * without fork() that has done neither yet (the slots in its table are
 * its parent's). */
int shim_core_pid_matches(void);

/* This process's id, recorded as the shim's; in a child made without
 * fork() (no atfork handler ran) the parent's slots, places and Redis
 * connections are forgotten first, as the fork handler does. Every core
 * call starts with it. Thread-safe. */
pid_t shim_core_adopt_pid(void);

/* One decision of rule r for `key` (len bytes): its bucket, when it has
 * one, and its concurrency slot, when it has a limit. Always fills *res
 * (the core applies the failure policy). Thread-safe. */
void shim_decide(const shim_rule_t *r, const char *key, size_t len,
                 tb_result_t *res);

/* Keep what the connection cfd took under rule r (key of klen bytes): its
 * Redis slot (kind TB_SLOT_NONE: none) and its local place (table NULL:
 * none), until the program closes cfd. 0, or -1 when there is no room to
 * keep them: they are given back at once, counted (written at exit, the
 * first case warned), and the caller must refuse the connection.
 * Thread-safe. */
int shim_hold(int cfd, const shim_rule_t *r, const char *key, size_t klen,
              const tb_slot_t *slot, const shim_place_t *place);

/* A connection of rule r (key of klen bytes) finds the limit full, in a
 * decision made after shim_slots_epoch() returned `epoch`: 1 when a
 * connection of the rule (with same_key, of that key too) held by this
 * process was given back since, or is being given back (waited for), or
 * has lost its peer, in which case what it holds is given back now
 * (shim_slots_reclaim()): the decision is worth asking again. Else 0.
 * Thread-safe. */
int shim_reclaim_gone(const shim_rule_t *r, const char *key, size_t klen,
                      int same_key, uint32_t epoch);

/* Give back what shim_slots_take() handed out: the local place, then the
 * Redis slot (one Redis call, none without a slot). Thread-safe. */
void shim_release(const shim_held_t *h);

/* Give `tokens` back to the token bucket at the full Redis key rkey, of
 * limit lim (a drained lease's), in one Redis call. TB_OK, or TB_ERR
 * with the reason (TB_ERR_*) in *err. Thread-safe. */
int shim_give_back(const char *rkey, const tb_limit_t *lim, double tokens,
                   int *err);

/* ---- Local places (shim_local.c) ------------------------------------ */

/* Map the shared tables of every inbound rule of conf with
 * local_concurrency, once, at initialisation, before the program forks;
 * conf's rules must stay where they are (the shim's static config).
 * TB_OK, or TB_ERR with the reason in err (no rule is then capped
 * locally). */
int shim_local_start(const shim_conf_t *conf, char *err, size_t errlen);

/* Take a place of rule r's local table for process `tag`: 1 with *p
 * filled (p->table NULL when r has no local cap), 0 when all N are held.
 * Lock-free; errno is preserved. */
int shim_local_take(const shim_rule_t *r, uint32_t tag, shim_place_t *p);

/* Give back the place *p holds, if any and if its owner was not reaped
 * meanwhile; with auto, tell its cap how long connection fd (still open;
 * -1 if unknown) lasted, unless its client set the pace. Lock-free. */
void shim_local_give(const shim_place_t *p, int fd);

/* ---- Leases (shim_lease.c) ------------------------------------------ */

/* When some rule of conf sets `lease`: map the lease table, once, at
 * initialisation, before the program forks and before the client is
 * made, and hand it to the client (conf->opts.leases). TB_OK (also when
 * no rule asks for one), or TB_ERR with the reason in err; every rule's
 * lease is then 0, so that none is asked for without a table. */
int shim_lease_start(shim_conf_t *conf, char *err, size_t errlen);

/* Once the client is handed to shim_core.c: register the exit handler
 * that gives the table's unspent tokens back to Redis when the process
 * that made the table ends. Nothing without a table. */
void shim_lease_arm(void);

/* ---- Matching (shim_match.c) ---------------------------------------- */

/* The first rule of the table `rules` (n of them, `bitmap` their ports)
 * for the address sa (len bytes), or NULL. Reads its arguments only. */
const shim_rule_t *shim_match(const shim_rule_t *rules, int n,
                              const unsigned char *bitmap,
                              const struct sockaddr *sa, socklen_t len);

/* The bucket key of a connection accepted under rule r from `peer`
 * (plen bytes): the peer's IP as text, an IPv6 peer cut to its first
 * v6_bits bits (tb_ip_key), written into buf (buflen bytes,
 * TB_IP_KEY_LEN is enough), or the rule's own key. Sets *key and returns
 * its length. */
size_t shim_inbound_key(const shim_rule_t *r,
                        const struct sockaddr_storage *peer, socklen_t plen,
                        int v6_bits, char *buf, size_t buflen,
                        const char **key);

#endif /* SHIM_INT_H */

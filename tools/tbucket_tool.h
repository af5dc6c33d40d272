/* tbucket_tool.h -- what the files of the tbucket tool share: the
 * settings one run is made of (tool_t, from the command line and a shim
 * configuration), the exit statuses, and what each file offers the others.
 * The manual is docs/reference.txt (tbucket(8)); tools/README.md says which
 * file owns what. */
#ifndef TBUCKET_TOOL_H
#define TBUCKET_TOOL_H

#include <stdint.h>
#include <stdio.h>

#include "tb.h"
#include "tb_shim.h"

/* Exit statuses: sysexits.h values, so a shell can tell them apart. */
#define EXIT_USAGE 64
#define EXIT_DATAERR 65
#define EXIT_UNAVAILABLE 69
#define EXIT_TEMPFAIL 75
#define EXIT_CONFIG 78

#define URL_MAX 512
#define TOOL_BANS_LIMIT 10000      /* bans: rows by default.         */
#define TOOL_BANS_MAX 100000       /* bans --limit at most.          */
#define DEFAULT_TIMEOUT_MS 1000

typedef enum { POLICY_FAIL = 0, POLICY_OPEN, POLICY_CLOSED } tool_policy_t;

/* Everything the command line and the config file say. Strings point
 * into argv or into the buffers here, never into libconfig's memory. */
typedef struct tool {
    const char *cmd;
    const char *key;
    const char *arg2, *arg3;   /* ban RULE KEY DURATION: KEY, DURATION. */
    char url[URL_MAX];
    char prefix[TB_PREFIX_MAX + 1];
    char rule_key[TB_KEY_RAW_MAX + 1];
    const char *route;
    const char *config;
    const char *rule;
    int url_set, prefix_set, timeout_set, connect_timeout_set;
    tb_tls_options_t tls;      /* Flags, then the config file's.     */
    char tls_buf[4][SHIM_PATH_MAX]; /* The file's TLS strings.       */
    int verify_set;
    int timeout_ms;            /* Command timeout, ms.               */
    int connect_timeout_ms;    /* 0: the same as timeout_ms.         */
    int have_cap, have_rate, have_cost;
    tb_limit_t limit;          /* Capacity (tokens), tokens/second.  */
    double cost;               /* Tokens, default 1.                 */
    tool_policy_t policy;
    tb_algo_t algo;            /* TB_ALGO_TOKEN_BUCKET unless set.    */
    int engine;                /* A tb_engine_t; -1 until set.       */
    int quiet;
    int keep_bucket;           /* unban: lift the ban alone.         */
    const char *ban_rule;      /* bans --rule: that rule's alone.    */
    const char *ban_key;       /* bans --key: that key's alone.      */
    double ban_limit;          /* bans --limit: rows at most.        */
    int once;                  /* top: one frame, then exit.         */
    int interval_ms;           /* top: between frames, default 1000. */
} tool_t;

/* ---- tbucket.c: usage ------------------------------------------------ */

void tool_usage(FILE *f);
/* "tbucket: WHAT: DETAIL" and the usage on stderr; EXIT_USAGE. */
int tool_usage_error(const char *what, const char *detail);

/* ---- tbucket_args.c: the command line and the config file ----------- */

/* Fill *t from argv (and the config file it names): 0, or the exit
 * status of a bad command line or config. */
int tool_parse_args(tool_t *t, int argc, char **argv);

/* ---- tbucket_cmds.c: the commands that speak to Redis ---------------- */

int tool_cmd_take(const tool_t *t);
int tool_cmd_inspect(const tool_t *t);
int tool_cmd_reset(const tool_t *t);
int tool_cmd_bans(const tool_t *t);
int tool_cmd_ban(const tool_t *t);
int tool_cmd_unban(const tool_t *t);

/* ---- tbucket_http.c: a plain HTTP/1.0 GET of a status page ---------- */

/* An http:// URL taken apart: what connect and the request need. */
typedef struct http_url {
    char host[256];            /* For getaddrinfo: no brackets.       */
    char hostport[300];        /* For the Host header, as written.    */
    char port[8];
    char path[1024];           /* Path and query, view=json added.    */
} http_url_t;

/* Parse "http://host[:port][/path][?query]" (an IPv6 host in brackets)
 * and ask for the JSON view. 0, or -1 when it is not such a URL. */
int tool_http_url_parse(const char *url, http_url_t *u);
/* The body of u's page, malloc'd and NUL-terminated, within timeout_ms;
 * NULL with the reason in err. */
char *tool_http_get(const http_url_t *u, int timeout_ms, char *err,
                    size_t errlen);
/* Monotonic milliseconds. */
int64_t tool_mono_ms(void);

/* ---- tbucket_json.c: a small JSON reader, enough for the page ------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype_t;

typedef struct jval {
    jtype_t type;
    double num;                /* J_NUM, J_BOOL (0 or 1).              */
    char *str;                 /* J_STR: decoded; non-ASCII as '?'.    */
    struct jval *items;        /* J_ARR and J_OBJ: n values.           */
    char **keys;               /* J_OBJ: the n member names.           */
    size_t n;
} jval_t;

/* Parse text, which must hold one value and nothing after it: 0 with
 * *out (the caller's to json_free), or -1 (nothing to free). */
int json_parse(const char *text, jval_t *out);
void json_free(jval_t *v);
/* Member name of object o, or NULL. */
const jval_t *json_get(const jval_t *o, const char *name);
/* A number member, 0 when absent. */
double json_num(const jval_t *o, const char *name);
/* A string member with every control character shown as '?' into buf;
 * "-" when absent. */
const char *json_text(const jval_t *o, const char *name, char *buf,
                      size_t len);

/* ---- tbucket_top.c: who is limited right now, in a terminal --------- */

int tool_cmd_top(const tool_t *t);

#endif /* TBUCKET_TOOL_H */

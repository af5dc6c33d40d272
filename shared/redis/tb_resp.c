/* tb_resp.c -- RESP: commands encoded into a growable buffer, and the
 * length of one whole value in bytes read (the coalescer's framing).
 *
 * A command is an array of bulk strings, "*<argc>\r\n" then
 * "$<len>\r\n<bytes>\r\n" per argument, exactly what hiredis's
 * redisFormatCommandArgv() makes (the unit tests compare the two). The
 * buffer belongs to its owner (a connection or a batch) and is kept
 * between uses, so encoding a decision allocates nothing once it has
 * grown to its working size. Growing allocates the new block, copies,
 * switches the pointer and only then frees the old one: a fork() in
 * another thread can never leave the child holding a freed pointer.
 * tb__resp_span() only measures: it builds nothing, so a proxy can pass
 * bytes on untouched, knowing where each command or reply ends.
 */
#include <stdlib.h>
#include <string.h>

#include "redis/tb_redis_int.h"

/* Room for n more bytes. TB_ERR when out of memory. */
static int reserve(tb__buf_t *b, size_t n)
{
    size_t cap;
    char *p, *old;

    if (b->cap - b->len >= n) {
        return TB_OK;
    }
    cap = b->cap ? b->cap : 512;
    while (cap - b->len < n) {
        if (cap > ((size_t)-1) / 2) {
            return TB_ERR;
        }
        cap *= 2;
    }
    p = malloc(cap);
    if (!p) {
        return TB_ERR;
    }
    if (b->len) {
        memcpy(p, b->p, b->len);
    }
    old = b->p;
    b->p = p;
    b->cap = cap;
    free(old);
    return TB_OK;
}

/* Write c then the decimal digits of v then CRLF at out; returns the
 * bytes written (at most 23). Lengths and counts are mostly one or two
 * digits: those skip the loop. */
static size_t header(char *out, char c, size_t v)
{
    char tmp[20];
    size_t k = 0, i, n = 1;

    out[0] = c;
    if (v < 10) {
        out[1] = (char)('0' + v);
        n = 2;
    }
    else if (v < 100) {
        out[1] = (char)('0' + v / 10);
        out[2] = (char)('0' + v % 10);
        n = 3;
    }
    else {
        do {
            tmp[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        for (i = 0; i < k; i++) {
            out[n++] = tmp[k - 1 - i];
        }
    }
    out[n++] = '\r';
    out[n++] = '\n';
    return n;
}

int tb__buf_argv(tb__buf_t *b, int argc, const char *const *argv,
                 const size_t *argvlen)
{
    size_t need = 23, at;
    int i;

    if (argc < 1) {
        return TB_ERR;
    }
    for (i = 0; i < argc; i++) {
        need += 25 + argvlen[i];
    }
    if (reserve(b, need) != TB_OK) {
        return TB_ERR;
    }
    at = b->len;
    at += header(b->p + at, '*', (size_t)argc);
    for (i = 0; i < argc; i++) {
        at += header(b->p + at, '$', argvlen[i]);
        if (argvlen[i]) {
            memcpy(b->p + at, argv[i], argvlen[i]);
        }
        at += argvlen[i];
        b->p[at++] = '\r';
        b->p[at++] = '\n';
    }
    b->len = at;
    return TB_OK;
}

int tb__buf_cmd(tb__buf_t *b, const tb__cmd_t *cmd)
{
    return tb__buf_argv(b, cmd->argc, cmd->argv, cmd->argvlen);
}

void tb__buf_free(tb__buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

int tb__buf_put(tb__buf_t *b, const char *p, size_t n)
{
    if (reserve(b, n) != TB_OK) {
        return TB_ERR;
    }
    if (n) {
        memcpy(b->p + b->len, p, n);
    }
    b->len += n;
    return TB_OK;
}

/* The number that a line "<c><digits>\r\n" at p (n bytes) carries into
 * *v, and the line's length into *at: 1, 0 when the line is not all
 * there yet, -1 when it is not a number. */
static int line_num(const char *p, size_t n, long long *v, size_t *at)
{
    const char *cr = memchr(p, '\r', n);
    size_t i = 1;
    int neg = 0;

    if (!cr || (size_t)(cr - p) + 1 >= n) {
        return n > 40 && !cr ? -1 : 0;
    }
    if (cr[1] != '\n') {
        return -1;
    }
    *v = 0;
    if (i < (size_t)(cr - p) && p[i] == '-') {
        neg = 1;
        i++;
    }
    if (i == (size_t)(cr - p) || (size_t)(cr - p) > 21) {
        return -1;
    }
    for (; p + i < cr; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }
        *v = *v * 10 + (p[i] - '0');
    }
    *v = neg ? -*v : *v;
    *at = (size_t)(cr - p) + 2;
    return 1;
}

/* The length of the value at p, nested at depth: see tb__resp_span. */
static long long span(const char *p, size_t n, int depth)
{
    long long v, k, sub;
    size_t at;
    int rc;

    if (n == 0) {
        return 0;
    }
    if (p[0] == '+' || p[0] == '-') {
        const char *nl = memchr(p, '\n', n);

        return nl ? (long long)(nl - p) + 1 : 0;
    }
    if ((p[0] != ':' && p[0] != '$' && p[0] != '*') || depth > 16) {
        return -1;
    }
    if ((rc = line_num(p, n, &v, &at)) <= 0) {
        return rc;
    }
    if (p[0] == ':' || v < 0) {
        return p[0] == ':' || v == -1 ? (long long)at : -1;
    }
    if (p[0] == '$') {
        if (v > 512LL * 1024 * 1024) {
            return -1;
        }
        return (size_t)v + 2 <= n - at && p[at + v] == '\r'
                       && p[at + v + 1] == '\n'
                   ? (long long)at + v + 2
                   : ((size_t)v + 2 <= n - at ? -1 : 0);
    }
    for (k = 0; k < v; k++) {
        sub = span(p + at, n - at, depth + 1);
        if (sub <= 0) {
            return sub;
        }
        at += (size_t)sub;
    }
    return (long long)at;
}

long long tb__resp_span(const char *p, size_t n)
{
    return span(p, n, 0);
}

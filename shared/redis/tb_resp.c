/* tb_resp.c -- the RESP writer: commands encoded into a growable buffer.
 *
 * A command is an array of bulk strings, "*<argc>\r\n" then
 * "$<len>\r\n<bytes>\r\n" per argument, exactly what hiredis's
 * redisFormatCommandArgv() makes (the unit tests compare the two). The
 * buffer belongs to its owner (a connection or a batch) and is kept
 * between uses, so encoding a decision allocates nothing once it has
 * grown to its working size. Growing allocates the new block, copies,
 * switches the pointer and only then frees the old one: a fork() in
 * another thread can never leave the child holding a freed pointer.
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

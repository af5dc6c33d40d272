/* tb_tls.c -- TLS to Redis with OpenSSL: the context (CA, client
 * certificate and key, read once), the handshake of one connection and
 * the record I/O that tb_conn.c drives.
 *
 * The only file of the core that includes OpenSSL's TLS headers (SHA-256
 * comes from libcrypto too, in base/tb_digest.c). A tb_tls_t is made
 * once per configuration (by the client, or by the host before it drops
 * privileges) and shared read-only by every connection, threads and
 * forked children alike; a connection's SSL is made from it by
 * tb__tls_session() and does its I/O through a socket BIO of our own that
 * writes with send(MSG_NOSIGNAL), as the plaintext path does, so a dead
 * Redis cannot raise SIGPIPE in the host.
 *
 * Nothing here waits but a blocking read: the handshake step, the write
 * and a non-blocking read return what they would wait for (POLLIN or
 * POLLOUT: a read may need to write and a write to read) and tb_conn.c
 * polls against its deadline. A blocking read (tb__tls_read with block)
 * lets recv() wait, bounded by the socket's SO_RCVTIMEO, which tb_conn.c
 * sets to the time left, as its plaintext reader does: one system call
 * per reply instead of poll() then recv(). Writes never block (send with
 * MSG_DONTWAIT, whatever the socket's mode). Reads ahead (read_ahead),
 * so a reply is usually one recv().
 *
 * Verification is on unless the host turns it off: the server's chain
 * must lead to the CA (the system store by default), and the
 * certificate must name the server (a DNS name, or an IP address SAN for
 * an IP host). A connection is closed without close_notify: a forked
 * child drops its parent's sessions with close(2) alone, and a word on
 * the parent's socket would break its session.
 *
 * Left out: session resumption (one handshake per pooled connection is
 * cheap beside its lifetime), encrypted keys (no one would be there to
 * type the passphrase), CRLs and OCSP.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "redis/tb_redis_int.h"

struct tb_tls {
    SSL_CTX *ctx;
    char server_name[256];   /* Empty: each connection's host.         */
};

/* ---- The socket BIO: send(MSG_NOSIGNAL) and recv ------------------- */

/* The BIO's data is the fd shifted left by one, its low bit set while a
 * blocking read is under way: no allocation per connection. */
#define BIO_BLOCK 1

static int bio_fd(BIO *b)
{
    return (int)((intptr_t)BIO_get_data(b) >> 1);
}

static void bio_set_block(BIO *b, int block)
{
    BIO_set_data(b, (void *)(((intptr_t)bio_fd(b) << 1)
                             | (block ? BIO_BLOCK : 0)));
}

static int bio_write(BIO *b, const char *buf, int len)
{
    ssize_t n;

    BIO_clear_retry_flags(b);
    do {
        n = send(bio_fd(b), buf, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        BIO_set_retry_write(b);
    }
    return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
    ssize_t n;

    BIO_clear_retry_flags(b);
    do {
        n = recv(bio_fd(b), buf, (size_t)len,
                 ((intptr_t)BIO_get_data(b) & BIO_BLOCK) ? 0 : MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        BIO_set_retry_read(b);
    }
    return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    /* Writes are never buffered here: a flush has nothing to do. */
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

/* The method is made once per process and never freed, as OpenSSL's own
 * are: BIO type numbers come from a process-wide counter (numbers past
 * 255 run into the type's flag bits), and a server makes contexts at
 * every configuration load. */
static BIO_METHOD *sock_method;
static pthread_once_t sock_once = PTHREAD_ONCE_INIT;

static void sock_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK
                                     | BIO_TYPE_DESCRIPTOR,
                                 "tb socket");

    if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read)
        && BIO_meth_set_ctrl(m, bio_ctrl)) {
        sock_method = m;
    }
    else {
        BIO_meth_free(m);
    }
}

/* ---- Errors -------------------------------------------------------- */

/* The first reason on this thread's OpenSSL error queue (the deepest
 * cause), then the queue emptied. */
static const char *ssl_reason(char *buf, size_t len)
{
    unsigned long code, first = ERR_get_error();
    const char *r;

    while ((code = ERR_get_error()) != 0) {
    }
    if (first == 0) {
        snprintf(buf, len, "unknown error");
        return buf;
    }
    r = ERR_reason_error_string(first);
    if (r) {
        snprintf(buf, len, "%s", r);
    }
    else {
        snprintf(buf, len, "error %08lx", first);
    }
    return buf;
}

/* Put "setting 'file': why" in err; return NULL for the caller. */
static tb_tls_t *fail(tb_tls_t *t, char *err, size_t errlen,
                      const char *setting, const char *file,
                      const char *why)
{
    if (err && errlen) {
        snprintf(err, errlen, "%s '%s': %s", setting, file, why);
    }
    tb_tls_free(t);
    return NULL;
}

/* 0 when file can be opened and read, else -1 with errno. OpenSSL's own
 * message for a missing file is a decoder's; the system's says more. */
static int readable(const char *file)
{
    FILE *f = fopen(file, "r");
    int bad;

    if (!f) {
        return -1;
    }
    bad = getc(f) == EOF && ferror(f);
    if (bad) {
        int saved = errno;

        fclose(f);
        errno = saved;
        return -1;
    }
    fclose(f);
    return 0;
}

/* A passphrase callback that has no passphrase, so an encrypted key fails
 * to load rather than prompt on a terminal no one is watching. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return 0;
}

/* Names and IP literals: printable, no spaces or URL delimiters. */
static int name_valid(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 253) {
        return 0;
    }
    for (; *s; s++) {
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e
            || strchr("/@?#\\\"'<>", *s)) {
            return 0;
        }
    }
    return 1;
}

/* ---- The context --------------------------------------------------- */

static tb_tls_t *load_files(tb_tls_t *t, const tb_tls_options_t *o,
                            char *err, size_t errlen)
{
    char why[160];

    if (o->ca_file) {
        if (readable(o->ca_file) < 0) {
            return fail(t, err, errlen, "tls_ca", o->ca_file,
                        strerror(errno));
        }
        if (SSL_CTX_load_verify_locations(t->ctx, o->ca_file, NULL) != 1) {
            return fail(t, err, errlen, "tls_ca", o->ca_file,
                        ssl_reason(why, sizeof(why)));
        }
    }
    else if (SSL_CTX_set_default_verify_paths(t->ctx) != 1) {
        return fail(t, err, errlen, "tls_ca", "(system store)",
                    ssl_reason(why, sizeof(why)));
    }
    if (!o->cert_file != !o->key_file) {
        return fail(t, err, errlen, o->cert_file ? "tls_cert" : "tls_key",
                    o->cert_file ? o->cert_file : o->key_file,
                    o->cert_file ? "needs tls_key (its private key)"
                                 : "needs tls_cert (its certificate)");
    }
    if (!o->cert_file) {
        return t;
    }
    if (readable(o->cert_file) < 0) {
        return fail(t, err, errlen, "tls_cert", o->cert_file,
                    strerror(errno));
    }
    if (SSL_CTX_use_certificate_chain_file(t->ctx, o->cert_file) != 1) {
        return fail(t, err, errlen, "tls_cert", o->cert_file,
                    ssl_reason(why, sizeof(why)));
    }
    if (readable(o->key_file) < 0) {
        return fail(t, err, errlen, "tls_key", o->key_file,
                    strerror(errno));
    }
    if (SSL_CTX_use_PrivateKey_file(t->ctx, o->key_file, SSL_FILETYPE_PEM)
            != 1
        || SSL_CTX_check_private_key(t->ctx) != 1) {
        /* Loading the key checks it against the certificate already. */
        if (ERR_GET_REASON(ERR_peek_error()) == X509_R_KEY_VALUES_MISMATCH
            || ERR_peek_error() == 0) {
            ERR_clear_error();
            snprintf(why, sizeof(why), "does not match tls_cert '%.100s'",
                     o->cert_file);
        }
        else {
            snprintf(why, sizeof(why), "not an unencrypted PEM private key "
                     "(");
            ssl_reason(why + strlen(why), sizeof(why) - strlen(why) - 1);
            strcat(why, ")");
        }
        return fail(t, err, errlen, "tls_key", o->key_file, why);
    }
    return t;
}

tb_tls_t *tb_tls_create(const tb_tls_options_t *o, char *err, size_t errlen)
{
    tb_tls_t *t;

    if (!o) {
        snprintf(err, errlen, "no TLS options given");
        return NULL;
    }
    if (o->server_name && !name_valid(o->server_name)) {
        return fail(NULL, err, errlen, "tls_server_name", o->server_name,
                    "not a host name or IP address");
    }
    if (!(t = calloc(1, sizeof(*t)))) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ERR_clear_error();
    pthread_once(&sock_once, sock_method_init);
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (!t->ctx || !sock_method) {
        char why[160];

        snprintf(err, errlen, "TLS: %s", ssl_reason(why, sizeof(why)));
        tb_tls_free(t);
        return NULL;
    }
    if (o->server_name) {
        snprintf(t->server_name, sizeof(t->server_name), "%s",
                 o->server_name);
    }
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    /* A write may be retried from where it stopped; fewer reads. */
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE
                                 | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(t->ctx, 1);
    SSL_CTX_set_default_passwd_cb(t->ctx, no_passphrase);
    SSL_CTX_set_verify(t->ctx, o->no_verify ? SSL_VERIFY_NONE
                                            : SSL_VERIFY_PEER, NULL);
    return load_files(t, o, err, errlen);
}

void tb_tls_free(tb_tls_t *t)
{
    if (!t) {
        return;
    }
    SSL_CTX_free(t->ctx);
    free(t);
}

/* ---- One connection ------------------------------------------------ */

SSL *tb__tls_session(const tb_tls_t *t, int fd, const char *host,
                     tb__error_t *e)
{
    const char *name = t->server_name[0] ? t->server_name : host;
    unsigned char ip[16];
    SSL *s;
    BIO *b;
    int is_ip, ok;

    ERR_clear_error();
    s = SSL_new(t->ctx);
    b = BIO_new(sock_method);
    if (!s || !b) {
        SSL_free(s);
        BIO_free(b);
        tb__set_error(e, TB_ERR_OOM, "tls: out of memory");
        return NULL;
    }
    BIO_set_data(b, (void *)((intptr_t)fd << 1));
    BIO_set_init(b, 1);
    SSL_set_bio(s, b, b);
    SSL_set_connect_state(s);
    is_ip = inet_pton(AF_INET, name, ip) == 1
            || inet_pton(AF_INET6, name, ip) == 1;
    /* SNI carries names only (RFC 6066); an IP host is checked against
     * the certificate's IP address SANs. */
    if (is_ip) {
        ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), name) == 1;
    }
    else {
        X509_VERIFY_PARAM_set_hostflags(SSL_get0_param(s),
                                        X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        ok = SSL_set_tlsext_host_name(s, name) == 1
             && SSL_set1_host(s, name) == 1;
    }
    if (!ok) {
        SSL_free(s);
        tb__set_error(e, TB_ERR_TLS, "tls: bad server name '%.80s'", name);
        return NULL;
    }
    return s;
}

/* The peer closed the connection (without close_notify). In the middle
 * of a handshake that is a server that does not speak TLS there or
 * refused us; later it is an ordinary close. */
static void closed(SSL *s, const char *during, tb__error_t *e)
{
    tb__set_error(e, SSL_is_init_finished(s) ? TB_ERR_IO : TB_ERR_TLS,
                  "%s: connection closed by server", during);
}

/* What SSL's last call needs: 0 with *events to wait for, or -1 with *e
 * (during names the step, for the message). */
static int ssl_outcome(SSL *s, int rc, short *events, const char *during,
                       tb__error_t *e)
{
    char why[120];
    long vr;

    switch (SSL_get_error(s, rc)) {
    case SSL_ERROR_WANT_READ:
        *events = POLLIN;
        return 0;
    case SSL_ERROR_WANT_WRITE:
        *events = POLLOUT;
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        tb__set_error(e, TB_ERR_IO, "%s: connection closed by server",
                      during);
        break;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() != 0) {
            tb__set_error(e, TB_ERR_TLS, "%s: %s", during,
                          ssl_reason(why, sizeof(why)));
        }
        else if (errno != 0 && errno != EAGAIN) {
            tb__set_error(e, TB_ERR_IO, "%s: %s", during, strerror(errno));
        }
        else {
            closed(s, during, e);
        }
        break;
    default:
        vr = SSL_get_verify_result(s);
        if (ERR_GET_REASON(ERR_peek_error())
            == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
            /* OpenSSL 3 reports a bare EOF as an SSL error. */
            ERR_clear_error();
            closed(s, during, e);
        }
        else if (vr != X509_V_OK) {
            ERR_clear_error();
            tb__set_error(e, TB_ERR_TLS, "%s: certificate verify failed: %s",
                          during, X509_verify_cert_error_string(vr));
        }
        else {
            tb__set_error(e, TB_ERR_TLS, "%s: %s", during,
                          ssl_reason(why, sizeof(why)));
        }
        break;
    }
    return -1;
}

/* Before an SSL call whose failure SSL_get_error() will judge: this
 * thread's error queue must be empty (a host's own OpenSSL use may have
 * left errors on it). Clearing it unconditionally costs about 800
 * instructions in OpenSSL 3.0; looking first costs a few. */
static void queue_empty(void)
{
    if (ERR_peek_error() != 0) {
        ERR_clear_error();
    }
    errno = 0;
}

int tb__tls_handshake(SSL *s, short *events, tb__error_t *e)
{
    int rc;

    queue_empty();
    rc = SSL_connect(s);
    if (rc == 1) {
        return 1;
    }
    return ssl_outcome(s, rc, events, "tls handshake", e);
}

long tb__tls_write(SSL *s, const char *buf, size_t len, short *events,
                   tb__error_t *e)
{
    size_t n = 0;

    queue_empty();
    if (SSL_write_ex(s, buf, len, &n) == 1) {
        return (long)n;
    }
    return ssl_outcome(s, 0, events, "tls write", e);
}

long tb__tls_read(SSL *s, char *buf, size_t len, int block, short *events,
                  tb__error_t *e)
{
    size_t n = 0;
    int ok;

    queue_empty();
    bio_set_block(SSL_get_rbio(s), block);
    ok = SSL_read_ex(s, buf, len, &n);
    bio_set_block(SSL_get_rbio(s), 0);
    if (ok == 1) {
        return (long)n;
    }
    return ssl_outcome(s, 0, events, "tls read", e);
}

void tb__tls_why_closed(SSL *s, tb__error_t *e)
{
    char buf[256], why[120];
    size_t n;

    queue_empty();
    if (SSL_read_ex(s, buf, sizeof(buf), &n) != 1
        && SSL_get_error(s, 0) == SSL_ERROR_SSL
        && ERR_GET_REASON(ERR_peek_error())
               != SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        tb__set_error(e, TB_ERR_TLS, "tls: %s", ssl_reason(why, sizeof(why)));
    }
    ERR_clear_error();
}

void tb__tls_end(SSL *s)
{
    /* No SSL_shutdown: see the head comment. */
    SSL_free(s);
}

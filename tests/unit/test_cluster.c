/* test_cluster.c -- unit tests for tb_cluster.c's hash slot.
 *
 * tb_key_slot() must be Redis's keyHashSlot: CRC16-XMODEM of the hash tag
 * (or of the whole key) modulo 16384. The table holds CRC16's check value
 * and slots printed by a real Redis 7.0 (CLUSTER KEYSLOT); the integration
 * test ha/test_ha_cluster.py compares hundreds more against a live node. The
 * routing, redirects and map refresh need a cluster and are tested there.
 * The coalescer's pure part (tb_coalesce_cluster.c) is here too: where a
 * command goes (its first key's slot, none, every primary), and a
 * client's replies put back in the order of its commands.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tb_int.h"

static const struct {
    const char *key;
    size_t len;
    unsigned slot;
} vectors[] = {
    /* CRC16-XMODEM("123456789") = 0x31C3 = 12739. */
    {"123456789", 9, 12739},
    {"foo", 3, 12182},
    {"bar", 3, 5061},
    {"", 0, 0},
    {"{user1000}.following", 20, 3443},
    {"{user1000}.followers", 20, 3443},
    {"user1000", 8, 3443},
    /* "{}" is no tag: the whole key is hashed. */
    {"foo{}{bar}", 10, 8363},
    /* Only the first '{' and the first '}' after it count. */
    {"foo{{bar}}zap", 13, 4015},
    {"{bar", 4, 4015},
    {"foo{bar}{zap}", 13, 5061},
    /* Binary bytes, a NUL included. */
    {"a\0b{\xff}", 6, 7920},
};

static void test_cluster_key_slot_vectors(void **state)
{
    size_t k;

    (void)state;
    for (k = 0; k < sizeof(vectors) / sizeof(vectors[0]); k++) {
        unsigned got = tb_key_slot(vectors[k].key, vectors[k].len);

        if (got != vectors[k].slot) {
            fail_msg("slot of vector %zu is %u, Redis says %u", k, got,
                     vectors[k].slot);
        }
    }
}

/* Every key one client's decision uses shares its slot. */
static void test_cluster_key_slot_one_client(void **state)
{
    char a[TB_KEY_BUF], b[TB_KEY_BUF];
    size_t la, lb;

    (void)state;
    la = tb_key_build("tb:", "alice{x}", 8, NULL, a);
    lb = tb_key_build("tb:", "alice{x}", 8, "api", b);
    assert_true(la > 0 && lb > 0);
    assert_int_equal(tb_key_slot(a, la), tb_key_slot(b, lb));
    la = tb_key_build("other:", "bob", 3, NULL, a);
    assert_int_equal(tb_key_slot(a, la), tb_key_slot("bob", 3));
}

/* The route of argv (n arguments) encoded as one RESP command. */
static int route(int n, const char *const *argv)
{
    size_t len[8];
    tb__buf_t b;
    int i, r;

    memset(&b, 0, sizeof(b));
    for (i = 0; i < n; i++) {
        len[i] = strlen(argv[i]);
    }
    assert_int_equal(tb__buf_argv(&b, n, argv, len), TB_OK);
    r = tb__cmd_route(b.p, b.len);
    tb__buf_free(&b);
    return r;
}

/* The key after numkeys for EVALSHA, EVAL and tbucket.*, else the first
 * argument; keyless commands anywhere, SCRIPT LOAD everywhere. */
static void test_cluster_coalescer_route(void **state)
{
    const char *evalsha[] = { "EVALSHA", "abc", "2", "tb:{u1}", "tb:{u1}:c",
                              "5" };
    const char *eval[] = { "eval", "return 1", "1", "tb:{u2}", "x" };
    const char *nokeys[] = { "EVAL", "return 1", "0", "tb:{u2}" };
    const char *mod[] = { "tbucket.gcra", "1", "tb:{u3}", "", "5" };
    const char *modbad[] = { "tbucket.bucket", "x", "tb:{u3}" };
    const char *zrem[] = { "ZREM", "tb:{u4}:conc", "id" };
    const char *load[] = { "SCRIPT", "LOAD", "return 1" };
    const char *exists[] = { "SCRIPT", "EXISTS", "abc" };
    const char *ping[] = { "PING" };
    const char *info[] = { "COMMAND", "INFO", "tbucket.bucket" };

    (void)state;
    assert_int_equal(route(6, evalsha), (int)tb_key_slot("u1", 2));
    assert_int_equal(route(5, eval), (int)tb_key_slot("u2", 2));
    assert_int_equal(route(4, nokeys), TB__ROUTE_ANY);
    assert_int_equal(route(5, mod), (int)tb_key_slot("u3", 2));
    assert_int_equal(route(3, modbad), TB__ROUTE_ANY);
    assert_int_equal(route(3, zrem), (int)tb_key_slot("u4", 2));
    assert_int_equal(route(3, load), TB__ROUTE_ALL);
    assert_int_equal(route(3, exists), TB__ROUTE_ANY);
    assert_int_equal(route(1, ping), TB__ROUTE_ANY);
    assert_int_equal(route(3, info), TB__ROUTE_ANY);
    /* Not a whole command: nowhere in particular. */
    assert_int_equal(tb__cmd_route("*2\r\n$3\r\nGET\r\n", 13),
                     TB__ROUTE_ANY);
}

/* Replies of commands 0..4 arriving 3, 1, 0, 4, 2 come out 0..4: each
 * when its turn comes, the early ones held meanwhile. */
static void test_cluster_coalescer_reorder(void **state)
{
    static const char *const r[5] = { ":0\r\n", ":1\r\n", "+two\r\n",
                                      ":3\r\n", "-ERR four\r\n" };
    static const int order[5] = { 3, 1, 0, 4, 2 };
    static const size_t after[5] = { 0, 0, 8, 8, 29 };
    tb__reorder_t o;
    tb__buf_t out;
    int i;

    (void)state;
    memset(&o, 0, sizeof(o));
    memset(&out, 0, sizeof(out));
    o.next_in = 5;
    for (i = 0; i < 5; i++) {
        assert_int_equal(tb__reorder_put(&o, (uint64_t)order[i],
                                         r[order[i]], strlen(r[order[i]]),
                                         &out), TB_OK);
        assert_int_equal(out.len, after[i]);
    }
    assert_int_equal(o.nheld, 0);
    assert_int_equal(o.next_out, 5);
    assert_memory_equal(out.p, ":0\r\n:1\r\n+two\r\n:3\r\n-ERR four\r\n",
                        29);
    /* Held replies are freed by a reset (the client went). */
    assert_int_equal(tb__reorder_put(&o, 7, ":7\r\n", 4, &out), TB_OK);
    assert_int_equal(o.nheld, 1);
    tb__reorder_reset(&o);
    assert_int_equal(o.nheld, 0);
    assert_int_equal(o.next_out, 0);
    tb__buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_key_slot_vectors),
        cmocka_unit_test(test_cluster_key_slot_one_client),
        cmocka_unit_test(test_cluster_coalescer_route),
        cmocka_unit_test(test_cluster_coalescer_reorder),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cluster.c -- unit tests for tb_cluster.c's hash slot.
 *
 * tb_key_slot() must be Redis's keyHashSlot: CRC16-XMODEM of the hash tag
 * (or of the whole key) modulo 16384. The table holds CRC16's check value
 * and slots printed by a real Redis 7.0 (CLUSTER KEYSLOT); the integration
 * test ha/test_ha_cluster.py compares hundreds more against a live node. The
 * routing, redirects and map refresh need a cluster and are tested there.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_key_slot_vectors),
        cmocka_unit_test(test_cluster_key_slot_one_client),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* common/crc32c: the known CRC-32C vectors, chained updates, and agreement with a
 * bit-at-a-time reference on random data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../test_util.h"
#include "common/crc32c.h"

static void test_known_vectors(void **state)
{
    (void)state;
    assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c("", 0), 0);
    /* RFC 3720 (iSCSI), appendix B.4 */
    uint8_t buf[32];
    memset(buf, 0, sizeof buf);
    assert_int_equal(crc32c(buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof buf);
    assert_int_equal(crc32c(buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    assert_int_equal(crc32c(buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    assert_int_equal(crc32c(buf, 32), 0x113FDB5Cu);
}

static void test_chained_and_reference(void **state)
{
    (void)state;
    uint8_t big[1000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof big; i++) {
        x = x * 1103515245u + 12345u;
        big[i] = (uint8_t)(x >> 16);
    }
    uint32_t whole = crc32c(big, sizeof big);
    assert_int_equal(crc32c_update(crc32c_update(0, big, 377), big + 377, sizeof big - 377), whole);
    assert_int_equal(crc32c_update(whole, "", 0), whole);
    assert_int_equal(whole, test_crc32c_bitwise(big, sizeof big));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vectors),
        cmocka_unit_test(test_chained_and_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Protocol framing: round trip, version refusal, garbage and size limits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/protocol.h"

static void test_round_trip(void **state)
{
    (void)state;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    reg.rank = 5;
    reg.host = "node07";
    reg.pid = 4242;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    env.request_id = 99;
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    char why[256];
    Grpo__Envelope *back = protocol_unpack(buf, len, why, sizeof why);
    assert_non_null(back);
    assert_int_equal(back->version, GRPO_PROTOCOL_VERSION);
    assert_int_equal(back->request_id, 99);
    assert_int_equal(back->body_case, GRPO__ENVELOPE__BODY_REGISTER);
    assert_int_equal(back->register_->rank, 5);
    assert_string_equal(back->register_->host, "node07");
    protocol_free(back);
    free(buf);
}

static void test_version_refused(void **state)
{
    (void)state;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    env.version = GRPO_PROTOCOL_VERSION + 1; /* pack by hand: protocol_pack would set ours */
    size_t len = grpo__envelope__get_packed_size(&env);
    uint8_t *buf = malloc(len);
    grpo__envelope__pack(&env, buf);
    char why[256];
    assert_null(protocol_unpack(buf, len, why, sizeof why));
    assert_non_null(strstr(why, "incompatible protocol version 2"));
    free(buf);
}

static void test_garbage_and_empty(void **state)
{
    (void)state;
    char why[256];
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
    assert_null(protocol_unpack(junk, sizeof junk, why, sizeof why));
    assert_non_null(strstr(why, "malformed"));
    /* an envelope with a version but no body */
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    assert_null(protocol_unpack(buf, len, why, sizeof why));
    assert_non_null(strstr(why, "no body"));
    free(buf);
    assert_null(protocol_unpack(junk, (size_t)GRPO_MAX_MESSAGE_BYTES + 1, why, sizeof why));
    assert_non_null(strstr(why, "exceeds"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_version_refused),
        cmocka_unit_test(test_garbage_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

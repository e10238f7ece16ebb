/* Protocol framing: round trip, version refusal, garbage and size limits; the data-plane key derivation's
 * layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/names.h"
#include "proto/plane_auth.h"
#include "proto/protocol.h"
#include "proto/transport.h"

/* Every phase has its name (verl's timing names: what the status page, grpoctl and the timing_s/ metrics
 * show); a number outside the enum is "unknown". */
static void test_phase_names(void **state)
{
    (void)state;
    static const char *const want[GRPO_NUM_PHASES] = {
        "idle", "gen",          "reward",      "old_log_prob", "ref",
        "adv",  "update_actor", "weight_sync", "testing",      "save_checkpoint"};
    for (int p = 0; p < GRPO_NUM_PHASES; p++)
        assert_string_equal(core_phase_name((Grpo__Phase)p), want[p]);
    assert_string_equal(core_phase_name(GRPO__PHASE__PHASE_UPDATE_ACTOR), "update_actor");
    assert_string_equal(core_phase_name((Grpo__Phase)GRPO_NUM_PHASES), "unknown");
    assert_string_equal(core_phase_name((Grpo__Phase)-1), "unknown");
}

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

/* Envelope.secret is bytes: what an older peer sends as a string (same wire type) decodes byte for byte, and
 * an embedded NUL stays visible to the comparison (issue 12, defect 15). */
static void test_secret_bytes(void **state)
{
    (void)state;
    /* version 1, secret "s3cret\0junk" as field 2 (length-delimited), status_request */
    const uint8_t wire[] = {0x08, 0x01, 0x12, 11,  's', '3', 'c',  'r',  'e',
                            't',  0,    'j',  'u', 'n', 'k', 0x88, 0x01, 0x01};
    char why[256];
    Grpo__Envelope *e = protocol_unpack(wire, sizeof wire, why, sizeof why);
    assert_non_null(e);
    assert_int_equal(e->secret.len, 11);
    assert_false(secret_matches(e->secret, "s3cret"));
    assert_false(secret_matches(e->secret, "s3cret\0junk")); /* a C string cannot hold it either */
    protocol_free(e);
    /* what a client packs is what a server compares */
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    envelope_set_secret(&env, "s3cret");
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    e = protocol_unpack(buf, len, why, sizeof why);
    assert_non_null(e);
    assert_true(secret_matches(e->secret, "s3cret"));
    assert_false(secret_matches(e->secret, "s3cre"));
    assert_false(secret_matches(e->secret, "s3cret!"));
    assert_false(secret_matches(e->secret, ""));
    protocol_free(e);
    free(buf);
    envelope_set_secret(&env, NULL);
    buf = protocol_pack(&env, &len);
    e = protocol_unpack(buf, len, why, sizeof why);
    assert_int_equal(e->secret.len, 0);
    assert_true(secret_matches(e->secret, ""));
    assert_false(secret_matches(e->secret, "s3cret"));
    protocol_free(e);
    free(buf);
    const uint8_t a[] = {'a', 0, 'b'}, b[] = {'a', 0, 'c'};
    assert_true(secret_bytes_equal(a, 3, a, 3));
    assert_false(secret_bytes_equal(a, 3, b, 3));
    assert_false(secret_bytes_equal(a, 1, a, 3));
    assert_false(secret_bytes_equal(a, 3, a, 1));
    assert_true(secret_bytes_equal(a, 0, b, 0));
    /* a secret file whose line holds a NUL is refused: the bytes after it would silently not count */
    char path[] = "/tmp/grpo-secret-nul-XXXXXX", out[64], err[256];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "abcdefghijklmnopqrstuvwxyz\0def\n", 31), 31);
    close(fd);
    assert_int_equal(secret_read(path, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "NUL"));
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "abcdefghijklmnopqrstuvwxyz\n\0junk", 32), 32); /* after the line: not the secret */
    close(fd);
    assert_int_equal(secret_read(path, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "abcdefghijklmnopqrstuvwxyz");
    unlink(path);
}

/* A process's data-plane key (1.12): keyed BLAKE2b-256 under the run key of "grpo plane key 2", then rank, pid,
 * incarnation and key epoch, little-endian 4, 4, 8 and 8 bytes. A known answer (Python's hashlib.blake2b(msg,
 * key=run_key, digest_size=32)): tests/cluster/net/capture.py derives the keys it looks for in a capture this way. */
static void test_plane_key_layout(void **state)
{
    (void)state;
    uint8_t run_key[PLANE_KEY_BYTES], key[PLANE_KEY_BYTES];
    for (int i = 0; i < PLANE_KEY_BYTES; i++)
        run_key[i] = (uint8_t)i;
    assert_int_equal(plane_init(), 0);
    plane_key_derive(run_key,
                     &(struct plane_id){.rank = 3, .pid = 4242, .incarnation = 0x0123456789abcdefull, .epoch = 7}, key);
    static const uint8_t want[PLANE_KEY_BYTES] = {0xf6, 0x06, 0x00, 0xdf, 0x15, 0x24, 0x36, 0xcb, 0xa3, 0x4e, 0x22,
                                                  0xe4, 0x95, 0x0a, 0xfe, 0x8f, 0xeb, 0x53, 0x2d, 0x25, 0x96, 0xab,
                                                  0x33, 0x0a, 0x31, 0x4e, 0x86, 0x3f, 0xf8, 0x6d, 0x9a, 0x6c};
    assert_memory_equal(key, want, PLANE_KEY_BYTES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phase_names),     cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_version_refused), cmocka_unit_test(test_garbage_and_empty),
        cmocka_unit_test(test_secret_bytes),    cmocka_unit_test(test_plane_key_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

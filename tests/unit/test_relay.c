/* The weight relay (worker/plane/relay.h): a relay serves the version it holds, chunk by chunk, to a request that
 * carries the version's token and to nothing else; a version it no longer holds is said as such (1), a wrong token
 * refused (-1); the digest is BLAKE2b-256 of the floats (checked against libsodium's one-shot call) and the token
 * depends on the run key, its epoch and the version; a relay dropped serves nothing; the tests' corrupt relay flips
 * a bit the digest finds; the relays' endpoints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "proto/plane_auth.h"
#include "worker/plane/relay.h"

enum { N = 1000 };

/* An ipc endpoint of this test's own (pid in the name). */
static void endpoint(char *out, size_t len, const char *tag)
{
    snprintf(out, len, "ipc:///tmp/test-relay-%d-%s.sock", (int)getpid(), tag);
}

static void test_digest_and_token(void **state)
{
    (void)state;
    assert_int_equal(plane_init(), 0);
    float w[N];
    for (int i = 0; i < N; i++)
        w[i] = (float)i * 0.5f - 3.0f;
    uint8_t a[RELAY_DIGEST_BYTES], b[RELAY_DIGEST_BYTES];
    relay_digest(w, N, a);
    crypto_generichash(b, sizeof b, (const unsigned char *)w, sizeof w, NULL, 0); /* the same, in one call */
    assert_memory_equal(a, b, sizeof a);
    w[N - 1] = 7.0f;
    relay_digest(w, N, b);
    assert_memory_not_equal(a, b, sizeof a);
    uint8_t key[PLANE_KEY_BYTES], key2[PLANE_KEY_BYTES], t[4][RELAY_TOKEN_BYTES];
    plane_run_key_new(key);
    plane_run_key_new(key2);
    relay_token(key, 5, 1, t[0]);
    relay_token(key, 5, 2, t[1]);  /* another version */
    relay_token(key, 6, 1, t[2]);  /* another epoch */
    relay_token(key2, 5, 1, t[3]); /* another run key */
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            assert_memory_not_equal(t[i], t[j], RELAY_TOKEN_BYTES);
    uint8_t again[RELAY_TOKEN_BYTES];
    relay_token(key, 5, 1, again);
    assert_memory_equal(again, t[0], RELAY_TOKEN_BYTES);
}

static void test_serve_and_fetch(void **state)
{
    (void)state;
    char ep[200], err[512];
    endpoint(ep, sizeof ep, "serve");
    struct relay_server *s = relay_server_open(ep, 3, err, sizeof err);
    if (!s)
        fail_msg("relay_server_open: %s", err);
    float *w = malloc(N * sizeof *w), *got = calloc(N, sizeof *got);
    assert_non_null(w);
    assert_non_null(got);
    for (int i = 0; i < N; i++)
        w[i] = (float)i * 0.25f + 1.0f;
    uint8_t key[PLANE_KEY_BYTES], tok[RELAY_TOKEN_BYTES], other[RELAY_TOKEN_BYTES];
    plane_run_key_new(key);
    relay_token(key, 9, 4, tok);
    relay_token(key, 9, 5, other);
    size_t bytes;
    int chunks;
    /* nothing held yet: "not held" (1) */
    assert_int_equal(relay_fetch(ep, 4, tok, got, N, 400 * sizeof(float), 2000, &bytes, &chunks, err, sizeof err), 1);
    relay_server_hold(s, 4, w, N, tok);
    /* chunks of 400, 400, 200 floats: the whole version, byte for byte */
    assert_int_equal(relay_fetch(ep, 4, tok, got, N, 400 * sizeof(float), 2000, &bytes, &chunks, err, sizeof err), 0);
    assert_int_equal(chunks, 3);
    assert_int_equal(bytes, N * sizeof(float));
    assert_memory_equal(got, w, N * sizeof(float));
    assert_int_equal(relay_server_bytes(s), (int64_t)(N * sizeof(float)));
    /* another version's token (a stranger's guess): refused, nothing served */
    memset(got, 0, N * sizeof *got);
    assert_int_equal(relay_fetch(ep, 4, other, got, N, 400 * sizeof(float), 2000, &bytes, &chunks, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "relay token"));
    assert_int_equal(bytes, 0);
    assert_int_equal(relay_server_bytes(s), (int64_t)(N * sizeof(float)));
    /* another version than it holds: "not held" */
    assert_int_equal(relay_fetch(ep, 5, other, got, N, 400 * sizeof(float), 2000, &bytes, &chunks, err, sizeof err), 1);
    /* a size that disagrees with the version's: refused */
    assert_int_equal(relay_fetch(ep, 4, tok, got, N - 1, 400 * sizeof(float), 2000, &bytes, &chunks, err, sizeof err),
                     -1);
    /* dropped: served no more */
    relay_server_drop(s);
    assert_int_equal(relay_fetch(ep, 4, tok, got, N, 400 * sizeof(float), 2000, &bytes, &chunks, err, sizeof err), 1);
    relay_server_close(s);
    /* gone: no answer within the wait, an error */
    assert_int_equal(relay_fetch(ep, 4, tok, got, N, 400 * sizeof(float), 300, &bytes, &chunks, err, sizeof err), -1);
    free(w);
    free(got);
}

/* GRPO_TEST_RELAY_CORRUPT_RANK names rollout rank 3: its relay's bytes differ from what it holds, and the digest
 * says so; rank 2's relay is honest. */
static void test_corrupt_relay(void **state)
{
    (void)state;
    setenv("GRPO_TEST_RELAY_CORRUPT_RANK", "3", 1);
    char ep[2][200], err[512];
    endpoint(ep[0], sizeof ep[0], "bad");
    endpoint(ep[1], sizeof ep[1], "good");
    struct relay_server *bad = relay_server_open(ep[0], 3, err, sizeof err),
                        *good = relay_server_open(ep[1], 2, err, sizeof err);
    unsetenv("GRPO_TEST_RELAY_CORRUPT_RANK");
    assert_non_null(bad);
    assert_non_null(good);
    float w[N], got[N];
    for (int i = 0; i < N; i++)
        w[i] = (float)i;
    uint8_t key[PLANE_KEY_BYTES], tok[RELAY_TOKEN_BYTES], want[RELAY_DIGEST_BYTES], dg[RELAY_DIGEST_BYTES];
    plane_run_key_new(key);
    relay_token(key, 1, 0, tok);
    relay_digest(w, N, want);
    relay_server_hold(bad, 0, w, N, tok);
    relay_server_hold(good, 0, w, N, tok);
    size_t bytes;
    int chunks;
    assert_int_equal(relay_fetch(ep[0], 0, tok, got, N, 4000, 2000, &bytes, &chunks, err, sizeof err), 0);
    relay_digest(got, N, dg);
    assert_memory_not_equal(dg, want, sizeof dg);
    assert_int_equal(relay_fetch(ep[1], 0, tok, got, N, 4000, 2000, &bytes, &chunks, err, sizeof err), 0);
    relay_digest(got, N, dg);
    assert_memory_equal(dg, want, sizeof dg);
    relay_server_close(bad);
    relay_server_close(good);
}

static void test_endpoints(void **state)
{
    (void)state;
    char bind[300], dial[300], err[256];
    assert_int_equal(
        relay_endpoints("ipc:///run/user/0/grpo-1-2-dispatch.sock", 7, "h", bind, dial, sizeof bind, err, sizeof err),
        0);
    assert_string_equal(bind, "ipc:///run/user/0/grpo-1-2-relay-7.sock");
    assert_string_equal(dial, bind);
    assert_int_equal(relay_endpoints("tcp://node3:29400", 5, "node9", bind, dial, sizeof bind, err, sizeof err), 0);
    assert_string_equal(bind, "tcp://*:29406");
    assert_string_equal(dial, "tcp://node9:29406");
    assert_int_equal(relay_endpoints("tcp://node3:65535", 0, "x", bind, dial, sizeof bind, err, sizeof err), -1);
    assert_non_null(strstr(err, "no port"));
    char longer[200];
    snprintf(longer, sizeof longer, "ipc:///%0120d-dispatch.sock", 0);
    assert_int_equal(relay_endpoints(longer, 1, "x", bind, dial, sizeof bind, err, sizeof err), -1);
    assert_non_null(strstr(err, "too long"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_and_token),
        cmocka_unit_test(test_serve_and_fetch),
        cmocka_unit_test(test_corrupt_relay),
        cmocka_unit_test(test_endpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The data plane's address choice (issue 26): the base by host count, the bind address, the host of an endpoint,
 * the host count, grpod.advertise_host resolved, and a name that does not resolve. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/netaddr.h"
#include "common/placement.h"

#include "../test_util.h"

static void test_data_base(void **state)
{
    (void)state;
    char b[128], b2[128];
    placement_data_base("tcp://*:7000", 2, "run-a", b, sizeof b); /* the configured base wins */
    assert_string_equal(b, "tcp://*:7000");
    placement_data_base("", 1, "run-a", b, sizeof b);   /* one host: ipc */
    assert_string_equal(b, "ipc://~run/grpo-run-a");    /* in the user's private runtime directory */
    placement_data_base(NULL, 3, "run-a", b, sizeof b); /* hosts: tcp on a port from the tag */
    assert_true(strncmp(b, "tcp://*:", 8) == 0);
    long port = strtol(b + 8, NULL, 10);
    assert_true(port >= 20000 && port < 40000);
    placement_data_base(NULL, 2, "run-a", b2, sizeof b2); /* the same tag gives the same port */
    assert_string_equal(b, b2);
    int differ = 0; /* and runs seldom share one */
    for (int i = 0; i < 8; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "run-%d", i);
        placement_data_base(NULL, 2, tag, b2, sizeof b2);
        differ += strcmp(b, b2) != 0;
    }
    assert_true(differ >= 7);
}

static void test_bind_and_host(void **state)
{
    (void)state;
    char b[128];
    placement_bind_endpoint("tcp://*:7001", "10.0.0.1", b, sizeof b);
    assert_string_equal(b, "tcp://10.0.0.1:7001");
    placement_bind_endpoint("tcp://*:7001", "", b, sizeof b); /* no address named: every interface */
    assert_string_equal(b, "tcp://*:7001");
    placement_bind_endpoint("tcp://hosta:7001", "10.0.0.1", b, sizeof b); /* a dialled endpoint is left alone */
    assert_string_equal(b, "tcp://hosta:7001");
    placement_bind_endpoint("ipc:///tmp/x-dp0.sock", "10.0.0.1", b, sizeof b);
    assert_string_equal(b, "ipc:///tmp/x-dp0.sock");
    placement_endpoint_host("tcp://10.0.0.1:7000", b, sizeof b);
    assert_string_equal(b, "10.0.0.1");
    placement_endpoint_host("tcp://*:7000", b, sizeof b);
    assert_string_equal(b, "");
    placement_endpoint_host("tcp://0.0.0.0:7000", b, sizeof b);
    assert_string_equal(b, "");
    placement_endpoint_host("ipc:///tmp/a.sock", b, sizeof b);
    assert_string_equal(b, "");
    char hosts[4][16] = {"a", "b", "a", "c"};
    assert_int_equal(placement_count_hosts(&hosts[0][0], 4, 16), 3);
    assert_int_equal(placement_count_hosts(&hosts[0][0], 1, 16), 1);
    char same[2][16] = {"a", "a"};
    assert_int_equal(placement_count_hosts(&same[0][0], 2, 16), 1);
}

/* A survivor that takes the lead of a split run dispatches at an endpoint of its own, derived from its data endpoint
 * alike where it binds and where the rollout ranks dial: above every data, dispatch and relay port of the run. */
static void test_lead_endpoint(void **state)
{
    (void)state;
    char b[256], d[256];
    placement_lead_endpoint("tcp://*:7001", b, sizeof b); /* the bind form (DP rank 1 of a base at 7000) */
    assert_string_equal(b, "tcp://*:7129");
    placement_lead_endpoint("tcp://hosta:7001", d, sizeof d); /* the dialled form: the same port */
    assert_string_equal(d, "tcp://hosta:7129");
    placement_lead_endpoint("tcp://[::1]:7002", b, sizeof b);
    assert_string_equal(b, "tcp://[::1]:7130");
    /* the relays of up to 126 rollout ranks sit at the dispatcher's port (7000 + DP ranks) + 1 + slot: below */
    assert_true(7129 > 7000 + 2 + 1 + 125);
    placement_lead_endpoint("ipc:///run/grpo/grpo-r1-dp1.sock", b, sizeof b);
    assert_string_equal(b, "ipc:///run/grpo/grpo-r1-dp1-dispatch.sock");
    placement_data_endpoint("ipc:///run/grpo/grpo-r1", 1, NULL, d, sizeof d); /* what DP rank 1 binds */
    placement_lead_endpoint(d, b, sizeof b);
    placement_dispatch_endpoint("ipc:///run/grpo/grpo-r1", 2, NULL, d, sizeof d);
    assert_string_not_equal(b, d); /* never the first lead's */
    placement_lead_endpoint("ipc:///tmp/odd", b, sizeof b);
    assert_string_equal(b, "ipc:///tmp/odd-dispatch");
}

static void test_advertise(void **state)
{
    (void)state;
    char a[64], err[512] = "";
    assert_int_equal(net_advertise_address("", a, sizeof a, err, sizeof err), 0);
    assert_string_equal(a, "");
    assert_int_equal(net_advertise_address("lo", a, sizeof a, err, sizeof err), 0); /* an interface: its address */
    assert_string_equal(a, "127.0.0.1");
    assert_int_equal(net_advertise_address("10.1.2.3", a, sizeof a, err, sizeof err), 0);
    assert_string_equal(a, "10.1.2.3");
    assert_int_equal(net_advertise_address("node7.example", a, sizeof a, err, sizeof err), 0);
    assert_string_equal(a, "node7.example");
    assert_int_equal(net_check_resolves("localhost", "grpod.advertise_host", err, sizeof err), 0);
    assert_int_equal(net_check_resolves("no-such-host.invalid", "grpod.advertise_host", err, sizeof err), -1);
    assert_non_null(strstr(err, "'no-such-host.invalid' does not resolve"));
    assert_non_null(strstr(err, "grpod.advertise_host"));
}

/* The sockets' runtime directory ($XDG_RUNTIME_DIR/grpo here, in a temporary directory): made 0700 when missing and
 * used; taken first by someone else (a link, a directory open to others, another user's) it is refused, naming
 * it, and nothing is bound there; ipc://~run/ endpoints resolve into it, others are left alone. */
static void test_runtime_dir(void **state)
{
    (void)state;
    char base[] = "/tmp/grpo_rt_XXXXXX", dir[4096], why[1024], want[4200], ep[256];
    assert_non_null(mkdtemp(base));
    setenv("XDG_RUNTIME_DIR", base, 1);
    assert_int_equal(placement_runtime_dir(dir, sizeof dir, why, sizeof why), 0);
    snprintf(want, sizeof want, "%s/grpo", base);
    assert_string_equal(dir, want);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    snprintf(ep, sizeof ep, "ipc://~run/grpo-r1-dp0.sock");
    assert_int_equal(placement_resolve_endpoint(ep, sizeof ep, why, sizeof why), 0);
    snprintf(want, sizeof want, "ipc://%s/grpo/grpo-r1-dp0.sock", base);
    assert_string_equal(ep, want);
    snprintf(ep, sizeof ep, "tcp://host:7000");
    assert_int_equal(placement_resolve_endpoint(ep, sizeof ep, why, sizeof why), 0);
    assert_string_equal(ep, "tcp://host:7000");
    /* open to others */
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(placement_runtime_dir(dir, sizeof dir, why, sizeof why), -1);
    assert_non_null(strstr(why, "open to other users"));
    snprintf(ep, sizeof ep, "ipc://~run/grpo-r1-dp0.sock");
    assert_int_equal(placement_resolve_endpoint(ep, sizeof ep, why, sizeof why), -1);
    assert_non_null(strstr(why, base));
    /* a link to a directory elsewhere */
    assert_int_equal(rmdir(dir), 0);
    snprintf(want, sizeof want, "%s/elsewhere", base);
    assert_int_equal(mkdir(want, 0700), 0);
    assert_int_equal(symlink(want, dir), 0);
    assert_int_equal(placement_runtime_dir(dir, sizeof dir, why, sizeof why), -1);
    assert_non_null(strstr(why, "a symbolic link"));
    /* another user's (as root: given to nobody) */
    assert_int_equal(unlink(dir), 0);
    if (getuid() == 0) {
        assert_int_equal(mkdir(dir, 0700), 0);
        assert_int_equal(chown(dir, 65534, 65534), 0);
        assert_int_equal(placement_runtime_dir(dir, sizeof dir, why, sizeof why), -1);
        assert_non_null(strstr(why, "owned by another user"));
    }
    unsetenv("XDG_RUNTIME_DIR");
    must_rm_rf(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_base),     cmocka_unit_test(test_runtime_dir), cmocka_unit_test(test_bind_and_host),
        cmocka_unit_test(test_lead_endpoint), cmocka_unit_test(test_advertise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

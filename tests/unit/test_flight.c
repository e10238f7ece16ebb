/* The flight recorder (worker/flight): the ring wraps round keeping the newest records, a reader on another thread
 * sees every record whole while the recorder writes, size 0 records nothing, the open waits nest, groups are
 * interned, and the dumps and the native stack come out. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/fs.h"
#include "worker/flight/flight.h"

/* one finished record of op with seq and bytes */
static void record(enum flight_op op, uint16_t group, uint64_t seq, uint64_t bytes, double t)
{
    int tok = flight_begin(op, group, seq, bytes, -1, t);
    assert_true(tok > 0);
    flight_end(tok, t + 0.5, false);
}

static void test_wraps_round(void **state)
{
    (void)state;
    flight_init(4);
    const uint16_t g = flight_group("dp", "0-1", 2);
    for (uint64_t i = 1; i <= 10; i++)
        record(FLIGHT_OP_ALLREDUCE, g, 100 + i, 8 * i, (double)i);
    assert_int_equal(flight_recorded(), 10);
    struct flight_entry e[8];
    const int n = flight_snapshot(e, 8);
    assert_int_equal(n, 4); /* the ring's size: the newest four, oldest first */
    for (int i = 0; i < n; i++) {
        const uint64_t id = 7 + (uint64_t)i;
        assert_int_equal(e[i].id, id);
        assert_int_equal(e[i].seq, 100 + id);
        assert_int_equal(e[i].bytes, 8 * id);
        assert_int_equal(e[i].group, g);
        assert_true(e[i].ended > e[i].began);
    }
    assert_int_equal(flight_snapshot(e, 2), 2); /* at most max: the newest two */
    assert_int_equal(e[0].id, 9);
    assert_int_equal(e[1].id, 10);
    flight_shutdown();
}

static void test_off_when_size_zero(void **state)
{
    (void)state;
    flight_init(0);
    assert_int_equal(flight_size(), 0);
    assert_int_equal(flight_begin(FLIGHT_OP_BARRIER, 0, 1, 0, -1, 1.0), 0);
    flight_end(0, 2.0, false); /* nothing, no crash */
    struct flight_entry e;
    assert_false(flight_current(&e));
    assert_int_equal(flight_snapshot(&e, 1), 0);
    assert_int_equal(flight_recorded(), 0);
    assert_int_equal(flight_dump("test", false), 0);
    flight_shutdown();
}

static void test_open_waits_nest(void **state)
{
    (void)state;
    flight_init(16);
    struct flight_entry e;
    assert_false(flight_current(&e));
    flight_set_phase(6); /* update_actor */
    flight_set_layer(12, true);
    const int outer = flight_begin(FLIGHT_OP_WORK_REQUEST, 0, 0, 0, -1, 10.0);
    const int inner = flight_begin(FLIGHT_OP_BROADCAST, 0, 77, 64, 0, 11.0);
    assert_true(flight_current(&e));
    assert_int_equal(e.op, FLIGHT_OP_BROADCAST);
    assert_int_equal(e.seq, 77);
    assert_int_equal(e.peer, 0);
    assert_int_equal(e.phase, 6);
    assert_int_equal(e.layer, 12);
    assert_true(e.flags & FLIGHT_BACKWARD);
    assert_true(e.ended == 0);
    flight_end(inner, 12.0, false);
    assert_true(flight_current(&e)); /* the outer one again */
    assert_int_equal(e.op, FLIGHT_OP_WORK_REQUEST);
    flight_set_layer(-1, false);
    flight_end(outer, 13.0, true);
    assert_false(flight_current(&e));
    struct flight_entry all[4];
    assert_int_equal(flight_snapshot(all, 4), 2);
    assert_int_equal(all[0].op, FLIGHT_OP_BROADCAST); /* in the order they ended */
    assert_int_equal(all[1].op, FLIGHT_OP_WORK_REQUEST);
    assert_true(all[1].flags & FLIGHT_FAILED);
    flight_shutdown();
}

/* ---- a reader on another thread while the recorder writes ---- */

static _Atomic int reader_passes, reader_bad, reader_seen;
static _Atomic bool writer_done;

/* every record the writer makes has seq 3 x id and bytes 7 x id: a torn copy breaks the rule */
static void *reader(void *arg)
{
    (void)arg;
    struct flight_entry *e = calloc(64, sizeof *e);
    while (!atomic_load(&writer_done)) {
        const int n = flight_snapshot(e, 64);
        for (int i = 0; i < n; i++) {
            if (e[i].seq != 3 * e[i].id || e[i].bytes != 7 * e[i].id || (i && e[i].id <= e[i - 1].id))
                atomic_fetch_add(&reader_bad, 1);
            atomic_fetch_add(&reader_seen, 1);
        }
        struct flight_entry cur;
        if (flight_current(&cur) && (cur.seq % 3 != 0 || cur.bytes != cur.seq / 3 * 7 || cur.ended != 0))
            atomic_fetch_add(&reader_bad, 1);
        atomic_fetch_add(&reader_passes, 1);
    }
    free(e);
    return NULL;
}

static void test_concurrent_reader(void **state)
{
    (void)state;
    flight_init(64);
    atomic_store(&writer_done, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, reader, NULL), 0);
    /* write until the reader has made many passes over the ring while it changed (an event, not a time) */
    uint64_t id = 0;
    while (atomic_load(&reader_passes) < 2000 || id < 100000) {
        id++;
        const int tok = flight_begin(FLIGHT_OP_ALLGATHER, 0, 3 * id, 7 * id, -1, (double)id);
        flight_end(tok, (double)id + 1, false);
    }
    atomic_store(&writer_done, true);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&reader_bad), 0);
    assert_true(atomic_load(&reader_seen) > 0);
    assert_int_equal(flight_recorded(), id);
    flight_shutdown();
}

static void test_groups_and_text(void **state)
{
    (void)state;
    char ranks[64];
    const int r[] = {7, 0, 1, 2, 3, 4, 6};
    flight_ranks_text(r, 7, ranks, sizeof ranks);
    assert_string_equal(ranks, "0-4,6-7");
    const int one[] = {5};
    flight_ranks_text(one, 1, ranks, sizeof ranks);
    assert_string_equal(ranks, "5");
    int many[100];
    for (int i = 0; i < 100; i++)
        many[i] = 2 * i;
    flight_ranks_text(many, 100, ranks, 24); /* cut short, and says so */
    assert_non_null(strstr(ranks, "..."));
    assert_true(strlen(ranks) < 24);

    const uint16_t a = flight_group("dp", "0-4,6-7", 7), b = flight_group("dp", "0-4,6-7", 7);
    const uint16_t c = flight_group("tp", "0-1", 2);
    assert_true(a > 0);
    assert_int_equal(a, b);
    assert_true(c != a);
    assert_string_equal(flight_group_name(a), "dp");
    assert_string_equal(flight_group_members(a), "0-4,6-7");
    assert_int_equal(flight_group_size(a), 7);

    flight_init(8);
    flight_set_phase(6);
    flight_set_layer(12, true);
    record(FLIGHT_OP_ALLREDUCE, a, 1234, 4096, 1.0);
    flight_set_layer(-1, false);
    struct flight_entry e;
    assert_int_equal(flight_snapshot(&e, 1), 1);
    char text[512];
    flight_entry_text(&e, 2.0, text, sizeof text);
    assert_non_null(strstr(text, "all-reduce #1234 of dp (ranks 0-4,6-7)"));
    assert_non_null(strstr(text, "4.0 KiB"));
    assert_non_null(strstr(text, "phase update_actor, layer 12 backward"));
    flight_entry_json(&e, 2.0, text, sizeof text);
    assert_non_null(strstr(text, "\"op\":\"all-reduce\""));
    assert_non_null(strstr(text, "\"group\":\"dp\""));
    assert_non_null(strstr(text, "\"members\":\"0-4,6-7\""));
    assert_non_null(strstr(text, "\"seq\":1234"));
    assert_non_null(strstr(text, "\"bytes\":4096"));
    assert_non_null(strstr(text, "\"open\":false"));
    flight_shutdown();
}

static void test_dump_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_flight.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[128];
    snprintf(sub, sizeof sub, "%s/flight", dir);
    flight_init(4);
    flight_set_rank(3);
    flight_set_dump_dir(sub);
    const uint16_t g = flight_group("world", "0-3", 4);
    for (uint64_t i = 1; i <= 6; i++)
        record(FLIGHT_OP_BROADCAST, g, i, 4, (double)i);
    const int open = flight_begin(FLIGHT_OP_BARRIER, g, 7, 0, -1, 20.0);
    assert_int_equal(flight_dump("unit test", false), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/rank-3.jsonl", sub);
    assert_string_equal(flight_dump_path(), path);
    char why[256];
    size_t len = 0;
    char *text = fs_read_all(path, 1 << 20, &len, why, sizeof why);
    assert_non_null(text);
    int lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    assert_int_equal(lines, 1 + 4 + 1); /* the header, the ring, the open wait */
    assert_non_null(strstr(text, "\"rank\":3,\"reason\":\"unit test\""));
    assert_non_null(strstr(text, "\"recorded\":6"));
    assert_non_null(strstr(text, "\"op\":\"barrier\",\"group\":\"world\""));
    assert_non_null(strstr(text, "\"open\":true"));
    free(text);
    flight_end(open, 21.0, false);
    assert_int_equal(flight_save_text("stacks", "frame one\n"), 0);
    snprintf(path, sizeof path, "%s/stacks-rank-3.txt", sub);
    text = fs_read_all(path, 1 << 20, &len, why, sizeof why);
    assert_non_null(text);
    assert_string_equal(text, "frame one\n");
    free(text);
    flight_set_dump_dir(NULL);
    flight_shutdown();
    assert_int_equal(fs_remove_tree(dir, why, sizeof why), 0);
}

/* ---- the native stack: the recording thread writes it when another thread asks ---- */

static char stack_text[16384];
static int stack_rc = -2;

static void *ask_stack(void *arg)
{
    (void)arg;
    stack_rc = flight_stack_capture(stack_text, sizeof stack_text, 10.0);
    return NULL;
}

static void test_stack_capture(void **state)
{
    (void)state;
    flight_init(4);
    assert_int_equal(flight_stack_init(), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, ask_stack, NULL), 0);
    pthread_join(th, NULL); /* this thread's handler runs while it waits here */
    assert_int_equal(stack_rc, 0);
    assert_true(strlen(stack_text) > 0);
    assert_non_null(strchr(stack_text, '\n')); /* a frame a line */
    flight_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wraps_round),     cmocka_unit_test(test_off_when_size_zero),
        cmocka_unit_test(test_open_waits_nest), cmocka_unit_test(test_concurrent_reader),
        cmocka_unit_test(test_groups_and_text), cmocka_unit_test(test_dump_file),
        cmocka_unit_test(test_stack_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

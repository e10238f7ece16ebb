/* The flight recorder's own cost: nanoseconds per recorded wait (flight_begin + flight_end, as comm.c's WAITED pays
 * them; its two clock reads were there before the recorder), alone and with a reader snapshotting the whole ring
 * without pause on another thread (the heartbeat thread reads it once a second: this is far worse), and with the
 * recorder off (trainer.flight_recorder.size 0).
 *
 *   build/bench/flight_bench [RECORDS]        (default 20000000)
 *
 * bench/run_flight_bench.sh multiplies it by the waits a step records to bound the cost per step. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "worker/flight/flight.h"

static _Atomic bool stop;
static _Atomic long snapshots;

static void *reader(void *arg)
{
    (void)arg;
    struct flight_entry *e = calloc(256, sizeof *e);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        flight_snapshot(e, 256);
        struct flight_entry cur;
        flight_current(&cur);
        atomic_fetch_add_explicit(&snapshots, 1, memory_order_relaxed);
    }
    free(e);
    return NULL;
}

/* ns per begin + end over n records */
static double run(long n, uint16_t g)
{
    const double t0 = clock_now_s();
    for (long i = 0; i < n; i++) {
        const int tok = flight_begin(FLIGHT_OP_ALLREDUCE, g, (uint64_t)i, 4096, -1, 1.0);
        flight_end(tok, 2.0, false);
    }
    return (clock_now_s() - t0) * 1e9 / (double)n;
}

int main(int argc, char **argv)
{
    const long n = argc > 1 ? strtol(argv[1], NULL, 10) : 20000000;
    if (n < 10) {
        fprintf(stderr, "usage: flight_bench [RECORDS, 10 or more]\n");
        return 2;
    }
    const uint16_t g = flight_group("dp", "0-1", 2);
    flight_init(0);
    const double off = run(n, g);
    flight_init(256);
    run(n / 10, g); /* warm */
    const double alone = run(n, g);
    pthread_t th;
    pthread_create(&th, NULL, reader, NULL);
    while (atomic_load(&snapshots) < 10) /* the reader is at work */
        ;
    const double read = run(n, g);
    atomic_store(&stop, true);
    pthread_join(th, NULL);
    printf("flight recorder, %ld records each: off %.1f ns, on %.1f ns, on with a reader snapshotting the ring "
           "without pause %.1f ns (%ld snapshots) per recorded wait\n",
           n, off, alone, read, atomic_load(&snapshots));
    printf("ns_per_record %.2f\n", alone);
    return 0;
}

/* The work units of a colocated step and who makes them. A step's B prompt groups are cut into U units (unit u:
 * groups dispatch_unit_range(B, U, u), a group never split); generation engine e of E owns the units
 * dispatch_unit_range(U, E, e) when the step starts, and takes them from the front. An engine that has made its
 * own takes the last unstarted unit of the engine with the most left (stealing), so no engine idles while
 * another has units it has not begun. A unit's groups come out the same whoever makes them (each sample draws
 * from its own RNG stream), so the step's batch does not depend on who stole what.
 *
 * The ledger is a table of int64 (units_table_len(E) of them): the step it describes, then each engine's next
 * and end unit. units_take is the pure rule; the table lives in MPI one-sided memory (comm_table) so that an
 * engine takes a unit without waiting for anyone. */
#ifndef GRPO_WORKER_HYBRID_UNITS_H
#define GRPO_WORKER_HYBRID_UNITS_H

#include <stdbool.h>
#include <stdint.h>

struct comm;

/* Values in the ledger of E engines. */
int units_table_len(int engines);

/* Engine `engine` takes its next unit of step `step` from the ledger v (set up for the step first if it
 * describes another): its own next one, or with steal its pick from the engine with the most units left (from
 * the back). The unit's index, or -1 when there is none; *stolen says whether it was another's. */
int units_take(int64_t *v, int engines, int units, int64_t step, int engine, bool steal, bool *stolen);

/* Where a rank may be lost (trainer.survive_trainer_loss) the ledger is instead one word per engine in the shared
 * memory of each host's ranks (comm_shared), changed by compare-and-swap: no lock that a dead rank could hold, no
 * MPI call while a unit is taken, and an engine steals only from the engines of its host. A word is the round's
 * key (in UNITS_KEY_BITS bits, never 0), the engine's next unit and its end; a word of another round (fresh memory too)
 * stands for the engine's whole range (dispatch_unit_range) not started. */
#define UNITS_KEY_BITS 24
#define UNITS_INDEX_BITS 20
/* The next unit of engine e's word w for the round `key`: from the front (its owner: *unit the next, the new word in
 * *next) or from the back (a thief: the last unstarted one). false when none is left; lo and hi: the engine's range. */
bool units_word_take(uint64_t w, int64_t key, int lo, int hi, bool from_back, uint64_t *next, int *unit);
/* Units left in the word w for the round `key` (its whole range when w is another round's). */
int units_word_left(uint64_t w, int64_t key, int lo, int hi);
/* Take from the words of a host (words[e] for every engine e; local[0..n_local) the engines of this host, own among
 * them): own units first, then the host's engine with the most left (the lower on a tie), each by compare-and-swap;
 * -1 when none is left on the host. *stolen as units_take. words may be shared between processes. */
int units_take_shared(uint64_t *words, const int *local, int n_local, int engines, int units, int64_t key, int engine,
                      bool *stolen);

/* The ledger shared by every rank of `all` (collective; NULL where the comm has no one-sided memory). Without
 * steal an engine takes its own units alone: the ledger is this rank's, no one-sided memory, no collective. With
 * per_host, the lock-free ledger of each host above (collective over all; NULL where there is no shared memory). */
struct units_ledger;
struct units_ledger *units_ledger_create(struct comm *all, int engines, int units, bool steal, bool per_host,
                                         int engine, bool head);
/* units_take on the shared ledger, under its lock. */
int units_ledger_take(struct units_ledger *l, int64_t step, int engine, bool *stolen);
/* Free it (collective over `all` where it is shared). */
void units_ledger_free(struct units_ledger *l);

#endif

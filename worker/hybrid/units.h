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

/* The ledger shared by every rank of `all` (collective; NULL where the comm has no one-sided memory). Without
 * steal an engine takes its own units alone: the ledger is this rank's, no one-sided memory, no collective. */
struct units_ledger;
struct units_ledger *units_ledger_create(struct comm *all, int engines, int units, bool steal);
/* units_take on the shared ledger, under its lock. */
int units_ledger_take(struct units_ledger *l, int64_t step, int engine, bool *stolen);
/* Free it (collective over `all` where it is shared). */
void units_ledger_free(struct units_ledger *l);

#endif

/* The data plane's sockets: each trainer DP rank binds one nanomsg REP
 * endpoint (handed out by grpod, or derived from the run when there is none);
 * each rollout rank connects one REQ socket to every trainer endpoint. Every
 * batch is a request the trainer answers with an acknowledgement (or a
 * refusal that says why). A rollout rank has at most one unacknowledged batch
 * per trainer: it waits for the previous answer before it sends the next, so a
 * slow trainer slows the rollout instead of growing memory (bounded
 * back-pressure), and a batch whose answer does not come is sent again by the
 * socket (the trainer drops the duplicate by its sequence number). */
#ifndef GRPO_WORKER_PLANE_DATAPLANE_H
#define GRPO_WORKER_PLANE_DATAPLANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct wire_auth;
struct plane_cred;

struct dataplane_pull;
struct dataplane_push;

/* Bind the trainer's REP socket at endpoint (messages over GRPO_MAX_MESSAGE_BYTES are dropped by nanomsg; an
 * ipc socket file is made owner-only). NULL with err. */
struct dataplane_pull *dataplane_pull_open(const char *endpoint, char *err, size_t errlen);
/* Wait up to timeout_ms for one batch: 1 with *buf (free with dataplane_msg_free) and *len, 0 on timeout, -1 with
 * err on a socket error. Answer it with dataplane_answer before the next receive. */
int dataplane_recv(struct dataplane_pull *p, int timeout_ms, void **buf, size_t *len, char *err, size_t errlen);
/* Answer the batch just received: accepted (ok) or refused with why; authenticated for its sender when its
 * authentication was good (a->verified), else plain. */
void dataplane_answer(struct dataplane_pull *p, bool ok, const char *why, const struct wire_auth *a);
void dataplane_pull_close(struct dataplane_pull *p);

/* Connect one REQ socket to each of the n endpoints; answers must be authenticated for cred (this process's
 * credentials, kept by the caller). NULL with err. */
struct dataplane_push *dataplane_push_open(const char *const *endpoints, int n, const struct plane_cred *cred,
                                           char *err, size_t errlen);
/* One REQ socket (endpoint 0 of dataplane_send) connected to each of the n endpoints: a batch goes to whichever
 * trainer listens (under trainer.survive_trainer_loss a split run's lead alone binds, and a survivor that takes the
 * lead binds its own; a batch sent to a lead that dies is sent again to the next). NULL with err. */
struct dataplane_push *dataplane_push_open_any(const char *const *endpoints, int n, const struct plane_cred *cred,
                                               char *err, size_t errlen);
/* Send one batch (packed with counter `counter` of the credentials) to endpoint i: first wait up to timeout_ms
 * for the answer to the previous one (back-pressure); an answer not authenticated for its batch is refused.
 * 0; -1 with err when no answer came in time (the trainer takes no data: try again) or the run ended meanwhile
 * (dataplane_push_until); -2 with err when the
 * previous batch was refused (err says why: a configuration that differs from the trainer's). */
int dataplane_send(struct dataplane_push *p, int i, const void *buf, size_t len, uint64_t counter, int timeout_ms,
                   char *err, size_t errlen);
/* Waits on a trainer (dataplane_send's) give up as soon as ended(ud) says the run has ended: called every 0.2 s
 * of a wait, it is also the caller's turn meanwhile (a rollout rank holds there for a pause). */
void dataplane_push_until(struct dataplane_push *p, bool (*ended)(void *ud), void *ud);
void dataplane_push_close(struct dataplane_push *p);

void dataplane_msg_free(void *buf);

#endif

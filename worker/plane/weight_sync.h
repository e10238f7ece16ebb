/* How a policy version goes from the trainers to the rollout processes, both sides in one place. The trainers'
 * dispatcher holds each published version (dispatch.h); a rollout process fetches the version its unit needs in
 * chunks, or, with actor_rollout_ref.rollout.weight_sync=broadcast, takes it in one broadcast over the collective
 * plane (weight_bcast.h) once every rollout process of the launch has asked for it: the rendezvous is the
 * dispatcher's (dispatch_core.c), the sender's side runs the rounds on the dispatcher's rank, the receiver's side
 * asks, joins or falls back to fetching. A failed or lost round turns the broadcast off for the rest of the run on
 * both sides; nothing is lost, the versions are fetched. */
#ifndef GRPO_WORKER_PLANE_WEIGHT_SYNC_H
#define GRPO_WORKER_PLANE_WEIGHT_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct comm;
struct dispatcher;
struct kctx;
struct relay_server;
struct work_client;

/* Told when a weight transfer begins (syncing true) and ends: the role's control-plane phase. */
typedef void (*weight_sync_phase_fn)(void *ud, bool syncing);

/* The dispatcher's rank: its broadcast rounds. */
struct weight_sync_sender {
    struct dispatcher *disp; /* NULL: not the dispatcher's rank (nothing to do) */
    struct comm *group;      /* the launch's broadcast group (weight_sync=broadcast); NULL: versions are fetched */
    struct kctx *K;          /* this rank's context (a GPU's makes the rounds go over an NCCL twin) */
    bool gpus_shared;        /* some node's ranks share a GPU (no NCCL twin) */
    size_t bucket_bytes;     /* actor_rollout_ref.rollout.update_weights_bucket_megabytes */
    size_t n_floats;         /* a version's floats (the weights, or with LoRA the adapter) */
    weight_sync_phase_fn phase;
    void *ud;
    struct comm *bcast; /* the group the rounds go over, made at the first (weight_bcast_group) */
};
/* If every rollout process has asked for the same held version: its round, from the dispatcher's copy. Returns
 * the seconds it took (0: no round). A failed round turns the broadcast off (logged). */
double weight_sync_serve_round(struct weight_sync_sender *s);
/* Rounds until none is due: a version the rollout processes are about to ask for (one-step-off: the one their
 * next step needs) has its round before the trainers go on, or they would wait through the update. wait(ud) runs
 * between looks (the control plane's hold). Returns the seconds the rounds took. */
double weight_sync_finish_rounds(struct weight_sync_sender *s, void (*wait)(void *ud), void *ud);
/* Free what the sender made (its NCCL twin). */
void weight_sync_sender_release(struct weight_sync_sender *s);

/* A rollout process (its group's first rank): the dispatcher's client and its side of the broadcast. */
struct weight_sync_receiver {
    struct work_client *work;
    struct comm *group; /* the launch's broadcast group (weight_sync=broadcast); NULL: versions are fetched */
    struct kctx *K;
    bool gpus_shared;
    void (*wait)(void *ud); /* between broadcast asks (keep-alives to the TP peers, the control plane's hold) */
    void *ud;
    struct comm *bcast; /* the group the rounds go over (made at the first round); NULL once given up */
    bool bcast_made;
    float *bcast_bucket; /* the broadcast's host bucket, from round to round */
    /* the relay tree (actor_rollout_ref.rollout.weight_relay_fanout > 0; worker/plane/relay.h): this process's relay,
     * which serves the version it holds from dst, and where the others dial it; NULL: every version is fetched from
     * the dispatcher */
    struct relay_server *relay;
    const char *relay_dial;
    int relay_from;     /* out: the rollout rank whose relay the last version came from (-1: the dispatcher) */
    int relay_failures; /* relays that failed this process so far (it fetched from the dispatcher instead) */
};
/* Version `version` into dst[0..n): in the trainers' broadcast when it gets a round, else fetched in chunks of
 * chunk_bytes (with the relay tree: from the holder the dispatcher names, checked against the version's digest, or
 * from the dispatcher; then served from dst until the next call). 0 with *broadcast (how it came), *bytes and *chunks
 * (what moved); -1 with err (the dispatcher is gone or refused, the sizes disagree). */
int weight_sync_receive(struct weight_sync_receiver *r, int64_t version, float *dst, size_t n, size_t chunk_bytes,
                        bool *broadcast, size_t *bytes, int *chunks, char *err, size_t errlen);
/* Free what the receiver made (its NCCL twin, its bucket). */
void weight_sync_receiver_release(struct weight_sync_receiver *r);

#endif

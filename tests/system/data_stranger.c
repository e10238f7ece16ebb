/* data_stranger ENDPOINT: play a stranger on a trainer's data socket. Sends, one request each: random bytes, a
 * truncated envelope, a rollout batch that names a prompt the run does not have, a rollout batch of another
 * protocol version, a control message, and one message over the size limit. A trainer must refuse (and count)
 * every one with an answer that says why, and carry on. Exit 0 when each of the first five got a refusal (the
 * oversized one is dropped by the socket, unanswered).
 *
 * data_stranger ENDPOINT DP_RANK [--cred FILE] [--dispatch EP] KEY=VALUE...: a stranger who knows the run (its
 * configuration, so its shape and its prompts) sends batches that are well formed and still must be refused: 20
 * empty batches for steps 1,000,000 on (a trainer keeps no step the dispatcher cannot have granted), and a whole
 * group of a real prompt for step 1 with one response of zero tokens, each authenticated with the good credentials
 * of one rollout process read from FILE (the run's GRPO_TEST_SPARE_CREDENTIALS; without FILE they go
 * unauthenticated). Exit 0 when each was refused, the reasons printed.
 *
 * With --dispatch EP (the trainers' dispatcher), the stranger plays a hostile peer of the data plane's
 * authentication (issue 27) before that: on the data socket, a whole group of a real prompt for step 1 without
 * authentication, the same with FILE's key claiming another process's identity, with FILE's identity naming
 * another rank as its sender, and a captured batch replayed; on the dispatcher, a ping without authentication, a
 * ping for another rollout rank than FILE's, and a weights download without credentials. Each must be refused for
 * its reason (a weights download must get no weights).
 *
 * Then (issue 27, what a step can hold) three batches for step 1's unit 0 that would take the real batch's place
 * (the trainer keeps the first copy of each unit), authenticated with FILE's credentials: one whose group holds a
 * prompt step 1 does not draw there, one whose policy_version step 1 cannot be generated with, and one with step
 * 1's real prompt and forged rewards of 1000 naming a rank the unit was not granted to (trainer rank 1: refused,
 * since FILE's key speaks for its own rank only). The run's step 1 must be waiting for its data meanwhile (the test
 * holds the rollout rank's scorer).
 *
 * With --flood EP SECONDS (the trainers' dispatcher; issue 39 item 4) the stranger floods the dispatcher for that
 * long instead, and does nothing else: FILE's key (one process of the last rollout rank, of the real processes'
 * generation) pings under its own worker id and 300 phantom ones, and for rollout rank 0; envelopes of 48 MiB with a
 * fake MAC (over the socket's bound); work requests of 60 KiB and of 600 bytes with a fake MAC (over their kind's
 * bound); and small ones with a fake MAC in FILE's process's name. Each answered one must be refused for its reason
 * (the phantoms: a second process of a live one's generation, or FILE's key over its rate; none may be served).
 * Prints the counts. */
#include <inttypes.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "proto/plane_auth.h"
#include "worker/data/dataset.h"
#include "proto/protocol.h"
#include "worker/step/prompts.h"
#include "worker/tokenizer/tokenizer.h"

/* Send one request; with answer, wait for the trainer's answer and require a refusal. */
static int request(int s, const void *buf, size_t len, const char *what, int answer)
{
    int timeout = 20000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout, sizeof timeout);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout, sizeof timeout);
    if (nn_send(s, buf, len, 0) < 0) {
        fprintf(stderr, "data_stranger: sending %s: %s\n", what, nn_strerror(nn_errno()));
        return 1;
    }
    if (!answer)
        return 0;
    void *msg;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    if (n < 0) {
        fprintf(stderr, "data_stranger: no answer to %s: %s\n", what, nn_strerror(nn_errno()));
        return 1;
    }
    Grpo__Envelope *env = protocol_unpack(msg, (size_t)n, NULL, 0);
    nn_freemsg(msg);
    int bad = !env || env->body_case != GRPO__ENVELOPE__BODY_REPLY || env->reply->ok;
    printf("%s: %s\n", what, bad ? "NOT REFUSED" : env->reply->error);
    if (env)
        protocol_free(env);
    return bad;
}

/* Send bytes and require a refusal whose reason holds `reason`. */
static int refused_bytes(int s, const uint8_t *buf, size_t len, const char *what, const char *reason, int quiet)
{
    int timeout = 20000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout, sizeof timeout);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout, sizeof timeout);
    void *msg;
    int n = nn_send(s, buf, len, 0) < 0 ? -1 : nn_recv(s, &msg, NN_MSG, 0);
    if (n < 0) {
        fprintf(stderr, "data_stranger: %s: %s\n", what, nn_strerror(nn_errno()));
        return 1;
    }
    Grpo__Envelope *ans = protocol_unpack(msg, (size_t)n, NULL, 0);
    nn_freemsg(msg);
    if (!reason) { /* any answer: the trainer may keep it until its step, and drop it there */
        int none = !ans || ans->body_case != GRPO__ENVELOPE__BODY_REPLY;
        printf("%s: %s\n", what, none ? "NO ANSWER" : ans->reply->ok ? "taken for now" : ans->reply->error);
        protocol_free(ans);
        return none;
    }
    int bad =
        !ans || ans->body_case != GRPO__ENVELOPE__BODY_REPLY || ans->reply->ok || !strstr(ans->reply->error, reason);
    if (bad || !quiet)
        printf("%s: %s\n", what,
               !ans || ans->body_case != GRPO__ENVELOPE__BODY_REPLY || ans->reply->ok ? "NOT REFUSED"
                                                                                      : ans->reply->error);
    protocol_free(ans);
    return bad;
}

/* Send a batch (authenticated with cred; NULL: not) and require a refusal whose reason holds `reason`. */
static int refused_for(int s, Grpo__RolloutBatch *rb, struct plane_cred *cred, const char *what, const char *reason,
                       int quiet)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_ROLLOUT;
    env.rollout = rb;
    size_t len;
    uint8_t *buf = plane_pack_request(&env, cred, &len);
    int bad = refused_bytes(s, buf, len, what, reason, quiet);
    free(buf);
    return bad;
}

/* One request to the dispatcher (authenticated with cred; NULL: not); the answer. */
static Grpo__Envelope *dispatch_call(int d, Grpo__Envelope *env, struct plane_cred *cred)
{
    size_t len;
    uint8_t *buf = plane_pack_request(env, cred, &len);
    int timeout = 20000;
    nn_setsockopt(d, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout, sizeof timeout);
    nn_setsockopt(d, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout, sizeof timeout);
    void *msg;
    int n = nn_send(d, buf, len, 0) < 0 ? -1 : nn_recv(d, &msg, NN_MSG, 0);
    free(buf);
    if (n < 0)
        return NULL;
    Grpo__Envelope *ans = protocol_unpack(msg, (size_t)n, NULL, 0);
    nn_freemsg(msg);
    return ans;
}

/* The dispatcher's answer must be a refusal holding `reason`. */
static int dispatch_refused(int d, Grpo__Envelope *env, struct plane_cred *cred, const char *what, const char *reason)
{
    Grpo__Envelope *ans = dispatch_call(d, env, cred);
    int refused = ans && ans->body_case == GRPO__ENVELOPE__BODY_REPLY && !ans->reply->ok;
    int bad = !refused || !strstr(ans->reply->error, reason);
    if (!ans)
        printf("%s: NO ANSWER\n", what);
    else if (ans->body_case == GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK)
        printf("%s: NOT REFUSED (%zu bytes of weights served)\n", what, ans->weights_chunk->data.len);
    else
        printf("%s: %s\n", what, refused ? ans->reply->error : "NOT REFUSED");
    protocol_free(ans);
    return bad;
}

/* The hostile peer of the authentication: see the head of this file. rb holds a whole group of a real prompt for
 * step 1 (from_rank set here). */
static int hostile(int s, const char *dispatch_ep, Grpo__RolloutBatch *rb, struct plane_cred *cred, int units)
{
    int bad = 0;
    rb->from_rank = cred ? cred->id.rank : 0;
    bad += refused_for(s, rb, NULL, "auth: an unauthenticated batch", "carries no authentication", 0);
    if (cred) {
        /* one process's key, another's identity: the rank before it, and the same rank with another pid */
        struct plane_cred other = *cred;
        other.id.rank = cred->id.rank - 1;
        rb->from_rank = other.id.rank;
        bad += refused_for(s, rb, &other, "auth: a batch MAC'd with one process's key claiming another's rank",
                           "authentication failed", 0);
        other = *cred;
        other.id.pid += 1;
        rb->from_rank = other.id.rank;
        bad += refused_for(s, rb, &other, "auth: a batch claiming another process of the same rank",
                           "authentication failed", 0);
        /* its own identity, naming another rank as the sender */
        rb->from_rank = cred->id.rank - 1;
        bad += refused_for(s, rb, cred, "auth: a batch whose from_rank is another rank than its credentials'",
                           "no process speaks for another", 0);
        /* a captured batch replayed: m1 and m2 (each refused for its far step), then m1 again */
        rb->from_rank = cred->id.rank;
        const int64_t keep_step = rb->step;
        rb->step = 3000000;
        Grpo__Envelope env = GRPO__ENVELOPE__INIT;
        env.body_case = GRPO__ENVELOPE__BODY_ROLLOUT;
        env.rollout = rb;
        size_t l1, l2;
        uint8_t *m1 = plane_pack_request(&env, cred, &l1);
        uint8_t *m2 = plane_pack_request(&env, cred, &l2);
        bad += refused_bytes(s, m1, l1, "auth: a batch to be captured", "batch for step", 0);
        bad += refused_bytes(s, m2, l2, "auth: the next batch", "batch for step", 0);
        bad += refused_bytes(s, m1, l1, "auth: the captured batch replayed", "replayed", 0);
        free(m1);
        free(m2);
        rb->step = keep_step;
    } else {
        printf("auth: no spare credentials: the probes that need one process's key are NOT RUN\n");
        bad++;
    }
    int d = nn_socket(AF_SP, NN_REQ);
    if (d < 0 || nn_connect(d, dispatch_ep) < 0) {
        fprintf(stderr, "data_stranger: %s: %s\n", dispatch_ep, nn_strerror(nn_errno()));
        return bad + 1;
    }
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    env.work_request = &w;
    const int my_slot = units - 1; /* the spare credentials are the last rollout rank's */
    w.worker_id = 0x5742, w.ping = true, w.rank = 0;
    bad += dispatch_refused(d, &env, NULL, "auth: an unauthenticated ping for rollout rank 0",
                            "carries no authentication");
    if (cred && my_slot > 0) {
        w.rank = 0;
        bad += dispatch_refused(d, &env, cred, "auth: a ping for rollout rank 0 from rollout rank 1's process",
                                "no process speaks for another");
        w.ping = false;
        bad += dispatch_refused(d, &env, cred, "auth: a claim of rollout rank 0's work from rollout rank 1's process",
                                "no process speaks for another");
    } else {
        printf("auth: a ping for another rollout rank needs spare credentials and two rollout ranks: NOT RUN\n");
        bad++;
    }
    Grpo__Envelope wenv = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.worker_id = 0x5742, q.version = 0, q.offset = 0, q.count = 16;
    wenv.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    wenv.weights_request = &q;
    bad +=
        dispatch_refused(d, &wenv, NULL, "auth: a weights download without credentials", "carries no authentication");
    nn_close(d);
    return bad;
}

/* A packed work request authenticated with cred, then padded with an unknown field (number 1000) to `total` bytes
 * (0: no padding); its MAC made with `key_of` (another process's credentials: a fake MAC) when not NULL. */
static uint8_t *flood_request(struct plane_cred *cred, const struct plane_cred *key_of, uint64_t id, int rank,
                              size_t total, size_t *len)
{
    struct plane_cred c = *cred; /* its counter goes on from cred's */
    if (key_of)
        memcpy(c.key, key_of->key, sizeof c.key);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = id, w.rank = rank, w.ping = true;
    env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    env.work_request = &w;
    size_t n;
    uint8_t *packed = plane_pack_request(&env, &c, &n);
    cred->counter = c.counter;
    const size_t room = total > n + 16 ? total : n;
    uint8_t *buf = malloc(room);
    if (!buf || !packed)
        abort();
    memcpy(buf, packed, n);
    free(packed);
    if (total > n + 16) { /* field 1000, wire type 2, a varint length, then the padding */
        size_t pad = total - n - 2, vlen = 1;
        for (size_t v = pad; v > 0x7f; v >>= 7)
            vlen++;
        pad -= vlen;
        buf[n++] = 0xC2, buf[n++] = 0x3E;
        size_t v = pad;
        do {
            buf[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
            v >>= 7;
        } while (v);
        memset(buf + n, 'x', pad);
        n += pad;
    }
    *len = n;
    return buf;
}

/* One request on REQ socket s; the answer's refusal text (malloc'd) or NULL (no answer, or not a refusal: *served). */
static char *flood_call(int s, const uint8_t *buf, size_t len, int *served)
{
    *served = 0;
    void *msg;
    int n = nn_send(s, buf, len, 0) < 0 ? -1 : nn_recv(s, &msg, NN_MSG, 0);
    if (n < 0)
        return NULL;
    Grpo__Envelope *ans = protocol_unpack(msg, (size_t)n, NULL, 0);
    nn_freemsg(msg);
    char *why = NULL;
    if (ans && ans->body_case == GRPO__ENVELOPE__BODY_REPLY && !ans->reply->ok)
        why = strdup(ans->reply->error);
    else
        *served = 1;
    protocol_free(ans);
    return why;
}

/* The flood (--flood): see the head of this file. 0 when every answer was the refusal it must be. */
static int flood(const char *ep, double seconds, struct plane_cred *cred, int units)
{
    enum { SOCKS = 5, BIG = 48 << 20 };
    int s[SOCKS];
    int tmo = 2000, big_tmo = 100;
    for (int i = 0; i < SOCKS; i++) {
        s[i] = nn_socket(AF_SP, NN_REQ);
        if (s[i] < 0 || nn_connect(s[i], ep) < 0) {
            fprintf(stderr, "data_stranger: %s: %s\n", ep, nn_strerror(nn_errno()));
            return 1;
        }
        nn_setsockopt(s[i], NN_SOL_SOCKET, NN_SNDTIMEO, i == SOCKS - 1 ? &big_tmo : &tmo, sizeof tmo);
        nn_setsockopt(s[i], NN_SOL_SOCKET, NN_RCVTIMEO, &tmo, sizeof tmo);
    }
    /* the fake MAC: a key of another identity (the rank before FILE's, another pid), never the claimed one's */
    struct plane_cred other = *cred;
    other.id.pid += 7;
    other.key[0] ^= 0x5a;
    /* a 48 MiB envelope with a fake MAC: its bytes, once */
    size_t big_len;
    uint8_t *big = flood_request(cred, &other, 0x5743, units - 1, BIG, &big_len);
    long phantom = 0, phantom_ok = 0, other_rank = 0, sized = 0, faked = 0, bigs = 0, unanswered = 0, bad = 0;
    long limited = 0; /* FILE's key over its budget: refused for its rate (a phantom or not) */
    const double until = clock_now_s() + seconds;
    for (uint64_t k = 0; clock_now_s() < until; k++) {
        size_t len;
        int served;
        char *why;
        /* FILE's own key: its own id (k 0) and phantom ids (300 of them, round and round) for its own rank */
        uint8_t *m = flood_request(cred, NULL, k % 2 ? 0x5742 : 0x9000 + k % 300, units - 1, 0, &len);
        why = flood_call(s[0], m, len, &served);
        free(m);
        phantom++;
        limited += why && strstr(why, "rate limited") != NULL;
        if (served ||
            (why && !strstr(why, "a second process of its generation is refused") && !strstr(why, "rate limited")))
            bad++, phantom_ok += served, printf("flood: a phantom ping: %s\n", why ? why : "SERVED");
        unanswered += !why && !served;
        free(why);
        /* ... and for rollout rank 0 */
        if (units > 1 && k % 4 == 0) {
            m = flood_request(cred, NULL, 0x5742, 0, 0, &len);
            why = flood_call(s[1], m, len, &served);
            free(m);
            other_rank++;
            limited += why && strstr(why, "rate limited") != NULL;
            if (served || (why && !strstr(why, "no process speaks for another") && !strstr(why, "rate limited")))
                bad++, printf("flood: a ping for rank 0: %s\n", why ? why : "SERVED");
            unanswered += !why && !served;
            free(why);
        }
        /* over the kind's bound, with a fake MAC: 60 KiB and 600 bytes */
        m = flood_request(cred, &other, 0x5742, units - 1, k % 2 ? 60 << 10 : 600, &len);
        why = flood_call(s[2], m, len, &served);
        free(m);
        sized++;
        if (served || (why && !strstr(why, "refused by its size, unauthenticated")))
            bad++, printf("flood: an oversized request: %s\n", why ? why : "SERVED");
        unanswered += !why && !served;
        free(why);
        /* within the bound, with a fake MAC */
        m = flood_request(cred, &other, 0x5742, units - 1, 0, &len);
        why = flood_call(s[3], m, len, &served);
        free(m);
        faked++;
        if (served || (why && !strstr(why, "authentication failed")))
            bad++, printf("flood: a fake MAC: %s\n", why ? why : "SERVED");
        unanswered += !why && !served;
        free(why);
        /* the 48 MiB envelope: the socket drops it (and the connection) unread; sent every 16th round */
        if (k % 16 == 0 && nn_send(s[SOCKS - 1], big, big_len, 0) >= 0)
            bigs++;
    }
    free(big);
    for (int i = 0; i < SOCKS; i++)
        nn_close(s[i]);
    printf("flood: %ld phantom pings of one key (%ld served), %ld pings for another rank (%ld of the key's requests "
           "refused for its rate), %ld requests over their kind's size, %ld with a fake MAC, %ld envelopes of 48 MiB "
           "sent, %ld unanswered, %ld wrong answers\n",
           phantom, phantom_ok, other_rank, limited, sized, faked, bigs, unanswered, bad);
    return bad || phantom == 0 ? 1 : 0;
}

/* The stranger who knows the run: see the head of this file. */
static int knowing_stranger(int s, int dp_rank, const char *cred_file, const char *dispatch_ep, double flood_s,
                            int argc, char **argv)
{
    struct plane_cred cred_buf, *cred = NULL;
    if (cred_file) {
        FILE *f = fopen(cred_file, "r");
        char line[256] = "";
        if (f && fgets(line, sizeof line, f) && plane_cred_parse(line, &cred_buf) == 0)
            cred = &cred_buf;
        else
            fprintf(stderr, "data_stranger: no credentials in %s\n", cred_file);
        if (f)
            fclose(f);
    }
    struct grpo_config c;
    struct cfg_error ce;
    config_init(&c);
    for (int i = 0; i < argc; i++)
        if (config_apply_override(&c, argv[i], &ce) != 0) {
            fprintf(stderr, "data_stranger: %s\n", ce.msg);
            return 2;
        }
    char err[1024];
    struct prompt_set train = {0}, val = {0};
    struct tokenizer *tok = prompt_load_tokenizer(c.arr_model_path, NULL, NULL, err, sizeof err);
    if (!tok || prompt_sets_load(&c, tok, NULL, &train, &val, err, sizeof err) != 0) {
        fprintf(stderr, "data_stranger: %s\n", err);
        return 2;
    }
    const int groups = (int)c.data_train_batch_size, n = (int)c.rollout_n;
    const int units = c.placement_rollout_ranks > 0 ? (int)c.placement_rollout_ranks : 1;
    if (flood_s > 0) {
        int rc = cred && dispatch_ep ? flood(dispatch_ep, flood_s, cred, units) : 2;
        if (rc == 2)
            fprintf(stderr, "data_stranger: --flood needs --cred FILE\n");
        prompt_set_free(&train);
        prompt_set_free(&val);
        tokenizer_free(tok);
        config_free(&c);
        return rc;
    }
    Grpo__RolloutBatch rb = GRPO__ROLLOUT_BATCH__INIT;
    rb.from_rank = cred ? cred->id.rank : 0, rb.to_dp_rank = dp_rank, rb.groups_in_step = groups;
    rb.samples_per_prompt = n, rb.units = units, rb.unit = 0, rb.policy_version = 0;
    int bad = 0;
    /* group 0 of step 1, a real prompt, every sample whole; sample 0 has no response token */
    const struct prompt_item *p = &train.items[0];
    Grpo__Sequence *q = calloc((size_t)n, sizeof *q);
    Grpo__Sequence **qs = calloc((size_t)n, sizeof *qs);
    int32_t one[1] = {0};
    float lp[1] = {-1.0f};
    if (!q || !qs)
        return 2;
    for (int j = 0; j < n; j++) {
        grpo__sequence__init(&q[j]);
        q[j].uid = 0, q[j].group_index = 0, q[j].sample_index = j;
        q[j].n_prompt_ids = (size_t)p->len, q[j].prompt_ids = p->ids;
        q[j].n_response_ids = q[j].n_old_log_probs = j == 0 ? 0 : 1;
        q[j].response_ids = j == 0 ? NULL : one;
        q[j].old_log_probs = j == 0 ? NULL : lp;
        q[j].data_source = (char *)p->data_source;
        qs[j] = &q[j];
    }
    rb.step = 1, rb.seq_no = 2000000, rb.n_sequences = (size_t)n, rb.sequences = qs;
    if (dispatch_ep) { /* the group, whole and every response one token long */
        q[0].n_response_ids = q[0].n_old_log_probs = 1, q[0].response_ids = one, q[0].old_log_probs = lp;
        bad += hostile(s, dispatch_ep, &rb, cred, units);
        q[0].n_response_ids = q[0].n_old_log_probs = 0, q[0].response_ids = NULL, q[0].old_log_probs = NULL;
        rb.from_rank = cred ? cred->id.rank : 0;
    }
    rb.n_sequences = 0, rb.sequences = NULL;
    for (int i = 0; i < 20; i++) { /* empty, and well formed: today's shape checks pass them */
        rb.step = 1000000 + i, rb.seq_no = 1000000 + (uint64_t)i;
        bad += refused_for(s, &rb, cred, i == 0 ? "an empty batch for step 1000000" : "an empty batch for a later step",
                           "batch for step", i > 0);
    }
    rb.step = 1, rb.seq_no = 2000000, rb.n_sequences = (size_t)n, rb.sequences = qs;
    bad += refused_for(s, &rb, cred, "a whole group with a response of zero tokens", "an empty response", 0);
    /* step 1's prompts, as the trainers draw them */
    struct data_cursor cur;
    int *uids = calloc((size_t)groups, sizeof(int));
    if (!uids || data_cursor_init(&cur, train.n, groups, c.data_shuffle, (uint64_t)c.data_seed, err, sizeof err) != 0)
        return 2;
    data_cursor_next(&cur, uids);
    data_cursor_free(&cur);
    /* group 0 of step 1, whole, with a prompt step 1 draws elsewhere (from the rank that holds the unit) */
    const int other = uids[1 % groups] != uids[0] ? uids[1 % groups] : (uids[0] + 1) % train.n;
    rb.from_rank = cred ? cred->id.rank : c.placement_trainer_ranks; /* a rollout rank: world rank T on */
    for (int j = 0; j < n; j++) {
        const struct prompt_item *o = &train.items[other];
        q[j].uid = other, q[j].n_prompt_ids = (size_t)o->len, q[j].prompt_ids = o->ids;
        q[j].n_response_ids = q[j].n_old_log_probs = 1, q[j].response_ids = one, q[j].old_log_probs = lp;
        q[j].data_source = (char *)o->data_source;
    }
    rb.seq_no = 2000001;
    bad += refused_for(s, &rb, cred, "a group holding a prompt not of its place in this step", "draws uid", 0);
    /* an empty batch for step 1's unit with a policy version step 1 cannot be generated with */
    rb.n_sequences = 0, rb.policy_version = 7, rb.seq_no = 2000002;
    bad += refused_for(s, &rb, cred, "a batch with an out-of-range policy_version", "policy_version 7 for step 1", 0);
    rb.policy_version = 0;
    /* step 1's real prompt at group 0, whole, with forged rewards, from trainer rank 1 (never granted a unit) */
    const struct prompt_item *real = &train.items[uids[0]];
    for (int j = 0; j < n; j++) {
        q[j].uid = uids[0], q[j].n_prompt_ids = (size_t)real->len, q[j].prompt_ids = real->ids;
        q[j].data_source = (char *)real->data_source;
        q[j].reward = q[j].raw_reward = 1000.0f;
    }
    rb.from_rank = 1, rb.n_sequences = (size_t)n, rb.seq_no = 2000003;
    bad += refused_for(s, &rb, cred, "a forged reward for a real prompt from a rank not granted the unit",
                       cred ? "no process speaks for another" : "not granted", 0);
    free(uids);
    free(q);
    free(qs);
    prompt_set_free(&train);
    prompt_set_free(&val);
    tokenizer_free(tok);
    config_free(&c);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc == 3) {
        fprintf(stderr, "usage: data_stranger ENDPOINT [DP_RANK [--cred FILE] [--dispatch EP | --flood EP SECONDS] "
                        "KEY=VALUE...]\n");
        return 2;
    }
    int s = nn_socket(AF_SP, NN_REQ);
    if (s < 0 || nn_connect(s, argv[1]) < 0) {
        fprintf(stderr, "data_stranger: %s: %s\n", argv[1], nn_strerror(nn_errno()));
        return 2;
    }
    if (argc > 3) {
        const char *cred = NULL, *dispatch = NULL;
        double flood_s = 0;
        int i = 3;
        for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
            if (strcmp(argv[i], "--cred") == 0)
                cred = argv[i + 1];
            else if (strcmp(argv[i], "--dispatch") == 0)
                dispatch = argv[i + 1];
            else if (strcmp(argv[i], "--flood") == 0 && i + 2 < argc) {
                dispatch = argv[i + 1];
                flood_s = atof(argv[i + 2]);
                i++;
            } else {
                fprintf(stderr, "data_stranger: unknown option %s\n", argv[i]);
                return 2;
            }
        }
        int rc = knowing_stranger(s, atoi(argv[2]), cred, dispatch, flood_s, argc - i, argv + i);
        nn_close(s);
        return rc;
    }
    int bad = 0;
    unsigned char junk[200];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)(i * 131 + 7);
    bad += request(s, junk, sizeof junk, "random bytes", 1);

    Grpo__Sequence q = GRPO__SEQUENCE__INIT, *qs[1] = {&q};
    int32_t ids[3] = {1, 2, 3};
    float lp[3] = {-1, -1, -1};
    q.uid = 1000000; /* no such prompt */
    q.n_prompt_ids = 3, q.prompt_ids = ids;
    q.n_response_ids = 3, q.response_ids = ids;
    q.n_old_log_probs = 3, q.old_log_probs = lp;
    Grpo__RolloutBatch rb = GRPO__ROLLOUT_BATCH__INIT;
    rb.step = 1, rb.seq_no = 1, rb.from_rank = 1, rb.n_sequences = 1, rb.sequences = qs;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_ROLLOUT;
    env.rollout = &rb;
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    bad += request(s, buf, len / 2, "a truncated envelope", 1);
    bad += request(s, buf, len, "a batch naming an unknown prompt", 1);
    env.version = GRPO_PROTOCOL_VERSION + 1;
    len = grpo__envelope__get_packed_size(&env);
    free(buf);
    buf = malloc(len);
    if (!buf)
        return 2;
    grpo__envelope__pack(&env, buf);
    bad += request(s, buf, len, "a batch of another protocol version", 1);
    free(buf);
    Grpo__Envelope hb = GRPO__ENVELOPE__INIT;
    hb.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    hb.status_request = 1;
    buf = protocol_pack(&hb, &len);
    bad += request(s, buf, len, "a control message", 1);
    free(buf);
    size_t big = (size_t)GRPO_MAX_MESSAGE_BYTES + 1024;
    unsigned char *huge = calloc(1, big);
    const uint64_t sent0 = nn_get_statistic(s, NN_STAT_BYTES_SENT),
                   broken0 = nn_get_statistic(s, NN_STAT_BROKEN_CONNECTIONS);
    bad += request(s, huge, big, "an oversized message", 0);
    free(huge);
    /* no answer comes to it: before the socket closes, wait until it has left (every byte sent) or the trainer has
     * dropped the connection it came on (it refuses a message over its limit by its size), at most 20 s */
    for (int i = 0; i < 2000; i++) {
        if (nn_get_statistic(s, NN_STAT_BYTES_SENT) >= sent0 + big ||
            nn_get_statistic(s, NN_STAT_BROKEN_CONNECTIONS) > broken0)
            break;
        usleep(10000); /* sleep-ok: the poll interval of a bounded wait */
    }
    nn_close(s);
    return bad ? 1 : 0;
}
